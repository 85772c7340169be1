// Package vrshard runs one Viewstamped Replication replica of a shard in a
// real process: it drives the pure core (internal/vr) with real I/O — a
// replication log on disk, the TCP peer transport, the storage engine as the
// store of the state machine (internal/kv, statemachine.go) — and
// implements shard.Replica, so the RESP front door serves a replicated shard
// unchanged.
//
// One driver owns the core: its rounds run one at a time, under a lock, on
// the driver goroutine, or, when that is idle, on the peer reader or the
// syncer that brings a peer batch or a finished fsync (inline.go: one
// goroutine hand-off fewer). Each round it takes every waiting client write
// (one batch), peer message and read request, then performs the core's
// Ready actions (internal/vr doc.go, "The driver's obligations"):
//
//  1. Persist: the batch's snapshot point, truncation, entries and hard state
//     go to the replication log (wal.go: segmented, CRC-checked, on vfs) as
//     ONE write, after the batch's messages were handed to the transport (the
//     core withholds those that promise durability). The fsync runs off the
//     driver goroutine, one at a time, covering every batch written before it
//     started; when it returns the driver calls Persisted. So a batch costs
//     at most one fsync, and batches written during an fsync share the next.
//  2. Apply committed entries to the engine with version = VR op number, in
//     one Append and without an engine fsync: the log is the durable copy.
//     After a crash the engine recovers some prefix of what was appended;
//     the core re-delivers every op after the last checkpoint, and the
//     applier writes only the records the engine lacks (ops whose records
//     were partly recovered included), taking the results of ops the engine
//     already holds from the client-table rows written with them.
//  3. Reply to writers, serve read-index reads, send snapshots to lagging
//     peers (the engine at the applied op plus the client table).
//  4. Now and then checkpoint: engine fsync, then a new log segment that
//     starts with the snapshot point, then the core's Compact.
//
// Durability (cad.go, docs/design/cad.md): a sync write, and any write whose
// reply depends on state, returns once committed (persisted on a majority)
// and applied here; a cad blind write (plain SET, MSET) once a majority
// holds it in memory (vr.AckReplicated); an async one at the same point,
// served to reads from the leader's overlay from its append on. Every read
// is checked against the readable index R via a per-key update index, and a
// leader read of a key updated after R waits for R (a durability wait).
// With Options.FollowerReads, followers holding an active-set lease serve
// cross-client-monotonic reads. Reads: read.go. Exactly-once: the core's client table, keyed by the RESP
// request id (client id, seq), answers retries across leader changes; writes
// without an id carry the proposer's id and a local sequence number so the
// proposing leader can find their waiter.
//
// # The nilext fast path (Options.Nilext; experimental)
//
// Off by default. On, the driver also keeps the core's durability log: its
// records go into the same log batch as entries (one fsync) and every new
// segment starts with the whole live d-log; nilext updates and their acks
// travel over the peer transport as wire.MsgNilext / wire.MsgNilextAck; a
// linearizable read at the leader of a key with a pending nilext update
// waits until the d-log is ordered and applied (Stats.NilextSlowReads).
// NilextApply makes this node the coordinator of plain SET/MSET writes: one
// round trip to every replica, complete on vr.NilextSupermajority acks of
// one view including its leader's, else (after NilextTimeout) the ordered
// path with the same request id. A sync nilext write is fsynced in the
// d-log of every acking replica before it completes; a cad or async one is
// acknowledged from memory and persisted in the background (so, unlike the
// ordered path, cad is weaker than sync here). Details: nilext.go.
//
// # Timing and the lease
//
// Defaults (Options.VR zero fields): heartbeat 10ms, view-change timeout
// 300ms, lease 250ms, clock drift bound MaxDrift = 1% (every node's clock
// runs at 1±0.01 of real time; internal/vr doc.go derives the leader's lease,
// LeaseDuration·(1−ρ)/(1+ρ) ≈ 245ms after the heartbeat a majority
// acknowledged). Time is each process's monotonic clock; wall-clock steps do
// not matter, rate errors beyond the bound do. A leader without a lease
// (new view, lost acks) serves linearizable reads by read-index instead.
// Every member must run the same lease, drift bound and mark-out: they are
// part of the group's identity (vr.Config.Hash), and a member that differs
// is refused. A view-change timeout below the lease is refused at start
// rather than shortening the lease.
//
// # Bootstrap
//
// Options.Bootstrap must be set only on a group's very first start. A replica
// with no replication log and no Bootstrap is treated as one that lost its
// disk: it runs VR recovery and state transfer before it votes or
// acknowledges. Bootstrapping a replica that had been a member would let it
// vote with an empty log (Open refuses when its engine is not empty).
//
// A failed write or fsync of the log or the engine stops this replica (the
// others carry on); a replica whose log is gone (wiped disk) rejoins by VR
// recovery and state transfer.
//
// It must not import the server, the RESP codec or the simulator; the server
// imports it.
package vrshard
