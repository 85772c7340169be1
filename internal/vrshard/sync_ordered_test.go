package vrshard

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// A blind sync write is answered at its ordered point (docs/design/cad.md
// §12): Apply returns once the leader appended it, and Wait awaits its
// commit and apply. Until then nobody sees it — not even a read of its own
// key (the RESP front door makes such a read on the same connection wait
// for the write first): a sync write is visible once applied, as before.
// Every fsync is held here, so nothing can commit while the test looks.
func TestSyncBlindWriteIsAnsweredAtItsOrderedPoint(t *testing.T) {
	leader, gates, w0 := heldLeader(t, nil, "k", "v0")
	ctx := context.Background()

	type applied struct {
		w shard.WriteReq
		p shard.Pending
	}
	ch := make(chan applied, 1)
	go func() {
		w, p := applyOne(t, leader, set("k", "v1"), level.Sync, shard.ReqID{})
		ch <- applied{w, p}
	}()
	var a applied
	select {
	case a = <-ch:
	case <-time.After(2 * time.Second):
		t.Fatal("Apply of a blind sync write waited for its commit (no fsync can finish)")
	}
	if a.w.Err != nil || a.w.Result.Kind != kv.ResOK || a.w.Result.Version <= w0.Version || len(a.p.Acks) != 1 {
		t.Fatalf("ordered sync write: %+v, pending %+v; want OK at its op and one pending wait", a.w, a.p)
	}
	if acked(a.p) {
		t.Fatal("a sync write acknowledged while no fsync could finish")
	}
	// Not applied, not acknowledged: every read, deferred or not, is
	// served at once with the value before it.
	if r, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{}); err != nil || string(r.Bulk) != "v0" {
		t.Fatalf("read of k behind its uncommitted sync write: %+v, %v; want v0 at once", r, err)
	}
	if r, p, err := leader.ReadDeferred(ctx, get("k"), level.ConsLinearizable, shard.Session{}); err != nil || string(r.Bulk) != "v0" || !p.IsZero() {
		t.Fatalf("deferred read of k behind its uncommitted sync write: %+v, %+v, %v; want v0 at once", r, p, err)
	}
	gates.release()
	if err := leader.Wait(ctx, a.p); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if r, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{}); err != nil || string(r.Bulk) != "v1" || r.Version != a.w.Result.Version {
		t.Fatalf("read after Wait: %+v, %v; want v1 at %d", r, err, a.w.Result.Version)
	}
}

// With the change switched off (syncWaitsInApply) Apply answers a blind
// sync write only once it is applied: the behaviour §12 replaced, kept so
// the two can be compared.
func TestSyncWaitsInApplyHoldsApplyUntilCommit(t *testing.T) {
	mutation.Require(t)
	leader, gates, _ := heldLeader(t, func(o *Options) { o.mut.syncWaitsInApply = true }, "k", "v0")
	done := make(chan shard.Pending, 1)
	go func() {
		_, p := applyOne(t, leader, set("k", "v1"), level.Sync, shard.ReqID{})
		done <- p
	}()
	select {
	case <-done:
		t.Fatal("Apply returned before any fsync could finish")
	case <-time.After(200 * time.Millisecond):
	}
	gates.release()
	if p := <-done; len(p.Acks) != 0 {
		t.Fatalf("pending %+v; want nothing left for Wait", p)
	}
}

// A retry of a sync SET that was already applied is answered from the client
// table without being appended; the driver must not keep waiting for its
// append (r.ordEarly would grow by one entry per such retry until the next
// leader change).
func TestRetryOfAnAppliedSyncWriteLeavesNothingBehind(t *testing.T) {
	mutation.Require(t)
	var pending atomic.Int64
	c := newCluster(t, 3, func(o *Options) {
		o.mut.afterHandle = func(r *Replica) {
			if r.isLeader.Load() {
				pending.Store(int64(len(r.ordEarly)))
			}
		}
	})
	leader := c.reps[c.leader(5*time.Second)]
	ctx := context.Background()
	id := shard.ReqID{Client: 42, Seq: 1}
	first, err := leader.Write(ctx, set("k", "v"), level.Sync, id)
	if err != nil {
		t.Fatal(err)
	}
	again, err := leader.Write(ctx, set("k", "v"), level.Sync, id)
	if err != nil || again.Version != first.Version {
		t.Fatalf("retry: %+v, %v; want the first reply (version %d)", again, err, first.Version)
	}
	// Another write's Ready runs the hook after the retry was answered.
	if _, err := leader.Write(ctx, set("other", "x"), level.Sync, shard.ReqID{Client: 43, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if got := pending.Load(); got != 0 {
		t.Fatalf("%d sync writes still wait for an append that will not come", got)
	}
}

// The same for cad and async writes (r.early): a retry of one already
// applied is answered from the client table, and a retry of one still in
// flight is dropped by the core and answered with the original at its
// commit; neither is appended, so indexEarly never drops the retry's entry.
// Each would leak one entry (and its keys) until the next leader change.
func TestRetryOfAnEarlyWriteLeavesNothingBehind(t *testing.T) {
	mutation.Require(t)
	for _, d := range []level.Durability{level.CAD, level.Async} {
		t.Run(d.String(), func(t *testing.T) {
			var pending atomic.Int64
			leader, gates, _ := heldLeader(t, func(o *Options) {
				o.mut.afterHandle = func(r *Replica) {
					if r.isLeader.Load() {
						pending.Store(int64(len(r.early)))
					}
				}
			}, "k0", "v0")
			ctx := context.Background()
			// In flight: acknowledged early, not committed (fsyncs held).
			inflight := shard.ReqID{Client: 41, Seq: 1}
			first, err := leader.Write(ctx, set("k", "v1"), d, inflight)
			if err != nil {
				t.Fatal(err)
			}
			retried := make(chan error, 1)
			go func() {
				again, err := leader.Write(ctx, set("k", "v1"), d, inflight)
				if err == nil && again.Version != first.Version {
					err = fmt.Errorf("retry answered at version %d, want %d", again.Version, first.Version)
				}
				retried <- err
			}()
			time.Sleep(50 * time.Millisecond)
			gates.release()
			if err := <-retried; err != nil {
				t.Fatalf("retry of an in-flight %v write: %v", d, err)
			}
			waitReadable(t, leader, first.Version)
			// Applied: answered from the client table.
			applied := shard.ReqID{Client: 42, Seq: 1}
			w, err := leader.Write(ctx, set("j", "v"), d, applied)
			if err != nil {
				t.Fatal(err)
			}
			waitReadable(t, leader, w.Version)
			if again, err := leader.Write(ctx, set("j", "v"), d, applied); err != nil || again.Version != w.Version {
				t.Fatalf("retry of an applied %v write: %+v, %v; want version %d", d, again, err, w.Version)
			}
			// Another write's Ready runs the hook after the retries were answered.
			if _, err := leader.Write(ctx, set("other", "x"), level.Sync, shard.ReqID{Client: 43, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			if got := pending.Load(); got != 0 {
				t.Fatalf("%d early writes still wait for an append that will not come", got)
			}
		})
	}
}
