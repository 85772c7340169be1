// Package sim is Kefir's deterministic simulator: one goroutine runs N replicas
// and M clients on virtual time, with a seeded PRNG deciding every delay, drop,
// duplication, clock drift, crash, failed fsync and torn write. A run is a pure
// function of its seed and options, so a failing seed replays exactly, event
// for event.
//
// # The contract a core follows
//
// A replication core runs here, and unchanged in production (ARCHITECTURE
// §1.2), by being wrapped in a Node: events in (a message, a tick carrying the
// node's local clock, a client invocation, "persisted up to N"), a Ready batch
// of actions out (records to append to the node's log, a request to fsync it,
// messages to send, completed client operations). The simulator performs the
// actions: messages go through the simulated network, records go through a
// vfs.Mem disk that loses unsynced bytes and may tear the last write when the
// node crashes, and a restarted node is rebuilt from what its disk recovered
// (ReplicaFactory; NewReplicaBoot also hands it its own disk for more files).
//
// Clients are Nodes too, because what a client does is protocol-specific
// (Skyros sends nilext writes to every replica and waits for a supermajority;
// a chain client writes to the head and reads at the tail; a VR client finds
// the leader). The simulator records their invocations and completions in a
// check.Recorder on virtual time.
//
// A Node never starts goroutines, reads a clock, draws random numbers or does
// I/O, and never iterates a map where the order could leak into its output:
// Explore replays every failing seed and reports a divergence as
// nondeterminism. Messages should implement String for readable traces.
//
// # Using it from an engine's tests
//
//	sim.Explore(t, 1, 200, func(seed uint64, trace io.Writer) error {
//		s := sim.New(sim.Swarm(seed, sim.Options{
//			Replicas: 5, Clients: 4,
//			NewReplica: myReplica, NewClient: myClient,
//			Workload: sim.KV{Keys: 3, Get: 4, Put: 4, CAS: 1},
//			OpsPerClient: 100, Duration: 5 * time.Second, Trace: trace,
//			Invariant: committedPrefixesAgree,
//		}))
//		h := s.Run()
//		return errors.Join(s.Err(), check.Errs(check.All(h, check.Options{})))
//	})
//
// A failure prints the seed, a trace file and the command that replays it
// (KEFIR_SIM_SEED=<seed> go test -run ...); KEFIR_SIM_SEEDS=<n> turns the same
// test into a soak. The fixed schedules of internal/sim/scenario run on any
// engine the same way; internal/sim/simtoy holds two toy registers (one
// correct, one with switchable bugs) that show the contract and prove the
// checkers catch real bugs.
//
// Package sim must not import any replication core (they import nothing from
// it outside their tests), nor net, nor the real clock.
package sim
