// Command txbench measures MULTI/EXEC against a RESP server (Kefir or
// Redis): -c connections each send "MULTI; INCR k; INCR k; EXEC" (or, with
// -plain, "INCR k; INCR k"; -cmd GET: GETs) as one pipelined request and wait for its
// replies, for -d; it prints transactions/s and, given -pid, the server's
// CPU time per transaction (utime+stime from /proc, docs/design/transactions.md).
//
// `txbench vs ...` is the side-by-side read-modify-write transaction benchmark
// against etcd and Redis (vs.go; bench/txn-vs.sh starts the systems).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "vs" {
		vsMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "xgroup" {
		xgroupMain(os.Args[2:])
		return
	}
	addr := flag.String("addr", "127.0.0.1:6379", "server")
	conns := flag.Int("c", 8, "connections")
	dur := flag.Duration("d", 5*time.Second, "duration")
	pids := flag.String("pid", "", "server process ids (comma-separated) whose CPU time is measured")
	plain := flag.Bool("plain", false, "the two commands without MULTI/EXEC (a pipeline)")
	cmd := flag.String("cmd", "INCR", "the command sent twice: INCR (k) or GET (k, set to 1 first)")
	flag.Parse()
	one := fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$1\r\nk\r\n", len(*cmd), *cmd)
	req := "*1\r\n$5\r\nMULTI\r\n" + one + one + "*1\r\n$4\r\nEXEC\r\n"
	lines := 6 // +OK, +QUEUED, +QUEUED, *2, :n, :n
	if *cmd == "GET" {
		lines = 8 // the two bulks take two lines each
	}
	if *plain {
		req = one + one
		lines = (lines - 4) * 1
		if *cmd == "GET" {
			lines = 4
		}
	}
	if *cmd == "GET" {
		nc, err := net.Dial("tcp", *addr)
		if err == nil {
			_, _ = nc.Write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"))
			_, _ = bufio.NewReader(nc).ReadBytes('\n')
			nc.Close()
		}
	}
	var done atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	c0 := cpu(*pids)
	start := time.Now()
	for range *conns {
		nc, err := net.Dial("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd := bufio.NewReader(nc)
			for !stop.Load() {
				if _, err := nc.Write([]byte(req)); err != nil {
					panic(err)
				}
				for range lines {
					l, err := rd.ReadBytes('\n')
					if err != nil {
						panic(err)
					}
					if bytes.HasPrefix(l, []byte("-")) {
						panic(string(l))
					}
				}
				done.Add(1)
			}
		}()
	}
	time.Sleep(*dur)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start).Seconds()
	n := done.Load()
	out := fmt.Sprintf("%d transactions, %.0f/s", n, float64(n)/el)
	if *pids != "" {
		out += fmt.Sprintf(", server CPU %.1f µs per transaction", (cpu(*pids)-c0)*1e6/float64(n))
	}
	fmt.Println(out)
}

// cpu is the summed utime+stime of pids, in seconds.
func cpu(pids string) float64 {
	if pids == "" {
		return 0
	}
	s := 0.0
	for _, p := range strings.Split(pids, ",") {
		b, err := os.ReadFile("/proc/" + p + "/stat")
		if err != nil {
			panic(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		u, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		s += (u + st) / 100 // USER_HZ
	}
	return s
}
