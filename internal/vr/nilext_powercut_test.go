package vr

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/sim/scenario"
)

// Issue 24 item 3: a cad (or async) nilext update is acknowledged from
// memory, before its d-log record is on disk. A replica that loses power
// right after its ack restarts without the update; if its d-log still counted
// as one of the logs RecoverDurabilityLog reads, a completed update could
// fall under the threshold and be dropped. These scripted runs are the two
// schedules the issue names.

// powerCut replaces replica id by a new incarnation started from what a
// power cut left on its disk: the hard state and log it had synced and the
// d-log records listed (the cad ones it acked from memory are gone).
func (x *tnet) powerCut(id uint64, hs HardState, entries []Entry, dlog []NilextRequest) {
	x.t.Helper()
	r, err := New(nxConfig(id, len(x.rs[id].cfg.Members)), State{HardState: hs, Entries: entries, DLog: dlog})
	if err != nil {
		x.t.Fatal(err)
	}
	x.rs[id] = r
	x.ready(id)
}

// takeDown removes replica id from the network (it keeps its memory: a
// partition or a paused process, not a power cut) and returns it.
func (x *tnet) takeDown(id uint64) *Replica {
	r := x.rs[id]
	delete(x.rs, id)
	x.ids = slices.DeleteFunc(x.ids, func(i uint64) bool { return i == id })
	return r
}

func (x *tnet) bringBack(id uint64, r *Replica) {
	x.rs[id] = r
	x.ids = append(x.ids, id)
	slices.Sort(x.ids)
}

func (x *tnet) run(rounds int) {
	for range rounds {
		x.tick(25 * time.Millisecond)
		x.deliver(nil)
	}
}

func inLog(r *Replica, client, req uint64) bool {
	for op := r.first; op <= r.lastOp(); op++ {
		if e := r.entry(op); e.Client == client && e.ReqNum == req {
			return true
		}
	}
	return false
}

// TestNilextPowerCutOfLeaderKeepsCompletedCADWrite, n = 3: a cad update
// acked by all three completes; replica 3 is cut off (it keeps the update in
// memory), and the leader loses power before the record reached its disk.
// The view change has only the restarted leader's d-log (without the update)
// and replica 2's. Counting both, the threshold is 2 and the update (in one
// log) was dropped: a completed write lost by one power cut. Only replica
// 2's log is fresh, and one fresh log of three suffices for n = 3 (every
// completed update is in every d-log).
func TestNilextPowerCutOfLeaderKeepsCompletedCADWrite(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", false))
	if !x.complete(10, 1) {
		t.Fatal("cad update did not complete on three acks")
	}
	if x.rs[1].Info().LastOp != 0 {
		t.Fatal("the finalizer ran: the schedule needs the update only in d-logs")
	}
	x.takeDown(3)
	x.powerCut(1, HardState{}, nil, nil)
	x.run(12)
	l := x.rs[2]
	if in := l.Info(); !in.IsLeader || in.View != 1 {
		t.Fatalf("replica 2 should lead view 1 with one fresh d-log: %+v (errors %v)", in, x.errs)
	}
	if !inLog(l, 10, 1) {
		t.Fatalf("completed cad update lost by one power cut: view 1's log %v", logReqs(l))
	}
	if in := x.rs[1].Info(); in.DLogStale {
		t.Fatalf("replica 1 is normal in view %d, after its restart: its d-log is fresh again: %+v", in.View, in)
	}
}

// TestNilextPowerCutWithFiveReplicasWaitsForFreshLogs, n = 5: the update is
// acked by replicas 1–4 (the supermajority, leader 1 included); 3 and 4 are
// cut off, and 1 loses power before the record reached its disk. Logs at
// hand: 1 (stale, without it), 2 (with it), 5 (never had it). Counting all
// three the threshold is 2 and the update was dropped. Two fresh logs are
// not enough for n = 5 (the threshold must exceed half the logs), so the new
// leader waits and says why; once 3 answers, the update is kept.
func TestNilextPowerCutWithFiveReplicasWaitsForFreshLogs(t *testing.T) {
	x := newNxNet(t, 5)
	x.send(nxReq(10, 1, "k", false), 1, 2, 3, 4)
	if !x.complete(10, 1) {
		t.Fatal("cad update did not complete on four acks")
	}
	r3 := x.takeDown(3)
	x.takeDown(4)
	x.powerCut(1, HardState{}, nil, nil)
	x.run(12)
	l := x.rs[2]
	if l.Info().IsLeader {
		t.Errorf("view %d started from the d-logs of replicas 1 (restarted), 2 and 5: log %v", l.Info().View, logReqs(l))
	} else {
		var waited bool
		for _, err := range x.errs[2] {
			waited = waited || errors.Is(err, ErrDLogStale)
		}
		if !waited || l.Info().NilextStaleWaits == 0 {
			t.Errorf("replica 2 waits without saying why: %v %+v", x.errs[2], l.Info())
		}
	}
	x.bringBack(3, r3)
	x.run(12)
	var lead *Replica
	for _, id := range x.ids {
		if in := x.rs[id].Info(); in.IsLeader {
			lead = x.rs[id]
		}
	}
	if lead == nil {
		t.Fatalf("no leader once replica 3 is back: %v", x.errs)
	}
	if !inLog(lead, 10, 1) {
		t.Fatalf("completed cad update lost by one power cut: view %d's log %v", lead.Info().View, logReqs(lead))
	}
}

// TestNilextRestartedFollowerForcesAViewChange: a follower restarted without
// DLogIntact resumes its view only until its restart promise runs out (one
// lease), then starts the next view (its acks in the old one may be lost),
// marks its do-view-change stale, and is fresh again once normal there. With
// DLogIntact (a clean stop) it just resumes its view.
func TestNilextRestartedFollowerForcesAViewChange(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", false))
	hs := HardState{}
	r, err := New(nxConfig(3, 3), State{HardState: hs, DLog: x.dlogDisk[3], DLogIntact: true})
	if err != nil {
		t.Fatal(err)
	}
	if in := r.Info(); in.Status != Normal || in.View != 0 || in.DLogStale {
		t.Fatalf("intact follower should resume view 0: %+v", in)
	}
	x.powerCut(3, hs, nil, nil)
	if in := x.rs[3].Info(); in.Status != Normal || in.View != 0 || !in.DLogStale {
		t.Fatalf("restarted follower should resume view 0 with a stale d-log: %+v", in)
	}
	// It keeps its restart promise (no vote for one lease, 50 ms here),
	// then starts view 1.
	x.tick(20 * time.Millisecond)
	x.deliver(nil)
	if in := x.rs[3].Info(); in.View != 0 {
		t.Fatalf("restarted follower left view 0 within its restart promise: %+v", in)
	}
	x.run(12)
	in := x.rs[2].Info()
	if !in.IsLeader || in.View != 1 {
		t.Fatalf("replica 2 should lead view 1: %+v", in)
	}
	if !inLog(x.rs[2], 10, 1) {
		t.Fatalf("update lost: %v", logReqs(x.rs[2]))
	}
	if x.rs[3].Info().DLogStale {
		t.Fatal("replica 3 still stale while normal in the view that started after its restart")
	}
}

// powerCutCAD is the same schedule on the simulator, in scenario steps: a
// slow disk (50 ms fsyncs) keeps the cad write's d-log record unsynced when
// client 0's put completes; the replicas listed are cut off from the others
// (they keep the write in memory), the leader loses power at once and
// restarts; client 1 reads the key, the network heals and client 1 reads
// it again. With n = 5 replica 4 never gets the write (held), so it
// completes on four acks.
func powerCutCAD(n int) *scenario.Scenario {
	var st []scenario.Step
	cut := []int{2}
	if n == 5 {
		cut = []int{2, 3}
		st = append(st, scenario.HoldClient(0, 4))
	}
	st = append(st, scenario.Do(0, scenario.Put("k", "a", level.CAD))...)
	for _, i := range cut {
		st = append(st, scenario.Isolate(i))
	}
	// A read while they are still cut off (for n = 5 it waits: two fresh
	// d-logs are not enough), and one after they are back (on the old code
	// their d-logs could bring the write back in a later view change, after
	// the first read had missed it).
	st = append(st, scenario.Crash(0), scenario.Restart(0), scenario.Settle())
	st = append(st, scenario.Do(1, scenario.Get("k", level.ConsLinearizable))...)
	st = append(st, scenario.Heal(), scenario.Settle())
	st = append(st, scenario.Do(1, scenario.Get("k", level.ConsLinearizable))...)
	return &scenario.Scenario{
		Name:     fmt.Sprintf("nilext-cad-power-cut-n%d", n),
		Source:   "issue 24 item 3",
		Doc:      "a completed cad nilext write survives one replica's power cut",
		Replicas: n, Clients: 2, Steps: st,
		Checks: []scenario.Checker{scenario.Linearizable, scenario.Durability},
	}
}

// TestNilextSimPowerCutKeepsCompletedCADWrite: the schedule above, judged
// by internal/check: the read after the power cut must return the
// completed write (on the old code it returned nil, and the linearizability
// checker rejected the history).
func TestNilextSimPowerCutKeepsCompletedCADWrite(t *testing.T) {
	for _, n := range []int{3, 5} {
		for seed := uint64(1); seed <= 3; seed++ {
			e := nilextEngine(slowFinalizer(), false)
			e.Sync = sim.Dist{Base: 50 * time.Millisecond}
			res := runScenario(t, powerCutCAD(n), e, seed)
			if err := res.Err(); err != nil {
				t.Fatalf("n=%d seed %d: %v\n%v", n, seed, err, res.History.Ops)
			}
			ops := res.History.Ops
			put, early, read := ops[0], ops[1], ops[len(ops)-1]
			if put.Outcome != check.OK || read.Outcome != check.OK || read.Result != "a" {
				t.Fatalf("n=%d seed %d: put %v, read %v %q: want both ok and the read to return the write\n%v",
					n, seed, put.Outcome, read.Outcome, read.Result, ops)
			}
			if n == 3 && (early.Outcome != check.OK || early.Result != "a") {
				t.Fatalf("n=3 seed %d: the read before the heal: %v %q, want ok \"a\" (one fresh d-log suffices)\n%v", seed, early.Outcome, early.Result, ops)
			}
		}
	}
}

// singlePowerCuts is a nemesis of single-replica power cuts: crashes (only
// synced bytes survive, the unsynced tail may be torn) and restarts are
// frequent, at most one replica is down at a time, and fsyncs take 2–6 ms,
// as vrshard holds cad/async d-log records for up to 5 ms before syncing
// them (docs/design/nilext.md), so a crash often catches the record of a
// write that completed on acks from memory.
func singlePowerCuts(so *sim.Options) {
	so.Sync = sim.Dist{Base: 2 * time.Millisecond, Jitter: 4 * time.Millisecond}
	so.Faults.MaxDown = 1
	so.Faults.Crash, so.Faults.Restart, so.Faults.Partition, so.Faults.OneWay, so.Faults.Heal = 3, 3, 1, 1, 1
}

// frequentPowerCuts is singlePowerCuts with a fault every 5–20 ms and
// twelve keys, so a write a power cut took is often still its key's latest
// when a read comes (with three keys it is usually overwritten first and
// the loss goes unseen).
func frequentPowerCuts(so *sim.Options) {
	singlePowerCuts(so)
	so.Faults.Every = sim.Dist{Base: 5 * time.Millisecond, Jitter: 15 * time.Millisecond}
	kv := so.Workload.(sim.KV)
	kv.Keys, kv.Get, kv.Put = 12, 6, 6
	so.Workload = kv
}

func nilextAt(d level.Durability) *nilextSimOptions {
	nx := defaultNilext()
	nx.dur = d
	return nx
}

// slowNilextAt also orders d-logs rarely (every 200 ms), so completed
// writes wait in d-logs, not in the consensus log, when a power cut and the
// view change after it come.
func slowNilextAt(d level.Durability) *nilextSimOptions {
	nx := nilextAt(d)
	nx.batch, nx.interval = 1000, 200*time.Millisecond
	return nx
}

// TestNilextSimCADPowerCuts: nilext writes at cad under single-replica power
// cuts: every history is linearizable (no completed write lost), with three
// and five replicas, ordering d-logs every 2 ms and every 200 ms.
func TestNilextSimCADPowerCuts(t *testing.T) {
	t.Run("n=3", func(t *testing.T) {
		exploreNilextWith(t, seedCount(100, 3000), 3, nilextAt(level.CAD), defaultSimOptions(), singlePowerCuts)
	})
	t.Run("n=3-slow-finalizer", func(t *testing.T) {
		exploreNilextWith(t, seedCount(100, 3000), 3, slowNilextAt(level.CAD), defaultSimOptions(), singlePowerCuts)
	})
	t.Run("n=5-slow-finalizer", func(t *testing.T) {
		exploreNilextWith(t, seedCount(50, 1500), 5, slowNilextAt(level.CAD), defaultSimOptions(), singlePowerCuts)
	})
	t.Run("n=3-slow-finalizer-frequent-cuts", func(t *testing.T) {
		exploreNilextWith(t, seedCount(100, 3000), 3, slowNilextAt(level.CAD), defaultSimOptions(), frequentPowerCuts)
	})
}

// TestNilextSimAsyncPowerCuts: the same at async. On the fast path async is
// acknowledged exactly as cad (from memory, the record written in the
// background; a read of a pending key waits for its commit), so it keeps
// cad's promise there: one replica's power cut loses no completed write,
// and the checker holds async histories to linearizability. (The runs are
// those of cad with another label, so only the five-replica one is run.)
func TestNilextSimAsyncPowerCuts(t *testing.T) {
	exploreNilextWith(t, seedCount(50, 1500), 5, nilextAt(level.Async), defaultSimOptions(), singlePowerCuts)
}

// nilextCaught runs seeds until the checkers reject a history, and fails
// the test if none does: the schedule can see the bug it is there for.
func nilextCaught(t *testing.T, budget, replicas int, nx *nilextSimOptions, o simOptions, more func(*sim.Options), hook func(*sim.Sim)) {
	t.Helper()
	nilextCaughtBy(t, budget, replicas, nx, o, more, hook, judge)
}

// nilextCaughtBy is nilextCaught with other checkers (judgeFn, after
// dropNilextReports): exploreNilextRun's runs must fail some seed.
func nilextCaughtBy(t *testing.T, budget, replicas int, nx *nilextSimOptions, o simOptions, more func(*sim.Options),
	hook func(*sim.Sim), judgeFn func(*sim.Sim, check.History) error) {
	t.Helper()
	o, tweak := nilextSimSized(o, nx, replicas, more)
	caughtWithin(t, budget, "survived %d seeds: the simulator and checkers cannot see this loss", func(seed uint64) error {
		s, h := simRunHook(seed, o, nil, tweak, hook)
		dropNilextReports(s)
		return judgeFn(s, h)
	})
}

// TestMutationNilextCountStaleDLogs: counting a restarted replica's d-log in
// d-log recovery (the rule before issue 24) loses completed cad writes
// under single-replica power cuts, and the checkers see it.
func TestMutationNilextCountStaleDLogs(t *testing.T) {
	mutation.Require(t)
	o := defaultSimOptions()
	o.mut.nilextCountStale = true
	nilextCaught(t, 300, 3, slowNilextAt(level.CAD), o, frequentPowerCuts, nil)
}

// TestNilextSimAsyncWholeGroupPowerCutLosesWrites: what the promise does not
// cover, and the checker must reject: every replica loses power at once
// while async (or cad) nilext writes sit acknowledged from memory only.
// Nothing holds them any more; a read after the restart misses a completed
// write and the linearizability checker fails the history. (At sync the
// same schedule passes: TestNilextSimPowerFailure.)
func TestNilextSimAsyncWholeGroupPowerCutLosesWrites(t *testing.T) {
	nx := nilextAt(level.Async)
	nx.batch, nx.interval = 1000, 50*time.Millisecond
	nilextCaught(t, 100, 3, nx, defaultSimOptions(), powerFailures, powerFailureHook)
}

// TestNilextStaleOutlivesARestart: only a replica whose disk says it was
// normal (View == LastNormalView) can have lost acks; it writes a marker
// among its d-log records, so a second restart — now in a view change, with
// a later view on disk — still counts its d-log as stale. Without the
// marker, a replica that stopped in a view change had fsynced every ack
// before its new view and is fresh.
func TestNilextStaleOutlivesARestart(t *testing.T) {
	r, err := New(nxConfig(3, 3), State{HardState: HardState{View: 4, LastNormalView: 4, Commit: 0}})
	if err != nil {
		t.Fatal(err)
	}
	rd := r.Ready()
	var marker []NilextRequest
	for _, q := range rd.DLog {
		if q.Client == 0 {
			marker = append(marker, q)
		}
	}
	if !r.Info().DLogStale || len(marker) != 1 || marker[0].ReqNum != 4 {
		t.Fatalf("restart from a normal view: stale %t, marker %v", r.Info().DLogStale, marker)
	}
	if got := r.DLogRecords(); len(got) != 1 || got[0].Client != 0 {
		t.Fatalf("a checkpoint would drop the marker: %v", got)
	}
	again, err := New(nxConfig(3, 3), State{HardState: HardState{View: 5, LastNormalView: 4}, DLog: marker})
	if err != nil {
		t.Fatal(err)
	}
	if in := again.Info(); !in.DLogStale || in.Status != ViewChange {
		t.Fatalf("second restart, in a view change, with the marker: %+v", in)
	}
	if len(again.DLog()) != 0 {
		t.Fatalf("the marker entered the d-log: %v", again.DLog())
	}
	clean, err := New(nxConfig(3, 3), State{HardState: HardState{View: 5, LastNormalView: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if clean.Info().DLogStale {
		t.Fatal("a replica that stopped in a view change (its acks fsynced before the new view) counts as stale")
	}
}
