package vr

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/mutation"
)

// View change: pre-votes, start-view-change, do-view-change, start-view,
// and the timers and restart promises that decide when a replica may vote.

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
	if mutation.On && r.mut.restartedLeaderVotes {
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

// stepDown drops leader-only state when this replica leaves its view.
func (r *Replica) stepDown() {
	for _, rd := range r.reads {
		r.out.ReadStates = append(r.out.ReadStates, ReadState{Ctx: rd.ctx, Err: ErrNotLeader})
	}
	r.reads = nil
	r.queue = nil
	r.ep.queued = nil // a queued reconfiguration goes with the queue; the caller asks again
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
	if !r.joinView(m.View) {
		return
	}
	if m.View == r.view && r.status == ViewChange {
		r.svc[j] = true
		r.checkSVC()
	}
}

// preVoteMark in a start-view-change's Op marks a pre-vote (preVote).
const preVoteMark = 1

// suspects reports whether this replica has lost its leader — a normal
// follower that has not heard from it for the view-change timeout, a
// leader that has not known f followers with it for as long (quorumAckAt,
// or since it began leading: lastContact), or a replica whose view change
// has run longer than vcTimeout — and may vote.
//
// The leader's case is Raft's check-quorum, here for pre-votes only (a
// leader never asks; it answers, onPreVote). Without it a leader cut off
// while the others formed a later view deadlocks with them once that view
// loses its own leader: the one replica left of it asks for the next view
// with pre-votes, which move no one, and drops every message of the old
// view as stale, while the old leader, "hearing its leader" (itself),
// ignores the pre-votes and leads its view for ever with no quorum (the
// move simulation's repair, seed 25: a reconfiguration it ordered there
// stayed pending, and each retry got "group is reconfiguring";
// testdata/stale_leader.txt). A leader that suspects has no lease left
// (LeaderLease is shorter than the timeout) and grants none (canVote).
func (r *Replica) suspects() bool {
	if !r.canVote() {
		return false
	}
	switch r.status {
	case Normal:
		if r.isLeader() {
			if mutation.On && r.mut.leaderIgnoresLostQuorum {
				return false
			}
			return r.now-max(r.lastContact, r.quorumAckAt()) >= int64(r.cfg.ViewChangeTimeout)
		}
		return r.now-r.lastContact >= int64(r.cfg.ViewChangeTimeout)
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
// too, while a quorum acknowledges it (suspects) — ignores the question
// (onPreVote), so a replica that merely did not hear the leader for a while
// (restarted before the leader's link to it came back, behind a one-way
// cut) never disturbs a view that a majority runs (Raft's pre-vote; issue
// 25 item 5). Plain VR moved to the next view at once, and its
// start-view-change drew every peer after its lease promise: a returning
// follower deposed a healthy leader. A view change that stalls moves on the
// same way, so a replica in an abandoned view change draws nobody either.
func (r *Replica) preVote() {
	if mutation.On && r.mut.noPreVote {
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
	// heldVC first: releasing the hold runs this check itself (and may send
	// the do-view-change, or start the view), so status and dvcSent are
	// read after it.
	if r.heldVC() || r.status != ViewChange || r.dvcSent != nil {
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

// joinView starts the view change to v (from a start-view-change or a
// do-view-change) when v is above this replica's view. A replica that may
// not vote yet (canVote) only notes v as pending and reports false: the
// message is dropped.
func (r *Replica) joinView(v uint64) bool {
	if v <= r.view {
		return true
	}
	if !r.canVote() {
		r.pendingView = max(r.pendingView, v)
		return false
	}
	r.startViewChange(v)
	return true
}

func (r *Replica) onDVC(j int, m *Message) {
	if r.status == Recovering || r.cfg.LeaderOf(m.View) != r.cfg.Self {
		return
	}
	if !r.joinView(m.View) || m.View != r.view {
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
	// cycle among the d-logs waits for more do-view-changes (nilext_recover.go).
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
	r.lastContact = r.now // no follower has acknowledged this view yet (suspects)
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
