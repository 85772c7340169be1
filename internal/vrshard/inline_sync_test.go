package vrshard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// A VR follower runs a sync write's fsync on its driver at the end of the
// round (env.go goroutines: no driver → syncer → driver hand-off), and that
// changes nothing of what a sync write promises: with the leader's and one
// follower's log fsyncs held, the other follower's inline fsync alone is one
// durable copy, and the write is not acknowledged until a second copy is
// durable (the held follower's, released). The mutation inlineSyncSkipped
// (the inline fsync reports durable without syncing) is caught here: the
// held follower's copy then counts and the write completes too early.
func TestFollowerInlineSyncKeepsTwoDurableCopies(t *testing.T) {
	if early := inlineSyncScenario(t, false); early != "" {
		t.Fatal(early)
	}
	t.Run("mutation inlineSyncSkipped", func(t *testing.T) {
		if inlineSyncScenario(t, true) == "" {
			t.Fatal("the mutation went unnoticed: a sync write waited for two durable copies although a follower's inline fsync reported its copy durable without syncing")
		}
	})
}

// inlineSyncScenario runs the test's scenario (broken: with the mutation
// inlineSyncSkipped) and returns what went wrong with the sync write's
// acknowledgement ("" if nothing); it fails t for anything else.
func inlineSyncScenario(t *testing.T, broken bool) string {
	if broken {
		mutation.Require(t)
	}
	c, gates, _ := gatedCluster(t, func(o *Options) {
		o.RequestTimeout = 10 * time.Second
		o.mut.inlineSyncSkipped = broken
	})
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	fa, fb := c.reps[(l+1)%3], c.reps[(l+2)%3]
	ctx := context.Background()
	inlined := func(r *Replica) uint64 { return r.exec.(*goroutines).inlined.Load() }

	// Lone sync writes: each follower runs (nearly) every fsync itself.
	a0, b0 := inlined(fa), inlined(fb)
	const n = 40
	for i := range n {
		if _, err := leader.Write(ctx, set("k", "v"), level.Sync, shard.ReqID{Client: 9, Seq: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if da, db := inlined(fa)-a0, inlined(fb)-b0; !broken && (da < n/2 || db < n/2) {
		t.Fatalf("followers ran %d and %d of %d lone sync writes' fsyncs on their drivers, want most", da, db, n)
	}
	if got := inlined(leader); got != 0 {
		t.Fatalf("the leader ran %d fsyncs on its driver, want none (it must keep stepping prepare-oks)", got)
	}

	// One follower's fsync alone: one durable copy, not acknowledged.
	gates[leader.cfg.Self].hold()
	gates[fa.cfg.Self].hold()
	defer gates.release()
	fs0 := fb.Stats().Fsyncs
	done := make(chan error, 1)
	go func() {
		_, err := leader.Write(ctx, kv.Op{Kind: kv.KindSet, Key: []byte("w"), Value: []byte("1")}, level.Sync, shard.ReqID{Client: 10, Seq: 1})
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for fb.Stats().Fsyncs == fs0 || (!broken && gates[fa.cfg.Self].held.Load() == 0) {
		if time.Now().After(deadline) {
			t.Fatal("the write's prepare never reached the followers' fsyncs")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the open follower's prepare-ok reaches the leader
	select {
	case err := <-done:
		return fmt.Sprintf("a sync write was acknowledged (err %v) with one durable copy (one follower's); the leader's and the other follower's fsyncs are held", err)
	default:
	}
	// The second follower's copy makes two: acknowledged.
	gates[fa.cfg.Self].release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write was not acknowledged once two followers held it on disk")
	}
	return ""
}
