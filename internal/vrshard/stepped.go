package vrshard

import (
	"time"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// Stepped mode (Options.stepped): the replica starts no goroutine — no
// driver, no syncer, no transport — and a caller delivers its events and
// collects its effects on one goroutine, the way the simulator drives a
// Node (internal/sim; host_sim_test.go). The events go to the same handlers
// a process's driver (run) calls, followed by the same afterEvents; what
// differs is only where events come from and where off-driver work runs:
//
//   - the off-driver work (env.go executor) is queued here: the log fsync in
//     flight (syncWork, run by SyncDone when the caller's simulated disk
//     says it finished, or at once when the driver waits for it:
//     awaitSync), and checkpoint engine fsyncs, snapshot captures and large
//     sends (work, run at the next tick); their results land in the
//     replica's result channels, and each step drains those into the
//     handlers, as run's select would;
//   - the group-commit deadline (nilext_gc.go armHold) is a time on the
//     replica's clock that the next step past it fires;
//   - clients submit writes with ProposeStepped and reads with
//     ReadStepped, which never block, and poll what they got back.
//
// The storage must start no goroutine either: Options.Storage.Inline, and
// the log's filler off (Open does both in stepped mode).

// stepState is stepped mode's state and executor.
type stepState struct {
	r        *Replica
	work     []func() // off-driver work to run at the next tick
	syncWork func()   // the log fsync in flight, not run yet
	syncGen  uint64   // bumped with each fsync started
	holdDue  time.Time
	never    chan time.Time // gc.timerC while the hold deadline is armed
	props    []*proposal
}

func newStepState(r *Replica) *stepState {
	return &stepState{r: r, never: make(chan time.Time)}
}

func (s *stepState) goWork(work func()) { s.work = append(s.work, work) }

func (s *stepState) syncLog(work func()) {
	s.syncWork = work
	s.syncGen++
}

func (s *stepState) expedite() {
	if w := s.syncWork; w != nil {
		s.syncWork = nil
		w()
	}
}

// SyncPending reports the log fsync in flight that the caller has to
// complete (SyncDone), by a number that grows with each fsync started (0:
// none). A caller whose disk takes time schedules SyncDone(gen) for later.
func (r *Replica) SyncPending() uint64 {
	if r.step1.syncWork == nil {
		return 0
	}
	return r.step1.syncGen
}

// SyncDone runs the log fsync gen (SyncPending) if it has not run yet and
// hands its result to the driver.
func (r *Replica) SyncDone(gen uint64) {
	if s := r.step1; s.syncWork != nil && s.syncGen == gen {
		s.expedite()
	}
	r.afterStep()
}

// StepMessages delivers a batch of peer frames from member `from`, as the
// transport hands them to deliver: decoded by the engine's codec
// (peerEngine.Decode), which fails a batch that does not decode or is not from
// `from` to this replica (the transport would close the connection).
func (r *Replica) StepMessages(from uint64, in []frame.Message) error {
	if r.failed() != nil {
		return nil
	}
	b, err := r.eng.Decode(from, r.cfg.Self, in)
	if err != nil {
		return err
	}
	r.step(inbound{from: from, batch: b})
	r.afterStep()
	return nil
}

// StepTick runs the replica's timers: the core's tick, the group-commit
// deadline if it passed, and the off-driver work queued since the last
// tick.
func (r *Replica) StepTick() {
	if r.failed() != nil {
		return
	}
	s := r.step1
	work := s.work
	s.work = nil
	for _, w := range work {
		w()
	}
	r.onTick()
	r.afterStep()
}

// afterStep drains the results of off-driver work into their handlers,
// fires a due group-commit deadline and takes an arrived apply waiter, then
// runs afterEvents, as run does after its select. A handler's error stops
// the replica (fail), which then fails every waiter, as run's exit does.
func (r *Replica) afterStep() {
	s := r.step1
	if r.failed() != nil {
		return
	}
	err := func() error {
		for {
			select {
			case res := <-r.syncDone:
				if err := r.synced(res); err != nil {
					return err
				}
				continue
			case res := <-r.ckptDone:
				if err := r.finishCheckpoint(res); err != nil {
					return err
				}
				continue
			case res := <-r.snapDone:
				if err := r.captured(res); err != nil {
					return err
				}
				continue
			case to := <-r.largeDone:
				r.sentLarge(to)
				continue
			case <-r.gc.wake:
				r.applyWaiterArrived()
				continue
			case f := <-r.expDone:
				r.expired(f)
				continue
			default:
			}
			break
		}
		if r.gc.timerC != nil && !r.clock.Now().Before(s.holdDue) {
			r.holdExpired()
		}
		props := s.props
		s.props = nil
		return r.afterEvents(props)
	}()
	if err != nil {
		r.fail(err)
		r.stopStepped()
	}
}

// stopStepped ends a stepped replica: every waiter fails, as when run
// exits.
func (r *Replica) stopStepped() {
	r.failAll(ErrOutcomeUnknown)
	select {
	case <-r.done:
	default:
		close(r.done)
	}
}

// closeStepped is Close's first half in stepped mode: the queued work runs
// (so no result is awaited that nobody produces), then the replica stops.
func (r *Replica) closeStepped() {
	s := r.step1
	s.expedite()
	for len(s.work) > 0 {
		w := s.work[0]
		s.work = s.work[1:]
		w()
	}
	r.stopStepped()
}

// ProposeStepped is Apply without waiting: it hands reqs to the driver and
// returns their batch, which the caller polls (Done). Writes this replica
// cannot take (not the leader, closed) are answered in reqs at once and
// nil is returned. Keys and values are not size-checked (Apply's
// applyWithoutOversize): the caller's writes are small.
func (r *Replica) ProposeStepped(reqs []shard.WriteReq) *SteppedWrite {
	err := r.failed()
	if err == nil && !r.isLeader.Load() {
		err = r.notLeader()
	}
	if err != nil {
		for i := range reqs {
			reqs[i].Result, reqs[i].Err = kv.Result{}, err
		}
		return nil
	}
	bw, pp, _ := r.newBatch(reqs)
	bw.deadline = r.clock.Now().Add(r.opts.RequestTimeout)
	r.step1.props = append(r.step1.props, pp...)
	r.afterStep()
	w := &SteppedWrite{bw: bw}
	if bw.held != nil {
		// Held behind commits in flight (txwait.go): Done decides it once
		// they finish, or at txHoldMax, as Apply's proposeHeld would.
		r.st.txHolds.Add(1)
		w.holdUntil = r.clock.Now().Add(txHoldMax)
	}
	return w
}

// SteppedWrite is a batch of writes ProposeStepped took; holdUntil bounds
// its hold while it has one (bw.held).
type SteppedWrite struct {
	bw        *batchWait
	holdUntil time.Time
}

// Done reports whether every write of the batch is finished: acknowledged
// (at its durability level) or failed. Then Result(i) is write i's reply as
// a client would get it once Apply and Wait returned: an early write
// whose acknowledgement failed has an unknown outcome (ErrOutcomeUnknown or
// the failure). A batch held behind commits in flight is decided here, in
// the caller's poll, once they finished or its hold ran out (proposeHeld's
// wait, polled): the caller polls after every event, which is when a
// commit can finish.
func (w *SteppedWrite) Done() bool {
	if bw := w.bw; bw.held != nil {
		r := bw.r
		if r.heldReleased(bw) || !r.clock.Now().Before(w.holdUntil) {
			if pp := r.decideHeld(bw); len(pp) > 0 {
				r.step1.props = append(r.step1.props, pp...)
				r.afterStep()
			}
		}
	}
	select {
	case <-w.bw.done:
		return true
	default:
		return false
	}
}

// Result is write i's reply (after Done).
func (w *SteppedWrite) Result(i int) (kv.Result, error) {
	p := &w.bw.ps[i]
	if p.early {
		if p.err != nil {
			return kv.Result{}, p.err
		}
		return p.ores, p.oerr
	}
	return p.res, p.err
}

// Expired reports whether the batch's RequestTimeout passed (Apply's
// caller would then have given up: the outcome is unknown).
func (w *SteppedWrite) Expired() bool {
	return !w.bw.r.clock.Now().Before(w.bw.deadline)
}

// SteppedRead is a read that never blocks, served by the route a process's
// Read takes (routeRead): a linearizable, bounded or cross-client-monotonic
// read at the leader takes the steps of leaderRead (linearizable, then
// leaderServe), a cross-client-monotonic one at a follower with
// FollowerReads those of followerRead, a session read those of
// waitSession (sessionPastWait, then sessionViews), each wait turned into a
// state the caller polls (Poll) after every event; an eventual read is
// served at once (CheckConsistency holds its window).
type SteppedRead struct {
	r        *Replica
	op       kv.Op
	rw       *readWaiter // the driver's confirmation or durability wait in flight
	follower bool        // rw is a follower's read-lease wait (followerRead)
	idx      uint64      // applied must reach it before the engine is read
	waited   bool        // a durability wait ran (leaderCheck)
	// session: a session read waiting for sess's versions since start;
	// waiter: it counts in the group commit's applied waiters
	// (untilApplied), until it finishes.
	session bool
	sess    shard.Session
	start   time.Time
	waiter  bool
	// deferred: the read may be deferred (ReadDeferredStepped) and has not
	// tried yet; held: it was, rw is its reply's durability wait and
	// heldRes its value.
	deferred bool
	held     bool
	heldRes  kv.Result
	deadline time.Time
	res      kv.Result
	err      error
	done     bool
}

// ReadStepped starts a read of op at level c (zero: linearizable) for
// session s (read at session level only).
func (r *Replica) ReadStepped(op kv.Op, c level.Consistency, s shard.Session) *SteppedRead {
	return r.readStepped(op, c, s, false)
}

// ReadDeferredStepped is ReadDeferred without waiting (deferred.go): a
// read at the leader whose keys' latest update is a cad write not yet
// readable takes that write's value (deferredRead, after the leadership
// confirmation) and is answered once R covers the write — the held
// reply's wait (readAck) as a durability wait the caller polls. Every
// other read is ReadStepped's.
func (r *Replica) ReadDeferredStepped(op kv.Op, c level.Consistency, s shard.Session) *SteppedRead {
	if c.IsZero() {
		c = level.ConsLinearizable
	}
	return r.readStepped(op, c, s, r.deferrable(&op, c))
}

func (r *Replica) readStepped(op kv.Op, c level.Consistency, s shard.Session, deferred bool) *SteppedRead {
	if c.IsZero() {
		c = level.ConsLinearizable
	}
	now := r.clock.Now()
	sr := &SteppedRead{r: r, op: op, start: now, deadline: now.Add(r.opts.RequestTimeout), deferred: deferred}
	if err := r.CheckConsistency(c); err != nil {
		sr.finish(kv.Result{}, err)
		return sr
	}
	switch r.routeRead(c) {
	case routeLocal:
		sr.finish(r.readLocal(op))
		return sr
	case routeSession:
		sr.session, sr.sess = true, s
		if r.applied.Load() < s.Need() {
			// As untilApplied: a batch held for group commit would keep
			// this read waiting up to its deadline; tell the driver.
			sr.waiter = true
			r.gc.appliedWaiters.Add(1)
			select {
			case r.gc.wake <- struct{}{}:
			default:
			}
			r.afterStep()
		}
	case routeChain:
		// A chain member's strong read, stepped: served or sent to the
		// tail at once; a read that would wait (dirty at the tail, no
		// lease yet) fails as unservable now, for the caller to retry.
		// The stepped paths' one user, the host simulation, runs VR
		// groups only (TxBeginStepped included: a chain's BEGIN is
		// chainTxBegin's, at the head).
		res, _, out, err := r.chainTry(op)
		switch {
		case err != nil || out == chainServed:
			sr.finish(res, err)
		case out == chainToTail:
			sr.finish(kv.Result{}, r.toTail())
		default:
			sr.finish(kv.Result{}, ErrCannotServe)
		}
		return sr
	case routeFollower:
		if res, ok := r.tryFollowerRead(op); ok {
			sr.finish(res, nil)
			return sr
		}
		sr.follower = true
		sr.rw = &readWaiter{done: make(chan struct{}), kind: rwFollower}
		r.read(sr.rw)
		r.afterStep()
	default: // routeLeader
		if r.localLease() {
			r.st.leaseReads.Add(1)
			r.st.localReads.Add(1)
			break
		}
		sr.rw = &readWaiter{done: make(chan struct{}), op: &sr.op}
		r.read(sr.rw)
		r.afterStep()
	}
	sr.Poll()
	return sr
}

func (sr *SteppedRead) finish(res kv.Result, err error) {
	sr.res, sr.err, sr.done = res, err, true
	if sr.waiter {
		sr.waiter = false
		sr.r.gc.appliedWaiters.Add(-1)
	}
	if err == nil {
		sr.r.stampView(&sr.res)
	}
}

// pollSession is Poll for a session read: waitSession's steps.
func (sr *SteppedRead) pollSession() bool {
	r := sr.r
	if need := sr.sess.Need(); r.applied.Load() < need {
		if r.clock.Now().Sub(sr.start) < r.opts.FollowerWait {
			return false
		}
		if err := r.sessionPastWait(need); err != nil {
			sr.finish(kv.Result{}, err)
			return true
		}
		return false
	}
	if err := r.sessionViews(sr.sess); err != nil {
		sr.finish(kv.Result{}, err)
		return true
	}
	sr.finish(r.readLocal(sr.op))
	return true
}

// Poll advances the read as far as it can now and reports whether it is
// finished (Result).
func (sr *SteppedRead) Poll() bool {
	r := sr.r
	for !sr.done {
		if err := r.failed(); err != nil {
			sr.finish(kv.Result{}, err)
			break
		}
		if !r.clock.Now().Before(sr.deadline) {
			sr.finish(kv.Result{}, ErrCannotServe)
			break
		}
		if sr.session {
			return sr.pollSession()
		}
		if sr.rw != nil {
			select {
			case <-sr.rw.done:
			default:
				return false
			}
			rw := sr.rw
			sr.rw = nil
			if sr.held {
				// The deferred reply's wait (readAck.Await): R covers the
				// write whose value it holds, in the view that appended it.
				if rw.err != nil {
					sr.finish(kv.Result{}, rw.err)
				} else {
					sr.finish(sr.heldRes, nil)
				}
				break
			}
			if sr.follower {
				sr.finish(r.followerAnswer(sr.op, rw))
				break
			}
			if rw.err != nil {
				sr.finish(kv.Result{}, rw.err)
				break
			}
			sr.idx = max(sr.idx, rw.idx)
		}
		if r.applied.Load() < sr.idx {
			if !r.isLeader.Load() {
				sr.finish(kv.Result{}, r.redirect())
				break
			}
			return false
		}
		if sr.deferred {
			// ReadDeferred's step after the confirmation: the value of a
			// cad write that is not readable yet, held until R covers it.
			sr.deferred = false
			res, ack, err := r.deferredRead(sr.op)
			if err != nil {
				sr.finish(kv.Result{}, err)
				break
			}
			if ack != nil {
				if mutation.On && r.mut.deferNoWait {
					sr.finish(res, nil) // the mutation: released at once
					break
				}
				sr.held, sr.heldRes = true, res
				sr.rw = &readWaiter{done: make(chan struct{}), kind: rwDurable, need: ack.need, deferred: true, view: ack.view}
				r.read(sr.rw)
				r.afterStep()
				continue
			}
		}
		res, need, R, err := r.leaderCheck(sr.op, sr.waited)
		if err != nil {
			sr.finish(kv.Result{}, err)
			break
		}
		if need <= R {
			sr.finish(res, nil)
			break
		}
		if !sr.waited {
			sr.waited = true
			r.st.durWaits.Add(1)
		}
		sr.idx = max(sr.idx, need)
		sr.rw = &readWaiter{done: make(chan struct{}), kind: rwDurable, need: need}
		r.read(sr.rw)
		r.afterStep()
	}
	return true
}

// Result is the read's reply (after Poll reported it finished).
func (sr *SteppedRead) Result() (kv.Result, error) { return sr.res, sr.err }

// SteppedNilext is NilextApply for one write, without waiting: the
// coordinated call goes to the driver (nxStart), and Poll settles it once
// it completed or NilextTimeout passed on the replica's clock
// (nilextSettle); a write the fast path did not complete takes the ordered
// path here (ProposeStepped) with the fast path's identity, so a copy
// already in some d-log is applied once.
type SteppedNilext struct {
	r        *Replica
	req      [1]shard.WriteReq
	bw       *batchWait
	calls    []*nxCall
	ids      []nxIdent
	deadline time.Time
	ordered  *SteppedWrite // the ordered fallback, once taken
	res      kv.Result
	err      error
	done     bool
	// Fast reports whether the write completed on the fast path.
	Fast bool
}

// NilextStepped starts q (a nilext-eligible write without an id; see
// NilextEligible) on the fast path. fallbackID identifies it on the ordered
// path when the fast path sends nothing (it rests after a timeout, or apply
// would reject the write).
func (r *Replica) NilextStepped(q shard.WriteReq, fallbackID shard.ReqID) *SteppedNilext {
	sn := &SteppedNilext{r: r}
	sn.req[0] = q
	if err := r.failed(); err != nil {
		sn.res, sn.err, sn.done = kv.Result{}, err, true
		return sn
	}
	if !r.opts.Nilext || r.clock.Now().UnixNano() < r.nxCool.Load() || r.nilextValid(&q.Op) != nil {
		r.st.nxFallbacks.Add(1)
		sn.req[0].ID = fallbackID
		sn.fallback()
		return sn
	}
	sn.bw, sn.calls, sn.ids = r.nilextCalls(sn.req[:])
	sn.deadline = r.clock.Now().Add(r.opts.NilextTimeout)
	r.nxStart(sn.calls)
	r.afterStep()
	sn.Poll()
	return sn
}

func (sn *SteppedNilext) fallback() {
	sn.ordered = sn.r.ProposeStepped(sn.req[:])
	if sn.ordered == nil {
		sn.res, sn.err, sn.done = sn.req[0].Result, sn.req[0].Err, true
	}
}

// Poll advances the write and reports whether it is finished (Result).
func (sn *SteppedNilext) Poll() bool {
	if sn.done {
		return true
	}
	if sn.ordered != nil {
		switch {
		case sn.ordered.Done():
			sn.res, sn.err = sn.ordered.Result(0)
		case sn.ordered.Expired():
			sn.res, sn.err = kv.Result{}, ErrOutcomeUnknown
		default:
			return false
		}
		sn.done = true
		return true
	}
	select {
	case <-sn.bw.done:
	default:
		if sn.r.clock.Now().Before(sn.deadline) {
			return false
		}
	}
	if fb := sn.r.nilextSettle(sn.req[:], sn.calls, sn.ids); len(fb) == 0 {
		sn.res, sn.err, sn.done, sn.Fast = sn.req[0].Result, sn.req[0].Err, true, true
		return true
	}
	sn.fallback()
	return sn.done
}

// Result is the write's reply (after Poll reported it finished): a
// fast-path completion is OK without a version.
func (sn *SteppedNilext) Result() (kv.Result, error) { return sn.res, sn.err }

// SteppedTxBegin is TxBegin without blocking: its linearizable read of the
// keyspace (txBeginRead) runs as a SteppedRead, and once that finished the
// snapshot is pinned as TxBegin pins it (txSnap).
type SteppedTxBegin struct {
	r    *Replica
	key  []byte
	sr   *SteppedRead
	snap *shard.TxSnap
	err  error
	done bool
}

// TxBeginStepped starts an interactive transaction's BEGIN (TxBegin); key
// is its first key on a node of several groups, else nil.
func (r *Replica) TxBeginStepped(key []byte) *SteppedTxBegin {
	b := &SteppedTxBegin{r: r, key: key, sr: r.ReadStepped(txBeginRead, level.ConsLinearizable, shard.Session{})}
	b.Poll()
	return b
}

// Poll advances the BEGIN and reports whether it is finished (Result).
func (b *SteppedTxBegin) Poll() bool {
	if b.done {
		return true
	}
	if !b.sr.Poll() {
		return false
	}
	b.done = true
	if _, b.err = b.sr.Result(); b.err == nil {
		b.snap, b.err = b.r.txSnap(b.key)
	}
	return true
}

// Result is the pinned snapshot, or the error (a follower's not-leader
// error among them), after Poll reported the BEGIN finished.
func (b *SteppedTxBegin) Result() (*shard.TxSnap, error) { return b.snap, b.err }
