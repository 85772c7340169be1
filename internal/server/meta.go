package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
	fc := cluster.FollowConfig{Password: s.cfg.Password,
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

// maxMapWait bounds how long a map poll is held (ms): a connection's
// read deadline on the poller's side is longer.
const maxMapWait = 5000

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
// at its leader; elsewhere -MOVED <leader's address>):
//
//	KEFIR.SLOTS META MAP [LOCAL|SINCE e [WAIT ms]]  the map as JSON (LOCAL: this node's replica's; SINCE: null unless newer
//	                                                than epoch e; WAIT: held up to ms, at most 5000, until it is)
//	KEFIR.SLOTS META PLAN from to ranges epoch driver   MovePlanned: the move's beat
//	KEFIR.SLOTS META CLAIM epoch driver beat        renew or take over a move's lease: the new beat
//	KEFIR.SLOTS META DONE epoch                     MoveDone: the map's epoch
//	KEFIR.SLOTS META ABORT epoch                    the move rolled back: the map's epoch
//	KEFIR.SLOTS META ADDNODE id client-addr peer-addr   a node joins the map: the map's epoch
//	KEFIR.SLOTS META SETMEMBERS group epoch id...   a group's members after its reconfiguration
//	                                                to VR epoch `epoch` (kv.KindMapSetMembers): the map's epoch
//	KEFIR.SLOTS META ADDGROUP group [ENGINE chain] id...
//	                                                a new data group with these members (leader
//	                                                order) and no slots (kv.KindMapAddGroup): the map's epoch
//	KEFIR.SLOTS META REMOVEGROUP group epoch        a data group of no slots leaves the map, compare-and-set by
//	                                                the map's epoch (kv.KindMapRemoveGroup): the map's epoch
func (c *conn) metaCmd(args [][]byte) error {
	m := c.srv.multi
	sub := strings.ToUpper(string(args[2]))
	want := map[string]int{"MAP": 3, "PLAN": 8, "CLAIM": 6, "DONE": 4, "ABORT": 4, "ADDNODE": 6, "SETMEMBERS": 6, "ADDGROUP": 5, "REMOVEGROUP": 5}
	n, ok := want[sub]
	if !ok {
		return errf("ERR unknown subcommand '%s' of KEFIR.SLOTS META (MAP, PLAN, CLAIM, DONE, ABORT, ADDNODE, SETMEMBERS, ADDGROUP, REMOVEGROUP)", strings.ToLower(sub))
	}
	if len(args) != n && !(sub == "MAP" && len(args) <= 7) && !((sub == "SETMEMBERS" || sub == "ADDGROUP") && len(args) > n) {
		return errf("ERR wrong number of arguments for 'kefir.slots|meta|%s' command", strings.ToLower(sub))
	}
	u := func(i int) (uint64, error) {
		v, err := strconv.ParseUint(string(args[i]), 10, 64)
		if err != nil {
			return 0, errf("ERR KEFIR.SLOTS META %s: %q is not a number", sub, args[i])
		}
		return v, nil
	}
	var op kv.Op
	switch sub {
	case "MAP":
		// MAP [LOCAL | SINCE epoch [WAIT ms]]. SINCE is the pollers' form:
		// a null reply when the map is at that epoch or older, so a node
		// without a metadata replica does not fetch the whole map every
		// poll; WAIT holds the reply until the map is newer (a long poll:
		// the node learns a change when the leader does, not a poll later).
		local, since, wait := false, uint64(0), uint64(0)
		switch {
		case len(args) == 4 && strings.EqualFold(string(args[3]), "LOCAL"):
			local = true
		case (len(args) == 5 || len(args) == 7 && strings.EqualFold(string(args[5]), "WAIT")) && strings.EqualFold(string(args[3]), "SINCE"):
			e, err := u(4)
			if err != nil {
				return err
			}
			since = e
			if len(args) == 7 {
				if wait, err = u(6); err != nil {
					return err
				}
				wait = min(wait, maxMapWait)
			}
		case len(args) != 3:
			return errf("ERR KEFIR.SLOTS META MAP takes LOCAL or SINCE epoch [WAIT ms], not %q", bytes.Join(args[3:], []byte(" ")))
		}
		var cm *kv.ClusterMap
		var err error
		if wait > 0 && since > 0 && c.mayBlock() {
			cm, err = c.srv.waitMetaMap(since, time.Duration(wait)*time.Millisecond)
		} else {
			cm, err = m.MetaMap(local)
		}
		if err != nil {
			return err
		}
		if cm == nil {
			return errf("TRYAGAIN the metadata group has no map yet (bootstrapping)")
		}
		if since > 0 && cm.Epoch <= since {
			return c.w.WriteNull()
		}
		b, err := json.Marshal(cm)
		if err != nil {
			return fmt.Errorf("server: the cluster map as JSON: %w", err)
		}
		return c.w.WriteBulk(b)
	case "PLAN":
		from, err1 := u(3)
		to, err2 := u(4)
		epoch, err3 := u(6)
		for _, err := range []error{err1, err2, err3} {
			if err != nil {
				return err
			}
		}
		rs, err := cluster.ParseSlotRanges(string(args[5]))
		if err != nil {
			return errf("ERR KEFIR.SLOTS META PLAN: %v", err)
		}
		op = kv.Op{Kind: kv.KindMapMovePlan, Key: kv.AppendMapMove(nil, kv.MapMove{From: from, To: to, Slots: rs, Epoch: epoch, Driver: string(args[7])})}
	case "CLAIM":
		epoch, err1 := u(3)
		beat, err2 := u(5)
		if err1 != nil {
			return err1
		}
		if err2 != nil {
			return err2
		}
		op = kv.Op{Kind: kv.KindMapMoveClaim, Key: kv.AppendMapMove(nil, kv.MapMove{Epoch: epoch, Driver: string(args[4]), Beat: beat})}
	case "DONE", "ABORT":
		epoch, err := u(3)
		if err != nil {
			return err
		}
		op = kv.Op{Kind: kv.KindMapMoveDone, Key: kv.AppendMapMove(nil, kv.MapMove{Epoch: epoch})}
		if sub == "ABORT" {
			op.Kind = kv.KindMapMoveAbort
		}
	case "ADDNODE":
		id, err := u(3)
		if err != nil || id == 0 {
			return errf("ERR KEFIR.SLOTS META ADDNODE: the node id must be a positive integer")
		}
		op = kv.Op{Kind: kv.KindMapAddNode, Key: kv.AppendMapNode(nil, kv.MapNode{ID: id, ClientAddr: string(args[4]), PeerAddr: string(args[5])})}
	case "SETMEMBERS":
		mm := kv.MapMembers{}
		var err error
		if mm.Group, err = u(3); err != nil {
			return err
		}
		if mm.Epoch, err = u(4); err != nil {
			return err
		}
		for i := 5; i < len(args); i++ {
			id, err := u(i)
			if err != nil {
				return err
			}
			mm.Members = append(mm.Members, id)
		}
		op = kv.Op{Kind: kv.KindMapSetMembers, Key: kv.AppendMapMembers(nil, mm)}
	case "ADDGROUP":
		ag := kv.MapAddGroup{}
		mm := &ag.MapMembers
		var err error
		if mm.Group, err = u(3); err != nil {
			return err
		}
		first := 4
		if len(args) > 5 && strings.EqualFold(string(args[4]), "ENGINE") {
			// KEFIR.SLOTS META ADDGROUP g ENGINE chain ids...
			ag.Engine, first = strings.ToLower(string(args[5])), 6
			if ag.Engine == "vr" {
				ag.Engine = kv.EngineVR
			}
		}
		for i := first; i < len(args); i++ {
			id, err := u(i)
			if err != nil {
				return err
			}
			mm.Members = append(mm.Members, id)
		}
		op = kv.Op{Kind: kv.KindMapAddGroup, Key: kv.AppendMapAddGroup(nil, ag)}
	case "REMOVEGROUP":
		g, err := u(3)
		if err != nil {
			return err
		}
		epoch, err := u(4)
		if err != nil {
			return err
		}
		op = kv.Op{Kind: kv.KindMapRemoveGroup, Key: kv.AppendMapMembers(nil, kv.MapMembers{Group: g, Epoch: epoch})}
	}
	res, err := m.MetaWrite(context.Background(), op)
	if err != nil {
		return err
	}
	return c.w.WriteInt(res.Int)
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
	out := &MetaStatus{Epoch: cm.Epoch, Nodes: len(cm.Nodes), Moves: cm.Moves}
	if out.Moves == nil {
		out.Moves = []kv.MapMove{}
	}
	if st, ok := s.multi.GroupState(cluster.MetaGroupID); ok {
		out.Meta = &GroupStatus{ID: uint64(cluster.MetaGroupID), Leader: st.Leader, Role: st.Role, View: st.View, Commit: st.Commit, Applied: st.Applied}
	}
	return out
}
