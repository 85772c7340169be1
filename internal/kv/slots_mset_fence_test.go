package kv

import "testing"

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
