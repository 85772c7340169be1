package cluster

import (
	"crypto/sha1" //nolint:gosec // a node name, not a security boundary
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
)

// The slot map (issue 28, first part): which replica group owns each of the
// 16384 slots, at an epoch. Today the map is static — given to every node in
// its configuration (kefir server --groups; kefir up --groups G computes it)
// and never changed while the cluster runs, at epoch 1. The metadata group of
// issue 28 will hold it instead and raise the epoch on every move; everything
// that routes reads it through a *SlotMap, so that group replaces where the
// map comes from, not the front door (docs/design/slot-map.md).

// SlotRange is an inclusive range of slots, as CLUSTER SLOTS reports it.
type SlotRange struct{ Start, End uint16 }

// GroupSpec is one replica group of a multi-group cluster: its id, its
// members (node ids, in leader order: the first is the group's initial
// leader) and the slot ranges it owns.
type GroupSpec struct {
	ID      GroupID
	Members []uint64
	Slots   []SlotRange
	// Engine is the group's replication engine as the map records it
	// (kv.EngineVR, kv.EngineChain; kefir server --chain-groups).
	Engine string
}

// SlotMap maps every slot to the group that owns it, at an epoch.
type SlotMap struct {
	Epoch  uint64
	Groups []GroupSpec // by id, ascending
	owner  [Slots]GroupID
}

// NewSlotMap checks groups (positive distinct ids, at least one member each,
// ranges inside 0..16383 that cover every slot exactly once) and returns
// their map at epoch.
func NewSlotMap(epoch uint64, groups []GroupSpec) (*SlotMap, error) {
	if len(groups) == 0 {
		return nil, errors.New("slot map: no groups")
	}
	m := &SlotMap{Epoch: epoch, Groups: slices.Clone(groups)}
	slices.SortFunc(m.Groups, func(a, b GroupSpec) int { return int(a.ID) - int(b.ID) })
	for i, g := range m.Groups {
		if g.ID == 0 {
			return nil, errors.New("slot map: group id 0 (ids are positive)")
		}
		if g.ID > math.MaxUint32 {
			// A result and a session token name a group in 32 bits
			// (kv.Result.Group, shard.GroupPos).
			return nil, fmt.Errorf("slot map: group id %d is above %d", g.ID, uint32(math.MaxUint32))
		}
		if i > 0 && m.Groups[i-1].ID == g.ID {
			return nil, fmt.Errorf("slot map: group %d listed twice", g.ID)
		}
		if len(g.Members) == 0 {
			return nil, fmt.Errorf("slot map: group %d has no members", g.ID)
		}
		for _, r := range g.Slots {
			if r.Start > r.End || r.End >= Slots {
				return nil, fmt.Errorf("slot map: group %d: bad slot range %d-%d (slots are 0-%d)", g.ID, r.Start, r.End, Slots-1)
			}
			for s := int(r.Start); s <= int(r.End); s++ {
				if o := m.owner[s]; o != 0 {
					return nil, fmt.Errorf("slot map: slot %d is in group %d and group %d", s, o, g.ID)
				}
				m.owner[s] = g.ID
			}
		}
	}
	for s, o := range m.owner {
		if o == 0 {
			return nil, fmt.Errorf("slot map: slot %d belongs to no group (every slot needs an owner)", s)
		}
	}
	return m, nil
}

// Owner returns the group that owns slot.
func (m *SlotMap) Owner(slot uint16) GroupID { return m.owner[slot&(Slots-1)] }

// Group returns the spec of group id.
func (m *SlotMap) Group(id GroupID) (GroupSpec, bool) {
	for _, g := range m.Groups {
		if g.ID == id {
			return g, true
		}
	}
	return GroupSpec{}, false
}

// Owns reports whether group id owns slot.
func (m *SlotMap) Owns(id GroupID, slot uint16) bool { return m.Owner(slot) == id }

// EvenGroups splits the slots into n contiguous ranges, one per group, as
// Redis Cluster's `redis-cli --cluster create` splits them among masters, and
// places the groups over nodes (ids 1..len) overlapping: group g's members
// start at node g and go round, so with as many groups as nodes each node
// leads one group at first and follows the others (FAWN-KV's chains).
func EvenGroups(n int, nodes []uint64, replicas int) []GroupSpec {
	gs := make([]GroupSpec, n)
	// redis-cli's split (clusterManagerCommandCreate): a float cursor,
	// rounded, so 3 groups get 0-5460, 5461-10922, 10923-16383 as there.
	per := float64(Slots) / float64(n)
	cursor, first := 0.0, 0
	for g := range n {
		last := int(math.Round(cursor + per - 1))
		if last > Slots-1 || g == n-1 {
			last = Slots - 1
		}
		last = max(last, first)
		start, end := first, last
		first, cursor = last+1, cursor+per
		var ms []uint64
		for r := range min(replicas, len(nodes)) {
			ms = append(ms, nodes[(g+r)%len(nodes)])
		}
		gs[g] = GroupSpec{ID: GroupID(g + 1), Members: ms, Slots: []SlotRange{{uint16(start), uint16(end)}}}
	}
	return gs
}

// ParseGroups parses kefir server's --groups:
//
//	ID=MEMBER,MEMBER,...:START-END[+START-END...];ID=...
//
// members are node ids of --members in leader order, e.g.
// "1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383". Empty: nil. A
// group with nothing after the colon owns no slots (FormatGroups writes a
// map's empty group so).
func ParseGroups(s string) ([]GroupSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var gs []GroupSpec
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		idStr, rest, ok := strings.Cut(part, "=")
		members, slots, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 {
			return nil, fmt.Errorf("group %q: want ID=MEMBER,MEMBER,...:START-END[+START-END...]", part)
		}
		id, err := strconv.ParseUint(idStr, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("group %q: the id must be a positive integer", part)
		}
		g := GroupSpec{ID: GroupID(id)}
		for _, m := range strings.Split(members, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(m), 10, 64)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("group %q: member %q is not a node id", part, m)
			}
			g.Members = append(g.Members, n)
		}
		for _, r := range strings.Split(slots, "+") {
			if strings.TrimSpace(slots) == "" {
				// A group that owns no slots (kefir cluster add-group's
				// before its first move, or one moves emptied): "ID=M,...:".
				break
			}
			a, b, ok := strings.Cut(strings.TrimSpace(r), "-")
			if !ok {
				b = a
			}
			lo, err1 := strconv.ParseUint(a, 10, 16)
			hi, err2 := strconv.ParseUint(b, 10, 16)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("group %q: slot range %q: want START-END", part, r)
			}
			g.Slots = append(g.Slots, SlotRange{uint16(lo), uint16(hi)})
		}
		gs = append(gs, g)
	}
	return gs, nil
}

// FormatGroups is ParseGroups' inverse.
func FormatGroups(gs []GroupSpec) string {
	var b strings.Builder
	for i, g := range gs {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, "%d=", g.ID)
		for j, m := range g.Members {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(m, 10))
		}
		b.WriteByte(':')
		for j, r := range g.Slots {
			if j > 0 {
				b.WriteByte('+')
			}
			fmt.Fprintf(&b, "%d-%d", r.Start, r.End)
		}
	}
	return b.String()
}

// NodeName is the 40-hex-digit name CLUSTER MYID, NODES, SLOTS and SHARDS
// give node id of cluster: Redis Cluster clients key their node tables by
// such names, and the same node must get the same one from every member.
func NodeName(cluster, node uint64) string {
	h := sha1.Sum([]byte(fmt.Sprintf("kefir cluster %d node %d", cluster, node))) //nolint:gosec // a name
	return hex.EncodeToString(h[:])
}

// GroupClusterID is the replication cluster id group g of a multi-group
// cluster runs under: distinct per group, so that a message delivered to
// the wrong group's replica is refused by its core, while the nodes'
// transport handshake checks the cluster's own id.
func GroupClusterID(cluster uint64, g GroupID) uint64 { return cluster + uint64(g)<<40 }

// ParseSlotRanges parses START-END[,START-END...] (a lone slot: START).
func ParseSlotRanges(s string) ([]kv.SlotRange, error) {
	var rs []kv.SlotRange
	for _, part := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(part), "-")
		if !ok {
			b = a
		}
		lo, err1 := strconv.ParseUint(a, 10, 16)
		hi, err2 := strconv.ParseUint(b, 10, 16)
		if err1 != nil || err2 != nil || lo > hi || hi >= Slots {
			return nil, fmt.Errorf("slot range %q: want START-END within 0-%d", part, Slots-1)
		}
		rs = append(rs, kv.SlotRange{Start: uint16(lo), End: uint16(hi)})
	}
	return rs, nil
}

// FormatSlotRanges is ParseSlotRanges' inverse.
func FormatSlotRanges(rs []kv.SlotRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d-%d", r.Start, r.End)
	}
	return strings.Join(parts, ",")
}

// InRanges reports, for a slot, whether it is in rs.
func InRanges(rs []kv.SlotRange) func(uint16) bool {
	return func(s uint16) bool { return kv.InSlotRanges(s, rs) }
}
