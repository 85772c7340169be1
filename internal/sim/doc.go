// Package sim is Kefir's deterministic simulator: one goroutine runs N replicas
// and M clients on virtual time, with a seeded PRNG deciding every delay, drop,
// duplication, clock drift, crash and torn write. A run is a pure function of
// its seed and options, so a failing seed replays exactly, event for event.
//
// The contract a replication core follows to run here (and, unchanged, in
// production; ARCHITECTURE §1.2) is the Node interface: events in (a message, a
// tick carrying the node's local clock, a client invocation, "persisted up to
// N"), a Ready batch of actions out (messages to send, records to append to the
// node's log, a request to fsync it, completed client operations). The
// simulator performs the actions: messages go through the simulated network,
// records go through a vfs.Mem disk that loses unsynced bytes and may tear the
// last write when the node crashes, and a restarted node is rebuilt from what
// its disk recovered.
//
// A Node never starts goroutines, reads a clock, draws random numbers or does
// I/O; the simulator owns all of that. Package sim must not import any
// replication core (they import nothing from it either; the toy cores in
// internal/sim/simtoy are test fixtures), nor net, nor the real clock for
// anything but benchmarks.
package sim
