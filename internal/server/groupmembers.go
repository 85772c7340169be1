package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Membership in a cluster of several groups (--groups; issue 28,
// docs/design/cluster.md §7 "Several groups"). Each data group changes its
// members by VR reconfiguration, one group at a time, driven by kefir
// cluster replace-node/remove-node: KEFIR.GROUP RECONFIG GROUP g at the
// group's leader, then KEFIR.SLOTS META SETMEMBERS (kv.KindMapSetMembers)
// records the new members in the metadata group's map. The map is the
// cluster's address book and the nodes' instruction:
//   - every node teaches its one peer transport, its router and its
//     replicas the nodes the map names (a node added after it started);
//   - a node the map names in a group it does not host starts a replica of
//     it (joinGroup): it asks the group for its configuration, records it in
//     the group's directory (joinFile) and opens the replica with it, an
//     empty disk and no bootstrap, so it pulls the state (VR's new member);
//   - a node whose replica of a group retired records that in the group's
//     directory (retiredFile), which a restart does not open, and stops
//     routing to it, until a later epoch of the group names the node
//     again (rejoin.go); a node whose groups all retired it and that has
//     no metadata replica retires as a single group's node does;
//   - a node whose groups were all removed from the map (remove-group)
//     stays up, empty: still a node of the map, it serves by forwarding
//     and takes part in a group the map names it in later; restarted, it
//     comes back empty (openGroups).
// A new node (kefir server --join, no --members) waits until the map names
// it in a group (PrepareJoin), then starts as a node of the map's groups.

// groupsState is a node of several groups' membership state.
type groupsState struct {
	mu      sync.Mutex
	lastMap *kv.ClusterMap
	// joining: groups a replica is being started for; next: when a failed
	// start may be tried again.
	joining map[cluster.GroupID]bool
	next    map[cluster.GroupID]time.Time
	// retiredH are replicas that retired: out of the routing, closed at
	// shutdown (the node's engine handle may be one of theirs).
	retiredH []cluster.Hosted
	// rejoinable: this node's VR replicas of data groups that retired
	// (not for a removed group), by group, still open (in retiredH, or
	// still hosted as the node's last data group): the replica takes part
	// again if a later epoch names this node (VR's start-epoch), and
	// rejoinRetired then un-retires it.
	rejoinable map[cluster.GroupID]retiredReplica
	logged     map[cluster.GroupID]bool
	// asked: when the map was last asked of the other nodes for a leaving
	// replica (askMap); asking: one is in flight.
	asked  time.Time
	asking bool
	// recorded: when this node, leading a group, last recorded its members
	// in the map (recordMembers); recording: one is in flight.
	recorded  map[cluster.GroupID]time.Time
	recording bool
	// masters are the hosted masters of the map's chain groups this node
	// runs (a node of the metadata group; startChainMasters), by group.
	// Only the watch's goroutine changes it (under mu), and stopGroupsWatch
	// after it; the admin port reads it under mu (groupMaster).
	masters map[cluster.GroupID]cluster.HostedChainMaster
	// namedAt is the highest epoch of a map seen naming this node (from
	// its joinFile's map_epoch at start): leftMap.
	namedAt uint64
	retired chan struct{}
	retErr  error
	once    sync.Once
	stop    func()
	wg      sync.WaitGroup
}

// groupsPoll is how often the node compares its groups with the map.
const groupsPoll = 50 * time.Millisecond

// admitRule is the handshake rule of a node of several groups' transport
// (transport.AdmitConfigs). The transport's configuration hash is derived
// from the node list it started with, so a node added later (or this node,
// if it joined) advertises another; the peer map still admits only nodes
// the map named (AddPeer). Nodes of the original list must match as
// before: a node with another --members is refused.
func admitRule(static []Member, joined bool) func(node, hash uint64) bool {
	ids := cluster.MemberIDs(static)
	return func(node, _ uint64) bool { return joined || !slices.Contains(ids, node) }
}

// startGroupsWatch follows the map's groups until Shutdown (a node of
// several groups).
func (s *Server) startGroupsWatch() {
	if s.multi == nil {
		return
	}
	gs := &groupsState{joining: map[cluster.GroupID]bool{}, next: map[cluster.GroupID]time.Time{},
		logged: map[cluster.GroupID]bool{}, recorded: map[cluster.GroupID]time.Time{}, retired: make(chan struct{}),
		masters: map[cluster.GroupID]cluster.HostedChainMaster{}, rejoinable: map[cluster.GroupID]retiredReplica{},
		namedAt: s.cfg.namedAtMapEpoch}
	s.groups = gs
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	gs.stop = func() {
		cancel()
		<-done
		gs.wg.Wait()
		// Before the replicas close: a master speaks through its node's
		// chain member and reads the metadata replica.
		gs.mu.Lock()
		ms := gs.masters
		gs.masters = map[cluster.GroupID]cluster.HostedChainMaster{}
		gs.mu.Unlock()
		for _, m := range ms {
			m.Stop()
		}
	}
	go func() {
		defer close(done)
		t := time.NewTicker(groupsPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s.syncGroups(ctx) {
				return
			}
		}
	}()
}

func (s *Server) stopGroupsWatch() {
	if s.groups != nil && s.groups.stop != nil {
		s.groups.stop()
	}
}

// closeRetiredGroups closes the replicas that retired (Shutdown, after the
// others).
func (s *Server) closeRetiredGroups() {
	if s.groups == nil {
		return
	}
	s.groups.mu.Lock()
	hs := s.groups.retiredH
	s.groups.retiredH = nil
	s.groups.mu.Unlock()
	for _, h := range hs {
		if err := h.Replica.Close(); err != nil {
			s.log.Error("close a retired replica", "err", err)
		}
	}
}

// syncGroups is one look at the map: new nodes taught, retired replicas
// dropped, replicas started for groups that now name this node. It reports
// true once the node itself retired.
func (s *Server) syncGroups(ctx context.Context) bool {
	gs := s.groups
	cm := s.multi.ClusterMap()
	if cm != nil && cm != gs.lastMap {
		gs.lastMap = cm
		s.learnNodes(mapNodesToMembers(cm.Nodes))
	}
	s.askMapIfLeaving(ctx)
	if lg, ok := s.multi.MetaHosted(); ok && lg.Hosted.Group.State().Retired {
		if s.retireMeta(lg) {
			return true
		}
	}
	for _, lg := range s.multi.Hosted() {
		if lg.Hosted.Group.State().Retired {
			if s.retireGroup(lg, 0) {
				return true
			}
		}
	}
	s.rejoinRetired()
	if cm == nil {
		return false
	}
	// Groups taken out of the map (kefir cluster remove-group): their
	// replicas retire here. Only by the map's Removed list: a hosted group
	// merely absent from this node's map may be one added after it.
	for _, lg := range s.multi.Hosted() {
		if slices.Contains(cm.Removed, uint64(lg.Spec.ID)) {
			if s.retireGroup(lg, cm.Epoch) {
				return true
			}
		}
	}
	// A chain member that the map removes (Leaving), or whose node the
	// map no longer has (remove-node took the node out after it left the
	// chain, and Leaving with it: leftMap), and that the chain's record no
	// longer names: out of the chain for good (its master never joins it
	// again), so it retires, as a VR replica its group left — and then the
	// node, if that was all it hosted (leavesMap).
	outOfMap := leftMap(cm, s.cfg.ReplicaID, &gs.namedAt)
	for _, lg := range s.multi.Hosted() {
		if g, ok := cm.Group(uint64(lg.Spec.ID)); ok && leftChain(g, s.cfg.ReplicaID, outOfMap) {
			if s.retireChainMember(lg, g) {
				return true
			}
		}
	}
	if leavesMap(cm, s.cfg.ReplicaID, &gs.namedAt, len(s.multi.Hosted()), s.multi.HostsMeta()) {
		return s.leaveMap(cm.Epoch)
	}
	s.recordMembersIfBehind(ctx, cm)
	s.followChainMasters(cm)
	s.startChainMasters(cm)
	hosted := map[cluster.GroupID]bool{}
	for _, lg := range s.multi.Hosted() {
		hosted[lg.Spec.ID] = true
	}
	hosted[cluster.MetaGroupID] = s.multi.HostsMeta()
	groups := append(slices.Clone(cm.Groups), kv.MapGroup{ID: uint64(cluster.MetaGroupID), Members: cm.MetaMembers()})
	for _, g := range groups {
		id := cluster.GroupID(g.ID)
		if !namedIn(&g, s.cfg.ReplicaID) || hosted[id] {
			continue
		}
		gs.mu.Lock()
		busy := gs.joining[id] || time.Now().Before(gs.next[id])
		if !busy {
			gs.joining[id] = true
		}
		gs.mu.Unlock()
		if busy {
			continue
		}
		rejoin := false
		if s.cfg.FS == nil {
			r, retired, err := readRetired(groupDir(s.cfg.DataDir, id))
			if err == nil && retired {
				gs.mu.Lock()
				_, open := gs.rejoinable[id]
				gs.mu.Unlock()
				rejoin = !open && s.mayRejoin(&g, r)
			}
			if err != nil || (retired && !rejoin) {
				// An old map (this node's replica of the metadata group
				// lags) may still name it, at the epoch it retired at or
				// an earlier one: never rejoin that (nor a removed group,
				// nor the metadata or a chain group). A replica still
				// open rejoins by itself (rejoinRetired).
				gs.mu.Lock()
				delete(gs.joining, id)
				gs.next[id] = time.Now().Add(time.Second)
				if _, open := gs.rejoinable[id]; !gs.logged[id] && !open {
					gs.logged[id] = true
					s.log.Warn("the map names this node in a group its replica retired from: not rejoining", "group", uint64(id), "map_epoch", cm.Epoch, "retired_at_epoch", r.Epoch, "err", err)
				}
				gs.mu.Unlock()
				continue
			}
		}
		members := slices.Clone(g.Members)
		join := s.joinGroup
		if rejoin {
			join = s.rejoinGroup
		} else if joiningChain(&g, s.cfg.ReplicaID) {
			metas := cm.MetaMembers()
			join = func(ctx context.Context, id cluster.GroupID, members []uint64) error {
				return s.joinChain(id, members, metas)
			}
		} else if created(g) {
			engine := g.Engine
			join = func(ctx context.Context, id cluster.GroupID, members []uint64) error {
				return s.createGroup(ctx, id, members, engine)
			}
		}
		gs.wg.Add(1)
		go func() {
			defer gs.wg.Done()
			err := join(ctx, id, members)
			gs.mu.Lock()
			delete(gs.joining, id)
			if err != nil {
				gs.next[id] = time.Now().Add(500 * time.Millisecond)
			}
			gs.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				s.log.Info("start a replica of a group the map names this node in", "group", uint64(id), "err", err)
			}
		}()
	}
	return false
}

// followChainMasters tells this node's chain members where their masters
// run now: the metadata group's members as map cm names them. Without it a
// member would send to the metadata members of its group's creation, and
// after a replace-node or remove-node of one of them the acting master
// (the new metadata leader's) would hear no member and fail them all.
func (s *Server) followChainMasters(cm *kv.ClusterMap) {
	meta := cm.MetaMembers()
	for _, lg := range s.multi.Hosted() {
		if f, ok := lg.Hosted.Replica.(cluster.ChainMastersFollower); ok {
			f.SetChainMasters(meta)
		}
	}
}

// startChainMasters starts, at a node hosting a replica of the metadata
// group, the hosted master of every chain group of map cm it does not run
// yet (docs/design/chain.md "A chain in a cluster of groups"): one per
// chain group at every metadata node, acting only at the metadata leader,
// the chain's record in the metadata group. A node that is a member of the
// chain starts it once its member is open (the master speaks through the
// member's endpoint; before, it would take the group's place on the
// transport).
func (s *Server) startChainMasters(cm *kv.ClusterMap) {
	gs := s.groups
	meta, ok := s.multi.MetaHosted()
	if !ok || meta.Hosted.Group.State().Retired {
		// No metadata replica here (any more: it retired, replaced by
		// kefir cluster replace-node): its masters stop with it.
		for id, m := range gs.masters {
			s.stopChainMaster(id, m)
		}
		return
	}
	for id, m := range gs.masters {
		if slices.Contains(cm.Removed, uint64(id)) {
			// A chain group taken out of the map (kefir cluster
			// remove-group): no member to master any more.
			s.stopChainMaster(id, m)
		}
	}
	host, ok := meta.Hosted.Group.(cluster.ChainMasterHost)
	if !ok {
		return
	}
	var local map[cluster.GroupID]shard.Replica
	for _, g := range cm.Groups {
		id := cluster.GroupID(g.ID)
		if _, runs := gs.masters[id]; !g.IsChain() || runs || time.Now().Before(gs.next[id]) {
			continue
		}
		if local == nil {
			local = map[cluster.GroupID]shard.Replica{}
			for _, lg := range s.multi.Hosted() {
				local[lg.Spec.ID] = lg.Hosted.Replica
			}
		}
		spec := cluster.ChainMasterSpec{Group: id, Members: slices.Clone(g.Members), Transport: s.peerTr,
			Logger: s.log.With("component", "chain-master", "group", g.ID)}
		// By whether it hosts a member, not by the map: the map follows
		// the chain's record, which leaves out a member while it is
		// failed (and this node's member may run meanwhile).
		if spec.Local = local[id]; spec.Local == nil && namedIn(&g, s.cfg.ReplicaID) {
			continue // its member is not open yet
		}
		m, err := host.HostChainMaster(spec)
		if err != nil {
			gs.mu.Lock()
			gs.next[id] = time.Now().Add(time.Second)
			gs.mu.Unlock()
			s.log.Warn("start the hosted master of a chain group", "group", g.ID, "err", err)
			continue
		}
		gs.mu.Lock()
		gs.masters[id] = m
		gs.mu.Unlock()
		s.log.Info("hosting the master of a chain group", "group", g.ID, "members", g.Members)
	}
}

// stopChainMaster stops this node's master of chain group id (the watch's
// goroutine).
func (s *Server) stopChainMaster(id cluster.GroupID, m cluster.HostedChainMaster) {
	s.groups.mu.Lock()
	delete(s.groups.masters, id)
	s.groups.mu.Unlock()
	m.Stop()
}

// groupMaster is this node's running master of chain group id of the
// cluster's map, if it runs one (a node of the metadata group).
func (s *Server) groupMaster(id cluster.GroupID) (cluster.HostedChainMaster, bool) {
	if s.groups == nil {
		return nil, false
	}
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	m, ok := s.groups.masters[id]
	return m, ok
}

// askMapIfLeaving: a replica here that is leaving its group must reach the
// group's new members (it hands them the epoch's start state and retires
// once they have it), whose addresses a node that was down through the
// change may not know: its own map (its metadata replica's, if it is itself
// leaving) is stale. Every half second meanwhile the node asks the other
// nodes for the metadata leader's map and learns its nodes.
func (s *Server) askMapIfLeaving(ctx context.Context) {
	gs := s.groups
	leaving := false
	hosted := s.multi.Hosted()
	if lg, ok := s.multi.MetaHosted(); ok {
		hosted = append(hosted, lg)
	}
	for _, lg := range hosted {
		if st := lg.Hosted.Group.State(); st.Leaving && !st.Retired {
			leaving = true
		}
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if !leaving || gs.asking || time.Since(gs.asked) < 500*time.Millisecond {
		return
	}
	gs.asked = time.Now()
	var seeds []string
	for _, n := range s.multi.Nodes() {
		if n.ID != s.cfg.ReplicaID && n.ClientAddr != "" {
			seeds = append(seeds, n.ClientAddr)
		}
	}
	s.goMeta(&gs.asking, seeds, func(mv *cluster.Mover) {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		cm, err := mv.MetaMap(cctx)
		if err != nil {
			s.log.Info("a replica here is leaving its group: ask the cluster for its map (the new members' addresses)", "err", err)
			return
		}
		s.learnNodes(mapNodesToMembers(cm.Nodes))
	})
}

// goMeta runs call in the background (until Shutdown's wait) with a Mover
// that reaches the metadata group through seeds (client addresses;
// redirects followed): the shape of every call this watcher makes to the
// cluster without blocking its poll. busy (a field of s.groups, whose mu
// the caller holds) is set until call returns, so that one call of each
// kind is in flight at a time; with no seed, nothing is called.
func (s *Server) goMeta(busy *bool, seeds []string, call func(mv *cluster.Mover)) {
	gs := s.groups
	*busy = true
	gs.wg.Add(1)
	go func() {
		defer gs.wg.Done()
		defer func() { gs.mu.Lock(); *busy = false; gs.mu.Unlock() }()
		if len(seeds) == 0 {
			return
		}
		mv := s.nodeMover(seeds)
		defer mv.Close()
		call(mv)
	}()
}

// nodeMover is a Mover of this node's own calls to the cluster through
// seeds (client addresses), with the node's password and, if the client
// port speaks TLS, the cluster certificate check the metadata follower
// uses (nodeTLS).
func (s *Server) nodeMover(seeds []string) *cluster.Mover {
	return &cluster.Mover{Seeds: seeds, Password: s.cfg.Password, TLS: s.nodeTLS(), RetryFor: time.Second}
}

// recordMembersIfBehind: a group this node leads whose configuration is of
// a later epoch than the map records (a reconfiguration whose recorder —
// kefir cluster replace-node — died before SETMEMBERS) is recorded by its
// leader, at most once a second per group: the map follows each group
// without a rerun of the command. The same compare-and-set op: a stale
// record (a leader deposed meanwhile) is refused.
func (s *Server) recordMembersIfBehind(ctx context.Context, cm *kv.ClusterMap) {
	gs := s.groups
	hosted := s.multi.Hosted()
	if lg, ok := s.multi.MetaHosted(); ok {
		hosted = append(hosted, lg)
	}
	var todo []kv.MapMembers
	for _, lg := range hosted {
		rc, ok := lg.Hosted.Group.(cluster.Reconfigurable)
		if !ok || !lg.Hosted.Group.State().IsLeader {
			continue
		}
		m := rc.Membership()
		recorded := cm.MetaEpoch
		if lg.Spec.ID != cluster.MetaGroupID {
			g, ok := cm.Group(uint64(lg.Spec.ID))
			if !ok || g.IsChain() {
				continue // a chain's members follow its record (kv)
			}
			recorded = g.MemberEpoch
		}
		if m.Epoch > recorded {
			todo = append(todo, kv.MapMembers{Group: uint64(lg.Spec.ID), Epoch: m.Epoch, Members: m.Members})
		}
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if len(todo) == 0 || gs.recording {
		return
	}
	now := time.Now()
	todo = slices.DeleteFunc(todo, func(mm kv.MapMembers) bool { return now.Sub(gs.recorded[cluster.GroupID(mm.Group)]) < time.Second })
	if len(todo) == 0 {
		return
	}
	for _, mm := range todo {
		gs.recorded[cluster.GroupID(mm.Group)] = now
	}
	s.goMeta(&gs.recording, s.metaSeeds(), func(mv *cluster.Mover) {
		for _, mm := range todo {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			e, err := mv.SetMembers(cctx, cluster.GroupID(mm.Group), mm.Epoch, mm.Members)
			cancel()
			if err != nil {
				s.log.Info("record a group's members in the map (its leader's epoch is ahead of the map's)", "group", mm.Group, "epoch", mm.Epoch, "err", err)
				continue
			}
			s.log.Info("recorded a group's members in the map (the map was behind the group)", "group", mm.Group, "epoch", mm.Epoch, "members", mm.Members, "map_epoch", e)
		}
	})
}

// metaSeeds are the client addresses of the metadata group's members as
// this node knows them.
func (s *Server) metaSeeds() []string {
	var seeds []string
	for _, id := range s.multi.MetaMembers() {
		if n, ok := s.multi.Node(id); ok && n.ClientAddr != "" {
			seeds = append(seeds, n.ClientAddr)
		}
	}
	return seeds
}

// learnNodes teaches the node the map's nodes: the peer transport (a node
// added after this one started), the router's and Multi's addresses, and
// every hosted replica (its redirects name the leader's client address).
func (s *Server) learnNodes(ns []Member) {
	for _, n := range ns {
		if n.ID == s.cfg.ReplicaID || n.PeerAddr == "" || s.peerTr.HasPeer(n.ID) {
			continue
		}
		if err := s.peerTr.AddPeer(n.ID, n.PeerAddr); err != nil {
			s.log.Error("add a node of the map to the peer transport", "node", n.ID, "err", err)
		}
	}
	s.multi.SetNodes(ns)
	s.router.SetMembers(s.multi.Nodes())
	for _, lg := range s.multi.Hosted() {
		if rc, ok := lg.Hosted.Group.(cluster.Reconfigurable); ok {
			if err := rc.SetAddrs(ns); err != nil {
				s.log.Error("teach a replica the map's nodes", "group", uint64(lg.Spec.ID), "err", err)
			}
		}
	}
}

// retireGroup records that this node's replica of lg retired and takes it
// out of the routing: the group no longer has it as a member (VR retired
// it), or, removedAt > 0, the group was taken out of the cluster map at
// that map epoch (kefir cluster remove-group). It reports true if VR
// retired the node's last replica (no metadata replica either): the node
// retires as a whole. A node whose last group was removed does not: the
// map still lists it as a node, and it stays up, empty (noteEmpty).
//
// A removed group's replica is also stopped and its data (group-g/vr/)
// deleted at once; group-g/ is kept with the retired record, which is
// what keeps a restart from opening the group again (its --groups or
// kefir-join.json still name it) and the map from giving the id to a new
// group (kv's Removed). Deleted rather than moved aside: the group owned
// no slot when it was removed (every key of it was moved to another group
// and purged here), so what is left is its log and reserved records,
// which nothing reads again. The one replica whose engine is the node's
// own handle (INFO, metrics, DBSIZE read it: the first group it opened)
// is closed at shutdown like a VR-retired one, and its vr/ deleted at the
// next start (openGroups).
//
// A VR replica's retirement (removedAt 0) is not recorded while its
// configuration names this node: a later epoch named it again (VR's
// start-epoch, adopted by the retired replica, which stays open) between
// syncGroups' look at its State and this read. The record would carry
// that epoch, the replica would leave the routing, and neither
// rejoinRetired nor a restart's mayRejoin (both want an epoch later than
// the record's) would take it back until a still later one; the watcher
// looks again at the next poll instead. A chain member that left its
// chain is not a VR retirement: its configuration (the member list it
// opened with) still names the node, and the chain's "named again" is
// the map's (leftChain) — retireChainMember records it through
// retireReplica.
func (s *Server) retireGroup(lg cluster.LocalGroup, removedAt uint64) bool {
	m := membershipOf(lg)
	if removedAt == 0 && slices.Contains(m.Members, s.cfg.ReplicaID) {
		return false
	}
	return s.retireReplica(lg, m, removedAt)
}

// membershipOf is hosted group lg's durable configuration (none: a
// replica that does not reconfigure).
func membershipOf(lg cluster.LocalGroup) cluster.Membership {
	if rc, ok := lg.Hosted.Group.(cluster.Reconfigurable); ok {
		return rc.Membership()
	}
	return cluster.Membership{}
}

// retireReplica is retireGroup without the VR guard: lg's retirement is
// recorded with configuration m (the record's epoch and members) whatever
// m says.
func (s *Server) retireReplica(lg cluster.LocalGroup, m cluster.Membership, removedAt uint64) bool {
	gs := s.groups
	id := lg.Spec.ID
	dir := groupDir(s.cfg.DataDir, id)
	r := retiredRecord{Cluster: s.cfg.ClusterID, Replica: s.cfg.ReplicaID, Epoch: m.Epoch, Members: m.Members, RemovedAt: removedAt}
	if s.cfg.FS == nil {
		if _, err := os.Stat(filepath.Join(dir, retiredFile)); err != nil {
			b, _ := json.Marshal(r)
			if err := vfs.WriteFileDurably(vfs.Default, dir, filepath.Join(dir, retiredFile), b); err != nil {
				s.log.Error("record the replica's retirement", "group", uint64(id), "err", err)
				return false
			}
		}
	}
	if rc, ok := lg.Hosted.Group.(cluster.Reconfigurable); ok && removedAt == 0 && id != cluster.MetaGroupID {
		gs.mu.Lock()
		gs.rejoinable[id] = retiredReplica{lg: lg, rc: rc, epoch: m.Epoch}
		gs.mu.Unlock()
	}
	if removedAt > 0 {
		gs.mu.Lock()
		delete(gs.rejoinable, id) // a removed group never takes it back
		gs.mu.Unlock()
	}
	// A removed group's replica leaves even as the node's last: the node
	// stays up, empty (noteEmpty). A VR replica's retirement from the
	// node's last group keeps it hosted: the node stops, or stays up for
	// its metadata replica, below.
	if h, ok := s.multi.RemoveGroup(id, removedAt == 0); ok {
		if removedAt > 0 && h.Engine != s.db {
			if err := h.Replica.Close(); err != nil {
				s.log.Error("stop the replica of a removed group", "group", uint64(id), "err", err)
			}
			if s.cfg.FS == nil {
				if err := os.RemoveAll(filepath.Join(dir, "vr")); err != nil {
					s.log.Error("delete the data of a removed group's replica", "group", uint64(id), "err", err)
				}
			}
			s.log.Warn("the group was removed from the cluster map: stopped this node's replica of it and deleted its data", "group", uint64(id), "map_epoch", removedAt, "dir", dir)
			s.noteEmpty(removedAt)
			return false
		}
		gs.mu.Lock()
		gs.retiredH = append(gs.retiredH, h)
		gs.mu.Unlock()
		if removedAt > 0 {
			s.log.Warn("the group was removed from the cluster map: stopped routing to this node's replica of it; it is closed at shutdown and its data deleted at the next start", "group", uint64(id), "map_epoch", removedAt)
			s.noteEmpty(removedAt)
			return false
		}
		s.log.Warn("this node's replica of a group retired: the group no longer has it as a member; stopped routing to it", "group", uint64(id), "epoch", m.Epoch, "members", m.Members)
		return false
	}
	if removedAt > 0 {
		return false // not hosted (any more): nothing to stop
	}
	if s.multi.HostsMeta() {
		gs.mu.Lock()
		if !gs.logged[id] {
			gs.logged[id] = true
			s.log.Warn("this node's last data group's replica retired; the node stays up for its metadata replica", "group", uint64(id), "epoch", m.Epoch, "members", m.Members)
		}
		gs.mu.Unlock()
		return false
	}
	return s.retireNode(r, id)
}

// retireNode records that the node retired as a whole (r: the record of
// its last replica to retire, of group id) and stops it: every group took
// it out.
func (s *Server) retireNode(r retiredRecord, id cluster.GroupID) bool {
	return s.stopRetired(r, fmt.Errorf("%w: replica %d left every group it hosted (cluster %d; the last, group %d, at epoch %d with members %v). %s is kept as it was and the node does not rejoin; to make this machine a node again wipe --dir and start it as a new one (kefir server --join, then kefir cluster replace-node)",
		ErrRetired, s.cfg.ReplicaID, s.cfg.ClusterID, id, r.Epoch, r.Members, s.cfg.DataDir),
		"every replica of this node retired: stopping", "group", uint64(id))
}

// stopRetired stops the node as retired, once: it records r as the node's
// retirement (a restart then refuses: CheckRetired; kefir up leaves it
// down), logs why, and ends the node with retErr. retireNode and leaveMap
// are its two reasons.
func (s *Server) stopRetired(r retiredRecord, retErr error, why string, attrs ...any) bool {
	gs := s.groups
	gs.once.Do(func() {
		if s.cfg.FS == nil {
			b, _ := json.Marshal(r)
			if err := vfs.WriteFileDurably(vfs.Default, s.cfg.DataDir, filepath.Join(s.cfg.DataDir, retiredFile), b); err != nil {
				s.log.Error("record the node's retirement", "err", err)
			}
		}
		gs.retErr = retErr
		s.log.Warn(why, attrs...)
		close(gs.retired)
	})
	return true
}

// leftMap reports whether cm takes node self out of the map, given
// *namedAt, the highest epoch of a map seen naming it, which it raises
// when cm names it. A map that does not name the node is its removal only
// at a later epoch: a map's epoch never goes down along the metadata
// group's log, so one at or below namedAt may predate the node's addition
// — the first map a restarted node polls can come from a metadata leader
// just elected, whose commit point is behind the addition it has in its
// log, or from one cut off that does not know it was replaced.
func leftMap(cm *kv.ClusterMap, self uint64, namedAt *uint64) bool {
	if len(cm.Nodes) == 0 {
		return false // a map of before the node list: nodes by their groups
	}
	if slices.Contains(cm.NodeIDs(), self) {
		*namedAt = max(*namedAt, cm.Epoch)
		return false
	}
	return cm.Epoch > *namedAt
}

// leavesMap reports whether node self, hosting hosted data replicas and
// (hostsMeta) a metadata replica, retires as a whole on map cm: taken out
// of the map (kefir cluster remove-node of a node that hosts nothing; the
// map refuses it for a node a group has: leftMap) and only once it hosts
// nothing here too. A replica the map no longer names retires first, by
// its own group's change (VR's Retired: its successors hold the state); a
// node that left the map with a replica still open — a data one, or the
// metadata group's, which may hold the only copy of the map's last
// changes — would stop it before its group is done with it.
func leavesMap(cm *kv.ClusterMap, self uint64, namedAt *uint64, hosted int, hostsMeta bool) bool {
	return leftMap(cm, self, namedAt) && hosted == 0 && !hostsMeta
}

// leaveMap retires the node as a whole: the map, at epoch, no longer has
// it (kefir cluster remove-node took it out, hosting nothing). Its record
// makes a restart refuse (CheckRetired) and kefir up leave it down.
func (s *Server) leaveMap(epoch uint64) bool {
	r := retiredRecord{Cluster: s.cfg.ClusterID, Replica: s.cfg.ReplicaID, LeftMapAt: epoch}
	return s.stopRetired(r, r.err(s.cfg.DataDir), "this node was taken out of the cluster map: stopping", "map_epoch", epoch)
}

// noteEmpty logs, once the node's last group was removed from the map (at
// map epoch removedAt), that the node goes on empty: it is still a node of
// the map, serving (it forwards or redirects every request and answers
// CLUSTER commands), and takes part in a group the map names it in later
// (add-group --members, a placed replace-node) as any node does.
func (s *Server) noteEmpty(removedAt uint64) {
	if len(s.multi.Hosted()) > 0 {
		return
	}
	s.emptiedByRemoval = true
	s.log.Warn("this node hosts no group now (its last was removed from the cluster map): it stays up, empty, serving and following the map, until the map names it in a group again", "map_epoch", removedAt, "metadata_replica", s.multi.HostsMeta())
}

// retireMeta records that this node's replica of the metadata group
// retired and stops following the map through it (the node polls the
// group's leader from then on). It reports true if the node has nothing
// left to host (no data replica either).
func (s *Server) retireMeta(lg cluster.LocalGroup) bool {
	gs := s.groups
	dir := groupDir(s.cfg.DataDir, cluster.MetaGroupID)
	m := membershipOf(lg)
	if s.cfg.FS == nil {
		r := retiredRecord{Cluster: s.cfg.ClusterID, Replica: s.cfg.ReplicaID, Epoch: m.Epoch, Members: m.Members}
		b, _ := json.Marshal(r)
		if err := vfs.WriteFileDurably(vfs.Default, dir, filepath.Join(dir, retiredFile), b); err != nil {
			s.log.Error("record the metadata replica's retirement", "err", err)
			return false
		}
	}
	if h, ok := s.multi.UnhostMeta(); ok {
		gs.mu.Lock()
		gs.retiredH = append(gs.retiredH, h)
		gs.mu.Unlock()
	}
	s.log.Warn("this node's replica of the metadata group retired: the group no longer has it as a member; following the map by polling", "epoch", m.Epoch, "members", m.Members)
	hosted := s.multi.Hosted()
	if len(hosted) == 0 {
		if s.emptiedByRemoval {
			return false // an empty node (its groups were removed) stays up
		}
		// Its last data replica retired (VR) before a restart, which
		// opened the node with its metadata replica only: with that gone
		// too, every group took the node out, as when it had stayed up.
		return s.retireNode(retiredRecord{Cluster: s.cfg.ClusterID, Replica: s.cfg.ReplicaID, Epoch: m.Epoch, Members: m.Members}, cluster.MetaGroupID)
	}
	for _, lg := range hosted {
		if !lg.Hosted.Group.State().Retired {
			return false
		}
	}
	return s.retireGroup(hosted[0], 0)
}

// groupSlots is a group's slot ranges as a replica's identity records them.
func groupSlots(id cluster.GroupID, rs []cluster.SlotRange) string {
	_, slots, _ := strings.Cut(cluster.FormatGroups([]cluster.GroupSpec{{ID: id, Slots: rs}}), ":")
	return slots
}

// readGroupJoin reads a group directory's joinFile (ok false: none).
func readGroupJoin(dir string) (joinRecord, bool, error) {
	var jr joinRecord
	ok, err := readRecord(dir, joinFile, &jr)
	return jr, ok, err
}

// readRecord reads JSON record file name of directory dir into v (ok
// false: there is none).
func readRecord(dir, name string, v any) (bool, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("server: read %s: %w", p, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("server: %s is corrupt: %w", p, err)
	}
	return true, nil
}

// writeGroupJoin records jr as the joinFile of group directory dir,
// durably, creating dir.
func writeGroupJoin(dir string, jr joinRecord) error {
	b, err := json.Marshal(jr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("server: create %s: %w", dir, err)
	}
	if err := vfs.WriteFileDurably(vfs.Default, dir, filepath.Join(dir, joinFile), b); err != nil {
		return fmt.Errorf("server: write %s: %w", filepath.Join(dir, joinFile), err)
	}
	return nil
}

// joinGroup starts this node's replica of group id, which the map names
// it in (members): the group's configuration, from its members, must name
// it too; it is recorded in the group's directory before the replica opens
// (a restart opens it from there), and the replica pulls the state.
func (s *Server) joinGroup(ctx context.Context, id cluster.GroupID, members []uint64) error {
	gc, err := s.groupConfig(ctx, id, members)
	if err != nil {
		return err
	}
	jr, err := s.groupJoinRecord(id, gc)
	if err != nil {
		return err
	}
	dir := groupDir(s.cfg.DataDir, id)
	if s.cfg.FS == nil {
		if _, err := os.Stat(filepath.Join(dir, "vr")); err == nil {
			if _, ok, _ := readGroupJoin(dir); !ok {
				return fmt.Errorf("%w: %s holds a replica already, not one this node joined with; move it away to let the node join group %d", ErrStaleConfig, dir, id)
			}
		}
		if err := writeGroupJoin(dir, jr); err != nil {
			return err
		}
	}
	lg, err := s.openJoinedGroup(s.peerTr, id, jr, false)
	if err != nil {
		return err
	}
	add := s.multi.AddGroup
	if id == cluster.MetaGroupID {
		add = func(lg cluster.LocalGroup) error { return s.multi.HostMeta(lg.Hosted, nil) }
	}
	if err := add(lg); err != nil {
		_ = lg.Hosted.Replica.Close()
		return err
	}
	s.log.Info("named by the map in a group: joined it as a new member", "group", uint64(id), "config", gc.String())
	return nil
}

// groupConfig asks group id's other members (members, as the map names
// them) for its configuration, which must name this node and be of its
// cluster.
func (s *Server) groupConfig(ctx context.Context, id cluster.GroupID, members []uint64) (cluster.GroupConfig, error) {
	var seeds []string
	for _, m := range members {
		if m == s.cfg.ReplicaID {
			continue
		}
		if n, ok := s.multi.Node(m); ok && n.ClientAddr != "" {
			seeds = append(seeds, n.ClientAddr)
		}
	}
	if len(seeds) == 0 {
		return cluster.GroupConfig{}, fmt.Errorf("no other member of group %d has a known address", id)
	}
	mv := s.nodeMover(seeds)
	defer mv.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gc, err := mv.GroupConfigOf(cctx, id)
	if err != nil {
		return cluster.GroupConfig{}, err
	}
	if !slices.Contains(gc.Members, s.cfg.ReplicaID) {
		return cluster.GroupConfig{}, fmt.Errorf("group %d's configuration (%s) does not name this node yet", id, gc)
	}
	if gc.Cluster != s.cfg.ClusterID {
		return cluster.GroupConfig{}, fmt.Errorf("%w: group %d is of cluster %d, this node of cluster %d", ErrStaleConfig, id, gc.Cluster, s.cfg.ClusterID)
	}
	return gc, nil
}

// slotsOf is group id's slot ranges in sm (none: not a group of it).
func slotsOf(sm *cluster.SlotMap, id cluster.GroupID) []cluster.SlotRange {
	if spec, ok := sm.Group(id); ok {
		return spec.Slots
	}
	return nil
}

// namedIn reports whether map entry g has node id as a member, or, a
// chain, as a node the map wants it to join (Joining).
func namedIn(g *kv.MapGroup, id uint64) bool {
	return slices.Contains(g.Members, id) || joiningChain(g, id)
}

// joiningChain reports whether map entry g is a chain the map wants node
// id to join (KindMapChainWant) and does not have it as a member yet.
func joiningChain(g *kv.MapGroup, id uint64) bool {
	return g.IsChain() && slices.Contains(g.Joining, id) && !slices.Contains(g.Members, id)
}

// leftChain reports whether map entry g is a chain that node id left as
// the map wants: removed (Leaving) or, outOfMap, taken out of the map
// with its Leaving entry (leftMap: the map's epoch is above every map
// seen naming the node), and no longer a member of the chain's record,
// which the map's members follow.
func leftChain(g *kv.MapGroup, id uint64, outOfMap bool) bool {
	return g.IsChain() && (slices.Contains(g.Leaving, id) || outOfMap) && !slices.Contains(g.Members, id) && !slices.Contains(g.Joining, id)
}

// joinChain starts this node's member of chain group id, which the map
// wants it to join (docs/design/chain.md "A chain in a cluster of groups"):
// the record (engine chain, not created, members the chain's of the map
// and this node, masters the metadata group's members) is written to the
// group's directory, then the member opens without bootstrap: an empty
// joiner, whose heartbeats ask the acting master to join it (pre-copy from
// the tail, then FLUSH links it in before the tail). Unlike a VR group's
// new member there is nothing to ask the group first: the chain's
// membership is its master's, which joins a node that asks.
func (s *Server) joinChain(id cluster.GroupID, members, metas []uint64) error {
	dir := groupDir(s.cfg.DataDir, id)
	jr, ok, err := joinRecord{}, false, error(nil)
	if s.cfg.FS == nil {
		if jr, ok, err = readGroupJoin(dir); err != nil {
			return err
		}
	}
	if !ok {
		ms := make([]Member, 0, len(members)+1)
		for _, mid := range append(slices.Clone(members), s.cfg.ReplicaID) {
			n, known := s.multi.Node(mid)
			if !known || n.PeerAddr == "" {
				return fmt.Errorf("chain group %d's node %d has no known address", id, mid)
			}
			ms = append(ms, n)
		}
		jr = chainJoinRecord(s.cfg.ClusterID, s.cfg.ReplicaID, id, ms, slotsOf(s.multi.Slots(), id), metas)
		if s.cfg.FS == nil {
			if _, err := os.Stat(filepath.Join(dir, "vr")); err == nil {
				return fmt.Errorf("%w: %s holds a replica already, not one this node joined with; move it away to let the node join chain group %d", ErrStaleConfig, dir, id)
			}
			if err := writeGroupJoin(dir, jr); err != nil {
				return err
			}
		}
	}
	if m, ok := s.groupMaster(id); ok {
		// This node's master of the chain registered the group on the
		// transport (no member here): the member takes its place, and
		// the master starts again speaking through it (startChainMasters).
		s.stopChainMaster(id, m)
	}
	lg, err := s.openJoinedGroup(s.peerTr, id, jr, false)
	if err != nil {
		return err
	}
	if err := s.multi.AddGroup(lg); err != nil {
		_ = lg.Hosted.Replica.Close()
		return err
	}
	s.log.Info("the map wants this node in a chain group: opened an empty member, which the chain's master joins", "group", uint64(id), "members", jr.Members)
	return nil
}

// chainJoinRecord is the joinFile of node self's member of chain group id
// that the map wants it to join: the chain's members and the node (ms), the
// group's slots, the metadata members where its masters run; engine chain,
// not Created (never bootstrapped: an empty joiner).
func chainJoinRecord(clusterID, self uint64, id cluster.GroupID, ms []Member, rs []cluster.SlotRange, metas []uint64) joinRecord {
	return joinRecord{Cluster: clusterID, Replica: self, Members: FormatMembers(ms), Slots: groupSlots(id, rs),
		Engine: kv.EngineChain, ChainMasters: slices.Clone(metas)}
}

// retireChainMember retires this node's member of chain group lg, which
// left the chain as the map wants (leftChain): recorded as retired (never
// opened again), out of the routing, and closed unless it is the node's
// engine handle. This node's master of the chain, which may speak through
// the member, is stopped first; it starts again on its own registration
// (startChainMasters). It reports true if the node retired (it hosted
// nothing else).
func (s *Server) retireChainMember(lg cluster.LocalGroup, g *kv.MapGroup) bool {
	id := lg.Spec.ID
	if len(s.multi.Hosted()) == 1 && s.multi.HostsMeta() {
		// Its last group, beside a metadata replica: it stays up (and its
		// master with it), as retireReplica says once.
		return s.retireReplica(lg, membershipOf(lg), 0)
	}
	if m, ok := s.groupMaster(id); ok {
		s.stopChainMaster(id, m)
	}
	s.log.Warn("the map removes this node from a chain group and the chain no longer has it: its member retires", "group", g.ID, "chain", g.Members)
	gone := s.retireReplica(lg, membershipOf(lg), 0)
	if gone {
		return true
	}
	gs := s.groups
	gs.mu.Lock()
	delete(gs.rejoinable, lg.Spec.ID) // a chain member never takes part again
	var h *cluster.Hosted
	if n := len(gs.retiredH); n > 0 && gs.retiredH[n-1].Replica == lg.Hosted.Replica && lg.Hosted.Engine != s.db {
		h = &gs.retiredH[n-1]
		gs.retiredH = gs.retiredH[:n-1]
	}
	gs.mu.Unlock()
	if h != nil {
		// Closed now: an open member would go on asking the masters to
		// join it (refused) until the node stops.
		if err := h.Replica.Close(); err != nil {
			s.log.Error("close a retired chain member", "group", g.ID, "err", err)
		}
	}
	return false
}

// created reports whether the map's entry g is a group whose first members
// start it from the map's record (kefir cluster add-group): a data group at
// member epoch 0. A group of --groups at epoch 0 names only nodes that
// opened it from their flags at their first start, so a node that does not
// host it and is named in it can only be one of an added group's first
// members (a node that lost its replica of a static group starts from its
// flags, never here; a retired one is skipped before). Once the group was
// reconfigured (epoch 1 or more) a member named in it joins by pulling the
// state from the others, as any new member.
func created(g kv.MapGroup) bool {
	return g.MemberEpoch == 0 && g.ID != uint64(cluster.MetaGroupID)
}

// chainMasters is where the hosted masters of map group g run, if it is a
// chain: the metadata group's members.
func chainMasters(g *kv.MapGroup, cm *kv.ClusterMap) []uint64 {
	if !g.IsChain() {
		return nil
	}
	return slices.Clone(cm.MetaMembers())
}

// createGroup starts this node's replica of group id, one of the group's
// first members (members, the map's record, in leader order): the record
// (the members with the map's addresses, Created) is written to the group's
// directory durably, then the replica opens with VR's first view from the
// list and an empty state — the same on every first member, so each
// bootstraps once, from the same list, and no one waits for a state nobody
// has. A directory that holds a replica already is opened as it is (a start
// that failed after its record) and never bootstrapped again: bootstrap
// happens only where vr/ does not exist yet.
func (s *Server) createGroup(ctx context.Context, id cluster.GroupID, members []uint64, engine string) error {
	dir := groupDir(s.cfg.DataDir, id)
	jr, ok, err := joinRecord{}, false, error(nil)
	if s.cfg.FS == nil {
		if jr, ok, err = readGroupJoin(dir); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(dir, "vr")); err == nil && !ok {
			return fmt.Errorf("%w: %s holds a replica already, not one this node created; move it away to let the node start group %d", ErrStaleConfig, dir, id)
		}
	}
	if !ok {
		// The map this node follows may lag (its metadata replica, or its
		// poll): a group reconfigured since would be bootstrapped at a
		// configuration it left. The metadata leader's map decides.
		if err := s.checkCreated(ctx, id, members, engine); err != nil {
			return err
		}
		ms := make([]Member, 0, len(members))
		for _, mid := range members {
			n, known := s.multi.Node(mid)
			if !known || n.PeerAddr == "" {
				return fmt.Errorf("group %d's member %d has no known address", id, mid)
			}
			ms = append(ms, n)
		}
		jr = joinRecord{Cluster: s.cfg.ClusterID, Replica: s.cfg.ReplicaID, Members: FormatMembers(ms), Slots: groupSlots(id, nil), Created: true, Engine: engine}
		if engine == kv.EngineChain {
			jr.ChainMasters = s.multi.MetaMembers()
		}
		if s.cfg.FS == nil {
			if err := writeGroupJoin(dir, jr); err != nil {
				return err
			}
		}
	}
	if !jr.Created {
		return fmt.Errorf("%w: %s records a replica that joined group %d, not one of its first members", ErrStaleConfig, dir, id)
	}
	lg, err := s.openJoinedGroup(s.peerTr, id, jr, s.firstOpen(jr, dir))
	if err != nil {
		return err
	}
	if err := s.multi.AddGroup(lg); err != nil {
		_ = lg.Hosted.Replica.Close()
		return err
	}
	s.log.Info("named by the map in a new group: started it as one of its first members", "group", uint64(id), "members", jr.Members)
	return nil
}

// checkCreated asks the metadata group's leader whether group id is still
// at its first configuration, members, naming this node.
func (s *Server) checkCreated(ctx context.Context, id cluster.GroupID, members []uint64, engine string) error {
	mv := s.nodeMover(s.metaSeeds())
	defer mv.Close()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cm, err := mv.MetaMap(cctx)
	if err != nil {
		return fmt.Errorf("start group %d: the metadata leader's map: %w", id, err)
	}
	g, ok := cm.Group(uint64(id))
	if !ok || !created(*g) || !slices.Equal(g.Members, members) || !slices.Contains(g.Members, s.cfg.ReplicaID) || g.Engine != engine {
		return fmt.Errorf("start group %d: the metadata leader's map (epoch %d) no longer has it at its first members %v naming this node: %+v", id, cm.Epoch, members, g)
	}
	return nil
}

// firstOpen reports whether a replica of a new group (jr.Created) in dir
// opens for the first time, so bootstraps: its record does not say it
// bootstrapped (jr.Opened) and its vr/ directory does not exist yet (a
// start that died between the replica's first open and the record's
// update finds vr/). (An in-memory FS never bootstraps a created group: it
// has no record either.)
func (s *Server) firstOpen(jr joinRecord, dir string) bool {
	if !jr.Created || jr.Opened || s.cfg.FS != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "vr"))
	return errors.Is(err, os.ErrNotExist)
}

// groupJoinRecord is the joinFile of a new member of group id whose
// configuration is gc, the members' addresses from the map.
func (s *Server) groupJoinRecord(id cluster.GroupID, gc cluster.GroupConfig) (joinRecord, error) {
	ms := make([]Member, 0, len(gc.Members))
	for _, mid := range gc.Members {
		n, ok := s.multi.Node(mid)
		if !ok {
			n, ok = gc.Addr(mid)
		}
		if !ok || n.PeerAddr == "" {
			return joinRecord{}, fmt.Errorf("group %d's member %d has no known address", id, mid)
		}
		ms = append(ms, n)
	}
	var rs []cluster.SlotRange
	if spec, ok := s.multi.Slots().Group(id); ok {
		rs = spec.Slots
	}
	return joinRecord{Cluster: gc.Cluster, Replica: s.cfg.ReplicaID, Members: FormatMembers(ms), Epoch: gc.Epoch,
		Start: gc.Start, Previous: gc.Previous, Slots: groupSlots(id, rs)}, nil
}

// openJoinedGroup opens this node's replica of group id as its joinFile
// jr records it, on the node's transport tr: a new member's configuration
// (Membership.Apply, no bootstrap), or for one of a new group's first
// members (jr.Created) the group's first configuration, bootstrapped if
// bootstrap (its first open).
func (s *Server) openJoinedGroup(tr *transport.Transport, id cluster.GroupID, jr joinRecord, bootstrap bool) (cluster.LocalGroup, error) {
	cfg := s.cfg
	ms, err := ParseMembers(jr.Members)
	if err != nil {
		return cluster.LocalGroup{}, fmt.Errorf("server: group %d's %s: %w", id, joinFile, err)
	}
	var rs []cluster.SlotRange
	if jr.Slots != "" {
		gs, err := cluster.ParseGroups(fmt.Sprintf("%d=%d:%s", id, cfg.ReplicaID, jr.Slots))
		if err != nil {
			return cluster.LocalGroup{}, fmt.Errorf("server: group %d's %s: %w", id, joinFile, err)
		}
		rs = gs[0].Slots
	}
	dir := groupDir(cfg.DataDir, id)
	clusterID := cluster.GroupClusterID(cfg.ClusterID, id)
	if cfg.FS == nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return cluster.LocalGroup{}, fmt.Errorf("server: create %s: %w", dir, err)
		}
		if err := checkIdentity(dir, replicaIdentity{Cluster: clusterID, Replica: cfg.ReplicaID, Members: cluster.MemberIDs(ms), Slots: jr.Slots}); err != nil {
			return cluster.LocalGroup{}, err
		}
	}
	spec := s.replicaSpec(filepath.Join(dir, "vr"))
	spec.Logger = s.log.With("component", "vr", "group", uint64(id))
	if id == cluster.MetaGroupID {
		spec.Logger = s.log.With("component", "vr", "group", "metadata")
		spec.ActiveExpiry = -1 // as openMeta: no user keys
	}
	spec.Cluster, spec.Members, spec.Group, spec.Transport = clusterID, ms, id, tr
	spec.Bootstrap = false
	spec.Membership = &cluster.Membership{Epoch: jr.Epoch, Members: cluster.MemberIDs(ms), Start: jr.Start, Previous: jr.Previous}
	if jr.Created {
		// One of the group's first members: VR's first configuration
		// (as a static group's), started from the list on the first open
		// only; later opens find the log (or, having persisted nothing,
		// recover from the other members as a replica that lost its disk).
		spec.Membership, spec.Bootstrap = nil, bootstrap
	}
	spec.Nilext, spec.FollowerReads = false, false // as openGroups
	open := cfg.OpenReplica
	if jr.Engine == kv.EngineChain {
		// A chain group: one of its first members (add-group --engine
		// chain: Created, bootstrapped at its first open) or a node the
		// map wants it to join (joinChain: never bootstrapped, an empty
		// joiner its master joins); the map never reconfigures a chain
		// (its master does), and its masters run at the metadata group's
		// nodes (startChainMasters).
		spec.Membership = nil
		if cfg.OpenChainReplica == nil {
			return cluster.LocalGroup{}, fmt.Errorf("server: group %d runs the chain engine, which this node cannot open", id)
		}
		open = cfg.OpenChainReplica
		spec.ChainMasters = jr.ChainMasters
		spec.Logger = s.log.With("component", "chain", "group", uint64(id))
	}
	h, err := open(spec)
	if err != nil {
		return cluster.LocalGroup{}, fmt.Errorf("server: group %d: %w", id, err)
	}
	if spec.Bootstrap && cfg.FS == nil {
		// Bootstrapped: the record says so, so that a replica whose vr/
		// is lost later recovers from the others instead of starting the
		// group's first view again with an empty log (its votes and
		// acknowledgements would be forgotten).
		jr.Opened = true
		b, err := json.Marshal(jr)
		if err == nil {
			err = vfs.WriteFileDurably(vfs.Default, dir, filepath.Join(dir, joinFile), b)
		}
		if err != nil {
			_ = h.Replica.Close()
			return cluster.LocalGroup{}, fmt.Errorf("server: group %d: record its bootstrap in %s: %w", id, filepath.Join(dir, joinFile), err)
		}
	}
	return cluster.LocalGroup{Spec: cluster.GroupSpec{ID: id, Members: cluster.MemberIDs(ms), Slots: rs}, Hosted: h}, nil
}

// groupCmdMulti serves KEFIR.GROUP at a node of several groups:
//
//	KEFIR.GROUP CONFIG GROUP g               group g's configuration, as
//	                                         KEFIR.GROUP CONFIG's (the addresses
//	                                         are the map's nodes'); a node that
//	                                         does not host g: -MOVED to one that does
//	KEFIR.GROUP RECONFIG GROUP g [EPOCH e] id...
//	                                         at g's leader (elsewhere -MOVED):
//	                                         move g from configuration epoch e
//	                                         (the one the list was planned
//	                                         against; -EPOCHMOVED if g is no
//	                                         longer there; no EPOCH: whatever it
//	                                         is) to these members, nodes of the
//	                                         map (odd, distinct); the current set
//	                                         again answers it unchanged
func (c *conn) groupCmdMulti(args [][]byte) error {
	s := c.srv
	sub := strings.ToUpper(string(args[1]))
	if sub != "CONFIG" && sub != "RECONFIG" && sub != "PROGRESS" {
		return errf("ERR unknown subcommand '%s' of KEFIR.GROUP (CONFIG, RECONFIG, PROGRESS)", strings.ToLower(sub))
	}
	if len(args) < 4 || !strings.EqualFold(string(args[2]), "GROUP") {
		return errf("ERR KEFIR.GROUP %s: this node hosts several groups: name one (KEFIR.GROUP %s GROUP <id>%s)", sub, sub, map[string]string{"CONFIG": "", "RECONFIG": " [EPOCH <epoch>] <member-id>..."}[sub])
	}
	gid, err := strconv.ParseUint(string(args[3]), 10, 32)
	if err != nil || gid == 0 {
		return errf("ERR KEFIR.GROUP %s: group %q is not a group id", sub, args[3])
	}
	id := cluster.GroupID(gid)
	if (sub == "CONFIG" || sub == "PROGRESS") && len(args) != 4 || sub == "RECONFIG" && len(args) < 5 {
		return errf("ERR wrong number of arguments for 'kefir.group|%s' command", strings.ToLower(sub))
	}
	lg, ok := s.hostedGroup(id)
	if !ok {
		_, addr, _ := s.multi.Leader(id)
		if id == cluster.MetaGroupID {
			if ms := s.multi.MetaMembers(); len(ms) > 0 {
				n, _ := s.multi.Node(ms[0])
				addr = n.ClientAddr
			}
		}
		if addr == "" {
			return errf("ERR KEFIR.GROUP: group %d is not hosted by this node, and no member of it is known", id)
		}
		return &cluster.ReplyError{Msg: "MOVED " + addr}
	}
	rc, ok := lg.Hosted.Group.(cluster.Reconfigurable)
	if !ok {
		return errf("ERR KEFIR.GROUP: %v", cluster.ErrNotReconfigurable)
	}
	if sub == "CONFIG" {
		return c.writeConfig(rc.Membership(), lg.Hosted.Group.State(), s.multi.Nodes())
	}
	if sub == "PROGRESS" {
		return c.writeProgress(rc.Membership(), lg.Hosted.Group.State(), func(id uint64) string {
			n, _ := s.multi.Node(id)
			return n.ClientAddr
		})
	}
	if cm := s.multi.ClusterMap(); cm != nil {
		if g, ok := cm.Group(uint64(id)); ok && g.IsChain() {
			// Its members are its master's: it repairs and rejoins.
			return errf("ERR KEFIR.GROUP RECONFIG: group %d is a chain: its membership is its master's, not VR reconfiguration's", id)
		}
	}
	epoch, rest, err := reconfigEpoch(args[4:])
	if err != nil {
		return err
	}
	ids := make([]uint64, 0, len(rest))
	for _, a := range rest {
		m, err := strconv.ParseUint(string(a), 10, 64)
		if err != nil || m == 0 {
			return errf("ERR KEFIR.GROUP RECONFIG: member %q: node ids (nodes of the cluster map) only", a)
		}
		if slices.Contains(ids, m) {
			return errf("ERR KEFIR.GROUP RECONFIG: member %d listed twice", m)
		}
		if _, known := s.multi.Node(m); !known {
			// Added to the map a moment ago, perhaps: this node's
			// replica of the metadata group (or its poll) may lag its
			// leader. TRYAGAIN: the caller (cluster.Mover) retries.
			if _, err := s.multi.RefreshMap(); err == nil {
				if cm := s.multi.ClusterMap(); cm != nil {
					s.learnNodes(mapNodesToMembers(cm.Nodes))
				}
			}
			if _, known := s.multi.Node(m); !known {
				return errf("TRYAGAIN KEFIR.GROUP RECONFIG: node %d is not a node of the cluster map this node follows: add it first (KEFIR.SLOTS META ADDNODE; kefir cluster replace-node does)", m)
			}
		}
		ids = append(ids, m)
	}
	if len(ids)%2 == 0 {
		return errf("ERR KEFIR.GROUP RECONFIG: %d members: a VR group needs an odd number (2f+1)", len(ids))
	}
	cur := rc.Membership()
	if cluster.SameIDs(ids, cur.Members) {
		return c.writeConfig(cur, lg.Hosted.Group.State(), s.multi.Nodes()) // a retry
	}
	st := lg.Hosted.Group.State()
	if !st.IsLeader {
		if st.Normal && st.Leader != 0 {
			if n, ok := s.multi.Node(st.Leader); ok && n.ClientAddr != "" {
				return &cluster.ReplyError{Msg: "MOVED " + n.ClientAddr}
			}
		}
		return cluster.ErrNoLeader
	}
	if i := slices.Index(ids, s.cfg.ReplicaID); i > 0 {
		ids = append([]uint64{s.cfg.ReplicaID}, slices.Delete(ids, i, i+1)...)
	}
	// The new members' addresses, at once: the leader reaches them as soon
	// as the epoch starts (the watcher would, a poll later).
	s.learnNodes(s.multi.Nodes())
	ctx, cancel := context.WithTimeout(context.Background(), reconfigTimeout)
	defer cancel()
	m, err := rc.Reconfigure(ctx, epoch, ids)
	if err != nil {
		if errors.Is(err, cluster.ErrNotLeader) {
			return err
		}
		if moved := (*cluster.EpochMovedError)(nil); errors.As(err, &moved) {
			moved.Group = id
			return &cluster.ReplyError{Msg: moved.Error()}
		}
		return errf("ERR KEFIR.GROUP RECONFIG GROUP %d to %v: %v (KEFIR.GROUP CONFIG GROUP %d tells whether the group moved)", id, ids, err, id)
	}
	s.log.Info("reconfigured a group", "group", uint64(id), "epoch", m.Epoch, "members", m.Members, "previous", m.Previous)
	return c.writeConfig(m, lg.Hosted.Group.State(), s.multi.Nodes())
}

// reconfigEpoch reads KEFIR.GROUP RECONFIG's optional EPOCH e before the
// members: the configuration epoch the change was planned against
// (cluster.AnyEpoch without it: an older caller's), and the members' args.
func reconfigEpoch(args [][]byte) (uint64, [][]byte, error) {
	if len(args) == 0 || !strings.EqualFold(string(args[0]), "EPOCH") {
		return cluster.AnyEpoch, args, nil
	}
	if len(args) < 3 {
		return 0, nil, errf("ERR KEFIR.GROUP RECONFIG: EPOCH <epoch> is followed by the members")
	}
	e, err := strconv.ParseUint(string(args[1]), 10, 64)
	if err != nil || e == cluster.AnyEpoch {
		return 0, nil, errf("ERR KEFIR.GROUP RECONFIG: EPOCH %q is not a configuration epoch", args[1])
	}
	return e, args[2:], nil
}

// hostedGroup returns this node's replica of data group id.
func (s *Server) hostedGroup(id cluster.GroupID) (cluster.LocalGroup, bool) {
	if id == cluster.MetaGroupID {
		return s.multi.MetaHosted()
	}
	for _, lg := range s.multi.Hosted() {
		if lg.Spec.ID == id {
			return lg, true
		}
	}
	return cluster.LocalGroup{}, false
}

// joinsGroups asks the cluster at mv's seeds whether it is one of several
// groups (it has a metadata group's map) or a single group, waiting while
// no seed answers.
func joinsGroups(ctx context.Context, mv *cluster.Mover, logf func(format string, args ...any)) (bool, error) {
	for {
		_, err := mv.MetaMap(ctx)
		switch {
		case err == nil, err != nil && strings.Contains(err.Error(), "TRYAGAIN"):
			return true, nil
		case strings.Contains(err.Error(), "needs a node of several groups"):
			return false, nil
		case ctx.Err() != nil:
			return false, fmt.Errorf("asking the cluster at %s what it is: %w", strings.Join(mv.Seeds, ","), ctx.Err())
		}
		logf("asking the cluster at %s for its map: %v", strings.Join(mv.Seeds, ","), err)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// prepareJoinGroups is PrepareJoin in a cluster of several groups: it waits
// until the metadata group's map names cfg.ReplicaID (at its addresses) in a
// group (kefir cluster replace-node), asks each such group for its
// configuration and records it in the group's directory, then records the
// map's nodes and groups in the node's joinFile. The node then starts as a
// node of those groups (a new member of each); groups the map names it in
// later are joined while it runs (syncGroups).
func prepareJoinGroups(ctx context.Context, cfg Config, mv *cluster.Mover, logf func(format string, args ...any)) (Config, error) {
	var cm *kv.ClusterMap
	for {
		var err error
		cm, err = mv.MetaMap(ctx)
		if err == nil {
			i := slices.IndexFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == cfg.ReplicaID })
			if i >= 0 && (cm.Nodes[i].PeerAddr != cfg.PeerAddr || cm.Nodes[i].ClientAddr != cfg.ClientAddr) {
				return cfg, fmt.Errorf("server: the cluster map has node %d at peer %s, client %s, but this node listens on peer %s, client %s: start it with those addresses",
					cfg.ReplicaID, cm.Nodes[i].PeerAddr, cm.Nodes[i].ClientAddr, cfg.PeerAddr, cfg.ClientAddr)
			}
			if i >= 0 {
				// A node of the map serves even before a group is placed
				// on it (it redirects and forwards, and opens the groups
				// the map names it in, now or later: syncGroups).
				break
			}
			logf("the cluster map (epoch %d) does not name node %d yet; waiting for kefir cluster add-node, replace-node, add-members or add-group", cm.Epoch, cfg.ReplicaID)
		} else {
			logf("asking the cluster for its map: %v", err)
		}
		select {
		case <-ctx.Done():
			return cfg, fmt.Errorf("waiting to be named by the cluster map: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	nodes := mapNodesToMembers(cm.Nodes)
	addr := func(id uint64) (Member, bool) {
		i := slices.IndexFunc(nodes, func(n Member) bool { return n.ID == id })
		if i < 0 {
			return Member{}, false
		}
		return nodes[i], true
	}
	sm, err := cluster.SlotMapOf(cm)
	if err != nil {
		return cfg, fmt.Errorf("server: the cluster map at epoch %d: %w", cm.Epoch, err)
	}
	clusterID := cfg.ClusterID
	// knowClusterID sets clusterID, when no flag or group gave it, from
	// the metadata group's configuration (the map does not carry it).
	knowClusterID := func(what string) error {
		if clusterID != 0 {
			return nil
		}
		gc, err := mv.GroupConfigOf(ctx, cluster.MetaGroupID)
		if err != nil {
			return fmt.Errorf("server: %sthe cluster's id from its metadata group: %w", what, err)
		}
		clusterID = gc.Cluster
		return nil
	}
	type pending struct {
		dir string
		b   []byte
	}
	var recs []pending
	// The data groups and the metadata group (which this node hosts if
	// the map names it a member: it is opened from its record as well).
	all := append(slices.Clone(sm.Groups), cluster.GroupSpec{ID: cluster.MetaGroupID, Members: cm.MetaMembers()})
	for _, g := range all {
		if !slices.Contains(g.Members, cfg.ReplicaID) {
			continue
		}
		if mg, ok := cm.Group(uint64(g.ID)); ok && created(*mg) {
			// One of a new group's first members (kefir cluster
			// add-group): nobody holds its state to pull; the node
			// bootstraps it from the map's list at its first open.
			ms := make([]Member, 0, len(mg.Members))
			for _, id := range mg.Members {
				n, ok := addr(id)
				if !ok {
					return cfg, fmt.Errorf("server: group %d's member %d is not a node of the cluster map", g.ID, id)
				}
				ms = append(ms, n)
			}
			if err := knowClusterID(fmt.Sprintf("start group %d: ", g.ID)); err != nil {
				return cfg, err
			}
			b, err := json.Marshal(joinRecord{Cluster: clusterID, Replica: cfg.ReplicaID, Members: FormatMembers(ms), Slots: groupSlots(g.ID, nil), Created: true, Engine: mg.Engine, ChainMasters: chainMasters(mg, cm)})
			if err != nil {
				return cfg, err
			}
			recs = append(recs, pending{groupDir(cfg.DataDir, g.ID), b})
			continue
		}
		var seeds []string
		for _, id := range g.Members {
			if n, ok := addr(id); ok && id != cfg.ReplicaID {
				seeds = append(seeds, n.ClientAddr)
			}
		}
		gmv := &cluster.Mover{Seeds: seeds, Password: cfg.Password, RetryFor: 10 * time.Second}
		gc, err := gmv.GroupConfigOf(ctx, g.ID)
		gmv.Close()
		if err != nil {
			return cfg, fmt.Errorf("server: join group %d: %w", g.ID, err)
		}
		if !slices.Contains(gc.Members, cfg.ReplicaID) {
			return cfg, fmt.Errorf("server: the map names node %d in group %d, but the group's configuration (%s) does not: run kefir cluster replace-node again", cfg.ReplicaID, g.ID, gc)
		}
		if clusterID != 0 && clusterID != gc.Cluster {
			return cfg, fmt.Errorf("%w: --cluster-id %d, but the cluster at %s is %d", ErrStaleConfig, clusterID, cfg.Join, gc.Cluster)
		}
		clusterID = gc.Cluster
		ms := make([]Member, 0, len(gc.Members))
		for _, id := range gc.Members {
			n, ok := addr(id)
			if !ok {
				return cfg, fmt.Errorf("server: group %d's member %d is not a node of the cluster map", g.ID, id)
			}
			ms = append(ms, n)
		}
		jr := joinRecord{Cluster: gc.Cluster, Replica: cfg.ReplicaID, Members: FormatMembers(ms), Epoch: gc.Epoch,
			Start: gc.Start, Previous: gc.Previous, Slots: groupSlots(g.ID, g.Slots)}
		b, err := json.Marshal(jr)
		if err != nil {
			return cfg, err
		}
		recs = append(recs, pending{groupDir(cfg.DataDir, g.ID), b})
	}
	// Chain groups the map wants this node to join (KindMapChainWant): an
	// empty member, opened from its record as any group this node joined,
	// which the chain's master joins (joinChain).
	for _, mg := range cm.Groups {
		if !joiningChain(&mg, cfg.ReplicaID) {
			continue
		}
		ms := make([]Member, 0, len(mg.Members)+1)
		for _, id := range append(slices.Clone(mg.Members), cfg.ReplicaID) {
			n, ok := addr(id)
			if !ok {
				return cfg, fmt.Errorf("server: chain group %d's node %d is not a node of the cluster map", mg.ID, id)
			}
			ms = append(ms, n)
		}
		if err := knowClusterID(fmt.Sprintf("join chain group %d: ", mg.ID)); err != nil {
			return cfg, err
		}
		id := cluster.GroupID(mg.ID)
		b, err := json.Marshal(chainJoinRecord(clusterID, cfg.ReplicaID, id, ms, slotsOf(sm, id), cm.MetaMembers()))
		if err != nil {
			return cfg, err
		}
		recs = append(recs, pending{groupDir(cfg.DataDir, cluster.GroupID(mg.ID)), b})
	}
	// The groups' records first, durably, then the node's: a restart finds
	// the node's only once every group's is there.
	for _, r := range recs {
		if err := os.MkdirAll(r.dir, 0o755); err != nil {
			return cfg, fmt.Errorf("server: create %s: %w", r.dir, err)
		}
		if err := vfs.WriteFileDurably(vfs.Default, r.dir, filepath.Join(r.dir, joinFile), r.b); err != nil {
			return cfg, fmt.Errorf("server: write %s: %w", filepath.Join(r.dir, joinFile), err)
		}
	}
	if err := knowClusterID(""); err != nil { // named in no group yet
		return cfg, err
	}
	jr := joinRecord{Cluster: clusterID, Replica: cfg.ReplicaID, Members: FormatMembers(nodes), Groups: cluster.FormatGroups(sm.Groups), MapEpoch: cm.Epoch}
	b, err := json.Marshal(jr)
	if err != nil {
		return cfg, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return cfg, fmt.Errorf("server: create %s: %w", cfg.DataDir, err)
	}
	if err := vfs.WriteFileDurably(vfs.Default, cfg.DataDir, filepath.Join(cfg.DataDir, joinFile), b); err != nil {
		return cfg, fmt.Errorf("server: write %s: %w", joinFile, err)
	}
	if len(recs) == 0 {
		logf("a node of the cluster map (epoch %d), in no group yet: serving, and joining the groups the map names it in later", cm.Epoch)
	} else {
		logf("named by the cluster map (epoch %d) in %d group(s): joining them as a new member (or starting a new group as one of its first members)", cm.Epoch, len(recs))
	}
	cfg.Members, cfg.ClusterID, cfg.Groups, cfg.Join = nodes, clusterID, sm.Groups, ""
	cfg.joinedGroups, cfg.Membership, cfg.namedAtMapEpoch = true, nil, cm.Epoch
	return cfg, nil
}

// writeProgress answers KEFIR.GROUP PROGRESS GROUP g at the group's leader:
// [epoch, epoch's start op, commit op, [[member, persisted op, applied op],
// ...]] for each follower the leader has heard from (as of its last tick),
// so that kefir cluster replace-node, remove-node and add-members can wait
// for the members the last change added to have pulled the group's state
// before changing the group again (cluster.Mover.WaitCaughtUp). Elsewhere
// -MOVED to the leader.
func (c *conn) writeProgress(m cluster.Membership, st cluster.State, clientAddr func(id uint64) string) error {
	if !st.Normal || !st.IsLeader {
		if a := clientAddr(st.Leader); st.Normal && st.Leader != 0 && a != "" {
			return &cluster.ReplyError{Msg: "MOVED " + a}
		}
		return cluster.ErrNoLeader
	}
	w := c.w
	_ = w.WriteArrayHeader(4)
	_ = w.WriteInt(int64(m.Epoch))
	_ = w.WriteInt(int64(m.Start))
	_ = w.WriteInt(int64(st.Commit))
	_ = w.WriteArrayHeader(len(st.Followers))
	for _, f := range st.Followers {
		_ = w.WriteArrayHeader(3)
		_ = w.WriteInt(int64(f.ID))
		_ = w.WriteInt(int64(f.Persisted))
		_ = w.WriteInt(int64(f.Applied))
	}
	return nil
}
