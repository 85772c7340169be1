package vrshard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/simkv"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

// The production replica host under the deterministic simulator
// (internal/sim): hostNode is a sim.Node around a real Replica in stepped
// mode (stepped.go) — its WAL and storage engine on the node's simulated
// disk (Boot.FS: a power cut tears the real files), its messages through the
// simulated network in the peer codec (internal/wire), its log fsyncs
// finishing after the simulator's disk latency, its timers on the node's
// drifting clock — and hostClient is a client that sends operations to the
// host's entry points (ProposeStepped, ReadStepped) and follows redirects.
// The checkers of internal/check judge the history.

// hostClientTimeout is how many ticks (1 ms) a client waits for a reply
// before it gives up with an unknown outcome: longer than the replicas'
// RequestTimeout, after which they answer unknown themselves.
const hostClientTimeout = 600

// hostClientBase is added to a client's address to make its client id.
const hostClientBase = 1 << 40

// simEpoch is the wall-clock time a node's virtual clock counts from.
const simEpoch = int64(1_800_000_000) * int64(time.Second)

// hostMsg is a peer message on the simulated network: the frame the
// transport would carry (envelope fields and the body in VR's codec).
type hostMsg struct {
	from, to uint64
	fm       frame.Message
}

// String decodes the message for traces (only a traced run calls it).
func (m hostMsg) String() string {
	if m.fm.Engine == frame.EngineChain {
		msgs, err := chainwire.Decode(m.from, m.to, []frame.Message{m.fm})
		if err != nil || len(msgs) != 1 {
			return fmt.Sprintf("chain(%d, %dB, %v)", m.fm.Type, len(m.fm.Body), err)
		}
		return msgs[0].String()
	}
	msgs, err := wire.Decode(m.from, m.to, []frame.Message{m.fm})
	if err != nil || len(msgs) != 1 {
		return fmt.Sprintf("vr(%d, %dB, %v)", m.fm.Type, len(m.fm.Body), err)
	}
	return msgs[0].String()
}

// hostReq and hostResp are the client protocol.
type hostReq struct {
	Seq uint64
	Op  check.Op
	// Session is the client's session token (reads at session level
	// wait for it).
	Session shard.Session
	// Direct: a direct nilext update the client sent to every replica
	// (NilextTakeStepped): the replica answers with its ack. Ordered: the
	// client's fallback, the ordered path with the same id.
	Direct, Ordered bool
	// Try numbers a request sent again to a replica that already took it
	// (move_sim_test.go: after a refusal by the slot fence, with the same
	// request id), which the duplicate filter (hostNode.seen) must not drop.
	Try int
	// Routed (move_sim_test.go): the request has passed a node's routing
	// already and reaches the group's replica as routed then (the node's
	// routing is not run again): a request routed by a view that went
	// stale on the way, the widest window a race with a hand-over opens.
	Routed bool
}

func (m hostReq) String() string { return fmt.Sprintf("req(seq=%d %v %s)", m.Seq, m.Op.Kind, m.Op.Key) }

type hostResp struct {
	Seq     uint64
	Outcome check.Outcome
	Result  check.Result
	// Redirect: the replica did not take the op; Leader is where to go
	// (-1: unknown).
	Redirect bool
	Leader   int
	// View is the view of the op at Result.Version (ViewKnown), for the
	// client's session token.
	View      uint64
	ViewKnown bool
	// Direct answers a Direct request: Acked with the replica's ack, or
	// not (refused, or no ack in time).
	Direct, Acked bool
	Ack           vr.NilextAck
	// Refused: the group's slot fence refused the op (Fence, a
	// *kv.SlotError): it had no effect there (move_sim_test.go). A
	// replica of a cluster's node turns it into Moved.
	Refused bool
	Fence   kv.SlotError
	// Moved (move_sim_test.go): the node's routing sends the request to
	// group Group, whose leader is Leader as the node knows it (-1: none
	// known, or the slot is in flight): -MOVED <slot> <addr>.
	Moved bool
	Group int
}

func (m hostResp) String() string {
	if m.Moved {
		return fmt.Sprintf("resp(seq=%d moved to group %d leader=%d)", m.Seq, m.Group, m.Leader)
	}
	return fmt.Sprintf("resp(seq=%d %v v%d redirect=%t leader=%d)", m.Seq, m.Outcome, m.Result.Version, m.Redirect, m.Leader)
}

// hostSimOptions tune a run's replicas.
type hostSimOptions struct {
	mut       mutations
	ckptOps   uint64        // Options.CheckpointOps (0: a small default, so runs checkpoint)
	cadDelay  time.Duration // Options.CadSyncDelay (0: the default)
	followers bool          // Options.FollowerReads
	// slowSync: fsyncs take 2–6 ms, so many acknowledged writes sit
	// unsynced when crashes hit (as internal/vr's cad simulations).
	slowSync bool
	// majorityDown lets the nemesis crash two of the three replicas at
	// once: a cad write then survives only if it was durable or read.
	majorityDown bool
	// groupSize, if set, splits the replicas into groups of that many
	// (group g: replicas (g-1)*groupSize ..., VR ids from 1 on, as the
	// replicas' addresses plus one): move_sim_test.go's groups.
	groupSize int
	// cluster, if set, makes the replicas the nodes of a cluster of
	// several groups (move_sim_test.go): a client's request enters through
	// the node's routing (simCluster, cluster.SlotOwner and
	// cluster.RefusalTarget, as cluster.Multi runs them).
	cluster *simCluster
	// powerCuts crashes every replica at once every 100–400 ms of the
	// first two seconds, and restarts them 20 ms later.
	powerCuts bool
	// direct: clients send nilext-eligible SETs to every replica as
	// direct updates (NilextTakeStepped: the Go client's broadcast,
	// KEFIR.NILEXT), complete them on a supermajority of acks of one view
	// including its leader's (vr.NilextTracker), and fall back to the
	// ordered path with the same id without them. Needs nilext.
	direct bool
	// deferred serves reads as a front door that can hold a reply does
	// (ReadDeferredStepped): a read of a cad write not yet readable takes
	// its value and is answered once R covers it (deferred.go).
	deferred bool
	// nilext turns on the fast path (Options.Nilext): SETs go through
	// the coordinator (NilextStepped), reads of keys with pending updates
	// take the slow path.
	nilext bool
	// eventual is the replicas' eventual window (vr.Config.EventualWindow;
	// 0: the default), and the window check.Eventual holds reads to.
	eventual time.Duration
	// expiry runs active expiry every expiry (Options.ActiveExpiry) on
	// wall clocks (skew; else the node's clock from the epoch, as before).
	expiry time.Duration
	// skew: each replica's clock is a wall clock, simEpoch plus the
	// simulator's time, set off by up to skew either way (drawn per replica
	// from the seed) and drifting at the simulator's rate from the node's
	// first event on: clocks that agree within about skew, as active
	// expiry and ClockSkew assume.
	skew time.Duration
	// clockSkew is the replicas' Options.ClockSkew (0: the default,
	// DefaultClockSkew): how far a replica that does not lead takes its
	// clock to be from the leader's, and so how early it may hide a key
	// (hostExpiryBound).
	clockSkew time.Duration
	// txn: the clients run transactions of this protocol instead of the
	// workload's operations (host_sim_txn_test.go), judged by the
	// transaction checker.
	txn hostTxnMode
	// earlyAborts, if set, gains the transactions the running replicas
	// answered as aborted without a log entry (txdoom.go), counted with
	// the run's stats (hostSim's stats set).
	earlyAborts *uint64
	// holds, if set, gains the transactions the running replicas held
	// behind a commit in flight and, of those, answered as aborted
	// (txwait.go).
	holds *[2]uint64
	// chain, if set, runs a chain instead of a VR group: the first
	// hostChainMembers nodes are its members, the next its master
	// (chain_host_sim_test.go).
	chain *hostChain
}

// hostTTL gives the Puts of keys k0 and k1 an expiry 10–200 ms after
// their invocation (on the recorder's clock: the simulator's time, from
// now); k2 keeps none, so the other checkers still judge a key.
//
// With ttlReads the expiry metadata is read and written too: of the writes
// of k0 and k1, 6 in 10 are a Put with an expiry 20–500 ms ahead, 1 a Put
// without, 2 a PEXPIREAT 20–500 ms ahead and 1 a PERSIST; a third of their
// reads are expiry reads (PEXPIRETIME, linearizable), and after a write of
// k0 or k1 the client's next op is, 6 times in 10, an expiry read of that
// key: the read that must see its session's acknowledged write however
// the write was answered (a cad or async write before it is applied, a
// nilext write on the fast path). check.Expiry judges the answers.
type hostTTL struct {
	sim.Workload
	now      func() int64
	ttlReads bool
	// last is each client's last write of k0 or k1 not followed up yet
	// (ttlReads; hostSim makes it afresh for each run, so a seed replays).
	last map[int]string
}

func (w hostTTL) Next(rng *rand.Rand, client, seq int) check.Op {
	if w.ttlReads {
		key, ok := w.last[client]
		delete(w.last, client)
		if ok && rng.IntN(10) < 6 {
			return check.Op{Kind: check.TTL, Key: key}
		}
	}
	op := w.Workload.Next(rng, client, seq)
	if op.Key != "k0" && op.Key != "k1" {
		return op
	}
	if !w.ttlReads {
		if op.Kind == check.Put {
			op.ExpireAt = w.now() + int64(10+rng.IntN(190))*int64(time.Millisecond)
		}
		return op
	}
	ahead := func() int64 { return w.now() + int64(20+rng.IntN(480))*int64(time.Millisecond) }
	switch op.Kind {
	case check.Get:
		if rng.IntN(3) == 0 {
			op = check.Op{Kind: check.TTL, Key: op.Key}
		}
	case check.Put:
		switch x := rng.IntN(10); {
		case x < 6:
			op.ExpireAt = ahead()
		case x < 7:
		case x < 9:
			op.Kind, op.Value, op.ExpireAt = check.Expire, "", ahead()
		default:
			op.Kind, op.Value = check.Persist, ""
		}
		w.last[client] = op.Key
	}
	return op
}

// hostReads splits a workload's reads between linearizable, session,
// bounded(t), bounded(1 version) and eventual, as internal/vr's
// sessionWorkload does for its simulated core.
type hostReads struct{ sim.KV }

// hostBoundedStaleness is the bound of the bounded(t) reads: two
// heartbeat intervals.
const hostBoundedStaleness = 20 * time.Millisecond

// hostEventualWindow is the eventual window of the runs with eventual
// reads: short, so partitions and crashes outlast it often.
const hostEventualWindow = 25 * time.Millisecond

func (w hostReads) Next(rng *rand.Rand, client, seq int) check.Op {
	op := w.KV.Next(rng, client, seq)
	if op.Kind == check.Get {
		op.Cons = [...]level.Consistency{level.ConsLinearizable, level.ConsSession,
			level.BoundedTimeLevel(hostBoundedStaleness), level.BoundedVersionsLevel(1), level.ConsEventual}[rng.IntN(5)]
	}
	return op
}

type hostNode struct {
	id  sim.Addr
	cfg sim.Config
	r   *Replica
	now int64 // the node's clock at the current event
	// wall, if set, is the replica's wall clock (hostSimOptions.skew).
	wall *hostWall
	out  sim.Ready
	// The log fsyncs asked of the simulator, oldest first (it completes
	// them in order): SyncPending's numbers.
	syncAsked uint64
	syncQ     []uint64
	writes    []hostWrite
	reads     []hostRead
	nilexts   []hostNilext
	takes     []hostTake
	deferred  bool // hostSimOptions.deferred
	// seen: the client requests this replica took, across its restarts. The
	// simulated network duplicates messages; a client's connection (TCP)
	// does not, and a nilext write taken twice gets two coordinator
	// identities and is executed twice. Ordered writes would be safe anyway
	// (the client table), reads too; this keeps the harness honest for all.
	seen map[hostReqKey]bool
	// txn: the transaction steps in flight and open transactions
	// (host_sim_txn_test.go).
	txn hostTxnState
	// group is the replica's group (hostSimOptions.groupSize; 1 without);
	// slots the KEFIR.SLOTS writes in flight (move_sim_test.go).
	group   uint64
	slots   []hostSlotWrite
	reconfs []hostReconf // KEFIR.GROUP RECONFIG in flight (memb_sim_test.go)
	booting bool         // the map's bootstrap in flight (meta_sim_test.go)
	// cl is the cluster the replica's node belongs to
	// (hostSimOptions.cluster; nil: none).
	cl *simCluster
	// refusalRedirects: a write the core refused (NotLeaderError: a chain
	// head without its lease, mapErr) is answered as a redirect, which the
	// client follows, rather than as an unknown outcome — it was never
	// proposed (chain_host_sim_test.go: a chain's head refuses writes for
	// the whole of a repair, and each unknown write would stay open for
	// ever in the linearizability search).
	refusalRedirects bool
}

type hostReqKey struct {
	from   sim.Addr
	seq    uint64
	direct bool // a direct update's take, not its ordered fallback
	try    int
}

type hostTake struct {
	from sim.Addr
	seq  uint64
	st   *SteppedTake
}

type hostNilext struct {
	from sim.Addr
	seq  uint64
	sn   *SteppedNilext
}

type hostWrite struct {
	from sim.Addr
	seq  uint64
	kind check.Kind
	w    *SteppedWrite
}

type hostRead struct {
	from sim.Addr
	seq  uint64
	sr   *SteppedRead
	ttl  bool // an expiry read (check.TTL: PEXPIRETIME)
}

type hostClock struct{ n *hostNode }

func (c hostClock) Now() time.Time {
	n := c.n
	if n.wall == nil {
		return time.Unix(0, simEpoch+n.now)
	}
	if !n.wall.set {
		// Before the node's first event (Open): the simulator's time.
		return time.Unix(0, simEpoch+n.wall.trueNow()+n.wall.skew)
	}
	return time.Unix(0, simEpoch+n.now-n.wall.offset+n.wall.skew)
}

// hostWall is a replica's wall clock (hostSimOptions.skew): the node's
// clock minus offset, the node's clock at its first event less the
// simulator's time then, plus skew. It outlives restarts, as a machine's
// clock does.
type hostWall struct {
	trueNow      func() int64
	offset, skew int64
	set          bool
}

type hostNet struct{ n *hostNode }

func (h hostNet) Send(to uint64, p frame.Payload) error {
	eng, typ := p.Kind()
	h.n.out.Messages = append(h.n.out.Messages, sim.Envelope{
		To:  sim.Addr(to - 1),
		Msg: hostMsg{from: h.n.r.cfg.Self, to: to, fm: frame.Message{Engine: eng, Type: typ, Body: p.AppendBody(nil)}},
	})
	return nil
}

func (h hostNet) SendLarge(to uint64, p frame.Payload) error { return h.Send(to, p) }

func hostMembers(n int) []uint64 {
	ms := make([]uint64, n)
	for i := range ms {
		ms[i] = uint64(i + 1)
	}
	return ms
}

const hostDir = "/kefir"

func newHostNode(o hostSimOptions, seed uint64, trueNow func() int64) sim.BootFactory {
	started := map[sim.Addr]bool{}
	walls := map[sim.Addr]*hostWall{}
	seen := map[sim.Addr]map[hostReqKey]bool{}
	rngs := map[sim.Addr]*uint64{}
	return func(id sim.Addr, b sim.Boot) sim.Node {
		if seen[id] == nil {
			seen[id] = map[hostReqKey]bool{}
		}
		if o.chain != nil && id == hostChainMembers {
			return o.chain.newHostMaster()
		}
		n := &hostNode{id: id, cfg: b.Config, seen: seen[id], deferred: o.deferred, group: 1, cl: o.cluster, refusalRedirects: o.chain != nil}
		members, cluster := hostMembers(b.Config.Replicas), uint64(7)
		if o.chain != nil {
			members = hostMembers(hostChainMembers)
		}
		if o.groupSize > 0 {
			first := int(id) / o.groupSize * o.groupSize
			members, cluster = nil, 7+uint64(first/o.groupSize)
			for i := range o.groupSize {
				members = append(members, uint64(first+i+1))
			}
			n.group = uint64(first/o.groupSize) + 1
		}
		var join *simJoin
		if c := o.cluster; c != nil {
			// memb_sim_test.go: a spare not placed yet, and a replica lost
			// for good or retired, run nothing; a new member opens with
			// the configuration its node was given.
			var ok bool
			if join, ok = c.boot(int(id)); !ok {
				return goneNode{}
			}
			if join != nil {
				n.group, cluster = uint64(join.group), 7+uint64(join.group)-1
			}
			if c.isMeta(int(id)) {
				n.group = kv.MetaGroup // meta_sim_test.go
				if join != nil {
					cluster = c.metaCluster()
				}
			}
		}
		if o.skew > 0 {
			if walls[id] == nil {
				x := seed*0x2545f4914f6cdd1d + uint64(id)*0x9e3779b97f4a7c15
				x ^= x >> 29
				skew := int64(x%uint64(2*o.skew+1)) - int64(o.skew)
				walls[id] = &hostWall{trueNow: trueNow, skew: skew}
			}
			n.wall = walls[id]
		}
		// Bootstrap only on the group's very first start: a restarted
		// replica whose disk lost its log recovers from the group.
		first := !started[id]
		started[id] = true
		// One random stream per replica across its incarnations: a
		// restart must not draw its predecessor's numbers (its local
		// write seqs, cad client id, nilext coordinator ids and nonce
		// would repeat, and the group would take its new writes for
		// duplicates of old ones).
		if rngs[id] == nil {
			x := seed*0x9e3779b97f4a7c15 + uint64(id)*0xbf58476d1ce4e5b9
			rngs[id] = &x
		}
		rng := rngs[id]
		ckpt := o.ckptOps
		if ckpt == 0 {
			ckpt = 200
		}
		opts := Options{
			Dir: hostDir, FS: b.FS,
			VR: vr.Config{
				Cluster: cluster, Members: members, Self: uint64(id) + 1,
				EventualWindow: o.eventual,
			},
			Bootstrap:     first,
			Clock:         hostClock{n},
			Network:       hostNet{n},
			CheckpointOps: ckpt,
			// A client waits for a reply at most hostClientTimeout ticks.
			RequestTimeout: 400 * time.Millisecond,
			KeepTail:       50,
			CadSyncDelay:   o.cadDelay,
			FollowerReads:  o.followers,
			Nilext:         o.nilext,
			ActiveExpiry:   o.expiry,
			ClockSkew:      o.clockSkew,
			Random: func() uint64 {
				// splitmix64: a replay of the seed draws the same numbers.
				*rng += 0x9e3779b97f4a7c15
				z := *rng
				z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
				z = (z ^ (z >> 27)) * 0x94d049bb133111eb
				return z ^ (z >> 31)
			},
			mut:     o.mut,
			stepped: true,
		}
		if join != nil {
			join.open(&opts)
		}
		if o.chain != nil {
			opts.Chain = o.chain.options(id)
		}
		r, err := Open(opts)
		if err != nil {
			panic(fmt.Sprintf("replica %d: open: %v", id, err))
		}
		n.r = r
		n.flush()
		return n
	}
}

func (n *hostNode) Ready() sim.Ready {
	rd := n.out
	n.out = sim.Ready{}
	return rd
}

func (n *hostNode) Step(ev sim.Event) {
	n.now = ev.Now
	if w := n.wall; w != nil && !w.set {
		w.offset, w.set = ev.Now-w.trueNow(), true
	}
	switch ev.Kind {
	case sim.Message:
		switch m := ev.Msg.(type) {
		case hostMsg:
			from := uint64(ev.From) + 1
			if err := n.r.StepMessages(from, []frame.Message{m.fm}); err != nil {
				panic(fmt.Sprintf("replica %d: a message from %d does not decode: %v", n.id, from, err))
			}
		case hostReq:
			if n.cl != nil {
				n.onRouted(ev.From, m) // move_sim_test.go
			} else {
				n.onClient(ev.From, m)
			}
		case hostTxnReq:
			n.onTxnReq(ev.From, m)
		case moverReq:
			n.onSlots(ev.From, m) // move_sim_test.go
		}
	case sim.Tick:
		n.r.StepTick()
	case sim.Persisted:
		if len(n.syncQ) > 0 {
			gen := n.syncQ[0]
			n.syncQ = n.syncQ[1:]
			n.r.SyncDone(gen)
		}
	}
	n.flush()
	if n.cl != nil {
		n.cl.stepped(n) // move_sim_test.go: the ownership invariant
	}
}

// flush answers the client operations that finished and asks the
// simulator for the log fsync the replica started, if any.
func (n *hostNode) flush() {
	n.writes = keepPending(n.writes, func(w hostWrite) bool {
		done, res, err := writeFinished(w.w)
		if _, refused := redirectTo(err); done && refused && n.refusalRedirects {
			// Taken again if the client comes back with it.
			delete(n.seen, hostReqKey{from: w.from, seq: w.seq})
			n.redirect(w.from, w.seq, err)
		} else if done {
			n.reply(w.from, w.seq, writeOutcome(w.kind, res, err))
		}
		return done
	})
	n.reads = keepPending(n.reads, func(rd hostRead) bool {
		if !rd.sr.Poll() {
			return false
		}
		res, err := rd.sr.Result()
		out := n.readOutcome(res, err)
		if rd.ttl && out.Outcome == check.OK {
			out.Result = simkv.TTLResult(res, simEpoch)
		}
		n.reply(rd.from, rd.seq, out)
		return true
	})
	n.takes = keepPending(n.takes, func(x hostTake) bool {
		if !x.st.Poll() {
			return false
		}
		ack, err := x.st.Result()
		n.reply(x.from, x.seq, hostResp{Direct: true, Acked: err == nil, Ack: ack})
		return true
	})
	n.nilexts = keepPending(n.nilexts, func(x hostNilext) bool {
		if !x.sn.Poll() {
			return false
		}
		res, err := x.sn.Result()
		if err == nil && x.sn.Fast {
			// Completed on the fast path: OK, at a version nobody knows yet.
			n.reply(x.from, x.seq, hostResp{Outcome: check.OK, Result: check.Result{Found: true}})
			return true
		}
		n.reply(x.from, x.seq, writeOutcome(check.Put, res, err))
		return true
	})
	n.flushTxn()
	n.flushSlots()
	n.flushReconfs()
	if gen := n.r.SyncPending(); gen > n.syncAsked {
		n.syncAsked = gen
		n.syncQ = append(n.syncQ, gen)
		n.out.Sync = true
	}
}

// keepPending calls finish on each of xs in order and returns, in order,
// those it did not finish (false).
func keepPending[T any](xs []T, finish func(T) bool) []T {
	k := 0
	for _, x := range xs {
		if !finish(x) {
			xs[k] = x
			k++
		}
	}
	clear(xs[k:])
	return xs[:k]
}

// writeFinished reports whether a stepped write has finished and, if so,
// its result; one that expired unanswered finished with ErrOutcomeUnknown.
// The plain and the transaction clients' writes are polled through it.
func writeFinished(w *SteppedWrite) (done bool, res kv.Result, err error) {
	switch {
	case w.Done():
		res, err = w.Result(0)
		return true, res, err
	case w.Expired():
		return true, kv.Result{}, ErrOutcomeUnknown
	}
	return false, kv.Result{}, nil
}

// redirectTo reports whether err refuses a request because this replica
// does not lead, and the simulator address of the leader it names (-1:
// none). The plain and the transaction clients' redirects are read by it.
func redirectTo(err error) (leader int, notLeader bool) {
	var nl *NotLeaderError
	if !errors.As(err, &nl) {
		return -1, false
	}
	if nl.Leader == 0 {
		return -1, true
	}
	return int(nl.Leader) - 1, true
}

func (n *hostNode) reply(to sim.Addr, seq uint64, m hostResp) {
	if m.Refused && n.cl != nil {
		n.cl.refused(n, &m) // move_sim_test.go
	}
	m.Seq = seq
	m.Result.Node = int(n.id)
	n.out.Messages = append(n.out.Messages, sim.Envelope{To: to, Msg: m})
}

func (n *hostNode) redirect(to sim.Addr, seq uint64, err error) {
	leader, _ := redirectTo(err)
	n.reply(to, seq, hostResp{Redirect: true, Leader: leader})
}

func (n *hostNode) onClient(from sim.Addr, m hostReq) {
	k := hostReqKey{from, m.Seq, m.Direct, m.Try}
	if n.seen[k] {
		return // a duplicate the network made
	}
	n.seen[k] = true
	if m.Op.Kind == check.Get || m.Op.Kind == check.TTL {
		read := n.r.ReadStepped
		if n.deferred {
			read = n.r.ReadDeferredStepped
		}
		op := kv.Op{Kind: kv.KindGet, Key: []byte(m.Op.Key)}
		if m.Op.Kind == check.TTL {
			op = simkv.TTLOp(m.Op)
		}
		sr := read(op, m.Op.Cons, m.Session)
		n.reads = append(n.reads, hostRead{from: from, seq: m.Seq, sr: sr, ttl: m.Op.Kind == check.TTL})
		return
	}
	// The client's identity and its op's number: the network duplicates
	// messages, and the core's client table answers a retransmission with
	// the first execution's result instead of executing it again.
	id := shard.ReqID{Client: hostClientBase + uint64(from), Seq: m.Seq}
	if m.Direct {
		st := n.r.NilextTakeStepped(id, hostKV(m.Op), m.Op.Dur)
		n.takes = append(n.takes, hostTake{from: from, seq: m.Seq, st: st})
		return
	}
	if op := hostKV(m.Op); !m.Ordered && n.r.NilextOn() && NilextEligible(&op) {
		sn := n.r.NilextStepped(shard.WriteReq{Op: op, Durability: m.Op.Dur}, id)
		n.nilexts = append(n.nilexts, hostNilext{from: from, seq: m.Seq, sn: sn})
		return
	}
	reqs := []shard.WriteReq{{Op: hostKV(m.Op), Durability: m.Op.Dur, ID: id}}
	w := n.r.ProposeStepped(reqs)
	if w == nil {
		n.redirect(from, m.Seq, reqs[0].Err)
		return
	}
	n.writes = append(n.writes, hostWrite{from: from, seq: m.Seq, kind: m.Op.Kind, w: w})
}

// hostKV is the kv op that executes the checker's write: simkv's mapping
// (the one internal/vr's simulator uses), with expiries (PXAT) on the wall
// clocks (hostWall), whose zero is simEpoch.
func hostKV(op check.Op) kv.Op { return simkv.ToKV(op, simEpoch) }

// writeOutcome is a write's reply. Every error is an unknown outcome but a
// refusal before the write was proposed, which ProposeStepped reports
// separately (redirect).
func writeOutcome(kind check.Kind, res kv.Result, err error) hostResp {
	if se, ok := kv.ParseSlotError(err); ok {
		return hostResp{Outcome: check.Failed, Refused: true, Fence: se}
	}
	if err != nil {
		return hostResp{Outcome: check.Unknown}
	}
	return hostResp{Outcome: check.OK, Result: simkv.WriteResult(kind, res), View: res.View, ViewKnown: res.ViewKnown}
}

func (n *hostNode) readOutcome(res kv.Result, err error) hostResp {
	if se, ok := kv.ParseSlotError(err); ok {
		return hostResp{Outcome: check.Failed, Refused: true, Fence: se}
	}
	if err != nil {
		if leader, ok := redirectTo(err); ok {
			return hostResp{Redirect: true, Leader: leader}
		}
		return hostResp{Outcome: check.Failed} // a read has no effect
	}
	return hostResp{Outcome: check.OK, Result: simkv.ReadResult(res), View: res.View, ViewKnown: res.ViewKnown}
}

// hostClient sends each operation to the replica it believes leads, follows
// redirects, and gives up (unknown outcome) after timeout ticks without a
// reply, moving on to the next replica.
type hostClient struct {
	n        int
	leader   int
	seq      uint64
	op       check.Op
	inflight bool
	ticks    int
	retry    int // ticks until a redirect without a leader is retried (0: none)
	out      sim.Ready
	timeout  int
	// sess is the client's session: every op it completed advances it, as
	// a client library's token does.
	sess shard.Session
	// direct (hostSimOptions.direct): SETs go to every replica as direct
	// nilext updates; tr counts their acks, directTicks how long the
	// current one has waited; ordered: it fell back to the ordered path.
	direct      bool
	tr          *vr.NilextTracker
	directTicks int
	ordered     bool
	// strongAnywhere: linearizable reads, expiry reads among them, go to
	// the replicas in turn too (a chain's members serve them, CRAQ-style;
	// chain_host_sim_test.go).
	strongAnywhere bool
}

// hostDirectTimeout is how many ticks a direct update waits for a
// supermajority before the client takes the ordered path (the Go client's
// NilextTimeout, 100 ms by default).
const hostDirectTimeout = 100

func newHostClient(timeout int, direct bool) sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		return &hostClient{n: cfg.Replicas, timeout: timeout, direct: direct}
	}
}

func (c *hostClient) Ready() sim.Ready {
	rd := c.out
	c.out = sim.Ready{}
	return rd
}

func (c *hostClient) send() {
	c.retry = 0
	c.out.Messages = append(c.out.Messages, sim.Envelope{To: sim.Addr(c.leader), Msg: hostReq{Seq: c.seq, Op: c.op, Session: c.sess, Ordered: c.ordered}})
}

// sendFirst sends a new op: a read at a level below linearizable to the
// replicas in turn (followers serve cross-client-monotonic reads under
// FollowerReads, session and eventual reads when their state allows, else
// redirect) — with strongAnywhere every read, linearizable and expiry
// reads too — and anything else to the leader it believes in.
func (c *hostClient) sendFirst() {
	c.tr, c.ordered = nil, false
	if c.direct && c.op.Kind == check.Put {
		if op := hostKV(c.op); NilextEligible(&op) {
			c.tr, c.directTicks = vr.NewNilextTracker(hostMembers(c.n)), 0
			for i := range c.n {
				c.out.Messages = append(c.out.Messages, sim.Envelope{To: sim.Addr(i), Msg: hostReq{Seq: c.seq, Op: c.op, Direct: true}})
			}
			return
		}
	}
	if (c.op.Kind == check.Get || c.op.Kind == check.TTL) && (c.strongAnywhere || !c.op.Cons.IsZero() && c.op.Cons.Kind != level.Linearizable) {
		c.retry = 0
		to := sim.Addr(c.seq % uint64(c.n))
		c.out.Messages = append(c.out.Messages, sim.Envelope{To: to, Msg: hostReq{Seq: c.seq, Op: c.op, Session: c.sess}})
		return
	}
	c.send()
}

func (c *hostClient) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Invoke:
		c.seq, c.op, c.inflight, c.ticks = ev.Seq, ev.Op, true, 0
		c.sendFirst()
	case sim.Message:
		m, ok := ev.Msg.(hostResp)
		if !ok || !c.inflight || m.Seq != c.seq {
			return
		}
		if m.Direct {
			if c.tr != nil && m.Acked && c.tr.Add(m.Ack) {
				// A supermajority of one view, its leader's ack among them:
				// the update is linearized (OK at a version nobody knows).
				c.inflight, c.tr = false, nil
				c.out.Done = append(c.out.Done, sim.Completion{Seq: m.Seq, Outcome: check.OK, Result: check.Result{Found: true, Node: m.Result.Node}})
			}
			return
		}
		if !m.Redirect {
			c.inflight = false
			if m.Outcome == check.OK && m.Result.Version > 0 {
				r := kv.Result{Version: m.Result.Version, View: m.View, ViewKnown: m.ViewKnown}
				if !c.op.Kind.IsWrite() {
					c.sess = c.sess.AfterRead(r.Pos())
				} else {
					c.sess = c.sess.AfterWrite(r.Pos())
				}
			}
			c.out.Done = append(c.out.Done, sim.Completion{Seq: m.Seq, Outcome: m.Outcome, Result: m.Result})
			return
		}
		if m.Leader >= 0 && m.Leader != c.leader {
			c.leader = m.Leader
			c.send()
			return
		}
		// No leader known (a view change): try the next replica soon.
		c.leader = (c.leader + 1) % c.n
		c.retry = 5
	case sim.Tick:
		if !c.inflight {
			return
		}
		c.ticks++
		if c.tr != nil {
			if c.directTicks++; c.directTicks >= hostDirectTimeout {
				// No supermajority in time: the ordered path, same id (a
				// copy in some d-log is applied once).
				c.tr, c.ordered = nil, true
				c.send()
			}
			return
		}
		if c.ticks >= c.timeout {
			// Give up, and try another replica next: the one asked may be
			// down or cut off (a deposed leader that still believes it
			// leads; other clients meanwhile find the new one).
			c.inflight = false
			c.out.Done = append(c.out.Done, sim.Completion{Seq: c.seq, Outcome: check.Unknown})
			c.leader = (c.leader + 1) % c.n
			return
		}
		if c.retry > 0 {
			if c.retry--; c.retry == 0 {
				c.send()
			}
		}
	}
}

// simPanic, deferred by a simulation run, makes a panic in it (a core or
// host assertion: a broken invariant) the run's error, a failure the run
// found, replayed like any other.
// soakOn reports whether KEFIR_SOAK=1 asks for the long runs (hundreds
// or thousands of seeds where make test runs a few); any other value, as
// unset, does not.
func soakOn() bool { return os.Getenv("KEFIR_SOAK") == "1" }

// simSeeds is how many seeds a simulation's case runs: KEFIR_SIM_SEEDS if
// set (sim.SeedsEnv; sim.Explore takes it too), else soak under
// KEFIR_SOAK=1, else n.
func simSeeds(n, soak int) int {
	if v, err := strconv.Atoi(os.Getenv(sim.SeedsEnv)); err == nil && v > 0 {
		return v
	}
	if soakOn() {
		return soak
	}
	return n
}

func simPanic(err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("panic: %v", p)
	}
}

// simClock is the simulation's true time once *s is made (0 before:
// sim.New boots the replicas at time 0), for what the nodes are built with
// before it exists.
func simClock(s **sim.Sim) func() int64 {
	return func() int64 {
		if *s == nil {
			return 0
		}
		return int64((*s).Now())
	}
}

// hostSim runs one seed: three replicas of the production host and four
// clients under a swarm of faults (crashes with torn tails, partitions,
// one-way links, drift, loss, duplication, failed fsyncs), and returns the
// checkers' verdicts joined.
func hostSim(seed uint64, trace io.Writer, o hostSimOptions, w sim.Workload, stats *string) (err error) {
	defer simPanic(&err)
	var s *sim.Sim
	trueNow := simClock(&s)
	w = hostRunWorkload(w, trueNow)
	newClient := newHostClient(hostClientTimeout, o.direct)
	var txns *hostTxnRun
	if o.txn != txnNone {
		txns = newHostTxnRun(o.txn, seed, trueNow)
		newClient = txns.client()
	}
	so := sim.Options{
		Replicas: 3, Clients: 4,
		NewReplicaBoot: newHostNode(o, seed, trueNow), NewClient: newClient,
		Workload: w, OpsPerClient: 150, Think: sim.Dist{Base: 2 * time.Millisecond, Jitter: 10 * time.Millisecond},
		Duration: 4 * time.Second, Trace: trace,
	}
	if o.slowSync {
		so.Sync = sim.Dist{Base: 2 * time.Millisecond, Jitter: 4 * time.Millisecond}
	}
	so = sim.Swarm(seed, so)
	if o.majorityDown {
		f := *so.Faults
		f.MaxDown = 2
		so.Faults = &f
	}
	s = sim.New(so)
	if o.powerCuts {
		s.PowerCuts(2 * time.Second)
	}
	h := s.Run()
	if s.Err() == nil {
		// Past the nemesis (it heals and restarts everyone at Duration/2),
		// then the replicas that applied the same op must hold the same
		// state.
		s.RunFor(max(so.Duration/2-s.Now(), 0) + time.Second)
		if err := hostAgree(s); err != nil {
			return err
		}
	}
	if stats != nil {
		// By the running replicas: active expiry, deferred reads, direct
		// nilext updates taken.
		expired, deferred, taken, early := uint64(0), uint64(0), uint64(0), uint64(0)
		var holds [2]uint64
		for i := range so.Replicas {
			if node := s.Replica(i); node != nil {
				st := node.(*hostNode).r.Stats()
				early += st.TxEarlyAborts
				h, ha := node.(*hostNode).r.TxHolds()
				holds[0] += h
				holds[1] += ha
				expired += st.ExpiredKeys
				deferred += st.DeferredReads
				tk, _ := node.(*hostNode).r.NilextDirectStats()
				taken += tk
			}
		}
		*stats = fmt.Sprintf("%+v at %v, %d ops; reads answered OK by level: %v; keys expired actively: %d; reads deferred: %d; direct updates taken: %d",
			s.Stats(), s.Now(), len(h.Ops), readsByLevel(h), expired, deferred, taken)
		if txns != nil {
			*stats = fmt.Sprintf("%+v at %v; transactions: %s (%d aborted early, %d held behind a commit in flight and %d of those aborted, by the running replicas)",
				s.Stats(), s.Now(), txns.stats(), early, holds[0], holds[1])
		}
		if o.earlyAborts != nil {
			*o.earlyAborts += early
		}
		if o.holds != nil {
			o.holds[0] += holds[0]
			o.holds[1] += holds[1]
		}
	}
	if txns != nil {
		return errors.Join(s.Err(), txns.judge())
	}
	return errors.Join(s.Err(), hostJudgeRun(h, w, o))
}

// hostRunWorkload is the workload one run issues: w, or a hostTTL bound to
// the run's clock (now) with its per-client state made afresh, so that a
// seed replays. hostSim and hostChainSim both start their runs' through it.
func hostRunWorkload(w sim.Workload, now func() int64) sim.Workload {
	if t, ok := w.(hostTTL); ok {
		t.now = now
		t.last = map[int]string{}
		return t
	}
	return w
}

// hostJudgeRun judges a run's history h of workload w: keys written with
// an expiry (hostTTL) go to the expiry checker, held to hostExpiryBound;
// the rest to the checkers the writes' durability promises (hostJudge).
func hostJudgeRun(h check.History, w sim.Workload, o hostSimOptions) error {
	if _, ok := w.(hostTTL); ok {
		plain, expiring := check.SplitExpiring(h)
		return errors.Join(hostJudge(plain, workloadDur(w), o.eventual), check.Expiry(expiring, hostExpiryBound(o)).Err())
	}
	return hostJudge(h, workloadDur(w), o.eventual)
}

// hostExpiryBound is how far (ns) a run's replicas may decide a key's
// expiry from the recorder's clock, the expiry checker's bound: the wall
// clocks' skew and drift (hostWall) and a millisecond of rounding, within
// 10 ms. A VR group serves linearizable reads at its leader, which decides
// expiry at its own clock; a chain serves them at every member (CRAQ), and
// a member that is not the head — the head's clock stamps the writes, as a
// leader's does — decides at its clock plus ClockSkew (readNow;
// docs/consistency.md, "Key expiry"), so it may hide a key that much
// earlier still.
func hostExpiryBound(o hostSimOptions) int64 {
	bound := int64(o.skew) + 10*int64(time.Millisecond)
	if o.chain != nil {
		cs := o.clockSkew
		if cs == 0 {
			cs = DefaultClockSkew
		}
		bound += int64(cs)
	}
	return bound
}

// hostAgree checks that the running replicas that applied the same op hold
// the same engine state (every key, value, version and timestamp: the
// encoding a snapshot for a lagging peer carries), as internal/vr's
// checkAgreement does for its state machines.
func hostAgree(s *sim.Sim) error {
	all := make([]int, s.Config().Replicas)
	for i := range all {
		all[i] = i
	}
	return hostAgreeAmong(s, all)
}

// hostAgreeAmong is hostAgree over the replicas of one group (idx).
func hostAgreeAmong(s *sim.Sim, idx []int) error {
	states := map[uint64][]byte{}
	owner := map[uint64]int{}
	for _, i := range idx {
		node, ok := s.Replica(i).(*hostNode)
		if !ok {
			continue // down, or nothing runs there (memb_sim_test.go)
		}
		r := node.r
		if r.failed() != nil {
			continue
		}
		at := r.applied.Load()
		es := r.db.Snapshot(at)
		data, err := captureData(es, nil)
		es.Close()
		if err != nil {
			return fmt.Errorf("replica %d: capture at %d: %w", i, at, err)
		}
		if prev, ok := states[at]; ok {
			if !bytes.Equal(prev, data) {
				return fmt.Errorf("replicas %d and %d applied op %d but their engines differ", owner[at], i, at)
			}
			continue
		}
		states[at], owner[at] = data, i
	}
	return nil
}

// hostJudge runs the checkers the durability level promises under crashes.
// Sync: every checker (check.All). Cad: cross-client monotonic reads and
// the cad durability rule (a value once read survives crashes), not
// linearizability: a cad write acknowledged from a majority's memory and
// never read may be lost to crashes (docs/design/cad.md §4), as
// internal/vr's cadJudge has it. The visualization file is off: its random
// name would make a replayed failure look different (Explore compares).
//
// Eventual reads are held to the window (eventual; 0: the default).
func hostJudge(h check.History, d level.Durability, eventual time.Duration) error {
	lin := check.LinOptions{NoVisualization: true}
	if eventual == 0 {
		eventual = vr.DefaultEventualWindow
	}
	if d == level.Sync || d.IsZero() {
		return check.Errs(append(check.All(h, check.Options{Lin: lin}), check.Eventual(h, eventual)))
	}
	if d == level.Async {
		// Async reads see a write from its append on, so a view change or
		// a crash may take back a value a read returned: reads go back in
		// time (docs/consistency.md) and no order of them is promised. Its
		// runs (the expiry reads') judge only what holds: the expiry
		// checker's rules on acknowledged writes, and the replicas'
		// agreement.
		return nil
	}
	return check.Errs([]check.Verdict{check.CrossClientMonotonic(h), check.Durability(h)})
}

// TestHostSim runs the production host (stepped) under random faults and
// checks linearizability (and every other checker) of what the clients saw.
func TestHostSim(t *testing.T) {
	syncW := sim.KV{Keys: 3, Get: 4, Put: 4, CAS: 1, Incr: 1, Delete: 1, Dur: level.Sync}
	cadW := sim.KV{Keys: 3, Get: 4, Put: 4, Dur: level.CAD}
	cadCCM := sim.KV{Keys: 3, Get: 5, Put: 4, Dur: level.CAD, Cons: level.ConsCrossClient}
	nxW := sim.KV{Keys: 3, Get: 4, Put: 5, CAS: 1, Dur: level.Sync}
	readsW := hostReads{sim.KV{Keys: 3, Get: 6, Put: 4, CAS: 1, Delete: 1, Dur: level.Sync}}
	ttlW := hostTTL{Workload: hostReads{sim.KV{Keys: 3, Get: 6, Put: 4, Dur: level.Sync}}}
	for _, tc := range []struct {
		name string
		o    hostSimOptions
		w    sim.Workload
	}{
		{"sync", hostSimOptions{}, syncW},
		{"cad", hostSimOptions{}, cadW},
		// Every replica loses its unsynced bytes at once, repeatedly, with
		// slow fsyncs: restarts from torn WALs and engines.
		{"sync-powercuts", hostSimOptions{slowSync: true, powerCuts: true}, syncW},
		{"cad-powercuts", hostSimOptions{slowSync: true, powerCuts: true}, cadW},
		// Reads as a front door that holds replies serves them: a read of a
		// cad write not yet readable is deferred (its value taken now, its
		// answer once R covers the write; deferred.go).
		{"cad-deferred", hostSimOptions{deferred: true}, cadW},
		{"cad-deferred-powercuts", hostSimOptions{deferred: true, slowSync: true, powerCuts: true}, cadW},
		// Two of three replicas down at once: the group stalls, then
		// recovers without losing what it promised.
		{"sync-majority-down", hostSimOptions{majorityDown: true}, syncW},
		// Cross-client-monotonic reads at every replica: followers serve
		// them under the active set's read lease, checked against R
		// (docs/design/cad.md §2–3).
		{"cad-follower-reads", hostSimOptions{followers: true}, cadCCM},
		{"cad-follower-reads-powercuts", hostSimOptions{followers: true, slowSync: true, powerCuts: true}, cadCCM},
		// The nilext fast path: SETs coordinated on a supermajority's
		// d-logs, ordered in the background under group commit
		// (nilext_gc.go), reads of pending keys on the slow path.
		{"nilext-sync", hostSimOptions{nilext: true}, nxW},
		{"nilext-sync-powercuts", hostSimOptions{nilext: true, slowSync: true, powerCuts: true}, nxW},
		// Direct updates (the client-driven Skyros path, NilextTake): the
		// clients send SETs to every replica, complete them on a
		// supermajority's acks and fall back to the ordered path without.
		{"nilext-direct", hostSimOptions{nilext: true, direct: true}, nxW},
		{"nilext-direct-powercuts", hostSimOptions{nilext: true, direct: true, slowSync: true, powerCuts: true}, nxW},
		// Reads at every level, sent to the replicas in turn: session reads
		// wait for the token's versions (followers redirect after
		// FollowerWait), bounded reads are served at the leader, eventual
		// reads wherever the window allows (docs/consistency.md); every
		// checker, check.Eventual with the window included.
		{"sync-read-levels", hostSimOptions{eventual: hostEventualWindow}, readsW},
		// Keys with an expiry, reads at every level, active expiry every
		// 20 ms at the leader on wall clocks 20 ms apart at most and
		// drifting (docs/design/expiry.md): the expiry checker.
		{"sync-expiry", hostSimOptions{eventual: hostEventualWindow, expiry: 20 * time.Millisecond, skew: 20 * time.Millisecond}, ttlW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim.Explore(t, 1, 4, func(seed uint64, trace io.Writer) error {
				return hostSim(seed, trace, tc.o, tc.w, nil)
			})
		})
	}
}

// TestHostSimExpiryReads: expiry reads (PEXPIRETIME) after the client's
// own SET PXAT, PEXPIREAT or PERSIST (hostTTL.ttlReads), by a leader that
// answers cad and async blind writes before applying them and by a nilext
// group that answers SETs on the fast path, under random faults: the
// expiry checker's read-your-writes rule for expiry metadata. Eight seeds
// a case (a run takes about 30 ms): without c89b77bb's fix (kv.KindTTL in
// readKeys and nilextCoord.readKeys) each case fails within them (cad at
// seed 5, async 3, nilext 1; TestHostSimCatchesMutations keeps that).
func TestHostSimExpiryReads(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    hostSimOptions
		w    sim.Workload
	}{
		{"cad", ttlRW, ttlReadsW(level.CAD)},
		{"async", ttlRW, ttlReadsW(level.Async)},
		{"nilext", ttlRWNilext, ttlReadsW(level.Sync)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim.Explore(t, 1, 8, func(seed uint64, trace io.Writer) error {
				return hostSim(seed, trace, tc.o, tc.w, nil)
			})
		})
	}
}

// ttlReadsW is the expiry reads' workload (hostTTL.ttlReads) with writes
// of durability d.
func ttlReadsW(d level.Durability) hostTTL {
	return hostTTL{Workload: sim.KV{Keys: 3, Get: 5, Put: 5, Dur: d}, ttlReads: true}
}

// ttlRW and ttlRWNilext are the expiry reads' runs: active expiry every
// 20 ms on wall clocks 10 ms apart at most (the expiry checker's bound
// follows), on a plain VR group and on a --nilext one.
var (
	ttlRW       = hostSimOptions{expiry: 20 * time.Millisecond, skew: 10 * time.Millisecond}
	ttlRWNilext = hostSimOptions{nilext: true, expiry: 20 * time.Millisecond, skew: 10 * time.Millisecond}
)

// TestHostSimReplaysExactly: a seed's run of the host simulation is a
// function of the seed (as TestMoveSimReplaysExactly for the cluster's):
// two runs write the same trace.
func TestHostSimReplaysExactly(t *testing.T) {
	cadW := sim.KV{Keys: 3, Get: 4, Put: 4, Dur: level.CAD}
	nxW := sim.KV{Keys: 3, Get: 4, Put: 5, CAS: 1, Dur: level.Sync}
	ttlW := hostTTL{Workload: hostReads{sim.KV{Keys: 3, Get: 6, Put: 4, Dur: level.Sync}}}
	for _, tc := range []struct {
		name string
		o    hostSimOptions
		w    sim.Workload
	}{
		{"cad-deferred-powercuts", hostSimOptions{deferred: true, slowSync: true, powerCuts: true}, cadW},
		{"nilext-direct-powercuts", hostSimOptions{nilext: true, direct: true, slowSync: true, powerCuts: true}, nxW},
		{"sync-expiry", hostSimOptions{eventual: hostEventualWindow, expiry: 20 * time.Millisecond, skew: 20 * time.Millisecond}, ttlW},
		// The expiry reads' workload keeps per-client state (hostTTL.last).
		{"cad-expiry-reads", ttlRW, ttlReadsW(level.CAD)},
	} {
		replaysExactly(t, tc.name, func(w io.Writer) error { return hostSim(2, w, tc.o, tc.w, nil) })
	}
}

// TestHostSimCasAfterDelete: a CAS that misses a key deleted just before
// it answers version 0 whether or not the replica applied the DEL in the
// same batch. The applier's overlay used to answer the tombstone's version
// (the engine 0), so a leader that applied the two in two batches and
// followers that applied them in one kept different client-table rows for
// the CAS: at this seed, replicas 0 and 1 applied op 600 but their engines
// differed (found by the move simulation, docs/design/cluster.md §9).
func TestHostSimCasAfterDelete(t *testing.T) {
	w := sim.KV{Keys: 1, Put: 1, Delete: 2, CAS: 3, Dur: level.Sync}
	if err := hostSim(17, nil, hostSimOptions{}, w, nil); err != nil {
		t.Fatal(err)
	}
}

// TestHostSimCatchesMutations shows the harness catches bugs in the host's
// policy, each at a fixed seed that is clean without the mutation (found by
// TestHostSimMutationScan):
//   - heldAckEarly (group commit, nilext_gc.go): a log batch held for a
//     later fsync is reported to the core as durable before any fsync
//     covers it, so a prepare-ok promises cad entries a crash then takes
//     back after a read returned them;
//   - followerNoRCheck (CAD follower reads, read.go): a follower under the
//     active set's read lease serves its state without checking the key's
//     latest update against R, returning a cad write that is not yet
//     readable, which a later read elsewhere does not see;
//   - ignoreSession (session reads, read.go routeRead): a follower serves
//     a session read without waiting for the token's versions, so a client
//     reads a version older than its own write (the session checker);
//   - followerLinearizable (read.go routeRead): any replica serves the
//     levels that need the leader from its own state, so a follower (or a
//     deposed leader) answers a bounded read with a value superseded
//     beyond the bound (the bounded-staleness checker);
//   - expiryClockAhead (active expiry, expiry.go): the leader's cycle
//     decides and deletes by a clock a second ahead of its own, so a
//     linearizable read before a key's expiry finds it gone (the expiry
//     checker);
//   - deferNoWait (deferred reads, deferred.go): a read deferred on a cad
//     write that is not yet readable is answered at once instead of once
//     R covers the write, so a power cut takes back a value a client read
//     (cross-client monotonic reads);
//   - directAckEarly (direct nilext updates, nilext.go takeDirect): a
//     replica acks a client's direct update before its d-log record is
//     durable, so a power cut of the group loses an update the client
//     completed on a supermajority's acks (linearizability);
//   - ttlNoReadKey (readKeysOf, nilextCoord.readKeys: the bug c89b77bb
//     fixed): an expiry read names no key to the read checks, so the
//     leader serves it from its engine before its cad or async write, or
//     a nilext group's fast-path SET, is applied: the client's PEXPIRETIME
//     after its own SET PXAT answers the older expiry (the expiry
//     checker's read-your-writes rule), under each of the three.
//
// want names the checker that must report it.
func TestHostSimCatchesMutations(t *testing.T) {
	mutation.Require(t)
	cadW := sim.KV{Keys: 3, Get: 4, Put: 4, Dur: level.CAD}
	cadCCM := sim.KV{Keys: 3, Get: 5, Put: 4, Dur: level.CAD, Cons: level.ConsCrossClient}
	readsW := hostReads{sim.KV{Keys: 3, Get: 6, Put: 4, CAS: 1, Delete: 1, Dur: level.Sync}}
	levels := hostSimOptions{eventual: hostEventualWindow}
	ttlW := hostTTL{Workload: hostReads{sim.KV{Keys: 3, Get: 6, Put: 4, Dur: level.Sync}}}
	ttl := hostSimOptions{eventual: hostEventualWindow, expiry: 20 * time.Millisecond, skew: 20 * time.Millisecond}
	nxW := sim.KV{Keys: 3, Get: 4, Put: 5, CAS: 1, Dur: level.Sync}
	for _, tc := range []struct {
		name string
		seed uint64
		o    hostSimOptions
		mut  mutations
		w    sim.Workload
		want string
	}{
		{"heldAckEarly", 52, hostSimOptions{}, mutations{heldAckEarly: true}, cadW, ""},
		{"followerNoRCheck", 1, hostSimOptions{followers: true}, mutations{followerNoRCheck: true}, cadCCM, ""},
		{"ignoreSession", 2, levels, mutations{ignoreSession: true}, readsW, "session: VIOLATED"},
		{"followerLinearizable", 1, levels, mutations{followerLinearizable: true}, readsW, "bounded-staleness: VIOLATED"},
		{"expiryClockAhead", 3, ttl, mutations{expiryClockAhead: true}, ttlW, "expiry: VIOLATED"},
		{"deferNoWait", 11, hostSimOptions{deferred: true, slowSync: true, powerCuts: true}, mutations{deferNoWait: true}, cadW,
			"cross-client-monotonic: VIOLATED"},
		{"directAckEarly", 15, hostSimOptions{nilext: true, direct: true, slowSync: true, powerCuts: true}, mutations{directAckEarly: true}, nxW,
			"linearizable: VIOLATED"},
		{"ttlNoReadKey/cad", 6, ttlRW, mutations{ttlNoReadKey: true}, ttlReadsW(level.CAD), "its own (read-your-writes)"},
		{"ttlNoReadKey/async", 3, ttlRW, mutations{ttlNoReadKey: true}, ttlReadsW(level.Async), "its own (read-your-writes)"},
		{"ttlNoReadKey/nilext", 1, ttlRWNilext, mutations{ttlNoReadKey: true}, ttlReadsW(level.Sync), "its own (read-your-writes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := hostSim(tc.seed, nil, tc.o, tc.w, nil); err != nil {
				t.Fatalf("seed %d fails without the mutation: %v", tc.seed, err)
			}
			o := tc.o
			o.mut = tc.mut
			err := hostSim(tc.seed, nil, o, tc.w, nil)
			if err == nil {
				t.Fatalf("seed %d: the checkers missed %s", tc.seed, tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("seed %d: %s caught, but not by %q: %v", tc.seed, tc.name, tc.want, err)
			}
			t.Logf("caught: %s", firstLine(err))
		})
	}
}

// TestHostSimMutationScan (KEFIR_SOAK=1) reports, for mutations of the
// host's read and group-commit policy, the first of 200 seeds whose run the
// checkers fail: a map of what the harness catches and what it does not
// yet (docs/design/one-house.md, "The host under the simulator").
func TestHostSimMutationScan(t *testing.T) {
	mutation.Require(t)
	if !soakOn() {
		t.Skip("a scan of 200 seeds per mutation: KEFIR_SOAK=1")
	}
	cadW := sim.KV{Keys: 3, Get: 4, Put: 4, Dur: level.CAD}
	syncW := sim.KV{Keys: 3, Get: 4, Put: 4, Dur: level.Sync}
	cadCCM := sim.KV{Keys: 3, Get: 5, Put: 4, Dur: level.CAD, Cons: level.ConsCrossClient}
	nxW := sim.KV{Keys: 3, Get: 4, Put: 5, CAS: 1, Dur: level.Sync}
	readsW := hostReads{sim.KV{Keys: 3, Get: 6, Put: 4, CAS: 1, Delete: 1, Dur: level.Sync}}
	for _, tc := range []struct {
		name string
		o    hostSimOptions
		w    sim.Workload
	}{
		{"ignoreSession", hostSimOptions{mut: mutations{ignoreSession: true}, eventual: hostEventualWindow}, readsW},
		{"followerLinearizable", hostSimOptions{mut: mutations{followerLinearizable: true}, eventual: hostEventualWindow}, readsW},
		{"expiryClockAhead", hostSimOptions{mut: mutations{expiryClockAhead: true}, eventual: hostEventualWindow,
			expiry: 20 * time.Millisecond, skew: 20 * time.Millisecond}, hostTTL{Workload: readsW}},
		{"heldAckEarly", hostSimOptions{mut: mutations{heldAckEarly: true}}, cadW},
		{"heldAckEarly/powercuts", hostSimOptions{mut: mutations{heldAckEarly: true}, slowSync: true, powerCuts: true}, cadW},
		{"noDurabilityWait/powercuts", hostSimOptions{mut: mutations{noDurabilityWait: true}, slowSync: true, powerCuts: true}, cadW},
		{"noPreReadCheck/powercuts", hostSimOptions{mut: mutations{noPreReadCheck: true}, slowSync: true, powerCuts: true}, cadW},
		{"localLeaseNoClock", hostSimOptions{mut: mutations{localLeaseNoClock: true}}, syncW},
		{"nilextMajority", hostSimOptions{mut: mutations{nilextMajority: true}, nilext: true}, nxW},
		{"nilextMajority/powercuts", hostSimOptions{mut: mutations{nilextMajority: true}, nilext: true, slowSync: true, powerCuts: true}, nxW},
		{"followerNoRCheck", hostSimOptions{mut: mutations{followerNoRCheck: true}, followers: true}, cadCCM},
		{"followerNoRCheck/powercuts", hostSimOptions{mut: mutations{followerNoRCheck: true}, followers: true, slowSync: true, powerCuts: true}, cadCCM},
		{"deferNoWait", hostSimOptions{mut: mutations{deferNoWait: true}, deferred: true}, cadW},
		{"deferNoWait/powercuts", hostSimOptions{mut: mutations{deferNoWait: true}, deferred: true, slowSync: true, powerCuts: true}, cadW},
		{"deferNoRecheck/powercuts", hostSimOptions{mut: mutations{deferNoRecheck: true}, deferred: true, slowSync: true, powerCuts: true}, cadW},
		{"directAckEarly/powercuts", hostSimOptions{mut: mutations{directAckEarly: true}, nilext: true, direct: true, slowSync: true, powerCuts: true}, nxW},
		{"ttlNoReadKey/cad", hostSimOptions{mut: mutations{ttlNoReadKey: true}, expiry: ttlRW.expiry, skew: ttlRW.skew}, ttlReadsW(level.CAD)},
		{"ttlNoReadKey/async", hostSimOptions{mut: mutations{ttlNoReadKey: true}, expiry: ttlRW.expiry, skew: ttlRW.skew}, ttlReadsW(level.Async)},
		{"ttlNoReadKey/nilext", hostSimOptions{mut: mutations{ttlNoReadKey: true}, nilext: true, expiry: ttlRW.expiry, skew: ttlRW.skew}, ttlReadsW(level.Sync)},
	} {
		caught := false
		for seed := uint64(1); seed <= 200 && !caught; seed++ {
			if err := hostSim(seed, nil, tc.o, tc.w, nil); err != nil {
				t.Logf("%s: caught at seed %d: %s", tc.name, seed, firstLine(err))
				caught = true
			}
		}
		if !caught {
			t.Logf("%s: not caught in 200 seeds", tc.name)
		}
	}
}

// readsByLevel counts the reads answered OK, by level and by the replica
// that served them.
func readsByLevel(h check.History) map[string]int {
	n := map[string]int{}
	for _, op := range h.Ops {
		if op.Kind == check.Get && op.Outcome == check.OK {
			n[fmt.Sprintf("%v@%d", op.Cons, op.Node)]++
		}
	}
	return n
}

// workloadDur is the durability level of a run's writes.
func workloadDur(w sim.Workload) level.Durability {
	switch w := w.(type) {
	case sim.KV:
		return w.Dur
	case hostReads:
		return w.Dur
	case hostTTL:
		return workloadDur(w.Workload)
	}
	panic(fmt.Sprintf("workloadDur: %T", w))
}

func firstLine(err error) string {
	s := err.Error()
	for i := range s {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
