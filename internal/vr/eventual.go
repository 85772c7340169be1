package vr

import (
	"math"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Eventual reads (issue 24). An eventual read may return an old version, but
// not one superseded longer than Config.EventualWindow W before the read
// began (check.Eventual). A replica proves that bound from its own state:
//
//   - A leader serves while the latest heartbeat f followers acknowledged was
//     sent less than W ago (its lease start, LeaseRead): a majority was in its
//     view after that send, so no other view had started, and its commit
//     point (once it covers the ops its view started with) held every write
//     completed before it.
//   - A follower serves while it has applied the commit point of a leader
//     message that vouched for it (the leader held its lease when sending:
//     Message.Nonce, set by evVouch) and echoed a prepare-ok this follower
//     sent less than W ago (AckSeq, timed from the send, as grants are): the
//     leader's state was the group's after that send, and this follower holds
//     it. A deposed leader cannot vouch (it has no lease), so a follower cut
//     off with it stops too.
//
// W is measured on the replica's clock and shortened by MaxDrift. Otherwise
// the read is refused (the driver redirects it to the leader, or answers
// that no replica can serve it). Without leases (LeaseDuration 0) no leader
// vouches, so only the leader serves eventual reads.

// evState is a follower's latest proof of freshness: at local time at, the
// group's state was at most commit. It stays true after a view change (it
// is about time, not views), so a replica in a view change keeps serving
// eventual reads until the window has passed since it.
type evState struct {
	at     int64  // local time it sent the prepare-ok a vouching leader echoed
	commit uint64 // the highest commit point such a message carried
}

// evVouch marks a leader's prepare or heartbeat sent under its lease.
func (r *Replica) evVouch(m *Message) {
	if r.leaseEnd() > r.now {
		m.Nonce = 1
	}
}

// evLearn takes a proof of freshness from a leader message of the current
// view (called for prepares and heartbeats accepted by a normal follower).
func (r *Replica) evLearn(m *Message) {
	if r.status != Normal || r.isLeader() || m.View != r.view || m.Nonce == 0 {
		return
	}
	s := r.cad.ackRing[m.AckSeq%hbRing]
	if m.AckSeq == 0 || s.seq != m.AckSeq {
		return // not ours (an earlier life's) or too old to remember
	}
	// Committed op numbers never change meaning, so the highest commit
	// point and the latest send time together are still a true (if
	// conservative) proof.
	r.ev.at = max(r.ev.at, s.at)
	r.ev.commit = max(r.ev.commit, m.Commit)
}

// EventualUntil returns the local time until which this replica may serve
// eventual reads from its applied state (0: not now; math.MaxInt64 with a
// negative EventualWindow). A driver publishes it after every step, as it
// does LeaseUntil, and refuses eventual reads at or after it. A recovering
// replica never serves them (it may hold nothing yet).
func (r *Replica) EventualUntil() int64 {
	w := r.cfg.EventualWindow
	switch {
	case r.status == Recovering:
		return 0
	case w < 0 || (mutation.On && r.mut.eventualUnbounded):
		if r.status != Normal {
			return 0 // as before issue 24: normal replicas only
		}
		return math.MaxInt64
	}
	win := int64(float64(w) * (1 - r.cfg.MaxDrift))
	var until int64
	if r.ev.at > 0 && r.applied >= r.ev.commit {
		until = r.ev.at + win
	}
	if r.status == Normal && r.isLeader() && r.commit >= r.viewStartOp {
		if r.n == 1 {
			return math.MaxInt64
		}
		if start := r.quorumAckAt(); start > 0 {
			until = max(until, start+win)
		}
	}
	return until
}

// nthLargest returns the n-th largest of xs (n >= 1), reordering xs.
func nthLargest(xs []int64, n int) int64 {
	for i := 0; i < n; i++ {
		m := i
		for j := i + 1; j < len(xs); j++ {
			if xs[j] > xs[m] {
				m = j
			}
		}
		xs[i], xs[m] = xs[m], xs[i]
	}
	return xs[n-1]
}
