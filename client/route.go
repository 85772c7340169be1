package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/keyslot"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// Slot routing in a cluster of several groups (docs/cluster.md, "The Go
// client"). A client dialed to a cluster keeps the slot map (CLUSTER SLOTS,
// with CLUSTER INFO's epoch) and a pool per node the map names (pool.go),
// and sends each keyed call to the leader of its key's group. The map is
// the only thing that moves routes: a -MOVED sends that one call to the
// node it names and asks for a fresh map, so a redirect of one group's key
// never moves another group's calls (the single-group pool follows a -MOVED
// with all of its connections, which against a node of several groups sent
// the whole pool from one group's leader to another's on every write of a
// key of another group). A transaction goes to its first key's group's
// leader's pool, whose transaction connections it shares (Tx.acquire in
// txn.go). Calls that name no key (Ping, Scan) use the client's own pool, as
// against one group: a node merges a scan over the groups.

// WithCluster says whether the client routes calls by their key's slot (a
// cluster of several groups) or talks to one group through the addresses
// given to Dial, as before. Without it, Dial asks the node (INFO cluster)
// and routes by slot when it says cluster_enabled:1. WithCluster(true)
// against a single group routes through the same path (one group owns every
// slot); WithCluster(false) against a cluster sends everything to the nodes
// given, which forward what they do not lead.
func WithCluster(on bool) Option {
	return func(o *options) {
		o.cluster = -1
		if on {
			o.cluster = 1
		}
	}
}

// router is a cluster client's routing state.
type router struct {
	c *Client
	// crossSlot: the server refuses a command whose keys hash to different
	// slots (cluster_enabled:1), so multi-key calls are split by slot;
	// otherwise (WithCluster(true) on one group) by node only.
	crossSlot bool
	m         atomic.Pointer[slotMap]

	mu    sync.Mutex
	nodes map[string]*pool // by client address; never removed (a node's pool is idle once no slot routes there)
	// A refresh in flight (refreshing); again: one was asked for meanwhile;
	// hint: a node to ask first (the last -MOVED's).
	refreshing, again, closed bool
	hint                      string
	stop                      chan struct{} // closed by close: a refresh in flight gives up
	wg                        sync.WaitGroup

	refreshes atomic.Uint64 // maps fetched (tests, metrics)
}

// slotMap is one fetched CLUSTER SLOTS reply: each slot's group and each
// group's nodes.
type slotMap struct {
	epoch  uint64
	owner  [keyslot.N]int16 // index in groups; -1: no group (the client's own pool serves it)
	groups []mapGroup
}

// mapGroup is a group of the map: its leader's pool and its members' (the
// leader first), which serve the reads any replica may answer.
type mapGroup struct {
	leader  *pool
	members []*pool
	rr      *atomic.Uint32
	// chain: the group is a chain (its nodes' metadata say kefir-engine
	// chain), whose every member serves strong reads under SU and AUSI:
	// WithChainReads spreads them over members.
	chain bool
}

// The node metadata CLUSTER SLOTS gives a chain group's members (the
// server's ClusterEngineField and kv.EngineChain; TestEngineFieldAgrees).
const (
	engineField = "kefir-engine"
	engineChain = "chain"
)

// refreshPause spaces refreshes asked for while one runs: a burst of
// -MOVED replies (every call in flight to a group whose leader changed)
// costs two fetches, not one per reply.
const refreshPause = 20 * time.Millisecond

// startRouting decides at Dial whether the client routes by slot
// (WithCluster, else INFO cluster on the dialed connection) and if so
// fetches the first map.
func (c *Client) startRouting(ctx context.Context) error {
	if c.opts.cluster < 0 {
		return nil
	}
	cn, err := c.conn(ctx, &c.slots[0])
	if err != nil {
		return err
	}
	enabled, known := clusterEnabled(ctx, cn)
	if c.opts.cluster == 0 && !(known && enabled) {
		return c.startChainRouting(ctx)
	}
	if c.opts.nilext != nil {
		return errors.New("kefir: WithNilext does not go with slot routing (a cluster of several groups has no nilext fast path; WithCluster(false) to keep one group's)")
	}
	r := &router{c: c, crossSlot: known && enabled, nodes: map[string]*pool{}, stop: make(chan struct{})}
	m, err := r.fetch(ctx, c.addrs)
	if err != nil {
		return fmt.Errorf("kefir: reading the cluster's slot map: %w", err)
	}
	r.m.Store(m)
	c.rt = r
	return nil
}

// startChainRouting: with WithChainReads against a single group (no
// cluster), the client routes by the group's map as WithCluster(true) does
// — where a chain's strong reads are spread over the members the map names
// (a chain group's nodes say so) — if the map names a chain; else nothing
// changes (the strong reads are spread over the addresses given to Dial).
// A node that gives no map (an older one, a refusal) changes nothing
// either: the map is how the client learns the chain, not a requirement.
func (c *Client) startChainRouting(ctx context.Context) error {
	if !c.opts.chainReads || c.opts.nilext != nil {
		return nil
	}
	r := &router{c: c, nodes: map[string]*pool{}, stop: make(chan struct{})}
	m, err := r.fetch(ctx, c.addrs)
	if err != nil || !m.chainGroups() {
		r.close()
		return nil
	}
	r.m.Store(m)
	c.rt = r
	return nil
}

// clusterEnabled asks cn's node INFO cluster: enabled is its
// cluster_enabled (a node keeps it for its life), known false if it does
// not say.
func clusterEnabled(ctx context.Context, cn *conn) (enabled, known bool) {
	r := newCall(replyBulk, false, nil, nil)
	r.allowRedirect = false
	r.cmd = append(r.cmd, arg{s: "INFO"}, arg{s: "cluster"})
	owned, err := cn.do(ctx, r)
	if !owned {
		return false, false
	}
	defer putRequest(r)
	if err != nil {
		return false, false
	}
	return clusterEnabledIn(r.val)
}

// clusterEnabledIn reads cluster_enabled from an INFO cluster reply (known
// false if it does not say).
func clusterEnabledIn(info []byte) (enabled, known bool) {
	switch {
	case bytes.Contains(info, []byte("cluster_enabled:1")):
		return true, true
	case bytes.Contains(info, []byte("cluster_enabled:0")):
		return false, true
	}
	return false, false
}

// routeKey returns the key a call is routed by: the first key of the
// client's keyed commands (multi-key calls are split by slot first:
// splitKeys), none for the rest.
func routeKey(req *request) (string, bool) {
	if len(req.cmd) < 2 {
		return "", false
	}
	switch req.cmd[0].s {
	case "GET", "SET", "DEL", "KEFIR.CAS", "INCRBY", "MGET", "MSET", "PEXPIRE", "PERSIST", "PTTL":
		return req.cmd[1].s, true
	}
	return "", false
}

// route returns the pool of slot's group's leader, or the client's own pool
// when the map names no group for it.
func (r *router) route(slot int) *pool {
	m := r.m.Load()
	if g := m.owner[slot]; g >= 0 {
		return m.groups[g].leader
	}
	return &r.c.pool
}

// replica returns the pool of the next member of slot's group, round robin
// (nil when the map names no group for it).
func (r *router) replica(slot int) *pool {
	m := r.m.Load()
	g := m.owner[slot]
	if g < 0 {
		return nil
	}
	mg := &m.groups[g]
	return mg.members[int((mg.rr.Add(1)-1)%uint32(len(mg.members)))]
}

// node returns the pool of the node at addr, making it on first use.
func (r *router) node(addr string) *pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.nodes[addr]
	if !ok {
		p = newPool(r.c, []string{addr}, r.c.opts.poolSize, true)
		r.nodes[addr] = p
	}
	return p
}

// refreshSoon asks for a fresh map, from hint first if it is not empty (the
// node a -MOVED named knows its group best), without waiting for it: the
// call that noticed the map was stale follows its redirect meanwhile.
func (r *router) refreshSoon(hint string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if hint != "" {
		r.hint = hint
	}
	if r.closed {
		return
	}
	if r.refreshing {
		r.again = true
		return
	}
	r.refreshing = true
	r.wg.Add(1)
	go r.refreshLoop()
}

func (r *router) refreshLoop() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		hint := r.hint
		r.hint = ""
		r.mu.Unlock()
		addrs := []string{}
		if hint != "" {
			addrs = append(addrs, hint)
		}
		cur := r.m.Load()
		for _, g := range cur.groups {
			for _, p := range g.members {
				addrs = append(addrs, p.addrs[0])
			}
		}
		addrs = append(addrs, r.c.addrs...)
		ctx, cancel := context.WithTimeout(context.Background(), 2*r.c.opts.dialTimeout)
		go func() {
			select {
			case <-r.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if m, err := r.fetch(ctx, dedup(addrs)); err == nil {
			r.install(m)
		}
		cancel()
		r.mu.Lock()
		if !r.again || r.closed {
			r.refreshing = false
			r.mu.Unlock()
			return
		}
		r.again = false
		r.mu.Unlock()
		select {
		case <-time.After(refreshPause):
		case <-r.stop:
		}
	}
}

// install replaces the map unless m is older (a lower epoch: a node that
// has not seen a move yet). Leaders change within an epoch, so an equal
// epoch replaces it.
func (r *router) install(m *slotMap) {
	for {
		cur := r.m.Load()
		if m.epoch < cur.epoch || r.m.CompareAndSwap(cur, m) {
			return
		}
	}
}

func (r *router) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.stop)
	nodes := make([]*pool, 0, len(r.nodes))
	for _, p := range r.nodes {
		nodes = append(nodes, p)
	}
	r.mu.Unlock()
	r.wg.Wait()
	for _, p := range nodes {
		p.close()
	}
}

func dedup(addrs []string) []string {
	seen := make(map[string]bool, len(addrs))
	out := addrs[:0]
	for _, a := range addrs {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// fetch reads the map from the first of addrs that answers, on a
// connection of its own (CLUSTER SLOTS makes a connection a cluster
// client's; the fetch is rare, a dial is nothing beside it).
func (r *router) fetch(ctx context.Context, addrs []string) (*slotMap, error) {
	var errs []error
	for _, a := range addrs {
		m, err := r.fetchFrom(ctx, a)
		if err == nil {
			r.refreshes.Add(1)
			return m, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (r *router) fetchFrom(ctx context.Context, addr string) (*slotMap, error) {
	cn, err := r.c.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	info, err := rawCall(ctx, cn, "CLUSTER", "INFO")
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
	}
	slots, err := rawCall(ctx, cn, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS: %w", addr, err)
	}
	m, err := r.parse(slots)
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS: %w", addr, err)
	}
	// cluster_current_epoch: the slot map's epoch (each move raises it).
	for _, line := range strings.Split(string(info.Str), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_current_epoch:"); ok {
			m.epoch, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	return m, nil
}

// rawCall runs one command on cn and returns its reply.
func rawCall(ctx context.Context, cn *conn, words ...string) (resp.Value, error) {
	r := newCall(replyRaw, false, nil, nil)
	r.allowRedirect = false
	for _, w := range words {
		r.cmd = append(r.cmd, arg{s: w})
	}
	owned, err := cn.do(ctx, r)
	if !owned {
		return resp.Value{}, err
	}
	v := r.raw
	putRequest(r)
	return v, err
}

// parse reads a CLUSTER SLOTS reply: [start, end, [host, port, id, …]
// (the master: the group's leader), [host, port, …] (its replicas)…] per
// range. Ranges with the same nodes in the same order (and the same
// engine) are one group's.
func (r *router) parse(v resp.Value) (*slotMap, error) {
	if v.Kind != resp.Array {
		return nil, fmt.Errorf("want an array, got %s", v.Kind)
	}
	m := &slotMap{}
	for i := range m.owner {
		m.owner[i] = -1
	}
	index := map[string]int16{}
	for _, e := range v.Elems {
		if e.Kind != resp.Array || len(e.Elems) < 3 || e.Elems[0].Kind != resp.Int || e.Elems[1].Kind != resp.Int {
			return nil, fmt.Errorf("malformed range %s", e.String())
		}
		start, end := e.Elems[0].Int, e.Elems[1].Int
		if start < 0 || end >= keyslot.N || start > end {
			return nil, fmt.Errorf("range %d-%d out of 0-%d", start, end, keyslot.N-1)
		}
		var addrs []string
		chain := false
		for _, n := range e.Elems[2:] {
			if n.Kind != resp.Array || len(n.Elems) < 2 || n.Elems[1].Kind != resp.Int {
				return nil, fmt.Errorf("malformed node %s", n.String())
			}
			addrs = append(addrs, net.JoinHostPort(string(n.Elems[0].Str), strconv.FormatInt(n.Elems[1].Int, 10)))
			chain = chain || chainNode(n)
		}
		// A chain and a VR group on the same nodes, head and leader the
		// same, are two groups here: their strong reads go different ways.
		key := strings.Join(addrs, ",") + "," + strconv.FormatBool(chain)
		g, ok := index[key]
		if !ok {
			g = int16(len(m.groups))
			index[key] = g
			mg := mapGroup{rr: new(atomic.Uint32), chain: chain}
			for _, a := range addrs {
				mg.members = append(mg.members, r.node(a))
			}
			mg.leader = mg.members[0]
			m.groups = append(m.groups, mg)
		}
		for s := start; s <= end; s++ {
			m.owner[s] = g
		}
	}
	return m, nil
}

// chainNode reports whether a CLUSTER SLOTS node entry ([host, port, id,
// metadata]) says its group is a chain. The metadata is a map: RESP3's, or
// RESP2's array of key, value, key, value.
func chainNode(n resp.Value) bool {
	if len(n.Elems) < 4 {
		return false
	}
	md := n.Elems[3]
	if md.Kind != resp.Map && md.Kind != resp.Array {
		return false
	}
	for i := 0; i+1 < len(md.Elems); i += 2 {
		if string(md.Elems[i].Str) == engineField && string(md.Elems[i+1].Str) == engineChain {
			return true
		}
	}
	return false
}

// chain reports whether the map names slot's group a chain.
func (r *router) chain(slot int) bool {
	m := r.m.Load()
	g := m.owner[slot]
	return g >= 0 && m.groups[g].chain
}

// chainGroups reports whether the map names any chain group.
func (m *slotMap) chainGroups() bool {
	for i := range m.groups {
		if m.groups[i].chain {
			return true
		}
	}
	return false
}

// clusterReplicaRead reports whether req may go to any member of its key's
// group in a cluster: replicaRead's levels but cross-client-monotonic,
// which a cluster's followers do not serve (docs/cluster.md: --follower-reads
// is refused with --groups, so they would redirect every one).
func clusterReplicaRead(req *request) bool {
	return replicaRead(req) && req.opts.consistency.Kind != level.CrossClientMonotonic
}

// asking runs req once at addr after ASKING, on a connection of its own
// (Redis Cluster's -ASK: a slot being moved, this one call at the importing
// node; ASKING must come right before the command on its connection, which
// a shared connection's other callers could come between). Kefir hands
// slots over whole and sends no -ASK (docs/cluster.md), so this is for a
// server that does.
func (r *router) asking(ctx context.Context, req *request, addr string) (owned bool, err error) {
	cn, err := r.c.dialAs(ctx, addr, true)
	if err != nil {
		return true, fmt.Errorf("%w: %w", errNotSent, err)
	}
	if _, err := rawCall(ctx, cn, "ASKING"); err != nil {
		cn.close()
		return true, fmt.Errorf("%w: ASKING: %w", errNotSent, err)
	}
	owned, err = cn.do(ctx, req)
	if owned {
		cn.close()
	} else {
		cn.closeWhenIdle()
	}
	return owned, err
}

// splitKeys groups the indices of keys by where they must go: by slot when
// the server refuses keys of several slots in one command, else by the
// node the map routes them to. One part: the keys go as one command.
func (r *router) splitKeys(keys []string) [][]int {
	m := r.m.Load()
	byPart := map[int][]int{}
	var order []int
	for i, k := range keys {
		s := int(keySlot(k))
		part := s
		if !r.crossSlot {
			part = int(m.owner[s]) // -1: the client's own pool
		}
		if _, ok := byPart[part]; !ok {
			order = append(order, part)
		}
		byPart[part] = append(byPart[part], i)
	}
	parts := make([][]int, 0, len(order))
	for _, p := range order {
		parts = append(parts, byPart[p])
	}
	return parts
}

// eachPart runs f for every part concurrently (each part a call of its own,
// with its own retries, request id and session token merge) and joins the
// errors.
func eachPart(parts [][]int, f func(idx []int) error) []error {
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, idx := range parts[1:] {
		wg.Go(func() { errs[i+1] = f(idx) })
	}
	errs[0] = f(parts[0])
	wg.Wait()
	return errs
}
