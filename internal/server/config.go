package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Config is everything a node needs. cmd/kefir fills it from flags, environment and
// a config file; tests fill it directly.
type Config struct {
	// NodeID names the node in logs, INFO and /status.
	NodeID string
	// ClientAddr is the RESP listen address; PeerAddr the replication port; HTTPAddr
	// the admin port. An empty PeerAddr or HTTPAddr disables that port.
	ClientAddr string
	PeerAddr   string
	HTTPAddr   string
	// DataDir holds the storage engine's files.
	DataDir string

	// Password, if set, is required by AUTH / HELLO AUTH before any other command.
	Password string
	// ClusterSecret authenticates peers on the peer port (HMAC challenge-response).
	ClusterSecret string
	// TLSCert and TLSKey, if both set, turn on TLS on the client port.
	TLSCert, TLSKey string

	// MaxClients caps concurrent client connections (0 = 10000).
	MaxClients int
	// IdleTimeout closes client connections idle this long (0 = never).
	IdleTimeout time.Duration
	// MaxBulk caps one bulk string in a request, and so one value (the
	// engine's MaxValueSize is set to it). 0 = what the node can really
	// carry, measured (docs/operations.md, "Value size"): DefaultMaxBulk on a
	// single node, DefaultMaxBulkGroup in a replica group. A command over it
	// is read, discarded and refused; the connection carries on.
	MaxBulk int
	// MaxRequest caps one command's total size, its arguments and headers (0 =
	// 64 MiB, or MaxBulk + 64 KiB if that is more): without it a client could
	// send a million arguments, each under MaxBulk, and make the node buffer
	// them all before anything is refused.
	MaxRequest int

	// Consistency and Durability are the defaults for connections that set none.
	Consistency level.Consistency
	Durability  level.Durability

	// SyncInterval makes the engine fsync in the background at least this often
	// (bounds what async writes can lose). 0 = engine default.
	SyncInterval time.Duration
	// CacheBytes sizes the engine's value cache (0 = engine default).
	CacheBytes int64
	// CheckpointInterval writes the engine's index hint file this often, so a
	// restart replays only the log tail (0 = default 1m, <0 = never).
	CheckpointInterval time.Duration
	// CompactInterval runs engine compaction this often (0 = default 1m, <0 = never).
	CompactInterval time.Duration
	// RetainVersions keeps this many old versions of each key for stale and
	// versioned reads (0 = newest only).
	RetainVersions int

	// ClientTTL is how long the at-most-once client table remembers an idle client
	// id (0 = shard default, 1h).
	ClientTTL time.Duration

	// ShutdownTimeout bounds graceful shutdown's wait for in-flight commands.
	ShutdownTimeout time.Duration

	// IOModel is how plain-TCP client connections are served: IOEpoll (event
	// loops, Linux only) or IOGoroutine (one goroutine per connection); ""
	// leaves the process's model as it is (DefaultIOModel unless set before;
	// kefir server resolves --io-model and KEFIR_IO_MODEL into this field,
	// the package reads no environment). The model is process-wide, like the event loops: New
	// sets it, so the last server created in a process decides for all of
	// them. TLS connections always use goroutines.
	IOModel IOModel
	// IOLoops is the number of epoll event loops (0: one per two processors;
	// kefir server takes it from KEFIR_IO_LOOPS). Process-wide like IOModel:
	// New sets it, and only the value set before the first epoll connection
	// starts the loops counts.
	IOLoops int

	// LoopSpin is how long an event loop polls for more input before it
	// sleeps in epoll_wait, while it is busy (docs/operations.md, "Event
	// loop polling"): 0 picks DefaultLoopSpin for a single node and no polling
	// for a replica (its processes usually share cores with its peers);
	// negative turns polling off. Process-wide like IOModel: New sets it.
	LoopSpin time.Duration

	Logger *slog.Logger

	// FS is the file system under the engine (nil = the OS). Tests pass a vfs.Mem
	// to inject fsync failures and crashes.
	FS vfs.FS

	// Replication. With no Members the node is a single-node shard (the
	// shard package); with Members it is one VR replica of the group
	// (internal/vrshard), ReplicaID naming which.
	//
	// Members is the whole group in leader order (view v is led by
	// Members[v mod n]); every node must be given the same list and
	// ClusterID, else peers refuse each other's connections (a log line on
	// both sides names the mismatch). ReplicaID must be one of them.
	Members   []Member
	ReplicaID uint64
	ClusterID uint64
	// Join is a member's client address (or several, comma-separated): the
	// node joins that group as a new member (kefir server --join;
	// PrepareJoin resolves it into Members, ClusterID and Membership
	// before New, waiting until the group's configuration names ReplicaID).
	Join string
	// Membership is the configuration a new member opens its replica with
	// (set by PrepareJoin; nil otherwise).
	Membership *cluster.Membership
	// joinedGroups: this node joined a cluster of several groups (PrepareJoin):
	// Members and Groups are the map's when it joined.
	joinedGroups bool
	// namedAtMapEpoch: the epoch of the cluster map that named this node
	// when it joined (its joinFile's map_epoch; 0: a founder, named by
	// every map from the first). A map at this epoch or below that does
	// not name the node is one from before it joined, not its removal
	// (syncGroups' leftMap).
	namedAtMapEpoch uint64
	// Groups, when set, makes the node one of a cluster of several replica
	// groups on a static slot map (issue 28, first part; docs/cluster.md):
	// Members are then the cluster's nodes, each group names its members
	// among them and the slots it owns, and the node hosts a replica of
	// every group it is a member of, each in DataDir/group-<id>, all on the
	// node's one peer transport. Empty: the node's one group is Members.
	Groups []cluster.GroupSpec
	// ChainGroups are the groups of Groups that run the chain engine
	// (kefir server --chain-groups; docs/design/chain.md "A chain in a
	// cluster of groups"): opened by OpenChainReplica, their masters at
	// the metadata group's nodes. Every node gets the same list.
	ChainGroups []cluster.GroupID
	// CrossGroupTx (with Groups) lets a KEFIR.TX transaction name keys of
	// several slots: the node coordinates its two-phase commit, and pushes
	// transactions left prepared in the groups it leads (xgtx.go).
	// Off: -CROSSSLOT. kefir server and kefir up set it by default
	// (--cross-group-tx); the zero Config, as the package's tests build
	// it, has it off.
	CrossGroupTx bool
	// ClusterRedirects answers every connection's request for a slot whose
	// group is led elsewhere with -MOVED <slot> <addr>, as Redis Cluster
	// does, instead of forwarding it (docs/cluster.md). Without it only
	// connections that behaved as a cluster client's (CLUSTER SLOTS, ...)
	// are redirected, and plain clients are forwarded.
	ClusterRedirects bool
	// Bootstrap starts a new group if this node's data directory holds no
	// replication log. Set it only on the group's very first start (kefir up
	// does it when no node has a data directory yet). Without it a node with
	// an empty directory is treated as one that lost its disk: it rejoins by
	// VR recovery and state transfer, and never re-bootstraps.
	Bootstrap bool
	// HeartbeatInterval and ViewChangeTimeout tune VR timing (0 = vrshard
	// defaults: 10ms and 300ms).
	HeartbeatInterval time.Duration
	ViewChangeTimeout time.Duration
	// Nilext turns on the Skyros nilext fast path (experimental; every
	// member must agree): plain SET and MSET complete in one round trip to
	// every replica, this node coordinating, and are ordered in the
	// background (internal/vrshard nilext.go, internal/server nilext.go).
	Nilext bool
	// NilextBatch and NilextInterval tune the leader's background ordering
	// of its d-log (it orders as soon as NilextBatch entries wait, and at
	// least every NilextInterval); NilextSyncDelay bounds how long a log
	// batch nobody waits for may wait for a later fsync to cover it
	// (negative: never; vrshard Options.NilextSyncDelay). 0 = defaults
	// (64, 1ms, 5ms).
	NilextBatch     int
	NilextInterval  time.Duration
	NilextSyncDelay time.Duration
	// CadSyncDelay bounds how long a log batch of cad and async blind writes
	// may wait for a later fsync to cover it (negative: never; 0: the
	// default, 2ms; vrshard Options.CadSyncDelay).
	CadSyncDelay time.Duration
	// CheckpointOps: the replica checkpoints (engine sync, new replication
	// log segment) after this many applied ops (0: vrshard's default, 20000;
	// vrshard Options.CheckpointOps).
	CheckpointOps uint64
	// FsyncExtraDelay emulates a slower disk for benchmarks: every fsync of
	// a file under the node (the engine's log and the replication log among
	// them) is followed by a sleep this long on the goroutine that synced,
	// before anything learns it is done, so the data is reported durable that
	// much later (the real fsync still happens first, so what is reported
	// durable is). The disk does it (vfs.SlowSync over FS; diskFS). 0: none.
	FsyncExtraDelay time.Duration
	// FollowerReads lets followers serve cross-client-monotonic reads while
	// they hold an active-set lease (docs/design/cad.md §3); every member
	// must agree.
	FollowerReads bool
	// ActiveExpiry is the tick of the leader's background deletion of
	// expired keys (expiry.go; default DefaultActiveExpiry, negative: off,
	// leaving expired keys hidden by reads but stored until written). In a
	// replica group the replica runs it (cluster.ReplicaSpec.ActiveExpiry).
	ActiveExpiry time.Duration
	// ClockSkew (replicated mode) bounds every member's wall clock's offset
	// from the leader's; followers decide expiry at their clock plus it
	// (vrshard.Options.ClockSkew; 0: vrshard.DefaultClockSkew).
	ClockSkew time.Duration
	// RepairAfter (a cluster of several groups): the metadata group's
	// leader re-creates the replicas of a node that has not answered for
	// this long on live nodes (cluster.FollowConfig.RepairAfter; 0: no
	// automatic repair; kefir server's default cluster.DefaultRepairAfter).
	RepairAfter time.Duration
	// Zone (a cluster of several groups) is this node's failure domain
	// (kv.MapNode.Zone; "": none): the node records it in the map once it
	// sees itself there (cluster.FollowConfig.Zone), and placement puts a
	// group's replicas in distinct zones.
	Zone string

	// NoChainVersionQuery turns off a chain member's version query
	// (--chain-version-query=false): a strong read of a key with a write in
	// flight at the member is forwarded whole to the tail, as before
	// session 28 (docs/design/chain.md, "The version query").
	NoChainVersionQuery bool

	// Chain: the group is a chain (kefir server --engine chain), whose
	// members need not be odd: a chain of n survives n−1 failures, so a
	// chain of two is a replicated group. (VR's 2f+1 rule is for VR.)
	Chain bool

	// OpenReplica opens the node's replica when it has Members: the
	// replication engine, which the binary chooses (kefir server:
	// vrshard.OpenHosted). The front door knows only its contract
	// (internal/cluster).
	OpenReplica cluster.Opener
	// OpenChainReplica opens the node's member of a chain group of a
	// cluster of several groups (kefir cluster add-group --engine chain;
	// kefir server: vrshard.OpenChainGroup). Nil: the node refuses to
	// start one.
	OpenChainReplica cluster.Opener
}

// Member is one replica of the group: its id, the address peers dial, and the
// RESP address clients (and forwarding followers) use.
type Member = cluster.Member

// Replicated reports whether the node runs as a replica of a group.
func (c Config) Replicated() bool { return len(c.Members) > 0 }

// ParseMembers parses "ID@PEER/CLIENT,ID@PEER/CLIENT,...", e.g.
// "1@127.0.0.1:7381/127.0.0.1:6381,2@127.0.0.1:7382/127.0.0.1:6382". The
// order is the leader order.
func ParseMembers(s string) ([]Member, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var ms []Member
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		idStr, addrs, ok := strings.Cut(part, "@")
		if !ok {
			return nil, fmt.Errorf("member %q: want ID@PEER-ADDR/CLIENT-ADDR", part)
		}
		id, err := strconv.ParseUint(idStr, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("member %q: id must be a positive integer", part)
		}
		peer, client, ok := strings.Cut(addrs, "/")
		if !ok || peer == "" || client == "" {
			return nil, fmt.Errorf("member %q: want ID@PEER-ADDR/CLIENT-ADDR", part)
		}
		for _, a := range []string{peer, client} {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("member %q: address %q: %w", part, a, err)
			}
		}
		ms = append(ms, Member{ID: id, PeerAddr: peer, ClientAddr: client})
	}
	return ms, nil
}

// FormatMembers is ParseMembers' inverse.
func FormatMembers(ms []Member) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%d@%s/%s", m.ID, m.PeerAddr, m.ClientAddr)
	}
	return strings.Join(parts, ",")
}

func (c Config) validateReplication() error {
	if c.ClusterRedirects && len(c.Groups) == 0 {
		return errors.New("config: --cluster-redirects needs --groups (a single group's followers forward)")
	}
	if len(c.ChainGroups) > 0 && len(c.Groups) == 0 {
		return errors.New("config: --chain-groups needs --groups (a single chain is --engine chain)")
	}
	if len(c.Groups) > 0 && !c.Replicated() {
		return errors.New("config: --groups needs --members (the cluster's nodes)")
	}
	if !c.Replicated() {
		if c.Join != "" {
			return errors.New("config: --join is resolved before the node starts (server.PrepareJoin; kefir server does it)")
		}
		if c.Nilext {
			return fmt.Errorf("config: --nilext needs replicated mode (--members)")
		}
		if c.FollowerReads {
			return fmt.Errorf("config: --follower-reads needs replicated mode (--members)")
		}
		if c.ReplicaID != 0 || c.Bootstrap {
			return errors.New("config: --replica-id and --bootstrap need --members (the group's member list)")
		}
		return nil
	}
	if c.NilextBatch < 0 || c.NilextInterval < 0 {
		return fmt.Errorf("config: --nilext-batch %d and --nilext-interval %v must not be negative", c.NilextBatch, c.NilextInterval)
	}
	seen := map[uint64]bool{}
	self := false
	for _, m := range c.Members {
		if seen[m.ID] {
			return fmt.Errorf("config: member id %d listed twice", m.ID)
		}
		seen[m.ID] = true
		self = self || m.ID == c.ReplicaID
	}
	if len(c.Groups) > 0 {
		if err := c.validateGroups(seen); err != nil {
			return err
		}
	} else if len(c.Members)%2 == 0 && !c.Chain {
		return fmt.Errorf("config: %d members: a VR group needs an odd number (2f+1)", len(c.Members))
	}
	if !self {
		return fmt.Errorf("config: --replica-id %d is not in --members %s", c.ReplicaID, FormatMembers(c.Members))
	}
	if c.ClusterID == 0 {
		return errors.New("config: a replicated node needs --cluster-id (the same positive number on every member)")
	}
	if c.ClusterSecret == "" {
		return errors.New("config: a replicated node needs --cluster-secret (peers authenticate with it); set it with --cluster-secret or KEFIR_CLUSTER_SECRET")
	}
	if c.PeerAddr == "" {
		return errors.New("config: a replicated node needs --peer-addr")
	}
	return nil
}

// validateIOModel refuses a model this build cannot run rather than falling
// back silently: an operator who asked for epoll and got goroutines would read
// the wrong conclusions off a benchmark.
func validateIOModel(m IOModel) error {
	switch m {
	case "", IOGoroutine:
		return nil
	case IOEpoll:
		if !epollSupported {
			return fmt.Errorf("config: --io-model epoll needs Linux; use goroutine here")
		}
		return nil
	}
	return fmt.Errorf("config: --io-model %q: want epoll or goroutine", string(m))
}

// ErrInsecure is returned by Validate when a non-loopback address would be bound
// without a password (or a peer port without a cluster secret).
var ErrInsecure = errors.New("refusing to listen on a non-loopback address without authentication")

// Default value-size limits (MaxBulk), measured on 2 cores (docs/operations.md,
// "Value size"). A single node stores and reads back values up to Redis's
// 512 MiB (through a restart too). A replica group carries 16 MiB with no view
// change in every trial and 24 MiB too; from 28 MiB on, the prepare carrying
// the value keeps the followers' heartbeats behind it past the view-change
// timeout, so the group changes views (28, 32 MiB), and from 48 MiB the write
// fails and the group goes through view changes. The group's default keeps
// twice that margin. Both include 64 KiB for the key and framing.
const (
	DefaultMaxBulk      = 512 << 20
	DefaultMaxBulkGroup = 16<<20 + 64<<10
)

// DefaultClientAddr is the RESP address a node listens on when told none (and
// `kefir up`'s first node): what examples and docs dial.
const DefaultClientAddr = "127.0.0.1:6380"

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.NodeID == "" {
		c.NodeID = "n1"
	}
	if c.ClientAddr == "" {
		c.ClientAddr = DefaultClientAddr
	}
	if c.MaxClients <= 0 {
		c.MaxClients = 10000
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = time.Minute
	}
	if c.CompactInterval == 0 {
		c.CompactInterval = time.Minute
	}
	if c.MaxBulk <= 0 {
		c.MaxBulk = DefaultMaxBulk
		if c.Replicated() {
			c.MaxBulk = DefaultMaxBulkGroup
		}
	}
	if c.MaxRequest <= 0 {
		c.MaxRequest = max(64<<20, c.MaxBulk+64<<10)
	}
	if c.Consistency.IsZero() {
		c.Consistency = level.ConsLinearizable
	}
	if c.Durability.IsZero() {
		c.Durability = level.Sync
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// diskFS is the file system the engine and the replication log write
// through: FS (nil: the OS's) as a slower disk when FsyncExtraDelay is set,
// else FS itself (nil stays nil: the packages default to the OS).
func (c *Config) diskFS() vfs.FS {
	if c.FsyncExtraDelay <= 0 {
		return c.FS
	}
	fs := c.FS
	if fs == nil {
		fs = vfs.Default
	}
	return vfs.SlowSync(fs, c.FsyncExtraDelay)
}

// MaxFsyncExtraDelay bounds Config.FsyncExtraDelay: an emulated disk slower
// than this would outlast request timeouts rather than emulate a disk.
const MaxFsyncExtraDelay = 100 * time.Millisecond

// Validate checks the configuration, including the security defaults: every
// port on a non-loopback address needs authentication.
func (c Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("config: data directory is required")
	}
	if err := c.validateReplication(); err != nil {
		return err
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("config: TLS needs both a certificate and a key file")
	}
	if err := validateIOModel(c.IOModel); err != nil {
		return err
	}
	// As kefir server's --zone: the metadata group refuses a bad zone
	// (KEFIR.SLOTS META ADDNODE), so a node started with one would ask to
	// record it, and be refused, for as long as it runs.
	if err := kv.ValidZone(c.Zone); err != nil {
		return fmt.Errorf("config: --zone: %w", err)
	}
	if c.FsyncExtraDelay < 0 || c.FsyncExtraDelay > MaxFsyncExtraDelay {
		return fmt.Errorf("config: --fsync-extra-delay %v must be between 0 and %v", c.FsyncExtraDelay, MaxFsyncExtraDelay)
	}
	for _, p := range []struct{ name, addr, secret, how string }{
		{"client", c.ClientAddr, c.Password, "set a password with --password or KEFIR_PASSWORD"},
		{"http admin", c.HTTPAddr, c.Password, "set a password with --password or KEFIR_PASSWORD (the admin port then requires it as HTTP basic auth)"},
		{"peer", c.PeerAddr, c.ClusterSecret, "set a cluster secret with --cluster-secret or KEFIR_CLUSTER_SECRET"},
	} {
		if p.addr == "" {
			continue
		}
		loop, err := isLoopback(p.addr)
		if err != nil {
			return fmt.Errorf("config: %s address: %w", p.name, err)
		}
		if !loop && p.secret == "" {
			return fmt.Errorf("%w: %s port %s; %s", ErrInsecure, p.name, p.addr, p.how)
		}
	}
	return nil
}

// isLoopback reports whether addr (host:port) binds only loopback interfaces.
// An empty host ("":6380) or a wildcard binds everything.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	if ip == nil {
		// A hostname may resolve anywhere: treat as exposed.
		return false, nil
	}
	return ip.IsLoopback(), nil
}

// DefaultLoopSpin is a single node's event-loop polling (Config.LoopSpin).
const DefaultLoopSpin = 50 * time.Microsecond

// effectiveLoopSpin resolves LoopSpin's 0 ("auto"): a single node polls, a
// replica does not. Three replicas on one small machine (kefir up, the
// benchmarks) share its cores, and a loop polling there takes CPU its peers
// need: YCSB A at async, 64 clients, fell from 29.4–29.7k to 25.8–27.4k ops/s
// with 50 µs (docs/benchmarks.md, session 8).
func (c Config) effectiveLoopSpin() time.Duration {
	switch {
	case c.LoopSpin < 0:
		return 0
	case c.LoopSpin > 0:
		return c.LoopSpin
	case len(c.Members) > 0:
		return 0
	}
	return DefaultLoopSpin
}

// validateGroups checks --groups against the nodes of --members (known):
// a slot map that covers every slot once, groups of an odd number of
// distinct known nodes, this node in at least one, no nilext (the fast
// path does not span groups yet) and no follower reads.
func (c Config) validateGroups(known map[uint64]bool) error {
	if _, err := cluster.NewSlotMap(1, c.Groups); err != nil {
		return fmt.Errorf("config: --groups: %w", err)
	}
	for _, id := range c.ChainGroups {
		if !slices.ContainsFunc(c.Groups, func(g cluster.GroupSpec) bool { return g.ID == id }) {
			return fmt.Errorf("config: --chain-groups: %d is not a group of --groups", id)
		}
	}
	if c.Nilext {
		return errors.New("config: --nilext is not supported yet with --groups (the fast path does not span groups)")
	}
	if c.FollowerReads {
		// Cross-client-monotonic promises sequential consistency, which a
		// follower's reads (ordered in its group's log only) do not give
		// across groups; each group's leader serves them instead, as
		// linearizable reads, which compose (docs/design/cluster.md §8).
		return errors.New("config: --follower-reads is not supported with --groups: in a cluster, cross-client-monotonic reads are served by each group's leader (sequential consistency across groups; docs/cluster.md)")
	}
	hosted := false
	for _, g := range c.Groups {
		if g.ID == cluster.MetaGroupID {
			return fmt.Errorf("config: --groups: group id %d is reserved for the metadata group", g.ID)
		}
		if len(g.Members)%2 == 0 && !slices.Contains(c.ChainGroups, g.ID) && g.Engine != kv.EngineChain {
			return fmt.Errorf("config: --groups: group %d has %d members: a VR group needs an odd number (2f+1)", g.ID, len(g.Members))
		}
		seen := map[uint64]bool{}
		for _, m := range g.Members {
			if !known[m] {
				return fmt.Errorf("config: --groups: group %d's member %d is not in --members", g.ID, m)
			}
			if seen[m] {
				return fmt.Errorf("config: --groups: group %d lists node %d twice", g.ID, m)
			}
			seen[m] = true
			hosted = hosted || m == c.ReplicaID
		}
	}
	// A node that joined (PrepareJoin) hosts the groups its records name,
	// which may be only a chain the map wants it to join (a chain's
	// Joining, not its members).
	if !hosted && !c.joinedGroups {
		return fmt.Errorf("config: --groups: node %d is a member of no group", c.ReplicaID)
	}
	return nil
}
