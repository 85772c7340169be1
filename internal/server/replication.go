package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/vrshard"
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
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return fmt.Errorf("server: write %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, p); err != nil {
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
	if have.Cluster != want.Cluster || have.Replica != want.Replica || !slices.Equal(have.Members, want.Members) {
		return fmt.Errorf("%w: %s belongs to cluster %d as replica %d of members %v, but this node is configured as cluster %d, replica %d, members %v; fix --cluster-id/--replica-id/--members (or use an empty --dir for a new node)",
			ErrStaleConfig, dir, have.Cluster, have.Replica, have.Members, want.Cluster, want.Replica, want.Members)
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

// openReplica opens this node's VR replica in cfg.DataDir/vr.
func (s *Server) openReplica() (*vrshard.Replica, error) {
	cfg := s.cfg
	if cfg.FS == nil {
		if err := checkMode(cfg.DataDir, true); err != nil {
			return nil, err
		}
		if err := checkIdentity(cfg.DataDir, cfg.identity()); err != nil {
			return nil, err
		}
	}
	peers := map[uint64]string{}
	clients := map[uint64]string{}
	ids := make([]uint64, len(cfg.Members))
	for i, m := range cfg.Members {
		ids[i] = m.ID
		peers[m.ID] = m.PeerAddr
		clients[m.ID] = m.ClientAddr
	}
	opts := vrshard.Options{
		Dir: filepath.Join(cfg.DataDir, "vr"),
		FS:  cfg.diskFS(),
		VR: vr.Config{
			Cluster: cfg.ClusterID, Members: ids, Self: cfg.ReplicaID,
			HeartbeatInterval: cfg.HeartbeatInterval, ViewChangeTimeout: cfg.ViewChangeTimeout,
			NilextBatch: cfg.NilextBatch, NilextInterval: cfg.NilextInterval,
		},
		NilextSyncDelay: cfg.NilextSyncDelay,
		CadSyncDelay:    cfg.CadSyncDelay,
		CheckpointOps:   cfg.CheckpointOps,
		Bootstrap:       cfg.Bootstrap,
		Nilext:          cfg.Nilext,
		FollowerReads:   cfg.FollowerReads,
		ClockSkew:       cfg.ClockSkew,
		Peers:           peers,
		ClientAddrs:     clients,
		ClusterSecret:   cfg.ClusterSecret,
		Storage: storage.Options{
			SyncInterval:       cfg.SyncInterval,
			CacheBytes:         cfg.CacheBytes,
			CheckpointInterval: max(cfg.CheckpointInterval, 0),
			CompactInterval:    max(cfg.CompactInterval, 0),
			Retention:          storage.Retention{KeepVersions: cfg.RetainVersions},
			MaxValueSize:       cfg.MaxBulk, // what the front door admits, the engine stores
			OnSync:             s.fsyncObserver("storage"),
		},
		OnLogSync: s.fsyncObserver("replication"),
		Logger:    s.log.With("component", "vr"),
	}
	// The node's peer transport: its handshake admits peers of the same
	// cluster and group configuration (members, epoch, lease timing), whose
	// hash is the one the replica runs with, defaults filled in.
	gcfg, err := vrshard.GroupConfig(opts)
	if err != nil {
		return nil, fmt.Errorf("server: VR replica %d of cluster %d: %w", cfg.ReplicaID, cfg.ClusterID, err)
	}
	tr, err := transport.New(transport.Config{
		Self: cfg.ReplicaID, Peers: peers, ClusterSecret: cfg.ClusterSecret,
		Cluster: gcfg.Cluster, ConfigHash: gcfg.Hash(),
		Logger: opts.Logger, // the transport adds "replica" itself
	})
	if err != nil {
		return nil, fmt.Errorf("server: peer transport of node %d: %w", cfg.ReplicaID, err)
	}
	opts.Transport = tr
	r, err := vrshard.Open(opts)
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("server: open VR replica %d of cluster %d: %w", cfg.ReplicaID, cfg.ClusterID, err)
	}
	s.peerTr = tr
	return r, nil
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
	Fsyncs    uint64 `json:"log_fsyncs"`
	Forwarded uint64 `json:"forwarded"`
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

// role names what a replica does now: leader, follower, recovering,
// view-change or failed.
func role(in vrshard.Info) string {
	switch {
	case in.Failed != nil:
		return "failed"
	case in.Status == vr.Recovering:
		return "recovering"
	case in.Status == vr.ViewChange:
		return "view-change"
	case in.IsLeader:
		return "leader"
	}
	return "follower"
}

// replicaInfo reports the VR state, or nil for a single node.
func (s *Server) replicaInfo() *ReplicaInfo {
	if s.vr == nil {
		return nil
	}
	in := s.vr.Info()
	st := s.vr.Stats()
	out := &ReplicaInfo{
		ReplicaID: s.cfg.ReplicaID, ClusterID: s.cfg.ClusterID, Role: role(in),
		Status: in.Status.String(), View: in.View, Leader: in.Leader, Commit: in.Commit,
		Applied: in.Applied, Fsyncs: st.Fsyncs, Forwarded: s.fwd.forwarded.Load(),
		ViewChanges: st.ViewChanges, LeaderChanges: st.LeaderChanges, Depositions: st.Depositions,
		WritesRefusedNoLeader: st.WritesRefusedNoLeader, ViewEvents: []ViewEventJSON{},
	}
	for _, e := range s.vr.ViewEvents() {
		out.ViewEvents = append(out.ViewEvents, ViewEventJSON{Time: e.Time.UTC(), Kind: e.Kind, View: e.View, Leader: e.Leader, Reason: e.Reason})
	}
	if in.Failed != nil {
		out.Failed = in.Failed.Error()
	}
	if s.vr.NilextOn() {
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
	if s.vr == nil || role(s.vr.Info()) == "leader" {
		return "master"
	}
	return "replica"
}
