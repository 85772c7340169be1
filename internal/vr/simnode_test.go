package vr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/simkv"
	"github.com/kefirdb/kefir/internal/vfs"
)

// This file adapts the core to the simulator: simReplica is core + an
// in-memory KV state machine + a driver that follows doc.go's obligations
// over the simulator's disk; simClient is a client library that finds the
// leader, retries with the same request number and gives up with an unknown
// outcome.

// ---- the state machine: internal/kv over simkv's in-memory store ----

// The replicas run the production state machine (internal/kv): entries
// carry kv ops in kv's codec, kv.Apply evaluates them and kv.Read serves
// reads, and the core's client table keeps results in kv's codec, as a
// vrshard replica's does. The store under it (what the storage engine is to
// a process) and the mapping between the checkers' operations and kv's are
// internal/simkv's, shared with vrshard's host simulator.

// reader reads the simulated disk's records with kv's decoder; err is its
// first failure.
type reader struct {
	d   kv.Decoder
	err error
}

func newReader(b []byte) *reader { return &reader{d: kv.Decoder{B: b}} }

func (r *reader) uvarint() uint64 {
	v := r.d.Uvarint()
	r.err = r.d.Err
	return v
}

func (r *reader) str() string {
	s := string(r.d.Bytes())
	r.err = r.d.Err
	return s
}

func (r *reader) byte() byte {
	c := r.d.Byte()
	r.err = r.d.Err
	return c
}

// ---- the disk format of the simulated driver ----

const (
	recEntry byte = iota + 1
	recTruncate
	recHardState
	recSnapshot   // installed snapshot: replaces the whole log
	recCheckpoint // local checkpoint: entries after it stay
)

func appendSnapshot(b []byte, s *Snapshot) []byte {
	b = binary.AppendUvarint(b, s.Op)
	b = kv.AppendClientEntries(b, s.Clients)
	b = binary.AppendUvarint(b, uint64(len(s.Data)))
	return append(b, s.Data...)
}

func readSnapshot(r *reader) *Snapshot {
	s := &Snapshot{Op: r.uvarint()}
	if r.err == nil {
		s.Clients = kv.DecodeClientEntries(&r.d)
		r.err = r.d.Err
	}
	s.Data = []byte(r.str())
	return s
}

func encodeEntry(e *Entry) []byte {
	b := []byte{recEntry}
	for _, v := range []uint64{e.View, e.Op, e.Client, e.ReqNum, uint64(len(e.Data))} {
		b = binary.AppendUvarint(b, v)
	}
	return append(b, e.Data...)
}

// replay rebuilds State from the records a restarted replica's log kept.
// Snapshot records carry the snapshot point (op and client table); the
// state at that op is the engine's (engine_sim_test.go). recovering: the
// log was dropped for recovery from the group, which has not finished.
func replay(recs [][]byte) (st State, recovering bool) {
	base := uint64(0)
	for _, rec := range recs {
		r := newReader(rec[1:])
		switch rec[0] {
		case recEntry:
			e := Entry{View: r.uvarint(), Op: r.uvarint()}
			e.Client, e.ReqNum = r.uvarint(), r.uvarint()
			e.Data = []byte(r.str())
			if want := base + uint64(len(st.Entries)) + 1; e.Op != want {
				panic(fmt.Sprintf("replay: entry %d, want %d", e.Op, want))
			}
			st.Entries = append(st.Entries, e)
		case recTruncate:
			t := r.uvarint()
			if t < base {
				panic(fmt.Sprintf("replay: truncate to %d below snapshot %d", t, base))
			}
			if t-base < uint64(len(st.Entries)) {
				st.Entries = st.Entries[:t-base]
			}
		case recDLog:
			st.DLog = append(st.DLog, decodeDLog(r))
		case recHardState:
			st.HardState = HardState{View: r.uvarint(), LastNormalView: r.uvarint(), Commit: r.uvarint()}
		case recSnapshot, recCheckpoint:
			s := readSnapshot(r)
			if rec[0] == recSnapshot {
				st.Entries = nil
			} else {
				if s.Op < base || s.Op-base > uint64(len(st.Entries)) {
					panic(fmt.Sprintf("replay: checkpoint at %d outside log (%d,+%d]", s.Op, base, len(st.Entries)))
				}
				st.Entries = append([]Entry(nil), st.Entries[s.Op-base:]...)
			}
			st.Snapshot, base = s, s.Op
		case recRecovering:
			// The host keeps its configuration when it drops the log.
			st, base, recovering = State{Membership: st.Membership}, 0, true
		case recRecovered:
			recovering = false
		case recMembership:
			st.Membership, st.HardState = readMembership(r)
		case recReset:
			st, base, recovering = State{}, 0, false
		case recRetired:
		}
		if r.err != nil {
			panic(fmt.Sprintf("replay: record type %d: %v", rec[0], r.err))
		}
	}
	return st, recovering
}

// ---- client protocol ----

type clientReq struct {
	Seq uint64
	Op  check.Op
}

func (m clientReq) String() string {
	return fmt.Sprintf("req(seq=%d %v %s)", m.Seq, m.Op.Kind, m.Op.Key)
}

type clientResp struct {
	Seq    uint64
	OK     bool
	Result check.Result
	// Write, for a write's reply, is its result as the core's client table
	// keeps it (kv.AppendResult); Result then only names the replica.
	Write []byte
	// Leader is the replica to try next (-1: unknown) when !OK.
	Leader int
}

func (m clientResp) String() string {
	v := m.Result.Version
	if m.Write != nil {
		res, _, _ := kv.DecodeResult(m.Write)
		v = res.Version
	}
	return fmt.Sprintf("resp(seq=%d ok=%t v%d leader=%d)", m.Seq, m.OK, v, m.Leader)
}

// result is the reply's result for the client's op: a write's is read from
// its kv result for op's kind (as a client library reads a reply for the
// command it sent).
func (m clientResp) result(op check.Op) check.Result {
	if m.Write == nil {
		return m.Result
	}
	res, err := simkv.DecodeWrite(op.Kind, m.Write)
	if err != nil {
		panic(fmt.Sprintf("%v: %v", m.Seq, err))
	}
	res.Node = m.Result.Node
	return res
}

// ---- the replica node ----

type simOptions struct {
	mut        mutations
	lease      time.Duration // 0: reads use ReadIndex only
	drift      float64
	checkpoint uint64 // checkpoint every this many applied ops (0: never)
	keep       uint64 // entries kept after a checkpoint
	lostState  bool   // restarts run the recovery protocol
	counters   *simCounters
	nilext     *nilextSimOptions // nil: the fast path is off (nilext_sim_test.go)
	// Session reads (session_sim_test.go): counters, and the mutation that
	// serves them without checking the client's token.
	session        *sessionCounters
	sessionNoToken bool
	sessionNoRead  bool // the mutation: the token's max read is ignored (last write only)
	boundedNoCheck bool // the mutation: followers serve bounded(t) reads without freshness
	// boundedVrshardRule: followers trust any commit point their leader
	// sends, without a lease and even one still behind the log the view
	// started with (vrshard's rule today).
	boundedVrshardRule bool
	// cad: the CAD read and write rules (cad_sim_test.go); nil: off.
	cad *cadSimOptions
	// perReplica adjusts one replica's configuration (mixed flags).
	perReplica func(id sim.Addr, c *Config)
	// engineLoss, if > 0, is the chance per draw that the nemesis takes a
	// replica down and loses (or rolls back) its engine
	// (engine_sim_test.go); engineTrustsLog is the mutation: a restart
	// trusts the log's snapshot point whatever the engine holds.
	engineLoss      float64
	engineTrustsLog bool
	// ttl: key expiry runs (expiry_sim_test.go); nil: off.
	ttl *ttlSim
	// reconfig: the group's membership changes (reconfig_sim_test.go);
	// nil: the first Replicas replicas are the group for ever.
	reconfig *reconfigSim
}

// simCounters shows that a run exercised the paths it claims to.
type simCounters struct {
	snapshotsSent, snapshotsInstalled, recoveries, viewsStarted int
	engineLosses                                                int // engine_sim_test.go
}

type parkedRead struct {
	client sim.Addr
	seq    uint64
	key    string
	index  uint64
}

type simReplica struct {
	// keptRetired: a retired replica the host keeps (reconfigSim.keepRetired).
	keptRetired bool
	id          sim.Addr
	o           simOptions
	core        *Replica
	state       *simkv.Store
	out         sim.Ready
	recs        int
	seqAt       []struct {
		recs int
		seq  uint64
	}
	now    int64
	parked []parkedRead
	byCtx  map[uint64]parkedRead
	ctx    uint64
	ckpt   uint64
	errs   []error
	// bounded(t) reads: when (local clock) this follower last heard its
	// leader, and the commit point that message carried.
	hbAt     int64
	hbCommit uint64
	// The view whose start-view this replica received, and the op that
	// view's log ended at.
	startView, startOp uint64
	// async runs: acknowledged blind writes not yet applied, by key, and
	// the operations proposed at AckAppended awaiting their ack.
	overlay  map[string]simkv.Record
	asyncOps map[[2]uint64]check.Op
	// fs holds the engine's durable copy (engine_sim_test.go); recovering:
	// the log says this replica recovers from the group (recRecovering).
	fs         vfs.FS
	recovering bool
	// msPending: a Ready.Membership written in batch msSeq, reported to
	// the operator (reconfigSim.note) once that batch is durable.
	msPending *Membership
	msSeq     uint64
}

func memberIDs(n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	return ids
}

func replicaID(a sim.Addr) uint64    { return uint64(a) + 1 }
func replicaAddr(id uint64) sim.Addr { return sim.Addr(id - 1) }

func simConfig(id sim.Addr, n int, o simOptions) Config {
	if o.reconfig != nil {
		n = o.reconfig.initial
	}
	c := Config{Cluster: 7, Epoch: 1, Members: memberIDs(n), Self: replicaID(id),
		HeartbeatInterval: 5 * time.Millisecond, ViewChangeTimeout: 40 * time.Millisecond,
		LeaseDuration: o.lease, MaxDrift: o.drift, MaxBatch: 16, MaxInflight: 256, EventualWindow: eventualWindow}
	if o.nilext != nil {
		c.Nilext, c.NilextBatch, c.NilextInterval = true, o.nilext.batch, o.nilext.interval
	}
	if o.cad != nil {
		cadConfig(&c, o.cad)
	}
	if o.perReplica != nil {
		o.perReplica(id, &c)
	}
	return c
}

func newSimReplica(o simOptions) sim.BootFactory {
	incarnation := map[sim.Addr]uint64{}
	return func(id sim.Addr, b sim.Boot) sim.Node {
		cfg := b.Config
		st, state, recovering, reset := restoreDisk(b, o.engineTrustsLog)
		incarnation[id]++
		st.Bootstrap = incarnation[id] == 1
		// A driver that knows its disk kept every d-log record it acked
		// (a clean stop, or only sync writes, as some scenarios have).
		st.DLogIntact = o.nilext != nil && o.nilext.intact
		if (o.lostState && incarnation[id] > 1) || recovering {
			// A restart (even from a wiped disk) is not a new group.
			st.LostState = true
			st.Nonce = incarnation[id]<<8 | uint64(id)
		} else if o.cad != nil {
			// doc.go: a fresh random nonce on every start (scrambled here).
			st.Nonce = splitmix(incarnation[id]<<8 | uint64(id))
		}
		if o.reconfig != nil && !o.reconfig.runs(id, st.Membership, b.Recovered) {
			// Not a member of the configuration its disk holds (a spare,
			// or a retired member): the host does not start a core.
			return &simReplica{id: id, o: o, state: state, recs: len(b.Recovered), byCtx: map[uint64]parkedRead{}, fs: b.FS}
		}
		core, err := New(simConfig(id, cfg.Replicas, o), st)
		if err != nil {
			panic(err)
		}
		core.mut = o.mut
		n := &simReplica{id: id, o: o, core: core, state: state, recs: len(b.Recovered), byCtx: map[uint64]parkedRead{}}
		n.fs, n.recovering = b.FS, recovering
		n.keptRetired = o.reconfig != nil && st.Membership != nil && !slices.Contains(st.Membership.Members, replicaID(id))
		if reset {
			n.dropLog()
		}
		n.ckpt = core.applied
		return n
	}
}

func (n *simReplica) Ready() sim.Ready {
	rd := n.out
	n.out = sim.Ready{}
	return rd
}

func (n *simReplica) Step(ev sim.Event) {
	n.now = ev.Now
	if n.core == nil {
		n.spareStep(ev)
		return
	}
	switch ev.Kind {
	case sim.Tick:
		before := n.core.Info()
		n.core.Tick(ev.Now)
		n.count(before)
		n.expiryTick()
	case sim.Persisted:
		var seq uint64
		for len(n.seqAt) > 0 && n.seqAt[0].recs <= ev.Persisted {
			seq = n.seqAt[0].seq
			n.seqAt = n.seqAt[1:]
		}
		if seq > 0 {
			n.core.Persisted(seq)
			if n.msPending != nil && seq >= n.msSeq {
				if n.keptRetired && slices.Contains(n.msPending.Members, replicaID(n.id)) {
					n.keptRetired = false
					n.o.reconfig.readopted++
				}
				n.o.reconfig.note(n.msPending)
				n.msPending = nil
			}
		}
	case sim.Message:
		switch m := ev.Msg.(type) {
		case Message:
			before := n.core.Info()
			n.core.Step(ev.Now, m)
			n.count(before)
			n.heardLeader(ev.Now, m, false)
		case leasedMsg:
			n.stepLeased(ev.Now, m)
		case clientReq:
			n.onClient(ev.From, m)
		case nilextReq:
			n.onNilext(ev.From, m)
		case sessionReq:
			n.onSession(ev.From, m)
		default:
			panic(fmt.Sprintf("simReplica: unexpected %T", ev.Msg))
		}
	}
	n.drain()
	n.maybeStop()
}

func (n *simReplica) count(before Info) {
	c := n.o.counters
	if c == nil {
		return
	}
	after := n.core.Info()
	if before.Status == Recovering && after.Status == Normal {
		c.recoveries++
	}
	if after.IsLeader && !before.IsLeader {
		c.viewsStarted++
	}
}

func (n *simReplica) redirect(to sim.Addr, seq uint64) {
	l := -1
	if info := n.core.Info(); info.Status == Normal {
		l = int(replicaAddr(info.Leader))
	} else if info.Leaving {
		l = int(replicaAddr(n.core.cfg.Members[0])) // the new epoch's first leader
	}
	n.out.Messages = append(n.out.Messages, sim.Envelope{To: to, Msg: clientResp{Seq: seq, Leader: l}})
}

func (n *simReplica) onClient(from sim.Addr, m clientReq) {
	if n.o.cad != nil {
		if m.Op.Kind == check.Get {
			n.cadRead(from, m)
		} else {
			n.cadPropose(from, m)
		}
		return
	}
	if m.Op.Kind == check.Get {
		if n.nilextRead(from, m) {
			return
		}
		n.onClientRead(from, m)
		return
	}
	err := n.core.Propose(n.now, Request{Client: uint64(from), ReqNum: m.Seq, Data: simkv.AppendOp(nil, m.Op, n.proposeNow())})
	if err != nil {
		n.redirect(from, m.Seq)
	}
}

// onClientRead serves a linearizable read: under the lease, else read-index.
func (n *simReplica) onClientRead(from sim.Addr, m clientReq) {
	{
		idx, err := n.core.LeaseRead(n.now)
		if n.o.lease == 0 && !n.core.mut.noLeaseCheck {
			idx, err = 0, ErrNoLease
		}
		switch {
		case err == nil:
			n.parked = append(n.parked, parkedRead{client: from, seq: m.Seq, key: m.Op.Key, index: idx})
		case errors.Is(err, ErrNoLease):
			n.ctx++
			if err := n.core.ReadIndex(n.now, n.ctx); err != nil {
				n.redirect(from, m.Seq)
				return
			}
			n.byCtx[n.ctx] = parkedRead{client: from, seq: m.Seq, key: m.Op.Key}
		default:
			n.redirect(from, m.Seq)
		}
	}
}

func (n *simReplica) serveReads() {
	k := 0
	for _, p := range n.parked {
		if p.index > n.core.applied {
			n.parked[k] = p
			k++
			continue
		}
		v := n.state.Record(p.key)
		if n.cadRewait(p, v) {
			continue
		}
		res := simkv.ReadKey(v.Getter(), p.key, n.readNow())
		res.Node = int(n.id)
		n.out.Messages = append(n.out.Messages, sim.Envelope{To: p.client, Msg: clientResp{Seq: p.seq, OK: true, Result: res}})
	}
	n.parked = n.parked[:k]
}

// drain performs the core's Ready batches as doc.go prescribes.
func (n *simReplica) drain() {
	for range 100 {
		rd := n.core.Ready()
		if rd.Empty() {
			n.serveReads()
			return
		}
		if rd.HasWrite() {
			before := len(n.out.Persist)
			if s := rd.Snapshot; s != nil {
				n.out.Persist = append(n.out.Persist, appendSnapshot([]byte{recSnapshot}, n.toEngine(s)))
				if c := n.o.counters; c != nil {
					c.snapshotsInstalled++
				}
				n.state = loadImage(s.Data)
				if rc := n.o.reconfig; rc != nil && n.core.cfg.EpochStart > 0 {
					rc.snapshots++ // state transfer by snapshot in a reconfigured epoch (a joining member, mostly)
				}
				n.parked = nil // reads wait for applied, which jumped; simplest to let clients retry
			}
			if rd.HasTruncate {
				n.out.Persist = append(n.out.Persist, binary.AppendUvarint([]byte{recTruncate}, rd.Truncate))
			}
			for i := range rd.Entries {
				n.out.Persist = append(n.out.Persist, encodeEntry(&rd.Entries[i]))
			}
			for i := range rd.DLog {
				n.out.Persist = append(n.out.Persist, encodeDLog(&rd.DLog[i]))
			}
			if ms := rd.Membership; ms != nil {
				// One record with the hard state (doc.go): a torn batch
				// keeps both or neither.
				n.out.Persist = append(n.out.Persist, appendMembership([]byte{recMembership}, ms, rd.HardState))
				// The operator acts on it once it is durable (doc.go).
				n.msPending, n.msSeq = ms, rd.PersistSeq
			} else if hs := rd.HardState; hs != nil {
				b := []byte{recHardState}
				for _, v := range []uint64{hs.View, hs.LastNormalView, hs.Commit} {
					b = binary.AppendUvarint(b, v)
				}
				n.out.Persist = append(n.out.Persist, b)
			}
			n.noteRecovered()
			n.recs += len(n.out.Persist) - before
			n.seqAt = append(n.seqAt, struct {
				recs int
				seq  uint64
			}{n.recs, rd.PersistSeq})
			n.out.Sync = true
		}
		for _, m := range rd.Messages {
			n.out.Messages = append(n.out.Messages, sim.Envelope{To: replicaAddr(m.To), Msg: n.outgoing(m)})
		}
		for _, a := range rd.Acks {
			n.onAck(a)
		}
		for _, a := range rd.NilextAcks {
			n.out.Messages = append(n.out.Messages, sim.Envelope{To: sim.Addr(a.Client), Msg: nilextAckMsg{a}})
		}
		if len(rd.Committed) > 0 {
			results := make([][]byte, len(rd.Committed))
			for i, c := range rd.Committed {
				n.o.reconfig.audit(n.id, &c.Entry)
				if c.Duplicate || (n.o.reconfig != nil && len(c.Data) == 0) {
					continue // a reconfiguration: hosts skip empty requests (vrshard's apply)
				}
				results[i] = n.state.ApplyEntry(c.Op, c.Data, n.applyClock())
			}
			n.core.Advance(results)
			n.pruneOverlay()
		}
		for _, r := range rd.Replies {
			if isExpiryClient(r.Client) {
				continue // the leader's own active expiry: nobody to answer
			}
			// The result as the client table keeps it (kv's codec): the
			// client reads it for its op (clientResp.result).
			ok := r.Err == nil
			resp := clientResp{Seq: r.ReqNum, OK: ok, Result: check.Result{Node: int(n.id)}, Leader: -1}
			if ok {
				resp.Write = r.Result
			}
			n.out.Messages = append(n.out.Messages, sim.Envelope{To: sim.Addr(r.Client), Msg: resp})
		}
		for _, rs := range rd.ReadStates {
			p, ok := n.byCtx[rs.Ctx]
			if !ok {
				continue
			}
			delete(n.byCtx, rs.Ctx)
			if rs.Err != nil {
				n.redirect(p.client, p.seq)
				continue
			}
			p.index = rs.Index
			n.parked = append(n.parked, p)
		}
		for _, to := range rd.SnapshotNeeded {
			s := Snapshot{Op: n.core.applied, Clients: n.core.ClientTable(), Data: n.state.Image()}
			if err := n.core.SendSnapshot(to, s); err != nil {
				panic(err)
			}
			if c := n.o.counters; c != nil {
				c.snapshotsSent++
			}
		}
		n.errs = append(n.errs, rd.Errors...)
		if n.o.checkpoint > 0 && n.core.applied >= n.ckpt+n.o.checkpoint {
			a := n.core.applied
			s := Snapshot{Op: a, Clients: n.core.ClientTable(), Data: n.state.Image()}
			n.out.Persist = append(n.out.Persist, appendSnapshot([]byte{recCheckpoint}, n.toEngine(&s)))
			n.recs++
			n.ckpt = a
			if a > n.o.keep {
				if err := n.core.Compact(a - n.o.keep); err != nil {
					panic(err)
				}
			}
		}
		n.serveReads()
	}
	panic(fmt.Sprintf("replica %d: Ready did not settle", n.id))
}

// ---- the client library ----

// simClient sends each operation to the replica it believes leads, follows
// redirects, and moves on to the next replica after timeout ticks without a
// reply, giving up (unknown outcome) after maxTries sends. With session set
// it also keeps a session token: writes and linearizable reads go to the
// leader as before; session, bounded and eventual reads go to a random
// replica with the token (sessionReq).
type simClient struct {
	id       sim.Addr
	n        int
	leader   int // where writes and linearizable reads go
	target   int // where a session client's local read in flight went
	seq      uint64
	op       check.Op
	inflight bool
	ticks    int
	tries    int
	out      sim.Ready
	timeout  int // ticks before trying another replica
	maxTries int

	session            bool
	lastWrite, maxRead uint64
	rnd                uint64 // xorshift state, seeded from the virtual time of each invocation
}

func newSimClient(timeout, maxTries int) sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		return &simClient{id: id, n: cfg.Replicas, timeout: timeout, maxTries: maxTries}
	}
}

func (c *simClient) Ready() sim.Ready {
	rd := c.out
	c.out = sim.Ready{}
	return rd
}

// local reports whether the operation in flight is a read any replica may
// serve (session, bounded or eventual) of a session client, sent as a
// sessionReq to a random replica.
func (c *simClient) local() bool {
	return c.session && c.op.Kind == check.Get &&
		(c.op.Cons.Kind == level.Session || c.op.Cons.Kind == level.BoundedTime || c.op.Cons.Kind == level.Eventual)
}

// dest is where the request in flight goes: the leader, or the local read's
// target.
func (c *simClient) dest() int {
	if c.local() {
		return c.target
	}
	return c.leader
}

// random is deterministic per simulation seed: the invocation times differ
// from seed to seed, the client has no other source.
func (c *simClient) random(n int) int {
	c.rnd ^= c.rnd << 13
	c.rnd ^= c.rnd >> 7
	c.rnd ^= c.rnd << 17
	return int(c.rnd % uint64(n))
}

func (c *simClient) send() {
	c.tries++
	c.ticks = 0
	var msg any = clientReq{Seq: c.seq, Op: c.op}
	if c.local() {
		msg = sessionReq{Seq: c.seq, Op: c.op, LastWrite: c.lastWrite, MaxRead: c.maxRead}
	}
	c.out.Messages = append(c.out.Messages, sim.Envelope{To: sim.Addr(c.dest()), Msg: msg})
}

func (c *simClient) giveUp() {
	c.inflight = false
	c.out.Done = append(c.out.Done, sim.Completion{Seq: c.seq, Outcome: check.Unknown})
}

// learn advances a session client's token with an acknowledged result. A
// write's version is the op that wrote it (a failed CAS reports the version
// it found, which is what the session then knows to exist).
func (c *simClient) learn(res check.Result) {
	if c.op.Kind.IsWrite() {
		c.lastWrite = max(c.lastWrite, res.Version)
	} else {
		c.maxRead = max(c.maxRead, res.Version)
	}
}

func (c *simClient) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Invoke:
		c.seq, c.op, c.inflight, c.tries = ev.Seq, ev.Op, true, 0
		if c.local() {
			c.rnd = uint64(ev.Now)*2654435761 + uint64(c.id)*40503 + c.seq | 1
			c.target = c.random(c.n)
		}
		c.send()
	case sim.Message:
		m, ok := ev.Msg.(clientResp)
		if !ok || !c.inflight || m.Seq != c.seq {
			return
		}
		if m.OK {
			c.inflight = false
			res := m.result(c.op)
			if c.session {
				c.learn(res)
			}
			c.out.Done = append(c.out.Done, sim.Completion{Seq: m.Seq, Outcome: check.OK, Result: res})
			return
		}
		if m.Leader >= 0 && m.Leader != c.dest() {
			c.leader, c.target = m.Leader, m.Leader
			if c.tries >= c.maxTries {
				c.giveUp()
				return
			}
			c.send()
		}
		// Otherwise wait: the timeout moves on to another replica.
	case sim.Tick:
		if !c.inflight {
			return
		}
		c.ticks++
		if c.ticks >= c.timeout {
			if c.tries >= c.maxTries {
				c.giveUp()
				return
			}
			if c.local() {
				c.target = (c.target + 1) % c.n
			} else {
				c.leader = (c.leader + 1) % c.n
			}
			c.send()
		}
	}
}

// ---- cross-replica invariants ----

// checkAgreement verifies that live replicas agree on every committed op they
// both still hold, and that applied state machines with the same applied op
// are equal.
func checkAgreement(s *sim.Sim, n int) error {
	var rs []*simReplica
	for i := 0; i < n; i++ {
		if node := s.Replica(i); node != nil && node.(*simReplica).core != nil {
			rs = append(rs, node.(*simReplica))
		}
	}
	for a := 0; a < len(rs); a++ {
		for b := a + 1; b < len(rs); b++ {
			x, y := rs[a].core, rs[b].core
			lo := max(x.first, y.first)
			hi := min(x.commit, y.commit)
			for op := lo; op <= hi; op++ {
				ex, ey := x.entry(op), y.entry(op)
				if ex.View != ey.View || ex.Client != ey.Client || ex.ReqNum != ey.ReqNum {
					return fmt.Errorf("replicas %d and %d disagree on committed op %d: %+v vs %+v", x.cfg.Self, y.cfg.Self, op, ex, ey)
				}
			}
			if x.applied == y.applied {
				if ex, ey := rs[a].state.Image(), rs[b].state.Image(); !slices.Equal(ex, ey) {
					return fmt.Errorf("replicas %d and %d applied %d ops but their states differ", x.cfg.Self, y.cfg.Self, x.applied)
				}
			}
		}
	}
	return nil
}

// loadImage is the store a snapshot's or checkpoint's data holds.
func loadImage(b []byte) *simkv.Store {
	s, err := simkv.LoadImage(b)
	if err != nil {
		panic(err)
	}
	return s
}
