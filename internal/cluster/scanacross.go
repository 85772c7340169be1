package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// A keyspace scan (KEYS, SCAN, KEFIR.SCAN) at a node of several groups
// merges every group's ordered stream (issue 28: "KEFIR.SCAN over the whole
// keyspace merges the groups' ordered streams"). A group this node hosts
// and can serve at the read's level is read here; any other group's part —
// not hosted here (a cluster of more nodes than a group has members), or
// not readable here at that level (a linearizable scan at a node that does
// not lead the group) — is asked of the group's leader with KEFIR.GROUPSCAN
// (GroupScan there), on the node's forwarding connections — at level
// session with the session, whose part of the group is read there. So any
// node answers a keyspace scan at any level, whatever groups it hosts and
// leads, as Redis Cluster clients expect (redis-py's RedisCluster sends
// KEYS and DBSIZE to one node, go-redis's ClusterClient a keyless command
// to any).
//
// Each part is a stream of served keys: a group's engine may hold keys of
// slots it does not serve (being imported, or handed over and not yet
// purged), which are dropped, and a part read again past them until it has
// Limit served pairs or reaches its range's end (servedPart): a part cut
// short by its table would otherwise end the caller's scan early. The
// merge sorts the parts' pairs and cuts at Limit; the Limit smallest keys
// of parts that each hold Limit (or all) of their keys from the start are
// the range's first Limit. A part stops short only at kv.MaxScanBytes of
// served pairs, and says nothing of its keys after the last it reached, so
// the merge keeps only keys up to the smallest such point — reading the
// limiting part on while fewer than Limit lie below it (a short page would
// read as the range's end). Every key of every group in the merged range
// is then in it: SCAN's guarantee.

// GroupScanAsker asks the node at client address addr for group id's part
// of a keyspace scan at level c (KEFIR.GROUPSCAN; the server's Router), at
// level session for session s (its part of the group is read there).
type GroupScanAsker interface {
	AskGroupScan(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error)
}

// GroupPart is one group's part of a keyspace scan: its served pairs
// (key, value, ...), whether its range ended, and the version and view of
// the read (for the session it advances).
type GroupPart struct {
	Res   kv.Result
	Ended bool
	// Last is the last key the part's reads reached (served or not): the
	// part says nothing of its keys after it unless Ended.
	Last []byte
	// served are the slots whose every key in the part's range the part
	// holds: those its group served throughout its reads (nil: unknown, a
	// node of an older build; taken as every slot).
	served *slotSet
	// ranks are the slots' ranks in the tables the part's reads loaded,
	// the lowest and the highest of each (slotrank.go; nil: unknown, a
	// node of an older build, whose keys are all kept).
	ranks slotRanks
}

// slotSet is a set of slots, a bit each.
type slotSet [Slots / 64]uint64

func (s *slotSet) has(slot uint16) bool { return s[slot/64]&(1<<(slot%64)) != 0 }

func (s *slotSet) add(slot uint16) { s[slot/64] |= 1 << (slot % 64) }

// everySlot returns the set of every slot.
func everySlot() slotSet {
	var s slotSet
	for i := range s {
		s[i] = ^uint64(0)
	}
	return s
}

// keep removes from s the slots not in o.
func (s *slotSet) keep(o *slotSet) {
	for i := range s {
		s[i] &= o[i]
	}
}

// servedSlots caches the sets of slots a group's latest tables serve (a
// table is immutable and changes only at a move's steps; a page reads it
// twice per part read, and across a move's window before and after differ).
type servedSlots struct {
	p atomic.Pointer[[]*tableServed]
}

type tableServed struct {
	t *kv.SlotTable
	s slotSet
	r slotRanks // the slots' ranks (slotrank.go)
}

// servedCached is how many tables servedSlots keeps: a move's steps make
// three of a group's (before, during, after).
const servedCached = 4

// of returns the slots t serves and their ranks.
func (c *servedSlots) of(t *kv.SlotTable) *tableServed {
	var old []*tableServed
	if p := c.p.Load(); p != nil {
		old = *p
	}
	for _, x := range old {
		if x.t == t {
			return x
		}
	}
	x := &tableServed{t: t, r: ranksOf(t, nil)}
	for slot := range uint16(Slots) {
		if t.Entry(slot).State.Serves() {
			x.s.add(slot)
		}
	}
	// A new list, the newest first (a concurrent miss may drop one: it is
	// computed again when next needed).
	n := append([]*tableServed{x}, old[:min(len(old), servedCached-1)]...)
	c.p.Store(&n)
	return x
}

// ranges returns s as ranges of consecutive slots, in order.
func (s *slotSet) ranges() []SlotRange {
	var out []SlotRange
	for slot := range uint16(Slots) {
		if !s.has(slot) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End == slot-1 {
			out[n-1].End = slot
		} else {
			out = append(out, SlotRange{slot, slot})
		}
	}
	return out
}

// SetGroupScanAsker sets how the node asks other nodes for groups' parts
// of a keyspace scan (before it serves; nil: only hosted groups are read).
func (m *Multi) SetGroupScanAsker(a GroupScanAsker) { m.asker = a }

// servedPart reads group g's part of op with read, dropping the keys of
// slots the group's table says it does not serve, and reading again past
// them until the part has op.Limit served pairs or its range ended.
//
// A slot counts as served by a read only if the table loaded before it and
// the one loaded after it both serve the slot. The engine applies a batch
// before its table is published, so a table that serves the slot before
// the read means the read sees the take-over's state, final copy included
// (a destination's table loaded only after could name a take-over that
// came after a read of a partial copy); and a table that still serves it
// after the read means the hand-over, if the read saw it at all, was not
// acknowledged yet, so no other group had served a write of the slot (a
// source's table loaded only before could be older than a read of its
// purged engine). The part's served set is the slots every read served
// (a group without a table serves the slots of its spec, --groups: no move
// ever touched it); the merge reads the page again while some slot is in
// no part's set (scanAcross).
func servedPart(op kv.Op, g *localGroup, read func(kv.Op) (kv.Result, error)) (GroupPart, error) {
	var part GroupPart
	var pairs [][]byte
	served := 0 // bytes of the served pairs: only those bound the part
	cover := everySlot()
	var top kv.Result // the read of the largest version
	for {
		before := g.table()
		res, err := read(op)
		if err != nil {
			return part, err
		}
		if res.Version >= top.Version {
			top = res
		}
		after := g.table()
		for i, t := range []*kv.SlotTable{before, after} {
			if i == 1 && after == before {
				break // the same table: nothing more to remove
			}
			if t == nil {
				cover.keep(&g.owned)
				part.ranks = spanRanks(part.ranks, g.noTable)
			} else {
				ts := g.served.of(t)
				cover.keep(&ts.s)
				part.ranks = spanRanks(part.ranks, ts.r)
			}
		}
		serves := func(slot uint16) bool {
			return (before == nil || before.Entry(slot).State.Serves()) && (after == nil || after.Entry(slot).State.Serves())
		}
		size := 0
		for i := 0; i+1 < len(res.Array); i += 2 {
			size += len(res.Array[i]) + len(res.Array[i+1])
			if !serves(Slot(res.Array[i])) {
				continue
			}
			pairs = append(pairs, res.Array[i], res.Array[i+1])
			served += len(res.Array[i]) + len(res.Array[i+1])
		}
		part.Res = res
		if len(res.Array) >= 2 {
			part.Last = res.Array[len(res.Array)-2]
		}
		part.Ended = op.Limit <= 0 || (len(res.Array)/2 < op.Limit && size < kv.MaxScanBytes)
		// A read the engine stopped at kv.MaxScanBytes of unserved keys
		// (an import in progress) is read on past them: only served bytes
		// may end a part short, so its short page carries them and does
		// not read as the range's end.
		if part.Ended || len(pairs)/2 >= op.Limit || served >= kv.MaxScanBytes {
			break
		}
		op.Key = append(slices.Clip(part.Last), 0) // the first key after it
	}
	// The part returns keys of every read: its position, which advances
	// the session, is the read's of the largest version (with that read's
	// view), not the last read's — a session read at a replica behind an
	// earlier read's key would serve its older state.
	part.Res.Version, part.Res.View, part.Res.ViewKnown = top.Version, top.View, top.ViewKnown
	part.Res.Array = pairs
	part.served = &cover
	return part, nil
}

// GroupScan reads group id's part of a keyspace scan at level c at this
// node (KEFIR.GROUPSCAN, which another node's scan sends), at level session
// for session s — its part of the group, after its other parts are checked
// against the groups hosted here (sessionAt), as any read's: the part's
// version and view advance the asking node's session. A not-leader error
// names the node to ask instead (the front door forwards it there).
func (m *Multi) GroupScan(ctx context.Context, id GroupID, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error) {
	g := m.hs().byID[id]
	if g == nil {
		if _, ok := m.smap().Group(id); !ok {
			return GroupPart{}, &ReplyError{fmt.Sprintf("ERR group %d is not a group of the slot map (epoch %d)", id, m.smap().Epoch)}
		}
		leader, addr, _ := m.Leader(id)
		return GroupPart{}, &NotLeaderError{Leader: leader, Addr: addr}
	}
	gs, err := m.sessionAt(g, c, s)
	if err != nil {
		return GroupPart{}, err
	}
	part, err := servedPart(op, g, func(op kv.Op) (kv.Result, error) {
		return g.h.Replica.Read(ctx, op, c, gs)
	})
	part.Res.Group = g.spec.gid()
	if err == nil {
		err = m.scanCopies(g.spec.gid(), c, s)
	}
	return part, err
}

// scanCopies checks, at level session, s's parts of groups other than skip
// against the view copies the groups hosted here hold, after a keyspace
// scan's reads here, as a keyed read checks them after its read
// (otherParts): a part that served a slot a move brought applied the
// take-over, and before it the import of the source's copy. A scan reads
// every group of the map, each judging its own part of the session where
// it is read, but a group removed after its slots moved away is read
// nowhere: only the copies its slots brought judge the session's part of
// it (docs/design/cluster.md §8).
func (m *Multi) scanCopies(skip uint32, c level.Consistency, s shard.Session) error {
	if mutation.On && MultiMut.ScanCopiesUnchecked.Load() {
		return nil
	}
	return m.copiedParts(skip, c, s)
}

// scanAcross is Scan at a node of several groups (above). A page whose
// parts together did not serve every slot throughout their reads — a slot
// in a move's window (handed over by its source, not yet taken over by its
// destination) at some part's read, or taken over only after the
// destination's part was read and handed over before the source's — may
// lack that slot's keys, so it is read again, at once and then backing
// off, as a keyed request for the slot is forwarded again until a group
// serves it; after remoteScanFor the scan fails (TRYAGAIN) rather than
// return a page that may miss keys.
func (m *Multi) scanAcross(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, shard.Session, error) {
	deadline := time.Now().Add(remoteScanFor)
	pause := time.Duration(0)
	for {
		res, after, uncovered, err := m.scanPage(ctx, op, c, s)
		if err != nil || uncovered < 0 || (mutation.On && MultiMut.ScanWindowUnchecked.Load()) {
			return res, after, err
		}
		if time.Now().Add(pause).After(deadline) || ctx.Err() != nil {
			return kv.Result{}, s, &ReplyError{fmt.Sprintf("TRYAGAIN a keyspace scan's page was read while slot %d moved, and again for %s: no group served it throughout", uncovered, remoteScanFor)}
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(max(2*pause, 20*time.Millisecond), 500*time.Millisecond)
	}
}

// scanPage reads one page of a keyspace scan at a node of several groups
// (scanAcross), and names a slot no part served throughout its reads (-1:
// none; the page holds every key of every slot in its range).
func (m *Multi) scanPage(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, shard.Session, int, error) {
	type pair struct {
		k, v []byte
		gid  uint32 // the part's group
	}
	type stream struct {
		read  func(op kv.Op) (GroupPart, error) // from op.Key on
		pairs []pair
		ended bool
		last  []byte
		gid   uint32
		cover slotSet // the slots every read of the part served
		// ranks are the slots' ranks over the part's reads (slotrank.go);
		// unranked: some read's were unknown (a node of an older build).
		ranks    slotRanks
		unranked bool
		// behind are the slots where some other part's table ranks
		// higher than the part's (nil: none).
		behind slotRanks
	}
	out := kv.Result{Kind: kv.ResArray}
	after := s
	var parts []*stream
	readHere := false // some part was read at a hosted replica
	take := func(st *stream, part GroupPart) {
		part.Res.Group = st.gid
		after = after.AfterRead(part.Res.Pos())
		if part.Res.Kind != 0 {
			out.Kind = part.Res.Kind
		}
		for i := 0; i+1 < len(part.Res.Array); i += 2 {
			st.pairs = append(st.pairs, pair{part.Res.Array[i], part.Res.Array[i+1], st.gid})
		}
		st.ended, st.last = part.Ended, part.Last
		if part.served != nil {
			st.cover.keep(part.served)
		}
		if part.ranks == nil {
			st.unranked = true
		} else {
			st.ranks = spanRanks(st.ranks, part.ranks)
		}
	}
	for _, spec := range m.smap().Groups {
		id := spec.ID
		g := m.hs().byID[id]
		st := &stream{gid: spec.gid(), cover: everySlot()}
		remote := func(op kv.Op, refused error) (GroupPart, error) { return m.remotePart(ctx, id, refused, op, c, s) }
		st.read = func(op kv.Op) (GroupPart, error) { return remote(op, ErrNotLeader) }
		part, err := GroupPart{}, error(ErrNotLeader)
		if g != nil {
			local := func(op kv.Op) (GroupPart, error) {
				return servedPart(op, g, func(op kv.Op) (kv.Result, error) {
					return g.h.Replica.Read(ctx, op, c, g.session(s))
				})
			}
			if part, err = local(op); err == nil {
				st.read = local
				readHere = true
			}
		}
		if errors.Is(err, ErrNotLeader) {
			part, err = remote(op, err)
		}
		if err != nil {
			return kv.Result{}, s, -1, err
		}
		take(st, part)
		parts = append(parts, st)
	}
	// The merged page is exact up to the smallest key an unfinished part
	// reached (a part says nothing of its keys after its last). If fewer
	// than Limit keys lie below that point — a part cut short, at
	// kv.MaxScanBytes, by another node's older build — that part is read
	// on: a short page would read as the range's end to the caller. A key
	// two parts returned (its slot moved between their reads, served by
	// each at its read) is kept once: it would count twice toward Limit.
	// At levels that order reads (linearizable to session) a part's keys
	// of a slot are kept only if no part's table ranks the slot above
	// the part's own (slotrank.go): at level session a source's replica
	// may be a follower behind its hand-over, its table still serving
	// the slot and its engine the slot's state before the move, older
	// than the session's own writes (and deletions) at the destination.
	// Its slot then counts as not served by it: the page is read again
	// unless the part ranked highest served the slot. Among parts of
	// equal rank (none across groups in a correct history), the copy of
	// a key kept is the one of the group a keyed read of it goes to
	// (SlotOwner).
	ranked := c.Kind >= level.Linearizable && c.Kind <= level.Session && !(mutation.On && MultiMut.ScanPartsUnranked.Load())
	rank := func() {
		if !ranked {
			return
		}
		var best slotRanks // the highest rank of every slot over the parts
		for _, st := range parts {
			if !st.unranked {
				best = highest(best, st.ranks)
			}
		}
		for _, st := range parts {
			st.behind = nil
			if !st.unranked && below(st.ranks, best) {
				st.behind = combineRanks(st.ranks, best, func(x, y rankRun) rankRun {
					if x.Lo < y.Hi {
						return rankRun{Lo: 1, Hi: 1}
					}
					return rankRun{}
				})
			}
		}
	}
	// behind reports whether a part's keys of slot may be older than
	// another part's state of it (outside a move's window, no part's
	// are: nothing is looked up per key).
	behind := func(st *stream, k []byte) bool {
		return st.behind != nil && st.behind.at(Slot(k)).Lo == 1
	}
	rank()
	byKeyOwnerFirst := func(a, b pair) int {
		if c := bytes.Compare(a.k, b.k); c != 0 {
			return c
		}
		o, _ := m.owner(Slot(a.k))
		isO := func(p pair) int {
			if GroupID(p.gid) == o {
				return 0
			}
			return 1
		}
		return isO(a) - isO(b)
	}
	var all []pair
	for {
		var limiting *stream
		for _, st := range parts {
			if !st.ended && (limiting == nil || bytes.Compare(st.last, limiting.last) < 0) {
				limiting = st
			}
		}
		all = all[:0]
		for _, st := range parts {
			for _, p := range st.pairs {
				if (limiting == nil || bytes.Compare(p.k, limiting.last) <= 0) && !behind(st, p.k) {
					all = append(all, p)
				}
			}
		}
		slices.SortFunc(all, byKeyOwnerFirst)
		all = slices.CompactFunc(all, func(a, b pair) bool { return bytes.Equal(a.k, b.k) })
		size := 0
		for _, p := range all {
			size += len(p.k) + len(p.v)
		}
		if limiting == nil || op.Limit <= 0 || len(all) >= op.Limit || size >= kv.MaxScanBytes {
			break
		}
		next := op
		next.Key = append(slices.Clip(limiting.last), 0)
		part, err := limiting.read(next)
		if err != nil {
			return kv.Result{}, s, -1, err
		}
		prev := limiting.last
		take(limiting, part)
		if !limiting.ended && bytes.Compare(limiting.last, prev) <= 0 {
			return kv.Result{}, s, -1, fmt.Errorf("a keyspace scan's part did not advance past %q", prev)
		}
		rank()
	}
	if readHere {
		// After the reads here: the copies the moves of the slots they
		// served brought were applied before (scanCopies). Parts read
		// at other nodes were checked there (GroupScan).
		if err := m.scanCopies(0, c, s); err != nil {
			return kv.Result{}, s, -1, err
		}
	}
	if op.Limit > 0 && len(all) > op.Limit {
		all = all[:op.Limit]
	}
	out.Array = make([][]byte, 0, 2*len(all))
	for _, p := range all {
		out.Array = append(out.Array, p.k, p.v)
	}
	var covered slotSet
	for _, st := range parts {
		// A part behind another's state of a slot does not hold it.
		start := uint16(0)
		for _, r := range st.behind {
			if r.Lo == 1 {
				for slot := start; slot <= r.End; slot++ {
					st.cover[slot/64] &^= 1 << (slot % 64)
				}
			}
			start = r.End + 1
		}
		for i := range covered {
			covered[i] |= st.cover[i]
		}
	}
	for i, w := range covered {
		if w != ^uint64(0) {
			for b := range 64 {
				if w&(1<<b) == 0 {
					return out, after, i*64 + b, nil
				}
			}
		}
	}
	return out, after, -1, nil
}

// remotePart asks group id's leader for its part (refused: the error the
// local replica gave, which may name it; the map's idea of the leader
// otherwise). At level session the session s travels with the request, so
// the node asked reads the group at the session's part of it (read your
// writes, whichever node took them); the part's version and view come back
// and advance the session here (scanPage's take).
func (m *Multi) remotePart(ctx context.Context, id GroupID, refused error, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error) {
	if c.Kind != level.Session || (mutation.On && MultiMut.ScanSessionNotCarried.Load()) {
		s = shard.Session{}
	}
	if m.asker == nil {
		return GroupPart{}, &ReplyError{fmt.Sprintf("ERR a keyspace scan at level %s cannot read group %d at this node", c, id)}
	}
	_, addr, _ := LeaderOf(refused)
	// The node asked may die or lose the group's leadership meanwhile:
	// asked again, of the leader this node knows by then, for as long as
	// a forwarded read is (the node asked forwards a part it cannot serve,
	// and waits for a leader, itself).
	deadline := time.Now().Add(remoteScanFor)
	pause := 20 * time.Millisecond
	hops := 0
	for {
		if addr == "" {
			_, addr, _ = m.Leader(id)
		}
		var err error
		if addr == "" {
			err = fmt.Errorf("%w: no node of group %d is known", ErrNoLeader, id)
		} else {
			var part GroupPart
			if part, err = m.asker.AskGroupScan(ctx, addr, id, op, c, s); err == nil {
				if part.served == nil && !s.IsZero() {
					// An older build's reply (five elements): its node read
					// the part without the session (its GroupScan took
					// none), so it may lack the session's writes.
					return GroupPart{}, &ReplyError{fmt.Sprintf("ERR a keyspace scan at level session cannot read group %d at %s, a node of an older build that does not read it for the session: scan at another level, or once every node runs this build", id, addr)}
				}
				return part, nil
			}
			var re *ReplyError
			if errors.As(err, &re) && !retryableReply(re.Msg) {
				return GroupPart{}, fmt.Errorf("group %d's part of a keyspace scan (asked at %s): %w", id, addr, err)
			}
			if re != nil && strings.HasPrefix(re.Msg, "MOVED ") && hops < 3 {
				// The node asked names the leader: ask it next, at once
				// (a few hops: two nodes that disagree back off below).
				if f := strings.Fields(re.Msg); len(f) >= 2 {
					addr, hops = f[len(f)-1], hops+1
					continue
				}
			}
		}
		if time.Now().Add(pause).After(deadline) || ctx.Err() != nil {
			return GroupPart{}, fmt.Errorf("group %d's part of a keyspace scan (asked at %q): %w", id, addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause, addr, hops = min(2*pause, 500*time.Millisecond), "", 0
	}
}

// remoteScanFor bounds how long a part of a keyspace scan is asked again.
const remoteScanFor = 10 * time.Second

// retryableReply reports whether an error reply to KEFIR.GROUPSCAN says the
// part may be served if asked again (of the leader known by then): no
// leader yet, a redirect, a slot in flight.
func retryableReply(msg string) bool {
	for _, p := range []string{"UNAVAILABLE", "MOVED", "TRYAGAIN", "LOADING"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// GroupScanReply is KEFIR.GROUPSCAN's reply: [version, view (-1: unknown),
// ended (0|1), last key, [key, value, ...], [start, end, ...], [end, lo,
// hi, ...]]: the sixth, the ranges of slots (inclusive) the part served
// throughout its reads, from which the asking node tells whether its page
// may lack a moving slot's keys (scanAcross); the seventh, the slots' ranks
// in the tables the part's reads loaded, as runs (each from the previous
// run's end + 1), from which it tells whether the part is behind another's
// state of a slot (slotrank.go).
func GroupScanReply(p GroupPart) resp.Value {
	view := int64(-1)
	if p.Res.ViewKnown {
		view = int64(p.Res.View)
	}
	ended := int64(0)
	if p.Ended {
		ended = 1
	}
	pairs := make([]resp.Value, len(p.Res.Array))
	for i, b := range p.Res.Array {
		pairs[i] = resp.Value{Kind: resp.Bulk, Str: b}
	}
	var served []resp.Value
	if p.served != nil {
		for _, r := range p.served.ranges() {
			served = append(served, resp.Value{Kind: resp.Int, Int: int64(r.Start)}, resp.Value{Kind: resp.Int, Int: int64(r.End)})
		}
	}
	out := resp.Value{Kind: resp.Array, Elems: []resp.Value{
		{Kind: resp.Int, Int: int64(p.Res.Version)}, {Kind: resp.Int, Int: view}, {Kind: resp.Int, Int: ended},
		{Kind: resp.Bulk, Str: p.Last}, {Kind: resp.Array, Elems: pairs}, {Kind: resp.Array, Elems: served}}}
	if p.ranks != nil {
		ranks := make([]resp.Value, 0, 3*len(p.ranks))
		for _, r := range p.ranks {
			ranks = append(ranks, resp.Value{Kind: resp.Int, Int: int64(r.End)}, resp.Value{Kind: resp.Int, Int: int64(r.Lo)}, resp.Value{Kind: resp.Int, Int: int64(r.Hi)})
		}
		out.Elems = append(out.Elems, resp.Value{Kind: resp.Array, Elems: ranks})
	}
	return out
}

// AskGroupScan asks the node at addr for group id's part of a keyspace
// scan at level c: KEFIR.CALL CONSISTENCY c SESSION token CMD
// KEFIR.GROUPSCAN id start end limit, on a pooled forwarding connection (a
// node that cannot serve it forwards it to the group's leader, as any
// read). The session goes with it (at levels other than session the fresh
// one); the reply comes as [token, reply], whose token is not needed here:
// the part's version and view are the group's advance.
func (r *Router) AskGroupScan(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error) {
	// SESSION always, the fresh session's "" too: the connection is pooled,
	// shared by every scan this node asks of addr, and a KEFIR.GROUPSCAN
	// without it is read at — and advances — the connection's own session
	// there, which would mix other scans' positions into this one's.
	args := [][]byte{[]byte("KEFIR.CALL"), []byte("CONSISTENCY"), []byte(c.String()), []byte("SESSION"), []byte(s.String()),
		[]byte("CMD"), []byte("KEFIR.GROUPSCAN"),
		strconv.AppendUint(nil, uint64(id), 10), op.Key, op.End, strconv.AppendInt(nil, int64(op.Limit), 10)}
	v, err := r.fwd.ask(ctx, addr, args...)
	if err != nil {
		return GroupPart{}, err
	}
	if v.Kind == resp.Array && len(v.Elems) == 2 && (v.Elems[1].Kind == resp.Array || v.Elems[1].Kind == resp.Error) {
		v = v.Elems[1] // [token, reply]: KEFIR.CALL SESSION's shape
	}
	return parseGroupScanReply(addr, v)
}

// parseGroupScanReply reads GroupScanReply's reply v from the node at addr.
func parseGroupScanReply(addr string, v resp.Value) (GroupPart, error) {
	if v.Kind == resp.Error {
		return GroupPart{}, &ReplyError{string(v.Str)}
	}
	e := v.Elems
	if v.Kind != resp.Array || len(e) < 5 || e[0].Kind != resp.Int || e[1].Kind != resp.Int || e[2].Kind != resp.Int || e[4].Kind != resp.Array {
		return GroupPart{}, fmt.Errorf("KEFIR.GROUPSCAN at %s: unexpected reply", addr)
	}
	p := GroupPart{Res: kv.Result{Kind: kv.ResArray, Version: uint64(e[0].Int)}, Ended: e[2].Int == 1, Last: e[3].Str}
	if len(e) >= 6 { // five: a node of an older build, which does not say (taken as every slot)
		p.served = &slotSet{}
		r := e[5].Elems
		for i := 0; i+1 < len(r); i += 2 {
			if r[i].Kind != resp.Int || r[i+1].Kind != resp.Int || r[i].Int < 0 || r[i].Int > r[i+1].Int || r[i+1].Int >= Slots {
				return GroupPart{}, fmt.Errorf("KEFIR.GROUPSCAN at %s: a bad range of served slots", addr)
			}
			for slot := uint16(r[i].Int); slot <= uint16(r[i+1].Int); slot++ {
				p.served.add(slot)
			}
		}
	}
	if len(e) >= 7 { // six or five: an older build's, which does not say (its keys kept)
		if e[6].Kind != resp.Array {
			return GroupPart{}, fmt.Errorf("KEFIR.GROUPSCAN at %s: unexpected reply", addr)
		}
		r := e[6].Elems
		p.ranks = make(slotRanks, 0, len(r)/3)
		for i := 0; i+2 < len(r); i += 3 {
			if r[i].Kind != resp.Int || r[i+1].Kind != resp.Int || r[i+2].Kind != resp.Int || r[i].Int < 0 || r[i].Int >= Slots || r[i+1].Int < 0 || r[i+2].Int < 0 {
				return GroupPart{}, fmt.Errorf("KEFIR.GROUPSCAN at %s: a bad run of slot ranks", addr)
			}
			p.ranks = append(p.ranks, rankRun{End: uint16(r[i].Int), Lo: uint64(r[i+1].Int), Hi: uint64(r[i+2].Int)})
		}
		if len(r)%3 != 0 || !validRanks(p.ranks) {
			return GroupPart{}, fmt.Errorf("KEFIR.GROUPSCAN at %s: slot ranks that do not cover every slot", addr)
		}
	}
	// Elements past the seventh (a newer build's) are left for it.
	if e[1].Int >= 0 {
		p.Res.View, p.Res.ViewKnown = uint64(e[1].Int), true
	}
	p.Res.Array = make([][]byte, len(e[4].Elems))
	for i, x := range e[4].Elems {
		p.Res.Array[i] = x.Str
	}
	return p, nil
}

// AskGroupKeys asks the node at addr how many user keys its replica of
// group id holds (KEFIR.GROUPSCAN id COUNT; DBSIZE at a node that does not
// host every group). A node that does not host it forwards it to the
// group's leader.
func (r *Router) AskGroupKeys(ctx context.Context, addr string, id GroupID) (int64, error) {
	v, err := r.fwd.ask(ctx, addr, []byte("KEFIR.GROUPSCAN"), strconv.AppendUint(nil, uint64(id), 10), []byte("COUNT"))
	if err != nil {
		return 0, fmt.Errorf("group %d's key count (asked at %s): %w", id, addr, err)
	}
	switch v.Kind {
	case resp.Int:
		return v.Int, nil
	case resp.Error:
		return 0, fmt.Errorf("group %d's key count (asked at %s): %s", id, addr, v.Str)
	}
	return 0, fmt.Errorf("group %d's key count (asked at %s): unexpected reply", id, addr)
}
