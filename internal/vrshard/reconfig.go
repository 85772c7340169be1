package vrshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vr"
)

// Reconfiguration on the host (docs/design/cluster.md §7, "What the host
// must do"). The core orders the new member list as the epoch's last op and
// reports the move in Ready.Membership; the host
//   - writes it in the same log record as the batch's hard state
//     (recHardStateMember, wal.go) and in every hard state record after,
//     so a new segment carries it on and a restart passes it back
//     (vr.State.Membership);
//   - acts on it only once Persisted covers that batch: Reconfigure's
//     caller hears of the new epoch then, not when the Ready arrives (a
//     power cut could still take the record, and the replica would restart
//     in the old epoch);
//   - addresses the new members (the transport's peer map) and lets peers
//     of the adjacent epoch through its handshake (peer.go), at once: the
//     core sends nothing in the new epoch before the batch is durable.
//
// What it leaves to the node (internal/server membership.go): starting a
// new member elsewhere (kefir server --join opens it with Membership.Apply,
// an empty disk and no Bootstrap: ReplicaSpec.Membership), teaching it the
// addresses of members it learns later (SetAddrs, hostmember.go), and
// stopping a retired one (Info.Retired).

// reconfState is the host's reconfiguration state. noted, seq and waiters
// are the driver goroutine's; member and the Info flags are published.
type reconfState struct {
	// vrc is VR's core (nil for another core: no reconfiguration).
	vrc *vrCore
	// noted: the membership the last such Ready reported, written with the
	// batch of PersistSeq seq and not durable yet (nil: none).
	noted *vr.Membership
	seq   uint64
	// waiters: Reconfigure calls whose request the core took, answered
	// when a membership becomes durable or the leader loses its view.
	waiters []reconfWaiter
	// member: the durable configuration after the last reconfiguration
	// (nil: never reconfigured).
	member atomic.Pointer[vr.Membership]
	// admit: the peers the handshake lets through with another
	// configuration hash (admitsConfig, peer.go).
	admit atomic.Pointer[[]uint64]
	// The core's reconfiguration flags as of the last Ready (vr.Info).
	epoch                     atomic.Uint64
	joining, leaving, retired atomic.Bool
}

type reconfWaiter struct {
	members []uint64
	done    chan reconfResult // buffered: the driver never blocks on it
}

type reconfResult struct {
	m   vr.Membership
	err error
}

// ErrNoReconfig: the replica's core is not VR's (a chain member's group
// changes through its master).
var ErrNoReconfig = errors.New("vrshard: this replica's core does not reconfigure")

// Reconfigure asks the group, at its leader, to move from configuration
// epoch (vr.AnyEpoch: whatever it is) to a new member list (odd, distinct,
// not the current set; the first member leads the new epoch's view 0) and
// returns the new configuration once this replica's
// record of it is durable. The core's refusals come back typed:
// *NotLeaderError (with the leader's address when known), vr.ErrBadMembers,
// vr.ErrReconfigUnsupported (nilext or follower reads), *vr.ReconfiguredError
// (a reconfiguration is already under way, and epoch is vr.AnyEpoch), *vr.EpochMovedError (the group
// is no longer at epoch, or is moving from it (Pending): the core's compare-and-set), ErrBusy. If the leader loses its
// view before the move commits the answer is ErrOutcomeUnknown: the request
// may still commit under the next leader; ask Info().Epoch, or again.
//
// The caller starts a replica for every new member (Membership.Apply of the
// result, an empty disk, no Bootstrap) and stops the leaving ones once
// their Info().Retired.
func (r *Replica) Reconfigure(ctx context.Context, epoch uint64, members []uint64) (vr.Membership, error) {
	done := make(chan reconfResult, 1)
	members = slices.Clone(members)
	call := func() { r.reconfigure(epoch, members, done) }
	select {
	case r.ctlc <- call:
	case <-ctx.Done():
		return vr.Membership{}, ctx.Err()
	case <-r.done:
		return vr.Membership{}, r.closedErr()
	}
	select {
	case res := <-done:
		return res.m, res.err
	case <-ctx.Done():
		return vr.Membership{}, ctx.Err()
	case <-r.done:
		select {
		case res := <-done:
			return res.m, res.err
		default:
			return vr.Membership{}, r.closedErr()
		}
	}
}

// reconfigure (driver) hands members to the core's Reconfigure and
// registers done to be answered when the move is durable (persisted) or
// the leader loses its view (lostLead); a refusal answers it at once.
// Reconfigure runs it on the driver goroutine, ReconfigureStepped on the
// caller's (stepped mode): one path.
func (r *Replica) reconfigure(epoch uint64, members []uint64, done chan reconfResult) {
	if r.rc.vrc == nil {
		done <- reconfResult{err: ErrNoReconfig}
		return
	}
	if err := r.rc.vrc.Replica.Reconfigure(r.now(), epoch, members); err != nil {
		done <- reconfResult{err: r.reconfigErr(members, err)}
		return
	}
	r.rc.waiters = append(r.rc.waiters, reconfWaiter{members: members, done: done})
}

// ReconfigureStepped is Reconfigure in stepped mode (stepped.go): the
// request goes to the core on the caller's goroutine, as the driver would
// run it, and the caller polls the result (SteppedReconfig.Done) after its
// later steps. A stepped replica that failed answers its error.
func (r *Replica) ReconfigureStepped(epoch uint64, members []uint64) *SteppedReconfig {
	done := make(chan reconfResult, 1)
	if err := r.failed(); err != nil {
		done <- reconfResult{err: err}
	} else {
		r.reconfigure(epoch, slices.Clone(members), done)
		r.afterStep()
	}
	return &SteppedReconfig{r: r, done: done}
}

// SteppedReconfig is a reconfiguration ReconfigureStepped handed to the
// core.
type SteppedReconfig struct {
	r    *Replica
	done chan reconfResult
	res  *reconfResult
}

// Done reports whether the reconfiguration is answered: the new
// configuration durable here, or refused, or its outcome unknown (the
// leader lost its view, or the replica stopped: Reconfigure's answers).
func (s *SteppedReconfig) Done() bool {
	if s.res != nil {
		return true
	}
	select {
	case res := <-s.done:
		s.res = &res
		return true
	default:
	}
	if err := s.r.failed(); err != nil {
		s.res = &reconfResult{err: s.r.closedErr()}
		return true
	}
	return false
}

// Result is the answer once Done: Reconfigure's.
func (s *SteppedReconfig) Result() (vr.Membership, error) {
	if !s.Done() {
		return vr.Membership{}, ErrOutcomeUnknown
	}
	return s.res.m, s.res.err
}

// reconfigErr is the core's refusal of Reconfigure as the host's callers
// know it: not leader as elsewhere (with a redirect), the rest wrapped.
func (r *Replica) reconfigErr(members []uint64, err error) error {
	switch {
	case errors.Is(err, vr.ErrNotLeader), errors.Is(err, vr.ErrNotNormal), errors.Is(err, vr.ErrBusy):
		return r.mapErr(err)
	}
	return fmt.Errorf("vrshard: replica %d: reconfigure to %v: %w", r.cfg.Self, members, err)
}

// Membership is the group's configuration after its last durable
// reconfiguration at this replica (ok false: never reconfigured, the
// Options' configuration holds).
func (r *Replica) Membership() (vr.Membership, bool) {
	m := r.rc.member.Load()
	if m == nil {
		return vr.Membership{}, false
	}
	return *m, true
}

// noteMembership (driver, handle): the core's Ready moved the replica to
// another configuration. The WAL writes it with the batch's hard state from
// now on; the host's group view follows at once (the core's messages and
// leader rule are the new epoch's); the caller hears of it once durable.
func (r *Replica) noteMembership(persistSeq uint64, hasHS bool) error {
	v := r.rc.vrc
	if v == nil || v.member == nil {
		return nil
	}
	m := v.member
	v.member = nil
	if !hasHS {
		// The core writes the view-0 hard state with every membership;
		// without it the record would restart the replica inconsistently.
		return fmt.Errorf("vrshard: replica %d: the core reported epoch %d without a hard state", r.cfg.Self, m.Epoch)
	}
	r.wal.member = m
	r.rc.noted, r.rc.seq = m, persistSeq
	// Field by field: other goroutines read r.cfg.Self (Info), which stays.
	g := vrGroup(v.Config())
	r.cfg.Members, r.cfg.Hash, r.cfg.leaderOf = g.Members, g.Hash, g.leaderOf
	r.log.Info("vr replica moves to a new configuration", "epoch", m.Epoch, "members", m.Members,
		"start", m.Start, "previous", m.Previous)
	return r.admitMembers(m)
}

// persisted tells the core that the batches up to seq are durable, and
// answers Reconfigure once the batch with the new configuration is.
func (r *Replica) persisted(seq uint64) {
	r.core.Persisted(seq)
	m := r.rc.noted
	if m == nil || seq < r.rc.seq {
		return
	}
	r.rc.noted = nil
	r.rc.member.Store(m)
	for _, w := range r.rc.waiters {
		if slices.Equal(w.members, m.Members) {
			w.done <- reconfResult{m: *m}
		} else {
			w.done <- reconfResult{err: &vr.ReconfiguredError{Epoch: m.Epoch, Members: slices.Clone(m.Members)}}
		}
	}
	r.rc.waiters = nil
}

// lostLead (driver): the leader lost its view. A reconfiguration it took
// and has not seen committed may be lost or may commit under the next
// leader: its callers get ErrOutcomeUnknown. One whose membership is on its
// way to disk is answered by persisted instead.
func (r *Replica) lostLead() {
	if r.rc.noted != nil {
		return
	}
	for _, w := range r.rc.waiters {
		w.done <- reconfResult{err: ErrOutcomeUnknown}
	}
	r.rc.waiters = nil
}

// publishEpoch (driver, after a Ready): the core's reconfiguration flags
// for Info.
func (r *Replica) publishEpoch() {
	v := r.rc.vrc
	if v == nil {
		return
	}
	i := &v.info
	r.rc.epoch.Store(i.Epoch)
	r.rc.joining.Store(i.Joining)
	r.rc.leaving.Store(i.Leaving)
	r.rc.retired.Store(i.Retired)
}

// reconfigured is the refusal a leaving replica gives client ops: the
// group moved to the configuration it recorded last.
func (rc *reconfState) reconfigured() error {
	re := &vr.ReconfiguredError{Epoch: rc.epoch.Load()}
	if m := rc.member.Load(); m != nil {
		re.Epoch, re.Members = m.Epoch, slices.Clone(m.Members)
	}
	return fmt.Errorf("%w: %w", shard.ErrUnavailable, re)
}

// startMembership is the configuration a replica opens with when its disk
// records none but its Options name a later epoch (a new member started
// with Membership.Apply): written with its first hard state, so a restart
// with the original Options still comes back in that epoch.
func startMembership(cfg vr.Config) *vr.Membership {
	if cfg.EpochStart == 0 {
		return nil
	}
	return &vr.Membership{Epoch: cfg.Epoch, Members: slices.Clone(cfg.Members), Start: cfg.EpochStart,
		Previous: slices.Clone(cfg.Previous)}
}
