package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/server"
)

// startFollowerReadGroup runs a 3-replica group in-process with
// --follower-reads on every member.
func startFollowerReadGroup(t testing.TB) []*server.Server {
	t.Helper()
	return startGroupWith(t, true)
}

// followerReadTestGroup is startFollowerReadGroup for a test (skipped under
// -short), once the group has a leader, whose index it returns.
func followerReadTestGroup(t *testing.T) ([]*server.Server, int) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	nodes := startFollowerReadGroup(t)
	return nodes, leaderOf(t, nodes)
}

// followerServed is each node's count of cross-client-monotonic reads it
// served from its own engine as a follower (kefir_follower_reads_total).
func followerServed(nodes []*server.Server) []uint64 {
	out := make([]uint64, len(nodes))
	for i, n := range nodes {
		if st := n.Status(); st.Replication != nil && st.Replication.CAD != nil {
			out[i] = st.Replication.CAD.FollowerServed
		}
	}
	return out
}

func sum(xs []uint64) (s uint64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// wireLog counts, per server address, the commands the client sent there
// that carry a request id (writes) or a given consistency level.
type wireLog struct {
	mu   sync.Mutex
	seen map[string]map[string]int // addr -> marker -> count
}

var wireMarkers = []string{"REQID", "SESSION", "linearizable", "cross-client-monotonic", "eventual"}

func (w *wireLog) wrap(nc net.Conn) net.Conn { return &loggedConn{Conn: nc, log: w} }

func (w *wireLog) reset() {
	w.mu.Lock()
	w.seen = nil
	w.mu.Unlock()
}

func (w *wireLog) count(addr, marker string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[addr][marker]
}

type loggedConn struct {
	net.Conn
	log *wireLog
}

func (c *loggedConn) Write(b []byte) (int, error) {
	addr := c.RemoteAddr().String()
	c.log.mu.Lock()
	if c.log.seen == nil {
		c.log.seen = map[string]map[string]int{}
	}
	if c.log.seen[addr] == nil {
		c.log.seen[addr] = map[string]int{}
	}
	for _, m := range wireMarkers {
		// Each marker is a whole bulk string on the wire.
		c.log.seen[addr][m] += bytes.Count(b, []byte(fmt.Sprintf("$%d\r\n%s\r\n", len(m), m)))
	}
	c.log.mu.Unlock()
	return c.Conn.Write(b)
}

// waitFollowerReads reads at cross-client-monotonic level until some follower
// serves one itself: followers serve them only once they hold an active-set
// lease, a few heartbeats after the group formed.
func waitFollowerReads(t testing.TB, ctx context.Context, c *Client, nodes []*server.Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); sum(followerServed(nodes)) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no follower served a cross-client-monotonic read within 10s")
		}
		if _, err := c.Get(ctx, "warm", WithConsistency(CrossClientMonotonic)); err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With --follower-reads, the client sends cross-client-monotonic and
// eventual reads to every replica it was given, while writes and
// linearizable reads go to the leader only — also after a -MOVED, which used
// to move the whole pool (follower reads included) to the leader for good.
func TestFollowerReadsAreSpreadOverReplicas(t *testing.T) {
	nodes, l := followerReadTestGroup(t)
	order := []int{(l + 1) % 3, l, (l + 2) % 3} // a follower first: the first write gets -MOVED
	var addrs []string
	for _, i := range order {
		addrs = append(addrs, nodes[i].ClientAddr().String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wire wireLog
	c := dialGroup(t, ctx, addrs, &wire)
	defer c.Close()
	for i := range 10 {
		if err := c.Put(ctx, fmt.Sprint("k", i), []byte("v0")); err != nil {
			t.Fatal(err)
		}
	}
	waitFollowerReads(t, ctx, c, nodes)
	stableView(t, nodes, func(l int) []string { return spreadRound(t, ctx, c, &wire, nodes, order, l) })
}

// spreadRound is one measured round of TestFollowerReadsAreSpreadOverReplicas
// with node l leading; it returns what it found wrong.
func spreadRound(t *testing.T, ctx context.Context, c *Client, wire *wireLog, nodes []*server.Server, order []int, l int) (failures []string) {
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	leaderAddr := nodes[l].ClientAddr().String()
	wire.reset()
	before := followerServed(nodes)
	var fwdBefore []uint64
	for _, n := range nodes {
		fwdBefore = append(fwdBefore, n.Status().Replication.Forwarded)
	}
	const reads = 300
	for i := range reads {
		key := fmt.Sprint("k", i%10)
		v, err := c.Get(ctx, key, WithConsistency(CrossClientMonotonic))
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if len(v) == 0 {
			t.Fatalf("read %d of %s: empty value", i, key)
		}
		if i%10 == 9 {
			if err := c.Put(ctx, key, fmt.Appendf(nil, "v%d", i)); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			if _, err := c.Get(ctx, key, WithConsistency(Linearizable)); err != nil {
				t.Fatalf("linearizable read %d: %v", i, err)
			}
			// Eventual may find a replica that has not applied the key's
			// first write yet.
			if _, err := c.Get(ctx, key, WithConsistency(Eventual)); err != nil && !errors.Is(err, ErrNotFound) {
				t.Fatalf("eventual read %d: %v", i, err)
			}
		}
	}
	after := followerServed(nodes)
	served := sum(after) - sum(before)
	t.Logf("followers served %d of %d cross-client-monotonic reads themselves (per node %v -> %v)", served, reads, before, after)
	if got := c.leader.Load(); got == nil || *got != leaderAddr {
		fail("the client's leader is %s, want %s", deref(got), leaderAddr)
	}
	for _, i := range order {
		if i != l && after[i] == before[i] {
			fail("follower %s served no cross-client-monotonic read", nodes[i].ClientAddr())
		}
	}
	// Round robin sends two thirds of the reads to followers. Those that find
	// their key's latest write not yet readable (on a loaded machine, a
	// follower applies late) are redirected: a tenth is a floor that a
	// client pinned to the leader, which leaves followers serving none,
	// cannot meet.
	if served < reads/10 {
		fail("followers served %d of %d reads; want at least %d", served, reads, reads/10)
	}
	for _, i := range order {
		a := nodes[i].ClientAddr().String()
		if n := wire.count(a, "cross-client-monotonic"); n == 0 {
			fail("no cross-client-monotonic read was sent to %s", a)
		}
		if n := wire.count(a, "eventual"); n == 0 {
			fail("no eventual read was sent to %s", a)
		}
		if i == l {
			continue
		}
		if n := wire.count(a, "REQID"); n != 0 {
			fail("%d writes were sent to follower %s", n, a)
		}
		if n := wire.count(a, "linearizable"); n != 0 {
			fail("%d linearizable reads were sent to follower %s", n, a)
		}
		if fw := nodes[i].Status().Replication.Forwarded; fw != fwdBefore[i] {
			fail("follower %s forwarded %d calls", a, fw-fwdBefore[i])
		}
	}
	if w := wire.count(leaderAddr, "REQID"); w != reads/10 {
		fail("leader got %d writes, want %d", w, reads/10)
	}
	return failures
}

// stableView runs round with the current leader until one run is clean (at
// most 3 tries): the routing assertions name the leader, and a loaded machine
// (the race detector, other engineers' builds, CI's own parallel packages)
// can make the group change views in the middle of a round, or keep a
// follower out of the active set for a whole round so that it redirects
// every read it gets (seen once: "served no cross-client-monotonic read").
// A client that routes wrongly fails every round, so three in a row that
// find something wrong fail the test.
func stableView(t *testing.T, nodes []*server.Server, round func(l int) []string) {
	t.Helper()
	for try := 1; ; try++ {
		l := leaderOf(t, nodes)
		v0 := viewOf(nodes)
		failures := round(l)
		if v1 := viewOf(nodes); v1 != v0 && try < 3 {
			t.Logf("the group changed views (%d -> %d) during round %d; again (%d findings dropped)", v0, v1, try, len(failures))
			continue
		}
		if len(failures) > 0 && try < 3 {
			t.Logf("round %d found %d problems without a view change (%q); again", try, len(failures), failures)
			continue
		}
		for _, f := range failures {
			t.Error(f)
		}
		return
	}
}

// viewOf is the highest view any live node is in.
func viewOf(nodes []*server.Server) uint64 {
	var v uint64
	for _, n := range nodes {
		if n != nil && n.Status().Replication != nil {
			v = max(v, n.Status().Replication.View)
		}
	}
	return v
}

// Without --follower-reads a follower answers every cross-client-monotonic
// read with -MOVED: the client retries that read at the leader, and the
// next one is tried at a replica again — the redirect moves neither reads
// nor writes for good, and nothing is forwarded.
func TestFollowerReadRetriesAtTheLeaderOnMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	nodes := startGroup(t) // no follower reads
	addrs := clientAddrs(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wire wireLog
	c := dialGroup(t, ctx, addrs, &wire)
	defer c.Close()
	if err := c.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	stableView(t, nodes, func(l int) (failures []string) {
		fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
		wire.reset()
		const reads = 60
		for i := range reads {
			v, err := c.Get(ctx, "k", WithConsistency(CrossClientMonotonic))
			if err != nil || string(v) != "v1" {
				t.Fatalf("read %d = %q, %v; want v1", i, v, err)
			}
		}
		// Round robin: a third of the reads start at the leader; the other
		// two thirds are tried at a follower first and retried at the leader.
		if n := wire.count(addrs[l], "cross-client-monotonic"); n != reads {
			fail("leader got %d reads, want all %d", n, reads)
		}
		for i, a := range addrs {
			if i == l {
				continue
			}
			if n := wire.count(a, "cross-client-monotonic"); n != reads/3 {
				fail("follower %s got %d reads, want %d (every third, also after its -MOVEDs)", a, n, reads/3)
			}
			if fw := nodes[i].Status().Replication.Forwarded; fw != 0 {
				fail("follower %s forwarded %d calls; the client asked for -MOVED", a, fw)
			}
		}
		return failures
	})
}

// A follower serving reads under a lease keeps doing so for a client that
// saw the leader stop and followed -MOVEDs to the new one: the redirects did
// not pin reads to the leader.
func TestFollowerReadsResumeAfterALeaderChange(t *testing.T) {
	nodes, l := followerReadTestGroup(t)
	addrs := clientAddrs(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dialGroup(t, ctx, addrs, nil)
	defer c.Close()
	if err := c.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	waitFollowerReads(t, ctx, c, nodes)

	nodes[l].Close()
	nodes[l] = nil
	nl := leaderOf(t, nodes)
	if err := c.Put(ctx, "k", []byte("v2")); err != nil {
		t.Fatalf("write after the leader stopped: %v", err)
	}
	// Cross-client-monotonic reads need not see a completed write, but
	// never return less than an earlier read did: after this read of v2,
	// every read returns v2.
	if v, err := c.Get(ctx, "k", WithConsistency(Linearizable)); err != nil || string(v) != "v2" {
		t.Fatalf("linearizable read after the write = %q, %v; want v2", v, err)
	}
	f := 3 - l - nl
	start := nodes[f].Status().Replication.CAD.FollowerServed
	for deadline := time.Now().Add(10 * time.Second); nodes[f].Status().Replication.CAD.FollowerServed == start; {
		if time.Now().After(deadline) {
			t.Fatal("after the leader change the remaining follower never served a read again")
		}
		v, err := c.Get(ctx, "k", WithConsistency(CrossClientMonotonic))
		if err != nil || string(v) != "v2" {
			t.Fatalf("read after a read of v2 = %q, %v; want v2", v, err)
		}
	}
}

// Writers (sync and cad) and readers at cross-client-monotonic level, the
// readers' calls spread over the three replicas by one shared client: no
// read returns a state older than one an earlier read (any client)
// returned. The same history with one stale read added fails the check, so
// the history is one the checker can judge.
func TestFollowerReadHistoryIsCrossClientMonotonic(t *testing.T) {
	nodes, _ := followerReadTestGroup(t)
	addrs := clientAddrs(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *Client {
		c, err := Dial(ctx, addrs, WithRetryUnavailable(10*time.Second), WithMaxRetries(5))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	readers := dial()
	waitFollowerReads(t, ctx, readers, nodes)
	before := sum(followerServed(nodes))

	rec := check.NewRecorder(nil)
	keys := []string{"a", "b", "c"}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for cid, dur := range []Durability{Sync, CAD} {
		w := dial()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cid), 1))
			for i := 0; !stop.Load(); i++ {
				op := check.Op{Client: cid, Kind: check.Put, Key: keys[rng.IntN(len(keys))], Value: fmt.Sprintf("w%d-%d", cid, i), Dur: dur}
				id := rec.Invoke(op)
				if err := w.Put(ctx, op.Key, []byte(op.Value), WithDurability(dur)); err != nil {
					rec.Unknown(id)
					continue
				}
				rec.Complete(id, check.Result{Node: -1})
			}
		}()
	}
	var readErrs atomic.Int64
	for r := range 4 {
		cid := 10 + r
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cid), 2))
			for !stop.Load() {
				key := keys[rng.IntN(len(keys))]
				id := rec.Invoke(check.Op{Client: cid, Kind: check.Get, Key: key, Cons: level.ConsCrossClient})
				v, err := readers.Get(ctx, key, WithConsistency(CrossClientMonotonic))
				if finishRead(rec, id, v, err, check.Result{Node: -1}) != nil {
					readErrs.Add(1)
					rec.Fail(id)
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()

	h := rec.History()
	reads, writes := 0, 0
	for _, op := range h.Ops {
		if op.Outcome == check.OK {
			if op.Kind == check.Get {
				reads++
			} else {
				writes++
			}
		}
	}
	served := sum(followerServed(nodes)) - before
	t.Logf("%d reads (%d failed), %d writes; followers served %d reads themselves", reads, readErrs.Load(), writes, served)
	if readErrs.Load() != 0 {
		t.Errorf("%d reads failed", readErrs.Load())
	}
	if reads < 100 || writes < 20 {
		t.Fatalf("only %d reads and %d writes completed", reads, writes)
	}
	if served == 0 {
		t.Fatal("no read was served by a follower: the history does not test follower reads")
	}
	v := check.CrossClientMonotonic(h)
	if !v.OK || v.Checked == 0 {
		t.Fatalf("cross-client monotonic (%d judged):\n%v", v.Checked, v)
	}

	// The control: a read after everything else that returns a key's first
	// value, which later writes (begun after it was acknowledged) replaced
	// and later reads returned.
	stale, ok := staleRead(h)
	if !ok {
		t.Fatal("the history has no key whose first value was definitely overwritten and then read")
	}
	h.Ops = append(h.Ops, stale)
	if v := check.CrossClientMonotonic(h); v.OK {
		t.Fatalf("a read of an overwritten value after a read of its successor passed the check: %v", stale)
	}
}

// staleRead returns a read, invoked after every operation of h returned,
// of a value that is definitely older than one some read in h returned: the
// first acknowledged write of a key, when a read returned the value of a
// write invoked after that one had been acknowledged.
func staleRead(h check.History) (check.Op, bool) {
	end := int64(0)
	first := map[string]*check.Op{}
	byValue := map[string]*check.Op{}
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Return != check.Never {
			end = max(end, op.Return)
		}
		if op.Kind == check.Put && op.Outcome == check.OK {
			if f := first[op.Key]; f == nil || op.Return < f.Return {
				first[op.Key] = op
			}
			byValue[op.Value] = op
		}
	}
	for _, op := range h.Ops {
		if op.Kind != check.Get || op.Outcome != check.OK || !op.Found || op.Return == check.Never {
			continue
		}
		f, w := first[op.Key], byValue[op.Result]
		if f == nil || w == nil || w.Invoke <= f.Return {
			continue
		}
		return check.Op{ID: len(h.Ops), Client: 999, Kind: check.Get, Key: op.Key, Cons: level.ConsCrossClient,
			Invoke: end + 1, Return: end + 2, Outcome: check.OK, Found: true, Result: f.Value, Node: -1}, true
	}
	return check.Op{}, false
}

func deref(p *string) string {
	if p == nil {
		return "none"
	}
	return *p
}

// WithReplicaReads(false) keeps every read on the leader-bound pool; the
// default spreads replica-servable reads over every address, and only those.
func TestWithReplicaReadsOff(t *testing.T) {
	a, b := newTestServer(t), newTestServer(t)
	defer a.close()
	defer b.close()
	a.set("k", "v")
	b.set("k", "v")
	addrs := append(a.addr(), b.addr()...)
	ctx := context.Background()
	for _, spread := range []bool{true, false} {
		var wire wireLog
		c, err := Dial(ctx, addrs, WithPoolSize(1), WithReplicaReads(spread), func(o *options) { o.wrapConn = wire.wrap })
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if _, err := c.Get(ctx, "k", WithConsistency(Eventual)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Get(ctx, "k", WithConsistency(Linearizable)); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
		if n := wire.count(addrs[1], "linearizable"); n != 0 {
			t.Errorf("spread=%v: %d linearizable reads went to the second address", spread, n)
		}
		want := 0
		if spread {
			want = 5
		}
		if n := wire.count(addrs[1], "eventual"); n != want {
			t.Errorf("spread=%v: %d of 10 eventual reads went to the second address, want %d", spread, n, want)
		}
	}
}

// Session reads of a Session go to every replica too, and still read the
// session's own writes: a follower that has not applied them waits or
// redirects, never answers older.
func TestSessionReadsSpreadAndReadTheirWrites(t *testing.T) {
	nodes, _ := followerReadTestGroup(t)
	addrs := clientAddrs(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wire wireLog
	c := dialGroup(t, ctx, addrs, &wire)
	defer c.Close()
	s := c.Session()
	for i := range 60 {
		want := fmt.Sprint("v", i)
		if err := s.Put(ctx, "k", []byte(want)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := s.Get(ctx, "k", WithConsistency(SessionConsistency))
		if err != nil || string(got) != want {
			t.Fatalf("session read after writing %s = %q, %v", want, got, err)
		}
	}
	wire.mu.Lock()
	defer wire.mu.Unlock()
	reached := 0
	for _, a := range addrs {
		if wire.seen[a]["SESSION"] > 0 {
			reached++
		}
	}
	if reached != len(addrs) {
		t.Errorf("session calls reached %d of %d replicas: %v", reached, len(addrs), wire.seen)
	}
}
