package vrshard

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// Issue 7 (found by the SIGKILL e2e test with --follower-reads): a leader
// read that has waited for durability once may return what the engine
// holds, but no version beyond R. The driver writes an apply batch to the
// engine before it publishes applied, so in between a reader sees the engine
// ahead of applied; bounding the read's need by applied then let it return a
// version beyond R, which the other active-set members had not applied — a
// follower answered the older value right after. This test runs the
// leader's check exactly in that window: the new version is in the engine,
// applied and R are not yet past it, and the check must not serve it.
func TestLeaderReadNeverReturnsAVersionBeyondRWhileApplyIsPublished(t *testing.T) {
	mutation.Require(t)
	var (
		armed atomic.Bool
		reps  sync.Map // self → *Replica
		once  sync.Once
		got   struct {
			res     kv.Result
			need, R uint64
			err     error
			applied uint64
		}
		ran = make(chan struct{})
	)
	c := newCluster(t, 3, func(o *Options) {
		followerReadOpts(o)
		self := o.VR.Self
		o.mut.afterEngineWrite = func() {
			v, ok := reps.Load(self)
			if !ok || !armed.Load() {
				return
			}
			r := v.(*Replica)
			if !r.isLeader.Load() {
				return
			}
			once.Do(func() {
				got.applied = r.applied.Load()
				got.res, got.need, got.R, got.err = r.leaderCheck(get("k"), true)
				close(ran)
			})
		}
	})
	for i, id := range c.ids {
		reps.Store(id, c.reps[i])
	}
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	ctx := context.Background()
	res, err := leader.Write(ctx, set("k", "v1"), level.Sync, shard.ReqID{Client: 9, Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitReadable(t, leader, res.Version)
	// Quiet group: R has caught up with the leader's applied op, so a
	// check bounded by applied would pass.
	if !testgroup.Until(5*time.Second, 2*time.Millisecond, func() bool { in := leader.Info(); return in.Readable >= in.Applied }) {
		in := leader.Info()
		t.Fatalf("R %d never caught up with applied %d", in.Readable, in.Applied)
	}
	armed.Store(true)
	res2, err := leader.Write(ctx, set("k", "v2"), level.Sync, shard.ReqID{Client: 9, Seq: 2})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the hook never ran in the apply window")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.R >= res2.Version {
		t.Fatalf("R %d already covered the write at %d when its apply was not yet published: the window was not tested", got.R, res2.Version)
	}
	if got.res.Version != res2.Version || string(got.res.Bulk) != "v2" {
		t.Fatalf("the engine read in the window returned %+v, want v2 at %d: the window was not tested", got.res, res2.Version)
	}
	if got.need <= got.R {
		t.Fatalf("leader check served %q at version %d beyond R %d (published applied %d): a member may still return v1",
			got.res.Bulk, got.res.Version, got.R, got.applied)
	}
}

// The update index answers "latest update above r" alone only for r at or
// above both its floor and the point it was pruned to: after a view change
// R starts again from 0, below ops pruned under the previous view's R, and
// a check that trusted the index would find no update of a key pruned there
// and serve whatever the engine holds.
func TestUpdateIndexIsIncompleteBelowItsPrunedPoint(t *testing.T) {
	u := newKeyUpdates(0)
	u.add(5, [][]byte{[]byte("k")})
	if !u.complete(0) || u.need1([]byte("k")) != 5 {
		t.Fatalf("fresh index: complete(0)=%v need1=%d, want true and 5", u.complete(0), u.need1([]byte("k")))
	}
	u.prune(5)
	if u.need1([]byte("k")) != 0 {
		t.Fatalf("pruned op still indexed: %d", u.need1([]byte("k")))
	}
	if u.complete(4) {
		t.Fatal("complete(4) after pruning op 5: the index no longer knows op 5 > 4")
	}
	if !u.complete(5) {
		t.Fatal("complete(5) after pruning op 5 must hold")
	}
}
