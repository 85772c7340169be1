package vrshard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// The read fence is checked after a read's freshness wait, not only before
// it: a replica of a slot's old group that has not applied the hand-over
// passes the fence on arrival, waits until it applied what the read must
// see — the hand-over among it — and must then refuse, not serve its frozen
// copy while the slot's new owner takes writes. Here a follower of the
// source is held (its driver stopped) through the move and a write at the
// destination; a session read whose token is past the hand-over arrives,
// waits, and the follower is released. (The hold is a test hook, read
// only in a -tags mutations build.)
func TestReadAtALaggingReplicaOfTheSourceIsFencedAfterItsWait(t *testing.T) {
	mutation.Require(t)
	var held atomic.Uint64 // the held follower's id (0: none)
	release := make(chan struct{})
	g1, g2, must := twoSlotGroups(t, func(o *Options) {
		o.FollowerWait = 20 * time.Second // the read waits rather than redirects
		o.mut.afterStep = func(r *Replica, _ peerMsg) {
			if held.Load() == r.opts.VR.Self {
				<-release
			}
		}
	})
	const timeout = 10 * time.Second
	k := "acct"
	s := kv.KeySlot([]byte(k))
	v := must(g1, set(k, "old")).Version
	g1.waitApplied(v, timeout)
	l := g1.leader(timeout)
	f := g1.reps[(l+1)%len(g1.reps)]
	held.Store(f.opts.VR.Self)
	released := false
	unhold := func() {
		if !released {
			released = true
			held.Store(0)
			close(release)
		}
	}
	defer unhold()

	moveSlots(t, g1, g2, []kv.SlotRange{{Start: s, End: s}}, func() {})
	must(g2, set(k, "new")) // acknowledged at the slot's owner
	need := g1.reps[l].applied.Load()
	if f.applied.Load() >= need {
		t.Fatalf("the held follower applied %d, the hand-over is within %d: not lagging", f.applied.Load(), need)
	}
	type answer struct {
		res kv.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := f.Read(context.Background(), get(k), level.ConsSession, shard.Session{LastWrite: need})
		done <- answer{res, err}
	}()
	time.Sleep(200 * time.Millisecond) // the read passes the fence on arrival and waits
	unhold()
	select {
	case a := <-done:
		var se *kv.SlotError
		if !errors.As(a.err, &se) || se.Slot != s {
			t.Fatalf("session read at the lagging follower after its wait: %q, %v; want the fence's *kv.SlotError (slot %d): the owner has \"new\"",
				a.res.Bulk, a.err, s)
		}
	case <-time.After(timeout):
		t.Fatal("the session read did not return")
	}
}

// twoSlotGroups starts two VR groups on three node transports, group 1
// owning every slot and group 2 none (tune1 tunes group 1's replicas), and
// returns them with a write that must succeed at a group's leader.
func twoSlotGroups(t *testing.T, tune1 func(*Options)) (g1, g2 *cluster, must func(*cluster, kv.Op) kv.Result) {
	t.Helper()
	g1, g2 = twoGroups(t, tune1, nil)
	must = func(g *cluster, op kv.Op) kv.Result { t.Helper(); return mustWrite(t, g, op) }
	must(g1, slotOp(kv.KindSlotInit, []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}, 0, 0, 1))
	must(g2, slotOp(kv.KindSlotInit, nil, 0, 0, 1))
	return g1, g2, must
}
