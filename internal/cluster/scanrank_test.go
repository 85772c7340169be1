package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// keysOfGroup1 returns n keys of slots 0-8191 (group 1 of the tests' maps),
// in key order, each in a slot of its own.
func keysOfGroup1(n int) [][]byte {
	var out [][]byte
	seen := map[uint16]bool{}
	for i := 0; len(out) < n; i++ {
		k := []byte(fmt.Sprintf("k%04d", i))
		if s := Slot(k); s <= 8191 && !seen[s] {
			seen[s] = true
			out = append(out, k)
		}
	}
	return out
}

// A keyspace scan at level session at a node whose replica of a move's
// source is a follower behind the hand-over: its table still serves the
// moved slots and its engine holds their state before the move, while the
// session, after the move, deleted one key of a moved slot (kd) and
// overwrote another (kw) at the destination. The destination's part, read
// at or after the session's writes there, ranks the slots above the
// source's (slotrank.go), so the page holds neither the deleted key nor the
// overwritten key's old value: the source's keys of those slots are
// dropped, and the slots are served by the destination's part. Both with
// the destination hosted here (the node's owner of the slots is then the
// destination) and with its part read at another node (this node's map
// still names the source: the owner-first choice of a key's copy would
// keep the old value). With the mutation ScanPartsUnranked the source's
// keys are kept: the deleted key comes back.
func TestScanAtLevelSessionBehindAHandOver(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{1, 2}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ks := keysOfGroup1(3)
	kd, kw, kk := ks[0], ks[1], ks[2] // deleted, overwritten, not moved
	moved := []kv.SlotRange{{Start: Slot(kd), End: Slot(kd)}, {Start: Slot(kw), End: Slot(kw)}}
	// The destination took the slots over at epoch 2; the source's
	// replica here is behind either its migrating step (no table yet)
	// or its hand-over (migrating at 2).
	dst0, err1 := kv.NewSlotTable([]kv.SlotRange{{Start: 8192, End: 16383}}, 1).Set(moved, kv.SlotImporting, 1, 2)
	migrating, err2 := kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1).Set(moved, kv.SlotMigrating, 2, 2)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	dst, err := dst0.Set(moved, kv.SlotOwned, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	spec1, _ := sm.Group(1)
	spec2, _ := sm.Group(2)
	st := &stateGroup{st: State{Normal: true, Leader: 1}}
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}}
	sess := shard.Session{}.AfterWrite(kv.Result{Version: 9, Group: 2}.Pos()) // deleted kd, wrote kw "new" through group 2
	for _, srcTable := range []*kv.SlotTable{nil, migrating} {
		for _, remote := range []bool{false, true} {
			name := fmt.Sprintf("source table %v, destination read at another node %v", srcTable != nil, remote)
			src := &versionedReplica{keys: [][]byte{kd, kw, kk}, vals: [][]byte{[]byte("old"), []byte("old"), []byte("k")}, t: srcTable}
			dstRep := &versionedReplica{keys: [][]byte{kw}, vals: [][]byte{[]byte("new")}, t: dst}
			groups := []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: src, Group: st}}}
			if !remote {
				groups = append(groups, LocalGroup{Spec: spec2, Hosted: Hosted{Replica: dstRep, Group: st}})
			}
			m, err := NewMulti(sm, 1, members, groups)
			if err != nil {
				t.Fatal(err)
			}
			if remote {
				n2, err := NewMulti(sm, 2, members, []LocalGroup{{Spec: spec2, Hosted: Hosted{Replica: dstRep, Group: st}}})
				if err != nil {
					t.Fatal(err)
				}
				m.SetGroupScanAsker(wireAsker(n2))
				if id, _ := m.owner(Slot(kd)); id != 1 {
					t.Fatalf("%s: this node's owner of %q is group %d, want the source (1): its map is stale", name, kd, id)
				}
			}
			scan := func() string {
				t.Helper()
				res, _, err := m.Scan(context.Background(), kv.Op{Kind: kv.KindScan, Limit: 10}, level.Consistency{Kind: level.Session}, sess)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return fmt.Sprintf("%q", res.Array)
			}
			want := fmt.Sprintf("%q", [][]byte{kw, []byte("new"), kk, []byte("k")})
			if got := scan(); got != want {
				t.Fatalf("%s: the page %s, want %s (%q deleted and %q overwritten by the session at the destination)", name, got, want, kd, kw)
			}
			if mutation.On {
				MultiMut.ScanPartsUnranked.Store(true)
				got := scan()
				MultiMut.ScanPartsUnranked.Store(false)
				if !strings.Contains(got, fmt.Sprintf("%q", kd)) {
					t.Fatalf("%s: ScanPartsUnranked not caught: %s", name, got)
				}
				t.Logf("%s: with ScanPartsUnranked: %s", name, got)
			}
		}
	}
}

// A slot's ranks (slotrank.go) along a move from group 1 to group 2 and
// on to group 3: a replica of a group whose table serves the slot is
// behind (another group's table ranks the slot higher) exactly when that
// group's state was overtaken — its own later step (migrating, hand-over),
// or the next group's take-over; a source at its migrating step is not
// behind a destination still importing, a destination that took over is
// not behind its source's hand-over, and after an abort neither side is
// behind the other. A destination's importing step ranks above a source
// that has not applied its migrating step (a brief lag, read again).
func TestSlotRanksOrderAMovesSteps(t *testing.T) {
	x := []kv.SlotRange{{Start: 7, End: 7}}
	must := func(tb *kv.SlotTable, err error) *kv.SlotTable {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	var owned slotSet // a group without a table owns its spec's slots
	for s := range uint16(8192) {
		owned.add(s)
	}
	// A serving table's rank of slot 7 (Lo), and any table's (Hi).
	serving := func(tb *kv.SlotTable) uint64 { return ranksOf(tb, &owned).at(7).Lo }
	rank := func(tb *kv.SlotTable) uint64 { return ranksOf(tb, &owned).at(7).Hi }
	// Group 1 owns slot 7; group 2 and 3 do not.
	a0 := kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1)
	b0 := kv.NewSlotTable([]kv.SlotRange{{Start: 8192, End: 16383}}, 1)
	bImp := must(b0.Set(x, kv.SlotImporting, 1, 2))
	aMig := must(a0.Set(x, kv.SlotMigrating, 2, 2))
	aNone := must(aMig.Set(x, kv.SlotNone, 2, 2))
	bOwn := must(bImp.Set(x, kv.SlotOwned, 1, 2))
	aBack := must(aMig.Set(x, kv.SlotOwned, 0, 2)) // an abort
	bGone := must(bImp.Set(x, kv.SlotNone, 1, 2))
	c0 := kv.NewSlotTable(nil, 1)
	cImp := must(c0.Set(x, kv.SlotImporting, 2, 3))
	bMig := must(bOwn.Set(x, kv.SlotMigrating, 3, 3))
	cOwn := must(cImp.Set(x, kv.SlotOwned, 2, 3))
	for _, c := range []struct {
		name         string
		serving, oth *kv.SlotTable
		behind       bool
	}{
		{"source without a table, destination took over", nil, bOwn, true},
		{"source owned, destination took over", a0, bOwn, true},
		{"source migrating, destination took over", aMig, bOwn, true},
		{"source migrating, destination importing", aMig, bImp, false},
		{"source owned, destination importing (the source lags its migrating step)", a0, bImp, true},
		{"source migrating, its own hand-over elsewhere", aMig, aNone, true},
		{"destination took over, source handed over", bOwn, aNone, false},
		{"destination took over, a stale source replica", bOwn, aMig, false},
		{"source after an abort, destination gave up", aBack, bGone, false},
		{"source migrating, destination gave up (the source lags the abort)", aMig, bGone, true},
		{"first destination, second took over", bOwn, cOwn, true},
		{"first destination migrating, second importing", bMig, cImp, false},
		{"first source behind both moves, second destination importing", a0, cImp, true},
		{"a group without a table, one with a table not owning the slot", nil, b0, false},
	} {
		if got := serving(c.serving) < rank(c.oth); got != c.behind {
			t.Errorf("%s: behind %v (ranks %d and %d), want %v", c.name, got, serving(c.serving), rank(c.oth), c.behind)
		}
	}
	// The runs cover every slot, and a combination keeps them so; a
	// table's slots it does not serve are never behind.
	for _, tb := range []*kv.SlotTable{a0, bOwn, cImp} {
		if r := ranksOf(tb, nil); !validRanks(r) || !validRanks(spanRanks(r, ranksOf(nil, &owned))) {
			t.Errorf("ranks %v do not cover every slot", r)
		}
	}
	if below(ranksOf(b0, nil), ranksOf(a0, nil)) || below(ranksOf(a0, nil), ranksOf(b0, nil)) {
		t.Error("two groups' tables outside any move: one is behind the other")
	}
}
