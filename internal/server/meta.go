package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/transport"
)

// The metadata group at a node (docs/design/cluster.md §4; the map itself
// is kv/clustermap.go, its follower cluster/meta.go): a node of a cluster of
// several groups that is one of cluster.MetaMembers hosts a replica of it,
// in DIR/group-65535/, on the node's one peer transport.

// openMeta opens this node's replica of the metadata group, if it is a
// member, and makes m follow its map.
func (s *Server) openMeta(m *cluster.Multi, slots *cluster.SlotMap, byID map[uint64]Member, tr *transport.Transport) error {
	cfg := s.cfg
	ids := make([]uint64, 0, len(cfg.Members))
	for _, mb := range cfg.Members {
		ids = append(ids, mb.ID)
	}
	members := cluster.MetaMembers(ids)
	dir := groupDir(cfg.DataDir, cluster.MetaGroupID)
	if cfg.FS == nil {
		// Its replica retired (the group was reconfigured without this
		// node): never reopened. Or this node joined the group as a new
		// member (groupmembers.go): opened from that record.
		if err := CheckRetired(dir); err != nil {
			s.log.Info("not opening the metadata group's replica: it retired", "err", err)
			return nil
		}
		jr, ok, err := readGroupJoin(dir)
		if err != nil {
			return err
		}
		if ok {
			lg, err := s.openJoinedGroup(tr, cluster.MetaGroupID, jr, false)
			if err != nil {
				return err
			}
			if err := m.HostMeta(lg.Hosted, nil); err != nil {
				_ = lg.Hosted.Replica.Close()
				return fmt.Errorf("server: metadata group: %w", err)
			}
			return nil
		}
	}
	if !slices.Contains(members, cfg.ReplicaID) {
		return nil
	}
	ms := make([]Member, len(members))
	for i, id := range members {
		ms[i] = byID[id]
	}
	clusterID := cluster.GroupClusterID(cfg.ClusterID, cluster.MetaGroupID)
	if cfg.FS == nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("server: create %s: %w", dir, err)
		}
		if err := checkIdentity(dir, replicaIdentity{Cluster: clusterID, Replica: cfg.ReplicaID, Members: members, Slots: "metadata"}); err != nil {
			return err
		}
	}
	spec := s.replicaSpec(filepath.Join(dir, "vr"))
	spec.Logger = s.log.With("component", "vr", "group", "metadata")
	spec.Cluster, spec.Members, spec.Group, spec.Transport = clusterID, ms, cluster.MetaGroupID, tr
	spec.Nilext = false
	spec.ActiveExpiry = -1 // no user keys: nothing expires
	h, err := cfg.OpenReplica(spec)
	if err != nil {
		return fmt.Errorf("server: metadata group: %w", err)
	}
	if err := m.HostMeta(h, cluster.BootstrapMap(slots, cfg.Members)); err != nil {
		_ = h.Replica.Close()
		return fmt.Errorf("server: metadata group: %w", err)
	}
	return nil
}

// startMetaFollower follows the metadata group's map until Shutdown: from
// this node's replica of it (and, at its leader, bootstraps it and resumes
// abandoned moves), or, at a node that hosts none, by polling its leader.
func (s *Server) startMetaFollower() {
	if s.multi == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.metaStop = func() { cancel(); <-done }
	fc := cluster.FollowConfig{Password: s.cfg.Password, RepairAfter: s.cfg.RepairAfter, Zone: s.cfg.Zone,
		Logf: func(format string, args ...any) { s.log.Info(fmt.Sprintf(format, args...), "component", "metadata") }}
	// The resumer drives a move through the client ports, as kefir cluster
	// move-slots does: this node's first.
	fc.Seeds = append(fc.Seeds, s.ClientAddr().String())
	for _, mb := range s.cfg.Members {
		if mb.ID != s.cfg.ReplicaID && mb.ClientAddr != "" {
			fc.Seeds = append(fc.Seeds, mb.ClientAddr)
		}
	}
	fc.TLS = s.nodeTLS()
	go func() {
		defer close(done)
		s.multi.FollowMap(ctx, fc)
	}()
}

// nodeTLS is the TLS configuration of this node's own calls to other
// nodes' client ports (nil: the client port is plain): the nodes share the
// cluster's certificate (the forwarder trusts exactly it the same way).
func (s *Server) nodeTLS() *tls.Config {
	if s.cfg.TLSCert == "" {
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // see VerifyGroupCert
	c.VerifyPeerCertificate = cluster.VerifyGroupCert(s.cfg.TLSCert, s.cfg.TLSKey)
	return c
}

// waitMetaMap holds a map poll at the metadata leader until the map's
// epoch is above since, wait passes or the server shuts down
// (cluster.Multi.WaitMetaMap).
func (s *Server) waitMetaMap(since uint64, wait time.Duration) (*kv.ClusterMap, error) {
	ctx, cancel := context.WithTimeout(s.stopping, wait)
	defer cancel()
	return s.multi.WaitMetaMap(ctx, since)
}

func (s *Server) stopMetaFollower() {
	if s.metaStop != nil {
		s.metaStop()
	}
}

// metaCmd serves KEFIR.SLOTS META (the metadata group's records of moves,
// at its leader; elsewhere -MOVED <leader's address>): the subcommands are
// cluster.MetaCommand's (metacmd.go), the one translation the move
// simulation runs too; a write's op is proposed at this node's replica of
// the metadata group, which answers -MOVED where it does not lead.
func (c *conn) metaCmd(args [][]byte) error {
	m := c.srv.multi
	cmd, err := cluster.MetaCommand(args)
	if err != nil {
		return err
	}
	if !cmd.Map {
		res, err := m.MetaWrite(context.Background(), cmd.Op)
		if err != nil {
			return err
		}
		return c.w.WriteInt(res.Int)
	}
	var cm *kv.ClusterMap
	if cmd.Wait > 0 && cmd.Since > 0 && c.mayBlock() {
		cm, err = c.srv.waitMetaMap(cmd.Since, time.Duration(cmd.Wait)*time.Millisecond)
	} else {
		cm, err = m.MetaMap(cmd.Local)
	}
	if err != nil {
		return err
	}
	if cm == nil {
		return errf("TRYAGAIN the metadata group has no map yet (bootstrapping)")
	}
	if cmd.Since > 0 && cm.Epoch <= cmd.Since {
		return c.w.WriteNull()
	}
	b, err := json.Marshal(cm)
	if err != nil {
		return fmt.Errorf("server: the cluster map as JSON: %w", err)
	}
	return c.w.WriteBulk(b)
}

// metaInfo is CLUSTER INFO's part about the metadata group at a node that
// hosts a replica of it: the epoch of the map this replica applied (the
// map the node routes by when its tables know no better) and the moves in
// flight it records.
func (s *Server) metaInfo() string {
	if s.multi == nil {
		return ""
	}
	cm := s.multi.ClusterMap()
	if cm == nil {
		return ""
	}
	return fmt.Sprintf("kefir_map_epoch:%d\r\nkefir_moves_in_flight:%d\r\n", cm.Epoch, len(cm.Moves))
}

// MetaStatus is /status's cluster_map: the map this node follows and this
// node's replica of the metadata group, if it hosts one.
type MetaStatus struct {
	Epoch uint64       `json:"epoch"`
	Nodes int          `json:"nodes"`
	Moves []kv.MapMove `json:"moves_in_flight"`
	Meta  *GroupStatus `json:"metadata_replica,omitempty"`
	// Zones are the nodes' zones, by node id (those that have one), and
	// SharedZones the groups whose replicas share one
	// (cluster.GroupsSharingZones), as kefir cluster status shows them.
	Zones       map[uint64]string `json:"zones,omitempty"`
	SharedZones map[uint64]string `json:"shared_zones,omitempty"`
}

// metaStatus reports the map (nil: none followed yet).
func (s *Server) metaStatus() *MetaStatus {
	if s.multi == nil {
		return nil
	}
	cm := s.multi.ClusterMap()
	if cm == nil {
		return nil
	}
	out := &MetaStatus{Epoch: cm.Epoch, Nodes: len(cm.Nodes), Moves: cm.Moves, SharedZones: cluster.GroupsSharingZones(cm)}
	for _, n := range cm.Nodes {
		if n.Zone != "" {
			if out.Zones == nil {
				out.Zones = map[uint64]string{}
			}
			out.Zones[n.ID] = n.Zone
		}
	}
	if out.Moves == nil {
		out.Moves = []kv.MapMove{}
	}
	if st, ok := s.multi.GroupState(cluster.MetaGroupID); ok {
		out.Meta = &GroupStatus{ID: uint64(cluster.MetaGroupID), Leader: st.Leader, Role: st.Role, View: st.View, Commit: st.Commit, Applied: st.Applied}
	}
	return out
}
