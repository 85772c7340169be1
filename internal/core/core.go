// Package core is the contract between the replica host (internal/vrshard
// today: log, apply, snapshots, read waiters, group commit) and a replication
// protocol core (internal/vr; a chain core next). etcd-io/raft's RawNode,
// Ready and Advance are the model: events go in (Step, Heard, Tick, Propose,
// Persisted, Read), the core's actions come out in one Ready batch, and
// Advance reports what the host applied. docs/design/one-house.md, "The core
// contract", lists every interaction the host has with a core and which of
// them are in this contract.
//
// The package is pure, like the cores that implement it (internal/purity):
// no goroutines, clocks, randomness or I/O. Time comes in with every call as
// the host's local clock in nanoseconds.
//
// The data types here (Entry, Request, HardState, Snapshot, Reply,
// ReadState, Status, AckPoint and the errors) were VR's; internal/vr keeps
// them under their old names as aliases, so a core and its host share one
// definition.
package core

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
)

// Core is one replica's protocol core as the host drives it, from one
// goroutine. M is the engine's peer message type: the host moves messages
// between the engine's codec and the core without reading them.
//
// The host's obligations (internal/vr doc.go has them in full for VR):
// after any event it calls Ready and performs the batch in field order —
// write Snapshot, Truncate, Entries, HardState as one append and report its
// fsync with Persisted(PersistSeq) (batches durable in order); send
// Messages; apply Committed in op order, skipping Duplicates, and call
// Advance with one result per entry before the next event; deliver Replies
// and Acks; serve ReadStates once applied >= Index; capture a snapshot for
// each SnapshotNeeded peer (SendSnapshot); log Errors.
type Core[M any] interface {
	// Step hands the core one message from a peer.
	Step(now int64, m M)
	// Heard: peer `from` is sending something that has not arrived yet (a
	// large message in progress): it is alive.
	Heard(now int64, from uint64)
	// Tick runs the core's timers.
	Tick(now int64)
	// Propose asks the core to order a client request, acknowledged at ack
	// (a core that has no early acknowledgement refuses anything but
	// AckApplied). ErrBusy: the pipeline is full, propose again after a
	// commit; ErrNotLeader, ErrNotNormal, ErrStaleRequest: refused.
	Propose(now int64, req Request, ack AckPoint) error
	// Persisted: every disk batch up to PersistSeq seq is written and
	// fsynced.
	Persisted(seq uint64)
	// Read registers a read request: its answer comes out in a later
	// Ready's ReadStates with req.Ctx (the index to have applied before
	// serving, or an error) — in the next Ready when the core can answer
	// from its own state (a leader lease, as etcd's ReadOnlyLeaseBased),
	// else after a round with its peers. An error: refused now (not the
	// leader; a kind this core does not serve).
	Read(now int64, req ReadRequest) error
	// Ready returns the actions accumulated since the last call.
	Ready() Ready[M]
	// Advance reports the results of the last Ready's Committed entries,
	// in order (nil for duplicates).
	Advance(results [][]byte)

	// Info is the core's state for the host's publication (leader, view,
	// commit) and metrics.
	Info() Info
	// ClientTable is the client table as of the applied op, for a snapshot
	// or checkpoint; ClientTableMinOp its oldest record's op.
	ClientTable() []ClientRecord
	ClientTableMinOp() (op uint64, ok bool)
	// CompactPoint is the op up to which the log may be compacted after a
	// checkpoint at op, keeping a tail; Compact drops the log up to op (the
	// host stored a snapshot there).
	CompactPoint(op, keepEntries uint64, keepBytes int) uint64
	Compact(op uint64) error
	// SendSnapshot answers Ready.SnapshotNeeded: s is the state machine at
	// the applied op.
	SendSnapshot(to uint64, s Snapshot) error
}

// Boot is what a core starts from: nothing (a new group), or what the host
// recovered from its disk. An engine adds its own (VR: a recovery nonce,
// the nilext d-log).
type Boot struct {
	// HardState is the last one written.
	HardState HardState
	// Snapshot is the latest durable snapshot (nil: none, the log starts at
	// 1). The host has already restored the state machine from it.
	Snapshot *Snapshot
	// Entries follow the snapshot, contiguous.
	Entries []Entry
	// LostState: the disk may lack something this replica promised before
	// it stopped (a replaced disk, a lost engine): the core must recover
	// from its group before it votes or acknowledges anything.
	LostState bool
	// Bootstrap: the very first start of a new group. Any later start is a
	// restart, even with an empty disk.
	Bootstrap bool
	// Applied is the state machine's own record of how far it applied (the
	// engine's applied mark; 0: unknown). The host applies only committed
	// entries, so every op up to it was committed. VR does not need it; the
	// chain core counts it as committed, since a chain member's commit
	// point, written before it applies, is durable only with its next
	// batch's fsync (vrshard chaincore.go).
	Applied uint64
	// StateTop is the newest version the state machine holds records of
	// (the engine's; 0: it holds none). After a lost state it may hold
	// records no op of the log accounts for — pages of a snapshot a crash
	// cut short, or what a lost engine kept — which a core must not replay
	// its history over (the chain core's joiner asks for a snapshot).
	StateTop uint64
}

// SyncHinter is what a core offers a host that holds log batches for a
// later fsync (group commit): hints that make the replicas sync now because
// someone waits for a commit. Optional: a core without it gets no hints,
// and the host then holds nothing it would have to release early. Hints
// change when replicas fsync, never what they promise.
type SyncHinter interface {
	// WantSync makes the core's next messages ask its peers to sync held
	// batches now: a proposal waits for its commit, or, with beat,
	// something waits for entries already sent (send a beat at once if any
	// is not committed).
	WantSync(beat bool)
	// AskSync (at a replica that does not order writes) asks the one that
	// does, and through it the others, to sync held batches now: a caller
	// here waits for an apply.
	AskSync()
	// Queued reports whether the request the last Propose took will be a
	// new log entry (false: a retry of one in flight or executed, whose
	// waiter waits for an entry that may be held).
	Queued(client, req uint64) bool
}

// Ready is the batch of actions a core produced since the last Ready. The
// host performs them in field order (Core).
type Ready[M any] struct {
	// PersistSeq, when non-zero, numbers this batch's disk writes
	// (Snapshot, Truncate, Entries, HardState, in that order). After they
	// are written *and fsynced*, the host calls Persisted(PersistSeq).
	// Batches are synced in order: one fsync may cover several, reported as
	// the highest.
	PersistSeq uint64
	// Snapshot, if set, replaces the state machine and the whole log: the
	// host stores it durably, discards every log entry, and restores the
	// application state from Snapshot.Data before applying anything later.
	Snapshot *Snapshot
	// Truncate, if HasTruncate, discards every log entry with op > Truncate.
	HasTruncate bool
	Truncate    uint64
	// Entries are appended to the log, contiguous after the log's last op.
	Entries []Entry
	// HardState, if set, is written last: it may vouch for entries in
	// Entries, so a torn batch must never keep it without them (a prefix of
	// Truncate, Entries, HardState is always consistent).
	HardState *HardState

	// Messages may be sent at once, before the fsync of this batch: the
	// core itself withholds every message that promises durability until
	// Persisted covers what it promises.
	Messages []M

	// Committed are entries to apply to the state machine, in op order,
	// after everything before them. The host executes each one that is not
	// a Duplicate and passes the results to Advance.
	Committed []Committed

	// Replies to clients (from the leader): results of applied requests and
	// duplicates answered from the client table.
	Replies []Reply
	// ReadStates answer read requests (Read): serve once applied >= Index,
	// or fail with Err.
	ReadStates []ReadState
	// SnapshotNeeded lists peers that need a snapshot (their log is behind
	// this replica's first entry). The host answers with SendSnapshot.
	SnapshotNeeded []uint64
	// SnapshotPages lists peers that pull a snapshot a page at a time (a
	// chain joiner's pre-copy): the host answers each with SendSnapshot
	// carrying one page of its capture (Snapshot's paging fields).
	SnapshotPages []PageRequest
	// Errors are things an operator must see (configuration mismatches,
	// peers refusing us). They change nothing; log them (rate-limited).
	Errors []error
	// Acks are early acknowledgements of writes proposed with an AckPoint
	// other than AckApplied: Client, ReqNum and Op, no Result. The write's
	// normal Reply still comes when it is applied.
	Acks []Reply

	// Lease is the core's lease as of this Ready, taken before anything in
	// it: the host publishes it for reads served off its driver before it
	// sends any of Messages (a reader must not use a lease this replica
	// gave up by joining another view). Every Ready carries it; it does not
	// make a Ready non-empty.
	Lease Lease

	// Readable is the readable index R as of this Ready (after everything
	// in it): every op <= R is on enough replicas that every later leader
	// has it, so a read off the driver may serve it once applied (CAD,
	// docs/design/cad.md). The host publishes it once this Ready's
	// Committed are applied, and before it serves its ReadStates. It never
	// exceeds the commit point. A core that acknowledges nothing before
	// commit sets its commit point; 0: nothing is readable here now.
	Readable uint64
	// Durable is how far every log-datastore member persisted (a chain's
	// durable point at this member, as an op: docs/design/chain.md,
	// "Per-request durability"); the host answers a write that asks for
	// durability only once it covers the write. A core that acknowledges
	// nothing before every disk it promises has it leaves it 0 (VR).
	Durable uint64
	// EventualUntil is the host's local time until which this replica may
	// serve eventual reads from its applied state (0: not now;
	// math.MaxInt64: no bound). A core without eventual reads leaves it 0.
	//
	// Readable and EventualUntil ride on every Ready, as Lease does, and do
	// not make a Ready non-empty: the host publishes the last Ready's.
	EventualUntil int64
}

// Lease lets the host serve reads without asking the core, until a local
// time (Ready.Lease).
type Lease struct {
	// Held: there is a lease; the rest is meaningless otherwise.
	Held bool
	// Until is the host's local time (the clock it passes in) at which the
	// lease ends.
	Until int64
	// Index is the op a read under a leader's lease must find applied (its
	// commit point), or the one a follower's read lease serves up to (CAD's
	// readable index R).
	Index uint64
	// Follower: a follower's read lease (cross-client-monotonic reads),
	// not a leader's (linearizable reads).
	Follower bool
}

// Empty reports whether rd holds nothing to do.
func (rd *Ready[M]) Empty() bool {
	return rd.PersistSeq == 0 && len(rd.Messages) == 0 && len(rd.Committed) == 0 &&
		len(rd.Replies) == 0 && len(rd.ReadStates) == 0 && len(rd.SnapshotNeeded) == 0 && len(rd.SnapshotPages) == 0 && len(rd.Errors) == 0 &&
		len(rd.Acks) == 0
}

// HasWrite reports whether rd carries disk writes.
func (rd *Ready[M]) HasWrite() bool {
	return rd.Snapshot != nil || rd.HasTruncate || rd.HardState != nil || len(rd.Entries) > 0
}

// Committed is an entry ready to apply. Duplicate entries (a client's request
// that was already executed: a retry ordered twice across a view change) must
// not be executed; their result is the client table's.
type Committed struct {
	Entry
	Duplicate bool
}

// Info is the engine-neutral part of a core's state.
type Info struct {
	Self   uint64
	Status Status
	// View is the core's configuration generation: VR's view, a chain's
	// epoch. A change of View or leader ends what the host promised under
	// the old one (its waiting writes' outcomes are unknown).
	View     uint64
	Leader   uint64
	IsLeader bool
	FirstOp  uint64
	LastOp   uint64
	Commit   uint64
	// Tail is a chain's tail as this member last heard of it (itself if it
	// is the tail; 0: unknown, or VR): where a strong read of a key with an
	// update not yet committed here is sent (docs/design/chain.md, "Reads at
	// any member on the host").
	Tail uint64
	// Epoch is a chain's configuration epoch (0 for VR): View at every
	// member but the head, which reports the epoch it became the head at.
	// The version query names it (the tail answers only in the asker's).
	Epoch uint64
}

// Status is a replica's protocol status (VR Revisited §4; a chain core maps
// its own states onto these).
type Status uint8

const (
	// Normal: the replica takes part in the current view.
	Normal Status = iota + 1
	// ViewChange: the replica is moving to a new view and does not accept
	// writes.
	ViewChange
	// Recovering: the replica lost state it may have promised; it neither
	// votes nor acknowledges until the recovery protocol has rebuilt it.
	Recovering
	// Removed: a chain member its master's configuration no longer
	// includes (failed while it was alive, or a truncated old tail): it
	// serves nothing and takes no lease until it restarts and rejoins.
	Removed
)

func (s Status) String() string {
	switch s {
	case Normal:
		return "normal"
	case ViewChange:
		return "view-change"
	case Recovering:
		return "recovering"
	case Removed:
		return "removed"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Request is one client operation to order. Data is opaque to the core: the
// host's state machine interprets it. Client 0 means "no identity" (plain
// clients): such requests bypass the client table.
type Request struct {
	Client uint64
	ReqNum uint64
	Data   []byte
}

// Entry is one slot of the replicated log: a request at op number Op, first
// proposed by the leader of View. Two entries with the same Op and View are the
// same entry (one leader per view, and a leader's log only grows), which is
// how logs are compared without looking at Data.
type Entry struct {
	View uint64
	Op   uint64
	Request
}

// ClientRecord is one row of the client table: the latest request of a client
// that was executed (Op: the op it executed at) and its result. It is part of
// the replicated state: it is rebuilt from the log on every replica and travels
// inside snapshots (without Touched, which the core does not use). It is kv's
// entry: the one client table every engine keeps (internal/kv, clients.go).
type ClientRecord = kv.ClientEntry

// Snapshot is the state machine at op Op: the application's state (Data,
// produced and consumed by the host) and the client table.
type Snapshot struct {
	Op      uint64
	Clients []ClientRecord
	Data    []byte
	// A page of a paged snapshot (the chain's pre-copy; zero: the whole
	// state): Data holds the keys after the cursor From (nil: from the
	// first) up to Next, both keys of the host's state; More says pages
	// follow. Clients come with the last page. A page with More restores
	// nothing yet: its host writes its records and waits for the rest.
	From, Next []byte
	More       bool
	// Number is the engine's own number of the snapshot's last entry, when
	// its entries carry one beyond the op (the chain's sequence numbers;
	// 0: none, or unknown — VR's ops number themselves). The host keeps it
	// on disk with the snapshot and gives it back at a restart
	// (Boot.Snapshot): the entries that would tell it are gone (Numberer).
	Number uint64
}

// Numberer is what a core offers whose log entries carry a number of their
// own beyond the op (the chain's sequence numbers, whose numbering epoch a
// whole-chain restart compares): the host asks it, at a checkpoint at op,
// for the number to keep with the snapshot (Snapshot.Number), since after
// the checkpoint no entry on the disk may tell it. Optional: a core without
// it gets 0 (unknown).
type Numberer interface {
	// NumberAt is the number of the history's entry at op (0: unknown).
	NumberAt(op uint64) uint64
}

// PageRequest asks the host for the page of its snapshot at Op after the
// cursor After (Op 0, or an Op its capture is no longer at: the first page
// of a new capture).
type PageRequest struct {
	To    uint64
	Op    uint64
	After []byte
}

// HardState is what a replica persists besides its log, so that a restart from
// an intact disk keeps its promises: the view it promised not to go below,
// the last view in which it was normal (its log is a prefix of that view's
// leader's log), and a commit point below which its log is final.
type HardState struct {
	View           uint64
	LastNormalView uint64
	Commit         uint64
}

// Reply answers a client request: the result the state machine produced (or
// the cached one, for a duplicate), or Err.
type Reply struct {
	Client uint64
	ReqNum uint64
	Op     uint64
	Result []byte
	Err    error
}

// ReadRequest asks the core what a read must wait for (Core.Read).
type ReadRequest struct {
	Ctx  uint64
	Kind ReadKind
	// Need is the op that must be readable (ReadDurable, ReadDurableKnown).
	Need uint64
}

// ReadKind says what a read request asks the core to confirm.
type ReadKind uint8

const (
	// ReadLinearizable: that this replica leads (under its lease, or by a
	// round with its peers). Index is its commit point then.
	ReadLinearizable ReadKind = iota
	// ReadDurable (leader): that op Need is readable — on enough replicas
	// that every later leader has it (CAD's readable index R >= Need) —
	// and, after that, that this replica still leads. Index >= Need.
	ReadDurable
	// ReadDurableKnown (leader): ReadDurable for a read whose result was
	// fixed under confirmed leadership: readability alone releases it.
	ReadDurableKnown
	// ReadFollower (follower): the index up to which this follower may
	// serve under its read lease (CAD's R), or an error: ask the leader.
	ReadFollower
)

func (k ReadKind) String() string {
	switch k {
	case ReadLinearizable:
		return "linearizable"
	case ReadDurable:
		return "durable"
	case ReadDurableKnown:
		return "durable-known"
	case ReadFollower:
		return "follower"
	}
	return fmt.Sprintf("read(%d)", uint8(k))
}

// ReadState says that a read registered with Ctx may be served once the
// local state machine has applied Index (or failed with Err). Lease: the
// core answered from its own state (a leader lease), without a round trip
// to its peers; the host counts it as such.
type ReadState struct {
	Ctx   uint64
	Index uint64
	Err   error
	Lease bool
}

// Errors callers branch on. Their texts keep VR's words: operators and
// tests know them.
var (
	// ErrNotLeader: the request must go to the leader (Info.Leader names it
	// when known).
	ErrNotLeader = errors.New("vr: not the leader")
	// ErrNotNormal: the replica is in a view change or recovering.
	ErrNotNormal = errors.New("vr: replica not in normal status")
	// ErrStaleRequest: a client sent a request number below the one the client
	// table holds; it was executed (or superseded) long ago and its reply is gone.
	ErrStaleRequest = errors.New("vr: stale request")
	// ErrNoLease: the leader does not hold a lease right now; confirm
	// leadership with a round (VR's ReadIndex).
	ErrNoLease = errors.New("vr: no leader lease")
	// ErrBusy: too many operations in flight; retry later.
	ErrBusy = errors.New("vr: too many operations in flight")
)

// AckPoint is where a write is acknowledged to its client (cad.md §1).
type AckPoint uint8

const (
	// AckApplied: when committed (persisted on a majority) and applied; the
	// Reply carries the result. sync writes, and every write whose reply
	// depends on state.
	AckApplied AckPoint = iota
	// AckReplicated: when held in memory by a majority; cad blind writes.
	// The ack comes out in Ready.Acks.
	AckReplicated
	// AckAppended: as soon as the leader appended it (unsafe, for
	// experiments: the simulator's fully asynchronous baseline).
	AckAppended
)

func (a AckPoint) String() string {
	switch a {
	case AckApplied:
		return "applied"
	case AckReplicated:
		return "replicated"
	case AckAppended:
		return "appended"
	}
	return fmt.Sprintf("ack(%d)", uint8(a))
}
