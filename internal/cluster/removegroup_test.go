package cluster

import (
	"errors"
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
