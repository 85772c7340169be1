package vrshard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vr"
)

// Reads. Every replica's engine holds committed state only (entries are
// applied once a majority persisted them), so any replica may serve a read
// whose level it can prove from how far it has applied:
//
//   - linearizable (and cross-client-monotonic, bounded(N versions) and
//     bounded(t), which it implies): at the leader, after the core confirms leadership —
//     under the lease (LeaseRead) or else by a read-index heartbeat round —
//     and the engine has applied the returned index; then the keys read are
//     checked against the readable index R (cad.go): a key updated after R
//     (an early-acknowledged cad write, or with follower reads an op some
//     active-set member has not applied) waits for R and is read again.
//   - cross-client-monotonic with Options.FollowerReads: also at a follower
//     holding an active-set lease (vr FollowerRead), when no key read (no key
//     in a scan's range) was updated after the R it learned; else redirect.
//   - session: any replica whose applied op is at least the token's last
//     write and max read (versions are op numbers, equal on every replica);
//     a follower behind waits up to FollowerWait, then redirects; the leader
//     waits for a version in its log until it is applied (waitSession).
//   - bounded(t): at the leader, as linearizable. A follower cannot time its
//     freshness from a heartbeat's arrival (a deposed leader keeps sending
//     them; a message can sit in a queue); serving it at followers needs a
//     round trip the follower starts, answered by a leader holding its lease.
//   - eventual: any normal replica whose state it can prove is at most the
//     eventual window old (vr Replica.EventualUntil, docs/consistency.md): a
//     follower that has not heard from a leader holding its lease, or a
//     leader that has not heard from a majority, for the window redirects.
//
// A replica that cannot prove a level returns *NotLeaderError (redirect) or
// ErrCannotServe; it never serves a weaker level silently.

// CheckConsistency reports whether this replica can serve level c now.
func (r *Replica) CheckConsistency(c level.Consistency) error {
	if c.IsZero() {
		c = level.ConsLinearizable
	}
	if c.Kind < level.Linearizable || c.Kind > level.Eventual {
		return fmt.Errorf("consistency %v: %w", c, level.ErrUnknownLevel)
	}
	if err := r.failed(); err != nil {
		return err
	}
	if co := r.opts.Chain; co != nil && co.Mode == chain.AU && (c.Kind == level.Linearizable || c.Kind == level.CrossClientMonotonic) {
		// Refused at every member, not redirected: no member can serve it
		// (docs/design/chain.md, "Kefir's levels on a chain").
		return fmt.Errorf("consistency %v: %w", c, ErrNotOfferedUnderAU)
	}
	if vr.Status(r.status.Load()) == vr.Recovering {
		// A replica recovering from a lost disk may hold nothing yet: even an
		// eventual read must not answer "absent" for a key that has existed
		// all along.
		return r.notLeader()
	}
	if c.Kind == level.Eventual && r.now() >= r.eventualUntil.Load() {
		// Cut off for longer than the eventual window (issue 24): its state
		// may be older than the level allows.
		if r.isLeader.Load() {
			return fmt.Errorf("%w: eventual read: this leader has not heard from a majority within the eventual window", ErrCannotServe)
		}
		return r.notLeader()
	}
	if needsLeader(c) && !r.isLeader.Load() && !(mutation.On && r.mut.followerLinearizable) && !r.chainReads(c) &&
		!(c.Kind == level.CrossClientMonotonic && r.opts.FollowerReads) {
		return r.notLeader()
	}
	return nil
}

// needsLeader reports whether level c is served at the leader only. bounded(t)
// is among them: a follower would time freshness from a heartbeat's arrival,
// which proves nothing when the sender was deposed (it keeps sending) or the
// message sat in a queue. A follower may serve it once freshness is proven by
// a round trip the follower starts and a leader that holds its lease.
func needsLeader(c level.Consistency) bool {
	switch c.Kind {
	case level.Linearizable, level.CrossClientMonotonic, level.BoundedVersions, level.BoundedTime:
		return true
	}
	return false
}

// CheckDurability accepts every level (docs/design/cad.md §1; Apply says
// where each is acknowledged).
func (r *Replica) CheckDurability(d level.Durability) error {
	if d < level.Sync || d > level.Async {
		return fmt.Errorf("durability %v: %w", d, level.ErrUnknownLevel)
	}
	return r.failed()
}

// Read serves a read at level c for session s.
func (r *Replica) Read(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, error) {
	res, err := r.serveRead(ctx, op, c, s)
	if err == nil {
		r.stampView(&res)
	}
	return res, err
}

func (r *Replica) serveRead(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, error) {
	if err := ctx.Err(); err != nil {
		return kv.Result{}, err
	}
	if err := r.fenceRead(&op); err != nil {
		return kv.Result{}, err
	}
	if c.IsZero() {
		c = level.ConsLinearizable
	}
	if err := r.CheckConsistency(c); err != nil {
		return kv.Result{}, err
	}
	switch r.routeRead(c) {
	case routeFollower:
		return r.followerRead(ctx, op)
	case routeLeader:
		return r.leaderRead(ctx, op)
	case routeChain:
		return r.chainRead(ctx, op)
	case routeSession:
		if err := r.waitSession(ctx, s.Need()); err != nil {
			return kv.Result{}, err
		}
		if err := r.sessionViews(s); err != nil {
			return kv.Result{}, err
		}
	}
	return r.readLocal(op)
}

// readRoute is how a read that CheckConsistency admitted is served.
type readRoute uint8

const (
	// routeLocal: from local state at once (eventual; bounded and
	// linearizable under the followerLinearizable mutation).
	routeLocal readRoute = iota
	// routeFollower: a follower's cross-client-monotonic read under the
	// active set's read lease (followerRead).
	routeFollower
	// routeLeader: at the leader, leadership confirmed (leaderRead).
	routeLeader
	// routeSession: once the token's versions are applied (waitSession,
	// sessionViews), from local state.
	routeSession
	// routeChain: a chain member's strong read, at any member (chainRead).
	routeChain
)

// routeRead decides how a read at level c (not zero) is served: the one
// copy of the choice, for the blocking Read (serveRead) and the stepped
// one (ReadStepped).
func (r *Replica) routeRead(c level.Consistency) readRoute {
	switch {
	case mutation.On && r.mut.followerLinearizable && needsLeader(c):
		// Deliberately broken (tests): local state, no proof of freshness.
		return routeLocal
	case c.Kind == level.CrossClientMonotonic && r.opts.FollowerReads && !r.isLeader.Load():
		return routeFollower
	case r.chainReads(c):
		return routeChain
	case needsLeader(c):
		return routeLeader
	case c.Kind == level.Session && !(mutation.On && r.mut.ignoreSession):
		return routeSession
	}
	return routeLocal
}

// sessionViews is the check a session read makes once the token's
// versions are applied (checkSessionViews), unless a mutation skips it.
func (r *Replica) sessionViews(s shard.Session) error {
	if mutation.On && r.mut.noSessionViews {
		return nil
	}
	return r.checkSessionViews(s)
}

// leaderRead serves a linearizable or cross-client-monotonic read at the
// leader: leadership confirmed (lease or read-index) as before, then the
// read is checked against the readable index R (cad.go). If a key it read
// has a later update than R — a cad write acknowledged but not committed,
// or (with follower reads) one not applied on every active-set member — it
// registers a durability wait for that op and reads again once R covers it.
func (r *Replica) leaderRead(ctx context.Context, op kv.Op) (kv.Result, error) {
	if err := r.linearizable(ctx, &op); err != nil {
		return kv.Result{}, err
	}
	return r.leaderServe(ctx, op)
}

// leaderServe is leaderRead once leadership is confirmed.
func (r *Replica) leaderServe(ctx context.Context, op kv.Op) (kv.Result, error) {
	deadline := time.Now().Add(r.opts.RequestTimeout)
	waited := false
	var tw0 time.Time
	loops := 0
	for {
		res, need, R, err := r.leaderCheck(op, waited)
		if err != nil {
			return kv.Result{}, err
		}
		if need <= R {
			if cadtraceOn && waited {
				r.ctr.sample("read.durwait.total", int64(time.Since(tw0)))
				r.ctr.sample(fmt.Sprintf("read.durwait.loops=%d", loops), 0)
			}
			return res, nil
		}
		var tw time.Time
		if cadtraceOn {
			loops++
			tw = time.Now()
		}
		if !waited {
			waited = true
			r.st.durWaits.Add(1)
			if cadtraceOn {
				tw0 = tw
				r.ctr.sample("read.durwait.gapOps(need-R)x1000", int64(need-R)*1000)
			}
		}
		if time.Now().After(deadline) {
			return kv.Result{}, ErrCannotServe
		}
		rw := &readWaiter{done: make(chan struct{}), kind: rwDurable, need: need}
		if err := r.sendRead(ctx, rw); err != nil {
			return kv.Result{}, err
		}
		if err := r.awaitRead(ctx, rw); err != nil {
			return kv.Result{}, err
		}
		if cadtraceOn {
			r.ctr.sample("read.durwait.oneWait(register->release)", int64(time.Since(tw)))
		}
		if rw.err != nil {
			return kv.Result{}, rw.err
		}
		if err := r.waitApplied(ctx, max(rw.idx, need), r.opts.RequestTimeout); err != nil {
			return kv.Result{}, err
		}
		if cadtraceOn && r.readable.Load() < need {
			r.ctr.sample("read.durwait.staleRAfterRelease", 0)
		}
	}
}

// leaderCheck reads op from the engine (and the async overlay) and returns
// the result with the op R must reach before it may be returned, and the R
// it was checked against: the result may be returned if need <= R.
func (r *Replica) leaderCheck(op kv.Op, waited bool) (res kv.Result, need, R uint64, err error) {
	ov := r.upd.overlayFor(r.readKeysOf(&op), false)
	if !waited && !(mutation.On && r.mut.noDurabilityWait) && !(mutation.On && r.mut.noPreReadCheck) {
		// Before the engine read: the latest update of every key read must
		// be readable already, or the read waits for it. The check after the
		// read (below) cannot see this: an update the engine does not show
		// yet may be applied, and R pass it, between the engine read and
		// that check, which then finds it readable and serves the older
		// value — for the connection's own cad write right after Apply
		// returned (docs/design/cad.md §10), or any write acknowledged
		// before the read began. An update indexed before this check is
		// either still indexed (need0 >= its op, so R0 >= its op: applied
		// before R0 was published, i.e. before the engine read) or pruned
		// before it (pruning needs it applied): either way the engine read
		// below shows it.
		R0 := r.readable.Load()
		if need0 := r.cadNeed(&op, R0, ov); need0 > R0 {
			return kv.Result{}, need0, R0, nil
		}
	}
	res, err = r.readWith(op, ov)
	if err != nil {
		return kv.Result{}, 0, 0, err
	}
	if h := r.mut.afterLeaderRead; mutation.On && h != nil {
		h()
	}
	R = r.readable.Load()
	need = r.cadNeed(&op, R, ov)
	if waited {
		// The read began before any update it has not seen was
		// acknowledged, so it only needs what it returned to be readable:
		// the engine's state, at most engineTop — loaded after the engine
		// read, and set before each write to it. Not applied: it is
		// published after the write, so the engine may already show a
		// version beyond both it and R, which other members lack (issue 7).
		// A hot key's later updates do not make it wait again.
		need = min(need, r.engineTop.Load())
	}
	if need <= R || (mutation.On && r.mut.noDurabilityWait) {
		if len(ov) > 0 {
			r.st.overlayReads.Add(1)
		}
		return res, R, R, nil
	}
	return res, need, R, nil
}

// followerRead serves a cross-client-monotonic read at a follower holding
// an active-set lease: from its engine if nothing it read (nor, for a scan,
// anything in the range) was updated after the readable index R it learned;
// else the read goes to the leader. Why R suffices: docs/design/cad.md §2.
func (r *Replica) followerRead(ctx context.Context, op kv.Op) (kv.Result, error) {
	if res, ok := r.tryFollowerRead(op); ok {
		return res, nil
	}
	rw := &readWaiter{done: make(chan struct{}), kind: rwFollower}
	if err := r.sendRead(ctx, rw); err != nil {
		return kv.Result{}, err
	}
	if err := r.awaitRead(ctx, rw); err != nil {
		return kv.Result{}, err
	}
	return r.followerAnswer(op, rw)
}

// followerAnswer is followerRead once the driver answered its rwFollower
// wait rw (vr FollowerRead): the read lease's R, or an error.
func (r *Replica) followerAnswer(op kv.Op, rw *readWaiter) (kv.Result, error) {
	if rw.err != nil {
		r.st.followerRedirects.Add(1)
		return kv.Result{}, r.notLeader()
	}
	R := rw.idx
	res, err := r.readLocal(op)
	if err != nil {
		return kv.Result{}, err
	}
	if need := r.cadNeed(&op, R, nil); need > R && !(mutation.On && r.mut.followerNoRCheck) {
		r.st.followerRedirects.Add(1)
		return kv.Result{}, r.notLeader()
	}
	r.st.followerReads.Add(1)
	return res, nil
}

// tryFollowerRead is followerRead under the published read lease
// (localFollowerLease): ok false if there is none or the read must go to the
// leader, which followerRead then decides with the driver.
func (r *Replica) tryFollowerRead(op kv.Op) (kv.Result, bool) {
	R, ok := r.localFollowerLease()
	if !ok {
		return kv.Result{}, false
	}
	res, err := r.readLocal(op)
	if err != nil {
		return kv.Result{}, false
	}
	if need := r.cadNeed(&op, R, nil); need > R && !(mutation.On && r.mut.followerNoRCheck) {
		return kv.Result{}, false
	}
	r.st.followerReads.Add(1)
	r.st.localReads.Add(1)
	return res, true
}

// cadNeed returns the op R must reach before op's result (already read
// from the engine) may be returned: the latest update of every key it read
// (ov: keys served from the async overlay, exempt), of every key in a
// scan's range. When the index does not know every op above R (shortly
// after a restart: keyUpdates.floor), the engine's latest versions stand in
// for point reads and a scan needs R to pass the floor.
func (r *Replica) cadNeed(op *kv.Op, R uint64, ov map[string]overlayEntry) uint64 {
	complete := r.upd.complete(R)
	if op.Kind == kv.KindScan || op.Kind == kv.KindEvalRO {
		// A read-only script may read any key: a scan of the whole
		// keyspace (its Key and End are nil).
		need := r.upd.needRange(op.Key, op.End)
		if !complete {
			need = max(need, r.upd.floorOp())
		}
		return need
	}
	var need uint64
	for _, k := range r.readKeysOf(op) {
		if _, ok := ov[string(k)]; ok {
			continue
		}
		n := r.upd.need1(k)
		if !complete {
			if v, err := latestVersion(r.db, k); err == nil {
				n = max(n, v)
			} else {
				n = max(n, r.upd.floorOp())
			}
		}
		need = max(need, n)
	}
	return need
}

func (r *Replica) sendRead(ctx context.Context, rw *readWaiter) error {
	select {
	case r.readc <- rw:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return r.closedErr()
	}
}

// linearizable waits until a read started now may be served locally.
// With the nilext fast path on, op says which keys the read depends on.
func (r *Replica) linearizable(ctx context.Context, op *kv.Op) error {
	if r.localLease() {
		r.st.leaseReads.Add(1)
		r.st.localReads.Add(1)
		return nil
	}
	rw := &readWaiter{done: make(chan struct{}), op: op}
	select {
	case r.readc <- rw:
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return r.closedErr()
	}
	select {
	case <-rw.done: // the lease answered at once: no timer needed
	default:
		if err := r.awaitRead(ctx, rw); err != nil {
			return err
		}
	}
	if rw.err != nil {
		return rw.err
	}
	// The leader applies what it committed within its own Ready loop.
	return r.waitApplied(ctx, rw.idx, r.opts.RequestTimeout)
}

// localLease confirms leadership for a read started now from the lease the
// driver published (publishLease), as the driver's LeaseRead would, without
// a round trip to the driver: two goroutine wake-ups per read, and a driver
// round that contends with the writes' (docs/design/local-lease-reads.md).
// False means ask the driver.
func (r *Replica) localLease() bool {
	ls := r.lease.Load()
	return ls != nil && !ls.follower && ((mutation.On && r.mut.localLeaseNoClock) || r.now() < ls.until) && r.applied.Load() >= ls.idx
}

// localFollowerLease is localLease for a follower's cross-client-monotonic
// read (the driver's vr.FollowerRead): the readable index it may serve up
// to, or false.
func (r *Replica) localFollowerLease() (uint64, bool) {
	ls := r.lease.Load()
	if ls == nil || !ls.follower || (!(mutation.On && r.mut.localLeaseNoClock) && r.now() >= ls.until) || r.applied.Load() < ls.idx {
		return 0, false
	}
	return ls.idx, true
}

// TryRead serves a read that confirms leadership (linearizable,
// cross-client-monotonic) at once if it can without waiting: this replica
// leads under a running lease (localLease) and everything the read returns
// is readable. ok false means it could not, with nothing done: the caller
// reads with Read or ReadDeferred, which wait. Event loops call it so that
// a leader's reads need not leave the loop for a goroutine.
func (r *Replica) TryRead(op kv.Op, c level.Consistency) (kv.Result, bool) {
	if r.fenceRead(&op) != nil {
		return kv.Result{}, false // Read refuses it
	}
	if c.IsZero() {
		c = level.ConsLinearizable
	}
	if c.Kind == level.CrossClientMonotonic && r.opts.FollowerReads && !r.isLeader.Load() {
		res, ok := r.tryFollowerRead(op)
		r.stampView(&res)
		return res, ok
	}
	if r.chainReads(c) && !(mutation.On && r.mut.followerLinearizable) {
		if r.CheckConsistency(c) != nil {
			return kv.Result{}, false
		}
		res, _, out, err := r.chainTry(op)
		if err != nil || out != chainServed {
			return kv.Result{}, false
		}
		r.stampView(&res)
		return res, true
	}
	if !r.leaseServes(c) {
		return kv.Result{}, false
	}
	res, need, R, err := r.leaderCheck(op, false)
	if err != nil || need > R {
		return kv.Result{}, false
	}
	r.st.leaseReads.Add(1)
	r.st.localReads.Add(1)
	r.stampView(&res)
	return res, true
}

// leaseServes reports whether a read of consistency c that confirms
// leadership may be served here at once: this replica leads under a running
// lease (TryRead's condition, and TryTxBegin's).
func (r *Replica) leaseServes(c level.Consistency) bool {
	return needsLeader(c) && !(mutation.On && r.mut.followerLinearizable) && r.CheckConsistency(c) == nil && r.localLease()
}

func (r *Replica) awaitRead(ctx context.Context, rw *readWaiter) error {
	return r.awaitDone(ctx, rw.done, r.opts.RequestTimeout, ErrCannotServe)
}

// awaitDone waits until done closes, at most d (then timeoutErr). If the
// replica closes first, done may still have closed: failAll finishes every
// waiter before r.done closes.
func (r *Replica) awaitDone(ctx context.Context, done <-chan struct{}, d time.Duration, timeoutErr error) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return timeoutErr
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		select {
		case <-done:
		default:
			return r.closedErr()
		}
	}
	return nil
}

// waitSession waits until this replica has applied need, a session token's
// last write and max read (versions are op numbers).
//
// A follower waits at most FollowerWait, then redirects to the leader.
//
// At the leader a version it has not applied is normally a write it answered
// before applying it: a cad or async write (acknowledged before its commit)
// or a sync write answered at its ordered point (docs/design/cad.md §10,
// §12). Such a write is in the leader's log (lastOp is set before any write
// of a Ready is answered) and is applied unless a view change drops it, so a
// need up to lastOp is waited for however slow the commit — up to
// RequestTimeout in all, as every leader wait (then ErrCannotServe: the
// group cannot commit, the session is not lost) — and the wait redirects as
// soon as this replica stops leading (publish wakes it). A need beyond the
// log — a write a view change lost, a token from another group — fails with
// shard.ErrSessionAhead after FollowerWait, as before.
func (r *Replica) waitSession(ctx context.Context, need uint64) error {
	start := time.Now()
	if done, err := r.untilApplied(ctx, need, r.opts.FollowerWait, nil); done || err != nil {
		return err
	}
	if err := r.sessionPastWait(need); err != nil {
		return err
	}
	left := r.opts.RequestTimeout - time.Since(start)
	if left <= 0 {
		return ErrCannotServe
	}
	// Past FollowerWait, at the leader, need within its log.
	done, err := r.untilApplied(ctx, need, left, func() error { return r.sessionPastWait(need) })
	if done || err != nil {
		return err
	}
	return ErrCannotServe
}

// sessionPastWait decides a session read that still waits for version
// need once FollowerWait passed: a follower redirects, a leader fails a need
// beyond its log (shard.ErrSessionAhead) and waits on (nil) for one within
// it. The one copy of the rule, for waitSession and the stepped read
// (stepped.go).
func (r *Replica) sessionPastWait(need uint64) error {
	if !r.isLeader.Load() {
		return r.redirect()
	}
	if err := r.chainHeadLost("needs", need); err != nil {
		return err // past a chain head's history: lost with an earlier head
	}
	if need > r.lastOp.Load() || (mutation.On && r.mut.sessionWaitLimited) {
		return r.sessionAhead(need)
	}
	return nil
}

func (r *Replica) sessionAhead(need uint64) error {
	return fmt.Errorf("%w: session needs version %d, replica has applied %d and its log ends at %d",
		shard.ErrSessionAhead, need, r.applied.Load(), r.lastOp.Load())
}

// redirect is the error of a read this replica cannot serve because it does
// not lead: the leader's address, or ErrCannotServe if none is known.
func (r *Replica) redirect() error {
	err := r.notLeader()
	if !errors.Is(err, ErrNotLeader) || r.leader.Load() == 0 {
		return ErrCannotServe
	}
	return err
}

// waitApplied waits until the applied op reaches idx, an op a linearizable
// or durability wait learned is committed, at most limit; then it fails
// (ErrCannotServe at the leader, else a redirect).
func (r *Replica) waitApplied(ctx context.Context, idx uint64, limit time.Duration) error {
	if done, err := r.untilApplied(ctx, idx, limit, nil); done || err != nil {
		return err
	}
	if r.isLeader.Load() {
		// Not a session's error: no token asked for idx.
		return ErrCannotServe
	}
	return r.redirect()
}

// untilApplied waits until the applied op reaches idx (true), d passes
// (false, nil), or ctx ends, the replica closes or check, called whenever
// the wait wakes without idx applied (and once before it sleeps), fails.
// Every wait is woken by notify (setApplied, publish), with one timer,
// stopped on return.
func (r *Replica) untilApplied(ctx context.Context, idx uint64, d time.Duration, check func() error) (bool, error) {
	return r.until(ctx, &r.applied, idx, d, check)
}

// until is untilApplied for any index the driver publishes and wakes
// notify for when it rises: applied (setApplied), or a chain member's
// readable index (publishReadable; chainDurableRead).
func (r *Replica) until(ctx context.Context, at *atomic.Uint64, idx uint64, d time.Duration, check func() error) (bool, error) {
	if at.Load() >= idx {
		return true, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	// A batch held for group commit would keep this waiter up to its
	// deadline: tell the driver someone waits (nilext_gc.go).
	r.gc.appliedWaiters.Add(1)
	defer r.gc.appliedWaiters.Add(-1)
	select {
	case r.gc.wake <- struct{}{}:
	default:
	}
	for {
		r.notifyMu.Lock()
		ch := r.notify
		r.notifyMu.Unlock()
		if at.Load() >= idx {
			return true, nil
		}
		if check != nil {
			if err := check(); err != nil {
				return false, err
			}
		}
		select {
		case <-ch:
		case <-t.C:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-r.done:
			return false, r.closedErr()
		}
	}
}

// readLocal evaluates a read against this replica's engine.
func (r *Replica) readLocal(op kv.Op) (kv.Result, error) { return r.readWith(op, nil) }

// readWith evaluates a read against the engine (kv.Read), keys in ov (the
// leader's pending async writes) excepted.
func (r *Replica) readWith(op kv.Op, ov map[string]overlayEntry) (kv.Result, error) {
	if op.Now == 0 {
		op.Now = r.readNow()
	}
	// Without the copy: a read's results are read-only (kv.Result), as the
	// single node's read path has them (shard.Shard.readGet); the copy and
	// its allocation were a tenth of a chain head's pipelined GET.
	engineGet := r.db.GetShared
	scan := shard.EngineScanner(r.db)
	if kv.MultiKey(&op) && !(mutation.On && r.mut.tornMultiReads) {
		// A read of several keys sees the engine at one version: the
		// driver applies batches between the reads of single keys, and a
		// read that saw one key before a batch and another after it would
		// return a state no prefix of the log ever had (a write that
		// completed before another began, seen only in part). The engine's
		// last version is every key's newest, so the snapshot pins nothing
		// retention would otherwise drop.
		snap := r.db.Snapshot(0)
		defer snap.Close()
		engineGet = snap.Get
		scan = shard.SnapshotScannerInto(snap, op.ScanBuf) // the caller's buffer, if it lends one (kv.Op.ScanBuf)
	}
	n := 0
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
		if h := r.mut.betweenKeys; mutation.On && h != nil {
			if n++; n == 2 {
				h()
			}
		}
		if e, ok := ov[string(k)]; ok {
			if e.tomb {
				return nil, nil, 0, false, nil // a miss reports no version
			}
			return e.value, e.meta, e.op, true, nil
		}
		v, ok, err := r.getFrom(engineGet, k)
		return v.Data, v.Meta, v.Version, ok, err
	}
	res, err := kv.Read(get, scan, &op, shard.DefaultMaxScan)
	if err != nil {
		return res, err
	}
	// The fence again, after the read: the one on arrival (fenceRead in
	// Read, TryRead, ReadDeferred) ran before the read's freshness wait
	// (leadership, waitApplied, waitSession), which may have applied the
	// slot's hand-over — a lagging follower, a new leader. flush publishes
	// a batch's table before applied passes the batch, so the table loaded
	// now is at least as new as every op the wait asked for: a read that
	// must see the hand-over is refused rather than served from the frozen
	// copy. (The engine may be a batch ahead of it; a read that did not
	// wait for that batch may return the state just before it.)
	if err := r.fenceRead(&op); err != nil {
		return kv.Result{}, err
	}
	return res, nil
}

// readNow is the time (unix ms) a read decides key expiry at
// (docs/consistency.md, "Key expiry"): the leader's own clock, which also
// stamped the writes; any other replica's clock plus ClockSkew, so that a
// replica whose clock is behind the leader's by up to ClockSkew still hides
// every key the leader has expired (one ahead hides keys early, by at most
// twice ClockSkew).
func (r *Replica) readNow() int64 {
	now := r.clock.Now().UnixMilli()
	if r.isLeader.Load() {
		return now
	}
	return now + r.opts.ClockSkew.Milliseconds()
}

// getFrom reads key k with get (the engine's latest, or a snapshot's); a
// miss is not an error, a failure is shard.ErrUnavailable. (kv.Read keeps
// reserved keys from reaching it.)
func (r *Replica) getFrom(get func([]byte) (storage.Value, error), k []byte) (storage.Value, bool, error) {
	v, err := get(k)
	if errors.Is(err, storage.ErrNotFound) {
		return storage.Value{}, false, nil
	}
	if err != nil {
		return v, false, fmt.Errorf("%w: get: %w", shard.ErrUnavailable, err)
	}
	return v, true, nil
}

// ---- status ----

// Status reports progress in shard terms: LastVersion is the applied op.
func (r *Replica) Status() shard.Status {
	st := r.db.Stats()
	return shard.Status{
		LastVersion: r.applied.Load(),
		LastPos:     uint64(st.LastPos),
		DurablePos:  uint64(st.DurablePos),
		Writes:      r.st.applied.Load(),
		Syncs:       r.st.fsyncs.Load(),
		// The client table's rows in the engine, which the engine counts
		// among its keys (DBSIZE subtracts them).
		Clients: int(r.app.nrows.Load()),
		// The applied mark and the view history (engine_mark.go).
		Reserved: int(r.app.nreserved.Load()),
	}
}

// Info is the replica's protocol state as last published by the driver.
type Info struct {
	Self     uint64
	Status   vr.Status
	View     uint64
	Leader   uint64
	IsLeader bool
	Commit   uint64
	Applied  uint64
	Failed   error
	// DLogLen is the nilext d-log's length (pending nilext updates).
	DLogLen int
	// Readable is the readable index R this replica knows (cad.go).
	Readable uint64
	// Nilext view changes (vr Info): NilextCycles counts view changes whose
	// d-logs at hand ordered pending updates in a cycle (with every
	// replica's log, the group stays stopped); NilextStaleWaits those that
	// waited for fresh d-logs; DLogStale says this replica restarted and its
	// d-log does not count in d-log recovery yet.
	NilextCycles, NilextStaleWaits uint64
	DLogStale                      bool
	// Reconfiguration (reconfig.go; vr Info): the epoch; Joining: a new
	// member still pulling the epoch's start state; Leaving: not a member of
	// the epoch, answering state transfer; Retired: leaving, and enough new
	// members hold the start state: the caller may stop this replica.
	Epoch                     uint64
	Joining, Leaving, Retired bool
}

// Info reports the replica's protocol state.
func (r *Replica) Info() Info {
	return Info{Self: r.cfg.Self, Status: vr.Status(r.status.Load()), View: r.view.Load(),
		Leader: r.leader.Load(), IsLeader: r.isLeader.Load(), Commit: r.commit.Load(),
		Applied: r.applied.Load(), Failed: r.failed(), DLogLen: int(r.dlogLen.Load()), Readable: r.readable.Load(),
		NilextCycles: r.nxCycles.Load(), NilextStaleWaits: r.nxStaleWaits.Load(), DLogStale: r.dlogStale.Load(),
		Epoch: r.rc.epoch.Load(), Joining: r.rc.joining.Load(), Leaving: r.rc.leaving.Load(), Retired: r.rc.retired.Load()}
}

// Stats returns the replica's counters.
func (r *Replica) Stats() Stats {
	return Stats{Readies: r.st.readies.Load(), Fsyncs: r.st.fsyncs.Load(), Persisted: r.st.persisted.Load(),
		Applied: r.st.applied.Load(), Proposals: r.st.proposals.Load(), LeaseReads: r.st.leaseReads.Load(), LocalReads: r.st.localReads.Load(),
		IndexReads: r.st.indexReads.Load(), Checkpoints: r.st.ckpts.Load(), SnapsSent: r.st.snapsSent.Load(), SnapsCaptured: r.st.snapsCaptured.Load(),
		SnapsLoaded: r.st.snapsLoaded.Load(), Forgets: r.st.forgets.Load(), NilextFast: r.st.nxFast.Load(), NilextFallbacks: r.st.nxFallbacks.Load(),
		NilextSent: r.st.nxSent.Load(), NilextAcksSent: r.st.nxAcksSent.Load(), NilextSlowReads: r.st.nxSlowReads.Load(),
		DurabilityWaits: r.st.durWaits.Load(), DurabilityRounds: r.st.durRounds.Load(), FollowerReads: r.st.followerReads.Load(),
		FollowerRedirects: r.st.followerRedirects.Load(), ChainClean: r.st.chainClean.Load(), ChainToTail: r.st.chainToTail.Load(), ChainWaits: r.st.chainWaits.Load(), ChainDurableWaits: r.st.chainDurableWaits.Load(), ChainVersionReads: r.st.chainVersionReads.Load(), ChainVersionFallbacks: r.st.chainVersionFallbacks.Load(), ChainVersionAnswers: r.st.chainVersionAnswers.Load(), ChainHeldReads: r.st.chainHeldReads.Load(), ChainVersionQueries: r.st.chainVersionQueries.Load(), ChainVersionWaited: r.st.chainVersionWaited.Load(), EarlyAcks: r.st.earlyAcks.Load(), OverlayReads: r.st.overlayReads.Load(),
		DeferredReads: r.st.durDeferred.Load(), TxEarlyAborts: r.st.earlyAborts.Load(), TxHolds: r.st.txHolds.Load(), TxHeldAborts: r.st.heldAborts.Load(), TxFreshReads: r.st.freshReads.Load(), ViewChanges: r.vt.viewChanges.Load(), LeaderChanges: r.vt.leaderChanges.Load(),
		Depositions: r.vt.depositions.Load(), WritesRefusedNoLeader: r.vt.refused.Load(), ExpiredKeys: r.exp.deleted.Load()}
}

// ---- snapshots ----

// The capture itself (scan, encoding) is in snapshot.go.

// snapshotMetas reads the meta trailer of a snapshot's data (captureData)
// whose n keys start at rd: the meta of the key at each index. Data without
// a trailer (no key has meta, or a build before meta) has none.
func snapshotMetas(rd reader, n uint64) (map[uint64][]byte, error) {
	for i := uint64(0); i < n; i++ {
		rd.bytes()
		rd.bytes()
		rd.uvarint()
		rd.varint()
	}
	if rd.err != nil {
		return nil, ErrCorruptEntry
	}
	if len(rd.b) == 0 {
		return nil, nil
	}
	m := rd.uvarint()
	if rd.err != nil || m > n {
		return nil, ErrCorruptEntry
	}
	metas := make(map[uint64][]byte, m)
	for j := uint64(0); j < m; j++ {
		i, meta := rd.uvarint(), rd.bytes()
		if rd.err != nil || i >= n {
			return nil, ErrCorruptEntry
		}
		metas[i] = meta
	}
	return metas, nil
}

// restore makes the engine hold the snapshot's state (committed state at
// s.Op; the engine may hold older committed state, or newer if it was ahead
// after a restart) and syncs it, before the log records the snapshot point.
func (r *Replica) restore(s *vr.Snapshot) error {
	if err := r.restoreRecords(s); err != nil {
		return err
	}
	var recs []storage.Record
	if s.Op > r.app.markTop {
		// Last, so the engine holds it only with the state before it.
		recs = append(recs, storage.Record{Key: appliedKey, Value: binary.BigEndian.AppendUint64(nil, s.Op), Version: s.Op})
		if _, err := r.db.Append(recs...); err != nil {
			return fmt.Errorf("vrshard: restore snapshot: %w", err)
		}
	}
	if _, err := r.db.Sync(r.db.LastPos()); err != nil {
		return fmt.Errorf("vrshard: restore snapshot: engine sync: %w", err)
	}
	r.app.replayTo = max(r.app.replayTo, r.db.LastVersion())
	if err := r.app.loadRows(); err != nil {
		return err
	}
	if err := r.app.loadMarks(); err != nil {
		return err
	}
	r.publishViews()
	r.app.nreserved.Store(int64(r.app.reservedRows()))
	r.upd.raiseFloor(max(s.Op, r.db.LastVersion()))
	r.setApplied(s.Op)
	r.sinceCkpt = 0
	r.st.snapsLoaded.Add(1)
	r.log.Info("restored snapshot", "op", s.Op, "pages", r.pagesIn+1)
	r.pagesIn = 0
	return nil
}

// restorePage writes a page of a paged snapshot (core.Snapshot.More) into
// the engine, nothing else: the last page restores (restore). Until then
// the engine holds state that is no op's, so the first page marks the
// disk recovering (durably, before any page's record can reach the disk):
// a restart then recovers from the chain, as a wiped member does, rather
// than replay its log over it.
func (r *Replica) restorePage(s *vr.Snapshot) error {
	if !r.recovering {
		r.recovering = true
		if err := r.awaitSync(); err != nil {
			return err
		}
		r.wal.addFlags(true)
		if err := r.wal.write(); err != nil {
			return err
		}
		if err := r.wal.sync(); err != nil {
			return err
		}
		r.st.fsyncs.Add(1)
	}
	r.pagesIn++
	if err := r.restoreRecords(s); err != nil {
		return err
	}
	// Synced page by page, at the pre-copy's pace: left to the last page,
	// the whole state's write-back (200 MB in the A2 benchmark) hit the
	// shared disk at once, and the members' own fsyncs waited behind it
	// (the chain's throughput fell to a fifth for a second).
	if _, err := r.db.Sync(r.db.LastPos()); err != nil {
		return fmt.Errorf("vrshard: restore snapshot page: engine sync: %w", err)
	}
	return nil
}

// restoreRecords writes a snapshot's records (a page's: the keys after
// s.From up to s.Next, or to the end for the last page) that the engine
// lacks, and deletes the keys in that range the snapshot does not hold;
// not synced.
func (r *Replica) restoreRecords(s *vr.Snapshot) error {
	rd := reader{b: s.Data}
	n := rd.uvarint()
	if rd.err != nil || n > uint64(len(rd.b)) {
		return fmt.Errorf("vrshard: snapshot at %d: %w", s.Op, ErrCorruptEntry)
	}
	metas, err := snapshotMetas(rd, n)
	if err != nil {
		return fmt.Errorf("vrshard: snapshot at %d: %w", s.Op, err)
	}
	in := make(map[string]struct{}, n)
	// Its records (versions <= s.Op) become visible as they are written.
	r.engineTop.Store(max(r.engineTop.Load(), s.Op))
	var recs []storage.Record
	flush := func() error {
		if len(recs) == 0 {
			return nil
		}
		_, err := r.db.Append(recs...)
		recs = recs[:0]
		if err != nil {
			return fmt.Errorf("vrshard: restore snapshot: %w", err)
		}
		return nil
	}
	for i := uint64(0); i < n; i++ {
		k, v := rd.bytes(), rd.bytes()
		ver, ts := rd.uvarint(), rd.varint()
		if rd.err != nil {
			return fmt.Errorf("vrshard: snapshot at %d: %w", s.Op, ErrCorruptEntry)
		}
		in[string(k)] = struct{}{}
		if bytes.Equal(k, appliedKey) {
			continue // the sender's mark: this engine's is written below
		}
		if vs, err := r.db.Versions(k); err == nil && len(vs) > 0 && vs[0].Version >= ver {
			continue // same history: the engine has this version or a later one
		}
		recs = append(recs, storage.Record{Key: k, Value: v, Meta: metas[i], Version: ver, Timestamp: ts})
		if len(recs) >= 1024 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	// Keys the engine has that the snapshot does not were deleted by an op
	// up to s.Op: in a page's range, (From, Next], or (From, end) for the
	// last page.
	var dels []storage.Record
	var start, end []byte
	if s.From != nil {
		start = append(append(start, s.From...), 0)
	}
	if s.More {
		end = append(append(end, s.Next...), 0)
	}
	err = r.db.Scan(start, end, 0, 0, func(k []byte, v storage.Value) bool {
		if _, ok := in[string(k)]; !ok && v.Version < s.Op && !bytes.Equal(k, appliedKey) {
			dels = append(dels, storage.Record{Key: append([]byte(nil), k...), Version: s.Op, Tombstone: true})
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("vrshard: restore snapshot: scan: %w", err)
	}
	recs = append(recs, dels...)
	if err := flush(); err != nil {
		return err
	}
	r.log.Debug("restored snapshot records", "op", s.Op, "keys", n, "deleted", len(dels), "last", !s.More)
	return nil
}

// fenceRead refuses a read of a key whose slot the group does not serve by
// its own table as of its last applied batch (kv/slots.go): whatever map
// routed the read here, a group that handed a slot over serves none of its
// keys.
func (r *Replica) fenceRead(op *kv.Op) error {
	if mutation.On && (r.mut.slotsUnfenced || r.mut.slotsReadUnfenced) {
		return nil
	}
	return r.app.pubSlots.Load().Check(op)
}

// SlotTable returns the group's slot table as of its last applied batch
// (nil: the group has none and serves every slot it is routed).
func (r *Replica) SlotTable() *kv.SlotTable { return r.app.pubSlots.Load() }
