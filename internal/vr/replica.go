package vr

import (
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
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
	// Membership is the configuration the disk recorded last
	// (Ready.Membership), nil if none: it replaces the Config's Epoch,
	// Members, EpochStart and Previous.
	Membership *Membership
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
// and checkers catch them. Never set outside tests; read only as
// `mutation.On && r.mut.x`, so the default build compiles them away
// (internal/mutation).
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
	// leaderIgnoresLostQuorum: a normal leader never suspects itself, however
	// long no quorum has acknowledged it, and ignores every pre-vote (before
	// issue 28's fix; testdata/stale_leader.txt).
	leaderIgnoresLostQuorum bool
	// eventualUnbounded: every normal replica serves eventual reads, however
	// long it has been cut off (the rule before issue 24).
	eventualUnbounded bool
	// joinEarly: a member of a new epoch takes part (votes, acknowledges,
	// leads) before state transfer has brought it the epoch's start op
	// (reconfig.go).
	joinEarly bool
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

	// clients is the client table (kv's, under the count rule: clients.go).
	clients *kv.ClientTable

	nx nilextState

	cad cadState

	ev evState

	ep epochState
}

// New returns a replica. A replica with an empty State and view 0 is a member
// of a new group; otherwise it resumes from what its disk recovered.
func New(cfg Config, st State) (*Replica, error) {
	if st.Membership != nil {
		cfg = st.Membership.Apply(cfg)
	}
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
		inflight: map[uint64]uint64{}, clients: newClientTable(cfg.ClientCap)}
	r.f = (r.n - 1) / 2
	r.self = slices.Index(cfg.Members, cfg.Self)
	r.resize(st.Nonce)
	r.first = 1
	if s := st.Snapshot; s != nil {
		r.first = s.Op + 1
		r.clients.Load(s.Clients)
	}
	for i, e := range st.Entries {
		if e.Op != r.first+uint64(i) {
			return nil, fmt.Errorf("vr: recovered entry %d has op %d, want %d", i, e.Op, r.first+uint64(i))
		}
	}
	r.log = append([]Entry(nil), st.Entries...)
	// A reconfiguration in the recovered log still closes its epoch: a
	// restarted leader must not order ops after it (the power-cut
	// simulation, seed 363).
	r.noteAppended(r.log)
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
	case r.self < 0:
		// A previous member that left, restarted before the new epoch had
		// started (Info.Retired): it may hold the only copy of the
		// epoch's start state, and serves it again (reconfig.go).
		if st.Bootstrap || st.LostState {
			return nil, fmt.Errorf("vr: replica %d is not a member of epoch %d (members %v): only a leaving replica restarts, from its disk", cfg.Self, cfg.Epoch, cfg.Members)
		}
		r.status = Recovering
		r.ep.leaving = true
		r.ep.started = map[uint64]bool{}
	case cfg.EpochStart > 0 && r.commit < cfg.EpochStart:
		// A member of a reconfigured epoch without its start state: a new
		// member, or one that stopped before it had it. It pulls the state
		// before it takes part (reconfig.go).
		if st.Bootstrap {
			return nil, fmt.Errorf("vr: bootstrap of epoch %d, which starts at op %d: start new members without Bootstrap", cfg.Epoch, cfg.EpochStart)
		}
		if st.LostState && st.Nonce == 0 {
			return nil, fmt.Errorf("vr: recovery needs a non-zero nonce")
		}
		if st.LostState {
			r.nonce = st.Nonce
		}
		r.status = Recovering
		r.ep.joining = true
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
		if r.status == Recovering && !r.ep.joining && !r.ep.leaving {
			r.sendRecovery()
		}
	}
}

// Step processes one peer message received at local time now.
func (r *Replica) Step(now int64, m Message) {
	r.observe(now)
	if r.epochStep(&m) {
		r.checkInvariants()
		return
	}
	if m.Type == MsgRefuse {
		r.out.Errors = append(r.out.Errors, &RefusedError{By: m.From, Reason: m.Reason})
		return
	}
	if why := r.identity(&m); why != "" {
		ours := m.Cluster == r.cfg.Cluster
		if ours && m.Epoch < r.cfg.Epoch && r.cfg.EpochStart > 0 &&
			(slices.Contains(r.cfg.Members, m.From) || slices.Contains(r.cfg.Previous, m.From)) {
			// A replica of an older epoch: tell it where the group went
			// (it never rejoins the old group; reconfig.go).
			r.sendStartEpoch(m.From)
			return
		}
		if !ours || m.Epoch <= r.cfg.Epoch {
			// A later epoch is not an error here: the refusal makes its
			// sender tell us about it (epochStep).
			r.out.Errors = append(r.out.Errors, &ConfigError{From: m.From, Reason: why})
		}
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
	if r.epochTick() {
		r.checkInvariants()
		return
	}
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
