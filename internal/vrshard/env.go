package vrshard

import (
	"math/rand/v2"
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
}

// goroutines is a process's executor: a goroutine per checkpoint, capture
// or large message (rare), and the replica's long-lived syncer goroutine
// for the log's fsyncs (one per fsync would be a goroutine per write batch:
// ARCHITECTURE §1.4).
type goroutines struct{ syncReq chan<- func() }

func (g goroutines) goWork(work func())  { go work() }
func (g goroutines) syncLog(work func()) { g.syncReq <- work }
func (goroutines) expedite()             {}

// randomSource draws the host's random numbers (incarnation ids, nonces;
// Options.Random): the simulator seeds it so that a run replays.
func randomSource(o *Options) func() uint64 {
	if o.Random != nil {
		return o.Random
	}
	return rand.Uint64
}
