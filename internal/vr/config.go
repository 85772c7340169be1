package vr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"
)

// Config is a replica's view of its group. All replicas of a group must have
// equal Cluster, Epoch and Members; every message carries their identity and a
// mismatch is refused (ConfigError), so a node started with the wrong peer
// list cannot corrupt a group.
type Config struct {
	// Cluster identifies the group (e.g. a random id chosen at bootstrap).
	Cluster uint64
	// Epoch is the configuration's generation; membership changes bump it.
	Epoch uint64
	// Members lists the replica ids, in the order that picks leaders: the
	// leader of view v is Members[v % len(Members)]. An odd count 2f+1.
	Members []uint64
	// Self is this replica's id; it must be in Members.
	Self uint64
	// EpochStart is the op of the reconfiguration entry that began this
	// epoch (0 for a group's first epoch): a member holds the epoch's
	// start state once its commit point reaches it (reconfig.go). It is
	// part of the identity (Hash) when non-zero. Previous lists the members
	// of the epoch before, the replicas a new member pulls that state from.
	// A host takes both from the Membership a Ready reports
	// (Membership.Apply) for every replica it starts in the new epoch.
	EpochStart uint64
	Previous   []uint64

	// HeartbeatInterval: the leader sends a commit (heartbeat) at least this
	// often, on its local clock (nanoseconds, as in event times).
	HeartbeatInterval time.Duration
	// ViewChangeTimeout: a follower that hears nothing from its leader for this
	// long starts a view change; a view change that does not finish in this
	// long moves on to the next view. Each view change a replica leaves
	// unfinished doubles its wait for the next one (up to 16 times, back to
	// one once it sees a normal view; Replica.vcTimeout), so view changes
	// that ship large logs on a slow box still finish. Must be >= LeaseDuration.
	ViewChangeTimeout time.Duration
	// LeaseDuration: a follower that acknowledged a heartbeat promises not to
	// join another view for this long after it received it (on its clock).
	// Zero disables leases (reads then always use ReadIndex).
	LeaseDuration time.Duration
	// MaxDrift bounds the rate error of every replica's clock (e.g. 1e-3 for
	// 1 ms/s). The leader's lease is shortened by it; see Replica.LeaseRead.
	MaxDrift float64

	// MaxBatch caps the entries of one prepare (and one state-transfer
	// message); proposals beyond it wait for the next Ready.
	MaxBatch int
	// MaxBatchBytes caps the request bytes of one prepare (a state-transfer
	// message: four times it); an entry larger than it goes alone. Without
	// it, 256 pipelined 16 MiB SETs made one 4 GiB prepare per follower.
	MaxBatchBytes int
	// MaxInflight caps uncommitted ops at the leader (the pipeline depth).
	MaxInflight int

	// Nilext turns on the nilext fast path (nilext.go). Off, Nilext calls
	// are refused and nothing else changes.
	Nilext bool
	// NilextBatch: the leader orders its d-log as soon as this many entries
	// wait. NilextInterval: it orders whatever waits at least this often.
	NilextBatch    int
	NilextInterval time.Duration

	// FollowerReads turns on the active set (cad.md §3): the leader grants
	// read leases to followers that have applied everything readable, and
	// followers holding one serve cross-client-monotonic reads
	// (FollowerRead). Off, the readable index R is simply the commit point
	// and FollowerRead always fails. Needs LeaseDuration > 0: grants never
	// outlive the leader's own lease.
	FollowerReads bool
	// MarkOut is the longest read lease the leader grants a follower (on
	// the follower's clock from receipt, shortened by MaxDrift). It bounds
	// how long a follower that stopped hearing from the leader may keep
	// serving.
	MarkOut time.Duration
	// Removal is how long after the last grant it *sent* the leader waits
	// before it drops a suspected follower from the active set (and stops
	// counting its applied op in R). It must cover the longest grant in
	// real time plus a heartbeat:
	//
	//	Removal >= MarkOut·(1+MaxDrift)/(1−MaxDrift) + HeartbeatInterval
	Removal time.Duration
	// Suspect: a member that has not answered for this long, or whose
	// applied op trails a pending durability wait for this long, stops
	// receiving grants (IN → REMOVING).
	//
	// Default: MarkOut (100 ms), at least three heartbeats. It used to be
	// three heartbeats (30 ms), and on a loaded box (load 20–40 on 2 cores)
	// stalls of a few tens of ms are routine: followers were suspected,
	// lost their leases and every read flapped to the leader. A longer
	// Suspect costs little: safety rests on Removal (counted from the last
	// grant sent), and a follower that really died holds durability waits
	// back for Suspect + Removal, 600 ms instead of 530 ms by default.
	Suspect time.Duration

	// EventualWindow bounds how old the state an eventual read returns may
	// be (eventual.go): a replica serves eventual reads only while it can
	// prove its state was current at some instant within the window (on its
	// clock, shortened by MaxDrift). Zero: DefaultEventualWindow; negative:
	// no bound (every normal replica serves them, however long cut off).
	// A node's own serving policy: members may differ.
	EventualWindow time.Duration

	// ClientCap overrides MaxClients (clients.go) when > 0: tests only. It
	// decides which client records every replica drops, so it must be the
	// same on every replica.
	ClientCap int
}

// Defaults for zero Config fields.
const (
	DefaultHeartbeatInterval = 10 * time.Millisecond
	DefaultViewChangeTimeout = 100 * time.Millisecond
	DefaultMaxBatch          = 256
	DefaultMaxBatchBytes     = 8 << 20
	DefaultMaxInflight       = 4096
	// Skyros's artifact: batch 64, a 1 ms finalization timer (digest 004 §2.5).
	DefaultNilextBatch    = 64
	DefaultNilextInterval = time.Millisecond
	// Active set (cad.md §3): a 100 ms lease, dropped after five of them,
	// suspected after one lease length of silence, and never sooner than
	// three missed heartbeats (see Config.Suspect).
	DefaultMarkOut             = 100 * time.Millisecond
	DefaultRemovalMarkOuts     = 5
	MinDefaultSuspectHeartbeat = 3
	// DefaultEventualWindow: a replica cut off from its leader for 5 s stops
	// serving eventual reads (docs/consistency.md).
	DefaultEventualWindow = 5 * time.Second
)

func (c *Config) fill() {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.ViewChangeTimeout == 0 {
		c.ViewChangeTimeout = DefaultViewChangeTimeout
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.NilextBatch == 0 {
		c.NilextBatch = DefaultNilextBatch
	}
	if c.NilextInterval == 0 {
		c.NilextInterval = DefaultNilextInterval
	}
	if c.MarkOut == 0 {
		c.MarkOut = DefaultMarkOut
	}
	if c.EventualWindow == 0 {
		c.EventualWindow = DefaultEventualWindow
	}
	if c.Removal == 0 {
		c.Removal = max(DefaultRemovalMarkOuts*c.MarkOut, c.MinRemoval())
	}
	if c.Suspect == 0 {
		c.Suspect = max(c.MarkOut, MinDefaultSuspectHeartbeat*c.HeartbeatInterval)
	}
}

// MinRemoval is the smallest Removal that is safe for c: a grant of MarkOut
// lasts at most MarkOut·(1+ρ)/(1−ρ) of the leader's clock (the follower's
// clock may run slow, the leader's fast), plus one heartbeat for a grant in
// flight when the leader decided.
func (c Config) MinRemoval() time.Duration {
	return time.Duration(float64(c.MarkOut)*(1+c.MaxDrift)/(1-c.MaxDrift)) + c.HeartbeatInterval
}

// Validate reports what is wrong with c (after defaults).
func (c Config) Validate() error { return c.validate(true) }

// ValidateAnyCount is Validate without the rule that the members be odd: a
// chain member's host (vrshard with Options.Chain) takes its timing and
// identity from a Config, and a chain of n members survives n−1 failures
// whatever n (a chain of two is replicated; 2f+1 is VR's quorum rule).
func (c Config) ValidateAnyCount() error { return c.validate(false) }

func (c Config) validate(odd bool) error {
	c.fill()
	var errs []error
	n := len(c.Members)
	if n == 0 || odd && n%2 == 0 {
		errs = append(errs, fmt.Errorf("need an odd number of members, have %d", n))
	}
	seen := map[uint64]bool{}
	self := false
	for _, m := range c.Members {
		if seen[m] {
			errs = append(errs, fmt.Errorf("member %d listed twice", m))
		}
		seen[m] = true
		self = self || m == c.Self
	}
	if !self && !slices.Contains(c.Previous, c.Self) {
		// A previous member that is not a member is leaving (reconfig.go):
		// it runs until the new epoch has started.
		errs = append(errs, fmt.Errorf("self %d is not a member of %v", c.Self, c.Members))
	}
	if c.HeartbeatInterval <= 0 || c.ViewChangeTimeout <= c.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("view-change timeout %v must exceed heartbeat interval %v", c.ViewChangeTimeout, c.HeartbeatInterval))
	}
	if c.LeaseDuration < 0 {
		errs = append(errs, fmt.Errorf("lease %v must not be negative", c.LeaseDuration))
	} else if c.ViewChangeTimeout < c.LeaseDuration {
		// A follower would time out, and ask for a new view, while the
		// promise its acknowledgements made still holds.
		errs = append(errs, fmt.Errorf("view-change timeout %v is below the lease %v: raise the view-change timeout to at least the lease (the lease is part of the group's identity and is not shortened to fit)", c.ViewChangeTimeout, c.LeaseDuration))
	}
	if c.MaxDrift < 0 || c.MaxDrift >= 0.1 {
		errs = append(errs, fmt.Errorf("max drift %g must be in [0, 0.1)", c.MaxDrift))
	}
	if c.MaxBatch < 1 || c.MaxInflight < 1 || c.MaxBatchBytes < 1 {
		errs = append(errs, errors.New("MaxBatch, MaxBatchBytes and MaxInflight must be positive"))
	}
	if c.NilextBatch < 1 || c.NilextInterval <= 0 {
		errs = append(errs, fmt.Errorf("nilext batch %d and interval %v must be positive", c.NilextBatch, c.NilextInterval))
	}
	if c.MarkOut <= 0 || c.Suspect <= 0 {
		errs = append(errs, fmt.Errorf("mark-out %v and suspect %v must be positive", c.MarkOut, c.Suspect))
	} else if c.Removal < c.MinRemoval() {
		errs = append(errs, fmt.Errorf("removal %v must be at least mark-out·(1+drift)/(1−drift) + heartbeat = %v", c.Removal, c.MinRemoval()))
	}
	if c.FollowerReads && c.LeaseDuration == 0 {
		errs = append(errs, errors.New("follower reads need a lease (LeaseDuration > 0): grants never outlive the leader's lease"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("vr: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// Hash is a fingerprint of the group's identity: cluster, epoch, the member
// list (in leader order) and the lease timing every member must share —
// LeaseDuration, MaxDrift and MarkOut (defaults filled). Two replicas that
// differ in any of them disagree on it, and each refuses the other's
// messages (and the transport its connection). The lease timing belongs to
// the identity because a leader counts on its followers' promises with its
// own numbers: a follower started with a shorter lease (a rolling change of
// flags) would join a new view while the leader still serves reads under its
// lease (issue 24 item 4), and one with a different drift bound or mark-out
// would time grants differently from the leader that sent them.
func (c Config) Hash() uint64 {
	c.fill()
	h := fnv.New64a()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	put(c.Cluster)
	put(c.Epoch)
	for _, m := range c.Members {
		put(m)
	}
	if c.EpochStart != 0 {
		// Only for reconfigured epochs: a first epoch's hash stays what it
		// was before reconfiguration existed.
		put(c.EpochStart)
	}
	put(uint64(c.LeaseDuration))
	put(math.Float64bits(c.MaxDrift))
	put(uint64(c.MarkOut))
	return h.Sum64()
}

// Identity describes what Hash covers, for the error a mismatch produces.
func (c Config) Identity() string {
	c.fill()
	return fmt.Sprintf("members %v, lease %v, max drift %g, mark-out %v", c.Members, c.LeaseDuration, c.MaxDrift, c.MarkOut)
}

// LeaderOf returns the leader of view v.
func (c Config) LeaderOf(v uint64) uint64 { return c.Members[v%uint64(len(c.Members))] }

// LeaderLease is how long, on the leader's own clock, a lease lasts after
// the heartbeat that a majority acknowledged was sent:
//
//	LeaseDuration × (1 − MaxDrift) / (1 + MaxDrift)
//
// Why: a follower keeps its promise for LeaseDuration on its clock, which is
// at least LeaseDuration/(1+MaxDrift) of real time after it received the
// heartbeat, hence after the leader sent it; the leader's local span D lasts
// at most D/(1−MaxDrift) of real time. D/(1−ρ) ≤ L/(1+ρ) gives the formula.
func (c Config) LeaderLease() time.Duration {
	return time.Duration(float64(c.LeaseDuration) * (1 - c.MaxDrift) / (1 + c.MaxDrift))
}
