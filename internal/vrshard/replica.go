package vrshard

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/core"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// Options configure a Replica.
type Options struct {
	// Dir holds the replication log (Dir/wal) and the engine (Dir/engine).
	Dir string
	// FS is the file system (nil = the real one); tests pass a vfs.Mem.
	FS vfs.FS
	// VR is the group configuration: cluster id, epoch, members, self, and
	// timing. Zero timings get this package's defaults (DefaultHeartbeat...).
	VR vr.Config
	// Bootstrap: start a new group if the disk holds no replication log. A
	// replica whose log is missing without Bootstrap (a replaced or wiped
	// disk) runs VR recovery before it takes part again. Pass it only on the
	// very first start of a group.
	Bootstrap bool
	// Transport is the node's peer transport, shared by every replica the
	// node hosts (internal/server creates it): the replica registers Group
	// on it and sends and receives through that endpoint. If nil, the
	// replica starts a transport of its own from Peers, ClusterSecret, TLS,
	// Listener and PeerMaxFrame, and closes it with itself (a node hosting
	// one replica; tests).
	Transport *transport.Transport
	// Group is the replica group's id on the transport (0 for a node's only
	// group). Every member of a group uses the same id.
	Group uint64
	// Peers maps every member's id to its peer address (host:port); used
	// only without Transport.
	Peers map[uint64]string
	// ClientAddrs optionally maps member ids to their client (RESP)
	// addresses, so a NotLeaderError can say where the leader listens.
	ClientAddrs   map[uint64]string
	ClusterSecret string
	TLS           *tls.Config
	// Listener, if set, is served for inbound peer connections by the
	// replica's own transport (without Transport).
	Listener net.Listener
	// PeerMaxFrame bounds one frame on the replica's own peer transport
	// (default frame.DefaultMaxFrame); a larger message, such as a snapshot of a big
	// state, travels as several frames. Every member must agree on it.
	PeerMaxFrame int
	// Storage tunes the engine; Devices and FS are filled from Dir and FS
	// when empty.
	Storage storage.Options

	// TickInterval is how often the core's timers run (default heartbeat/4).
	TickInterval time.Duration
	// FollowerTickInterval is how often they run while this replica is a
	// normal follower of a VR group (default the heartbeat interval; see
	// tickFor).
	FollowerTickInterval time.Duration
	// MaxProposals caps the writes taken into one Ready batch (default 4096).
	MaxProposals int
	// CheckpointOps and CheckpointBytes trigger a checkpoint (engine fsync,
	// new log segment, core compaction) after this many applied ops or this
	// much log (defaults 20000 ops, 64 MiB).
	CheckpointOps   uint64
	CheckpointBytes int64
	// KeepTail is how many applied entries the core keeps after a checkpoint
	// so slightly lagging replicas catch up without a snapshot (default 1024).
	KeepTail uint64
	// KeepTailBytes bounds that tail's request data (default 32 MiB): a
	// lagging replica beyond it gets a snapshot instead.
	KeepTailBytes int
	// FollowerWait bounds how long a session read waits for this replica to
	// catch up before redirecting (default 50ms); at the leader, how long it
	// waits for a token version beyond its log before it fails with
	// shard.ErrSessionAhead (read.go waitSession).
	FollowerWait time.Duration
	// RequestTimeout bounds how long a write or a linearizable read waits at
	// a leader that cannot reach a majority (a partitioned old leader keeps
	// believing it leads until it hears of a newer view); then the write's
	// outcome is unknown (ErrOutcomeUnknown) and the read fails
	// (ErrCannotServe). Default 2 s.
	RequestTimeout time.Duration
	// AskTail, on a chain member under SU or AUSI, asks the chain's tail
	// (member tail, at client address addr) for its version (ChainVersion)
	// in configuration epoch: a strong read of a key dirty here is then
	// answered from this member's engine once it applied that far
	// (chainVersionRead, CRAQ's version query) instead of being sent whole
	// to the tail. The node sets it (the front door's KEFIR.CHAINVERSION,
	// cluster.ReplicaSpec.AskTail); nil: dirty reads go to the tail whole.
	AskTail func(ctx context.Context, tail uint64, addr string, epoch uint64) (uint64, error)
	// ChainHeldReads lets a version read answer from a held blind update
	// the tail's version covers, without waiting for this member's apply
	// (chainHeldRead; CRAQ proper). Off by default, and the node never
	// sets it: an apply-time refusal the member cannot foresee from the
	// entry turns a held blind write into a no-op — a Duplicate, a retry
	// a new head ordered again after an older head's entry (the client
	// table skips it at apply) — and the member would answer a value that
	// was never committed (review of session 29). A write to a key a
	// prepared transaction locks is declined here whatever this says.
	// Tests of the mechanism set it.
	ChainHeldReads bool
	// Nilext turns on the nilext fast path (nilext.go; experimental): the
	// core's Config.Nilext, the d-log on disk, NilextApply. Every member of
	// a group must agree on it.
	Nilext bool
	// NilextTimeout bounds how long a coordinated nilext write waits for a
	// supermajority before it falls back to the ordered path (default 100ms).
	NilextTimeout time.Duration
	// NilextBackoff: after a write missed the supermajority, writes take the
	// ordered path at once for this long, then the fast path is tried again
	// (default 1s): a down replica costs one timeout, not one per write.
	NilextBackoff time.Duration
	// NilextSyncDelay bounds how long a log batch nobody waits for (entries
	// the leader ordered from the d-log, cad d-log records, a new commit
	// point) may wait for a later batch's fsync to cover it (group commit
	// across the d-log and the log; nilext_gc.go). Default 5ms; negative:
	// every batch is synced at once, as without the fast path.
	NilextSyncDelay time.Duration
	// CadSyncDelay bounds how long a log batch nobody waits for — cad and
	// async blind writes, acknowledged before they are durable — may wait
	// for a later batch's fsync to cover it (group commit; nilext_gc.go).
	// A write or read that waits for a commit syncs the held batches at once,
	// here and (by the leader's sync hint) at the followers. Default 2ms;
	// negative: every batch is synced as soon as the fsync before it returns.
	// With Nilext, NilextSyncDelay and its rules apply instead.
	CadSyncDelay time.Duration
	// FollowerReads turns on the active set (docs/design/cad.md §3):
	// followers holding a lease serve cross-client-monotonic reads. Every
	// member of a group must agree on it.
	FollowerReads bool
	// ClockSkew bounds how far any member's wall clock may be from the
	// leader's (default DefaultClockSkew). A replica that is not the leader
	// decides key expiry at its own clock plus ClockSkew, so that a read it
	// serves never returns a key the leader's clock has expired
	// (docs/consistency.md, "Key expiry"; expiry.go).
	ClockSkew time.Duration
	// ActiveExpiry is the tick of active expiry at the leader (expiry.go:
	// the deletion of expired keys nobody reads again, on the replica's
	// clock); 0: off. A process's node sets it (OpenHosted).
	ActiveExpiry time.Duration
	Logger       *slog.Logger
	// OnLogSync, if set, is told how long each fsync of the replication log
	// took (the node's fsync latency histogram); it runs on the goroutine that
	// synced. The engine's own fsyncs are Storage.OnSync's.
	OnLogSync func(time.Duration)

	// Clock is the host's time source (default: the process's clock). The
	// simulator passes a node's drifting virtual clock (env.go).
	Clock Clock
	// Random draws the host's random numbers (default math/rand/v2's); the
	// simulator passes a seeded source so a run replays.
	Random func() uint64
	// Network, if set, is the peer network the replica sends on instead of
	// a transport (Transport, Peers and Listener are then unused); inbound
	// messages are the caller's to deliver (StepMessages). The simulator's.
	Network Network

	// stepped: no goroutine of the host runs; a caller delivers events and
	// collects effects on one goroutine (stepped.go). The simulator's.
	stepped bool
	// newCore, if set, opens the protocol core instead of VR's (vrcore.go):
	// a test plugs a second core into the host through the contract.
	newCore func(group, core.Boot) (hostCore, error)

	// Chain, if set, makes the replica a member of a chain (the chain
	// engine, chaincore.go) instead of a VR replica: VR's Members is the
	// chain, head first.
	Chain *ChainOptions

	// mut: deliberate bugs for tests (mutations), set from the first start.
	mut mutations
	// ownsHandshake: Transport is this replica's alone (a single-group
	// node's, openOnTransport): the replica sets its handshake's
	// configuration rule (peer.go). A transport shared by groups compares
	// the node-level identity only.
	ownsHandshake bool
}

// Timing defaults (local loopback clusters; the docs state the drift bound).
const (
	DefaultHeartbeat  = 10 * time.Millisecond
	DefaultViewChange = 300 * time.Millisecond
	DefaultLease      = 250 * time.Millisecond
	DefaultMaxDrift   = 0.01

	DefaultClockSkew = 100 * time.Millisecond

	DefaultNilextSyncDelay = 5 * time.Millisecond
	DefaultCadSyncDelay    = 2 * time.Millisecond
)

func (o *Options) fill() error {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	if o.Dir == "" {
		return errors.New("vrshard: Options.Dir is required")
	}
	c := &o.VR
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeat
	}
	if c.ViewChangeTimeout == 0 {
		c.ViewChangeTimeout = DefaultViewChange
	}
	if c.LeaseDuration == 0 {
		// Not shortened to fit a shorter view-change timeout: the lease is
		// part of the group's identity (vr.Config.Hash), so a member started
		// with such a timeout would silently promise less than its leader
		// counts on. Validate refuses the timeout instead.
		c.LeaseDuration = DefaultLease
	}
	if c.MaxDrift == 0 {
		c.MaxDrift = DefaultMaxDrift
	}
	if o.ClockSkew == 0 {
		o.ClockSkew = DefaultClockSkew
	}
	c.Nilext = c.Nilext || o.Nilext
	c.FollowerReads = c.FollowerReads || o.FollowerReads
	o.FollowerReads = c.FollowerReads
	o.Nilext = c.Nilext
	if o.NilextTimeout == 0 {
		o.NilextTimeout = 100 * time.Millisecond
	}
	if o.NilextBackoff == 0 {
		o.NilextBackoff = time.Second
	}
	if o.NilextSyncDelay == 0 {
		o.NilextSyncDelay = DefaultNilextSyncDelay
	}
	if o.CadSyncDelay == 0 {
		o.CadSyncDelay = DefaultCadSyncDelay
	}
	validate := c.Validate
	if o.Chain != nil {
		validate = c.ValidateAnyCount // a chain of two is a chain
	}
	if err := validate(); err != nil {
		return err
	}
	if o.TickInterval == 0 {
		o.TickInterval = max(time.Millisecond, c.HeartbeatInterval/4)
	}
	if o.FollowerTickInterval == 0 {
		o.FollowerTickInterval = max(o.TickInterval, c.HeartbeatInterval)
	}
	if o.MaxProposals == 0 {
		o.MaxProposals = 4096
	}
	if o.Chain != nil {
		// No chain member holds a log batch for a later fsync: a write's
		// answer waits for every member's fsync in turn (SU over log
		// members), so a held batch delays every write behind it at every
		// hop. (Checkpoints are as VR's: a joiner whose pre-copy starts
		// below the tail's compacted history gets a snapshot,
		// chaincore.go CompactPoint.)
		o.CadSyncDelay, o.NilextSyncDelay = -1, -1
		if o.Chain.Store != ChainLog {
			// A buffered or memory member's acknowledgements wait for no
			// fsync (the core's rule): its batches are flushed on the
			// interval (holdable, chainstore.go).
			o.CadSyncDelay = o.Chain.Flush
			if o.CadSyncDelay <= 0 {
				o.CadSyncDelay = DefaultChainFlush
			}
		}
	}
	if o.CheckpointOps == 0 {
		o.CheckpointOps = 20000
	}
	if o.CheckpointBytes == 0 {
		o.CheckpointBytes = 64 << 20
	}
	if o.KeepTail == 0 {
		o.KeepTail = 1024
	}
	if o.KeepTailBytes == 0 {
		o.KeepTailBytes = 32 << 20
	}
	if o.FollowerWait == 0 {
		o.FollowerWait = 50 * time.Millisecond
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if len(o.Storage.Devices) == 0 {
		o.Storage.Devices = []storage.Device{{Dir: vfs.Join(o.Dir, "engine")}}
	}
	if o.Storage.FS == nil {
		o.Storage.FS = o.FS
	}
	// The replication log makes every write durable; the engine is synced only at
	// checkpoints, so zero-filling its segments ahead would cost CPU and disk
	// bandwidth (a tenth of a follower's CPU under a write load) for nothing.
	o.Storage.NoZeroFill = true
	if o.Storage.Logger == nil {
		o.Storage.Logger = o.Logger
	}
	for _, m := range c.Members {
		if o.Transport == nil && o.Network == nil && m != c.Self && o.Peers[m] == "" {
			return fmt.Errorf("vrshard: no peer address for member %d", m)
		}
	}
	return nil
}

// mutations are deliberate bugs tests switch on to prove the checkers see
// them. Never set outside tests; the bool ones are read only as
// `mutation.On && r.mut.x`, so the default build compiles them away
// (internal/mutation). The funcs and delays are test hooks.
type mutations struct {
	// followerLinearizable serves linearizable reads from local state at any
	// replica, without lease or read-index.
	followerLinearizable bool
	// localLeaseNoClock: a local lease read (localLease) trusts the
	// published lease without checking that it is still running.
	localLeaseNoClock bool
	// expiryClockAhead: active expiry's deletes (expiry.go) decide with a
	// clock a second ahead of the leader's, deleting keys before they
	// expire.
	expiryClockAhead bool
	// ignoreSession serves session reads without waiting for the token.
	ignoreSession bool
	// nilextMajority completes coordinated nilext writes on a simple
	// majority (f+1 acks of one view, the leader's included) instead of the
	// supermajority: a completed write can be lost in a view change.
	nilextMajority bool
	// followerNoRCheck serves cross-client-monotonic follower reads under
	// the lease without checking the keys' latest updates against R.
	followerNoRCheck bool
	// noDurabilityWait serves leader reads without the check against R
	// (the read may return a cad write no majority has persisted).
	noDurabilityWait bool
	// ttlNoReadKey: an expiry read (kv.KindTTL) names no key to the read
	// checks (readKeysOf, nilextCoord.readKeys), as before c89b77bb: it is
	// served from the engine before the key's last write is applied.
	ttlNoReadKey bool
	// afterEngineWrite (a test hook, not a mutation) runs on the driver
	// goroutine when an apply batch is in the engine but applied is not yet
	// published: the window in which readers see the engine ahead of it.
	afterEngineWrite func()
	// afterReadRelease (a test hook) runs on the driver goroutine right
	// after a Ready's read waits were released, before ready() ends.
	afterReadRelease func()
	// afterHandle (a test hook) runs on the driver goroutine at the end of
	// every handled Ready: tests read driver-only state there.
	afterHandle func(r *Replica)
	// chainCommitIgnoresEngine: a restarted chain member's committed
	// prefix ignores its engine's applied mark (chainConfig).
	chainCommitIgnoresEngine bool
	// chainCheckpointNoNumber: a checkpoint keeps no number of its last
	// entry (core.Numberer: the code before).
	chainCheckpointNoNumber bool
	// chainLostStateReplays: a chain member restarting with a lost state
	// and an engine holding records (a crash mid-pages, over a checkpoint
	// or on a disk it started empty) is not paged (openChain): it
	// pre-copies the log over them, and may carry a whole-chain restart.
	chainLostStateReplays bool
	// chainTruncateAtBoot: a chain member drops its log past its commit
	// point at a restart or a rejoin, reporting only its committed prefix
	// (chainCore.tentative: the code before).
	chainTruncateAtBoot bool
	// chainCommitLazy: a chain member below the tail saves an advanced
	// commit point only with its next batch (chainCore.commitLazy).
	chainCommitLazy bool
	// chainTailCommitLags: a chain tail saves its commit point as the
	// others do (chainCore.tailCommitLags).
	chainTailCommitLags bool
	// chainAUAtCommit: an AU chain's head answers async writes at commit,
	// as under SU (chainCore.auAtCommit).
	chainAUAtCommit bool
	// chainSyncAtCommit: a sync write on an AUSI or AU chain is answered at
	// commit, its durable point not waited for (the code before session
	// 30: under AUSI a sync write waited for no disk).
	chainSyncAtCommit bool
	// chainReadDirty: a chain member serves a strong read of a key that is
	// dirty here (an update to it held, not yet committed) from that
	// update — CRAQ without its version check (indexChain).
	chainReadDirty bool
	// chainVersionUnchecked: a chain member answers a dirty key from its
	// engine as soon as the tail answered the version query, without
	// comparing the tail's version with what it applied (chainVersionRead).
	chainVersionUnchecked bool
	// chainHeldNewest: a chain member answers a dirty read from the newest
	// update of the key it holds, whatever the tail's version
	// (chainHeldRead): a value the tail has not committed.
	chainHeldNewest bool
	// chainVersionInFlight: a dirty read that finds a version query in
	// flight takes its answer, computed perhaps before a write answered
	// before the read began (askVersion).
	chainVersionInFlight bool
	// chainVersionWait (a test hook) replaces chainVersionWait, the bound
	// on a member's wait to apply up to the tail's version.
	chainVersionWait time.Duration
	// captureDelay (a test hook) lengthens every snapshot capture, as a
	// large state's scan would.
	captureDelay time.Duration
	// pageMovingVersion: each page of a paged snapshot is read at the
	// engine's latest version when it is read, not at the capture's op.
	pageMovingVersion bool
	// encodeDelay (a test hook) lengthens the encoding of every large
	// message, as a state of gigabytes would.
	encodeDelay time.Duration
	// hintConsumedEarly: the leader's sync hint is consumed by the next
	// fsync that starts (as before), even one that started between the
	// hinted message's step and the Ready writing its entries, which are
	// then held until the deadline (nilext_gc.go wantDone).
	hintConsumedEarly bool
	// retryMayWait: a retry of a request in flight (dropped by the core: it
	// waits for the entry already in the log) does not release held
	// batches, which it then waits for until their deadline (nilext_gc.go).
	retryMayWait bool
	// backlogMayWait: writes waiting in the backlog for room in a full
	// pipeline do not release held batches, whose commit they wait for
	// until the deadline (nilext_gc.go).
	backlogMayWait bool
	// noAskSync: a caller waiting for an apply at a follower (a session
	// read) does not ask the leader to sync (vr AskSync), so it waits for
	// the held batches' deadline at the leader (nilext_gc.go).
	noAskSync bool
	// afterStep (a test hook) runs on the driver goroutine after each peer
	// message is stepped, before the Ready it produced is handled: tests
	// interleave there what the drain loop may do in between (a finished
	// fsync, synced). m is the engine's (VR's: *vrMsg), valid during the
	// call only.
	afterStep func(r *Replica, m peerMsg)
	// lateReadable publishes R only at the end of ready(), after the
	// readers a Ready releases were woken (the behaviour before §9 of
	// docs/design/cad.md): they may check against the old R and wait again.
	lateReadable bool
	// ackWaitSkipped: Wait returns at once for writes Apply returned at
	// their ordered point, as if they were acknowledged: a front door then
	// releases replies of writes that may be lost (docs/design/cad.md §10).
	ackWaitSkipped bool
	// applyWaitsForAck: Apply waits for every write's acknowledgement, as
	// before §10 (no ordered point); tests compare the two.
	applyWaitsForAck bool
	// syncWaitsInApply: sync blind writes are answered inside Apply, once
	// applied, as before §12: a read pipelined behind one on a connection
	// waits for its commit (tests compare the two; not a safety mutation).
	syncWaitsInApply bool
	// nilextUnchecked: NilextApply sends writes apply will reject (an
	// empty or reserved key, an oversize key or value) on the fast path, where
	// they are acknowledged before apply fails them (nilextApplyValid), and
	// NilextTake takes those with an empty or reserved key.
	nilextUnchecked bool
	// noSizeCheck: Apply proposes writes whose keys or values the engine
	// refuses; the apply of the committed op fails and stops the replica.
	noSizeCheck bool
	// appendUnchecked: an APPEND whose result outgrows the engine's value
	// limit is written anyway; the engine fails the apply and the replica
	// stops (statemachine.go).
	appendUnchecked bool
	// applyOwnClock: a replica stamps what it applies with its own clock,
	// not the timestamp the leader put in the entry, so replicas that
	// applied the same ops hold different engines (the host simulator's
	// agreement check, hostAgree, must catch it: reads return no
	// timestamps, so no client-side checker can).
	applyOwnClock bool
	// txUnvalidated: the state machine applies an EXEC without comparing
	// its watches and a KEFIR.TX commit without validating its checks (the
	// conflict window): a broken validator, which the transaction checker
	// must catch (host_sim_txn_test.go).
	txUnvalidated bool
	// txFreeStale: the applier's "nothing is locked" (applier.txFree) is
	// not cleared by a two-phase op, so a write after a prepare in the same
	// batch skips the lock rule.
	txFreeStale bool
	// noEarlyAbort: the leader proposes every transaction, doomed or not
	// (txdoom.go), as before early aborts. doomKeyGrain: its early check
	// ignores a commit's ranges (a write of other bits of a key counts as a
	// conflict); doomOnEqual: it counts a key still at the version the
	// transaction read as written after it. Both abort transactions that
	// validation would commit.
	noEarlyAbort, doomKeyGrain, doomOnEqual bool
	// noTxHold: the leader proposes a transaction at once even when a
	// commit it proposed and has not applied writes a key the transaction
	// checks (txwait.go), as before holds.
	noTxHold bool
	// holdOutOfOrder: the writes after a held transaction in its batch are
	// proposed before it is (txwait.go), out of the connection's order.
	holdOutOfOrder bool
	// noFreshReads: a transaction's first read does not wait for the
	// commits in flight that write its keys (txwait.go, TxWriting).
	noFreshReads bool
	// earlyTxRelease: an applied transaction's waiters wake in the Ready
	// that applies it, before R covers it (txwait.go deferTx; the code
	// before that rule, without its 2 ms poll). onTxRelease is called on
	// the driver just before an applied transaction's waiters wake, with
	// its op (tests check that R covers it).
	earlyTxRelease bool
	onTxRelease    func(op uint64)
	// slotsUnfenced: the group applies writes and serves reads of keys
	// whose slots it does not own (a source that keeps serving a slot it
	// handed over; kv/slots.go's fence is skipped).
	slotsUnfenced bool
	// slotsReadUnfenced: reads only skip the fence — "serving a slot after
	// giving it away": the source answers reads of slots it handed over
	// from its frozen copy while writes go on at the destination.
	slotsReadUnfenced bool
	// slotsMovedTwice: a retried write that the slot's old group ran before
	// the hand-over runs again at the new one (its request mark is ignored).
	slotsMovedTwice bool
	// earlyRejectable: a blind write that apply will reject (an empty or
	// reserved key) is answered early anyway — acknowledged OK at cad or
	// async (and overlaid: a read may return a value of a write that wrote
	// nothing), ordered with OK at sync (its batch then gets no reply) —
	// cad.go answerableEarly.
	earlyRejectable bool
	// noPreReadCheck: a leader read checks its keys' latest updates against
	// R only after reading the engine (the check before §10): an update
	// applied, and made readable, in between is missed and the read returns
	// the value before it.
	noPreReadCheck bool
	// afterLeaderRead (a test hook) runs on the reader's goroutine right
	// after a leader read read the engine, before its check against R.
	afterLeaderRead func()
	// noEarlyIndex: early-acknowledged writes enter the update index only
	// when applied, not when appended: a read right after Apply returned
	// misses the connection's own write (and any cad write not applied).
	noEarlyIndex bool
	// deferNoWait: a deferred read's reply is released at once, before the
	// cad write whose value it returns is durable (docs/design/cad.md §11).
	// noLateIndex: writes appended without entering the index (sync,
	// state-dependent) stay out of it until applied even when an
	// early-acknowledged op is ordered after them (cad.go indexLate).
	noLateIndex bool
	deferNoWait bool
	// directAckEarly: a direct nilext update (NilextTake) is acknowledged
	// as soon as this replica took it into its d-log, before the record
	// is durable: a power cut of the group loses an update its client
	// completed.
	directAckEarly bool
	// deferNoRecheck: a deferred read does not check, after reading the
	// engine, that the log values it took are still its keys' latest
	// updates: a multi-key read may combine an older value of one key with
	// a newer value of another.
	deferNoRecheck bool
	// afterOverlay (a test hook) runs on the reader's goroutine right after
	// a deferred read took its keys' values from the overlay.
	afterOverlay func()
	// tornMultiReads: MGET, EXISTS and scans read the engine's latest
	// state key by key (no snapshot), so an apply batch can land between
	// two keys' reads.
	tornMultiReads bool
	// betweenKeys (a test hook) runs on the reader's goroutine between the
	// first and the second key of an MGET or EXISTS.
	betweenKeys func()
	// sessionWaitLimited: a session read at the leader fails with
	// shard.ErrSessionAhead once FollowerWait passed even when the token's
	// version is in the leader's log (the rule before session 9): a client
	// that reads right after a cad, async or ordered sync write gets that
	// error whenever the commit is slower than FollowerWait.
	sessionWaitLimited bool
	// noSessionViews: a session read does not compare the token's views
	// with the views of this replica's ops (checkSessionViews): a session
	// whose cad or async write a view change dropped is served state
	// without it once its op number holds another write.
	noSessionViews bool
	// chainSessionUnchecked: an early acknowledgement's token carries no
	// view, and a chain member neither fails a session read whose token is
	// past the head's history (lost with an earlier head) nor checks a
	// write's session at the head (chainSessionCheck): the code before
	// session 30, under which a session that saw an AU head's async write
	// lost with it was not told.
	chainSessionUnchecked bool
	// writeSessionUnchecked: a VR leader proposes a session write without
	// judging the session's token (writeSessionCheck), as before session
	// 30: a session that writes again after its cad or async write was
	// dropped has its token raised past the loss, and its next read of the
	// lost key is served without it.
	writeSessionUnchecked bool
	// noLeaderWake: publish does not wake waiting readers when leadership
	// changes, so a session read waiting at a deposed leader for an op of
	// its log waits until an apply or RequestTimeout instead of redirecting.
	noLeaderWake bool
	// heldAckEarly: a log batch held for group commit (nilext_gc.go) is
	// reported to the core as durable before any fsync covers it, so a
	// prepare-ok promises entries a crash can still lose.
	heldAckEarly bool
	// forgetTooEarly: the leader's forget entry deletes every client row
	// (below = applied+1) instead of only those older than its core's
	// oldest client record: a crash then rebuilds a result the core still
	// holds by re-evaluating the op, and a retry gets a wrong reply
	// (docs/design/client-table.md).
	forgetTooEarly bool
}

// proposal is one write on its way through the log.
type proposal struct {
	// When Apply took it (-tags cadtrace; zero-size otherwise, and first so
	// that it adds no trailing padding).
	trAt traceStamp
	req  vr.Request
	seq  uint64 // local seq (client 0 only)
	// alone holds this proposal: waitID's slice for its request id when it
	// is the only one waiting for it (almost always; a second one appends
	// to a new slice).
	alone [1]*proposal
	res   kv.Result
	err   error
	wait  *batchWait
	// txDone closes when a proposed EXEC or transaction commit fails, or
	// once it is applied and R covers it (deferTx): what a transaction
	// held behind it, or a fresh first read, waits for (txwait.go). A
	// proposal's own, not its batch's: a batch may hold a transaction
	// itself, and two batches each waiting for the other would stall.
	txDone chan struct{}
	// ack is where the write is acknowledged (cad.go): AckReplicated for a
	// cad or async blind write, else AckApplied. op is the write (valid while
	// Apply waits), for the overlay; async says it is an async write, which
	// reads take from the overlay at once (a cad one only once readable).
	ack   vr.AckPoint
	async bool
	op    *kv.Op   // early-acknowledged writes only: a copy the overlay may keep
	blind bool     // the reply depends on no state
	keys  [][]byte // early-acknowledged writes: the keys written (copies)
	// orderEarly: a sync blind write (ack AckApplied) that Apply still
	// answers at its ordered point, with Wait awaiting its apply, so that
	// the commands pipelined behind it on a connection do not wait for its
	// commit (docs/design/cad.md §12). Unlike a cad write it is neither
	// indexed nor overlaid: nobody may see it before it is applied, and the
	// front door makes a read of its keys on the same connection wait.
	orderEarly bool
	// durable: a sync write on an AUSI or AU chain, answered only once every
	// log member persisted it (parkDurable).
	durable bool
	// The ordered point (Apply returns there; docs/design/cad.md §10), driver
	// only until it (bw.ordered, or bw.done if that is nil): ordered once the
	// write is in the leader's log or finished, whichever comes first; early
	// when it was in the log first (Apply answered it, Wait awaits its
	// finish); ores and oerr are the reply Apply gives.
	ordered, early bool
	ores           kv.Result
	oerr           error
	// sess: the writer's session (shard.WriteReq.Session), which a chain's
	// head checks before it proposes the write (chainSessionCheck).
	sess shard.Session
}

// batchWait is one Apply call's writes. done closes when every write is
// finished (acknowledged or failed), ordered when every write is ordered
// (nil when no write of the batch can be ordered before it is finished:
// then done is the ordered point).
// It is the shard.Ack a Pending carries for the early ones (Await).
type batchWait struct {
	left      atomic.Int32
	done      chan struct{}
	unordered int // driver only
	ordered   chan struct{}
	ps        []proposal
	r         *Replica
	deadline  time.Time // RequestTimeout after the proposals were handed over
	// undurable: a reply of the batch was committed and parked for the
	// chain's durable point (parkDurable), so a timeout says ErrNotDurable.
	undurable atomic.Bool
	// held: the writes newBatch held, reqs[heldFrom:] — a transaction
	// behind commits in flight and every write after it in the batch
	// (txwait.go) — proposed or answered by Apply once those finish.
	held     []shard.WriteReq
	heldFrom int
}

func (p *proposal) finish(res kv.Result, err error) {
	p.res, p.err = res, err
	p.releaseTx()
	if !p.ordered {
		p.markOrdered(res, err)
	}
	if p.wait.left.Add(-1) == 0 {
		close(p.wait.done)
	}
}

// releaseTx wakes whoever waits behind p's transaction (holds, fresh first
// reads: txwait.go), once: p finished, or will never be proposed.
func (p *proposal) releaseTx() {
	if p.txDone != nil {
		close(p.txDone)
		p.txDone = nil
	}
}

// markOrdered records the reply Apply gives for p: its result if it is
// finished, else (early) OK at its op, the acknowledgement still to come.
func (p *proposal) markOrdered(res kv.Result, err error) {
	p.ordered = true
	p.ores, p.oerr = res, err
	if bw := p.wait; bw.ordered != nil {
		if bw.unordered--; bw.unordered == 0 {
			close(bw.ordered)
		}
	}
}

type idKey struct{ client, seq uint64 }

type readWaiter struct {
	op   *kv.Op // the read, for the nilext check (nil: none)
	kind readKind
	need uint64 // rwDurable: the op R must reach
	// deferred (rwDurable): a deferred read's wait, released on R alone
	// (AwaitReadable); view: the view whose leader appended op need — the
	// wait fails unless this replica still leads it. A flag, not view != 0:
	// view 0 is every new group's first view.
	deferred bool
	view     uint64
	// confirm: a linearizable read registered with the core (read),
	// counted as a lease or an index read when its ReadState comes.
	confirm bool
	idx     uint64
	err     error
	done    chan struct{}
}

type readKind uint8

const (
	rwLeader   readKind = iota // confirm leadership (lease or read-index)
	rwDurable                  // durability wait: R >= need (WaitReadable)
	rwFollower                 // follower read lease and R (FollowerRead)
)

// parkedReply is a state-dependent write's reply held until R covers its
// op (follower reads only): the reply is a read of that state.
type parkedReply struct {
	op  uint64
	fin func()
	p   *proposal
	// durable: a write asking for durability on an AUSI or AU chain, held
	// until the chain's durable point covers op too (parkDurable).
	durable bool
}

type syncResult struct {
	// The fsync's duration for the CAD timeline: zero-size without -tags
	// cadtrace, and first so that it adds no trailing padding either.
	d   traceDur
	end traceStamp // when the fsync returned (cadtrace)
	seq uint64
	err error
}

type ckptResult struct {
	gen uint64
	err error
}

type inbound struct {
	// When the reader handed it over (-tags cadtrace; zero-size otherwise,
	// and first so that it adds no padding).
	at   traceStamp
	from uint64
	// batch is the messages, decoded by the engine's codec (nil: only news
	// that a large message from `from` is arriving, peer.go progress).
	batch peerBatch
}

// Stats are counters of a replica's work.
type Stats = kcluster.Stats

// Replica is one VR replica of a shard: it implements shard.Replica, so the
// RESP front door serves it unchanged. Writes and strong reads are served at
// the leader; others get a *NotLeaderError naming it.
type Replica struct {
	opts  Options
	cfg   group // the group's configuration, engine-neutral (group.go)
	log   *slog.Logger
	core  hostCore        // the protocol core, through the contract (vrcore.go)
	eng   peerEngine      // the engine's peer messages: codec, stepping (vrcore.go)
	ext   engineExt       // what the engine adds beyond the contract: VR's nilext coordinator, or noExt (vrcore.go)
	rc    reconfState     // reconfiguration (reconfig.go)
	addrs addrBook        // addresses the node taught it (hostmember.go)
	hint  core.SyncHinter // the core's group-commit hints, or none (vrcore.go)
	vs    viewStatuser    // the core's view and status after each message (viewlog.go)
	nx    *nilextCoord    // VR's nilext coordinator (nilext.go), also ext; nil unless VR's core with Options.Nilext
	db    *storage.DB
	wal   *wal
	app   *applier
	ep    *transport.Endpoint  // this group's endpoint on the node transport (peer.go); nil with Options.Network
	ownTr *transport.Transport // the transport Open started, if not given one
	// peerTr: the transport the group's endpoint is on (own or the node's),
	// set before the endpoint registers (deliver reads it).
	peerTr *transport.Transport
	start  time.Time
	mut    mutations

	// The environment (env.go): opts.Clock, the network sent on (ep, or
	// opts.Network), the executor of off-driver work and opts.Random.
	clock Clock
	net   Network
	exec  executor
	rand  func() uint64
	step1 *stepState // stepped mode's state and executor (stepped.go); nil in a process

	propc chan []*proposal
	inbox chan inbound
	readc chan *readWaiter
	nxc   chan []*nxCall
	ctlc  chan func() // calls run on the driver goroutine (Reconfigure)
	stop  chan struct{}
	done  chan struct{}

	// The driver's rounds run under drv, on run's goroutine or, when the
	// driver is idle, on a peer reader's or the syncer's that brings an
	// event (inline.go): one goroutine hand-off fewer per event.
	drv sync.Mutex
	// drvLive: run has started and not returned; no inline round runs
	// otherwise (REQUIRES: drv).
	drvLive bool
	// runTimerC is the hold timer's channel run selects on (REQUIRES:
	// drv); an inline round that changes gc.timerC wakes run (drvKick).
	runTimerC <-chan time.Time
	// drvKick (capacity 1) makes run look again: an inline round failed
	// the replica or armed the hold timer.
	drvKick chan struct{}
	// inPending counts the peer batches queued on inbox and not yet
	// stepped: a reader steps its batch inline only when it is 0, so
	// no batch overtakes one queued before it.
	inPending atomic.Int64
	// syncerRound: the syncer is running a round inline (inline.go); the
	// next fsync starts at its end, on that same goroutine's next turn.
	syncerRound bool
	// inlineRound: the round runs inline (REQUIRES: drv); its sends write
	// to an idle link on the spot (send), with push as their argument.
	inlineRound bool
	push        [1]transport.Outbound

	// Driver goroutine state.
	waitID     map[idKey][]*proposal
	waitLocal  map[uint64]*proposal
	reads      map[uint64]*readWaiter
	readCtx    uint64
	tail       []vr.Entry // log entries after the applied op, for checkpoints
	lastHS     vr.HardState
	sinceCkpt  uint64
	forgetAt   uint64 // the applied op before which no forget entry is proposed
	recovering bool
	wasLeader  bool
	leadView   uint64
	errLogAt   time.Time
	// Log fsyncs run off the driver goroutine, one at a time: written is the
	// last PersistSeq written to the log, syncing the one the fsync in flight
	// covers (0: none). The core accepts Persisted for several batches at
	// once, so batches written while an fsync runs share the next one.
	written  uint64
	syncing  uint64
	synced0  uint64 // highest PersistSeq reported to the core
	ckptBase int64  // log segment size right after the last checkpoint
	// A checkpoint's engine fsync runs off the driver goroutine too; the
	// entries after its op stay in tail until its segment is written.
	ckptRunning bool
	// ckpt is the snapshot point the running checkpoint records, taken
	// when it began: the applied op, the client table as of it and the
	// core's number of its entry (core.Numberer).
	ckpt       vr.Snapshot
	ckptMarked bool   // the engine held its applied mark when the checkpoint's sync began
	ckptGen    uint64 // bumped to cancel a running checkpoint
	ckptOut    int    // engine fsyncs started and not yet received
	ckptDone   chan ckptResult
	// exp is active expiry's cycle (expiry.go); expDone brings a round's
	// walk back to the driver.
	exp      expiryCycle
	expDone  chan expiryFound
	syncDone chan syncResult
	syncReq  chan func() // to the syncer goroutine (goroutines.syncLog)
	// A snapshot capture runs off the driver goroutine (snapshot.go): one at
	// a time, for every peer in snapFor.
	snapRunning bool
	snapAt      uint64
	snapFor     map[uint64]bool
	// pages: the paged snapshots peers are pulling (snapshot.go), by peer.
	pages map[uint64]*pageSrc
	// pagesIn counts the pages of a paged snapshot this replica wrote
	// before its last (restorePage).
	pagesIn  int
	snapDone chan snapResult
	// A message with a large snapshot is encoded and queued off this
	// goroutine (snapshot.go, sendLarge); later messages to that peer wait
	// in held until it is queued. largeOut counts those in flight.
	held map[uint64][]peerMsg
	// snapHolds: a peer sent a snapshot at op needs the log after it until
	// it has installed it; checkpoints do not compact past op before until.
	snapHolds map[uint64]snapHold
	largeOut  int
	largeDone chan uint64
	gc        groupCommit // batches held for a later fsync (nilext_gc.go)

	// Published by the driver for other goroutines.
	applied atomic.Uint64
	// engineTop is the highest op whose records the engine may show: set
	// before they are written, so a reader that loads it after reading the
	// engine has a bound on what it saw. applied is published only after
	// the write (a reader can see the engine ahead of it), so it is no such
	// bound (issue 7: a leader read returned a version beyond R that way).
	engineTop atomic.Uint64
	commit    atomic.Uint64
	// lastOp is the last op in the log: set when a Ready's entries are
	// written, before any of them is answered (markAppended, earlyAcks), so
	// a token carrying an op this leader answered never exceeds it.
	lastOp   atomic.Uint64
	leader   atomic.Uint64
	isLeader atomic.Bool
	// chainTail is a chain member's idea of its chain's tail (core.Info's
	// Tail), where a strong read of a key dirty here goes (chainRead).
	chainTail atomic.Uint64
	// chainDirtyAll: the highest op indexChain indexed that writes keys it
	// does not name, or changes which keys the group serves (a flush, a
	// script, a cross-group decide or resolve, a slot-table op): while it
	// is above the commit point every key is dirty here (chainTry). Set on
	// the driver only.
	chainDirtyAll atomic.Uint64
	// chainTxPrepared is the highest op of a cross-group prepare this
	// member indexed (indexChain): a prepare may lock a key, making a
	// later blind write of it a no-op at apply, which the held entry does
	// not show (chainHeldRead declines while one is above applied). Set on
	// the driver only.
	chainTxPrepared atomic.Uint64
	// asker batches the version queries of concurrent dirty reads
	// (chainask.go).
	asker chainAsker
	// peers: the leader's view of its followers' progress as of the last
	// tick (publishPeers; nil unless this replica leads a VR group).
	peers atomic.Pointer[[]kcluster.FollowerState]
	// chainCommitted: the highest commit point a chain member's core
	// handed out (Ready.Readable), stored before that Ready's messages are
	// sent — so at the tail, at least every op it has acknowledged: its
	// answer to a version query (ChainVersion).
	chainCommitted atomic.Uint64
	// chainEpoch: a chain member's configuration epoch (core.Info.Epoch;
	// view is the epoch a head became the head at): what a version query
	// names and the tail compares.
	chainEpoch atomic.Uint64
	status     atomic.Uint32
	// tickPeriod is the driver's tick period now (tickFor; ns); ticks
	// counts the ticks it ran (onTick), which tests compare with it.
	tickPeriod atomic.Int64
	ticks      atomic.Uint64
	view       atomic.Uint64
	dlogLen    atomic.Int64
	// Nilext view-change figures of the core's Info (read.go Info).
	nxCycles, nxStaleWaits atomic.Uint64
	dlogStale              atomic.Bool
	localSeq               atomic.Uint64
	failErr                atomic.Pointer[error]
	// views is the view history of the applied ops (engine_mark.go), for
	// session reads; published before the engine shows the ops.
	views     atomic.Pointer[viewHist]
	closeOnce sync.Once
	notifyMu  sync.Mutex
	notify    chan struct{} // closed and replaced when applied advances or leadership changes (wake)
	nxIDs     nxIdents
	upd       *keyUpdates // per-key update index and async overlay (cad.go)
	txw       txWriters   // keys of the EXECs and transaction commits in flight (txwait.go)
	readable  atomic.Uint64
	ctr       *tracer // CAD timeline (cadtrace.go); nil, and its hooks no-ops, without -tags cadtrace

	// beforeClose runs first in Close (and crash): what rides on the
	// replica and must stop before it (a chain node's hosted master and
	// metadata replica, chainmeta.go).
	beforeClose []func()
	// hostedMeta is a chain node's replica of the metadata group
	// (OpenChainNode; nil elsewhere), hostedMaster the master it hosts.
	hostedMeta   *Replica
	hostedMaster *chainmaster.Master
	// groupMaster is this node's hosted master of the chain group r is a
	// member of, in a cluster of several groups (OpenChainGroup; started
	// later, by the metadata replica's HostChainMaster): the member's
	// messages for its master that are this node's are handed to it.
	groupMaster *atomic.Pointer[chainmaster.Master]

	// Early-acknowledged writes without a request id get one: this
	// incarnation's random client id and the next number (driver only).
	cadClient uint64
	cadSeq    uint64
	early     map[idKey][][]byte // keys of early-ack proposals not yet appended
	ordEarly  map[idKey]struct{} // orderEarly proposals not yet appended (cad.go indexEarly)
	late      []vr.Entry         // appended, not indexed, not applied (cad.go indexLate)
	appended  []appendedWrite    // early-ack proposals appended in this Ready
	parked    []parkedReply      // driver only, in op order
	// durable: the core's durable point (Ready.Durable, a chain's), which
	// a parked write asking for durability waits for (parkDurable). Driver
	// only; it only rises (committed positions are final).
	durable   uint64
	txApplied []txApplied  // driver only, in op order (txwait.go)
	backlog   []*proposal  // writes waiting for room in the pipeline, in order
	nxCool    atomic.Int64 // local Unix ns until which the fast path rests

	vt viewTrack // view events (viewlog.go)

	// lease: the leader's lease as the driver last published it (LeaseUntil),
	// for reads that confirm leadership without a round trip to the driver
	// (localLease); nil when there is none.
	lease atomic.Pointer[leaseSnap]
	// eventualUntil: local time (r.now) until which this replica may serve
	// eventual reads (Ready.EventualUntil, published after every round).
	eventualUntil atomic.Int64
	// rdReadable and rdEventual are the last Ready's Readable and
	// EventualUntil (driver only), which publish publishes.
	rdReadable uint64
	rdEventual int64

	st struct {
		// logWrites: the log writes the driver's Readies made (one per
		// Ready that had something to write; a chain member's hard state
		// on its own included: BenchmarkChainSyncWrite).
		logWrites atomic.Uint64
		// inlineSteps, inlineSyncs: peer batches and log fsyncs whose
		// driver round ran on the reader's or syncer's goroutine (inline.go).
		inlineSteps, inlineSyncs                                                                                                      atomic.Uint64
		localReads                                                                                                                    atomic.Uint64
		readies, fsyncs, persisted, applied, proposals, leaseReads, indexReads, ckpts, snapsSent, snapsLoaded, snapsCaptured, forgets atomic.Uint64
		// A chain member's strong reads (chainRead): served at once (the
		// key clean here), sent to the tail (dirty here), waited for (dirty
		// at the tail, or no tail known).
		chainClean, chainToTail, chainWaits atomic.Uint64
		// chainDurableWaits: waits of a strong read under AUSI for an
		// update it read to reach the durable point (chainDurableRead).
		chainDurableWaits atomic.Uint64
		// The version query (chainVersionRead): a dirty read answered here
		// at the tail's version; one sent on whole instead (the query
		// failed — an older tail, none reachable — or the wait for this
		// member's apply ran past chainVersionWait); queries answered as
		// the tail (ChainVersion).
		// chainHeldReads: those of the version reads answered from an
		// update held here, not yet applied (chainHeldRead).
		// chainVersionQueries: the version queries this member sent (a
		// batch of dirty reads shares one: chainAsker).
		// chainVersionWaited: version reads that found the tail's
		// version ahead of this member's apply and waited for it.
		chainHeldReads, chainVersionQueries, chainVersionWaited                                                                                   atomic.Uint64
		chainVersionReads, chainVersionFallbacks, chainVersionAnswers                                                                             atomic.Uint64
		nxFast, nxFallbacks, nxSent, nxAcksSent, nxSlowReads                                                                                      atomic.Uint64
		durWaits, durRounds, followerReads, followerRedirects, earlyAcks, overlayReads, durDeferred, earlyAborts, txHolds, heldAborts, freshReads atomic.Uint64
	}
}

var _ shard.Replica = (*Replica)(nil)

// Open recovers a replica from opts.Dir and starts it: its driver goroutine
// and its peer transport.
func Open(opts Options) (*Replica, error) {
	// Before fill: a memory chain member's file system (once per open: it
	// writes the member's mark).
	if err := applyChainStore(&opts); err != nil {
		return nil, err
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	wcfg := defaultWALConfig()
	wcfg.onSync = opts.OnLogSync
	if opts.Chain != nil && opts.Chain.Store == ChainMemory {
		// In memory a zero-filled segment ahead is memory spent on zeros
		// (up to 64 MiB), and saves no fsync's metadata.
		wcfg.fill = seglog.FillOff
	}
	if opts.stepped {
		// No goroutine may run: the log's segments are appended to, and
		// the engine runs its file operations on the caller's.
		wcfg.fill = seglog.FillOff
		opts.Storage.Inline = true
	}
	w, ws, err := openWALWith(opts.FS, vfs.Join(opts.Dir, "wal"), wcfg)
	if err != nil {
		return nil, err
	}
	db, err := storage.Open(opts.Storage)
	if err != nil {
		w.close()
		return nil, fmt.Errorf("vrshard: open engine: %w", err)
	}
	r := &Replica{
		opts: opts, cfg: neutralGroup(opts.VR), wal: w, db: db, start: opts.Clock.Now(), mut: opts.mut,
		clock: opts.Clock, rand: randomSource(&opts),
		// "replica", not "node": the server's logger already names the node
		// ("node", its --node-id), and a key repeated in one line is ambiguous.
		log:       opts.Logger.With("replica", opts.VR.Self),
		propc:     make(chan []*proposal, 256),
		inbox:     make(chan inbound, 256),
		readc:     make(chan *readWaiter, 256),
		nxc:       make(chan []*nxCall, 256),
		ctlc:      make(chan func()),
		drvKick:   make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		waitID:    map[idKey][]*proposal{},
		waitLocal: map[uint64]*proposal{},
		reads:     map[uint64]*readWaiter{},
		notify:    make(chan struct{}),
		syncDone:  make(chan syncResult, 1),
		syncReq:   make(chan func(), 1),
		snapDone:  make(chan snapResult, 1),
		held:      map[uint64][]peerMsg{},
		snapHolds: map[uint64]snapHold{},
		largeDone: make(chan uint64, len(opts.VR.Members)),
		snapFor:   map[uint64]bool{},
		pages:     map[uint64]*pageSrc{},
		gc:        groupCommit{wake: make(chan struct{}, 1)},
		ckptDone:  make(chan ckptResult, 2),
		exp:       expiryCycle{every: opts.ActiveExpiry},
		expDone:   make(chan expiryFound, 1),
	}
	// Writes without a request id are matched to their committed entries by
	// (proposer, local seq). Entries this replica proposed before a restart can
	// commit after it (when it leads again); they must not complete this
	// incarnation's writes, so every incarnation draws its seqs from a fresh,
	// random point of a 2^62 space (a collision needs two incarnations'
	// ranges to overlap).
	r.localSeq.Store(r.rand() >> 2)
	r.cadClient = r.rand() | 1<<63
	r.nxIDs.rand = r.rand
	if opts.stepped {
		r.step1 = newStepState(r)
		r.exec = r.step1
	} else {
		r.exec = goroutines{syncReq: r.syncReq}
	}
	if ws.empty && opts.Bootstrap && db.LastVersion() > 0 {
		// The log is gone but the engine is not: this is a replica that lost
		// its log, not a new group. Bootstrapping it would let it vote with
		// an empty log and lose committed writes.
		db.Close()
		w.close()
		return nil, fmt.Errorf("vrshard: Bootstrap refused: %s has no replication log but its engine holds version %d; start without Bootstrap to recover from the group", opts.Dir, db.LastVersion())
	}
	r.app = newApplier(db)
	r.app.appendUnchecked = mutation.On && r.mut.appendUnchecked
	r.app.unfenced = mutation.On && r.mut.slotsUnfenced
	r.app.movedTwice = mutation.On && r.mut.slotsMovedTwice
	r.app.txUnvalidated = mutation.On && r.mut.txUnvalidated
	r.app.txFreeStale = mutation.On && r.mut.txFreeStale
	if err := r.app.loadMarks(); err != nil {
		db.Close()
		w.close()
		return nil, err
	}
	engineLost := false
	if behind, have := engineBehind(r.app, &ws); behind {
		// The engine lacks ops the log no longer has (its snapshot point says
		// they are in the engine): a deleted engine directory, a lost
		// device. Replaying the log would leave holes that this replica
		// would serve, vote with and send in snapshots. It recovers from the
		// group instead, as a wiped replica does: its log is dropped (it is
		// rewritten below, marked recovering) and state transfer fills the
		// engine (restore keeps what it still holds).
		r.log.Warn("engine is behind the replication log's snapshot point: recovering from the group",
			"engine_applied", have, "snapshot_op", ws.snap.Op, "engine_version", db.LastVersion())
		ws = walState{empty: true, member: ws.member} // the epoch it is in is not the engine's to forget
		engineLost = true
	}
	// What the core starts from: the engine-neutral part (core.Boot) and
	// VR's extras (vrStart).
	boot := core.Boot{HardState: ws.hs, Entries: ws.entries}
	if !engineLost {
		boot.Applied = r.app.mark
	}
	boot.StateTop = db.LastVersion()
	if ws.snap.Op > 0 || len(ws.snap.Clients) > 0 {
		s := ws.snap
		boot.Snapshot = &s
	}
	// A clean stop synced every d-log record it acknowledged: the d-log
	// counts in d-log recovery at once (vr State.DLogIntact). After a crash
	// or power cut it does not, and a nilext replica forces a view change.
	// A fresh nonce on every start, not only for recovery: the core seeds
	// its prepare-ok sequence numbers from it (vr cadState.init).
	vx := vrStart{DLog: ws.dlog, DLogIntact: ws.clean, Nonce: r.rand() | 1, Membership: ws.member}
	switch {
	case ws.empty && opts.Bootstrap && !engineLost:
		boot.Bootstrap = true
	case ws.empty || ws.recovering:
		// The disk lacks what this replica may have promised: recover from
		// the group before voting or acknowledging anything.
		boot.LostState = true
		r.recovering = true
	}
	c, err := openCore(&opts, r.cfg, boot, vx)
	if err != nil {
		db.Close()
		w.close()
		return nil, fmt.Errorf("vrshard: start core: %w", err)
	}
	if ws.clean {
		if err := w.unmarkClean(r.recovering); err != nil {
			db.Close()
			w.close()
			return nil, err
		}
	}
	if v, ok := c.(*vrCore); ok {
		r.cfg = vrGroup(v.Config()) // with the core's defaults filled in
		r.rc.vrc = v
		if w.member == nil {
			w.member = startMembership(v.Config())
		}
		if w.member != nil {
			r.rc.member.Store(w.member)
		}
		r.rc.admitFrom(v.Config())
		if opts.Nilext {
			v.nx = newNilextCoord(r, v)
			r.nx = v.nx
		}
	}
	r.core, r.eng, r.ext, r.hint, r.vs = c, engineOf(c), extOf(c), hintsOf(c), viewStatusOf(c)
	r.lastHS = ws.hs
	r.tail = ws.entries
	if err := r.app.loadRows(); err != nil {
		db.Close()
		w.close()
		return nil, err
	}
	r.applied.Store(ws.snap.Op)
	r.publishViews()
	r.app.nreserved.Store(int64(r.app.reservedRows()))
	// The engine may hold ops the index never saw (applied before this
	// start; they are re-applied, and indexed, as the log replays).
	if cadtraceOn {
		r.ctr = newTracer(fmt.Sprint(r.cfg.Self))
	}
	r.upd = newKeyUpdates(max(ws.snap.Op, db.LastVersion()))
	r.engineTop.Store(max(ws.snap.Op, db.LastVersion()))
	r.early = map[idKey][][]byte{}
	r.ordEarly = map[idKey]struct{}{}
	if ws.empty {
		w.marked = false // a new log: no engine sync has covered the mark yet
		w.addSnapshot(vr.Snapshot{})
		w.addFlags(r.recovering)
		w.addHardState(vr.HardState{})
		if err := w.roll(); err != nil {
			db.Close()
			w.close()
			return nil, err
		}
	}
	// One line for either engine: the log's component (vr or chain) says which.
	r.log.Info("replica open", "bootstrap", boot.Bootstrap, "lost_state", boot.LostState,
		"snapshot_op", ws.snap.Op, "log_entries", len(ws.entries), "view", ws.hs.View,
		"commit", ws.hs.Commit, "engine_version", db.LastVersion())
	if opts.Chain != nil && opts.Chain.Store != ChainLog {
		r.log.Info("chain member datastore: acknowledges without an fsync", "store", opts.Chain.Store.String(),
			"flush", opts.Chain.Flush, "in_memory", opts.Chain.Store == ChainMemory)
	}
	if err := r.openEndpoint(); err != nil {
		db.Close()
		w.close()
		return nil, err
	}
	r.openView(ws.hs)
	r.publish()
	if opts.stepped {
		return r, nil // the caller drives it (stepped.go)
	}
	go r.syncer()
	go r.run()
	return r, nil
}

// Transport returns the node's peer transport the replica sends on (for
// HandleConn, Stats and fault injection, which are the node's links, shared
// by all its groups).
// Nil when the replica runs on Options.Network.
func (r *Replica) Transport() *transport.Transport {
	if r.ep == nil {
		return nil
	}
	return r.ep.Transport()
}

// Engine returns the storage engine (reads only: the driver is its writer).
func (r *Replica) Engine() *storage.DB { return r.db }

// now is the driver's clock: nanoseconds since the replica started, on
// opts.Clock (monotonic in a process).
func (r *Replica) now() int64 { return int64(r.clock.Now().Sub(r.start)) }

// Close stops the replica: driver, transport, log and engine (which syncs).
func (r *Replica) Close() error {
	var err error
	r.closeOnce.Do(func() {
		for _, f := range r.beforeClose {
			f()
		}
		close(r.stop)
		if r.step1 != nil {
			r.closeStepped()
		}
		<-r.done
		r.closeEndpoint()
		r.drainSync()
		close(r.syncReq) // the syncer is idle: drainSync took the last result
		var mark error
		if !r.recovering && r.failed() == nil {
			mark = r.wal.markClean()
		}
		err = errors.Join(mark, r.wal.close(), r.db.Close())
	})
	return err
}

// crash stops the replica as a process kill would: nothing is synced or
// flushed (the engine's unwritten buffer is lost). The engine is abandoned,
// not closed. Tests only.
func (r *Replica) crash() {
	r.closeOnce.Do(func() {
		for _, f := range r.beforeClose {
			f()
		}
		close(r.stop)
		<-r.done
		r.closeEndpoint()
		r.drainSync()
		close(r.syncReq) // the syncer is idle: drainSync took the last result
		r.wal.close()
	})
}

// drainSync waits for fsyncs still in flight after the driver stopped, so
// no file is closed under them.
func (r *Replica) drainSync() {
	if r.syncing != 0 {
		<-r.syncDone
		r.syncing = 0
	}
	if r.snapRunning { // its scan stops early once r.stop is closed
		<-r.snapDone
		r.snapRunning = false
	}
	for _, src := range r.pages { // no read of one runs now
		src.es.Close()
	}
	clear(r.pages)
	for ; r.largeOut > 0; r.largeOut-- {
		<-r.largeDone
	}
	for ; r.ckptOut > 0; r.ckptOut-- {
		<-r.ckptDone
	}
	if r.exp.walking {
		<-r.expDone
		r.exp.walking = false
	}
}

func (r *Replica) failed() error {
	if p := r.failErr.Load(); p != nil {
		return *p
	}
	return nil
}

// fail stops the replica after a disk error: the core counted on the write,
// so continuing could break the protocol's promises. The group goes on.
func (r *Replica) fail(err error) {
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	r.failErr.CompareAndSwap(nil, &err)
	r.log.Error("vr replica stopped", "err", err)
}

// ---- the driver ----

// The driver is an event handler: one method per kind of event (a batch of
// proposals, peer messages, a read, nilext calls, a tick, a finished log
// fsync, checkpoint, capture or large send, the group-commit deadline, an
// apply waiter's arrival), and afterEvents, which runs after a batch of
// events: propose, perform the core's Ready, start fsyncs, checkpoint. Two
// drivers call them: run, a process's goroutine selecting on the event
// channels, and the stepped driver (stepped.go), a caller on its own
// goroutine (the simulator). An error from a handler stops the replica
// (fail).

func (r *Replica) run() {
	defer close(r.done)
	// The driver's state is run's while it holds drv: from here to the
	// return (the deferred calls below run under it, last to first), and
	// from each event to the end of its round; an idle driver's events may
	// run on the goroutine that brings them meanwhile (inline.go).
	r.drv.Lock()
	defer r.drv.Unlock()
	defer func() { r.drvLive = false }()
	defer r.failAll(ErrOutcomeUnknown)
	defer r.stopHold()
	r.drvLive = true
	period := r.opts.TickInterval
	r.tickPeriod.Store(int64(period))
	tick := time.NewTicker(period)
	defer tick.Stop()
	// A first round at once rather than at the first event or tick: what
	// reads off the driver may use (the lease, R, the eventual horizon)
	// comes with the core's Ready, and Open published nothing of it yet.
	if err := r.afterEvents(nil); err != nil {
		r.fail(err)
		return
	}
	var props []*proposal
	lock := r.drv.Lock
	for r.failed() == nil {
		var err error
		timerC := r.gc.timerC
		r.runTimerC = timerC
		r.drv.Unlock()
		select {
		case <-r.stop:
			lock()
			return
		case <-r.drvKick:
			lock() // an inline round failed the replica, or armed the hold timer
		case ps := <-r.propc:
			lock()
			props = append(props[:0], ps...)
		case in := <-r.inbox:
			lock()
			r.stepQueued(in)
		case rw := <-r.readc:
			lock()
			r.read(rw)
		case calls := <-r.nxc:
			lock()
			r.nxStart(calls)
		case f := <-r.ctlc:
			lock()
			f()
		case <-tick.C:
			lock()
			r.onTick()
		case res := <-r.syncDone:
			if r.drv.TryLock() {
				err = r.synced(res)
				break
			}
			// An inline round holds the driver, and may be waiting for
			// this very result (awaitSync): it goes back for that round,
			// and run handles it only if it is still there. The buffer
			// has room: one fsync is in flight at most, and the round
			// starts none while the driver still counts this one.
			r.syncDone <- res
			lock()
			select {
			case res = <-r.syncDone:
				err = r.synced(res)
			default:
			}
		case res := <-r.ckptDone:
			lock()
			err = r.finishCheckpoint(res)
		case res := <-r.snapDone:
			lock()
			err = r.captured(res)
		case to := <-r.largeDone:
			lock()
			r.sentLarge(to)
		case <-timerC:
			lock()
			r.holdExpired()
		case <-r.gc.wake:
			lock()
			r.applyWaiterArrived()
		case f := <-r.expDone:
			lock()
			r.expired(f)
		}
		if err != nil {
			r.fail(err)
			return
		}
		if r.failed() != nil {
			return
		}
		// Take whatever else is waiting: one Ready (one fsync) covers it all.
	drain:
		for len(props) < r.opts.MaxProposals {
			select {
			case ps := <-r.propc:
				props = append(props, ps...)
			case in := <-r.inbox:
				r.stepQueued(in)
			case rw := <-r.readc:
				r.read(rw)
			case calls := <-r.nxc:
				r.nxStart(calls)
			case res := <-r.syncDone:
				if err := r.synced(res); err != nil {
					r.fail(err)
					return
				}
			default:
				break drain
			}
		}
		if err := r.afterEvents(props); err != nil {
			r.fail(err)
			return
		}
		clear(props)
		props = props[:0]
		if d := r.tickFor(); d != period {
			period = d
			r.tickPeriod.Store(int64(d))
			tick.Reset(d)
		}
	}
}

// tickFor is the driver's tick period as of the last published round:
// TickInterval, or FollowerTickInterval while this replica is a normal
// follower of a VR group without nilext. Such a follower's timers only watch
// for a silent leader (vr.Replica.suspects: a view-change timeout, at least
// the lease), so ticking once a heartbeat rather than four times delays a
// suspicion by at most a heartbeat, while every tick wakes an idle process:
// a follower's CPU per insert under YCSB-E fell 12–15 % with the slower tick
// (docs/design/scans.md, "Eighth round"). A leader heartbeats and checks its
// reads and lease on the fast tick; a view change resends on it; a chain
// member's and a nilext replica's timers are left as they were. A round
// that changes the role takes effect at its end: run's own at once, an
// inline one (inline.go) by waking run (endInline), since a view change
// or an election completes from peer messages alone, which a follower
// mostly steps inline.
func (r *Replica) tickFor() time.Duration {
	if r.opts.Chain != nil || r.opts.Nilext || r.isLeader.Load() || vr.Status(r.status.Load()) != vr.Normal {
		return r.opts.TickInterval
	}
	return r.opts.FollowerTickInterval
}

// onTick runs the core's timers at the driver's clock.
func (r *Replica) onTick() {
	r.ticks.Add(1)
	r.core.Tick(r.now())
	r.noteView(viewCause{kind: 't'})
	r.ext.tick()
	r.maybeExpire()
	r.publishPeers()
}

// publishPeers (driver, each tick) publishes the VR leader's view of each
// follower's progress (vr.Replica.Peers) for Peers: /status and the
// per-group metrics show replication lag from it. Once per tick, not per
// Ready (it allocates; a lag figure a tick old is fresh enough), and
// converted here so that State, which routing calls per request, only
// loads a pointer.
func (r *Replica) publishPeers() {
	pc, ok := r.core.(interface{ Peers() []vr.PeerInfo })
	if !ok {
		return // a chain member: its core has no such view
	}
	ps := pc.Peers()
	if len(ps) == 0 {
		if r.peers.Load() != nil {
			r.peers.Store(nil)
		}
		return
	}
	out := make([]kcluster.FollowerState, len(ps))
	for i, p := range ps {
		out[i] = kcluster.FollowerState{ID: p.ID, Persisted: p.Persisted, Applied: p.Applied}
	}
	r.peers.Store(&out)
}

// Peers returns the leader's view of its followers' progress as of its
// last tick (nil at a follower, during a view change, or in a chain); the
// slice is shared: callers must not modify it.
func (r *Replica) Peers() []kcluster.FollowerState {
	if p := r.peers.Load(); p != nil {
		return *p
	}
	return nil
}

// applyWaiterArrived: a caller started waiting for an apply (untilApplied):
// ready() asks the followers (at a follower: the leader) to sync and
// startSync stops holding (nilext_gc.go).
func (r *Replica) applyWaiterArrived() { r.gc.arrived = true }

// afterEvents is the driver's work after a batch of events: the proposals
// taken (props) and the backlog go to the core, the core's Ready is
// performed, held log batches may start an fsync (a read may now wait for
// one: nilext_gc.go), and a checkpoint or a forget entry may be due.
func (r *Replica) afterEvents(props []*proposal) error {
	props = r.exp.takeProps(props)
	if len(props) > 0 || len(r.backlog) > 0 {
		r.propose(props)
	}
	if err := r.ready(); err != nil {
		return err
	}
	r.startSync()
	r.maybeCheckpoint()
	r.maybeForgetRows()
	return nil
}

// maybeForgetRows (leader): once the engine holds a tenth more client rows
// than the core's table may hold, propose an entry that forgets the rows
// older than the core's oldest record — rows of clients the core has dropped,
// which no dedup decision and no replay needs (docs/design/client-table.md).
// At most one proposal per cap/10 applied ops; a lost one (view change)
// is simply proposed again later, and a repeated one deletes nothing more.
func (r *Replica) maybeForgetRows() {
	limit := r.cfg.ClientCap
	applied := r.applied.Load()
	if !r.isLeader.Load() || int(r.app.nrows.Load()) <= limit+limit/10 || applied < r.forgetAt {
		return
	}
	below := applied + 1
	if op, ok := r.core.ClientTableMinOp(); ok {
		below = min(below, op)
	}
	if mutation.On && r.mut.forgetTooEarly {
		below = applied + 1
	}
	if err := r.core.Propose(r.now(), vr.Request{Data: encodeForget(r.clock.Now().UnixNano(), below)}, vr.AckApplied); err != nil {
		return // not normal, not leader or busy: the next round tries again
	}
	r.forgetAt = applied + uint64(max(limit/10, 1))
	r.st.forgets.Add(1)
}

// step hands an inbound batch to the engine, which steps its messages
// into the core and tells the host what it must know of each (stepHooks,
// below): the host does not read the engine's messages.
func (r *Replica) step(in inbound) {
	now := r.now()
	if in.batch == nil {
		r.core.Heard(now, in.from)
		return
	}
	if cadtraceOn && in.at != (traceStamp{}) {
		r.ctr.sample("inbox wait(reader->driver) "+in.batch.Label(), in.at.ago())
	}
	r.eng.StepBatch(now, in.batch, r)
}

// The host's stepHooks (vrcore.go).

func (r *Replica) syncWanted(asked bool) {
	if !asked {
		r.gc.want = true // a read at the leader waits: hold nothing (nilext_gc.go)
		return
	}
	if !r.opts.Nilext {
		// A follower's caller waits for an apply: hold nothing, and ask
		// the other followers to sync too (nilext_gc.go).
		r.gc.want = true
		r.hint.WantSync(true)
	}
}

func (r *Replica) stepped(c viewCause, m peerMsg) {
	r.noteView(c)
	if h := r.mut.afterStep; mutation.On && h != nil {
		h(r, m)
	}
}

func (r *Replica) trace() *tracer { return r.ctr }

// propose hands writes to the core in arrival order. When the pipeline is
// full (vr.ErrBusy: MaxInflight ops not yet committed — cad and async writes
// are acknowledged before commit, so their clients can outrun it) the rest
// wait in the backlog, in order, and are proposed as commits make room:
// backpressure, not an error. Order matters: the core drops a request
// numbered below one of the same client already in flight.
func (r *Replica) propose(ps []*proposal) {
	backlogged := len(r.backlog) > 0
	if backlogged {
		ps = append(r.backlog, ps...)
		r.backlog = nil
	}
	now := r.now()
	for i, p := range ps {
		if (p.ack != vr.AckApplied || p.orderEarly) && p.req.Client == 0 && p.req.ReqNum == 0 {
			// The core acknowledges early only writes with a client
			// identity. Numbered here, in proposal order: the core drops a
			// request numbered below one of the same client in flight.
			r.cadSeq++
			p.req.Client, p.req.ReqNum = r.cadClient, r.cadSeq
		}
		if !p.sess.IsZero() {
			check := r.writeSessionCheck
			if r.opts.Chain != nil {
				check = r.chainSessionCheck
			}
			if err := check(p.sess); err != nil {
				p.finish(kv.Result{}, err)
				continue
			}
		}
		err := r.core.Propose(now, p.req, p.ack)
		if errors.Is(err, vr.ErrBusy) {
			r.backlog = append(r.backlog[:0:0], ps[i:]...)
			if !r.opts.Nilext && !(mutation.On && r.mut.backlogMayWait) {
				// The backlog waits for a commit: hold nothing here, and
				// make the prepares ask the followers to sync; when it
				// starts, a heartbeat asks them to sync what they hold
				// (nilext_gc.go).
				r.gc.want = true
				r.hint.WantSync(!backlogged)
			}
			return
		}
		if err != nil {
			p.finish(kv.Result{}, r.mapErr(err))
			continue
		}
		r.st.proposals.Add(1)
		if p.ack == vr.AckApplied {
			r.hint.WantSync(false) // its commit is awaited: followers must not hold it
		}
		if p.req.Client != 0 && !r.opts.Nilext && !(mutation.On && r.mut.retryMayWait) && !r.hint.Queued(p.req.Client, p.req.ReqNum) {
			// A retry of a request already in the log (or executed): no new
			// entry makes its batch urgent, yet its waiter waits for the
			// apply of an entry that may be held, here and at the
			// followers: sync it now, and ask them to (nilext_gc.go).
			r.gc.want = true
			r.hint.WantSync(true)
		}
		if p.ack != vr.AckApplied {
			r.early[idKey{p.req.Client, p.req.ReqNum}] = p.keys
		} else if p.orderEarly {
			r.ordEarly[idKey{p.req.Client, p.req.ReqNum}] = struct{}{}
		}
		if p.req.Client != 0 {
			k := idKey{p.req.Client, p.req.ReqNum}
			if w, ok := r.waitID[k]; ok {
				r.waitID[k] = append(w, p)
			} else {
				p.alone[0] = p
				r.waitID[k] = p.alone[:] // no slice of its own to allocate
			}
		} else {
			r.waitLocal[p.seq] = p
		}
	}
}

func (r *Replica) mapErr(err error) error {
	switch {
	case errors.Is(err, vr.ErrNotLeader):
		return r.notLeader()
	case errors.Is(err, vr.ErrNotNormal):
		return &NotLeaderError{}
	case errors.Is(err, vr.ErrStaleRequest):
		return fmt.Errorf("%w: %w", shard.ErrStaleRequest, err)
	case errors.Is(err, vr.ErrBusy):
		return ErrBusy
	}
	return fmt.Errorf("%w: %w", shard.ErrUnavailable, err)
}

func (r *Replica) notLeader() error {
	if r.rc.leaving.Load() {
		// Not a member any more: the caller goes to the new members, not
		// to a leader of a group this replica left (reconfig.go).
		return r.rc.reconfigured()
	}
	id := r.leader.Load()
	if id == r.cfg.Self || vr.Status(r.status.Load()) != vr.Normal {
		return &NotLeaderError{}
	}
	return &NotLeaderError{Leader: id, Addr: r.addrs.client(r, id)}
}

func (r *Replica) read(rw *readWaiter) {
	now := r.now()
	req := core.ReadRequest{Kind: core.ReadLinearizable}
	switch rw.kind {
	case rwFollower:
		req.Kind = core.ReadFollower
	case rwDurable:
		if rw.deferred && (!r.wasLeader || r.leadView != rw.view) {
			// A deferred read took its value from this view's log: in
			// another view op need may be another entry.
			rw.err = r.notLeader()
			close(rw.done)
			return
		}
		req.Kind, req.Need = core.ReadDurable, rw.need
		if rw.deferred {
			// A deferred read's result was fixed under confirmed
			// leadership: R alone releases it (vr AwaitReadable).
			req.Kind = core.ReadDurableKnown
		}
	default:
		if rw.op != nil && r.isLeader.Load() {
			// The engine may make the read wait for updates it took and
			// has not ordered (VR: a key with a pending nilext update),
			// answered in ReadStates.
			if ctx := r.readCtx + 1; r.ext.readFirst(now, ctx, rw.op) {
				r.readCtx = ctx
				r.reads[ctx] = rw
				return
			}
		}
	}
	// The core answers in Ready.ReadStates: a linearizable read under its
	// lease and a follower's read in this round's Ready, others after a
	// round with the peers (handle counts lease and index reads).
	r.readCtx++
	req.Ctx = r.readCtx
	if err := r.core.Read(now, req); err != nil {
		rw.err = r.readErr(rw, err)
		close(rw.done)
		return
	}
	switch rw.kind {
	case rwDurable:
		r.st.durRounds.Add(1)
	case rwLeader:
		rw.confirm = true
	}
	r.reads[req.Ctx] = rw
}

// readErr is the error a read waiter gets for the core's err: a follower's
// read sees the core's own (it redirects on any: followerAnswer), others
// the host's (mapErr).
func (r *Replica) readErr(rw *readWaiter, err error) error {
	if rw.kind == rwFollower {
		return err
	}
	return r.mapErr(err)
}

// ready performs the core's actions until it has none (doc.go of internal/vr).
func (r *Replica) ready() error {
	if r.gc.appliedWaiters.Load() > 0 {
		// Prepares carry the hint while anyone waits; a heartbeat carries it
		// only when a waiter arrived (one per arrival, not one per driver
		// round: the prepare-oks it draws would start the next round).
		r.hint.WantSync(r.gc.arrived)
	}
	if r.gc.arrived {
		r.gc.arrived = false
		if !r.opts.Nilext && !(mutation.On && r.mut.noAskSync) {
			// At a follower (a no-op at the leader): the apply waited for
			// needs a commit, for which the leader and the other followers
			// may hold batches until their deadline.
			r.hint.AskSync()
		}
	}
	for {
		rd := r.core.Ready()
		// Before anything this round's steps produced is sent (handle): a
		// reader must not use a lease this replica gave up by joining
		// another view (vr.LeaseUntil). The last, empty, Ready's is the
		// lease after the round. Except a chain member's first lease in a
		// Ready with entries (a joiner's merged temporary store, in its
		// first active Ready): published after handle indexed them, or a
		// strong read between the two would find their keys clean and the
		// engine without them (chainread.go). Publishing a lease later is
		// always safe.
		lateLease := r.chainCRAQ() && rd.Lease.Held && len(rd.Entries) > 0 && r.lease.Load() == nil
		if !lateLease {
			r.publishLease(rd.Lease)
		}
		// R and the eventual horizon wait for publish (R only once the
		// Ready's Committed are applied); the last, empty, Ready's are
		// those after the round, as its lease is.
		r.rdReadable, r.rdEventual = rd.Readable, rd.EventualUntil
		// A chain's durable point, before the replies it may release (at
		// apply, in handle) and for the parked ones (releaseParked, after
		// the round), an empty Ready's too: an acknowledgement that moved
		// only the durable point makes no other change. Committed positions
		// are final, so it only rises.
		r.durable = max(r.durable, rd.Durable)
		extra, urgent := r.ext.readyExtra()
		if rd.Empty() && !extra {
			break
		}
		r.st.readies.Add(1)
		if err := r.handle(&rd, urgent); err != nil {
			return err
		}
		if lateLease {
			r.publishLease(rd.Lease)
		}
	}
	r.wantDone()
	r.noteView(viewCause{kind: 'r'})
	r.publish()
	r.releaseTxApplied()
	info := r.core.Info()
	r.publishEpoch()
	if r.wasLeader && (!info.IsLeader || info.View != r.leadView) {
		r.failWrites(ErrOutcomeUnknown)
		r.lostLead()
		r.upd.dropOverlay()
		clear(r.early)
		clear(r.ordEarly)
	}
	r.releaseParked()
	r.wasLeader, r.leadView = info.IsLeader, info.View
	r.ext.round(info)
	if r.recovering && info.Status != vr.Recovering {
		// The recovered state is durable (its batch was synced): from now on
		// a restart with this disk is an ordinary restart.
		r.recovering = false
		if err := r.awaitSync(); err != nil {
			return err
		}
		r.wal.addFlags(false)
		if err := r.wal.write(); err != nil {
			return err
		}
		if err := r.wal.sync(); err != nil {
			return err
		}
		r.st.fsyncs.Add(1)
		r.markSynced()
	}
	return nil
}

// markSynced tells the core that every batch written so far is durable
// (after a synchronous fsync of the current segment).
func (r *Replica) markSynced() {
	if r.written > r.synced0 {
		r.synced0 = r.written
		r.persisted(r.written)
	}
}

// handle performs rd; urgent: the engine's part of it must be synced at
// once (engineExt.readyExtra).
func (r *Replica) handle(rd *core.Ready[peerMsg], urgent bool) error {
	if s := rd.Snapshot; s != nil && s.More {
		// A page of a paged snapshot: its records go into the engine now;
		// the log and the applied op change only with the last page.
		if err := r.restorePage(s); err != nil {
			return err
		}
		rd.Snapshot = nil
	}
	// 1. Disk: snapshot, truncate, entries, hard state: one write; the fsync
	// runs in the background (startSync), or waits for a later batch's if
	// nobody waits for this one (nilext_gc.go).
	hold := !urgent && r.holdable(rd)
	roll := false
	if cadtraceOn && len(rd.Entries) > 0 && r.isLeader.Load() {
		es := rd.Entries
		r.ctr.readyAt(es[0].Op, es[len(es)-1].Op, func(op uint64) (traceStamp, bool) {
			e := &es[op-es[0].Op]
			if ps := r.waitID[idKey{e.Client, e.ReqNum}]; e.Client != 0 && len(ps) > 0 {
				return ps[0].trAt, true
			}
			return traceStamp{}, false
		})
	}
	if s := rd.Snapshot; s != nil {
		if err := r.restore(s); err != nil {
			return err
		}
		r.wal.buf = r.wal.buf[:0]
		r.wal.marked = true // restore synced the engine with its mark at s.Op
		r.wal.addSnapshot(vr.Snapshot{Op: s.Op, Clients: s.Clients, Number: s.Number})
		r.wal.addFlags(r.recovering)
		r.wal.addHardState(r.lastHS)
		r.tail = nil
		roll = true
		// A checkpoint in flight is superseded by the snapshot point.
		r.ckptGen++
		r.ckptRunning, r.ckpt = false, vr.Snapshot{}
	}
	if rd.HasTruncate {
		r.wal.addTruncate(rd.Truncate)
		r.upd.truncate(rd.Truncate)
		r.truncateLate(rd.Truncate)
		for len(r.tail) > 0 && r.tail[len(r.tail)-1].Op > rd.Truncate {
			r.tail = r.tail[:len(r.tail)-1]
		}
	}
	r.wal.addEntries(rd.Entries)
	r.tail = append(r.tail, rd.Entries...)
	if n := len(rd.Entries); n > 0 {
		r.lastOp.Store(rd.Entries[n-1].Op)
	} else if rd.HasTruncate {
		r.lastOp.Store(min(r.lastOp.Load(), rd.Truncate))
	}
	r.indexEarly(rd.Entries)
	if r.chainCRAQ() {
		// Before this Ready's messages pass them on (below): chainRead.
		r.indexChain(rd.Entries)
	}
	// The engine's records (VR: d-log records) go into the same batch; a
	// new segment replaces every older one, so it takes every live one.
	r.ext.logExtra(r.wal, roll)
	r.st.persisted.Add(uint64(len(rd.Entries)))
	if err := r.noteMembership(rd.PersistSeq, rd.HardState != nil); err != nil {
		return err
	}
	if rd.HardState != nil {
		r.wal.addHardState(*rd.HardState)
		r.lastHS = *rd.HardState
	}
	if r.chainCRAQ() {
		// Before this Ready's acknowledgements leave (below): what a tail
		// answers a version query (ChainVersion) covers every op it has
		// acknowledged. R is published only after the round. The commit
		// point, not R: under AUSI R is the durable point, and a cad write
		// is answered at commit, before it (chainDurableRead waits for it).
		c := rd.Readable
		if n := len(rd.Committed); n > 0 {
			c = max(c, rd.Committed[n-1].Op)
		}
		if c > r.chainCommitted.Load() {
			r.chainCommitted.Store(c)
		}
	}
	// 2. Messages may leave before the fsync: the core withholds those that
	// promise durability. Sending first overlaps the network with the disk.
	for _, m := range rd.Messages {
		r.send(m)
	}
	if roll {
		// The new segment holds everything the old one did that still
		// matters (snapshot point, the entries after it, hard state), so once
		// it is durable every batch written so far is.
		if err := r.awaitSync(); err != nil {
			return err
		}
		if err := r.wal.roll(); err != nil {
			return err
		}
		r.st.fsyncs.Add(1)
		r.ckptBase = r.wal.size
		r.written = max(r.written, rd.PersistSeq)
		r.markSynced()
	} else if r.wal.pending() {
		if err := r.wal.write(); err != nil {
			return err
		}
		r.st.logWrites.Add(1)
		if rd.PersistSeq != 0 {
			r.written = rd.PersistSeq
		}
		if cadtraceOn && len(rd.Entries) > 0 {
			r.ctr.appended(rd.Entries[0].Op, rd.Entries[len(rd.Entries)-1].Op, rd.PersistSeq, false)
		}
		r.noteWritten(hold)
		r.startSync()
	}
	r.ext.written()
	// 3. Apply committed entries: one engine Append, no engine fsync.
	if len(rd.Committed) > 0 {
		if cadtraceOn {
			r.ctr.committed(rd.Committed[len(rd.Committed)-1].Op)
		}
		if err := r.apply(rd.Committed); err != nil {
			return err
		}
	}
	// 4. Replies and reads.
	for _, rep := range rd.Replies {
		k := idKey{rep.Client, rep.ReqNum}
		ps := r.waitID[k]
		delete(r.waitID, k)
		// A retry of a request already applied is answered from the client
		// table, and one of a request in flight is dropped by the core and
		// answered here with the original: neither is appended, so
		// indexEarly would never drop its entry. A reply means the request
		// was executed, so a later append of it (a retry queued behind
		// MaxInflight) is a duplicate that writes nothing and needs no index
		// entry; the original was indexed at its own append, handled (step 1)
		// before the replies of the same Ready.
		delete(r.ordEarly, k)
		delete(r.early, k)
		var res kv.Result
		var opErr error
		if rep.Err != nil {
			opErr = r.mapErr(rep.Err)
		} else if len(rep.Result) > 0 {
			var err error
			if res, opErr, err = decodeResult(rep.Result); err != nil {
				return fmt.Errorf("vrshard: cached result of client %d: %w", rep.Client, err)
			}
		}
		if cadtraceOn && len(ps) > 0 {
			r.ctr.replied(rep.Op)
		}
		for _, p := range ps {
			if !p.blind && r.mustPark(rep.Op) || r.parkDurable(p, rep.Op) {
				r.markUndurable(p, rep.Op)
				// The closure's own copies: captured, res and opErr
				// themselves would be on the heap for every reply.
				res, opErr := res, opErr
				r.parked = append(r.parked, parkedReply{op: rep.Op, p: p, fin: func() { p.finish(res, opErr) }, durable: p.durable})
				continue
			}
			r.deferTx(p, rep.Op)
			p.finish(res, opErr)
		}
	}
	r.earlyAcks(rd.Acks)
	r.markAppended()
	if len(rd.ReadStates) > 0 && !(mutation.On && r.mut.lateReadable) {
		// The core releases a durability wait once R covers it, and the
		// reader then checks its keys against the *published* R: publish it
		// before waking the reader, or it may still see the R of the last
		// ready() and register a second wait, which costs another heartbeat
		// round (2–7 % of waits under YCSB A; docs/design/cad.md §9). Safe
		// to publish early: the Committed of this Ready are applied (step
		// 3), and R never exceeds the commit point they reach, so R <=
		// applied. The Ready's R covers every read it releases: the core
		// released them before it made this Ready. (An R that Advance
		// moves comes with the next Ready, in this same round.)
		r.publishReadable(rd.Readable)
	}
	for _, rs := range rd.ReadStates {
		rw := r.reads[rs.Ctx]
		if rw == nil {
			continue
		}
		delete(r.reads, rs.Ctx)
		if rw.confirm {
			if rs.Lease {
				r.st.leaseReads.Add(1)
			} else {
				r.st.indexReads.Add(1)
			}
		}
		rw.idx = rs.Index
		if rs.Err != nil {
			rw.err = r.readErr(rw, rs.Err)
		}
		close(rw.done)
	}
	if h := r.mut.afterReadRelease; mutation.On && h != nil && len(rd.ReadStates) > 0 {
		h()
	}
	if h := r.mut.afterHandle; mutation.On && h != nil {
		h(r)
	}
	// 5. Snapshots for lagging peers: the engine at the applied op, captured
	// off this goroutine (snapshot.go).
	for _, to := range rd.SnapshotNeeded {
		r.wantSnapshot(to)
	}
	for _, req := range rd.SnapshotPages {
		r.wantPage(req)
	}
	// 6. Errors an operator must see, at most one line a second.
	if now := r.clock.Now(); len(rd.Errors) > 0 && now.Sub(r.errLogAt) > time.Second {
		r.errLogAt = now
		r.log.Warn("vr", "err", rd.Errors[0], "more", len(rd.Errors)-1)
	}
	return nil
}

// startSync starts an fsync of the log if batches wait for one, none is in
// flight, and they may not be held for a later one (nilext_gc.go).
func (r *Replica) startSync() {
	if r.syncing != 0 || r.written == 0 || r.written <= r.lastSynced() || r.holding() || r.syncerRound {
		return
	}
	r.syncStarted()
	r.syncing = r.written
	// In a process the replica's syncer goroutine runs it (syncer): one
	// long-lived goroutine, not one per fsync (ARCHITECTURE §1.4). It is idle
	// now: one fsync is in flight at most, and its result was taken.
	seg, seq := r.wal.seg, r.written
	q := traceNow()
	r.exec.syncLog(func() {
		t := traceNow()
		if cadtraceOn {
			r.ctr.sample("fsync hand-off driver->syncer", q.ago()-t.ago())
		}
		err := seg.Sync()
		res := syncResult{seq: seq, err: err, d: t.since(), end: traceNow()}
		if !r.syncedInline(res) { // an idle driver's round runs here (inline.go)
			r.syncDone <- res
		}
	})
}

// syncer runs the log's fsyncs off the driver, one at a time, until syncReq
// is closed (Close, after the last result was taken).
func (r *Replica) syncer() {
	for work := range r.syncReq {
		work()
	}
}

func (r *Replica) lastSynced() uint64 { return r.synced0 }

// synced handles a finished fsync: a failure stops the replica (the core
// counted on the batch), success tells the core and starts the next one.
func (r *Replica) synced(res syncResult) error {
	if err := r.syncFinished(res); err != nil {
		return err
	}
	r.startSync()
	return nil
}

func (r *Replica) syncFinished(res syncResult) error {
	r.syncing = 0
	if res.err != nil {
		return fmt.Errorf("vrshard: wal: fsync: %w", res.err)
	}
	r.st.fsyncs.Add(1)
	r.wal.syncs++
	r.ctr.synced(res.seq, res.d)
	if cadtraceOn {
		r.ctr.sample("fsync hand-off syncer->driver", res.end.ago())
	}
	if res.seq > r.synced0 {
		r.synced0 = res.seq
		r.persisted(res.seq)
	}
	return nil
}

// awaitSync waits for the fsync in flight, before the segment changes, and
// starts none: the caller syncs what was written since.
func (r *Replica) awaitSync() error {
	if r.syncing == 0 {
		return nil
	}
	r.exec.expedite()
	return r.syncFinished(<-r.syncDone)
}

func (r *Replica) apply(cs []vr.Committed) error {
	results := make([][]byte, len(cs))
	type local struct {
		p   *proposal
		op  uint64
		res kv.Result
		err error
	}
	var locals []local
	r.app.begin()
	self := r.cfg.Self
	for i := range cs {
		c := &cs[i]
		r.app.noteView(c.Op, c.View)
		if c.Duplicate || len(c.Data) == 0 {
			continue
		}
		if ts, below, ok, err := decodeForget(c.Data); ok {
			if err != nil {
				return fmt.Errorf("vrshard: op %d: %w", c.Op, err)
			}
			r.app.applyForget(c.Op, below, ts)
			continue
		}
		h, op, err := decodeOp(c.Data)
		if err != nil {
			return fmt.Errorf("vrshard: op %d: %w", c.Op, err)
		}
		ts := h.ts
		if mutation.On && r.mut.applyOwnClock {
			ts = r.clock.Now().UnixNano()
		}
		res, opErr, err := r.app.applyOp(&op, c.Op, ts, c.Client, c.ReqNum)
		if err != nil {
			return fmt.Errorf("vrshard: op %d: %w", c.Op, err)
		}
		// Indexed before the engine shows it: a reader that sees the new
		// state then finds the op when it checks against R.
		r.upd.add(c.Op, op.WrittenKeys())
		if op.WritesAll() {
			// A flush names no key but updates every one (cad.go).
			r.upd.flushed(c.Op)
		}
		if c.Client != 0 {
			results[i] = kv.AppendResult(nil, res, opErr)
		} else if h.proposer == self {
			if p := r.waitLocal[h.seq]; p != nil {
				delete(r.waitLocal, h.seq)
				locals = append(locals, local{p, c.Op, res, opErr})
			}
		}
	}
	last := cs[len(cs)-1].Op
	r.engineTop.Store(max(r.engineTop.Load(), last))
	r.app.markApplied(last)
	// Before the engine shows the batch: a reader that sees a version there
	// finds its view (a session token's, read.go).
	r.publishViews()
	if err := r.app.flush(); err != nil {
		return err
	}
	if h := r.mut.afterEngineWrite; mutation.On && h != nil {
		h()
	}
	r.core.Advance(results)
	r.st.applied.Add(uint64(len(cs)))
	r.sinceCkpt += uint64(len(cs))
	r.trimTail(last)
	r.setApplied(last)
	r.ctr.appliedTo(last)
	r.trimLate(last)
	for _, l := range locals {
		if !l.p.blind && r.mustPark(l.op) || r.parkDurable(l.p, l.op) {
			r.markUndurable(l.p, l.op)
			r.parked = append(r.parked, parkedReply{op: l.op, p: l.p, fin: func() { l.p.finish(l.res, l.err) }, durable: l.p.durable})
			continue
		}
		r.deferTx(l.p, l.op)
		l.p.finish(l.res, l.err)
	}
	return nil
}

// publishViews publishes the applier's view history if it changed.
func (r *Replica) publishViews() {
	if !r.app.viewsChanged {
		return
	}
	r.app.viewsChanged = false
	r.views.Store(&viewHist{starts: r.app.views, top: r.app.viewTop})
}

func (r *Replica) setApplied(op uint64) {
	r.applied.Store(op)
	r.wake()
}

// wake wakes every reader waiting on notify (waitApplied, waitSession).
func (r *Replica) wake() {
	r.notifyMu.Lock()
	close(r.notify)
	r.notify = make(chan struct{})
	r.notifyMu.Unlock()
}

// leaseSnap is a published lease, valid until local time until
// (Replica.now). A leader's (follower false): reads may confirm leadership
// with it once applied >= idx, its commit index. A follower's read lease:
// cross-client-monotonic reads may be served up to the readable index idx.
type leaseSnap struct {
	until    int64
	idx      uint64
	follower bool
}

// publishLease publishes the core's lease (Ready.Lease) for localLease and
// localFollowerLease.
func (r *Replica) publishLease(ls core.Lease) {
	until, idx, follower := ls.Until, ls.Index, ls.Follower
	cur := r.lease.Load()
	if !ls.Held || r.opts.Nilext || follower && !r.opts.FollowerReads {
		if cur != nil {
			r.lease.Store(nil)
		}
		return
	}
	if cur == nil || cur.until != until || cur.idx != idx || cur.follower != follower {
		r.lease.Store(&leaseSnap{until: until, idx: idx, follower: follower})
	}
}

func (r *Replica) publish() {
	info := r.core.Info()
	changed := info.IsLeader != r.isLeader.Load() || info.View != r.view.Load() ||
		uint32(info.Status) != r.status.Load()
	r.commit.Store(info.Commit)
	r.lastOp.Store(info.LastOp)
	r.leader.Store(info.Leader)
	r.chainTail.Store(info.Tail)
	r.chainEpoch.Store(info.Epoch)
	r.isLeader.Store(info.IsLeader)
	r.status.Store(uint32(info.Status))
	r.view.Store(info.View)
	if changed && !(mutation.On && r.mut.noLeaderWake) {
		// A session read waiting at the leader for an op in its log must
		// redirect as soon as this replica stops leading (waitSession).
		r.wake()
	}
	r.ext.publish() // the engine's figures as of the Info above
	r.eventualUntil.Store(r.rdEventual)
	r.publishReadable(r.rdReadable)
}

// publishReadable publishes the readable index R and drops from the update
// index the ops every reader may now see.
func (r *Replica) publishReadable(R uint64) {
	if old := r.readable.Swap(R); R > old && r.chainDurable() {
		// A read waiting for the durable point (chainDurableRead) is woken
		// when R rises, which under AUSI an fsync's completion alone may
		// do, with nothing new applied.
		r.wake()
	}
	r.ctr.readable(R)
	if !r.opts.FollowerReads && !r.isLeader.Load() && !r.chainCRAQ() {
		// A follower that serves no read by R never learns one (the core
		// takes R from the leader only with follower reads), so pruning by
		// it kept every op it applied: the index grew by every write's keys
		// for as long as the replica followed (TestFollowerUpdateIndexStaysBounded).
		// It forgets what it applied and raises the floor with it: should it
		// lead, its reads fall back to the engine's versions (cadNeed) until
		// its R passes what it forgot, as after a restart.
		r.upd.forget(r.applied.Load())
		return
	}
	r.upd.prune(min(r.applied.Load(), R))
}

// failWrites fails every write waiting for its outcome: this replica no
// longer leads, so it will not learn it.
func (r *Replica) failWrites(err error) {
	for k, ps := range r.waitID {
		for _, p := range ps {
			p.finish(kv.Result{}, err)
		}
		delete(r.waitID, k)
	}
	for k, p := range r.waitLocal {
		p.finish(kv.Result{}, err)
		delete(r.waitLocal, k)
	}
	for _, pr := range r.parked {
		pr.p.finish(kv.Result{}, err)
	}
	clear(r.parked)
	r.parked = r.parked[:0]
	r.releaseTxAll()
	// Never proposed: whoever leads now never saw them.
	for _, p := range r.backlog {
		p.finish(kv.Result{}, r.notLeader())
	}
	r.backlog = nil
}

func (r *Replica) failAll(err error) {
	if ferr := r.failed(); ferr != nil {
		err = ferr
	}
	r.failWrites(err)
	for k, rw := range r.reads {
		rw.err = err
		close(rw.done)
		delete(r.reads, k)
	}
	r.isLeader.Store(false)
	r.lease.Store(nil)
	// Anyone still blocked in Apply/Read sees stop/done and leaves.
}

// trimTail drops tail entries up to op, keeping those a running checkpoint
// must still write.
func (r *Replica) trimTail(op uint64) {
	if r.ckptRunning {
		op = min(op, r.ckpt.Op)
	}
	k := 0
	for k < len(r.tail) && r.tail[k].Op <= op {
		k++
	}
	r.tail = r.tail[k:]
}

// maybeCheckpoint starts a checkpoint when one is due: the engine is
// fsynced up to the applied op in the background; finishCheckpoint then
// records that point (with the client table as of it) at the head of a new
// log segment, drops the old segments and lets the core forget all but a
// tail of its log.
func (r *Replica) maybeCheckpoint() {
	// Bytes count from the last checkpoint's segment head, which holds the
	// unapplied tail: a tail above CheckpointBytes must not trigger a
	// checkpoint on every round.
	if r.recovering || r.ckptRunning || (r.sinceCkpt < r.opts.CheckpointOps && r.wal.size-r.ckptBase < r.opts.CheckpointBytes) {
		return
	}
	r.ckptRunning = true
	op := r.applied.Load()
	r.ckpt = vr.Snapshot{Op: op, Clients: r.core.ClientTable()}
	if n, ok := r.core.(core.Numberer); ok && !(mutation.On && r.mut.chainCheckpointNoNumber) {
		// The chain's sequence number of the entry at op: after the
		// checkpoint no entry on the disk may tell it, and a whole-chain
		// restart compares its numbering epoch (openChain). It rides the
		// checkpoint's own write: no fsync of its own.
		r.ckpt.Number = n.NumberAt(op)
	}
	r.ckptMarked = r.app.mark > 0 // appended before the sync below starts
	r.ckptGen++
	r.ckptOut++
	r.sinceCkpt = 0
	gen, pos := r.ckptGen, r.db.LastPos()
	r.exec.goWork(func() {
		_, err := r.db.Sync(pos)
		r.ckptDone <- ckptResult{gen, err}
	})
}

func (r *Replica) finishCheckpoint(res ckptResult) error {
	r.ckptOut--
	if res.gen != r.ckptGen || !r.ckptRunning {
		return nil // cancelled by a snapshot install
	}
	if res.err != nil {
		return fmt.Errorf("vrshard: checkpoint: engine sync: %w", res.err)
	}
	op := r.ckpt.Op
	if err := r.awaitSync(); err != nil {
		return err
	}
	r.wal.addSnapshot(r.ckpt)
	// The engine sync covered its applied mark (>= op): from now on an
	// engine without one has lost its state (engineBehind).
	r.wal.marked = r.wal.marked || r.ckptMarked
	r.wal.addFlags(false)
	k := 0
	for k < len(r.tail) && r.tail[k].Op <= op {
		k++
	}
	r.wal.addEntries(r.tail[k:])
	r.ext.logExtra(r.wal, true)
	r.wal.addHardState(r.lastHS)
	if err := r.wal.roll(); err != nil {
		return err
	}
	r.ckptRunning, r.ckpt = false, vr.Snapshot{}
	r.st.fsyncs.Add(1)
	r.markSynced() // batches written to the old segment are in the new one
	r.ckptBase = r.wal.size
	r.st.ckpts.Add(1)
	r.trimTail(r.applied.Load())
	if to := r.core.CompactPoint(op, r.opts.KeepTail, r.opts.KeepTailBytes); to > 0 {
		if err := r.core.Compact(r.holdLog(to)); err != nil {
			return fmt.Errorf("vrshard: checkpoint: %w", err)
		}
	}
	return nil
}

// ---- shard.Replica ----

// Apply proposes writes and returns at their ordered point
// (docs/design/cad.md §10). A blind write acknowledged before commit (cad
// and async: once a majority holds it in memory, §19) is ordered once it is
// in the leader's log: its reply (OK at its op) is
// then known, and a later read of its keys sees it (the update index holds
// it from its append, so a linearizable or cross-client-monotonic read
// waits until it is durable). Apply returns then, and the returned Pending
// carries it: Wait awaits its acknowledgement and fails if it will not come
// (leader change, closed replica, RequestTimeout) — the writes' outcome is
// then unknown and no reply of the batch may be released. A blind sync write
// (not with Nilext) is ordered the same way, and Wait awaits its apply; unlike
// a cad write it is neither indexed nor overlaid, so nobody sees it until it
// is applied (docs/design/cad.md §12). Every other write
// — any write whose reply depends on state, and a blind one apply will
// reject (answerableEarly) — is answered when committed and applied here,
// inside Apply, as before.
func (r *Replica) Apply(ctx context.Context, reqs []shard.WriteReq) (shard.Pending, error) {
	if err := r.failed(); err != nil {
		return shard.Pending{}, err
	}
	if err := ctx.Err(); err != nil {
		return shard.Pending{}, err
	}
	if len(reqs) == 0 {
		return shard.Pending{}, nil
	}
	if !r.isLeader.Load() {
		err := r.notLeader()
		if _, _, known := LeaderOf(err); !known {
			r.refuseNoLeader(len(reqs))
		}
		for i := range reqs {
			reqs[i].Result, reqs[i].Err = kv.Result{}, err
		}
		return shard.Pending{}, nil
	}
	if !(mutation.On && r.mut.noSizeCheck) {
		if p, err, split := r.applyWithoutOversize(ctx, reqs); split {
			return p, err
		}
	}
	bw, pp, point := r.newBatch(reqs)
	if len(pp) > 0 { // none: every write was answered (an early abort) or held
		select {
		case r.propc <- pp:
		case <-ctx.Done():
			unsent(pp)
			if bw.held != nil {
				r.dropHeld(bw, bw.heldFrom, len(bw.held), ctx.Err())
			}
			return shard.Pending{}, ctx.Err()
		case <-r.done:
			unsent(pp)
			if bw.held != nil {
				r.dropHeld(bw, bw.heldFrom, len(bw.held), r.closedErr())
			}
			return shard.Pending{}, r.closedErr()
		}
	}
	if bw.held != nil {
		if err := r.proposeHeld(ctx, bw); err != nil {
			return shard.Pending{}, err
		}
	}
	bw.deadline = r.clock.Now().Add(r.opts.RequestTimeout)
	if cadtraceOn {
		tap := time.Now()
		defer func() {
			r.ctr.sample(fmt.Sprintf("apply.%v.batchwait", reqs[0].Durability), int64(time.Since(tap)))
			r.ctr.sample(fmt.Sprintf("apply.%v.batchlen x1000", reqs[0].Durability), int64(len(reqs))*1000)
		}()
	}
	timer := time.NewTimer(r.opts.RequestTimeout)
	defer timer.Stop()
	select {
	case <-point:
	case <-timer.C:
		// The driver may still finish the proposals; nobody reads them.
		for i := range reqs {
			reqs[i].Result, reqs[i].Err = kv.Result{}, bw.timeoutErr(ErrOutcomeUnknown)
		}
		return shard.Pending{}, nil
	case <-ctx.Done():
		return shard.Pending{}, ctx.Err()
	case <-r.done:
		// failAll finished every waiter before done closed.
		select {
		case <-bw.done:
		default:
			return shard.Pending{}, r.closedErr()
		}
	}
	early := false
	for i := range reqs {
		reqs[i].Result, reqs[i].Err = bw.ps[i].ores, bw.ps[i].oerr
		r.stampView(&reqs[i].Result)
		early = early || bw.ps[i].early
	}
	if !early {
		return shard.Pending{}, nil
	}
	return shard.Pending{Acks: []shard.Ack{bw}}, nil
}

// newBatch makes the proposals of Apply's writes (stamped with this
// leader's clock, numbered, encoded) and their batchWait; point is the
// channel that closes at their ordered point.
func (r *Replica) newBatch(reqs []shard.WriteReq) (bw *batchWait, pp []*proposal, point chan struct{}) {
	bw = &batchWait{done: make(chan struct{}), r: r, unordered: len(reqs)}
	bw.left.Store(int32(len(reqs)))
	ps := make([]proposal, len(reqs))
	bw.ps = ps
	pp = make([]*proposal, 0, len(reqs))
	now := r.clock.Now()
	ts, nowMs := now.UnixNano(), now.UnixMilli()
	mayBeEarly := false
	var doomed []int // transactions answered without the log (txdoom.go)
	for i := range reqs {
		q := &reqs[i]
		p := &ps[i]
		if q.Op.Now == 0 {
			// The proposer (this leader) stamps its clock: every replica
			// decides expiry with it (kv/expiry.go).
			q.Op.Now = nowMs
		}
		p.wait = bw
		if bw.held != nil && !(mutation.On && r.mut.holdOutOfOrder) {
			continue // held with the transaction before it (txwait.go)
		}
		// The kind test here, not in txDoomed: every write passes this
		// way, and only a transaction's needs the call.
		if kv.TxValidated(q.Op.Kind) {
			if res, ok := r.txDoomed(&q.Op, q.ID); ok {
				p.res = res
				doomed = append(doomed, i)
				continue
			}
			if bw.held == nil && len(r.txBehind(&q.Op)) > 0 && r.txHoldable(reqs) {
				// Decided, with the writes after it, once the commits
				// it is behind are applied (txwait.go; Apply's
				// proposeHeld).
				bw.held, bw.heldFrom = reqs[i:], i
				if mutation.On && r.mut.holdOutOfOrder {
					bw.held = reqs[i : i+1]
				}
				continue
			}
		}
		if r.prepareProposal(q, p, ts) {
			mayBeEarly = true
		}
		pp = append(pp, p)
	}
	// Only a write acknowledged before it is applied can be ordered before
	// it is finished: a batch with none (sync, state-dependent writes) is
	// ordered when done, and needs no second channel.
	point = bw.done
	if mayBeEarly && !(mutation.On && r.mut.applyWaitsForAck) {
		bw.ordered = make(chan struct{})
		point = bw.ordered
	}
	// Finished before the driver sees the batch (after ordered exists:
	// finish counts them ordered too).
	for _, i := range doomed {
		ps[i].finish(ps[i].res, nil)
	}
	return bw, pp, point
}

// prepareProposal makes p the proposal of q, stamped ts: its acknowledgement
// point, the keys the cad index needs, its request id and encoding. For a
// transaction, its written keys enter the leader's in-flight writers
// (txwait.go). It reports whether the write may be ordered before it is
// finished (newBatch's mayBeEarly).
func (r *Replica) prepareProposal(q *shard.WriteReq, p *proposal, ts int64) (mayBeEarly bool) {
	if cadtraceOn {
		p.trAt = traceNow()
	}
	if kv.TxValidated(q.Op.Kind) {
		p.txDone = make(chan struct{})
		r.txw.add(q.Op.WrittenKeys(), p.txDone)
	}
	early := r.answerableEarly(&q.Op)
	p.ack, p.blind = r.ackPointFor(q, early), NilextEligible(&q.Op)
	p.async = q.Durability == level.Async
	p.sess = q.Session
	p.durable = r.chainDurableWrite(q, p.ack)
	p.orderEarly = r.ordersEarly(q, p.ack, early)
	if p.orderEarly {
		mayBeEarly = true
	}
	if p.ack == vr.AckReplicated {
		p.op = cloneOp(&q.Op) // for the overlay (cad.go)
	}
	if p.ack != vr.AckApplied {
		mayBeEarly = true
		for _, k := range q.Op.WrittenKeys() {
			p.keys = append(p.keys, bytes.Clone(k))
		}
	}
	h := header{ts: ts}
	if q.ID.IsZero() {
		p.seq = r.localSeq.Add(1)
		h.proposer, h.seq = r.cfg.Self, p.seq
	} else {
		p.req.Client, p.req.ReqNum = q.ID.Client, q.ID.Seq
	}
	p.req.Data = encodeOp(nil, h, &q.Op)
	return mayBeEarly
}

// ordersEarly reports whether q, acknowledged at ack, is a sync blind write
// Apply answers at its ordered point (docs/design/cad.md §12); early is
// answerableEarly's verdict on it.
func (r *Replica) ordersEarly(q *shard.WriteReq, ack vr.AckPoint, early bool) bool {
	return ack == vr.AckApplied && early && !r.opts.Nilext && !(mutation.On && r.mut.syncWaitsInApply)
}

// applyWithoutOversize answers with an error, without proposing them, the
// writes of reqs whose keys or values the engine would refuse, and applies
// the others (split: some were refused, p and err are Apply's). A committed
// op the engine refuses fails the apply, and the replica stops — on every
// replica that applies it, and again on every restart that replays it: one
// SET with a 70 KiB key took a group down.
func (r *Replica) applyWithoutOversize(ctx context.Context, reqs []shard.WriteReq) (p shard.Pending, err error, split bool) {
	var bad []error
	for i := range reqs {
		if e := r.oversize(&reqs[i].Op); e != nil {
			if bad == nil {
				bad = make([]error, len(reqs))
			}
			bad[i] = e
		}
	}
	if bad == nil {
		return shard.Pending{}, nil, false
	}
	sub := make([]shard.WriteReq, 0, len(reqs))
	idx := make([]int, 0, len(reqs))
	for i := range reqs {
		if bad[i] != nil {
			reqs[i].Result, reqs[i].Err = kv.Result{}, bad[i]
			continue
		}
		sub = append(sub, reqs[i])
		idx = append(idx, i)
	}
	if len(sub) == 0 {
		return shard.Pending{}, nil, true
	}
	p, err = r.Apply(ctx, sub)
	for j, i := range idx {
		reqs[i].Result, reqs[i].Err = sub[j].Result, sub[j].Err
	}
	return p, err, true
}

// oversize returns an error if op writes a key or value above the engine's
// limits (kv.Op.CheckSizes). An APPEND whose result outgrows the value
// limit is not caught here: its size is known only at apply.
func (r *Replica) oversize(op *kv.Op) error {
	return op.CheckSizes(r.db.MaxKeySize(), r.db.MaxValueSize())
}

// Await waits until every write Apply answered at its ordered point is
// acknowledged: nil if all are, else the first one's error (the outcome of
// the writes is unknown).
func (bw *batchWait) Await(ctx context.Context) error {
	r := bw.r
	if mutation.On && r.mut.ackWaitSkipped {
		return nil
	}
	select {
	case <-bw.done:
	default:
		if err := r.awaitDone(ctx, bw.done, max(bw.deadline.Sub(r.clock.Now()), 0), ErrOutcomeUnknown); err != nil {
			return bw.timeoutErr(err)
		}
	}
	for i := range bw.ps {
		if p := &bw.ps[i]; p.early && p.err != nil {
			return p.err
		}
	}
	return nil
}

func (r *Replica) closedErr() error {
	if err := r.failed(); err != nil {
		return err
	}
	return shard.ErrClosed
}

// Wait waits for the acknowledgement of the writes Apply returned at their
// ordered point (p.Acks); an error means some of them may be lost, so no
// reply of their batch may claim success. Everything else Apply already
// waited for.
func (r *Replica) Wait(ctx context.Context, p shard.Pending) error {
	for _, a := range p.Acks {
		if err := a.Await(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Write is Apply and Wait for one write.
func (r *Replica) Write(ctx context.Context, op kv.Op, d level.Durability, id shard.ReqID) (kv.Result, error) {
	reqs := [1]shard.WriteReq{{Op: op, Durability: d, ID: id}}
	p, err := r.Apply(ctx, reqs[:])
	if err != nil {
		return kv.Result{}, err
	}
	if reqs[0].Err != nil {
		return kv.Result{}, reqs[0].Err
	}
	if err := r.Wait(ctx, p); err != nil {
		return kv.Result{}, err
	}
	return reqs[0].Result, nil
}
