// Command delaymesh runs delay proxies (internal/faultproxy) in front of the client and
// peer ports of a system under test, so every system in the YCSB comparison sees the
// same emulated network distance on every link (issue 8 §5): each LISTEN=UPSTREAM pair
// is a proxy that forwards connections to LISTEN on to UPSTREAM, holding the bytes of
// each direction for -delay. The peers scripts (bench/peers/*.sh --delay) start it and
// point each system's member lists at the LISTEN addresses:
//
//	go run ./delaymesh -delay 250us 127.0.0.1:12480=127.0.0.1:2480 127.0.0.1:12482=127.0.0.1:2482
//
// It prints "ready" once every proxy listens and runs until SIGINT or SIGTERM.
// It must not be imported (package main); it imports faultproxy, test infrastructure
// that production code never imports.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/faultproxy"
)

// pair is one proxy: connections to listen are forwarded to upstream.
type pair struct{ listen, upstream string }

func parsePairs(args []string) ([]pair, error) {
	if len(args) == 0 {
		return nil, errors.New("no LISTEN=UPSTREAM pairs given")
	}
	var ps []pair
	seen := map[string]bool{}
	for _, a := range args {
		l, u, ok := strings.Cut(a, "=")
		if !ok || l == "" || u == "" || !strings.Contains(l, ":") || !strings.Contains(u, ":") {
			return nil, fmt.Errorf("%q: want LISTEN=UPSTREAM, both host:port", a)
		}
		if l == u {
			return nil, fmt.Errorf("%q: a proxy forwarding to itself", a)
		}
		if seen[l] {
			return nil, fmt.Errorf("%s listed twice", l)
		}
		seen[l] = true
		ps = append(ps, pair{l, u})
	}
	return ps, nil
}

// start opens every proxy, each delaying both directions by oneWay, or none if one fails.
func start(ps []pair, oneWay time.Duration) ([]*faultproxy.Proxy, error) {
	var out []*faultproxy.Proxy
	for i, p := range ps {
		px, err := faultproxy.Listen(p.listen, p.upstream, uint64(i)+1)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		px.Delay(faultproxy.Up, oneWay, 0)
		px.Delay(faultproxy.Down, oneWay, 0)
		out = append(out, px)
	}
	return out, nil
}

func run(args []string, stdout io.Writer, stop <-chan os.Signal) error {
	fs := flag.NewFlagSet("delaymesh", flag.ContinueOnError)
	delay := fs.Duration("delay", 0, "one-way delay added in each direction of every proxied connection")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *delay < 0 {
		return fmt.Errorf("-delay %v: negative", *delay)
	}
	ps, err := parsePairs(fs.Args())
	if err != nil {
		return err
	}
	proxies, err := start(ps, *delay)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ready: %d proxies, %v each way\n", len(proxies), *delay)
	<-stop
	var cerr error
	for _, p := range proxies {
		cerr = errors.Join(cerr, p.Close())
	}
	return cerr
}

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	if err := run(os.Args[1:], os.Stdout, stop); err != nil {
		fmt.Fprintln(os.Stderr, "delaymesh:", err)
		os.Exit(1)
	}
}
