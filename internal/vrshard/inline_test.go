package vrshard

import (
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/shard"
)

// One client's sync writes to three replicas on loopback TCP: between
// writes every driver is idle, so the followers step the leader's prepares
// on their connection readers and report their fsyncs on their syncers,
// and the leader steps the prepare-oks on its readers (inline.go). Every
// write is on every replica afterwards, and still there after all three
// are killed and restarted from their logs (the fsyncs the inline rounds
// reported were real). Run with -race too: the rounds share the driver's
// state under drv with run's goroutine.
func TestIdleDriverRoundsRunInline(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader(5 * time.Second)
	const n = 60
	for i := range n {
		if _, err := c.write(set(fmt.Sprint("k", i), fmt.Sprint("v", i)), shard.ReqID{Client: 9, Seq: uint64(i + 1)}, 5*time.Second); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	c.waitApplied(c.reps[lead].Info().Commit, 5*time.Second)
	for i, r := range c.reps {
		steps, syncs := r.st.inlineSteps.Load(), r.st.inlineSyncs.Load()
		t.Logf("replica %d (leader %v): %d inline steps, %d inline fsync rounds, %d fsyncs", c.ids[i], i == lead, steps, syncs, r.st.fsyncs.Load())
		if steps == 0 {
			t.Errorf("replica %d stepped no peer batch inline in %d writes one at a time", c.ids[i], n)
		}
		if i != lead && syncs == 0 {
			t.Errorf("follower %d ran no fsync's round on its syncer in %d writes one at a time", c.ids[i], n)
		}
	}
	for i := range c.reps {
		c.kill(i)
	}
	for i := range c.reps {
		c.open(i, false, nil)
	}
	c.leader(10 * time.Second)
	for i := range c.reps {
		for k := range n {
			c.expectValue(i, fmt.Sprint("k", k), fmt.Sprint("v", k))
		}
	}
}

// A reader steps its batch inline only when no batch queued for run waits:
// one that did would overtake it, and a peer's messages must reach the core
// in the order it sent them (inline.go).
func TestInlineStepWaitsForQueuedBatches(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader(5 * time.Second)
	f := c.reps[(lead+1)%3]
	from := c.ids[lead]
	f.inPending.Add(1) // as if a batch were on inbox or in run's hands
	stepped := f.stepInline(inbound{from: from})
	f.inPending.Add(-1)
	if stepped {
		t.Fatal("stepped a batch inline while another waited for the driver")
	}
	// And with none waiting, an idle driver's round runs on the caller.
	ok := false
	for deadline := time.Now().Add(5 * time.Second); !ok && time.Now().Before(deadline); {
		if ok = f.stepInline(inbound{from: from}); !ok {
			time.Sleep(time.Millisecond) // run was busy: try again
		}
	}
	if !ok {
		t.Fatal("an idle driver's round never ran inline")
	}
}

// An inline round that waits for the fsync in flight (awaitSync: a roll, a
// recovering replica's first normal round) gets its result even when run,
// idle in its select, took it from syncDone first: run gives it back rather
// than wait for the driver with it (the deadlock TestChainJoinPagedUnderWrites
// found). Here the test's goroutine is the inline round.
func TestRunGivesBackAFsyncResultAnInlineRoundAwaits(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader(5 * time.Second)
	f := c.reps[(lead+1)%3]
	held := false
	for deadline := time.Now().Add(5 * time.Second); !held && time.Now().Before(deadline); {
		if held = f.tryDriver(); !held {
			time.Sleep(time.Millisecond)
		}
	}
	if !held {
		t.Fatal("the driver was never idle")
	}
	for f.syncing != 0 { // the inline round's own fsync in flight, if any: not this test's
		if err := f.awaitSync(); err != nil {
			t.Fatal(err)
		}
	}
	// An fsync that covers nothing new, handed to the syncer as startSync
	// does; its result reaches syncDone while this round holds the driver.
	f.syncing = f.synced0 + 1
	seg, seq := f.wal.seg, f.synced0
	f.exec.syncLog(func() {
		res := syncResult{seq: seq, err: seg.Sync()}
		if !f.syncedInline(res) {
			f.syncDone <- res
		}
	})
	time.Sleep(50 * time.Millisecond) // run, idle in its select, takes it
	done := make(chan error, 1)
	go func() { done <- f.awaitSync() }()
	select {
	case err := <-done:
		f.endInline(err)
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		f.drv.Unlock() // let run go, so the cluster can close
		t.Fatal("the inline round's awaitSync never got the fsync's result: run kept it")
	}
}
