package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Placement without a new node: each of the failed node's groups takes the
// live node not in it that hosts the fewest replicas (the plan's earlier
// choices counted, ties to the lower id), the metadata group last and only
// a node then in a data group; a chain's change joins the chosen node
// before the tail; a dead node is never chosen.
func TestPlanReplacePlaced(t *testing.T) {
	nodes := func(ids ...uint64) []kv.MapNode {
		var ns []kv.MapNode
		for _, id := range ids {
			ns = append(ns, kv.MapNode{ID: id, ClientAddr: "c", PeerAddr: "p"})
		}
		return ns
	}
	all := func(uint64) bool { return true }
	// Five nodes, three groups of three (kefir up --nodes 5 --groups 3),
	// the metadata group on 1-3. Replicas: 1:2+meta 2:3+meta 3:3+meta 4:2 5:1.
	cm := &kv.ClusterMap{Epoch: 4, Nodes: nodes(1, 2, 3, 4, 5),
		Groups: []kv.MapGroup{
			{ID: 1, Members: []uint64{1, 2, 3}},
			{ID: 2, Members: []uint64{2, 3, 4}},
			{ID: 3, Members: []uint64{3, 4, 5}},
		}}
	plan, err := PlanReplacePlaced(cm, 3, all)
	if err != nil {
		t.Fatal(err)
	}
	// Group 1 [1 2 3]: 4 (2 replicas) and 5 (1): 5. Group 2 [2 3 4]: 1
	// (2 with meta) and 5 (now 2): 1, the lower id. Group 3 [3 4 5]: 1
	// (now 3) and 2 (4): 1. The metadata group [1 2 3]: 4 (2) and 5 (2),
	// both in data groups: 4.
	want := []GroupChange{
		{Group: 1, Members: []uint64{1, 2, 5}},
		{Group: 2, Members: []uint64{2, 1, 4}},
		{Group: 3, Members: []uint64{1, 4, 5}},
		{Group: MetaGroupID, Members: []uint64{1, 2, 4}},
	}
	if !slices.EqualFunc(plan, want, func(a, b GroupChange) bool { return a.Group == b.Group && slices.Equal(a.Members, b.Members) }) {
		t.Fatalf("placing node 3's replicas: %+v, want %+v", plan, want)
	}
	// Node 5 down: never chosen.
	plan, err = PlanReplacePlaced(cm, 3, func(id uint64) bool { return id != 5 })
	if err != nil || !slices.Equal(plan[0].Members, []uint64{1, 2, 4}) || !slices.Equal(plan[1].Members, []uint64{2, 1, 4}) {
		t.Fatalf("node 5 down: %+v %v", plan, err)
	}
	// Only 4 and 5 up: groups 1 and 2 take 5, and group 3 [3 4 5] has
	// nobody left to take.
	if _, err := PlanReplacePlaced(cm, 3, func(id uint64) bool { return id == 4 || id == 5 }); err == nil || !strings.Contains(err.Error(), "no live node of the map can take node 3's place in group 3") {
		t.Fatalf("too few live nodes: %v", err)
	}
	// The metadata group takes only a node of a data group: node 6 hosts
	// nothing, node 4 is in group 1 — 4, though 6 hosts fewer.
	cm2 := &kv.ClusterMap{Epoch: 2, Nodes: nodes(1, 2, 3, 4, 6),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 4}}, {ID: 2, Members: []uint64{2, 3, 4}}}}
	plan, err = PlanReplacePlaced(cm2, 1, all)
	if err != nil || len(plan) != 2 || plan[0].Group != 1 || !slices.Equal(plan[0].Members, []uint64{6, 2, 4}) ||
		plan[1].Group != MetaGroupID || !slices.Equal(plan[1].Members, []uint64{6, 2, 3}) {
		// Group 1 placed 6 first, which makes 6 a data node: the
		// metadata group may then take it (1 replica against 4's 3).
		t.Fatalf("metadata group: %+v %v", plan, err)
	}
	// replace-node --group 65535: the metadata step alone (group 1's step,
	// which made 6 a data node, is not run with it) takes 4, a data node
	// in the map, never 6, which would host the metadata group only.
	plan, err = PlanReplacePlacedStep(cm2, 1, all, MetaGroupID)
	if err != nil || len(plan) != 1 || plan[0].Group != MetaGroupID || !slices.Equal(plan[0].Members, []uint64{4, 2, 3}) {
		t.Fatalf("the metadata step alone: %+v %v", plan, err)
	}
	plan, err = PlanReplacePlacedStep(cm2, 1, all, 1)
	if err != nil || len(plan) != 1 || plan[0].Group != 1 || !slices.Equal(plan[0].Members, []uint64{6, 2, 4}) {
		t.Fatalf("group 1's step alone: %+v %v", plan, err)
	}
	if plan, err = PlanReplacePlacedStep(cm2, 1, all, 7); err != nil || len(plan) != 0 {
		t.Fatalf("a group old is not in: %+v %v", plan, err)
	}
	// A chain group: the chosen node joins before the tail, old leaves;
	// a node leaving the chain is not chosen.
	cm3 := &kv.ClusterMap{Epoch: 2, Nodes: nodes(1, 2, 3, 4, 5),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{2, 4, 3}, Leaving: []uint64{5}, Engine: kv.EngineChain}}}
	plan, err = PlanReplacePlaced(cm3, 4, all)
	if err != nil || len(plan) != 1 || !plan[0].Chain || !slices.Equal(plan[0].Join, []uint64{1}) || !slices.Equal(plan[0].Leave, []uint64{4}) ||
		!slices.Equal(plan[0].Members, []uint64{2, 1, 3}) {
		t.Fatalf("chain: %+v %v", plan, err)
	}
	// A rerun while the chain's master carries out the first run's wish
	// (node 1 still joining, 4 leaving but not yet failed: a join longer
	// than the command's --timeout): the wish as it is, not a second
	// joiner (the map adds a wish's joiners to those under way: the chain
	// would grow by two nodes).
	cm3r := &kv.ClusterMap{Epoch: 3, Nodes: nodes(1, 2, 3, 4, 5),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{2, 4, 3}, Joining: []uint64{1}, Leaving: []uint64{4}, Engine: kv.EngineChain}}}
	plan, err = PlanReplacePlaced(cm3r, 4, all)
	if err != nil || len(plan) != 1 || !plan[0].Chain || !slices.Equal(plan[0].Join, []uint64{1}) || !slices.Equal(plan[0].Leave, []uint64{4}) ||
		!slices.Equal(plan[0].Members, []uint64{2, 1, 3}) {
		t.Fatalf("chain, a rerun mid-join: %+v %v", plan, err)
	}
	// The join done, 4 not yet failed: nothing joins again.
	cm3r.Groups[1].Members, cm3r.Groups[1].Joining = []uint64{2, 4, 1, 3}, nil
	plan, err = PlanReplacePlaced(cm3r, 4, all)
	if err != nil || len(plan) != 1 || len(plan[0].Join) != 0 || !slices.Equal(plan[0].Leave, []uint64{4}) ||
		!slices.Equal(plan[0].Members, []uint64{2, 1, 3}) {
		t.Fatalf("chain, a rerun after the join: %+v %v", plan, err)
	}
	// The metadata group never takes a node in no data group, though it
	// hosts the fewest: node 6 left chain 1 (its member retired), so
	// group 1 cannot take it; the metadata group [1 2 3] takes 4, not 6.
	cm6 := &kv.ClusterMap{Epoch: 2, Nodes: nodes(1, 2, 3, 4, 6),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 4}, Leaving: []uint64{6}, Engine: kv.EngineChain}, {ID: 2, Members: []uint64{2, 3, 4}}}}
	plan, err = PlanReplacePlaced(cm6, 1, all)
	if err != nil || len(plan) != 2 || !slices.Equal(plan[0].Join, []uint64{3}) ||
		plan[1].Group != MetaGroupID || !slices.Equal(plan[1].Members, []uint64{4, 2, 3}) {
		t.Fatalf("metadata group, a node of no data group: %+v %v", plan, err)
	}
	// Not a node: refused; in no group (a rerun once done): nothing to do.
	cm4 := &kv.ClusterMap{Epoch: 1, Nodes: nodes(1, 2, 3, 4, 5), Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}}}
	if _, err := PlanReplacePlaced(cm4, 9, all); err == nil || !strings.Contains(err.Error(), "node 9 is not a node") {
		t.Errorf("not a node: %v", err)
	}
	if plan, err := PlanReplacePlaced(cm4, 5, all); err != nil || len(plan) != 0 {
		t.Errorf("in no group: %+v %v, want nothing to do", plan, err)
	}
	// Only in the metadata group (a map the nodes' ids give it to): refused.
	cm5 := &kv.ClusterMap{Epoch: 1, Nodes: nodes(1, 2, 3, 4), Groups: []kv.MapGroup{{ID: 1, Members: []uint64{2, 3, 4}}}}
	if _, err := PlanReplacePlaced(cm5, 1, all); err == nil || !strings.Contains(err.Error(), "member of no data group") {
		t.Errorf("metadata only: %v", err)
	}
}

// Placement's liveness (Mover.Ping) answers within RetryFor even when the
// node accepts the connection and never answers (a SIGSTOPped process:
// the kernel completes the handshake), not after the round trip's 10 s.
func TestPingAnswersWithinRetryFor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	mv := &Mover{Seeds: []string{ln.Addr().String()}, RetryFor: 300 * time.Millisecond}
	defer mv.Close()
	start := time.Now()
	err = mv.Ping(context.Background())
	if took := time.Since(start); err == nil || took > 3*time.Second {
		t.Fatalf("PING of a node that never answers: %v after %v, want an error within about RetryFor", err, took)
	}
}

// slotsMeet: ranges meet on a shared slot, whatever their order or split;
// adjacent or disjoint ones do not (Mover.claimAbort refuses an abort whose
// ranges meet a recorded move's but are not its ranges).
func TestSlotsMeet(t *testing.T) {
	r := func(a, b uint16) kv.SlotRange { return kv.SlotRange{Start: a, End: b} }
	for _, c := range []struct {
		a, b []kv.SlotRange
		want bool
	}{
		{[]kv.SlotRange{r(0, 99)}, []kv.SlotRange{r(100, 199)}, false},
		{[]kv.SlotRange{r(0, 99)}, []kv.SlotRange{r(99, 99)}, true},
		{[]kv.SlotRange{r(10, 20)}, []kv.SlotRange{r(0, 100)}, true},
		{[]kv.SlotRange{r(0, 5), r(50, 60)}, []kv.SlotRange{r(6, 49), r(61, 16383)}, false},
		{[]kv.SlotRange{r(0, 5), r(50, 60)}, []kv.SlotRange{r(61, 70), r(55, 55)}, true},
		{nil, []kv.SlotRange{r(0, 16383)}, false},
	} {
		if got := slotsMeet(c.a, c.b); got != c.want || slotsMeet(c.b, c.a) != c.want {
			t.Errorf("slotsMeet(%v, %v) = %v, want %v (both ways)", c.a, c.b, got, c.want)
		}
	}
}

// placeNodes is a map's nodes of ids (placement reads their ids only).
func placeNodes(ids ...uint64) []kv.MapNode {
	var ns []kv.MapNode
	for _, id := range ids {
		ns = append(ns, kv.MapNode{ID: id, ClientAddr: "c", PeerAddr: "p"})
	}
	return ns
}

// A new group's replicas (kefir cluster add-group without --members): r
// distinct live nodes, each the one hosting the fewest replicas with the
// earlier choices counted, ties to the lower id, in the order chosen; the
// metadata group's replicas count; a dead node is never chosen; too few
// live nodes is an error that names them.
func TestPlaceGroup(t *testing.T) {
	all := func(uint64) bool { return true }
	// kefir up --nodes 5 --groups 2: groups [1 2 3] and [4 5 1], the
	// metadata group on 1-3. Replicas: 1:3 2:2 3:2 4:1 5:1, 6 (added): 0.
	cm := &kv.ClusterMap{Epoch: 6, Nodes: placeNodes(1, 2, 3, 4, 5, 6),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{4, 5, 1}}}}
	if got, err := PlaceGroup(cm, 3, all); err != nil || !slices.Equal(got, []uint64{6, 4, 5}) {
		t.Fatalf("three replicas: %v %v, want [6 4 5]", got, err)
	}
	// Five: 6, 4, 5 (now 2 each with 2 and 3), then 2 (ties to the lower
	// id), then 3 (2 has 3 now).
	if got, err := PlaceGroup(cm, 5, all); err != nil || !slices.Equal(got, []uint64{6, 4, 5, 2, 3}) {
		t.Fatalf("five replicas: %v %v, want [6 4 5 2 3]", got, err)
	}
	// 6 and 4 dead: 5, then 2 and 3 (2 replicas each), never 4 or 6.
	if got, err := PlaceGroup(cm, 3, func(id uint64) bool { return id != 6 && id != 4 }); err != nil || !slices.Equal(got, []uint64{5, 2, 3}) {
		t.Fatalf("6 and 4 dead: %v %v, want [5 2 3]", got, err)
	}
	// A chain's joiners count as replicas: 6 joining chain 2 hosts one.
	cmc := &kv.ClusterMap{Epoch: 6, Nodes: placeNodes(1, 2, 3, 4, 5, 6),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{4, 5}, Joining: []uint64{6}, Engine: kv.EngineChain}}}
	if got, err := PlaceGroup(cmc, 1, all); err != nil || !slices.Equal(got, []uint64{4}) {
		t.Fatalf("a chain's joiner counted: %v %v, want [4]", got, err)
	}
	// Two live nodes for three replicas: refused, naming them.
	if _, err := PlaceGroup(cm, 3, func(id uint64) bool { return id == 2 || id == 5 }); err == nil || !strings.Contains(err.Error(), "needs 3 distinct live nodes") || !strings.Contains(err.Error(), "[2 5] answer") {
		t.Fatalf("too few live nodes: %v", err)
	}
	if _, err := PlaceGroup(cm, 7, all); err == nil || !strings.Contains(err.Error(), "needs 7 distinct live nodes") {
		t.Fatalf("more replicas than nodes: %v", err)
	}
	if _, err := PlaceGroup(cm, 0, all); err == nil {
		t.Fatal("zero replicas: no error")
	}
}

// Growing a group by placement (kefir cluster add-members --replicas N
// without --new): the nodes not in it, least loaded first; the metadata
// group only nodes of a data group; nothing once it has N members; a dead
// node never; too few nodes an error.
func TestPlaceMembers(t *testing.T) {
	all := func(uint64) bool { return true }
	// Replicas: 1:3 2:2 3:2 4:1 5:1, 6: 0 (in no group).
	cm := &kv.ClusterMap{Epoch: 6, Nodes: placeNodes(1, 2, 3, 4, 5, 6),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{4, 5, 1}}}}
	if got, err := PlaceMembers(cm, 1, 5, all); err != nil || !slices.Equal(got, []uint64{6, 4}) {
		t.Fatalf("group 1 to five: %v %v, want [6 4]", got, err)
	}
	// Group 2 [4 5 1]: 6, then 2 (2 replicas, ties with 3 to the lower id).
	if got, err := PlaceMembers(cm, 2, 5, all); err != nil || !slices.Equal(got, []uint64{6, 2}) {
		t.Fatalf("group 2 to five: %v %v, want [6 2]", got, err)
	}
	// The metadata group [1 2 3]: 4 and 5, never 6 (in no data group).
	if got, err := PlaceMembers(cm, MetaGroupID, 5, all); err != nil || !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("the metadata group to five: %v %v, want [4 5]", got, err)
	}
	// 6 dead: 4, then 5.
	if got, err := PlaceMembers(cm, 1, 5, func(id uint64) bool { return id != 6 }); err != nil || !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("6 dead: %v %v, want [4 5]", got, err)
	}
	// Already five (a rerun once the map has them): nothing.
	cm5 := &kv.ClusterMap{Epoch: 7, Nodes: cm.Nodes, Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3, 6, 4}}, {ID: 2, Members: []uint64{4, 5, 1}}}}
	if got, err := PlaceMembers(cm5, 1, 5, all); err != nil || len(got) != 0 {
		t.Fatalf("a rerun: %v %v, want nothing", got, err)
	}
	// One live node outside group 1 for two new members: refused.
	if _, err := PlaceMembers(cm, 1, 5, func(id uint64) bool { return id != 6 && id != 5 }); err == nil || !strings.Contains(err.Error(), "2 more distinct live nodes not in it") {
		t.Fatalf("too few live nodes: %v", err)
	}
	if _, err := PlaceMembers(cm, 9, 5, all); err == nil || !strings.Contains(err.Error(), "group 9 is not a group") {
		t.Fatalf("no such group: %v", err)
	}
	// A chain [4 5 1] grows by the same rule (any count); the nodes it
	// is joining count as members and come first (a rerun asks for them
	// again), the nodes leaving it do not count.
	cm.Groups[1].Engine = kv.EngineChain
	if got, err := PlaceMembers(cm, 2, 4, all); err != nil || !slices.Equal(got, []uint64{6}) {
		t.Fatalf("chain 2 to four: %v %v, want [6]", got, err)
	}
	cm.Groups[1].Joining = []uint64{6}
	if got, err := PlaceMembers(cm, 2, 4, all); err != nil || !slices.Equal(got, []uint64{6}) {
		t.Fatalf("chain 2 to four, 6 joining: %v %v, want [6] again", got, err)
	}
	if got, err := PlaceMembers(cm, 2, 5, all); err != nil || !slices.Equal(got, []uint64{6, 2}) {
		t.Fatalf("chain 2 to five, 6 joining: %v %v, want [6 2]", got, err)
	}
	cm.Groups[1].Joining, cm.Groups[1].Leaving = nil, []uint64{5}
	if got, err := PlaceMembers(cm, 2, 3, all); err != nil || !slices.Equal(got, []uint64{6}) {
		t.Fatalf("chain 2 to three, 5 leaving: %v %v, want [6]", got, err)
	}
}

// The placement tests catch a placement that forgets the liveness answer
// (a dead node chosen) or the group's members (a node chosen twice for one
// group): placedWrong, the property TestPlaceGroup, TestPlaceMembers and
// TestPlanReplacePlaced assert by their expected lists, fires on each.
func TestPlacementMutations(t *testing.T) {
	mutation.Require(t)
	cm := &kv.ClusterMap{Epoch: 6, Nodes: placeNodes(1, 2, 3, 4, 5, 6),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{4, 5, 1}}}}
	dead := func(id uint64) bool { return id != 6 }
	// placedWrong: a chosen node dead, or in the group already (or chosen
	// twice).
	placedWrong := func(group, chosen []uint64) string {
		for i, id := range chosen {
			if !dead(id) {
				return fmt.Sprintf("chose dead node %d", id)
			}
			if slices.Contains(group, id) || slices.Contains(chosen[:i], id) {
				return fmt.Sprintf("chose node %d, in the group already", id)
			}
		}
		return ""
	}
	check := func() string {
		ms, err := PlaceGroup(cm, 3, dead)
		if err != nil {
			return err.Error()
		}
		if w := placedWrong(nil, ms); w != "" {
			return "PlaceGroup " + w
		}
		// Group 2 [4 5 1]: 4 and 5 host the fewest replicas.
		ms, err = PlaceMembers(cm, 2, 5, dead)
		if err != nil {
			return err.Error()
		}
		if w := placedWrong(cm.Groups[1].Members, ms); w != "" {
			return "PlaceMembers " + w
		}
		plan, err := PlanReplacePlaced(cm, 2, dead)
		if err != nil {
			return err.Error()
		}
		if w := placedWrong([]uint64{1, 3}, []uint64{plan[0].Members[1]}); w != "" {
			return "PlanReplacePlaced " + w
		}
		return ""
	}
	if w := check(); w != "" {
		t.Fatalf("without a mutation: %s", w)
	}
	for name, m := range map[string]*atomic.Bool{"PlaceIgnoresLive": &MultiMut.PlaceIgnoresLive, "PlaceIgnoresMembers": &MultiMut.PlaceIgnoresMembers} {
		m.Store(true)
		w := check()
		m.Store(false)
		if w == "" {
			t.Errorf("%s: not caught", name)
		} else {
			t.Logf("%s caught: %s", name, w)
		}
	}
}

// A placed add-group's rerun takes only a group an earlier run could have
// added: never one owning slots (with --id of a group of kefir up, the
// rerun rule must not answer as if this command had added it), and
// without --id the newest such group, not an older one left without slots
// (remove-group stopped after moving them away).
func TestPlacedEarlier(t *testing.T) {
	all := []kv.SlotRange{{Start: 0, End: 16383}}
	cm := &kv.ClusterMap{Epoch: 9, Nodes: placeNodes(1, 2, 3, 4, 5),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}, Slots: all}, {ID: 2, Members: []uint64{3, 4, 5}}, {ID: 3, Members: []uint64{5, 4, 1}}}}
	if g, ok := PlacedEarlier(cm, 3, 1, kv.EngineVR); ok {
		t.Errorf("--id 1 (a group owning every slot) taken as the earlier run's: %+v", g)
	}
	if g, ok := PlacedEarlier(cm, 3, 0, kv.EngineVR); !ok || g.ID != 3 {
		t.Errorf("without --id: %+v %v, want group 3 (the newest empty one)", g, ok)
	}
	if g, ok := PlacedEarlier(cm, 3, 2, kv.EngineVR); !ok || g.ID != 2 {
		t.Errorf("--id 2: %+v %v, want group 2", g, ok)
	}
}

// A node of the map that hosts nothing and does not answer is, likeliest,
// a new one started with kefir server --join: it listens only once a
// command names it, so placement cannot choose it, and a refusal must say
// so rather than advise starting and adding nodes (which is what was done).
func TestPlacementNamesSilentNodes(t *testing.T) {
	// Nodes 4 and 5 added and waiting to join; 3 down.
	cm := &kv.ClusterMap{Epoch: 5, Nodes: placeNodes(1, 2, 3, 4, 5),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: 16383}}}}}
	up := func(id uint64) bool { return id <= 2 }
	if got := Silent(cm, up); !slices.Equal(got, []uint64{4, 5}) {
		t.Errorf("Silent: %v, want [4 5] (3 hosts replicas)", got)
	}
	const note = "nodes [4 5] host no replica and do not answer (down, or not running"
	if _, err := PlaceGroup(cm, 3, up); err == nil || !strings.Contains(err.Error(), note) || !strings.Contains(err.Error(), "name the nodes with --members") {
		t.Errorf("PlaceGroup: %v", err)
	}
	if _, err := PlaceMembers(cm, 1, 5, up); err == nil || !strings.Contains(err.Error(), note) || !strings.Contains(err.Error(), "with --new") {
		t.Errorf("PlaceMembers: %v", err)
	}
	if _, err := PlaceGroup(cm, 5, func(id uint64) bool { return id != 3 && id != 2 }); err == nil || strings.Contains(err.Error(), "host no replica") {
		t.Errorf("every node hosting nothing answers: %v", err)
	}
}

// What a group is asked for (rebaseChange): the plan's change, made from
// the map's members, applied to the group's own configuration. A rerun
// after the group changed (before the map said so) keeps it; a change of
// another member that landed meanwhile (the repairer's, an operator's) is
// kept, not undone — for a replacement, a removal and an addition alike;
// what the plan can no longer mean is refused (plan again).
func TestRebaseChange(t *testing.T) {
	for _, c := range []struct {
		name              string
		was, planned, cur []uint64
		want              []uint64
		err               string
	}{
		{"replace, the group as the map said", []uint64{1, 2, 4}, []uint64{1, 2, 5}, []uint64{1, 2, 4}, []uint64{1, 2, 5}, ""},
		{"replace, the group changed already", []uint64{1, 2, 4}, []uint64{1, 2, 5}, []uint64{1, 2, 3}, []uint64{1, 2, 3}, ""},
		// Group [1 3 5], planned [1 4 5] (3 -> 4); meanwhile an operator
		// replaced 5 by 9: [1 3 9]. The plan would bring 5 back.
		{"replace, another member replaced meanwhile", []uint64{1, 3, 5}, []uint64{1, 4, 5}, []uint64{1, 3, 9}, []uint64{1, 4, 9}, ""},
		// Planned [1 7 5] (3 -> 7); meanwhile 5 was replaced by 7.
		{"replace, the new node made a member meanwhile", []uint64{1, 3, 5}, []uint64{1, 7, 5}, []uint64{1, 3, 7}, nil, "node 7, which the change adds, became a member"},
		// remove-node 4,5 of [1 2 3 4 5] while the repairer replaced 3 by 6.
		{"remove, another member replaced meanwhile", []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3}, []uint64{1, 2, 6, 4, 5}, []uint64{1, 2, 6}, ""},
		{"remove, done already", []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3}, []uint64{1, 2, 6}, []uint64{1, 2, 6}, ""},
		// ... while the repairer replaced 5 by 9: removing 4 alone leaves four.
		{"remove, one of them replaced meanwhile", []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 9}, nil, "with 4 members [1 2 3 9]"},
		// add-members 4,5 to [1 2 3] while the repairer replaced 3 by 9.
		{"add, another member replaced meanwhile", []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 9}, []uint64{1, 2, 9, 4, 5}, ""},
		{"add, done already", []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5}, ""},
		{"add, one made a member meanwhile", []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 4, 3}, nil, "node 4, which the change adds"},
	} {
		got, err := rebaseChange(c.was, c.planned, c.cur, 0)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v %v, want an error with %q", c.name, got, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v %v, want %v", c.name, got, err, c.want)
		}
	}
	// add-members --replicas 5, two runs at once from the map's [1 2 3]:
	// the second finds the group grown by the first and asks for nothing
	// more (before: both runs' nodes, seven members); a group that lacks
	// members after another change gets only what it lacks.
	for _, c := range []struct {
		name              string
		was, planned, cur []uint64
		want              []uint64
	}{
		{"grow, grown by another run", []uint64{1, 2, 3}, []uint64{1, 2, 3, 6, 7}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5}},
		{"grow, the same nodes", []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5}},
		{"grow to 7, grown to 5 by another run", []uint64{1, 2, 3}, []uint64{1, 2, 3, 6, 7, 8, 9}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5, 6, 7}},
		{"grow to 7, one taken by another run", []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 6, 7, 8}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5, 6, 7}},
		{"grow, a member replaced meanwhile", []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 9}, []uint64{1, 2, 9, 4, 5}},
	} {
		got, err := rebaseChange(c.was, c.planned, c.cur, len(c.planned))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v %v, want %v", c.name, got, err, c.want)
		}
	}
}

// Replacing a node a chain dropped (kefir cluster replace-node --old N
// after the chain's master failed N: the map's Dropped): the chain is
// planned as a replacement of N — a placed node (or --new) joins, N leaves
// — although N is no member any more; a rerun while the join runs (N now
// Leaving, the joiner in Joining) plans the same wish, one after plans
// nothing; a node dropped from chains only is still a node to replace
// (DroppedFrom names the chains), not "in no group".
func TestPlanReplaceDroppedChainMember(t *testing.T) {
	all := func(uint64) bool { return true }
	// Group 1 (VR) [1 2 3]; chain 2 [4 3], node 5 dropped from it.
	cm := &kv.ClusterMap{Epoch: 6, Nodes: placeNodes(1, 2, 3, 4, 5),
		Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{4, 3}, Engine: kv.EngineChain, Dropped: []uint64{5}}}}
	if got := DroppedFrom(cm, 5); !slices.Equal(got, []GroupID{2}) {
		t.Fatalf("DroppedFrom(5): %v, want [2]", got)
	}
	if st := (ClusterStatus{Map: cm}).String(); !strings.Contains(st, "2  members [4 3] (a chain, head first) (dropped by failure: [5]; kefir cluster replace-node --old N re-creates one elsewhere)") {
		t.Fatalf("kefir cluster status names no dropped member:\n%s", st)
	}
	want := GroupChange{Group: 2, Chain: true, Join: []uint64{1}, Leave: []uint64{5}, Members: []uint64{4, 1, 3}}
	same := func(p []GroupChange) bool {
		return len(p) == 1 && p[0].Group == want.Group && p[0].Chain && slices.Equal(p[0].Join, want.Join) &&
			slices.Equal(p[0].Leave, want.Leave) && slices.Equal(p[0].Members, want.Members)
	}
	// Nodes 1 and 2 host two replicas each (group 1, the metadata group):
	// node 1, the lower id.
	if plan, err := PlanReplacePlaced(cm, 5, all); err != nil || !same(plan) {
		t.Fatalf("replace-node --old 5, placed: %+v %v, want %+v", plan, err, want)
	}
	if plan, err := PlanNodeChange(cm, 5, Member{ID: 1, ClientAddr: "c", PeerAddr: "p"}); err != nil || !same(plan) {
		t.Fatalf("replace-node --old 5 --new 1: %+v %v, want %+v", plan, err, want)
	}
	// A new node in the dropped place (--new 6, in no group yet): the
	// chain's place is old's still, so old is a data group's member.
	if plan, err := PlanNodeChange(cm, 5, Member{ID: 6, ClientAddr: "c6", PeerAddr: "p6"}); err != nil || len(plan) != 1 ||
		!slices.Equal(plan[0].Join, []uint64{6}) || !slices.Equal(plan[0].Leave, []uint64{5}) {
		t.Fatalf("replace-node --old 5 --new 6: %+v %v, want chain 2 joining 6 in 5's place", plan, err)
	}
	// The wish recorded (kv: 5 leaves Dropped for Leaving), 1 joining.
	g := &cm.Groups[1]
	g.Dropped, g.Leaving, g.Joining = nil, []uint64{5}, []uint64{1}
	if plan, err := PlanReplacePlaced(cm, 5, all); err != nil || !same(plan) || ChainChangeDone(cm, plan[0]) {
		t.Fatalf("a rerun while 1 joins: %+v %v", plan, err)
	}
	g.Members, g.Joining = []uint64{4, 1, 3}, nil
	if plan, err := PlanReplacePlaced(cm, 5, all); err != nil || len(plan) != 0 {
		t.Fatalf("a rerun once done: %+v %v, want nothing", plan, err)
	}
	if DroppedFrom(cm, 5) != nil {
		t.Fatal("DroppedFrom after the replacement: want none")
	}
}

// zonedNodes is placeNodes with zones: zones[i] is node i+1's ("" none).
func zonedNodes(zones ...string) []kv.MapNode {
	var ns []kv.MapNode
	for i, z := range zones {
		ns = append(ns, kv.MapNode{ID: uint64(i + 1), ClientAddr: "c", PeerAddr: "p", Zone: z})
	}
	return ns
}

// Placement by zones: a node in a zone the group does not have is taken
// over a less loaded node in one it has; when every live node's zone is
// taken the least loaded is taken anyway, and SharedZones names the zone
// the group then has twice; a failed node's places are filled in its own
// zone (the missing one), the metadata group's too. Under the
// PlaceIgnoresZones mutation (placement as before zones) the check fails.
func TestPlaceZones(t *testing.T) {
	all := func(uint64) bool { return true }
	check := func() string {
		// Nodes 1-3 in zone a and idle; 4 in b, idle; 5 in b, 6 and 7 in
		// c, each hosting two replicas (group 1 and the metadata group).
		cm := &kv.ClusterMap{Epoch: 3, Nodes: zonedNodes("a", "a", "a", "b", "b", "c", "c"),
			Groups: []kv.MapGroup{{ID: 1, Members: []uint64{5, 6, 7}}}, Meta: []uint64{5, 6, 7}, MetaEpoch: 1}
		// 1 (a, idle), then 4 (b, idle), then 6 (c, two replicas, the
		// lower id) rather than 2 or 3 (idle, but in a).
		if ms, err := PlaceGroup(cm, 3, all); err != nil || !slices.Equal(ms, []uint64{1, 4, 6}) {
			return fmt.Sprintf("PlaceGroup: %v %v, want [1 4 6]", ms, err)
		}
		// Five replicas on three zones: once every zone is taken, the
		// fallback is a zone with the fewest of the group's replicas,
		// then the least loaded as before zones: 2 (a, idle), then 5 (b,
		// one replica of b's, as c has) rather than 3 (a third in a).
		ms, err := PlaceGroup(cm, 5, all)
		if err != nil || !slices.Equal(ms, []uint64{1, 4, 6, 2, 5}) {
			return fmt.Sprintf("PlaceGroup of 5: %v %v, want [1 4 6 2 5]", ms, err)
		}
		if s := SharedZones(cm, ms); s != "zone a: nodes 1, 2; zone b: nodes 4, 5" {
			return fmt.Sprintf("SharedZones of %v: %q", ms, s)
		}
		// A group that gains a member: group 2 [1 4] (a, b) grows to 3.
		cm2 := &kv.ClusterMap{Epoch: 3, Nodes: cm.Nodes, Groups: append(slices.Clone(cm.Groups), kv.MapGroup{ID: 2, Members: []uint64{1, 4}}),
			Meta: cm.Meta, MetaEpoch: 1}
		if ms, err := PlaceMembers(cm2, 2, 3, all); err != nil || !slices.Equal(ms, []uint64{6}) {
			return fmt.Sprintf("PlaceMembers: %v %v, want [6]", ms, err)
		}
		// Node 3 (zone c) of group 1 [1 2 3] and of the metadata group
		// [1 2 3] fails: node 4 (a) is idle, 5 (b) and 6, 7 (c) host
		// group 2's replicas; group 1 takes 6 (c, the missing zone), the
		// metadata group 7 (c, now the less loaded of the two).
		cm3 := &kv.ClusterMap{Epoch: 5, Nodes: zonedNodes("a", "b", "c", "a", "b", "c", "c"),
			Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 2, 3}}, {ID: 2, Members: []uint64{5, 6, 7}}}}
		plan, err := PlanReplacePlaced(cm3, 3, all)
		want := []GroupChange{{Group: 1, Members: []uint64{1, 2, 6}}, {Group: MetaGroupID, Members: []uint64{1, 2, 7}}}
		if err != nil || !slices.EqualFunc(plan, want, func(a, b GroupChange) bool { return a.Group == b.Group && slices.Equal(a.Members, b.Members) }) {
			return fmt.Sprintf("PlanReplacePlaced: %+v %v, want %+v", plan, err, want)
		}
		// The same with zone c down (6 and 7): the least loaded, 4 (a),
		// which node 1 is in too — said by SharedZones.
		plan, err = PlanReplacePlaced(cm3, 3, func(id uint64) bool { return id != 6 && id != 7 })
		if err != nil || !slices.Equal(plan[0].Members, []uint64{1, 2, 4}) || SharedZones(cm3, plan[0].Members) != "zone a: nodes 1, 4" {
			return fmt.Sprintf("PlanReplacePlaced with zone c down: %+v %v", plan, err)
		}
		return ""
	}
	if w := check(); w != "" {
		t.Fatal(w)
	}
	if !mutation.On {
		return
	}
	MultiMut.PlaceIgnoresZones.Store(true)
	w := check()
	MultiMut.PlaceIgnoresZones.Store(false)
	if w == "" {
		t.Fatal("PlaceIgnoresZones: not caught")
	}
	t.Logf("PlaceIgnoresZones caught: %s", w)
}

// A map whose nodes are each in a zone of their own places exactly as
// the same map without zones — which places as before zones: the other
// placement tests' expectations are the rule before zones, unchanged.
func TestPlaceZonesNoneOrDistinctPlaceAsBefore(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 35))
	for trial := range 300 {
		n := 3 + rng.IntN(6)
		var ids []uint64
		for i := range n {
			ids = append(ids, uint64(i+1))
		}
		cm := &kv.ClusterMap{Epoch: 2, Nodes: placeNodes(ids...)}
		for g := range 1 + rng.IntN(4) {
			perm := rng.Perm(n)[:3]
			cm.Groups = append(cm.Groups, kv.MapGroup{ID: uint64(g + 1), Members: []uint64{uint64(perm[0] + 1), uint64(perm[1] + 1), uint64(perm[2] + 1)}})
		}
		down := uint64(rng.IntN(n + 1)) // 0: all up
		live := func(id uint64) bool { return id != down }
		distinct := *cm
		distinct.Nodes = slices.Clone(cm.Nodes)
		for i := range distinct.Nodes {
			distinct.Nodes[i].Zone = fmt.Sprintf("z%d", i)
		}
		old := cm.Groups[0].Members[0]
		m := &distinct
		a, errA := PlaceGroup(cm, 3, live)
		b, errB := PlaceGroup(m, 3, live)
		if !slices.Equal(a, b) || (errA == nil) != (errB == nil) {
			t.Fatalf("trial %d: PlaceGroup %v %v, without zones %v %v", trial, b, errB, a, errA)
		}
		pa, errA := PlanReplacePlaced(cm, old, live)
		pb, errB := PlanReplacePlaced(m, old, live)
		if fmt.Sprint(pa) != fmt.Sprint(pb) || (errA == nil) != (errB == nil) {
			t.Fatalf("trial %d: PlanReplacePlaced %v %v, without zones %v %v", trial, pb, errB, pa, errA)
		}
		ma, errA := PlaceMembers(cm, 1, 5, live)
		mb, errB := PlaceMembers(m, 1, 5, live)
		if !slices.Equal(ma, mb) || (errA == nil) != (errB == nil) {
			t.Fatalf("trial %d: PlaceMembers %v %v, without zones %v %v", trial, mb, errB, ma, errA)
		}
	}
}

// kefir cluster status shows each node's zone and flags a group whose
// replicas share one (the metadata group's too), and only such a group;
// --json carries the same in shared_zones.
func TestClusterStatusZones(t *testing.T) {
	cm := &kv.ClusterMap{Epoch: 4, Nodes: zonedNodes("a", "a", "b", "c", ""), Groups: []kv.MapGroup{
		{ID: 1, Members: []uint64{1, 3, 4}, Slots: []kv.SlotRange{{Start: 0, End: 99}}},
		{ID: 2, Members: []uint64{2, 1, 5}, Slots: []kv.SlotRange{{Start: 100, End: kv.NumSlots - 1}}},
	}}
	st := (ClusterStatus{Map: cm}).String()
	for _, want := range []string{
		"  1  client c  peer p  zone a  groups [1 2] and the metadata group\n",
		"  5  client c  peer p  groups [2]\n",
		"slots 100-16383 (16284)  REPLICAS SHARE A ZONE (zone a: nodes 2, 1)\n",
		"the metadata group (members [1 2 3]): REPLICAS SHARE A ZONE (zone a: nodes 1, 2)\n",
	} {
		if !strings.Contains(st, want) {
			t.Errorf("status without %q:\n%s", want, st)
		}
	}
	if strings.Count(st, "SHARE A ZONE") != 2 {
		t.Errorf("status flags other groups:\n%s", st)
	}
	if z := GroupsSharingZones(cm); len(z) != 2 || z[2] == "" || z[uint64(MetaGroupID)] == "" {
		t.Errorf("shared_zones %v, want groups 2 and 65535", z)
	}
}
