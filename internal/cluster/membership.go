package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
)

// A single VR group's membership as a node and the operator's commands see
// it (docs/design/cluster.md §7, "The node wiring"; docs/cluster.md,
// "Replacing a failed node"). The engine reconfigures (vrshard); this file
// is the contract the front door speaks, and the client side of
// KEFIR.GROUP, which kefir cluster replace-node/remove-node and a joining
// node (kefir server --join) send.

// Membership is a group's configuration: its epoch, members in leader order
// (the first leads the epoch's first view), the op that started the epoch
// (0: the group's first epoch) and the members of the epoch before.
type Membership struct {
	Epoch    uint64
	Members  []uint64
	Start    uint64
	Previous []uint64
}

// Reconfigurable is a hosted group that changes its members (a VR replica;
// Hosted.Group implements it when the engine does).
type Reconfigurable interface {
	// Reconfigure asks the group, at its leader, to move from
	// configuration epoch (AnyEpoch: whatever it is) to members and
	// returns the new configuration once this replica's record of it is
	// durable. A *NotLeaderError-like error (errors.Is ErrNotLeader)
	// names the leader; a group no longer at epoch refuses with an error
	// errors.As finds an *EpochMovedError-like one in (the engine's:
	// vr.EpochMovedError), checked where the request is ordered.
	Reconfigure(ctx context.Context, epoch uint64, members []uint64) (Membership, error)
	// Membership is the replica's durable configuration.
	Membership() Membership
	// SetAddrs teaches the replica its group's members' addresses: peer
	// addresses it has not got are added to its transport, client
	// addresses name the leader in its redirects.
	SetAddrs(ms []Member) error
}

// AnyEpoch as Reconfigurable.Reconfigure's epoch: the request is not tied
// to the configuration it was planned against (KEFIR.GROUP RECONFIG
// without EPOCH, an older caller's). Equal to vr.AnyEpoch.
const AnyEpoch = ^uint64(0)

// EpochMovedError refuses KEFIR.GROUP RECONFIG ... EPOCH Expected: the
// group (Group; 0: a single group's) is at configuration Epoch, Members —
// another change (the repairer's, another operator's) came between reading
// the configuration and asking for the change, and the request, planned
// against the older member list, would undo it. Its text is the RESP error
// the node answers with (-EPOCHMOVED ...); the client reads it back
// (ParseEpochMoved), so errors.As finds it on both sides.
type EpochMovedError struct {
	Group           GroupID
	Expected, Epoch uint64
	Members         []uint64
	// Pending: the change to Epoch is ordered from Expected, not committed
	// yet (vr.EpochMovedError.Pending): the group is still at Expected,
	// and may stay there if the change is lost in a view change. The text
	// keeps the prefix an older client parses ("is at epoch"), and says
	// so after it.
	Pending bool
}

// epochPending is what the text of a Pending refusal says after the part
// ParseEpochMoved reads.
const epochPending = "another change is ordered and not committed yet (it may still be lost in a view change)"

func (e *EpochMovedError) Error() string {
	ms := make([]string, len(e.Members))
	for i, id := range e.Members {
		ms[i] = strconv.FormatUint(id, 10)
	}
	if e.Pending {
		return fmt.Sprintf("EPOCHMOVED group %d is at epoch %d, members %s, not at epoch %d: %s; read its configuration again (KEFIR.GROUP CONFIG) once it commits and plan the change against it",
			e.Group, e.Epoch, strings.Join(ms, ","), e.Expected, epochPending)
	}
	return fmt.Sprintf("EPOCHMOVED group %d is at epoch %d, members %s, not at epoch %d: another change came first; read its configuration again (KEFIR.GROUP CONFIG) and plan the change against it",
		e.Group, e.Epoch, strings.Join(ms, ","), e.Expected)
}

// ParseEpochMoved reads an EpochMovedError back from its RESP text (ok
// false: msg is another error).
func ParseEpochMoved(msg string) (*EpochMovedError, bool) {
	var e EpochMovedError
	var ms string
	if _, err := fmt.Sscanf(msg, "EPOCHMOVED group %d is at epoch %d, members %s not at epoch %d:", &e.Group, &e.Epoch, &ms, &e.Expected); err != nil {
		return nil, false
	}
	for _, f := range strings.Split(strings.TrimSuffix(ms, ","), ",") {
		id, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, false
		}
		e.Members = append(e.Members, id)
	}
	e.Pending = strings.Contains(msg, epochPending)
	return &e, true
}

// epochMoved is err as an *EpochMovedError when its text is one (a
// Mover's error carries the node's reply text), else err.
func epochMoved(err error) error {
	if e, ok := ParseEpochMoved(err.Error()); ok {
		return e
	}
	return err
}

// ErrNotReconfigurable: the node's group does not change its members this
// way (a single node, a chain, a node of several groups).
var ErrNotReconfigurable = errors.New("cluster: this node's group cannot be reconfigured (a VR group only)")

// GroupConfig is a group's configuration with its members' addresses, as
// KEFIR.GROUP CONFIG answers it.
type GroupConfig struct {
	Cluster uint64
	Membership
	// Addrs are the members' (and any other known node's) addresses.
	Addrs []Member
	// Leader is the leader the answering node knows (0: none).
	Leader uint64
}

// Addr returns id's addresses in c.
func (c GroupConfig) Addr(id uint64) (Member, bool) {
	i := slices.IndexFunc(c.Addrs, func(m Member) bool { return m.ID == id })
	if i < 0 {
		return Member{}, false
	}
	return c.Addrs[i], true
}

// FormatMember is ID@PEER/CLIENT (ID alone when no address is known).
func FormatMember(m Member) string {
	if m.PeerAddr == "" && m.ClientAddr == "" {
		return strconv.FormatUint(m.ID, 10)
	}
	return fmt.Sprintf("%d@%s/%s", m.ID, m.PeerAddr, m.ClientAddr)
}

// ParseMember parses ID or ID@PEER/CLIENT.
func ParseMember(s string) (Member, error) {
	s = strings.TrimSpace(s)
	idStr, addrs, hasAddrs := strings.Cut(s, "@")
	id, err := strconv.ParseUint(idStr, 10, 64)
	if err != nil || id == 0 {
		return Member{}, fmt.Errorf("member %q: the id must be a positive integer", s)
	}
	if !hasAddrs {
		return Member{ID: id}, nil
	}
	peer, client, ok := strings.Cut(addrs, "/")
	if !ok || peer == "" || client == "" {
		return Member{}, fmt.Errorf("member %q: want ID@PEER-ADDR/CLIENT-ADDR", s)
	}
	return Member{ID: id, PeerAddr: peer, ClientAddr: client}, nil
}

// String is the configuration in one line, as kefir cluster prints it.
func (c GroupConfig) String() string {
	ms := make([]string, len(c.Members))
	for i, id := range c.Members {
		m, ok := c.Addr(id)
		if !ok {
			m = Member{ID: id}
		}
		ms[i] = FormatMember(m)
	}
	return fmt.Sprintf("epoch %d, members %s", c.Epoch, strings.Join(ms, ","))
}

// GroupConfig asks the group (any seed; a member answers with its own
// durable configuration) for its configuration.
func (mv *Mover) GroupConfig(ctx context.Context) (GroupConfig, error) {
	v, err := mv.do(ctx, "KEFIR.GROUP", "CONFIG")
	if err != nil {
		return GroupConfig{}, fmt.Errorf("group configuration: %w", err)
	}
	return DecodeGroupConfig(v)
}

// GroupConfigOf asks for data group g's configuration in a cluster of
// several groups (KEFIR.GROUP CONFIG GROUP g: a node that hosts g answers
// with its replica's; another sends the asker on to one that does).
func (mv *Mover) GroupConfigOf(ctx context.Context, g GroupID) (GroupConfig, error) {
	v, err := mv.do(ctx, "KEFIR.GROUP", "CONFIG", "GROUP", strconv.FormatUint(uint64(g), 10))
	if err != nil {
		return GroupConfig{}, fmt.Errorf("group %d's configuration: %w", g, err)
	}
	return DecodeGroupConfig(v)
}

// ReconfigureGroup asks data group g's leader (following redirects) to
// move from configuration epoch — the one members were planned against —
// to members, nodes of the cluster map (KEFIR.GROUP RECONFIG GROUP g EPOCH
// epoch id...), and returns the new configuration. A group that moved on
// meanwhile refuses: the error holds an *EpochMovedError (errors.As).
func (mv *Mover) ReconfigureGroup(ctx context.Context, g GroupID, epoch uint64, members []uint64) (GroupConfig, error) {
	args := []string{"KEFIR.GROUP", "RECONFIG", "GROUP", strconv.FormatUint(uint64(g), 10), "EPOCH", strconv.FormatUint(epoch, 10)}
	for _, id := range members {
		args = append(args, strconv.FormatUint(id, 10))
	}
	v, err := mv.do(ctx, args...)
	if err != nil {
		return GroupConfig{}, fmt.Errorf("reconfigure group %d: %w", g, epochMoved(err))
	}
	return DecodeGroupConfig(v)
}

// GroupProgress is a group's leader's account of its members (KEFIR.GROUP
// PROGRESS): the epoch, the op it started at, the commit op, and each
// follower's persisted op as of the leader's last tick.
type GroupProgress struct {
	Epoch, Start, Commit uint64
	Persisted            map[uint64]uint64
}

// GroupProgress asks group g's leader (any seed; -MOVED followed).
func (mv *Mover) GroupProgress(ctx context.Context, g GroupID) (GroupProgress, error) {
	v, err := mv.do(ctx, "KEFIR.GROUP", "PROGRESS", "GROUP", strconv.FormatUint(uint64(g), 10))
	if err != nil {
		return GroupProgress{}, fmt.Errorf("group %d's progress: %w", g, err)
	}
	e := v.Elems
	if v.Kind != resp.Array || len(e) != 4 || e[3].Kind != resp.Array {
		return GroupProgress{}, fmt.Errorf("group %d's progress: unexpected reply", g)
	}
	p := GroupProgress{Epoch: uint64(e[0].Int), Start: uint64(e[1].Int), Commit: uint64(e[2].Int), Persisted: map[uint64]uint64{}}
	for _, f := range e[3].Elems {
		if f.Kind == resp.Array && len(f.Elems) == 3 {
			p.Persisted[uint64(f.Elems[0].Int)] = uint64(f.Elems[1].Int)
		}
	}
	return p, nil
}

// CaughtUpWait is how long a membership command waits by default for the
// members the group's last change added to catch up before changing it
// again (kefir cluster ... --catch-up-wait).
const CaughtUpWait = 30 * time.Second

// WaitCaughtUp waits until every member of group g that its current epoch
// added (members not in previous), other than those in skip (leaving now),
// has persisted the group's log up to the op the epoch started at — it has
// pulled the group's state and takes part — or returns an error saying
// which has not, after wait. Changing a group again while such a
// member is still catching up can leave the new epoch without a working
// majority (two replacements in a row of a group of three: one new member
// still pulling, the next not started); a leader that does not know the
// subcommand (an older node) is not waited for. logf reports the wait.
func (mv *Mover) WaitCaughtUp(ctx context.Context, g GroupID, members, previous, skip []uint64, wait time.Duration, logf func(format string, args ...any)) error {
	var added []uint64
	for _, id := range members {
		if !slices.Contains(previous, id) && !slices.Contains(skip, id) {
			added = append(added, id)
		}
	}
	if len(previous) == 0 || len(added) == 0 {
		return nil // the group's first epoch, or nothing new in it
	}
	// On the Mover's clock (the simulation's, under it: a wait on the
	// real clock would tie a simulated run to how fast the box runs it).
	deadline := mv.clock().Now().Add(wait)
	logged := false
	for {
		p, err := mv.GroupProgress(ctx, g)
		if err != nil && strings.Contains(err.Error(), "unknown subcommand") {
			return nil
		}
		var behind []string
		if err == nil {
			// The leader lists every other member of its epoch: the one
			// member it does not list is itself, which may be one the
			// change added (view v is led by members[v mod n]) and has
			// caught up, as it leads.
			leaderAdded := len(p.Persisted) == len(members)-1
			for _, id := range added {
				got, ok := p.Persisted[id]
				if !ok && leaderAdded {
					leaderAdded = false
					continue
				}
				if !ok || got < p.Start {
					behind = append(behind, fmt.Sprintf("node %d (persisted op %d of the epoch's start %d)", id, got, p.Start))
				}
			}
			if len(behind) == 0 {
				return nil
			}
		}
		if mv.clock().Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("group %d: cannot tell whether its new members caught up: %w", g, err)
			}
			return fmt.Errorf("group %d's new members have not caught up with it after %v: %s — changing the group again now could leave it without a working majority; rerun once they have (or pass --force)", g, wait, strings.Join(behind, ", "))
		}
		if !logged && logf != nil && len(behind) > 0 {
			logf("group %d: waiting for %s to catch up before changing it again", g, strings.Join(behind, ", "))
			logged = true
		}
		_ = mv.clock().Sleep(ctx, 100*time.Millisecond) // ctx's end is seen above
	}
}

// SetMembers records group g's members of VR epoch epoch in the metadata
// group's map (KEFIR.SLOTS META SETMEMBERS, kv.KindMapSetMembers) and
// returns the map's epoch.
func (mv *Mover) SetMembers(ctx context.Context, g GroupID, epoch uint64, members []uint64) (uint64, error) {
	args := []string{"KEFIR.SLOTS", "META", "SETMEMBERS", strconv.FormatUint(uint64(g), 10), strconv.FormatUint(epoch, 10)}
	for _, id := range members {
		args = append(args, strconv.FormatUint(id, 10))
	}
	v, err := mv.do(ctx, args...)
	if err != nil {
		return 0, fmt.Errorf("record group %d's members in the map: %w", g, err)
	}
	return uint64(v.Int), nil
}

// ChainWant records in the metadata group's map that chain group ch.Group
// is to join ch.Join and leave ch.Leave (KEFIR.SLOTS META CHAINWANT,
// kv.KindMapChainWant), planned against the map at epoch, and returns the
// map's epoch after it. The chain's master carries it out.
func (mv *Mover) ChainWant(ctx context.Context, ch GroupChange, epoch uint64) (uint64, error) {
	args := []string{"KEFIR.SLOTS", "META", "CHAINWANT", strconv.FormatUint(uint64(ch.Group), 10), strconv.FormatUint(epoch, 10)}
	if len(ch.Join) > 0 {
		args = append(args, "JOIN")
		for _, id := range ch.Join {
			args = append(args, strconv.FormatUint(id, 10))
		}
	}
	if len(ch.Leave) > 0 {
		args = append(args, "LEAVE")
		for _, id := range ch.Leave {
			args = append(args, strconv.FormatUint(id, 10))
		}
	}
	v, err := mv.do(ctx, args...)
	if err != nil {
		return 0, fmt.Errorf("record chain group %d's change in the map: %w", ch.Group, err)
	}
	return uint64(v.Int), nil
}

// Reconfigure asks the group's leader (following redirects) to move from
// configuration epoch (the one members were planned against) to members
// (ID, or ID@PEER/CLIENT for one the group does not know yet), and returns
// the new configuration; a group that moved on refuses (*EpochMovedError).
func (mv *Mover) Reconfigure(ctx context.Context, epoch uint64, members []Member) (GroupConfig, error) {
	args := []string{"KEFIR.GROUP", "RECONFIG", "EPOCH", strconv.FormatUint(epoch, 10)}
	for _, m := range members {
		args = append(args, FormatMember(m))
	}
	v, err := mv.do(ctx, args...)
	if err != nil {
		return GroupConfig{}, fmt.Errorf("reconfigure: %w", epochMoved(err))
	}
	return DecodeGroupConfig(v)
}

// DecodeGroupConfig decodes KEFIR.GROUP's reply: [cluster-id, epoch,
// epoch-start, [member ...], [previous-id ...], leader, [ID@PEER/CLIENT ...]].
func DecodeGroupConfig(v resp.Value) (GroupConfig, error) {
	bad := func(what string) (GroupConfig, error) {
		return GroupConfig{}, fmt.Errorf("KEFIR.GROUP reply: %s", what)
	}
	if v.Kind != resp.Array || len(v.Elems) != 7 {
		return bad("not a 7-element array")
	}
	a := v.Elems
	for _, i := range []int{0, 1, 2, 5} {
		if a[i].Kind != resp.Int || a[i].Int < 0 {
			return bad(fmt.Sprintf("element %d is not a count", i))
		}
	}
	c := GroupConfig{Cluster: uint64(a[0].Int), Membership: Membership{Epoch: uint64(a[1].Int), Start: uint64(a[2].Int)}, Leader: uint64(a[5].Int)}
	ids := func(x resp.Value) ([]uint64, bool) {
		if x.Kind != resp.Array {
			return nil, false
		}
		out := make([]uint64, 0, len(x.Elems))
		for _, e := range x.Elems {
			if e.Kind != resp.Int || e.Int <= 0 {
				return nil, false
			}
			out = append(out, uint64(e.Int))
		}
		return out, true
	}
	var ok bool
	if c.Members, ok = ids(a[3]); !ok || len(c.Members) == 0 {
		return bad("no member ids")
	}
	if c.Previous, ok = ids(a[4]); !ok {
		return bad("previous members are not ids")
	}
	if a[6].Kind != resp.Array {
		return bad("no addresses")
	}
	for _, e := range a[6].Elems {
		m, err := ParseMember(string(e.Str))
		if err != nil {
			return bad(err.Error())
		}
		c.Addrs = append(c.Addrs, m)
	}
	return c, nil
}

// MemberIDs is the ids of ms, in order.
func MemberIDs(ms []Member) []uint64 {
	ids := make([]uint64, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// SameIDs reports whether a and b hold the same ids, in any order (member
// lists hold each id once).
func SameIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// ReplaceMembers is the member list that replaces old with nw in c (nw at
// old's place), or an error naming what is wrong: old not a member, nw's id
// already one, nw without both addresses.
func ReplaceMembers(c GroupConfig, old uint64, nw Member) ([]Member, error) {
	if !slices.Contains(c.Members, old) {
		return nil, fmt.Errorf("node %d is not a member of the group (%s)", old, c)
	}
	if slices.Contains(c.Members, nw.ID) {
		return nil, fmt.Errorf("node %d is already a member of the group (%s)", nw.ID, c)
	}
	if nw.PeerAddr == "" || nw.ClientAddr == "" {
		return nil, fmt.Errorf("the new node %d needs its addresses: ID@PEER-ADDR/CLIENT-ADDR", nw.ID)
	}
	out := make([]Member, len(c.Members))
	for i, id := range c.Members {
		out[i] = Member{ID: id}
		if id == old {
			out[i] = nw
		}
	}
	return out, nil
}

// RemoveMembers is the member list without ids, or an error: an id that is
// not a member, or a remaining list that is empty or even (a VR group needs
// 2f+1 members).
func RemoveMembers(c GroupConfig, ids []uint64) ([]Member, error) {
	var out []Member
	for _, id := range ids {
		if !slices.Contains(c.Members, id) {
			return nil, fmt.Errorf("node %d is not a member of the group (%s)", id, c)
		}
	}
	for _, id := range c.Members {
		if !slices.Contains(ids, id) {
			out = append(out, Member{ID: id})
		}
	}
	if len(out) == 0 || len(out)%2 == 0 {
		return nil, fmt.Errorf("removing %v would leave %d members; a VR group needs an odd number (2f+1), at least 1", ids, len(out))
	}
	return out, nil
}

// AddMembers is the member list of c grown by news (appended after the
// present members, whose leader order stays), or an error naming what is
// wrong: a new id already a member or named twice, a new member without
// both addresses, or a list that would not be odd (a VR group needs 2f+1:
// grow a group of three by two).
func AddMembers(c GroupConfig, news []Member) ([]Member, error) {
	if len(news) == 0 {
		return nil, errors.New("no member to add")
	}
	out := make([]Member, 0, len(c.Members)+len(news))
	for _, id := range c.Members {
		out = append(out, Member{ID: id})
	}
	for i, m := range news {
		if slices.Contains(c.Members, m.ID) {
			return nil, fmt.Errorf("node %d is already a member of the group (%s)", m.ID, c)
		}
		if slices.ContainsFunc(news[:i], func(o Member) bool { return o.ID == m.ID }) {
			return nil, fmt.Errorf("node %d is named twice", m.ID)
		}
		if m.PeerAddr == "" || m.ClientAddr == "" {
			return nil, fmt.Errorf("the new node %d needs its addresses: ID@PEER-ADDR/CLIENT-ADDR", m.ID)
		}
		out = append(out, m)
	}
	if len(out)%2 == 0 {
		return nil, fmt.Errorf("adding %d member(s) would leave %d members; a VR group needs an odd number (2f+1): add two at a time", len(news), len(out))
	}
	return out, nil
}

// WaitNamed polls the group until its configuration names self and returns
// it (a new node, kefir server --join): every `every`, logging each time
// what it saw, until ctx ends.
func (mv *Mover) WaitNamed(ctx context.Context, self uint64, every time.Duration, logf func(format string, args ...any)) (GroupConfig, error) {
	for {
		c, err := mv.GroupConfig(ctx)
		mv.close()
		switch {
		case err == nil && slices.Contains(c.Members, self):
			return c, nil
		case err == nil:
			logf("the group's configuration does not name this node yet (%s); waiting for kefir cluster replace-node or add-members", c)
		case ctx.Err() == nil:
			logf("asking the group for its configuration: %v", err)
		}
		select {
		case <-ctx.Done():
			return GroupConfig{}, fmt.Errorf("waiting to be named by the group: %w", ctx.Err())
		case <-time.After(every):
		}
	}
}

// GroupChange is one data group's new member list (node ids) in a change of
// a cluster of several groups.
type GroupChange struct {
	Group   GroupID
	Members []uint64
	// Chain: the group is a chain, changed by one wish recorded in the map
	// (Mover.ChainWant, kv.KindMapChainWant) that its master carries out —
	// no reconfiguration, no SETMEMBERS: Join joins the chain, Leave
	// leaves it, and Members is the chain the change leads to (the
	// command waits until the map's list has Join and not Leave).
	Chain       bool
	Join, Leave []uint64
	// Size: a VR growth's target (add-members --replicas), not the nodes
	// it adds: a group grown meanwhile gets only what it lacks
	// (rebaseChange); 0: the change is its nodes.
	Size int
}

// PlanNodeChange returns, for a cluster of several groups whose map is cm,
// the groups to reconfigure to replace node old by nw, in group order (the
// metadata group last, if old is one of its members), or
// an error naming what is wrong before anything changes: old not a node of
// the map, or in no group; nw's id the old one's, a node of the map at
// other addresses, already a member of one of old's groups, or one that
// would change the metadata group's members (MetaMembers: the lowest ids).
// A change already made in some groups (a rerun after a crash) plans the
// rest: groups that no longer have old are left.
func PlanNodeChange(cm *kv.ClusterMap, old uint64, nw Member) ([]GroupChange, error) {
	if !slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == old }) {
		return nil, fmt.Errorf("node %d is not a node of the cluster map (epoch %d)", old, cm.Epoch)
	}
	if nw.ID == old {
		return nil, fmt.Errorf("the new node's id %d is the old one's: a new node takes a new id", nw.ID)
	}
	ids := make([]uint64, 0, len(cm.Nodes)+1)
	known := false
	for _, n := range cm.Nodes {
		ids = append(ids, n.ID)
		if n.ID == nw.ID {
			known = true
			if n.ClientAddr != nw.ClientAddr || n.PeerAddr != nw.PeerAddr {
				return nil, fmt.Errorf("node id %d is already used in the map (at %s, peer %s): give the new node an unused id", nw.ID, n.ClientAddr, n.PeerAddr)
			}
		}
	}
	if !known && !slices.Equal(MetaMembers(ids), MetaMembers(append(ids, nw.ID))) {
		return nil, fmt.Errorf("node id %d is below the metadata group's members %v (the lowest ids host it): give the new node a higher id", nw.ID, MetaMembers(ids))
	}
	var out []GroupChange
	for _, g := range mapGroups(cm) {
		if g.IsChain() {
			// Planned while the map's chain still has old (or remembers it
			// as dropped by failure: Dropped), or still waits for nw to
			// join (a rerun while the master carries it out: a failed old
			// is out of the record already).
			if ch, ok := planChain(g, []uint64{nw.ID}, []uint64{old}); ok {
				if slices.Contains(g.Leaving, nw.ID) {
					// Its member there retired on disk, and its node never
					// reopens it: the change would wait for ever, the
					// chain kept one longer meanwhile (review30b).
					return nil, fmt.Errorf("node %d left chain group %d (its member there retired): it cannot take node %d's place in it; give the new node an unused id", nw.ID, g.ID, old)
				}
				out = append(out, ch)
			}
			continue
		}
		if !slices.Contains(g.Members, old) {
			continue
		}
		if slices.Contains(g.Members, nw.ID) {
			return nil, fmt.Errorf("node %d is already a member of group %d (members %v) with node %d: it cannot take node %d's place there", nw.ID, g.ID, g.Members, old, old)
		}
		ms := slices.Clone(g.Members)
		ms[slices.Index(ms, old)] = nw.ID
		out = append(out, GroupChange{Group: GroupID(g.ID), Members: ms})
	}
	if len(out) == 0 && !slices.ContainsFunc(cm.Groups, func(g kv.MapGroup) bool { return slices.Contains(g.Members, nw.ID) }) {
		return nil, fmt.Errorf("node %d is a member of no group (map epoch %d): nothing to replace", old, cm.Epoch)
	}
	if !slices.ContainsFunc(cm.Groups, func(g kv.MapGroup) bool {
		return slices.Contains(g.Members, old) || slices.Contains(g.Dropped, old) || slices.Contains(g.Members, nw.ID) || slices.Contains(g.Joining, nw.ID)
	}) {
		// A node starts only as a member of a data group (it must serve
		// some slots' requests); the metadata group alone is not one.
		return nil, fmt.Errorf("node %d is a member of no data group (map epoch %d): only of the metadata group, which a node does not host alone", old, cm.Epoch)
	}
	return out, nil
}

// PlanAddMembers returns, for a cluster of several groups whose map is cm,
// the change that grows group g (a VR data group, the metadata group, or a
// chain group) by the nodes news, appended after its members (their leader
// order stays; a chain's are joined before its tail), and which of news the
// map does not know yet (to record with KEFIR.SLOTS META ADDNODE first); or
// an error before anything changes: g not a group of the map, a new id
// already a member, named twice, used in the map with other addresses or
// below the metadata group's members (the lowest ids host it), a node new
// to the map without both addresses or added to the metadata group only (a
// node starts only as a member of a data group), a member count that would
// not be odd (a VR group), or a node that left the chain (planChainGrowth).
// A rerun after the group grew but before the map recorded it plans the
// same list: the reconfiguration is then a no-op; one after the map
// recorded it (every one of news a member) plans no members: nothing is
// left to do.
func PlanAddMembers(cm *kv.ClusterMap, g GroupID, news []Member) (GroupChange, []Member, error) {
	var grp kv.MapGroup
	if g == MetaGroupID {
		grp = kv.MapGroup{ID: uint64(MetaGroupID), Members: cm.MetaMembers()}
	} else if mg, ok := cm.Group(uint64(g)); ok {
		grp = *mg
	} else {
		return GroupChange{}, nil, fmt.Errorf("group %d is not a group of the cluster map (epoch %d)", g, cm.Epoch)
	}
	if len(news) == 0 {
		return GroupChange{}, nil, errors.New("no member to add")
	}
	// A chain's node still joining is wanted already: an earlier run's
	// wish under way, which the rerun waits for (planChainGrowth).
	wanted := func(id uint64) bool {
		return slices.Contains(grp.Members, id) || grp.IsChain() && slices.Contains(grp.Joining, id)
	}
	if !slices.ContainsFunc(news, func(m Member) bool { return !wanted(m.ID) }) {
		if grp.IsChain() {
			return planChainGrowth(grp, MemberIDs(news)), nil, nil
		}
		return GroupChange{Group: g}, nil, nil // a rerun after the map recorded it
	}
	ids := make([]uint64, 0, len(cm.Nodes)+len(news))
	for _, n := range cm.Nodes {
		ids = append(ids, n.ID)
	}
	ms := slices.Clone(grp.Members)
	var unknown []Member
	for i, m := range news {
		if slices.ContainsFunc(news[:i], func(o Member) bool { return o.ID == m.ID }) {
			return GroupChange{}, nil, fmt.Errorf("node %d is named twice", m.ID)
		}
		if wanted(m.ID) {
			return GroupChange{}, nil, fmt.Errorf("node %d is already a member of group %d (members %v%s)", m.ID, g, grp.Members, joiningNote(grp))
		}
		if grp.IsChain() && slices.Contains(grp.Leaving, m.ID) {
			// Its member there retired on disk, and its node never reopens
			// it: the join would wait for ever (as PlanNodeChange's).
			return GroupChange{}, nil, fmt.Errorf("node %d left chain group %d (its member there retired): it cannot join it again; give the new node an unused id", m.ID, g)
		}
		j := slices.IndexFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == m.ID })
		switch {
		case j >= 0 && m.PeerAddr != "" && (cm.Nodes[j].ClientAddr != m.ClientAddr || cm.Nodes[j].PeerAddr != m.PeerAddr):
			return GroupChange{}, nil, fmt.Errorf("node id %d is already used in the map (at %s, peer %s): give the new node an unused id, or name the node by its id alone", m.ID, cm.Nodes[j].ClientAddr, cm.Nodes[j].PeerAddr)
		case j < 0 && (m.PeerAddr == "" || m.ClientAddr == ""):
			return GroupChange{}, nil, fmt.Errorf("node %d is not a node of the cluster map (epoch %d): a new node needs its addresses, ID@PEER-ADDR/CLIENT-ADDR", m.ID, cm.Epoch)
		case j < 0:
			if !slices.Equal(MetaMembers(ids), MetaMembers(append(slices.Clone(ids), m.ID))) {
				return GroupChange{}, nil, fmt.Errorf("node id %d is below the metadata group's members %v (the lowest ids host it): give the new node a higher id", m.ID, MetaMembers(ids))
			}
			if g == MetaGroupID {
				return GroupChange{}, nil, fmt.Errorf("node %d is not a node of the cluster map: a node starts only as a member of a data group (add it to one first)", m.ID)
			}
			unknown = append(unknown, m)
		case g == MetaGroupID && !slices.ContainsFunc(cm.Groups, func(dg kv.MapGroup) bool { return slices.Contains(dg.Members, m.ID) }):
			return GroupChange{}, nil, fmt.Errorf("node %d is a member of no data group (map epoch %d): a node hosts the metadata group beside a data group, never alone", m.ID, cm.Epoch)
		}
		ms = append(ms, m.ID)
	}
	if grp.IsChain() {
		// Any length runs (f+1 members survive f failures): no odd rule.
		return planChainGrowth(grp, MemberIDs(news)), unknown, nil
	}
	if len(ms)%2 == 0 {
		return GroupChange{}, nil, fmt.Errorf("adding %d member(s) would leave group %d with %d members (%v); a VR group needs an odd number (2f+1): add two at a time", len(news), g, len(ms), ms)
	}
	return GroupChange{Group: g, Members: ms}, unknown, nil
}

// planChainGrowth is the change that grows chain group g by join: a wish
// with joiners only (KindMapChainWant), which the chain's master carries
// out as any wanted join — the node, seeing itself in the map's Joining,
// opens an empty member and asks; it is joined before the tail, the chain
// kept one longer per joiner (chainmaster's countWant) — and which the
// command waits for (ChainChangeDone). A rerun while the joins run plans
// the wish as it is (a no-op, then the wait); one after every joiner is
// linked in plans nothing (no Members: nothing left to do).
func planChainGrowth(g kv.MapGroup, join []uint64) GroupChange {
	ch, _ := planChain(g, join, nil)
	if len(ch.Join) == 0 {
		return GroupChange{Group: GroupID(g.ID)}
	}
	return ch
}

// joiningNote names chain g's nodes still joining, for an error ("" if
// none).
func joiningNote(g kv.MapGroup) string {
	if len(g.Joining) == 0 {
		return ""
	}
	return fmt.Sprintf("; joining %v", g.Joining)
}

// planChain plans the change of chain group g that removes leave and, in
// their place, joins join (nodes of the map); ok false when g has nothing
// to do with it: none of leave a member (nor a member its master dropped
// by failure: the map's Dropped, whose place a replacement re-creates; nor
// a node still joining, whose join the replacement withdraws) and none of
// join wanted or joining. Without leave it is a growth: every one of join not linked in
// yet joins (planChainGrowth). A change the chain made already in part (a rerun) plans what is
// left: a joiner already a member is not asked again, and a leaving node
// already out of the chain is still named, so that the map keeps it out
// (the wish is then the map's as it is, a no-op).
func planChain(g kv.MapGroup, join, leave []uint64) (GroupChange, bool) {
	in := func(id uint64) bool { return slices.Contains(g.Members, id) }
	// A member's place, the place of one its master dropped by failure
	// (Dropped), or the place a node the map wants in was to take
	// (Joining: it died before it was linked in): a replacement joins a
	// node in any, and the wish's leave withdraws the dead joiner's join
	// (kv.chainWant: Joining loses it, Leaving keeps it out).
	placeOf := func(id uint64) bool {
		return in(id) || slices.Contains(g.Dropped, id) || slices.Contains(g.Joining, id)
	}
	grow := len(leave) == 0
	if !grow && !slices.ContainsFunc(leave, placeOf) && !slices.ContainsFunc(join, func(id uint64) bool { return slices.Contains(g.Joining, id) }) {
		return GroupChange{}, false
	}
	ch := GroupChange{Group: GroupID(g.ID), Chain: true}
	if grow {
		// A growth (add-members): every joiner not linked in yet — not a
		// member, or one still in Joining (its flush under way).
		ch.Join = slices.DeleteFunc(slices.Clone(join), func(id uint64) bool { return in(id) && !slices.Contains(g.Joining, id) })
	} else if slices.ContainsFunc(leave, placeOf) {
		// Joining only in place of a member: a node leaving a chain it is
		// no longer in asks no other to join.
		ch.Join = slices.DeleteFunc(slices.Clone(join), in)
	} else {
		ch.Join = slices.DeleteFunc(slices.Clone(join), func(id uint64) bool { return !slices.Contains(g.Joining, id) })
	}
	ch.Leave = slices.Clone(leave)
	// The master joins a node before the tail (the digest's rule), then
	// fails the leaving ones.
	ch.Members = slices.Clone(g.Members)
	for _, id := range ch.Join {
		if !slices.Contains(ch.Members, id) { // not linked in yet (it may be flushing)
			ch.Members = slices.Insert(ch.Members, max(len(ch.Members)-1, 0), id)
		}
	}
	ch.Members = slices.DeleteFunc(ch.Members, func(id uint64) bool { return slices.Contains(leave, id) })
	return ch, true
}

// ChainChangeDone reports whether map cm's chain group ch.Group has carried
// out ch: every node of ch.Join a member, its join done (no longer in the
// map's Joining: the list has the joiner from the FLUSH on, and a failure
// during the flush aborts the join), and none of ch.Leave.
func ChainChangeDone(cm *kv.ClusterMap, ch GroupChange) bool {
	g, ok := cm.Group(uint64(ch.Group))
	if !ok {
		return false
	}
	return !slices.ContainsFunc(ch.Join, func(id uint64) bool { return !slices.Contains(g.Members, id) || slices.Contains(g.Joining, id) }) &&
		!slices.ContainsFunc(ch.Leave, func(id uint64) bool { return slices.Contains(g.Members, id) })
}

// mapGroups is cm's data groups, then the metadata group (its members as
// the map knows them): the groups a node change plans for, in that order
// (the metadata group last: the cluster's map is recorded there).
func mapGroups(cm *kv.ClusterMap) []kv.MapGroup {
	return append(slices.Clone(cm.Groups), kv.MapGroup{ID: uint64(MetaGroupID), Members: cm.MetaMembers()})
}

// PlanRemoveNodes returns, for a cluster of several groups whose map is cm,
// the groups to reconfigure to remove nodes ids, in group order, or an
// error before anything changes: an id not a node of the map, or a group
// left with an even or empty number of members (removing one node of a
// group of 2f+1 always does: replace it instead, or remove two of a group
// of five). A rerun plans what is left; none (nodes in no group) leaves
// taking them out of the map (Mover.RemoveNode) to the caller.
func PlanRemoveNodes(cm *kv.ClusterMap, ids []uint64) ([]GroupChange, error) {
	for _, id := range ids {
		if !slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == id }) {
			return nil, fmt.Errorf("node %d is not a node of the cluster map (epoch %d)", id, cm.Epoch)
		}
	}
	var out []GroupChange
	groups := mapGroups(cm)
	if mutation.On && MultiMut.RemoveNodesSkipsMeta.Load() {
		groups = cm.Groups
	}
	for _, g := range groups {
		ms := slices.DeleteFunc(slices.Clone(g.Members), func(id uint64) bool { return slices.Contains(ids, id) })
		if len(ms) == len(g.Members) {
			continue
		}
		if g.IsChain() {
			// Any length of at least one runs: the chain is one shorter.
			if len(ms) == 0 {
				return nil, fmt.Errorf("removing %v would leave chain group %d (members %v) no member", ids, g.ID, g.Members)
			}
			if ch, ok := planChain(g, nil, ids); ok {
				out = append(out, ch)
			}
			continue
		}
		if len(ms) == 0 || len(ms)%2 == 0 {
			return nil, fmt.Errorf("removing %v would leave group %d with %d members (%v); a VR group needs an odd number (2f+1), at least 1: replace the node instead (kefir cluster replace-node --old N --new ID@PEER-ADDR/CLIENT-ADDR)", ids, g.ID, len(ms), ms)
		}
		out = append(out, GroupChange{Group: GroupID(g.ID), Members: ms})
	}
	return out, nil
}
