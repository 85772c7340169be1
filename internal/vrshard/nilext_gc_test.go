package vrshard

import (
	"context"
	"fmt"
	mrand "math/rand"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Tests of the group commit across the d-log and the log (nilext_gc.go).

// gcStats sums the held batches and deadline fsyncs of every live replica.
func (c *cluster) gcStats() (held, late uint64) {
	for _, r := range c.reps {
		if r != nil {
			held += r.gc.held.Load()
			late += r.gc.late.Load()
		}
	}
	return held, late
}

// waitDLogEmpty waits until every replica applied its d-log (the leader's
// ordering committed everywhere) and returns how long it took.
func (c *cluster) waitDLogEmpty(timeout time.Duration) (time.Duration, bool) {
	return c.waitEvery(timeout, func(r *Replica) bool { return r.Info().DLogLen == 0 })
}

// A nilext write with no write after it: the ordering batch is held at every
// replica, and the deadline, not a later d-log record, syncs it. The write is
// committed and applied after about NilextSyncDelay, not before (the hold is
// real) and not never (no hang).
func TestNilextHeldOrderingIsReleasedByTheDeadline(t *testing.T) {
	const delay = 300 * time.Millisecond
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.NilextSyncDelay = delay
	})
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	before := c.reps[f].Stats().Fsyncs
	start := time.Now()
	if _, fb, err := c.reps[f].NilextWrite(context.Background(), set("a", "1"), level.Sync); err != nil || !fb.IsZero() {
		t.Fatalf("nilext write: fallback %v, %v", fb, err)
	}
	_, ok := c.waitDLogEmpty(5 * time.Second)
	took := time.Since(start)
	if !ok {
		t.Fatalf("the held ordering was never synced: d-logs not empty after %v (no deadline release)", took)
	}
	if took < delay*2/3 {
		t.Fatalf("ordering committed %v after the write, before the %v deadline: the batch was not held", took, delay)
	}
	held, late := c.gcStats()
	if held == 0 || late == 0 {
		t.Fatalf("held %d batches, %d deadline fsyncs: want both > 0", held, late)
	}
	c.expectValue(l, "a", "1")
	t.Logf("ordering committed %v after the write (deadline %v); held %d, deadline fsyncs %d; follower fsyncs %d",
		took, delay, held, late, c.reps[f].Stats().Fsyncs-before)
}

// fsyncsPerWrite runs n sync nilext writes coordinated by a follower, one
// at a time with a pause between them (low load: each ordering round carries
// one write), and returns the log fsyncs per write per replica.
func fsyncsPerWrite(t *testing.T, syncDelay time.Duration, n int) float64 {
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.NilextSyncDelay = syncDelay
	})
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	if _, _, err := c.reps[f].NilextWrite(context.Background(), set("warm", "1"), level.Sync); err != nil {
		t.Fatal(err)
	}
	c.waitDLogEmpty(5 * time.Second)
	var before uint64
	for _, r := range c.reps {
		before += r.Stats().Fsyncs
	}
	for i := range n {
		if _, fb, err := c.reps[f].NilextWrite(context.Background(), set(fmt.Sprint("k", i%50), fmt.Sprint(i)), level.Sync); err != nil || !fb.IsZero() {
			t.Fatalf("write %d: fallback %v, %v", i, fb, err)
		}
		time.Sleep(3 * time.Millisecond)
	}
	var after uint64
	for _, r := range c.reps {
		after += r.Stats().Fsyncs
	}
	if _, ok := c.waitDLogEmpty(5 * time.Second); !ok {
		t.Fatal("d-logs not applied after the writes")
	}
	c.expectValue(l, fmt.Sprint("k", (n-1)%50), fmt.Sprint(n-1))
	return float64(after-before) / float64(n) / 3
}

// At steady load the ordering's fsync rides on the next write's d-log fsync:
// about one fsync per write per replica, against about two (or more: a new
// commit point is a batch of its own) without the hold.
func TestNilextGroupCommitSavesAnFsyncPerWrite(t *testing.T) {
	if raceOn {
		// Under the detector a write plus the 3 ms pause outlasts the 5 ms
		// hold, so the count measures the detector (1.53 seen); make test
		// runs this without it.
		t.Skip("a timing-bound fsync count: skipped under -race")
	}
	// A loaded machine stretches the 3 ms pause and coalesces batches
	// without the hold too (1.79 against 1.41 seen at load 20), so the pair
	// is measured up to three times and one clean pass suffices: without
	// the hold the count never drops to 1.5.
	const n = 100
	var on, off float64
	for attempt := 1; attempt <= 3; attempt++ {
		off = fsyncsPerWrite(t, -1, n)
		on = fsyncsPerWrite(t, 0, n) // the default delay
		t.Logf("attempt %d: log fsyncs per write per replica: %.2f with group commit, %.2f without", attempt, on, off)
		if on <= 1.5 && on <= off-0.4 {
			return
		}
	}
	t.Fatalf("group commit: %.2f fsyncs per write per replica (without: %.2f); want <= 1.5 and at least 0.4 fewer", on, off)
}

// heldLossScenario: a cad nilext write (its d-log record is not fsynced
// before the ack) is ordered by the leader; the ordering is held at every
// replica (no later write, a long deadline). Once a linearizable read at the
// leader returned it (it is committed), every replica loses power: only
// fsynced bytes survive. It reports what a linearizable read returns after
// the restart.
func heldLossScenario(t *testing.T, broken bool) (before, after string) {
	if broken {
		mutation.Require(t)
	}
	mems := map[uint64]*vfs.Mem{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.FS = mems[o.VR.Self]
		o.NilextSyncDelay = time.Second
		o.mut.heldAckEarly = broken
	})
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	if _, fb, err := c.reps[f].NilextWrite(context.Background(), set("x", "1"), level.CAD); err != nil || !fb.IsZero() {
		t.Fatalf("nilext write: fallback %v, %v", fb, err)
	}
	// Committed and applied everywhere: at once with the mutation, after
	// the deadline's fsync without it.
	if took, ok := c.waitDLogEmpty(10 * time.Second); !ok {
		t.Fatalf("ordering not applied after %v", took)
	}
	v, err := c.linGet(l, "x")
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.reps {
		c.kill(i)
	}
	for _, m := range mems {
		m.Crash(nil)
	}
	for i := range c.reps {
		c.open(i, false, nil)
	}
	nl := c.leader(10 * time.Second)
	var w string
	for try := 0; ; try++ {
		if w, err = c.linGet(nl, "x"); err == nil {
			break
		}
		if try == 100 {
			t.Fatalf("read after the restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
		nl = c.leader(5 * time.Second)
	}
	return v, w
}

// A held batch's prepare-ok must wait for the fsync that covers it: the
// mutation that reports a held batch durable at once loses a committed op
// (a linearizable read returned it, then a power cut of every replica erased
// it); the real hold keeps it.
//
// Real time decides whether anything else fsyncs the log before the power
// cut (a view change on a loaded machine does), so the mutation gets three
// tries to lose the op; the real hold must keep it every time. (The
// simulator catches the same mutation deterministically, at a fixed seed:
// TestHostSimCatchesMutations.)
//
// Under the race detector the mutation half is skipped: there something
// else fsynced the log before the power cut in all three tries (CI, session
// 28), and the simulator's catch above is the deterministic one. The real
// hold's half runs in both builds.
func TestNilextHeldPrepareOKBeforeFsyncLosesACommittedOp(t *testing.T) {
	lost := raceOn
	if raceOn {
		t.Log("race build: the mutation half is left to TestHostSimCatchesMutations")
	}
	for try := 1; try <= 3 && !lost; try++ {
		before, after := heldLossScenario(t, true)
		if before != "1" {
			t.Fatalf("mutation: read %q before the power cut, want \"1\"", before)
		}
		lost = after != "1"
		if !lost {
			t.Logf("try %d: the mutation's op survived the power cut (something else fsynced the log)", try)
		}
	}
	if !lost {
		t.Fatal("mutation (held batch reported durable before its fsync): the committed op survived the power cut in three tries; want it lost")
	}
	if before, after := heldLossScenario(t, false); before != "1" || after != "1" {
		t.Fatalf("group commit: read %q before the power cut, %q after; a committed op was lost", before, after)
	}
}

// Slow-path reads and non-nilext updates behind held batches: a non-nilext
// update is not held (its entry is not in any d-log), so it completes long
// before the deadline and carries the held ordering with it; a slow-path
// read is served with the pending write long before the deadline too (the
// leader's prepare asks the followers to sync: vr.SyncWanted).
func TestNilextHeldBatchesAndOrderedWritesAndSlowReads(t *testing.T) {
	const delay = 500 * time.Millisecond
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(true)(o) // the leader orders only for reads and ordered writes
		o.NilextSyncDelay = delay
	})
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	if _, fb, err := c.reps[f].NilextWrite(context.Background(), set("n", "1"), level.Sync); err != nil || !fb.IsZero() {
		t.Fatalf("nilext write: fallback %v, %v", fb, err)
	}
	start := time.Now()
	if _, err := c.write(set("o", "2"), shard.ReqID{Client: 99, Seq: 1}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > delay/2 {
		t.Fatalf("ordered write took %v: held behind the %v deadline", took, delay)
	}
	for k, want := range map[string]string{"n": "1", "o": "2"} {
		if v, err := c.linGet(l, k); err != nil || v != want {
			t.Fatalf("after the ordered write: %s = %q, %v; want %q", k, v, err, want)
		}
	}
	// A slow-path read: pending write, nothing else to order.
	if _, fb, err := c.reps[f].NilextWrite(context.Background(), set("n", "3"), level.Sync); err != nil || !fb.IsZero() {
		t.Fatalf("nilext write: fallback %v, %v", fb, err)
	}
	slow := c.reps[l].Stats().NilextSlowReads
	start = time.Now()
	if v, err := c.linGet(l, "n"); err != nil || v != "3" {
		t.Fatalf("slow-path read: %q, %v; want 3", v, err)
	}
	took := time.Since(start)
	if c.reps[l].Stats().NilextSlowReads != slow+1 {
		t.Fatal("the read did not take the slow path")
	}
	if took > delay/2 {
		t.Fatalf("slow-path read took %v: the followers held its ordering toward the %v deadline (no sync hint)", took, delay)
	}
	t.Logf("slow-path read: %v (deadline %v)", took, delay)
}

// A slow-path read of a key whose ordering is already held at every replica
// (background ordering ran, nothing synced it): the leader's heartbeat asks
// the followers to sync, so the read does not wait for the deadline.
func TestNilextSlowReadOfAHeldOrderingDoesNotWaitForTheDeadline(t *testing.T) {
	const delay = time.Second
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.NilextSyncDelay = delay
	})
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	written, commit := c.reps[l].Stats().Persisted, c.reps[l].Info().Commit
	if _, fb, err := c.reps[f].NilextWrite(context.Background(), set("h", "1"), level.Sync); err != nil || !fb.IsZero() {
		t.Fatalf("nilext write: fallback %v, %v", fb, err)
	}
	// The ordering's entry in the leader's log.
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return c.reps[l].Stats().Persisted != written }) {
		t.Fatal("the leader never ordered the write")
	}
	if in := c.reps[l].Info(); in.Commit != commit || in.DLogLen == 0 {
		t.Fatalf("ordering not held (commit %d before the write): %+v", commit, in)
	}
	start := time.Now()
	if v, err := c.linGet(l, "h"); err != nil || v != "1" {
		t.Fatalf("slow-path read: %q, %v; want 1", v, err)
	}
	if took := time.Since(start); took > delay/2 {
		t.Fatalf("slow-path read of a held ordering took %v (deadline %v): the followers were not asked to sync", took, delay)
	} else {
		t.Logf("slow-path read of a held ordering: %v (deadline %v)", took, delay)
	}
}

// Power cuts with the fast path and group commit on: nilext puts, ordered
// CASes and linearizable reads while replicas are killed and their disks
// lose what was not fsynced (a random prefix survives, maybe torn). The
// deadline is long (20ms) so that held batches are common when the power
// goes; a held batch promised nothing, so the history stays linearizable.
func TestNilextPowerLossHistoryIsLinearizable(t *testing.T) {
	mems := map[uint64]*vfs.Mem{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.FS = mems[o.VR.Self]
		o.NilextSyncDelay = 20 * time.Millisecond
		o.NilextBackoff = 100 * time.Millisecond
		o.CheckpointOps = 300
		o.KeepTail = 20
	})
	c.leader(5 * time.Second)
	crashRng := mrand.New(mrand.NewSource(9))
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 5, keys: workloadKeys("x", "y", "z"), nilext: true,
		afterKill: func(i int) { mems[c.ids[i]].Crash(crashRng) }}
	h := runWorkload(t, w, workloadTime(), true, 11)
	ok, unknown := summarize(h)
	var held uint64
	for _, r := range c.reps {
		if r != nil {
			held += r.gc.held.Load()
		}
	}
	t.Logf("%d operations: %d ok, %d unknown, %d power cuts; live replicas held %d batches", len(h.Ops), ok, unknown, len(h.Crashes), held)
	if ok < 100 || len(h.Crashes) == 0 || held == 0 {
		t.Fatalf("%d operations completed, %d power cuts, %d batches held: the test tested nothing", ok, len(h.Crashes), held)
	}
	if v := check.Linearizable(h, linOptions()); !v.OK {
		t.Fatalf("history not linearizable:\n%v", v)
	}
}
