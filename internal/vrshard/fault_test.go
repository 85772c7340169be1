package vrshard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
)

func TestKilledLeaderIsReplacedAndRejoins(t *testing.T) {
	c := newCluster(t, 3, nil)
	for i := range 50 {
		if _, err := c.write(set(fmt.Sprint("k", i), "old"), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	old := c.leader(5 * time.Second)
	oldView := c.reps[old].Info().View
	c.kill(old)
	l := c.leader(10 * time.Second)
	if l == old || c.reps[l].Info().View <= oldView {
		t.Fatalf("new leader %d in view %d; old was %d in view %d", l, c.reps[l].Info().View, old, oldView)
	}
	var last kv.Result
	for i := range 50 {
		var err error
		if last, err = c.write(set(fmt.Sprint("k", i), "new"), shard.ReqID{Client: 3, Seq: uint64(i + 1)}, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	res, err := c.reps[l].Read(context.Background(), get("k7"), level.ConsLinearizable, shard.Session{})
	if err != nil || string(res.Bulk) != "new" {
		t.Fatalf("linearizable read at new leader: %+v, %v", res, err)
	}
	// The old leader restarts from its disk (the engine lost its unflushed
	// appends; the log has them) and catches up.
	c.open(old, false, nil)
	c.waitApplied(last.Version, 10*time.Second)
	for i := 0; i < 50; i += 7 {
		c.expectValue(old, fmt.Sprint("k", i), "new")
	}
}

func TestWipedReplicaRejoinsBySnapshot(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 40 // compact often, so the log no longer starts at op 1
		o.KeepTail = 5
	})
	for i := range 200 {
		if _, err := c.write(set(fmt.Sprint("k", i%50), fmt.Sprint("v", i)), shard.ReqID{Client: 8, Seq: uint64(i + 1)}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	del, err := c.write(kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k3")}}, shard.ReqID{}, 5*time.Second)
	if err != nil || del.Int != 1 {
		t.Fatalf("del: %+v, %v", del, err)
	}
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	c.waitApplied(del.Version, 5*time.Second)
	c.wipe(f)
	// More writes while it is gone.
	var last kv.Result
	for i := range 20 {
		if last, err = c.write(set(fmt.Sprint("late", i), "x"), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.open(f, false, nil) // no bootstrap: an empty disk means lost state
	c.waitApplied(last.Version, 15*time.Second)
	// It serves nothing, not even eventual reads, until its recovery completes.
	c.waitRecovered(f, 15*time.Second)
	if got := c.reps[f].Stats().SnapsLoaded; got == 0 {
		t.Fatalf("the wiped replica caught up without a snapshot (loaded %d): the test did not test state transfer", got)
	}
	c.expectValue(f, "k49", "v199")
	c.expectValue(f, "late19", "x")
	// The restored engine's client rows are counted (Status.Clients, which
	// DBSIZE subtracts): the same rows as the leader's, client 8's among them.
	if got, want := c.reps[f].Status().Clients, engineRows(t, c.reps[f]); got != want || got == 0 || got != c.reps[l].Status().Clients {
		t.Fatalf("restored replica counts %d client rows, its engine has %d, the leader counts %d", got, want, c.reps[l].Status().Clients)
	}
	res, err := c.reps[f].Read(context.Background(), get("k3"), level.ConsEventual, shard.Session{})
	if err != nil || res.Kind != kv.ResNil {
		t.Fatalf("deleted key on the restored replica: %+v, %v", res, err)
	}
	// It takes part again: with the other follower gone, writes still commit.
	other := 3 - l - f
	c.kill(other)
	if _, err := c.write(set("after", "1"), shard.ReqID{}, 10*time.Second); err != nil {
		t.Fatalf("write with the restored replica as the only follower: %v", err)
	}
}

// A write retried with the same request id after the leader that executed
// it died is answered from the client table at the new leader: executed
// once. The same retry with a fresh id executes again (the control: the
// test can tell the difference).
func TestRetryAcrossLeaderChangeExecutesOnce(t *testing.T) {
	c := newCluster(t, 3, nil)
	incr := kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 1}
	id := shard.ReqID{Client: 42, Seq: 1}
	first, err := c.write(incr, id, 5*time.Second)
	if err != nil || first.Int != 1 {
		t.Fatalf("first incr: %+v, %v", first, err)
	}
	c.waitApplied(first.Version, 5*time.Second)
	c.kill(c.leader(time.Second))
	again, err := c.write(incr, id, 10*time.Second)
	if err != nil || again.Int != 1 || again.Version != first.Version {
		t.Fatalf("retry at the new leader: %+v, %v; want the cached result %+v", again, err, first)
	}
	fresh, err := c.write(incr, shard.ReqID{Client: 42, Seq: 2}, 5*time.Second)
	if err != nil || fresh.Int != 2 {
		t.Fatalf("next request: %+v, %v; want 2", fresh, err)
	}
	if _, err := c.write(incr, shard.ReqID{Client: 42, Seq: 1}, 5*time.Second); !errors.Is(err, shard.ErrStaleRequest) {
		t.Fatalf("request older than the table's: %v, want shard.ErrStaleRequest", err)
	}
}

// A node started with a stale configuration (another epoch) is refused at
// the handshake; it cannot join and the group is unaffected.
func TestStaleConfigurationIsRefused(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader(5 * time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := c.options(2, true, ln)
	o.Dir = t.TempDir()
	o.VR.Epoch = 2
	o.Peers = map[uint64]string{1: c.peers[1], 2: c.peers[2], 3: ln.Addr().String()}
	rogue, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { return c.reps[l].Transport().Stats().IdentityRefusals != 0 }) {
		t.Fatalf("the leader never refused the stale node's connection")
	}
	if _, err := c.write(set("a", "1"), shard.ReqID{}, 5*time.Second); err != nil {
		t.Fatalf("group stopped working with a stale node knocking: %v", err)
	}
	if rogue.Info().Commit != 0 {
		t.Fatalf("stale node learned commit %d from a group that refused it", rogue.Info().Commit)
	}
}

// A leader cut off from the group keeps believing it leads, but once its
// lease has run out it must not serve linearizable reads: the others have
// elected a new leader and written since. Its writes time out as unknown.
// Reads that confirm the lease without the driver (TryRead, and Read's
// local lease) must see that it ran out: with the localLeaseNoClock
// mutation the old leader serves its stale value.
func TestPartitionedOldLeaderServesNoStaleRead(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "lease", true: "localLeaseNoClock"}[broken], func(t *testing.T) {
			c := newCluster(t, 3, func(o *Options) { o.RequestTimeout = 400 * time.Millisecond })
			if _, err := c.write(set("x", "old"), shard.ReqID{}, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			old := c.leader(time.Second)
			// The precondition: the leader holds its lease (on a loaded
			// machine the grants may still be on their way after the write).
			var res kv.Result
			var ok bool
			if !testgroup.Until(5*time.Second, time.Millisecond, func() bool {
				res, ok = c.reps[old].TryRead(get("x"), level.ConsLinearizable)
				return ok
			}) || string(res.Bulk) != "old" {
				t.Fatalf("leader under its lease: TryRead = %q, %v; want \"old\", true", res.Bulk, ok)
			}
			c.reps[old].mut.localLeaseNoClock = broken
			for _, id := range c.ids {
				if id != c.ids[old] {
					c.reps[old].Transport().SetLinkFault(id, transport.Fault{Partition: true})
				}
			}
			nl := newLeaderBesides(t, c, old)
			if _, err := c.reps[nl].Write(context.Background(), set("x", "new"), level.Sync, shard.ReqID{}); err != nil {
				t.Fatalf("write at the new leader: %v", err)
			}
			res, ok = c.reps[old].TryRead(get("x"), level.ConsLinearizable)
			if ok != broken {
				t.Fatalf("mutated=%t: partitioned old leader's TryRead = %q, %v (the new leader has written \"new\")", broken, res.Bulk, ok)
			}
			res, err := c.reps[old].Read(context.Background(), get("x"), level.ConsLinearizable, shard.Session{})
			if (err == nil) != broken {
				t.Fatalf("mutated=%t: partitioned old leader's Read = %q, %v (the new leader has written \"new\")", broken, res.Bulk, err)
			}
			if broken {
				if string(res.Bulk) != "old" {
					t.Fatalf("mutated: stale read returned %q, want \"old\"", res.Bulk)
				}
				return
			}
			if _, err := c.reps[old].Write(context.Background(), set("y", "1"), level.Sync, shard.ReqID{}); !errors.Is(err, shard.ErrUnavailable) {
				t.Fatalf("write at the partitioned old leader: %v, want an unavailable (unknown or redirect) error", err)
			}
		})
	}
}

// wipe stops replica i and deletes its directory, as a lost disk; c.open(i,
// false, nil) then restarts it with nothing.
func (c *cluster) wipe(i int) {
	c.t.Helper()
	c.reps[i].Close()
	c.reps[i] = nil
	if err := os.RemoveAll(c.dirs[i]); err != nil {
		c.t.Fatal(err)
	}
}

// waitRecovered waits for replica i's recovery to end (status normal).
func (c *cluster) waitRecovered(i int, timeout time.Duration) {
	c.t.Helper()
	if !testgroup.Until(timeout, time.Millisecond, func() bool { return c.reps[i].Info().Status == vr.Normal }) {
		c.t.Fatalf("the wiped replica did not finish recovery: %+v", c.reps[i].Info())
	}
}

// writeWhile writes key "during" every 20 ms for d and fails the test if a
// write takes longer than limit (while names what runs meanwhile); it returns
// the last write's result.
func (c *cluster) writeWhile(t *testing.T, d, limit time.Duration, while string) kv.Result {
	t.Helper()
	var last kv.Result
	for start := time.Now(); time.Since(start) < d; time.Sleep(20 * time.Millisecond) {
		t0 := time.Now()
		res, err := c.write(set("during", fmt.Sprint(time.Since(start))), shard.ReqID{}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(t0); took > limit {
			t.Fatalf("a write took %v while %s", took, while)
		}
		last = res
	}
	return last
}

// A state larger than one peer frame still reaches a replica that needs a
// snapshot: it travels as several frames (with the default 256 MiB frame
// limit, any store above it could never again restore a wiped or
// far-behind replica).
func TestSnapshotLargerThanAFrameReachesAWipedReplica(t *testing.T) {
	const frame = 64 << 10
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 40
		o.KeepTail = 5
		o.PeerMaxFrame = frame
	})
	val := strings.Repeat("v", 900)
	var last kv.Result
	var err error
	for i := range 400 { // ~360 KB of values: a snapshot of about six frames
		if last, err = c.write(set(fmt.Sprint("k", i), val), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	c.waitApplied(last.Version, 5*time.Second)
	c.wipe(f)
	for i := range 50 {
		if last, err = c.write(set(fmt.Sprint("late", i), "x"), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.open(f, false, nil)
	if !testgroup.Until(15*time.Second, time.Millisecond, func() bool { return c.reps[f].Info().Status == vr.Normal }) {
		t.Fatalf("the wiped replica did not finish recovery: %+v (leader sent %d snapshots)", c.reps[f].Info(), c.reps[l].Stats().SnapsSent)
	}
	c.waitApplied(last.Version, 15*time.Second)
	if got := c.reps[f].Stats().SnapsLoaded; got == 0 {
		t.Fatal("the wiped replica caught up without a snapshot: the test did not test state transfer")
	}
	t.Logf("leader sent %d snapshots", c.reps[l].Stats().SnapsSent)
	c.expectValue(f, "k0", val)
	c.expectValue(f, "k399", val)
	c.expectValue(f, "late49", "x")
}

// wipeAFollower writes the n ops op(i) at the leader, waits until every
// replica applied them, then wipes a follower's disk and restarts it empty:
// the group must rebuild it from a snapshot. It returns the leader, its view
// and the follower.
func (c *cluster) wipeAFollower(t *testing.T, n int, op func(i int) kv.Op) (l int, view uint64, f int) {
	t.Helper()
	var last kv.Result
	var err error
	for i := range n {
		if last, err = c.write(op(i), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	l = c.leader(5 * time.Second)
	view = c.reps[l].Info().View
	f = (l + 1) % 3
	c.waitApplied(last.Version, 5*time.Second)
	c.wipe(f)
	c.open(f, false, nil)
	return l, view, f
}

// A snapshot capture that takes longer than the view-change timeout (a
// large state's scan) runs beside the leader's work: writes keep committing
// and no view change happens while it runs, and the wiped replica that
// asked is restored once it is done. On the driver goroutine the capture
// stopped heartbeats and replication for its whole length.
func TestASlowSnapshotCaptureDoesNotStallTheLeader(t *testing.T) {
	mutation.Require(t)
	const capture = 2500 * time.Millisecond // the test cluster's view-change timeout is 1 s
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 40
		o.KeepTail = 5
		o.mut.captureDelay = capture
	})
	l, view, f := c.wipeAFollower(t, 200, func(i int) kv.Op { return set(fmt.Sprint("k", i%50), fmt.Sprint("v", i)) })
	last := c.writeWhile(t, capture, 700*time.Millisecond, "a snapshot was being captured")
	if got := c.reps[l].Info(); got.View != view || !got.IsLeader {
		t.Fatalf("the leader lost its view during the capture: %+v (was view %d)", got, view)
	}
	c.waitRecovered(f, 15*time.Second)
	c.waitApplied(last.Version, 15*time.Second)
	if got := c.reps[f].Stats().SnapsLoaded; got == 0 {
		t.Fatal("the wiped replica caught up without a snapshot: the test did not test state transfer")
	}
	// Checkpoints ran during the capture (over 40 writes); none compacted
	// the log past its op, so the core took it the first time.
	if st := c.reps[l].Stats(); st.SnapsCaptured != 1 || st.Checkpoints < 2 {
		t.Fatalf("leader captured %d snapshots with %d checkpoints; want one capture, with checkpoints during it", st.SnapsCaptured, st.Checkpoints)
	}
	c.expectValue(f, "k49", "v199")
}

// Closing a replica whose capture is still running stops the capture and
// waits for it, so no scan outlives the engine.
func TestCloseStopsARunningCapture(t *testing.T) {
	mutation.Require(t)
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 40
		o.KeepTail = 5
		o.mut.captureDelay = time.Minute
	})
	var last kv.Result
	var err error
	for i := range 100 {
		if last, err = c.write(set(fmt.Sprint("k", i), "v"), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	c.waitApplied(last.Version, 5*time.Second)
	c.wipe(f)
	c.open(f, false, nil)
	if !testgroup.Until(10*time.Second, time.Millisecond, func() bool { return c.reps[l].Stats().SnapsCaptured != 0 }) {
		t.Fatal("no capture started")
	}
	start := time.Now()
	if err := c.reps[l].Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v with a capture running", d)
	}
	c.reps[l] = nil
}

// Concurrent large writes make a batch larger than a peer frame: it commits
// (the transport fragments what exceeds the frame, the core bounds a prepare
// in bytes). Before either, the followers refused the one oversized prepare
// and the group stopped committing: with the default limits, sixteen
// pipelined 16 MiB SETs were enough.
func TestABatchLargerThanAFrameCommits(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) { o.PeerMaxFrame = 256 << 10 })
	val := strings.Repeat("b", 200<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.write(set(fmt.Sprint("big", i), val), shard.ReqID{}, 10*time.Second); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	l := c.leader(5 * time.Second)
	c.waitApplied(c.reps[l].Info().Commit, 10*time.Second)
	for i := range c.reps {
		c.expectValue(i, "big23", val)
	}
}

// A message with a large snapshot is encoded and queued off the driver
// goroutine (encoding copies and checksums the whole state: about a second
// per GiB). With the encoding slowed past the view-change timeout, writes
// keep committing and the leader keeps its view; the messages for the
// wiped replica wait behind its snapshot and it is restored.
//
// The log after the snapshot is kept until its hold runs out, and the
// hold's time starts once the snapshot is queued: the encoding here (2.5 s)
// outlasts the hold itself (two view-change timeouts: 2 s). When the hold
// was counted from the core's send, a checkpoint in the last half second of
// the encoding compacted past the snapshot's op, and the replica needed and
// loaded a second snapshot. With CheckpointOps 40 (a checkpoint about every
// second of the writes below) that took luck: one run in two to six failed
// on a busy machine. With 10, several checkpoints fall in that half second
// and nearly every run failed (15 of 16).
func TestALargeSnapshotIsEncodedOffTheDriver(t *testing.T) {
	mutation.Require(t)
	const encode = 2500 * time.Millisecond // the test cluster's view-change timeout is 1 s
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 10
		o.KeepTail = 5
		o.mut.encodeDelay = encode
	})
	val := strings.Repeat("v", 900)
	// 400 writes, ~370 KB: above largeMessage.
	l, view, f := c.wipeAFollower(t, 400, func(i int) kv.Op { return set(fmt.Sprint("k", i), val) })
	if !testgroup.Until(10*time.Second, time.Millisecond, func() bool { return c.reps[l].Stats().SnapsSent != 0 }) {
		t.Fatal("no snapshot sent")
	}
	ckpts0 := c.reps[l].Stats().Checkpoints
	last := c.writeWhile(t, encode, 700*time.Millisecond, "a snapshot was being encoded")
	if got := c.reps[l].Info(); got.View != view || !got.IsLeader {
		t.Fatalf("the leader lost its view during the encoding: %+v (was view %d)", got, view)
	}
	c.waitRecovered(f, 15*time.Second)
	c.waitApplied(last.Version, 15*time.Second)
	// Checkpoints ran while the snapshot was on its way; the log after it
	// was kept, so the first snapshot to arrive was enough.
	if got, ckpts := c.reps[f].Stats().SnapsLoaded, c.reps[l].Stats().Checkpoints-ckpts0; got != 1 || ckpts < 3 {
		t.Fatalf("the wiped replica loaded %d snapshots, the leader checkpointed %d times since sending it; want one snapshot despite at least 3 checkpoints", got, ckpts)
	}
	c.expectValue(f, "k399", val)
	res, err := c.reps[l].Read(context.Background(), get("during"), level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	c.expectValue(f, "during", string(res.Bulk))
}

// A tail of large entries is bounded in bytes after a checkpoint, not only
// in entries: a replica that lost its disk comes back from a snapshot, not
// from a recovery response carrying every large value since the start. With
// 1,024 entries kept whatever their size, 22 values of 16 MiB were never
// compacted, and every recovery response and view change carried 352 MiB.
func TestATailOfLargeEntriesIsBoundedInBytes(t *testing.T) {
	mutation.Require(t)
	var firstOp [4]atomic.Uint64 // per replica id, read on its driver goroutine
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointBytes = 1 << 20
		o.KeepTailBytes = 512 << 10
		o.mut.afterHandle = func(r *Replica) { firstOp[r.cfg.Self].Store(r.core.Info().FirstOp) }
	})
	val := strings.Repeat("L", 200<<10)
	var last kv.Result
	var err error
	for i := range 20 { // 4 MB in 20 entries: far fewer than KeepTail
		if last, err = c.write(set(fmt.Sprint("big", i), val), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	c.waitApplied(last.Version, 5*time.Second)
	if first := firstOp[c.ids[l]].Load(); first < 10 {
		t.Fatalf("the leader's log still starts at op %d after 4 MB of checkpointed writes", first)
	}
	c.wipe(f)
	c.open(f, false, nil)
	c.waitRecovered(f, 15*time.Second)
	if got := c.reps[f].Stats().SnapsLoaded; got == 0 {
		t.Fatal("the wiped replica recovered from the log: the tail was not bounded in bytes")
	}
	c.expectValue(f, "big0", val)
}
