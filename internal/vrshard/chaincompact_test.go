package vrshard

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// TestChainCompaction: chain members on the host checkpoint and compact
// their history as VR replicas do (docs/design/chain.md, "Bounded
// history"). Under a long run of writes every member's history in memory
// stays under a bound set by the checkpoint interval and the kept tail; a
// member that was down while the tail compacted past its durable prefix
// restarts from its own checkpoint (replaying only the log after it),
// rejoins, and its pre-copy starts from a snapshot of the tail; it then
// serves every write as the head. Last a node with an empty disk joins the
// compacted chain from a snapshot and serves every write as the head.
func TestChainCompaction(t *testing.T) {
	mutation.Require(t)
	const ckpt, keep = 64, 16
	var longest [3]atomic.Uint64 // the longest history each member held in memory
	g := newChainGroupTuned(t, 0, func(i int, o *Options) {
		o.CheckpointOps, o.KeepTail = ckpt, keep
		o.mut.afterHandle = func(r *Replica) {
			in := r.core.Info()
			if n := in.LastOp + 1 - in.FirstOp; n > longest[i].Load() {
				longest[i].Store(n)
			}
		}
	})
	seq := uint64(0)
	head := 0
	writes := func(n int) {
		for range n {
			seq++
			g.write(head, set(fmt.Sprint("k", seq%40), fmt.Sprint("v", seq)), shard.ReqID{Client: 5, Seq: seq})
		}
	}
	writes(300)
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	// A checkpoint runs every ckpt applied ops and keeps `keep` entries;
	// the driver compacts when the checkpoint's engine sync is back, so a
	// few checkpoints' worth of writes may come in meanwhile.
	const bound = 3*ckpt + keep
	for i, r := range g.reps {
		if n := longest[i].Load(); n > bound || n == 0 {
			t.Fatalf("node %d held up to %d history entries in memory, want at most %d", i+1, n, bound)
		}
		if r.Stats().Checkpoints == 0 {
			t.Fatalf("node %d took no checkpoint", i+1)
		}
	}

	g.crash(1)
	g.waitMembers(1, 3)
	writes(200) // the tail compacts far past what node 2 holds
	g.restart(1)
	g.waitMembers(1, 2, 3)
	writes(1)
	g.caughtUp(1, 0)
	st := g.reps[1].Stats()
	if st.SnapsLoaded == 0 {
		t.Fatalf("node 2 rejoined without a snapshot (stats %+v)", st)
	}
	if st.Applied >= 300 {
		t.Fatalf("node 2 applied %d entries after its restart: it replayed more than its log's tail", st.Applied)
	}
	t.Logf("longest histories in memory %d %d %d (bound %d); node 2 after restart: applied %d, snapshots loaded %d",
		longest[0].Load(), longest[1].Load(), longest[2].Load(), bound, st.Applied, st.SnapsLoaded)
	if n := g.reps[2].Stats().SnapsCaptured; n == 0 {
		t.Fatalf("the tail captured no snapshot for the joiner")
	}
	// Node 2 serves from the state its snapshot and pre-copy gave it: the
	// head fails, node 2 heads the chain.
	g.crash(0)
	g.waitMembers(2, 3)
	for k := seq - 39; k <= seq; k++ {
		if got, want := g.read(1, fmt.Sprint("k", k%40)), fmt.Sprint("v", k); got != want {
			t.Fatalf("GET k%d at node 2 after its snapshot = %q, want %q", k%40, got, want)
		}
	}
	if n := longest[1].Load(); n > bound {
		t.Fatalf("node 2 held up to %d history entries, want at most %d", n, bound)
	}

	// Node 1 comes back on an empty disk, a new node: its pre-copy starts
	// from nothing, below the tail's compacted history, so from a snapshot.
	head = 1
	writes(100)
	g.dirs[0] = t.TempDir()
	g.restart(0)
	g.waitMembers(2, 1, 3)
	writes(1)
	g.caughtUp(0, 1)
	if st := g.reps[0].Stats(); st.SnapsLoaded == 0 || st.Applied >= 100 {
		t.Fatalf("the new node 1 joined with %d snapshots, applying %d entries: want a snapshot and the log after it", st.SnapsLoaded, st.Applied)
	}
	g.crash(1)
	g.waitMembers(1, 3)
	for k := seq - 39; k <= seq; k++ {
		if got, want := g.read(0, fmt.Sprint("k", k%40)), fmt.Sprint("v", k); got != want {
			t.Fatalf("GET k%d at the new node 1 = %q, want %q", k%40, got, want)
		}
	}
}
