package vr

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/core"
)

// The data types the host and the core share are the engine-neutral
// contract's (internal/core); VR keeps its names for them.
type (
	Status       = core.Status
	Request      = core.Request
	Entry        = core.Entry
	ClientRecord = core.ClientRecord
	Snapshot     = core.Snapshot
	HardState    = core.HardState
	Reply        = core.Reply
	ReadState    = core.ReadState
	AckPoint     = core.AckPoint
)

// A replica's protocol status (VR Revisited §4; core.Status).
const (
	Normal     = core.Normal
	ViewChange = core.ViewChange
	Recovering = core.Recovering
)

// MsgType says what a Message is.
type MsgType uint8

// Message types. Values are part of the wire format: never renumber.
const (
	MsgPrepare          MsgType = 1  // leader → followers: Entries, Commit
	MsgPrepareOK        MsgType = 2  // follower → leader: Op received, Persisted, Applied in View; HBSeq echoed
	MsgCommit           MsgType = 3  // leader heartbeat: Commit, Op (leader's last op), HBSeq
	MsgStartViewChange  MsgType = 4  // View; Op = 1: a pre-vote (viewchange.go, preVote)
	MsgDoViewChange     MsgType = 5  // → new leader: LastNormalView, Op, Commit, First, Entries
	MsgStartView        MsgType = 6  // new leader → all: Op, Commit, First, Entries
	MsgRecovery         MsgType = 7  // Nonce, Op (what the recovering replica still trusts)
	MsgRecoveryResponse MsgType = 8  // View, Nonce; from the leader also Op, Commit, First, Entries
	MsgGetState         MsgType = 9  // View, Op (requester's trusted last op)
	MsgNewState         MsgType = 10 // View, Op, Commit, First, Entries, Snapshot
	MsgRefuse           MsgType = 11 // Reason: the sender refused a message (configuration mismatch)
	// Reconfiguration (reconfig.go). A start-epoch tells a replica of an
	// older epoch (or a member that has not reported the epoch started)
	// the sender's configuration: Op is the epoch's start op, Entries[0].Data
	// its members and the previous ones (encodeMembership). An
	// epoch-started tells a previous member that the sender holds the
	// epoch's start state.
	MsgStartEpoch         MsgType = 12
	MsgEpochStarted       MsgType = 13
	maxMsgType                    = MsgEpochStarted
	msgTypeCountForTables         = int(maxMsgType) + 1
)

var msgNames = [msgTypeCountForTables]string{"invalid", "prepare", "prepare-ok", "commit",
	"start-view-change", "do-view-change", "start-view", "recovery", "recovery-response",
	"get-state", "new-state", "refuse", "start-epoch", "epoch-started"}

func (t MsgType) String() string {
	if int(t) < len(msgNames) {
		return msgNames[t]
	}
	return fmt.Sprintf("msg(%d)", uint8(t))
}

// Valid reports whether t is a known message type.
func (t MsgType) Valid() bool { return t >= MsgPrepare && t <= maxMsgType }

// Message is every peer message. One flat struct (rather than one type per
// message) keeps the wire codec a single reflection-free function and lets
// the configuration identity be checked in one place; each type uses the
// fields its comment names.
type Message struct {
	Type MsgType
	// Configuration identity, checked on every message (Config.Identity).
	Cluster    uint64
	Epoch      uint64
	ConfigHash uint64
	From, To   uint64

	View           uint64
	LastNormalView uint64
	Op             uint64
	Commit         uint64
	// First is the op number of Entries[0] (and of a do-view-change's whole
	// log), so an empty Entries still says where the sender's log starts.
	First    uint64
	Nonce    uint64
	HBSeq    uint64
	Entries  []Entry
	Snapshot *Snapshot
	Reason   string
	// DLog is the sender's nilext durability log, in its order: on
	// do-view-change, and on the leader's recovery-response (nilext.go).
	DLog []NilextRequest
	// DLogStale (do-view-change): the sender restarted since it last became
	// normal, and its disk may have lost d-log updates it acknowledged from
	// memory (cad/async) before: its DLog must not count as one of the logs
	// in d-log recovery (nilext_recover.go, nxRecover).
	DLogStale bool

	// CAD (cad.md). On prepare-ok, Op is the follower's last op held in
	// memory (received, counted for Acked only), Persisted its fsynced
	// prefix (counted for the commit point) and Applied its applied op
	// (counted for the readable index). On the leader's prepare and
	// heartbeat, Readable is the readable index R and Grant the read lease
	// the follower may assume from receipt, in nanoseconds (0: none), and
	// a non-zero Persisted asks the follower to sync its log now: something
	// at the leader waits for a commit (SyncWanted).
	Persisted uint64
	Applied   uint64
	Readable  uint64
	Grant     int64
	// AckSeq numbers a follower's prepare-oks; the leader echoes the latest
	// one it received with every grant, and the follower times the grant
	// from when it sent that prepare-ok (cad.go).
	AckSeq uint64
	// Nonce, unused on a leader's prepare and heartbeat otherwise, is 1 there
	// when the leader held its lease as it sent the message: its commit point
	// was then the group's, and the follower may time eventual reads from the
	// prepare-ok the message echoes (eventual.go).
}

func (m Message) String() string {
	s := fmt.Sprintf("%s %d->%d v%d", m.Type, m.From, m.To, m.View)
	switch m.Type {
	case MsgPrepare, MsgNewState, MsgStartView, MsgDoViewChange, MsgRecoveryResponse:
		s += fmt.Sprintf(" op%d c%d first%d n=%d", m.Op, m.Commit, m.First, len(m.Entries))
		if m.Type == MsgDoViewChange {
			s += fmt.Sprintf(" lnv%d", m.LastNormalView)
		}
		if m.Snapshot != nil {
			s += fmt.Sprintf(" snap@%d", m.Snapshot.Op)
		}
	case MsgPrepareOK:
		s += fmt.Sprintf(" op%d p%d a%d hb%d", m.Op, m.Persisted, m.Applied, m.HBSeq)
	case MsgCommit:
		s += fmt.Sprintf(" op%d c%d r%d g%d hb%d", m.Op, m.Commit, m.Readable, m.Grant, m.HBSeq)
	case MsgGetState, MsgRecovery:
		s += fmt.Sprintf(" op%d", m.Op)
		if m.Type == MsgGetState && m.Nonce == joinMark {
			s += " join"
		}
	case MsgStartEpoch:
		s += fmt.Sprintf(" e%d start%d", m.Epoch, m.Op)
	case MsgStartViewChange:
		if m.Op == preVoteMark {
			s += " pre-vote"
		}
	case MsgRefuse:
		s += " " + m.Reason
	}
	return s
}

// Errors callers branch on.
var (
	// ErrNotLeader: the request must go to the leader (Replica.Leader names it
	// when known).
	ErrNotLeader = core.ErrNotLeader
	// ErrNotNormal: the replica is in a view change or recovering.
	ErrNotNormal = core.ErrNotNormal
	// ErrStaleRequest: a client sent a request number below the one the client
	// table holds; it was executed (or superseded) long ago and its reply is gone.
	ErrStaleRequest = core.ErrStaleRequest
	// ErrNoLease: the leader does not hold a lease right now; use ReadIndex.
	ErrNoLease = core.ErrNoLease
	// ErrBusy: too many operations in flight; retry later.
	ErrBusy = core.ErrBusy
	// ErrNoReadLease: this follower holds no valid active-set lease in the
	// current normal view (or follower reads are off): redirect the
	// cross-client-monotonic read to the leader.
	ErrNoReadLease = errors.New("vr: no follower read lease")
)

// Where a write is acknowledged to its client (cad.md §1; core.AckPoint).
const (
	// AckApplied: when committed (persisted on a majority) and applied; the
	// Reply carries the result. sync writes, and every write whose reply
	// depends on state.
	AckApplied = core.AckApplied
	// AckReplicated: when held in memory by a majority (Info.Acked >= op);
	// cad blind writes. The ack comes out in Ready.Acks.
	AckReplicated = core.AckReplicated
	// AckAppended: as soon as the leader appended it (unsafe, for
	// experiments: the simulator's fully asynchronous baseline; the driver
	// acknowledges async writes at AckReplicated, docs/design/cad.md §19).
	AckAppended = core.AckAppended
)

// MemberState is a follower's place in the leader's active set (cad.md §3).
type MemberState uint8

const (
	// MemberOut: not in the active set; its applied op does not hold R back.
	MemberOut MemberState = iota
	// MemberJoining: counted in R, not yet granted (catching up to R).
	MemberJoining
	// MemberIn: counted in R and granted read leases.
	MemberIn
	// MemberRemoving: suspected; no more grants, still counted in R until
	// Removal has passed since the last grant sent.
	MemberRemoving
)

func (s MemberState) String() string {
	switch s {
	case MemberOut:
		return "out"
	case MemberJoining:
		return "joining"
	case MemberIn:
		return "in"
	case MemberRemoving:
		return "removing"
	}
	return fmt.Sprintf("member(%d)", uint8(s))
}

// ConfigError is emitted (Ready.Errors) when a peer's message does not match
// this replica's configuration identity: wrong cluster, wrong epoch, a
// different member list, an unknown sender or a message meant for another
// replica. The message is dropped and the sender is told (MsgRefuse).
type ConfigError struct {
	From   uint64
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("vr: refused message from replica %d: %s", e.From, e.Reason)
}

// RefusedError is emitted when a peer refused one of our messages.
type RefusedError struct {
	By     uint64
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("vr: replica %d refused our messages: %s", e.By, e.Reason)
}
