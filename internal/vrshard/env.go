package vrshard

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
)

// The host's environment: its clock, its randomness, its peer network and
// the executor of its off-driver work. A process gets the real ones
// (Options' defaults); the simulator injects its own (host_sim_test.go) and
// drives the same host code in stepped mode (stepped.go), on one goroutine
// and virtual time — TigerBeetle's VOPR and FoundationDB's simulation are the
// models (docs/design/one-house.md, "The host under the simulator").

// Clock is the host's time source (Options.Clock).
type Clock interface {
	// Now is the current time. The host measures intervals with it (its
	// monotonic reading when it has one: a process's time.Now) and stamps
	// wall-clock times from it (a write's timestamp and expiry clock,
	// reads' expiry decisions).
	Now() time.Time
}

// wallClock is a process's clock.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Network is what the host uses of the peer transport: sending to a member
// of its group. A *transport.Endpoint is one (the default: the node's
// transport, or one the replica starts); the simulator passes its network
// and delivers inbound messages with Replica.StepMessages.
type Network interface {
	// Send queues a message for peer `to`; it must not block for long.
	Send(to uint64, m frame.Payload) error
	// SendLarge queues a message that may exceed one frame (a snapshot);
	// it may block while the message is encoded and queued.
	SendLarge(to uint64, m frame.Payload) error
}

// executor runs the driver's off-driver work: the log's fsyncs, a
// checkpoint's engine fsync, a snapshot capture and the encoding of a large
// message. The work hands its result to the driver on one of the replica's
// result channels (syncDone, ckptDone, snapDone, largeDone), whose buffers
// hold every result that can be outstanding, and the driver's event handlers
// take it from there (run, or the stepped driver).
type executor interface {
	// goWork runs work off the driver.
	goWork(work func())
	// syncLog runs an fsync of the log (work), one at a time, in order.
	syncLog(work func())
	// expedite makes the log fsync in flight finish now: the driver is
	// about to wait for its result (awaitSync).
	expedite()
	// roundEnd: the driver finished a round of events (run); idle: no
	// event waits for it.
	roundEnd(idle bool)
}

// goroutines is a process's executor: a goroutine per checkpoint, capture
// or large message (rare), and the replica's long-lived syncer goroutine
// for the log's fsyncs (one per fsync would be a goroutine per write batch:
// ARCHITECTURE §1.4).
//
// A VR follower's urgent fsync (the leader waits for its prepare-ok: a
// sync write) is held to the end of the driver's round instead (inline),
// and the driver runs it itself when no event waits: two goroutine
// hand-offs fewer per write (driver → syncer, syncer → driver), each a
// thread wake-up on a loaded machine (docs/design/write-path.md, "Counted
// per write"). Nothing else changes: the same work runs, one fsync at a
// time, and its result reaches the driver through syncDone as before, so
// the core learns a batch is persisted only once the fsync returned. What a
// held fsync delays is what arrives during it: a prepare that comes then is
// stepped, written and acknowledged (received) after it, and its own fsync
// follows, as it would behind the syncer's fsync in flight. When an event
// already waits at the round's end the syncer runs the fsync, as before.
type goroutines struct {
	syncReq chan<- func()
	inline  func() bool   // whether the fsync starting now may run on the driver
	held    func()        // the fsync held to the round's end (driver only)
	inlined atomic.Uint64 // fsyncs the driver ran itself at a round's end (tests)
}

func (g *goroutines) goWork(work func()) { go work() }

func (g *goroutines) syncLog(work func()) {
	if g.inline != nil && g.inline() {
		g.held = work
		return
	}
	g.syncReq <- work
}

// expedite runs a held fsync now, on the caller: the driver waits for it
// (awaitSync), or the driver stopped (drainSync).
func (g *goroutines) expedite() {
	if w := g.held; w != nil {
		g.held = nil
		w()
	}
}

func (g *goroutines) roundEnd(idle bool) {
	w := g.held
	if w == nil {
		return
	}
	g.held = nil
	if idle {
		g.inlined.Add(1)
		w()
		return
	}
	g.syncReq <- w
}

// randomSource draws the host's random numbers (incarnation ids, nonces;
// Options.Random): the simulator seeds it so that a run replays.
func randomSource(o *Options) func() uint64 {
	if o.Random != nil {
		return o.Random
	}
	return rand.Uint64
}
