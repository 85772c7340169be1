package check

import (
	"fmt"
	"sort"
)

// Slot ownership across a cluster's maps (issue 28: "no slot owned by two
// groups at one epoch"). A MapObservation is one map as a node reported it
// at some moment (its metadata replica's map, its CLUSTER SLOTS with the
// epoch it was at): which group owns each slot range, at one epoch. The
// cluster promises that a map gives every slot exactly one owner, and that
// two maps at one epoch agree on every slot: an epoch names one map, so a
// change of owner must raise it (the metadata group's MoveDone does).

// OwnedRange is a slot range and the group a map gives it to.
type OwnedRange struct {
	Start, End uint16
	Group      uint64
}

// MapObservation is one map seen by Source.
type MapObservation struct {
	Source string
	Epoch  uint64
	Ranges []OwnedRange
}

// slotCount is Redis Cluster's number of slots.
const slotCount = 16384

// SlotOwners checks observations: every one gives each slot exactly one
// owner, and every two at one epoch give each slot the same owner. It
// returns the violations found (at most one per observation and epoch).
func SlotOwners(obs []MapObservation) []Violation {
	var out []Violation
	type first struct {
		source string
		owner  []uint64
	}
	byEpoch := map[uint64]first{}
	for _, o := range obs {
		owner := make([]uint64, slotCount)
		bad := ""
		for _, r := range o.Ranges {
			for s := int(r.Start); s <= int(r.End) && s < slotCount && bad == ""; s++ {
				if owner[s] != 0 && owner[s] != r.Group {
					bad = fmt.Sprintf("slot %d is owned by group %d and group %d in one map at epoch %d (%s)", s, owner[s], r.Group, o.Epoch, o.Source)
				}
				owner[s] = r.Group
			}
		}
		for s := 0; s < slotCount && bad == ""; s++ {
			if owner[s] == 0 {
				bad = fmt.Sprintf("slot %d has no owner in the map at epoch %d (%s)", s, o.Epoch, o.Source)
			}
		}
		if bad != "" {
			out = append(out, Violation{Key: o.Source, Reason: bad})
			continue
		}
		f, ok := byEpoch[o.Epoch]
		if !ok {
			byEpoch[o.Epoch] = first{o.Source, owner}
			continue
		}
		for s := range owner {
			if owner[s] != f.owner[s] {
				out = append(out, Violation{Key: o.Source, Reason: fmt.Sprintf(
					"slot %d is owned by group %d (%s) and by group %d (%s) at one epoch %d", s, f.owner[s], f.source, owner[s], o.Source, o.Epoch)})
				break
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Reason < out[j].Reason })
	return out
}
