package check

import (
	"strings"
	"testing"
)

// twoGroupMap is a map of two groups split at cut, at epoch.
func twoGroupMap(src string, epoch uint64, cut uint16) MapObservation {
	return MapObservation{Source: src, Epoch: epoch, Ranges: []OwnedRange{{0, cut - 1, 1}, {cut, slotCount - 1, 2}}}
}

// A move done right (the owner changes with the epoch) passes; a broken
// step is caught: a move whose map change keeps the epoch (two maps at one
// epoch disagree), one that gives the slots to the destination without
// taking them from the source (two owners in one map), one that drops them.
func TestSlotOwners(t *testing.T) {
	good := []MapObservation{twoGroupMap("n1", 1, 8192), twoGroupMap("n2", 1, 8192), twoGroupMap("n1", 2, 4096), twoGroupMap("n3", 2, 4096)}
	if v := SlotOwners(good); len(v) != 0 {
		t.Fatalf("a correct move: %v", v)
	}
	for _, c := range []struct {
		name string
		obs  MapObservation
		want string
	}{
		{"moved without raising the epoch", twoGroupMap("n2", 1, 4096), "at one epoch 1"},
		{"destination added, source kept", MapObservation{"n2", 2, []OwnedRange{{0, 8191, 1}, {4096, slotCount - 1, 2}}}, "in one map"},
		{"slots dropped", MapObservation{"n2", 2, []OwnedRange{{0, 4000, 1}, {4096, slotCount - 1, 2}}}, "has no owner"},
	} {
		v := SlotOwners(append(good[:len(good):len(good)], c.obs))
		if len(v) != 1 || !strings.Contains(v[0].Reason, c.want) {
			t.Fatalf("%s: %v, want one violation %q", c.name, v, c.want)
		}
	}
}
