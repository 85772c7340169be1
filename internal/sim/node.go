package sim

import (
	"fmt"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Addr names a simulated endpoint. Replicas are 0..Replicas-1 and clients are
// Replicas..Replicas+Clients-1, so a core can tell them apart from its Config.
type Addr int

// EventKind says what an Event carries.
type EventKind uint8

const (
	// Message: Msg arrived from From.
	Message EventKind = iota + 1
	// Tick: the node's timer fired; Now is its local clock. Ticks arrive every
	// Config.Tick of *local* time, so a fast clock ticks more often in real time.
	Tick
	// Invoke (clients only): start operation Op with sequence number Seq.
	Invoke
	// Persisted (replicas only): the first Persisted records of the node's log
	// (counting those recovered at restart) are durable (fsynced).
	Persisted
)

func (k EventKind) String() string {
	switch k {
	case Message:
		return "msg"
	case Tick:
		return "tick"
	case Invoke:
		return "invoke"
	case Persisted:
		return "persisted"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one input to a Node.
type Event struct {
	Kind EventKind
	// Now is the node's local clock (virtual nanoseconds, drifted) when the
	// event is delivered. Cores use it for leases and timeouts instead of
	// reading a clock.
	Now  int64
	From Addr
	Msg  any
	Seq  uint64   // Invoke
	Op   check.Op // Invoke: Kind, Key, Value, Expect, Delta, Cons, Dur
	// Route (Invoke, when Routed): the replica the test wants the operation
	// sent to, e.g. a lagging follower for a follower read. A client honours
	// it where its protocol allows reads there and ignores it otherwise.
	Route     Addr
	Routed    bool
	Persisted int // Persisted
}

// Envelope is an outgoing message.
type Envelope struct {
	To  Addr
	Msg any
}

// Completion is a client operation's end.
type Completion struct {
	Seq     uint64
	Outcome check.Outcome // OK, Failed or Unknown
	Result  check.Result
}

// Ready is the batch of actions a Node produced since it was last drained.
// The simulator performs them in field order:
//
//  1. Persist: append these records to the node's log, in order, after every
//     record appended before. They are not durable yet.
//  2. Sync: fsync the log. When the fsync completes (after a simulated disk
//     latency) the node receives Persisted with the log length at the time of
//     the request. A node must not send a message that promises durability
//     (e.g. a prepare-ok under sync durability) before that event arrives.
//  3. Messages: send. They may already leave before the fsync: that is how
//     CAD-style protocols acknowledge before persisting.
//  4. Done (clients only): operations that completed.
type Ready struct {
	Persist  [][]byte
	Sync     bool
	Messages []Envelope
	Done     []Completion
}

// Empty reports whether there is nothing to do.
func (r *Ready) Empty() bool {
	return len(r.Persist) == 0 && !r.Sync && len(r.Messages) == 0 && len(r.Done) == 0
}

// Node is a deterministic state machine: a replica (core plus its state
// machine) or a client library. Step must not block; Ready returns and clears
// the pending actions (the simulator may keep the returned slices until the
// next Step, so a core may reuse them after that).
type Node interface {
	Step(ev Event)
	Ready() Ready
}

// Config is what a node learns about the cluster when it is created.
type Config struct {
	Replicas int
	Clients  int
	// Tick is the nominal interval between Tick events, on the node's clock.
	Tick time.Duration
}

// IsReplica reports whether a is a replica address.
func (c Config) IsReplica(a Addr) bool { return a >= 0 && int(a) < c.Replicas }

// ClientAddr is the address of client i.
func (c Config) ClientAddr(i int) Addr { return Addr(c.Replicas + i) }

// Boot is what a replica is given when it starts or restarts.
type Boot struct {
	Config Config
	// Recovered are the records its log kept (nil on first start). They may
	// include records appended but never synced, and miss the last ones; a
	// torn record is never returned. All of them are durable by now.
	Recovered [][]byte
	// FS is the replica's own disk, for engines that keep more than the log
	// (e.g. an internal/storage engine under the shard). It has the same crash
	// semantics as the log; its writes and fsyncs take no simulated time.
	// The simulator owns the file "/wal"; use other names.
	FS vfs.FS
}

// BootFactory builds replica id from its Boot (log records and own disk).
type BootFactory func(id Addr, b Boot) Node

// ReplicaFactory builds replica id from the records its log recovered (nil on
// first start); see Boot.Recovered. Engines that also want their own disk use
// a BootFactory (Options.NewReplicaBoot) instead.
type ReplicaFactory func(id Addr, cfg Config, recovered [][]byte) Node

// ClientFactory builds client library instance id.
type ClientFactory func(id Addr, cfg Config) Node
