package main

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// Flags the planner or the mover would take silently wrong are refused as
// usage errors before anything is reached (the address is a closed port:
// a flag that passed would fail on connecting instead, after --timeout).
func TestClusterRebalanceRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--tolerance", "NaN"},
		{"--tolerance", "+Inf"},
		{"--tolerance", "-0.1"},
		{"--max-moves", "-1"},
		{"--max-moves", "65"},
		{"--by", "reads"},
		{"--by", "load", "--sample", "0s"},
		{"--page", "0"},
		{"--page", "300000000000000000"},
		{"--max-pause", "0s"},
		{"extra"},
	} {
		var stderr strings.Builder
		err := runClusterRebalance(append([]string{"--addr", "127.0.0.1:1", "--timeout", "1s"}, args...), io.Discard, &stderr)
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// A rebalance that finds the groups unbalanced and no move that helps did
// nothing: a distinct exit status, not 0 (a dry run only reports).
func TestClusterRebalanceStuckExitStatus(t *testing.T) {
	stuck := cluster.Plan{Balanced: false}
	if err := stuckStatus(stuck, false); err != exitStatus(exitStuck) {
		t.Fatalf("unbalanced, no move: %v, want exit status %d", err, exitStuck)
	}
	if err := stuckStatus(stuck, true); err != nil {
		t.Fatalf("dry run: %v, want nil", err)
	}
	if err := stuckStatus(cluster.Plan{Balanced: true}, false); err != nil {
		t.Fatalf("balanced: %v, want nil", err)
	}
}

// add-group's checks against the map, before anything changes: an even,
// duplicated or unknown member list, a taken or reserved id; the next id
// by default; a rerun finds the group it added (the same members, no
// slots, first epoch) instead of adding another.
func TestPlanAddGroup(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes:  []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}, {ID: 6}},
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: 16383}}}}}
	for _, tc := range []struct {
		members []uint64
		id      uint64
		want    string
	}{
		{[]uint64{4, 5}, 0, "odd number"},
		{[]uint64{4, 5, 5}, 0, "listed twice"},
		{[]uint64{4, 5, 9}, 0, "node 9 is not a node"},
		{[]uint64{4, 5, 6}, 1, "group 1 is in the map already"},
		{[]uint64{4, 5, 6}, kv.MetaGroup, "ids are 1 to"},
	} {
		if _, _, err := planAddGroup(cm, tc.members, tc.id, kv.EngineVR); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v --id %d: %v, want %q", tc.members, tc.id, err, tc.want)
		}
	}
	if id, again, err := planAddGroup(cm, []uint64{4, 5, 6}, 0, kv.EngineVR); err != nil || id != 2 || again {
		t.Fatalf("the next id: %d %v %v", id, again, err)
	}
	cm.Groups = append(cm.Groups, kv.MapGroup{ID: 7, Members: []uint64{4, 5, 6}})
	if id, again, err := planAddGroup(cm, []uint64{4, 5, 6}, 0, kv.EngineVR); err != nil || id != 7 || !again {
		t.Fatalf("a rerun: %d %v %v", id, again, err)
	}
	if id, again, err := planAddGroup(cm, []uint64{6, 5, 4}, 0, kv.EngineVR); err != nil || id != 8 || again {
		t.Fatalf("another leader order is another group: %d %v %v", id, again, err)
	}
}

// A removed group's id is never given to a new group: refused with --id,
// skipped by the default.
func TestPlanAddGroupSkipsRemovedIDs(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 5, Removed: []uint64{2, 9},
		Nodes:  []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}},
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: 16383}}}}}
	if _, _, err := planAddGroup(cm, []uint64{1, 2, 3}, 2, kv.EngineVR); err == nil || !strings.Contains(err.Error(), "group 2 was removed") {
		t.Fatalf("--id 2 (removed): %v", err)
	}
	if id, again, err := planAddGroup(cm, []uint64{1, 2, 3}, 0, kv.EngineVR); err != nil || id != 10 || again {
		t.Fatalf("the next id past the removed ones: %d %v %v", id, again, err)
	}
}

// A placed replace-node's rerun: a group whose own configuration no longer
// has the old node keeps the members it has (it changed before the map
// said so); otherwise the plan's.
func TestPlacedMembers(t *testing.T) {
	if got := placedMembers([]uint64{1, 2, 5}, []uint64{1, 2, 4}, 4); !slices.Equal(got, []uint64{1, 2, 5}) {
		t.Errorf("old still a member: %v, want the plan's", got)
	}
	if got := placedMembers([]uint64{1, 2, 5}, []uint64{1, 2, 3}, 4); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("the group changed already: %v, want its own members", got)
	}
}
