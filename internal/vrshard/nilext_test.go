package vrshard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
)

// nilextOn turns the fast path on; lazy keeps d-log entries pending (the
// leader orders them only when a read or a non-nilext update needs it), so
// tests can look at them before background ordering does.
func nilextOn(lazy bool) func(*Options) {
	return func(o *Options) {
		o.Nilext = true
		o.NilextTimeout = 300 * time.Millisecond
		if lazy {
			o.VR.NilextBatch = 1 << 20
			o.VR.NilextInterval = time.Hour
		}
	}
}

func (c *cluster) linGet(i int, k string) (string, error) {
	res, err := c.reps[i].Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
	return string(res.Bulk), err
}

// A nilext write coordinated by a follower completes on the supermajority's
// acks in one round trip (one MsgNilext per peer, no fallback, nothing
// proposed through the ordered path) and the leader's background ordering
// then puts it in every replica's state.
func TestNilextWriteCompletesInOneRoundTripAndIsOrderedInBackground(t *testing.T) {
	c := newCluster(t, 3, nilextOn(false))
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	before := c.reps[f].Stats()
	res, fb, err := c.reps[f].NilextWrite(context.Background(), set("a", "1"), level.Sync)
	if err != nil || res.Kind != kv.ResOK || !fb.IsZero() {
		t.Fatalf("nilext write at follower: %+v, fallback id %v, %v", res, fb, err)
	}
	st := c.reps[f].Stats()
	if st.NilextFast-before.NilextFast != 1 || st.NilextFallbacks != before.NilextFallbacks {
		t.Fatalf("stats %+v: want one fast completion, no fallback", st)
	}
	if sent := st.NilextSent - before.NilextSent; sent != 2 {
		t.Fatalf("coordinator sent %d nilext messages for one write to 2 peers, want 2 (one round trip)", sent)
	}
	if p := c.reps[l].Stats().Proposals; p != 0 {
		t.Fatalf("leader proposed %d writes through the ordered path, want 0", p)
	}
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
		for i := range c.reps {
			res, err := c.reps[i].Read(context.Background(), get("a"), level.ConsEventual, shard.Session{})
			if err != nil || string(res.Bulk) != "1" {
				return false
			}
		}
		return true
	}) {
		t.Fatal("background ordering did not apply the nilext write on every replica")
	}
	if got := c.reps[l].Info().DLogLen; got != 0 {
		t.Fatalf("leader d-log holds %d entries after the write was applied", got)
	}
}

// pendingNilextWrite starts a group with the fast path on (lazy ordering)
// and writes k=v1 through a follower's coordinator, so that the leader holds
// it pending in its d-log; it returns the group, the leader and the
// follower.
func pendingNilextWrite(t *testing.T) (c *cluster, l, f int) {
	t.Helper()
	c = newCluster(t, 3, nilextOn(true))
	l = c.leader(5 * time.Second)
	f = (l + 1) % 3
	if _, _, err := c.reps[f].NilextWrite(context.Background(), set("k", "v1"), level.Sync); err != nil {
		t.Fatal(err)
	}
	if n := c.reps[l].Info().DLogLen; n != 1 {
		t.Fatalf("leader d-log length %d, want the pending write", n)
	}
	return c, l, f
}

// A linearizable read at the leader of a key with a pending nilext write
// takes the slow path (counted) and sees the write; a read of another key
// does not.
func TestNilextReadOfPendingKeyTakesSlowPath(t *testing.T) {
	c, l, f := pendingNilextWrite(t)
	if v, err := c.linGet(l, "other"); err != nil || v != "" {
		t.Fatalf("read of another key: %q, %v", v, err)
	}
	if n := c.reps[l].Stats().NilextSlowReads; n != 0 {
		t.Fatalf("a read of a key without pending writes took the slow path (%d)", n)
	}
	v, err := c.linGet(l, "k")
	if err != nil || v != "v1" {
		t.Fatalf("linearizable read of the pending key: %q, %v; want v1", v, err)
	}
	if n := c.reps[l].Stats().NilextSlowReads; n != 1 {
		t.Fatalf("slow-path reads %d, want 1", n)
	}
	// A scan whose range holds a pending key takes the slow path too.
	if _, _, err := c.reps[f].NilextWrite(context.Background(), set("s2", "x"), level.Sync); err != nil {
		t.Fatal(err)
	}
	scan := kv.Op{Kind: kv.KindScan, Key: []byte("s"), End: []byte("t"), Limit: 10}
	res, err := c.reps[l].Read(context.Background(), scan, level.ConsLinearizable, shard.Session{})
	if err != nil || len(res.Array) != 2 || string(res.Array[0]) != "s2" {
		t.Fatalf("scan over a pending key: %q, %v; want [s2 x]", res.Array, err)
	}
	if n := c.reps[l].Stats().NilextSlowReads; n != 2 {
		t.Fatalf("slow-path reads %d after the scan, want 2", n)
	}
}

// Completed nilext writes still only in d-logs (none ordered) survive the
// leader's death: the new leader rebuilds them from the do-view-changes.
// The killed replica restarts with its d-log from disk.
func TestNilextCompletedWritesSurviveLeaderKill(t *testing.T) {
	c := newCluster(t, 3, nilextOn(true))
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	const n = 20
	for i := range n {
		if _, fb, err := c.reps[f].NilextWrite(context.Background(), set(fmt.Sprint("k", i), fmt.Sprint("v", i)), level.Sync); err != nil || !fb.IsZero() {
			t.Fatalf("write %d: fallback %v, %v", i, fb, err)
		}
	}
	if got := c.reps[l].Info().DLogLen; got != n {
		t.Fatalf("leader d-log %d, want %d pending", got, n)
	}
	c.kill(l)
	nl := c.leader(10 * time.Second)
	for i := range n {
		if v, err := c.linGet(nl, fmt.Sprint("k", i)); err != nil || v != fmt.Sprint("v", i) {
			t.Fatalf("after the leader's kill: k%d = %q, %v; a completed write was lost", i, v, err)
		}
	}
	c.open(l, false, nil)
	c.waitApplied(c.reps[nl].Info().Applied, 10*time.Second)
	c.expectValue(l, fmt.Sprint("k", n-1), fmt.Sprint("v", n-1))
}

// nilextLossScenario: the coordinator's link to one follower is cut, so
// that follower never sees the write; the leader and the coordinator ack it.
// Then the link heals and the leader dies before ordering it. It reports
// whether the write completed on the fast path and whether it survived.
func nilextLossScenario(t *testing.T, broken bool) (completed, survived bool) {
	if broken {
		mutation.Require(t)
	}
	c := newCluster(t, 3, nilextOn(true))
	l := c.leader(5 * time.Second)
	co, other := (l+1)%3, (l+2)%3
	c.reps[co].mut.nilextMajority = broken
	if err := c.reps[co].Transport().SetLinkFault(c.ids[other], transport.Fault{Partition: true}); err != nil {
		t.Fatal(err)
	}
	_, fb, err := c.reps[co].NilextWrite(context.Background(), set("x", "1"), level.Sync)
	completed = err == nil && fb.IsZero()
	if err := c.reps[co].Transport().SetLinkFault(c.ids[other], transport.Fault{}); err != nil {
		t.Fatal(err)
	}
	if !completed {
		return false, false
	}
	c.kill(l)
	nl := c.leader(10 * time.Second)
	v, err := c.linGet(nl, "x")
	if err != nil {
		t.Fatalf("read after the view change: %v", err)
	}
	return true, v == "1"
}

// The durability check can fail: a coordinator that completes on a simple
// majority acknowledges a write that the view change then drops. The
// correct coordinator does not complete it on the fast path (it falls back).
func TestNilextSimpleMajorityLosesWrites(t *testing.T) {
	if completed, survived := nilextLossScenario(t, true); !completed || survived {
		t.Fatalf("broken coordinator: completed %v survived %v; want an acknowledged write lost", completed, survived)
	}
	if completed, _ := nilextLossScenario(t, false); completed {
		t.Fatal("correct coordinator completed a write only two of three replicas hold")
	}
}

// With the fast path on, a restart keeps an un-ordered d-log entry on disk
// (it is in State.DLog), and the group still applies it after a full
// restart of every replica.
func TestNilextDLogSurvivesFullRestart(t *testing.T) {
	c := newCluster(t, 3, nilextOn(true))
	l := c.leader(5 * time.Second)
	if _, fb, err := c.reps[(l+1)%3].NilextWrite(context.Background(), set("p", "q"), level.Sync); err != nil || !fb.IsZero() {
		t.Fatalf("write: %v %v", fb, err)
	}
	for i := range c.reps {
		c.kill(i)
	}
	for i := range c.reps {
		c.open(i, false, nil)
	}
	nl := c.leader(10 * time.Second)
	if v, err := c.linGet(nl, "p"); err != nil || v != "q" {
		t.Fatalf("after a whole-group restart: p = %q, %v", v, err)
	}
}

// doNilextWrite coordinates a put at a random replica; a write that falls
// back is retried through the ordered path with the id the fast path used
// (exactly-once), following redirects. While the fast path rests, the put
// takes the ordered path with the client's own id (own).
func (w *workload) doNilextWrite(h int, sop kv.Op, rng *rand.Rand, own shard.ReqID, sess *shard.Session) {
	var id shard.ReqID
	done := w.tryReplicas(3*time.Second, rng.IntN(len(w.c.reps)), func(ctx context.Context, r *Replica, target int) (bool, error) {
		var err error
		if id.IsZero() {
			_, id, err = r.NilextWrite(ctx, sop, level.Sync)
			if errors.Is(err, ErrNilextResting) {
				w.doWrite(h, check.Put, sop, own, sess)
				return true, nil
			}
		} else {
			_, err = r.Write(ctx, sop, level.Sync, id)
		}
		if err == nil {
			w.rec.Complete(h, check.Result{Node: target})
			return true, nil
		}
		if !retryable(err) && !errors.Is(err, ErrFailed) {
			panic(fmt.Sprintf("nilext write: unexpected error %v", err))
		}
		// With id still zero the fast path never took the write (the
		// replica was closed): it is in no d-log, so a fresh attempt is safe.
		return false, err
	})
	if !done {
		w.rec.Unknown(h)
	}
}

// Concurrent nilext puts (coordinated by random replicas), ordered CASes
// and linearizable reads under partitions and leader kills (with pending
// d-log entries: the leader orders only every 20ms) form a linearizable
// history.
func TestNilextHistoryUnderFaultsIsLinearizable(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.VR.NilextInterval = 20 * time.Millisecond
		o.NilextBackoff = 100 * time.Millisecond
		o.CheckpointOps = 200
		o.KeepTail = 20
	})
	c.leader(5 * time.Second)
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 5, keys: workloadKeys("x", "y", "z"), nilext: true}
	h := runWorkload(t, w, workloadTime(), true, 7)
	ok, unknown := summarize(h)
	var fast, fallbacks, slow uint64
	for _, r := range c.reps {
		if r != nil {
			st := r.Stats()
			fast, fallbacks, slow = fast+st.NilextFast, fallbacks+st.NilextFallbacks, slow+st.NilextSlowReads
		}
	}
	t.Logf("%d operations: %d ok, %d unknown, %d crashes; live replicas: %d fast nilext writes, %d fallbacks, %d slow-path reads",
		len(h.Ops), ok, unknown, len(h.Crashes), fast, fallbacks, slow)
	if ok < 100 || fast == 0 {
		t.Fatalf("only %d operations completed, %d on the fast path", ok, fast)
	}
	if v := check.Linearizable(h, linOptions()); !v.OK {
		t.Fatalf("history not linearizable:\n%v", v)
	}
}

// A down replica (no supermajority possible for n = 3) costs one timeout:
// the write falls back to the ordered path with its id, later writes skip
// the fast path while it rests, and it completes fast again once the
// replica is back and the rest is over.
func TestNilextFallsBackAndReturnsWhenReplicasAreBack(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.NilextTimeout = 100 * time.Millisecond
		o.NilextBackoff = 300 * time.Millisecond
	})
	l := c.leader(5 * time.Second)
	down := (l + 1) % 3
	c.kill(down)
	t0 := time.Now()
	res, id, err := c.reps[l].NilextWrite(context.Background(), set("a", "1"), level.Sync)
	if err != nil || id.IsZero() || res.Kind != kv.ResOK || time.Since(t0) < 100*time.Millisecond {
		t.Fatalf("write with a replica down: %+v id %v err %v after %v; want an ordered fallback after the timeout", res, id, err, time.Since(t0))
	}
	t0 = time.Now()
	if _, _, err := c.reps[l].NilextWrite(context.Background(), set("b", "1"), level.Sync); !errors.Is(err, ErrNilextResting) || time.Since(t0) > 50*time.Millisecond {
		t.Fatalf("second write while resting: %v after %v; want ErrNilextResting at once", err, time.Since(t0))
	}
	c.open(down, false, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(100 * time.Millisecond)
		_, id, err := c.reps[l].NilextWrite(context.Background(), set("c", "1"), level.Sync)
		if err == nil && id.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fast path did not come back after the replica returned: id %v err %v", id, err)
		}
	}
	// The restarted replica forced a view change (its d-log may have lost
	// cad acks: vr nxRestarted), so the leader may have moved.
	if v, err := c.linGet(c.leader(5*time.Second), "a"); err != nil || v != "1" {
		t.Fatalf("fallback write: a = %q, %v", v, err)
	}
}

// NilextTake (a client's own broadcast, KEFIR.NILEXT): every replica acks
// in the same view, only the leader claims to lead; a retransmission is
// acked again without a second d-log entry; a client that gathered every
// ack has a write a linearizable read sees; and what a misbehaving client
// sends is refused without an ack.
func TestNilextTakeFromAClient(t *testing.T) {
	c := newCluster(t, 3, nilextOn(true))
	l := c.leader(5 * time.Second)
	ctx := context.Background()
	id := shard.ReqID{Client: 99, Seq: 1}
	view := c.reps[l].Info().View
	for i, r := range c.reps {
		a, err := r.NilextTake(ctx, id, set("k", "v"), level.Sync)
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		if a.View != view || a.From != c.ids[i] || a.Leader != (i == l) || a.Client != 99 || a.ReqNum != 1 {
			t.Fatalf("replica %d acked %+v (view %d, leader index %d)", i, a, view, l)
		}
	}
	if _, err := c.reps[l].NilextTake(ctx, id, set("k", "v"), level.Sync); err != nil {
		t.Fatalf("retransmission: %v", err)
	}
	if n := c.reps[l].Info().DLogLen; n != 1 {
		t.Fatalf("leader d-log %d after a retransmission, want 1", n)
	}
	if v, err := c.linGet(l, "k"); err != nil || v != "v" {
		t.Fatalf("read after the client's supermajority: %q, %v", v, err)
	}

	refused := []struct {
		name string
		id   shard.ReqID
		op   kv.Op
		want error
	}{
		{"older than one already taken", shard.ReqID{Client: 99, Seq: 0}, set("k", "x"), ErrNilextInvalid},
		{"SET NX", shard.ReqID{Client: 5, Seq: 1}, kv.Op{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("v"), Cond: kv.IfAbsent}, ErrNilextInvalid},
		{"SET GET", shard.ReqID{Client: 5, Seq: 1}, kv.Op{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("v"), ReturnOld: true}, ErrNilextInvalid},
		{"DEL", shard.ReqID{Client: 5, Seq: 1}, kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k")}}, ErrNilextInvalid},
		{"odd MSET", shard.ReqID{Client: 5, Seq: 1}, kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("k")}}, ErrNilextInvalid},
		{"no client id", shard.ReqID{Seq: 1}, set("k", "x"), ErrNilextInvalid},
		{"oversized value", shard.ReqID{Client: 5, Seq: 1}, set("k", string(make([]byte, 16<<20+1))), ErrNilextInvalid},
	}
	for _, tc := range refused {
		if _, err := c.reps[l].NilextTake(ctx, tc.id, tc.op, level.Sync); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Out of order: seq 3 then seq 2 of one client. Acking 2 would be
	// wrong: once 3 is applied the core counts 2 as executed.
	if _, err := c.reps[l].NilextTake(ctx, shard.ReqID{Client: 7, Seq: 3}, set("o", "3"), level.CAD); err != nil {
		t.Fatal(err)
	}
	if _, err := c.reps[l].NilextTake(ctx, shard.ReqID{Client: 7, Seq: 2}, set("o", "2"), level.CAD); !errors.Is(err, ErrNilextStale) {
		t.Fatalf("seq 2 after seq 3: %v, want ErrNilextStale", err)
	}

	// A write that reached only two replicas (no supermajority) and then
	// took the ordered path with the same id is applied once.
	fid := shard.ReqID{Client: 8, Seq: 1}
	for _, i := range []int{l, (l + 1) % 3} {
		if _, err := c.reps[i].NilextTake(ctx, fid, set("f", "1"), level.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.write(kv.Op{Kind: kv.KindIncrBy, Key: []byte("f"), Delta: 1}, shard.ReqID{Client: 8, Seq: 2}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if res, err := c.write(set("f", "1"), fid, 5*time.Second); err == nil {
		t.Fatalf("ordered copy after a later request of the client: %+v, want a stale-request error", res)
	}
	if v, err := c.linGet(l, "f"); err != nil || v != "2" {
		t.Fatalf("f = %q, %v; want 2 (the d-log copy ordered before the INCR, applied once)", v, err)
	}
	if taken, refusedN := c.reps[l].NilextDirectStats(); taken < 4 || refusedN < uint64(len(refused)) {
		t.Fatalf("leader direct stats: taken %d, refused %d", taken, refusedN)
	}
}

// A --nilext replica that stopped cleanly (Close: everything synced, a
// clean mark last in its log) resumes its view as a follower; one that was
// killed — its log may lack d-log records it acked from memory, had it been
// a power cut — forces a view change, its d-log stale (vr nxRestarted). The
// mark is cleared at open, so a crash after a clean restart counts as a
// crash again.
func TestNilextCleanStopKeepsTheViewAKillDoesNot(t *testing.T) {
	c := newCluster(t, 3, nilextOn(false))
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	if _, _, err := c.reps[l].NilextWrite(context.Background(), set("a", "1"), level.CAD); err != nil {
		t.Fatal(err)
	}
	view := c.reps[l].Info().View
	if err := c.reps[f].Close(); err != nil {
		t.Fatal(err)
	}
	c.reps[f] = nil
	c.open(f, false, nil)
	if in := c.reps[f].Info(); in.View != view || in.Status != vr.Normal || in.DLogStale {
		t.Fatalf("cleanly stopped follower came back as %+v, want normal in view %d with a fresh d-log", in, view)
	}
	c.kill(f)
	c.open(f, false, nil)
	if in := c.reps[f].Info(); !in.DLogStale {
		t.Fatalf("killed follower came back as %+v: want a stale d-log", in)
	}
	// After its restart promise (one lease) it starts the next view.
	if _, ok := c.waitEvery(10*time.Second, func(r *Replica) bool {
		in := r.Info()
		return in.Status == vr.Normal && in.View > view && !in.DLogStale
	}); !ok {
		t.Fatalf("no view change after the kill: %+v", c.reps[f].Info())
	}
	nl := c.leader(5 * time.Second)
	if v, err := c.linGet(nl, "a"); err != nil || v != "1" {
		t.Fatalf("a = %q, %v after the restarts", v, err)
	}
}
