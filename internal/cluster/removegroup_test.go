package cluster

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// remove-group's checks against the map: the metadata group, an unknown
// id and the last data group refused; a removed id answered as such; the
// count of slots the group owns.
func TestCheckRemoveGroup(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 5, Removed: []uint64{4},
		Nodes: []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}},
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: 99}, {Start: 200, End: 16383}}},
			{ID: 2, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 100, End: 199}}}}}
	for id, want := range map[uint64]string{kv.MetaGroup: "is the metadata group", 7: "no group 7 in the cluster map (its data groups: [1 2])"} {
		if _, err := CheckRemoveGroup(cm, id); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--id %d: %v, want %q", id, err, want)
		}
	}
	if _, err := CheckRemoveGroup(cm, 4); !errors.Is(err, ErrRemovedAlready) {
		t.Errorf("--id 4 (removed): %v", err)
	}
	if n, err := CheckRemoveGroup(cm, 2); err != nil || n != 100 {
		t.Errorf("--id 2: %d %v", n, err)
	}
	cm.Groups = cm.Groups[:1]
	if _, err := CheckRemoveGroup(cm, 1); err == nil || !strings.Contains(err.Error(), "last data group") {
		t.Errorf("the last group: %v", err)
	}
}

// TestEmptiedBy: the members of a removed group that are in no other data
// group (a chain's joiner counts as in it): kefir up --nodes 5 --groups 3's
// group 3 leaves node 5 empty.
func TestEmptiedBy(t *testing.T) {
	cm := &kv.ClusterMap{Groups: []kv.MapGroup{
		{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{2, 3, 4}}, {ID: 3, Members: []uint64{3, 4, 5}}}}
	if got := EmptiedBy(cm, 3); !slices.Equal(got, []uint64{5}) {
		t.Errorf("group 3: %v, want [5]", got)
	}
	if got := EmptiedBy(cm, 1); !slices.Equal(got, []uint64{1}) {
		t.Errorf("group 1: %v, want [1]", got)
	}
	cm.Groups = append(cm.Groups, kv.MapGroup{ID: 4, Members: []uint64{2}, Joining: []uint64{5}, Engine: kv.EngineChain})
	if got := EmptiedBy(cm, 3); len(got) != 0 {
		t.Errorf("group 3, node 5 joining chain 4: %v, want none", got)
	}
	if got := EmptiedBy(cm, 9); got != nil {
		t.Errorf("no group 9: %v", got)
	}
}
