package vrshard

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// TestChainRestartCheckpointOfTheNewerEpoch: a whole-chain restart must
// know the numbering epoch of a checkpoint's last update (chain.Master's
// upToDate: the newest epoch of its last update, then the longest). Node 1,
// the head, logged updates it never passed on and stopped; the chain
// repaired around it (a newer epoch) and answered two writes, fewer than
// node 1's unpassed suffix; nodes 2 and 3 then checkpointed with no entry
// after (a quiet moment: CheckpointOps 1) and stopped too. Every node
// restarts on its disk. Node 1 reports its whole log (its tentative suffix
// past the commit point), nodes 2 and 3 their checkpoint, whose last
// update's number the host keeps with it on disk (the snapshot record's
// number: Replica.maybeCheckpoint, chainCore.NumberAt, openChain). The
// restart carries on from theirs, and both answered writes are there. With
// the mutation chainCheckpointNoNumber (the host before: no number on
// disk) nodes 2 and 3 report lu 0, compared by length: node 1's longer log
// of the older epoch wins and both answered writes are lost.
//
// Node 1's unpassed suffix is written into its log while it is down (three
// entries after its last, numbered on in its epoch, as a head numbers the
// updates it takes): a crash between a head's fsync and its send cannot be
// timed on real transports.
func TestChainRestartCheckpointOfTheNewerEpoch(t *testing.T) {
	mutation.Require(t) // the afterHandle hook
	if lost := checkpointRestartLoses(t, false); lost != 0 {
		t.Fatalf("%d of 2 answered writes lost in the whole chain's restart", lost)
	}
	if lost := checkpointRestartLoses(t, true); lost != 2 {
		t.Fatalf("chainCheckpointNoNumber not caught: %d of 2 answered writes lost, want both", lost)
	}
}

// checkpointRestartLoses runs TestChainRestartCheckpointOfTheNewerEpoch's
// case, with the mutation chainCheckpointNoNumber or not, and returns how
// many of the two writes the repaired chain answered are missing after the
// whole chain's restart.
func checkpointRestartLoses(t *testing.T, noNumber bool) (lost int) {
	var alone [3]atomic.Uint64 // the op a member's last checkpoint took with nothing after it
	g := newChainGroupTuned(t, 0, func(i int, o *Options) {
		o.mut.chainCheckpointNoNumber = noNumber
		if i == 0 {
			return // node 1 keeps its log (its default checkpoints are far off)
		}
		o.CheckpointOps = 1
		o.mut.afterHandle = func(r *Replica) {
			if r.st.ckpts.Load() > 0 && !r.ckptRunning && r.sinceCkpt == 0 && r.lastOp.Load() == r.applied.Load() {
				alone[i].Store(r.applied.Load())
			} else {
				alone[i].Store(0)
			}
		}
	})
	for k := 1; k <= 4; k++ {
		g.write(0, set(fmt.Sprint("a", k), fmt.Sprint("v", k)), shard.ReqID{Client: 5, Seq: uint64(k)})
	}
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	g.crash(0)
	g.waitMembers(2, 3)
	for k := 1; k <= 2; k++ {
		g.write(1, set(fmt.Sprint("b", k), fmt.Sprint("w", k)), shard.ReqID{Client: 5, Seq: uint64(4 + k)})
	}
	for _, i := range []int{1, 2} {
		if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { return alone[i].Load() == 6 }) {
			t.Fatalf("node %d did not checkpoint its 6 entries with nothing after (last: %d)", i+1, alone[i].Load())
		}
	}
	g.crash(1)
	g.crash(2)

	// Node 1's suffix: three updates it logged as head and never passed on.
	w, st, err := openWAL(vfs.Default, vfs.Join(g.dirs[0], "wal"))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.entries) != 4 {
		t.Fatalf("node 1's log holds %d entries after its snapshot at %d, want its 4", len(st.entries), st.snap.Op)
	}
	last := st.entries[3]
	ce, err := fromLogEntry(last)
	if err != nil {
		t.Fatal(err)
	}
	req, err := decodeChainOp(ce.Op)
	if err != nil {
		t.Fatal(err)
	}
	var suffix []core.Entry
	for i := uint64(1); i <= 3; i++ {
		req.Client, req.ReqNum = 99, i // new requests, never answered
		ce.Seq++
		ce.Op = appendChainOp(nil, req)
		e, err := chainEntry(last.Op+i, ce)
		if err != nil {
			t.Fatal(err)
		}
		suffix = append(suffix, e)
	}
	w.addEntries(suffix)
	if err := w.write(); err != nil {
		t.Fatal(err)
	}
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}

	head := g.restartAll()
	for k := 1; k <= 2; k++ {
		if got, want := g.read(head, fmt.Sprint("b", k)), fmt.Sprint("w", k); got == "" {
			lost++
		} else if got != want {
			t.Fatalf("GET b%d at node %d = %q, want the answered %q", k, head+1, got, want)
		}
	}
	return lost
}

// TestWALSnapshotNumberAndTheRecordBefore: a snapshot record keeps the
// engine's number of its last entry (core.Snapshot.Number) after its
// clients, and only when it has one: a record without it — VR's, and a
// chain member's written by a build before the number — is read as before,
// its number unknown (0). A chain member restarting from such a checkpoint
// with no entry after it reports lu 0 (chain.Master's upToDate then
// compares by length, the rule before); from one with the number, its
// number and so its epoch.
func TestWALSnapshotNumberAndTheRecordBefore(t *testing.T) {
	clients := []vr.ClientRecord{{Client: 1, ReqNum: 4, Op: 4, Result: []byte("r")}}
	seq := uint64(2)<<chainSeqBits | 2
	for _, tc := range []struct {
		name   string
		before bool // written as a build before the number wrote it
		number uint64
	}{{"with", false, seq}, {"without", false, 0}, {"before", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			mem := vfs.NewMem()
			w := newTestWAL(t, mem)
			if tc.before {
				w.record(recSnapshot, func(b []byte) []byte {
					return kv.AppendClientEntries(binary.AppendUvarint(b, 6), clients)
				})
			} else {
				w.addSnapshot(vr.Snapshot{Op: 6, Clients: clients, Number: tc.number})
			}
			w.addHardState(vr.HardState{Commit: 6})
			if err := w.roll(); err != nil {
				t.Fatal(err)
			}
			w.close()
			_, st, err := openWALWith(mem, "/wal", testWALConfig())
			if err != nil {
				t.Fatal(err)
			}
			if st.snap.Op != 6 || st.snap.Number != tc.number || len(st.snap.Clients) != 1 || st.snap.Clients[0].ReqNum != 4 {
				t.Fatalf("recovered snapshot %+v, want op 6, number %#x, the client", st.snap, tc.number)
			}
			c, err := openChain(chainConfig{Self: 2, Master: bedMaster, Members: []uint64{1, 2, 3}},
				core.Boot{HardState: st.hs, Snapshot: &st.snap, Entries: st.entries})
			if err != nil {
				t.Fatal(err)
			}
			if lu, n := c.restartReport(); lu != tc.number || n != 6 {
				t.Fatalf("restart report (%#x, %d), want (%#x, 6)", lu, n, tc.number)
			}
			if got := c.NumberAt(6); got != tc.number {
				t.Fatalf("NumberAt(6) = %#x after the restart, want %#x", got, tc.number)
			}
		})
	}
}

// TestChainNumberAt: a chain core's number of the history's entry at a
// position (core.Numberer), which its host keeps with a checkpoint there:
// the entry's sequence number, the compacted prefix's at its end, 0
// outside the history.
func TestChainNumberAt(t *testing.T) {
	b := bedWithWrites(t, []uint64{1, 2, 3}, 3)
	c := b.cores[3]
	hist := c.m.History()
	if len(hist) != 3 {
		t.Fatalf("the tail holds %d entries, want 3", len(hist))
	}
	for op := uint64(1); op <= 3; op++ {
		if got := c.NumberAt(op); got != hist[op-1].Seq {
			t.Fatalf("NumberAt(%d) = %#x, want %#x", op, got, hist[op-1].Seq)
		}
	}
	if got := c.NumberAt(4); got != 0 {
		t.Fatalf("NumberAt(4) past the history = %#x, want 0", got)
	}
	if err := c.Compact(2); err != nil {
		t.Fatal(err)
	}
	if got, want := c.NumberAt(2), hist[1].Seq; got != want || c.NumberAt(1) != 0 {
		t.Fatalf("after compacting to 2: NumberAt(2) = %#x (want %#x), NumberAt(1) = %#x (want 0)", got, want, c.NumberAt(1))
	}
}

// TestChainRestartNeverFromAMemberMidPages: a whole chain's power cut
// while node 1 was taking a paged snapshot over its old checkpoint (its disk
// marked recovering, its engine holding pages up to a newer version). Its
// checkpoint is the longest history reported, of the newest numbering
// epoch — but its state is a prefix of the pages over the checkpoint, no
// history's. Its heartbeats say so (Any: chain.Status.Paged, openChain),
// the master restarts the chain from node 3, and node 1 refuses a RESTART
// sent to it all the same (review34a). With the mutation
// chainLostStateReplays (the code before: no paged start for a member with
// a checkpoint) node 1 carries the chain on.
func TestChainRestartNeverFromAMemberMidPages(t *testing.T) {
	seq := func(e, i uint64) uint64 { return e<<chainSeqBits | i }
	boots := map[uint64]core.Boot{
		1: {LostState: true, StateTop: 45, HardState: core.HardState{Commit: 40}, Snapshot: &core.Snapshot{Op: 40, Number: seq(5, 40)}},
		2: {StateTop: 20, HardState: core.HardState{Commit: 20}, Snapshot: &core.Snapshot{Op: 20, Number: seq(3, 20)}},
		3: {StateTop: 22, HardState: core.HardState{Commit: 22}, Snapshot: &core.Snapshot{Op: 22, Number: seq(3, 22)}},
	}
	run := func(t *testing.T, mutated bool) (chain.NodeID, *chainCore) {
		ids := []uint64{1, 2, 3}
		b := newChainBed(t, ids...)
		for _, id := range ids {
			b.crash(id)
		}
		if !b.master.Down() {
			t.Fatal("the master is not down with every member crashed")
		}
		for _, id := range ids {
			c, err := openChain(chainConfig{Self: id, Master: bedMaster, Members: ids, Heartbeat: 1, lostStateReplays: mutated}, boots[id])
			if err != nil {
				t.Fatal(err)
			}
			c.Tick(1)
			rd := c.Ready()
			if len(rd.Messages) != 1 || rd.Messages[0].Type != chain.MsgHeartbeat {
				t.Fatalf("node %d sent %v, want a heartbeat", id, rd.Messages)
			}
			// As chainmaster takes a restarted member's heartbeat.
			hb := rd.Messages[0]
			if id == 1 && hb.Any == mutated {
				t.Fatalf("node 1's heartbeat says paged %v (mutated %v)", hb.Any, mutated)
			}
			b.cores[id] = c
			b.master.Restarted(hb.From, hb.LU, int(hb.LA), hb.Any)
		}
		ms := b.master.Members()
		if b.master.Down() || len(ms) != 1 {
			t.Fatalf("the chain did not restart: members %v", ms)
		}
		// Node 1 refuses a RESTART, were it ordered one.
		b.cores[1].Step(0, chain.Msg{Type: chain.MsgRestart, From: bedMaster, To: 1, Epoch: b.master.Epoch() + 1})
		return ms[0], b.cores[1]
	}
	if from, c1 := run(t, false); from != 3 || c1.status().State != chain.Inactive {
		t.Fatalf("restarted from %d (want 3), node 1 %v after a RESTART (want inactive)", from, c1.status().State)
	}
	if mutation.On {
		if from, _ := run(t, true); from != 1 {
			t.Fatalf("chainLostStateReplays: restarted from %d, want 1 (the mutation does not bite)", from)
		}
	}
}
