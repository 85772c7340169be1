// Package testgroup is the one test harness for "start a group, find the
// leader, wait": the polling, deadline and leader-finding mechanism that the
// replica-group tests of internal/vrshard (in-process replicas),
// internal/server and client (in-process server nodes) and test/e2e (real
// processes, started by test/e2e/cluster) share. Each kind of group keeps
// its own thin starter, because what it starts differs; how a test waits
// for it and finds its leader is written once, here.
//
// Test-only: production code must not import this package; only test files
// and the test/ tree (test/e2e/cluster) may. A test in this package fails if
// any other non-test file does.
package testgroup

import (
	"net"
	"testing"
	"time"
)

// Interval is how often WaitFor polls: short enough that a test does not
// idle long after its condition holds, long enough not to starve the code
// under test of a shared CPU.
const Interval = 5 * time.Millisecond

// Until polls cond every interval until it holds or timeout has passed,
// and reports whether it held. cond runs at least once.
func Until(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// WaitFor fails the test unless cond holds within timeout; what names the
// condition in the failure message.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(timeout, Interval, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Leader polls every interval for up to timeout for a member that leads
// and returns its index. leads(i) reports whether member i leads and in
// which view; members that are down report false. When several members
// call themselves leader (an old leader has not yet heard of a new view),
// the one in the highest view wins. It reports false if none led in time.
func Leader(n int, timeout, interval time.Duration, leads func(i int) (bool, uint64)) (int, bool) {
	best := -1
	ok := Until(timeout, interval, func() bool {
		var view uint64
		best = -1
		for i := range n {
			if l, v := leads(i); l && (best < 0 || v > view) {
				best, view = i, v
			}
		}
		return best >= 0
	})
	return best, ok
}

// Settled polls every interval for up to timeout until sample names the
// same leader for settle without a break, and returns it. sample reports
// the leader every running member agrees on, or false while they do not
// agree (a view change under way, a follower not hearing the leader). A
// member that merely calls itself leader is not a ready group: a fresh
// group's first leader does so before it has reached its peers, and a peer
// that has not heard it times out and starts a view change; settle, longer
// than a view-change timeout, lets such a peer break the agreement first.
func Settled(timeout, settle, interval time.Duration, sample func() (int, bool)) (int, bool) {
	var since time.Time
	last := -1
	ok := Until(timeout, interval, func() bool {
		l, agreed := sample()
		now := time.Now()
		switch {
		case !agreed || l < 0:
			last = -1
		case l != last:
			last, since = l, now
		case now.Sub(since) >= settle:
			return true
		}
		return false
	})
	return last, ok
}

// LoopbackAddrs reserves n loopback ports for members that bind them later:
// from outside the kernel's ephemeral range and exclusive across test
// processes (FreePorts), so neither a listener on port 0, an outgoing
// connection's local port, nor another package's test takes one in between —
// a port the kernel handed out and took back was, now and then ("bind:
// address already in use" in a clean CI run).
func LoopbackAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = loopbackAddr(t)
	}
	return addrs
}

// HoldLoopbackAddrs reserves n loopback ports as LoopbackAddrs does and keeps
// them bound until release, so that nothing the test itself starts in between
// can bind them either; release frees them just before the members bind them.
func HoldLoopbackAddrs(t testing.TB, n int) (addrs []string, release func()) {
	t.Helper()
	addrs = LoopbackAddrs(t, n)
	lns := make([]net.Listener, 0, n)
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("hold loopback port %s: %v", a, err)
		}
		lns = append(lns, ln)
	}
	return addrs, func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
}
