package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// The nilext fast path (Skyros; docs/design/nilext.md, ARCHITECTURE §5.2).
//
// With WithNilext, and a replica group running --nilext (the client asks
// KEFIR.TOPOLOGY once), Put and MultiPut outside a Session are sent by the
// client itself to every replica (KEFIR.NILEXT) and complete on
// f + ceil(f/2) + 1 acks of one view, the leader's among them: one round
// trip instead of the ordered path's two. The replicas append the write to
// their durability logs; the leader orders it in the background.
//
// A write that gets no such supermajority within the nilext timeout (a
// replica down, slow or partitioned, a view change) falls back to the
// ordered path with the same request id, so a copy that did reach some
// d-logs and the ordered copy apply once. After two such fallbacks in a row
// the fast path rests for the backoff (writes go straight to the ordered
// path), then is tried again; one stalled write alone does not make it rest.
//
// Identities: a replica's d-log cleanup assumes one nilext write in flight
// per client id, sent in request-number order. A write takes one of the
// client's lanes (lanes.go: a random client id and its request counter, used
// by one write at a time, shared with the ordered path), and a member's
// writes go over one connection, so per replica the writes of a lane arrive
// in order. A lane whose fallback's outcome stayed unknown is retired (its
// ordered copy may still be in flight).

// Defaults of WithNilext.
const (
	DefaultNilextTimeout = 50 * time.Millisecond
	DefaultNilextBackoff = time.Second
)

// restAfter is how many writes in a row must miss the supermajority
// before the fast path rests.
const restAfter = 2

type nilextOptions struct {
	timeout, backoff time.Duration
	conns            int // connections (batches in flight) per member
}

// WithNilextConns sets how many connections the nilext fast path keeps to
// each replica (default 1), each with one KEFIR.NILEXT BATCH in flight.
// With one, a write that arrives while a batch is out waits for that batch's
// whole round trip before its own batch leaves: under a few concurrent
// writers that doubles their latency. With more, a new batch leaves on an
// idle connection at once, and the replica's driver can share one fsync
// among batches from several connections. It adjusts WithNilext: give it
// after WithNilext (alone, or before it, it does nothing).
func WithNilextConns(n int) Option {
	return func(o *options) {
		if o.nilext != nil {
			o.nilext.conns = n
		}
	}
}

// WithNilext turns on the nilext fast path for Put and MultiPut (outside
// sessions) when the replica group runs it. timeout bounds how long a write
// waits for a supermajority before it falls back to the ordered path;
// backoff is how long the fast path then rests. Zero picks
// DefaultNilextTimeout and DefaultNilextBackoff. Writes return exactly what
// the ordered path returns; Delete keeps the ordered path (its reply says
// whether the key existed, which depends on state).
func WithNilext(timeout, backoff time.Duration) Option {
	return func(o *options) {
		if timeout <= 0 {
			timeout = DefaultNilextTimeout
		}
		if backoff <= 0 {
			backoff = DefaultNilextBackoff
		}
		o.nilext = &nilextOptions{timeout: timeout, backoff: backoff}
	}
}

// NilextStats counts the client's nilext writes.
type NilextStats struct {
	// Fast writes completed on a supermajority; Fallbacks took the ordered
	// path after one missed it; Rested took the ordered path while the fast
	// path rested after a fallback.
	Fast, Fallbacks, Rested uint64
	// Batches is how many KEFIR.NILEXT BATCH commands went out (to all
	// members together), Items how many writes they carried: Items/Batches
	// is the group commit's batch size.
	Batches, Items uint64
}

// NilextStats reports the fast path's counters (zero without WithNilext).
func (c *Client) NilextStats() NilextStats {
	if c.nx == nil {
		return NilextStats{}
	}
	return NilextStats{Fast: c.nx.fast.Load(), Fallbacks: c.nx.fallbacks.Load(), Rested: c.nx.rested.Load(),
		Batches: c.nx.batches.Load(), Items: c.nx.items.Load()}
}

type nilextPath struct {
	c    *Client
	opts nilextOptions

	mu      sync.Mutex
	topo    *topology  // nil until learned
	retryAt time.Time  // when to ask for the topology again after a failure
	members []*memberQ // per member of topo, created with it

	cool                    atomic.Int64 // Unix ns until which the fast path rests
	missed                  atomic.Int32 // writes that missed the supermajority since the last fast one
	fast, fallbacks, rested atomic.Uint64
	batches, items          atomic.Uint64

	// mutFirstAck completes a write on the first ack from anyone: the
	// deliberately wrong rule tests use to show their checks can fail.
	mutFirstAck bool
}

// topology is what KEFIR.TOPOLOGY said.
type topology struct {
	on      bool
	members []uint64 // in leader order: view v is led by members[v mod n]
	addrs   []string // their client addresses
	need    int      // acks that complete a write
}

// memberQ sends every lane's writes to one member as KEFIR.NILEXT BATCH
// commands over its slots' connections, one batch in flight per slot:
// writes that arrive while every slot has a batch out go together in the
// next one (group commit), so under load a member handles one command and
// one fsync for many writes.
//
// Order: a lane's next write is submitted only after its previous one
// completed on a supermajority. With one slot the queue is FIFO over one
// connection, so each lane's requests reach the member in order. With
// several, a write to a member that had not acked the lane's previous one
// (only possible when the supermajority is not every member: 5 or more
// replicas) can overtake it on another connection; the member then refuses
// the older one as stale (vrshard.ErrNilextStale), which only costs that
// member's ack of a write that already completed.
type memberQ struct {
	i    int
	addr string

	mu       sync.Mutex
	slots    []*memberSlot
	queue    []*nxItem
	downTill time.Time // a failed dial is not retried before then
}

// memberSlot is one connection to a member with at most one batch out.
type memberSlot struct {
	cn   *conn // nil or broken: dial before the next batch
	busy bool  // a flush runs on this slot
	// misses counts batches in a row that got no reply in time: a
	// connection that stopped answering without breaking (a partition that
	// ate bytes) is replaced after maxMisses.
	misses int
}

// nxItem is one write's request to one member.
type nxItem struct {
	id, seq uint64
	dur     string
	kvs     []KV
	acks    chan<- nilextAck // buffered for every member: never blocks
}

const maxMisses = 3

func newNilextPath(c *Client, o nilextOptions) *nilextPath {
	return &nilextPath{c: c, opts: o}
}

// nilextSupermajority is f + ceil(f/2) + 1 for n = 2f+1 replicas (the same
// rule as internal/vr's NilextSupermajority; a test checks they agree).
func nilextSupermajority(n int) int {
	f := (n - 1) / 2
	return f + (f+1)/2 + 1
}

// topology returns the group's topology, asking for it if it is not known
// (nil while a recent attempt failed: take the ordered path meanwhile).
func (p *nilextPath) topology(ctx context.Context) *topology {
	p.mu.Lock()
	t, retry := p.topo, p.retryAt
	p.mu.Unlock()
	if t != nil || time.Now().Before(retry) {
		return t
	}
	t, err := p.fetchTopology(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.retryAt = time.Now().Add(p.opts.backoff)
		return nil
	}
	if p.topo == nil {
		p.topo = t
		for i, a := range t.addrs {
			m := &memberQ{i: i, addr: a}
			for range max(p.opts.conns, 1) {
				m.slots = append(m.slots, &memberSlot{})
			}
			p.members = append(p.members, m)
		}
	}
	return p.topo
}

func (p *nilextPath) fetchTopology(ctx context.Context) (*topology, error) {
	r := newCall(replyRaw, false, nil, nil)
	r.cmd = append(r.cmd, arg{s: "KEFIR.TOPOLOGY"})
	if err := p.c.finish(ctx, r); err != nil {
		var se *Error
		if errors.As(err, &se) && se.Prefix == "ERR" {
			// A server without KEFIR.TOPOLOGY: no fast path, ever.
			return &topology{}, nil
		}
		return nil, err
	}
	v := r.raw
	putRequest(r)
	return parseTopology(v)
}

// parseTopology reads [cluster, view, leader, nilext, self, [[id, addr]...]].
func parseTopology(v resp.Value) (*topology, error) {
	bad := func(what string) (*topology, error) {
		return nil, fmt.Errorf("kefir: KEFIR.TOPOLOGY reply: %s", what)
	}
	if v.Kind != resp.Array || len(v.Elems) != 6 || v.Elems[3].Kind != resp.Int || v.Elems[5].Kind != resp.Array {
		return bad("want [cluster, view, leader, nilext, self, members]")
	}
	t := &topology{on: v.Elems[3].Int == 1}
	for _, m := range v.Elems[5].Elems {
		if m.Kind != resp.Array || len(m.Elems) != 2 || m.Elems[0].Kind != resp.Int || m.Elems[0].Int <= 0 || m.Elems[1].Kind != resp.Bulk {
			return bad("want members as [id, address] pairs")
		}
		t.members = append(t.members, uint64(m.Elems[0].Int))
		t.addrs = append(t.addrs, string(m.Elems[1].Str))
	}
	if len(t.members)%2 == 0 {
		t.on = false // a single node (no members) or a malformed group
	}
	t.need = nilextSupermajority(len(t.members))
	return t, nil
}

func (p *nilextPath) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.members {
		m.mu.Lock()
		for _, sl := range m.slots {
			if sl.cn != nil {
				sl.cn.close()
			}
		}
		m.mu.Unlock()
	}
}

// nilextAck is one replica's answer to KEFIR.NILEXT.
type nilextAck struct {
	member int // index in topology.members
	view   uint64
	from   uint64
	leader bool
	err    error
}

// ackTracker is the completion rule: need acks from distinct members in one
// view, one of them that view's leader (members[view mod n]; an ack's own
// leader claim is believed only when it matches).
type ackTracker struct {
	t     *topology
	views map[uint64]*viewCount
}

type viewCount struct {
	from   uint64 // bit i: members[i] acked in this view
	count  int
	leader bool
}

func (a *ackTracker) add(k nilextAck) bool {
	n := len(a.t.members)
	if k.err != nil || k.member < 0 || k.member >= n || a.t.members[k.member] != k.from {
		return false // an error, or a node that is not the member we asked
	}
	if a.views == nil {
		a.views = map[uint64]*viewCount{}
	}
	vc := a.views[k.view]
	if vc == nil {
		vc = &viewCount{}
		a.views[k.view] = vc
	}
	if vc.from&(1<<k.member) == 0 {
		vc.from |= 1 << k.member
		vc.count++
	}
	if k.leader && a.t.members[k.view%uint64(n)] == k.from {
		vc.leader = true
	}
	return vc.leader && vc.count >= a.t.need
}

// write runs a nilext write (Put: one pair; MultiPut: several) on the fast
// path. done false means the fast path did not take it and nothing was sent:
// the caller runs the ordered path as usual. done true means err is the
// write's outcome (the fast path, or its ordered fallback with the same id).
func (p *nilextPath) write(ctx context.Context, kvs []KV, opts []CallOption) (done bool, err error) {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	if !o.consistency.IsZero() {
		return false, nil // a write with a read level: let the server judge it
	}
	t := p.topology(ctx)
	if t == nil || !t.on || len(t.members) > 63 {
		return false, nil
	}
	if now := time.Now().UnixNano(); now < p.cool.Load() {
		p.rested.Add(1)
		return false, nil
	}
	if len(kvs) > 1 {
		seen := make(map[string]struct{}, len(kvs))
		for _, kv := range kvs {
			if _, dup := seen[kv.Key]; dup {
				// MSET's last value wins; keep that exact semantics on the
				// ordered path instead of reasoning about it here.
				return false, nil
			}
			seen[kv.Key] = struct{}{}
		}
	}
	dur := o.durability
	if dur.IsZero() {
		dur = Sync
	}
	// Copies may be sent after this call returns (to a slow member), and
	// every copy of one request id must carry the same bytes: the caller
	// may reuse its buffers once we return.
	kvs = cloneKVs(kvs)
	l := p.c.lanes.Get()
	if l == nil {
		return false, nil // closed: the ordered path says so
	}
	l.Next()
	if p.broadcast(ctx, t, l, kvs, dur.String()) {
		p.fast.Add(1)
		p.missed.Store(0)
		p.c.lanes.Put(l)
		return true, nil
	}
	// No supermajority in time: take the ordered path with the same id
	// (exactly once with any copy in a d-log). A second miss in a row means
	// a replica is down or slow, not a passing stall: rest the fast path so
	// the writes until the backoff ends do not each wait out the timeout.
	if p.missed.Add(1) >= restAfter {
		p.cool.Store(time.Now().Add(p.opts.backoff).UnixNano())
		p.missed.Store(0)
	}
	p.fallbacks.Add(1)
	if err := p.fallback(ctx, l, kvs, opts); err != nil {
		return true, err // the lane is dropped: its id may still have a write in flight
	}
	p.c.lanes.Put(l)
	return true, nil
}

// broadcast sends the write to every member and reports whether a
// supermajority acked it within the nilext timeout.
func (p *nilextPath) broadcast(ctx context.Context, t *topology, l *lane, kvs []KV, dur string) bool {
	bctx, cancel := context.WithTimeout(ctx, p.opts.timeout)
	defer cancel()
	acks := make(chan nilextAck, len(t.members))
	for _, m := range p.members {
		p.submit(m, &nxItem{id: l.ID, seq: l.Seq, dur: dur, kvs: kvs, acks: acks})
	}
	tr := ackTracker{t: t}
	for range t.members {
		select {
		case a := <-acks:
			if p.mutFirstAck && a.err == nil {
				return true
			}
			if tr.add(a) {
				return true
			}
		case <-bctx.Done():
			return false
		}
	}
	return false
}

// submit queues it for member m and starts a flush on an idle slot, if
// any (else a busy slot's flush takes it when its batch is back).
func (p *nilextPath) submit(m *memberQ, it *nxItem) {
	m.mu.Lock()
	m.queue = append(m.queue, it)
	var sl *memberSlot
	for _, s := range m.slots {
		if !s.busy {
			sl = s
			break
		}
	}
	if sl == nil {
		m.mu.Unlock()
		return
	}
	sl.busy = true
	batch := m.queue
	m.queue = nil
	m.mu.Unlock()
	go p.flush(m, sl, batch)
}

// flush sends batches to m on slot sl until m's queue is empty.
func (p *nilextPath) flush(m *memberQ, sl *memberSlot, batch []*nxItem) {
	for {
		p.sendBatch(m, sl, batch)
		m.mu.Lock()
		if len(m.queue) == 0 {
			sl.busy = false
			m.mu.Unlock()
			return
		}
		batch = m.queue
		m.queue = nil
		m.mu.Unlock()
	}
}

// sendBatch sends one KEFIR.NILEXT BATCH to m and hands each write its ack
// (or error). A reply later than the nilext timeout is of no use to anyone:
// the writes have completed or fallen back by then.
func (p *nilextPath) sendBatch(m *memberQ, sl *memberSlot, batch []*nxItem) {
	failAll := func(err error) {
		for _, it := range batch {
			it.acks <- nilextAck{member: m.i, err: err}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.timeout)
	defer cancel()
	m.mu.Lock()
	cn, down := sl.cn, m.downTill
	m.mu.Unlock()
	if cn == nil || !cn.healthy() {
		if time.Now().Before(down) {
			failAll(fmt.Errorf("kefir: nilext: %s was unreachable recently", m.addr))
			return
		}
		fresh, err := p.c.dial(ctx, m.addr)
		m.mu.Lock()
		if err != nil {
			m.downTill = time.Now().Add(p.opts.backoff)
		} else {
			if sl.cn != nil {
				sl.cn.close()
			}
			sl.cn = fresh
		}
		m.mu.Unlock()
		if err != nil {
			failAll(err)
			return
		}
		cn = fresh
	}
	words := 3
	for _, it := range batch {
		words += 4 + 2*len(it.kvs)
	}
	cmd := make([]arg, 0, words)
	cmd = append(cmd, arg{s: "KEFIR.NILEXT"}, arg{s: "BATCH"}, arg{s: strconv.Itoa(len(batch))})
	for _, it := range batch {
		cmd = append(cmd, arg{s: strconv.FormatUint(it.id, 10)}, arg{s: strconv.FormatUint(it.seq, 10)}, arg{s: it.dur}, arg{s: strconv.Itoa(len(it.kvs))})
		for _, kv := range it.kvs {
			cmd = append(cmd, arg{s: kv.Key}, arg{b: nonNil(kv.Value)})
		}
	}
	// A fresh request, never pooled: when ctx ends first the connection may
	// still complete it.
	r := &request{cmd: cmd, kind: replyRaw, done: make(chan struct{}, 1)}
	p.batches.Add(1)
	p.items.Add(uint64(len(batch)))
	owned, err := cn.do(ctx, r)
	m.mu.Lock()
	if !owned {
		if sl.misses++; sl.misses >= maxMisses && sl.cn == cn {
			sl.cn = nil
			cn.close()
		}
	} else {
		sl.misses = 0
	}
	m.mu.Unlock()
	if !owned || err != nil {
		if err == nil {
			err = ctx.Err()
		}
		failAll(err)
		return
	}
	v := r.raw
	if v.Kind != resp.Array || len(v.Elems) != len(batch) {
		failAll(fmt.Errorf("kefir: KEFIR.NILEXT BATCH reply: want %d replies, got %s", len(batch), v.Kind))
		return
	}
	for j, it := range batch {
		it.acks <- parseNilextAck(m.i, v.Elems[j])
	}
}

func parseNilextAck(member int, v resp.Value) nilextAck {
	out := nilextAck{member: member}
	switch {
	case v.Kind == resp.Error:
		out.err = serverError(v.Str)
	case v.Kind != resp.Array || len(v.Elems) != 3 || v.Elems[0].Kind != resp.Int || v.Elems[1].Kind != resp.Int || v.Elems[2].Kind != resp.Int ||
		v.Elems[0].Int < 0 || v.Elems[1].Int <= 0:
		out.err = fmt.Errorf("kefir: KEFIR.NILEXT reply: want [view, replica, leader], got %s", v.Kind)
	default:
		out.view, out.from, out.leader = uint64(v.Elems[0].Int), uint64(v.Elems[1].Int), v.Elems[2].Int == 1
	}
	return out
}

// fallback applies the write on the ordered path under the lane's id,
// retrying while the group has no leader (a retry with the same id executes
// at most once) until ctx ends.
func (p *nilextPath) fallback(ctx context.Context, l *lane, kvs []KV, opts []CallOption) error {
	backoff := 5 * time.Millisecond
	for {
		r := newCall(replyStatus, true, nil, opts)
		r.fixedID, r.fixedSeq = l.ID, l.Seq
		if len(kvs) == 1 {
			r.cmd = append(r.cmd, arg{s: "SET"}, arg{s: kvs[0].Key}, arg{b: nonNil(kvs[0].Value)})
		} else {
			r.cmd = append(r.cmd, arg{s: "MSET"})
			for _, kv := range kvs {
				r.cmd = append(r.cmd, arg{s: kv.Key}, arg{b: nonNil(kv.Value)})
			}
		}
		err := p.c.status(ctx, r)
		if err == nil {
			return nil
		}
		retry := errors.Is(err, ErrUnavailable) || (errors.Is(err, ErrUnknownOutcome) && ctx.Err() == nil && !isStale(err))
		var se *Error
		if errors.As(err, &se) && se.Prefix == "UNAVAILABLE" {
			retry = true
		}
		if errors.Is(err, errConnLost) {
			// The node the leader hint names accepted and then dropped the
			// call (it may be dead behind a proxy, or restarting): ask the
			// nodes again instead of redialing it.
			p.c.leader.Store(nil)
		}
		if !retry || ctx.Err() != nil {
			if ctx.Err() != nil && !errors.Is(err, ErrUnknownOutcome) {
				// The broadcast may have reached some d-logs.
				return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
			}
			return err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

func cloneKVs(kvs []KV) []KV {
	n := 0
	for _, kv := range kvs {
		n += len(kv.Value)
	}
	slab := make([]byte, 0, n)
	out := make([]KV, len(kvs))
	for i, kv := range kvs {
		start := len(slab)
		slab = append(slab, kv.Value...)
		out[i] = KV{Key: kv.Key, Value: slab[start:len(slab):len(slab)]}
	}
	return out
}

// cloneValue deep-copies v, which aliases the reader's buffer.
func cloneValue(v resp.Value) resp.Value {
	out := v
	if v.Str != nil {
		out.Str = append([]byte(nil), v.Str...)
	}
	if v.Elems != nil {
		out.Elems = make([]resp.Value, len(v.Elems))
		for i, e := range v.Elems {
			out.Elems[i] = cloneValue(e)
		}
	}
	return out
}
