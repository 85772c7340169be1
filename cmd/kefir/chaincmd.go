package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

const chainUsage = `usage: kefir chain restart --without N[,M] --http ADDR[,ADDR...] [--group G] [--password P]

  restart   restart a chain that is down (every member failed) without the
            members named, which may never come back (a disk gone for good):
            the master restarts it from the longest durable history among the
            others once they have restarted. The writes acknowledged last are
            lost if only the members left out held them. A member left out
            that comes back holding more than the chain restarted from is not
            joined until it is restarted on an empty directory.
            --http: the admin (HTTP) addresses of the chain's nodes; the
            metadata leader's master acts, the command asks each in turn.
            --group: a chain group G of a cluster of several groups (its
            masters run at the cluster's metadata members: give their admin
            addresses)`

// runChain runs `kefir chain restart` (docs/chain.md, "Restarting a whole
// chain"): it asks each node's admin port (POST /chain/restart) until the
// acting master answers.
func runChain(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "restart" {
		return usageError{errors.New(chainUsage)}
	}
	fs := flag.NewFlagSet("kefir chain restart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	without := fs.String("without", "", "the members to restart without, N[,M...]")
	addrs := fs.String("http", "", "the chain nodes' admin (HTTP) addresses, host:port[,host:port...]")
	password := fs.String("password", os.Getenv("KEFIR_PASSWORD"), "the admin port's password, if the nodes have one (env KEFIR_PASSWORD)")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline for the whole command")
	group := fs.Uint64("group", 0, "a cluster's chain group to restart (0: the nodes' own chain, kefir server --engine chain)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *without == "" || *addrs == "" || fs.NArg() != 0 {
		return usageError{errors.New("restart needs --without and --http")}
	}
	q := url.Values{"without": {*without}}
	if *group != 0 {
		q.Set("group", fmt.Sprint(*group))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var tried []string
	for _, a := range strings.Split(*addrs, ",") {
		a = strings.TrimSpace(a)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a+"/chain/restart?"+q.Encode(), nil)
		if err != nil {
			return usageError{err}
		}
		if *password != "" {
			req.SetBasicAuth("kefir", *password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", a, err))
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		msg := strings.TrimSpace(string(body))
		switch resp.StatusCode {
		case http.StatusOK:
			_, err := fmt.Fprintf(stdout, "%s (master at %s)\n", msg, a)
			return err
		case http.StatusServiceUnavailable, http.StatusNotFound:
			tried = append(tried, fmt.Sprintf("%s: %s", a, msg)) // not the acting master: ask the next
		default:
			return fmt.Errorf("%s: %s", a, msg) // the acting master refused
		}
	}
	return fmt.Errorf("no node's master acted (is the metadata group's leader among them, and up?):\n  %s", strings.Join(tried, "\n  "))
}
