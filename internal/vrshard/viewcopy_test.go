package vrshard

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
)

// A view copy a move imports (kv/viewcopy.go) is the group's state: every
// replica judges a session's part of the copied group by it
// (CopiedSessionViews) — an op the copy covers named in another view is
// lost; the same view, an op above the copy's top or below its first row,
// or a group it holds no copy of, pass — and so does a replica restarted on
// its disk and one rebuilt by state transfer. MoveViews hands the copy on
// beside the group's own history.
func TestViewCopiesSurviveRestartAndStateTransfer(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 40 // compact often: a wiped replica needs a snapshot
		o.KeepTail = 5
	})
	write := func(op kv.Op) kv.Result {
		t.Helper()
		res, err := c.write(op, shard.ReqID{}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	write(slotOp(kv.KindSlotInit, []kv.SlotRange{{Start: 0, End: 299}, {Start: 301, End: kv.NumSlots - 1}}, 0, 0, 1))
	write(slotOp(kv.KindSlotSet, []kv.SlotRange{{Start: 300, End: 300}}, kv.SlotImporting, 7, 2))
	cp := kv.ViewCopy{Top: 500, Starts: []kv.ViewStart{{Op: 10, View: 1}, {Op: 200, View: 3}}}
	last := write(kv.Op{Kind: kv.KindSlotImport, Keys: kv.AppendSlotViews(nil, 7, cp)})
	c.waitApplied(last.Version, 5*time.Second)

	wrote := func(op, view uint64) shard.Session {
		return shard.Session{LastWrite: op, WriteView: view, WriteViewKnown: true}
	}
	judge := func(i int, when string) {
		t.Helper()
		r := c.reps[i]
		if err := r.CopiedSessionViews(7, wrote(250, 2)); !errors.Is(err, shard.ErrSessionLost) {
			t.Fatalf("replica %d %s: a write at op 250 of view 2, which group 7's copy says view 3 ordered: %v", i, when, err)
		}
		read := shard.Session{MaxRead: 20, ReadView: 3, ReadViewKnown: true}
		if err := r.CopiedSessionViews(7, read); !errors.Is(err, shard.ErrSessionLost) {
			t.Fatalf("replica %d %s: a read at op 20 of view 3 (view 1 by the copy): %v", i, when, err)
		}
		for _, s := range []shard.Session{wrote(250, 3), wrote(600, 9), wrote(5, 9)} {
			if err := r.CopiedSessionViews(7, s); err != nil {
				t.Fatalf("replica %d %s: %+v: %v", i, when, s, err)
			}
		}
		if err := r.CopiedSessionViews(8, wrote(250, 2)); err != nil {
			t.Fatalf("replica %d %s: group 8, of which it holds no copy: %v", i, when, err)
		}
	}
	for i := range c.reps {
		judge(i, "after the import")
	}
	l := c.leader(5 * time.Second)
	vs, top := c.reps[l].MoveViews(1)
	if len(vs) != 2 || vs[0].Group != 1 || vs[0].Top != top || top < last.Version || len(vs[0].Starts) == 0 ||
		vs[1].Group != 7 || vs[1].Top != cp.Top || len(vs[1].Starts) != len(cp.Starts) {
		t.Fatalf("MoveViews: %+v (top %d)", vs, top)
	}

	f, g := (l+1)%3, (l+2)%3
	c.kill(f)
	c.open(f, false, nil)
	c.waitApplied(last.Version, 10*time.Second)
	judge(f, "after its restart")

	c.wipe(g)
	for i := range 60 {
		last = write(set(fmt.Sprint("k", i), "v"))
	}
	c.open(g, false, nil)
	c.waitApplied(last.Version, 15*time.Second)
	c.waitRecovered(g, 15*time.Second)
	if c.reps[g].Stats().SnapsLoaded == 0 {
		t.Fatal("the wiped replica caught up without a snapshot: the test did not test state transfer")
	}
	judge(g, "rebuilt by state transfer")
}

// CopiedSessionViews runs on every session read, per part of the token of
// another group and per hosted group (cluster.Multi.otherParts): a pass
// allocates nothing — the words naming the copy are made for the error
// only (before, two allocations and ~290 ns of formatting per call, more
// than ten times the check itself) — and a mismatch still names the copy.
func TestCopiedSessionViewsPassAllocatesNothing(t *testing.T) {
	c := kv.ViewCopy{Top: 1 << 20}
	for i := range 10 {
		c.Starts = append(c.Starts, kv.ViewStart{Op: uint64(1 + i*1000), View: uint64(i + 1)})
	}
	cs := map[uint32]kv.ViewCopy{7: c}
	r := &Replica{app: &applier{}}
	r.app.copies.Store(&cs)
	ok := shard.Session{LastWrite: 5000, WriteView: 5, WriteViewKnown: true, MaxRead: 4000, ReadView: 4, ReadViewKnown: true}
	if n := testing.AllocsPerRun(100, func() {
		if err := r.CopiedSessionViews(7, ok); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("a session that passes the copy's check: %v allocations per check, want 0", n)
	}
	lost := ok
	lost.WriteView = 4
	err := r.CopiedSessionViews(7, lost)
	if !errors.Is(err, shard.ErrSessionLost) || !strings.Contains(err.Error(), "by the copy of group 7's view history") {
		t.Fatalf("a session whose write the copy says was of another view: %v", err)
	}
}
