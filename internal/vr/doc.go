// Package vr is the Viewstamped Replication core (VR Revisited, Liskov &
// Cowling 2012) of one replica: normal operation (prepare / prepare-ok /
// commit, batched and pipelined, commit point on heartbeats), view change
// (start-view-change / do-view-change / start-view), the recovery protocol
// for a replica that lost state (nonce), state transfer (get-state /
// new-state, with a snapshot when the log prefix is gone), log compaction,
// the client table (at-most-once), configuration identity on every message,
// and the hooks for linearizable reads (leader lease and read-index).
//
// It is a pure, deterministic state machine (ARCHITECTURE §1.2): it never
// starts goroutines, reads a clock, draws random numbers or does I/O. Time
// comes in with every call (the driver's local clock, nanoseconds), a
// recovery nonce comes in State. It must not import net, os, time.Now users,
// math/rand or any Kefir package but the pure ones (internal/core, the host
// contract whose types it shares; internal/kv); internal/wire encodes its
// messages and internal/vrshard drives it through that contract
// (internal/core, vrshard's vrCore adapter).
//
// # The driver's obligations
//
// A driver owns one Replica and calls it from one goroutine: Step for each
// peer message, Tick periodically (every few milliseconds; timers are
// compared against the times passed in), Propose for client writes, ReadIndex
// or LeaseRead for linearizable reads, Persisted when an fsync completes.
// After any of those it calls Ready and performs the returned actions:
//
//  1. Disk, in this order, as one append (one fsync covers the batch):
//     if Snapshot is set, store it durably, discard the whole log and restore
//     the state machine from it; if HasTruncate, discard log entries with
//     op > Truncate; append Entries; write HardState if set (last: it may
//     vouch for the entries before it, so a torn write must not keep it
//     without them). Then fsync and,
//     when the fsync returns, call Persisted(PersistSeq). Batches must become
//     durable in order. A failed write or fsync must stop the replica (crash
//     it): the core has already counted on the batch.
//  2. Send Messages. They may go out before the fsync of step 1: the core
//     holds back everything that promises durability (prepare-ok only covers
//     synced entries; do-view-change and start-view wait for the synced view)
//     and releases it from a later Ready. Messages may be lost, duplicated or
//     reordered; the core retransmits on its own timers.
//  3. Apply Committed entries to the state machine in op order, skipping
//     those marked Duplicate, then call Advance with one result per entry
//     (nil for duplicates) before the next Step/Tick/Propose. The results
//     become the client table's cached replies.
//  4. Deliver Replies to clients, and serve ReadStates (a read-index read may
//     run once the state machine has applied ReadState.Index). A read taken
//     from LeaseRead likewise waits for applied >= the returned index.
//  5. For each SnapshotNeeded peer, capture the state machine at the applied
//     op (Data) with ClientTable(), and call SendSnapshot.
//  6. Log Errors (configuration mismatches, refusals), rate-limited.
//  7. Checkpoint now and then: store a snapshot of the state machine at the
//     applied op (with ClientTable()) durably, then call Compact(op) (keep a
//     tail of entries so slightly lagging replicas need no snapshot).
//
// # Reconfiguration (reconfig.go; docs/design/cluster.md §7)
//
// Reconfigure at the leader orders a new member list as the epoch's last
// op. The driver writes Ready.Membership, when set, in the same atomic
// record as the batch's HardState, acts on it (starts new members, reports
// success) only once Persisted covers that batch, passes it back in State.Membership on
// every later start; skips committed entries with empty Data (a
// reconfiguration is handed out as one); starts a replica for each new
// member with Membership.Apply of the reported configuration, an empty
// disk and a fresh nonce (not Bootstrap); stops a replica once
// Info.Retired and records that, and until then restarts a leaving replica
// (named only in its configuration's Previous) from its disk as any other:
// it may hold the only copy of the new epoch's start state. The wire codec
// must carry a get-state's Nonce (the join mark).
//
// The very first start of a new group passes State{Bootstrap: true}. On
// every later start the driver passes what its disk holds in State: the latest
// snapshot (with the state machine already restored from it), the entries
// after it and the last hard state. If the replica may have acknowledged
// anything that is not on disk (a replaced disk, writes acknowledged before
// fsync), it sets LostState and a fresh random Nonce: the replica then runs
// the recovery protocol and neither votes nor acknowledges until it is back.
//
// The snapshot in State is a promise that the state machine holds every op
// up to Snapshot.Op, and the core takes it as applied. A driver whose state
// machine keeps its own durable copy (an engine beside the log) makes the
// copy durable before the log records a snapshot point (step 7, and step 1
// for an installed snapshot), and persists with the state, in the same
// write, the op it holds (an applied mark). But the engine can still be lost
// while the log survives: a deleted engine directory, a lost device, an
// older backup restored. So on every start the driver compares the engine's
// applied op with the log's snapshot point, and if the engine is behind it
// must not pass the log: it discards the log durably (marking it
// recovering, so a crash before recovery ends starts recovering again) and
// starts the core as a wiped replica — an empty State with LostState and a
// fresh Nonce. The replica then recovers, and gets the state by state
// transfer: a snapshot (step 1) when the leader's log no longer reaches op
// 1, else every committed entry again from op 1, which a state machine that
// kept part of its old state applies as a replay (the ops' versions tell it
// what it already holds). Why: the core cannot see the state machine.
// Started from the log, the replica would come back Normal with holes, vote
// in view changes, lead, answer linearizable reads without committed
// writes, and send snapshots that copy the loss to its peers (issue 24,
// item 2; vrshard.Open and engineBehind do this; the simulator's driver
// too, engine_sim_test.go).
//
// # The nilext fast path (Config.Nilext; nilext.go)
//
// With the fast path on, the driver also: passes every nilext update a
// client sends to this replica to Nilext (any replica, not only the leader);
// writes Ready.DLog with the batch's other records (before the fsync that
// PersistSeq reports) and hands those records back in State.DLog on restart
// (it may rewrite them from Replica.DLog at a checkpoint); sends
// Ready.NilextAcks to their clients; and, at the leader, calls ReadNilext
// before a linearizable read: if it returns true the read waits for the
// ReadState carrying its ctx instead of LeaseRead/ReadIndex. The wire codec
// must carry Message.DLog and Message.DLogStale. Clients (or the node
// coordinating for a RESP client) complete an update with NilextTracker and
// fall back to Propose, with the same request number, when no supermajority
// answers. It sets State.DLogIntact only if it knows the disk kept every
// d-log record the replica acknowledged (acks of cad/async updates leave
// from memory): otherwise a restarted replica's d-log is stale, does not
// count in d-log recovery, and the replica forces a view change at once
// (nilext.go, nxRestarted).
//
// # Eventual reads (eventual.go)
//
// The driver publishes EventualUntil after every step and serves an
// eventual read only before that local time (else it redirects).
//
// # CAD and cross-client monotonic reads (cad.go; docs/design/cad.md)
//
// The driver's obligations do not grow: it calls Advance with applied
// results and Persisted after each fsync as above, and reports nothing new —
// the core learns the applied op from Advance and the persisted one from
// Persisted, and followers send both to the leader on their own. It may
// propose a write with ProposeAck: AckReplicated (cad, async) or AckAppended
// (a fully asynchronous baseline) acknowledgements come out in Ready.Acks (Client, ReqNum, Op, no
// Result) and the write's normal Reply still comes at apply (ignore it if
// already acked). Writes whose reply depends on state use AckApplied. At
// the leader, a read of a key whose latest update index u (in the log,
// applied or not) is <= Readable() is served under the lease once applied
// >= u; otherwise it calls WaitReadable(now, ctx, u) and serves when the
// ReadState for ctx arrives (applied >= its Index). Either way, at serve
// time the key's version in the state machine must be <= Readable(): the
// state machine may have applied a newer write of the key since u was
// taken, which other members may lack; if so, wait again with that version
// as u (the simulator found this). With
// Config.FollowerReads, a follower serves a cross-client-monotonic read of
// key k when FollowerRead(now) succeeds with R and k's latest version in its
// state machine (tombstones included) is <= R; otherwise it redirects to the
// leader. The driver must pass a fresh random State.Nonce on every start,
// not only with LostState: it keeps read-lease acknowledgements of
// different lives apart (New refuses a zero nonce with FollowerReads). The wire codec must carry Persisted, Applied,
// Readable, Grant and AckSeq.
//
// # Pre-votes
//
// A replica that loses its leader (a normal follower not heard from it for
// the view-change timeout, or a view change that ran past its timeout) does
// not move to the next view on its own: it asks every peer with a
// start-view-change marked as a pre-vote (Op = 1), and moves once f+1
// replicas, itself included, suspect. Replicas that still hear their leader
// ignore the question, so a follower that merely lost touch (a restart, a
// one-way cut) never deposes a leader a majority runs (viewchange.go, preVote).
// The wire codec must carry a start-view-change's Op.
//
// # Leases and reads
//
// Followers promise, when they acknowledge a heartbeat, not to join another
// view for Config.LeaseDuration on their clock; the leader counts its lease
// from the send time of the latest heartbeat f followers acknowledged, for
// Config.LeaderLease() = LeaseDuration·(1−MaxDrift)/(1+MaxDrift) of its own
// clock. That is safe as long as every clock's rate stays within 1±MaxDrift.
// A restarted replica keeps promises it forgot by not voting for a lease
// period after it starts: a restarted follower neither starts nor joins a
// view change, and a restarted replica that led its last normal view (whose
// read grants promised, in memory, that it joins no other view while one
// may be valid) does not count or send its own start-view-change meanwhile
// (heldVC). A follower that had joined a view change before it crashed
// finishes it at once: it joined only after its promises had run out. Without a lease, ReadIndex confirms leadership with
// a heartbeat round instead. Followers expose their commit point (Info) for
// session and bounded reads.
//
// # Files
//
// replica.go holds the state, New, the Step/Tick dispatch and the
// invariants; each other file is one part of the protocol: normal.go
// (propose, prepare, prepare-ok, commit, heartbeats), viewchange.go
// (pre-votes, start-view-change, do-view-change, start-view, vote timers),
// recovery.go, statetransfer.go (get-state/new-state, snapshots,
// compaction), persist.go (the log in memory, write batches, Persisted),
// send.go (outgoing messages, the identity check), reads.go (read index,
// leases), ready.go (Ready, Advance), info.go, cad.go (acks, active set,
// readable index, follower reads), nilext.go with nilext_recover.go and
// nilext_tracker.go (the Skyros fast path), synchint.go (fsync hints),
// reconfig.go (epochs: reconfiguration, joining and leaving members),
// eventual.go, clients.go, config.go, types.go. testdata/*.txt are
// protocol scenarios run by interaction_test.go.
package vr
