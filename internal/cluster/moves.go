package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// Slot moves at a node (docs/design/cluster.md). Each hosted group's replica
// keeps its own slot table (kv/slots.go), changed only by ops in its log and
// enforced at apply and read: the fence. This file is the node's side of it:
//
//   - routing by the hosted groups' tables, which override the static map
//     (owner): a group that serves a slot at a higher epoch than the map
//     knows wins, and a slot its source handed over while its destination
//     (hosted here) has not taken it yet is "in flight": no group serves it,
//     and the request is forwarded, which retries until one does;
//   - a group's refusal (*kv.SlotError, from its fence) becomes the redirect
//     to the group that serves the slot now (refusal): -MOVED for a cluster
//     client, forwarding for the others;
//   - the effective map CLUSTER SLOTS, SHARDS and NODES report (Slots);
//   - the admin steps a move is made of (SlotTable, SlotWrite, SlotDump):
//     a mover (mover.go, kefir cluster move-slots) drives them through
//     KEFIR.SLOTS at each group's leader.

// slotTabler is a replica whose engine keeps a slot table (vrshard).
type slotTabler interface{ SlotTable() *kv.SlotTable }

// table is g's slot table as its replica here applied it (nil: none).
func (g *localGroup) table() *kv.SlotTable {
	if g.tab == nil {
		return nil
	}
	return g.tab.SlotTable()
}

// owner returns the group that serves slot by this node's best knowledge,
// and whether the slot is in flight (SlotOwner over the hosted groups'
// tables and the routing map).
func (m *Multi) owner(slot uint16) (GroupID, bool) {
	return SlotOwner(slot, m.hs().local, m.smap(), m.meta.follows.Load())
}

// refusal turns group from's fence refusal of a request for slot into the
// redirect to the group that serves it now (RefusalTarget); other errors
// get the slot named (withSlot).
func (m *Multi) refusal(err error, slot uint16, from GroupID) error {
	se, ok := kv.ParseSlotError(err)
	if !ok {
		return withSlot(err, slot)
	}
	id, inFlight, ok := RefusalTarget(slot, from, se, m.hs().local, m.smap(), m.meta.follows.Load())
	if !ok {
		return &ReplyError{fmt.Sprintf("TRYAGAIN slot %d is not served by group %d (%v)", slot, from, err)}
	}
	if inFlight {
		return &NotLeaderError{Slot: slot, HasSlot: true}
	}
	leader, addr, _ := m.Leader(id)
	return &NotLeaderError{Leader: leader, Addr: addr, Slot: slot, HasSlot: true}
}

// effective caches the map Slots builds, by the tables it was built from.
type effective struct {
	mu   sync.Mutex
	tabs []*kv.SlotTable
	from *SlotMap // the map it overrode
	m    *SlotMap
}

// Slots returns the slot map as this node routes by it: the static map
// overridden by the hosted groups' tables (a slot in flight is shown at its
// destination), at the highest epoch any of them knows.
func (m *Multi) Slots() *SlotMap {
	tabs := make([]*kv.SlotTable, len(m.hs().local))
	any := false
	for i, g := range m.hs().local {
		tabs[i] = g.table()
		any = any || tabs[i] != nil
	}
	sm := m.smap()
	if !any {
		return sm
	}
	m.eff.mu.Lock()
	defer m.eff.mu.Unlock()
	if m.eff.m != nil && m.eff.from == sm && slices.Equal(tabs, m.eff.tabs) {
		return m.eff.m
	}
	out := &SlotMap{Epoch: sm.Epoch, Groups: make([]GroupSpec, len(sm.Groups))}
	for _, t := range tabs {
		if t != nil {
			out.Epoch = max(out.Epoch, t.Epoch())
		}
	}
	idx := map[GroupID]int{}
	for i, g := range sm.Groups {
		out.Groups[i] = GroupSpec{ID: g.ID, Members: g.Members, Engine: g.Engine}
		idx[g.ID] = i
	}
	for s := 0; s < Slots; s++ {
		id, _ := m.owner(uint16(s))
		i, ok := idx[id]
		if !ok {
			id, i = sm.Owner(uint16(s)), idx[sm.Owner(uint16(s))]
		}
		out.owner[s] = id
		rs := out.Groups[i].Slots
		if n := len(rs); n > 0 && int(rs[n-1].End) == s-1 {
			rs[n-1].End = uint16(s)
		} else {
			out.Groups[i].Slots = append(rs, SlotRange{uint16(s), uint16(s)})
		}
	}
	m.eff.tabs, m.eff.m, m.eff.from = tabs, out, sm
	return out
}

// hosted returns hosted group id, or an error naming it.
func (m *Multi) hosted(id GroupID) (*localGroup, error) {
	g := m.hs().byID[id]
	if id == MetaGroupID {
		if g = m.metaG(); g == nil {
			// Sent on to a node that hosts it (the mover follows -MOVED).
			if ms := m.MetaMembers(); len(ms) > 0 {
				return nil, &NotLeaderError{Leader: ms[0], Addr: m.member(ms[0]).ClientAddr}
			}
			return nil, &ReplyError{"ERR " + errNoMetaGroup}
		}
	}
	if g == nil {
		return nil, NotHosted(m.smap(), id, m.self, func(n uint64) string { return m.member(n).ClientAddr })
	}
	return g, nil
}

// NotHosted is the answer of node self, which does not host group id, to a
// request for it (KEFIR.SLOTS): for a group of the map sm, a not-leader
// error naming its first member other than self (clientAddr gives a node's
// address), which forwards or redirects in turn, as a key of that group is
// — the Mover follows it, so any node of a cluster of more nodes than a
// group has replicas is a seed for any move; for a group not in the map, or
// whose only member is self, an error. Not self: a node the map names in a
// group it does not host — its replica lost with its directory, a new
// member not opened yet, a retired one the map still lists — would send the
// caller back to itself until its retries ran out (the move simulation's
// replacements, 30 nodes × 100 groups, seed 1: "no leader answered within
// 1s: MOVED node9", the lost replica's node).
func NotHosted(sm *SlotMap, id GroupID, self uint64, clientAddr func(node uint64) string) error {
	if spec, ok := sm.Group(id); ok {
		for _, n := range spec.Members {
			if n == self {
				continue
			}
			if addr := clientAddr(n); addr != "" {
				return &NotLeaderError{Leader: n, Addr: addr}
			}
		}
	}
	return &ReplyError{fmt.Sprintf("ERR group %d is not hosted by this node", id)}
}

// leads returns nil if this node's replica of g leads it, else the
// not-leader error that names the leader.
func (m *Multi) leads(g *localGroup) error {
	st := g.h.Group.State()
	if st.Normal && st.Leader == m.self {
		return nil
	}
	if !st.Normal || st.Leader == 0 {
		return &NotLeaderError{}
	}
	return &NotLeaderError{Leader: st.Leader, Addr: m.member(st.Leader).ClientAddr}
}

// led returns group id if this node hosts it and its replica here leads it
// (hosted, then leads): the KEFIR.SLOTS steps run only at a group's leader.
func (m *Multi) led(id GroupID) (*localGroup, error) {
	g, err := m.hosted(id)
	if err != nil {
		return nil, err
	}
	if err := m.leads(g); err != nil {
		return nil, err
	}
	return g, nil
}

// SlotTable returns group id's slot table as its leader here applied it
// (nil: none yet).
func (m *Multi) SlotTable(id GroupID) (*kv.SlotTable, error) {
	g, err := m.led(id)
	if err != nil {
		return nil, err
	}
	if g.tab == nil {
		return nil, &ReplyError{fmt.Sprintf("ERR group %d's engine keeps no slot table", id)}
	}
	return g.table(), nil
}

// SlotWrite proposes a slot op (kv.KindSlotInit, KindSlotSet,
// KindSlotImport) in group id's log, at its leader here.
func (m *Multi) SlotWrite(ctx context.Context, id GroupID, op kv.Op) (kv.Result, error) {
	if !kv.IsSlotKind(op.Kind) {
		return kv.Result{}, fmt.Errorf("cluster: %s is not a slot op", op.Kind)
	}
	g, err := m.led(id)
	if err != nil {
		return kv.Result{}, err
	}
	// Sync: a step is durable on a majority before the mover takes the next.
	return g.h.Replica.Write(ctx, op, level.Sync, shard.ReqID{})
}

// Dump is one page of a group's keys of some slots (SlotDump): Entries
// (kv.AppendSlotImport's triples) and Versions of those above the version
// asked, Keys every key of the page, Next the cursor to go on from (nil:
// done).
type Dump struct {
	Entries  [][]byte
	Versions []uint64
	Keys     [][]byte
	Next     []byte
	// At is the engine's last version before the page was read: a key
	// written later may or may not be in it.
	At uint64
}

// SlotsHandedOver returns nil if group id's leader at a has handed every
// slot of rs over (its fence froze them: the final copy reads a state no
// write changes), else a TRYAGAIN error.
func SlotsHandedOver(a SlotAdmin, id GroupID, rs []kv.SlotRange) error {
	t, err := a.SlotTable(id)
	if err != nil {
		return err
	}
	for _, r := range rs {
		for s := int(r.Start); s <= int(r.End); s++ {
			if t == nil || t.Entry(uint16(s)).State != kv.SlotNone {
				return &ReplyError{fmt.Sprintf("TRYAGAIN group %d has not handed slot %d over (yet)", id, s)}
			}
		}
	}
	return nil
}

// SlotDump returns a page of up to limit user keys of group id, from key
// cursor on, whose slot is in slots, with the entries of those whose
// version is above since. It reads the leader's engine as it stands: a
// pre-copy reads a moving state (the keys written meanwhile are copied
// again, their versions are above the pre-copy's start), the final copy
// reads a state the source's fence has frozen.
func (m *Multi) SlotDump(id GroupID, slots func(uint16) bool, cursor []byte, limit int, since uint64) (Dump, error) {
	g, err := m.led(id)
	if err != nil {
		return Dump{}, err
	}
	return DumpSlots(g.h.Engine, slots, cursor, limit, since)
}

// SlotClients returns group id's client-table rows (client id, row value)
// as of version at (0: the latest), at its leader here: the request marks a
// move takes to the destination (kv.AppendSlotClientMark). A row the engine
// no longer retains at that version is not returned.
func (m *Multi) SlotClients(id GroupID, at uint64) (ids []uint64, rows [][]byte, err error) {
	g, err := m.led(id)
	if err != nil {
		return nil, nil, err
	}
	if ids, rows, err = ClientRows(g.h.Engine, at); err != nil {
		return nil, nil, fmt.Errorf("cluster: group %d's client rows: %w", id, err)
	}
	return ids, rows, nil
}

// viewMover is a replica that gives a move its group's view history and
// the view copies its group imported (vrshard.Replica.MoveViews).
type viewMover interface {
	MoveViews(gid uint32) (views []kv.GroupViews, top uint64)
}

// SlotViews returns what a move of group id's slots takes to the
// destination with its final copy (kv/viewcopy.go): group id's view history
// at its leader here, then the copies of other groups it holds. at is the
// hand-over's version: a leader whose history does not reach it yet (new,
// still applying) answers TRYAGAIN, so that the copy covers every op the
// slots' sessions can name at the source. A replica that keeps no history
// gives none.
func (m *Multi) SlotViews(id GroupID, at uint64) ([]kv.GroupViews, error) {
	g, err := m.led(id)
	if err != nil {
		return nil, err
	}
	vm, ok := g.h.Replica.(viewMover)
	if !ok {
		return nil, nil
	}
	views, top := vm.MoveViews(g.spec.gid())
	return MoveViewsAt(views, top, at, id)
}

// MoveViewsAt is SlotViews's answer from a replica's MoveViews.
func MoveViewsAt(views []kv.GroupViews, top, at uint64, id GroupID) ([]kv.GroupViews, error) {
	if top < at {
		return nil, &ReplyError{fmt.Sprintf("TRYAGAIN group %d's leader has applied its history to op %d, not yet to the hand-over's %d", id, top, at)}
	}
	return views, nil
}

// slotClientEnd ends the range of the request marks' keys
// (kv.SlotClientPrefix with its last byte, '/', incremented).
var slotClientEnd = append(kv.SlotClientPrefix[:len(kv.SlotClientPrefix)-1:len(kv.SlotClientPrefix)-1], '0')

// ClientRows is SlotClients over an engine: each client's row, or the
// request mark the group imported for it with an earlier move if that
// names a later request (the two share AppendClientRow's encoding, the
// request number first). With the marks, a write that ran at a slot's
// first group and is retried only after the slot went on from the second
// to a third is answered there from its mark, not run again.
func ClientRows(db *storage.DB, at uint64) (ids []uint64, rows [][]byte, err error) {
	byID := map[uint64][]byte{}
	scan := func(prefix, end []byte) error {
		return db.Scan(prefix, end, at, 0, func(k []byte, v storage.Value) bool {
			c, err := kv.ClientRowID(prefix, k)
			if err != nil {
				return true
			}
			if old, ok := byID[c]; ok {
				prev, n := binary.Uvarint(old)
				req, m := binary.Uvarint(v.Data)
				if n > 0 && (m <= 0 || req <= prev) {
					return true
				}
			}
			byID[c] = slices.Clone(v.Data)
			return true
		})
	}
	if err := scan(kv.ClientRowPrefix, kv.ClientRowEnd); err != nil {
		return nil, nil, err
	}
	if err := scan(kv.SlotClientPrefix, slotClientEnd); err != nil {
		return nil, nil, err
	}
	for c := range byID {
		ids = append(ids, c)
	}
	slices.Sort(ids)
	for _, c := range ids {
		rows = append(rows, byID[c])
	}
	return ids, rows, nil
}

// DumpSlots is SlotDump over an engine.
func DumpSlots(db *storage.DB, slots func(uint16) bool, cursor []byte, limit int, since uint64) (Dump, error) {
	type rec struct {
		key, meta, data []byte
		ver             uint64
	}
	d := Dump{At: db.LastVersion()}
	var recs []rec
	visit := func(k []byte, v storage.Value) bool {
		if !slots(Slot(k)) {
			return true
		}
		d.Keys = append(d.Keys, slices.Clone(k))
		if v.Version > since {
			recs = append(recs, rec{slices.Clone(k), slices.Clone(v.Meta), slices.Clone(v.Data), v.Version})
		}
		if len(d.Keys) >= limit {
			d.Next = append(slices.Clone(k), 0)
			return false
		}
		return true
	}
	if err := scanUserKeys(db, cursor, visit); err != nil {
		return Dump{}, fmt.Errorf("cluster: dump slots: %w", err)
	}
	// A hash's fields are its rows, read after the key scan (no scan runs
	// inside another's visit).
	for _, r := range recs {
		var fields [][]byte
		if err := scanHashRows(db, r.meta, r.data, func(f, v []byte) {
			fields = append(fields, slices.Clone(f), slices.Clone(v))
		}); err != nil {
			return Dump{}, fmt.Errorf("cluster: dump slots: hash %q: %w", r.key, err)
		}
		d.Entries = kv.AppendSlotImport(d.Entries, r.key, r.meta, r.data, fields, false)
		d.Versions = append(d.Versions, r.ver)
	}
	return d, nil
}

// scanUserKeys visits the engine's user keys from cursor on, in key order,
// until visit returns false. User keys sort around the reserved range
// (kv.ReservedPrefix), which is skipped.
func scanUserKeys(db *storage.DB, cursor []byte, visit func(k []byte, v storage.Value) bool) error {
	resEnd := kv.PrefixEnd(kv.ReservedPrefix)
	stopped := false
	v := func(k []byte, val storage.Value) bool {
		if !visit(k, val) {
			stopped = true
			return false
		}
		return true
	}
	if kv.IsReserved(cursor) {
		cursor = resEnd
	}
	if string(cursor) < string(kv.ReservedPrefix) {
		if err := db.Scan(cursor, kv.ReservedPrefix, 0, 0, v); err != nil {
			return err
		}
		cursor = resEnd
	}
	if stopped {
		return nil
	}
	return db.Scan(cursor, nil, 0, 0, v)
}

// scanHashRows visits the field rows of a hash (meta, data: its metadata
// record); a key of another type has none. Not to be called inside another
// scan's visit.
func scanHashRows(db *storage.DB, meta, data []byte, visit func(field, value []byte)) error {
	if kv.MetaType(meta) != kv.TypeHash {
		return nil
	}
	gen, err := kv.HashGen(data)
	if err != nil {
		return err
	}
	p := kv.HashRowPrefix(gen)
	return db.Scan(p, kv.PrefixEnd(p), 0, 0, func(k []byte, v storage.Value) bool {
		visit(k[len(p):], v.Data)
		return true
	})
}

// SlotStat is what one slot of a group holds: its keys, their bytes (key,
// metadata and value; a hash's field rows with it) and how many of its keys
// were written above a version (the load a rebalance weighs by).
type SlotStat struct {
	Keys, Bytes, Written int64
}

// SlotStatsPage is one page of StatsSlots: the slots of the page's keys, the cursor
// of the next page (nil: the last) and the engine's last version before the
// page was read.
type SlotStatsPage struct {
	Slots map[uint16]SlotStat
	Next  []byte
	At    uint64
}

// SlotStats returns a page of group id's per-slot statistics (StatsSlots)
// at its leader here: what kefir cluster rebalance weighs slots by.
func (m *Multi) SlotStats(id GroupID, cursor []byte, limit int, since, until uint64) (SlotStatsPage, error) {
	g, err := m.led(id)
	if err != nil {
		return SlotStatsPage{}, err
	}
	return StatsSlots(g.h.Engine, cursor, limit, since, until)
}

// StatsSlots counts up to limit user keys of the engine from cursor on by
// slot: keys, bytes, and keys whose version is above since and at most
// until (0: no bound; a rebalance weighing by load takes every group's
// until right after its sample, so that each group's window is the sample
// however long the scans of the groups before it take). Like DumpSlots
// it reads the engine as it stands, page by page (the caller sums pages: a
// slot's keys are spread over the key order).
func StatsSlots(db *storage.DB, cursor []byte, limit int, since, until uint64) (SlotStatsPage, error) {
	type hashRec struct {
		slot       uint16
		meta, data []byte
	}
	st := SlotStatsPage{Slots: map[uint16]SlotStat{}, At: db.LastVersion()}
	var hashes []hashRec
	n := 0
	err := scanUserKeys(db, cursor, func(k []byte, v storage.Value) bool {
		s := Slot(k)
		e := st.Slots[s]
		e.Keys++
		e.Bytes += int64(len(k) + len(v.Meta) + len(v.Data))
		if v.Version > since && (until == 0 || v.Version <= until) {
			e.Written++
		}
		st.Slots[s] = e
		if kv.MetaType(v.Meta) == kv.TypeHash {
			hashes = append(hashes, hashRec{s, slices.Clone(v.Meta), slices.Clone(v.Data)})
		}
		if n++; n >= limit {
			st.Next = append(slices.Clone(k), 0)
			return false
		}
		return true
	})
	if err != nil {
		return SlotStatsPage{}, fmt.Errorf("cluster: slot stats: %w", err)
	}
	for _, h := range hashes {
		e := st.Slots[h.slot]
		if err := scanHashRows(db, h.meta, h.data, func(f, v []byte) { e.Bytes += int64(len(f) + len(v)) }); err != nil {
			return SlotStatsPage{}, fmt.Errorf("cluster: slot stats: %w", err)
		}
		st.Slots[h.slot] = e
	}
	return st, nil
}
