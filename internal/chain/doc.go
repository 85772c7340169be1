// Package chain is Kefir's chain replication core (issue 30): a pure,
// deterministic implementation of chain replication with Ouroboros joins
// (digest 002 §3, the dissertation's Listings 1 and 2, with the fixes of
// digest 002 §7). docs/design/chain.md describes the messages, the state per
// member, and how each ambiguity of the text was resolved.
//
// A Member is one member of one chain (one key range): updates enter at the
// head, which numbers them, flow down, the tail answers the master and
// acknowledges upstream; strong reads are served by the tail. A Master
// decides membership and routes client requests; the chain never decides its
// own membership. Joins happen at any position without blocking traffic
// (pre-copy from the tail, FLUSH rewiring with a temporary store, TRUNCATE);
// failures are repaired by CR_HEAD, CR_MID and CR_TAIL. Check asserts the
// invariants of the correctness proof (digest 002 §3.9) and is called after
// every event by the tests and the simulator.
//
// A chain runs in one of three update modes (Ouroboros+: SU, the tail
// answers; AUSI, the head answers once the acknowledgement is back; AU, the
// head answers on apply), serves reads at the tail, CRAQ reads at any member
// and weak reads at any member holding a session's token, and gives each
// member a datastore kind (memory, log, buffered log) whose persistence the
// host performs on the core's request (MsgPersist, MsgPersisted).
//
// Like internal/vr, the package does no I/O, starts no goroutines, reads no
// clock and draws no random numbers (internal/purity enforces it): a host
// feeds messages in and sends what Ready returns, over per-neighbour FIFO
// links (TCP).
package chain
