package vrshard

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// ackHold holds a chain's middle member's driver, once started, after it
// steps the tail's acknowledgement: nothing of the ack is published or
// passed on, so the update it acknowledges is applied at the tail and in
// flight at the middle and the head.
type ackHold struct {
	t        *testing.T
	armed    atomic.Bool
	started  bool
	released bool
	release  chan struct{}
	done     chan error
}

// newAckHeldChain is an SU chain of three log members whose middle's
// driver h holds once h.start armed it.
func newAckHeldChain(t *testing.T) (*chainGroup, *ackHold) {
	return newAckHeldChainTuned(t, nil)
}

// newAckHeldChainTuned is newAckHeldChain with every member's options
// adjusted by tune (before Open).
func newAckHeldChainTuned(t *testing.T, tune func(i int, o *Options)) (*chainGroup, *ackHold) {
	return newAckHeldChainMode(t, chain.SU, tune)
}

// newAckHeldChainMode is newAckHeldChainTuned in update mode mode.
func newAckHeldChainMode(t *testing.T, mode chain.Mode, tune func(i int, o *Options)) (*chainGroup, *ackHold) {
	mutation.Require(t)
	h := &ackHold{t: t, release: make(chan struct{}), done: make(chan error, 1)}
	g := newModeChain(t, mode, func(i int, o *Options) {
		if tune != nil {
			tune(i, o)
		}
		if i != 1 {
			return
		}
		o.mut.afterStep = func(r *Replica, m peerMsg) {
			if cm, ok := m.(*chainMsg); ok && h.armed.Load() && cm.Type == chain.MsgAck && cm.From == 3 {
				<-h.release
			}
		}
	})
	t.Cleanup(func() {
		if h.started {
			h.unhold()
			<-h.done
		}
	})
	return g, h
}

// start arms the hold and writes op at the head in the background.
func (h *ackHold) start(g *chainGroup, op kv.Op, id shard.ReqID) {
	h.started = true
	h.armed.Store(true)
	go func() {
		_, err := g.tryWrite(0, op, id)
		h.done <- err
	}()
}

func (h *ackHold) unhold() {
	if !h.released {
		h.released = true
		h.armed.Store(false)
		close(h.release)
	}
}

// finish lets the ack go and fails the test if the write (what) failed.
func (h *ackHold) finish(what string) {
	h.t.Helper()
	h.unhold()
	if err := <-h.done; err != nil {
		h.done <- nil
		h.t.Fatalf("%s: %v", what, err)
	}
	h.done <- nil
}

// TestChainCRAQReadWhileAFlushIsInFlight: an op that writes keys it does
// not name (kv.Op.WritesAll: FLUSHALL, a script's undeclared keys, a
// cross-group transaction's decide and resolve) makes every key dirty at a
// member until the member applies it, as a named key's update does
// (chainread.go). Here a FLUSHALL has reached the tail of a D-D-D chain
// under SU — the tail applied it and answers a read of k with nothing —
// while the acknowledgement is held at the middle member (its driver stops
// after stepping the tail's ack: a test hook), so the head has not applied
// it. A linearizable read of k at the head after the tail's answer must
// not return k's value from before the flush: that read follows one that
// saw the flush.
func TestChainCRAQReadWhileAFlushIsInFlight(t *testing.T) {
	g, h := newAckHeldChain(t)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	for i := range 3 {
		if got := g.read(i, "k"); got != "v1" {
			t.Fatalf("before: GET k at node %d = %q", i+1, got)
		}
	}
	h.start(g, kv.Op{Kind: kv.KindFlush}, shard.ReqID{Client: 5, Seq: 2})

	// The tail applies the flush: k is gone there.
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		res, err := g.chainReadAt(2, "k")
		return err == nil && res.Bulk == nil
	}) {
		t.Fatal("the tail kept answering k for 2 s: the flush never reached it")
	}
	// Then, at the head (its lease runs on: its driver is not held).
	res, err := g.chainReadAt(0, "k")
	if err == nil && string(res.Bulk) == "v1" {
		t.Fatalf("GET k at the head after the tail answered it missing (the flush applied there) = %q: "+
			"a read older than one that completed before it began (the flush in flight at the head made no key dirty)", res.Bulk)
	}
	t.Logf("GET k at the head while the flush's ack is held: %q, %v", res.Bulk, err)
	h.finish("the flush")
}

// TestChainCRAQReadWhileASlotHandOverIsInFlight: a slot-table op changes
// which keys the group serves without naming them, so while one is in
// flight at a member every key is dirty there (indexChain). A member
// acknowledges upstream before its host applies, so without this the head
// could answer a hand-over (and the destination take the slot's writes)
// while a member still served the slot's keys clean under its old table.
// Here the hand-over (migrating → none) has been applied at the tail, which
// refuses k, and is held at the middle (as in the flush test); a
// linearizable read of k at the head must not be served from the head's
// table of before the hand-over.
func TestChainCRAQReadWhileASlotHandOverIsInFlight(t *testing.T) {
	g, h := newAckHeldChain(t)
	seq := uint64(0)
	w := func(op kv.Op) {
		t.Helper()
		seq++
		g.write(0, op, shard.ReqID{Client: 5, Seq: seq})
	}
	w(slotOp(kv.KindSlotInit, []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}, 0, 0, 1))
	w(set("k", "v1"))
	slot := kv.KeySlot([]byte("k"))
	rs := []kv.SlotRange{{Start: slot, End: slot}}
	w(slotOp(kv.KindSlotSet, rs, kv.SlotMigrating, 2, 2))
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	for i := range 3 {
		if got := g.read(i, "k"); got != "v1" {
			t.Fatalf("before: GET k at node %d = %q", i+1, got)
		}
	}
	seq++
	h.start(g, slotOp(kv.KindSlotSet, rs, kv.SlotNone, 2, 2), shard.ReqID{Client: 5, Seq: seq})
	var tailErr error
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		_, tailErr = g.chainReadAt(2, "k")
		return tailErr != nil
	}) {
		t.Fatal("the tail kept serving k for 2 s: the hand-over never reached it")
	}
	res, err := g.chainReadAt(0, "k")
	if err == nil {
		t.Fatalf("GET k at the head while the hand-over is in flight there (the tail refuses k: %v) = %q: served under the table of before it", tailErr, res.Bulk)
	}
	t.Logf("GET k at the head while the hand-over's ack is held: %v (the tail: %v)", err, tailErr)
	h.finish("the hand-over")
}

// TestChainTxBeginWhileAnUpdateIsInFlight: a transaction begins at the
// chain's head; its snapshot must hold every update a read could already
// have returned — at the tail, an update the head has not applied yet. The
// event loop's TryTxBegin must not pin the head's state while one is in
// flight there (it leaves the BEGIN to TxBegin, which waits).
func TestChainTxBeginWhileAnUpdateIsInFlight(t *testing.T) {
	g, h := newAckHeldChain(t)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	// With nothing in flight the head begins on the loop (the test below
	// would pass for nothing if it never did).
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		snap, ok := g.reps[0].TryTxBegin()
		if ok {
			snap.Close()
		}
		return ok
	}) {
		t.Fatal("TryTxBegin at a quiet head never began")
	}
	h.start(g, set("k", "v2"), shard.ReqID{Client: 5, Seq: 2})
	if !testgroup.Until(2*time.Second, 2*time.Millisecond, func() bool {
		res, err := g.chainReadAt(2, "k")
		return err == nil && string(res.Bulk) == "v2"
	}) {
		t.Fatal("the tail never answered v2")
	}
	if snap, ok := g.reps[0].TryTxBegin(); ok {
		v, _, _, _, err := snap.Get([]byte("k"))
		snap.Close()
		if err != nil || string(v) != "v2" {
			t.Fatalf("a transaction begun at the head after the tail answered v2 reads k = %q, %v", v, err)
		}
	}
	h.finish("the write")
}
