package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// Growing a group (kefir cluster add-members): the plan appends the new
// members after the present ones, records the nodes the map does not know,
// and refuses before anything changes what would leave the group even,
// name a member twice, reuse an id, or put a node only in the metadata
// group; a rerun after the map recorded it plans nothing.
func TestPlanAddMembers(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes: []kv.MapNode{{ID: 1, ClientAddr: "c1", PeerAddr: "p1"}, {ID: 2, ClientAddr: "c2", PeerAddr: "p2"}, {ID: 3, ClientAddr: "c3", PeerAddr: "p3"},
			{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}, {ID: 8, ClientAddr: "c8", PeerAddr: "p8"}},
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{2, 1, 3}, Slots: []kv.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{3, 4, 1}, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}},
		}}
	n5 := Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}
	ch, unknown, err := PlanAddMembers(cm, 1, []Member{{ID: 4}, n5})
	if err != nil || ch.Group != 1 || !slices.Equal(ch.Members, []uint64{2, 1, 3, 4, 5}) || len(unknown) != 1 || unknown[0] != n5 {
		t.Fatalf("grow group 1 by 4 and 5: %+v %v %v", ch, unknown, err)
	}
	if !slices.Equal(cm.Groups[0].Members, []uint64{2, 1, 3}) {
		t.Fatalf("the plan changed the map's list: %v", cm.Groups[0].Members)
	}
	// The metadata group grows by nodes of data groups.
	if ch, unknown, err := PlanAddMembers(cm, MetaGroupID, []Member{{ID: 4}, {ID: 8, ClientAddr: "c8", PeerAddr: "p8"}}); err == nil || !strings.Contains(err.Error(), "node 8 is a member of no data group") {
		t.Fatalf("node 8 (no data group) into the metadata group: %+v %v %v", ch, unknown, err)
	}
	cm.Groups[0].Members = []uint64{2, 1, 3, 8, 4}
	if ch, unknown, err := PlanAddMembers(cm, MetaGroupID, []Member{{ID: 4}, {ID: 8}}); err != nil || !slices.Equal(ch.Members, []uint64{1, 2, 3, 4, 8}) || len(unknown) != 0 {
		t.Fatalf("grow the metadata group by 4 and 8: %+v %v %v", ch, unknown, err)
	}
	// A rerun once the map has them: nothing to do.
	if ch, unknown, err := PlanAddMembers(cm, 1, []Member{{ID: 4}, {ID: 8}}); err != nil || len(ch.Members) != 0 || len(unknown) != 0 {
		t.Fatalf("a rerun: %+v %v %v", ch, unknown, err)
	}
	cm.Groups[0].Members = []uint64{2, 1, 3}
	for name, c := range map[string]struct {
		g    GroupID
		news []Member
		want string
	}{
		"even":              {1, []Member{n5}, "would leave group 1 with 4 members"},
		"no group":          {7, []Member{{ID: 4}, n5}, "group 7 is not a group"},
		"already a member":  {1, []Member{{ID: 2}, n5}, "node 2 is already a member of group 1"},
		"twice":             {1, []Member{n5, n5}, "node 5 is named twice"},
		"id used elsewhere": {1, []Member{{ID: 4, ClientAddr: "x", PeerAddr: "y"}, n5}, "node id 4 is already used"},
		"new, no address":   {1, []Member{{ID: 4}, {ID: 9}}, "node 9 is not a node of the cluster map"},
		"below metadata":    {1, []Member{{ID: 4}, {ID: 0, ClientAddr: "c0", PeerAddr: "p0"}}, "below the metadata group's members"},
		"new node, meta":    {MetaGroupID, []Member{{ID: 4}, n5}, "a node starts only as a member of a data group"},
		"nothing":           {1, nil, "no member to add"},
	} {
		if _, _, err := PlanAddMembers(cm, c.g, c.news); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", name, err, c.want)
		}
	}
	// The metadata group grows beside a chain: its members follow the
	// metadata members in the map.
	cm.Groups = append(cm.Groups, kv.MapGroup{ID: 3, Members: []uint64{4, 2}, Engine: kv.EngineChain})
	cm.Groups[0].Members = []uint64{2, 1, 3, 8}
	if ch, _, err := PlanAddMembers(cm, MetaGroupID, []Member{{ID: 4}, {ID: 8}}); err != nil || !slices.Equal(ch.Members, []uint64{1, 2, 3, 4, 8}) {
		t.Fatalf("grow the metadata group beside a chain: %+v %v", ch, err)
	}
}

// AddMembers, a single group's list: the new members after the present
// ones, with their addresses; an even result or a member again refused.
func TestAddMembers(t *testing.T) {
	c := GroupConfig{Membership: Membership{Epoch: 2, Members: []uint64{3, 1, 2}}}
	n4 := Member{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}
	n5 := Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}
	ms, err := AddMembers(c, []Member{n4, n5})
	if err != nil || !slices.Equal(ms, []Member{{ID: 3}, {ID: 1}, {ID: 2}, n4, n5}) {
		t.Fatalf("add 4 and 5: %+v %v", ms, err)
	}
	for name, news := range map[string][]Member{
		"odd becomes even":  {n4},
		"already a member":  {{ID: 1, ClientAddr: "c1", PeerAddr: "p1"}, n5},
		"twice":             {n4, n4},
		"without addresses": {{ID: 4}, n5},
		"none":              nil,
	} {
		if _, err := AddMembers(c, news); err == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
}

// Growing a chain group (kefir cluster add-members --group G on a chain):
// one wish with joiners only, each joined before the tail, of any count (no
// odd rule); the refusals of a VR group's growth, and a node that left the
// chain (its member retired) refused; a rerun while the joins run plans
// the wish as it is, one after they are done plans nothing.
func TestPlanAddMembersToAChain(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes: []kv.MapNode{{ID: 1, ClientAddr: "c1", PeerAddr: "p1"}, {ID: 2, ClientAddr: "c2", PeerAddr: "p2"}, {ID: 3, ClientAddr: "c3", PeerAddr: "p3"},
			{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}},
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{2, 1, 3}, Slots: []kv.SlotRange{{Start: 0, End: 8191}}},
			{ID: 3, Members: []uint64{4, 2}, Engine: kv.EngineChain, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}},
		}}
	n5 := Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}
	// One node: a chain of three (no odd rule), joined before the tail.
	ch, unknown, err := PlanAddMembers(cm, 3, []Member{{ID: 1}})
	if err != nil || !ch.Chain || !slices.Equal(ch.Join, []uint64{1}) || len(ch.Leave) != 0 || !slices.Equal(ch.Members, []uint64{4, 1, 2}) || len(unknown) != 0 {
		t.Fatalf("grow chain 3 by node 1: %+v %v %v", ch, unknown, err)
	}
	// Two, one new to the map (recorded first): a chain of four.
	ch, unknown, err = PlanAddMembers(cm, 3, []Member{{ID: 1}, n5})
	if err != nil || !slices.Equal(ch.Join, []uint64{1, 5}) || !slices.Equal(ch.Members, []uint64{4, 1, 5, 2}) || len(unknown) != 1 || unknown[0] != n5 {
		t.Fatalf("grow chain 3 by 1 and 5: %+v %v %v", ch, unknown, err)
	}
	if ChainChangeDone(cm, ch) {
		t.Fatal("done before the joins")
	}
	for name, c := range map[string]struct {
		news []Member
		want string
	}{
		"already a member":  {[]Member{{ID: 2}, n5}, "node 2 is already a member of group 3"},
		"twice":             {[]Member{n5, n5}, "node 5 is named twice"},
		"id used elsewhere": {[]Member{{ID: 1, ClientAddr: "x", PeerAddr: "y"}}, "node id 1 is already used"},
		"new, no address":   {[]Member{{ID: 9}}, "node 9 is not a node of the cluster map"},
		"nothing":           {nil, "no member to add"},
	} {
		if _, _, err := PlanAddMembers(cm, 3, c.news); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", name, err, c.want)
		}
	}
	// A node the map took out of the chain: its member retired, and its
	// node never opens it again.
	left := *cm
	left.Groups = slices.Clone(cm.Groups)
	left.Groups[1].Leaving = []uint64{1}
	if _, _, err := PlanAddMembers(&left, 3, []Member{{ID: 1}}); err == nil || !strings.Contains(err.Error(), "node 1 left chain group 3") {
		t.Fatalf("a node that left: %v", err)
	}
	// A rerun while node 1 joins (in Joining; in the list from its flush
	// on): the wish as it is, then the wait.
	cm.Groups[1].Joining = []uint64{1}
	for _, ms := range [][]uint64{{4, 2}, {4, 1, 2}} {
		cm.Groups[1].Members = ms
		ch, _, err := PlanAddMembers(cm, 3, []Member{{ID: 1}})
		if err != nil || !slices.Equal(ch.Join, []uint64{1}) || ChainChangeDone(cm, ch) {
			t.Fatalf("a rerun while node 1 joins (members %v): %+v %v", ms, ch, err)
		}
	}
	// Linked in: nothing left.
	cm.Groups[1].Joining = nil
	if ch, _, err := PlanAddMembers(cm, 3, []Member{{ID: 1}}); err != nil || ch.Chain || len(ch.Members) != 0 {
		t.Fatalf("a rerun once node 1 is a member: %+v %v", ch, err)
	}
}
