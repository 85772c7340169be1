package vr

import (
	"math"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Linearizable reads at the leader: read index and lease reads.

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
	if mutation.On && r.mut.noLeaseCheck {
		return r.commit, nil
	}
	if r.cfg.LeaseDuration == 0 || r.commit < r.viewStartOp {
		return 0, ErrNoLease
	}
	if r.n > 1 && r.now >= r.leaseEnd() { // leaseEnd 0: no quorum has acknowledged a heartbeat
		return 0, ErrNoLease
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
	if mutation.On && r.mut.noLeaseCheck {
		return math.MaxInt64, r.commit, true
	}
	end := r.leaseEnd()
	if end == 0 {
		return 0, 0, false
	}
	return end, r.commit, true
}
