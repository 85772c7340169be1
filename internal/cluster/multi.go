package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// Multi is a node's replicas of several groups behind the one shard.Replica
// (and Group) the front door talks to (issue 28, first part): each request
// goes, by the slot of its keys, to the group that owns the slot in the
// slot map. A request for a group this node does not host, or whose replica
// here does not lead, fails with a *NotLeaderError naming the slot, which
// the front door forwards or turns into Redis Cluster's -MOVED.
//
// A group refuses keys of slots it does not own by its own account (its
// GroupSpec), checked before anything is proposed, not by the routing map:
// when the metadata group makes the map change under a running node, a
// request routed on a stale map must not be served by a group that gave
// the slot away.
//
// Every result Multi returns names its group (kv.Result.Group), and every
// read is given the session's part for its group (shard.Session.For): a
// session token keeps one position per group's log.
//
// What does not span groups yet (docs/cluster.md): the nilext fast path,
// follower-served cross-client-monotonic reads (CheckConsistency) and
// FLUSHALL. Reads of the whole keyspace (KEYS, SCAN, KEFIR.SCAN) merge
// every group's ordered stream, asking other nodes for the groups this one
// cannot serve (scanacross.go).
type Multi struct {
	// slots is the map this node routes by when no hosted table knows
	// better: the static map (--groups), replaced by the metadata group's
	// whenever this node's replica of it applies a change (meta.go).
	slots atomic.Pointer[SlotMap]
	self  uint64
	// asker reads the parts of a keyspace scan this node cannot serve
	// (SetGroupScanAsker, before the node serves; scanacross.go).
	asker GroupScanAsker
	// set is the hosted groups (copy on write): a node starts a replica
	// for a group the map names it in and drops one that retired
	// (membership, AddGroup and RemoveGroup).
	set atomic.Pointer[hostedSet]
	// members are the nodes' addresses by id (copy on write): --members',
	// then the map's (SetNodes).
	members atomic.Pointer[map[uint64]Member]
	setMu   sync.Mutex // serializes AddGroup, RemoveGroup and SetNodes
	paths   shard.ReadPaths
	eff     effective // moves.go
	meta    metaState // meta.go
	reads   readLoad  // the reads this node served, per slot (load.go)
	// pusher pushes prepared cross-group transactions (xgtx.go);
	// txPushes counts the sweep's pushes.
	pusher   atomic.Pointer[TxPusher]
	txPushes atomic.Uint64
	// txOps runs two-phase ops for the sweep's collection of decisions
	// (xgtx.go); txSettles counts the commits it settled.
	txOps     atomic.Pointer[TxOpRunner]
	txSettles atomic.Uint64
	// txKeep overrides TxDecisionKeep for this node (0: the default; a
	// test's, without writing the package's variable other servers read).
	txKeep atomic.Int64
}

// LocalGroup is one group's replica a node hosts.
type LocalGroup struct {
	Spec   GroupSpec
	Hosted Hosted
}

// owns reports whether g's spec gives it slot: its own account while it
// has no slot table (a move gives it one before anything changes).
func (g *localGroup) owns(slot uint16) bool { return g.owned.has(slot) }

type localGroup struct {
	spec  GroupSpec
	owned slotSet // the group's slots by its spec (--groups)
	h     Hosted
	// tab is the replica's slot table, if its engine keeps one (moves.go).
	tab slotTabler
	// served caches the slots tab's latest table serves (scanacross.go).
	served servedSlots
	// noTable are the slots' ranks while the group has no table: its
	// spec's slots served (slotrank.go).
	noTable slotRanks
}

// ErrCrossSlot is Redis Cluster's refusal of a command whose keys hash to
// different slots.
var ErrCrossSlot = &ReplyError{"CROSSSLOT Keys in request don't hash to the same slot"}

// NewMulti returns the replica of node self (whose peers' client addresses
// members names) that routes by slots to the hosted groups. A node may host
// none (an empty node: every group it had was removed, kefir cluster
// remove-group): it routes every request elsewhere, answers for the map,
// and serves the groups it is given later (AddGroup).
func NewMulti(slots *SlotMap, self uint64, members []Member, groups []LocalGroup) (*Multi, error) {
	m := &Multi{self: self}
	m.slots.Store(slots)
	ms := map[uint64]Member{}
	for _, mb := range members {
		ms[mb.ID] = mb
	}
	m.members.Store(&ms)
	set := &hostedSet{byID: map[GroupID]*localGroup{}}
	for _, lg := range groups {
		if _, dup := set.byID[lg.Spec.ID]; dup {
			return nil, fmt.Errorf("cluster: group %d hosted twice", lg.Spec.ID)
		}
		set = set.with(newLocalGroup(lg))
	}
	m.set.Store(set)
	// Every hosted group runs the same engine: they share read paths. An
	// empty node takes the general ones (Read), also for a group it is
	// given later.
	if len(set.local) > 0 {
		m.paths = set.local[0].h.Replica.ReadPaths()
	}
	// ReadKey's answer names no group, so a session could not tell which
	// group's position it read: the front door takes Read, whose result
	// does (a replica group's engine has no ReadKey path anyway).
	m.paths.Key = false
	return m, nil
}

// hostedSet is a Multi's hosted groups: by id and in id order.
type hostedSet struct {
	byID  map[GroupID]*localGroup
	local []*localGroup // by id
}

// hs is the hosted groups now.
func (m *Multi) hs() *hostedSet { return m.set.Load() }

// with returns the set with g added.
func (s *hostedSet) with(g *localGroup) *hostedSet {
	n := &hostedSet{byID: maps.Clone(s.byID), local: append(slices.Clone(s.local), g)}
	n.byID[g.spec.ID] = g
	slices.SortFunc(n.local, func(a, b *localGroup) int { return int(a.spec.ID) - int(b.spec.ID) })
	return n
}

func newLocalGroup(lg LocalGroup) *localGroup {
	g := &localGroup{spec: lg.Spec, h: lg.Hosted}
	g.tab, _ = lg.Hosted.Replica.(slotTabler)
	for _, r := range lg.Spec.Slots {
		for s := int(r.Start); s <= int(r.End) && s < Slots; s++ {
			g.owned.add(uint16(s))
		}
	}
	g.noTable = ranksOf(nil, &g.owned)
	return g
}

// AddGroup makes a replica the node opened after it started part of m
// (a group the metadata group's map now names this node in: a new member
// that joined it). Requests for the group's slots go to it from now on.
func (m *Multi) AddGroup(lg LocalGroup) error {
	m.setMu.Lock()
	defer m.setMu.Unlock()
	cur := m.hs()
	if _, ok := cur.byID[lg.Spec.ID]; ok || lg.Spec.ID == MetaGroupID {
		return fmt.Errorf("cluster: group %d is hosted here already", lg.Spec.ID)
	}
	m.set.Store(cur.with(newLocalGroup(lg)))
	return nil
}

// RemoveGroup takes hosted group id out of m (its replica retired: the
// group no longer has this node, or the group was removed from the map)
// and returns it for the caller to close. With keepLast the node's last
// group is not removed (ok false: a node whose last replica retired stops,
// or stays up for its metadata replica, with the replica kept); without,
// the node goes on empty (its last group was removed from the map).
func (m *Multi) RemoveGroup(id GroupID, keepLast bool) (h Hosted, ok bool) {
	m.setMu.Lock()
	defer m.setMu.Unlock()
	cur := m.hs()
	g := cur.byID[id]
	if g == nil || (keepLast && len(cur.local) == 1) {
		return Hosted{}, false
	}
	n := &hostedSet{byID: maps.Clone(cur.byID)}
	delete(n.byID, id)
	for _, x := range cur.local {
		if x != g {
			n.local = append(n.local, x)
		}
	}
	m.set.Store(n)
	return g.h, true
}

// member returns node id's addresses as this node knows them.
func (m *Multi) member(id uint64) Member { return (*m.members.Load())[id] }

// nodeIDs returns the ids of the nodes this node knows.
func (m *Multi) nodeIDs() []uint64 {
	ms := *m.members.Load()
	ids := make([]uint64, 0, len(ms))
	for id := range ms {
		ids = append(ids, id)
	}
	return ids
}

// Node returns node id's addresses, if this node knows them.
func (m *Multi) Node(id uint64) (Member, bool) {
	n, ok := (*m.members.Load())[id]
	return n, ok
}

// Nodes returns the nodes this node knows, by id.
func (m *Multi) Nodes() []Member {
	ms := *m.members.Load()
	out := make([]Member, 0, len(ms))
	for _, n := range ms {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// SetNodes merges nodes' addresses into the ones m knows (the map's nodes:
// a node added after this one started), so that redirects name them.
func (m *Multi) SetNodes(nodes []Member) {
	m.setMu.Lock()
	defer m.setMu.Unlock()
	ms := maps.Clone(*m.members.Load())
	for _, n := range nodes {
		ms[n.ID] = n
	}
	m.members.Store(&ms)
}

// Hosted returns the hosted groups' replicas, by group id.
func (m *Multi) Hosted() []LocalGroup {
	local := m.hs().local
	out := make([]LocalGroup, len(local))
	for i, g := range local {
		out[i] = LocalGroup{Spec: g.spec, Hosted: g.h}
	}
	return out
}

// Leader returns the node id and client address of group id's leader as
// this node knows it: its hosted replica's view, or for a group it does not
// host the group's first member other than this node (which forwards or
// redirects in turn; this node, named in a group it does not host, would
// send the caller back to itself: NotHosted).
func (m *Multi) Leader(id GroupID) (uint64, string, bool) {
	if g := m.hs().byID[id]; g != nil {
		st := g.h.Group.State()
		if !st.Normal || st.Leader == 0 {
			return 0, "", false
		}
		return st.Leader, m.member(st.Leader).ClientAddr, true
	}
	spec, ok := m.smap().Group(id)
	if !ok {
		return 0, "", false
	}
	for _, n := range spec.Members {
		if n != m.self {
			return n, m.member(n).ClientAddr, true
		}
	}
	return 0, "", false
}

// opSlot returns the slot of op's keys: the first key's, and ErrCrossSlot
// if another key hashes elsewhere. A keyless op (other than a scan or a
// flush, which Multi handles itself) routes as the empty key (slot 0).
func opSlot(op *kv.Op) (uint16, error) {
	keys, step := op.RoutingKeys()
	if len(keys) == 0 {
		return Slot(nil), nil
	}
	slot := Slot(keys[0])
	for i := step; i < len(keys); i += step {
		if Slot(keys[i]) != slot {
			return 0, ErrCrossSlot
		}
	}
	return slot, nil
}

// route returns the hosted group that serves op, the op's slot, or the
// error that sends it elsewhere. A script runs in the group of its declared
// keys' slot, so it is marked to touch those keys only
// (kv.DeclaredKeysOnly): any other key may be another group's.
func (m *Multi) route(op *kv.Op) (*localGroup, uint16, error) {
	if kv.RunsCommands(op.Kind) { // a script, an EXEC
		op.Cond = kv.DeclaredKeysOnly
	}
	slot, err := opSlot(op)
	if err != nil {
		return nil, 0, err
	}
	g, err := m.routeSlot(slot)
	return g, slot, err
}

// routeSlot returns the hosted group that serves slot, or the error that
// sends a request for it elsewhere.
func (m *Multi) routeSlot(slot uint16) (*localGroup, error) {
	id, inFlight := m.owner(slot)
	if inFlight {
		// Handed over by its source, not yet taken by its destination:
		// no group serves it for the moment. A leader-less redirect makes
		// the front door forward it, which retries until one does.
		return nil, &NotLeaderError{Slot: slot, HasSlot: true}
	}
	g := m.hs().byID[id]
	if g == nil {
		leader, addr, _ := m.Leader(id)
		return nil, &NotLeaderError{Leader: leader, Addr: addr, Slot: slot, HasSlot: true}
	}
	if g.table() == nil && !g.owns(slot) {
		// The routing map and the group disagree: the group's own
		// account wins, and the request is not proposed.
		return nil, &ReplyError{fmt.Sprintf("TRYAGAIN slot %d is not owned by group %d (slot map epoch %d is stale)", slot, id, m.smap().Epoch)}
	}
	return g, nil
}

// withSlot names slot in a not-leader error from a group's replica, so the
// front door can answer -MOVED <slot> <addr>.
func withSlot(err error, slot uint16) error {
	var nl *NotLeaderError
	if err == nil || !errors.As(err, &nl) || nl.HasSlot {
		return err
	}
	c := *nl
	c.Slot, c.HasSlot = slot, true
	return &c
}

// errFlushAcross: a flush without a group's route at a node of several
// groups. The front door sends FLUSHALL to every group, each part routed by
// a key (flush.go); a bare flush would empty whichever group slot 0 is in.
var errFlushAcross = &ReplyError{"ERR a flush in a cluster of several groups must name its group's route (FLUSHALL at a node sends one to every group)"}

// Apply applies reqs, each at the group that owns its slot. A batch of one
// group (a pipeline of keys with one hash tag, or every batch of a
// one-group node) goes to it whole.
func (m *Multi) Apply(ctx context.Context, reqs []shard.WriteReq) (shard.Pending, error) {
	if err := m.txWriteWait(ctx, reqs); err != nil {
		return shard.Pending{}, err
	}
	var one *localGroup
	mixed := false
	slots := make([]uint16, len(reqs))
	groups := make([]*localGroup, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		if r.Err != nil {
			mixed = true // refused before routing (txWriteWait)
			continue
		}
		if r.Op.Kind == kv.KindFlush && len(r.Op.Key) == 0 && len(m.smap().Groups) > 1 {
			r.Err = errFlushAcross
			mixed = true
			continue
		}
		g, slot, err := m.route(&r.Op)
		if err == nil && r.Op.Kind == kv.KindFlush {
			err = flushCheck(g, &r.Op)
		}
		if err != nil {
			r.Err = err
			mixed = true
			continue
		}
		slots[i], groups[i] = slot, g
		if !r.Session.IsZero() {
			r.Session = g.session(r.Session) // the part g's replica checks
		}
		if one == nil {
			one = g
		} else if one != g {
			mixed = true
		}
	}
	if !mixed && one != nil {
		p, err := one.h.Replica.Apply(ctx, reqs)
		for i := range reqs {
			reqs[i].Err = m.refusal(reqs[i].Err, slots[i], one.spec.ID)
			reqs[i].Result.Group = one.spec.gid()
		}
		return p, err
	}
	var pend shard.Pending
	for _, g := range m.hs().local {
		var idx []int
		for i, gi := range groups {
			if gi == g {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		sub := make([]shard.WriteReq, len(idx))
		for j, i := range idx {
			sub[j] = reqs[i]
		}
		p, err := g.h.Replica.Apply(ctx, sub)
		if err != nil {
			return pend, err
		}
		for j, i := range idx {
			reqs[i] = sub[j]
			reqs[i].Err = m.refusal(reqs[i].Err, slots[i], g.spec.ID)
			reqs[i].Result.Group = g.spec.gid()
		}
		pend = pend.Merge(p)
	}
	return pend, nil
}

// Wait waits for every acknowledgement p holds (each group's writes).
func (m *Multi) Wait(ctx context.Context, p shard.Pending) error {
	if p.SyncPos != 0 && len(m.hs().local) > 0 {
		return m.hs().local[0].h.Replica.Wait(ctx, p)
	}
	for _, a := range p.Acks {
		if err := a.Await(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Write is Apply and Wait for one write.
func (m *Multi) Write(ctx context.Context, op kv.Op, d level.Durability, id shard.ReqID) (kv.Result, error) {
	reqs := [1]shard.WriteReq{{Op: op, Durability: d, ID: id}}
	p, err := m.Apply(ctx, reqs[:])
	if err != nil {
		return kv.Result{}, err
	}
	if reqs[0].Err != nil {
		return kv.Result{}, reqs[0].Err
	}
	if err := m.Wait(ctx, p); err != nil {
		return kv.Result{}, err
	}
	return reqs[0].Result, nil
}

// Read serves op at the group that owns its slot, for the session's part
// in that group; a scan of the keyspace merges every hosted group's.
func (m *Multi) Read(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, error) {
	if op.Kind == kv.KindScan {
		return m.scanRead(ctx, op, c, s)
	}
	g, slot, err := m.route(&op)
	if err != nil {
		return kv.Result{}, err
	}
	if err := m.txReadWait(ctx, g, &op); err != nil {
		return kv.Result{}, err
	}
	gs, err := m.sessionAt(g, c, s)
	if err != nil {
		return kv.Result{}, err
	}
	res, err := g.h.Replica.Read(ctx, op, c, gs)
	res.Group = g.spec.gid()
	if err == nil {
		if err := m.otherParts(g, c, s, true); err != nil {
			return kv.Result{}, err
		}
		m.reads.add(slot)
	}
	return res, m.refusal(err, slot, g.spec.ID)
}

// gid is the group's id as a result and a session token name it (NewSlotMap
// keeps ids below 2^32).
func (s GroupSpec) gid() uint32 { return uint32(s.ID) }

// session returns the part of s that g's replica serves a read by.
func (g *localGroup) session(s shard.Session) shard.Session {
	if mutation.On && MultiMut.WrongSessionPart.Load() {
		// Deliberately broken (tests): every group is given the top-level
		// part, none of its own.
		return s.For(0)
	}
	return s.For(g.spec.gid())
}

// sessionViewer is a replica that judges a session's part of its group
// without waiting (vrshard.Replica.SessionViews), and a part of another
// group by the copy of that group's view history its group imported with a
// move (CopiedSessionViews, kv/viewcopy.go).
type sessionViewer interface {
	SessionViews(s shard.Session) error
	CopiedSessionViews(gid uint32, s shard.Session) error
}

// sessionAt returns the part of s that g's replica serves a read at level c
// by, after checking, at level session, the session's parts of the other
// groups this node hosts against their replicas' view histories: a
// session that saw a write a view change dropped (a cad or async write
// acknowledged early, never committed) is lost wherever it reads next
// (shard.ErrSessionLost), not only at the group that dropped it. This is
// what carries the detection across a slot move: the key's new group has
// nothing of the old group's log, but the old group's replica on this node
// does (docs/design/cluster.md §8). Where the old group is not hosted, has
// not applied that far, or no longer exists, the copies of its view
// history that moves brought to the hosted groups judge the part once the
// read was served (otherParts, called again after it) — the key's new
// group's copy in particular, which its replica applied before the
// take-over that lets it serve the key (kv/viewcopy.go). The cost: per
// part of another group, one binary search per hosted group, each time.
func (m *Multi) sessionAt(g *localGroup, c level.Consistency, s shard.Session) (shard.Session, error) {
	if err := m.otherParts(g, c, s, false); err != nil {
		return shard.Session{}, err
	}
	return g.session(s), nil
}

// otherParts checks, at level session, s's parts of groups other than g:
// before a read (copies false) at the hosted replicas of those groups, after
// it (copies true) by the view copies every hosted group holds. The copies
// are consulted only once the read was served: its group's replica served
// the slot, so it applied the take-over and, before it, the import that
// brought the copy (published no later: vrshard's flush), while a check
// before the read could run just before both applied.
func (m *Multi) otherParts(g *localGroup, c level.Consistency, s shard.Session, copies bool) error {
	if c.Kind != level.Session || len(s.Groups) == 0 || (mutation.On && MultiMut.OtherPartsUnchecked.Load()) {
		return nil
	}
	if copies {
		return m.copiedParts(g.spec.gid(), c, s)
	}
	for _, p := range s.Groups {
		if p.Group == g.spec.gid() || (!p.WriteViewKnown && !p.ReadViewKnown) {
			continue
		}
		if og := m.hs().byID[GroupID(p.Group)]; og != nil {
			if sv, ok := og.h.Replica.(sessionViewer); ok {
				if err := sv.SessionViews(s.For(p.Group)); err != nil {
					return fmt.Errorf("group %d: %w", p.Group, err)
				}
			}
		}
	}
	return nil
}

// copiedParts checks, at level session, s's parts of groups other than
// skip (0: none) by the view copies every hosted group holds of them
// (otherParts after a keyed read, scanCopies after a keyspace scan's).
func (m *Multi) copiedParts(skip uint32, c level.Consistency, s shard.Session) error {
	if c.Kind != level.Session || len(s.Groups) == 0 || (mutation.On && (MultiMut.OtherPartsUnchecked.Load() || MultiMut.CopiesUnchecked.Load())) {
		return nil
	}
	for _, p := range s.Groups {
		if (skip != 0 && p.Group == skip) || (!p.WriteViewKnown && !p.ReadViewKnown) {
			continue
		}
		ps := s.For(p.Group)
		for _, og := range m.hs().local {
			sv, ok := og.h.Replica.(sessionViewer)
			if !ok || og.spec.gid() == p.Group {
				continue // a group's own history is judged by its read (sessionAt)
			}
			if err := sv.CopiedSessionViews(p.Group, ps); err != nil {
				return fmt.Errorf("group %d: %w", p.Group, err)
			}
		}
	}
	return nil
}

// MultiMutations are Multi's deliberate bugs (internal/mutation), which the
// server's tests switch on (exported for them: Multi is built there).
type MultiMutations struct {
	// WrongSessionPart: reads are given the session's top-level part, not
	// their group's (server TestSessionReadsAcrossGroupsAtFollowers).
	WrongSessionPart atomic.Bool
	// OtherPartsUnchecked: a session read checks only its own group's part,
	// so a write lost in another group goes unreported there (server
	// TestSessionLostInOneGroupIsLostAtEvery).
	OtherPartsUnchecked atomic.Bool
	// CopiesUnchecked: a session read checks the other groups' parts only
	// at the hosted replicas of those groups, not against the view copies
	// moves brought (server TestSessionLostAtANodeThatDoesNotHostItsGroup).
	CopiesUnchecked atomic.Bool
	// NoViewCopies: a move takes no view history to the destination
	// (server TestSessionLostAtANodeThatDoesNotHostItsGroup).
	NoViewCopies atomic.Bool
	// StaleMap, "routing on a stale map": the routing decision (SlotOwner,
	// RefusalTarget) goes by the cached map alone, ignoring the hosted
	// groups' tables and the peer a group's refusal names (vrshard's
	// TestMoveSimCatchesMutations).
	StaleMap atomic.Bool
	// ReadsIgnoreTxLocks: a read of a key that a prepared cross-group
	// transaction writes is served at once, not after its resolve
	// (server TestCrossGroupTxReadsWaitForLocks).
	ReadsIgnoreTxLocks atomic.Bool
	// DecideEarly: a cross-group coordinator (TwoPhase) decides commit on
	// the primary's prepare alone, ignoring the other parts' answers
	// (server TestCrossGroupTxMutationsCaught, vrshard TestXgSimCatchesMutations).
	DecideEarly atomic.Bool
	// PushDecidesLocally: a push (PushTx) aborts the part it holds without
	// asking the primary, whose decision may be commit (vrshard
	// TestXgSimCatchesMutations).
	PushDecidesLocally atomic.Bool
	// PlanAfterHandOver: a recorded move (Mover.Meta) is planned in the
	// metadata group only after its hand-over, not before its first step,
	// so a driver that dies before then leaves steps no record names and
	// no resumer finishes (vrshard TestMoveSimMetaCatchesMutations).
	PlanAfterHandOver atomic.Bool
	// ScanWindowUnchecked: a keyspace scan's page is returned even when
	// some slot was served by none of its parts' reads (a move's window
	// between them), so it may miss that slot's keys (TestScanAcrossAMove).
	ScanWindowUnchecked atomic.Bool
	// ScanSessionNotCarried: a keyspace scan at level session asks another
	// node for a group's part without the session, so a replica there that
	// has not applied the session's writes serves its older state
	// (TestScanAtLevelSessionAcrossNodesReadsYourWrites).
	ScanSessionNotCarried atomic.Bool
	// ScanCopiesUnchecked: a keyspace scan does not check the session's
	// parts against the view copies moves brought, so a session whose
	// part of a removed group is lost is served (TestScanChecksTheViewCopies,
	// server TestSessionScanLostInARemovedGroup).
	ScanCopiesUnchecked atomic.Bool
	// ScanPartsUnranked: a keyspace scan's merge keeps every part's keys
	// of the slots it served, also a part whose replica's table shows the
	// slot before a move another part's shows, so a source's follower
	// behind a hand-over returns a key the session deleted at the
	// destination (TestScanAtLevelSessionBehindAHandOver, server
	// TestSessionScanAtAFollowerBehindAHandOver).
	ScanPartsUnranked atomic.Bool
	// SlotListingUnchecked: CLUSTER COUNTKEYSINSLOT and GETKEYSINSLOT
	// answer from the routed group's engine whether or not its table
	// serves the slot, so a destination's replica that has not applied
	// the take-over lists its partial pre-copy (TestSlotListingOnlyWhereServed).
	SlotListingUnchecked atomic.Bool
	// DoneBeforeCopy: a recorded move's end (DONE) is written right after
	// its plan, before any step: the map gives the slots to the
	// destination while the source still holds them, so a remove-group
	// finds the source empty and removes it mid-move (vrshard
	// TestMoveSimGroupOpsCatchesMutations).
	DoneBeforeCopy atomic.Bool
	// RemoveNodesSkipsMeta: PlanRemoveNodes plans the data groups only,
	// leaving the removed nodes in the metadata group (vrshard
	// TestMoveSimShrinkCatchesMutations).
	RemoveNodesSkipsMeta atomic.Bool
	// IgnoreAbortMark: a driver that takes over a recorded move marked for
	// abort (kv.MapMove.AbortWanted) neither carries the mark in its
	// claims nor settles the move: it drives it forward as an unmarked one
	// (vrshard TestMoveSimMetaAbortCatchesMutations; with
	// kv.MapMut.ClaimIgnoresAbortMark its claims are taken).
	IgnoreAbortMark atomic.Bool
	// AbortSkipsFence: a driver settling a move marked for abort
	// (Mover.settle) reads the groups' tables without fencing them first,
	// so a live forward driver's steps still land after the decision
	// (vrshard TestMoveSimMetaAbortRacesALiveDriver).
	AbortSkipsFence atomic.Bool
	// AbortDropsImportOrigin: a move rolled back after its migrating step
	// leaves the source's slots owned with peer 0, as if never imported,
	// so kv.MovedRequest no longer checks their requests against the
	// marks the source imported with them (vrshard
	// TestMoveSimAbortOfAnImportedSlotKeepsItsMarks).
	AbortDropsImportOrigin atomic.Bool
	// PlaceIgnoresLive: placement (PlanReplacePlaced, PlaceGroup,
	// PlaceMembers) counts every node of the map as up, whatever the
	// liveness answer, so it may choose a dead node (TestPlacementMutations,
	// vrshard TestMoveSimPlacedCatchesMutations).
	PlaceIgnoresLive atomic.Bool
	// PlaceIgnoresMembers: placement may choose a node already in the
	// group (TestPlacementMutations, vrshard
	// TestMoveSimPlacedCatchesMutations).
	PlaceIgnoresMembers atomic.Bool
	// PlaceIgnoresZones: placement takes no account of the nodes' zones
	// (the least loaded node, as before zones; TestPlaceZones).
	PlaceIgnoresZones atomic.Bool
}

// MultiMut is the process's MultiMutations (tests only; read under mutation.On).
var MultiMut MultiMutations

// errScanSessionAcross: a keyspace scan's result would have to advance every
// group's part of the session, and a result names one group: only Scan,
// which returns the advanced session, serves one at level session.
var errScanSessionAcross = &ReplyError{"ERR a keyspace scan (KEYS, SCAN, KEFIR.SCAN) at level session across groups needs the session advanced per group (cluster.Multi.Scan)"}

// scanRead is a keyspace scan for Read and ReadDeferred, whose result names
// at most one group: a merged one names none and has version 0 (it advances
// no session), and at level session it is refused (Scan serves it).
func (m *Multi) scanRead(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, error) {
	if c.Kind == level.Session && !m.oneGroup() {
		return kv.Result{}, errScanSessionAcross
	}
	res, _, err := m.Scan(ctx, op, c, s)
	return res, err
}

// oneGroup reports whether the cluster is this node's one group.
func (m *Multi) oneGroup() bool { return len(m.hs().local) == 1 && len(m.smap().Groups) == 1 }

// Scan merges the groups' ordered streams of a keyspace scan: each group's
// first Limit served pairs, merged by key, cut at Limit; the groups this
// node cannot serve at c are read at their leaders (scanacross.go).
//
// It returns the session s advanced by what each group's scan read (its
// part of each group): a scan of one group's keyspace is that group's
// result; a merged one names no group and has version 0, since its version
// would mix groups' logs. Each group reads at the session's part for it, so
// at level session every group's scan waits for the session's writes and
// reads there. The front door scans through Scan (conn.readPath).
func (m *Multi) Scan(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, shard.Session, error) {
	if m.oneGroup() {
		g := m.hs().local[0]
		res, err := g.h.Replica.Read(ctx, op, c, g.session(s))
		res.Group = g.spec.gid()
		if err != nil {
			return res, s, err
		}
		return res, s.AfterRead(res.Pos()), nil
	}
	return m.scanAcross(ctx, op, c, s) // scanacross.go
}

// ReadPaths are the hosted groups' (one engine).
func (m *Multi) ReadPaths() shard.ReadPaths { return m.paths }

// ReadKey reads key at the group that owns its slot. Its version names no
// group, so the front door does not take it (ReadPaths.Key is false).
func (m *Multi) ReadKey(key []byte, c level.Consistency, s shard.Session) ([]byte, uint64, bool, error) {
	op := kv.Op{Kind: kv.KindGet, Key: key}
	g, slot, err := m.route(&op)
	if err != nil {
		return nil, 0, false, err
	}
	gs, err := m.sessionAt(g, c, s)
	if err != nil {
		return nil, 0, false, err
	}
	v, ver, found, err := g.h.Replica.ReadKey(key, c, gs)
	if err == nil {
		if err := m.otherParts(g, c, s, true); err != nil {
			return nil, 0, false, err
		}
		m.reads.add(slot)
	}
	return v, ver, found, m.refusal(err, slot, g.spec.ID)
}

// ReadDeferred is Read's deferred path at the owning group.
func (m *Multi) ReadDeferred(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, shard.Pending, error) {
	if op.Kind == kv.KindScan {
		res, err := m.scanRead(ctx, op, c, s)
		return res, shard.Pending{}, err
	}
	g, slot, err := m.route(&op)
	if err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	if err := m.txReadWait(ctx, g, &op); err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	gs, err := m.sessionAt(g, c, s)
	if err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	res, p, err := g.h.Replica.ReadDeferred(ctx, op, c, gs)
	res.Group = g.spec.gid()
	if err == nil {
		// A deferred read passed its fence before it was deferred.
		if err := m.otherParts(g, c, s, true); err != nil {
			return kv.Result{}, shard.Pending{}, err
		}
		m.reads.add(slot)
	}
	return res, p, m.refusal(err, slot, g.spec.ID)
}

// TryRead serves op at its group if that needs no wait.
func (m *Multi) TryRead(op kv.Op, c level.Consistency) (kv.Result, bool) {
	if op.Kind == kv.KindScan {
		return kv.Result{}, false
	}
	g, slot, err := m.route(&op)
	if err != nil {
		return kv.Result{}, false
	}
	if keys, _ := op.RoutingKeys(); !(mutation.On && MultiMut.ReadsIgnoreTxLocks.Load()) && m.TxLocked(keys, false) && m.leads(g) == nil {
		return kv.Result{}, false // Read waits for the resolve
	}
	res, ok := g.h.Replica.TryRead(op, c)
	res.Group = g.spec.gid()
	if ok {
		m.reads.add(slot)
	}
	return res, ok
}

// CheckConsistency is the hosted groups'. Cross-client-monotonic promises
// sequential consistency, a single order of every client's operations, and
// each group orders only its own: two groups' orders compose into one only
// if each group's reads are linearizable (linearizability is local, sequential
// consistency is not). So in a cluster every group's leader serves them, as
// it serves linearizable reads (under its lease, waiting until what it
// returns is readable), and no follower does: a node of several groups
// never runs with follower reads (the server refuses --follower-reads with
// --groups, and opens the groups' replicas without them whatever its flags).
// docs/design/cluster.md §8. Sessions compose too: each keeps its own
// position per group's log.
func (m *Multi) CheckConsistency(c level.Consistency) error {
	g := m.first()
	if g == nil {
		return nil // an empty node: the group that serves it decides
	}
	return g.h.Replica.CheckConsistency(c)
}

// CheckDurability is the hosted groups' (one engine).
func (m *Multi) CheckDurability(d level.Durability) error {
	g := m.first()
	if g == nil {
		return nil // an empty node: the group that serves it decides
	}
	return g.h.Replica.CheckDurability(d)
}

// first is the first hosted group (nil: the node hosts none).
func (m *Multi) first() *localGroup {
	if l := m.hs().local; len(l) > 0 {
		return l[0]
	}
	return nil
}

// Status adds up the hosted groups'.
func (m *Multi) Status() shard.Status {
	var st shard.Status
	for _, g := range m.hs().local {
		s := g.h.Replica.Status()
		st.LastVersion = max(st.LastVersion, s.LastVersion)
		st.LastPos += s.LastPos
		st.DurablePos += s.DurablePos
		st.Clients += s.Clients
		st.Reserved += s.Reserved
		st.Writes += s.Writes
		st.Syncs += s.Syncs
		st.ReadSyncs += s.ReadSyncs
		st.Deduped += s.Deduped
	}
	return st
}

// Close closes every hosted replica.
func (m *Multi) Close() error {
	var errs []error
	if g := m.metaG(); g != nil {
		if err := g.h.Replica.Close(); err != nil {
			errs = append(errs, fmt.Errorf("metadata group: %w", err))
		}
	}
	for _, g := range m.hs().local {
		if err := g.h.Replica.Close(); err != nil {
			errs = append(errs, fmt.Errorf("group %d: %w", g.spec.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Engine is group id's engine at this node (false: not hosted here).
func (m *Multi) Engine(id GroupID) (*storage.DB, bool) {
	if g := m.hs().byID[id]; g != nil {
		return g.h.Engine, true
	}
	return nil, false
}

// Engines returns the hosted groups' storage engines.
func (m *Multi) Engines() []*storage.DB {
	out := make([]*storage.DB, 0, len(m.hs().local))
	for _, g := range m.hs().local {
		out = append(out, g.h.Engine)
	}
	return out
}

// Group: the node's replication side as /status, INFO and metrics report
// it is its first hosted group's (per-group state is in CLUSTER SHARDS and
// NODES); the nilext fast path is off across groups.

// State is the first hosted group's; an empty node's says so (StatusEmpty).
func (m *Multi) State() State {
	if g := m.first(); g != nil {
		return g.h.Group.State()
	}
	return State{Self: m.self, Status: StatusEmpty}
}

// StatusEmpty is State.Status at a node that hosts no group.
const StatusEmpty = "empty"

// Stats are the first hosted group's (none: zero).
func (m *Multi) Stats() Stats {
	if g := m.first(); g != nil {
		return g.h.Group.Stats()
	}
	return Stats{}
}

// ViewEvents are the first hosted group's (none: none).
func (m *Multi) ViewEvents() []ViewEvent {
	if g := m.first(); g != nil {
		return g.h.Group.ViewEvents()
	}
	return nil
}

// GroupState returns hosted group id's state.
func (m *Multi) GroupState(id GroupID) (State, bool) {
	g := m.hs().byID[id]
	if id == MetaGroupID {
		g = m.metaG()
	}
	if g == nil {
		return State{}, false
	}
	return g.h.Group.State(), true
}

// NilextOn: the fast path does not span groups yet.
func (m *Multi) NilextOn() bool { return false }

// NilextEligible: nothing takes the fast path.
func (m *Multi) NilextEligible(*kv.Op) bool { return false }

var errNilextMulti = &RequestError{errors.New("the nilext fast path is not supported yet in a cluster of several groups")}

// NilextApply is never called (NilextOn is false).
func (m *Multi) NilextApply(context.Context, []shard.WriteReq) ([]int, error) {
	return nil, errNilextMulti
}

// NilextTake refuses: the fast path is off.
func (m *Multi) NilextTake(context.Context, shard.ReqID, kv.Op, level.Durability) (NilextAck, error) {
	return NilextAck{}, errNilextMulti
}

// NilextTakeBatch refuses every update: the fast path is off.
func (m *Multi) NilextTakeBatch(_ context.Context, ups []NilextDirect) ([]NilextAck, []error) {
	errs := make([]error, len(ups))
	for i := range errs {
		errs[i] = errNilextMulti
	}
	return make([]NilextAck, len(ups)), errs
}

// ScanSlot visits the keys of slot in its group's state at level c, in key
// order, until visit returns false. Keys are stored by key, not by slot, so
// this reads every key of the group (CLUSTER COUNTKEYSINSLOT and
// GETKEYSINSLOT: O(the group's keys), as docs/cluster.md says). At level
// session the group's replica waits for the session's part there (s); the
// listing advances no session (it returns keys, not what it read).
//
// The group's engine may hold keys of a slot its table does not serve
// (imported before the take-over, or handed over and not yet purged),
// where the routing map sends the request to a group whose replica here
// has not applied the take-over: the group's table must serve the slot
// before the reads and still after them (the reasoning of servedPart),
// else the listing is refused as a keyed read is (refusal: a redirect to
// the group that serves the slot, or a leader-less one while it is in
// flight, which the front door forwards until a group serves it). A
// refusal after the reads comes after keys were visited: the caller drops
// them.
func (m *Multi) ScanSlot(ctx context.Context, slot uint16, c level.Consistency, s shard.Session, visit func(key []byte) bool) error {
	g, err := m.routeSlot(slot)
	if err != nil {
		return err
	}
	if err := m.servesSlot(g, slot); err != nil {
		return err
	}
	if err := ScanSlot(ctx, g.h.Replica, slot, c, g.session(s), visit); err != nil {
		return err
	}
	return m.servesSlot(g, slot)
}

// servesSlot refuses a listing of slot at g if g's table does not serve it
// (ScanSlot); a group without a table serves its spec's slots (routeSlot
// checked them).
func (m *Multi) servesSlot(g *localGroup, slot uint16) error {
	t := g.table()
	if t == nil || (mutation.On && MultiMut.SlotListingUnchecked.Load()) {
		return nil
	}
	if e := t.Entry(slot); !e.State.Serves() {
		return m.refusal(&kv.SlotError{Slot: slot, State: e.State, Peer: e.Peer, Epoch: e.Epoch}, slot, g.spec.ID)
	}
	return nil
}

// ScanSlot visits the keys of slot that rep holds, in key order, at level c
// for session s (rep's own part of it), until visit returns false: a scan of
// every key of rep, filtered by slot.
func ScanSlot(ctx context.Context, rep shard.Replica, slot uint16, c level.Consistency, s shard.Session, visit func(key []byte) bool) error {
	var start []byte
	for {
		res, err := rep.Read(ctx, kv.Op{Kind: kv.KindScan, Key: start, Limit: scanPage}, c, s)
		if err != nil {
			return withSlot(err, slot)
		}
		for i := 0; i+1 < len(res.Array); i += 2 {
			if k := res.Array[i]; Slot(k) == slot && !visit(k) {
				return nil
			}
		}
		if len(res.Array) < 2*scanPage {
			return nil
		}
		last := res.Array[len(res.Array)-2]
		start = append(append(start[:0:0], last...), 0) // the next key after last
	}
}

// scanPage is how many pairs one read of ScanSlot asks a group for.
const scanPage = 1000

var (
	_ shard.Replica = (*Multi)(nil)
	_ Group         = (*Multi)(nil)
)
