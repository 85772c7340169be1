package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// TestChainAUSIReadsAtTheDurablePoint: under AUSI a strong read serves a
// value only once it is at the durable point (docs/design/chain.md,
// "Strong reads at the durable point"). A D-D-D chain under AUSI with the
// version query on, the tail's log fsyncs held (gatedFS): a cad write of
// k=v2 is answered at commit — every member holds it, no disk does. A
// linearizable read of k at each member, through each path (the head and
// the middle: dirty there, the version query, its wait for the durable
// point, then sent to the tail; the tail: its wait), must answer neither
// v2, which a power cut of every member could still take, nor v1, older
// than a write answered before the read began: it waits. A read waiting at
// the tail is answered v2 as soon as the fsync is let go — woken by the
// durable point rising, nothing new applied. Without the rule (R at the
// commit point, the engine read as it is) every member answers v2 at once.
// A transaction's start at the head waits too (its snapshot would lack v2
// at the durable point, or hold it at the commit point).
func TestChainAUSIReadsAtTheDurablePoint(t *testing.T) {
	gate := newGatedFS(vfs.OS{}) // the tail's log fsyncs
	var q versionQuery
	g := newModeChain(t, chain.AUSI, func(i int, o *Options) {
		q.tune(i, o)
		if i == 2 {
			o.FS = gate
		}
	})
	q.g.Store(g)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.write(0, set("other", "o"), shard.ReqID{Client: 5, Seq: 2})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	for i := range 3 {
		if got := g.read(i, "k"); got != "v1" {
			t.Fatalf("before: GET k at node %d = %q", i+1, got)
		}
	}
	gate.hold()
	defer gate.release()
	if err := g.writeOnce(0, set("k", "v2"), level.CAD, shard.ReqID{Client: 5, Seq: 3}, 2*time.Second); err != nil {
		t.Fatalf("the cad write of v2 (answered at commit under AUSI): %v", err)
	}
	if !testgroup.Until(time.Second, time.Millisecond, func() bool { return gate.held.Load() > 0 }) {
		t.Fatal("no fsync of the tail is held: v2 may be durable already")
	}
	// The tail's version is its commit point, not its durable point: v2
	// was answered at commit, and a member that has not applied it yet
	// must wait for it (at the durable point it would need only v1's op
	// and serve v1, older than an answered write).
	if v, err := g.reps[2].ChainVersion(g.reps[2].chainEpoch.Load()); err != nil || v < g.reps[0].applied.Load() {
		t.Fatalf("the tail's version = %d, %v; want at least v2's op %d (answered at commit)", v, err, g.reps[0].applied.Load())
	}
	for i := range 3 {
		if !testgroup.Until(time.Second, 2*time.Millisecond, func() bool { return g.reps[i].Info().Applied >= g.reps[0].Info().Applied }) {
			t.Fatalf("node %d did not apply v2", i+1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		res, err := g.reps[i].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		cancel()
		if err == nil {
			t.Fatalf("GET k at node %d while v2 is committed and on no disk = %q; want a wait (v2 is not durable, v1 is older than an answered write)", i+1, res.Bulk)
		}
		t.Logf("node %d: %v", i+1, err)
	}
	if st := g.reps[0].Stats(); q.calls.Load() == 0 || st.ChainVersionFallbacks == 0 || st.ChainDurableWaits == 0 {
		t.Fatalf("head stats %+v, %d version queries: want the version query, its wait for the durable point and its fallback", st, q.calls.Load())
	}
	// A transaction's start at the head: its snapshot pinned neither past
	// the durable point nor before the answered write — it waits.
	if _, ok := g.reps[0].TryTxBegin(); ok {
		t.Fatal("TryTxBegin at the head pinned a snapshot while v2 is on no disk")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if snap, err := g.reps[0].TxBegin(ctx, nil); err == nil {
		v, _, _, _, _ := snap.Get([]byte("k"))
		snap.Close()
		t.Fatalf("TxBegin at the head while v2 is on no disk: a snapshot reading k = %q; want a wait", v)
	}
	cancel()
	if res, err := g.chainReadAt(0, "other"); err != nil || string(res.Bulk) != "o" {
		t.Fatalf("GET other (durable) at the head = %q, %v", res.Bulk, err)
	}
	type answer struct {
		res kv.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		res, err := g.reps[2].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		done <- answer{res, err}
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case a := <-done:
		t.Fatalf("GET k at the tail answered %q, %v before its fsync", a.res.Bulk, a.err)
	default:
	}
	gate.release()
	released := time.Now()
	a := <-done
	if a.err != nil || string(a.res.Bulk) != "v2" {
		t.Fatalf("GET k at the tail after its fsync = %q, %v; want v2", a.res.Bulk, a.err)
	}
	if took := time.Since(released); took > time.Second {
		t.Fatalf("the waiting read took %v after the fsync: not woken by the durable point", took)
	}
	if st := g.reps[2].Stats(); st.ChainDurableWaits == 0 {
		t.Fatalf("tail stats %+v: want waits for the durable point", st)
	}
	for i := range 3 {
		if got := g.read(i, "k"); got != "v2" {
			t.Fatalf("after: GET k at node %d = %q", i+1, got)
		}
	}
	snap, err := g.reps[0].TxBegin(context.Background(), nil)
	if err != nil {
		t.Fatalf("TxBegin at the head after the fsync: %v", err)
	}
	defer snap.Close()
	if v, _, _, _, err := snap.Get([]byte("k")); err != nil || string(v) != "v2" {
		t.Fatalf("TxBegin at the head after the fsync: k = %q, %v; want v2", v, err)
	}
}

// TestChainAUSIHotKeyReadIsNotStarved: a strong read under AUSI waits for
// the durable point at most once. A D-D-D chain under AUSI whose tail's
// log fsyncs take 20 ms (gatedFS.delay), and a writer sending cad APPENDs
// to one key back to back (each answered at commit, well before the fsync
// that covers it): a linearizable read of the key at the tail finds an
// update not yet durable, waits for the fsync covering it, and answers what
// it read (the key's value at its read, committed then, durable now). Were
// it to read again after the wait, it would find a newer update beyond the
// durable point each time — the writer's next ones — and wait again, until
// its deadline: starved for as long as the writes go on.
func TestChainAUSIHotKeyReadIsNotStarved(t *testing.T) {
	gate := newGatedFS(vfs.OS{}) // the tail's log fsyncs
	g := newModeChain(t, chain.AUSI, func(i int, o *Options) {
		if i == 2 {
			o.FS = gate
		}
	})
	g.write(0, set("k", "v"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(2, 0)
	gate.delay.Store(int64(20 * time.Millisecond))
	defer gate.delay.Store(0)
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		seq := uint64(1)
		for {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			seq++
			op := kv.Op{Kind: kv.KindAppend, Key: []byte("k"), Value: []byte("+")}
			if err := g.writeOnce(0, op, level.CAD, shard.ReqID{Client: 6, Seq: seq}, 2*time.Second); err != nil {
				writerDone <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-writerDone; err != nil {
			t.Errorf("writer: %v", err)
		}
	}()
	time.Sleep(100 * time.Millisecond) // the writes under way
	for n := range 5 {
		before := g.reps[2].Stats().ChainDurableWaits
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		res, err := g.reps[2].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		cancel()
		waits := g.reps[2].Stats().ChainDurableWaits - before
		if err != nil {
			t.Fatalf("read %d of the hot key at the tail: %v after %v, %d waits for the durable point: starved by the writes", n, err, time.Since(start), waits)
		}
		if waits > 1 {
			t.Fatalf("read %d of the hot key at the tail waited %d times for the durable point; want at most one", n, waits)
		}
		if len(res.Bulk) == 0 {
			t.Fatalf("read %d: empty value", n)
		}
	}
}

// TestChainAUSIHeldReadWaitsForTheDisks: a read answered from an update
// held and not applied (Options.ChainHeldReads, chainHeldRead; off in the
// node) is declined under AUSI, where a strong read serves only values at
// the durable point: a held update is above what the member applied, so
// above R. A D-D-D chain under AUSI with held reads on, the tail's fsyncs
// held and the middle's acknowledgement held in its driver: the tail
// committed k=v2 (its version covers it), the middle holds it unapplied,
// no disk below the middle has it. A linearizable read of k at the middle
// must wait; with held reads back on under AUSI (chainHeldRead's AUSI
// check removed: review34d found no test that failed) it answers v2 at
// once, a value a power cut of every member could take.
func TestChainAUSIHeldReadWaitsForTheDisks(t *testing.T) {
	gate := newGatedFS(vfs.OS{}) // the tail's log fsyncs
	var q versionQuery           // sets ChainHeldReads
	g, h := newAckHeldChainMode(t, chain.AUSI, func(i int, o *Options) {
		q.tune(i, o)
		o.mut.chainVersionWait = 5 * time.Second // the test lets the ack go
		if i == 2 {
			o.FS = gate
		}
	})
	q.g.Store(g)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	if got := g.read(1, "k"); got != "v1" {
		t.Fatalf("before: GET k at the middle = %q", got)
	}
	// Without the tail's lease its version query is refused and the read
	// goes to the tail: the held read would not be tried (versionHeldUpdate).
	if !tailLeased(g) {
		t.Fatal("the tail never held a lease to answer a version query")
	}
	gate.hold()
	defer gate.release()
	before := g.reps[2].applied.Load()
	h.start(g, set("k", "v2"), shard.ReqID{Client: 5, Seq: 2})
	if !testgroup.Until(2*time.Second, time.Millisecond, func() bool {
		return g.reps[2].applied.Load() > before && gate.held.Load() > 0
	}) {
		t.Fatal("the tail did not apply v2 with its fsync held")
	}
	// v1 (at the durable point; v2 is answered to nobody yet), a wait or
	// the tail's address are all right; v2 is not.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	res, err := g.reps[1].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
	cancel()
	if err == nil && string(res.Bulk) == "v2" {
		t.Fatalf("GET k at the middle, v2 held there, committed at the tail, on no disk = v2 (held reads %d); want v1, a wait or the tail",
			g.reps[1].Stats().ChainHeldReads)
	}
	t.Logf("GET k at the middle: %q, %v", res.Bulk, err)
	gate.release()
	h.finish("the write of v2")
}
