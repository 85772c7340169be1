package vr

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
)

// The nilext fast path (Skyros, paper 004; digest 004 §2, ARCHITECTURE §5.2)
// is a mode of this core, off unless Config.Nilext is set.
//
// A client sends a nil-externalizing update (no result, only an ack) to every
// replica. Each replica appends it to its durability log (d-log), keyed by
// (client, request number), and acknowledges with its view and whether it
// leads that view. The client completes the update on NilextSupermajority
// acks of one view including the leader's (NilextTracker). The leader later
// moves d-log entries, in its own d-log order, into the consensus log; an
// entry leaves every d-log once it is applied.
//
// Why the leader's d-log order is a correct order: the leader's ack is needed
// for completion, so if b was invoked after a completed, a was already in the
// leader's d-log when b arrived. Reads at the leader of a key with a pending
// entry order the whole d-log first (ReadNilext); non-nilext updates order the
// whole d-log before themselves (Propose).
//
// View change: every do-view-change carries the sender's d-log, and the new
// leader rebuilds the d-log with RecoverDurabilityLog before it serves; see
// that function for the f >= 2 cycle rule and what Kefir guarantees.

// NilextRequest is a nil-externalizing update sent to every replica. Keys are
// the keys it writes (opaque to the core), so the leader can tell a read that
// it depends on a pending update without understanding Data. Sync asks that
// the d-log entry be on disk before the ack (durability level sync); without
// it (cad, async) the ack goes out at once and the entry is written in the
// background.
type NilextRequest struct {
	Request
	Keys [][]byte
	Sync bool
}

// NilextAck acknowledges a nilext update: replica From holds it in its d-log
// (durably, if Sync) while normal in View; Leader says From leads View.
type NilextAck struct {
	Client, ReqNum uint64
	From           uint64
	View           uint64
	Leader         bool
}

// Nilext errors callers branch on.
var (
	// ErrNilextOff: the replica runs without the fast path; use Propose.
	ErrNilextOff = errors.New("vr: nilext fast path is off")
	// ErrNilextIdentity: a nilext update needs a client id and request number,
	// because the d-log and the client table dedup by them.
	ErrNilextIdentity = errors.New("vr: nilext update without client identity")
	// ErrDLogCycle: the durability logs at hand order some pending updates in
	// a cycle, so no order of them is known to respect real time.
	ErrDLogCycle = errors.New("vr: durability logs order updates in a cycle")
	// ErrDLogStale: too many of the durability logs at hand come from
	// replicas that restarted after possibly losing acknowledged cad/async
	// updates (a power cut): the new leader waits for more, or, with every
	// replica's log at hand, recovers from the stale ones too.
	ErrDLogStale = errors.New("vr: durability logs of restarted replicas")
)

// NilextSupermajority is how many acks (one view, the leader's included) a
// nilext update needs among n = 2f+1 replicas: f + ceil(f/2) + 1.
func NilextSupermajority(n int) int {
	f := (n - 1) / 2
	return f + (f+1)/2 + 1
}

type dkey struct{ client, req uint64 }

type dEntry struct {
	NilextRequest
	seq    uint64 // persist batch holding it (0: nothing to wait for)
	view   uint64 // view it was appended in (the ack's view)
	queued bool   // leader: handed to the consensus log
	gone   bool
}

type nilextState struct {
	list     []*dEntry // arrival order, with gone entries until compaction
	idx      map[dkey]*dEntry
	byClient map[uint64][]*dEntry // per client, in arrival order (gone ones pruned lazily)
	keys     map[string]int       // pending entries per key
	live     int
	unqueued int

	acks      []pendingAck
	quiet     map[dkey]bool // ordered from the d-log: nobody waits for a Reply
	lastOrder int64

	slowReads uint64
	cycles    uint64
	cycleView uint64 // view and log count of the last cycle reported
	cycleLogs int

	// restarted: this replica started from a disk that may lack d-log
	// updates it had acknowledged from memory (nxRestarted); its d-log is
	// stale while its last normal view is at most restartView.
	restarted   bool
	restartView uint64
	staleWaits  uint64 // view changes that waited for fresh d-logs (Info)
	staleView   uint64 // view and fresh-log count of the last wait reported
	staleLogs   int
}

type pendingAck struct {
	seq uint64
	a   NilextAck
}

func (nx *nilextState) init() {
	if nx.idx == nil {
		nx.idx = map[dkey]*dEntry{}
		nx.byClient = map[uint64][]*dEntry{}
		nx.keys = map[string]int{}
		nx.quiet = map[dkey]bool{}
	}
}

func (nx *nilextState) add(e *dEntry) {
	nx.init()
	nx.list = append(nx.list, e)
	nx.idx[dkey{e.Client, e.ReqNum}] = e
	nx.byClient[e.Client] = append(nx.byClient[e.Client], e)
	for _, k := range e.Keys {
		nx.keys[string(k)]++
	}
	nx.live++
	if !e.queued {
		nx.unqueued++
	}
}

func (nx *nilextState) remove(e *dEntry) {
	if e.gone {
		return
	}
	e.gone = true
	delete(nx.idx, dkey{e.Client, e.ReqNum})
	for _, k := range e.Keys {
		if nx.keys[string(k)]--; nx.keys[string(k)] <= 0 {
			delete(nx.keys, string(k))
		}
	}
	nx.live--
	if !e.queued {
		nx.unqueued--
	}
	if len(nx.list) > 64 && nx.live < len(nx.list)/2 {
		nx.list = slices.DeleteFunc(nx.list, func(e *dEntry) bool { return e.gone })
	}
}

func (nx *nilextState) clear() {
	nx.list = nil
	clear(nx.idx)
	clear(nx.byClient)
	clear(nx.keys)
	clear(nx.quiet)
	nx.live, nx.unqueued = 0, 0
}

func (nx *nilextState) entries() []NilextRequest {
	out := make([]NilextRequest, 0, nx.live)
	for _, e := range nx.list {
		if !e.gone {
			out = append(out, e.NilextRequest)
		}
	}
	return out
}

// nxRestarted records, when the replica starts, whether its d-log may lack
// updates it acknowledged before it stopped, and reports whether it must
// force a view change for that (New). A cad or async nilext update is
// acknowledged from memory and written to the disk later; a power cut
// between the two leaves a restarted replica without an update that counted
// its ack. RecoverDurabilityLog's threshold assumes every acker of a
// completed update still holds it, so such a d-log must not count as one of
// the logs (issue 24): the replica marks its do-view-changes stale
// (Message.DLogStale) until it is normal in a view that started after its
// restart — every ack it gives there is in its memory. So that this stale
// window is one view change, not the rest of a long view, a restarted
// follower resumes its view only until its lease promise lets it start the
// next one: New sets pendingView, so it stops renewing the promise (as when
// another replica asks for a view) and starts that view once it has run out
// (Tick; a restarted leader moves on at once). A recovering replica
// (LostState) acked in at most the view it recovers into: nxAdopt extends
// the window to it.
//
// Only a replica that was normal when it stopped can have lost acks: its
// disk's hard state has View == LastNormalView. One whose disk holds a later
// view had made that view durable, with the fsync covering every d-log
// record written before it (one file, appended in order; recovery keeps a
// prefix), and gives no acks outside normal status. Staleness outlives
// further restarts: it is recorded on the disk as a marker among the d-log
// records (staleMarker), so a replica that restarts again, in a view change
// this time, still knows its d-log of that view lacks something.
func (r *Replica) nxRestarted(st State) bool {
	if !r.cfg.Nilext || st.Bootstrap {
		return false
	}
	if st.LostState {
		r.nx.restarted = true
		return false
	}
	hs := st.HardState
	if st.DLogIntact || hs.View != hs.LastNormalView {
		return false
	}
	if r.nxStale() && r.nx.restartView >= hs.View {
		return true // a marker already says so
	}
	r.nx.restarted, r.nx.restartView = true, max(r.nx.restartView, hs.View)
	r.out.DLog = append(r.out.DLog, staleMarker(r.nx.restartView))
	return true
}

// staleMarker is the d-log record that keeps a replica's staleness across
// restarts: client 0 (no real update has it: Nilext refuses it) and the
// view its d-log may lack acks of in ReqNum. restoreDLog reads it back;
// it never enters the d-log itself (DLog), only the disk (DLogRecords).
func staleMarker(view uint64) NilextRequest {
	return NilextRequest{Request: Request{ReqNum: view}}
}

// DLogRecords is what a driver writes when it rewrites the d-log records on
// its disk (at a checkpoint): the d-log, and the stale marker while this
// replica's d-log is stale.
func (r *Replica) DLogRecords() []NilextRequest {
	es := r.nx.entries()
	if r.nxStale() {
		es = append(es, staleMarker(r.nx.restartView))
	}
	return es
}

// nxStale reports whether this replica's d-log may lack updates it
// acknowledged (nxRestarted): its do-view-change says so.
func (r *Replica) nxStale() bool {
	return r.nx.restarted && r.lnv <= r.nx.restartView
}

// restoreDLog loads the d-log a restarted replica's disk kept, dropping what
// the client table shows executed.
func (r *Replica) restoreDLog(es []NilextRequest) {
	for _, q := range es {
		if q.Client == 0 {
			r.nx.restarted, r.nx.restartView = true, max(r.nx.restartView, q.ReqNum)
			continue
		}
		if r.nxApplied(q.Client, q.ReqNum) || r.nx.idx[dkey{q.Client, q.ReqNum}] != nil {
			continue
		}
		r.nx.add(&dEntry{NilextRequest: q, view: r.view})
	}
}

func (r *Replica) nxApplied(client, req uint64) bool {
	rec := r.clients[client]
	return rec != nil && req <= rec.ReqNum
}

// Nilext takes a nilext update from a client at local time now. The ack comes
// out in Ready.NilextAcks: at once for cad/async updates and for copies of
// updates already executed; for sync updates once the d-log entry is durable.
// A retransmission keeps its first d-log position and is acknowledged again.
func (r *Replica) Nilext(now int64, req NilextRequest) error {
	r.observe(now)
	switch {
	case !r.cfg.Nilext:
		return ErrNilextOff
	case req.Client == 0:
		return ErrNilextIdentity
	case r.status != Normal:
		return ErrNotNormal
	}
	r.nx.init()
	ack := NilextAck{Client: req.Client, ReqNum: req.ReqNum, From: r.cfg.Self, View: r.view, Leader: r.isLeader()}
	if r.nxApplied(req.Client, req.ReqNum) {
		// Executed (or superseded by the client's later request): never
		// re-added, and safe to acknowledge, since it is committed.
		r.out.NilextAcks = append(r.out.NilextAcks, ack)
		return nil
	}
	e := r.nx.idx[dkey{req.Client, req.ReqNum}]
	if e == nil {
		e = &dEntry{NilextRequest: req, view: r.view}
		if req.Sync {
			e.seq = r.nextSeq()
		}
		r.nx.add(e)
		r.out.DLog = append(r.out.DLog, req)
		if r.isLeader() && r.nx.unqueued >= r.cfg.NilextBatch {
			r.nxOrder()
		}
	}
	if e.seq > r.synced && !r.mut.ackBeforePersist && !r.mut.nilextAckEarly {
		r.nx.acks = append(r.nx.acks, pendingAck{seq: e.seq, a: ack})
	} else {
		r.out.NilextAcks = append(r.out.NilextAcks, ack)
	}
	return nil
}

// nxRelease sends the acks whose d-log entries are durable now.
func (r *Replica) nxRelease() {
	n := 0
	for _, p := range r.nx.acks {
		if p.seq <= r.synced {
			r.out.NilextAcks = append(r.out.NilextAcks, p.a)
		} else {
			r.nx.acks[n] = p
			n++
		}
	}
	r.nx.acks = r.nx.acks[:n]
}

// nxClamp: no batch was issued for seq r.seq+1, so acks wait only for what was.
func (r *Replica) nxClamp() {
	for i := range r.nx.acks {
		r.nx.acks[i].seq = min(r.nx.acks[i].seq, r.seq)
	}
}

// nxOrder moves every unqueued d-log entry, in d-log order, to the proposal
// queue (the next Ready turns it into one prepare batch).
func (r *Replica) nxOrder() {
	if !r.cfg.Nilext || r.nx.unqueued == 0 || r.status != Normal || !r.isLeader() {
		return
	}
	for _, e := range r.nx.list {
		if e.gone || e.queued {
			continue
		}
		e.queued = true
		r.nx.unqueued--
		if r.nxApplied(e.Client, e.ReqNum) {
			r.nx.remove(e)
			continue
		}
		// Ordered even if a Propose of the same request (the client's
		// fallback) or a later one of its client is in flight: the copy that
		// applies second is a Duplicate and is skipped, and this way no entry
		// can stay in the d-log (and keep its keys pending) for ever.
		r.queue = append(r.queue, e.Request)
		r.inflight[e.Client] = max(r.inflight[e.Client], e.ReqNum)
		r.nx.quiet[dkey{e.Client, e.ReqNum}] = true
	}
	r.nx.lastOrder = r.now
}

// nxTick is the background finalizer's timer.
func (r *Replica) nxTick() {
	if r.cfg.Nilext && r.nx.unqueued > 0 && r.now-r.nx.lastOrder >= int64(r.cfg.NilextInterval) {
		r.nxOrder()
	}
}

// nxBeforePropose: a non-nilext update (or the ordered fallback of a nilext
// one) is ordered after every pending d-log entry; whoever proposes a request
// wants its Reply.
func (r *Replica) nxBeforePropose(req Request) {
	if !r.cfg.Nilext {
		return
	}
	r.nxOrder()
	delete(r.nx.quiet, dkey{req.Client, req.ReqNum})
}

// nxQuietReply reports (and forgets) that an applied entry came from the
// d-log only, so its client got its answer from the acks.
func (r *Replica) nxQuietReply(client, req uint64) bool {
	k := dkey{client, req}
	if r.nx.quiet[k] {
		delete(r.nx.quiet, k)
		return true
	}
	return false
}

// nxExecuted removes an applied request, and every earlier one of its
// client, from the d-log. The earlier ones are applied already or were never
// completed: a client has one request outstanding (the client table's rule),
// so an earlier request that completed was in the leader's d-log before this
// one arrived and was ordered first. Without this, copies that reached only
// some followers (a client that died mid-broadcast, or moved on) would stay
// until the next view change.
func (r *Replica) nxExecuted(client, req uint64) {
	es, ok := r.nx.byClient[client]
	if !ok {
		return
	}
	k := 0
	for _, e := range es {
		if e.gone {
			continue
		}
		if e.ReqNum <= req {
			r.nx.remove(e)
			continue
		}
		es[k] = e
		k++
	}
	if k == 0 {
		delete(r.nx.byClient, client)
	} else {
		r.nx.byClient[client] = es[:k]
	}
}

func (r *Replica) nxStepDown() {
	for _, e := range r.nx.list {
		if !e.gone && e.queued {
			e.queued = false
			r.nx.unqueued++
		}
	}
	clear(r.nx.quiet)
}

// nxEnterView: a follower that becomes normal in a new view drops its d-log.
// Safe: every update that completed in an earlier view is in the new view's
// start log (RecoverDurabilityLog at the new leader), and nothing was acked in
// the new view yet (only normal replicas ack).
func (r *Replica) nxEnterView() {
	r.nx.clear()
}

// nxAdopt replaces the d-log by the leader's (recovery protocol): the leader's
// d-log holds every update completed in its view, in real-time order.
func (r *Replica) nxAdopt(es []NilextRequest) {
	if r.nx.restarted {
		// It may have acked updates of this very view before it lost its
		// disk, and the leader may ack them only later: stale for this view,
		// which it asks to end once its lease promise allows (as a restarted
		// follower does, New).
		r.nx.restartView = max(r.nx.restartView, r.view)
		r.pendingView = max(r.pendingView, r.view+1)
	}
	r.nx.clear()
	for _, q := range es {
		if r.nxApplied(q.Client, q.ReqNum) || r.nx.idx[dkey{q.Client, q.ReqNum}] != nil {
			continue
		}
		r.nx.add(&dEntry{NilextRequest: q, view: r.view})
		r.out.DLog = append(r.out.DLog, q)
	}
	if r.nx.restarted {
		// On the disk too, or a crash in the view change to come would
		// bring it back fresh (nxRestarted).
		r.out.DLog = append(r.out.DLog, staleMarker(r.nx.restartView))
	}
}

// ReadNilext is called by the leader's driver before a linearizable read of
// keys. If none of them has a pending nilext update it returns false and does
// nothing: serve the read as usual (LeaseRead or ReadIndex). Otherwise it
// orders the whole d-log now and registers a read-index read for ctx that
// Ready.ReadStates releases once those entries are committed (and leadership
// is confirmed by a heartbeat round); it returns true (a slow-path read,
// counted in Info.NilextSlowReads).
func (r *Replica) ReadNilext(now int64, ctx uint64, keys [][]byte) (bool, error) {
	r.observe(now)
	if r.status != Normal || !r.isLeader() {
		return false, ErrNotLeader
	}
	if !r.cfg.Nilext || !r.NilextPending(keys...) {
		return false, nil
	}
	r.nxOrder()
	r.nx.slowReads++
	r.reads = append(r.reads, readReq{ctx: ctx, min: r.lastOp() + uint64(len(r.queue))})
	r.hbNow = true
	return true, nil
}

// NilextPending reports whether any of keys has a nilext update in this
// replica's d-log (not applied yet).
func (r *Replica) NilextPending(keys ...[]byte) bool {
	for _, k := range keys {
		if r.nx.keys[string(k)] > 0 {
			return true
		}
	}
	return false
}

// DLog returns the d-log in order (do-view-changes carry it; a driver that
// compacts the d-log records on its disk writes DLogRecords).
func (r *Replica) DLog() []NilextRequest { return r.nx.entries() }

// InDLog reports whether this replica is normal and holds request (client,
// req) in its d-log (not applied yet). A driver uses it to tell log entries
// that came from the d-log — whose clients completed on the d-log acks, so no
// client waits for their commit — from the others: it may hold the fsync of
// a batch of such entries until a later batch needs one (group commit across
// the d-log and the log; docs/design/nilext.md). Only a hint for when to
// fsync: what Persisted promises is unchanged.
func (r *Replica) InDLog(client, req uint64) bool {
	return r.status == Normal && r.nx.idx[dkey{client, req}] != nil
}

// syncHint marks a leader's prepare or heartbeat sent while something at the
// leader waits for a commit — a read (a nilext slow-path read, a durability
// wait) or a write the driver said waits for its commit (WantSync):
// Persisted, unused on the leader's messages, carries the leader's last op. A
// follower whose driver holds log batches for group commit (batches no client
// waits for: d-log entries, cad and async blind writes) syncs them at once
// instead of at its deadline (SyncWanted). Only a hint: it changes when a
// follower fsyncs, never what it promises.
func (r *Replica) syncHint(m *Message) {
	if r.syncWanted {
		m.Persisted = r.lastOp()
		return
	}
	for i := range r.reads {
		if q := &r.reads[i]; q.min > r.commit || q.durWait {
			m.Persisted = r.lastOp()
			return
		}
	}
}

// WantSync makes the prepares and heartbeats of the next Ready ask the
// followers to sync held log batches now (SyncWanted): the driver proposed a
// write that waits for its commit (its prepare carries the request), or,
// with beat, something waits for entries already sent, and a heartbeat goes
// out with the next Ready if any entry is not yet committed.
func (r *Replica) WantSync(beat bool) {
	r.syncWanted = true
	if beat && r.commit < r.lastOp() {
		r.hbNow = true
	}
}

// SyncWanted reports whether m, a message from the leader, asks its receiver
// to sync held log batches now (something at the leader waits for a commit;
// syncHint).
func SyncWanted(m *Message) bool {
	return (m.Type == MsgPrepare || m.Type == MsgCommit) && m.Persisted > 0
}

// AskSync (at a follower) makes the next Ready send the leader a prepare-ok,
// even without progress, that asks it to sync held log batches now and to
// ask the other followers to (SyncAsked): a caller at this follower waits
// for an apply (a session read), which needs a commit, and the leader cannot
// know. Readable, unused on a prepare-ok, carries the request (non-zero).
// Only a hint: it changes when replicas fsync, never what they promise.
func (r *Replica) AskSync() {
	if r.status == Normal && !r.isLeader() {
		r.askSync = true
		r.cad.due = true
	}
}

// SyncAsked reports whether m, a follower's prepare-ok, asks the leader to
// sync held log batches now (AskSync).
func SyncAsked(m *Message) bool {
	return m.Type == MsgPrepareOK && m.Readable > 0
}

// ---- view change ----

// nxRecover rebuilds the d-log at a new leader from the do-view-changes at
// hand, once the chosen consensus log (ours before `first`, then es) is known.
// It returns false when the logs order pending updates in a cycle: the view
// must not start (see RecoverDurabilityLog).
func (r *Replica) nxRecover(first uint64, es []Entry) ([]NilextRequest, bool) {
	if !r.cfg.Nilext {
		return nil, true
	}
	inLog := map[dkey]bool{}
	for op := r.first; op < first && op <= r.lastOp(); op++ {
		if e := r.entry(op); e.Client != 0 {
			inLog[dkey{e.Client, e.ReqNum}] = true
		}
	}
	for _, e := range es {
		if e.Client != 0 {
			inLog[dkey{e.Client, e.ReqNum}] = true
		}
	}
	// Our own d-log first: it breaks ties among unordered updates.
	logs := make([][]NilextRequest, 0, r.n)
	all := make([][]NilextRequest, 0, r.n)
	order := append([]int{r.self}, func() []int {
		var o []int
		for i := range r.dvc {
			if i != r.self {
				o = append(o, i)
			}
		}
		return o
	}()...)
	for _, i := range order {
		d := r.dvc[i]
		if d == nil {
			continue
		}
		l := make([]NilextRequest, 0, len(d.DLog))
		for _, q := range d.DLog {
			// Executed or already in the chosen log: not pending any more.
			// Dropping an op from every log leaves the others' relations as
			// they were.
			if !inLog[dkey{q.Client, q.ReqNum}] && !r.nxApplied(q.Client, q.ReqNum) {
				l = append(l, q)
			}
		}
		all = append(all, l)
		if !d.DLogStale || r.mut.nilextCountStale {
			logs = append(logs, l)
		}
	}
	// Only fresh logs count (nxRestarted): with V of them, the threshold
	// V − (n − S) must exceed V/2, so V > 2(n − S) (1 of 3, 3 of 5).
	if need := 2*(r.n-NilextSupermajority(r.n)) + 1; len(logs) < need {
		stale := len(all) - len(logs)
		if len(all) < r.n {
			if r.nx.staleView != r.view || r.nx.staleLogs != len(logs) {
				r.nx.staleView, r.nx.staleLogs = r.view, len(logs)
				r.nx.staleWaits++
				r.out.Errors = append(r.out.Errors, fmt.Errorf("vr: replica %d waits for more do-view-changes to start view %d: %d of the %d d-logs at hand come from replicas that restarted and may have lost acknowledged updates, %d fresh ones needed: %w",
					r.cfg.Self, r.view, stale, len(all), need, ErrDLogStale))
			}
			return nil, false
		}
		// Every replica answered and too many of them restarted (a power
		// cut of several at once): no more logs will come, and waiting
		// would stop the group for good. What no log holds any more is
		// lost — the promise covers one replica's power cut, not this.
		if r.nx.staleView != r.view || r.nx.staleLogs != -1 {
			r.nx.staleView, r.nx.staleLogs = r.view, -1
			r.out.Errors = append(r.out.Errors, fmt.Errorf("vr: replica %d starts view %d from all %d d-logs, %d of them from replicas that restarted: cad/async nilext updates acknowledged only from their memory may be lost: %w",
				r.cfg.Self, r.view, len(all), stale, ErrDLogStale))
		}
		logs = all
	}
	out, err := recoverDLog(logs, r.n, r.mut.nilextBreakCycles)
	if err != nil {
		// Reported (and counted) once per view and number of logs: the
		// operator sees the group waiting for more replicas, or stuck.
		if r.nx.cycleView != r.view || r.nx.cycleLogs != len(logs) {
			r.nx.cycleView, r.nx.cycleLogs = r.view, len(logs)
			r.nx.cycles++
			what := "waiting for more replicas' do-view-changes"
			if len(all) == r.n {
				what = "refusing to serve: even every replica's d-log cycles"
			}
			r.out.Errors = append(r.out.Errors, fmt.Errorf("vr: replica %d cannot start view %d from %d of %d d-logs (%s): %w",
				r.cfg.Self, r.view, len(logs), r.n, what, err))
		}
		return nil, false
	}
	return out, true
}

// nxStartView appends the recovered d-log to the consensus log of the view
// this leader is starting, so the start-view carries it, and keeps it as the
// leader's d-log (already queued) until it is applied.
func (r *Replica) nxStartView(rec []NilextRequest) {
	r.nx.clear()
	if !r.cfg.Nilext {
		return
	}
	start := r.lastOp() + 1
	es := make([]Entry, 0, len(rec))
	for i, q := range rec {
		es = append(es, Entry{View: r.view, Op: start + uint64(i), Request: q.Request})
		r.nx.add(&dEntry{NilextRequest: q, view: r.view, queued: true})
		r.nx.quiet[dkey{q.Client, q.ReqNum}] = true
	}
	r.appendEntries(es)
	r.nx.lastOrder = r.now
}

// RecoverDurabilityLog computes the new leader's d-log from V durability
// logs (each in its replica's arrival order; logs[0] breaks ties) out of a
// group of n = 2f+1 replicas with supermajority S = NilextSupermajority(n).
//
// Rule (paper 004 Fig. 7, generalized to V >= f+1 logs): with threshold
// t = V − (n − S), keep the updates present in >= t logs; add the edge a→b
// when, in >= t logs, a precedes b or a is present without b; topologically
// sort. For V = f+1, t = ceil(f/2)+1 as in the paper.
//
// Why t is right for any V: a completed update was in S d-logs (one view,
// leader included) and stays there until applied or a new view starts, so at
// most n−S of the V logs lack it. If b was invoked after a completed, a was in
// those S logs before b arrived, so each of them shows "a before b, or a
// without b": >= t logs again. Every completed update is therefore kept and
// every real-time edge among kept updates is in the graph, and t > V/2
// (V >= f+1 > 2·floor(f/2) >= 2(n−S)) rules out opposite edges. If the graph
// is acyclic, any topological order respects real time: the result is safe.
//
// The cycle hazard (digest 004 §6.1): for f >= 2, pairwise majorities can form
// a cycle of length >= 3 (a Condorcet cycle), and there are executions, each
// producing the very same logs, in which each edge of the cycle is the real-
// time one: no order chosen from those logs is right in all of them. So a
// cycle is never broken: RecoverDurabilityLog returns ErrDLogCycle, and the
// new leader waits for more do-view-changes and recomputes with the larger V
// (the higher threshold removes edges that only a minority of replicas
// supports; the §6.1 cycle, with all five logs, is gone). If all n logs still
// form a cycle, the leader refuses to start the view (the group stays
// unavailable and reports it in Ready.Errors) rather than guess.
//
// What Kefir guarantees: for f = 1 (S = n = 3, t = V) the edge relation is
// an intersection of linear orders and cannot cycle, so recovery always
// succeeds with 2 logs. For f >= 2 every history stays linearizable and no
// completed update is lost; a view change that meets a cycle needs more
// replicas to answer, and one whose logs cycle even with all replicas refuses
// to serve.
func RecoverDurabilityLog(logs [][]NilextRequest, n int) ([]NilextRequest, error) {
	return recoverDLog(logs, n, false)
}

func recoverDLog(logs [][]NilextRequest, n int, breakCycles bool) ([]NilextRequest, error) {
	v := len(logs)
	t := v - (n - NilextSupermajority(n))
	if v == 0 {
		return nil, nil
	}
	if t < 1 || v > n {
		return nil, fmt.Errorf("vr: recover d-log from %d logs of %d replicas: need at least %d", v, n, n-NilextSupermajority(n)+1)
	}
	type node struct {
		req   NilextRequest
		count int
	}
	var nodes []*node // in order of first appearance, logs[0] first
	at := map[dkey]int{}
	pos := make([]map[dkey]int, v)
	for i, l := range logs {
		pos[i] = make(map[dkey]int, len(l))
		for p, q := range l {
			k := dkey{q.Client, q.ReqNum}
			if _, dup := pos[i][k]; dup {
				continue
			}
			pos[i][k] = p
			j, ok := at[k]
			if !ok {
				j = len(nodes)
				at[k] = j
				nodes = append(nodes, &node{req: q})
			}
			nodes[j].count++
		}
	}
	var keep []*node
	for _, nd := range nodes {
		if nd.count >= t {
			keep = append(keep, nd)
		}
	}
	m := len(keep)
	keys := make([]dkey, m)
	for i, nd := range keep {
		keys[i] = dkey{nd.req.Client, nd.req.ReqNum}
	}
	// at[i*m+a] is the position of kept update a in log i, -1 if absent: the
	// pair loop below is O(m²·V) array reads, no map lookups.
	at2 := make([]int32, v*m)
	for i := 0; i < v; i++ {
		for a, k := range keys {
			p, ok := pos[i][k]
			if !ok {
				p = -1
			}
			at2[i*m+a] = int32(p)
		}
	}
	// adj[a] lists b with a→b; indeg counts incoming edges.
	adj := make([][]int, m)
	indeg := make([]int, m)
	for a := 0; a < m; a++ {
		for b := a + 1; b < m; b++ {
			ab, ba := 0, 0
			for i := 0; i < v; i++ {
				pa, pb := at2[i*m+a], at2[i*m+b]
				switch {
				case pa >= 0 && (pb < 0 || pa < pb):
					ab++
				case pb >= 0 && (pa < 0 || pb < pa):
					ba++
				}
			}
			if ab >= t && ba >= t {
				panic(fmt.Sprintf("vr: recover d-log: edges both ways between %v and %v with threshold %d of %d", keys[a], keys[b], t, v))
			}
			if ab >= t {
				adj[a] = append(adj[a], b)
				indeg[b]++
			} else if ba >= t {
				adj[b] = append(adj[b], a)
				indeg[a]++
			}
		}
	}
	// Kahn's algorithm; among ready updates the earliest first appearance
	// goes first (a min-heap of indexes), which is the new leader's own
	// order where the logs have no opinion.
	out := make([]NilextRequest, 0, m)
	done := make([]bool, m)
	ready := &intHeap{}
	for i := 0; i < m; i++ {
		if indeg[i] == 0 {
			heap.Push(ready, i)
		}
	}
	for len(out) < m {
		pick := -1
		if ready.Len() > 0 {
			pick = heap.Pop(ready).(int)
		} else {
			var cyc []dkey
			for i := 0; i < m; i++ {
				if !done[i] {
					cyc = append(cyc, keys[i])
				}
			}
			if !breakCycles {
				return nil, fmt.Errorf("%w: %d of %d updates left unordered (%d logs, threshold %d): %v", ErrDLogCycle, len(cyc), m, v, t, cyc)
			}
			// Deliberately wrong (tests only): the paper-faithful "fixed
			// deterministic rule" — most logs first, then lowest (client, request).
			for i := 0; i < m; i++ {
				if done[i] {
					continue
				}
				if pick < 0 || keep[i].count > keep[pick].count ||
					(keep[i].count == keep[pick].count && (keys[i].client < keys[pick].client ||
						(keys[i].client == keys[pick].client && keys[i].req < keys[pick].req))) {
					pick = i
				}
			}
		}
		done[pick] = true
		out = append(out, keep[pick].req)
		for _, b := range adj[pick] {
			if indeg[b]--; indeg[b] == 0 && !done[b] {
				heap.Push(ready, b)
			}
		}
	}
	return out, nil
}

// ---- the client side ----

// NilextTracker is the client-side completion rule of one nilext update: it
// completes on NilextSupermajority(n) acks from distinct replicas in the same
// view, one of them the leader of that view. Pure: the Go client and the
// RESP coordinator feed it the acks they receive.
type NilextTracker struct {
	members []uint64
	need    int
	views   map[uint64]*viewAcks
}

type viewAcks struct {
	from   []bool
	count  int
	leader bool
}

// NewNilextTracker returns a tracker for a group with these members (in
// leader order, as Config.Members).
func NewNilextTracker(members []uint64) *NilextTracker {
	return &NilextTracker{members: members, need: NilextSupermajority(len(members)), views: map[uint64]*viewAcks{}}
}

// Need is how many acks complete an update.
func (t *NilextTracker) Need() int { return t.need }

// Add records an ack and reports whether the update is complete.
func (t *NilextTracker) Add(a NilextAck) bool {
	j := slices.Index(t.members, a.From)
	if j < 0 {
		return t.Done()
	}
	va := t.views[a.View]
	if va == nil {
		va = &viewAcks{from: make([]bool, len(t.members))}
		t.views[a.View] = va
	}
	if !va.from[j] {
		va.from[j] = true
		va.count++
	}
	// The leader of a view is fixed by the view; an ack's own claim is only
	// believed when it matches.
	if a.Leader && t.members[a.View%uint64(len(t.members))] == a.From {
		va.leader = true
	}
	return t.Done()
}

// Done reports whether some view has enough acks including its leader's.
func (t *NilextTracker) Done() bool {
	for _, va := range t.views {
		if va.leader && va.count >= t.need {
			return true
		}
	}
	return false
}

// Reset forgets every ack (a new update).
func (t *NilextTracker) Reset() { clear(t.views) }

type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
