package vr

import (
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Normal operation: propose, prepare, prepare-ok, commit and heartbeats.

// Propose submits a client request at the leader. Duplicates of executed
// requests are answered from the client table (Ready.Replies); duplicates of
// requests in flight are dropped (the reply comes when they are applied).
func (r *Replica) Propose(now int64, req Request) error {
	r.observe(now)
	if err := r.canOrder(); err != nil {
		return err
	}
	r.nxBeforePropose(req)
	if req.Client != 0 && !(mutation.On && r.mut.skipClientTable) {
		switch d, c := r.clients.Check(req.Client, req.ReqNum); d {
		case kv.Stale:
			return fmt.Errorf("%w: client %d request %d, table has %d", ErrStaleRequest, req.Client, req.ReqNum, c.ReqNum)
		case kv.Duplicate:
			r.out.Replies = append(r.out.Replies, Reply{Client: req.Client, ReqNum: req.ReqNum, Op: c.Op, Result: c.Result})
			return nil
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
	if mutation.On && r.mut.commitWithoutQuorum {
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
	if SyncWanted(m) && r.status == Normal {
		// Its entries are synced at once: no receipt-only ack (receiptOnly).
		r.cad.hinted = [2]uint64{r.view, r.lastOp()}
	}
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
		// A heartbeat whose send time has left the ring (hbSentAt 0) was
		// sent after the one acknowledged before, so that one's time still
		// bounds it from below: keeping it keeps the lease and
		// quorumAckAt from falling back (a leader whose followers are slow
		// to acknowledge would count itself without a quorum: suspects).
		r.ackAt[j] = max(r.ackAt[j], r.hbSentAt(m.HBSeq))
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
	if mutation.On && r.mut.ackBeforePersist {
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
	if !r.cfg.FollowerReads || (mutation.On && r.mut.noCommitForReads) {
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
