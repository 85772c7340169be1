package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vfs"
)

// ErrStaleConfig is returned by New when the data directory was created for a
// different group (cluster id, replica id or member ids) than the one
// configured: starting anyway would make this node vote in a group whose log
// it does not hold.
var ErrStaleConfig = errors.New("configuration does not match the data directory")

// identityFile records, at a replica's first start, which group its data
// directory belongs to. It is checked at every later start.
const identityFile = "kefir-replica.json"

type replicaIdentity struct {
	Cluster uint64   `json:"cluster_id"`
	Replica uint64   `json:"replica_id"`
	Members []uint64 `json:"members"`
	// Previous are the member lists the group had before its
	// reconfigurations (membership.go records each new one in Members):
	// a member restarted with the flags of any of them is the same
	// replica (its disk's configuration supersedes them).
	Previous [][]uint64 `json:"previous_members,omitempty"`
	// Slots are the slot ranges of a group of several (--groups): the
	// map is static, so a group restarted with other slots would hold keys
	// it no longer owns and miss the ones it now does.
	Slots string `json:"slots,omitempty"`
}

func (c Config) identity() replicaIdentity {
	ids := make([]uint64, len(c.Members))
	for i, m := range c.Members {
		ids[i] = m.ID
	}
	return replicaIdentity{Cluster: c.ClusterID, Replica: c.ReplicaID, Members: ids}
}

// checkIdentity refuses a data directory that belongs to another group, and
// records the identity in one that belongs to none yet. Peer addresses are
// not part of it: a member may move to a new address.
func checkIdentity(dir string, want replicaIdentity) error {
	p := filepath.Join(dir, identityFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		b, err = json.Marshal(want)
		if err != nil {
			return err
		}
		// Durably: a crash right after the first start must not leave an
		// empty or missing identity, which would refuse (empty) or let
		// another group take (missing) the directory.
		if err := vfs.WriteFileDurably(vfs.Default, dir, p, b); err != nil {
			return fmt.Errorf("server: write %s: %w", p, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("server: read %s: %w", p, err)
	}
	var have replicaIdentity
	if err := json.Unmarshal(b, &have); err != nil {
		return fmt.Errorf("server: %s is corrupt: %w", p, err)
	}
	if have.Slots != "" && have.Slots != want.Slots { // "": recorded before slots were
		return fmt.Errorf("%w: %s is a replica of a group owning slots %q, but --groups gives it %q; slots do not move yet (issue 28), so start it with its old --groups (or use an empty --dir)",
			ErrStaleConfig, dir, have.Slots, want.Slots)
	}
	known := slices.Equal(have.Members, want.Members) || slices.ContainsFunc(have.Previous, func(ms []uint64) bool { return slices.Equal(ms, want.Members) })
	if have.Cluster != want.Cluster || have.Replica != want.Replica || !known {
		return fmt.Errorf("%w: %s belongs to cluster %d as replica %d of members %v (before: %v), but this node is configured as cluster %d, replica %d, members %v; fix --cluster-id/--replica-id/--members (or use an empty --dir for a new node)",
			ErrStaleConfig, dir, have.Cluster, have.Replica, have.Members, have.Previous, want.Cluster, want.Replica, want.Members)
	}
	return nil
}

// checkMode refuses a data directory written in the other mode: a single
// node keeps its engine in DIR/storage, a replica its log and engine in
// DIR/vr. Starting in the other mode would silently serve an empty store.
func checkMode(dir string, replicated bool) error {
	other, mode := "vr", "a replica of a group (it has vr/); start it with its --members, --replica-id and --cluster-id"
	if replicated {
		other, mode = "storage", "a single node (it has storage/); start it without --members, or use an empty --dir"
	}
	if _, err := os.Stat(filepath.Join(dir, other)); err == nil {
		return fmt.Errorf("%w: %s was created by %s", ErrStaleConfig, dir, mode)
	}
	return nil
}

// openReplica opens this node's replica of its group in cfg.DataDir/vr,
// with the engine the binary wired in (Config.OpenReplica).
func (s *Server) openReplica() (cluster.Hosted, error) {
	cfg := s.cfg
	if cfg.OpenReplica == nil {
		return cluster.Hosted{}, fmt.Errorf("server: node %d has members but no replication engine (Config.OpenReplica is nil; kefir server sets it)", cfg.ReplicaID)
	}
	if cfg.FS == nil {
		if err := checkMode(cfg.DataDir, true); err != nil {
			return cluster.Hosted{}, err
		}
		if err := CheckRetired(cfg.DataDir); err != nil {
			return cluster.Hosted{}, fmt.Errorf("server: %w", err)
		}
		if err := checkIdentity(cfg.DataDir, cfg.identity()); err != nil {
			return cluster.Hosted{}, err
		}
	}
	if len(cfg.Groups) > 0 {
		return s.openGroups()
	}
	if cfg.FS == nil {
		if m, _ := filepath.Glob(filepath.Join(cfg.DataDir, "group-*")); len(m) > 0 {
			return cluster.Hosted{}, fmt.Errorf("%w: %s holds replicas of several groups (%s); start it with its --groups, or use an empty --dir", ErrStaleConfig, cfg.DataDir, filepath.Base(m[0]))
		}
	}
	h, err := cfg.OpenReplica(s.replicaSpec(filepath.Join(cfg.DataDir, "vr")))
	if err != nil {
		return cluster.Hosted{}, fmt.Errorf("server: %w", err)
	}
	return h, nil
}

// replicaSpec is what the node hands the engine for a replica in dir.
func (s *Server) replicaSpec(dir string) cluster.ReplicaSpec {
	cfg := s.cfg
	spec := cluster.ReplicaSpec{
		Dir:    dir,
		FS:     cfg.diskFS(),
		Logger: s.log.With("component", "vr"),

		Cluster: cfg.ClusterID, Self: cfg.ReplicaID, Members: cfg.Members,
		ClusterSecret: cfg.ClusterSecret, Bootstrap: cfg.Bootstrap, Membership: cfg.Membership,

		HeartbeatInterval: cfg.HeartbeatInterval, ViewChangeTimeout: cfg.ViewChangeTimeout,
		CheckpointOps: cfg.CheckpointOps,
		Nilext:        cfg.Nilext, NilextBatch: cfg.NilextBatch, NilextInterval: cfg.NilextInterval,
		NilextSyncDelay: cfg.NilextSyncDelay, CadSyncDelay: cfg.CadSyncDelay,
		FollowerReads: cfg.FollowerReads, ClockSkew: cfg.ClockSkew,
		ActiveExpiry: cfg.ActiveExpiry,

		Storage:   s.storageOptions(), // the engine's directory, FS and logger are the replica's
		OnLogSync: s.fsyncObserver("replication"),
	}
	if !cfg.NoChainVersionQuery {
		spec.AskTail = s.askTail
	}
	return spec
}

// groupDir is where a node of several groups keeps group id's replica (its
// identity file and its engine's vr/ directory).
func groupDir(dataDir string, id cluster.GroupID) string {
	return filepath.Join(dataDir, fmt.Sprintf("group-%d", id))
}

// openGroups opens this node's replica of every group it is a member of
// (Config.Groups), all on one peer transport the node makes, behind one
// cluster.Multi that routes each request by its slot.
func (s *Server) openGroups() (_ cluster.Hosted, err error) {
	cfg := s.cfg
	groups := slices.Clone(cfg.Groups)
	for i := range groups {
		if slices.Contains(cfg.ChainGroups, groups[i].ID) {
			// In the map the metadata group starts with, so that its
			// nodes run the chain's master (startChainMasters).
			groups[i].Engine = kv.EngineChain
		}
	}
	slots, err := cluster.NewSlotMap(1, groups)
	if err != nil {
		return cluster.Hosted{}, fmt.Errorf("server: %w", err)
	}
	if cfg.FS == nil {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, "vr")); err == nil {
			return cluster.Hosted{}, fmt.Errorf("%w: %s holds a single group's replica (vr/); start it without --groups, or use an empty --dir", ErrStaleConfig, cfg.DataDir)
		}
	}
	peers := map[uint64]string{}
	byID := map[uint64]Member{}
	for _, m := range cfg.Members {
		peers[m.ID], byID[m.ID] = m.PeerAddr, m
	}
	tr, err := transport.New(transport.Config{
		Self: cfg.ReplicaID, Peers: peers, ClusterSecret: cfg.ClusterSecret, Cluster: cfg.ClusterID,
		Logger: s.log.With("component", "transport"),
	})
	if err != nil {
		return cluster.Hosted{}, fmt.Errorf("server: peer transport: %w", err)
	}
	var locals []cluster.LocalGroup
	defer func() {
		if err != nil {
			for _, lg := range locals {
				_ = lg.Hosted.Replica.Close()
			}
			if s.emptyDB != nil {
				_ = s.emptyDB.Close()
			}
			tr.Close()
		}
	}()
	tr.AdmitConfigs(admitRule(cfg.Members, cfg.joinedGroups)) // groupmembers.go
	opened := map[cluster.GroupID]bool{}
	// removed: some group this node had was removed from the map (its
	// record says so): a node left with no group by that stays a node.
	// retired: some group this node had took it out (any record).
	removed, retired := false, false
	// openJoined opens a group this node joined as a new member
	// (groupmembers.go: its directory's joinFile), unless it retired since.
	openJoined := func(id cluster.GroupID) (bool, error) {
		dir := groupDir(cfg.DataDir, id)
		if cfg.FS == nil {
			if err := CheckRetired(dir); err != nil {
				s.log.Info("not opening a group this node's replica retired from", "group", uint64(id), "err", err)
				retired = true
				if r, ok, _ := readRetired(dir); ok && r.RemovedAt > 0 {
					removed = true
				}
				deleteRemovedData(dir, s.log)
				opened[id] = true
				return true, nil
			}
		}
		jr, ok, err := readGroupJoin(dir)
		if err != nil || !ok {
			return false, err
		}
		lg, err := s.openJoinedGroup(tr, id, jr, s.firstOpen(jr, dir))
		if err != nil {
			return true, err
		}
		opened[id] = true
		locals = append(locals, lg)
		return true, nil
	}
	for _, g := range slots.Groups {
		if !slices.Contains(g.Members, cfg.ReplicaID) {
			continue
		}
		if cfg.FS == nil {
			if done, err := openJoined(g.ID); err != nil {
				return cluster.Hosted{}, err
			} else if done {
				continue
			}
		}
		opened[g.ID] = true
		lg, err := s.openStaticGroup(tr, g, byID)
		if err != nil {
			return cluster.Hosted{}, err
		}
		locals = append(locals, lg)
	}
	// Groups this node joined after it started (the map named it there).
	if cfg.FS == nil {
		dirs, _ := filepath.Glob(filepath.Join(cfg.DataDir, "group-*"))
		for _, d := range dirs {
			n, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(d), "group-"), 10, 32)
			if err != nil || cluster.GroupID(n) == cluster.MetaGroupID || opened[cluster.GroupID(n)] {
				continue
			}
			if _, err := openJoined(cluster.GroupID(n)); err != nil {
				return cluster.Hosted{}, err
			}
		}
	}
	var engine *storage.DB // the node's handle (INFO, metrics): its first group's
	if len(locals) > 0 {
		engine = locals[0].Hosted.Engine
	} else {
		// Every group it had is gone and the node did not retire as a
		// whole (CheckRetired above): its groups were removed from the
		// map (kefir cluster remove-group) and it stayed up, empty
		// (retireGroup), or it hosts a metadata replica (checked once
		// openMeta ran). It comes back so, serving by forwarding until
		// the map names it in a group; its handle is an empty engine in
		// memory, which nothing writes.
		if engine, err = s.openEmptyEngine(); err != nil {
			return cluster.Hosted{}, err
		}
		s.log.Warn("this node hosts no group (none placed on it yet, or every one it had was removed or retired it): starting empty, serving and following the map", "dir", cfg.DataDir)
	}
	m, err := cluster.NewMulti(slots, cfg.ReplicaID, cfg.Members, locals)
	if err != nil {
		return cluster.Hosted{}, fmt.Errorf("server: %w", err)
	}
	// The metadata group (meta.go): opened last, so that m routes by its
	// map from the first request on.
	if err := s.openMeta(m, slots, byID, tr); err != nil {
		return cluster.Hosted{}, err
	}
	if len(locals) == 0 && retired && !removed && !m.HostsMeta() {
		// Every group took it out (VR retired each replica) and it has
		// no metadata replica: it retired as a whole, even if the node's
		// own record (written after the last group's, retireReplica) is
		// missing — a crash between the two writes, or that write failed.
		// (A node that never had a group — it joined the map and waits
		// for one, as kefir up's added nodes do — starts empty.)
		return cluster.Hosted{}, fmt.Errorf("%w: node %d hosts no replica of any group: every one it had retired, none was removed from the map, and it hosts no metadata replica (%s)", ErrRetired, cfg.ReplicaID, cfg.DataDir)
	}
	s.emptiedByRemoval = removed
	s.multi = m
	return cluster.Hosted{Replica: m, Group: m, Engine: engine, Transport: tr}, nil
}

// openEmptyEngine opens the engine handle of a node that starts with no
// group: empty, in memory (Server.emptyDB, closed at Shutdown).
func (s *Server) openEmptyEngine() (*storage.DB, error) {
	opts := s.storageOptions()
	opts.FS = vfs.NewRAM()
	opts.Devices = []storage.Device{{Dir: "/empty"}}
	opts.Logger = s.log.With("component", "storage")
	db, err := storage.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("server: open an empty node's engine: %w", err)
	}
	s.emptyDB = db
	return db, nil
}

// openStaticGroup opens this node's replica of group g of --groups (a
// member of it there) on transport tr, in its directory as it is; byID are
// --members' addresses.
func (s *Server) openStaticGroup(tr *transport.Transport, g cluster.GroupSpec, byID map[uint64]Member) (cluster.LocalGroup, error) {
	cfg := s.cfg
	ms := make([]Member, len(g.Members))
	for i, id := range g.Members {
		ms[i] = byID[id]
	}
	dir := groupDir(cfg.DataDir, g.ID)
	clusterID := cluster.GroupClusterID(cfg.ClusterID, g.ID)
	if cfg.FS == nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return cluster.LocalGroup{}, fmt.Errorf("server: create %s: %w", dir, err)
		}
		_, slots, _ := strings.Cut(cluster.FormatGroups([]cluster.GroupSpec{{ID: g.ID, Slots: g.Slots}}), ":")
		if err := checkIdentity(dir, replicaIdentity{Cluster: clusterID, Replica: cfg.ReplicaID, Members: g.Members, Slots: slots}); err != nil {
			return cluster.LocalGroup{}, err
		}
	}
	spec := s.replicaSpec(filepath.Join(dir, "vr"))
	spec.Logger = s.log.With("component", "vr", "group", uint64(g.ID))
	spec.Cluster, spec.Members, spec.Group, spec.Transport = clusterID, ms, g.ID, tr
	// Neither the nilext fast path nor follower-served reads span
	// groups (Config.validateGroups refuses both; off here whatever
	// the config says): a cluster's cross-client-monotonic reads are
	// its leaders' (cluster.Multi.CheckConsistency).
	spec.Nilext, spec.FollowerReads = false, false
	open := cfg.OpenReplica
	if g.Engine == kv.EngineChain {
		// A chain group of --chain-groups: its masters run at the
		// metadata group's members, computed from --members as
		// openMeta does.
		ids := make([]uint64, len(cfg.Members))
		for i, m := range cfg.Members {
			ids[i] = m.ID
		}
		open, spec.ChainMasters = cfg.OpenChainReplica, cluster.MetaMembers(ids)
		if open == nil {
			return cluster.LocalGroup{}, fmt.Errorf("server: group %d of --chain-groups: this node has no chain engine (Config.OpenChainReplica)", g.ID)
		}
		spec.Logger = s.log.With("component", "chain", "group", uint64(g.ID))
	}
	h, err := open(spec)
	if err != nil {
		return cluster.LocalGroup{}, fmt.Errorf("server: group %d: %w", g.ID, err)
	}
	return cluster.LocalGroup{Spec: g, Hosted: h}, nil
}

// storageOptions are the storage engine's settings from the node's Config,
// the same for a single node's engine and a replica's (which places it in
// its own directory, on its FS, with its logger).
func (s *Server) storageOptions() storage.Options {
	cfg := &s.cfg
	return storage.Options{
		SyncInterval:       cfg.SyncInterval,
		CacheBytes:         cfg.CacheBytes,
		CheckpointInterval: max(cfg.CheckpointInterval, 0),
		CompactInterval:    max(cfg.CompactInterval, 0),
		Retention:          storage.Retention{KeepVersions: cfg.RetainVersions},
		MaxValueSize:       cfg.MaxBulk,  // what the front door admits, the engine stores
		CountMeta:          kv.HasExpiry, // INFO's expires=: keys with a TTL, not every hash
		OnSync:             s.fsyncObserver("storage"),
	}
}

// ReplicaInfo is the replication part of /status and INFO.
type ReplicaInfo struct {
	ReplicaID uint64 `json:"replica_id"`
	ClusterID uint64 `json:"cluster_id"`
	Role      string `json:"role"`
	Status    string `json:"status"`
	View      uint64 `json:"view"`
	Leader    uint64 `json:"leader"`
	Commit    uint64 `json:"commit_op"`
	Applied   uint64 `json:"applied_op"`
	Failed    string `json:"failed,omitempty"`
	// The group's configuration (membership.go): its epoch and members,
	// and whether this replica is joining (pulling the epoch's start
	// state), leaving, or retired.
	Epoch     uint64   `json:"epoch"`
	Members   []uint64 `json:"members"`
	Joining   bool     `json:"joining,omitempty"`
	Leaving   bool     `json:"leaving,omitempty"`
	Retired   bool     `json:"retired,omitempty"`
	Fsyncs    uint64   `json:"log_fsyncs"`
	Forwarded uint64   `json:"forwarded"`
	// Lag: commit_op less applied_op here; Followers: at the leader, each
	// follower's progress and lag (lag.go).
	Lag       uint64        `json:"lag_ops"`
	Followers []FollowerLag `json:"followers,omitempty"`
	// Nilext fast path (omitted when off).
	Nilext *NilextInfo `json:"nilext,omitempty"`
	// CAD and cross-client-monotonic reads.
	CAD *CADInfo `json:"cad"`
	// View events (vrshard/viewlog.go): counts since this node started, and
	// the last few events, oldest first.
	ViewChanges           uint64          `json:"view_changes"`
	LeaderChanges         uint64          `json:"leader_changes"`
	Depositions           uint64          `json:"depositions"`
	WritesRefusedNoLeader uint64          `json:"writes_refused_no_leader"`
	ViewEvents            []ViewEventJSON `json:"view_events"`
}

// ViewEventJSON is one view event in /status.
type ViewEventJSON struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`
	View   uint64    `json:"view"`
	Leader uint64    `json:"leader,omitempty"`
	Reason string    `json:"reason"`
}

// replicaInfo reports the replica's state, or nil for a single node.
func (s *Server) replicaInfo() *ReplicaInfo {
	if s.grp == nil {
		return nil
	}
	in := s.grp.State()
	st := s.grp.Stats()
	out := &ReplicaInfo{
		ReplicaID: s.cfg.ReplicaID, ClusterID: s.cfg.ClusterID, Role: in.Role,
		Status: in.Status, View: in.View, Leader: in.Leader, Commit: in.Commit,
		Applied: in.Applied, Fsyncs: st.Fsyncs, Forwarded: s.router.Forwarded(),
		ViewChanges: st.ViewChanges, LeaderChanges: st.LeaderChanges, Depositions: st.Depositions,
		WritesRefusedNoLeader: st.WritesRefusedNoLeader, ViewEvents: []ViewEventJSON{},
		Epoch: in.Epoch, Joining: in.Joining, Leaving: in.Leaving, Retired: in.Retired,
		Lag: opsBehind(in.Commit, in.Applied), Followers: followerLags(in),
	}
	if s.mem != nil { // a node of several groups has no one member list
		out.Members = cluster.MemberIDs(s.groupMembers())
	}
	for _, e := range s.grp.ViewEvents() {
		out.ViewEvents = append(out.ViewEvents, ViewEventJSON{Time: e.Time.UTC(), Kind: e.Kind, View: e.View, Leader: e.Leader, Reason: e.Reason})
	}
	if in.Failed != nil {
		out.Failed = in.Failed.Error()
	}
	if s.grp.NilextOn() {
		out.Nilext = s.nilextInfo(in)
	}
	out.CAD = s.cadInfo(in)
	return out
}

// roleName is the node's role for INFO and /status.
func (s *Server) roleName() string {
	if ri := s.replicaInfo(); ri != nil {
		return ri.Role
	}
	return "single-node"
}

// redisRole is the role HELLO reports, in Redis's words: a client library that
// looks for the master must find the node that leads, not any replica (a
// follower forwards writes, but it is not where they are decided).
func (s *Server) redisRole() string {
	if s.grp == nil || s.grp.State().Role == cluster.RoleLeader {
		return "master"
	}
	return "replica"
}
