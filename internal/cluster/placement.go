package cluster

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Placement: where a failed node's replicas are re-created when the
// operator names no new node (kefir cluster replace-node --old N alone;
// docs/cluster.md, "Replacing a failed node"). FAWN-KV's manager re-creates
// a failed node's replicas on the nodes it already has (digest 002 §2);
// Kefir does the same with the map's nodes: each of N's groups takes, in
// N's place, a live node of the map that is not in it, the one hosting the
// fewest replicas, so a node's load — and what its own failure would cost
// — stays even. A new group's replicas (PlaceGroup) and a group's new
// members (PlaceMembers) are placed by the same rule (placer). Live means
// answering now: a node that waits to join (kefir server --join) does not
// listen yet, so placement never chooses one (Silent names them).
//
// Failure domains first: a node may have a zone (kv.MapNode.Zone: a rack,
// an availability zone), and a group whose replicas share one loses them
// together. So placement takes, before any load, a node whose zone no
// other member of the group has (the place's old node does not count: its
// zone is the one to fill again); only when every live candidate's zone is
// taken does it fall back to one in a zone with the fewest of the group's
// replicas (five replicas over three zones: 2, 2, 1, never 3 in one, a
// majority lost with that zone), the least loaded of those — a group in
// fewer zones than its replicas is allowed (better than no replica), and
// made visible (SharedZones: the commands and the repairer say so, kefir
// cluster status flags the group). A node without a zone is a zone of its
// own, unknown: it never shares one, so a map without zones places exactly
// as before zones.

// PlanReplacePlaced returns, for a cluster of several groups whose map is
// cm, the groups to change to re-create node old's replicas on other nodes
// of the map, in group order (the metadata group last, if old is one of its
// members) — a chain group also when its master dropped old by failure
// already (hasPlaceOf: the map's Dropped): each group gets, in old's place, the node that live reports up,
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
	return PlanReplacePlacedStep(cm, old, live, 0)
}

// PlanReplacePlacedStep is PlanReplacePlaced of group only's step alone
// (kefir cluster replace-node --group G; 0: every step): chosen as if the
// other steps were not planned, since they are not run with it. The
// metadata group's step of the whole plan may take a node that only an
// earlier data step made a data node (a node of no group, the least
// loaded); run alone, that step would give the metadata group a node that
// hosts no data group. Alone, it takes a node that is a data node in cm.
// A plan without only's group is empty.
func PlanReplacePlacedStep(cm *kv.ClusterMap, old uint64, live func(id uint64) bool, only GroupID) ([]GroupChange, error) {
	if !slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == old }) {
		return nil, fmt.Errorf("node %d is not a node of the cluster map (epoch %d)", old, cm.Epoch)
	}
	p := newPlacer(cm, func(id uint64) bool { return id != old && live(id) })
	p.old = old
	inData := slices.ContainsFunc(cm.Groups, func(g kv.MapGroup) bool { return hasPlaceOf(g, old) })
	var out []GroupChange
	for _, g := range mapGroups(cm) {
		if !hasPlaceOf(g, old) || (only != 0 && GroupID(g.ID) != only) {
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
		best := p.choose(g, nil)
		if best == 0 {
			return nil, fmt.Errorf("no live node of the map can take node %d's place in group %d (members %v; the map's nodes %v, live %v): start a new node (kefir server --join) and name it with --new", old, g.ID, g.Members, cm.NodeIDs(), p.live())
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

// hasPlaceOf reports whether group g has a place of node old to re-create
// elsewhere (replace-node --old old): old is a member; or g is a chain
// whose master dropped old by failure (the map's Dropped: the chain runs
// one shorter, and the place is still old's), that the map wants old to
// join (Joining: a replacement or a growth whose new node died before it
// was linked in — the chain is kept one longer for it, and a replace's
// leaving member waits for it, for ever), or that is re-creating it
// already (old leaving, a node joining: an earlier run's wish under way).
func hasPlaceOf(g kv.MapGroup, old uint64) bool {
	return slices.Contains(g.Members, old) ||
		g.IsChain() && (slices.Contains(g.Dropped, old) || slices.Contains(g.Joining, old) || slices.Contains(g.Leaving, old) && len(g.Joining) > 0)
}

// DroppedFrom returns the chain groups of cm whose master dropped node id
// by failure (kv.MapGroup's Dropped), in map order: the groups
// PlanReplacePlaced re-creates a member of for id although id is no member
// of them any more. The metadata leader's repairer, which replaces a node
// dead for long, calls it to learn that a dead node has chain places left
// to re-create — the chains drop a failed member within --fail-after, long
// before — and PlanReplacePlaced for the steps.
func DroppedFrom(cm *kv.ClusterMap, id uint64) []GroupID {
	var out []GroupID
	for _, g := range cm.Groups {
		if g.IsChain() && slices.Contains(g.Dropped, id) {
			out = append(out, GroupID(g.ID))
		}
	}
	return out
}

// PlaceGroup returns the members of a new data group of r replicas
// (kefir cluster add-group without --members) on r distinct nodes of cm
// that live reports up, chosen one after the other by placement's rule
// (the fewest replicas hosted, each choice counted, ties to the lower id),
// in that order: the first leads the group's first view (a chain's head).
// An error, before anything changes, when fewer than r nodes are up.
func PlaceGroup(cm *kv.ClusterMap, r int, live func(id uint64) bool) ([]uint64, error) {
	if r < 1 {
		return nil, fmt.Errorf("%d replicas: a group needs at least one", r)
	}
	p := newPlacer(cm, live)
	g := kv.MapGroup{} // the new group: no member yet
	for len(g.Members) < r {
		id := p.choose(g, nil)
		if id == 0 {
			return nil, fmt.Errorf("a group of %d replicas needs %d distinct live nodes; the map's nodes are %v, and %v answer (map epoch %d)%s: name the nodes with --members, or ask for fewer replicas", r, r, cm.NodeIDs(), p.live(), cm.Epoch, waitingNote(cm, live))
		}
		g.Members = append(g.Members, id)
	}
	return g.Members, nil
}

// PlacedEarlier returns the group of cm that an earlier run of a placed
// add-group of r replicas of engine (and id, 0: the next) added, if cm has
// one. A rerun must not place the group a second time, and it has no
// member list to compare with, so a group that could be the earlier run's
// is taken as it: one in the map, never reconfigured, of r members and the
// engine, owning no slots (the state add-group leaves a group in: a group
// with slots is an older one, which --id must not pass for the earlier
// run's) — with id, that group; without, the last such (the highest id:
// the earlier run's id was above every group of its map, so a lower match
// is an older group, such as one whose slots remove-group moved away
// before it stopped).
// Adding a second placed group before the first has slots therefore needs
// an id.
func PlacedEarlier(cm *kv.ClusterMap, r int, id uint64, engine string) (kv.MapGroup, bool) {
	for _, g := range slices.Backward(cm.Groups) {
		if (id == 0 || g.ID == id) && g.MemberEpoch == 0 && len(g.Members) == r && g.Engine == engine && len(g.Slots) == 0 {
			return g, true
		}
	}
	return kv.MapGroup{}, false
}

// PlaceMembers returns the nodes that grow group g of cm to r members
// (kefir cluster add-members --replicas r without --new), chosen by
// placement's rule among the nodes live reports up and not in g — for the
// metadata group, only nodes in a data group — in the order chosen; none
// if g has r members or more already (a rerun once the map recorded the
// growth). A chain counts the nodes the map wants to join it as members
// (and not those it wants out): the ones still joining come first in the
// result — an earlier run's choice, asked for again (the wish is then a
// no-op and the command waits for it) rather than placed a second time.
// An error, before anything changes, when g is not a group of the map or
// too few nodes are up. PlanAddMembers checks the rest (an even count).
func PlaceMembers(cm *kv.ClusterMap, g GroupID, r int, live func(id uint64) bool) ([]uint64, error) {
	groups := mapGroups(cm)
	i := slices.IndexFunc(groups, func(mg kv.MapGroup) bool { return mg.ID == uint64(g) })
	if i < 0 {
		return nil, fmt.Errorf("group %d is not a group of the cluster map (epoch %d)", g, cm.Epoch)
	}
	grp := groups[i]
	have := len(grp.Members)
	var out []uint64
	if grp.IsChain() {
		have = len(ChainWanted(grp))
		out = slices.DeleteFunc(slices.Clone(grp.Joining), func(id uint64) bool { return slices.Contains(grp.Leaving, id) })
		have -= len(out) // counted in out
	}
	p := newPlacer(cm, live)
	for have+len(out) < r {
		id := p.choose(grp, out)
		if id == 0 {
			return nil, fmt.Errorf("group %d (members %v) grows to %d members on %d more distinct live nodes not in it; the map's nodes are %v, and %v answer (map epoch %d)%s: name the new members with --new", g, grp.Members, r, r-have, cm.NodeIDs(), p.live(), cm.Epoch, waitingNote(cm, live))
		}
		out = append(out, id)
	}
	return out, nil
}

// ChainWanted is the members chain g is to have once the map's wish is
// carried out: its members and the nodes joining it, but not the nodes
// leaving it.
func ChainWanted(g kv.MapGroup) []uint64 {
	ids := slices.Clone(g.Members)
	for _, id := range g.Joining {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return slices.DeleteFunc(ids, func(id uint64) bool { return slices.Contains(g.Leaving, id) })
}

// placer is placement's rule over a map: the one copy PlanReplacePlaced,
// PlaceGroup and PlaceMembers choose by.
type placer struct {
	nodes []uint64          // the map's nodes, in its order
	zone  map[uint64]string // the nodes' zones ("": none)
	// old is the node whose places are re-created (PlanReplacePlaced): a
	// member still, but its zone is the one to fill, not one taken.
	old  uint64
	load map[uint64]int  // replicas a node hosts (or is joining), choices counted
	data map[uint64]bool // nodes in a data group, choices counted
	up   map[uint64]bool // nodes live reports up
}

// newPlacer counts every group's members and a chain's joiners (the
// metadata group's members too: its replicas are a node's load as much)
// and asks live of each node of cm once.
func newPlacer(cm *kv.ClusterMap, live func(id uint64) bool) *placer {
	p := &placer{load: map[uint64]int{}, data: map[uint64]bool{}, up: map[uint64]bool{}, zone: map[uint64]string{}}
	for _, g := range mapGroups(cm) {
		for _, id := range slices.Concat(g.Members, g.Joining) {
			p.load[id]++
			if g.ID != uint64(MetaGroupID) {
				p.data[id] = true
			}
		}
	}
	for _, n := range cm.Nodes {
		p.nodes = append(p.nodes, n.ID)
		p.zone[n.ID] = n.Zone
		if live(n.ID) || (mutation.On && MultiMut.PlaceIgnoresLive.Load()) {
			p.up[n.ID] = true
		}
	}
	return p
}

// choose returns the node to add to group g (beside also, nodes chosen
// for it already): up, not in g (nor joining or leaving it, for a chain)
// nor in also, for the metadata group only a node in a data group (a node
// hosts the metadata group only with one: PlanNodeChange); of those, one
// in a zone no member of g (as the map wants it: ChainWanted, but p.old)
// nor of also is in, if there is one, else one in a zone with the fewest
// of them; then the one hosting the fewest replicas, ties to the lower id;
// 0 if none is. The choice is counted: the next one sees it.
func (p *placer) choose(g kv.MapGroup, also []uint64) uint64 {
	meta := g.ID == uint64(MetaGroupID)
	in := func(id uint64) bool {
		if mutation.On && MultiMut.PlaceIgnoresMembers.Load() {
			return false
		}
		return slices.Contains(g.Members, id) || slices.Contains(g.Joining, id) || slices.Contains(g.Leaving, id) || slices.Contains(also, id)
	}
	// The group's replicas in each zone, each node once (a chain's
	// joiners are in ChainWanted and in a growth's also).
	taken, seen := map[string]int{}, map[uint64]bool{}
	for _, id := range slices.Concat(ChainWanted(g), also) {
		if z := p.zone[id]; z != "" && id != p.old && !seen[id] {
			taken[z]++
			seen[id] = true
		}
	}
	// shares: how many of the group's replicas a candidate's zone has
	// already; "" is no zone, never taken, so without zones every
	// candidate is as good as before. Fewest first, not just none first:
	// once every zone has one (five replicas, three zones) the next goes
	// to a zone with the fewest, so that no zone gets a majority while
	// another could take the replica — a VR group of five with three in
	// one zone loses its quorum with that zone.
	shares := func(id uint64) int {
		if mutation.On && MultiMut.PlaceIgnoresZones.Load() {
			return 0
		}
		return taken[p.zone[id]]
	}
	best := uint64(0)
	for _, id := range p.nodes {
		if !p.up[id] || in(id) || (meta && !p.data[id]) {
			continue
		}
		if best == 0 || shares(id) < shares(best) ||
			shares(best) == shares(id) && (p.load[id] < p.load[best] || (p.load[id] == p.load[best] && id < best)) {
			best = id
		}
	}
	if best != 0 {
		p.load[best]++
		if !meta {
			p.data[best] = true
		}
	}
	return best
}

// live is the nodes up, in id order (for an error).
func (p *placer) live() []uint64 { return slices.Sorted(maps.Keys(p.up)) }

// Silent returns the nodes of cm that host no replica (of any group, nor
// join one) and that live does not report up, in id order. Placement
// never chooses them: they are down, or left the cluster as a whole
// (exited), or run a build from before session 32, whose joining node
// listened only once a command named it in a group (a node joining now
// serves once the map has it).
func Silent(cm *kv.ClusterMap, live func(id uint64) bool) []uint64 {
	hosts := map[uint64]bool{}
	for _, g := range mapGroups(cm) {
		for _, id := range slices.Concat(g.Members, g.Joining) {
			hosts[id] = true
		}
	}
	var out []uint64
	for _, id := range cm.NodeIDs() {
		if !hosts[id] && !live(id) {
			out = append(out, id)
		}
	}
	return out
}

// waitingNote is, for a placement's error, what Silent says of cm's nodes.
func waitingNote(cm *kv.ClusterMap, live func(id uint64) bool) string {
	ids := Silent(cm, live)
	if len(ids) == 0 {
		return ""
	}
	return fmt.Sprintf("; nodes %v host no replica and do not answer (down, or not running: placement never chooses them)", ids)
}

// SharedZones says which zones more than one of members (nodes of cm) are
// in, as "zone a: nodes 1, 4; zone b: ...", in zone order; "" if none is
// (nodes without a zone never share one). A group in fewer zones than its
// replicas loses several at once with one zone: placement avoids it when
// it can and, when it cannot (placer.choose's fallback), the commands, the
// repairer and kefir cluster status say so with this.
func SharedZones(cm *kv.ClusterMap, members []uint64) string {
	in := map[string][]uint64{}
	for _, id := range members {
		if i := slices.IndexFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == id }); i >= 0 && cm.Nodes[i].Zone != "" {
			in[cm.Nodes[i].Zone] = append(in[cm.Nodes[i].Zone], id)
		}
	}
	var out []string
	for _, z := range slices.Sorted(maps.Keys(in)) {
		if ids := in[z]; len(ids) > 1 {
			nodes := make([]string, len(ids))
			for i, id := range ids {
				nodes[i] = strconv.FormatUint(id, 10)
			}
			out = append(out, fmt.Sprintf("zone %s: nodes %s", z, strings.Join(nodes, ", ")))
		}
	}
	return strings.Join(out, "; ")
}

// ZoneNote is what a placed change ch (planned on cm) adds to its
// "placing ... on node N" line: "" when its members do not share a zone,
// else the zones shared — placement's fallback when no live node of
// another zone could take the place, made visible where it happens.
func ZoneNote(cm *kv.ClusterMap, ch GroupChange) string {
	if s := SharedZones(cm, ch.Members); s != "" {
		return "; its members then share a zone (" + s + ")"
	}
	return ""
}
