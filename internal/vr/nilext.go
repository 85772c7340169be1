package vr

import (
	"errors"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
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
	return r.clients.Executed(client, req)
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
	if e.seq > r.synced && !(mutation.On && r.mut.ackBeforePersist) && !(mutation.On && r.mut.nilextAckEarly) {
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
