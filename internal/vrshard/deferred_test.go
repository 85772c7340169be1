package vrshard

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// Deferred reads (deferred.go, docs/design/cad.md §11): a read of a key
// whose latest update is a cad write not yet durable is answered at once
// with that write's value, and its reply is held until the write is
// readable.

// deferredRead runs ReadDeferred for a linearizable GET of k and fails the
// test on an error.
func deferredRead(t *testing.T, r *Replica, op kv.Op) (kv.Result, shard.Pending) {
	t.Helper()
	res, p, err := r.ReadDeferred(context.Background(), op, level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatalf("ReadDeferred %v: %v", op.Kind, err)
	}
	return res, p
}

// heldWait starts r.Wait(p) and fails with msg if it returns within d; its
// outcome arrives on the channel later.
func heldWait(t *testing.T, r *Replica, p shard.Pending, d time.Duration, msg string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background(), p) }()
	select {
	case err := <-done:
		t.Fatalf("%s: Wait returned %v", msg, err)
	case <-time.After(d):
	}
	return done
}

// With every log fsync held, a cad write is acknowledged and a read of its
// key is answered at once with its value — but the reply's Pending is
// released only once the write is durable. A read of a key with no pending
// write defers nothing.
func TestDeferredReadAnswersAtOnceAndReleasesWhenDurable(t *testing.T) {
	c, gates, _ := gatedCluster(t, func(o *Options) { o.RequestTimeout = 5 * time.Second })
	leader := c.reps[c.leader(5*time.Second)]
	ctx := context.Background()
	if _, err := leader.Write(ctx, set("old", "v0"), level.Sync, shard.ReqID{}); err != nil {
		t.Fatal(err)
	}
	gates.hold()
	defer gates.release()
	w, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{Client: 5, Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res, p := deferredRead(t, leader, get("old")); string(res.Bulk) != "v0" || !p.IsZero() {
		t.Fatalf("read of a durable key: %+v, pending %+v; want v0 with nothing to wait for", res, p)
	}
	start := time.Now()
	res, p := deferredRead(t, leader, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("old"), []byte("k")}})
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("deferred read took %v: it waited instead of deferring", took)
	}
	if len(res.Array) != 2 || string(res.Array[0]) != "v0" || string(res.Array[1]) != "v1" || res.Version != w.Version || p.IsZero() {
		t.Fatalf("MGET old k with k's cad write unpersisted: %+v (pending %+v); want [v0 v1] at version %d, held", res, p, w.Version)
	}
	if st := leader.Stats(); st.DeferredReads != 1 || st.DurabilityWaits != 1 {
		t.Fatalf("deferred reads %d, durability waits %d; want 1 and 1", st.DeferredReads, st.DurabilityWaits)
	}
	done := heldWait(t, leader, p, 150*time.Millisecond, "the reply of a read of a write nobody persisted was released")
	gates.release()
	if err := <-done; err != nil {
		t.Fatalf("Wait after the fsyncs: %v", err)
	}
	if R := leader.Info().Readable; R < w.Version {
		t.Fatalf("reply released at R = %d, below the write's op %d", R, w.Version)
	}
}

// A deferred read of a cad write the leader cannot replicate (it is cut off)
// is never released: once another leader takes over, its Wait fails, so the
// front door drops the connection instead of answering a value that is lost.
// With the deferNoWait mutation the value is released at once: the test can
// fail.
func TestDeferredReadOfALostWriteIsNeverReleased(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "checked", true: "deferNoWait"}[broken], func(t *testing.T) {
			c := orderedCluster(t, func(o *Options) { o.mut.deferNoWait = broken })
			l, old, _ := isolatedLeader(t, c, "k", "v0")
			if _, p := applyOne(t, old, set("k", "lost"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); len(p.Acks) != 1 {
				t.Fatalf("ordered cad write at an isolated leader: pending %+v", p)
			}
			res, p := deferredRead(t, old, get("k"))
			if string(res.Bulk) != "lost" || p.IsZero() {
				t.Fatalf("deferred read at the isolated leader: %+v, pending %+v; want the ordered value, held", res, p)
			}
			done := make(chan error, 1)
			go func() { done <- old.Wait(context.Background(), p) }()
			if broken {
				select {
				case err := <-done:
					if err == nil {
						return // the mutation released a value no one else holds: caught
					}
					t.Fatalf("deferNoWait: Wait = %v", err)
				case <-time.After(2 * time.Second):
					t.Fatal("deferNoWait: Wait still blocked; the mutation is not exercised")
				}
			}
			nl := newLeaderBesides(t, c, l)
			if _, err := c.reps[nl].Write(context.Background(), set("x", "1"), level.Sync, shard.ReqID{}); err != nil {
				t.Fatalf("write at the new leader: %v", err)
			}
			c.isolate(l, false)
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the reply of a read of a lost write was released")
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Wait never returned after the old leader rejoined")
			}
			if v, err := c.linGet(nl, "k"); err != nil || v != "v0" {
				t.Fatalf("k at the new leader: %q, %v; want v0 (the cad write was lost)", v, err)
			}
		})
	}
}

// newLeaderBesides waits until a replica other than old leads.
func newLeaderBesides(t *testing.T, c *cluster, old int) int {
	t.Helper()
	l, ok := testgroup.Leader(len(c.reps), 10*time.Second, testgroup.Interval, func(i int) (bool, uint64) {
		if i == old || c.reps[i] == nil {
			return false, 0
		}
		in := c.reps[i].Info()
		return in.IsLeader, in.View
	})
	if !ok {
		t.Fatal("no new leader")
	}
	return l
}

// A deferred MGET takes k's value from the log, then reads j from the
// engine. If, in between, k is written again and then j is written and
// made readable, the two values belong to no single moment: the read must
// notice that k's value is no longer its latest update and read again.
// The deferNoRecheck mutation returns the old k with the new j.
func TestDeferredReadRechecksItsKeysAfterTheEngineRead(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "checked", true: "deferNoRecheck"}[broken], func(t *testing.T) {
			c, gates, _ := gatedCluster(t, func(o *Options) {
				o.RequestTimeout = 5 * time.Second
				o.mut.deferNoRecheck = broken
			})
			leader := c.reps[c.leader(5*time.Second)]
			ctx := context.Background()
			if _, err := leader.Write(ctx, set("j", "j0"), level.Sync, shard.ReqID{}); err != nil {
				t.Fatal(err)
			}
			gates.hold()
			if _, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			leader.mut.afterOverlay = func() {
				once.Do(func() {
					gates.release()
					if _, err := leader.Write(ctx, set("k", "v2"), level.CAD, shard.ReqID{Client: 5, Seq: 2}); err != nil {
						t.Error(err)
					}
					w, err := leader.Write(ctx, set("j", "j1"), level.Sync, shard.ReqID{Client: 6, Seq: 1})
					if err != nil {
						t.Error(err)
					}
					waitReadable(t, leader, w.Version)
				})
			}
			res, p, err := leader.ReadDeferred(ctx, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("k"), []byte("j")}}, level.ConsLinearizable, shard.Session{})
			if err == nil {
				err = leader.Wait(ctx, p)
			}
			if err != nil || len(res.Array) != 2 {
				t.Fatalf("MGET k j: %+v, %v", res, err)
			}
			k, j := string(res.Array[0]), string(res.Array[1])
			stale := k == "v1" && j == "j1"
			switch {
			case broken && stale:
				return // caught: SET k v2 ended before SET j j1 began, yet the read saw j1 and not v2
			case broken:
				t.Fatalf("deferNoRecheck: MGET = [%s %s]; the window was not exercised", k, j)
			case stale:
				t.Fatalf("MGET = [%s %s]: j1 was written after k = v2 was acknowledged, yet the read returned v1", k, j)
			}
		})
	}
}

// The power-loss workload (lin_test.go) with cad puts, a slow log fsync so
// that cad writes are often not yet durable when read, and every read a
// deferred one: the history stays linearizable and keeps the session
// guarantees, and reads were in fact deferred.
func TestDeferredReadsUnderPowerLossAreLinearizable(t *testing.T) {
	c, gates, mems := gatedCluster(t, func(o *Options) {
		o.CheckpointOps = 300
		o.KeepTail = 20
	})
	for _, g := range gates {
		g.delay.Store(int64(3 * time.Millisecond))
	}
	c.leader(5 * time.Second)
	crashRng := mrand.New(mrand.NewSource(7))
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 5, keys: workloadKeys("x", "y"), dur: level.CAD,
		deferredReads: true, afterKill: func(i int) { mems[c.ids[i]].Crash(crashRng) }}
	h := runWorkload(t, w, workloadTime(), true, 11)
	ok, unknown := summarize(h)
	t.Logf("%d operations: %d ok, %d unknown, %d power cuts, %d deferred reads", len(h.Ops), ok, unknown, len(h.Crashes), w.deferred.Load())
	if ok < 100 || len(h.Crashes) == 0 || w.deferred.Load() == 0 {
		t.Fatalf("%d operations completed, %d power cuts, %d deferred reads: the test tested nothing", ok, len(h.Crashes), w.deferred.Load())
	}
	if v := check.Linearizable(h, linOptions()); !v.OK {
		t.Fatalf("history not linearizable:\n%v", v)
	}
	if v := check.Session(h, check.SessionOptions{}); !v.OK {
		t.Fatalf("session guarantees:\n%v", v)
	}
}

// A deferred read returns what a read served once R covers its op would
// return: for a multi-key read, every key's value at that op. A
// state-dependent sync write (SET ... GET) is not indexed at its append, so
// a deferred MGET that takes k's cad write (op w) from the log and j from the
// engine could miss such a write of j at an op below w that is appended but
// not applied yet: [k1 j0], a state the log never held (j1 precedes k1).
// Alone that history has a linearization (j1 is not acknowledged yet), but
// an ordinary MGET j k that reads j after j1 is applied and k before k1 is
// fixes j1 before k1, and the two reads together have none. indexLate
// indexes j1 when k1 is appended, so the read falls back and waits; the
// noLateIndex mutation returns [k1 j0]. (j1 was a blind sync SET until
// docs/design/cad.md §12 indexed those at their own append, which left this
// test passing under noLateIndex.)
func TestDeferredMultiKeyReadSeesEveryEarlierWrite(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "indexed", true: "noLateIndex"}[broken], func(t *testing.T) {
			k, j := deferredMultiKeyRead(t, broken)
			stale := k == "k1" && j != "j1"
			switch {
			case broken && stale:
				t.Logf("noLateIndex caught: MGET k j = [%s %s]", k, j)
			case broken:
				t.Fatalf("noLateIndex: MGET k j = [%s %s]; the mutation was not exercised", k, j)
			case stale:
				t.Fatalf("MGET k j = [%s %s]: k1 was appended after j1, so a read returning k1 must return j1", k, j)
			}
		})
	}
}

// deferredMultiKeyRead runs the schedule above and returns the MGET's k and j.
func deferredMultiKeyRead(t *testing.T, broken bool) (k, j string) {
	if broken {
		mutation.Require(t)
	}
	c, gates, _ := gatedCluster(t, func(o *Options) {
		o.RequestTimeout = 5 * time.Second
		o.mut.noLateIndex = broken
	})
	leader := c.reps[c.leader(5*time.Second)]
	ctx := context.Background()
	for _, kv := range [][2]string{{"j", "j0"}, {"k", "k0"}} {
		if _, err := leader.Write(ctx, set(kv[0], kv[1]), level.Sync, shard.ReqID{}); err != nil {
			t.Fatal(err)
		}
	}
	gates.hold()
	var once sync.Once
	release := func() {
		once.Do(func() {
			gates.release()
		})
	}
	defer release()
	applied := make(chan error, 1)
	go func() {
		// One batch: j1 at op w-1 (SET ... GET: state-dependent, answered
		// at apply and not indexed at its append), k1 at op w.
		j1 := set("j", "j1")
		j1.ReturnOld = true
		_, err := leader.Apply(ctx, []shard.WriteReq{
			{Op: j1, Durability: level.Sync},
			{Op: set("k", "k1"), Durability: level.CAD, ID: shard.ReqID{Client: 5, Seq: 1}},
		})
		applied <- err
	}()
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return leader.upd.overlayFor([][]byte{[]byte("k")}, true) != nil }) {
		t.Fatal("setup: k1 never ordered")
	}
	type result struct {
		res kv.Result
		p   shard.Pending
		err error
	}
	got := make(chan result, 1)
	go func() {
		res, p, err := leader.ReadDeferred(ctx, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("k"), []byte("j")}}, level.ConsLinearizable, shard.Session{})
		got <- result{res, p, err}
	}()
	var o result
	select {
	case o = <-got: // answered at once (deferred)
	case <-time.After(200 * time.Millisecond): // waiting for R: let it
		release()
		o = <-got
	}
	release()
	if o.err == nil {
		o.err = leader.Wait(ctx, o.p)
	}
	if o.err != nil || len(o.res.Array) != 2 {
		t.Fatalf("MGET k j: %+v, %v", o.res, o.err)
	}
	if err := <-applied; err != nil {
		t.Fatalf("apply j1 k1: %v", err)
	}
	return string(o.res.Array[0]), string(o.res.Array[1])
}

// A deferred read's reply waits for R in the view whose leader appended the
// write it returns. If that leader is deposed before the read's Wait
// registers, and leads again in a later view (three replicas: every third
// view), R there covers the same op number — but of another log, which lost
// the write. The driver refuses the wait unless it still leads the write's
// view, so the Wait fails instead of releasing the lost value. Run from the
// first view (0, which readWaiter once used as "not a deferred read", so
// the check was skipped) and from a later one.
func TestDeferredReadIsNotReleasedInALaterViewOfItsLeader(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(map[bool]string{false: "view0", true: "laterView"}[later], func(t *testing.T) {
			// The setup needs the isolated leader to still hold its lease
			// when it serves the read; on a loaded box (make test's parallel
			// packages) it once did not. That says nothing about the
			// property, so the setup is retried, at most three times.
			for attempt := 1; ; attempt++ {
				if deferredReadInALaterView(t, later) || attempt == 3 {
					return
				}
				t.Logf("attempt %d: the isolated leader could not serve the read (lease gone under load); again", attempt)
			}
		})
	}
}

// deferredReadInALaterView runs the schedule above; laterView: from a view
// after the first. False: the setup failed before the property could be
// looked at (the isolated leader could not serve the read).
func deferredReadInALaterView(t *testing.T, laterView bool) bool {
	c := newCluster(t, 3, func(o *Options) {
		// The isolated leader must still hold its lease when it serves the
		// read, also on a loaded box (-race, parallel packages).
		o.VR.ViewChangeTimeout, o.VR.LeaseDuration = 2*time.Second, 2*time.Second
		o.RequestTimeout = 10 * time.Second
	})
	if laterView {
		first := c.leader(5 * time.Second)
		c.isolate(first, true)
		newLeaderBesides(t, c, first)
		c.isolate(first, false)
	}
	l, old, _ := isolatedLeader(t, c, "k", "v0")
	v := old.Info().View
	if laterView && v == 0 {
		t.Fatal("setup: still in view 0")
	}
	if _, p := applyOne(t, old, set("k", "lost"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); len(p.Acks) != 1 {
		t.Fatalf("ordered cad write at an isolated leader: pending %+v", p)
	}
	res, p, err := old.ReadDeferred(context.Background(), get("k"), level.ConsLinearizable, shard.Session{})
	if errors.Is(err, ErrCannotServe) {
		return false
	}
	if err != nil {
		t.Fatalf("ReadDeferred get: %v", err)
	}
	if string(res.Bulk) != "lost" || p.IsZero() {
		t.Fatalf("deferred read at the isolated leader: %+v, pending %+v; want the ordered value, held", res, p)
	}
	// Another leader's log gets entries past the lost write's op.
	for i := range 3 {
		// The group may still be settling (another view change under load):
		// retry a redirected write at whichever replica other than l leads.
		for deadline := time.Now().Add(15 * time.Second); ; {
			nl := newLeaderBesides(t, c, l)
			_, err := c.reps[nl].Write(context.Background(), set("x", fmt.Sprint(i)), level.Sync, shard.ReqID{Client: 6, Seq: uint64(i + 1)})
			if err == nil {
				break
			}
			// A view change under way may also leave the write's outcome
			// unknown; the retry carries the same request id, so the client
			// table applies it at most once.
			if !(errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown)) || time.Now().After(deadline) {
				t.Fatalf("write at the new leader: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	c.isolate(l, false)
	// Depose leaders until l leads again.
	deadline := time.Now().Add(60 * time.Second)
	for {
		cur := c.leader(10 * time.Second)
		if in := c.reps[cur].Info(); cur == l && in.View != v {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("setup: the old leader never led again")
		}
		if cur != l {
			c.isolate(cur, true)
			newLeaderBesides(t, c, cur)
			c.isolate(cur, false)
		}
	}
	if v, err := c.linGet(l, "k"); err != nil || v != "v0" {
		t.Fatalf("k at the old leader, leading again: %q, %v; want v0 (the cad write was lost)", v, err)
	}
	if err := old.Wait(context.Background(), p); err == nil {
		t.Fatal("the reply of a read of a lost write was released in a later view of its leader")
	}
	return true
}

// A read that starts after a cad write was acknowledged reflects every write
// ordered before it: here a sync SET k k1 GET is appended (every log fsync held,
// so it cannot commit), then a cad SET x x1 is acknowledged. A read of k must
// not return k0 at once — another read could see k1 without x1 once the sync
// write is applied (the engine applies in log order) and so order the two
// writes the other way (docs/design/cad.md §11). It waits until k1 is readable
// and returns it. With the noLateIndex mutation it returns k0 at once.
func TestReadAfterACADAckSeesSyncWritesOrderedBeforeIt(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "indexed", true: "noLateIndex"}[broken], func(t *testing.T) {
			leader, gates, w0 := heldLeader(t, func(o *Options) { o.mut.noLateIndex = broken }, "k", "k0")
			ctx := context.Background()
			syncDone := make(chan error, 1)
			go func() {
				_, err := leader.Write(ctx, set("k", "k1"), level.Sync, shard.ReqID{Client: 8, Seq: 1})
				syncDone <- err
			}()
			// The sync write is appended before the cad write is proposed.
			if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return leader.Stats().Persisted >= w0.Version+1 }) {
				t.Fatal("the sync write was never appended")
			}
			if _, err := leader.Write(ctx, set("x", "x1"), level.CAD, shard.ReqID{Client: 9, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			got := make(chan readOut, 1)
			go func() {
				res, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
				got <- readOut{res, err}
			}()
			select {
			case o := <-got:
				if broken && o.err == nil && string(o.res.Bulk) == "k0" {
					return // caught: k0 after a cad write ordered after k1 was acknowledged
				}
				t.Fatalf("read of k while its sync write (ordered before an acknowledged cad write) is unpersisted: %+v, %v; want it to wait", o.res, o.err)
			case <-time.After(150 * time.Millisecond):
				if broken {
					t.Fatal("noLateIndex: the read waited; the mutation was not exercised")
				}
			}
			gates.release()
			if o := <-got; o.err != nil || string(o.res.Bulk) != "k1" {
				t.Fatalf("read after the fsyncs: %+v, %v; want k1", o.res, o.err)
			}
			if err := <-syncDone; err != nil {
				t.Fatalf("the sync write: %v", err)
			}
		})
	}
}
