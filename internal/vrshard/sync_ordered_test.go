package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// A blind sync write is answered at its ordered point (docs/design/cad.md
// §12): Apply returns once the leader appended it, Wait awaits its commit
// and apply, and a read pipelined behind it either ignores it (another key,
// served at once) or waits for it (its own key). Every fsync is held here,
// so nothing can commit while the test looks.
func TestSyncBlindWriteIsAnsweredAtItsOrderedPoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*mutations)
	}{
		{"indexed", nil},
		{"syncEarlyUnindexed", func(m *mutations) { m.syncEarlyUnindexed = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := tc.mut != nil
			c, gates, _ := gatedCluster(t, func(o *Options) {
				o.RequestTimeout = 5 * time.Second
				if tc.mut != nil {
					tc.mut(&o.mut)
				}
			})
			leader := c.reps[c.leader(5*time.Second)]
			ctx := context.Background()
			w0, err := leader.Write(ctx, set("k", "v0"), level.Sync, shard.ReqID{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leader.Write(ctx, set("other", "o"), level.Sync, shard.ReqID{}); err != nil {
				t.Fatal(err)
			}
			waitReadable(t, leader, w0.Version+1)
			gates.hold()
			defer gates.release()

			applied := make(chan struct {
				w shard.WriteReq
				p shard.Pending
			}, 1)
			go func() {
				w, p := applyOne(t, leader, set("k", "v1"), level.Sync, shard.ReqID{})
				applied <- struct {
					w shard.WriteReq
					p shard.Pending
				}{w, p}
			}()
			var a struct {
				w shard.WriteReq
				p shard.Pending
			}
			select {
			case a = <-applied:
			case <-time.After(2 * time.Second):
				t.Fatal("Apply of a blind sync write waited for its commit (no fsync can finish)")
			}
			if a.w.Err != nil || a.w.Result.Kind != shard.ResOK || a.w.Result.Version <= w0.Version || len(a.p.Acks) != 1 {
				t.Fatalf("ordered sync write: %+v, pending %+v; want OK at its op and one pending wait", a.w, a.p)
			}
			if acked(a.p) {
				t.Fatal("a sync write acknowledged while no fsync could finish")
			}
			// Another key: served at once, from before the write.
			if r, err := leader.Read(ctx, get("other"), level.ConsLinearizable, shard.Session{}); err != nil || string(r.Bulk) != "o" {
				t.Fatalf("read of another key behind an uncommitted sync write: %+v, %v", r, err)
			}
			// Its own key: the connection wrote v1, so neither v0 nor v1
			// may come back before v1 is committed.
			got := make(chan readOut, 1)
			go func() {
				res, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
				got <- readOut{res, err}
			}()
			select {
			case o := <-got:
				if broken && o.err == nil && string(o.res.Bulk) == "v0" {
					return // caught: the connection's own write was missed
				}
				t.Fatalf("read of k behind its uncommitted sync write: %+v, %v; want it to wait", o.res, o.err)
			case <-time.After(200 * time.Millisecond):
				if broken {
					t.Fatal("syncEarlyUnindexed: the read waited; the mutation was not exercised")
				}
			}
			gates.release()
			if err := leader.Wait(ctx, a.p); err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if o := <-got; o.err != nil || string(o.res.Bulk) != "v1" || o.res.Version != a.w.Result.Version {
				t.Fatalf("read after the commit: %+v, %v; want v1 at %d", o.res, o.err, a.w.Result.Version)
			}
		})
	}
}

// With the change switched off (syncWaitsInApply) Apply answers a blind
// sync write only once it is applied: the behaviour §12 replaced, kept so
// the two can be compared.
func TestSyncWaitsInApplyHoldsApplyUntilCommit(t *testing.T) {
	c, gates, _ := gatedCluster(t, func(o *Options) {
		o.RequestTimeout = 5 * time.Second
		o.mut.syncWaitsInApply = true
	})
	leader := c.reps[c.leader(5*time.Second)]
	w0, err := leader.Write(context.Background(), set("k", "v0"), level.Sync, shard.ReqID{})
	if err != nil {
		t.Fatal(err)
	}
	waitReadable(t, leader, w0.Version)
	gates.hold()
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
