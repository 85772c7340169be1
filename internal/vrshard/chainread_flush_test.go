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
	mutation.Require(t)
	var armed atomic.Bool
	release := make(chan struct{})
	g := newModeChain(t, chain.SU, func(i int, o *Options) {
		if i != 1 {
			return
		}
		o.mut.afterStep = func(r *Replica, m peerMsg) {
			if cm, ok := m.(*chainMsg); ok && armed.Load() && cm.Type == chain.MsgAck && cm.From == 3 {
				<-release // the middle's driver: nothing of the ack is published or passed on
			}
		}
	})
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	for i := range 3 {
		if got := g.read(i, "k"); got != "v1" {
			t.Fatalf("before: GET k at node %d = %q", i+1, got)
		}
	}
	armed.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := g.tryWrite(0, kv.Op{Kind: kv.KindFlush}, shard.ReqID{Client: 5, Seq: 2})
		done <- err
	}()
	released := false
	unhold := func() {
		if !released {
			released = true
			armed.Store(false)
			close(release)
		}
	}
	defer func() { unhold(); <-done }()

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
	unhold()
	if err := <-done; err != nil {
		done <- nil
		t.Fatalf("the flush: %v", err)
	}
	done <- nil
}
