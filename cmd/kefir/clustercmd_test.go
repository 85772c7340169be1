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

// A placed add-group (no --members): the map's least loaded live nodes,
// the next id; a rerun after the group is in the map takes it again
// rather than placing a second group (no member list to compare with: a
// group of --replicas members, never reconfigured, with no slots — or the
// --id one), and pings nobody; an even VR count and too few live nodes are
// refused.
func TestPlanAddGroupPlaced(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes:  []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}},
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: 16383}}}}}
	asked := 0
	all := func() func(uint64) bool { asked++; return func(uint64) bool { return true } }
	// Loads (the metadata group on 1-3): 1:2 2:2 3:2 4:0 5:0.
	id, ms, again, err := planAddGroupPlaced(cm, 3, 0, kv.EngineVR, all)
	if err != nil || id != 2 || again || !slices.Equal(ms, []uint64{4, 5, 1}) || asked != 1 {
		t.Fatalf("placed: group %d %v again %v: %v (live asked %d times)", id, ms, again, err, asked)
	}
	// The map has it (the first run's ADDGROUP went through): a rerun
	// finds it, whatever the nodes' load now says, and asks no liveness.
	cm.Groups = append(cm.Groups, kv.MapGroup{ID: 2, Members: ms})
	if id, ms2, again, err := planAddGroupPlaced(cm, 3, 0, kv.EngineVR, all); err != nil || id != 2 || !again || !slices.Equal(ms2, ms) || asked != 1 {
		t.Fatalf("a rerun: group %d %v again %v: %v (live asked %d times)", id, ms2, again, err, asked)
	}
	if id, _, again, err := planAddGroupPlaced(cm, 3, 2, kv.EngineVR, all); err != nil || id != 2 || !again {
		t.Fatalf("a rerun with --id 2: group %d again %v: %v", id, again, err)
	}
	// Not the earlier run's: another engine, another size, a group with
	// slots or reconfigured since — a new group is placed.
	if id, _, again, err := planAddGroupPlaced(cm, 3, 0, kv.EngineChain, all); err != nil || id != 3 || again {
		t.Fatalf("a chain beside the VR group: group %d again %v: %v", id, again, err)
	}
	cm.Groups[1].Slots = []kv.SlotRange{{Start: 0, End: 99}}
	// Loads now 1:3 2:2 3:2 4:1 5:1: 4, 5, then 2 (ties to the lower id).
	if id, ms, again, err := planAddGroupPlaced(cm, 3, 0, kv.EngineVR, all); err != nil || id != 3 || again || !slices.Equal(ms, []uint64{4, 5, 2}) {
		t.Fatalf("a group with slots is not the rerun's: group %d %v again %v: %v", id, ms, again, err)
	}
	cm.Groups[1].MemberEpoch = 1
	if _, _, _, err := planAddGroupPlaced(cm, 3, 2, kv.EngineVR, all); err == nil || !strings.Contains(err.Error(), "group 2 is in the map already") {
		t.Fatalf("--id 2 of a group reconfigured since: %v", err)
	}
	if _, _, _, err := planAddGroupPlaced(cm, 4, 0, kv.EngineVR, all); err == nil || !strings.Contains(err.Error(), "odd number") {
		t.Fatalf("four VR replicas: %v", err)
	}
	two := func() func(uint64) bool { return func(id uint64) bool { return id <= 2 } }
	if _, _, _, err := planAddGroupPlaced(cm, 3, 0, kv.EngineVR, two); err == nil || !strings.Contains(err.Error(), "needs 3 distinct live nodes") {
		t.Fatalf("two live nodes: %v", err)
	}
}

// A placed add-members' rerun after the group grew but before the map said
// so asks for the members the group has (the earlier run's choice), not a
// new placement; otherwise nothing (the command places).
func TestGrownAlready(t *testing.T) {
	if got := grownAlready([]uint64{5, 2, 3}, []uint64{5, 2, 3, 4, 1}, 5); !slices.Equal(got, []uint64{4, 1}) {
		t.Errorf("grown to five before the map said so: %v, want [4 1]", got)
	}
	for _, c := range []struct {
		cur []uint64
		r   int
	}{
		{[]uint64{5, 2, 3}, 5},       // not grown yet
		{[]uint64{5, 2, 4, 1, 6}, 5}, // not the map's members (another change)
		{[]uint64{5, 2, 3, 4, 1}, 7}, // not the size asked for
	} {
		if got := grownAlready([]uint64{5, 2, 3}, c.cur, c.r); got != nil {
			t.Errorf("cur %v, --replicas %d: %v, want nothing (place)", c.cur, c.r, got)
		}
	}
}

// --replicas is add-members' (and add-group's) alone: replace-node and
// remove-node refuse it rather than run without it (the address is a
// closed port: a flag that passed would fail on connecting instead).
func TestClusterMembersRefuseReplicasElsewhere(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		args []string
	}{
		{"replace-node", []string{"--old", "4", "--replicas", "5"}},
		{"remove-node", []string{"--id", "4", "--replicas", "3"}},
		{"add-members", []string{"--group", "3", "--replicas", "-1"}},
	} {
		err := runClusterMembers(c.cmd, append([]string{"--addr", "127.0.0.1:1", "--timeout", "1s"}, c.args...), io.Discard, io.Discard)
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%s %v: %v, want a usage error", c.cmd, c.args, err)
		}
	}
}

// add-members --replicas --json on a group that has its members already
// prints JSON, as the command does when nothing changes with --new: a
// script reading the output must not meet a sentence.
func TestPlaceMembersNothingLeftJSON(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3, Nodes: []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}},
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}}}
	var out strings.Builder
	news, err := placeMembers(t.Context(), nil, cm, 1, 3, true, &out, io.Discard)
	if err != nil || news != nil || strings.TrimSpace(out.String()) != "null" {
		t.Fatalf("--json, nothing left: %v %v %q, want null", news, err, out.String())
	}
}

// remove-node --id N --group G takes N out of G; a node that still hosts
// another group (or the metadata group) stays in the map, and the command
// says which groups keep it rather than asking the map to remove it (which
// refuses) and telling the operator to run it again later.
func TestStillHosts(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 9, Nodes: []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}, {ID: 6}, {ID: 7}},
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{1, 2, 3}},
			{ID: 2, Members: []uint64{4, 5, 6}},
			{ID: 3, Members: []uint64{4, 2, 6}, Joining: []uint64{5}},
			{ID: 4, Engine: kv.EngineChain, Members: []uint64{9, 10, 11}, Leaving: []uint64{7}},
		}}
	for id, want := range map[uint64]string{
		1: "group 1 and the metadata group",
		4: "groups 2, 3",
		5: "groups 2, 3", // joining group 3
		6: "groups 2, 3",
		// Out of chain group 4, which lists it as leaving (its master
		// refuses it should it come back): hosts nothing — remove-node
		// without --group must not tell the operator to run itself.
		7: "",
		9: "group 4",
	} {
		if got := stillHosts(cm, id); got != want {
			t.Errorf("node %d: %q, want %q", id, got, want)
		}
	}
	if got := stillHosts(nil, 4); got != "" {
		t.Errorf("no map: %q", got)
	}
}
