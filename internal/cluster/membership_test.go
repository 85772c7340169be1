package cluster

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

func testConfig() GroupConfig {
	return GroupConfig{Cluster: 7, Membership: Membership{Epoch: 2, Members: []uint64{1, 2, 3}, Start: 40, Previous: []uint64{1, 2, 5}},
		Addrs: []Member{{1, "p1:1", "c1:1"}, {2, "p2:1", "c2:1"}, {3, "p3:1", "c3:1"}, {5, "p5:1", "c5:1"}}, Leader: 1}
}

// KEFIR.GROUP's reply decodes to what the node wrote (the server writes
// it field by field; this is the reply's shape, built by hand).
func TestDecodeGroupConfig(t *testing.T) {
	c := testConfig()
	ints := func(ids []uint64) resp.Value {
		v := resp.Value{Kind: resp.Array}
		for _, id := range ids {
			v.Elems = append(v.Elems, resp.Value{Kind: resp.Int, Int: int64(id)})
		}
		return v
	}
	addrs := resp.Value{Kind: resp.Array}
	for _, m := range c.Addrs {
		addrs.Elems = append(addrs.Elems, resp.Value{Kind: resp.Bulk, Str: []byte(FormatMember(m))})
	}
	v := resp.Value{Kind: resp.Array, Elems: []resp.Value{{Kind: resp.Int, Int: 7}, {Kind: resp.Int, Int: 2}, {Kind: resp.Int, Int: 40},
		ints(c.Members), ints(c.Previous), {Kind: resp.Int, Int: 1}, addrs}}
	got, err := DecodeGroupConfig(v)
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, c)
	}
	if s := got.String(); s != "epoch 2, members 1@p1:1/c1:1,2@p2:1/c2:1,3@p3:1/c3:1" {
		t.Fatalf("String() = %q", s)
	}
	v.Elems[3] = ints(nil)
	if _, err := DecodeGroupConfig(v); err == nil {
		t.Fatal("a configuration without members decoded")
	}
	if _, err := DecodeGroupConfig(resp.Value{Kind: resp.Error, Str: []byte("ERR x")}); err == nil {
		t.Fatal("an error reply decoded")
	}
}

// -EPOCHMOVED reads back as it was written, a refusal naming a change
// ordered and not committed yet (vr.EpochMovedError.Pending) included: its
// text says the group is only moving there, after the part an older client
// parses, which still reads it.
func TestEpochMovedText(t *testing.T) {
	for _, e := range []*EpochMovedError{
		{Group: 3, Expected: 5, Epoch: 6, Members: []uint64{1, 2, 4}},
		{Group: 3, Expected: 5, Epoch: 6, Members: []uint64{1, 2, 4}, Pending: true},
	} {
		got, ok := ParseEpochMoved(e.Error())
		if !ok || !reflect.DeepEqual(got, e) {
			t.Errorf("%q read back as %+v (%v), want %+v", e.Error(), got, ok, e)
		}
		if strings.Contains(e.Error(), "not committed") != e.Pending {
			t.Errorf("%q: pending %v", e.Error(), e.Pending)
		}
	}
}

func TestParseMember(t *testing.T) {
	for in, want := range map[string]Member{"4": {ID: 4}, " 4@h:1/h:2 ": {4, "h:1", "h:2"}} {
		if got, err := ParseMember(in); err != nil || got != want {
			t.Errorf("ParseMember(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "x", "4@h:1", "4@/h:2", "4@h:1/"} {
		if _, err := ParseMember(in); err == nil {
			t.Errorf("ParseMember(%q) accepted", in)
		}
	}
}

// The operator's changes are checked before anything is sent: a member to
// replace that is not one, a new node that already is one or has no
// addresses, removals that leave an even or empty group.
func TestMemberChanges(t *testing.T) {
	c := testConfig()
	got, err := ReplaceMembers(c, 2, Member{4, "p4:1", "c4:1"})
	if err != nil || !reflect.DeepEqual(got, []Member{{ID: 1}, {4, "p4:1", "c4:1"}, {ID: 3}}) {
		t.Fatalf("replace 2 by 4: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		old  uint64
		nw   Member
		want string
	}{
		{9, Member{4, "p", "c"}, "node 9 is not a member"},
		{2, Member{3, "p", "c"}, "node 3 is already a member"},
		{2, Member{ID: 4}, "needs its addresses"},
	} {
		if _, err := ReplaceMembers(c, tc.old, tc.nw); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("replace %d by %+v: %v, want %q", tc.old, tc.nw, err, tc.want)
		}
	}
	got, err = RemoveMembers(c, []uint64{1, 3})
	if err != nil || !reflect.DeepEqual(got, []Member{{ID: 2}}) {
		t.Fatalf("remove 1,3: %+v, %v", got, err)
	}
	for _, ids := range [][]uint64{{1}, {1, 2, 3}, {4}} {
		if _, err := RemoveMembers(c, ids); err == nil {
			t.Errorf("remove %v accepted", ids)
		}
	}
}

// PlanNodeChange and PlanRemoveNodes: replacing or removing nodes of a
// cluster of several groups plans one change per group they are in, and
// refuses, before anything changes, a node not in the map or in no group, a
// new id used at other addresses, below the metadata members, the old one's
// or already in one of the node's groups, and a removal that leaves a group
// even or empty. A rerun after some groups changed plans the rest.
func TestPlanNodeChange(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes: []kv.MapNode{{ID: 1, ClientAddr: "c1", PeerAddr: "p1"}, {ID: 2, ClientAddr: "c2", PeerAddr: "p2"}, {ID: 3, ClientAddr: "c3", PeerAddr: "p3"},
			{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}, {ID: 6, ClientAddr: "c6", PeerAddr: "p6"}, {ID: 7, ClientAddr: "c7", PeerAddr: "p7"},
			{ID: 8, ClientAddr: "c8", PeerAddr: "p8"}},
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{1, 2, 4}, Slots: []kv.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{3, 4, 1, 6, 7}, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}},
		}}
	n5 := Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}
	plan, err := PlanNodeChange(cm, 4, n5)
	if err != nil || len(plan) != 2 || plan[0].Group != 1 || !slices.Equal(plan[0].Members, []uint64{1, 2, 5}) ||
		plan[1].Group != 2 || !slices.Equal(plan[1].Members, []uint64{3, 5, 1, 6, 7}) {
		t.Fatalf("replace 4 by 5: %+v %v", plan, err)
	}
	for name, c := range map[string]struct {
		old  uint64
		nw   Member
		want string
	}{
		"not a node":         {9, n5, "node 9 is not a node"},
		"in no group":        {8, n5, "node 8 is a member of no group"},
		"id used elsewhere":  {4, Member{ID: 2, ClientAddr: "x", PeerAddr: "y"}, "node id 2 is already used"},
		"already a member":   {4, Member{ID: 2, ClientAddr: "c2", PeerAddr: "p2"}, "node 2 is already a member of group 1"},
		"new id is the old":  {4, Member{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}, "the old one's"},
		"below the metadata": {4, Member{ID: 0, ClientAddr: "c0", PeerAddr: "p0"}, "below the metadata group's members"},
	} {
		if _, err := PlanNodeChange(cm, c.old, c.nw); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", name, err, c.want)
		}
	}
	// An existing node of no group may take the place (it starts a replica).
	if plan, err := PlanNodeChange(cm, 4, Member{ID: 8, ClientAddr: "c8", PeerAddr: "p8"}); err != nil || len(plan) != 2 {
		t.Fatalf("replace 4 by node 8 of the map: %+v %v", plan, err)
	}
	for name, c := range map[string]struct {
		ids  []uint64
		want string
	}{
		"one of three":  {[]uint64{4}, "would leave group 1 with 2 members"},
		"one of five":   {[]uint64{6}, "would leave group 2 with 4 members"},
		"not a node":    {[]uint64{9}, "node 9 is not a node"},
		"all of group1": {[]uint64{1, 2, 4}, "would leave group 1 with 0 members"},
	} {
		if _, err := PlanRemoveNodes(cm, c.ids); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("remove %s: %v, want %q", name, err, c.want)
		}
	}
	// A node in no group: nothing to reconfigure (the command then takes
	// it out of the map).
	if plan, err := PlanRemoveNodes(cm, []uint64{8}); err != nil || len(plan) != 0 {
		t.Fatalf("remove node 8, in no group: %+v %v", plan, err)
	}
	if plan, err := PlanRemoveNodes(cm, []uint64{6, 7}); err != nil || len(plan) != 1 || plan[0].Group != 2 || !slices.Equal(plan[0].Members, []uint64{3, 4, 1}) {
		t.Fatalf("remove two of a group of five: %+v %v", plan, err)
	}
	// A member of the metadata group (the three lowest ids) is replaced
	// there too, last; a removal must leave it odd as well.
	if plan, err := PlanNodeChange(cm, 2, n5); err != nil || len(plan) != 2 || plan[0].Group != 1 ||
		plan[1].Group != MetaGroupID || !slices.Equal(plan[1].Members, []uint64{1, 5, 3}) {
		t.Fatalf("replace 2 by 5: %+v %v", plan, err)
	}
	if _, err := PlanRemoveNodes(cm, []uint64{3}); err == nil || !strings.Contains(err.Error(), "would leave group 2 with 4") {
		t.Fatalf("remove 3: %v", err)
	}
	cm.Meta = []uint64{1, 2, 3, 6, 7}
	// A node in no group: nothing to reconfigure (the command then takes
	// it out of the map).
	if plan, err := PlanRemoveNodes(cm, []uint64{8}); err != nil || len(plan) != 0 {
		t.Fatalf("remove node 8, in no group: %+v %v", plan, err)
	}
	if plan, err := PlanRemoveNodes(cm, []uint64{6, 7}); err != nil || len(plan) != 2 || plan[1].Group != MetaGroupID || !slices.Equal(plan[1].Members, []uint64{1, 2, 3}) {
		t.Fatalf("remove two of five metadata members: %+v %v", plan, err)
	}
	cm.Meta = nil
	// A rerun after group 1 changed plans group 2; after both, nothing.
	cm.Nodes = append(cm.Nodes, kv.MapNode{ID: 5, ClientAddr: "c5", PeerAddr: "p5"})
	cm.Groups[0].Members = []uint64{1, 2, 5}
	if plan, err := PlanNodeChange(cm, 4, n5); err != nil || len(plan) != 1 || plan[0].Group != 2 {
		t.Fatalf("rerun after group 1: %+v %v", plan, err)
	}
	cm.Groups[1].Members = []uint64{3, 5, 1, 6, 7}
	if plan, err := PlanNodeChange(cm, 4, n5); err != nil || len(plan) != 0 {
		t.Fatalf("rerun after both: %+v %v", plan, err)
	}
}

// A node's hosted groups change while it runs: a group added (a replica the
// map named this node in) serves its slots from then on, one removed (it
// retired) sends them elsewhere again, the last one is not removed; nodes
// learned from the map name the leader in redirects. Routing reads the set
// concurrently with the changes (go test -race).
func TestMultiAddsAndRemovesGroups(t *testing.T) {
	mu, m, _ := newTestMulti(t, 1)
	k2 := keyIn(m, 2)
	write := func(k string) ([]byte, error) {
		reqs := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("x")}}}
		if _, err := mu.Apply(context.Background(), reqs); err != nil {
			return nil, err
		}
		return reqs[0].Result.Bulk, reqs[0].Err
	}
	if _, err := write(k2); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a key of group 2, not hosted: %v", err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			_, _ = mu.routeSlot(Slot([]byte(k2)))
			_ = mu.Hosted()
			_ = mu.Nodes()
			_, _, _ = mu.Leader(2)
		}
	}()
	spec2, _ := m.Group(2)
	g2 := &fakeReplica{name: "g2"}
	for range 50 {
		if err := mu.AddGroup(LocalGroup{Spec: spec2, Hosted: Hosted{Replica: g2, Group: &stateGroup{}}}); err != nil {
			t.Fatal(err)
		}
		if _, ok := mu.RemoveGroup(2, true); !ok {
			t.Fatal("group 2 not removed")
		}
		mu.SetNodes([]Member{{ID: 4, ClientAddr: "n4:4"}})
	}
	stop.Store(true)
	wg.Wait()
	if err := mu.AddGroup(LocalGroup{Spec: spec2, Hosted: Hosted{Replica: g2, Group: &stateGroup{}}}); err != nil {
		t.Fatal(err)
	}
	if err := mu.AddGroup(LocalGroup{Spec: spec2, Hosted: Hosted{Replica: g2, Group: &stateGroup{}}}); err == nil {
		t.Fatal("group 2 added twice")
	}
	if got, err := write(k2); err != nil || string(got) != "g2" {
		t.Fatalf("a key of group 2 once added: %q %v", got, err)
	}
	if _, ok := mu.RemoveGroup(2, true); !ok {
		t.Fatal("group 2 not removed")
	}
	if _, err := write(k2); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a key of group 2 once removed: %v", err)
	}
	if _, ok := mu.RemoveGroup(1, true); ok {
		t.Fatal("the node's last group was removed (keepLast)")
	}
	if n, ok := mu.Node(4); !ok || n.ClientAddr != "n4:4" || len(mu.Nodes()) != 4 || mu.Nodes()[3].ID != 4 {
		t.Fatalf("nodes learned: %+v", mu.Nodes())
	}
	// Its last group removed (the map removed it), the node is empty:
	// every key goes elsewhere, and it takes a group again.
	if _, ok := mu.RemoveGroup(1, false); !ok {
		t.Fatal("the node's last group was not removed")
	}
	checkEmptyMulti(t, mu, keyIn(m, 1))
	if err := mu.AddGroup(LocalGroup{Spec: spec2, Hosted: Hosted{Replica: g2, Group: &stateGroup{}}}); err != nil {
		t.Fatal(err)
	}
	if got, err := write(k2); err != nil || string(got) != "g2" {
		t.Fatalf("a key of group 2 added to an empty node: %q %v", got, err)
	}
}

// checkEmptyMulti checks that mu, a node that hosts no group, redirects a
// write of key k to the group's leader and reports itself empty without
// failing the checks every request makes.
func checkEmptyMulti(t *testing.T, mu *Multi, k string) {
	t.Helper()
	if len(mu.Hosted()) != 0 {
		t.Fatalf("hosted: %+v", mu.Hosted())
	}
	reqs := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("x")}}}
	if _, err := mu.Apply(context.Background(), reqs); err != nil || !errors.Is(reqs[0].Err, ErrNotLeader) {
		t.Fatalf("a write at an empty node: %v %v, want a redirect", err, reqs[0].Err)
	}
	if st := mu.State(); st.Status != StatusEmpty || st.Self != 1 {
		t.Fatalf("an empty node's state: %+v", st)
	}
	if err := mu.CheckConsistency(level.ConsLinearizable); err != nil {
		t.Fatal(err)
	}
	if err := mu.CheckDurability(level.Sync); err != nil {
		t.Fatal(err)
	}
	_ = mu.Stats()
	_ = mu.ViewEvents()
}

// TestMultiEmpty: a node restarted after its last group was removed opens
// with no group (NewMulti of none) and routes every request elsewhere.
func TestMultiEmpty(t *testing.T) {
	mu, m, _ := newTestMulti(t)
	checkEmptyMulti(t, mu, keyIn(m, 2))
}

// TestPlanNodeChangeOfChainGroups: replace-node and remove-node plan a
// chain group as one wish for its master (Chain: Join, Leave; no
// reconfiguration), a rerun plans what is left (nothing once the map's
// chain has the new node and not the old), removing a chain's last member
// is refused, and ChainChangeDone tells when the map's chain has carried a
// change out. A metadata member not in the chain is planned as in a
// cluster without one.
func TestPlanNodeChangeOfChainGroups(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes: []kv.MapNode{{ID: 1, ClientAddr: "c1", PeerAddr: "p1"}, {ID: 2, ClientAddr: "c2", PeerAddr: "p2"}, {ID: 3, ClientAddr: "c3", PeerAddr: "p3"},
			{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}},
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: 16383}}},
			{ID: 2, Members: []uint64{3, 4}, Engine: kv.EngineChain},
		}}
	n5 := Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}
	chainStep := func(plan []GroupChange, join, leave, members []uint64) bool {
		return len(plan) == 1 && plan[0].Group == 2 && plan[0].Chain && slices.Equal(plan[0].Join, join) &&
			slices.Equal(plan[0].Leave, leave) && slices.Equal(plan[0].Members, members)
	}
	if plan, err := PlanNodeChange(cm, 4, n5); err != nil || !chainStep(plan, []uint64{5}, []uint64{4}, []uint64{3, 5}) {
		t.Fatalf("replace a chain's member: %+v %v", plan, err)
	}
	if plan, err := PlanRemoveNodes(cm, []uint64{4}); err != nil || !chainStep(plan, nil, []uint64{4}, []uint64{3}) {
		t.Fatalf("remove a chain's member: %+v %v", plan, err)
	}
	g := &cm.Groups[1]
	g.Members = []uint64{4}
	if _, err := PlanRemoveNodes(cm, []uint64{4}); err == nil || !strings.Contains(err.Error(), "no member") {
		t.Fatalf("remove a chain's last member: %v", err)
	}
	cm.Nodes = append(cm.Nodes, kv.MapNode{ID: 5, ClientAddr: "c5", PeerAddr: "p5"})
	// Reruns: 5 joined, 4 not gone yet; 4 failed, 5 still joining; done.
	g.Members, g.Joining, g.Leaving = []uint64{3, 5, 4}, nil, []uint64{4}
	if plan, err := PlanNodeChange(cm, 4, n5); err != nil || !chainStep(plan, []uint64{}, []uint64{4}, []uint64{3, 5}) || ChainChangeDone(cm, plan[0]) {
		t.Fatalf("a rerun once 5 joined: %+v %v", plan, err)
	}
	if st := (ClusterStatus{Map: cm}).String(); !strings.Contains(st, "2  members [3 5 4] (a chain, head first) (changing: joining [], leaving [4])  leader") {
		t.Fatalf("kefir cluster status during the change:\n%s", st)
	}
	g.Members, g.Joining = []uint64{3}, []uint64{5}
	if plan, err := PlanNodeChange(cm, 4, n5); err != nil || !chainStep(plan, []uint64{5}, []uint64{4}, []uint64{5, 3}) || ChainChangeDone(cm, plan[0]) {
		t.Fatalf("a rerun while 5 joins, 4 failed: %+v %v", plan, err)
	}
	g.Members, g.Joining = []uint64{3, 5}, nil
	if plan, err := PlanNodeChange(cm, 4, n5); err != nil || len(plan) != 0 {
		t.Fatalf("a rerun once done: %+v %v", plan, err)
	}
	if !ChainChangeDone(cm, GroupChange{Group: 2, Chain: true, Join: []uint64{5}, Leave: []uint64{4}}) {
		t.Fatal("the change done, but ChainChangeDone says not")
	}
	// A node that left the chain cannot come back in another's place: its
	// member there retired, its node would never reopen it (review30b).
	if _, err := PlanNodeChange(cm, 3, Member{ID: 4, ClientAddr: "c4", PeerAddr: "p4"}); err == nil || !strings.Contains(err.Error(), "left chain group 2") {
		t.Fatalf("replace node 3 by node 4, which left the chain: %v", err)
	}
	g.Members, g.Leaving = []uint64{3, 4}, nil
	// A metadata member not in the chain is replaced and removed as in a
	// cluster without one: group 1 and the metadata group.
	if plan, err := PlanRemoveNodes(cm, []uint64{1, 2}); err != nil || len(plan) != 2 || !slices.Equal(plan[0].Members, []uint64{3}) || plan[1].Group != MetaGroupID {
		t.Fatalf("remove metadata members 1 and 2: %+v %v", plan, err)
	}
	if plan, err := PlanNodeChange(cm, 1, Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}); err != nil || len(plan) != 2 ||
		!slices.Equal(plan[0].Members, []uint64{5, 2, 3}) || plan[1].Group != MetaGroupID || !slices.Equal(plan[1].Members, []uint64{5, 2, 3}) {
		t.Fatalf("replace metadata member 1: %+v %v", plan, err)
	}
}

// TestChainChangeDoneWaitsForTheFlush: the map's list has the new node from
// the master's FLUSH on, as the joiner — the map keeps it in Joining until
// the flush is done, since a failure during it aborts the join. With the
// old node out already (it failed before: a SIGKILLed member replaced),
// kefir cluster replace-node must not report the change done then.
func TestChainChangeDoneWaitsForTheFlush(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 3,
		Nodes: []kv.MapNode{{ID: 1, ClientAddr: "c1", PeerAddr: "p1"}, {ID: 2, ClientAddr: "c2", PeerAddr: "p2"},
			{ID: 3, ClientAddr: "c3", PeerAddr: "p3"}, {ID: 4, ClientAddr: "c4", PeerAddr: "p4"}, {ID: 5, ClientAddr: "c5", PeerAddr: "p5"}},
		Groups: []kv.MapGroup{{ID: 2, Members: []uint64{5, 3}, Engine: kv.EngineChain, Joining: []uint64{5}, Leaving: []uint64{4}}}}
	ch := GroupChange{Group: 2, Chain: true, Join: []uint64{5}, Leave: []uint64{4}, Members: []uint64{5, 3}}
	if ChainChangeDone(cm, ch) {
		t.Fatal("done while node 5 flushes (still in the map's Joining)")
	}
	// A rerun plans the same wish (a no-op for the map), and the chain it
	// leads to has node 5 once.
	if plan, err := PlanNodeChange(cm, 4, Member{ID: 5, ClientAddr: "c5", PeerAddr: "p5"}); err != nil || len(plan) != 1 ||
		!slices.Equal(plan[0].Join, ch.Join) || !slices.Equal(plan[0].Leave, ch.Leave) || !slices.Equal(plan[0].Members, ch.Members) {
		t.Fatalf("a rerun while 5 flushes: %+v %v", plan, err)
	}
	cm.Groups[0].Joining = nil
	if !ChainChangeDone(cm, ch) {
		t.Fatal("not done once 5's flush is done")
	}
}

// TestClusterStatusNodeGroups: kefir cluster status names each node's
// groups, and a node of the map in none (its groups removed) as empty.
func TestClusterStatusNodeGroups(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 4, Meta: []uint64{1, 2, 3},
		Nodes:  []kv.MapNode{{ID: 1, ClientAddr: "c1"}, {ID: 2, ClientAddr: "c2"}, {ID: 3, ClientAddr: "c3"}, {ID: 4, ClientAddr: "c4"}, {ID: 5, ClientAddr: "c5"}},
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 4}}, {ID: 2, Members: []uint64{2, 4, 1}}}, Removed: []uint64{3}}
	st := (ClusterStatus{Map: cm}).String()
	for _, want := range []string{
		"  1  client c1  peer   groups [1 2] and the metadata group\n",
		"  3  client c3  peer   no data groups (the metadata group only)\n",
		"  4  client c4  peer   groups [1 2]\n",
		"  5  client c5  peer   no groups (empty: add-group --members or replace-node can place replicas on it)\n",
	} {
		if !strings.Contains(st, want) {
			t.Errorf("status lacks %q:\n%s", want, st)
		}
	}
}
