package vrshard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// versionQuery wires every member's Options.AskTail to the tail replica
// in the same process (the node's front door does it over KEFIR.CHAINVERSION):
// tune's members ask g's replicas once g is stored in the pointer. With
// old set, the query fails as an older tail's "unknown command" would.
type versionQuery struct {
	g   atomic.Pointer[chainGroup]
	old atomic.Bool
	// calls counts the queries; delay (ns) is each one's round trip.
	calls, delay atomic.Int64
}

func (q *versionQuery) tune(_ int, o *Options) {
	o.ChainHeldReads = true // the mechanism under test (off in the node)
	o.AskTail = func(_ context.Context, tail uint64, _ string, epoch uint64) (uint64, error) {
		q.calls.Add(1)
		if d := q.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		g := q.g.Load()
		if q.old.Load() {
			return 0, errors.New("ERR unknown command 'KEFIR.CHAINVERSION'")
		}
		if g == nil || tail < 1 || int(tail) > len(g.reps) {
			return 0, fmt.Errorf("no member %d", tail)
		}
		return g.reps[tail-1].ChainVersion(epoch)
	}
}

// TestChainVersionQueryTailAhead: CRAQ's version query when the tail's
// version is ahead of the member's apply. An SU chain of three log
// members; an update of k has been committed and applied at the tail —
// which answers the new value — while the acknowledgement is held at the
// middle member (its driver stops after stepping the tail's ack), so
// neither the middle nor the head applied it. A linearizable read of k at
// the middle, after the tail answered the new value, asks the tail for its
// version and finds it ahead of what it applied. It must not answer v1,
// older than a read that completed before it began.
//
// The update is an APPEND (not blind: its value is the key's state at
// apply, which only the engine computes), so the member waits until the
// ack is let go, then answers v1+2 from its own engine (not sent to the
// tail). With the mutation chainVersionUnchecked (the engine's value as
// soon as the tail answered, no comparison) it answers v1 at once:
// TestChainVersionUncheckedMutation. A blind SET instead is answered at
// once from the held update: TestChainVersionQueryHeldCommitted.
func TestChainVersionQueryTailAhead(t *testing.T) {
	if err := versionTailAhead(t, false, false); err != nil {
		t.Fatal(err)
	}
}

func TestChainVersionUncheckedMutation(t *testing.T) {
	mutation.Require(t)
	err := versionTailAhead(t, true, false)
	if err == nil {
		t.Fatal("chainVersionUnchecked: a member answering its applied value without the tail's version was not caught")
	}
	t.Logf("chainVersionUnchecked caught: %v", err)
}

// TestChainVersionQueryHeldCommitted: CRAQ proper (chainHeldRead). As in
// TestChainVersionQueryTailAhead, but the update is a blind SET of v2: the
// middle holds it, unapplied (its ack held in its driver), and the tail's
// version covers it, so the middle answers v2 at once from the held
// update — while the ack is still held and its apply has not reached the
// write (the gate: it cannot, the driver is stopped). On the code before,
// the read waited for the ack (the wait bound is 5 s here).
func TestChainVersionQueryHeldCommitted(t *testing.T) {
	if err := versionTailAhead(t, false, true); err != nil {
		t.Fatal(err)
	}
}

func versionTailAhead(t *testing.T, unchecked, blind bool) error {
	var q versionQuery
	g, h := newAckHeldChainTuned(t, func(i int, o *Options) {
		q.tune(i, o)
		o.mut.chainVersionWait = 5 * time.Second // the test lets the ack go
		o.mut.chainVersionUnchecked = unchecked
	})
	q.g.Store(g)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	for i := range 3 {
		if got := g.read(i, "k"); got != "v1" {
			return fmt.Errorf("before: GET k at node %d = %q", i+1, got)
		}
	}
	upd, want := kv.Op{Kind: kv.KindAppend, Key: []byte("k"), Value: []byte("+2")}, "v1+2"
	if blind {
		upd, want = set("k", "v2"), "v2"
	}
	h.start(g, upd, shard.ReqID{Client: 5, Seq: 2})
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		res, err := g.chainReadAt(2, "k")
		return err == nil && string(res.Bulk) == want
	}) {
		return fmt.Errorf("the tail never answered %s", want)
	}
	written := g.reps[2].applied.Load() // the update's op: the tail applied it
	before := g.reps[1].Stats()
	type answer struct {
		res kv.Result
		err error
	}
	got := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := g.reps[1].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		got <- answer{res, err}
	}()
	if blind {
		var a answer
		select {
		case a = <-got:
		case <-time.After(2 * time.Second):
			h.finish("the write of v2")
			<-got
			return errors.New("GET k at the middle, v2 held there and committed at the tail: it waited for the ack")
		}
		applied := g.reps[1].applied.Load()
		h.finish("the write of v2")
		if a.err != nil || string(a.res.Bulk) != want {
			return fmt.Errorf("GET k at the middle, v2 held there and committed at the tail = %q, %v; want %s", a.res.Bulk, a.err, want)
		}
		if applied >= written {
			return fmt.Errorf("the middle applied up to %d, the write is op %d: the ack was not held", applied, written)
		}
		after := g.reps[1].Stats()
		if after.ChainHeldReads != before.ChainHeldReads+1 || after.ChainToTail != before.ChainToTail || after.ChainVersionWaited != before.ChainVersionWaited {
			return fmt.Errorf("middle stats before %+v after %+v: want one read answered from the held update, none sent to the tail", before, after)
		}
		return nil
	}
	select {
	case a := <-got:
		h.finish("the write")
		return fmt.Errorf("GET k at the middle, its ack held, after the tail answered %s = %q, %v: want it to wait for the version the tail answered", want, a.res.Bulk, a.err)
	case <-time.After(100 * time.Millisecond):
	}
	h.finish("the write")
	a := <-got
	if a.err != nil || string(a.res.Bulk) != want {
		return fmt.Errorf("GET k at the middle once the ack went = %q, %v; want %s", a.res.Bulk, a.err, want)
	}
	after := g.reps[1].Stats()
	if after.ChainVersionReads != before.ChainVersionReads+1 || after.ChainToTail != before.ChainToTail || after.ChainHeldReads != before.ChainHeldReads ||
		after.ChainVersionWaited != before.ChainVersionWaited+1 {
		return fmt.Errorf("middle stats before %+v after %+v: want one read answered at the tail's version from the engine after a wait, none sent to the tail", before, after)
	}
	if g.reps[2].Stats().ChainVersionAnswers == 0 {
		return errors.New("the tail answered no version query")
	}
	return nil
}

// TestChainVersionQueryHeldUpdate: CRAQ's version query when this member
// holds a newer update than the tail's version. An SU chain of three log
// members whose middle's log fsyncs are held (gatedFS): an update of k is
// at the head and the middle, not at the tail. A linearizable read of k at
// the head, and at the middle, asks the tail, whose version is below the
// held update: each answers the committed v1 itself, at once (neither the
// held v2 — the mutation chainReadDirty, caught by
// TestChainCRAQReadDirtyMutation — nor a wait, nor a forward). With the
// tail answering as an older node would (no KEFIR.CHAINVERSION), the read
// is sent to the tail whole, as before the query. Once the write is
// answered every member reads v2.
func TestChainVersionQueryHeldUpdate(t *testing.T) {
	if err := versionHeldUpdate(t, false); err != nil {
		t.Fatal(err)
	}
}

// TestChainHeldNewestMutation: the mutation chainHeldNewest (a member
// answers a dirty read from the newest update it holds, whatever the
// tail's version) serves the held v2 of TestChainVersionQueryHeldUpdate,
// which the tail has not committed.
func TestChainHeldNewestMutation(t *testing.T) {
	mutation.Require(t)
	err := versionHeldUpdate(t, true)
	if err == nil {
		t.Fatal("chainHeldNewest: a member answering an update the tail has not committed was not caught")
	}
	t.Logf("chainHeldNewest caught: %v", err)
}

func versionHeldUpdate(t *testing.T, newest bool) error {
	var q versionQuery
	gate := newGatedFS(vfs.OS{}) // the middle's log fsyncs
	g := newModeChain(t, chain.SU, func(i int, o *Options) {
		q.tune(i, o)
		o.mut.chainHeldNewest = newest
		if i == 1 {
			o.FS = gate
		}
	})
	q.g.Store(g)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	// The tail answers version queries only under its lease, which a new
	// chain's tail may not hold yet: the reads below were then sent to the
	// tail (a query refused: "member 3 holds no lease"), failing the test
	// about one run in three.
	if !tailLeased(g) {
		return errors.New("the tail never held a lease to answer a version query")
	}
	w := startGatedWrite(g, gate, set("k", "v2"), shard.ReqID{Client: 5, Seq: 2})
	defer w.finish()
	// The update reaches the middle (its disk then holds it): k is dirty
	// at both.
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		return g.reps[1].upd.need1([]byte("k")) > 1
	}) {
		return errors.New("the update of k never reached the middle")
	}
	for _, i := range []int{0, 1} {
		before := g.reps[i].Stats()
		start := time.Now()
		res, err := g.chainReadAt(i, "k")
		if err != nil || string(res.Bulk) != "v1" {
			return fmt.Errorf("GET k at node %d while v2 is held there = %q, %v; want v1 answered there", i+1, res.Bulk, err)
		}
		if took := time.Since(start); took > 300*time.Millisecond {
			return fmt.Errorf("GET k at node %d took %v: it waited", i+1, took)
		}
		after := g.reps[i].Stats()
		if after.ChainVersionReads != before.ChainVersionReads+1 || after.ChainToTail != before.ChainToTail || after.ChainHeldReads != before.ChainHeldReads {
			return fmt.Errorf("node %d stats before %+v after %+v: want one read answered at the tail's version, from the engine", i+1, before, after)
		}
	}
	q.old.Store(true) // an older tail: the query fails
	res, err := g.chainReadAt(0, "k")
	if err == nil || !isRedirectTo(err, 3) {
		return fmt.Errorf("GET k at the head, the tail knowing no version query = %q, %v; want it sent to the tail (node 3)", res.Bulk, err)
	}
	if st := g.reps[0].Stats(); st.ChainVersionFallbacks == 0 {
		return fmt.Errorf("head stats %+v: want the failed query counted", st)
	}
	q.old.Store(false)
	if w.answered.Load() {
		return errors.New("the write of v2 was answered before the reads: the update was not in flight")
	}
	if err := w.finish(); err != nil {
		return fmt.Errorf("the write of v2: %v", err)
	}
	for i := range 3 {
		if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
			res, err := g.chainReadAt(i, "k")
			return err == nil && string(res.Bulk) == "v2"
		}) {
			return fmt.Errorf("after: GET k at node %d never answered v2", i+1)
		}
	}
	return nil
}

// TestKeyUpdatesNeedAtMost: the update of a key at most a version, with
// the index's queue out of order as a chain member's is (the driver
// indexes ops as they arrive, apply indexes them again): an op applied
// after later ones arrived must not hide them. Scanning from the queue's
// end for the first op at most v did (the history of
// TestChainReadsAtEveryMemberVersionQuery was not linearizable under AUSI).
func TestKeyUpdatesNeedAtMost(t *testing.T) {
	u := newKeyUpdates(0)
	k := [][]byte{[]byte("k")}
	for _, op := range []uint64{5, 6, 8, 10} {
		u.add(op, k)
	}
	u.add(7, [][]byte{[]byte("other")})
	u.add(5, k) // applied: indexed again, after 6, 8 and 10
	for _, c := range []struct{ v, want uint64 }{{4, 0}, {5, 5}, {7, 6}, {8, 8}, {9, 8}, {10, 10}, {99, 10}} {
		if got := u.needAtMost(k[0], c.v); got != c.want {
			t.Errorf("needAtMost(k, %d) = %d, want %d", c.v, got, c.want)
		}
	}
	if got := u.needAtMost([]byte("absent"), 9); got != 0 {
		t.Errorf("needAtMost(absent, 9) = %d, want 0", got)
	}
}

// TestKeyUpdatesHeldAtMost: the held update a chain member answers a dirty
// read with (chainHeldRead) is the key's latest at most the tail's
// version — not a newer held one, not an older one — and only a blind
// write's: an op re-indexed at apply (no value) does not hide the value
// indexed on arrival, a state-dependent write at that op has none, and an
// MSET naming a key twice leaves it the last value.
func TestKeyUpdatesHeldAtMost(t *testing.T) {
	u := newKeyUpdates(0)
	k := []byte("k")
	held := func(op uint64, keys []string, vals ...string) {
		ks := make([][]byte, len(keys))
		es := make([]overlayEntry, len(keys))
		for i := range keys {
			ks[i] = []byte(keys[i])
			es[i] = heldValue(op, []byte(vals[i]), nil)
		}
		u.addHeld(op, ks, es)
	}
	held(5, []string{"k"}, "a")
	u.add(6, [][]byte{k}) // an APPEND: no value
	held(8, []string{"k", "x", "k"}, "b", "x", "c")
	held(10, []string{"k"}, "d")
	u.add(5, [][]byte{k}) // op 5 applied: indexed again, without a value
	for _, c := range []struct {
		v    uint64
		op   uint64
		val  string
		held bool
	}{{4, 0, "", false}, {5, 5, "a", true}, {7, 6, "", false}, {8, 8, "c", true}, {9, 8, "c", true}, {10, 10, "d", true}, {99, 10, "d", true}} {
		op, e, ok := u.heldAtMost(k, c.v)
		if op != c.op || ok != c.held || string(e.value) != c.val {
			t.Errorf("heldAtMost(k, %d) = %d, %q, %v; want %d, %q, %v", c.v, op, e.value, ok, c.op, c.val, c.held)
		}
	}
	if op, _, ok := u.heldAtMost([]byte("absent"), 9); op != 0 || ok {
		t.Errorf("heldAtMost(absent, 9) = %d, %v; want 0, false", op, ok)
	}
	// Pruned up to 8 (applied there): whatever op at most 8 is found (op
	// 5's apply batch lingers behind 10), the caller reads the engine.
	u.prune(8)
	if op, e, ok := u.heldAtMost(k, 9); op > 8 {
		t.Errorf("heldAtMost(k, 9) after pruning up to 8 = %d, %q, %v; want an op at most 8", op, e.value, ok)
	}
}

// TestChainBlind: which held writes a dirty read may be answered from
// (chainBlind) — those whose effect on each key they write depends on
// nothing the key held — and what each leaves a key holding.
func TestChainBlind(t *testing.T) {
	k := []byte("k")
	for _, c := range []struct {
		name  string
		op    kv.Op
		keys  []string
		vals  []string // "-": a deletion
		blind bool
	}{
		{"SET", set("k", "v"), []string{"k"}, []string{"v"}, true},
		{"SET EX ahead", kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("v"), Now: 1000, ExpireAt: 2000}, []string{"k"}, []string{"v"}, true},
		{"SET EX past", kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("v"), Now: 3000, ExpireAt: 2000}, nil, nil, false},
		{"SET NX", kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("v"), Cond: kv.IfAbsent}, nil, nil, false},
		{"SET GET", kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("v"), ReturnOld: true}, nil, nil, false},
		{"SET KEEPTTL", kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("v"), TTL: kv.TTLKeep}, nil, nil, false},
		{"SET reserved key", kv.Op{Kind: kv.KindSet, Key: kv.SlotTableKey, Value: []byte("v")}, nil, nil, false},
		{"MSET", kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("a"), []byte("1"), []byte("b"), []byte("2")}}, []string{"a", "b"}, []string{"1", "2"}, true},
		{"DEL", kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("a"), []byte("b")}}, []string{"a", "b"}, []string{"-", "-"}, true},
		{"APPEND", kv.Op{Kind: kv.KindAppend, Key: k, Value: []byte("v")}, nil, nil, false},
		{"INCRBY", kv.Op{Kind: kv.KindIncrBy, Key: k, Delta: 1}, nil, nil, false},
		{"CAS", kv.Op{Kind: kv.KindCAS, Key: k, Expected: []byte("a"), Value: []byte("b")}, nil, nil, false},
		{"HSET", kv.Op{Kind: kv.KindHSet, Key: k, Keys: [][]byte{[]byte("f"), []byte("v")}}, nil, nil, false},
	} {
		ks, vals := chainBlind(&c.op, 7)
		if (vals != nil) != c.blind {
			t.Errorf("%s: blind %v, want %v", c.name, vals != nil, c.blind)
			continue
		}
		if len(ks) != len(c.keys) || len(vals) != len(c.keys) {
			t.Errorf("%s: keys %q, %d values; want %q", c.name, ks, len(vals), c.keys)
			continue
		}
		for i := range ks {
			got := string(vals[i].value)
			if vals[i].tomb {
				got = "-"
			}
			if string(ks[i]) != c.keys[i] || got != c.vals[i] || vals[i].op != 7 {
				t.Errorf("%s: key %d = %q holding %q at %d; want %q holding %q at 7", c.name, i, ks[i], got, vals[i].op, c.keys[i], c.vals[i])
			}
		}
	}
}

// TestChainVersionQueriesBatched: concurrent dirty reads at a member share
// version queries (chainAsker). The chain of TestChainVersionQueryHeldUpdate
// (v2 held at the head and the middle, v1 committed); each query takes
// 50 ms. 16 concurrent reads of k at the head send fewer than 16 queries —
// one for the first read, one for those that arrived while it was in
// flight — and every one answers the committed v1 at the head. With the
// tail answering as an older node would, the batch's failed answer sends
// each read to the tail whole, again with fewer queries than reads.
func TestChainVersionQueriesBatched(t *testing.T) {
	var q versionQuery
	gate := newGatedFS(vfs.OS{}) // the middle's log fsyncs
	g := newModeChain(t, chain.SU, func(i int, o *Options) {
		q.tune(i, o)
		if i == 1 {
			o.FS = gate
		}
	})
	q.g.Store(g)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	waitTailLease(t, g)
	w := startGatedWrite(g, gate, set("k", "v2"), shard.ReqID{Client: 5, Seq: 2})
	defer w.finish()
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		return g.reps[1].upd.need1([]byte("k")) > 1
	}) {
		t.Fatal("the update of k never reached the middle")
	}
	q.delay.Store(int64(50 * time.Millisecond))
	const n = 16
	for _, old := range []bool{false, true} {
		q.old.Store(old)
		q.calls.Store(0)
		before := g.reps[0].Stats()
		errs := make(chan error, n)
		for range n {
			go func() {
				res, err := g.chainReadAt(0, "k")
				switch {
				case old && !isRedirectTo(err, 3):
					errs <- fmt.Errorf("GET k at the head, the tail an older node: %q, %v; want it sent to the tail (node 3)", res.Bulk, err)
				case !old && (err != nil || string(res.Bulk) != "v1"):
					errs <- fmt.Errorf("GET k at the head while v2 is held there = %q, %v; want v1", res.Bulk, err)
				default:
					errs <- nil
				}
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		after := g.reps[0].Stats()
		calls := q.calls.Load()
		sent := after.ChainVersionQueries - before.ChainVersionQueries
		t.Logf("older tail %v: %d concurrent dirty reads, %d queries", old, n, calls)
		if calls >= n || calls == 0 || sent != uint64(calls) {
			t.Fatalf("older tail %v: %d concurrent dirty reads sent %d queries (counted %d): want fewer queries than reads", old, n, calls, sent)
		}
		if old && after.ChainVersionFallbacks-before.ChainVersionFallbacks != n {
			t.Fatalf("older tail: head stats before %+v after %+v: want every read counted as a fallback", before, after)
		}
		if !old && after.ChainVersionReads-before.ChainVersionReads != n {
			t.Fatalf("head stats before %+v after %+v: want %d reads answered at the tail's version", before, after, n)
		}
	}
	if w.answered.Load() {
		t.Fatal("the write of v2 was answered before the reads: the update was not in flight")
	}
}

// TestChainVersionQueryAfterTheReadBegan: a dirty read takes the answer of
// a query sent after it began, not of one in flight when it arrived, whose
// answer the tail may have computed before a write — answered before the
// read began — committed there. The tail's version is a counter here: the
// first query reads it (1) and is held; the version moves to 2 (a write
// committed, answered); a read that begins then must get at least 2. The
// mutation chainVersionInFlight (it takes the query in flight) gets 1.
func TestChainVersionQueryAfterTheReadBegan(t *testing.T) {
	if err := versionAfterBegan(false); err != nil {
		t.Fatal(err)
	}
}

func TestChainVersionInFlightMutation(t *testing.T) {
	mutation.Require(t)
	err := versionAfterBegan(true)
	if err == nil {
		t.Fatal("chainVersionInFlight: a read answered by a query sent before it began was not caught")
	}
	t.Logf("chainVersionInFlight caught: %v", err)
}

func versionAfterBegan(inFlight bool) error {
	var ver atomic.Uint64
	ver.Store(1)
	asked := make(chan struct{}, 4)
	release := make(chan struct{})
	r := &Replica{}
	r.mut.chainVersionInFlight = inFlight
	r.opts.AskTail = func(context.Context, uint64, string, uint64) (uint64, error) {
		v := ver.Load() // the tail computes its answer on arrival
		asked <- struct{}{}
		<-release
		return v, nil
	}
	type answer struct {
		v   uint64
		err error
	}
	first, second := make(chan answer, 1), make(chan answer, 1)
	ask := func(c chan answer) {
		v, err := r.askVersion(context.Background(), 3, "tail", 1)
		c <- answer{v, err}
	}
	go ask(first)
	<-asked // the first query is at the tail, its answer 1
	ver.Store(2)
	go ask(second) // begins after the version moved
	time.Sleep(20 * time.Millisecond)
	close(release)
	a, b := <-first, <-second
	if a.err != nil || b.err != nil || a.v != 1 {
		return fmt.Errorf("answers %+v, %+v", a, b)
	}
	if b.v < 2 {
		return fmt.Errorf("a read that began after the tail's version moved to 2 was answered %d", b.v)
	}
	return nil
}

// waitTailLease waits until the chain's tail (member 3) answers version
// queries: it does only under its lease, which a new chain's tail may not
// hold yet (a read sent before then goes to the tail whole).
func waitTailLease(t *testing.T, g *chainGroup) {
	t.Helper()
	if !tailLeased(g) {
		t.Fatal("the tail never held a lease to answer a version query")
	}
}

// tailLeased reports whether the tail answers a version query within 2 s.
func tailLeased(g *chainGroup) bool {
	return testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		_, err := g.reps[2].ChainVersion(g.reps[0].chainEpoch.Load())
		return err == nil
	})
}
