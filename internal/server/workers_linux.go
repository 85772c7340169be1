package server

import (
	"sync/atomic"
	"time"
)

// workers are an event loop's long-lived goroutines for the work that must
// wait off the loop: a replica's pipeline (its commands wait for the VR
// driver or a forward to the leader), a read that waits for an fsync, a
// batch's durability wait (the syncer), the release of a batch whose
// connection broke. ARCHITECTURE §1.4: no goroutine is created per command
// or per fsync on the write path. Before, each of these started a goroutine
// (`go l.runAway`, `go l.syncer`): on a replicated node, one per command
// batch, each starting on a fresh stack that grew again through the
// command's call chain.
//
// A job goes to a worker that is idle (blocked receiving on jobs); only when
// none is does the pool start one, and that one stays: it serves the next
// jobs until it has been idle for workerIdle. So the pool is as large as the
// loop's peak number of connections waiting at once, and a steady load
// creates no goroutines. A job never waits for another job (each is one
// connection's pipeline, or one durability group), so a busy pool cannot
// deadlock: a job that finds every worker busy gets a new one.
type workers struct {
	jobs chan job
	// started counts the goroutines the pool has started (tests).
	started atomic.Uint64
}

// workerIdle is how long an idle worker waits for a job before it exits: long
// against the gaps of a steady load, so the pool does not shrink and regrow
// under one, short enough that a burst's workers go away.
const workerIdle = 10 * time.Second

type jobKind uint8

const (
	// jobPipeline runs the rest of c's pipeline (runAway): first, if set,
	// then what c has buffered.
	jobPipeline jobKind = iota + 1
	// jobReadFailed releases c's batch and ends c, whose input failed with err.
	jobReadFailed
	// jobSync runs the loop's syncer (releaseParked).
	jobSync
)

// job is one piece of work for a worker: a value, not a closure, so handing
// it over allocates nothing.
type job struct {
	kind  jobKind
	l     *loop
	c     *conn
	first [][]byte
	err   error
}

func newWorkers() *workers { return &workers{jobs: make(chan job)} }

// submit hands j to an idle worker, or to a new one when none is idle.
func (w *workers) submit(j job) {
	select {
	case w.jobs <- j:
	default:
		w.started.Add(1)
		go w.work(j)
	}
}

func (w *workers) work(j job) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		j.run()
		j = job{} // hold no connection while idle
		idle.Reset(workerIdle)
		select {
		case j = <-w.jobs:
		case <-idle.C:
			return
		}
	}
}

func (j job) run() {
	switch j.kind {
	case jobPipeline:
		j.l.runAway(j.c, j.first)
	case jobReadFailed:
		j.l.finishReadFailed(j.c, j.err)
	case jobSync:
		j.l.syncer()
	}
}
