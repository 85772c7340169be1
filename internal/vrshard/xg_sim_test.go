package vrshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/storage"
)

// Cross-group transactions under the deterministic simulator (issue 29;
// docs/design/transactions.md, "Cross-group transactions", "The
// simulation"): two groups of three production replicas in stepped mode on
// three nodes (the move simulation's simCluster and hostNode, each group
// owning half the slots), bank accounts in both groups, and clients that
// are cross-group coordinators: each transaction reads its keys in a
// snapshot per slot (a BEGIN at the slot's group leader, closed at once:
// the versions seen), computes its writes, and commits with the production
// coordinator's decision sequence, kcluster.TwoPhase, run as a coroutine in
// lockstep with the simulator (xgCo): every batch of ops it runs becomes
// simulated messages to the groups' leaders, so a run is a pure function
// of its seed. The coordinator dies between any two of its actions (a
// message sent, a batch answered): before, between and after its prepares,
// before and after its decision, between its resolves. A pusher, the
// groups' leaders' sweep, lists the parts prepared longer than xgPushAge
// at each group's leader (kcluster.TxStale, what Multi.RunTxPush lists)
// and pushes each with kcluster.PushTx. Faults: the nemesis (crashes,
// partitions, lossy links: leader failovers), whole-node crashes, power
// cuts.
//
// Checks: every committed read-only transaction across all accounts sees
// the initial total (the sum invariant on a snapshot read); the history of
// transfers, totals and plain reads is strict serializable (check.CheckTxns,
// Elle's rw-register: every write carries a unique tag); after the faults
// heal, every lock is released (no prepared part, no lock record, at every
// replica: the push) and the accounts hold the initial total; the groups'
// replicas agree.
//
// Not here: the front door (the snapshot of a further slot is taken at its
// group's leader, not from a follower as server.txPartSnap does), and the
// timing of cluster.AwaitTxLocks (a plain read of a write-locked key is
// refused at the leader by the same lookup and the client reads again; the
// readers' own pushes are left to the sweep).

// xgAccounts is the number of accounts in each group; xgInitial their
// initial balance (an absent account holds it).
const (
	xgAccounts = 3
	xgInitial  = 100
	xgPushAge  = 300 * time.Millisecond
	// xgDecisionKeep is the groups' kcluster.TxDecisionKeep: shorter than
	// the push's age, so that a decision collected too early (kv's
	// CollectIgnoresPending) is gone when a participant's push asks.
	xgDecisionKeep = 200 * time.Millisecond
)

// xgLockedReply answers a plain read of a write-locked key (the client
// reads again: cluster.Multi's readers wait).
const xgLockedReply = "TXLOCKED"

// xgTrueMs is the clock the two-phase ops are stamped with and the sweep
// reads: the simulator's true time. The nodes' clocks in the simulator
// drift apart by more than a cluster's clock-skew bound, and the push's
// age compares the prepare's clock with the sweeping leader's; the push is
// safe whatever the clocks say (the primary's first decision wins), only
// its timing rests on them.
func xgTrueMs(s *sim.Sim) int64 { return (simEpoch + int64(s.Now())) / int64(time.Millisecond) }

func xgKind(k kv.Kind) bool { return kv.IsXgtxKind(k) }

// xgReadLocked reports whether a plain read at this replica, leading its
// group, must wait for a prepared transaction that writes its key (what
// cluster.Multi.txReadWait checks).
func (n *hostNode) xgReadLocked(op kv.Op) bool {
	if n.r.failed() != nil || !n.r.isLeader.Load() || len(op.Key) == 0 || n.cl.readsIgnoreLocks {
		return false
	}
	locked, err := kv.TxWriteLocked(n.r.db.Lookup, op.Key)
	return err == nil && locked
}

// xgCluster is the two groups on three nodes, group 1 owning the lower
// half of the slots.
func xgCluster() *simCluster {
	half := uint16(kv.NumSlots / 2)
	return newSimCluster([]kcluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: 0, End: half - 1}}},
		{ID: 2, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: half, End: kv.NumSlots - 1}}},
	}, movesGroupSize)
}

// xgAccountKeys are xgAccounts keys of each group, each of its own slot.
func xgAccountKeys(cl *simCluster) []string {
	var out []string
	per := map[kcluster.GroupID]int{}
	slots := map[uint16]bool{}
	for i := 0; len(out) < 2*xgAccounts; i++ {
		k := "acct" + strconv.Itoa(i)
		sl := kv.KeySlot([]byte(k))
		g := cl.smap.Owner(sl)
		if per[g] < xgAccounts && !slots[sl] {
			per[g]++
			slots[sl] = true
			out = append(out, k)
		}
	}
	return out
}

// xgValue is an account's value: a unique tag (the Elle checker's value)
// and the balance.
func xgValue(tag, bal int) []byte { return []byte(fmt.Sprintf("%d:%d", tag, bal)) }

func xgParse(v []byte) (tag, bal int, err error) {
	if v == nil {
		return 0, xgInitial, nil
	}
	t, b, ok := strings.Cut(string(v), ":")
	if !ok {
		return 0, 0, fmt.Errorf("account value %q", v)
	}
	tag, err1 := strconv.Atoi(t)
	bal, err2 := strconv.Atoi(b)
	return tag, bal, errors.Join(err1, err2)
}

// xgOut is one request of a coroutine's batch, to group g's leader.
type xgOut struct {
	g   kcluster.GroupID
	req hostTxnReq
}

// xgCall is what the coroutine asks of its node: a batch to run, or done.
type xgCall struct {
	batch []xgOut
	done  bool
}

type xgWake struct {
	resps []hostTxnResp
	errs  []error
}

// xgCo runs one function (a transaction, a push round) as a coroutine:
// its goroutine runs only between a resume and its next call, while the
// simulator's goroutine waits.
type xgCo struct {
	yield  chan xgCall
	wake   chan xgWake
	ctx    context.Context
	cancel context.CancelFunc
}

func startXgCo(f func(ctx context.Context, co *xgCo)) *xgCo {
	ctx, cancel := context.WithCancel(context.Background())
	co := &xgCo{yield: make(chan xgCall), wake: make(chan xgWake), ctx: ctx, cancel: cancel}
	go func() {
		<-co.wake
		f(ctx, co)
		co.yield <- xgCall{done: true}
	}()
	return co
}

func (co *xgCo) resume(w xgWake) xgCall {
	co.wake <- w
	return <-co.yield
}

// call runs a batch at the node: each request's answer, or the error that
// left it unanswered (the coordinator died: ctx's).
func (co *xgCo) call(ctx context.Context, batch []xgOut) ([]hostTxnResp, []error) {
	if err := ctx.Err(); err != nil {
		errs := make([]error, len(batch))
		for i := range errs {
			errs[i] = err
		}
		return make([]hostTxnResp, len(batch)), errs
	}
	co.yield <- xgCall{batch: batch}
	w := <-co.wake
	return w.resps, w.errs
}

// runner is the coroutine's kcluster.TxOpRunner: each op to the leader of
// its routing key's group.
func (co *xgCo) runner(cl *simCluster) kcluster.TxOpRunner {
	return func(ctx context.Context, ops []kv.Op) ([]string, []error) {
		batch := make([]xgOut, len(ops))
		for i, op := range ops {
			keys, _ := op.RoutingKeys()
			batch[i] = xgOut{g: cl.smap.Owner(kv.KeySlot(keys[0])), req: hostTxnReq{Step: stepWrite, Op: op}}
		}
		resps, errs := co.call(ctx, batch)
		replies := make([]string, len(ops))
		for i := range ops {
			switch {
			case errs[i] != nil:
			case resps[i].Err != "":
				errs[i] = errors.New(resps[i].Err)
			default:
				replies[i] = strings.TrimSuffix(string(resps[i].Res.Bulk), "\r\n")
			}
		}
		return replies, errs
	}
}

// xgPending is a request of the batch in flight.
type xgPending struct {
	i     int
	out   xgOut
	seq   uint64 // its current attempt's number
	ticks int    // since the attempt was sent
	wait  int    // ticks until it is sent again (0: none due)
	total int
	done  bool
}

// Request timing, in ticks (1 ms): an attempt unanswered for xgResend is
// sent again (a new number: the ops are idempotent), and a request
// unanswered for xgGiveUp fails (its outcome unknown).
const (
	xgResend = 150
	xgGiveUp = 1500
)

// xgNode is a client node of the simulation: a coordinator (its
// transactions, one at a time) or the pusher.
type xgNode struct {
	run    *xgRun
	id     int
	pusher bool
	rng    *rand.Rand
	now    int64
	out    sim.Ready
	leader []int // by group index: the replica believed to lead
	seq    uint64
	co     *xgCo
	width  int // the batch's requests
	batch  []*xgPending
	resps  []hostTxnResp
	errs   []error
	left   int
	// killIn: actions (a request sent, a batch answered) until the
	// coordinator dies (-1: it does not); sent: a write left it.
	killIn int
	sent   bool
	idle   int // ticks until the next transaction or push round
	count  int
	txn    *xgTxn
}

// xgTxn is the transaction a coordinator runs.
type xgTxn struct {
	id     int // the recorder's
	mops   []check.Mop
	result string // "ok", "abort", "unknown"
	total  int    // a committed read of every account: the sum
	all    bool
}

func (n *xgNode) Ready() sim.Ready {
	rd := n.out
	n.out = sim.Ready{}
	return rd
}

func (n *xgNode) Step(ev sim.Event) {
	n.now = ev.Now
	switch ev.Kind {
	case sim.Message:
		m, ok := ev.Msg.(hostTxnResp)
		if !ok || n.co == nil {
			return
		}
		for _, p := range n.batch {
			if p.done || p.seq != m.Seq || p.wait > 0 {
				continue
			}
			switch {
			case m.Redirect:
				gi := int(p.out.g) - 1
				if m.Leader >= 0 && m.Leader != n.leader[gi] && groupOf(m.Leader) == p.out.g {
					n.leader[gi] = m.Leader
					n.send(p)
				} else {
					n.leader[gi] = gi*movesGroupSize + (n.leader[gi]+1)%movesGroupSize
					p.wait = 5
				}
			case m.Err == xgLockedReply:
				p.wait = 5 // the reader waits for the lock
			default:
				n.finish(p, m, nil)
			}
			return
		}
	case sim.Tick:
		n.tick()
	}
}

// send sends request p's next attempt, or kills the coordinator if its
// time came.
func (n *xgNode) send(p *xgPending) {
	if p.seq == 0 || p.out.req.Step != stepWrite || xgKind(p.out.req.Op.Kind) {
		// A new number for every attempt but a plain write's: its number
		// is its request id (the client table answers it again, never
		// applies it twice); the two-phase ops are idempotent.
		n.seq++
		p.seq = n.seq
	}
	p.ticks, p.wait = 0, 0
	p.out.req.Seq = p.seq
	gi := int(p.out.g) - 1
	if p.out.req.Step == stepWrite {
		n.sent = true
	}
	n.out.Messages = append(n.out.Messages, sim.Envelope{To: sim.Addr(n.leader[gi]), Msg: p.out.req})
}

func (n *xgNode) finish(p *xgPending, m hostTxnResp, err error) {
	p.done = true
	n.resps[p.i], n.errs[p.i] = m, err
	if n.left--; n.left == 0 {
		n.batch = nil
		if n.action() {
			return
		}
		n.drive(xgWake{resps: n.resps, errs: n.errs})
	}
}

// action counts one of the coordinator's actions; true if it died there.
func (n *xgNode) action() bool {
	if n.killIn < 0 {
		return false
	}
	if n.killIn--; n.killIn >= 0 {
		return false
	}
	n.killIn = -1
	n.run.kills++
	n.die()
	return true
}

// die ends the coordinator: what it sent may still arrive and run; its
// coroutine sees its context end and returns.
func (n *xgNode) die() {
	n.co.cancel()
	n.batch = nil
	n.drive(failed(n.width, n.co.ctx.Err()))
}

// failed is the answer of a batch of width requests that all failed.
func failed(width int, err error) xgWake {
	errs := make([]error, width)
	for i := range errs {
		errs[i] = err
	}
	return xgWake{resps: make([]hostTxnResp, width), errs: errs}
}

// drive resumes the coroutine with w and sends its next batch, until it
// waits for one or returns.
func (n *xgNode) drive(w xgWake) {
	for {
		c := n.co.resume(w)
		if c.done {
			n.co = nil
			n.done()
			return
		}
		n.width = len(c.batch)
		if n.co.ctx.Err() != nil {
			w = failed(n.width, n.co.ctx.Err())
			continue
		}
		n.resps, n.errs = make([]hostTxnResp, len(c.batch)), make([]error, len(c.batch))
		n.left = len(c.batch)
		n.batch = nil
		dead := false
		for i, o := range c.batch {
			if dead = n.action(); dead {
				break
			}
			p := &xgPending{i: i, out: o}
			n.batch = append(n.batch, p)
			if d := n.run.o.resolveDelay; d > 0 && o.req.Op.Kind == kv.KindTxResolve {
				p.wait = d // sent by tick
				continue
			}
			n.send(p)
		}
		if dead {
			return
		}
		if n.left == 0 {
			w = xgWake{}
			continue
		}
		return
	}
}

func (n *xgNode) tick() {
	if n.co != nil {
		for _, p := range n.batch {
			if p.done {
				continue
			}
			p.total++
			if p.total >= xgGiveUp {
				n.finish(p, hostTxnResp{}, fmt.Errorf("no reply in %d ms", xgGiveUp))
				return
			}
			if p.wait > 0 {
				if p.wait--; p.wait == 0 {
					n.send(p)
				}
				continue
			}
			if p.ticks++; p.ticks >= xgResend {
				n.send(p)
			}
		}
		return
	}
	if n.idle > 0 {
		n.idle--
		return
	}
	r := n.run
	if n.pusher {
		n.idle = 50
		n.pushRound()
		return
	}
	if r.stopped || n.count >= r.ops {
		return
	}
	n.count++
	n.idle = 2 + n.rng.IntN(20)
	n.startTxn()
}

// pushRound is the groups' leaders' sweep: the parts prepared longer than
// xgPushAge at each group's leader, each pushed (kcluster.PushTx).
func (n *xgNode) pushRound() {
	r := n.run
	type stale struct {
		key []byte
		p   kv.TxPrepared
	}
	var todo []stale
	var unsettled []kv.TxDecision
	var collects []kv.Op
	for a := range r.s.Config().Replicas {
		node := r.s.Replica(a)
		if node == nil {
			continue
		}
		h := node.(*hostNode)
		if h.r.failed() != nil || !h.r.isLeader.Load() {
			continue
		}
		now := time.UnixMilli(xgTrueMs(r.s))
		ps, err := kcluster.TxStale(h.r.db, now, xgPushAge)
		if err != nil {
			continue
		}
		for _, p := range ps {
			todo = append(todo, stale{p.Locks[0].Key, p})
		}
		// The decisions this group keeps as a primary (what
		// Multi.collectDecisions does at each leader).
		c, u, err := kcluster.TxDecisionsDue(h.r.db, now, xgDecisionKeep, xgPushAge, nil)
		if err != nil {
			continue
		}
		unsettled = append(unsettled, u...)
		if c != nil {
			collects = append(collects, *c)
		}
	}
	if r.o.noCollect {
		unsettled, collects = nil, nil
	}
	if len(todo) == 0 && len(unsettled) == 0 && len(collects) == 0 {
		return
	}
	n.killIn = -1
	n.co = startXgCo(func(ctx context.Context, co *xgCo) {
		for _, t := range todo {
			r.pushes++
			err := kcluster.PushTx(ctx, co.runner(r.cl), t.key, t.p) // failed: the next round
			if err != nil {
				r.pushFails++
			}
		}
		for _, d := range unsettled {
			r.settles++
			_ = kcluster.SettleTx(ctx, co.runner(r.cl), d) // failed: the next round
		}
		if len(collects) > 0 {
			replies, _ := co.runner(r.cl)(ctx, collects)
			for _, rep := range replies {
				if n, err := strconv.Atoi(strings.TrimPrefix(rep, "+COLLECTED ")); err == nil {
					r.collected += n
				}
			}
		}
	})
	n.drive(xgWake{})
}

// startTxn draws a transaction and starts its coroutine: a transfer
// between two accounts (60 %), a read-only transaction of every account
// (25 %), or a plain read (15 %).
func (n *xgNode) startTxn() {
	r := n.run
	t := &xgTxn{}
	n.txn, n.sent = t, false
	n.killIn = -1
	switch {
	case r.o.killAt >= 0:
		n.killIn = r.o.killAt
	case r.o.coordDeaths && r.s.Now() < r.faultsUntil && n.rng.IntN(4) == 0:
		n.killIn = n.rng.IntN(9)
	}
	x := n.rng.IntN(20)
	if r.o.skewMix && x < 14 && x%2 == 0 {
		// Half the transfers and totals become write-skew pairs' halves
		// (see xgOptions.skewMix).
		x = -1
	}
	if r.o.plainMix && x >= 6 && x < 14 {
		// Fewer transfers and totals, more plain reads and writes (see
		// xgOptions.plainMix).
		x = 14 + x%6
	}
	var body func(ctx context.Context, co *xgCo)
	switch {
	case x < 0:
		w := n.rng.IntN(2)
		kw, ko := r.skews[w], r.skews[1-w]
		t.mops = []check.Mop{{Kind: check.MopRead, Key: kw}, {Kind: check.MopRead, Key: ko}, {Kind: check.MopWrite, Key: kw, Value: r.nextTag()}}
		body = func(ctx context.Context, co *xgCo) { r.skew(ctx, co, t, kw, ko) }
	case x < 10:
		a := n.rng.IntN(len(r.keys))
		b := (a + 1 + n.rng.IntN(len(r.keys)-1)) % len(r.keys)
		amount := 1 + n.rng.IntN(20)
		ka, kb := r.keys[a], r.keys[b]
		t.mops = []check.Mop{{Kind: check.MopRead, Key: ka}, {Kind: check.MopRead, Key: kb}, {Kind: check.MopRead, Key: r.regs[a]},
			{Kind: check.MopWrite, Key: ka, Value: r.nextTag()}, {Kind: check.MopWrite, Key: kb, Value: r.nextTag()}}
		body = func(ctx context.Context, co *xgCo) { r.transfer(ctx, co, t, ka, kb, r.regs[a], amount) }
	case x < 14:
		for _, k := range append(slices.Clone(r.keys), r.regs...) {
			t.mops = append(t.mops, check.Mop{Kind: check.MopRead, Key: k})
		}
		body = func(ctx context.Context, co *xgCo) { r.total(ctx, co, t) }
	case x < 17:
		k := r.regs[n.rng.IntN(len(r.regs))]
		t.mops = []check.Mop{{Kind: check.MopWrite, Key: k, Value: r.nextTag()}}
		body = func(ctx context.Context, co *xgCo) { r.plainWrite(ctx, co, t, k) }
	default:
		all := append(slices.Clone(r.keys), r.regs...)
		k := all[n.rng.IntN(len(all))]
		t.mops = []check.Mop{{Kind: check.MopRead, Key: k}}
		body = func(ctx context.Context, co *xgCo) { r.plainRead(ctx, co, t, k) }
	}
	t.id = r.rec.Invoke(check.Txn{Process: n.id, Mops: slices.Clone(t.mops)})
	n.co = startXgCo(body)
	n.drive(xgWake{})
}

// done records the coordinator's transaction (or ends the push round).
func (n *xgNode) done() {
	t := n.txn
	n.txn = nil
	if n.pusher || t == nil {
		return
	}
	r := n.run
	switch {
	case t.result == "ok":
		r.rec.Complete(t.id, t.mops)
		r.ok++
		if t.all && t.total != xgInitial*len(r.keys) {
			r.errs = append(r.errs, fmt.Errorf("a committed read of every account at %v totals %d, not %d: %v", r.s.Now(), t.total, xgInitial*len(r.keys), t.mops))
		}
	case t.result == "abort" || !n.sent:
		r.rec.Fail(t.id)
		r.aborts++
	default:
		r.rec.Unknown(t.id)
		r.unknown++
	}
}

// xgOptions tune a run.
type xgOptions struct {
	// faults: the nemesis (crashes of replicas with torn tails, partitions,
	// lossy links: leader failovers) and whole-node crashes until
	// faultsUntil; powerCuts: every replica down at once now and then.
	faults, powerCuts bool
	// coordDeaths: a quarter of the coordinators die at a random action
	// while the faults last; killAt >= 0: every coordinator dies at that
	// action (0: before its first request).
	coordDeaths bool
	killAt      int
	// mut: the replicas' mutations; kvMut, decideEarly, pushLocal: kv's
	// and the coordinator's (process-wide, set for the run).
	mut         mutations
	kvMut       kv.XgtxMutations
	decideEarly bool
	pushLocal   bool
	// readsIgnoreLocks (a check of the check): the plain reads do not wait
	// for a prepared transaction's write lock — what cluster.MultiMut's
	// ReadsIgnoreTxLocks does to the server's reads, done to the
	// simulation's (whose read wait is its own).
	readsIgnoreLocks bool
	// resolveDelay: ticks a coordinator waits before it sends its
	// resolves (a slow link to the other participants): the window in
	// which only the primary's part of a committed transaction is visible
	// is wider.
	resolveDelay int
	// plainMix: the transfers are 30 % and the plain reads and writes
	// half of the transactions, so that more of them fall between a
	// transfer's decision and its other part's resolve.
	plainMix bool
	// noCollect (a check of the check): the sweep collects no decision.
	noCollect bool
	// skewMix: half the transfers and totals are transactions that read
	// two registers, one in each group, and write one of them (chosen at
	// random): two of them that write different ones are write skew unless
	// one aborts — a writer's prepare must conflict with the other's read
	// lock. Their registers are written by nothing else.
	skewMix bool
}

// xgRun is one seed's shared client state and account.
type xgRun struct {
	s           *sim.Sim
	cl          *simCluster
	o           xgOptions
	keys        []string // the accounts
	regs        []string // a register in each account's slot ({acctN}r)
	skews       []string // the skew transactions' registers, one of each group ({acctN}s)
	rec         *check.TxnRecorder
	tag         int
	ops         int
	stopped     bool
	faultsUntil time.Duration
	errs        []error

	ok, aborts, unknown, kills, pushes, pushFails, nodeDowns int
	refused                                                  int // plain writes refused by the lock rule
	settles, collected                                       int // commits the sweep settled, decisions it deleted
}

func (r *xgRun) nextTag() int { r.tag++; return r.tag }

// snapshot reads keys in a snapshot per slot (a BEGIN at the slot's
// group's leader): by key, its value, version and the slot's start.
type xgSeen struct {
	val   []byte
	ver   uint64
	start uint64
}

func (r *xgRun) snapshot(ctx context.Context, co *xgCo, keys []string) (map[string]xgSeen, bool) {
	var batch []xgOut
	var slots []uint16
	bySlot := map[uint16][]string{}
	for _, k := range keys {
		sl := kv.KeySlot([]byte(k))
		if _, ok := bySlot[sl]; !ok {
			slots = append(slots, sl)
		}
		bySlot[sl] = append(bySlot[sl], k)
	}
	for _, sl := range slots {
		var ks [][]byte
		for _, k := range bySlot[sl] {
			ks = append(ks, []byte(k))
		}
		batch = append(batch, xgOut{g: r.cl.smap.Owner(sl), req: hostTxnReq{Step: stepBegin, Keys: ks, Close: true}})
	}
	resps, errs := co.call(ctx, batch)
	seen := map[string]xgSeen{}
	for i, sl := range slots {
		if errs[i] != nil || resps[i].Err != "" || len(resps[i].Vals) != len(bySlot[sl]) {
			return nil, false
		}
		for j, k := range bySlot[sl] {
			seen[k] = xgSeen{val: resps[i].Vals[j], ver: resps[i].Vers[j], start: resps[i].Start}
		}
	}
	return seen, true
}

// commit runs the production coordinator's sequence (kcluster.TwoPhase)
// over the parts of keys (one per slot: every key is one slot here) with
// writes, the first written key's part the primary.
func (r *xgRun) commit(ctx context.Context, co *xgCo, t *xgTxn, keys []string, seen map[string]xgSeen, writes map[string][]byte) {
	txid := kv.NewTxID(xgTrueMs(r.s), fmt.Appendf(nil, "%08d", r.nextTag()))
	primary := []byte(keys[0])
	var parts [][]byte
	var prepares []kv.Op
	var slots []uint16
	bySlot := map[uint16][]string{}
	for _, k := range keys {
		sl := kv.KeySlot([]byte(k))
		if _, ok := bySlot[sl]; !ok {
			slots = append(slots, sl)
		}
		bySlot[sl] = append(bySlot[sl], k)
	}
	for _, sl := range slots {
		var ws []kv.Op
		var checks []kv.TxCheck
		for _, k := range bySlot[sl] {
			if v, ok := writes[k]; ok {
				ws = append(ws, kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: v})
			}
			checks = append(checks, kv.TxCheck{Key: []byte(k), Version: seen[k].ver})
		}
		first := bySlot[sl][0]
		op, err := kv.NewTxPrepare(txid, primary, seen[first].start, kv.TxOrigin{}, checks, ws)
		if err != nil {
			r.errs = append(r.errs, err)
			t.result = "abort"
			return
		}
		parts = append(parts, []byte(first))
		prepares = append(prepares, op)
	}
	committed, _, forget, err := kcluster.TwoPhase(ctx, co.runner(r.cl), txid, primary, parts, prepares)
	defer func() {
		if forget != nil {
			co.runner(r.cl)(ctx, forget) // lost: the primary's sweep settles it
		}
	}()
	switch {
	case err != nil || ctx.Err() != nil:
		t.result = "unknown"
	case committed:
		t.result = "ok"
	default:
		t.result = "abort"
	}
}

func (r *xgRun) transfer(ctx context.Context, co *xgCo, t *xgTxn, a, b, reg string, amount int) {
	keys := []string{a, b, reg}
	seen, ok := r.snapshot(ctx, co, keys)
	if !ok {
		t.result = "abort"
		return
	}
	writes := map[string][]byte{}
	for i, k := range keys {
		tag, bal, err := xgParse(seen[k].val)
		if err != nil {
			r.errs = append(r.errs, err)
			t.result = "abort"
			return
		}
		t.mops[i].Value = tag
		switch i {
		case 0:
			writes[k] = xgValue(t.mops[3].Value, bal-amount)
		case 1:
			writes[k] = xgValue(t.mops[4].Value, bal+amount)
		}
	}
	r.commit(ctx, co, t, keys, seen, writes)
}

func (r *xgRun) total(ctx context.Context, co *xgCo, t *xgTxn) {
	keys := append(slices.Clone(r.keys), r.regs...)
	seen, ok := r.snapshot(ctx, co, keys)
	if !ok {
		t.result = "abort"
		return
	}
	t.all = true
	for i, k := range keys {
		tag, bal, err := xgParse(seen[k].val)
		if err != nil {
			r.errs = append(r.errs, err)
		}
		if i < len(r.keys) {
			t.total += bal
		}
		t.mops[i].Value = tag
	}
	r.commit(ctx, co, t, keys, seen, nil)
}

// skew reads the registers kw and ko and writes kw: half of a write-skew
// pair (xgOptions.skewMix).
func (r *xgRun) skew(ctx context.Context, co *xgCo, t *xgTxn, kw, ko string) {
	keys := []string{kw, ko}
	seen, ok := r.snapshot(ctx, co, keys)
	if !ok {
		t.result = "abort"
		return
	}
	for i, k := range keys {
		tag, _, err := xgParse(seen[k].val)
		if err != nil {
			r.errs = append(r.errs, err)
			t.result = "abort"
			return
		}
		t.mops[i].Value = tag
	}
	r.commit(ctx, co, t, keys, seen, map[string][]byte{kw: xgValue(t.mops[2].Value, 0)})
}

// plainWrite is a SET of a register at its group's leader, outside any
// transaction, with a request id: refused (no effect) while a prepared
// transaction locks the key (kv's lock rule at apply).
func (r *xgRun) plainWrite(ctx context.Context, co *xgCo, t *xgTxn, k string) {
	g := r.cl.smap.Owner(kv.KeySlot([]byte(k)))
	op := kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: xgValue(t.mops[0].Value, 0)}
	resps, errs := co.call(ctx, []xgOut{{g: g, req: hostTxnReq{Step: stepWrite, Op: op}}})
	switch {
	case errs[0] != nil:
		t.result = "unknown"
	case strings.Contains(resps[0].Err, kv.ErrTxLocked.Error()):
		t.result = "abort"
		r.refused++
	case resps[0].Err != "":
		t.result = "unknown"
	default:
		// The group's op number orders the writes of the key (it never
		// leaves its group here): the checker infers the rw edges of the
		// transactions that read it from them.
		t.mops[0].Version = resps[0].Res.Version
		t.result = "ok"
	}
}

// plainRead is a GET at the key's group's leader (linearizable), outside
// any transaction: a transaction of one read in the history.
func (r *xgRun) plainRead(ctx context.Context, co *xgCo, t *xgTxn, k string) {
	g := r.cl.smap.Owner(kv.KeySlot([]byte(k)))
	resps, errs := co.call(ctx, []xgOut{{g: g, req: hostTxnReq{Step: stepRead, Op: kv.Op{Kind: kv.KindGet, Key: []byte(k)}}}})
	if errs[0] != nil || resps[0].Err != "" {
		t.result = "abort"
		return
	}
	var v []byte
	if resps[0].Res.Kind == kv.ResBulk {
		v = resps[0].Res.Bulk
	}
	tag, _, err := xgParse(v)
	if err != nil {
		r.errs = append(r.errs, err)
	}
	t.mops[0].Value = tag
	t.result = "ok"
}

// xgSim runs one seed: 4 coordinators of 40 transactions each until 1.2 s
// (the faults until 0.6 s), then every replica up and the network healed
// until every lock is released (the pusher) and the replicas agree; then
// the checks (see the top of this file).
func xgSim(seed uint64, trace io.Writer, o xgOptions, summary *string) (err error) {
	defer simPanic(&err)
	if mutation.On {
		kv.XgtxMut = o.kvMut
		defer func() { kv.XgtxMut = kv.XgtxMutations{} }()
		kcluster.MultiMut.DecideEarly.Store(o.decideEarly)
		kcluster.MultiMut.PushDecidesLocally.Store(o.pushLocal)
		defer kcluster.MultiMut.DecideEarly.Store(false)
		defer kcluster.MultiMut.PushDecidesLocally.Store(false)
	}
	const planEnd = 1200 * time.Millisecond
	const coords = 4
	cl := xgCluster()
	cl.readsIgnoreLocks = o.readsIgnoreLocks
	var s *sim.Sim
	trueNow := simClock(&s)
	run := &xgRun{cl: cl, o: o, keys: xgAccountKeys(cl), ops: 40, faultsUntil: planEnd / 2}
	for _, k := range run.keys {
		run.regs = append(run.regs, "{"+k+"}r")
	}
	// One skew register in each group: in the slots of the first account
	// and of the first account of the other group.
	for _, k := range run.keys {
		if len(run.skews) == 0 || cl.smap.Owner(kv.KeySlot([]byte(k))) != cl.smap.Owner(kv.KeySlot([]byte(run.keys[0]))) {
			run.skews = append(run.skews, "{"+k+"}s")
			if len(run.skews) == 2 {
				break
			}
		}
	}
	run.rec = check.NewTxnRecorder(trueNow)
	var nodes []*xgNode
	defer func() {
		for _, n := range nodes {
			if n.co != nil {
				n.co.cancel()
				for n.co != nil {
					if c := n.co.resume(failed(n.width, n.co.ctx.Err())); c.done {
						n.co = nil
					}
				}
			}
		}
	}()
	so := sim.Options{
		Replicas: 2 * movesGroupSize, Clients: coords + 1,
		NewReplicaBoot: newHostNode(hostSimOptions{mut: o.mut, groupSize: movesGroupSize, cluster: cl}, seed, trueNow),
		NewClient: func(id sim.Addr, cfg sim.Config) sim.Node {
			n := &xgNode{run: run, id: int(id), pusher: int(id) == cfg.Replicas+coords, rng: rand.New(rand.NewPCG(seed, uint64(id))),
				leader: []int{0, movesGroupSize}}
			nodes = append(nodes, n)
			return n
		},
		Duration: planEnd, Trace: trace,
	}
	if !o.faults {
		so.Faults = &sim.Faults{Every: sim.Dist{Base: time.Hour}}
	}
	if o.powerCuts {
		so.Sync = sim.Dist{Base: 2 * time.Millisecond, Jitter: 4 * time.Millisecond}
	}
	so = sim.Swarm(seed, so)
	if so.Faults != nil {
		f := *so.Faults
		f.MaxDown, f.Until = 1, run.faultsUntil
		so.Faults = &f
	}
	s = sim.New(so)
	run.s, cl.s = s, s
	if o.powerCuts {
		s.PowerCuts(run.faultsUntil - 1)
	}
	var restart func()
	restart = func() {
		if s.Now() >= run.faultsUntil {
			for i := range so.Replicas {
				if !s.Up(i) {
					s.Restart(i)
				}
			}
		}
		s.After(50*time.Millisecond, restart)
	}
	s.After(50*time.Millisecond, restart)
	s.Run()
	var errs []error
	if s.Err() == nil {
		run.stopped = true
		busy := func() bool {
			for _, n := range nodes {
				if !n.pusher && n.co != nil {
					return true
				}
			}
			return xgLocksLeft(s) != nil
		}
		// Quiet twice, the second time after a push's age: a prepare sent
		// again may arrive after its transaction resolved and lock again
		// (the push releases it).
		for extra, quiet := 0, 0; extra < 60 && quiet < 2; extra++ {
			s.RunFor(100 * time.Millisecond)
			if busy() {
				quiet = 0
				continue
			}
			if quiet++; quiet == 1 {
				s.RunFor(xgPushAge + 200*time.Millisecond)
			}
		}
		errs = append(errs, xgLocksLeft(s), xgDecisionsLeft(s))
		errs = append(errs, replicationRestored(s, cl))
		for g, ms := range cl.members {
			if err := hostAgreeAmong(s, ms); err != nil {
				errs = append(errs, fmt.Errorf("group %d: %w", g+1, err))
			}
		}
		errs = append(errs, xgFinalTotal(s, run))
	}
	errs = append(errs, s.Err())
	errs = append(errs, run.errs...)
	h := run.rec.History()
	errs = append(errs, check.Errs([]check.Verdict{check.CheckTxns(h, check.TxnOptions{Model: check.StrictSerializable})}))
	if summary != nil {
		*summary = fmt.Sprintf("%d transactions: %d committed, %d aborted, %d unknown; %d plain writes refused by a lock; %d coordinator deaths, %d pushes (%d failed), %d commits settled, %d decisions collected, %d node crashes; %+v at %v",
			len(h.Txns), run.ok, run.aborts, run.unknown, run.refused, run.kills, run.pushes, run.pushFails, run.settles, run.collected, run.nodeDowns, s.Stats(), s.Now())
	}
	return errors.Join(errs...)
}

// xgLocksLeft reports a replica still holding a prepared part or a lock.
func xgLocksLeft(s *sim.Sim) error {
	for a := range s.Config().Replicas {
		node := s.Replica(a)
		if node == nil {
			return fmt.Errorf("replica %d is down", a)
		}
		get := node.(*hostNode).r.db.Lookup
		n, err := kv.TxLockCount(get)
		if err != nil {
			return err
		}
		ids, err := kv.TxPreparedIDs(get)
		if err != nil {
			return err
		}
		if n != 0 || len(ids) != 0 {
			var parts []string
			for _, id := range ids {
				p, _, _ := kv.TxPreparedOf(get, id)
				parts = append(parts, fmt.Sprintf("%s (primary %s, locks %d, prepared at %d)", p.TxID, p.Primary, len(p.Locks), p.Prepared))
			}
			return fmt.Errorf("locks not released after the faults healed: replica %d (group %d, leader %t) holds %d prepared parts (count %d): %s", a, groupOf(a), node.(*hostNode).r.isLeader.Load(), len(ids), n, strings.Join(parts, ", "))
		}
	}
	return nil
}

// xgDecisionsLeft reports a replica still holding a decision record once
// the runs are quiet: the sweep collects every one (kcluster.
// TxDecisionsDue), so their number is bounded by the transactions of the
// last xgDecisionKeep and the commits not yet settled — none after a quiet
// period.
func xgDecisionsLeft(s *sim.Sim) error {
	for a := range s.Config().Replicas {
		node := s.Replica(a)
		if node == nil {
			return fmt.Errorf("replica %d is down", a)
		}
		db := node.(*hostNode).r.db
		var left []string
		err := db.Scan(kv.TxDecisionPrefix, nil, 0, 0, func(key []byte, v storage.Value) bool {
			if !bytes.HasPrefix(key, kv.TxDecisionPrefix) {
				return false
			}
			txid := key[len(kv.TxDecisionPrefix):]
			d, err := kv.DecodeTxDecision(txid, v.Data)
			left = append(left, fmt.Sprintf("%x (time %d, commit %t, pending %d, err %v)", txid, kv.TxIDTime(txid), d.Commit, len(d.Pending), err))
			return true
		})
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("decisions not collected after a quiet period: replica %d (group %d) holds %d: %s", a, groupOf(a), len(left), strings.Join(left, ", "))
		}
	}
	return nil
}

// xgFinalTotal: the accounts, as each group's first replica holds them
// (the replicas agree), total the initial sum.
func xgFinalTotal(s *sim.Sim, r *xgRun) error {
	sum := 0
	var vals []string
	for _, k := range r.keys {
		g := r.cl.smap.Owner(kv.KeySlot([]byte(k)))
		node := s.Replica((int(g) - 1) * movesGroupSize)
		if node == nil {
			return fmt.Errorf("group %d's replica 0 is down", g)
		}
		v, err := node.(*hostNode).r.db.Get([]byte(k))
		var data []byte
		if err == nil {
			data = v.Data
		} else if !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		_, bal, err := xgParse(data)
		if err != nil {
			return err
		}
		sum += bal
		vals = append(vals, k+"="+string(data))
	}
	if sum != xgInitial*len(r.keys) {
		return fmt.Errorf("the accounts total %d, not %d, after the run: %s", sum, xgInitial*len(r.keys), strings.Join(vals, " "))
	}
	return nil
}

// TestXgSim runs cross-group transactions (transfers, read-only totals,
// plain reads and writes) with their coordinators dying at random actions,
// under the nemesis and whole-node crashes, and under power cuts (see the
// top of this file): 10, 30 and 10 seeds (about 3 s); 200, 1000 and 300
// under KEFIR_SOAK=1; KEFIR_SIM_SEEDS=n runs n of each.
func TestXgSim(t *testing.T) {
	for _, tc := range []struct {
		name       string
		o          xgOptions
		n, soak    int
		firstSeeds uint64
	}{
		{"calm", xgOptions{killAt: -1}, 10, 200, 1},
		{"faults", xgOptions{faults: true, coordDeaths: true, killAt: -1}, 30, 1000, 1},
		{"powercuts", xgOptions{powerCuts: true, coordDeaths: true, killAt: -1}, 10, 300, 1},
		{"skew", xgOptions{skewMix: true, killAt: -1}, 5, 100, 1},
		{"skewfaults", xgOptions{skewMix: true, faults: true, coordDeaths: true, killAt: -1}, 10, 300, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim.Explore(t, tc.firstSeeds, simSeeds(tc.n, tc.soak), func(seed uint64, trace io.Writer) error {
				return xgSim(seed, trace, tc.o, nil)
			})
		})
	}
}

// TestXgSimCoordinatorDiesAtEachAction kills every coordinator at the same
// action, for each action in turn: 0 before its reads, 1-2 between the
// snapshot reads (2 of a transfer) and after them, then among its
// prepares, after their answers (the decision not sent), after the
// decision's answer (the resolves not sent), between resolves, before its
// forget (the primary's sweep settles the commit). Every lock must be
// released by the push, every decision collected, and the history stay
// strict serializable with the sum kept.
func TestXgSimCoordinatorDiesAtEachAction(t *testing.T) {
	for k := range 10 {
		t.Run(strconv.Itoa(k), func(t *testing.T) {
			var sum string
			if err := xgSim(1, nil, xgOptions{killAt: k}, &sum); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(sum, "coordinator deaths") || strings.Contains(sum, " 0 coordinator deaths") {
				t.Fatalf("no coordinator died: %s", sum)
			}
			t.Logf("%s", sum)
		})
	}
}

// TestXgSimSummary logs what a run exercises.
func TestXgSimSummary(t *testing.T) {
	for _, o := range []xgOptions{{killAt: -1}, {faults: true, coordDeaths: true, killAt: -1}, {skewMix: true, killAt: -1}} {
		var sum string
		if err := xgSim(1, nil, o, &sum); err != nil {
			t.Fatal(err)
		}
		t.Logf("faults %t: %s", o.faults, sum)
	}
}

// TestXgSimCatchesMutations shows the simulation catches bugs in the
// cross-group commit, each at a fixed seed that is clean without it:
//   - kv ResolveIgnoresDecision: a resolve lands an aborted part's writes;
//   - kv PrepareSkipsLocks: two prepared transactions lock one key and
//     both commit over the same version;
//   - the simulation's reads ignoring write locks (cluster's
//     ReadsIgnoreTxLocks, done to the simulation's own read wait): a plain
//     read sees one group's part of a committed transfer before the other
//     group's resolve — caught by the Elle checker (seed 6, with more plain
//     reads and writes and the resolves sent 30 ms late: the window is
//     rare otherwise, 1 seed in 60 before decisions were collected and
//     none of 400 since);
//   - cluster DecideEarly: the coordinator decides commit on the
//     primary's prepare alone, and lands half a transfer;
//   - cluster PushDecidesLocally: a push aborts a participant's part
//     without asking the primary, which may have decided commit;
//   - kv CollectIgnoresPending: a commit's decision is collected before
//     every participant resolved it, and a participant's push, finding it
//     forgotten, aborts its part of a committed transfer;
//   - the sweep collecting nothing (a check of the bound check): the
//     decisions are left after the quiet period;
//   - kv ReadLockAdmitsWriter: shared read locks that do not exclude a
//     writer's prepare (nor a reader's of a write-locked key) — with the
//     skew workload two transactions that each read both skew registers
//     and wrote one both commit (write skew: the Elle checker's G2), and in
//     the plain workload a read-only total sees half a transfer.
func TestXgSimCatchesMutations(t *testing.T) {
	mutation.Require(t)
	faults := xgOptions{faults: true, coordDeaths: true, killAt: -1}
	calm := xgOptions{killAt: -1}
	slowResolves := xgOptions{killAt: -1, plainMix: true, resolveDelay: 30}
	skew := xgOptions{killAt: -1, skewMix: true}
	// Each mutation is looked for over a short list of seeds, stopping at
	// the first that catches it, every seed tried clean without it: a
	// fixed single seed stops catching whenever a change elsewhere moves
	// the schedule (one fewer message per write moved seven of them in
	// session 29), while a mutation the simulation can catch is caught
	// within a few seeds.
	for _, tc := range []struct {
		name  string
		seeds []uint64
		o     xgOptions
		set   func(*xgOptions)
		want  string
	}{
		{"ResolveIgnoresDecision", xgCatchSeeds, calm, func(o *xgOptions) { o.kvMut.ResolveIgnoresDecision = true }, "the accounts total"},
		{"PrepareSkipsLocks", xgCatchSeeds, calm, func(o *xgOptions) { o.kvMut.PrepareSkipsLocks = true }, "the accounts total"},
		{"readsIgnoreLocks", append([]uint64{6}, xgCatchSeeds...), slowResolves, func(o *xgOptions) { o.readsIgnoreLocks = true }, "txn-strict-serializable: VIOLATED"},
		{"DecideEarly", xgCatchSeeds, calm, func(o *xgOptions) { o.decideEarly = true }, "the accounts total"},
		{"PushDecidesLocally", xgCatchSeeds, faults, func(o *xgOptions) { o.pushLocal = true }, "the accounts total"},
		{"CollectIgnoresPending", xgCatchSeeds, faults, func(o *xgOptions) { o.kvMut.CollectIgnoresPending = true }, "the accounts total"},
		{"noCollect", xgCatchSeeds, calm, func(o *xgOptions) { o.noCollect = true }, "decisions not collected after a quiet period"},
		{"ReadLockAdmitsWriter", xgCatchSeeds, skew, func(o *xgOptions) { o.kvMut.ReadLockAdmitsWriter = true }, "txn-strict-serializable: VIOLATED"},
		{"ReadLockAdmitsWriter/totals", xgCatchSeeds, calm, func(o *xgOptions) { o.kvMut.ReadLockAdmitsWriter = true }, "a committed read of every account"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var missed []uint64
			for _, seed := range tc.seeds {
				if err := xgSim(seed, nil, tc.o, nil); err != nil {
					t.Fatalf("seed %d fails without the mutation: %v", seed, err)
				}
				o := tc.o
				tc.set(&o)
				err := xgSim(seed, nil, o, nil)
				if err == nil {
					missed = append(missed, seed)
					continue
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("seed %d: %s caught, but not by %q: %v", seed, tc.name, tc.want, err)
				}
				t.Logf("caught at seed %d (missed at %v): %s", seed, missed, firstLine(err))
				return
			}
			t.Fatalf("the simulation missed %s at every seed of %v", tc.name, tc.seeds)
		})
	}
}

// xgCatchSeeds are the seeds TestXgSimCatchesMutations looks for a
// mutation at, in order: most are caught at the first; the rarer windows
// (a push or a collect racing a resolve under faults) within a few dozen.
var xgCatchSeeds = func() []uint64 {
	out := make([]uint64, 40)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}()

// TestXgSimReplaysExactly: a seed's run, coordinator coroutines and their
// deaths included, is a pure function of the seed — two runs write the
// same trace, event for event.
func TestXgSimReplaysExactly(t *testing.T) {
	o := xgOptions{faults: true, coordDeaths: true, killAt: -1}
	replaysExactly(t, "seed 3", func(w io.Writer) error { return xgSim(3, w, o, new(string)) })
}

// replaysExactly runs a simulation twice (run writes its trace to w) and
// fails t unless both runs end alike and write the same non-empty trace:
// a seed's run must be a function of the seed (a map's order or a real
// clock leaking into the code under test would make them differ, and a
// failing seed would not replay).
func replaysExactly(t *testing.T, name string, run func(w io.Writer) error) {
	t.Helper()
	var a, b strings.Builder
	errA, errB := run(&a), run(&b)
	if fmt.Sprint(errA) != fmt.Sprint(errB) {
		t.Fatalf("%s: the runs end differently: %v / %v", name, errA, errB)
	}
	if a.Len() == 0 || a.String() != b.String() {
		la, lb := strings.Split(a.String(), "\n"), strings.Split(b.String(), "\n")
		for i := range min(len(la), len(lb)) {
			if la[i] != lb[i] {
				t.Logf("line %d:\n%s\n%s", i, la[i], lb[i])
				break
			}
		}
		t.Fatalf("%s: the traces differ (%d and %d bytes)", name, a.Len(), b.Len())
	}
}
