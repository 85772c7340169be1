package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
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
// (GroupScan there), on the node's forwarding connections. So any node
// answers a keyspace scan at any level but session, whatever groups it
// hosts and leads, as Redis Cluster clients expect (redis-py's
// RedisCluster sends KEYS and DBSIZE to one node, go-redis's ClusterClient
// a keyless command to any).
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
// of a keyspace scan at level c (KEFIR.GROUPSCAN; the server's Router).
type GroupScanAsker interface {
	AskGroupScan(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency) (GroupPart, error)
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
}

// SetGroupScanAsker sets how the node asks other nodes for groups' parts
// of a keyspace scan (before it serves; nil: only hosted groups are read).
func (m *Multi) SetGroupScanAsker(a GroupScanAsker) { m.asker = a }

// servedPart reads one group's part of op with read, dropping the keys of
// slots the group's table t says it does not serve, and reading again past
// them until the part has op.Limit served pairs or its range ended.
func servedPart(op kv.Op, t *kv.SlotTable, read func(kv.Op) (kv.Result, error)) (GroupPart, error) {
	var part GroupPart
	var pairs [][]byte
	served := 0 // bytes of the served pairs: only those bound the part
	for {
		res, err := read(op)
		if err != nil {
			return part, err
		}
		size := 0
		for i := 0; i+1 < len(res.Array); i += 2 {
			size += len(res.Array[i]) + len(res.Array[i+1])
			if t != nil && !t.Entry(Slot(res.Array[i])).State.Serves() {
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
	part.Res.Array = pairs
	return part, nil
}

// GroupScan reads group id's part of a keyspace scan at level c at this
// node (KEFIR.GROUPSCAN, which another node's scan sends): a not-leader
// error names the node to ask instead (the front door forwards it there).
func (m *Multi) GroupScan(ctx context.Context, id GroupID, op kv.Op, c level.Consistency) (GroupPart, error) {
	g := m.hs().byID[id]
	if g == nil {
		if _, ok := m.smap().Group(id); !ok {
			return GroupPart{}, &ReplyError{fmt.Sprintf("ERR group %d is not a group of the slot map (epoch %d)", id, m.smap().Epoch)}
		}
		leader, addr, _ := m.Leader(id)
		return GroupPart{}, &NotLeaderError{Leader: leader, Addr: addr}
	}
	part, err := servedPart(op, g.table(), func(op kv.Op) (kv.Result, error) {
		return g.h.Replica.Read(ctx, op, c, shard.Session{})
	})
	part.Res.Group = g.spec.gid()
	return part, err
}

// scanAcross is Scan at a node of several groups (above).
func (m *Multi) scanAcross(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, shard.Session, error) {
	type pair struct{ k, v []byte }
	type stream struct {
		read  func(op kv.Op) (GroupPart, error) // from op.Key on
		pairs []pair
		ended bool
		last  []byte
		gid   uint32
	}
	out := kv.Result{Kind: kv.ResArray}
	after := s
	var parts []*stream
	take := func(st *stream, part GroupPart) {
		part.Res.Group = st.gid
		after = after.AfterRead(part.Res.Pos())
		if part.Res.Kind != 0 {
			out.Kind = part.Res.Kind
		}
		for i := 0; i+1 < len(part.Res.Array); i += 2 {
			st.pairs = append(st.pairs, pair{part.Res.Array[i], part.Res.Array[i+1]})
		}
		st.ended, st.last = part.Ended, part.Last
	}
	for _, spec := range m.smap().Groups {
		id := spec.ID
		g := m.hs().byID[id]
		st := &stream{gid: spec.gid()}
		remote := func(op kv.Op, refused error) (GroupPart, error) { return m.remotePart(ctx, id, refused, op, c) }
		st.read = func(op kv.Op) (GroupPart, error) { return remote(op, ErrNotLeader) }
		part, err := GroupPart{}, error(ErrNotLeader)
		if g != nil {
			local := func(op kv.Op) (GroupPart, error) {
				return servedPart(op, g.table(), func(op kv.Op) (kv.Result, error) {
					return g.h.Replica.Read(ctx, op, c, g.session(s))
				})
			}
			if part, err = local(op); err == nil {
				st.read = local
			}
		}
		if errors.Is(err, ErrNotLeader) {
			part, err = remote(op, err)
		}
		if err != nil {
			return kv.Result{}, s, err
		}
		take(st, part)
		parts = append(parts, st)
	}
	// The merged page is exact up to the smallest key an unfinished part
	// reached (a part says nothing of its keys after its last). If fewer
	// than Limit keys lie below that point — a part cut short, at
	// kv.MaxScanBytes, by another node's older build — that part is read
	// on: a short page would read as the range's end to the caller.
	var all []pair
	for {
		var limiting *stream
		for _, st := range parts {
			if !st.ended && (limiting == nil || bytes.Compare(st.last, limiting.last) < 0) {
				limiting = st
			}
		}
		all = all[:0]
		size := 0
		for _, st := range parts {
			for _, p := range st.pairs {
				if limiting == nil || bytes.Compare(p.k, limiting.last) <= 0 {
					all = append(all, p)
					size += len(p.k) + len(p.v)
				}
			}
		}
		if limiting == nil || op.Limit <= 0 || len(all) >= op.Limit || size >= kv.MaxScanBytes {
			break
		}
		next := op
		next.Key = append(slices.Clip(limiting.last), 0)
		part, err := limiting.read(next)
		if err != nil {
			return kv.Result{}, s, err
		}
		prev := limiting.last
		take(limiting, part)
		if !limiting.ended && bytes.Compare(limiting.last, prev) <= 0 {
			return kv.Result{}, s, fmt.Errorf("a keyspace scan's part did not advance past %q", prev)
		}
	}
	slices.SortFunc(all, func(a, b pair) int { return bytes.Compare(a.k, b.k) })
	if op.Limit > 0 && len(all) > op.Limit {
		all = all[:op.Limit]
	}
	out.Array = make([][]byte, 0, 2*len(all))
	for _, p := range all {
		out.Array = append(out.Array, p.k, p.v)
	}
	return out, after, nil
}

// remotePart asks group id's leader for its part (refused: the error the
// local replica gave, which may name it; the map's idea of the leader
// otherwise). A session's part of another node's group is not carried
// there: a keyspace scan at level session needs every group here.
func (m *Multi) remotePart(ctx context.Context, id GroupID, refused error, op kv.Op, c level.Consistency) (GroupPart, error) {
	if c.Kind == level.Session {
		return GroupPart{}, &ReplyError{fmt.Sprintf("ERR a keyspace scan (KEYS, SCAN, KEFIR.SCAN) at level session needs this node to serve every group, and it cannot serve group %d here: scan at another level, or at a node that hosts every group (issue 28)", id)}
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
			if part, err = m.asker.AskGroupScan(ctx, addr, id, op, c); err == nil {
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
// ended (0|1), last key, [key, value, ...]].
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
	return resp.Value{Kind: resp.Array, Elems: []resp.Value{
		{Kind: resp.Int, Int: int64(p.Res.Version)}, {Kind: resp.Int, Int: view}, {Kind: resp.Int, Int: ended},
		{Kind: resp.Bulk, Str: p.Last}, {Kind: resp.Array, Elems: pairs}}}
}

// AskGroupScan asks the node at addr for group id's part of a keyspace
// scan at level c: KEFIR.CALL CONSISTENCY c CMD KEFIR.GROUPSCAN id start end
// limit, on a pooled forwarding connection (a node that cannot serve it
// forwards it to the group's leader, as any read).
func (r *Router) AskGroupScan(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency) (GroupPart, error) {
	v, err := r.fwd.ask(ctx, addr, []byte("KEFIR.CALL"), []byte("CONSISTENCY"), []byte(c.String()), []byte("CMD"), []byte("KEFIR.GROUPSCAN"),
		strconv.AppendUint(nil, uint64(id), 10), op.Key, op.End, strconv.AppendInt(nil, int64(op.Limit), 10))
	if err != nil {
		return GroupPart{}, err
	}
	if v.Kind == resp.Error {
		return GroupPart{}, &ReplyError{string(v.Str)}
	}
	e := v.Elems
	if v.Kind != resp.Array || len(e) != 5 || e[0].Kind != resp.Int || e[1].Kind != resp.Int || e[2].Kind != resp.Int || e[4].Kind != resp.Array {
		return GroupPart{}, fmt.Errorf("KEFIR.GROUPSCAN at %s: unexpected reply", addr)
	}
	p := GroupPart{Res: kv.Result{Kind: kv.ResArray, Version: uint64(e[0].Int)}, Ended: e[2].Int == 1, Last: e[3].Str}
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
