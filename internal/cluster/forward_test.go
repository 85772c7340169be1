package cluster

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// fakeLeader serves forwarded requests on a loopback port with answer, which
// sees each request's arguments and the connection's number and returns the
// reply to send, or "" to close the connection without one (a leader that
// died after reading the request).
func fakeLeader(t *testing.T, answer func(conn int, args []string) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(wg.Wait) // runs last: after the listener and connections are closed
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, nc := range open {
			nc.Close()
		}
		mu.Unlock()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, nc)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				rd := resp.NewReader(nc, 0)
				for {
					args, err := rd.ReadCommand(nil)
					if err != nil {
						return
					}
					var s []string
					for _, a := range args {
						s = append(s, string(a))
					}
					reply := answer(n, s)
					if reply == "" {
						return
					}
					if _, err := nc.Write([]byte(reply)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// reqID is the REQID a forwarded KEFIR.CALL carries, "" if none.
func reqID(args []string) string {
	for i, a := range args {
		if a == "REQID" && i+2 < len(args) {
			return args[i+1] + " " + args[i+2]
		}
	}
	return ""
}

// A forwarded write whose leader reads it and dies is sent again, with the
// same request id, until a leader answers; the answer is the outcome (issue
// 25 item 12).
func TestForwarderRetriesWithTheSameRequestID(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	addr := fakeLeader(t, func(conn int, args []string) string {
		mu.Lock()
		ids = append(ids, reqID(args))
		mu.Unlock()
		if conn < 2 {
			return "" // read it, then died
		}
		return "*2\r\n$1\r\n0\r\n:7\r\n" // [session, 7]
	})
	f := newForwarder("", "", "")
	defer f.close()
	fc := &Call{Args: [][]byte{[]byte("INCR"), []byte("k")}, Dur: level.Sync}
	f.forward(addr, []*Call{fc}, func() (string, bool) { return addr, true })
	if fc.Err != nil || fc.Reply.Kind != resp.Int || fc.Reply.Int != 7 {
		t.Fatalf("outcome %v, reply %v; want the third attempt's :7", fc.Err, fc.Reply)
	}
	if len(ids) != 3 || ids[0] == "" || ids[1] != ids[0] || ids[2] != ids[0] {
		t.Fatalf("request ids of the attempts: %q; want one id, three times", ids)
	}
}

// When the retries run out, a write that reached a leader which never
// answered is "outcome unknown"; one that never reached a node that could
// apply it is "not applied".
func TestForwarderSaysWhatItKnowsWhenRetriesRunOut(t *testing.T) {
	f := newForwarder("", "", "")
	f.retryFor = 300 * time.Millisecond
	defer f.close()

	died := fakeLeader(t, func(int, []string) string { return "" })
	fc := &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	f.forward(died, []*Call{fc}, func() (string, bool) { return "", false })
	if fc.Err == nil || !strings.Contains(fc.Err.Error(), "the write's outcome is unknown") {
		t.Errorf("sent, never answered: %v", fc.Err)
	}

	moved := fakeLeader(t, func(int, []string) string { return "-MOVED 127.0.0.1:1\r\n" })
	fc = &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	f.forward(moved, []*Call{fc}, func() (string, bool) { return "", false })
	if fc.Err == nil || !strings.Contains(fc.Err.Error(), "the write was not applied") {
		t.Errorf("refused with MOVED, then nobody listening: %v", fc.Err)
	}

	// Once a leader has read it without answering, a later MOVED from
	// another node does not make it "not applied".
	fc = &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	first := true
	f.forward(died, []*Call{fc}, func() (string, bool) {
		if first {
			first = false
			return moved, true
		}
		return "", false
	})
	if fc.Err == nil || !strings.Contains(fc.Err.Error(), "the write's outcome is unknown") {
		t.Errorf("sent to one that died, then MOVED: %v", fc.Err)
	}
}

// clientTable is a fake leader's client table, the rule of vr/normal.go and
// shard's table: per client id, the latest request number executed; an older
// number is refused as stale, the same one answered from the table (not run
// again), a newer one executed. The forwarding tests' fake leaders share it.
type clientTable struct {
	mu     sync.Mutex
	latest map[string]uint64
	ran    []string // keys executed, in order
}

// forwardedOK is a leader's answer to a forwarded write that ran: [session, OK].
const forwardedOK = "*2\r\n$1\r\n0\r\n+OK\r\n"

// cmdKey is the key of the command a forwarded KEFIR.CALL carries, "" if none.
func cmdKey(args []string) string {
	for i, a := range args {
		if a == "CMD" && i+2 < len(args) {
			return args[i+2]
		}
	}
	return ""
}

// run applies the table's rule to a forwarded request and returns the reply
// to send: reply if it ran or is answered from the table, an error if it
// carries no request id or is stale.
func (tb *clientTable) run(args []string, reply string) string {
	id, seq, _ := strings.Cut(reqID(args), " ")
	n, err := strconv.ParseUint(seq, 10, 64)
	if id == "" || err != nil {
		return "-ERR a forwarded write without a request id\r\n"
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.latest == nil {
		tb.latest = map[string]uint64{}
	}
	switch has, ok := tb.latest[id]; {
	case ok && n < has:
		return fmt.Sprintf("-ERR %s: client %s request %d, table has %d\r\n", shard.ErrStaleRequest, id, n, has)
	case ok && n == has:
		return reply // answered from the table
	}
	tb.latest[id] = n
	tb.ran = append(tb.ran, cmdKey(args))
	return reply
}

// executed is the keys run so far, in order.
func (tb *clientTable) executed() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]string(nil), tb.ran...)
}

// serve starts a fake leader that keeps the table and answers every write
// that runs with forwardedOK; refuse says whether a request for key is
// refused with "no leader" instead (it does not run: a node that cannot take
// it, e.g. a slot in a move's hand-over).
func (tb *clientTable) serve(t *testing.T, refuse func(key string) bool) string {
	return fakeLeader(t, func(_ int, args []string) string {
		if refuse(cmdKey(args)) {
			return "-" + ErrNoLeader.Msg + "\r\n"
		}
		return tb.run(args, forwardedOK)
	})
}

// A forwarded pipeline whose first write is refused (no leader for its
// slot yet: a move's hand-over) while the second runs: the first is sent
// again, alone, after the second ran. With one client id for the pipeline
// its request number is then below the one the table holds, and the user
// gets "stale request" for a write sent once. Each write has its own id.
func TestForwardedWriteRetriedAfterALaterOneRanIsNotStale(t *testing.T) {
	var l clientTable
	var tries atomic.Int32
	addr := l.serve(t, func(key string) bool { return key == "a" && tries.Add(1) == 1 })
	f := newForwarder("", "", "")
	defer f.close()
	a := &Call{Args: [][]byte{[]byte("SET"), []byte("a"), []byte("1")}, Dur: level.Sync}
	b := &Call{Args: [][]byte{[]byte("SET"), []byte("b"), []byte("1")}, Dur: level.Sync}
	f.forward(addr, []*Call{a, b}, func() (string, bool) { return addr, true })
	for _, c := range []*Call{a, b} {
		if c.Err != nil || string(c.Reply.Str) != "OK" {
			t.Fatalf("SET %s: %v %v %q; want OK (ran: %q)", c.Args[1], c.Err, c.Reply.Kind, c.Reply.Str, l.executed())
		}
	}
	if ran := l.executed(); fmt.Sprint(ran) != "[b a]" {
		t.Fatalf("executed %q, want b then a", ran)
	}
}

// The same across two forwards: a write refused once waits to be retried
// while its pooled connection serves another client's write, which must
// not take a later request number of the waiting write's id.
func TestForwardedWriteRetriedAfterAnotherForwardIsNotStale(t *testing.T) {
	var l clientTable
	var bDone atomic.Bool
	addr := l.serve(t, func(key string) bool { return key == "a" && !bDone.Load() })
	f := newForwarder("", "", "")
	defer f.close()
	a := &Call{Args: [][]byte{[]byte("SET"), []byte("a"), []byte("1")}, Dur: level.Sync}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.forward(addr, []*Call{a}, func() (string, bool) { return addr, true })
	}()
	// Wait for a's first refusal to put its connection back in the pool.
	testgroup.WaitFor(t, 5*time.Second, "a's connection to go back to the pool", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.idle[addr]) > 0
	})
	b := &Call{Args: [][]byte{[]byte("SET"), []byte("b"), []byte("1")}, Dur: level.Sync}
	f.forward(addr, []*Call{b}, func() (string, bool) { return addr, true })
	bDone.Store(true)
	<-done
	for _, c := range []*Call{a, b} {
		if c.Err != nil || string(c.Reply.Str) != "OK" {
			t.Fatalf("SET %s: %v %v %q; want OK (ran: %q)", c.Args[1], c.Err, c.Reply.Kind, c.Reply.Str, l.executed())
		}
	}
}

// A forwarded write's id is its lane's: settled writes hand the lane on (the
// next write runs as the same client, next number: the table holds one id per
// write in flight, not one per write), an unknown outcome retires it.
func TestForwarderLanesAreReusedOnlyWhenSettled(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	die := false
	addr := fakeLeader(t, func(_ int, args []string) string {
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, reqID(args))
		if die {
			return ""
		}
		return forwardedOK
	})
	f := newForwarder("", "", "")
	f.retryFor = 200 * time.Millisecond
	defer f.close()
	set := func() *Call {
		c := &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
		f.forward(addr, []*Call{c}, func() (string, bool) { return addr, true })
		return c
	}
	a, b := set(), set()
	if a.Err != nil || b.Err != nil || b.ID.Client != a.ID.Client || b.ID.Seq != a.ID.Seq+1 {
		t.Fatalf("two settled writes: %v %v, ids %+v %+v; want one lane, numbers n and n+1", a.Err, b.Err, a.ID, b.ID)
	}
	mu.Lock()
	die = true
	mu.Unlock()
	if c := set(); c.Err == nil || !strings.Contains(c.Err.Error(), "outcome is unknown") || c.ID.Client != a.ID.Client {
		t.Fatalf("a write whose leader died: %v, id %+v", c.Err, c.ID)
	}
	mu.Lock()
	die = false
	mu.Unlock()
	if d := set(); d.Err != nil || d.ID.Client == a.ID.Client {
		t.Fatalf("after an unknown outcome: %v, id %+v; want a fresh lane, not %d", d.Err, d.ID, a.ID.Client)
	}
}

// forwardAroundAnother forwards a to addr and, between its first attempt
// and its retry (when the forwarder asks where to retry), runs between and
// then forwards b on the same forwarder, which takes the pooled connection
// a's first attempt used; b must be answered OK.
func forwardAroundAnother(t *testing.T, f *forwarder, addr string, a, b *Call, between func()) {
	t.Helper()
	other := false
	f.forward(addr, []*Call{a}, func() (string, bool) {
		if !other {
			other = true
			between()
			f.forward(addr, []*Call{b}, func() (string, bool) { return addr, true })
		}
		return addr, true
	})
	if b.Err != nil || b.Reply.Kind != resp.Simple {
		t.Fatalf("b: %v %v", b.Err, b.Reply)
	}
}

// A forwarded write refused before it ran (no leader: a slot in a move's
// window) is retried while another forward has used its pooled connection.
// The retry keeps its lane's id, which no other write used meanwhile (b
// takes a lane of its own); with ids one per connection, b gave the id a
// later seq at the leader, which refused the retry as stale, and the client
// got an error for a write that never ran (seen in bench/reshard-vs.sh: a
// few per move).
func TestForwarderRetryOfARefusedWriteIsNotStale(t *testing.T) {
	var tb clientTable
	var refuse atomic.Bool
	refuse.Store(true)
	addr := tb.serve(t, func(string) bool { return refuse.Load() })
	f := newForwarder("", "", "")
	defer f.close()
	a := &Call{Args: [][]byte{[]byte("SET"), []byte("a"), []byte("1")}, Dur: level.Sync}
	b := &Call{Args: [][]byte{[]byte("SET"), []byte("b"), []byte("1")}, Dur: level.Sync}
	// Between a's attempts the slot is served again.
	forwardAroundAnother(t, f, addr, a, b, func() { refuse.Store(false) })
	if a.Err != nil || a.Reply.Kind != resp.Simple {
		t.Fatalf("a, refused and then retried: %v %v; want OK", a.Err, a.Reply)
	}
	if ran := tb.executed(); len(ran) != 2 {
		t.Fatalf("writes run: %q, want 2", ran)
	}
}

// A forwarded write the leader may have run (it answered UNAVAILABLE) is
// retried with its id while another forward uses its pooled connection;
// that forward must not advance the id's seq (its own lane), or the retry
// is refused as stale and the client told "outcome unknown" for a write
// the table could have answered.
func TestForwarderRetryOfAMaybeWriteIsAnsweredFromTheTable(t *testing.T) {
	var tb clientTable
	var first atomic.Bool
	first.Store(true)
	addr := fakeLeader(t, func(_ int, args []string) string {
		reply := tb.run(args, forwardedOK)
		if first.CompareAndSwap(true, false) {
			return "-UNAVAILABLE commit timed out\r\n" // it ran; the answer was lost
		}
		return reply
	})
	f := newForwarder("", "", "")
	defer f.close()
	a := &Call{Args: [][]byte{[]byte("INCR"), []byte("a")}, Dur: level.Sync}
	b := &Call{Args: [][]byte{[]byte("SET"), []byte("b"), []byte("1")}, Dur: level.Sync}
	forwardAroundAnother(t, f, addr, a, b, func() {})
	if a.Err != nil || a.Reply.Kind != resp.Simple {
		t.Fatalf("a, run and retried: %v %v; want the table's OK", a.Err, a.Reply)
	}
	if ran := tb.executed(); len(ran) != 2 {
		t.Fatalf("writes run: %q, want 2 (a once)", ran)
	}
}
