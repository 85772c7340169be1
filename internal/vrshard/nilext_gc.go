package vrshard

import (
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/vr"
)

// Group commit across the d-log and the log (nilext fast path;
// docs/design/nilext.md, "Durability levels and fsyncs").
//
// The d-log records and the log entries go into the same log segment, so one
// fsync covers both. A batch the leader's background ordering produced —
// entries that all came from the d-log — has no client waiting for it: the
// clients completed on the d-log acks; only a slow-path read, a durability
// wait or a non-nilext update behind it would wait. Such a batch (and one
// that carries nothing else anyone waits for: a cad/async d-log record, a
// new commit point) is *held*: its fsync is not started. The next batch that
// needs one — at steady load, the next sync d-log record — starts an fsync
// that covers the held batches too; if none comes within
// Options.NilextSyncDelay of the first held batch, the held ones are synced
// then. Persisted is reported to the core only when the fsync that covers a
// batch returns, as before, so a prepare-ok (its Persisted field) still only
// covers durable entries: VR's rule is intact; only when the ordering's fsync
// happens changes.
//
// Urgent (synced at once, covering every held batch before it): a snapshot,
// a truncation, a new view or last-normal view in the hard state (the core
// holds do-view-change and start-view until it is durable), a sync d-log
// record (its ack waits), an entry without a client identity, an entry a
// waiter of this replica proposed, an entry not in this replica's d-log (a
// non-nilext update, the ordered fallback of a write this replica never
// took), anything while recovering, and every batch while a read waits at
// this replica (a slow-path read or durability wait needs the commit). A
// follower learns that the leader has such a read waiting from the leader's
// prepare or heartbeat (vr.SyncWanted): it then holds nothing until its
// next fsync has started.

// The same hold serves cad and async writes without the fast path
// (Options.CadSyncDelay): a batch whose entries are all blind cad or async
// writes is acknowledged before it is durable (at a majority's memory), so
// no client waits for its fsync. Holding it saves
// fsyncs — on this kind of VM an fsync costs about as much CPU as the writes it
// covers — at the price of a later commit point and apply. Urgent, besides the
// cases above: an entry whose waiter at the leader awaits its commit (a sync
// or non-blind write: the leader's prepare then carries the sync hint,
// vr.Replica.WantSync), a read waiting at this replica, and a caller waiting
// for an apply (untilApplied: a session read, a barrier), which wakes the
// driver and makes its next messages carry the hint. A follower holds every
// batch until the leader's hint or its deadline: it cannot tell which entries
// someone waits for, the leader can.

// groupCommit is the driver's hold state (driver goroutine only, except
// appliedWaiters and wake).
type groupCommit struct {
	urgent uint64    // highest PersistSeq written that must be synced at once
	heldAt time.Time // when the oldest held batch not covered by an fsync was written (zero: none)
	heldSq uint64    // that batch's PersistSeq
	timer  *time.Timer
	timerC <-chan time.Time // timer.C while armed, else nil
	want   bool             // the leader asked for a sync: hold nothing it sent (until wantDone)
	held   atomic.Uint64    // batches held (tests)
	late   atomic.Uint64    // fsyncs the deadline started (tests)
	// appliedWaiters counts callers blocked in untilApplied; one that starts
	// waiting sends on wake (capacity 1) so the driver stops holding.
	appliedWaiters atomic.Int64
	wake           chan struct{}
	arrived        bool // a wake came: at a follower, ready() asks the leader to sync (vr AskSync)
}

// holdDelay is how long a held batch may wait (negative: never held).
func (r *Replica) holdDelay() time.Duration {
	if r.opts.Nilext {
		return r.opts.NilextSyncDelay
	}
	return r.opts.CadSyncDelay
}

// holdable reports whether the batch rd may wait for a later fsync (the
// engine's part of it, a sync d-log record, is the caller's:
// engineExt.readyExtra). It runs before handle() records rd (r.lastHS is
// still the previous hard state).
func (r *Replica) holdable(rd *core.Ready[peerMsg]) bool {
	if r.holdDelay() < 0 || r.recovering || rd.Snapshot != nil || rd.HasTruncate {
		return false
	}
	if r.chainUnsynced() {
		// A buffered or memory chain member: no acknowledgement, read or
		// apply waits for its fsync (the core acknowledges what it holds),
		// so every batch waits for the flush interval.
		return true
	}
	if r.waited() {
		return false
	}
	if hs := rd.HardState; hs != nil && (hs.View != r.lastHS.View || hs.LastNormalView != r.lastHS.LastNormalView) {
		return false
	}
	leader := r.isLeader.Load()
	for i := range rd.Entries {
		e := &rd.Entries[i]
		if e.Client == 0 {
			return false
		}
		if r.opts.Nilext {
			if len(r.waitID[idKey{e.Client, e.ReqNum}]) > 0 || !r.ext.preAcked(e.Client, e.ReqNum) {
				return false
			}
			continue
		}
		if leader && !ackedBeforeDurable(r.waitID[idKey{e.Client, e.ReqNum}]) {
			return false
		}
	}
	return true
}

// waited reports whether something here waits for a commit, so nothing may
// be held: the leader's sync hint, a read, a caller blocked for an apply.
func (r *Replica) waited() bool {
	return r.gc.want || len(r.reads) > 0 || r.gc.appliedWaiters.Load() > 0
}

// ackedBeforeDurable reports whether ws, the waiters of one entry at the
// leader, are all acknowledged before the entry is durable (cad and async
// blind writes). An entry nobody here waits for (a forwarded write, a
// retransmission) counts as awaited: its waiter may want its commit.
func ackedBeforeDurable(ws []*proposal) bool {
	for _, p := range ws {
		if p.ack == vr.AckApplied {
			return false
		}
	}
	return len(ws) > 0
}

// noteWritten records that the batch up to r.written (held or not) was
// written to the log, before startSync.
func (r *Replica) noteWritten(held bool) {
	g := &r.gc
	if !held {
		g.urgent = r.written
		return
	}
	g.held.Add(1)
	if mutation.On && r.mut.heldAckEarly {
		// The mutation: the held batch counts as durable before any fsync.
		r.markSynced()
		return
	}
	if g.heldAt.IsZero() || g.heldSq <= r.synced0 {
		g.heldAt, g.heldSq = r.clock.Now(), r.written
	}
}

// holding reports whether every batch written and not synced may still
// wait (startSync starts no fsync then).
func (r *Replica) holding() bool {
	g := &r.gc
	if g.urgent > r.synced0 || g.heldAt.IsZero() || r.waited() && !r.chainUnsynced() {
		return false
	}
	if r.clock.Now().Sub(g.heldAt) >= r.holdDelay() {
		g.late.Add(1)
		return false
	}
	if g.timerC == nil {
		r.armHold()
	}
	return true
}

// syncStarted: the fsync just started covers every batch written so far.
// It does not consume the leader's sync hint (want): an fsync may start
// between the step of the hinted message and the Ready that writes its
// entries (the drain loop takes a finished fsync, and synced starts the next
// one), and that fsync does not cover them. wantDone consumes it.
func (r *Replica) syncStarted() {
	r.gc.heldAt = time.Time{}
	if mutation.On && r.mut.hintConsumedEarly {
		r.gc.want = false // the mutation
	}
}

// wantDone runs at the end of ready(), once every message stepped so far has
// had its entries written (none held while want was set): the leader's hint
// makes everything written urgent, and is consumed.
func (r *Replica) wantDone() {
	g := &r.gc
	if !g.want || (mutation.On && r.mut.hintConsumedEarly) {
		return
	}
	g.urgent = max(g.urgent, r.written)
	g.want = false
}

// armHold sets the deadline timer for the oldest held batch.
func (r *Replica) armHold() {
	g := &r.gc
	if g.heldAt.IsZero() {
		return
	}
	d := max(r.holdDelay()-r.clock.Now().Sub(g.heldAt), 0)
	if r.step1 != nil {
		// Stepped: the next step past it fires it (stepped.go).
		r.step1.holdDue = r.clock.Now().Add(d)
		g.timerC = r.step1.never
		return
	}
	if g.timer == nil {
		g.timer = time.NewTimer(d)
	} else {
		g.timer.Reset(d)
	}
	g.timerC = g.timer.C
}

// holdExpired runs when the deadline timer fires: sync the held batches if
// their deadline passed; startSync re-checks and, if they may still wait (the
// timer was set for batches an fsync covered meanwhile), re-arms it.
func (r *Replica) holdExpired() {
	r.gc.timerC = nil
	r.startSync()
}

// stopHold releases the timer when the driver stops.
func (r *Replica) stopHold() {
	if r.gc.timer != nil {
		r.gc.timer.Stop()
	}
}
