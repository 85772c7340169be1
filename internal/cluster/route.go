package cluster

import (
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// The routing decision, one copy for a node (Multi) and the move
// simulation's node (internal/vrshard, move_sim_test.go), which runs it over
// simulated replicas: which group serves a slot by what a node knows — the
// slot tables of the groups it hosts, each as its replica here applied it
// (the groups' own knowledge, as far as this node has it), and its cached map
// (the static map, or the metadata group's) — and where a request goes when a
// group's fence refused it (docs/design/cluster.md §1 and §9). Pure: no
// locks, no clock, no I/O; the caller hands it what its replicas applied.

// RoutedGroup is one hosted group as the routing decision sees it.
type RoutedGroup interface {
	// RouteID is the group's id.
	RouteID() GroupID
	// RouteTable is the group's slot table as this node's replica applied
	// it (nil: the group keeps none yet).
	RouteTable() *kv.SlotTable
}

// RouteID is the group's id (RoutedGroup).
func (g *localGroup) RouteID() GroupID { return g.spec.ID }

// RouteTable is table (RoutedGroup).
func (g *localGroup) RouteTable() *kv.SlotTable { return g.table() }

// SlotOwner returns the group that serves slot by a node's best knowledge,
// and whether the slot is in flight: handed over by its source, not yet
// taken by its destination, which is hosted here and still importing (no
// group serves it for the moment). hosted are the node's groups, sm its
// cached map, followed whether that map is the metadata group's (then a map
// at least as new as what the tables know of the slot decides: a map at
// epoch E has every move up to E done, so a hosted replica that lags one of
// them does not send the request to the old owner).
func SlotOwner[G RoutedGroup](slot uint16, hosted []G, sm *SlotMap, followed bool) (GroupID, bool) {
	if mutation.On && MultiMut.StaleMap.Load() {
		// Deliberately broken (tests): the cached map decides, whatever
		// the groups' own tables say.
		return sm.Owner(slot), false
	}
	var best, handed GroupID
	var bestEpoch, handedEpoch uint64
	for _, g := range hosted {
		t := g.RouteTable()
		if t == nil {
			continue
		}
		e := t.Entry(slot)
		switch {
		case e.State.Serves():
			// At one epoch a destination that owns the slot wins over a
			// source whose replica here has not applied its hand-over.
			if best == 0 || e.Epoch > bestEpoch || (e.Epoch == bestEpoch && e.State == kv.SlotOwned) {
				best, bestEpoch = g.RouteID(), e.Epoch
			}
		case e.State == kv.SlotNone && e.Peer != 0:
			if handed == 0 || e.Epoch > handedEpoch {
				handed, handedEpoch = GroupID(e.Peer), e.Epoch
			}
		}
	}
	if best != 0 && (handed == 0 || bestEpoch >= handedEpoch) {
		if !followed || bestEpoch > sm.Epoch {
			return best, false
		}
	} else if handed != 0 && (!followed || handedEpoch > sm.Epoch) {
		return handed, importing(hosted, handed, slot)
	}
	return sm.Owner(slot), false
}

// importing reports whether group id is hosted and its table here has slot
// importing.
func importing[G RoutedGroup](hosted []G, id GroupID, slot uint16) bool {
	for _, g := range hosted {
		if g.RouteID() == id {
			t := g.RouteTable()
			return t != nil && t.Entry(slot).State == kv.SlotImporting
		}
	}
	return false
}

// RefusalTarget is where a request for slot goes after group from's fence
// refused it (se, the refusal): the group SlotOwner names, or, if that is
// from itself (this node's replica of from has not applied what its leader
// has), the peer the refusal names — the group's own -MOVED. inFlight: that
// group is hosted here and still importing the slot. ok is false when the
// refusal names no peer and this node knows no better (TRYAGAIN).
func RefusalTarget[G RoutedGroup](slot uint16, from GroupID, se kv.SlotError, hosted []G, sm *SlotMap, followed bool) (id GroupID, inFlight, ok bool) {
	id, inFlight = SlotOwner(slot, hosted, sm, followed)
	if id != from || inFlight {
		return id, inFlight, true
	}
	if mutation.On && MultiMut.StaleMap.Load() {
		// Deliberately broken (tests): the refusal's peer is ignored and
		// the request goes back where the stale map sends it.
		return from, false, true
	}
	if se.Peer == 0 {
		return from, false, false
	}
	id = GroupID(se.Peer)
	return id, importing(hosted, id, slot), true
}
