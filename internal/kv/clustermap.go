package kv

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
)

// The cluster map: the replicated state of a cluster's metadata group (issue
// 28, docs/design/cluster.md §4). One reserved record (ClusterMapKey) holds
// the nodes (id and addresses), the data groups (members, slot ranges), the
// moves in flight, and the map epoch, raised by every change of who owns a
// slot (MoveDone, to the move's epoch, above every epoch the map had: no
// op raises it while a move is in flight), by MoveAbort and by AddNode
// when no move is in flight. It is changed only by
// the KindMap* ops in the metadata group's log, so every replica of that
// group holds the same map at the same op, and like any record it is in every
// snapshot, state transfer and crash replay.
//
// The map is where a node learns the cluster; it is not what decides who
// serves a key: each data group's own slot table (slots.go) does, at apply.
// A move is recorded twice: MovePlanned before its first step in the groups'
// logs and MoveDone after its last, so a move the map shows planned is one a
// driver must finish or roll back; the lease (Driver, Beat) says who drives
// it, and another driver takes over only by a claim that names the beat it
// saw (compare-and-set), so two drivers never both think they drive.

// The ops (Key: the payload encoded by AppendClusterMap, AppendMapMove or
// AppendMapNode; each result's Int is the map epoch after it, Version 0
// when nothing changed — a retried op):
//
//	KindMapInit       Key: a map. The first map; a no-op once there is one.
//	KindMapMovePlan   Key: a move (From, To, Slots, Epoch, Driver). Refused
//	                  unless From owns every slot, the epoch is above the
//	                  map's and no other move is in flight; the same move
//	                  planned again by its driver is a no-op, by another
//	                  driver refused (it must claim a lapsed lease).
//	                  Int: the move's beat.
//	KindMapMoveClaim  Key: a move (Epoch, Driver, Beat, AbortWanted): the
//	                  move at Epoch gets Driver and its beat goes up, if
//	                  its beat is Beat (a lease renewed, or taken over).
//	                  A claim with AbortWanted marks the record for good
//	                  (the move is to be rolled back if it has not been
//	                  handed over: kefir cluster move-slots --abort); a
//	                  marked record refuses every claim without the mark,
//	                  so no driver that does not know it (a forward driver
//	                  renewing, a take-over) holds it again. Int: the new
//	                  beat.
//	KindMapMoveDone   Key: a move (Epoch; Driver and Beat: the end of a
//	                  driver holding a marked move): To owns the slots,
//	                  the map's epoch becomes Epoch, the move is no longer
//	                  in flight. With a Driver, refused unless the
//	                  record's driver and beat are those (a displaced
//	                  driver cannot end a move another holds); a marked
//	                  move is refused an end without one. An unmarked
//	                  move's end without a Driver is unchecked, as before
//	                  the mark (so that without marks a metadata group of
//	                  mixed builds applies the same).
//	KindMapMoveAbort  Key: as MoveDone: the move is dropped, From keeps
//	                  the slots; the epoch becomes Epoch (the groups' tables
//	                  went through it).
//	KindMapAddNode    Key: a node (AppendMapAddNode: its id, addresses
//	                  and zone, if it has one). Added to the map (no group:
//	                  it gets slots only by moves); the same node again is
//	                  a no-op; a node of the map at the same addresses
//	                  with another zone (one given) gets that zone — how
//	                  a node of the first map, which has no zones, gets
//	                  one.
//	                  The epoch goes up by one, unless a move is in flight
//	                  (then it stays below the move's until MoveDone).
//	                  With Cond MapNodeRemove, the node is taken out of
//	                  the map instead (kefir cluster remove-node of a node
//	                  that hosts nothing): refused while a group has it as
//	                  a member or joining chain member, or it is a member
//	                  of the metadata group; a chain's Leaving and Dropped
//	                  lose it; its id joins RemovedNodes, and an add of
//	                  that id is refused from then on (ids are never
//	                  reused); a node the map does not have is a no-op. The metadata group's members
//	                  are fixed in the map (Meta) first, so that taking a
//	                  node out never moves DefaultMetaMembers' choice.
//	KindMapSetMembers Key: a group's members (AppendMapMembers: group, VR
//	                  epoch, members in leader order), recorded after the
//	                  group's reconfiguration to that epoch committed.
//	                  Compare-and-set by the group's VR epoch: refused
//	                  below the epoch the map records for the group, and at
//	                  it unless the members are the same set (then a
//	                  no-op: a retry); refused for a group the map does not
//	                  have (MetaGroup: the metadata group's own members,
//	                  ClusterMap.Meta), an even or empty list, a member listed twice or
//	                  not a node of the map. The map epoch moves as with
//	                  AddNode (so pollers learn the members), unless a move
//	                  is in flight.
//	KindMapAddGroup   Key: a group's id and first members (AppendMapMembers,
//	                  epoch 0), nodes of the map, an odd number, distinct,
//	                  in leader order. A new data group that owns no slots
//	                  (it gets them by moves); its members, following the
//	                  map, bootstrap its replicas from this record (VR's
//	                  first view from the list). The same id with the same
//	                  members again is a no-op (a retry); an id the map has
//	                  for another group, the metadata group's id, 0 or an
//	                  id above 2^32-1 is refused. The epoch moves as with
//	                  AddNode.
//	KindMapRemoveGroup Key: a group's id and the map epoch the caller read
//	                  (AppendMapMembers, no members). The group leaves the
//	                  map and its id joins Removed (never used again: its
//	                  nodes keep a tombstone of their replica under that
//	                  id). Compare-and-set by the map's epoch; refused for
//	                  the metadata group, an id the map does not have, the
//	                  last data group, a group that owns a slot or that a
//	                  move in flight names. The same id again, once
//	                  removed, is a no-op (a retry), whatever the epoch.
//	                  The epoch moves as with AddNode.
//	KindMapChainWant  Key: a chain group's nodes to add and to remove
//	                  (AppendMapChainWant), chainconf.go.

// MapMutations are deliberate bugs of the map's ops the tests switch on to
// show that they catch them (internal/mutation); exported for vrshard's
// move simulation, set only before a run.
type MapMutations struct {
	// ClaimIgnoresAbortMark: a record marked for abort takes claims that
	// do not carry the mark (a forward driver may hold it again).
	ClaimIgnoresAbortMark bool
}

// MapMut is the process's MapMutations (tests only; read under
// mutation.On).
var MapMut MapMutations

// ClusterMapKey is the reserved record that holds the metadata group's map.
var ClusterMapKey = ReservedKey("clustermap")

// ClusterMap is the metadata group's state.
type ClusterMap struct {
	Epoch  uint64
	Nodes  []MapNode  // by id
	Groups []MapGroup // by id
	Moves  []MapMove  // in flight (at most one today)
	// Meta are the metadata group's own members (leader order) of its VR
	// epoch MetaEpoch, once a reconfiguration of it was recorded
	// (KindMapSetMembers of MetaGroup); nil: DefaultMetaMembers of the
	// nodes, the members it was bootstrapped with.
	Meta      []uint64 `json:",omitempty"`
	MetaEpoch uint64   `json:",omitempty"`
	// Removed are the ids of the data groups taken out of the map
	// (KindMapRemoveGroup), ascending: a node retires its replica of a
	// group it finds here (and only here: a group merely absent from a
	// node's map may be one added after that map), and no new group
	// takes such an id.
	Removed []uint64 `json:",omitempty"`
	// RemovedNodes are the ids of the nodes taken out of the map
	// (KindMapAddNode with MapNodeRemove), ascending: no node is added
	// again under such an id. A node's id names its replicas everywhere
	// (groups' members, chains' records and dropped lists, the peers'
	// tables); a new machine under an old id would be taken for the old
	// one's restarted replicas, and an old machine's directory that comes
	// back under it would be taken for a member of the cluster.
	RemovedNodes []uint64 `json:",omitempty"`
}

// MaxZoneLen bounds a node's zone (ValidZone).
const MaxZoneLen = 64

// ValidZone checks a node's failure domain label (kefir server --zone,
// kefir cluster add-node --zone): a short name of printable ASCII without
// spaces or commas, so that it reads in a status line and a flag's list
// (kefir up --zones a,b,c) as it is. "" is no zone.
func ValidZone(z string) error {
	if len(z) > MaxZoneLen {
		return fmt.Errorf("zone %.20q...: longer than %d bytes", z, MaxZoneLen)
	}
	for i := 0; i < len(z); i++ {
		if c := z[i]; c <= ' ' || c > '~' || c == ',' {
			return fmt.Errorf("zone %q: byte %d (%q) is not a printable ASCII character other than space and ','", z, i, c)
		}
	}
	return nil
}

// MetaGroup is the metadata group's id (cluster.MetaGroupID): its members
// are recorded by KindMapSetMembers of this group.
const MetaGroup = 65535

// MetaReplicas is how many nodes a cluster's metadata group starts with.
const MetaReplicas = 3

// DefaultMetaMembers returns the metadata group's first members among
// nodes: the MetaReplicas lowest ids (an odd number; every node computes
// the same).
func DefaultMetaMembers(nodes []uint64) []uint64 {
	ids := slices.Clone(nodes)
	slices.Sort(ids)
	n := min(len(ids), MetaReplicas)
	if n%2 == 0 {
		n--
	}
	return ids[:max(n, 0)]
}

// NodeGroups is what keeps node id in the map (removeNode refuses to take
// it out while any is so): the data groups that have it as a member, or
// joining (a chain's), in map order, and whether it is a member of the
// metadata group. A chain that lists it only as leaving — out of the
// chain's record already, kept listed so that its master refuses it —
// does not keep it: once the node leaves the map, the master refuses it
// as no node of the map (removeNode, and docs/design/chain.md, "A node
// that left a chain leaves the map").
func (m *ClusterMap) NodeGroups(id uint64) (groups []uint64, meta bool) {
	for _, g := range m.Groups {
		if slices.Contains(g.Members, id) || slices.Contains(g.Joining, id) {
			groups = append(groups, g.ID)
		}
	}
	return groups, slices.Contains(m.MetaMembers(), id)
}

// MetaMembers returns the metadata group's members as the map knows them.
func (m *ClusterMap) MetaMembers() []uint64 {
	if m.Meta != nil {
		return m.Meta
	}
	return DefaultMetaMembers(m.NodeIDs())
}

// NodeIDs returns the ids of the map's nodes, in the map's order.
func (m *ClusterMap) NodeIDs() []uint64 {
	ids := make([]uint64, len(m.Nodes))
	for i, n := range m.Nodes {
		ids[i] = n.ID
	}
	return ids
}

// MapNode is a node of the cluster: its id and addresses, and its zone.
type MapNode struct {
	ID         uint64
	ClientAddr string
	PeerAddr   string
	// Zone is the node's failure domain (kefir server --zone: a rack, a
	// data centre's availability zone), "" when it has none: placement
	// puts a group's replicas in distinct zones (internal/cluster,
	// placement.go). Not in AppendMapNode's encoding (a group's address
	// record shares it): the map's last section and AppendMapAddNode
	// carry it.
	Zone string `json:",omitempty"`
}

// MapGroup is a data group: its members (node ids, in leader order) and the
// slot ranges it owns. MemberEpoch is the group's VR configuration epoch
// the members are of (KindMapSetMembers; 0: the group's first epoch, as VR
// numbers it).
type MapGroup struct {
	ID          uint64
	Members     []uint64
	Slots       []SlotRange
	MemberEpoch uint64 `json:",omitempty"`
	// Engine is the group's replication engine: EngineVR ("") or
	// EngineChain (KindMapAddGroup's, docs/design/chain.md "A chain in a
	// cluster of groups"): its members open a chain member, and the
	// metadata group's nodes each run the chain's hosted master.
	Engine string `json:",omitempty"`
	// A chain group's wanted change (KindMapChainWant, chainconf.go):
	// Joining are nodes to add, which open an empty member the chain's
	// master joins, each cleared once the chain's record has it as a
	// member (followChain); Leaving are nodes to remove, which the master
	// fails once no node is left to join and never joins again — kept
	// after they left, so that a leaving node's member that comes back
	// (its heartbeats say it is no replica) is refused and retires, not
	// joined, whichever metadata node's master acts — until the node
	// leaves the map (removeNode), after which the master refuses it as
	// no node of the map.
	Joining []uint64 `json:",omitempty"`
	Leaving []uint64 `json:",omitempty"`
	// Dropped are the members a chain group's master failed that the map
	// did not want out (followChain: they left the chain's record, and
	// not by a wish — a crash, a partition), in the order dropped: the
	// places kefir cluster replace-node --old N re-creates (a join of a
	// placed node, N then kept out as Leaving). A node leaves it when the
	// chain has it as a member again (it restarted and rejoined), when a
	// wish names it (KindMapChainWant), or when it leaves the map.
	Dropped []uint64 `json:",omitempty"`
}

// The engines a data group runs (MapGroup.Engine).
const (
	EngineVR    = ""
	EngineChain = "chain"
)

// IsChain reports whether g runs the chain engine.
func (g *MapGroup) IsChain() bool { return g.Engine == EngineChain }

// engineName is g's engine for messages.
func (g *MapGroup) engineName() string {
	if g.Engine == EngineVR {
		return "vr"
	}
	return g.Engine
}

// MapMove is a move in flight: Slots from group From to group To at Epoch,
// driven by Driver, whose lease the beat counts.
type MapMove struct {
	From, To uint64
	Slots    []SlotRange
	Epoch    uint64
	Driver   string
	Beat     uint64
	// AbortWanted marks a move to be rolled back (set by a claim that
	// carries it, never cleared while the move is in flight): whoever
	// holds the record settles it — rolls it back before its hand-over,
	// finishes it after — and never drives it forward before the
	// hand-over. In an op's Key: the claim carries the mark.
	AbortWanted bool `json:",omitempty"`
}

// Owner returns the group that owns slot in the map (0: none).
func (m *ClusterMap) Owner(slot uint16) uint64 {
	for _, g := range m.Groups {
		if InSlotRanges(slot, g.Slots) {
			return g.ID
		}
	}
	return 0
}

// Group returns group id's entry.
func (m *ClusterMap) Group(id uint64) (*MapGroup, bool) {
	for i := range m.Groups {
		if m.Groups[i].ID == id {
			return &m.Groups[i], true
		}
	}
	return nil, false
}

// Check returns an error unless every slot is owned by exactly one group
// and every group's members are nodes of the map: the invariant every op
// keeps.
func (m *ClusterMap) Check() error {
	var owner [NumSlots]uint64
	nodes := map[uint64]bool{}
	for _, n := range m.Nodes {
		nodes[n.ID] = true
		if err := ValidZone(n.Zone); err != nil {
			return fmt.Errorf("cluster map: node %d: %v", n.ID, err)
		}
	}
	for _, g := range m.Groups {
		for _, id := range slices.Concat(g.Members, g.Joining, g.Leaving, g.Dropped) {
			if !nodes[id] {
				return fmt.Errorf("cluster map: group %d's member %d (or node joining or leaving it) is not a node of the map", g.ID, id)
			}
		}
		for _, r := range g.Slots {
			if r.Start > r.End || r.End >= NumSlots {
				return fmt.Errorf("cluster map: group %d: bad range %d-%d", g.ID, r.Start, r.End)
			}
			for s := int(r.Start); s <= int(r.End); s++ {
				if owner[s] != 0 {
					return fmt.Errorf("cluster map: slot %d is owned by group %d and group %d at epoch %d", s, owner[s], g.ID, m.Epoch)
				}
				owner[s] = g.ID
			}
		}
	}
	for _, id := range m.Meta {
		if !nodes[id] {
			return fmt.Errorf("cluster map: the metadata group's member %d is not a node of the map", id)
		}
	}
	for _, id := range m.RemovedNodes {
		if nodes[id] {
			return fmt.Errorf("cluster map: node %d is both in the map and removed from it", id)
		}
	}
	for s, o := range owner {
		if o == 0 {
			return fmt.Errorf("cluster map: slot %d has no owner at epoch %d", s, m.Epoch)
		}
	}
	return nil
}

// AppendClusterMap appends m's encoding to b.
func AppendClusterMap(b []byte, m *ClusterMap) []byte {
	b = binary.AppendUvarint(b, m.Epoch)
	b = binary.AppendUvarint(b, uint64(len(m.Nodes)))
	for _, n := range m.Nodes {
		b = AppendMapNode(b, n)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Groups)))
	for _, g := range m.Groups {
		b = binary.AppendUvarint(b, g.ID)
		b = binary.AppendUvarint(b, uint64(len(g.Members)))
		for _, id := range g.Members {
			b = binary.AppendUvarint(b, id)
		}
		b = AppendBytes(b, EncodeSlotRanges(g.Slots))
	}
	b = binary.AppendUvarint(b, uint64(len(m.Moves)))
	for _, mv := range m.Moves {
		b = appendMapMove(b, mv)
	}
	// The groups' member epochs, last and only when one was recorded: a
	// map of before KindMapSetMembers decodes (and encodes) as it was.
	var eps []MapGroup
	for _, g := range m.Groups {
		if g.MemberEpoch != 0 {
			eps = append(eps, g)
		}
	}
	var chains []uint64
	for _, g := range m.Groups {
		if g.IsChain() {
			chains = append(chains, g.ID)
		}
	}
	// Each optional section is written when it or a later one has
	// something: removed groups, then chain groups, come last.
	// The moves marked for abort (their epochs) come last of all.
	var marked []uint64
	for _, mv := range m.Moves {
		if mv.AbortWanted {
			marked = append(marked, mv.Epoch)
		}
	}
	var wants, dropped []MapGroup
	for _, g := range m.Groups {
		if len(g.Joining) > 0 || len(g.Leaving) > 0 {
			wants = append(wants, g)
		}
		if len(g.Dropped) > 0 {
			dropped = append(dropped, g)
		}
	}
	var zoned []MapNode
	for _, n := range m.Nodes {
		if n.Zone != "" {
			zoned = append(zoned, n)
		}
	}
	removedNodesOn := len(m.RemovedNodes) > 0 || len(zoned) > 0
	droppedOn := len(dropped) > 0 || removedNodesOn
	markedOn := len(marked) > 0 || droppedOn
	wantsOn := len(wants) > 0 || markedOn
	chainsOn := len(chains) > 0 || wantsOn
	removedOn := len(m.Removed) > 0 || chainsOn
	metaOn := m.Meta != nil || removedOn
	if len(eps) > 0 || metaOn {
		b = binary.AppendUvarint(b, uint64(len(eps)))
		for _, g := range eps {
			b = binary.AppendUvarint(b, g.ID)
			b = binary.AppendUvarint(b, g.MemberEpoch)
		}
	}
	// Then the metadata group's members, when recorded (a count of 0:
	// none, written only when removed or chain groups follow).
	if metaOn {
		b = binary.AppendUvarint(b, uint64(len(m.Meta)))
		for _, id := range m.Meta {
			b = binary.AppendUvarint(b, id)
		}
		if len(m.Meta) > 0 {
			b = binary.AppendUvarint(b, m.MetaEpoch)
		}
	}
	// Then the removed groups' ids (a count of 0: none, written only when
	// chain groups follow).
	if removedOn {
		b = binary.AppendUvarint(b, uint64(len(m.Removed)))
		for _, id := range m.Removed {
			b = binary.AppendUvarint(b, id)
		}
	}
	// Then the groups that run the chain engine, when there are any (a
	// count of 0: none, written only when a later section follows): a
	// map of VR groups only decodes (and encodes) as before.
	if chainsOn {
		b = binary.AppendUvarint(b, uint64(len(chains)))
		for _, id := range chains {
			b = binary.AppendUvarint(b, id)
		}
	}
	// Then the chain groups' wanted changes, when one has any (only chain
	// groups have them, so the chain section precedes it; a count of 0:
	// none, written only when marked moves follow).
	if wantsOn {
		b = binary.AppendUvarint(b, uint64(len(wants)))
		for _, g := range wants {
			b = binary.AppendUvarint(b, g.ID)
			b = appendIDs(b, g.Joining)
			b = appendIDs(b, g.Leaving)
		}
	}
	// Then the epochs of the moves marked for abort, when one is: a map
	// that never had an abort of a recorded move encodes as before the
	// mark (so it stays readable by an older build; one that holds a
	// mark is not: docs/design/cluster.md §9, mixed builds). A count of
	// 0: none, written only when dropped members follow.
	if markedOn {
		b = appendIDs(b, marked)
	}
	// Then the chain groups' dropped members, when one has any: a map
	// whose chains never lost a member to a failure encodes as before
	// (an older build cannot read one that has: the same rule). A count
	// of 0: none, written only when removed nodes follow.
	if droppedOn {
		b = binary.AppendUvarint(b, uint64(len(dropped)))
		for _, g := range dropped {
			b = binary.AppendUvarint(b, g.ID)
			b = appendIDs(b, g.Dropped)
		}
	}
	// Then the ids of the nodes taken out of the map, when there are any
	// (a map that never lost a node encodes as before; one that has is
	// not readable by a build before this section: the same rule). A
	// count of 0: none, written only when zones follow.
	if removedNodesOn {
		b = appendIDs(b, m.RemovedNodes)
	}
	// Then the zones of the nodes that have one (id and zone, in node
	// order), when one has: a map without zones encodes as before, one
	// with them is not readable by a build before this section.
	if len(zoned) > 0 {
		b = binary.AppendUvarint(b, uint64(len(zoned)))
		for _, n := range zoned {
			b = binary.AppendUvarint(b, n.ID)
			b = AppendBytes(b, []byte(n.Zone))
		}
	}
	return b
}

// appendIDs appends a count and ids.
func appendIDs(b []byte, ids []uint64) []byte {
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
	}
	return b
}

// DecodeClusterMap decodes AppendClusterMap's encoding, all of b.
func DecodeClusterMap(b []byte) (*ClusterMap, error) {
	d := Decoder{B: b}
	m := &ClusterMap{Epoch: d.Uvarint()}
	count := func() int {
		n := d.Uvarint()
		if n > uint64(len(d.B)) {
			d.Err = ErrCorrupt
			return 0
		}
		return int(n)
	}
	for range count() {
		m.Nodes = append(m.Nodes, decodeMapNode(&d))
	}
	for range count() {
		g := MapGroup{ID: d.Uvarint()}
		for range count() {
			g.Members = append(g.Members, d.Uvarint())
		}
		rs, err := DecodeSlotRanges(d.Bytes())
		if err != nil && d.Err == nil {
			d.Err = err
		}
		g.Slots = rs
		m.Groups = append(m.Groups, g)
	}
	for range count() {
		m.Moves = append(m.Moves, decodeMapMove(&d))
	}
	if d.Err == nil && len(d.B) > 0 {
		for range count() {
			id, ep := d.Uvarint(), d.Uvarint()
			if g, ok := m.Group(id); ok && ep != 0 {
				g.MemberEpoch = ep
			} else if d.Err == nil {
				d.Err = ErrCorrupt
			}
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		if n := count(); n > 0 {
			m.Meta = make([]uint64, 0, n)
			for range n {
				m.Meta = append(m.Meta, d.Uvarint())
			}
			m.MetaEpoch = d.Uvarint()
		} else if len(d.B) == 0 && d.Err == nil {
			d.Err = ErrCorrupt // a count of 0 only before removed groups
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		for range n {
			m.Removed = append(m.Removed, d.Uvarint())
		}
		if n == 0 && d.Err == nil && len(d.B) == 0 {
			// No removed groups is written only before chain groups.
			d.Err = ErrCorrupt
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		if n == 0 && d.Err == nil && len(d.B) == 0 {
			d.Err = ErrCorrupt // a count of 0 only before a later section
		}
		for range n {
			if g, ok := m.Group(d.Uvarint()); ok && !g.IsChain() {
				g.Engine = EngineChain
			} else if d.Err == nil {
				d.Err = ErrCorrupt
			}
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		if n == 0 && d.Err == nil && len(d.B) == 0 {
			d.Err = ErrCorrupt // a count of 0 only before marked moves
		}
		for range n {
			g, ok := m.Group(d.Uvarint())
			var j, l []uint64
			for range count() {
				j = append(j, d.Uvarint())
			}
			for range count() {
				l = append(l, d.Uvarint())
			}
			if ok && g.IsChain() && g.Joining == nil && g.Leaving == nil && len(j)+len(l) > 0 {
				g.Joining, g.Leaving = j, l
			} else if d.Err == nil {
				d.Err = ErrCorrupt
			}
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		if n == 0 && d.Err == nil && len(d.B) == 0 {
			d.Err = ErrCorrupt // a count of 0 only before dropped members
		}
		for range n {
			e := d.Uvarint()
			i := slices.IndexFunc(m.Moves, func(x MapMove) bool { return x.Epoch == e })
			if i >= 0 && !m.Moves[i].AbortWanted {
				m.Moves[i].AbortWanted = true
			} else if d.Err == nil {
				d.Err = ErrCorrupt
			}
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		if n == 0 && d.Err == nil && len(d.B) == 0 {
			d.Err = ErrCorrupt // a count of 0 only before removed nodes
		}
		for range n {
			g, ok := m.Group(d.Uvarint())
			var ids []uint64
			for range count() {
				ids = append(ids, d.Uvarint())
			}
			if ok && g.IsChain() && g.Dropped == nil && len(ids) > 0 {
				g.Dropped = ids
			} else if d.Err == nil {
				d.Err = ErrCorrupt
			}
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		for range n {
			id := d.Uvarint()
			if len(m.RemovedNodes) > 0 && id <= m.RemovedNodes[len(m.RemovedNodes)-1] && d.Err == nil {
				d.Err = ErrCorrupt // ascending, each once
			}
			m.RemovedNodes = append(m.RemovedNodes, id)
		}
		if n == 0 && d.Err == nil && len(d.B) == 0 {
			d.Err = ErrCorrupt // a count of 0 only before zones
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		n := count()
		last := -1
		for range n {
			id, zone := d.Uvarint(), string(d.Bytes())
			i := slices.IndexFunc(m.Nodes, func(x MapNode) bool { return x.ID == id })
			if d.Err == nil && (i <= last || zone == "" || ValidZone(zone) != nil) {
				d.Err = ErrCorrupt // nodes of the map in order, each once, a valid zone
			}
			if d.Err == nil {
				m.Nodes[i].Zone, last = zone, i
			}
		}
		if n == 0 && d.Err == nil {
			d.Err = ErrCorrupt // the last section: written only when a node has a zone
		}
	}
	if d.Err != nil || len(d.B) != 0 {
		return nil, fmt.Errorf("%w: cluster map", ErrCorrupt)
	}
	return m, nil
}

// AppendMapNode appends n's id and addresses to b (in the map and a
// group's address record; not its zone).
func AppendMapNode(b []byte, n MapNode) []byte {
	b = binary.AppendUvarint(b, n.ID)
	b = AppendBytes(b, []byte(n.ClientAddr))
	return AppendBytes(b, []byte(n.PeerAddr))
}

// AppendMapAddNode appends KindMapAddNode's Key to b: AppendMapNode, then
// n's zone when it has one — a key without a zone is byte for byte a key
// of the builds before zones, which refuse one with a zone (trailing
// bytes): every metadata replica must run a build that knows zones
// before a zone is given (docs/cluster.md).
func AppendMapAddNode(b []byte, n MapNode) []byte {
	b = AppendMapNode(b, n)
	if n.Zone != "" {
		b = AppendBytes(b, []byte(n.Zone))
	}
	return b
}

func decodeMapNode(d *Decoder) MapNode {
	return MapNode{ID: d.Uvarint(), ClientAddr: string(d.Bytes()), PeerAddr: string(d.Bytes())}
}

// MapNodeRemove is KindMapAddNode's Cond that takes the node out of the
// map (removeNode). A metadata group of mixed builds must not be sent it:
// a build before it refuses it, as an add without addresses (upgrade the metadata group's
// nodes first; docs/cluster.md).
const MapNodeRemove Cond = 1

// removeNode is KindMapAddNode's step with MapNodeRemove: node Key's id
// leaves the map if nothing places a replica on it.
func removeNode(m *ClusterMap, op *Op) (*ClusterMap, Result, error) {
	epoch := Result{Kind: ResInt, Int: int64(m.Epoch)}
	nd, err := DecodeMapNode(op.Key)
	if err != nil {
		return nil, Result{}, err
	}
	i := slices.IndexFunc(m.Nodes, func(x MapNode) bool { return x.ID == nd.ID })
	if i < 0 {
		return nil, epoch, nil // taken out already: a retry
	}
	switch gs, meta := m.NodeGroups(nd.ID); {
	case meta:
		return nil, Result{}, errMap("node %d is a member of the metadata group: replace it there first (kefir cluster replace-node --old %d --group 65535)", nd.ID, nd.ID)
	case len(gs) > 0:
		return nil, Result{}, errMap("node %d is in group %d: remove it from its groups first (kefir cluster remove-node or replace-node)", nd.ID, gs[0])
	}
	n := m.clone()
	n.Meta = slices.Clone(m.MetaMembers())
	n.Nodes = slices.Delete(slices.Clone(m.Nodes), i, i+1)
	// The id is never given again (addNode refuses it).
	n.RemovedNodes = append(n.RemovedNodes, nd.ID)
	slices.Sort(n.RemovedNodes)
	for j := range n.Groups {
		// A chain's place it left by failure is no longer its: the
		// operator took the node out of the cluster. Nor is a chain's
		// Leaving entry (the node is out of the chain's record: NodeGroups):
		// what kept a returning member of it out of the chain — its
		// master refuses a node the map's Leaving names — is from now on
		// that it is no node of the map, which the master refuses as well
		// (chainmaster: a map's view names the map's nodes), read from
		// the same map version as Leaving, so no master sees neither.
		n.Groups[j].Dropped = dropIDs(n.Groups[j].Dropped, []uint64{nd.ID})
		n.Groups[j].Leaving = dropIDs(n.Groups[j].Leaving, []uint64{nd.ID})
	}
	// As with an added node: the epoch moves so that pollers learn it,
	// unless a move is in flight (its epoch is above the map's).
	if len(n.Moves) == 0 {
		n.Epoch++
	}
	return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
}

// DecodeMapNode decodes AppendMapAddNode's encoding, all of b.
func DecodeMapNode(b []byte) (MapNode, error) {
	d := Decoder{B: b}
	n := decodeMapNode(&d)
	if d.Err == nil && len(d.B) > 0 {
		if n.Zone = string(d.Bytes()); d.Err == nil && n.Zone == "" {
			d.Err = ErrCorrupt // written only when there is one
		}
	}
	if d.Err != nil || len(d.B) != 0 || n.ID == 0 {
		return MapNode{}, fmt.Errorf("%w: cluster map node", ErrCorrupt)
	}
	if err := ValidZone(n.Zone); err != nil {
		return MapNode{}, fmt.Errorf("%w: cluster map node %d: %v", ErrCorrupt, n.ID, err)
	}
	return n, nil
}

// MapMembers is KindMapSetMembers's payload: group's members (leader
// order) in its VR configuration epoch Epoch.
type MapMembers struct {
	Group   uint64
	Epoch   uint64
	Members []uint64
}

// AppendMapMembers appends mm's encoding (KindMapSetMembers's Key) to b.
func AppendMapMembers(b []byte, mm MapMembers) []byte {
	b = binary.AppendUvarint(b, mm.Group)
	b = binary.AppendUvarint(b, mm.Epoch)
	b = binary.AppendUvarint(b, uint64(len(mm.Members)))
	for _, id := range mm.Members {
		b = binary.AppendUvarint(b, id)
	}
	return b
}

// DecodeMapMembers decodes AppendMapMembers's encoding, all of b.
func DecodeMapMembers(b []byte) (MapMembers, error) {
	d := Decoder{B: b}
	mm := decodeMapMembers(&d)
	if d.Err != nil || len(d.B) != 0 {
		return MapMembers{}, fmt.Errorf("%w: cluster map members", ErrCorrupt)
	}
	return mm, nil
}

// decodeMapMembers reads AppendMapMembers's encoding from d (errors stick
// in d.Err).
func decodeMapMembers(d *Decoder) MapMembers {
	mm := MapMembers{Group: d.Uvarint(), Epoch: d.Uvarint()}
	n := d.Uvarint()
	if n > uint64(len(d.B)) {
		d.Err = ErrCorrupt
		n = 0
	}
	for range n {
		mm.Members = append(mm.Members, d.Uvarint())
	}
	return mm
}

// MapAddGroup is KindMapAddGroup's payload: the group's first members
// (epoch 0) and its engine (EngineVR or EngineChain).
type MapAddGroup struct {
	MapMembers
	Engine string
}

// AppendMapAddGroup appends ag's encoding (KindMapAddGroup's Key) to b: the
// members as AppendMapMembers, then the engine's name unless it is VR's (a
// VR group's payload is as before engines).
func AppendMapAddGroup(b []byte, ag MapAddGroup) []byte {
	b = AppendMapMembers(b, ag.MapMembers)
	if ag.Engine != EngineVR {
		b = AppendBytes(b, []byte(ag.Engine))
	}
	return b
}

// DecodeMapAddGroup decodes AppendMapAddGroup's encoding, all of b.
func DecodeMapAddGroup(b []byte) (MapAddGroup, error) {
	d := Decoder{B: b}
	ag := MapAddGroup{MapMembers: decodeMapMembers(&d)}
	if d.Err == nil && len(d.B) > 0 {
		ag.Engine = string(d.Bytes())
		if ag.Engine != EngineChain && d.Err == nil {
			return MapAddGroup{}, fmt.Errorf("%w: cluster map group: engine %q (want %q or none)", ErrCorrupt, ag.Engine, EngineChain)
		}
	}
	if d.Err != nil || len(d.B) != 0 {
		return MapAddGroup{}, fmt.Errorf("%w: cluster map group", ErrCorrupt)
	}
	return ag, nil
}

// AppendMapMove appends mv's encoding (the Key of the move ops) to b: a
// claim that carries the abort mark ends in a 1 (without it, the encoding
// of before the mark).
func AppendMapMove(b []byte, mv MapMove) []byte {
	b = appendMapMove(b, mv)
	if mv.AbortWanted {
		b = binary.AppendUvarint(b, 1)
	}
	return b
}

// appendMapMove is a move's encoding in the map (its mark in a section of
// its own: AppendClusterMap).
func appendMapMove(b []byte, mv MapMove) []byte {
	b = binary.AppendUvarint(b, mv.From)
	b = binary.AppendUvarint(b, mv.To)
	b = AppendBytes(b, EncodeSlotRanges(mv.Slots))
	b = binary.AppendUvarint(b, mv.Epoch)
	b = AppendBytes(b, []byte(mv.Driver))
	return binary.AppendUvarint(b, mv.Beat)
}

func decodeMapMove(d *Decoder) MapMove {
	mv := MapMove{From: d.Uvarint(), To: d.Uvarint()}
	rs, err := DecodeSlotRanges(d.Bytes())
	if err != nil && d.Err == nil {
		d.Err = err
	}
	mv.Slots = rs
	mv.Epoch = d.Uvarint()
	mv.Driver = string(d.Bytes())
	mv.Beat = d.Uvarint()
	return mv
}

// DecodeMapMove decodes AppendMapMove's encoding, all of b.
func DecodeMapMove(b []byte) (MapMove, error) {
	d := Decoder{B: b}
	mv := decodeMapMove(&d)
	if d.Err == nil && len(d.B) > 0 {
		mv.AbortWanted = d.Uvarint() == 1
		if !mv.AbortWanted && d.Err == nil {
			d.Err = ErrCorrupt
		}
	}
	if d.Err != nil || len(d.B) != 0 {
		return MapMove{}, fmt.Errorf("%w: cluster map move", ErrCorrupt)
	}
	return mv, nil
}

// ReadClusterMap reads the metadata group's map through get (nil, nil:
// none yet).
func ReadClusterMap(get Getter) (*ClusterMap, error) {
	data, _, _, ok, err := get(ClusterMapKey)
	if err != nil || !ok {
		return nil, err
	}
	return DecodeClusterMap(data)
}

// MapCheckAgain ends the refusal of a removal checked against an older map
// than the one it reached (the epoch's compare-and-set): the remover reads
// the map and checks again (cluster.GroupRemoval). It crosses the wire as
// text, so the remover matches the words.
const MapCheckAgain = "check it again"

// errMap is a refused map op: an outcome (the client table keeps it by
// ErrSlotTransition's code), the map unchanged.
func errMap(format string, args ...any) error {
	return fmt.Errorf("%w: cluster map: %s", ErrSlotTransition, fmt.Sprintf(format, args...))
}

func applyMapOp(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	if op.Kind == KindMapChainInit || op.Kind == KindMapChainSet {
		return applyChainOp(get, version, op, emit) // chainconf.go: no map needed
	}
	m, err := ReadClusterMap(get)
	if err != nil {
		return Result{}, err
	}
	if op.Kind == KindMapInit {
		if m != nil {
			return Result{Kind: ResInt, Int: int64(m.Epoch)}, nil
		}
		n, err := DecodeClusterMap(op.Key)
		if err != nil || n.Epoch == 0 || len(n.Moves) != 0 {
			return Result{}, fmt.Errorf("%w: map init", ErrInvalidOp)
		}
		if err := n.Check(); err != nil {
			return Result{}, fmt.Errorf("%w: map init: %v", ErrInvalidOp, err)
		}
		put(emit, ClusterMapKey, AppendClusterMap(nil, n), nil)
		return Result{Kind: ResInt, Int: int64(n.Epoch), Version: version}, nil
	}
	if m == nil {
		return Result{}, errMap("no map yet (the metadata group is not bootstrapped)")
	}
	n, res, err := mapStep(m, op)
	if err != nil || n == nil {
		return res, err
	}
	if err := n.Check(); err != nil {
		// Every step keeps one owner per slot; a step that would break it
		// is a bug, refused rather than written.
		return Result{}, fmt.Errorf("%w: %s: %v", ErrInvalidOp, op.Kind, err)
	}
	put(emit, ClusterMapKey, AppendClusterMap(nil, n), nil)
	res.Version = version
	return res, nil
}

// mapStep returns the map after op (nil: unchanged) and op's result.
func mapStep(m *ClusterMap, op *Op) (*ClusterMap, Result, error) {
	epoch := Result{Kind: ResInt, Int: int64(m.Epoch)}
	if op.Kind == KindMapSetMembers {
		return setMembers(m, op)
	}
	if op.Kind == KindMapAddGroup {
		return addGroup(m, op)
	}
	if op.Kind == KindMapRemoveGroup {
		return removeGroup(m, op)
	}
	if op.Kind == KindMapChainWant {
		return chainWant(m, op) // chainconf.go
	}
	if op.Kind == KindMapAddNode && op.Cond == MapNodeRemove {
		return removeNode(m, op)
	}
	if op.Kind == KindMapAddNode {
		nd, err := DecodeMapNode(op.Key)
		if err != nil {
			return nil, Result{}, err
		}
		i := slices.IndexFunc(m.Nodes, func(x MapNode) bool { return x.ID == nd.ID })
		if i >= 0 {
			cur := m.Nodes[i]
			if cur.ClientAddr != nd.ClientAddr || cur.PeerAddr != nd.PeerAddr {
				return nil, Result{}, errMap("node %d is in the map with other addresses (%s, %s)", nd.ID, cur.ClientAddr, cur.PeerAddr)
			}
			if nd.Zone == "" || nd.Zone == cur.Zone {
				// The same node again (a retry), or one without a zone: an
				// add that names none leaves a zone the map has, so that a
				// rerun of an add-node without --zone takes nothing away.
				return nil, epoch, nil
			}
			// The node's zone, given or changed: placement reads it from
			// here on (the replicas already placed stay where they are).
			n := m.clone()
			n.Nodes[i].Zone = nd.Zone
			if len(n.Moves) == 0 {
				n.Epoch++ // as an added node: pollers learn it
			}
			return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
		}
		if _, gone := slices.BinarySearch(m.RemovedNodes, nd.ID); gone {
			return nil, Result{}, errMap("node %d was removed from the cluster, and a removed node's id is never used again: start the new node with another --id", nd.ID)
		}
		n := m.clone()
		n.Nodes = append(n.Nodes, nd)
		slices.SortFunc(n.Nodes, func(a, b MapNode) int { return cmp.Compare(a.ID, b.ID) })
		// The epoch moves with the node list, so a node that polls the map
		// (it adopts only a newer epoch) learns the node — unless a move is
		// in flight: its epoch is above the map's, and the map must not
		// reach it before MoveDone (a map at epoch E has every move up to E
		// done, and two maps at one epoch have the same owners), nor may
		// MoveDone's change of owners then leave the epoch where a poller
		// already saw it. The node reaches the pollers at the move's end,
		// which raises the epoch to the move's; hosted replicas see it at
		// once (they adopt every new version of the record).
		if len(n.Moves) == 0 {
			n.Epoch++
		}
		return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
	}
	mv, err := DecodeMapMove(op.Key)
	if err != nil {
		return nil, Result{}, err
	}
	i := slices.IndexFunc(m.Moves, func(x MapMove) bool { return x.Epoch == mv.Epoch })
	switch op.Kind {
	case KindMapMovePlan:
		if i >= 0 {
			cur := m.Moves[i]
			if cur.From == mv.From && cur.To == mv.To && slices.Equal(cur.Slots, mv.Slots) {
				// Planned again. Only by the driver that holds the lease
				// (a retry) is it answered the beat: another driver that
				// read the map before this plan landed would otherwise
				// drive the move at the holder's beat, and the groups'
				// driver fence (epoch, beat) could not tell their steps
				// apart. Drivers name themselves uniquely
				// (cluster.Mover's driver token); another one takes the
				// move over only by a claim of a lease it saw lapse.
				if cur.Driver != mv.Driver {
					return nil, Result{}, errMap("the move at epoch %d is driven by %q (beat %d), not %q: take it over by a claim once its lease lapses", cur.Epoch, cur.Driver, cur.Beat, mv.Driver)
				}
				return nil, Result{Kind: ResInt, Int: int64(cur.Beat)}, nil
			}
		}
		if len(m.Moves) > 0 {
			c := m.Moves[0]
			return nil, Result{}, errMap("a move is in flight (slots %v from group %d to group %d at epoch %d): finish or abort it first", c.Slots, c.From, c.To, c.Epoch)
		}
		if mv.Epoch <= m.Epoch {
			return nil, Result{}, errMap("move epoch %d is not above the map's %d", mv.Epoch, m.Epoch)
		}
		if _, ok := m.Group(mv.To); !ok || mv.From == mv.To || len(mv.Slots) == 0 {
			return nil, Result{}, errMap("a move needs slots and two distinct groups of the map (%d to %d)", mv.From, mv.To)
		}
		for _, r := range mv.Slots {
			for s := int(r.Start); s <= int(r.End); s++ {
				if o := m.Owner(uint16(s)); o != mv.From {
					return nil, Result{}, errMap("slot %d is group %d's, not group %d's", s, o, mv.From)
				}
			}
		}
		n := m.clone()
		mv.Beat = 1
		n.Moves = append(n.Moves, mv)
		return n, Result{Kind: ResInt, Int: 1}, nil
	case KindMapMoveClaim:
		if i < 0 {
			return nil, Result{}, errMap("no move in flight at epoch %d", mv.Epoch)
		}
		if cur := m.Moves[i]; cur.AbortWanted && !mv.AbortWanted && !(mutation.On && MapMut.ClaimIgnoresAbortMark) {
			// Sticky: a driver that does not know the mark (a forward
			// driver's renewal, a take-over that read the map before
			// it) never holds the move again.
			return nil, Result{}, errMap("the move at epoch %d is marked to be rolled back (driver %q, beat %d): only a claim that carries the mark (move-slots --abort, a take-over that settles it) holds it", mv.Epoch, cur.Driver, cur.Beat)
		}
		if cur := m.Moves[i]; cur.Beat != mv.Beat {
			if cur.Driver == mv.Driver && cur.Beat == mv.Beat+1 {
				// This driver's own claim at mv.Beat, applied, its
				// answer lost and the claim sent again: a retry,
				// answered the beat it set. No other claim landed
				// since (it would name its own driver; drivers' names
				// are unique: cluster.Mover.identify), so the lease is
				// still this driver's. Refused, a lost answer cost the
				// driver its lease, and its move two leases of waiting
				// for a take-over (TestMoveSimGroupOps/powercuts, seed 2).
				return nil, Result{Kind: ResInt, Int: int64(cur.Beat)}, nil
			}
			return nil, Result{}, errMap("the move at epoch %d is at beat %d (driver %q), not %d: its lease was taken", mv.Epoch, cur.Beat, cur.Driver, mv.Beat)
		}
		n := m.clone()
		n.Moves[i].Driver = mv.Driver
		n.Moves[i].Beat++
		n.Moves[i].AbortWanted = n.Moves[i].AbortWanted || mv.AbortWanted
		return n, Result{Kind: ResInt, Int: int64(n.Moves[i].Beat)}, nil
	case KindMapMoveDone, KindMapMoveAbort:
		if i < 0 {
			return nil, epoch, nil // done (or aborted) already: a retry
		}
		cur := m.Moves[i]
		if cur.AbortWanted && mv.Driver == "" {
			// A marked move is ended only by the driver that holds it
			// (its ends name it): a forward driver the abort displaced
			// does not end it.
			return nil, Result{}, errMap("the move at epoch %d is marked to be rolled back and held by %q (beat %d): only its holder ends it", mv.Epoch, cur.Driver, cur.Beat)
		}
		if mv.Driver != "" && (cur.Driver != mv.Driver || cur.Beat != mv.Beat) {
			// Compare-and-set on the lease: a driver displaced after its
			// last renewal does not end a move another driver holds.
			return nil, Result{}, errMap("the move at epoch %d is at beat %d (driver %q), not %d (driver %q): its lease was taken", mv.Epoch, cur.Beat, cur.Driver, mv.Beat, mv.Driver)
		}
		n := m.clone()
		done := n.Moves[i]
		n.Moves = slices.Delete(n.Moves, i, i+1)
		if op.Kind == KindMapMoveDone {
			in := func(s uint16) bool { return InSlotRanges(s, done.Slots) }
			for gi := range n.Groups {
				g := &n.Groups[gi]
				var own []uint16
				for _, r := range g.Slots {
					for s := int(r.Start); s <= int(r.End); s++ {
						if g.ID == done.To || !in(uint16(s)) {
							own = append(own, uint16(s))
						}
					}
				}
				if g.ID == done.To {
					for _, r := range done.Slots {
						for s := int(r.Start); s <= int(r.End); s++ {
							own = append(own, uint16(s))
						}
					}
				}
				g.Slots = rangesOf(own)
			}
		}
		if op.Kind == KindMapMoveDone {
			// A change of owners raises the epoch above every epoch the
			// map had (a poller adopts only a newer one). The move's epoch
			// is above the map's, since nothing raises the map's while a
			// move is in flight; n.Epoch+1 covers a map an add-node took
			// to the move's epoch before that rule (one written by an
			// older version), which would otherwise keep its epoch.
			n.Epoch = max(n.Epoch+1, done.Epoch)
		} else {
			n.Epoch = max(n.Epoch, done.Epoch)
		}
		return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
	}
	return nil, Result{}, fmt.Errorf("%w: %s", ErrInvalidOp, op.Kind)
}

// setMembers is KindMapSetMembers's step: the members the group's VR
// reconfiguration committed, compare-and-set by its epoch. Why by the VR
// epoch: the recorder (kefir cluster replace-node) learns the members and
// epoch from the group's leader and may be retried or race another
// recorder; an older epoch's list must never overwrite a newer one.
func setMembers(m *ClusterMap, op *Op) (*ClusterMap, Result, error) {
	mm, err := DecodeMapMembers(op.Key)
	if err != nil {
		return nil, Result{}, err
	}
	var g *MapGroup
	if mm.Group == MetaGroup {
		// The metadata group's own members, kept apart from the data
		// groups (it owns no slots).
		g = &MapGroup{ID: MetaGroup, Members: m.MetaMembers(), MemberEpoch: m.MetaEpoch}
	} else if g, _ = m.Group(mm.Group); g == nil {
		return nil, Result{}, errMap("no group %d in the map", mm.Group)
	} else if g.IsChain() {
		// A chain's membership is its master's, recorded in the chain's
		// own record (ChainConfigKey); the map keeps its first members.
		return nil, Result{}, errMap("group %d runs the chain engine: its members are its master's, not the map's", mm.Group)
	}
	if err := checkMemberList(m, mm); err != nil {
		return nil, Result{}, err
	}
	cur := g.MemberEpoch // never recorded: 0, the group's first epoch
	sameSet := len(mm.Members) == len(g.Members) && !slices.ContainsFunc(mm.Members, func(id uint64) bool { return !slices.Contains(g.Members, id) })
	switch {
	case mm.Epoch < cur:
		return nil, Result{}, errMap("group %d: members of epoch %d, but the map has epoch %d's", mm.Group, mm.Epoch, cur)
	case mm.Epoch == cur && sameSet:
		return nil, Result{Kind: ResInt, Int: int64(m.Epoch)}, nil // a retry
	case mm.Epoch == cur:
		return nil, Result{}, errMap("group %d: epoch %d's members are %v, not %v", mm.Group, cur, g.Members, mm.Members)
	}
	n := m.clone()
	if mm.Group == MetaGroup {
		n.Meta, n.MetaEpoch = slices.Clone(mm.Members), mm.Epoch
	} else {
		ng, _ := n.Group(mm.Group)
		ng.Members, ng.MemberEpoch = slices.Clone(mm.Members), mm.Epoch
	}
	// As AddNode: the epoch moves so pollers adopt the map, but not while
	// a move is in flight (its MoveDone raises it).
	if len(n.Moves) == 0 {
		n.Epoch++
	}
	return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
}

// addGroup is KindMapAddGroup's step: a new data group with no slots. The
// record is what its members bootstrap from (server: a member the map names
// in a group at member epoch 0 that it hosts no replica of and never had a
// directory for starts the group's first view from this list), so the list
// must be one VR can run and must never change under the same id: a
// different list at an existing id is refused, not overwritten.
func addGroup(m *ClusterMap, op *Op) (*ClusterMap, Result, error) {
	ag, err := DecodeMapAddGroup(op.Key)
	if err != nil {
		return nil, Result{}, err
	}
	mm := ag.MapMembers
	if mm.Group == 0 || mm.Group >= MetaGroup || mm.Epoch != 0 {
		// Data groups' ids are below the metadata group's reserved one
		// (a result and a token name a group in 32 bits; the ids of
		// kefir up and --groups are small).
		return nil, Result{}, errMap("group id %d (epoch %d): a new group needs an id from 1 to %d and epoch 0", mm.Group, mm.Epoch, MetaGroup-1)
	}
	// A chain runs with any number of members (a chain of two runs); the
	// rest of the list's rules are VR's.
	if err := checkList(m, mm, ag.Engine != EngineChain); err != nil {
		return nil, Result{}, err
	}
	if slices.Contains(m.Removed, mm.Group) {
		// Its former members keep a tombstone under this id (they never
		// rejoin a group they retired from): a new group needs a new id.
		return nil, Result{}, errMap("group %d was removed from the map: a new group needs another id", mm.Group)
	}
	if g, ok := m.Group(mm.Group); ok {
		if g.MemberEpoch == 0 && slices.Equal(g.Members, mm.Members) && g.Engine == ag.Engine {
			return nil, Result{Kind: ResInt, Int: int64(m.Epoch)}, nil // a retry
		}
		return nil, Result{}, errMap("group %d is in the map already (members %v at epoch %d, engine %q)", mm.Group, g.Members, g.MemberEpoch, g.engineName())
	}
	n := m.clone()
	n.Groups = append(n.Groups, MapGroup{ID: mm.Group, Members: slices.Clone(mm.Members), Engine: ag.Engine})
	slices.SortFunc(n.Groups, func(a, b MapGroup) int { return cmp.Compare(a.ID, b.ID) })
	// As AddNode: the epoch moves so pollers learn the group, but not
	// while a move is in flight (its MoveDone raises it).
	if len(n.Moves) == 0 {
		n.Epoch++
	}
	return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
}

// removeGroup is KindMapRemoveGroup's step: a data group that owns no
// slots leaves the map. Why the map must be empty of it first: every slot
// has one owner in every map (Check), so the group's slots are moved away
// by ordinary moves (kefir cluster remove-group drives them) before it is
// removed; and a group a move in flight names may still take slots (the
// move's MoveDone) or hold the only copy of some (the move's source until
// its hand-over). Compare-and-set by the map's epoch: the caller checked
// the group against the map it read. Once removed, its id is kept in
// Removed: that is what its members retire by (a node whose map does not
// list a group it hosts may merely lag an add-group), and what keeps the
// id from being given to a new group whose members would find their old
// replica's tombstone.
func removeGroup(m *ClusterMap, op *Op) (*ClusterMap, Result, error) {
	mm, err := DecodeMapMembers(op.Key)
	if err != nil {
		return nil, Result{}, err
	}
	if mm.Group == MetaGroup {
		return nil, Result{}, errMap("group %d is the metadata group: it holds the map and is not removed (its members change by replace-node)", mm.Group)
	}
	if slices.Contains(m.Removed, mm.Group) {
		return nil, Result{Kind: ResInt, Int: int64(m.Epoch)}, nil // a retry
	}
	g, ok := m.Group(mm.Group)
	if !ok || len(mm.Members) != 0 {
		return nil, Result{}, errMap("no group %d in the map", mm.Group)
	}
	if len(m.Groups) == 1 {
		return nil, Result{}, errMap("group %d is the map's last data group: the cluster's slots need one", mm.Group)
	}
	for _, mv := range m.Moves {
		if mv.From == mm.Group || mv.To == mm.Group {
			return nil, Result{}, errMap("a move of slots %v from group %d to group %d at epoch %d is in flight: finish or abort it first", mv.Slots, mv.From, mv.To, mv.Epoch)
		}
	}
	if len(g.Slots) > 0 {
		return nil, Result{}, errMap("group %d owns slots %v: move them to other groups first", mm.Group, g.Slots)
	}
	if mm.Epoch != m.Epoch {
		return nil, Result{}, errMap("the removal of group %d was checked against the map at epoch %d, the map is at %d: "+MapCheckAgain, mm.Group, mm.Epoch, m.Epoch)
	}
	n := m.clone()
	n.Groups = slices.DeleteFunc(n.Groups, func(x MapGroup) bool { return x.ID == mm.Group })
	n.Removed = append(n.Removed, mm.Group)
	slices.Sort(n.Removed)
	// As AddNode: the epoch moves so pollers learn the removal, but not
	// while a move (of other groups) is in flight: its MoveDone raises it.
	if len(n.Moves) == 0 {
		n.Epoch++
	}
	return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
}

// checkMemberList refuses a member list VR could not run: empty or even,
// a member twice, a member that is not a node of the map.
func checkMemberList(m *ClusterMap, mm MapMembers) error { return checkList(m, mm, true) }

// checkList is checkMemberList, the number of members odd only if odd (a
// chain's need not be; never empty).
func checkList(m *ClusterMap, mm MapMembers, odd bool) error {
	if len(mm.Members) == 0 {
		return errMap("group %d: no members", mm.Group)
	}
	if odd && len(mm.Members)%2 == 0 {
		return errMap("group %d: %d members: a VR group has an odd number", mm.Group, len(mm.Members))
	}
	for i, id := range mm.Members {
		if slices.Contains(mm.Members[:i], id) {
			return errMap("group %d: member %d listed twice", mm.Group, id)
		}
		if !slices.ContainsFunc(m.Nodes, func(n MapNode) bool { return n.ID == id }) {
			return errMap("group %d: member %d is not a node of the map (add it first)", mm.Group, id)
		}
	}
	return nil
}

// rangesOf returns slots (any order, no duplicates) as sorted ranges.
func rangesOf(slots []uint16) []SlotRange {
	slices.Sort(slots)
	var out []SlotRange
	for _, s := range slots {
		if n := len(out); n > 0 && out[n-1].End+1 == s {
			out[n-1].End = s
			continue
		}
		out = append(out, SlotRange{s, s})
	}
	return out
}

// clone returns a deep copy of m (ops never change a decoded map in place).
func (m *ClusterMap) clone() *ClusterMap {
	n := &ClusterMap{Epoch: m.Epoch, Nodes: slices.Clone(m.Nodes), Moves: slices.Clone(m.Moves), Meta: slices.Clone(m.Meta), MetaEpoch: m.MetaEpoch,
		Removed: slices.Clone(m.Removed), RemovedNodes: slices.Clone(m.RemovedNodes)}
	for _, g := range m.Groups {
		n.Groups = append(n.Groups, MapGroup{ID: g.ID, Members: slices.Clone(g.Members), Slots: slices.Clone(g.Slots), MemberEpoch: g.MemberEpoch, Engine: g.Engine,
			Joining: slices.Clone(g.Joining), Leaving: slices.Clone(g.Leaving), Dropped: slices.Clone(g.Dropped)})
	}
	for i := range n.Moves {
		n.Moves[i].Slots = slices.Clone(n.Moves[i].Slots)
	}
	return n
}

// The driver fence. A move recorded in the metadata group is driven under a
// lease whose beat only goes up (KindMapMoveClaim): a driver that takes a
// move over starts above every beat its predecessor held. Each step such a
// driver sends a group (KindSlotSet, KindSlotImport) carries the move's
// epoch and the driver's beat in Op.Expected (AppendDriverFence), and the
// group keeps the highest it has seen (SlotFenceKey): a step with a lower
// beat at the same epoch — a displaced driver's command that was still in
// flight when the move was taken over — is refused and changes nothing.
// Steps without a fence (a move not recorded, --record=false) are not
// checked.

// SlotFenceKey is the reserved record of a group's driver fence: the epoch
// and beat of the newest driver that sent it a step.
var SlotFenceKey = ReservedKey("slotfence")

// AppendDriverFence is the Op.Expected of a step of the move at epoch sent
// by a driver at beat.
func AppendDriverFence(b []byte, epoch, beat uint64) []byte {
	b = binary.AppendUvarint(b, epoch)
	return binary.AppendUvarint(b, beat)
}

func decodeDriverFence(b []byte) (epoch, beat uint64, err error) {
	d := Decoder{B: b}
	epoch, beat = d.Uvarint(), d.Uvarint()
	if d.Err != nil || len(d.B) != 0 {
		return 0, 0, fmt.Errorf("%w: driver fence", ErrCorrupt)
	}
	return epoch, beat, nil
}

// checkDriverFence refuses a fenced step older than the group's fence, and
// raises the fence to a newer one (even for a step that changes nothing
// else: a new driver's first step fences the group against its
// predecessor's).
// raised reports whether it wrote the fence.
func checkDriverFence(get Getter, op *Op, emit Emit) (raised bool, err error) {
	if len(op.Expected) == 0 || (op.Kind != KindSlotSet && op.Kind != KindSlotImport) {
		return false, nil
	}
	epoch, beat, err := decodeDriverFence(op.Expected)
	if err != nil {
		return false, err
	}
	data, _, _, ok, err := get(SlotFenceKey)
	if err != nil {
		return false, err
	}
	if ok {
		fe, fb, err := decodeDriverFence(data)
		if err != nil {
			return false, err
		}
		if epoch < fe || (epoch == fe && beat < fb) {
			return false, fmt.Errorf("%w: a step of the move at epoch %d by a driver at beat %d, and a driver at epoch %d beat %d took over: this driver was displaced",
				ErrSlotTransition, epoch, beat, fe, fb)
		}
		if epoch == fe && beat == fb {
			return false, nil
		}
	}
	put(emit, SlotFenceKey, AppendDriverFence(nil, epoch, beat), nil)
	return true, nil
}

// dropIDs is ids without those of out, nil if none is left (a map's
// lists are nil when empty: an encoding's round trip keeps it so).
func dropIDs(ids, out []uint64) []uint64 {
	ids = slices.DeleteFunc(slices.Clone(ids), func(id uint64) bool { return slices.Contains(out, id) })
	if len(ids) == 0 {
		return nil
	}
	return ids
}
