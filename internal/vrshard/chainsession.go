package vrshard

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// A session on a chain (docs/design/chain.md, "Sessions on the host").
//
// A chain member's op numbers are positions in its history, and a head that
// fails takes with it the updates it had not passed on — under AU, async
// writes it had already answered. The repaired chain's next head numbers
// its updates at the same positions, so a position alone does not say which
// update a session saw. The token says more: each of its versions carries
// the view of its entry, on a chain the epoch its head numbered it in (the
// high bits of its chain sequence number, core.Entry.View), which the early
// acknowledgement puts in the write's token (earlyAcks) and the view history
// records for every applied entry (engine_mark.go), as for VR. A different
// update at the token's position was numbered by another head, in another
// epoch: the session's update is gone.
//
// Three places tell the session (shard.ErrSessionLost), as the core's rule
// (internal/chain, Member.weakRead and clientUpdate: `lost`) does:
//   - a session read, once the token's positions are applied, compares
//     their views (checkSessionViews, VR's own check);
//   - a session read or write at the head whose token names a position
//     past the head's history: the head holds every update the chain holds
//     (each member's history is a prefix of its predecessor's), so one it
//     lacks was lost with an earlier head (chainHeadLost);
//   - a session write at the head, before it is proposed, also compares the
//     views of positions in the head's log not yet applied
//     (chainSessionCheck): the write's token would otherwise rise past the
//     lost update and the session's next read would check only the new one.
//
// Tokens without views (v1: written by a member before this, or by a
// single node) are judged by the position rule only, as before otherwise.

// chainHeadServing reports whether this member is its chain's active head
// under the master's lease: no other member has been made head (the master
// replaces one only after its lease lapsed), so its history is the
// chain's longest.
func (r *Replica) chainHeadServing() bool {
	if r.opts.Chain == nil || !r.isLeader.Load() || core.Status(r.status.Load()) != core.Normal {
		return false
	}
	ls := r.lease.Load()
	return ls != nil && r.now() < ls.until
}

// chainHeadLost is the error of a session whose token names position need
// past this head's history, lost with an earlier head; nil if this member
// is not the chain's serving head or holds need.
func (r *Replica) chainHeadLost(what string, need uint64) error {
	if mutation.On && r.mut.chainSessionUnchecked {
		return nil
	}
	if last := r.lastOp.Load(); need > last && r.chainHeadServing() {
		return fmt.Errorf("%w: the session %s version %d, but the chain's head holds %d updates (the update was answered by an earlier head that failed before passing it on); start a new session",
			shard.ErrSessionLost, what, need, last)
	}
	return nil
}

// chainSessionCheck fails a write whose session saw an update the chain no
// longer holds (driver only, at the head, before the write is proposed):
// a position past the head's history, or one whose entry here — applied or
// in the log — was numbered in another view than the token says.
func (r *Replica) chainSessionCheck(s shard.Session) error {
	if mutation.On && r.mut.chainSessionUnchecked {
		return nil
	}
	for _, p := range tokenParts(s) {
		if p.v == 0 {
			continue
		}
		if err := r.chainHeadLost(p.what, p.v); err != nil {
			return err
		}
		if !p.known || !r.chainHeadServing() {
			continue
		}
		if view, ok := r.logView(p.v); ok && view != p.view {
			return chainViewLost(p.what, p.v, p.view, view)
		}
	}
	return nil
}

// chainViewLost is the error of a session that saw (what: "wrote", "read")
// version v numbered in epoch saw, where the chain's update at v was
// numbered in epoch is.
func chainViewLost(what string, v, saw, is uint64) error {
	return fmt.Errorf("%w: the session %s version %d of epoch %d, but the chain's update there was numbered in epoch %d (the session's was lost with an earlier head); start a new session",
		shard.ErrSessionLost, what, v, saw, is)
}
