package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A single VR group's membership at a node (issue 28; docs/cluster.md,
// "Replacing a failed node"; docs/design/cluster.md §7, "The node wiring").
// The engine reconfigures (vrshard, internal/vr); the node
//   - serves KEFIR.GROUP CONFIG (its replica's durable configuration and
//     the members' addresses) and, at the leader, KEFIR.GROUP RECONFIG:
//     first the group's address record (kv.KindGroupAddrs) through the
//     log, so that every member learns a new member's addresses, then the
//     reconfiguration;
//   - follows its replica (memberWatch): an address record applied here
//     teaches the transport and the router the addresses, a new epoch
//     changes the members the router and the CLUSTER replies name, and a
//     retired replica is recorded in the data directory (retiredFile) and
//     stops the node;
//   - joins a group as a new member (PrepareJoin: kefir server --join),
//     recording the configuration it was named in (joinFile) so that a
//     restart needs no --join.
// Nodes of several groups (--groups) reconfigure each data group through
// the metadata group's map: groupmembers.go.

// joinFile records, in a new member's data directory, the configuration it
// joined with; retiredFile that its replica left the group.
const (
	joinFile    = "kefir-join.json"
	retiredFile = "kefir-retired.json"
)

// ErrRetired refuses to start a node whose replica left its group.
var ErrRetired = errors.New("this node left its group")

// joinRecord is joinFile's content.
type joinRecord struct {
	Cluster  uint64   `json:"cluster_id"`
	Replica  uint64   `json:"replica_id"`
	Members  string   `json:"members"` // FormatMembers, in leader order
	Epoch    uint64   `json:"epoch"`
	Start    uint64   `json:"epoch_start"`
	Previous []uint64 `json:"previous"`
	// A node of several groups: Groups (the map's groups, cluster.FormatGroups)
	// in the node's joinFile; Slots (the group's ranges) in a group
	// directory's.
	Groups string `json:"groups,omitempty"`
	Slots  string `json:"slots,omitempty"`
	// Created: a group directory's record of a replica started as one of a
	// new group's first members (kefir cluster add-group: the map's record
	// at member epoch 0 names this node), which bootstraps the group's
	// first view from Members instead of pulling a state nobody has. It
	// bootstraps only at its first open: while Opened is not set (it is,
	// once the bootstrapped replica opened) and its vr/ directory does not
	// exist.
	Created bool `json:"created,omitempty"`
	Opened  bool `json:"opened,omitempty"`
	// Engine is the group's engine as the map records it (kv.EngineVR,
	// kv.EngineChain): a restart opens the replica with the same one.
	Engine string `json:"engine,omitempty"`
	// ChainMasters: a chain group's, the metadata group's members when the
	// group was created, where its hosted masters run (the member sends
	// them its master's messages).
	ChainMasters []uint64 `json:"chain_masters,omitempty"`
	// MapEpoch (a node's joinFile in a cluster of several groups): the
	// epoch of the cluster map that named the node when it joined. Only a
	// later map that does not name it takes it out (leftMap): an earlier
	// one, from a metadata leader that has not applied the node's
	// addition yet, merely predates it.
	MapEpoch uint64 `json:"map_epoch,omitempty"`
}

// retiredRecord is retiredFile's content.
type retiredRecord struct {
	Cluster uint64   `json:"cluster_id"`
	Replica uint64   `json:"replica_id"`
	Epoch   uint64   `json:"epoch"`
	Members []uint64 `json:"members"`
	// RemovedAt: the group was taken out of the cluster map
	// (kv.KindMapRemoveGroup), and the replica retired for it
	// (groupmembers.go, retireGroup) when the node saw the map at this
	// epoch (the removal's, or a later one); its data (vr/) is deleted,
	// the record stays as the group's tombstone.
	RemovedAt uint64 `json:"removed_at_map_epoch,omitempty"`
	// LeftMapAt (the node's own record): the node, hosting nothing, was
	// taken out of the cluster map (kefir cluster remove-node,
	// kv.MapNodeRemove) and retired when it saw the map at this epoch.
	LeftMapAt uint64 `json:"left_map_at_epoch,omitempty"`
}

func (r retiredRecord) err(dir string) error {
	if r.LeftMapAt > 0 {
		return fmt.Errorf("%w: node %d was taken out of the cluster map (cluster %d; seen at map epoch %d). %s is kept as it was and the node does not come back; to make this machine a node again wipe --dir and start it as a new one (kefir server --join, then kefir cluster add-node)",
			ErrRetired, r.Replica, r.Cluster, r.LeftMapAt, dir)
	}
	return fmt.Errorf("%w: replica %d left group (cluster %d) at epoch %d; members are %v. %s is kept as it was and the node does not rejoin; to make this machine a member again wipe --dir and start it as a new one (kefir server --join, then kefir cluster replace-node)",
		ErrRetired, r.Replica, r.Cluster, r.Epoch, r.Members, dir)
}

// CheckRetired refuses a data directory whose replica retired (an error
// wrapping ErrRetired that says when and who the members are): kefir server
// refuses to start on it, and kefir up leaves such a node down.
func CheckRetired(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, retiredFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("server: read %s: %w", retiredFile, err)
	}
	var r retiredRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%w: %s is corrupt (%v); the replica in %s retired", ErrRetired, retiredFile, err, dir)
	}
	return r.err(dir)
}

// Joined reports whether the node whose data directory is dir joined its
// cluster (PrepareJoin recorded what the group or the map told it): a
// restart then needs no --join. A directory without the record is a node
// that has not joined yet, whatever else it holds.
func Joined(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, joinFile))
	return err == nil
}

// PrepareJoin resolves a node's group when it joins one as a new member:
// from its data directory's joinFile if it joined before (a restart: no
// --join needed), else, with cfg.Join, by asking the group (any member's
// client address) for its configuration until it names cfg.ReplicaID
// (kefir cluster replace-node does), logging while it waits; the answer is
// recorded in joinFile. The result has Members (in the configuration's
// leader order, with addresses), ClusterID and Membership set. Without
// either it returns cfg as it is.
func PrepareJoin(ctx context.Context, cfg Config, logf func(format string, args ...any)) (Config, error) {
	if cfg.FS != nil || cfg.DataDir == "" {
		return cfg, nil
	}
	if err := CheckRetired(cfg.DataDir); err != nil {
		return cfg, err
	}
	p := filepath.Join(cfg.DataDir, joinFile)
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		var jr joinRecord
		if err := json.Unmarshal(b, &jr); err != nil {
			return cfg, fmt.Errorf("server: %s is corrupt: %w", p, err)
		}
		if len(cfg.Members) > 0 || cfg.Join != "" {
			logf("this node joined its group as a new member: its data directory's %s supersedes --members and --join", joinFile)
		}
		if cfg.ReplicaID != 0 && cfg.ReplicaID != jr.Replica {
			return cfg, fmt.Errorf("%w: %s joined as replica %d, but --replica-id is %d", ErrStaleConfig, cfg.DataDir, jr.Replica, cfg.ReplicaID)
		}
		ms, err := ParseMembers(jr.Members)
		if err != nil {
			return cfg, fmt.Errorf("server: %s: %w", p, err)
		}
		cfg.Members, cfg.ClusterID, cfg.ReplicaID, cfg.Join = ms, jr.Cluster, jr.Replica, ""
		if jr.Groups != "" {
			// A node that joined a cluster of several groups: its groups'
			// directories record each one's configuration.
			if cfg.Groups, err = cluster.ParseGroups(jr.Groups); err != nil {
				return cfg, fmt.Errorf("server: %s: %w", p, err)
			}
			cfg.joinedGroups, cfg.Membership, cfg.namedAtMapEpoch = true, nil, jr.MapEpoch
			return cfg, nil
		}
		cfg.Membership = &cluster.Membership{Epoch: jr.Epoch, Members: cluster.MemberIDs(ms), Start: jr.Start, Previous: jr.Previous}
		return cfg, nil
	case !errors.Is(err, os.ErrNotExist):
		return cfg, fmt.Errorf("server: read %s: %w", p, err)
	case cfg.Join == "":
		return cfg, nil
	}
	switch {
	case len(cfg.Members) > 0:
		return cfg, errors.New("config: --join takes no --members: the group tells the node its members")
	case cfg.Bootstrap:
		return cfg, errors.New("config: --join and --bootstrap exclude each other: a new member pulls the group's state")
	case cfg.ReplicaID == 0:
		return cfg, errors.New("config: --join needs --replica-id (the id kefir cluster replace-node --new gives it)")
	case len(cfg.Groups) > 0:
		return cfg, errors.New("config: --join takes no --groups: the cluster's map tells the node its groups")
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "vr")); err == nil {
		return cfg, fmt.Errorf("%w: %s holds a replica already; a new member starts with an empty --dir", ErrStaleConfig, cfg.DataDir)
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.DataDir, "group-*", "vr")); len(m) > 0 {
		return cfg, fmt.Errorf("%w: %s holds replicas already (%s); a new node starts with an empty --dir", ErrStaleConfig, cfg.DataDir, m[0])
	}
	mv := &cluster.Mover{Seeds: strings.Split(cfg.Join, ","), Password: cfg.Password, RetryFor: 2 * time.Second}
	defer mv.Close()
	if multi, err := joinsGroups(ctx, mv, logf); err != nil {
		return cfg, err
	} else if multi {
		return prepareJoinGroups(ctx, cfg, mv, logf) // groupmembers.go
	}
	gc, err := mv.WaitNamed(ctx, cfg.ReplicaID, 500*time.Millisecond, logf)
	if err != nil {
		return cfg, err
	}
	if cfg.ClusterID != 0 && cfg.ClusterID != gc.Cluster {
		return cfg, fmt.Errorf("%w: --cluster-id %d, but the group at %s is cluster %d", ErrStaleConfig, cfg.ClusterID, cfg.Join, gc.Cluster)
	}
	ms := make([]Member, 0, len(gc.Members))
	for _, id := range gc.Members {
		m, ok := gc.Addr(id)
		if !ok {
			return cfg, fmt.Errorf("server: the group's configuration (%s) has no address for member %d", gc, id)
		}
		if id == cfg.ReplicaID && (m.PeerAddr != cfg.PeerAddr || m.ClientAddr != cfg.ClientAddr) {
			return cfg, fmt.Errorf("server: the group knows node %d as %s, but this node listens on peer %s, client %s: start it with those addresses (or replace the node again)",
				id, cluster.FormatMember(m), cfg.PeerAddr, cfg.ClientAddr)
		}
		ms = append(ms, m)
	}
	jr := joinRecord{Cluster: gc.Cluster, Replica: cfg.ReplicaID, Members: FormatMembers(ms), Epoch: gc.Epoch, Start: gc.Start, Previous: gc.Previous}
	b, err = json.Marshal(jr)
	if err != nil {
		return cfg, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return cfg, fmt.Errorf("server: create data dir: %w", err)
	}
	// Durably, before the replica opens: a restart must find it (the
	// replica's own record of the configuration comes with its first hard
	// state).
	if err := vfs.WriteFileDurably(vfs.Default, cfg.DataDir, p, b); err != nil {
		return cfg, fmt.Errorf("server: write %s: %w", p, err)
	}
	logf("named by the group (%s): joining as a new member", gc)
	cfg.Members, cfg.ClusterID, cfg.Join = ms, gc.Cluster, ""
	cfg.Membership = &gc.Membership
	return cfg, nil
}

// memberState is the node's view of its group's membership (nil on a node
// that does not reconfigure).
type memberState struct {
	rc cluster.Reconfigurable
	// dir: every node whose addresses the node knows (the flags', the
	// group's address record's), by id; copy on write.
	dir atomic.Pointer[[]Member]
	// mu serializes syncMembership (the watcher, and RECONFIG at the
	// leader) and the directory's read-modify-writes; it guards the
	// fields below.
	mu      sync.Mutex
	rec     []byte // the record last applied
	epoch   uint64
	members []uint64
	retired chan struct{} // closed once the replica retired
	retErr  error         // why, set before retired closes
	stop    func()
	once    sync.Once
}

// initMembership sets s.mem up when the node's group reconfigures, and
// applies what the replica holds (its configuration, the address record).
func (s *Server) initMembership() {
	rc, ok := s.grp.(cluster.Reconfigurable)
	if !ok || s.multi != nil {
		return
	}
	ms := &memberState{rc: rc, retired: make(chan struct{})}
	dir := slices.Clone(s.cfg.Members)
	ms.dir.Store(&dir)
	s.mem = ms
	s.syncMembership()
	if m := rc.Membership(); !slices.Equal(m.Members, cluster.MemberIDs(s.cfg.Members)) {
		s.log.Warn("the group's configuration on disk supersedes --members (the group was reconfigured); runs that one",
			"epoch", m.Epoch, "members", m.Members, "flag_members", cluster.MemberIDs(s.cfg.Members))
	}
}

// Retired is closed when this node's replica left its group (it recorded
// that in its data directory); RetiredErr says so. Never closed on a node
// that does not reconfigure.
func (s *Server) Retired() <-chan struct{} {
	if s.groups != nil {
		return s.groups.retired // a node of several groups (groupmembers.go)
	}
	if s.mem == nil {
		return nil
	}
	return s.mem.retired
}

// RetiredErr is the reason Retired closed.
func (s *Server) RetiredErr() error {
	if s.groups != nil {
		select {
		case <-s.groups.retired:
			return s.groups.retErr
		default:
			return nil
		}
	}
	if s.mem == nil {
		return nil
	}
	select {
	case <-s.mem.retired:
		return s.mem.retErr
	default:
		return nil
	}
}

// memberPoll is how often the watcher looks at the replica.
const memberPoll = 20 * time.Millisecond

// startMemberWatch follows the replica until Shutdown.
func (s *Server) startMemberWatch() {
	ms := s.mem
	if ms == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	ms.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		t := time.NewTicker(memberPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s.syncMembership() {
				return
			}
		}
	}()
}

func (s *Server) stopMemberWatch() {
	if s.mem != nil && s.mem.stop != nil {
		s.mem.stop()
	}
}

// syncMembership (the watcher) applies what changed in the replica: a new
// address record, a new configuration, retirement (then it reports true:
// nothing more to follow).
func (s *Server) syncMembership() (retired bool) {
	ms := s.mem
	ms.mu.Lock()
	defer ms.mu.Unlock()
	changed := false
	v, err := s.db.Get(kv.GroupAddrsKey)
	switch {
	case err == nil && !bytes.Equal(v.Data, ms.rec):
		ns, derr := kv.DecodeGroupAddrs(v.Data)
		if derr != nil {
			s.log.Error("the group's address record does not decode", "err", derr)
			break
		}
		ms.rec = slices.Clone(v.Data)
		s.learnAddrsLocked(mapNodesToMembers(ns), false)
		changed = true
	case err != nil && !errors.Is(err, storage.ErrNotFound):
		s.log.Error("read the group's address record", "err", err)
	}
	m := ms.rc.Membership()
	if m.Epoch != ms.epoch || !slices.Equal(m.Members, ms.members) {
		if ms.members != nil {
			s.log.Info("the group moved to a new configuration", "epoch", m.Epoch, "members", m.Members, "previous", m.Previous)
		}
		ms.epoch, ms.members = m.Epoch, m.Members
		changed = true
		s.recordMembers(m.Members)
	}
	if changed {
		s.router.SetMembers(s.groupMembers())
	}
	if st := s.grp.State(); st.Retired {
		s.retire(m)
		return true
	}
	return false
}

// learnAddrsLocked (ms.mu held) merges ns into the directory and teaches
// the replica. The flags' addresses stay for the nodes they name (an
// operator who moved a member restarts it with its new address) unless
// force (a RECONFIG's new member, whose addresses the leader just wrote).
func (s *Server) learnAddrsLocked(ns []Member, force bool) {
	ms := s.mem
	dir := slices.Clone(*ms.dir.Load())
	for _, n := range ns {
		i := slices.IndexFunc(dir, func(m Member) bool { return m.ID == n.ID })
		switch {
		case i < 0:
			dir = append(dir, n)
		case force || !slices.ContainsFunc(s.cfg.Members, func(m Member) bool { return m.ID == n.ID }):
			dir[i] = n
		}
	}
	ms.dir.Store(&dir)
	if err := ms.rc.SetAddrs(dir); err != nil {
		s.log.Error("teach the replica its group's addresses", "err", err)
	}
}

func mapNodesToMembers(ns []kv.MapNode) []Member {
	out := make([]Member, len(ns))
	for i, n := range ns {
		out[i] = Member{ID: n.ID, PeerAddr: n.PeerAddr, ClientAddr: n.ClientAddr}
	}
	return out
}

// addrOf returns id's addresses as the node knows them.
func (s *Server) addrOf(id uint64) (Member, bool) {
	if s.mem == nil {
		i := slices.IndexFunc(s.cfg.Members, func(m Member) bool { return m.ID == id })
		if i < 0 {
			return Member{ID: id}, false
		}
		return s.cfg.Members[i], true
	}
	dir := *s.mem.dir.Load()
	i := slices.IndexFunc(dir, func(m Member) bool { return m.ID == id })
	if i < 0 {
		return Member{ID: id}, false
	}
	return dir[i], true
}

// groupMembers is the group's current members in leader order with their
// addresses: the replica's configuration's, or the flags' on a node that
// does not reconfigure.
func (s *Server) groupMembers() []Member {
	if s.mem == nil {
		return s.cfg.Members
	}
	ids := s.mem.rc.Membership().Members
	out := make([]Member, len(ids))
	for i, id := range ids {
		out[i], _ = s.addrOf(id)
	}
	return out
}

// retire records in the data directory that the replica left the group,
// and tells the node to stop (Retired).
func (s *Server) retire(m cluster.Membership) {
	ms := s.mem
	ms.once.Do(func() {
		r := retiredRecord{Cluster: s.cfg.ClusterID, Replica: s.cfg.ReplicaID, Epoch: m.Epoch, Members: m.Members}
		if s.cfg.FS == nil {
			b, _ := json.Marshal(r)
			if err := vfs.WriteFileDurably(vfs.Default, s.cfg.DataDir, filepath.Join(s.cfg.DataDir, retiredFile), b); err != nil {
				s.log.Error("record the replica's retirement", "err", err)
			}
		}
		ms.retErr = r.err(s.cfg.DataDir)
		s.log.Warn("this node's replica retired: the group no longer has it as a member; stopping", "epoch", m.Epoch, "members", m.Members)
		close(ms.retired)
	})
}

// groupCmd serves KEFIR.GROUP:
//
//	KEFIR.GROUP CONFIG                 this node's durable configuration:
//	                                   [cluster-id, epoch, epoch-start, [member-id...],
//	                                   [previous-id...], leader (0: unknown),
//	                                   [ID@PEER/CLIENT... of every node it knows]]
//	KEFIR.GROUP RECONFIG [EPOCH e] member...
//	                                   at the leader (elsewhere -MOVED <leader>): move
//	                                   the group from configuration epoch e
//	                                   (-EPOCHMOVED if it is no longer there; no
//	                                   EPOCH: whatever it is) to these members (ID, or
//	                                   ID@PEER/CLIENT for a node the group does not
//	                                   know; odd, distinct); the answer is CONFIG's
//	                                   of the new configuration. Asking again for
//	                                   the current set answers it unchanged.
func (c *conn) groupCmd(args [][]byte) error {
	s := c.srv
	if s.multi != nil {
		return c.groupCmdMulti(args) // groupmembers.go
	}
	if s.mem == nil {
		return errf("ERR KEFIR.GROUP: %v", cluster.ErrNotReconfigurable)
	}
	switch sub := strings.ToUpper(string(args[1])); sub {
	case "CONFIG":
		if len(args) != 2 {
			return errf("ERR wrong number of arguments for 'kefir.group|config' command")
		}
		return c.writeGroupConfig(s.mem.rc.Membership())
	case "RECONFIG":
		if len(args) < 3 {
			return errf("ERR wrong number of arguments for 'kefir.group|reconfig' command")
		}
		epoch, members, err := reconfigEpoch(args[2:])
		if err != nil {
			return err
		}
		m, err := s.reconfigure(epoch, members)
		if err != nil {
			return err
		}
		return c.writeGroupConfig(m)
	case "PROGRESS":
		// PROGRESS [GROUP g]: the one group whatever g names (the
		// commands name one; groupmembers.go's writeProgress).
		if len(args) != 2 && len(args) != 4 {
			return errf("ERR wrong number of arguments for 'kefir.group|progress' command")
		}
		return c.writeProgress(s.mem.rc.Membership(), s.grp.State(), func(id uint64) string {
			for _, m := range *s.mem.dir.Load() {
				if m.ID == id {
					return m.ClientAddr
				}
			}
			return ""
		})
	default:
		return errf("ERR unknown subcommand '%s' of KEFIR.GROUP (CONFIG, RECONFIG, PROGRESS)", strings.ToLower(sub))
	}
}

func (c *conn) writeGroupConfig(m cluster.Membership) error {
	return c.writeConfig(m, c.srv.grp.State(), *c.srv.mem.dir.Load())
}

// writeConfig writes KEFIR.GROUP CONFIG's reply: configuration m, the
// leader st knows, the addresses of dir.
func (c *conn) writeConfig(m cluster.Membership, st cluster.State, dir []Member) error {
	s, w := c.srv, c.w
	leader := uint64(0)
	if st.Normal {
		leader = st.Leader
	}
	_ = w.WriteArrayHeader(7)
	_ = w.WriteInt(int64(s.cfg.ClusterID))
	_ = w.WriteInt(int64(m.Epoch))
	_ = w.WriteInt(int64(m.Start))
	_ = w.WriteArrayHeader(len(m.Members))
	for _, id := range m.Members {
		_ = w.WriteInt(int64(id))
	}
	_ = w.WriteArrayHeader(len(m.Previous))
	for _, id := range m.Previous {
		_ = w.WriteInt(int64(id))
	}
	_ = w.WriteInt(int64(leader))
	_ = w.WriteArrayHeader(len(dir))
	for _, d := range dir {
		_ = w.WriteBulkString(cluster.FormatMember(d))
	}
	return nil
}

// reconfigTimeout bounds KEFIR.GROUP RECONFIG's wait for the new
// configuration to be durable here.
const reconfigTimeout = 30 * time.Second

// reconfigure runs KEFIR.GROUP RECONFIG at the leader: the list is checked
// before anything changes; the addresses of nodes the group does not know
// go through the log first (the address record), then the reconfiguration.
func (s *Server) reconfigure(epoch uint64, args [][]byte) (cluster.Membership, error) {
	ms := s.mem
	want := make([]Member, 0, len(args))
	for _, a := range args {
		m, err := cluster.ParseMember(string(a))
		if err != nil {
			return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG: %v", err)
		}
		if slices.ContainsFunc(want, func(x Member) bool { return x.ID == m.ID }) {
			return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG: member %d listed twice", m.ID)
		}
		want = append(want, m)
	}
	if len(want)%2 == 0 {
		return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG: %d members: a VR group needs an odd number (2f+1)", len(want))
	}
	cur := ms.rc.Membership()
	ids := cluster.MemberIDs(want)
	if cluster.SameIDs(ids, cur.Members) {
		return cur, nil // a retry of a reconfiguration that happened
	}
	var learn []Member
	for _, m := range want {
		known, ok := s.addrOf(m.ID)
		switch {
		case m.PeerAddr == "" && !ok:
			return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG: node %d is not known to the group: give its addresses as %d@PEER-ADDR/CLIENT-ADDR", m.ID, m.ID)
		case m.PeerAddr == "":
		case ok && slices.Contains(cur.Members, m.ID) && known != m:
			return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG: member %d is %s, not %s (a member's addresses do not change here)", m.ID, cluster.FormatMember(known), cluster.FormatMember(m))
		case known != m:
			learn = append(learn, m)
		}
	}
	st := s.grp.State()
	if !st.IsLeader {
		// The leader decides: -MOVED to it, checked here so that a
		// follower writes nothing.
		return cluster.Membership{}, s.notLeaderErr(st)
	}
	if epoch != cluster.AnyEpoch && cur.Epoch > epoch {
		// Planned against a configuration the group has left: refused
		// before the address record is written (the core's check, at
		// ordering, decides every other case; a durable epoch above the
		// expected one is one the core is at or past).
		return cluster.Membership{}, &cluster.ReplyError{Msg: (&cluster.EpochMovedError{Expected: epoch, Epoch: cur.Epoch, Members: cur.Members}).Error()}
	}
	// The current leader leads the new epoch's first view when it stays: no
	// view change for the clients.
	if i := slices.Index(ids, s.cfg.ReplicaID); i > 0 {
		ids = append([]uint64{s.cfg.ReplicaID}, slices.Delete(ids, i, i+1)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reconfigTimeout)
	defer cancel()
	if len(learn) > 0 {
		dir := slices.Clone(*ms.dir.Load())
		for _, n := range learn {
			if i := slices.IndexFunc(dir, func(m Member) bool { return m.ID == n.ID }); i >= 0 {
				dir[i] = n
			} else {
				dir = append(dir, n)
			}
		}
		ns := make([]kv.MapNode, len(dir))
		for i, d := range dir {
			ns[i] = kv.MapNode{ID: d.ID, ClientAddr: d.ClientAddr, PeerAddr: d.PeerAddr}
		}
		op := kv.Op{Kind: kv.KindGroupAddrs, Key: kv.AppendGroupAddrs(nil, ns)}
		if _, err := s.shard.Write(ctx, op, level.Sync, shard.ReqID{}); err != nil {
			if errors.Is(err, cluster.ErrNotLeader) {
				return cluster.Membership{}, err
			}
			return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG: record the new members' addresses: %v", err)
		}
		// At once here: the leader's transport must reach the new members
		// as soon as the epoch starts (the watcher would, a poll later).
		ms.mu.Lock()
		s.learnAddrsLocked(learn, true)
		ms.mu.Unlock()
	}
	m, err := ms.rc.Reconfigure(ctx, epoch, ids)
	if err != nil {
		if errors.Is(err, cluster.ErrNotLeader) {
			return cluster.Membership{}, err
		}
		if moved := (*cluster.EpochMovedError)(nil); errors.As(err, &moved) {
			return cluster.Membership{}, &cluster.ReplyError{Msg: moved.Error()}
		}
		return cluster.Membership{}, errf("ERR KEFIR.GROUP RECONFIG to %v: %v (KEFIR.GROUP CONFIG tells whether the group moved)", ids, err)
	}
	s.log.Info("reconfigured the group", "epoch", m.Epoch, "members", m.Members, "previous", m.Previous)
	s.syncMembership()
	return m, nil
}

// notLeaderErr is a not-leader refusal naming the leader st knows.
func (s *Server) notLeaderErr(st cluster.State) error {
	if st.Normal && st.Leader != 0 {
		if m, ok := s.addrOf(st.Leader); ok && m.ClientAddr != "" {
			return &cluster.ReplyError{Msg: "MOVED " + m.ClientAddr}
		}
	}
	return cluster.ErrNoLeader
}

// recordMembers makes the identity file name the group's current members,
// keeping the earlier lists (replicaIdentity.Previous): a restart with the
// new member list in --members is then accepted, as is one with the old.
func (s *Server) recordMembers(ids []uint64) {
	if s.cfg.FS != nil {
		return
	}
	p := filepath.Join(s.cfg.DataDir, identityFile)
	b, err := os.ReadFile(p)
	var id replicaIdentity
	if err == nil {
		err = json.Unmarshal(b, &id)
	}
	if err != nil {
		s.log.Error("record the group's members in the identity file", "err", err)
		return
	}
	if slices.Equal(id.Members, ids) {
		return
	}
	if !slices.ContainsFunc(id.Previous, func(ms []uint64) bool { return slices.Equal(ms, id.Members) }) {
		id.Previous = append(id.Previous, id.Members)
	}
	id.Members = slices.Clone(ids)
	if b, err = json.Marshal(id); err == nil {
		err = vfs.WriteFileDurably(vfs.Default, s.cfg.DataDir, p, b)
	}
	if err != nil {
		s.log.Error("record the group's members in the identity file", "err", err)
	}
}

// deleteRemovedData deletes the data (vr/) of a replica in dir whose group
// was removed from the cluster map (its retired record has RemovedAt): the
// replica retired while it was the node's own engine handle and was closed
// only at shutdown (groupmembers.go, retireGroup). The record stays.
func deleteRemovedData(dir string, log *slog.Logger) {
	b, err := os.ReadFile(filepath.Join(dir, retiredFile))
	if err != nil {
		return
	}
	var r retiredRecord
	if json.Unmarshal(b, &r) != nil || r.RemovedAt == 0 {
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "vr")); err != nil {
		return
	}
	if err := os.RemoveAll(filepath.Join(dir, "vr")); err != nil {
		log.Error("delete the data of a removed group's replica", "dir", dir, "err", err)
		return
	}
	log.Info("deleted the data of a removed group's replica", "dir", dir, "removed_at_map_epoch", r.RemovedAt)
}
