package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// BenchmarkScanPage: one page (Limit 100) of a keyspace scan at level
// session at a node hosting both groups of a map, 1,000 keys split between
// them by slot, the groups' tables those of a finished move of one slot
// range (the merge's per-page work: parts read, filtered, ranked, merged).
func BenchmarkScanPage(b *testing.B) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{1}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	x := []kv.SlotRange{{Start: 100, End: 199}}
	t1 := kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1)
	t2 := kv.NewSlotTable([]kv.SlotRange{{Start: 8192, End: 16383}}, 1)
	t1, _ = t1.Set(x, kv.SlotMigrating, 2, 2)
	t1, _ = t1.Set(x, kv.SlotNone, 2, 2)
	t2, _ = t2.Set(x, kv.SlotImporting, 1, 2)
	t2, _ = t2.Set(x, kv.SlotOwned, 1, 2)
	var k1, k2 [][]byte
	for i := range 1000 {
		k := []byte(fmt.Sprintf("key:%06d", i))
		if s := Slot(k); t1.Entry(s).State.Serves() {
			k1 = append(k1, k)
		} else {
			k2 = append(k2, k)
		}
	}
	slices.SortFunc(k1, func(a, b []byte) int { return slices.Compare(a, b) })
	slices.SortFunc(k2, func(a, b []byte) int { return slices.Compare(a, b) })
	spec1, _ := sm.Group(1)
	spec2, _ := sm.Group(2)
	st := &stateGroup{st: State{Normal: true, Leader: 1}}
	m, err := NewMulti(sm, 1, []Member{{ID: 1, ClientAddr: "n1:1"}}, []LocalGroup{
		{Spec: spec1, Hosted: Hosted{Replica: &versionedReplica{keys: k1, t: t1}, Group: st}},
		{Spec: spec2, Hosted: Hosted{Replica: &versionedReplica{keys: k2, t: t2}, Group: st}},
	})
	if err != nil {
		b.Fatal(err)
	}
	op := kv.Op{Kind: kv.KindScan, Limit: 100}
	c := level.Consistency{Kind: level.Session}
	b.ReportAllocs()
	for b.Loop() {
		res, _, err := m.Scan(context.Background(), op, c, shard.Session{})
		if err != nil || len(res.Array) != 200 {
			b.Fatalf("%d %v", len(res.Array), err)
		}
	}
}
