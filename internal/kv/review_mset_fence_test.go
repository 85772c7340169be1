package kv

import "testing"

// REVIEW (finding 6): SlotTable.Check (and MovedRequest) take RoutingKeys'
// keys but ignore its step: an MSET's or MSETNX's values are checked as
// keys. An MSET of keys the group owns is refused because a *value* hashes
// to a slot the group does not serve (and the refusal redirects the client
// to that value's group, which refuses the keys).
func TestReviewFenceChecksMSetKeysNotValues(t *testing.T) {
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
