package vrshard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

func TestParseChainStore(t *testing.T) {
	for in, want := range map[string]ChainStore{"log": ChainLog, "D": ChainLog, "buffered": ChainBuffered,
		"mb": ChainBuffered, "b": ChainBuffered, "memory": ChainMemory, " m ": ChainMemory} {
		if got, err := ParseChainStore(in); err != nil || got != want {
			t.Errorf("ParseChainStore(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseChainStore("ssd"); err == nil {
		t.Error("ParseChainStore(ssd): no error")
	}
	for s, want := range map[ChainStore]chain.Store{ChainLog: chain.Log, ChainBuffered: chain.Buffered, ChainMemory: chain.Memory} {
		if s.core() != want {
			t.Errorf("%v is the core's %v, want %v", s, s.core(), want)
		}
	}
}

// newStoreChain is a chain of three on the production host whose members
// have the given stores (head first); a buffered or memory member flushes
// every flush.
func newStoreChain(t *testing.T, stores [3]ChainStore, flush time.Duration) *chainGroup {
	return newChainGroupTuned(t, 0, func(i int, o *Options) {
		co := *o.Chain
		co.Store, co.Flush = stores[i], flush
		co.NoLogMember = !slices.Contains(stores[:], ChainLog) // as kefir up sets it
		o.Chain = &co
	})
}

// storeWrites writes n keys s<from>… at the head (node 1 unless head says).
func storeWrites(g *chainGroup, head, from, n int) {
	g.t.Helper()
	storeWritesAt(g, head, from, n, level.Sync)
}

// storeWritesAt is storeWrites at durability d.
func storeWritesAt(g *chainGroup, head, from, n int, d level.Durability) {
	g.t.Helper()
	for k := from; k < from+n; k++ {
		g.retry(head, "write", func(ctx context.Context, r *Replica) error {
			_, err := r.Write(ctx, set(fmt.Sprint("s", k), fmt.Sprint("v", k)), d, shard.ReqID{Client: 9, Seq: uint64(k + 1)})
			return err
		})
	}
}

// storeMissing reads keys s0 … s<n-1> at node i (the head) and returns how
// many are missing.
func storeMissing(g *chainGroup, i, n int) int {
	g.t.Helper()
	missing := 0
	for k := range n {
		if got := g.read(i, fmt.Sprint("s", k)); got == "" {
			missing++
		} else if got != fmt.Sprint("v", k) {
			g.t.Fatalf("GET s%d at node %d = %q", k, i+1, got)
		}
	}
	return missing
}

// TestChainStoresOnTheHost: a chain of a memory head, a buffered middle and a
// log tail (M-Mb-D) on the production host. Acknowledgements wait for no
// fsync at the memory and buffered members: with their flush interval at an
// hour, 40 writes are answered while neither syncs a batch (a log member
// syncs each, as the tail does); the memory member writes nothing to its
// directory but its mark. A crash of the memory head loses nothing (the
// others hold every acknowledged write); it comes back empty — also when
// restarted with Bootstrap, which its mark overrides — and joins again,
// copying the history. A crash of every member keeps every acknowledged
// write: the master restarts the chain from the log tail's history, the
// longest, never from the memory member's empty one.
func TestChainStoresOnTheHost(t *testing.T) {
	g := newStoreChain(t, [3]ChainStore{ChainMemory, ChainBuffered, ChainLog}, time.Hour)
	storeWrites(g, 0, 0, 40)
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	fs := [3]uint64{}
	for i, r := range g.reps {
		fs[i] = r.Stats().Fsyncs
	}
	// The log tail syncs each of its batches (one write at a time: ≥ 40);
	// the others at most at their start (an urgent batch: the bootstrap's).
	if fs[2] < 40 || fs[0] > 3 || fs[1] > 3 {
		t.Fatalf("fsyncs after 40 writes: M %d, Mb %d, D %d; want ≤ 3, ≤ 3, ≥ 40", fs[0], fs[1], fs[2])
	}
	if n := g.reps[1].gc.held.Load(); n == 0 {
		t.Fatalf("the buffered member held no batch for its flush")
	}
	ents, err := os.ReadDir(g.dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != memoryMark {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the memory member's directory holds %v, want only %s", names, memoryMark)
	}

	// One member lost: nothing acknowledged is.
	g.crash(0)
	g.waitMembers(2, 3)
	storeWrites(g, 1, 40, 10)
	g.nt.start(0, nil)
	g.open(0, true) // Bootstrap again, as kefir up's restart passes it: the mark overrides it
	g.waitMembers(2, 1, 3)
	g.caughtUp(0, 1)
	if st := g.reps[0].Info(); st.Applied < 50 {
		t.Fatalf("the restarted memory member applied %d ops, want the 50 written", st.Applied)
	}
	if m := storeMissing(g, 1, 50); m != 0 {
		t.Fatalf("%d of 50 acknowledged writes lost after the memory head's crash", m)
	}

	// Every member lost: the log tail's history is the longest.
	head := restartWhole(t, g)
	if m := storeMissing(g, head, 50); m != 0 {
		t.Fatalf("%d of 50 acknowledged writes lost after a crash of every member of M-Mb-D (chain %v)", m, g.master.Members())
	}
	// The restarted chain's first member ends as its tail (the others join
	// before the tail): one holding the whole history, not the memory one.
	if ms := g.master.Members(); ms[2] == 1 {
		t.Fatalf("the chain %v restarted from node 1, the memory member", ms)
	}
}

// restartWhole crashes every member of g, restarts them all, and waits
// until the master's chain holds all three again (the restarted ones
// joined: a join may change the head); it returns the head's index.
func restartWhole(t *testing.T, g *chainGroup) (head int) {
	t.Helper()
	for i := range 3 {
		g.crash(i)
	}
	for i := range 3 {
		g.restart(i)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if ms := g.master.Members(); len(ms) == 3 && g.reps[ms[0]-1] != nil && g.reps[ms[0]-1].Info().IsLeader {
			return int(ms[0] - 1)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no member heads the chain after the whole-chain restart (master: %v)", g.master.Members())
	return 0
}

// TestChainMemoryChainLosesEverything: a chain of memory members only
// (M-M-M) crashed whole keeps nothing, as the loss table says: it restarts
// empty and takes writes again. A single member's crash loses nothing.
func TestChainMemoryChainLosesEverything(t *testing.T) {
	g := newStoreChain(t, [3]ChainStore{ChainMemory, ChainMemory, ChainMemory}, 0)
	storeWrites(g, 0, 0, 20)
	g.crash(2)
	g.waitMembers(1, 2)
	if m := storeMissing(g, 0, 20); m != 0 {
		t.Fatalf("%d of 20 acknowledged writes lost after the tail's crash", m)
	}
	g.restart(2)
	g.waitMembers(1, 3, 2)
	head := restartWhole(t, g)
	if m := storeMissing(g, head, 20); m != 20 {
		t.Fatalf("%d of 20 writes lost after a crash of every memory member, want all", m)
	}
	res := g.write(head, set("after", "1"), shard.ReqID{Client: 10, Seq: 1})
	if res.Kind != kv.ResOK {
		t.Fatalf("a write after the restart: %+v", res)
	}
	var got kv.Result
	g.retry(head, "read after", func(ctx context.Context, r *Replica) (err error) {
		got, err = r.Read(ctx, get("after"), level.ConsLinearizable, shard.Session{})
		return err
	})
	if string(got.Bulk) != "1" {
		t.Fatalf("GET after = %q", got.Bulk)
	}
	if _, err := os.Stat(filepath.Join(g.dirs[0], "wal")); !os.IsNotExist(err) {
		t.Fatalf("a memory member wrote its log to disk: %v", err)
	}
}

// TestChainMemoryTailKeepsWhatTheLogsCommitted: D-D-M, a memory tail. The
// tail acknowledges what it holds, so a write is answered once both log
// members have it on disk; only the tail's host records a write as committed
// with the write itself. A crash of every member (a Close: the engine's
// buffered appends reach the OS; a kill -9 may lose the last of them,
// e2e TestChainStoresLogHeadKilledWhole) restarts the chain from a log
// member's history — not the memory tail's empty one — and keeps every
// answered write, the last one included. Three rules each keep it here: a
// member writes its commit point with the Ready that advances it, before it
// answers (chainCore.Ready), a restarted member counts what its engine
// applied as committed (the host applies only committed entries; what a
// power cut leaves of a commit point written and not yet fsynced), and a
// restart carries on from the members' logs past their commit points
// (chainCore.tentative). With all three off — the mutations commitLazy,
// chainCommitIgnoresEngine and chainTruncateAtBoot (the code before session
// 24) — the write answered just before the crash is lost, and the
// restarted head's engine holds a version its log does not, which no read
// can wait out.
func TestChainMemoryTailKeepsWhatTheLogsCommitted(t *testing.T) {
	for _, m := range []struct{ lazy, ignoreEngine bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		if (m.lazy || m.ignoreEngine) && !mutation.On {
			continue
		}
		if testMemoryTail(t, m.lazy, m.ignoreEngine, false) != 0 {
			t.Fatalf("commitLazy %v, chainCommitIgnoresEngine %v: the write answered just before the crash was lost", m.lazy, m.ignoreEngine)
		}
	}
}

func testMemoryTail(t *testing.T, lazy, ignoreEngine, truncate bool) (missing int) {
	g := newChainGroupTuned(t, 0, func(i int, o *Options) {
		co := *o.Chain
		co.Store = [3]ChainStore{ChainLog, ChainLog, ChainMemory}[i]
		o.Chain = &co
		o.mut.chainCommitLazy, o.mut.chainCommitIgnoresEngine, o.mut.chainTruncateAtBoot = lazy, ignoreEngine, truncate
	})
	storeWrites(g, 0, 0, 30)
	storeWrites(g, 0, 30, 1) // answered; with commitLazy the head's commit point not yet saved
	head := restartWhole(t, g)
	if m := storeMissing(g, head, 30); m != 0 {
		t.Fatalf("%d of the first 30 writes lost after a crash of every member of D-D-M", m)
	}
	var res kv.Result
	err := g.try(head, "read s30", func(ctx context.Context, r *Replica) (err error) {
		res, err = g.readFollowing(ctx, r, "s30")
		return err
	})
	if err != nil || string(res.Bulk) != "v30" {
		if !lazy || !ignoreEngine || !truncate {
			t.Fatalf("the write answered just before a crash of every member of D-D-M: %q, %v", res.Bulk, err)
		}
		return 1
	}
	return 0
}

// TestChainMemoryTailMutation: the counter-test of
// TestChainMemoryTailKeepsWhatTheLogsCommitted — with the commit point saved
// with batches only, the restart's committed prefix the saved commit
// point alone and the log past it dropped, the write answered last is lost.
func TestChainMemoryTailMutation(t *testing.T) {
	mutation.Require(t)
	if testMemoryTail(t, true, true, true) == 0 {
		t.Fatal("with commitLazy, chainCommitIgnoresEngine and chainTruncateAtBoot the write answered just before the crash survived: the test does not exercise the commit point")
	}
}

// TestChainPowerCutOfEveryMember: the loss table's power-cut column on the
// production host, in process: each member's disk is a vfs.Mem, and a power
// cut of every member at once keeps exactly what each had fsynced (its
// log's batches, the hard states written with them; not a commit point
// written on its own, nor the engine's appends, synced only at
// checkpoints). D-D-D keeps every answered write, the last included: the
// tail records what it writes as committed in the same fsynced write
// (chainCore.Ready), and the restart carries on from the most up-to-date
// durable log, past the commit points (chainCore.tentative); with both off
// — the mutations tailCommitLags (the tail saves its commit point as the
// others do, in a later Ready) and truncateAtBoot — the last answered
// write is lost. D-D-M keeps every write too: the head's commit point for
// the last was written on its own and not yet fsynced, and the memory tail
// keeps nothing, but both log members fsynced the write before passing it
// on, and the restart takes it from their logs; with truncateAtBoot (the
// code before) it was lost in 4 of 4 runs — the table's former window.
func TestChainPowerCutOfEveryMember(t *testing.T) {
	run := func(t *testing.T, stores [3]ChainStore, lag, truncate bool) (lastKept bool) {
		mems := [3]*vfs.Mem{vfs.NewMem(), vfs.NewMem(), vfs.NewMem()}
		g := newChainGroupTuned(t, 0, func(i int, o *Options) {
			co := *o.Chain
			co.Store = stores[i]
			o.Chain = &co
			o.FS = mems[i]
			o.mut.chainTailCommitLags, o.mut.chainTruncateAtBoot = lag, truncate
		})
		storeWrites(g, 0, 0, 30)
		// The power goes first (every disk operation fails from now on),
		// the processes stop, then the reboot keeps exactly what was
		// fsynced. Rebooting the disks before stopping the replicas let a
		// member still running write unsynced state again as new, synced
		// files (seen in TestChainAUSIPowerCut, which this mirrors).
		for i := range 3 {
			mems[i].CrashAfter(0)
		}
		for i := range 3 {
			g.reps[i].crash()
			g.reps[i] = nil
			g.nt.trs[i].Close()
			mems[i].Crash(nil)
		}
		head := g.restartAll()
		if m := storeMissing(g, head, 29); m != 0 {
			t.Fatalf("%v: %d of the first 29 answered writes lost in a power cut of every member", stores, m)
		}
		return g.read(head, "s29") == "v29"
	}
	dd, ddm := [3]ChainStore{ChainLog, ChainLog, ChainLog}, [3]ChainStore{ChainLog, ChainLog, ChainMemory}
	if !run(t, dd, false, false) {
		t.Fatal("D-D-D: the write answered last was lost in a power cut of every member")
	}
	if !run(t, ddm, false, false) {
		t.Fatal("D-D-M: the write answered last was lost in a power cut of every member (the log members fsynced it: the restart must carry on from their logs)")
	}
	if !mutation.On {
		return
	}
	if run(t, ddm, false, true) {
		t.Log("D-D-M, truncateAtBoot: the write answered last survived the power cut (its commit point reached the disk with a later batch)")
	} else {
		t.Log("D-D-M, truncateAtBoot: the write answered last was lost in the power cut: the code before's window")
	}
	if run(t, dd, true, true) {
		t.Fatal("tailCommitLags and truncateAtBoot not caught: D-D-D kept the write answered last")
	}
}

// TestChainSyncWaitsForALogMember: D-D-M repaired down to its memory member
// alone. An async write is answered; a sync write is not — no disk holds it
// — and fails at the request timeout with ErrNotDurable, which says why;
// once a log member restarts and joins, pulling the history onto its disk,
// the same write retried is answered, and new sync writes are (design/
// chain.md, "A sync answer needs a disk"). On the code before, the memory
// member alone answered the sync write, and a crash of it lost it.
func TestChainSyncWaitsForALogMember(t *testing.T) {
	stores := [3]ChainStore{ChainLog, ChainLog, ChainMemory}
	g := newChainGroupTuned(t, 0, func(i int, o *Options) {
		co := *o.Chain
		co.Store = stores[i]
		o.Chain = &co
		o.RequestTimeout = 300 * time.Millisecond
	})
	storeWrites(g, 0, 0, 5)
	g.crash(0)
	g.waitMembers(2, 3)
	g.crash(1)
	g.waitMembers(3)
	storeWritesAt(g, 2, 100, 1, level.Async)
	id := shard.ReqID{Client: 11, Seq: 1}
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = g.reps[2].Write(ctx, set("sync", "1"), level.Sync, id)
		cancel()
		if errors.Is(err, ErrNotDurable) || err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // no lease yet: try again
	}
	if !errors.Is(err, ErrNotDurable) {
		t.Fatalf("a sync write at the memory member alone: %v, want ErrNotDurable", err)
	}
	t.Logf("a sync write at the memory member alone: %v", err)
	g.restart(0)
	g.waitMembers(1, 3)
	g.retry(0, "the sync write again", func(ctx context.Context, r *Replica) error {
		_, err := r.Write(ctx, set("sync", "1"), level.Sync, id)
		return err
	})
	storeWrites(g, 0, 200, 3)
	if m := storeMissing(g, 0, 5); m != 0 {
		t.Fatalf("%d of the first 5 writes missing", m)
	}
}

// TestChainSyncWaitsForALogMemberNeverHeard: M-M-D whose log tail fails
// before any write reached it — its memory members never heard from a log
// member, no message said the chain had one. Their configuration does
// (ChainOptions.NoLogMember unset, as kefir up sets --chain-log-member from
// --chain-stores): an async write is answered, a sync write fails with
// ErrNotDurable, and once the log member restarts and joins the same write
// retried is answered (design/chain.md, "A sync answer needs a disk"). On
// the code before (hadLog learnt from messages only) the memory head took a
// vacuous durable point and answered the sync write no disk held.
func TestChainSyncWaitsForALogMemberNeverHeard(t *testing.T) {
	stores := [3]ChainStore{ChainMemory, ChainMemory, ChainLog}
	g := newChainGroupTuned(t, 0, func(i int, o *Options) {
		co := *o.Chain
		co.Store = stores[i]
		o.Chain = &co
		o.RequestTimeout = 300 * time.Millisecond
	})
	for i := range 3 {
		g.eventual(i, "x") // every member reported to the master (a lease)
	}
	g.crash(2)
	g.waitMembers(1, 2)
	storeWritesAt(g, 0, 100, 1, level.Async)
	id := shard.ReqID{Client: 11, Seq: 1}
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = g.reps[0].Write(ctx, set("sync", "1"), level.Sync, id)
		cancel()
		if errors.Is(err, ErrNotDurable) || err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // no lease yet: try again
	}
	if !errors.Is(err, ErrNotDurable) {
		t.Fatalf("a sync write at M-M, its log tail failed before any write: %v, want ErrNotDurable", err)
	}
	t.Logf("a sync write at M-M, its log tail failed before any write: %v", err)
	g.restart(2)
	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { return len(g.master.Members()) == 3 }) {
		t.Fatalf("chain %v: the log member did not join", g.master.Members())
	}
	g.retry(0, "the sync write again", func(ctx context.Context, r *Replica) error {
		_, err := r.Write(ctx, set("sync", "1"), level.Sync, id)
		return err
	})
	storeWrites(g, 0, 200, 3)
}
