package vrshard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/sim"
)

// Transactions on the production host under the simulator's faults (issue
// 29): the clients of a run (hostTxnClient) run Elle's list-append
// transactions (check.TxnGen) against the replica group, in one of two
// protocols, and check.CheckTxns judges the history they record:
//
//   - txnExec, Redis's optimistic pattern: WATCH every key of the
//     transaction (a linearizable read, kv.KindWatch, at the leader), MGET
//     them (linearizable), then EXEC (kv.KindExec, one op of the log) of a
//     SET per appended key — the list read plus its appends — carrying the
//     watches. EXEC answering a null array is an abort. The reads are
//     outside EXEC: only the watches, compared by the state machine at the
//     EXEC's position, make them the state the writes replace. Judged
//     strict serializable.
//   - txnSI and txnSerializable, KEFIR.TX as the Go client runs it: BEGIN
//     with the reads (a pinned snapshot at a linearizable start version,
//     Replica.TxBeginStepped, held by the node that took it and lost with
//     it), a few ticks later PREPARE at the same node (the commit op built as
//     the front door builds it: internal/server txCommit at key grain), and
//     the op sent through the write path to the leader (KEFIR.TXAPPLY), with
//     a request id its redirects keep. A read-only transaction commits at
//     PREPARE without the log. -TXABORT is an abort. Judged snapshot
//     isolation and strict serializability.
//
// The front door's command parsing is not here (it is internal/server's and
// tested there): the clients build the ops it would. An outcome is an abort
// (check.Failed) only when nothing of the transaction can land: a refusal,
// a conflict, or a step before the commit op was sent that failed or timed
// out; a commit op sent without a reply is unknown.

// hostTxnMode is a run's transaction protocol.
type hostTxnMode uint8

const (
	txnNone hostTxnMode = iota
	txnExec
	txnSI
	txnSerializable
)

func (m hostTxnMode) String() string {
	return [...]string{"none", "exec", "si", "serializable"}[m]
}

// model is the isolation the mode promises.
func (m hostTxnMode) model() check.TxnModel {
	if m == txnSI {
		return check.SnapshotIsolation
	}
	return check.StrictSerializable
}

// hostTxnStep is what a transaction request asks of the node.
type hostTxnStep uint8

const (
	stepRead    hostTxnStep = iota + 1 // Op at linearizable (WATCH, MGET)
	stepWrite                          // Op through the log (EXEC, KEFIR.TXAPPLY)
	stepBegin                          // BEGIN and read Keys in the snapshot
	stepPrepare                        // the commit op of transaction Handle with Writes
)

// hostTxnReq is a transaction client's request.
type hostTxnReq struct {
	Seq    uint64
	Step   hostTxnStep
	Op     kv.Op
	Keys   [][]byte
	Handle uint64
	Iso    kv.Cond
	Writes []kv.Op
	// Close (xg_sim_test.go): a BEGIN whose snapshot is only read, closed
	// at once; its answer carries the versions seen and the start.
	Close bool
}

func (m hostTxnReq) String() string { return fmt.Sprintf("txreq(seq=%d step=%d)", m.Seq, m.Step) }

// hostTxnResp is the node's answer.
type hostTxnResp struct {
	Seq uint64
	// Redirect: not taken here; Leader is where to go (-1: unknown).
	Redirect bool
	Leader   int
	// Err: the step failed (nothing of it applied).
	Err string
	Res kv.Result
	// Handle and Vals answer a BEGIN (Vals: the snapshot's values of Keys,
	// nil for an absent key); Commit answers a PREPARE (nil: read-only,
	// committed).
	Handle uint64
	Vals   [][]byte
	Commit *kv.Op
	// Vers and Start (a Close BEGIN): the version of each key seen (0: not
	// live) and the snapshot's version.
	Vers  []uint64
	Start uint64
}

func (m hostTxnResp) String() string {
	return fmt.Sprintf("txresp(seq=%d redirect=%t err=%q)", m.Seq, m.Redirect, m.Err)
}

// hostTxnState is a node's transaction work: the steps in flight and the
// open KEFIR.TX transactions, which die with the node's process (a restart
// makes a new hostNode).
type hostTxnState struct {
	reads   []hostRead
	writes  []hostTxnWrite
	begins  []hostTxnBegin
	open    map[uint64]*hostOpenTxn
	counter uint64
}

type hostTxnWrite struct {
	from sim.Addr
	seq  uint64
	w    *SteppedWrite
}

type hostTxnBegin struct {
	from  sim.Addr
	seq   uint64
	keys  [][]byte
	b     *SteppedTxBegin
	close bool
}

// hostOpenTxn is an open KEFIR.TX transaction: its snapshot, the origin
// and the version it saw of each key (0: not live), as server's itxn keeps.
type hostOpenTxn struct {
	snap   *shard.TxSnap
	origin kv.TxOrigin
	seen   map[string]uint64
	began  int64
}

// hostTxnMaxAge is how long (node clock) an open transaction keeps its
// snapshot pinned: its client gave up long before.
const hostTxnMaxAge = 2 * hostClientTimeout * 1_000_000

func (n *hostNode) txnRedirect(to sim.Addr, seq uint64, err error) {
	leader, _ := redirectTo(err)
	n.txnReply(to, hostTxnResp{Seq: seq, Redirect: true, Leader: leader})
}

func (n *hostNode) txnReply(to sim.Addr, m hostTxnResp) {
	n.out.Messages = append(n.out.Messages, sim.Envelope{To: to, Msg: m})
}

// onTxnReq starts a transaction step.
func (n *hostNode) onTxnReq(from sim.Addr, m hostTxnReq) {
	k := hostReqKey{from: from, seq: m.Seq}
	if n.seen[k] {
		return // a duplicate the network made
	}
	n.seen[k] = true
	t := &n.txn
	nowMs := hostClock{n}.Now().UnixMilli()
	switch m.Step {
	case stepRead:
		op := m.Op
		op.Now = nowMs
		if n.cl != nil && n.xgReadLocked(op) {
			n.txnReply(from, hostTxnResp{Seq: m.Seq, Err: xgLockedReply})
			return
		}
		t.reads = append(t.reads, hostRead{from: from, seq: m.Seq, sr: n.r.ReadStepped(op, level.ConsLinearizable, shard.Session{})})
	case stepWrite:
		reqs := []shard.WriteReq{{Op: m.Op, Durability: level.Sync, ID: shard.ReqID{Client: hostClientBase + uint64(from), Seq: m.Seq}}}
		if xgKind(m.Op.Kind) {
			// As the server sends them (txGroupOp): no request id (they
			// are idempotent by transaction id); stamped with the
			// simulator's true time (xgTrueMs: the push's age).
			reqs[0].ID, reqs[0].Op.Now = shard.ReqID{}, xgTrueMs(n.cl.s)
		}
		w := n.r.ProposeStepped(reqs)
		if w == nil {
			n.txnRedirect(from, m.Seq, reqs[0].Err)
			return
		}
		t.writes = append(t.writes, hostTxnWrite{from, m.Seq, w})
	case stepBegin:
		t.begins = append(t.begins, hostTxnBegin{from, m.Seq, m.Keys, n.r.TxBeginStepped(nil), m.Close})
	case stepPrepare:
		n.txnReply(from, n.txnPrepare(m))
	}
}

// txnPrepare builds transaction m.Handle's commit op as the front door's
// txCommit does at key grain (no ranges): a check of each written key's
// version at the start, and under SERIALIZABLE of each key only read, in key
// order; a transaction that wrote nothing commits here.
func (n *hostNode) txnPrepare(m hostTxnReq) hostTxnResp {
	tx := n.txn.open[m.Handle]
	if tx == nil {
		return hostTxnResp{Seq: m.Seq, Err: "ERR no such transaction"}
	}
	delete(n.txn.open, m.Handle)
	defer tx.snap.Close()
	if len(m.Writes) == 0 {
		return hostTxnResp{Seq: m.Seq}
	}
	written := map[string]bool{}
	var checks []kv.TxCheck
	for _, w := range m.Writes {
		k := w.RoutingKey()
		if written[string(k)] {
			continue
		}
		written[string(k)] = true
		v, ok := tx.seen[string(k)]
		if !ok {
			return hostTxnResp{Seq: m.Seq, Err: fmt.Sprintf("harness: a blind write of %q", k)}
		}
		checks = append(checks, kv.TxCheck{Key: k, Version: v})
	}
	if m.Iso == kv.TxSerializable {
		var reads []string
		for k := range tx.seen {
			if !written[k] {
				reads = append(reads, k)
			}
		}
		slices.Sort(reads)
		for _, k := range reads {
			checks = append(checks, kv.TxCheck{Key: []byte(k), Version: tx.seen[k]})
		}
	}
	op, err := kv.NewTxCommit(tx.snap.Version(), m.Iso, tx.origin, checks, m.Writes)
	if err != nil {
		return hostTxnResp{Seq: m.Seq, Err: err.Error()}
	}
	return hostTxnResp{Seq: m.Seq, Commit: &op}
}

// flushTxn answers the transaction steps that finished and drops the open
// transactions whose clients are long gone.
func (n *hostNode) flushTxn() {
	t := &n.txn
	t.reads = keepPending(t.reads, func(rd hostRead) bool {
		if !rd.sr.Poll() {
			return false
		}
		res, err := rd.sr.Result()
		n.txnAnswer(rd.from, rd.seq, res, err)
		return true
	})
	t.writes = keepPending(t.writes, func(w hostTxnWrite) bool {
		done, res, err := writeFinished(w.w)
		if done {
			n.txnAnswer(w.from, w.seq, res, err)
		}
		return done
	})
	t.begins = keepPending(t.begins, func(b hostTxnBegin) bool {
		if !b.b.Poll() {
			return false
		}
		snap, err := b.b.Result()
		if err != nil {
			n.txnAnswer(b.from, b.seq, kv.Result{}, err)
			return true
		}
		n.txnReply(b.from, n.txnBegun(b, snap))
		return true
	})
	for h, tx := range t.open {
		if n.now-tx.began > hostTxnMaxAge {
			tx.snap.Close()
			delete(t.open, h)
		}
	}
}

// txnBegun opens the transaction BEGIN b pinned and reads its keys in the
// snapshot (server's itxn.get: the version each was seen at).
func (n *hostNode) txnBegun(b hostTxnBegin, snap *shard.TxSnap) hostTxnResp {
	origin, err := kv.SlotOrigin(snap.Get, nil)
	if err != nil {
		snap.Close()
		return hostTxnResp{Seq: b.seq, Err: err.Error()}
	}
	tx := &hostOpenTxn{snap: snap, origin: origin, seen: map[string]uint64{}, began: n.now}
	now := hostClock{n}.Now().UnixMilli()
	vals := make([][]byte, len(b.keys))
	for i, k := range b.keys {
		d, m, v, ok, err := snap.Get(k)
		if err != nil {
			snap.Close()
			return hostTxnResp{Seq: b.seq, Err: err.Error()}
		}
		if !ok || kv.Expired(m, now) {
			v, d = 0, nil
		}
		tx.seen[string(k)] = v
		vals[i] = bytes.Clone(d)
	}
	if b.close {
		snap.Close()
		vers := make([]uint64, len(b.keys))
		for i, k := range b.keys {
			vers[i] = tx.seen[string(k)]
		}
		return hostTxnResp{Seq: b.seq, Vals: vals, Vers: vers, Start: snap.Version()}
	}
	if n.txn.open == nil {
		n.txn.open = map[uint64]*hostOpenTxn{}
	}
	n.txn.counter++
	n.txn.open[n.txn.counter] = tx
	return hostTxnResp{Seq: b.seq, Handle: n.txn.counter, Vals: vals}
}

// txnAnswer replies to a read or a write: a redirect for a replica that
// does not lead, else the result or the error.
func (n *hostNode) txnAnswer(to sim.Addr, seq uint64, res kv.Result, err error) {
	if err != nil {
		if leader, ok := redirectTo(err); ok {
			n.txnReply(to, hostTxnResp{Seq: seq, Redirect: true, Leader: leader})
			return
		}
		n.txnReply(to, hostTxnResp{Seq: seq, Err: err.Error()})
		return
	}
	n.txnReply(to, hostTxnResp{Seq: seq, Res: res})
}

// hostTxnRun is a run's shared client state: one generator (the simulator
// steps one node at a time, so the transactions are a function of the
// seed) and one recorder on the simulator's clock.
type hostTxnRun struct {
	mode     hostTxnMode
	seed     uint64
	gen      *check.TxnGen
	rec      *check.TxnRecorder
	nextProc int
}

func newHostTxnRun(mode hostTxnMode, seed uint64, now func() int64) *hostTxnRun {
	return &hostTxnRun{
		mode: mode, seed: seed,
		gen:      check.NewTxnGen(check.TxnWorkload{Seed: int64(seed), Keys: 6, MaxMops: 4, MaxWritesPerKey: 32}),
		rec:      check.NewTxnRecorder(now),
		nextProc: 1000,
	}
}

// hostTxnWorkload drives the transaction clients' pace: each invocation is
// one transaction, which the client draws from its run's generator.
type hostTxnWorkload struct{}

func (hostTxnWorkload) Next(*rand.Rand, int, int) check.Op {
	return check.Op{Kind: check.Get, Key: "txn"}
}

// hostTxnClient runs one transaction at a time through the steps of its
// run's mode, following redirects.
type hostTxnClient struct {
	run    *hostTxnRun
	n      int
	id     sim.Addr
	rng    *rand.Rand
	proc   int
	leader int
	rseq   uint64 // the client's request numbers (its ids in the client table)
	out    sim.Ready

	// The transaction in flight.
	active  bool
	invSeq  uint64 // the simulator's invocation
	txID    int    // the recorder's
	mops    []check.Mop
	keys    [][]byte
	step    hostTxnStep
	req     hostTxnReq
	sent    bool // req is out (false: waiting to send: think or retry)
	ticks   int  // since req was first sent
	wait    int  // ticks until req is (re)sent
	commit  bool // req may land: a timeout is unknown, not an abort
	watches []kv.Watch
	handle  uint64
	beganAt int // the node that holds the KEFIR.TX transaction
}

func (r *hostTxnRun) client() sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		p := int(id) - cfg.Replicas
		return &hostTxnClient{run: r, n: cfg.Replicas, id: id, proc: p,
			rng: rand.New(rand.NewPCG(r.seed, uint64(id)))}
	}
}

func (c *hostTxnClient) Ready() sim.Ready {
	rd := c.out
	c.out = sim.Ready{}
	return rd
}

func (c *hostTxnClient) send(to int) {
	c.sent, c.wait = true, 0
	c.out.Messages = append(c.out.Messages, sim.Envelope{To: sim.Addr(to), Msg: c.req})
}

// next starts a step of the transaction: a new request (new number), sent
// to the leader it believes in, or to the node holding its KEFIR.TX
// transaction; after `think` ticks if think > 0.
func (c *hostTxnClient) next(step hostTxnStep, req hostTxnReq, think int) {
	c.rseq++
	req.Seq, req.Step = c.rseq, step
	c.step, c.req, c.ticks, c.commit = step, req, 0, step == stepWrite
	if think > 0 {
		c.sent, c.wait = false, think
		return
	}
	c.send(c.target())
}

func (c *hostTxnClient) target() int {
	if c.step == stepPrepare {
		return c.beganAt
	}
	return c.leader
}

// finish ends the transaction in flight with outcome out (reads filled in
// mops when out is OK).
func (c *hostTxnClient) finish(out check.Outcome) {
	switch out {
	case check.OK:
		c.run.rec.Complete(c.txID, c.mops)
	case check.Failed:
		c.run.rec.Fail(c.txID)
	default:
		c.run.rec.Unknown(c.txID)
		// The transaction may still be in flight: a fresh process id, as
		// check.RunTxns does.
		c.proc = c.run.nextProc
		c.run.nextProc++
	}
	c.active = false
	c.out.Done = append(c.out.Done, sim.Completion{Seq: c.invSeq, Outcome: out})
}

func (c *hostTxnClient) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Invoke:
		c.start(ev.Seq)
	case sim.Message:
		m, ok := ev.Msg.(hostTxnResp)
		if !ok || !c.active || !c.sent || m.Seq != c.req.Seq {
			return
		}
		c.onResp(m)
	case sim.Tick:
		if !c.active {
			return
		}
		if !c.sent {
			if c.wait--; c.wait <= 0 {
				c.send(c.target())
			}
			return
		}
		if c.ticks++; c.ticks >= hostClientTimeout {
			// Give up; try another replica next.
			c.leader = (c.leader + 1) % c.n
			if c.commit {
				c.finish(check.Unknown)
			} else {
				c.finish(check.Failed)
			}
			return
		}
		if c.wait > 0 {
			if c.wait--; c.wait == 0 {
				c.send(c.target())
			}
		}
	}
}

// start begins a new transaction: WATCH, or BEGIN with its reads.
func (c *hostTxnClient) start(seq uint64) {
	c.active, c.invSeq = true, seq
	c.mops = c.run.gen.Next()
	c.txID = c.run.rec.Invoke(check.Txn{Process: c.proc, Mops: c.mops})
	c.keys = c.keys[:0]
	for _, m := range c.mops {
		if !slices.ContainsFunc(c.keys, func(k []byte) bool { return string(k) == m.Key }) {
			c.keys = append(c.keys, []byte(m.Key))
		}
	}
	if c.run.mode == txnExec {
		c.next(stepRead, hostTxnReq{Op: kv.Op{Kind: kv.KindWatch, Keys: c.keys}}, 0)
		return
	}
	c.next(stepBegin, hostTxnReq{Keys: c.keys}, 0)
}

func (c *hostTxnClient) onResp(m hostTxnResp) {
	if m.Redirect {
		if c.step == stepPrepare {
			c.finish(check.Failed) // the transaction's node no longer has it
			return
		}
		if m.Leader >= 0 && m.Leader != c.leader {
			c.leader = m.Leader
			c.send(c.leader)
			return
		}
		c.leader = (c.leader + 1) % c.n
		c.sent, c.wait = true, 5
		return
	}
	if m.Err != "" {
		if strings.HasPrefix(m.Err, "harness:") {
			panic(m.Err)
		}
		if c.commit {
			// The write's outcome is not known (ErrOutcomeUnknown, the
			// replica failed): it may have been ordered.
			c.finish(check.Unknown)
			return
		}
		c.finish(check.Failed)
		return
	}
	switch c.step {
	case stepRead:
		if c.req.Op.Kind == kv.KindWatch {
			c.watches = c.watches[:0]
			for i, k := range c.keys {
				c.watches = append(c.watches, kv.Watch{Key: k, Seen: bytes.Clone(m.Res.Array[i])})
			}
			c.next(stepRead, hostTxnReq{Op: kv.Op{Kind: kv.KindMGet, Keys: c.keys}}, 0)
			return
		}
		sets := c.apply(m.Res.Array)
		var cmds [][][]byte
		for _, s := range sets {
			cmds = append(cmds, [][]byte{[]byte("SET"), s.Key, s.Value})
		}
		op := kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cmds, c.watches), Keys: c.keys, Delta: int64(len(c.keys))}
		c.next(stepWrite, hostTxnReq{Op: op}, 0)
	case stepBegin:
		c.handle, c.beganAt = m.Handle, c.leader
		sets := c.apply(m.Vals)
		iso := kv.TxSI
		if c.run.mode == txnSerializable {
			iso = kv.TxSerializable
		}
		// The transaction's think time, its snapshot open.
		c.next(stepPrepare, hostTxnReq{Handle: m.Handle, Iso: iso, Writes: sets}, 1+c.rng.IntN(5))
	case stepPrepare:
		if m.Commit == nil {
			c.finish(check.OK) // read-only: committed at the front door
			return
		}
		c.next(stepWrite, hostTxnReq{Op: *m.Commit}, 0)
	case stepWrite:
		c.finish(c.writeOutcome(m.Res))
	}
}

// writeOutcome reads EXEC's or KEFIR.TXAPPLY's reply.
func (c *hostTxnClient) writeOutcome(res kv.Result) check.Outcome {
	b := res.Bulk
	switch {
	case res.Kind != kv.ResReply:
		panic(fmt.Sprintf("harness: a transaction answered %+v", res))
	case bytes.Equal(b, kv.NullArray), bytes.HasPrefix(b, []byte("-TXABORT")):
		return check.Failed
	case c.run.mode == txnExec && bytes.HasPrefix(b, []byte("*")) && !bytes.Contains(b, []byte("\r\n-")):
		return check.OK
	case c.run.mode != txnExec && bytes.HasPrefix(b, []byte(":")):
		return check.OK
	}
	panic(fmt.Sprintf("harness: a transaction answered %q", b))
}

// apply fills the transaction's reads from vals (the keys' lists as read,
// nil: absent) and its own appends before them, and returns the SETs of the
// appended keys' final lists.
func (c *hostTxnClient) apply(vals [][]byte) []kv.Op {
	lists := map[string][]int{}
	for i, k := range c.keys {
		lists[string(k)] = decodeTxnList(vals[i])
	}
	var order []string
	for i, m := range c.mops {
		switch m.Kind {
		case check.MopRead:
			c.mops[i].List = slices.Clone(lists[m.Key])
			if c.mops[i].List == nil {
				c.mops[i].List = []int{}
			}
		case check.MopAppend:
			if !slices.Contains(order, m.Key) {
				order = append(order, m.Key)
			}
			lists[m.Key] = append(lists[m.Key], m.Value)
		}
	}
	sets := make([]kv.Op, 0, len(order))
	for _, k := range order {
		sets = append(sets, kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: encodeTxnList(lists[k])})
	}
	return sets
}

// A list is its elements in decimal, space-separated.
func encodeTxnList(l []int) []byte {
	var b []byte
	for i, x := range l {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return b
}

func decodeTxnList(b []byte) []int {
	if len(b) == 0 {
		return nil
	}
	var l []int
	for _, f := range strings.Fields(string(b)) {
		x, err := strconv.Atoi(f)
		if err != nil {
			panic(fmt.Sprintf("harness: list %q", b))
		}
		l = append(l, x)
	}
	return l
}

// judge checks the run's transactions against its mode's model.
func (r *hostTxnRun) judge() error {
	h := r.rec.History()
	ok, _, _ := h.Outcomes()
	if ok == 0 {
		return errors.New("no transaction committed")
	}
	return check.Errs([]check.Verdict{check.CheckTxns(h, check.TxnOptions{Model: r.mode.model()})})
}

// stats summarizes the run's outcomes.
func (r *hostTxnRun) stats() string {
	ok, failed, unknown := r.rec.History().Outcomes()
	return fmt.Sprintf("%d committed, %d aborted, %d unknown", ok, failed, unknown)
}

// hostTxnCases are the fault mixes of the transaction runs.
var hostTxnCases = []struct {
	name string
	o    hostSimOptions
}{
	// The swarm's faults: crashes with torn tails, partitions, one-way
	// links, drift, loss, duplication, failed fsyncs.
	{"swarm", hostSimOptions{}},
	// Every replica loses its unsynced bytes at once, repeatedly, with slow
	// fsyncs (every open KEFIR.TX transaction dies with them).
	{"powercuts", hostSimOptions{slowSync: true, powerCuts: true}},
	// Two of three replicas down at once: the group stalls and recovers.
	{"majority-down", hostSimOptions{majorityDown: true}},
}

// TestHostSimTxns runs transactions — WATCH/EXEC, KEFIR.TX under SI and
// SERIALIZABLE — on the production host under the simulator's faults and
// checks the histories with the Elle-style checker (check.CheckTxns): strict
// serializability for EXEC and SERIALIZABLE, snapshot isolation for SI. The
// leader's early aborts and its holds behind commits in flight (txwait.go)
// run as in a process. Two seeds per case by default; KEFIR_SOAK=1 runs 20.
func TestHostSimTxns(t *testing.T) {
	seeds := 2
	if soakOn() {
		seeds = 20
	}
	for _, mode := range []hostTxnMode{txnExec, txnSI, txnSerializable} {
		for _, tc := range hostTxnCases {
			t.Run(mode.String()+"-"+tc.name, func(t *testing.T) {
				o := tc.o
				o.txn = mode
				var early uint64
				var holds [2]uint64
				o.earlyAborts = &early
				o.holds = &holds
				sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) error {
					var stats string
					err := hostSim(seed, trace, o, hostTxnWorkload{}, &stats)
					if trace == nil {
						t.Logf("seed %d: %s", seed, stats)
					}
					return err
				})
				// The checker vouches for the leader's early aborts (a
				// retry answered from the client table, not aborted
				// after its first attempt committed) only if the runs
				// made some.
				if early == 0 {
					t.Errorf("no transaction aborted early in %d seeds: the checker judged no early abort", seeds)
				}
				// Holds are the host's policy and the simulator runs them
				// (SteppedWrite.Done polls what Apply waits for): the
				// runs must have made some for the checker to vouch for
				// them.
				t.Logf("%d seeds: %d transactions held behind a commit in flight, %d of them then aborted", seeds, holds[0], holds[1])
				if holds[0] == 0 {
					t.Errorf("no transaction held behind a commit in flight in %d seeds", seeds)
				}
			})
		}
	}
}

// TestHostSimTxnsCatchBrokenValidation shows the transaction runs catch a
// broken protocol, each at a seed that is clean without the mutation:
//   - txUnvalidated, a state machine that does not validate transactions
//     (EXEC's watches and a commit's checks are dropped at apply): lost
//     appends, in each protocol;
//   - followerLinearizable, a replica that serves linearizable reads from
//     its own state (read.go routeRead): a BEGIN at a follower or a deposed
//     leader pins a stale start version, and a read-only SERIALIZABLE
//     transaction commits what it read there, after a later commit returned
//     (a real-time cycle). EXEC is not hurt by it (a stale WATCH conflicts
//     at the state machine), nor are SI's reads (snapshot isolation has no
//     real-time order to break).
func TestHostSimTxnsCatchBrokenValidation(t *testing.T) {
	mutation.Require(t)
	for _, tc := range []struct {
		name string
		mode hostTxnMode
		seed uint64
		mut  mutations
	}{
		{"txUnvalidated", txnExec, 1, mutations{txUnvalidated: true}},
		{"txUnvalidated", txnSI, 1, mutations{txUnvalidated: true}},
		{"txUnvalidated", txnSerializable, 1, mutations{txUnvalidated: true}},
		{"followerLinearizable", txnSerializable, 18, mutations{followerLinearizable: true}},
	} {
		t.Run(tc.name+"/"+tc.mode.String(), func(t *testing.T) {
			o := hostSimOptions{txn: tc.mode}
			if err := hostSim(tc.seed, nil, o, hostTxnWorkload{}, nil); err != nil {
				t.Fatalf("seed %d fails without the mutation: %v", tc.seed, err)
			}
			o.mut = tc.mut
			err := hostSim(tc.seed, nil, o, hostTxnWorkload{}, nil)
			if err == nil {
				t.Fatalf("seed %d: the checker missed %s", tc.seed, tc.name)
			}
			if !strings.Contains(err.Error(), "txn-"+tc.mode.model().String()+": VIOLATED") {
				t.Fatalf("seed %d: caught, but not by the transaction checker: %v", tc.seed, err)
			}
			msg := err.Error()
			t.Logf("caught: %s", msg[:min(len(msg), 400)])
		})
	}
}
