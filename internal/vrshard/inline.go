package vrshard

// Inline driver rounds (issue 31 items 1–2, docs/design/write-path.md
// "Inline rounds"). The driver is an event handler whose rounds run under
// Replica.drv: normally on run's goroutine, which takes each event from a
// channel. A channel send to a parked goroutine is a thread wake-up on a
// busy box, and a replicated write crossed several per replica (a
// follower: peer reader → driver → syncer → driver → peer writer). So when
// the driver is idle, the goroutine that brings a peer batch (the
// transport's connection reader, deliver) or a finished log fsync (the
// syncer) runs the round itself: the same handlers (step, syncFinished)
// and the same afterEvents, under the same lock, one round at a time.
// A reader steps inline only where its link carries this group alone
// (deliver, transport.Transport.Alone): in a round it reads nothing for
// the node's other groups on the link, and any round can take long; nor a
// large batch (a snapshot's round takes seconds).
//
// Why the host's rules still hold: an inline round is a driver round. The
// core is stepped by one goroutine at a time (drv), with the same inputs
// in the same order as run would give it:
//   - Persist before acknowledging: the core's durable acknowledgement is
//     built from Persisted, which only syncFinished reports, for the seq
//     the returned fsync covered — whichever goroutine runs it.
//   - A peer's batches reach the core in the order they arrived: a reader
//     steps a batch inline only when no batch waits on inbox or in run's
//     hands (inPending 0, checked under drv), and a reader hands on its
//     batches one at a time.
//   - One fsync at a time, as before: a syncer's round starts the next
//     fsync only at its end (syncerRound), as the syncer's next work, so a
//     wait for the fsync in flight (awaitSync) never waits for itself.
//
//
// An inline round's peer messages are written to the socket on the spot
// when the link's writer is parked (transport.Endpoint.SendAll, send): the
// goroutine parks next anyway, while waking the writer is one more thread
// wake-up. run's rounds still wake the writer: under load that keeps the
// socket writes off the driver (the reason 2350e47 reverted SendAll there).
//
// run keeps every other event (proposals, reads, ticks, checkpoints), and
// the stepped driver (the simulator: stepped.go) never starts run, so none
// of this runs there: drvLive stays false.

// tryDriver takes the driver for an inline round if it is idle and
// running. REQUIRES on true: endInline after the round.
func (r *Replica) tryDriver() bool {
	if r.step1 != nil || !r.drv.TryLock() {
		return false
	}
	if !r.drvLive || r.failed() != nil {
		r.drv.Unlock()
		return false
	}
	r.inlineRound = true
	return true
}

// endInline ends an inline round that returned err, and wakes run if the
// round failed the replica (run then returns, failing every waiter),
// changed the hold timer run waits on, or changed the role so that run's
// ticker must change period (tickFor): a follower that enters a view change
// or becomes leader inline must not wait a follower's tick for it.
func (r *Replica) endInline(err error) {
	if err != nil {
		r.fail(err)
	}
	kick := r.failed() != nil || r.gc.timerC != r.runTimerC ||
		int64(r.tickFor()) != r.tickPeriod.Load()
	r.inlineRound = false
	r.drv.Unlock()
	if kick {
		select {
		case r.drvKick <- struct{}{}:
		default:
		}
	}
}

// stepInline steps a peer batch on the caller's goroutine (a connection
// reader) if the driver is idle and nothing queued for it waits: true if it
// did.
func (r *Replica) stepInline(in inbound) bool {
	if r.inPending.Load() != 0 || !r.tryDriver() {
		return false
	}
	if r.inPending.Load() != 0 { // queued meanwhile: it goes first
		r.inlineRound = false
		r.drv.Unlock()
		return false
	}
	r.st.inlineSteps.Add(1)
	r.step(in)
	r.endInline(r.afterEvents(nil))
	return true
}

// queueInbound hands a peer batch to run, counted in inPending until run
// has stepped it (stepQueued); false if the replica stopped or failed.
func (r *Replica) queueInbound(in inbound) bool {
	r.inPending.Add(1)
	select {
	case r.inbox <- in:
		return true
	case <-r.stop:
	case <-r.done: // failed: the connection's other groups go on
	}
	r.inPending.Add(-1)
	return false
}

// stepQueued (run) steps a batch taken from inbox. Batches come counted
// (queueInbound); a progress report (no batch) does not.
func (r *Replica) stepQueued(in inbound) {
	r.step(in)
	if in.batch != nil {
		r.inPending.Add(-1)
	}
}

// syncedInline hands a finished log fsync to the driver on the syncer's
// goroutine if the driver is idle (true), so its Persisted and what follows
// from it (a follower's durable prepare-ok, a leader's commit and replies)
// leave without waking run.
func (r *Replica) syncedInline(res syncResult) bool {
	if !r.tryDriver() {
		return false
	}
	r.st.inlineSyncs.Add(1)
	r.syncerRound = true
	err := r.syncFinished(res)
	if err == nil {
		err = r.afterEvents(nil)
	}
	r.syncerRound = false
	if err == nil {
		r.startSync() // the syncer's next work, once this round returns
	}
	r.endInline(err)
	return true
}
