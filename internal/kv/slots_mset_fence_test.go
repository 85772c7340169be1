package kv

import (
	"errors"
	"fmt"
	"testing"
)

// The fence checks an MSET's or MSETNX's keys, not its values
// (RoutingKeys' step): an MSET of keys the group owns must not be refused
// because a *value* hashes to a slot the group does not serve (the refusal
// would redirect the client to that value's group, which refuses the keys).
// TestSlotImportMarksAndMovedRequest has MovedRequest's case.
func TestFenceChecksMSetKeysNotValues(t *testing.T) {
	owned := keyOfSlot(100)
	tb := NewSlotTable([]SlotRange{{100, 100}}, 1)
	val := keyOfSlot(5) // a value that, read as a key, is of slot 5
	for _, kind := range []Kind{KindMSet, KindMSetNX} {
		op := Op{Kind: kind, Keys: [][]byte{owned, val}}
		if err := tb.Check(&op); err != nil {
			t.Errorf("%s of a key the group owns (value %q): refused: %v", kind, val, err)
		}
	}
}

// A scan is not fenced by its start key (a SCAN cursor's next key, which
// may hash to any slot): a group's part of a keyspace scan that resumes at
// a key of a slot it does not serve was refused ("ERR slot S is none
// here"), so paged SCAN and CLUSTER GETKEYSINSLOT failed at a node of
// several groups once a move had given the groups tables. Its callers
// filter what it returns by slot (cluster.servedPart, ScanSlot).
func TestFenceDoesNotCheckAScansStart(t *testing.T) {
	tb := NewSlotTable([]SlotRange{{100, 100}}, 1)
	op := Op{Kind: KindScan, Key: keyOfSlot(5), End: keyOfSlot(6), Limit: 10}
	if err := tb.Check(&op); err != nil {
		t.Fatalf("a scan from a key of slot 5 at a group serving slot 100: refused: %v", err)
	}
	if ks, _ := op.RoutingKeys(); ks != nil {
		t.Fatalf("a scan routes by %q", ks)
	}
}

// CheckSlotTable (the fence read off a table's encoding, for a transaction's
// snapshot) decides every key as Check of the decoded table does.
func TestCheckSlotTableAgreesWithCheck(t *testing.T) {
	tb := NewSlotTable([]SlotRange{{0, 99}, {200, 300}, {16000, NumSlots - 1}}, 3)
	tb, err := tb.Set([]SlotRange{{50, 60}}, SlotMigrating, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	tb, err = tb.Set([]SlotRange{{55, 56}}, SlotNone, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	enc := AppendSlotTable(nil, tb)
	for i := 0; i < 5000; i++ {
		op := Op{Kind: KindGet, Key: []byte(fmt.Sprintf("k%d", i))}
		want, got := tb.Check(&op), CheckSlotTable(enc, &op)
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("key %q (slot %d): CheckSlotTable %v, Check %v", op.Key, KeySlot(op.Key), got, want)
		}
	}
	op := Op{Kind: KindGet, Key: keyOfSlot(70)}
	if err := CheckSlotTable(nil, &op); err != nil {
		t.Fatalf("no table: %v, want unfenced", err)
	}
	if err := CheckSlotTable(enc[:len(enc)/2], &Op{Kind: KindGet, Key: keyOfSlot(NumSlots - 1)}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a torn table: %v, want ErrCorrupt", err)
	}
}
