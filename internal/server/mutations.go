package server

import "sync/atomic"

// serverMutations are the server's test-only mutations: deliberate bugs the
// tests switch on to show their checks catch them. Every production read is
// written `mutation.On && mut.f.Load()`, so the default build compiles them
// away (internal/mutation, TestEveryMutationReadIsGated). They are atomics,
// not plain bools, because the event loops are per process and outlive the
// test that flips one: other tests' loops read them concurrently.
type serverMutations struct {
	// releaseSkipsWait: a batch's replies are released without waiting for
	// what its writes still wait for (Pending), so a client can be told OK
	// for a replicated write that is then lost
	// (TestBrokenReleaseAcknowledgesLostWrite).
	releaseSkipsWait atomic.Bool
	// syncBarrierSkipped: a read runs without first waiting for the
	// connection's unapplied sync writes of its keys (syncKeys), so it can
	// miss a write pipelined before it.
	syncBarrierSkipped atomic.Bool
	// loopWaitsInline: the event loop waits for durability itself, stalling
	// every connection on it; loopReadsInline: the same for reads that must
	// wait for an fsync.
	loopWaitsInline, loopReadsInline atomic.Bool
	// loopNeverCoalesces and loopCoalescesAlways: a loop that serves on
	// through every fsync even under a write-only load, and one that waits
	// for every group's fsync however recently it served a read.
	loopNeverCoalesces, loopCoalescesAlways atomic.Bool
	// syncerSkipsWake: the syncer gives every connection back quietly, even
	// one the loop muted, which then waits for the next sweep.
	syncerSkipsWake atomic.Bool
	// execSkipsWatches: EXEC proposes its transaction without the
	// connection's watches, so the state machine never compares them and a
	// WATCH/MULTI/EXEC increment can lose another client's
	// (TestWatchedIncrementsLoseNothing must notice).
	execSkipsWatches atomic.Bool
}

// mut holds the server's mutations (process-wide, like the event loops).
var mut serverMutations
