package vr

// Sync hints: the leader's prepares and heartbeats, and a follower's
// prepare-ok, can ask the receiver to fsync held log batches now because
// something waits for a commit (group commit across cad/async writes and
// the nilext d-log). They change when replicas fsync, never what they promise.

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
