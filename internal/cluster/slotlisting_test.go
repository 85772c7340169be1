package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// handingReplica is a group's replica whose table changes to next at its
// first read (a step of a move applied while a listing reads).
type handingReplica struct {
	*versionedReplica
	next *kv.SlotTable
}

func (r *handingReplica) Read(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, error) {
	res, err := r.versionedReplica.Read(ctx, op, c, s)
	if r.next != nil {
		r.t, r.next = r.next, nil
	}
	return res, err
}

// CLUSTER COUNTKEYSINSLOT and GETKEYSINSLOT (Multi.ScanSlot) list a slot's
// keys only at a group whose table serves the slot before and after the
// reads. Two cases a move makes: the map names the slot's destination,
// whose replica here has not applied the take-over (importing: its engine
// holds the partial pre-copy); and the slot's source applies its hand-over
// while the listing reads (its engine then holds keys it no longer
// serves, until the purge). Each is refused as a keyed read is: a redirect
// to the group that serves the slot (the importing table's peer, the
// handed-over table's), which the front door forwards. With the mutation
// SlotListingUnchecked both list the engine's keys.
func TestSlotListingOnlyWhereServed(t *testing.T) {
	ks := keysOfGroup1(1)
	k := ks[0]
	slot := Slot(k)
	x := []kv.SlotRange{{Start: slot, End: slot}}
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}}
	st := &stateGroup{st: State{Normal: true, Leader: 1}}
	list := func(m *Multi) ([]string, error) {
		var got []string
		err := m.ScanSlot(context.Background(), slot, level.ConsLinearizable, shard.Session{}, func(k []byte) bool {
			got = append(got, string(k))
			return true
		})
		return got, err
	}
	redirects := func(err error, addr string) bool {
		var nl *NotLeaderError
		return errors.As(err, &nl) && nl.Addr == addr && nl.HasSlot && nl.Slot == slot
	}

	// The map (a newer one: the move's DONE) gives the slot to group 2,
	// hosted here; its replica here is still importing from group 1 (on
	// node 2).
	rest := []SlotRange{{Start: 0, End: slot - 1}, {Start: slot + 1, End: 8191}}
	if slot == 0 {
		rest = rest[1:]
	}
	sm, err := NewSlotMap(3, []GroupSpec{
		{ID: 1, Members: []uint64{2}, Slots: rest},
		{ID: 2, Members: []uint64{1}, Slots: []SlotRange{{Start: slot, End: slot}, {Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec2, _ := sm.Group(2)
	importing, err := kv.NewSlotTable([]kv.SlotRange{{Start: 8192, End: 16383}}, 1).Set(x, kv.SlotImporting, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := NewMulti(sm, 1, members, []LocalGroup{{Spec: spec2, Hosted: Hosted{Replica: &versionedReplica{keys: [][]byte{k}, t: importing}, Group: st}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := list(dst); !redirects(err, "n2:2") {
		t.Fatalf("a listing of slot %d at a destination still importing it: %q, %v; want a redirect to group 1's node n2:2", slot, got, err)
	}

	// The slot's source, hosted here, hands the slot over to group 2 (on
	// node 2) during the listing.
	sm2, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{2}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec1, _ := sm2.Group(1)
	mig, err1 := kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1).Set(x, kv.SlotMigrating, 2, 2)
	handed, err2 := mig.Set(x, kv.SlotNone, 2, 2)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	src := func() *Multi {
		rep := &handingReplica{versionedReplica: &versionedReplica{keys: [][]byte{k}, t: mig}, next: handed}
		m, err := NewMulti(sm2, 1, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: rep, Group: st}}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if got, err := list(src()); !redirects(err, "n2:2") {
		t.Fatalf("a listing of slot %d at a source that handed it over during the reads: %q, %v; want a redirect to group 2's node n2:2", slot, got, err)
	}
	// Served throughout: listed.
	served, err := NewMulti(sm2, 1, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: &versionedReplica{keys: [][]byte{k}, t: mig}, Group: st}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := list(served); err != nil || len(got) != 1 || got[0] != string(k) {
		t.Fatalf("a listing of slot %d at its source, migrating: %q, %v; want %q", slot, got, err, k)
	}

	if mutation.On {
		MultiMut.SlotListingUnchecked.Store(true)
		defer MultiMut.SlotListingUnchecked.Store(false)
		for _, m := range []*Multi{dst, src()} {
			if got, err := list(m); err != nil || len(got) != 1 {
				t.Fatalf("with SlotListingUnchecked: %q, %v; want the engine's key", got, err)
			}
		}
		t.Log("SlotListingUnchecked: both list the engine's key")
	}
}
