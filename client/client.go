package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/lanes"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// Option configures Dial.
type Option func(*options)

type options struct {
	password    string
	username    string
	tls         *tls.Config
	poolSize    int
	dialTimeout time.Duration
	maxRetries  int
	// retryUnavailable: how long a call keeps retrying -UNAVAILABLE replies.
	retryUnavailable time.Duration
	// wrapConn lets tests interpose on a connection's socket.
	wrapConn func(net.Conn) net.Conn
	// nilext: the fast path for nilext writes (nilext.go); nil: off.
	nilext *nilextOptions
	// leaderReadsOnly turns off spreading replicaReads over the addresses.
	leaderReadsOnly bool
	// cluster: route by slot (1), never (-1), or as INFO cluster says (0;
	// WithCluster, route.go).
	cluster int8
	// chainReads spreads strong reads too (WithChainReads).
	chainReads bool
}

// WithPassword authenticates every connection with AUTH.
func WithPassword(password string) Option { return func(o *options) { o.password = password } }

// WithUser authenticates as a named user (AUTH username password); it needs
// WithPassword.
func WithUser(username string) Option { return func(o *options) { o.username = username } }

// WithTLS connects with TLS using cfg.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithPoolSize sets how many connections the client keeps (default 2). Each
// connection pipelines any number of concurrent calls, so a few are plenty.
func WithPoolSize(n int) Option { return func(o *options) { o.poolSize = n } }

// WithDialTimeout bounds each connection attempt (default 5s).
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// WithMaxRetries sets how many times a call is retried on another connection after
// its connection died (default 1; with WithRetryUnavailable, further losses are
// retried within its window). Reads and unsent requests are retried freely;
// writes are resent with the same request id, so they are applied at most once.
func WithMaxRetries(n int) Option { return func(o *options) { o.maxRetries = n } }

// WithRetryUnavailable makes a call that gets -UNAVAILABLE (a replica group
// between leaders, a follower that cannot reach the leader) retry for up to d,
// with short backoffs, within its context (default 0: return ErrUnavailable at
// once). A call whose connections keep dying (a leader killed: each retry may
// meet another of its connections before the client sees it is dead) is
// retried within the same window once WithMaxRetries is spent, and so is one
// that can reach no node at all (every address refuses: a group restarting). Writes are
// retried with the same request id, so they still execute at most once.
func WithRetryUnavailable(d time.Duration) Option {
	return func(o *options) { o.retryUnavailable = d }
}

// WithReplicaReads says whether reads that any replica of a group may serve —
// cross-client-monotonic, session reads of a Session, eventual — are spread
// round robin over every address given to Dial (default true; only with more
// than one address). A replica that cannot serve one answers -MOVED and that
// read alone is retried the leader's way; writes and linearizable and bounded
// reads always go the leader's way. Against a group without --follower-reads,
// followers redirect every cross-client-monotonic read, so two thirds of them
// (with three addresses) pay a second round trip: turn this off there if
// those reads dominate. In a cluster of several groups (WithCluster) the reads
// of a key are spread over the members of its group instead, and
// cross-client-monotonic ones go to its leader (a cluster's followers do not
// serve them).
func WithReplicaReads(on bool) Option { return func(o *options) { o.leaderReadsOnly = !on } }

// WithChainReads says whether strong reads — linearizable, bounded, and
// reads at the node's default level — are spread round robin over a chain
// group's members as well (default false). For a chain group (kefir server
// --engine chain, or a chain group of a cluster) under SU or AUSI, whose
// every member serves them (CRAQ, docs/chain.md). The client learns the
// members from the cluster map (CLUSTER SLOTS, whose nodes of a chain group
// say kefir-engine chain): Dial with one member's address is enough, and
// the members follow the map as it changes. In a cluster of several groups
// only the reads of a chain group's keys are spread; a VR group's go to its
// leader. With WithCluster(false), or against a node whose map names no
// chain, they are spread over the addresses given to Dial instead (more
// than one), as before. A member answers a read of a key with no update in
// flight there at once; one with an update in flight asks the tail for its
// version or forwards the read to the tail, itself; a member that cannot
// serve it yet (no lease) answers -MOVED and that read alone goes the
// leader's way. Against a VR group spread over Dial's addresses it only adds
// a redirect to two reads in three: a follower serves no linearizable read.
// Independent of WithReplicaReads, which covers the weaker levels.
func WithChainReads(on bool) Option { return func(o *options) { o.chainReads = on } }

// maxMoves bounds how many -MOVED redirects one call follows.
const maxMoves = 5

// CallOption adjusts one call.
type CallOption func(*callOptions)

type callOptions struct {
	consistency Consistency
	durability  Durability
	// ttl (Put only, hasTTL): the key expires ttl after the write (ttl.go).
	ttl    time.Duration
	hasTTL bool
}

// WithConsistency sets the consistency level of a read.
func WithConsistency(c Consistency) CallOption {
	return func(o *callOptions) { o.consistency = c }
}

// WithDurability sets the durability level of a write.
func WithDurability(d Durability) CallOption {
	return func(o *callOptions) { o.durability = d }
}

// Client is a connection pool to a Kefir node. It is safe for concurrent use;
// concurrent calls share connections by pipelining.
type Client struct {
	// pool is the client's own connections (pool.go): to the leader of a
	// single group, found from the addresses given to Dial; in a cluster,
	// for the calls that name no key (Ping, Scan).
	pool
	opts   options
	closed atomic.Bool
	// rt routes keyed calls by their slot in a cluster (route.go); nil for
	// a single group.
	rt *router
	nx *nilextPath // nil unless WithNilext
	// lanes give every write its request id (lanes.go).
	lanes lanes.Pool

	// replicas serve the reads any replica may answer (replicaRead): poolSize
	// connections per address given to Dial, used round robin. They are apart
	// from slots so that a -MOVED, which moves slots to the leader, leaves
	// them where they are: one redirected read must not turn every later
	// follower read into a leader read. Empty with a single address.
	replicas []replicaSlot
	rnext    atomic.Uint32
}

// replicaSlot is a connection to one fixed address. Calls load cur without
// a lock: every replica read passes here, and a mutex taken per call would
// be contended by exactly the concurrent readers spreading is for.
type replicaSlot struct {
	cur  atomic.Pointer[conn]
	mu   sync.Mutex // held while dialing, and by Close
	addr string
	// downUntil (unix nanoseconds, under mu): a dial failed, so reads skip
	// this address until then instead of paying a dial per call.
	downUntil int64
}

// replicaDownFor is how long a replica whose dial failed is left alone.
const replicaDownFor = time.Second

// Dial connects to the first reachable address of addrs and returns a Client. It
// dials one connection eagerly, so a wrong address or password fails here; the rest
// of the pool is dialed on demand.
func Dial(ctx context.Context, addrs []string, opts ...Option) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("kefir: Dial needs at least one address")
	}
	o := options{poolSize: 2, dialTimeout: 5 * time.Second, maxRetries: 1}
	for _, opt := range opts {
		opt(&o)
	}
	if o.poolSize < 1 {
		return nil, fmt.Errorf("kefir: pool size %d, want >= 1", o.poolSize)
	}
	if o.username != "" && o.password == "" {
		return nil, errors.New("kefir: WithUser needs WithPassword")
	}
	c := &Client{opts: o}
	c.pool.init(c, append([]string(nil), addrs...), o.poolSize, false)
	if len(c.addrs) > 1 && (!o.leaderReadsOnly || o.chainReads) {
		c.replicas = make([]replicaSlot, len(c.addrs)*o.poolSize)
		for i := range c.replicas {
			c.replicas[i].addr = c.addrs[i/o.poolSize]
		}
	}
	if o.nilext != nil {
		c.nx = newNilextPath(c, *o.nilext)
	}
	if _, err := c.conn(ctx, &c.slots[0]); err != nil {
		return nil, err
	}
	if err := c.startRouting(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes every connection. Calls in flight fail (writes with
// ErrUnknownOutcome); later calls return ErrClosed.
func (c *Client) Close() error {
	c.closed.Store(true)
	c.lanes.Close()
	if c.nx != nil {
		c.nx.close()
	}
	c.pool.close()
	if c.rt != nil {
		c.rt.close()
	}
	for i := range c.replicas {
		r := &c.replicas[i]
		r.mu.Lock() // waits for a dial in progress, whose connection is stored by then
		if cn := r.cur.Load(); cn != nil {
			cn.close()
		}
		r.mu.Unlock()
	}
	return nil
}

func (s *slot) close() {
	s.mu.Lock()
	if s.c != nil {
		s.c.close()
	}
	s.mu.Unlock()
}

func (c *Client) dial(ctx context.Context, addr string) (*conn, error) {
	return c.dialAs(ctx, addr, false)
}

// dialAs dials addr; aware: the connection says READWRITE first, which makes
// it a cluster client's at the server (pool.aware).
func (c *Client) dialAs(ctx context.Context, addr string, aware bool) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.opts.dialTimeout)
	defer cancel()
	var nc net.Conn
	var err error
	if c.opts.tls != nil {
		d := tls.Dialer{Config: c.opts.tls}
		nc, err = d.DialContext(dctx, "tcp", addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(dctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // the writer batches; don't let Nagle add latency
	}
	if c.opts.wrapConn != nil {
		nc = c.opts.wrapConn(nc)
	}
	// A reader buffer that holds a scan reply (50 KB for YCSB-E's ranges of 1 KB
	// values) whole: the default 16 KiB one grew by doubling for every such reply
	// (zeroed allocations) and shrank back after it, a fifth of a scan-heavy client's
	// CPU (docs/design/scans.md).
	rd := resp.NewReader(nc, readBufferSize)
	if c.opts.password != "" {
		if err := authenticate(dctx, nc, rd, c.opts.username, c.opts.password); err != nil {
			nc.Close()
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
	}
	cn := newConn(nc, rd)
	cn.addr = addr
	if aware {
		r := newCall(replyStatus, false, nil, nil)
		r.allowRedirect = false
		r.cmd = append(r.cmd, arg{s: "READWRITE"})
		owned, err := cn.do(dctx, r)
		if owned {
			putRequest(r)
		}
		if err != nil {
			cn.close()
			return nil, fmt.Errorf("%s: READWRITE: %w", addr, err)
		}
	}
	return cn, nil
}

// authenticate runs AUTH synchronously, before the connection's goroutines start.
func authenticate(ctx context.Context, nc net.Conn, rd *resp.Reader, user, password string) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
		defer nc.SetDeadline(time.Time{})
	}
	var cmd []byte
	if user != "" {
		cmd = resp.AppendCommand(nil, []byte("AUTH"), []byte(user), []byte(password))
	} else {
		cmd = resp.AppendCommand(nil, []byte("AUTH"), []byte(password))
	}
	if _, err := nc.Write(cmd); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	v, err := rd.ReadValue()
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if v.Kind == resp.Error {
		se := serverError(v.Str)
		if errors.Is(se, ErrAuth) || (se.Prefix == "ERR" && authRefusal(se.Msg)) {
			// Redis answers a bad AUTH with -WRONGPASS, older servers with
			// -ERR invalid password.
			return fmt.Errorf("%w: %s", ErrAuth, se.Msg)
		}
		// Anything else (a server at its connection limit answers the first
		// command with -ERR max number of clients reached) is not about the
		// credentials: another connection or node may be fine.
		return fmt.Errorf("auth: %w", se)
	}
	return nil
}

// authRefusal reports whether an -ERR reply to AUTH refuses the credentials.
func authRefusal(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "password") || strings.Contains(m, "auth")
}

// replicaRead reports whether req is a read that any replica of a group may
// serve, so that the client spreads it over the addresses it was given:
// cross-client-monotonic (followers serve it with --follower-reads), session
// reads that carry a Session's token (any replica that has applied the
// token's writes), and eventual. Linearizable and bounded reads, writes, and
// session-level reads without a Session (their guarantee is the server
// connection's own session, which only the leader-bound pool keeps) are not.
func replicaRead(req *request) bool {
	if req.write {
		return false
	}
	switch req.opts.consistency.Kind {
	case level.CrossClientMonotonic, level.Eventual:
		return true
	case level.Session:
		return req.session != nil
	}
	return false
}

// spreads reports whether req goes to the next replica first: a
// replicaRead unless WithReplicaReads(false), a strong read with
// WithChainReads.
func (c *Client) spreads(req *request) bool {
	if req.write {
		return false
	}
	return c.chainStrong(req) || (!c.opts.leaderReadsOnly && replicaRead(req))
}

// chainStrong reports whether req is a strong read that WithChainReads
// spreads over a chain's members: linearizable, bounded, or at the node's
// default level.
func (c *Client) chainStrong(req *request) bool {
	if req.write || !c.opts.chainReads {
		return false
	}
	switch req.opts.consistency.Kind {
	case 0, level.Linearizable, level.BoundedVersions, level.BoundedTime:
		return true
	}
	return false
}

// replicaConn returns replica slot i's connection, dialing it if needed. It
// never waits for another caller's dial, and reports ok false when the slot
// is busy dialing, its address is down, or the dial fails: the read then goes
// the leader's way instead.
func (c *Client) replicaConn(ctx context.Context, i int) (cn *conn, ok bool, err error) {
	s := &c.replicas[i]
	if cn := s.cur.Load(); cn != nil && cn.healthy() {
		return cn, true, nil
	}
	if !s.mu.TryLock() {
		return nil, false, nil
	}
	defer s.mu.Unlock()
	if c.closed.Load() {
		return nil, false, ErrClosed
	}
	if cn := s.cur.Load(); cn != nil && cn.healthy() {
		return cn, true, nil
	}
	if time.Now().UnixNano() < s.downUntil {
		return nil, false, nil
	}
	cn, err = c.dial(ctx, s.addr)
	if err != nil {
		if errors.Is(err, ErrAuth) {
			return nil, false, err
		}
		s.downUntil = time.Now().Add(replicaDownFor).UnixNano()
		return nil, false, nil
	}
	s.cur.Store(cn)
	return cn, true, nil
}

// doReplica tries a replicaRead at the next replica. done false means the
// replica did not serve it — it answered -MOVED (cannot prove the level now:
// no lease, data not yet readable, a session's writes not yet applied) or
// -UNAVAILABLE, or the connection failed — and req is ready to run the
// leader's way; only this read goes there. A -MOVED's leader is remembered
// for the leader-bound pool, which is where that retry and writes go anyway.
func (c *Client) doReplica(ctx context.Context, req *request) (done, owned bool, err error) {
	i := int((c.rnext.Add(1) - 1) % uint32(len(c.replicas)))
	cn, ok, err := c.replicaConn(ctx, i)
	if err != nil {
		return true, true, err
	}
	if !ok {
		return false, true, nil
	}
	owned, err = cn.do(ctx, req)
	return c.replicaOutcome(ctx, req, owned, err, true)
}

// doReplicaAt is doReplica at the node of pool p: a member of a cluster's
// group (route.go). A -MOVED names the group's leader, where the read goes
// next by the map anyway.
func (c *Client) doReplicaAt(ctx context.Context, req *request, p *pool) (done, owned bool, err error) {
	sl, cn, err := p.connFor(ctx, p.pick())
	if err != nil {
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrClosed) {
			return true, true, err
		}
		return false, true, nil
	}
	owned, err = cn.do(ctx, req)
	sl.calls.Add(-1)
	return c.replicaOutcome(ctx, req, owned, err, false)
}

// replicaOutcome settles a replica read's attempt (doReplica); learn: a
// -MOVED's leader is remembered for the client's own pool.
func (c *Client) replicaOutcome(ctx context.Context, req *request, owned bool, err error, learn bool) (done, owned2 bool, err2 error) {
	if !owned {
		var ab errAbandoned
		if !errors.As(err, &ab) {
			panic("client: conn kept a request without abandoning it")
		}
		return true, false, ctxError(ab.cause, false) // a read: nothing was applied
	}
	var se *Error
	switch {
	case err == nil:
		return true, true, nil
	case errors.As(err, &se) && se.Prefix == "MOVED":
		if addr := lastWord(se.Msg); learn && addr != "" {
			c.leader.Store(&addr)
		}
	case errors.As(err, &se) && se.Prefix == "UNAVAILABLE":
	case errors.Is(err, errNotSent), errors.Is(err, errConnLost):
	default:
		return true, true, err // the replica's answer (an error reply included)
	}
	if ctx.Err() != nil {
		return true, true, ctxError(ctx.Err(), false)
	}
	req.state, req.err = stateNew, nil
	return false, true, nil
}

// do runs req: it picks a connection, retries on another one if the connection
// dies, and turns attempt outcomes into the public errors. owned reports whether
// the caller may read req's result and return it to the pool. A write without a
// request id takes a lane for it (lanes.go), returned once its outcome is
// settled.
func (c *Client) do(ctx context.Context, req *request) (owned bool, err error) {
	if err := ctx.Err(); err != nil {
		return true, ctxError(err, false)
	}
	if req.write && req.fixedID == 0 {
		l := c.lanes.Get()
		if l == nil {
			return true, ErrClosed
		}
		req.fixedID, req.fixedSeq = l.ID, l.Next()
		defer func() {
			// Unsettled (unknown outcome, or abandoned in flight): the request
			// may still be queued somewhere, so the lane is retired.
			if owned && !errors.Is(err, ErrUnknownOutcome) {
				c.lanes.Put(l)
			}
		}()
	}
	// p is where the call goes: the client's own pool, or in a cluster its
	// key's group's leader's (route.go), which the map alone changes: a
	// -MOVED or -ASK sends this call alone elsewhere (p, ask).
	p, slot := &c.pool, -1
	if c.rt != nil {
		if key, ok := routeKey(req); ok || req.slot > 0 {
			slot = req.slot - 1
			if ok {
				slot = int(keySlot(key))
			}
			p = c.rt.route(slot)
			// A member of the key's group first: for the reads any
			// replica may answer, and with WithChainReads for strong
			// reads of a chain group's key (every member serves them).
			if (!c.opts.leaderReadsOnly && clusterReplicaRead(req)) || (c.chainStrong(req) && c.rt.chain(slot)) {
				if rp := c.rt.replica(slot); rp != nil && rp != p {
					if done, owned, err := c.doReplicaAt(ctx, req, rp); done {
						return owned, err
					}
				}
			}
		}
	}
	if slot < 0 && len(c.replicas) > 0 && c.spreads(req) {
		if done, owned, err := c.doReplica(ctx, req); done {
			return owned, err
		}
	}
	ask := ""         // -ASK's node: the next attempt goes there, after ASKING
	start := p.pick() // slot 0, dialed by Dial, serves the first call
	retries := 0      // attempts whose request may have reached a server
	moves := 0
	maybeApplied := false // an earlier attempt of this write may have executed
	win := retryWindow{backoff: 5 * time.Millisecond}
	for attempt := 0; ; attempt++ {
		var owned bool
		var err error
		if ask != "" {
			owned, err = c.rt.asking(ctx, req, ask)
			ask = ""
		} else {
			sl, cn, cerr := p.connFor(ctx, (start+attempt)%len(p.slots))
			if cerr != nil && p != &c.pool && !errors.Is(cerr, ErrAuth) && !errors.Is(cerr, ErrClosed) {
				// The map's node cannot be reached (it died, or moved): ask
				// for a new map, and this attempt goes through the
				// addresses given to Dial, whose nodes forward or redirect.
				c.rt.refreshSoon("")
				p = &c.pool
				sl, cn, cerr = p.connFor(ctx, (start+attempt)%len(p.slots))
			}
			if cerr != nil && c.opts.retryUnavailable > 0 && ctx.Err() == nil && !errors.Is(cerr, ErrAuth) && !errors.Is(cerr, ErrClosed) {
				// No node could be reached (every one down at once: a
				// whole group restarting, or the only address given):
				// within the WithRetryUnavailable window, back off and
				// dial again, as for -UNAVAILABLE. Before, a write whose
				// connection died with it returned ErrUnknownOutcome at
				// the first refused dial, though the group was back in
				// under a second and its retry, with the same request id,
				// would have settled it.
				if win.open(c.opts.retryUnavailable) {
					if err := win.sleep(ctx); err != nil {
						return true, ctxError(err, req.write && (req.sent || maybeApplied))
					}
					if slot >= 0 {
						p = c.rt.route(slot)
					}
					continue
				}
			}
			if cerr != nil {
				if (req.sent || maybeApplied) && req.write {
					cerr = fmt.Errorf("%w: retry failed: %w", ErrUnknownOutcome, cerr)
				}
				return true, cerr
			}
			owned, err = cn.do(ctx, req)
			sl.calls.Add(-1)
		}
		if !owned {
			var ab errAbandoned
			if !errors.As(err, &ab) {
				panic("client: conn kept a request without abandoning it")
			}
			return false, ctxError(ab.cause, (ab.sent || req.sent) && req.write)
		}
		var se *Error
		if errors.As(err, &se) {
			switch {
			case se.Prefix == "MOVED" && (moves < maxMoves || c.opts.retryUnavailable > 0):
				// Not executed there: go to the named leader, same request id.
				// Nodes may name a leader that just died (until they notice),
				// so after a couple of hops wait a little, within the
				// WithRetryUnavailable window.
				moves++
				if moves > 2 {
					if open := win.open(c.opts.retryUnavailable); moves > maxMoves && !open {
						break
					}
					if err := win.sleep(ctx); err != nil {
						return true, ctxError(err, req.write && (req.sent || maybeApplied))
					}
				}
				addr := lastWord(se.Msg)
				if slot >= 0 {
					// This call alone goes there; the map, fetched anew,
					// moves the routes (a leader change, a slot move).
					c.rt.refreshSoon(addr)
					p = c.rt.node(addr)
				} else {
					c.leader.Store(&addr)
				}
				req.state, req.err = stateNew, nil
				continue
			case se.Prefix == "ASK" && slot >= 0 && moves < maxMoves:
				// A slot in migration: this call once at the importing
				// node, after ASKING; the map stays (Redis Cluster's rule).
				moves++
				ask = lastWord(se.Msg)
				req.state, req.err = stateNew, nil
				continue
			case se.Prefix == "UNAVAILABLE" && c.opts.retryUnavailable > 0:
				if req.write && strings.Contains(se.Msg, "outcome") {
					maybeApplied = true
				}
				if win.open(c.opts.retryUnavailable) {
					if slot < 0 {
						c.leader.Store(nil) // whoever said so is no longer sure who leads
					} else {
						c.rt.refreshSoon("")
					}
					if err := win.sleep(ctx); err != nil {
						return true, ctxError(err, req.write && (req.sent || maybeApplied))
					}
					if slot >= 0 {
						p = c.rt.route(slot)
					}
					req.state, req.err = stateNew, nil
					continue
				}
			}
			if req.write && se.Prefix == "UNAVAILABLE" && (maybeApplied || strings.Contains(se.Msg, "outcome")) {
				return true, fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
			}
		}
		if errors.Is(err, errConnLost) && req.write {
			maybeApplied = true
		}
		switch {
		case errors.Is(err, errNotSent), errors.Is(err, errConnLost):
			// A request that never left the client is retried regardless of
			// WithMaxRetries (it found a connection that had just died), but boundedly.
			sentNow := errors.Is(err, errConnLost)
			if sentNow {
				retries++
			}
			retry := (sentNow && retries <= c.opts.maxRetries) || (!sentNow && attempt < c.opts.maxRetries+len(c.slots)+1)
			if !retry && c.opts.retryUnavailable > 0 && ctx.Err() == nil {
				// Past the budget, within the WithRetryUnavailable window: a dead
				// leader's connections fail one after another (each retry may land
				// on one the client has not yet seen die), which is the leader
				// change that window is for. Back off as for -UNAVAILABLE.
				if win.open(c.opts.retryUnavailable) {
					if err := win.sleep(ctx); err != nil {
						return true, ctxError(err, req.write && (req.sent || maybeApplied))
					}
					retry = true
				}
			}
			if ctx.Err() == nil && retry {
				if slot >= 0 {
					// Its node may be gone: a new map may route elsewhere.
					if sentNow {
						c.rt.refreshSoon("")
					}
					p = c.rt.route(slot)
				}
				req.state, req.err = stateNew, nil
				continue
			}
			if ctx.Err() != nil {
				return true, ctxError(ctx.Err(), req.sent && req.write)
			}
			if (req.sent || maybeApplied) && req.write {
				return true, fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
			}
			return true, fmt.Errorf("%w: %w", ErrUnavailable, err)
		case err != nil && attempt > 0 && req.write && isStale(err):
			// A later write of the same client id ran before this retry arrived: the
			// server cannot tell whether the original ran.
			return true, fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
		}
		return true, err
	}
}

// retryWindow is one call's WithRetryUnavailable window — opened by the
// first retry that needs it (a dial that reaches no node, -UNAVAILABLE, a
// connection lost past WithMaxRetries, a -MOVED chain) and shared by all of
// them — and the backoff between its retries, doubled up to 200ms.
type retryWindow struct {
	began   time.Time
	backoff time.Duration
}

// open starts the window if it has not started and reports whether d has
// not passed since.
func (w *retryWindow) open(d time.Duration) bool {
	if w.began.IsZero() {
		w.began = time.Now()
	}
	return time.Since(w.began) < d
}

// sleep waits one backoff and doubles it; ctx's error if it ends first.
func (w *retryWindow) sleep(ctx context.Context) error {
	select {
	case <-time.After(w.backoff):
	case <-ctx.Done():
		return ctx.Err()
	}
	w.backoff = min(2*w.backoff, 200*time.Millisecond)
	return nil
}

// ctxError maps a context error. A write that may have reached the server has an
// unknown outcome; anything else timed out (deadline) or was cancelled.
func ctxError(err error, maybeApplied bool) error {
	switch {
	case maybeApplied && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w: %w", ErrUnknownOutcome, ErrTimeout, err)
	case maybeApplied:
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}

func newCall(kind replyKind, write bool, s *Session, opts []CallOption) *request {
	r := getRequest()
	r.kind, r.write, r.session = kind, write, s
	r.allowRedirect = true
	for _, o := range opts {
		o(&r.opts)
	}
	return r
}

// finish runs req and, for a session call, advances the session token. On error
// it returns req to the pool (if it may); on success the caller reads the result
// and then returns it.
func (c *Client) finish(ctx context.Context, req *request) error {
	owned, err := c.do(ctx, req)
	if err != nil {
		if owned {
			putRequest(req)
		}
		return err
	}
	if req.session != nil && req.token != "" {
		req.session.advance(req.token)
	}
	return nil
}

// The operations below are shared by Client (s == nil) and Session.

func (c *Client) get(ctx context.Context, s *Session, key string, opts []CallOption) ([]byte, error) {
	r := newCall(replyBulk, false, s, opts)
	r.cmd = append(r.cmd, arg{s: "GET"}, arg{s: key})
	if err := c.finish(ctx, r); err != nil {
		return nil, err
	}
	val, null := r.val, r.null
	putRequest(r)
	if null {
		return nil, ErrNotFound
	}
	return val, nil
}

func (c *Client) status(ctx context.Context, r *request) error {
	if err := c.finish(ctx, r); err != nil {
		return err
	}
	putRequest(r)
	return nil
}

func (c *Client) integer(ctx context.Context, r *request) (int64, error) {
	if err := c.finish(ctx, r); err != nil {
		return 0, err
	}
	n := r.n
	putRequest(r)
	return n, nil
}

func (c *Client) put(ctx context.Context, s *Session, key string, value []byte, opts []CallOption) error {
	if ms, ok, err := putTTL(opts); err != nil {
		return err
	} else if ok {
		// With an expiry: SET … PX on the ordered path (the nilext fast path
		// carries plain pairs only).
		r := newCall(replyStatus, true, s, opts)
		r.cmd = append(r.cmd, arg{s: "SET"}, arg{s: key}, arg{b: nonNil(value)}, arg{s: "PX"}, arg{s: ms})
		return c.status(ctx, r)
	}
	if s == nil && c.nx != nil {
		if done, err := c.nx.write(ctx, []KV{{Key: key, Value: value}}, opts); done {
			return err
		}
	}
	r := newCall(replyStatus, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "SET"}, arg{s: key}, arg{b: nonNil(value)})
	return c.status(ctx, r)
}

func (c *Client) del(ctx context.Context, s *Session, key string, opts []CallOption) (bool, error) {
	r := newCall(replyInt, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "DEL"}, arg{s: key})
	n, err := c.integer(ctx, r)
	return n > 0, err
}

func (c *Client) cas(ctx context.Context, s *Session, key string, expected, value []byte, opts []CallOption) (bool, error) {
	r := newCall(replyInt, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "KEFIR.CAS"}, arg{s: key}, arg{b: nonNil(expected)}, arg{b: nonNil(value)})
	n, err := c.integer(ctx, r)
	return n == 1, err
}

func (c *Client) incr(ctx context.Context, s *Session, key string, delta int64, opts []CallOption) (int64, error) {
	r := newCall(replyInt, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "INCRBY"}, arg{s: key}, arg{s: strconv.FormatInt(delta, 10)})
	return c.integer(ctx, r)
}

func (c *Client) multiGet(ctx context.Context, s *Session, keys []string, opts []CallOption) ([][]byte, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if c.rt != nil && len(keys) > 1 {
		if parts := c.rt.splitKeys(keys); len(parts) > 1 {
			// Keys of several slots: an MGET per slot (the server refuses
			// one across slots), concurrently, merged in the keys' order.
			out := make([][]byte, len(keys))
			errs := eachPart(parts, func(idx []int) error {
				sub := make([]string, len(idx))
				for j, i := range idx {
					sub[j] = keys[i]
				}
				vals, err := c.multiGet(ctx, s, sub, opts)
				for j, i := range idx {
					if err == nil {
						out[i] = vals[j]
					}
				}
				return err
			})
			if err := errors.Join(errs...); err != nil {
				return nil, fmt.Errorf("kefir: MultiGet of %d keys in %d parts (one per slot): %w", len(keys), len(parts), err)
			}
			return out, nil
		}
	}
	r := newCall(replyList, false, s, opts)
	r.cmd = append(r.cmd, arg{s: "MGET"})
	for _, k := range keys {
		r.cmd = append(r.cmd, arg{s: k})
	}
	if err := c.finish(ctx, r); err != nil {
		return nil, err
	}
	list := r.list
	putRequest(r)
	if len(list) != len(keys) {
		return nil, fmt.Errorf("kefir: MGET of %d keys returned %d values", len(keys), len(list))
	}
	return list, nil
}

func (c *Client) multiPut(ctx context.Context, s *Session, kvs []KV, opts []CallOption) error {
	if _, ok, err := putTTL(opts); err != nil || ok {
		if err == nil {
			err = errors.Join(ErrInvalidTTL, errors.New("kefir: MultiPut cannot set a TTL (MSET has no expiry); use Put with WithTTL per key"))
		}
		return err
	}
	if len(kvs) == 0 {
		return nil
	}
	if c.rt != nil && len(kvs) > 1 {
		keys := make([]string, len(kvs))
		for i := range kvs {
			keys[i] = kvs[i].Key
		}
		if parts := c.rt.splitKeys(keys); len(parts) > 1 {
			// Keys of several slots: an MSET per slot, concurrently, each
			// atomic and applied at most once (a request id of its own);
			// the whole is not atomic (Txn is).
			errs := eachPart(parts, func(idx []int) error {
				sub := make([]KV, len(idx))
				for j, i := range idx {
					sub[j] = kvs[i]
				}
				return c.multiPut(ctx, s, sub, opts)
			})
			failed := 0
			for _, e := range errs {
				if e != nil {
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("kefir: MultiPut of %d keys in %d parts (one per slot): %d failed, the others were applied: %w", len(kvs), len(parts), failed, errors.Join(errs...))
			}
			return nil
		}
	}
	if s == nil && c.nx != nil {
		if done, err := c.nx.write(ctx, kvs, opts); done {
			return err
		}
	}
	r := newCall(replyStatus, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "MSET"})
	for _, kv := range kvs {
		r.cmd = append(r.cmd, arg{s: kv.Key}, arg{b: nonNil(kv.Value)})
	}
	return c.status(ctx, r)
}

func (c *Client) scan(ctx context.Context, s *Session, into *ScanBuffer, start, end string, limit int, opts []CallOption) ([]KV, error) {
	r := newCall(replyPairs, false, s, opts)
	r.into = into
	r.cmd = append(r.cmd, arg{s: "KEFIR.SCAN"}, arg{s: start}, arg{s: end})
	if limit > 0 {
		r.cmd = append(r.cmd, arg{s: "LIMIT"}, arg{s: strconv.Itoa(limit)})
	}
	if err := c.finish(ctx, r); err != nil {
		return nil, err
	}
	kvs := r.kvs
	putRequest(r)
	return kvs, nil
}

// nonNil keeps a nil value distinguishable from "no argument" in arg.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// readBufferSize is a connection's reply buffer (see dial).
const readBufferSize = 64 << 10

// KV is a key and its value.
type KV struct {
	Key   string
	Value []byte
}

// Ping checks that a connection of the pool can reach the server and get an answer.
func (c *Client) Ping(ctx context.Context) error {
	r := newCall(replyStatus, false, nil, nil)
	r.cmd = append(r.cmd, arg{s: "PING"})
	return c.status(ctx, r)
}

// Get returns key's value, or ErrNotFound.
func (c *Client) Get(ctx context.Context, key string, opts ...CallOption) ([]byte, error) {
	return c.get(ctx, nil, key, opts)
}

// Put sets key to value.
func (c *Client) Put(ctx context.Context, key string, value []byte, opts ...CallOption) error {
	return c.put(ctx, nil, key, value, opts)
}

// Delete removes key and reports whether it existed.
func (c *Client) Delete(ctx context.Context, key string, opts ...CallOption) (bool, error) {
	return c.del(ctx, nil, key, opts)
}

// CAS sets key to value if its current value equals expected, and reports whether
// it did.
func (c *Client) CAS(ctx context.Context, key string, expected, value []byte, opts ...CallOption) (bool, error) {
	return c.cas(ctx, nil, key, expected, value, opts)
}

// Incr adds delta to key's integer value (a missing key counts as 0) and returns the
// new value. ErrNotInteger (which also matches ErrWrongType) if the value is not an
// integer.
func (c *Client) Incr(ctx context.Context, key string, delta int64, opts ...CallOption) (int64, error) {
	return c.incr(ctx, nil, key, delta, opts)
}

// MultiGet returns the values of keys in order; a missing key's value is nil (an
// empty value is a non-nil empty slice).
func (c *Client) MultiGet(ctx context.Context, keys []string, opts ...CallOption) ([][]byte, error) {
	return c.multiGet(ctx, nil, keys, opts)
}

// MultiPut sets every key to its value in one command.
func (c *Client) MultiPut(ctx context.Context, kvs []KV, opts ...CallOption) error {
	return c.multiPut(ctx, nil, kvs, opts)
}

// Scan returns the pairs with start <= key < end in key order, at most limit of
// them (limit <= 0: the server's default, 1000). An empty end means no upper bound.
func (c *Client) Scan(ctx context.Context, start, end string, limit int, opts ...CallOption) ([]KV, error) {
	return c.scan(ctx, nil, nil, start, end, limit, opts)
}

// ScanInto is Scan with the pairs and their values decoded into buf, which the next
// call with buf reuses: the Value slices it returns (and the slice of pairs) are valid
// only until then. Keys are strings of their own and stay valid. Once buf has grown to
// the size of the replies, a scan allocates one string (its keys) instead of a slab of
// values: for a loop of scans of large values that is most of the client's garbage
// and its collection (docs/design/scans.md). A call that returns an error, a
// cancelled one included, leaves buf's earlier results undefined but writes nothing
// into it afterwards.
func (c *Client) ScanInto(ctx context.Context, buf *ScanBuffer, start, end string, limit int, opts ...CallOption) ([]KV, error) {
	return c.scan(ctx, nil, buf, start, end, limit, opts)
}

// ScanBuffer is the memory ScanInto decodes a scan's reply into and reuses from one
// call to the next. The zero value is ready to use. A buffer serves one call at a
// time; give each goroutine its own.
type ScanBuffer struct {
	kvs  []KV
	vals []byte
}
