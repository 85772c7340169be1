// Package transport is the production peer transport of a node: it carries
// the messages of every replica group the node hosts between nodes over
// authenticated TCP (optionally TLS) connections. It moves opaque,
// group-addressed payloads (internal/frame) and knows no engine: each engine
// owns its message codec (VR's is internal/wire).
//
// A node creates one Transport; each replica it hosts registers its group
// (Register) with a Handler for its inbound messages and gets an Endpoint to
// send with. All groups share the node's connections, and a pair of nodes
// shares one connection for its traffic both ways (not one per group, nor
// one per direction).
//
// Shape, per peer:
//
//	Endpoint.Send / SendAll (driver goroutine, never waits for the network)
//	  └─ encodes the frame into the peer's queue (bounded; overflow drops the new message);
//	     SendAll then writes the queue itself with one non-blocking write if the
//	     peer's writer is parked (no hand-off), else wakes the writer
//	writer goroutine (one per peer)
//	  └─ writes to the pair's link; with none, dials one (timeout, capped
//	     exponential backoff with jitter, reset when the peer connects to
//	     us: its connection is then the link),
//	     takes everything queued and writes it with ONE Write (one syscall per batch),
//	     holds messages back for an injected link delay (order kept)
//	reader goroutine (one per link, dialed or accepted)
//	  └─ reads as much as the socket has, checks every frame's CRC, opens
//	     the envelopes and hands each group's run of messages to that
//	     group's Handler (one call per group per read)
//
// One connection per pair (peer.go, "link"): either node dials when it has
// something to send and no link. If both dial at once, both keep the
// connection the lower node id dialed: the acceptor refuses a dial its link
// beats before READY ("ERR duplicate"; the dialer waits for the winning
// connection, which reaches it as an inbound one), and a connection that
// lost after READY is closed by the side that sees it lose. A message
// written on the connection that lost (only the first messages of a race
// can be) is lost with it, as in any cut connection; none is delivered
// twice, since nothing is resent. A newer connection of the preferred
// direction, or one from a restarted peer (a new incarnation in the
// handshake), replaces the link at both ends (the old one is dead or
// half-open). A peer that dials while we hold a link that beats its dial,
// and the link is too old for a dial race, has lost that link (half-open
// here): we replace it with a fresh dial.
//
// Order: a peer's messages of one group reach the group's Handler in the
// order it sent them, with gaps for losses, also across reconnects (a new
// link starts delivering only after the previous link's reader has
// stopped).
//
// Loss is part of the contract: the engines tolerate lost messages and
// retransmit, so the transport never blocks a driver to avoid a loss. A full
// queue drops the message being sent; a failed dial drops what was queued for
// that peer (it is stale by the time a later dial succeeds); a failed write
// drops its batch; a message for a group that has no endpoint here (not
// opened yet, or closed) is dropped. Every drop is counted (Stats).
//
// Trust: a connection is admitted only after the handshake (handshake.go)
// proves the cluster secret, the peer protocol version and matching cluster
// id and configuration hash. A frame with a bad checksum closes the
// connection (the stream's framing can no longer be trusted), and so does a
// Handler's error: the engine's codec checks that every message carries the
// authenticated peer's id and ours (frame.ErrSpoofed) and decodes
// (frame.ErrCorrupt).
//
// Fault injection (SetLinkFault): per-link one-way delay with jitter (order
// kept), random drops, and partitions, changeable at run time, for
// experiments that emulate network distance and for tests. A fault is the
// node link's, so it affects every group on it, as a real network would.
//
// Use from a node: New with the cluster's peer map, secret and identity
// (Cluster, ConfigHash); either Listen on the peer address or, if the node
// owns the peer listener, hand each accepted connection untouched to
// HandleConn; Register each hosted group. Stats feeds the node's metrics;
// SetLinkFault is for experiments.
//
// This package imports internal/frame and the standard library. It must not
// import internal/vr, internal/wire, internal/server, internal/shard or any
// driver: they use it, not the reverse (purity test: TestNoEngineImports).
package transport

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
)

// Errors callers branch on.
var (
	// ErrUnknownPeer: Send to a node id that is not in Config.Peers.
	ErrUnknownPeer = errors.New("transport: unknown peer")
	// ErrClosed: the transport, or the endpoint, has been closed.
	ErrClosed = errors.New("transport: closed")
	// ErrGroupTaken: Register for a group that already has an endpoint.
	ErrGroupTaken = errors.New("transport: group already registered")
)

// Defaults for zero Config fields.
const (
	DefaultQueueLen         = 4096
	DefaultMaxQueueBytes    = 64 << 20
	DefaultDialTimeout      = time.Second
	DefaultHandshakeTimeout = 2 * time.Second
	DefaultWriteTimeout     = 5 * time.Second
	// DefaultMaxMessage bounds a message joined from fragments: the largest
	// snapshot (whole state) a replica accepts.
	DefaultMaxMessage     int64 = 64 << 30
	DefaultDialBackoff          = 50 * time.Millisecond
	DefaultMaxDialBackoff       = 2 * time.Second
)

// Handler receives one group's messages of one read from peer `from`, in
// the order the peer sent them. The handler owns every Body (they alias a
// fresh buffer) but not the msgs slice, which is reused after it returns. It
// is called from one goroutine per inbound connection, so it must be safe
// for concurrent use; while it runs, that connection is not read (a slow
// handler pushes back on the sender, whose queue then drops). It must return
// for Close to finish. An error (a message that does not decode, or is not
// from `from` to us) closes the connection: its stream cannot be trusted;
// wrap frame.ErrCorrupt or frame.ErrSpoofed so Stats counts it.
type Handler func(from uint64, msgs []frame.Message) error

// Config configures a Transport.
type Config struct {
	// Self is this node's id.
	Self uint64
	// Peers maps every other node's id to its peer address (host:port). An
	// entry for Self is ignored, so the whole cluster's map may be passed.
	Peers map[uint64]string
	// ClusterSecret authenticates peers (HMAC challenge-response). Required.
	ClusterSecret string
	// Cluster and ConfigHash are compared in the handshake; a peer that
	// differs is refused. A VR driver passes vr.Config.Cluster and
	// vr.Config.Hash(). If ConfigHash is zero it is derived from Cluster and
	// the sorted node ids (Self and Peers), which catches different peer
	// lists but not a different leader order or epoch.
	Cluster    uint64
	ConfigHash uint64
	// TLS, if set, wraps every connection: tls.Client when dialing (set
	// ServerName or InsecureSkipVerify with VerifyPeerCertificate
	// accordingly), tls.Server when accepting.
	TLS *tls.Config
	// Logger receives connection events (nil: discard). Lines carry this
	// replica's id ("replica") and the peer's; the caller's logger must not
	// carry "replica" already.
	Logger *slog.Logger

	// MaxFrame bounds one frame, inbound and outbound (default
	// frame.DefaultMaxFrame); a larger message (a snapshot of a large state)
	// is sent as fragments of at most this size. Every member must use the
	// same value.
	MaxFrame int
	// MaxMessage bounds one inbound message joined from fragments (default
	// DefaultMaxMessage).
	MaxMessage int64
	// QueueLen bounds the messages waiting for one peer (queued and held by
	// an injected delay); beyond it Send drops (default DefaultQueueLen).
	QueueLen int
	// MaxQueueBytes bounds the encoded bytes waiting for one peer's writer
	// to pick them up (what the writer already holds, e.g. for an injected
	// delay, is bounded by QueueLen only); a message is still admitted into
	// an empty queue whatever its size, so a large snapshot can go (default
	// DefaultMaxQueueBytes).
	MaxQueueBytes int
	// DialTimeout bounds one TCP connect (and TLS handshake).
	DialTimeout time.Duration
	// HandshakeTimeout bounds the peer handshake on either side.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds a batch write's progress (each piece of up to
	// writePiece bytes, so a snapshot of gigabytes is not cut off by it); a
	// peer that stops reading (e.g. SIGSTOP) has its connection closed and
	// redialed after it.
	WriteTimeout time.Duration
	// DialBackoff is the wait after the first failed dial; it doubles per
	// consecutive failure up to MaxDialBackoff, and each wait is drawn
	// uniformly from [d/2, d] so restarted nodes do not dial in lockstep.
	DialBackoff    time.Duration
	MaxDialBackoff time.Duration
	// Seed seeds the random drops and jitter of injected faults (0: random),
	// so an experiment can be repeated.
	Seed uint64
}

func (c *Config) fill() {
	if c.MaxFrame == 0 {
		c.MaxFrame = frame.DefaultMaxFrame
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = DefaultMaxMessage
	}
	if c.QueueLen == 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.MaxQueueBytes == 0 {
		c.MaxQueueBytes = DefaultMaxQueueBytes
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.DialBackoff == 0 {
		c.DialBackoff = DefaultDialBackoff
	}
	if c.MaxDialBackoff == 0 {
		c.MaxDialBackoff = DefaultMaxDialBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ConfigHash == 0 {
		c.ConfigHash = derivedHash(c.Cluster, c.Self, c.Peers)
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
}

func derivedHash(cluster, self uint64, peers map[uint64]string) uint64 {
	ids := []uint64{self}
	for id := range peers {
		if id != self {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	h := fnv.New64a()
	var b [8]byte
	for _, v := range append([]uint64{cluster}, ids...) {
		binary.LittleEndian.PutUint64(b[:], v)
		_, _ = h.Write(b[:])
	}
	return h.Sum64()
}

func (c *Config) validate() error {
	var errs []error
	if c.ClusterSecret == "" {
		errs = append(errs, errors.New("a cluster secret is required (peers are authenticated with it)"))
	}
	for id, addr := range c.Peers {
		if id != c.Self && addr == "" {
			errs = append(errs, fmt.Errorf("peer %d has no address", id))
		}
	}
	if c.MaxFrame < frame.FrameHeader || c.QueueLen < 1 || c.MaxQueueBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxFrame %d, QueueLen %d and MaxQueueBytes %d must be positive", c.MaxFrame, c.QueueLen, c.MaxQueueBytes))
	}
	if int64(c.MaxFrame) > math.MaxUint32 || c.MaxMessage < int64(c.MaxFrame) {
		errs = append(errs, fmt.Errorf("MaxFrame %d must fit a frame's 32-bit length and MaxMessage %d must be at least it", c.MaxFrame, c.MaxMessage))
	}
	if c.DialTimeout < 0 || c.HandshakeTimeout < 0 || c.WriteTimeout < 0 || c.DialBackoff < 0 || c.MaxDialBackoff < c.DialBackoff {
		errs = append(errs, fmt.Errorf("timeouts must be positive and MaxDialBackoff %v ≥ DialBackoff %v", c.MaxDialBackoff, c.DialBackoff))
	}
	if len(errs) > 0 {
		return fmt.Errorf("transport: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// Transport sends and receives peer messages. Its methods are safe for
// concurrent use.
type Transport struct {
	cfg  Config
	self Identity
	inc  uint64 // this transport's incarnation (handshake.go), random per New
	log  *slog.Logger
	// peers: every peer, by id. Readers load it without a lock; AddPeer
	// replaces it (copy on write) under mu.
	peersP atomic.Pointer[map[uint64]*peer]
	start  time.Time // origin of the monotonic clock used for delays

	ctx    context.Context // canceled by Close; aborts dials and handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{} // every connection: inbound (handshaking or not) and dialed links

	// groups maps a group id to its endpoint; readers load it per batch
	// without a lock, Register and Endpoint.Close replace it under mu.
	groups atomic.Pointer[map[uint64]*Endpoint]
	// admitCfg: AdmitConfigs' rule (nil: a differing hash is refused).
	admitCfg atomic.Pointer[func(node, hash uint64) bool]

	authFailures  atomic.Uint64
	identityFails atomic.Uint64
	protoFailures atomic.Uint64
}

// New validates cfg and starts one writer goroutine per peer. Nothing is
// dialed until there is something to send.
func New(cfg Config) (*Transport, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{
		cfg:       cfg,
		self:      Identity{Node: cfg.Self, Cluster: cfg.Cluster, ConfigHash: cfg.ConfigHash},
		log:       cfg.Logger.With("replica", cfg.Self),
		inc:       rand.Uint64() | 1,
		start:     time.Now(),
		ctx:       ctx,
		cancel:    cancel,
		listeners: map[net.Listener]struct{}{},
		conns:     map[net.Conn]struct{}{},
	}
	peers := make(map[uint64]*peer, len(cfg.Peers))
	for id, addr := range cfg.Peers {
		if id == cfg.Self {
			continue
		}
		peers[id] = t.newPeer(id, addr)
	}
	t.peersP.Store(&peers)
	t.groups.Store(&map[uint64]*Endpoint{})
	for _, p := range peers {
		t.wg.Add(1)
		go p.run()
	}
	return t, nil
}

// Endpoint is one replica group's access to the node's transport: it sends
// the group's messages, and its Handler receives them. Its methods are safe
// for concurrent use.
type Endpoint struct {
	t          *Transport
	group      uint64
	engine     frame.Engine
	handler    Handler
	onProgress func(from uint64)
	closed     atomic.Bool
}

// Register gives group (run by engine) an endpoint: h receives the group's
// inbound messages, and onProgress, if not nil, is told (from a
// connection's reader, at most every progressEvery) that a message of the
// group from a peer, larger than one read (64 KiB), is arriving but not
// whole yet: a snapshot, say, is on its way, and the messages queued behind
// it on the peer's stream wait for it. Until Register, the group's inbound
// messages are dropped (counted as Unrouted), as they are after the
// endpoint's Close.
func (t *Transport) Register(group uint64, engine frame.Engine, h Handler, onProgress func(from uint64)) (*Endpoint, error) {
	if h == nil {
		return nil, fmt.Errorf("transport: Register group %d: a Handler is required", group)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	old := *t.groups.Load()
	if _, ok := old[group]; ok {
		return nil, fmt.Errorf("%w: %d", ErrGroupTaken, group)
	}
	e := &Endpoint{t: t, group: group, engine: engine, handler: h, onProgress: onProgress}
	m := make(map[uint64]*Endpoint, len(old)+1)
	for g, x := range old {
		m[g] = x
	}
	m[group] = e
	t.groups.Store(&m)
	return e, nil
}

// Alone reports whether at most one group is registered on the transport:
// its peers' links then carry no other group's messages, so a connection's
// reader that spends a while in that group's Handler delays no other group
// (vrshard's inline rounds run only then).
func (t *Transport) Alone() bool { return len(*t.groups.Load()) <= 1 }

// Close unregisters the endpoint: its group's inbound messages are dropped
// from now on, and its sends fail with ErrClosed. A Handler call already
// running may finish. The transport stays up for the other groups.
func (e *Endpoint) Close() {
	if e.closed.Swap(true) {
		return
	}
	t := e.t
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.groups.Load()
	m := make(map[uint64]*Endpoint, len(old))
	for g, x := range old {
		if x != e {
			m[g] = x
		}
	}
	t.groups.Store(&m)
}

// Group returns the endpoint's group id.
func (e *Endpoint) Group() uint64 { return e.group }

// Transport returns the node transport the endpoint belongs to (for Stats
// and link faults, which are the node's, shared by all its groups).
func (e *Endpoint) Transport() *Transport { return e.t }

// endpoint returns the registered endpoint of group (nil if none).
func (t *Transport) endpoint(group uint64) *Endpoint { return (*t.groups.Load())[group] }

func (t *Transport) newPeer(id uint64, addr string) *peer {
	return &peer{
		t:      t,
		id:     id,
		addr:   addr,
		log:    t.log.With("peer", id, "peer_addr", addr),
		wake:   make(chan struct{}, 1),
		back:   make(chan struct{}, 1),
		redial: make(chan struct{}, 1),
		rng:    rand.New(rand.NewPCG(t.cfg.Seed, id)),
	}
}

// peers is the current peer map (read only).
func (t *Transport) peers() map[uint64]*peer { return *t.peersP.Load() }

// HasPeer reports whether id is in the peer map.
func (t *Transport) HasPeer(id uint64) bool { return t.peers()[id] != nil }

// AddPeer adds node id at addr to the peer map: a node that joins a group
// after this transport started (a VR reconfiguration's new member). Adding
// a known id with the same address does nothing; another address is an
// error (peers do not move while connected). The configuration hash
// derived from the peer list (Config.ConfigHash zero) does not change.
func (t *Transport) AddPeer(id uint64, addr string) error {
	if id == 0 || id == t.cfg.Self || addr == "" {
		return fmt.Errorf("transport: add peer %d at %q: a peer needs another node id and an address", id, addr)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	old := t.peers()
	if p := old[id]; p != nil {
		if p.addr != addr {
			return fmt.Errorf("transport: add peer %d at %s: already known at %s", id, addr, p.addr)
		}
		return nil
	}
	peers := make(map[uint64]*peer, len(old)+1)
	for k, v := range old {
		peers[k] = v
	}
	p := t.newPeer(id, addr)
	peers[id] = p
	t.peersP.Store(&peers)
	t.wg.Add(1)
	go p.run()
	return nil
}

// AdmitConfigs sets the rule that may admit, at the handshake, a peer of
// this cluster whose configuration hash differs from ours (nil: none is;
// the default). A VR group that reconfigures sets it: replicas of adjacent
// epochs must exchange messages (the new configuration reaches an old
// member, a new member pulls from the previous ones), and the handshake
// carries no epoch, so the rule admits the group's members and previous
// members and VR's core judges each message's configuration (it answers an
// older epoch with the new configuration and refuses a mismatch).
// Different clusters and peers outside the peer list stay refused here.
// The rule runs on handshaking goroutines.
func (t *Transport) AdmitConfigs(f func(node, hash uint64) bool) {
	if f == nil {
		t.admitCfg.Store(nil)
		return
	}
	t.admitCfg.Store(&f)
}

// configOK is the rule AdmitConfigs set, or nil.
func (t *Transport) configOK() func(node, hash uint64) bool {
	if f := t.admitCfg.Load(); f != nil {
		return *f
	}
	return nil
}

// Self returns this node's id.
func (t *Transport) Self() uint64 { return t.cfg.Self }

// now is monotonic nanoseconds since New.
func (t *Transport) now() int64 { return int64(time.Since(t.start)) }

// Send queues m for peer `to` and returns at once; it never waits for the
// network. The message is encoded before Send returns, so the caller may
// reuse m and what it refers to. A message that does not fit the peer's
// queue, or that an injected fault drops, is counted and discarded: the
// return value is nil then too, because loss is normal for the protocols
// above. Errors are for programming mistakes: ErrUnknownPeer, ErrClosed.
func (e *Endpoint) Send(to uint64, m frame.Payload) error {
	p, err := e.peer(to)
	if err != nil {
		return err
	}
	return p.send(e.group, m)
}

func (e *Endpoint) peer(to uint64) (*peer, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	p := e.t.peers()[to]
	if p == nil {
		return nil, e.t.unknownPeer(to)
	}
	return p, nil
}

func (t *Transport) unknownPeer(id uint64) error {
	return fmt.Errorf("%w: %d (node %d knows %v)", ErrUnknownPeer, id, t.cfg.Self, t.peerIDs())
}

// SendLarge is Send for a message too large to encode on the caller's hot
// path (a snapshot of the whole state): it encodes m into a buffer of its
// own without holding the peer's queue, then queues it. It may run on any
// goroutine; a caller that needs it in order with its other messages to the
// same peer holds those back until SendLarge returns.
func (e *Endpoint) SendLarge(to uint64, m frame.Payload) error {
	p, err := e.peer(to)
	if err != nil {
		return err
	}
	return p.sendFrames(frame.AppendFrames(nil, e.group, m, e.t.cfg.MaxFrame))
}

// Outbound is one message of a SendAll batch.
type Outbound struct {
	To  uint64
	Msg frame.Payload
}

// SendAll queues every message of msgs for its To, like Send, and then
// pushes each peer it touched: when that peer's writer goroutine is parked
// on a live plain-TCP connection, the peer's whole queue is written right
// here with one non-blocking write, which saves a goroutine hand-off (the
// lowest latency); otherwise the writer is woken as by Send. It never waits
// for the network. A driver passes all of one Ready's messages in one call,
// so each peer still gets one write per batch. It returns the first error
// (ErrUnknownPeer, ErrClosed); the other messages are still sent.
func (e *Endpoint) SendAll(msgs []Outbound) error {
	if e.closed.Load() {
		return ErrClosed
	}
	t := e.t
	var first error
	var touched [8]*peer
	pushed := touched[:0]
	for i := range msgs {
		m := &msgs[i]
		p := t.peers()[m.To]
		if p == nil {
			if first == nil {
				first = t.unknownPeer(m.To)
			}
			continue
		}
		p.mu.Lock()
		err := p.enqueueLocked(e.group, m.Msg, nil)
		p.mu.Unlock()
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if !slices.Contains(pushed, p) {
			pushed = append(pushed, p)
		}
	}
	for _, p := range pushed {
		p.push()
	}
	return first
}

func (t *Transport) peerIDs() []uint64 {
	ids := make([]uint64, 0, len(t.peers()))
	for id := range t.peers() {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Listen opens a TCP listener on addr and serves it in a goroutine until
// Close. It returns the bound address (useful with port 0).
func (t *Transport) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	if !t.trackListener(ln) {
		ln.Close()
		return nil, ErrClosed
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if err := t.serve(ln); err != nil {
			t.log.Error("peer listener stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return ln.Addr(), nil
}

// Serve accepts peer connections on ln until Close (then it returns nil) or
// until Accept fails permanently. Close closes ln.
func (t *Transport) Serve(ln net.Listener) error {
	if !t.trackListener(ln) {
		ln.Close()
		return ErrClosed
	}
	return t.serve(ln)
}

func (t *Transport) trackListener(ln net.Listener) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.listeners[ln] = struct{}{}
	return true
}

func (t *Transport) serve(ln net.Listener) error {
	defer func() {
		t.mu.Lock()
		delete(t.listeners, ln)
		t.mu.Unlock()
	}()
	delay := 5 * time.Millisecond
	for {
		nc, err := ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("transport: listener closed by someone else: %w", err)
			}
			// Out of file descriptors and the like: wait instead of spinning.
			t.log.Warn("peer accept failed; retrying", "err", err, "in", delay)
			select {
			case <-time.After(delay):
			case <-t.ctx.Done():
				return nil
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		t.HandleConn(nc)
	}
}

// HandleConn takes ownership of an accepted connection (for a node that owns
// its peer listener and hands connections over): it runs the acceptor's
// handshake and then reads the peer's messages, in a new goroutine.
func (t *Transport) HandleConn(nc net.Conn) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		nc.Close()
		return
	}
	t.conns[nc] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	go t.serveConn(nc)
}

func (t *Transport) untrack(nc net.Conn) {
	t.mu.Lock()
	delete(t.conns, nc)
	t.mu.Unlock()
}

// Close stops every goroutine, closes every connection and listener, and
// waits. Queued messages are dropped. It is safe to call more than once.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait()
		return nil
	}
	t.closed = true
	// Refuse new Sends before the writers account for what is queued.
	for _, p := range t.peers() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
	}
	t.cancel()
	for ln := range t.listeners {
		ln.Close()
	}
	for nc := range t.conns {
		nc.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}
