package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A node named again in a data group its replica retired from (kefir
// cluster replace-node --group, then replace-node, add-members or a
// placement that picks it again; issue 28, docs/design/cluster.md
// "Rejoining a group"). The retired record (retiredFile) says "this
// replica left at epoch E"; a later epoch that names the node makes it a
// member again, and the replica's kept log — committed up to its commit
// point, and past it perhaps ops that never committed (a replica told of
// the epoch it left by a start-epoch keeps its log as it was) — is a
// lagging member's: VR's joining member pulls the committed ops (or a
// snapshot) after its commit point, drops its log from the first entry
// that differs from them, and neither votes nor acknowledges before it
// holds the epoch's start (vr's TestSimReconfigurationKeepRetired). So the node un-retires rather than trusting
// or wiping anything itself:
//   - a retired replica still open (retiredH, or kept hosted as the node's
//     last data group) takes part by itself when the new epoch's members
//     reach it (start-epoch); once its configuration (persisted by then)
//     names this node at a later epoch, rejoinRetired removes the record,
//     durably, and routes to it again (a restart opens it);
//   - one not open (the node restarted since it retired) is opened from
//     its directory as it is (rejoinGroup) once the map and the group's
//     configuration name the node at a later epoch, then the record goes;
//     with no data left (vr/ gone) it joins as a new member (joinGroup).
// Never for a removed group (its id never returns to the map) nor for the
// metadata group or a chain group (a chain's member retires only by the
// map's Leaving, and its master joins a fresh one).

// retiredReplica is an open replica of a data group that retired here at
// epoch (its group's configuration without this node).
type retiredReplica struct {
	lg    cluster.LocalGroup
	rc    cluster.Reconfigurable
	epoch uint64
}

// rejoinRetired un-retires every open retired replica whose group took it
// back (rejoinable): its record removed, routed to again.
func (s *Server) rejoinRetired() {
	gs := s.groups
	gs.mu.Lock()
	var back []retiredReplica
	for _, r := range gs.rejoinable {
		if st, m := r.lg.Hosted.Group.State(), r.rc.Membership(); m.Epoch > r.epoch && slices.Contains(m.Members, s.cfg.ReplicaID) && !st.Leaving && !st.Retired {
			back = append(back, r)
		}
	}
	gs.mu.Unlock()
	for _, r := range back {
		id := r.lg.Spec.ID
		if err := s.removeRetiredRecord(id); err != nil {
			s.log.Error("a retired replica is a member of its group again: remove its retired record", "group", uint64(id), "err", err)
			continue // tried again at the next poll
		}
		m := r.rc.Membership()
		gs.mu.Lock()
		delete(gs.rejoinable, id)
		delete(gs.logged, id)
		i := slices.IndexFunc(gs.retiredH, func(h cluster.Hosted) bool { return h.Replica == r.lg.Hosted.Replica })
		if i >= 0 {
			gs.retiredH = slices.Delete(gs.retiredH, i, i+1)
		}
		gs.mu.Unlock()
		if i >= 0 {
			lg := r.lg
			lg.Spec.Members = slices.Clone(m.Members)
			if spec, ok := s.multi.Slots().Group(id); ok {
				lg.Spec.Slots = spec.Slots
			}
			if err := s.multi.AddGroup(lg); err != nil {
				s.log.Error("route to a replica that is a member of its group again", "group", uint64(id), "err", err)
				gs.mu.Lock()
				gs.retiredH = append(gs.retiredH, r.lg.Hosted) // still closed at shutdown
				gs.mu.Unlock()
				continue
			}
		}
		s.log.Warn("this node's replica of a group it had retired from is a member again: its retired record is removed and the node routes to it", "group", uint64(id), "retired_at_epoch", r.epoch, "epoch", m.Epoch, "members", m.Members)
	}
}

// readRetired reads group directory dir's retired record (ok false: none).
func readRetired(dir string) (retiredRecord, bool, error) {
	var r retiredRecord
	ok, err := readRecord(dir, retiredFile, &r)
	return r, ok, err
}

// removeRetiredRecord removes group id's retired record, durably (the
// directory synced): a restart opens the replica again.
func (s *Server) removeRetiredRecord(id cluster.GroupID) error {
	if s.cfg.FS != nil {
		return nil
	}
	dir := groupDir(s.cfg.DataDir, id)
	if err := os.Remove(filepath.Join(dir, retiredFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("server: remove %s: %w", filepath.Join(dir, retiredFile), err)
	}
	if err := vfs.Default.SyncDir(dir); err != nil {
		return fmt.Errorf("server: sync %s: %w", dir, err)
	}
	return nil
}

// mayRejoin reports whether map entry g (naming this node) takes back a
// group whose replica here retired with record r and is not open: a VR
// data group, not removed, at a later member epoch than r's.
func (s *Server) mayRejoin(g *kv.MapGroup, r retiredRecord) bool {
	return r.RemovedAt == 0 && g.ID != uint64(cluster.MetaGroupID) && !g.IsChain() &&
		slices.Contains(g.Members, s.cfg.ReplicaID) && g.MemberEpoch > r.Epoch
}

// rejoinGroup reopens this node's retired replica of group id, not open,
// which the map names again (mayRejoin): once the group's configuration
// (asked of members) names the node at a later epoch than it retired at,
// the replica opens from its directory as a restart would open it, then
// its retired record goes. With no data left it joins as a new member.
func (s *Server) rejoinGroup(ctx context.Context, id cluster.GroupID, members []uint64) error {
	dir := groupDir(s.cfg.DataDir, id)
	r, ok, err := readRetired(dir)
	if err != nil || !ok {
		return fmt.Errorf("rejoin group %d: its retired record: %v", id, err)
	}
	gc, err := s.groupConfig(ctx, id, members)
	if err != nil {
		return err
	}
	if gc.Epoch <= r.Epoch {
		return fmt.Errorf("group %d's configuration (%s) is not later than the one this node's replica retired at (epoch %d)", id, gc, r.Epoch)
	}
	if _, err := os.Stat(filepath.Join(dir, "vr")); errors.Is(err, os.ErrNotExist) {
		// Nothing kept: a new member's directory (its records describe
		// a replica that no longer exists).
		for _, f := range []string{identityFile, joinFile} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("rejoin group %d: %w", id, err)
			}
		}
		if err := s.removeRetiredRecord(id); err != nil {
			return err
		}
		return s.joinGroup(ctx, id, members)
	}
	lg, err := s.openKeptGroup(id)
	if err != nil {
		return fmt.Errorf("rejoin group %d: %w", id, err)
	}
	if err := s.removeRetiredRecord(id); err != nil {
		_ = lg.Hosted.Replica.Close()
		return err
	}
	if spec, ok := s.multi.Slots().Group(id); ok {
		lg.Spec.Slots = spec.Slots
	}
	if err := s.multi.AddGroup(lg); err != nil {
		_ = lg.Hosted.Replica.Close()
		return err
	}
	s.log.Warn("named again in a group this node's replica had retired from: reopened the replica from its directory (it catches up from the members)", "group", uint64(id), "retired_at_epoch", r.Epoch, "config", gc.String())
	return nil
}

// openKeptGroup opens this node's replica of data group id from its
// directory as openGroups does at a start: one it joined or created (its
// joinFile), else one of --groups.
func (s *Server) openKeptGroup(id cluster.GroupID) (cluster.LocalGroup, error) {
	dir := groupDir(s.cfg.DataDir, id)
	jr, ok, err := readGroupJoin(dir)
	if err != nil {
		return cluster.LocalGroup{}, err
	}
	if ok {
		return s.openJoinedGroup(s.peerTr, id, jr, s.firstOpen(jr, dir))
	}
	for _, g := range s.cfg.Groups {
		if g.ID == id && slices.Contains(g.Members, s.cfg.ReplicaID) && !slices.Contains(s.cfg.ChainGroups, id) {
			byID := map[uint64]Member{}
			for _, m := range s.cfg.Members {
				byID[m.ID] = m
			}
			return s.openStaticGroup(s.peerTr, g, byID)
		}
	}
	return cluster.LocalGroup{}, fmt.Errorf("%w: %s has no join record and --groups does not name this node in group %d", ErrStaleConfig, dir, id)
}
