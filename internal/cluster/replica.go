package cluster

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Member is one replica of a group: its id, the address peers dial, and the
// RESP address clients (and forwarding followers) use.
type Member struct {
	ID         uint64
	PeerAddr   string
	ClientAddr string
}

// Hosted is a replica a node hosts, as the engine that opened it hands it
// to the node.
type Hosted struct {
	// Replica serves reads and writes (shard.Replica: the same method set
	// as a single node's shard).
	Replica shard.Replica
	// Group is the replication side the front door reports and the
	// engine-level requests it serves (KEFIR.NILEXT).
	Group Group
	// Engine is the replica's storage engine, for stats; the replica closes
	// it.
	Engine *storage.DB
	// Transport is the node's peer transport the replica is registered on:
	// the node hands it every accepted peer connection, and closes it after
	// the replica (which sends on it until it stops).
	Transport *transport.Transport
}

// Opener opens a node's replica of its group. The binary chooses the engine
// (cmd/kefir: vrshard.OpenHosted); the front door only calls it.
type Opener func(ReplicaSpec) (Hosted, error)

// ReplicaSpec is what a node hands the engine that opens its replica: where,
// which group, and the node's tuning. Fields an engine does not have are
// ignored by it (0 keeps an engine's default).
type ReplicaSpec struct {
	// Dir is the replica's directory (the engine's log and storage under
	// it); FS the file system to use (nil: the OS's).
	Dir    string
	FS     vfs.FS
	Logger *slog.Logger

	Cluster       uint64
	Self          uint64
	Members       []Member // in leader order
	ClusterSecret string
	// Bootstrap starts a new group if Dir holds no log (a group's very
	// first start only).
	Bootstrap bool
	// Membership, if set, is the configuration a new member of a
	// reconfigured group opens with (an empty Dir, no Bootstrap: it pulls
	// the state): Members above are then its members, in its leader order.
	// A replica whose disk records a later one runs that.
	Membership *Membership
	// Group is the replica's group on the node's peer transport, and
	// Transport that transport when the node hosts several groups (the
	// node made it; the replica registers its group on it). Nil: the
	// node's only replica, which makes the transport itself.
	Group     GroupID
	Transport *transport.Transport
	// ChainMasters, for a chain group of a cluster of several groups
	// (Config.OpenChainReplica), are the metadata group's members: each
	// runs the group's hosted master (ChainMasterHost), and the member
	// sends its master's messages to all of them. Where it starts: the node
	// replaces the list as its map changes (ChainMastersFollower).
	ChainMasters []uint64

	HeartbeatInterval time.Duration
	ViewChangeTimeout time.Duration
	CheckpointOps     uint64
	// Nilext fast path (Skyros) and its tuning; CAD's sync delay; follower
	// reads (docs/design/cad.md §3).
	Nilext          bool
	NilextBatch     int
	NilextInterval  time.Duration
	NilextSyncDelay time.Duration
	CadSyncDelay    time.Duration
	FollowerReads   bool
	// ClockSkew bounds every member's wall-clock offset from the leader's:
	// a follower decides key expiry at its clock plus it (docs/consistency.md,
	// "Key expiry"; 0: the engine's default).
	ClockSkew time.Duration
	// ActiveExpiry is the tick of the replica's active expiry (the leader
	// deletes expired keys; docs/design/expiry.md): 0 the engine's
	// default, negative off.
	ActiveExpiry time.Duration

	// Storage configures the replica's storage engine (its OnSync times
	// the engine's fsyncs); OnLogSync times the replication log's.
	Storage   storage.Options
	OnLogSync func(time.Duration)

	// AskTail asks the member at client address addr — a chain group's
	// tail — for its version in configuration epoch (KEFIR.CHAINVERSION,
	// Router.AskChainVersion): a chain member's CRAQ version query
	// (docs/design/chain.md, "The version query"). Nil: a strong read of a
	// key dirty at a member goes to the tail whole.
	AskTail func(ctx context.Context, addr string, group GroupID, epoch uint64) (uint64, error)
}

// Group is the replication side of a hosted replica, in words that are not
// one engine's: its state, counters and view events for /status, INFO and
// metrics, and the nilext fast path's requests (KEFIR.NILEXT, the
// coordinator in the front door). A single node has none.
type Group interface {
	State() State
	Stats() Stats
	ViewEvents() []ViewEvent

	// NilextOn reports whether the nilext fast path runs (every member
	// agrees on it).
	NilextOn() bool
	// NilextEligible reports whether op is a nilext update the fast path
	// takes (plain SET and MSET).
	NilextEligible(op *kv.Op) bool
	// NilextApply coordinates reqs on the fast path and returns the indexes
	// of those that fell back: the caller applies them through the
	// Replica (the ids the fast path used make that exactly-once).
	NilextApply(ctx context.Context, reqs []shard.WriteReq) (fallbacks []int, err error)
	// NilextTake appends one client-coordinated update to this replica's
	// d-log and returns its ack; NilextTakeBatch does it for several
	// (acks[i] valid when errs[i] is nil). A *RequestError is the client's
	// mistake; a *NotLeaderError means the replica is not in a normal view.
	NilextTake(ctx context.Context, id shard.ReqID, op kv.Op, d level.Durability) (NilextAck, error)
	NilextTakeBatch(ctx context.Context, ups []NilextDirect) (acks []NilextAck, errs []error)
}

// ChainRestarter is a Group that is a chain node hosting a chain master
// (vrshard): the admin port's POST /chain/restart asks it to restart a chain
// that is down without members that may never come back. An error wrapping
// ErrNotActing means this node's master does not act (ask another node).
type ChainRestarter interface {
	RestartChainWithout(ids []uint64) (string, error)
}

// ChainMasterHost is a Group that is a node's replica of a cluster's
// metadata group and can host the master of one of the cluster's chain
// groups (vrshard): the chain's configuration is recorded in the metadata
// group, and the master acts only at its leader. The node starts one per
// chain group of the map (server, groupmembers.go).
type ChainMasterHost interface {
	HostChainMaster(ChainMasterSpec) (HostedChainMaster, error)
}

// HostedChainMaster is a node's running master of one of the cluster's
// chain groups (ChainMasterHost): the admin port's POST /chain/restart?group=G
// asks it (ChainRestarter), and Stop stops it.
type HostedChainMaster interface {
	ChainRestarter
	Stop()
}

// ChainMastersFollower is a chain group's member (Hosted.Replica) whose
// master's nodes — the metadata group's members, where the masters run —
// follow the cluster's map: the node calls SetChainMasters with the map's
// metadata members whenever it looks at its map, so that a change of the
// metadata group (replace-node, remove-node) does not strand the chain.
type ChainMastersFollower interface {
	SetChainMasters(ids []uint64)
}

// ChainMasterSpec is a chain group whose master a metadata node hosts.
type ChainMasterSpec struct {
	Group GroupID
	// Members is the chain's first configuration, head first (the map's
	// record; the master takes the metadata group's chain record over it
	// once there is one).
	Members []uint64
	// Transport is the node's peer transport; Local this node's member of
	// the chain, if it is one (nil otherwise: the master then registers
	// the group on Transport itself).
	Transport *transport.Transport
	Local     shard.Replica
	Logger    *slog.Logger
}

// ErrNotActing: this node's chain master does not act — it is not at the
// metadata group's leader, is still taking over, or the node hosts none.
var ErrNotActing = errors.New("this node's chain master does not act (not the metadata group's leader, or taking over): ask another node")

// Roles a replica reports (State.Role).
const (
	RoleLeader     = "leader"
	RoleFollower   = "follower"
	RoleRecovering = "recovering"
	RoleViewChange = "view-change"
	RoleFailed     = "failed"
)

// State is a replica's protocol state.
type State struct {
	Self uint64
	// Role is one of the Role constants; Status is the engine's own word
	// for its state (VR: normal, view-change, recovering).
	Role   string
	Status string
	// Normal: the group has a leader this replica follows (or is), Leader.
	Normal   bool
	View     uint64
	Leader   uint64
	IsLeader bool
	Commit   uint64
	Applied  uint64
	Failed   error
	// DLogLen is the nilext d-log's length (pending nilext updates).
	DLogLen int
	// Readable is the readable index this replica knows (CAD).
	Readable uint64
	// NilextCycles counts view changes whose d-logs ordered pending updates
	// in a cycle; NilextStaleWaits those that waited for fresh d-logs.
	NilextCycles, NilextStaleWaits uint64
	// DLogStale: this replica restarted and its d-log does not count in
	// d-log recovery yet.
	DLogStale bool
	// Membership (reconfiguration, membership.go): the configuration's
	// epoch; Joining: a new member pulling the epoch's start state;
	// Leaving: no longer a member, handing the state over; Retired: left,
	// the node may stop it for good.
	Epoch                     uint64
	Joining, Leaving, Retired bool
	// Followers (a VR leader): each follower's progress as the leader last
	// heard it, for the lag /status and the metrics report; shared by
	// every caller (read only).
	Followers []FollowerState
}

// FollowerState is a leader's view of one follower: the highest op it
// acknowledged as persisted and the highest it reported applied.
type FollowerState struct {
	ID                 uint64
	Persisted, Applied uint64
}

// NilextAck is one replica's acknowledgement of a nilext update: the view
// it took it in, from which replica, and whether that replica leads the
// view (a completion needs the leader's ack).
type NilextAck struct {
	View   uint64
	From   uint64
	Leader bool
}

// NilextDirect is one client-coordinated nilext update (KEFIR.NILEXT).
type NilextDirect struct {
	ID         shard.ReqID
	Op         kv.Op
	Durability level.Durability
}

// ViewEvent is one view event. Leader is the view's leader (0 while a view
// change runs: none is known).
type ViewEvent struct {
	Time   time.Time
	Kind   string
	View   uint64
	Leader uint64
	Reason string
}

// Stats are a replica's counters.
type Stats struct {
	Readies     uint64 // Ready batches handled
	Fsyncs      uint64 // fsyncs of the replication log
	Persisted   uint64 // log entries written
	Applied     uint64 // ops applied to the engine
	Proposals   uint64 // writes proposed at this replica while leader
	LeaseReads  uint64 // linearizable reads served under the lease
	LocalReads  uint64 // reads confirmed by a published lease, without the driver (leader lease and follower reads)
	IndexReads  uint64 // linearizable reads that needed a read-index round
	Checkpoints uint64
	// SnapsSent counts snapshots handed to the transport (not a copy the
	// core asked for while the last one was still being encoded: dropped).
	SnapsSent   uint64
	SnapsLoaded uint64
	// SnapsCaptured counts snapshot captures started (one may serve several
	// peers; one the core refuses is captured again).
	SnapsCaptured uint64
	// Forgets counts the forget entries this node proposed as leader
	// (client rows of clients the core dropped; docs/design/client-table.md).
	Forgets uint64
	// Nilext fast path: writes this node coordinated that completed on a
	// supermajority, and those that fell back to the ordered path; nilext
	// messages sent (one per peer per batch) and acks sent to coordinators;
	// linearizable reads at the leader that had to order pending updates.
	NilextFast      uint64
	NilextFallbacks uint64
	NilextSent      uint64
	NilextAcksSent  uint64
	NilextSlowReads uint64
	// CAD (vrshard cad.go): reads at the leader that waited for their keys'
	// latest update to become readable; cross-client-monotonic reads a
	// follower served locally, and those it redirected; cad/async writes
	// acknowledged before commit; reads served from the leader's async
	// overlay. DurabilityRounds counts the waits registered with the core:
	// at least one per durability wait, more when a read had to wait again.
	DurabilityWaits   uint64
	DurabilityRounds  uint64
	FollowerReads     uint64
	FollowerRedirects uint64
	// A chain member's strong reads (vrshard chainread.go): answered at
	// once (the key clean there), sent to the tail (dirty there), waited
	// for (dirty at the tail).
	ChainClean, ChainToTail, ChainWaits uint64
	// Under AUSI, the waits of a strong read for an update it read to
	// reach the durable point (vrshard chainDurableRead).
	ChainDurableWaits uint64
	// The version query: dirty reads answered at the member at the tail's
	// version, ones sent on whole after all (the query failed or the wait
	// ran long), and queries this member answered as the tail.
	ChainVersionReads, ChainVersionFallbacks, ChainVersionAnswers uint64
	// Of the version reads, those answered from an update held at the
	// member and not yet applied there (a blind write the tail's version
	// covers: CRAQ proper); and the version queries the member sent (one
	// answers every dirty read that waited for it: batched).
	ChainHeldReads, ChainVersionQueries uint64
	// Of the version reads, those that waited for the member's apply to
	// reach the tail's version.
	ChainVersionWaited uint64
	EarlyAcks          uint64
	OverlayReads       uint64
	// TxEarlyAborts counts the transactions (EXEC, KEFIR.TX commits) this
	// node answered as aborted as leader without proposing them: their
	// validation must fail (vrshard txdoom.go).
	TxEarlyAborts uint64
	// TxHolds counts the transactions this node, as leader, held behind
	// commits it had in flight that write a key they check, and
	// TxHeldAborts those of them it then answered as aborted without
	// proposing them (among TxEarlyAborts; vrshard txwait.go).
	TxHolds, TxHeldAborts uint64
	// TxFreshReads counts the transactions whose first read waited, at this
	// node as leader, for the commits in flight that write its keys, and
	// then took their start version again (server txRefresh).
	TxFreshReads uint64
	// DeferredReads counts the durability waits (among DurabilityWaits)
	// served as deferred reads: answered at once from the leader's log,
	// the reply held until R covered it (ReadDeferred).
	DeferredReads uint64
	// View events (vrshard viewlog.go): view changes this replica started or
	// joined, normal views it entered under a leader other than the last
	// one, times it stopped leading, and writes it refused because it knew
	// no leader.
	ViewChanges, LeaderChanges, Depositions, WritesRefusedNoLeader uint64
	// ExpiredKeys counts the keys this replica's active expiry deleted
	// while it led (INFO's expired_keys).
	ExpiredKeys uint64
}
