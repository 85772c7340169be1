package cluster

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
)

// Placement: where a failed node's replicas are re-created when the
// operator names no new node (kefir cluster replace-node --old N alone;
// docs/cluster.md, "Replacing a failed node"). FAWN-KV's manager re-creates
// a failed node's replicas on the nodes it already has (digest 002 §2);
// Kefir does the same with the map's nodes: each of N's groups takes, in
// N's place, a live node of the map that is not in it, the one hosting the
// fewest replicas, so a node's load — and what its own failure would cost
// — stays even.

// PlanReplacePlaced returns, for a cluster of several groups whose map is
// cm, the groups to change to re-create node old's replicas on other nodes
// of the map, in group order (the metadata group last, if old is one of its
// members): each group gets, in old's place, the node that live reports up,
// is not in the group (nor joining or leaving it, for a chain), and hosts
// the fewest replicas of the map's groups, the plan's earlier choices
// counted, ties to the lower id; the metadata group only a node that is
// then a member of a data group (a node hosts the metadata group only with
// one: PlanNodeChange). live is not asked of old. An error names what is
// wrong before anything changes: old not a node of the map, a member of the
// metadata group only, or a group no live node can join (add a node, or
// name it with --new). A rerun plans the groups that still have old: none
// once it is done (an empty plan, no error); a chain the map wants old out
// of already (old in its Leaving: an earlier run's wish under way) keeps
// that wish's joiners rather than choosing another.
func PlanReplacePlaced(cm *kv.ClusterMap, old uint64, live func(id uint64) bool) ([]GroupChange, error) {
	if !slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == old }) {
		return nil, fmt.Errorf("node %d is not a node of the cluster map (epoch %d)", old, cm.Epoch)
	}
	groups := mapGroups(cm)
	load := map[uint64]int{}  // replicas a node hosts (or is joining)
	data := map[uint64]bool{} // nodes in a data group
	for _, g := range groups {
		for _, id := range slices.Concat(g.Members, g.Joining) {
			load[id]++
			if g.ID != uint64(MetaGroupID) {
				data[id] = true
			}
		}
	}
	up := map[uint64]bool{}
	for _, n := range cm.Nodes {
		if n.ID != old && live(n.ID) {
			up[n.ID] = true
		}
	}
	inData := slices.ContainsFunc(cm.Groups, func(g kv.MapGroup) bool { return slices.Contains(g.Members, old) })
	var out []GroupChange
	for _, g := range groups {
		if !slices.Contains(g.Members, old) {
			continue
		}
		if g.IsChain() && slices.Contains(g.Leaving, old) {
			// The map wants old out of the chain already: a rerun while
			// its master carries out the wish an earlier run recorded
			// (a join that outlasts the command's --timeout). Its
			// joiners are the nodes chosen then; choosing again would add
			// a second, as a wish adds its joiners to those under way
			// (kv.chainWant). The wish as it is: a no-op, then a wait.
			ch, _ := planChain(g, g.Joining, []uint64{old})
			out = append(out, ch)
			continue
		}
		meta := g.ID == uint64(MetaGroupID)
		best := uint64(0)
		for _, n := range cm.Nodes {
			id := n.ID
			if !up[id] || slices.Contains(g.Members, id) || slices.Contains(g.Joining, id) || slices.Contains(g.Leaving, id) || (meta && !data[id]) {
				continue
			}
			if best == 0 || load[id] < load[best] || (load[id] == load[best] && id < best) {
				best = id
			}
		}
		if best == 0 {
			return nil, fmt.Errorf("no live node of the map can take node %d's place in group %d (members %v; the map's nodes %v, live %v): start a new node (kefir server --join) and name it with --new", old, g.ID, g.Members, cm.NodeIDs(), slices.Sorted(maps.Keys(up)))
		}
		load[best]++
		if !meta {
			data[best] = true
		}
		if g.IsChain() {
			ch, _ := planChain(g, []uint64{best}, []uint64{old})
			out = append(out, ch)
			continue
		}
		ms := slices.Clone(g.Members)
		ms[slices.Index(ms, old)] = best
		out = append(out, GroupChange{Group: GroupID(g.ID), Members: ms})
	}
	if len(out) == 0 {
		return nil, nil // done (a rerun), or nothing to do: the command says so
	}
	if !inData {
		return nil, fmt.Errorf("node %d is a member of no data group (map epoch %d): only of the metadata group, which a node does not host alone", old, cm.Epoch)
	}
	return out, nil
}
