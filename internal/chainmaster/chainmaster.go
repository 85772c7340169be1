// Package chainmaster runs a chain's master (chain.Master) as a role on a
// node: it decides the chain's membership, which the chain never does
// itself (docs/design/chain.md, "On the replica host").
//
// Until the cluster's metadata group exists (issue 28) the master is one
// process's role, not replicated: a node id outside the chain, on the same
// peer transport as the members (kefir server --chain-master). What it
// does:
//
//   - Failure detection by heartbeats, started by the members: every
//     member's host sends one every heartbeat interval; the master answers
//     a member of the chain with the configuration (head first), which
//     grants the member a lease of Lease from when it *sent* the heartbeat.
//     A member serves reads and takes writes only under its lease, so one
//     that the master gave up on stops by itself once the lease lapses. The
//     master declares a member failed (Master.Fail: CR_HEAD, CR_MID,
//     CR_TAIL) when it has heard nothing from it for FailAfter, which must
//     exceed Lease: by then the member's last lease has lapsed on any clock
//     that runs at about the master's rate. A member of the starting chain
//     that was never heard from is given StartGrace (10 s) instead.
//   - Rejoin: a node outside the chain whose heartbeat says it is not a
//     replica (a restarted member holding its committed prefix, or a new
//     node) is joined just before the tail (Master.Join), one at a time. A
//     member of the chain whose heartbeat says so restarted before the
//     master noticed its silence: it is declared failed first.
//   - Master failure: the members' leases lapse and the chain stops serving
//     until the master is back. The master keeps its configuration in
//     memory only: a restarted master starts from the configuration it is
//     given, which is right only if no repair or join happened since (or if
//     the operator passes the current chain). Replicating it is the
//     metadata group's job.
package chainmaster

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/transport"
)

// Defaults. A member's host uses DefaultHeartbeat and DefaultLease too.
const (
	DefaultHeartbeat = 50 * time.Millisecond
	DefaultLease     = 500 * time.Millisecond
	DefaultFailAfter = time.Second
	// DefaultStartGrace is how long a member of the starting chain is
	// given to be heard from at all (processes starting on a loaded
	// machine), before FailAfter applies.
	DefaultStartGrace = 10 * time.Second
)

// Config configures a master.
type Config struct {
	// Self is the master's node id (outside the chain).
	Self uint64
	// Members is the chain to start from, head first.
	Members []uint64
	// Group is the chain's group id on the transport.
	Group uint64
	// Transport is the node's peer transport; every member must be a peer.
	Transport *transport.Transport
	// Heartbeat is how often the master checks for failures (default
	// DefaultHeartbeat); FailAfter how long a silent member is given
	// (default DefaultFailAfter; it must exceed the members' lease).
	Heartbeat, FailAfter time.Duration
	// StartGrace is how long a member of the starting chain that has not
	// been heard from yet is given (default DefaultStartGrace).
	StartGrace time.Duration
	Logger     *slog.Logger
}

// Master is a running master.
type Master struct {
	cfg   Config
	ep    *transport.Endpoint
	inbox chan []chain.Msg
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex // guards m and heard
	m       *chain.Master
	heard   map[uint64]time.Time
	members []uint64 // published configuration, for Members
	lost    bool     // "the chain is lost" was logged
}

// Start registers the master on the transport and runs it until Close.
func Start(cfg Config) (*Master, error) {
	if cfg.Transport == nil || cfg.Self == 0 || len(cfg.Members) == 0 || slices.Contains(cfg.Members, cfg.Self) {
		return nil, fmt.Errorf("chainmaster: node %d mastering chain %v: need a transport and a node outside the chain", cfg.Self, cfg.Members)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.FailAfter <= 0 {
		cfg.FailAfter = DefaultFailAfter
	}
	if cfg.StartGrace < cfg.FailAfter {
		cfg.StartGrace = max(DefaultStartGrace, cfg.FailAfter)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ids := make([]chain.NodeID, len(cfg.Members))
	for i, id := range cfg.Members {
		ids[i] = chain.NodeID(id)
	}
	x := &Master{cfg: cfg, inbox: make(chan []chain.Msg, 256), stop: make(chan struct{}), done: make(chan struct{}),
		m: chain.NewMaster(chain.NodeID(cfg.Self), ids, len(ids)), heard: map[uint64]time.Time{},
		members: slices.Clone(cfg.Members)}
	// Silence counts from the start plus the grace: a member is failed
	// StartGrace after the start if it never answers.
	grace := time.Now().Add(cfg.StartGrace - cfg.FailAfter)
	for _, id := range cfg.Members {
		x.heard[id] = grace
	}
	ep, err := cfg.Transport.Register(cfg.Group, frame.EngineChain, x.deliver, nil)
	if err != nil {
		return nil, fmt.Errorf("chainmaster: group %d: %w", cfg.Group, err)
	}
	x.ep = ep
	go x.run()
	return x, nil
}

// Close stops the master.
func (x *Master) Close() {
	select {
	case <-x.stop:
	default:
		close(x.stop)
	}
	<-x.done
	x.ep.Close()
}

// Members is the chain as the master last configured it, head first.
func (x *Master) Members() []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.members)
}

// deliver decodes a batch on the transport's reader and queues it.
func (x *Master) deliver(from uint64, in []frame.Message) error {
	msgs, err := chainwire.Decode(from, x.cfg.Self, in)
	if err != nil {
		return err
	}
	select {
	case x.inbox <- msgs:
	case <-x.stop:
	}
	return nil
}

func (x *Master) run() {
	defer close(x.done)
	t := time.NewTicker(x.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-x.stop:
			return
		case msgs := <-x.inbox:
			x.step(msgs)
		case now := <-t.C:
			x.tick(now)
		}
	}
}

func (x *Master) step(msgs []chain.Msg) {
	x.mu.Lock()
	defer x.mu.Unlock()
	now := time.Now()
	for _, msg := range msgs {
		if msg.Type != chain.MsgHeartbeat {
			x.m.Step(msg)
			continue
		}
		from := uint64(msg.From)
		members := x.m.Members()
		if slices.Contains(members, msg.From) && msg.Refused && msg.From != x.m.Joiner() {
			// A member that says it is not a replica restarted (faster than
			// FailAfter: kefir up restarts a killed node in half a second)
			// and lost its place: its old incarnation failed. It is joined
			// again on a later heartbeat. (A joiner's heartbeats sent before
			// it became a replica arrive before its flush-ack, on the same
			// link, while it is still the joiner.)
			x.cfg.Logger.Warn("chain master: member restarted", "node", from)
			x.m.Fail(msg.From)
			delete(x.heard, from)
			continue
		}
		if slices.Contains(members, msg.From) {
			x.heard[from] = now
			x.send(chain.Msg{Type: chain.MsgHeartbeat, From: chain.NodeID(x.cfg.Self), To: msg.From,
				Seq: msg.Seq, Epoch: x.m.Epoch(), Members: members})
			continue
		}
		if msg.From == x.m.Joiner() {
			x.heard[from] = now
			continue
		}
		if msg.Refused && !x.m.Busy() {
			// A node outside the chain that is not a replica: a restarted
			// member (or a new node) waiting to be joined.
			if err := x.m.Join(msg.From, len(members)); err != nil {
				x.cfg.Logger.Warn("chain master: join refused", "node", from, "err", err)
				continue
			}
			x.heard[from] = now
			x.cfg.Logger.Info("chain master: joining", "node", from, "members", members)
		}
	}
	x.flush()
}

func (x *Master) tick(now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, id := range x.m.Members() {
		if h, ok := x.heard[uint64(id)]; !ok || now.Sub(h) > x.cfg.FailAfter {
			x.cfg.Logger.Warn("chain master: member failed (no heartbeat)", "node", uint64(id), "silent", now.Sub(h))
			x.m.Fail(id)
			delete(x.heard, uint64(id))
		}
	}
	if j := x.m.Joiner(); j != 0 {
		if h, ok := x.heard[uint64(j)]; ok && now.Sub(h) > x.cfg.FailAfter {
			// A joiner that stopped answering: give up on it (it is heard
			// from again, and joined again, if it comes back).
			x.cfg.Logger.Warn("chain master: joiner failed", "node", uint64(j))
			x.m.Fail(j)
			delete(x.heard, uint64(j))
		}
	}
	x.flush()
}

// flush sends the master's output and publishes its configuration.
func (x *Master) flush() {
	rd := x.m.Ready()
	for i := range rd.Msgs {
		x.send(rd.Msgs[i])
	}
	for _, id := range rd.Fenced {
		x.cfg.Logger.Warn("chain master: fenced (out of the chain until it restarts)", "node", uint64(id))
	}
	x.members = x.members[:0]
	for _, id := range x.m.Members() {
		x.members = append(x.members, uint64(id))
	}
	if x.m.Lost() && !x.lost {
		x.lost = true
		x.cfg.Logger.Error("chain master: every member failed: the chain is lost")
	}
}

func (x *Master) send(m chain.Msg) {
	m.From = chain.NodeID(x.cfg.Self)
	if err := x.ep.Send(uint64(m.To), chainwire.Payload(&m)); err != nil && !errors.Is(err, transport.ErrClosed) {
		x.cfg.Logger.Warn("chain master: send", "to", uint64(m.To), "type", m.Type.String(), "err", err)
	}
}
