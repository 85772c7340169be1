package vr

import (
	"fmt"
	"math"
	"slices"
)

// State is what a replica starts from: nothing (a new group), or what its
// disk recovered.
type State struct {
	HardState HardState
	// Snapshot is the latest durable snapshot (nil: none, the log starts at 1).
	// The driver has already restored the application state from it.
	Snapshot *Snapshot
	// Entries follow the snapshot, contiguous.
	Entries []Entry
	// LostState says the disk may lack something this replica promised before
	// it stopped (acks before fsync, a replaced disk): the replica then runs
	// the VR recovery protocol and does not vote until it has recovered.
	LostState bool
	// Nonce identifies this start (drawn by the driver, fresh and random on
	// every start; the core has no randomness). Required with LostState and
	// with Config.FollowerReads: it seeds the prepare-ok sequence numbers
	// that keep read-lease acknowledgements of different lives apart.
	Nonce uint64
	// Bootstrap: this is the very first start of a new group (the driver
	// knows, e.g. from an explicit init step): every replica starts normal in
	// view 0. Any later start is a restart, even with an empty disk, and a
	// restarted leader never leads its old view again.
	Bootstrap bool
	// DLog is the nilext durability log the disk kept (Ready.DLog records,
	// in order); ignored with LostState.
	DLog []NilextRequest
	// DLogIntact says the disk holds every d-log record this replica
	// acknowledged before it stopped (the driver knows, e.g. from a clean
	// shutdown that synced everything). Without it a nilext replica that
	// was normal when it stopped may lack cad/async updates it acknowledged
	// from memory (a power cut): its d-log counts as stale in d-log recovery
	// until it is normal in a later view, and it starts that view change
	// once its lease promise allows (nilext.go, nxRestarted).
	DLogIntact bool
}

type batch struct {
	seq  uint64
	last uint64 // the log's last op when the batch was issued, lowered by later truncations
}

type deferred struct {
	seq uint64
	m   Message
}

type readReq struct {
	ctx uint64
	hb  uint64 // heartbeat that confirms leadership; 0 = not sent yet
	min uint64 // commit must reach this op first (nilext slow-path reads)
	// durWait: a durability wait (WaitReadable): the readable index must
	// reach readable (and the view's start op) first.
	durWait  bool
	readable uint64
	// noConfirm (AwaitReadable): released on R alone, no heartbeat round.
	noConfirm bool
}

// mutations are deliberate bugs the tests switch on to prove the simulator
// and checkers catch them. Never set outside tests.
type mutations struct {
	// noCommitForReads: a commit point that advances while a durability
	// wait needs followers' applied reports goes out only with the next
	// prepare or heartbeat (before cad.md §13; a speed switch, not a
	// safety mutation).
	noCommitForReads    bool
	ackBeforePersist    bool
	commitWithoutQuorum bool
	noLeaseCheck        bool
	skipClientTable     bool
	nilextBreakCycles   bool
	nilextAckEarly      bool
	// nilextCountStale: d-log recovery counts the d-logs of replicas that
	// restarted after a possible power cut (issue 24's bug).
	nilextCountStale bool
	// CAD (cad.go): a follower's lease timed from the grant's receipt; grants
	// not capped by the leader's lease; suspected members dropped without
	// waiting Removal; R advanced past members' applied ops; a follower
	// serving although it has not applied the R it learned.
	grantFromReceipt       bool
	grantBeyondLease       bool
	dropAtOnce             bool
	readableIgnoresMembers bool
	followerNoAppliedCheck bool
	// ... and a leader that joins another view while its grants may be valid,
	// and one that, restarted, helps form the next view at once although
	// grants it sent before the crash may still be valid.
	leaderVotesWhileGranting bool
	restartedLeaderVotes     bool
	// noPreVote: a replica that times out starts a view change at once, and
	// its start-view-change draws every peer after it (plain VR; what a
	// returning follower that had not heard its leader yet did to a healthy
	// group, issue 25 item 5).
	noPreVote bool
	// eventualUnbounded: every normal replica serves eventual reads, however
	// long it has been cut off (the rule before issue 24).
	eventualUnbounded bool
}

const hbRing = 256

// Replica is the VR core for one replica: a deterministic state machine.
// It is not safe for concurrent use; one driver goroutine owns it.
type Replica struct {
	cfg  Config
	hash uint64
	self int
	n, f int
	mut  mutations

	status Status
	view   uint64
	lnv    uint64
	log    []Entry // log[i].Op == first+i
	first  uint64
	commit uint64
	handed uint64 // last op handed out in Ready.Committed
	// applied: last op whose result came back through Advance.
	applied uint64

	// Persistence bookkeeping (see durable).
	seq     uint64
	synced  uint64
	durable uint64 // log[..durable] is fsynced
	batches []batch
	viewSeq uint64 // batch that wrote the current view to the hard state
	hsDirty bool
	lastHS  HardState
	defers  []deferred

	out        Ready
	lastHanded []Committed

	now          int64
	started      bool
	promiseUntil int64
	// pendingView: a higher view others asked for while this replica's lease
	// promise forbade joining; it joins once the promise runs out.
	pendingView uint64
	// vcHeld: restarted into a view change that it may not help form yet
	// (its start-view-change is neither counted nor sent) until the promise
	// it made before the crash, and forgot, has run out (heldVC).
	vcHeld bool
	// Pre-votes (preVote): when each peer last asked, and for which view,
	// whether others had lost their leader too; when this replica last asked.
	preVoteAt   []int64
	preVoteView []uint64
	lastPreVote int64

	// Leader state (valid while leader in normal status).
	acked   []uint64
	hbAcked []uint64
	ackAt   []int64
	hbSeq   uint64
	hbSent  [hbRing]struct {
		seq uint64
		at  int64
	}
	lastHB      int64
	hbNow       bool
	syncWanted  bool // WantSync: this Ready's leader messages carry the sync hint
	askSync     bool // AskSync: this Ready's prepare-ok asks the leader to sync
	viewStartOp uint64
	queue       []Request
	inflight    map[uint64]uint64
	reads       []readReq
	snapWanted  []bool
	// snapNext: no new snapshot for peer j is asked of the driver before
	// this time (the last one is presumably still on its way; a recovering
	// replica asks every heartbeat, and each capture is a scan of the state).
	snapNext []int64

	// Follower state.
	lastContact  int64
	lastGetState int64

	// View change state.
	vcStart int64
	lastSVC int64
	svc     []bool
	dvc     []*Message
	dvcSent *Message
	pulling int
	// vcAbandoned counts view changes this replica left unfinished since it
	// was last normal; each one doubles the view-change timeout (vcTimeout).
	vcAbandoned int
	lastDVC     int64

	// Recovery state.
	nonce        uint64
	recHave      uint64
	recResp      []*Message
	lastRecovery int64

	clients map[uint64]*ClientRecord
	// clientCap overrides MaxClients (tests); clientsEvicted counts drops.
	clientCap      int
	clientsEvicted uint64

	nx nilextState

	cad cadState

	ev evState
}

// New returns a replica. A replica with an empty State and view 0 is a member
// of a new group; otherwise it resumes from what its disk recovered.
func New(cfg Config, st State) (*Replica, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.FollowerReads && st.Nonce == 0 {
		// A zero nonce is what a driver that forgot it passes on every
		// start: grants echoing an earlier life's prepare-ok numbers could
		// then be timed from this life's sends (cad.go, cadState.init).
		return nil, fmt.Errorf("vr: follower reads need a non-zero start nonce (State.Nonce)")
	}
	r := &Replica{cfg: cfg, hash: cfg.Hash(), n: len(cfg.Members), pulling: -1,
		inflight: map[uint64]uint64{}, clients: map[uint64]*ClientRecord{}, clientCap: cfg.ClientCap}
	r.f = (r.n - 1) / 2
	r.self = slices.Index(cfg.Members, cfg.Self)
	r.acked = make([]uint64, r.n)
	r.hbAcked = make([]uint64, r.n)
	r.ackAt = make([]int64, r.n)
	r.snapWanted = make([]bool, r.n)
	r.snapNext = make([]int64, r.n)
	r.svc = make([]bool, r.n)
	r.dvc = make([]*Message, r.n)
	r.recResp = make([]*Message, r.n)
	r.preVoteAt = make([]int64, r.n)
	r.preVoteView = make([]uint64, r.n)
	r.cad.init(r.n, st.Nonce)
	r.first = 1
	if s := st.Snapshot; s != nil {
		r.first = s.Op + 1
		r.loadClients(s.Clients)
	}
	for i, e := range st.Entries {
		if e.Op != r.first+uint64(i) {
			return nil, fmt.Errorf("vr: recovered entry %d has op %d, want %d", i, e.Op, r.first+uint64(i))
		}
	}
	r.log = append([]Entry(nil), st.Entries...)
	r.applied = r.first - 1
	r.handed = r.applied
	r.durable = r.lastOp()
	hs := st.HardState
	r.view, r.lnv = hs.View, hs.LastNormalView
	r.lastHS = hs
	r.commit = max(r.applied, min(hs.Commit, r.lastOp()))
	if !st.LostState && cfg.Nilext {
		// Without the fast path a kept d-log is dropped, never revived: an
		// operator who restarts a group stuck on a d-log cycle without
		// --nilext gives those pending updates up (docs/operations.md).
		r.restoreDLog(st.DLog)
	}
	stale := r.nxRestarted(st)
	switch {
	case st.LostState:
		if st.Nonce == 0 {
			return nil, fmt.Errorf("vr: recovery needs a non-zero nonce")
		}
		r.status = Recovering
		r.nonce = st.Nonce
		r.recHave = r.commit
	case st.Bootstrap:
		if hs != (HardState{}) || st.Snapshot != nil || len(st.Entries) > 0 {
			return nil, fmt.Errorf("vr: bootstrap with existing state (view %d, %d entries)", hs.View, len(st.Entries))
		}
		r.status = Normal
	case r.view == r.lnv && cfg.LeaderOf(r.view) != cfg.Self:
		// A follower's log is a prefix of its view's leader's log, on disk as
		// in memory, so it can resume in that view and fill gaps by transfer.
		r.status = Normal
		if stale {
			// A nilext follower whose d-log may have lost acked updates
			// asks for the next view as if another replica had: it stops
			// renewing its lease promise and joins once that runs out
			// (nxRestarted).
			r.pendingView = r.view + 1
		}
	default:
		r.status = ViewChange
		if cfg.LeaderOf(r.view) == cfg.Self {
			// A restarted leader may have lost entries it had sent (unsynced
			// here, persisted by followers): leading the same view again
			// would give their op numbers to other requests (found by the
			// simulator, power-failure seed 282). It moves to the next view.
			r.view++
			r.hsDirty = true
		}
		if cfg.FollowerReads && len(cfg.Members) > 1 && cfg.LeaderOf(r.lnv) == cfg.Self {
			// It led its last normal view, so read grants it sent may still be
			// valid, and the promise that came with them (grantFor) was in
			// memory only: its start-view-change waits a lease period (see
			// heldVC). Only the leader grants; a follower of that view that
			// had moved on to a view change joined it once its own promise
			// had run out (Tick, onSVC), and resumes it at once.
			r.vcHeld = true
		} else {
			r.svc[r.self] = true
		}
	}
	return r, nil
}

// Config returns the configuration the replica runs with (defaults filled).
func (r *Replica) Config() Config { return r.cfg }

func (r *Replica) lastOp() uint64 { return r.first + uint64(len(r.log)) - 1 }

func (r *Replica) entry(op uint64) *Entry {
	if op < r.first || op > r.lastOp() {
		panic(fmt.Sprintf("vr: replica %d: entry %d outside log [%d,%d]", r.cfg.Self, op, r.first, r.lastOp()))
	}
	return &r.log[op-r.first]
}

func (r *Replica) isLeader() bool { return r.cfg.LeaderOf(r.view) == r.cfg.Self }

func (r *Replica) leaderIdx(v uint64) int { return int(v % uint64(r.n)) }

func (r *Replica) observe(now int64) {
	if now > r.now {
		r.now = now
	}
	if !r.started {
		r.started = true
		// Before the crash this replica may have acknowledged heartbeats; it
		// keeps those (forgotten) promises by not voting for a lease period.
		r.promiseUntil = now + int64(r.cfg.LeaseDuration)
		r.lastContact, r.vcStart, r.lastHB = now, now, now-int64(r.cfg.HeartbeatInterval)
		if r.status == Recovering {
			r.sendRecovery()
		}
	}
}

func (r *Replica) canVote() bool { return r.now >= r.promiseUntil }

// heldVC reports whether this replica, restarted in a view change it may
// not help form yet (vcHeld), must still stay out of it. A leader's read
// grants promise, in memory only, that it joins no other view while one may
// be valid (grantFor); a restart forgets that promise, and the restart
// promise (observe) stands in for it: a grant runs out within MarkOut and
// the leader's lease, both shorter than LeaseDuration. Until then the
// replica neither counts nor sends its own start-view-change (so it sends
// no do-view-change either); it still follows a view that others formed
// without it (follow, onStartView), which needed no help from it. Once the
// promise has run out it joins its view change as any replica would.
func (r *Replica) heldVC() bool {
	if !r.vcHeld {
		return false
	}
	if r.mut.restartedLeaderVotes {
		r.vcHeld, r.svc[r.self] = false, true
		return false
	}
	if !r.canVote() {
		return true
	}
	r.vcHeld = false
	r.svc[r.self] = true
	// A whole timeout for the view change it joins only now.
	r.vcStart, r.lastSVC = r.now, r.now
	r.broadcast(Message{Type: MsgStartViewChange, View: r.view}, false)
	r.checkSVC()
	return false
}

// maxVCBackoff caps the view-change timeout's doubling at 2^maxVCBackoff
// times Config.ViewChangeTimeout.
const maxVCBackoff = 4

// vcTimeout is how long this replica gives the view change it is in before
// it moves on to the next view. A view change ships whole logs (do-view-change,
// start-view); on a stalled box that can take longer than the configured
// timeout, and if every replica then abandons every view at the same pace the
// group cycles through views for ever (seen at load 20–40 with an 11k-entry
// tail: views 2150 → 2400+, no leader; TestViewChangeWithSlowLargeLogConverges).
// So each view change abandoned since the replica was last normal doubles the
// timeout (capped), until one is long enough to finish; seeing a normal view
// resets it. On top, a deterministic stagger by member index (up to half the
// current timeout; the core has no randomness) keeps replicas from timing out
// together and tearing down a view change that another one is finishing.
func (r *Replica) vcTimeout() int64 {
	t := int64(r.cfg.ViewChangeTimeout) << min(r.vcAbandoned, maxVCBackoff)
	return t + t*int64(r.self)/int64(2*r.n)
}

// ---- persistence ----

func (r *Replica) nextSeq() uint64 { return r.seq + 1 }

// appendEntries appends es to the log and to this Ready's disk writes. es is
// not modified afterwards by anyone (entries are immutable once created), so
// the write list may share it.
func (r *Replica) appendEntries(es []Entry) {
	if len(es) == 0 {
		return
	}
	for i, e := range es {
		if e.Op != r.lastOp()+1+uint64(i) {
			panic(fmt.Sprintf("vr: replica %d: append op %d after %d", r.cfg.Self, e.Op, r.lastOp()+uint64(i)))
		}
	}
	r.log = append(r.log, es...)
	if len(r.out.Entries) == 0 {
		r.out.Entries = es[:len(es):len(es)]
	} else {
		r.out.Entries = append(r.out.Entries, es...)
	}
}

// truncate discards entries after op. Committed entries are never discarded.
func (r *Replica) truncate(op uint64) {
	if op >= r.lastOp() {
		return
	}
	if op < r.commit {
		panic(fmt.Sprintf("vr: replica %d (view %d, %s): truncating to %d below commit %d", r.cfg.Self, r.view, r.status, op, r.commit))
	}
	r.log = r.log[: op+1-r.first : op+1-r.first]
	var kept []Entry // a new slice: the old one may be shared with messages
	for _, e := range r.out.Entries {
		if e.Op <= op {
			kept = append(kept, e)
		}
	}
	r.out.Entries = kept
	if !r.out.HasTruncate || op < r.out.Truncate {
		r.out.HasTruncate, r.out.Truncate = true, op
	}
	r.durable = min(r.durable, op)
	for i := range r.batches {
		r.batches[i].last = min(r.batches[i].last, op)
	}
}

func (r *Replica) installSnapshot(s *Snapshot) {
	if r.handed != r.applied {
		panic(fmt.Sprintf("vr: replica %d: snapshot while %d entries are being applied", r.cfg.Self, r.handed-r.applied))
	}
	// Outside normal status the entries after the snapshot stay: they may be
	// this replica's copy of ops that are committed (see follow).
	var keep []Entry
	if r.status == ViewChange && r.lastOp() > s.Op {
		keep = append(keep, r.log[s.Op+1-r.first:]...)
	}
	cp := *s
	r.out.Snapshot = &cp
	r.out.Entries, r.out.HasTruncate, r.out.Truncate = nil, false, 0
	r.log = nil
	r.first = s.Op + 1
	r.commit, r.handed, r.applied = s.Op, s.Op, s.Op
	r.durable = min(r.durable, s.Op)
	for i := range r.batches {
		r.batches[i].last = min(r.batches[i].last, s.Op)
	}
	r.loadClients(s.Clients)
	r.hsDirty = true
	r.appendEntries(keep)
}

func (r *Replica) loadClients(cs []ClientRecord) {
	r.clients = make(map[uint64]*ClientRecord, len(cs))
	for _, c := range cs {
		c := c
		r.clients[c.Client] = &c
	}
}

// Persisted reports that every disk write of batches up to seq is durable.
func (r *Replica) Persisted(seq uint64) {
	if seq > r.seq {
		panic(fmt.Sprintf("vr: replica %d: persisted %d, only %d issued", r.cfg.Self, seq, r.seq))
	}
	if seq <= r.synced {
		return
	}
	r.synced = seq
	i := 0
	for ; i < len(r.batches) && r.batches[i].seq <= seq; i++ {
		r.durable = max(r.durable, min(r.batches[i].last, r.lastOp()))
	}
	r.batches = r.batches[i:]
	r.releaseDeferred()
	if r.status == Normal && r.isLeader() {
		r.advanceCommit()
	} else {
		r.maybeAck(0, false)
	}
}

func (r *Replica) releaseDeferred() {
	n := 0
	for _, d := range r.defers {
		if d.seq <= r.synced {
			r.out.Messages = append(r.out.Messages, d.m)
		} else {
			r.defers[n] = d
			n++
		}
	}
	r.defers = r.defers[:n]
	r.nxRelease()
}

// ---- messages ----

func (r *Replica) stamp(m *Message, to uint64) {
	m.Cluster, m.Epoch, m.ConfigHash = r.cfg.Cluster, r.cfg.Epoch, r.hash
	m.From, m.To = r.cfg.Self, to
}

func (r *Replica) send(to uint64, m Message) {
	r.stamp(&m, to)
	r.out.Messages = append(r.out.Messages, m)
}

// sendAfterSync sends m once the batch now being built is durable.
func (r *Replica) sendAfterSync(to uint64, m Message) {
	r.stamp(&m, to)
	if r.mut.ackBeforePersist {
		r.out.Messages = append(r.out.Messages, m)
		return
	}
	r.defers = append(r.defers, deferred{seq: r.nextSeq(), m: m})
}

func (r *Replica) broadcast(m Message, afterSync bool) {
	for i, id := range r.cfg.Members {
		if i == r.self {
			continue
		}
		if afterSync {
			r.sendAfterSync(id, m)
		} else {
			r.send(id, m)
		}
	}
}

func (r *Replica) copyLog(from uint64, limit int) []Entry {
	if from < r.first {
		from = r.first
	}
	if from > r.lastOp() {
		return nil
	}
	es := r.log[from-r.first:]
	if limit > 0 {
		es = es[:min(len(es), limit)]
		es = es[:batchLen(es, 4*r.cfg.MaxBatchBytes)]
	}
	return append([]Entry(nil), es...)
}

// batchLen is how many of es, at least one, fit in maxBytes of request data.
func batchLen(es []Entry, maxBytes int) int {
	n, size := 0, 0
	for n < len(es) {
		size += len(es[n].Data)
		if n > 0 && size > maxBytes {
			break
		}
		n++
	}
	return n
}

// identity returns why m does not belong to this group ("" if it does).
func (r *Replica) identity(m *Message) string {
	switch {
	case m.Cluster != r.cfg.Cluster:
		return fmt.Sprintf("cluster %d, ours is %d", m.Cluster, r.cfg.Cluster)
	case m.Epoch != r.cfg.Epoch:
		return fmt.Sprintf("config epoch %d, ours is %d (stale configuration on one side)", m.Epoch, r.cfg.Epoch)
	case m.ConfigHash != r.hash:
		return fmt.Sprintf("member list or lease timing differs (hash %x, ours %x for %s): every member needs the same members, lease, max drift and mark-out",
			m.ConfigHash, r.hash, r.cfg.Identity())
	case !slices.Contains(r.cfg.Members, m.From):
		return fmt.Sprintf("sender %d is not a member of %v", m.From, r.cfg.Members)
	case m.To != r.cfg.Self:
		return fmt.Sprintf("message for replica %d reached replica %d", m.To, r.cfg.Self)
	case m.From == r.cfg.Self:
		return "message from ourselves"
	case !m.Type.Valid():
		return fmt.Sprintf("unknown message type %d", m.Type)
	}
	return ""
}

// Step processes one peer message received at local time now.
func (r *Replica) Step(now int64, m Message) {
	r.observe(now)
	if m.Type == MsgRefuse {
		r.out.Errors = append(r.out.Errors, &RefusedError{By: m.From, Reason: m.Reason})
		return
	}
	if why := r.identity(&m); why != "" {
		r.out.Errors = append(r.out.Errors, &ConfigError{From: m.From, Reason: why})
		reply := Message{Type: MsgRefuse, Reason: why}
		r.stamp(&reply, m.From)
		r.out.Messages = append(r.out.Messages, reply)
		return
	}
	j := slices.Index(r.cfg.Members, m.From)
	switch m.Type {
	case MsgPrepare:
		r.onPrepare(j, &m)
	case MsgPrepareOK:
		r.onPrepareOK(j, &m)
	case MsgCommit:
		r.onCommit(j, &m)
	case MsgStartViewChange:
		r.onSVC(j, &m)
	case MsgDoViewChange:
		r.onDVC(j, &m)
	case MsgStartView:
		r.onStartView(j, &m)
	case MsgRecovery:
		r.onRecovery(j, &m)
	case MsgRecoveryResponse:
		r.onRecoveryResponse(j, &m)
	case MsgGetState:
		r.onGetState(j, &m)
	case MsgNewState:
		r.onNewState(j, &m)
	}
	r.checkInvariants()
}

// Tick advances timers to local time now.
func (r *Replica) Tick(now int64) {
	r.observe(now)
	hb := int64(r.cfg.HeartbeatInterval)
	if r.pendingView > r.view && r.status != Recovering && r.canVote() {
		r.startViewChange(r.pendingView)
	}
	switch r.status {
	case Normal:
		if r.isLeader() {
			if r.now-r.lastHB >= hb {
				r.hbNow = true
			}
			r.nxTick()
			r.updateMembers()
		} else if r.suspects() {
			r.preVote()
		}
	case ViewChange:
		if r.heldVC() {
			break
		}
		if r.suspects() {
			r.preVote()
		}
		if r.status == ViewChange && r.now-r.lastSVC >= hb {
			r.lastSVC = r.now
			r.broadcast(Message{Type: MsgStartViewChange, View: r.view}, false)
			// The do-view-change carries the log: resending it every
			// heartbeat would bury a slow new leader under copies of it
			// (and each copy reaching a leader already normal draws a
			// start-view with the whole log again).
			if r.dvcSent != nil && r.cfg.LeaderOf(r.view) != r.cfg.Self && r.now-r.lastDVC >= max(hb, r.vcTimeout()/4) {
				r.lastDVC = r.now
				r.sendAfterSync(r.cfg.LeaderOf(r.view), *r.dvcSent)
			}
			if r.pulling >= 0 {
				r.send(r.cfg.Members[r.pulling], Message{Type: MsgGetState, View: r.view, Op: r.commit})
			}
		}
	case Recovering:
		if r.now-r.lastRecovery >= hb {
			r.sendRecovery()
		}
	}
	r.checkInvariants()
}

// ---- normal operation ----

// Propose submits a client request at the leader. Duplicates of executed
// requests are answered from the client table (Ready.Replies); duplicates of
// requests in flight are dropped (the reply comes when they are applied).
func (r *Replica) Propose(now int64, req Request) error {
	r.observe(now)
	if r.status != Normal {
		return ErrNotNormal
	}
	if !r.isLeader() {
		return ErrNotLeader
	}
	r.nxBeforePropose(req)
	if req.Client != 0 && !r.mut.skipClientTable {
		if c := r.clients[req.Client]; c != nil {
			if req.ReqNum < c.ReqNum {
				return fmt.Errorf("%w: client %d request %d, table has %d", ErrStaleRequest, req.Client, req.ReqNum, c.ReqNum)
			}
			if req.ReqNum == c.ReqNum {
				r.out.Replies = append(r.out.Replies, Reply{Client: req.Client, ReqNum: req.ReqNum, Op: c.Op, Result: c.Result})
				return nil
			}
		}
		if r.inflight[req.Client] >= req.ReqNum {
			return nil
		}
	}
	if int(r.lastOp()-r.commit)+len(r.queue) >= r.cfg.MaxInflight {
		return ErrBusy
	}
	r.queue = append(r.queue, req)
	if req.Client != 0 {
		r.inflight[req.Client] = req.ReqNum
	}
	return nil
}

// flush turns queued proposals into one batch of entries: one disk write,
// one prepare per follower.
func (r *Replica) flush() {
	if len(r.queue) == 0 || r.status != Normal || !r.isLeader() {
		return
	}
	room := r.cfg.MaxInflight - int(r.lastOp()-r.commit)
	k := min(room, len(r.queue))
	if k <= 0 {
		return
	}
	start := r.lastOp() + 1
	es := make([]Entry, k)
	for i := range es {
		es[i] = Entry{View: r.view, Op: start + uint64(i), Request: r.queue[i]}
	}
	r.queue = r.queue[k:]
	if len(r.queue) == 0 {
		r.queue = nil
	}
	r.appendEntries(es)
	for off := 0; off < len(es); {
		chunk := es[off:min(off+r.cfg.MaxBatch, len(es))]
		chunk = chunk[:batchLen(chunk, r.cfg.MaxBatchBytes)]
		off += len(chunk)
		r.sendLeader(Message{Type: MsgPrepare, View: r.view, Op: chunk[len(chunk)-1].Op,
			Commit: r.commit, First: chunk[0].Op, Entries: chunk})
	}
	r.cadOrdered(es)
	if r.mut.commitWithoutQuorum {
		r.setCommit(r.lastOp())
	}
}

func (r *Replica) setCommit(c uint64) {
	if c > r.lastOp() {
		panic(fmt.Sprintf("vr: replica %d: commit %d beyond last op %d", r.cfg.Self, c, r.lastOp()))
	}
	if c > r.commit {
		r.commit = c
	}
}

// follow handles a message from the leader of view v. A replica that is not
// normal in v yet (it missed the start-view, or is behind by views) joins
// the view the VR way: it enters the view change for v and sends its
// do-view-change, which a leader already running v answers with the
// start-view. It keeps its whole log meanwhile: truncating to the commit
// point here could drop an op this replica's copy made committed, which a
// later view change would then lose (found by the simulator: seed 3364).
func (r *Replica) follow(j int, v uint64) bool {
	if r.status == Recovering || v < r.view || j != r.leaderIdx(v) {
		return false
	}
	if v == r.view && r.status == Normal {
		return true
	}
	// The leader of v sends prepares and commits only once v has formed:
	// joining it helps form nothing, whatever a restart promised (heldVC).
	r.vcHeld = false
	if v == r.view && (r.dvcSent != nil || r.pulling >= 0) {
		return false // already asked; the tick resends
	}
	if v > r.view || r.status != ViewChange {
		r.stepDown()
		r.setView(v)
		r.status = ViewChange
		r.vcStart, r.lastSVC = r.now, r.now
		r.hsDirty = true
	}
	r.sendDVC()
	return false
}

func (r *Replica) setView(v uint64) {
	if v < r.view {
		panic(fmt.Sprintf("vr: replica %d: view going back from %d to %d", r.cfg.Self, r.view, v))
	}
	r.view = v
}

// Heard tells a follower that bytes from peer `from` are arriving without a
// whole message yet (the transport's progress): a large message, such as a
// snapshot, is on its way from the leader, and the leader's heartbeats queued
// behind it on the same stream would otherwise arrive too late to keep this
// follower from starting a view change. Only the view-change timer hears it;
// leases and acknowledgements still need messages.
func (r *Replica) Heard(now int64, from uint64) {
	r.observe(now)
	j := slices.Index(r.cfg.Members, from)
	if r.status == Normal && !r.isLeader() && j == r.leaderIdx(r.view) {
		r.lastContact = r.now
	}
}

func (r *Replica) onPrepare(j int, m *Message) {
	if !r.follow(j, m.View) {
		return
	}
	r.lastContact = r.now
	r.appendFrom(j, m)
	r.learn(m)
	r.maybeAck(0, false)
}

// appendFrom appends the entries of m this replica lacks; a gap triggers
// state transfer. The log is a prefix of the leader's, so overlapping entries
// are the same ones.
func (r *Replica) appendFrom(j int, m *Message) {
	if len(m.Entries) > 0 && m.First > r.lastOp()+1 {
		r.requestState(j, false)
	} else {
		k := 0
		for ; k < len(m.Entries) && m.Entries[k].Op <= r.lastOp(); k++ {
			e := &m.Entries[k]
			if e.Op >= r.first && r.entry(e.Op).View != e.View {
				panic(fmt.Sprintf("vr: replica %d (view %d): leader %d's entry %d is from view %d, ours from view %d",
					r.cfg.Self, r.view, r.cfg.Members[j], e.Op, e.View, r.entry(e.Op).View))
			}
		}
		r.appendEntries(m.Entries[k:])
	}
	if c := min(m.Commit, r.lastOp()); c > r.commit {
		r.setCommit(c)
	}
}

func (r *Replica) requestState(j int, force bool) {
	if !force && r.now-r.lastGetState < int64(r.cfg.HeartbeatInterval) {
		return
	}
	r.lastGetState = r.now
	r.send(r.cfg.Members[j], Message{Type: MsgGetState, View: r.view, Op: r.lastOp()})
}

func (r *Replica) onCommit(j int, m *Message) {
	if !r.follow(j, m.View) {
		return
	}
	r.lastContact = r.now
	if m.Op > r.lastOp() {
		r.requestState(j, false)
	}
	if c := min(m.Commit, r.lastOp()); c > r.commit {
		r.setCommit(c)
	}
	r.learn(m)
	hb := m.HBSeq
	if r.pendingView > r.view {
		// Another replica wants a new view: let the promise run out (and the
		// leader's lease with it) so this replica can join, as plain VR would.
		hb = 0
	} else if r.cfg.LeaseDuration > 0 {
		r.promiseUntil = max(r.promiseUntil, r.now+int64(r.cfg.LeaseDuration))
	}
	r.maybeAck(hb, true)
}

func (r *Replica) onPrepareOK(j int, m *Message) {
	if r.status != Normal || m.View != r.view || !r.isLeader() {
		return
	}
	// Only the persisted prefix counts toward the commit point: entries
	// merely received (m.Op) count for early acks, and a crash may take them.
	if m.Persisted > r.acked[j] {
		r.acked[j] = min(m.Persisted, r.lastOp())
	}
	if m.HBSeq > r.hbAcked[j] {
		r.hbAcked[j] = m.HBSeq
		r.ackAt[j] = r.hbSentAt(m.HBSeq)
	}
	r.onPeerAck(j, m)
	r.advanceCommit()
}

func (r *Replica) hbSentAt(seq uint64) int64 {
	s := r.hbSent[seq%hbRing]
	if s.seq != seq {
		return 0
	}
	return s.at
}

// advanceCommit commits the highest op that f+1 replicas (the leader
// included) have persisted in this view.
func (r *Replica) advanceCommit() {
	if r.status != Normal || !r.isLeader() {
		return
	}
	vals := make([]uint64, r.n)
	copy(vals, r.acked)
	vals[r.self] = r.durable
	if r.mut.ackBeforePersist {
		vals[r.self] = r.lastOp()
	}
	slices.Sort(vals)
	if c := vals[r.n-1-r.f]; c > r.commit {
		r.setCommit(c)
		r.advanceAcked()
		r.commitNowForReads()
	}
	r.updateMembers()
}

// commitNowForReads sends the new commit point at once, instead of with the
// next prepare or heartbeat, while a durability wait is not covered by R and
// R needs the followers' applied reports (follower reads): they learn the
// commit point only from the leader, and with every client of a connection
// waiting behind the read no prepare may come before the next tick. Measured
// (YCSB A, cad, 64 clients on one connection, follower reads): a 10 ms
// heartbeat paced R, 4.1k ops/s (docs/design/cad.md §13).
func (r *Replica) commitNowForReads() {
	if !r.cfg.FollowerReads || r.mut.noCommitForReads {
		return
	}
	R := r.cad.readable
	for i := range r.reads {
		if q := &r.reads[i]; q.durWait && q.readable > R {
			r.hbNow = true
			return
		}
	}
}

func (r *Replica) heartbeat() {
	r.hbSeq++
	r.hbSent[r.hbSeq%hbRing] = struct {
		seq uint64
		at  int64
	}{r.hbSeq, r.now}
	r.lastHB = r.now
	r.hbNow = false
	for i := range r.reads {
		if r.reads[i].hb == 0 {
			r.reads[i].hb = r.hbSeq
		}
	}
	r.sendLeader(Message{Type: MsgCommit, View: r.view, Commit: r.commit, Op: r.lastOp(), HBSeq: r.hbSeq})
	if r.n == 1 {
		r.checkReads()
	}
}

// ---- reads ----

// ReadIndex registers a linearizable read: Ready.ReadStates will carry ctx
// with the op the state machine must have applied before the read is served,
// once a heartbeat round sent after this call has confirmed this replica is
// still the leader (or an error if it lost leadership meanwhile).
func (r *Replica) ReadIndex(now int64, ctx uint64) error {
	r.observe(now)
	if r.status != Normal || !r.isLeader() {
		return ErrNotLeader
	}
	r.reads = append(r.reads, readReq{ctx: ctx})
	r.hbNow = true
	return nil
}

func (r *Replica) checkReads() {
	if len(r.reads) == 0 || r.commit < r.viewStartOp {
		return
	}
	// confirmed: the highest heartbeat acked by f followers.
	acks := make([]uint64, 0, r.n)
	for i, a := range r.hbAcked {
		if i != r.self {
			acks = append(acks, a)
		}
	}
	slices.Sort(acks)
	var confirmed uint64
	if r.f == 0 {
		confirmed = r.hbSeq
	} else {
		confirmed = acks[len(acks)-r.f]
	}
	n := 0
	for _, rd := range r.reads {
		if (rd.noConfirm || rd.hb != 0 && rd.hb <= confirmed) && r.commit >= rd.min &&
			(!rd.durWait || r.cad.readable >= max(rd.readable, r.viewStartOp)) {
			r.out.ReadStates = append(r.out.ReadStates, ReadState{Ctx: rd.ctx, Index: r.commit})
		} else {
			r.reads[n] = rd
			n++
		}
	}
	r.reads = r.reads[:n]
}

// LeaseRead returns the op a linearizable read at local time now must wait
// for (applied >= index) if this leader holds a lease, or ErrNoLease /
// ErrNotLeader.
//
// Timing rule: the lease starts when the leader *sent* the latest heartbeat
// that f followers acknowledged and lasts Config.LeaderLease() on the
// leader's clock. A follower acknowledging a heartbeat promises not to join
// another view for LeaseDuration on its own clock; with every clock's rate
// within 1±MaxDrift, the leader's lease ends (in real time) before any such
// promise does, and no new view can form without one of those followers.
// A new leader also waits until it has committed the ops it inherited.
func (r *Replica) LeaseRead(now int64) (uint64, error) {
	r.observe(now)
	if r.status != Normal || !r.isLeader() {
		return 0, ErrNotLeader
	}
	if r.mut.noLeaseCheck {
		return r.commit, nil
	}
	if r.cfg.LeaseDuration == 0 || r.commit < r.viewStartOp {
		return 0, ErrNoLease
	}
	if r.n > 1 {
		at := make([]int64, 0, r.n)
		for i, a := range r.ackAt {
			if i != r.self {
				at = append(at, a)
			}
		}
		slices.Sort(at)
		start := at[len(at)-r.f]
		if start == 0 || r.now >= start+int64(r.cfg.LeaderLease()) {
			return 0, ErrNoLease
		}
	}
	return r.commit, nil
}

// LeaseUntil is LeaseRead for readers outside the driver: the local time
// until which this leader's current lease lasts, and the op a read must find
// applied (the commit index now). ok is false when LeaseRead would fail now
// for any reason but time. A driver publishes it after every step and before
// it sends anything a step produced (vrshard's local lease reads): a read
// that loaded it before the driver learned of a new view began before this
// replica could help form one, and one made after its end fails; in between,
// the followers' promises (LeaseRead) keep any other view from forming.
func (r *Replica) LeaseUntil() (until int64, commit uint64, ok bool) {
	if r.status != Normal || !r.isLeader() {
		return 0, 0, false
	}
	if r.mut.noLeaseCheck {
		return math.MaxInt64, r.commit, true
	}
	end := r.leaseEnd()
	if end == 0 {
		return 0, 0, false
	}
	return end, r.commit, true
}

// ---- view change ----

// stepDown drops leader-only state when this replica leaves its view.
func (r *Replica) stepDown() {
	for _, rd := range r.reads {
		r.out.ReadStates = append(r.out.ReadStates, ReadState{Ctx: rd.ctx, Err: ErrNotLeader})
	}
	r.reads = nil
	r.queue = nil
	clear(r.inflight)
	r.nxStepDown()
	r.cadReset()
	for i := range r.acked {
		r.acked[i], r.hbAcked[i], r.ackAt[i] = 0, 0, 0
		r.snapWanted[i] = false
		r.snapNext[i] = 0
		r.svc[i] = false
		r.dvc[i] = nil
	}
	r.dvcSent = nil
	r.pulling = -1
	r.vcHeld = false // leaving the view it restarted in: nothing to hold
}

func (r *Replica) startViewChange(v uint64) {
	if v <= r.view && r.status != Normal {
		panic(fmt.Sprintf("vr: replica %d: view change to %d from view %d (%s)", r.cfg.Self, v, r.view, r.status))
	}
	if r.status == ViewChange {
		r.vcAbandoned++
	}
	r.stepDown()
	r.setView(v)
	r.status = ViewChange
	r.svc[r.self] = true
	r.vcStart, r.lastSVC = r.now, r.now
	r.hsDirty = true
	r.broadcast(Message{Type: MsgStartViewChange, View: v}, false)
	r.checkSVC()
}

func (r *Replica) onSVC(j int, m *Message) {
	if r.status == Recovering {
		return
	}
	if m.Op == preVoteMark {
		r.onPreVote(j, m)
		return
	}
	if m.View > r.view {
		if !r.canVote() {
			r.pendingView = max(r.pendingView, m.View)
			return
		}
		r.startViewChange(m.View)
	}
	if m.View == r.view && r.status == ViewChange {
		r.svc[j] = true
		r.checkSVC()
	}
}

// preVoteMark in a start-view-change's Op marks a pre-vote (preVote).
const preVoteMark = 1

// suspects reports whether this replica has lost its leader — a normal
// follower that has not heard from it for the view-change timeout, or a
// replica whose view change has run longer than vcTimeout — and may vote.
func (r *Replica) suspects() bool {
	if !r.canVote() {
		return false
	}
	switch r.status {
	case Normal:
		return !r.isLeader() && r.now-r.lastContact >= int64(r.cfg.ViewChangeTimeout)
	case ViewChange:
		return !r.vcHeld && r.now-r.vcStart >= r.vcTimeout()
	}
	return false
}

// preVote is what a replica that suspects (suspects) does instead of
// starting a view change on its own: it asks every peer, with a
// start-view-change marked as a pre-vote, whether they have lost the leader
// too, and moves to the next view only once f+1 replicas (itself included)
// suspect (tryPreVotes). A replica that still hears its leader — the leader
// included — ignores the question (onPreVote), so a replica that merely did
// not hear the leader for a while (restarted before the leader's link to it
// came back, behind a one-way cut) never disturbs a view that a majority
// runs (Raft's pre-vote; issue 25 item 5). Plain VR moved to the next view
// at once, and its start-view-change drew every peer after its lease
// promise: a returning follower deposed a healthy leader. A view change
// that stalls moves on the same way, so a replica in an abandoned view
// change draws nobody either.
func (r *Replica) preVote() {
	if r.mut.noPreVote {
		r.startViewChange(r.view + 1)
		return
	}
	if r.now-r.lastPreVote >= int64(r.cfg.HeartbeatInterval) {
		r.lastPreVote = r.now
		r.broadcast(Message{Type: MsgStartViewChange, View: r.view + 1, Op: preVoteMark}, false)
	}
	r.tryPreVotes()
}

// onPreVote records a peer's pre-vote. One for the view this replica's view
// change is for counts as that peer's start-view-change: the sender has
// lost its leader, and only the do-view-changes that follow decide a view.
func (r *Replica) onPreVote(j int, m *Message) {
	if m.View <= r.view {
		if m.View == r.view && r.status == ViewChange {
			r.svc[j] = true
			r.checkSVC()
		}
		return
	}
	r.preVoteAt[j], r.preVoteView[j] = r.now, m.View
	r.tryPreVotes()
}

// tryPreVotes starts a view change once this replica and f peers that
// pre-voted recently (within a view-change timeout: a suspecting replica
// asks again every heartbeat) suspect their leader. It moves to the highest
// view asked for: a peer asking for a later view is normal in, or changing
// to, a view after ours.
func (r *Replica) tryPreVotes() {
	if !r.suspects() {
		return
	}
	cnt, top := 1, r.view+1
	for j, at := range r.preVoteAt {
		if j != r.self && at != 0 && r.now-at < int64(r.cfg.ViewChangeTimeout) && r.preVoteView[j] > r.view {
			cnt++
			top = max(top, r.preVoteView[j])
		}
	}
	if cnt >= r.f+1 {
		r.startViewChange(top)
	}
}

func (r *Replica) checkSVC() {
	if r.status != ViewChange || r.dvcSent != nil || r.heldVC() {
		return
	}
	cnt := 0
	for _, ok := range r.svc {
		if ok {
			cnt++
		}
	}
	if cnt < r.f+1 {
		return
	}
	r.sendDVC()
}

// sendDVC sends (or, at the new leader, records) this replica's
// do-view-change for the current view, built from its log as it is now.
func (r *Replica) sendDVC() {
	m := Message{Type: MsgDoViewChange, View: r.view, LastNormalView: r.lnv, Op: r.lastOp(),
		Commit: r.commit, First: r.first, Entries: r.copyLog(r.first, 0), DLog: r.DLog(), DLogStale: r.nxStale()}
	r.stamp(&m, r.cfg.LeaderOf(r.view))
	r.dvcSent = &m
	if r.cfg.LeaderOf(r.view) == r.cfg.Self {
		r.dvc[r.self] = &m
		r.tryStartView()
		return
	}
	// The do-view-change promises the view: it waits until the view is durable.
	r.lastDVC = r.now
	r.sendAfterSync(r.cfg.LeaderOf(r.view), m)
}

func (r *Replica) onDVC(j int, m *Message) {
	if r.status == Recovering || r.cfg.LeaderOf(m.View) != r.cfg.Self {
		return
	}
	if m.View > r.view {
		if !r.canVote() {
			r.pendingView = max(r.pendingView, m.View)
			return
		}
		r.startViewChange(m.View)
	}
	if m.View != r.view {
		return
	}
	switch r.status {
	case ViewChange:
		r.dvc[j] = m
		r.tryStartView()
	case Normal:
		// The sender missed the start-view.
		r.sendStartView(r.cfg.Members[j], false)
	}
}

// tryStartView starts the view once f+1 do-view-changes (its own included)
// are in: it takes the log with the highest last-normal view, then the
// highest op, and the highest commit.
func (r *Replica) tryStartView() {
	if r.status != ViewChange || r.dvc[r.self] == nil || r.pulling >= 0 {
		return
	}
	best, cnt := -1, 0
	var commit uint64
	for i, d := range r.dvc {
		if d == nil {
			continue
		}
		cnt++
		commit = max(commit, d.Commit)
		if best < 0 || d.LastNormalView > r.dvc[best].LastNormalView ||
			(d.LastNormalView == r.dvc[best].LastNormalView && d.Op > r.dvc[best].Op) {
			best = i
		}
	}
	if cnt < r.f+1 {
		return
	}
	// The nilext d-log is rebuilt against the consensus log chosen below; a
	// cycle among the d-logs waits for more do-view-changes (nilext.go).
	chosenFirst, chosen := r.lastOp()+1, []Entry(nil)
	if best != r.self {
		chosenFirst, chosen = r.dvc[best].First, r.dvc[best].Entries
	}
	recovered, ok := r.nxRecover(chosenFirst, chosen)
	if !ok {
		return
	}
	if best != r.self {
		d := r.dvc[best]
		trusted := r.commit
		if r.lnv == d.LastNormalView {
			trusted = r.lastOp()
		}
		if d.First > trusted+1 {
			// The chosen log starts after what we can vouch for: fetch the
			// chosen replica's snapshot first.
			r.pulling = best
			r.send(r.cfg.Members[best], Message{Type: MsgGetState, View: r.view, Op: r.commit})
			return
		}
		r.adoptLog(d.First, d.Entries)
	}
	r.nxStartView(recovered)
	r.status, r.lnv = Normal, r.view
	r.vcAbandoned = 0
	r.hsDirty = true
	if c := min(commit, r.lastOp()); c > r.commit {
		r.setCommit(c)
	}
	r.viewStartOp = r.lastOp()
	r.lastHB = r.now - int64(r.cfg.HeartbeatInterval)
	for i := range r.dvc {
		r.dvc[i] = nil
	}
	r.dvcSent = nil
	// Requests still uncommitted will be answered when they commit; retries
	// of them must not be ordered twice.
	for op := r.commit + 1; op <= r.lastOp(); op++ {
		if e := r.entry(op); e.Client != 0 {
			r.inflight[e.Client] = max(r.inflight[e.Client], e.ReqNum)
		}
	}
	for i, id := range r.cfg.Members {
		if i != r.self {
			r.sendStartView(id, true)
		}
	}
	r.advanceCommit()
}

func (r *Replica) sendStartView(to uint64, afterSync bool) {
	m := Message{Type: MsgStartView, View: r.view, Op: r.lastOp(), Commit: r.commit, First: r.first, Entries: r.copyLog(r.first, 0)}
	if afterSync {
		r.sendAfterSync(to, m)
	} else {
		r.send(to, m)
	}
}

// adoptLog replaces the log from op `first` on by es (es[0].Op == first),
// keeping the common part so that only the divergent suffix is rewritten.
func (r *Replica) adoptLog(first uint64, es []Entry) {
	if first < r.first {
		skip := r.first - first
		if skip > uint64(len(es)) {
			panic(fmt.Sprintf("vr: replica %d: adopted log ends at %d before our snapshot %d", r.cfg.Self, first+uint64(len(es))-1, r.first-1))
		}
		es, first = es[skip:], r.first
	}
	if first > r.lastOp()+1 {
		panic(fmt.Sprintf("vr: replica %d: adopted log starts at %d after our last op %d", r.cfg.Self, first, r.lastOp()))
	}
	div := first
	for _, e := range es {
		if e.Op > r.lastOp() || r.entry(e.Op).View != e.View {
			break
		}
		div++
	}
	last := first + uint64(len(es)) - 1
	r.truncate(div - 1)
	if last < r.lastOp() {
		r.truncate(last)
	}
	r.appendEntries(es[div-first:])
}

func (r *Replica) onStartView(j int, m *Message) {
	if r.status == Recovering || m.View < r.view || j != r.leaderIdx(m.View) {
		return
	}
	if m.View == r.view && r.status == Normal {
		return
	}
	if m.View == r.view && m.Op < r.commit {
		// A start-view overtaken by a snapshot we installed meanwhile (the
		// leader's log only grows within a view): wait for the fresh one.
		return
	}
	r.stepDown()
	r.setView(m.View)
	r.hsDirty = true
	r.lastContact = r.now
	if m.First > r.commit+1 {
		// The leader's log starts after our committed prefix: fetch its
		// snapshot first, keeping our log (and staying out of the view)
		// until the start-view can be adopted; the tick asks again.
		r.status = ViewChange
		r.vcStart, r.lastSVC = r.now, r.now
		r.pulling = j
		r.send(r.cfg.Members[j], Message{Type: MsgGetState, View: r.view, Op: r.commit})
		return
	}
	r.status, r.lnv = Normal, m.View
	r.vcAbandoned = 0
	r.nxEnterView()
	r.adoptLog(m.First, m.Entries)
	if c := min(m.Commit, r.lastOp()); c > r.commit {
		r.setCommit(c)
	}
	r.maybeAck(0, false)
}

// ---- state transfer ----

func (r *Replica) onGetState(j int, m *Message) {
	leaderServing := r.status == Normal && r.isLeader() && m.View == r.view
	pulled := r.status == ViewChange && m.View == r.view && r.dvcSent != nil && j == r.leaderIdx(r.view)
	if !leaderServing && !pulled {
		return
	}
	if m.Op+1 < r.first {
		r.wantSnapshot(j)
		return
	}
	r.send(r.cfg.Members[j], Message{Type: MsgNewState, View: r.view, Op: r.lastOp(), Commit: r.commit,
		First: m.Op + 1, Entries: r.copyLog(m.Op+1, 4*r.cfg.MaxBatch)})
}

// snapshotRate is the transfer rate a snapshot's resend interval assumes.
const snapshotRate = 64 << 20 // bytes per second

// wantSnapshot asks the driver for a snapshot for peer j, unless one is
// asked for already or the last one may still be on its way.
func (r *Replica) wantSnapshot(j int) {
	if r.snapWanted[j] || r.now < r.snapNext[j] {
		return
	}
	r.snapWanted[j] = true
	r.out.SnapshotNeeded = append(r.out.SnapshotNeeded, r.cfg.Members[j])
}

// SendSnapshot answers a SnapshotNeeded for peer `to` with s, the state
// machine at s.Op (at most the applied op, at least the log's first op - 1).
func (r *Replica) SendSnapshot(to uint64, s Snapshot) error {
	j := slices.Index(r.cfg.Members, to)
	if j < 0 {
		return fmt.Errorf("vr: snapshot for unknown replica %d", to)
	}
	if !r.snapWanted[j] {
		// Not asked for, or no longer: a view change since (stepDown)
		// ended the request. A capture that finished late must not hold
		// the peer's link with a state it will ignore.
		return fmt.Errorf("vr: no snapshot wanted for replica %d", to)
	}
	if s.Op+1 < r.first || s.Op > r.applied {
		r.snapWanted[j] = false // asked for again on the peer's next request
		return fmt.Errorf("vr: snapshot at op %d outside [%d, %d]", s.Op, r.first-1, r.applied)
	}
	r.snapWanted[j] = false
	// Another one only after the view-change timeout, or the time this one
	// takes at snapshotRate if longer: a state of gigabytes must not be
	// scanned and queued again every heartbeat while the first is in flight.
	size := int64(len(s.Data))
	for _, c := range s.Clients {
		size += int64(len(c.Result)) + 24
	}
	transfer := size / (snapshotRate / 1000) * 1e6 // ns, in whole milliseconds (no overflow)
	r.snapNext[j] = r.now + max(int64(r.cfg.ViewChangeTimeout), transfer)
	r.send(to, Message{Type: MsgNewState, View: r.view, Op: r.lastOp(), Commit: r.commit, First: s.Op + 1,
		Entries: r.copyLog(s.Op+1, 4*r.cfg.MaxBatch), Snapshot: &s})
	return nil
}

func (r *Replica) onNewState(j int, m *Message) {
	switch {
	case r.status == Recovering:
		// Only a snapshot is trustworthy before recovery ends: it is
		// committed state, whatever view sent it.
		if s := m.Snapshot; s != nil && s.Op > r.recHave {
			r.installSnapshot(s)
			r.recHave = s.Op
		}
	case r.status == ViewChange && m.View == r.view && j == r.pulling:
		if s := m.Snapshot; s != nil && s.Op > r.commit {
			r.installSnapshot(s)
		}
		r.pulling = -1
		if r.isLeader() {
			r.tryStartView()
		} else {
			r.sendDVC() // ask the leader for the start-view again
		}
	case r.status == Normal && m.View == r.view && j == r.leaderIdx(r.view) && !r.isLeader():
		r.lastContact = r.now
		if s := m.Snapshot; s != nil && s.Op > r.lastOp() {
			r.installSnapshot(s)
		}
		r.appendFrom(j, m)
		r.maybeAck(0, false)
	}
}

// CompactPoint is where Compact should cut to keep at most keepEntries
// entries up to op and, of those, only as many as hold keepBytes of request
// data (at least one): 0 if nothing is to be dropped. A tail counted in
// entries alone held 1,024 entries whatever their size (16 GiB of 16 MiB
// values in memory, carried whole by every view change and recovery).
func (r *Replica) CompactPoint(op, keepEntries uint64, keepBytes int) uint64 {
	if op < r.first || op > r.lastOp() {
		return 0
	}
	cut := uint64(0)
	if op > keepEntries {
		cut = op - keepEntries
	}
	size := 0
	for k := op; k > cut && k >= r.first; k-- {
		size += len(r.log[k-r.first].Data)
		if size > keepBytes && k < op {
			cut = k
			break
		}
	}
	if cut < r.first {
		return 0
	}
	return cut
}

// Compact drops log entries up to op, which the driver has captured in a
// durable snapshot (op <= applied). Lagging replicas then need that snapshot.
func (r *Replica) Compact(op uint64) error {
	if op > r.applied {
		return fmt.Errorf("vr: compact to %d beyond applied %d", op, r.applied)
	}
	if op < r.first {
		return nil
	}
	r.log = append([]Entry(nil), r.log[op+1-r.first:]...)
	r.first = op + 1
	return nil
}

// ---- recovery ----

func (r *Replica) sendRecovery() {
	r.lastRecovery = r.now
	r.broadcast(Message{Type: MsgRecovery, Nonce: r.nonce, Op: r.recHave}, false)
}

func (r *Replica) onRecovery(j int, m *Message) {
	if r.status != Normal {
		return
	}
	resp := Message{Type: MsgRecoveryResponse, View: r.view, Nonce: m.Nonce}
	if r.isLeader() {
		if m.Op+1 < r.first {
			r.wantSnapshot(j)
			return
		}
		resp.Op, resp.Commit, resp.First = r.lastOp(), r.commit, m.Op+1
		resp.Entries = r.copyLog(m.Op+1, 0)
		resp.DLog = r.DLog()
	}
	r.send(r.cfg.Members[j], resp)
}

func (r *Replica) onRecoveryResponse(j int, m *Message) {
	if r.status != Recovering || m.Nonce != r.nonce {
		return
	}
	if p := r.recResp[j]; p == nil || m.View >= p.View {
		r.recResp[j] = m
	}
	cnt := 0
	var top uint64
	for _, p := range r.recResp {
		if p != nil {
			cnt++
			top = max(top, p.View)
		}
	}
	l := r.recResp[r.leaderIdx(top)]
	if cnt < r.f+1 || l == nil || l.View != top || l.First > r.recHave+1 {
		return
	}
	r.setView(top)
	r.status, r.lnv = Normal, top
	r.vcAbandoned = 0
	r.nxAdopt(l.DLog)
	r.truncate(r.recHave)
	for _, e := range l.Entries {
		if e.Op > r.lastOp() {
			r.appendEntries([]Entry{e})
		}
	}
	if c := min(l.Commit, r.lastOp()); c > r.commit {
		r.setCommit(c)
	}
	r.hsDirty = true
	r.lastContact = r.now
	for i := range r.recResp {
		r.recResp[i] = nil
	}
}

// ---- output ----

// Ready returns the actions accumulated since the last call and clears them.
// The driver must perform them (doc.go) and, if Committed is non-empty, call
// Advance before the next Step.
func (r *Replica) Ready() Ready {
	if len(r.lastHanded) > 0 {
		panic(fmt.Sprintf("vr: replica %d: Ready before Advance of %d committed entries", r.cfg.Self, len(r.lastHanded)))
	}
	r.flush()
	if r.hbNow && r.status == Normal && r.isLeader() {
		r.heartbeat()
	}
	r.flushAck()
	if r.commit > r.handed {
		r.out.Committed = make([]Committed, 0, r.commit-r.handed)
		for op := r.handed + 1; op <= r.commit; op++ {
			e := r.entry(op)
			c := Committed{Entry: *e}
			if e.Client != 0 && !r.mut.skipClientTable {
				if rec := r.clients[e.Client]; rec != nil && e.ReqNum <= rec.ReqNum {
					c.Duplicate = true
				} else {
					r.clients[e.Client] = &ClientRecord{Client: e.Client, ReqNum: e.ReqNum, Op: op}
					r.evictClients()
				}
			}
			r.out.Committed = append(r.out.Committed, c)
		}
		r.handed = r.commit
		r.lastHanded = r.out.Committed
	}
	hs := HardState{View: r.view, LastNormalView: r.lnv, Commit: r.commit}
	if r.hsDirty || (len(r.out.Entries) > 0 && hs != r.lastHS) {
		if hs.View != r.lastHS.View || hs.LastNormalView != r.lastHS.LastNormalView {
			r.viewSeq = r.nextSeq()
		}
		r.out.HardState = &hs
		r.lastHS = hs
		r.hsDirty = false
	}
	if r.out.HasWrite() {
		r.seq++
		r.out.PersistSeq = r.seq
		r.batches = append(r.batches, batch{seq: r.seq, last: r.lastOp()})
	} else {
		// No batch this time: deferred messages wait only for what was issued.
		for i := range r.defers {
			r.defers[i].seq = min(r.defers[i].seq, r.seq)
		}
		r.nxClamp()
		r.releaseDeferred()
	}
	r.syncWanted = false // this Ready's prepares and heartbeats carried it
	rd := r.out
	r.out = Ready{}
	return rd
}

// Advance reports the results of the last Ready's Committed entries, in the
// same order (nil for duplicates). It updates the client table and queues the
// leader's replies.
func (r *Replica) Advance(results [][]byte) {
	if len(results) != len(r.lastHanded) {
		panic(fmt.Sprintf("vr: replica %d: %d results for %d committed entries", r.cfg.Self, len(results), len(r.lastHanded)))
	}
	leader := r.status == Normal && r.isLeader()
	for i, c := range r.lastHanded {
		if c.Op != r.applied+1 {
			panic(fmt.Sprintf("vr: replica %d: applied %d after %d", r.cfg.Self, c.Op, r.applied))
		}
		r.applied = c.Op
		if c.Client == 0 {
			continue
		}
		res := results[i]
		rec := r.clients[c.Client]
		if !c.Duplicate && rec != nil && rec.Op == c.Op {
			rec.Result = res
		}
		if r.inflight[c.Client] <= c.ReqNum {
			delete(r.inflight, c.Client)
		}
		r.nxExecuted(c.Client, c.ReqNum)
		if !leader || r.nxQuietReply(c.Client, c.ReqNum) {
			continue
		}
		if c.Duplicate {
			if rec == nil || rec.ReqNum != c.ReqNum {
				continue
			}
			res = rec.Result
		}
		r.out.Replies = append(r.out.Replies, Reply{Client: c.Client, ReqNum: c.ReqNum, Op: c.Op, Result: res})
	}
	r.lastHanded = nil
	if leader && r.cfg.FollowerReads {
		r.advanceReadable() // the leader's own applied op bounds R
	}
}

// ClientTable returns the client table as of the applied op, for a snapshot.
func (r *Replica) ClientTable() []ClientRecord {
	out := make([]ClientRecord, 0, len(r.clients))
	for _, c := range r.clients {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b ClientRecord) int {
		switch {
		case a.Client < b.Client:
			return -1
		case a.Client > b.Client:
			return 1
		}
		return 0
	})
	return out
}

// ---- introspection ----

// Info is a snapshot of a replica's protocol state.
type Info struct {
	Self           uint64
	Status         Status
	View           uint64
	LastNormalView uint64
	Leader         uint64
	IsLeader       bool
	FirstOp        uint64
	LastOp         uint64
	Commit         uint64
	Applied        uint64
	Durable        uint64
	// Nilext fast path: d-log length, reads that had to order pending
	// updates first, and view changes that met a d-log cycle. DLogStale:
	// this replica restarted and its d-log may lack updates it acknowledged
	// (it does not count in d-log recovery until it is normal in a later
	// view); NilextStaleWaits counts view changes that waited for more
	// fresh d-logs than were at hand (nilext.go, nxRecover).
	DLogLen          int
	NilextSlowReads  uint64
	NilextCycles     uint64
	DLogStale        bool
	NilextStaleWaits uint64
	// CAD (cad.go). Persisted: this replica's fsynced log prefix. Acked
	// (leader): highest op held in memory by a majority. Readable: the
	// readable index R (Replica.Readable). ReadLeaseUntil (follower): local
	// time its read lease ends (0: none). Members (leader): how many
	// followers are in each active-set state, indexed by MemberState
	// (Replica.Peers has the details; Info stays comparable).
	Persisted      uint64
	Acked          uint64
	Readable       uint64
	ReadLeaseUntil int64
	Members        [4]int
	// Clients is the client table's size; ClientsEvicted counts records
	// dropped to keep it within MaxClients (clients.go).
	Clients        int
	ClientsEvicted uint64
}

// Info reports the replica's state. Followers serve session and bounded reads
// from Commit/Applied: everything up to Commit is final.
func (r *Replica) Info() Info {
	return Info{Self: r.cfg.Self, Status: r.status, View: r.view, LastNormalView: r.lnv,
		Leader: r.cfg.LeaderOf(r.view), IsLeader: r.status == Normal && r.isLeader(),
		FirstOp: r.first, LastOp: r.lastOp(), Commit: r.commit, Applied: r.applied, Durable: r.durable,
		DLogLen: r.nx.live, NilextSlowReads: r.nx.slowReads, NilextCycles: r.nx.cycles,
		DLogStale: r.cfg.Nilext && r.nxStale(), NilextStaleWaits: r.nx.staleWaits,
		Persisted: r.durable, Acked: r.cad.acked, Readable: r.Readable(), ReadLeaseUntil: r.readLeaseUntil(),
		Members: r.memberCounts(), Clients: len(r.clients), ClientsEvicted: r.clientsEvicted}
}

func (r *Replica) memberCounts() (n [4]int) {
	for _, p := range r.Peers() {
		n[p.State]++
	}
	return n
}

func (r *Replica) readLeaseUntil() int64 {
	if r.status != Normal || r.isLeader() || r.cad.leaseView != r.view {
		return 0
	}
	return r.cad.leaseUntil
}

// CommitPoint is the highest op this replica knows to be committed.
func (r *Replica) CommitPoint() uint64 { return r.commit }

func (r *Replica) checkInvariants() {
	if r.commit > r.lastOp() {
		panic(fmt.Sprintf("vr: replica %d: commit %d > last op %d", r.cfg.Self, r.commit, r.lastOp()))
	}
	if r.applied > r.handed || r.handed > r.commit {
		panic(fmt.Sprintf("vr: replica %d: applied %d, handed %d, commit %d out of order", r.cfg.Self, r.applied, r.handed, r.commit))
	}
	if r.durable > r.lastOp() {
		panic(fmt.Sprintf("vr: replica %d: durable %d > last op %d", r.cfg.Self, r.durable, r.lastOp()))
	}
	if r.status == Normal && r.lnv != r.view {
		panic(fmt.Sprintf("vr: replica %d: normal in view %d but last normal view %d", r.cfg.Self, r.view, r.lnv))
	}
	r.checkCADInvariants()
}
