package main

import (
	"bufio"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line through addr and returns the fastest of n echoes.
func roundTrip(t *testing.T, addr string, n int) time.Duration {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	best := time.Hour
	for range n {
		t0 := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(t0))
	}
	return best
}

func TestEveryProxyDelaysBothDirections(t *testing.T) {
	const oneWay = 20 * time.Millisecond
	up := echoServer(t)
	ps, err := parsePairs([]string{"127.0.0.1:0=" + up, "127.0.0.2:0=" + up})
	if err != nil {
		t.Fatal(err)
	}
	proxies, err := start(ps, oneWay)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, p := range proxies {
			p.Close()
		}
	}()
	direct := roundTrip(t, up, 3)
	for _, p := range proxies {
		// The fastest round trip through a proxy carries both directions' delay;
		// a proxy that delayed one direction only (or none) would be under 2×.
		if rtt := roundTrip(t, p.Addr(), 3); rtt < 2*oneWay || rtt > 2*oneWay+direct+200*time.Millisecond {
			t.Errorf("round trip via %s: %v, want ≈ %v", p.Addr(), rtt, 2*oneWay)
		}
	}
}

func TestBadPairsAreRefused(t *testing.T) {
	for _, args := range [][]string{nil, {"127.0.0.1:1"}, {"=127.0.0.1:1"}, {"127.0.0.1:1=127.0.0.1:1"},
		{"127.0.0.1:1=127.0.0.1:2", "127.0.0.1:1=127.0.0.1:3"}, {"host=127.0.0.1:2"}} {
		if _, err := parsePairs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

func TestRunStopsOnSignalAndReportsReady(t *testing.T) {
	up := echoServer(t)
	stop := make(chan os.Signal, 1)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run([]string{"-delay", "1ms", "127.0.0.1:0=" + up}, pw, stop) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || line != "ready: 1 proxies, 1ms each way\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	stop <- os.Interrupt
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-delay", "-1ms", "127.0.0.1:0=" + up}, io.Discard, stop); err == nil {
		t.Fatal("negative delay accepted")
	}
}
