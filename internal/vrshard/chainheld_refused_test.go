package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// TestChainHeldReadOfARefusedWrite (review29): a blind SET held at a chain
// member is not the key's value at the tail's version if its apply refused
// it. Here a cross-group transaction's prepare write-locks k in the chain
// group (a chain group of a cluster takes part in KEFIR.TX across groups),
// so the lock rule at apply (kv.txLockGate) refuses a plain SET k v2 that
// entered the log after it: the tail applies it as a no-op and answers v1.
// A linearizable read at the middle — which holds the SET, its
// acknowledgement held there so it has not applied it — asks the tail for
// its version, finds the SET at most that version, and must answer v1, the
// committed state; chainHeldRead answers v2, a value no committed state
// had. (A Duplicate entry — a retry ordered twice, at an old and a new head —
// is skipped at apply the same way: chaincore.go, replica.go applyCommitted.)
func TestChainHeldReadOfARefusedWrite(t *testing.T) {
	var q versionQuery
	g, h := newAckHeldChainTuned(t, func(i int, o *Options) {
		q.tune(i, o)
		o.mut.chainVersionWait = 5 * time.Second // the test lets the ack go
	})
	q.g.Store(g)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	prep, err := kv.NewTxPrepare([]byte("t1"), []byte("k"), 1<<40, kv.TxOrigin{}, nil, []kv.Op{set("k", "vx")})
	if err != nil {
		t.Fatal(err)
	}
	if res := g.write(0, prep, shard.ReqID{Client: 6, Seq: 1}); string(res.Bulk) != string(kv.TxPreparedReply) {
		t.Fatalf("the prepare: %+v, want it prepared (k write-locked)", res)
	}
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	waitTailLease(t, g)
	before := g.reps[2].applied.Load()
	h.start(g, set("k", "v2"), shard.ReqID{Client: 5, Seq: 2})
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool { return g.reps[2].applied.Load() > before }) {
		t.Fatal("the tail never applied the SET")
	}
	if res, err := g.chainReadAt(2, "k"); err != nil || string(res.Bulk) != "v1" {
		t.Fatalf("GET k at the tail = %q, %v; want v1 (the SET refused at apply: k is locked)", res.Bulk, err)
	}
	if g.reps[1].applied.Load() > before {
		t.Fatal("the middle applied the SET: the ack was not held")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	type answer struct {
		res kv.Result
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := g.reps[1].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		got <- answer{res, err}
	}()
	// A held read would answer at once; the engine's way waits for the
	// middle's apply, which the ack let go brings.
	var a answer
	select {
	case a = <-got:
	case <-time.After(300 * time.Millisecond):
		h.unhold()
		a = <-got
	}
	h.unhold()
	<-h.done // the SET's answer: refused (locked)
	h.done <- nil
	if a.err != nil || string(a.res.Bulk) != "v1" {
		t.Fatalf("GET k at the middle, the refused SET k v2 held there = %q, %v; want v1, the committed value (held reads %d)", a.res.Bulk, a.err, g.reps[1].Stats().ChainHeldReads)
	}
	if n := g.reps[1].Stats().ChainHeldReads; n != 0 {
		t.Fatalf("%d reads answered from a held update while k's lock could refuse it", n)
	}
}
