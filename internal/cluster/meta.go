package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// The metadata group (issue 28; docs/design/cluster.md §4): a VR group of
// the same engine, on the nodes' one peer transport, under a reserved group
// id, whose state is the cluster map (kv/clustermap.go): the nodes, the data
// groups with their members and slot ranges, the moves in flight and the map
// epoch. It exists only in a cluster of several groups (--groups); its
// members are the first MetaMembers nodes by id.
//
// A node that hosts a replica of it follows the map its replica applied
// (FollowMap): the routing map (Multi.slots) is swapped for it atomically
// whenever the record's version changes, and read once when the node opens,
// before it serves anything, so a restarted node routes by the newest map it
// had at once. The node that leads the metadata group also bootstraps the
// map from --groups (KindMapInit, a no-op once there is one) and resumes a
// move whose driver's lease ran out (resumeMoves).

// MetaGroupID is the metadata group's id: reserved, refused in --groups.
const MetaGroupID GroupID = kv.MetaGroup

// MetaReplicas is how many nodes host the metadata group at first.
const MetaReplicas = kv.MetaReplicas

// MetaMembers returns the metadata group's first members among nodes: the
// first MetaReplicas by id (an odd number; every node must compute the
// same). A reconfiguration of the group records its later members in the
// map (kv.ClusterMap.MetaMembers).
func MetaMembers(nodes []uint64) []uint64 { return kv.DefaultMetaMembers(nodes) }

// BootstrapMap is the map a cluster starts with: the static map's groups
// and members' addresses at epoch 1.
func BootstrapMap(static *SlotMap, members []Member) *kv.ClusterMap {
	cm := &kv.ClusterMap{Epoch: 1}
	for _, mb := range members {
		cm.Nodes = append(cm.Nodes, kv.MapNode{ID: mb.ID, ClientAddr: mb.ClientAddr, PeerAddr: mb.PeerAddr})
	}
	slices.SortFunc(cm.Nodes, func(a, b kv.MapNode) int { return int(a.ID) - int(b.ID) })
	for _, g := range static.Groups {
		mg := kv.MapGroup{ID: uint64(g.ID), Members: slices.Clone(g.Members), Engine: g.Engine}
		for _, r := range g.Slots {
			mg.Slots = append(mg.Slots, kv.SlotRange{Start: r.Start, End: r.End})
		}
		cm.Groups = append(cm.Groups, mg)
	}
	return cm
}

// SlotMapOf is the routing map of a cluster map.
func SlotMapOf(cm *kv.ClusterMap) (*SlotMap, error) {
	gs := make([]GroupSpec, 0, len(cm.Groups))
	for _, g := range cm.Groups {
		spec := GroupSpec{ID: GroupID(g.ID), Members: slices.Clone(g.Members), Engine: g.Engine}
		for _, r := range g.Slots {
			spec.Slots = append(spec.Slots, SlotRange{r.Start, r.End})
		}
		gs = append(gs, spec)
	}
	return NewSlotMap(cm.Epoch, gs)
}

// metaState is a Multi's side of the metadata group.
type metaState struct {
	// g is this node's replica of it (nil: not hosted): set when the node
	// opens it, or later when the map names the node a member (a new
	// member of the group), cleared when it retires.
	g       atomic.Pointer[localGroup]
	follows atomic.Bool                   // the routing map is the metadata group's
	boot    atomic.Pointer[kv.ClusterMap] // the map to bootstrap the group with (nil: none)
	cm      atomic.Pointer[kv.ClusterMap]
	mu      sync.Mutex
	ver     uint64 // the record version cm was read at
	// changed is closed (and replaced) each time cm changes, under mu:
	// the long polls held at the leader (WaitMetaMap) wait on it.
	changed chan struct{}
	resume  resumer
	repair  Repairer
	zone    zoneRecorder
}

// smap is the map this node routes by when no hosted table knows better.
func (m *Multi) smap() *SlotMap { return m.slots.Load() }

// HostMeta makes this node's replica of the metadata group part of m:
// bootstrap is the map to start the group with (from --groups), and the
// routing map becomes the group's as this replica applied it (read here
// once, before m serves anything).
func (m *Multi) HostMeta(h Hosted, bootstrap *kv.ClusterMap) error {
	if err := m.hostMeta(h, bootstrap); err != nil {
		return err
	}
	_, err := m.RefreshMap()
	return err
}

func (m *Multi) hostMeta(h Hosted, bootstrap *kv.ClusterMap) error {
	m.meta.mu.Lock()
	defer m.meta.mu.Unlock()
	if !m.meta.g.CompareAndSwap(nil, &localGroup{spec: GroupSpec{ID: MetaGroupID, Members: nil}, h: h}) {
		return errors.New("cluster: this node hosts a replica of the metadata group already")
	}
	m.meta.boot.Store(bootstrap)
	m.meta.ver = 0 // this replica's record versions are its own
	m.meta.follows.Store(true)
	return nil
}

// UnhostMeta takes this node's replica of the metadata group out of m (it
// retired: the group no longer has this node) and returns it for the caller
// to close; the node polls the map from then on.
func (m *Multi) UnhostMeta() (Hosted, bool) {
	g := m.meta.g.Swap(nil)
	if g == nil {
		return Hosted{}, false
	}
	return g.h, true
}

// MetaHosted returns this node's replica of the metadata group.
func (m *Multi) MetaHosted() (LocalGroup, bool) {
	g := m.metaG()
	if g == nil {
		return LocalGroup{}, false
	}
	return LocalGroup{Spec: g.spec, Hosted: g.h}, true
}

func (m *Multi) metaG() *localGroup { return m.meta.g.Load() }

// HostsMeta reports whether this node hosts a replica of the metadata group.
func (m *Multi) HostsMeta() bool { return m.metaG() != nil }

// MetaMembers returns the metadata group's members as this node knows
// them: its map's, or the first by id of the nodes it knows.
func (m *Multi) MetaMembers() []uint64 {
	if cm := m.ClusterMap(); cm != nil {
		return cm.MetaMembers()
	}
	return MetaMembers(m.nodeIDs())
}

// ClusterMap returns the metadata group's map as this node's replica last
// applied it (nil: none yet, or not hosted here).
func (m *Multi) ClusterMap() *kv.ClusterMap { return m.meta.cm.Load() }

// RefreshMap reads the map from this node's replica of the metadata group
// and, if it changed, routes by it from now on (never by an older epoch than
// the one it routes by). It reports whether the map changed.
func (m *Multi) RefreshMap() (bool, error) {
	g := m.metaG()
	if g == nil {
		return false, nil
	}
	v, err := g.h.Engine.Get(kv.ClusterMapKey)
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cluster: read the cluster map: %w", err)
	}
	m.meta.mu.Lock()
	defer m.meta.mu.Unlock()
	if v.Version == m.meta.ver {
		return false, nil
	}
	cm, err := kv.DecodeClusterMap(v.Data)
	if err != nil {
		return false, fmt.Errorf("cluster: the cluster map at version %d: %w", v.Version, err)
	}
	sm, err := SlotMapOf(cm)
	if err != nil {
		return false, fmt.Errorf("cluster: the cluster map at epoch %d: %w", cm.Epoch, err)
	}
	m.meta.ver = v.Version
	m.adopt(cm, sm)
	return true, nil
}

// adopt makes cm (whose routing map is sm) the map this node routes by,
// unless it routes by a newer one already. Callers hold m.meta.mu.
func (m *Multi) adopt(cm *kv.ClusterMap, sm *SlotMap) {
	if cur := m.smap(); sm.Epoch < cur.Epoch || (m.meta.follows.Load() && m.meta.cm.Load() != nil && cm.Epoch < m.meta.cm.Load().Epoch) {
		return
	}
	m.meta.cm.Store(cm)
	m.slots.Store(sm)
	m.meta.follows.Store(true)
	if m.meta.changed != nil {
		close(m.meta.changed)
		m.meta.changed = nil
	}
}

// mapChanged returns a channel closed at the next change of the map this
// node's replica applied (adopt).
func (m *Multi) mapChanged() <-chan struct{} {
	m.meta.mu.Lock()
	defer m.meta.mu.Unlock()
	if m.meta.changed == nil {
		m.meta.changed = make(chan struct{})
	}
	return m.meta.changed
}

// WaitMetaMap is MetaMap(false) held until the map's epoch is above since
// or ctx ends (then the map as it is): the long poll of a node without a
// metadata replica (KEFIR.SLOTS META MAP SINCE e WAIT ms). The leader's
// replica adopts a change within FollowConfig.Every of applying it, and
// the waiters answer then — rather than at the poller's next poll.
func (m *Multi) WaitMetaMap(ctx context.Context, since uint64) (*kv.ClusterMap, error) {
	for {
		ch := m.mapChanged() // before reading: a change after the read closes it
		cm, err := m.MetaMap(false)
		if err != nil || cm == nil || cm.Epoch > since {
			return cm, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return cm, nil
		}
	}
}

// pollMap is the follower of a node without a replica of the metadata
// group: it asks the group's leader for its map (KEFIR.SLOTS META MAP, at
// the metadata members' client addresses; -MOVED followed) and adopts it
// when its epoch is newer. Until the first answer the node routes by its
// tables over the static map.
func (m *Multi) pollMap(ctx context.Context, mv *Mover, wait time.Duration) error {
	var since uint64
	cur := m.ClusterMap()
	if cur != nil {
		since = cur.Epoch
	}
	cm, err := mv.MetaMapWait(ctx, since, wait)
	if err != nil {
		return err
	}
	if cm == nil || (cur != nil && cm.Epoch <= cur.Epoch) {
		return nil // unchanged
	}
	sm, err := SlotMapOf(cm)
	if err != nil {
		return fmt.Errorf("cluster: the metadata leader's map at epoch %d: %w", cm.Epoch, err)
	}
	m.meta.mu.Lock()
	defer m.meta.mu.Unlock()
	m.adopt(cm, sm)
	return nil
}

// metaSeeds are the client addresses of the metadata group's members, then
// of the other nodes (each sends the asker on to the members it knows).
func (m *Multi) metaSeeds() []string {
	var out []string
	ms := m.MetaMembers()
	for _, id := range ms {
		if a := m.member(id).ClientAddr; a != "" {
			out = append(out, a)
		}
	}
	for _, id := range m.nodeIDs() {
		if a := m.member(id).ClientAddr; a != "" && id != m.self && !slices.Contains(ms, id) {
			out = append(out, a)
		}
	}
	return out
}

// MetaLeads reports whether this node leads the metadata group.
func (m *Multi) MetaLeads() bool {
	g := m.metaG()
	return g != nil && m.leads(g) == nil
}

// MetaWrite proposes a metadata op (kv.KindMap*) at the metadata group's
// leader here.
func (m *Multi) MetaWrite(ctx context.Context, op kv.Op) (kv.Result, error) {
	if op.Kind < kv.KindMapInit || !kv.IsSlotKind(op.Kind) {
		return kv.Result{}, fmt.Errorf("cluster: %s is not a metadata op", op.Kind)
	}
	return m.SlotWrite(ctx, MetaGroupID, op)
}

// MetaMap returns the map at the metadata group's leader (here; otherwise
// the not-leader error that names it), or, with local, this node's replica's.
func (m *Multi) MetaMap(local bool) (*kv.ClusterMap, error) {
	g, err := m.hosted(MetaGroupID)
	if err != nil {
		return nil, err
	}
	if !local {
		if err := m.leads(g); err != nil {
			return nil, err
		}
	}
	if _, err := m.RefreshMap(); err != nil {
		return nil, err
	}
	return m.ClusterMap(), nil
}

// FollowConfig is how a node's metadata follower reaches the cluster when
// it drives a move (resumeMoves): the client addresses of nodes, the
// password and TLS settings a client needs.
type FollowConfig struct {
	Seeds    []string
	Password string
	TLS      *tls.Config
	// Every is how often the replica's map is read (default 50 ms).
	Every time.Duration
	// Lease is a move driver's lease (default DefaultLease): a move whose
	// beat has not changed for two of them is taken over.
	Lease time.Duration
	// RepairAfter is kefir server's --repair-after: at the leader, a node
	// of the map that hosts replicas and has not answered for it has them
	// re-created on live nodes (repair.go; 0: no repair).
	RepairAfter time.Duration
	// Zone is kefir server's --zone ("": none): while the map has this
	// node with another zone, the follower asks the metadata group to
	// record it (zoneRecorder).
	Zone string
	Logf func(format string, args ...any)
}

// FollowMap follows the metadata group until ctx ends: it reads this node's
// replica's map every cfg.Every and routes by it when it changes; while
// this node leads the group, it bootstraps the map, resumes abandoned
// moves and repairs failed nodes (cfg.RepairAfter, repair.go).
func (m *Multi) FollowMap(ctx context.Context, cfg FollowConfig) {
	every := cfg.Every
	if every <= 0 {
		every = 50 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	rep := &m.meta.repair
	rep.mu.Lock()
	rep.After, rep.Net, rep.Logf = cfg.RepairAfter, &Mover{Seeds: cfg.Seeds, Password: cfg.Password, TLS: cfg.TLS}, cfg.Logf
	rep.mu.Unlock()
	// A node without a replica polls the leader every ten ticks; one may
	// start hosting a replica (a new member) or stop (it retired).
	var pl poller
	defer pl.close()
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			m.meta.zone.wg.Wait()
			m.meta.resume.wait()
			rep.Lost()
			rep.Wait()
			return
		case <-t.C:
		}
		m.meta.zone.tick(ctx, m, cfg)
		if m.metaG() == nil {
			// A long poll each tick: the leader holds it until the map
			// changes (MapWait at most). A leader too old to hold one is
			// asked every ten ticks.
			if !pl.noWait() || tick%10 == 0 {
				pl.poll(ctx, m, cfg, 10*every)
			}
			continue
		}
		if _, err := m.RefreshMap(); err != nil && cfg.Logf != nil {
			cfg.Logf("metadata: %v", err)
		}
		if !m.MetaLeads() {
			rep.Lost()
			continue
		}
		cm := m.ClusterMap()
		if boot := m.meta.boot.Load(); cm == nil && boot != nil {
			op := kv.Op{Kind: kv.KindMapInit, Key: kv.AppendClusterMap(nil, boot)}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if _, err := m.MetaWrite(wctx, op); err != nil && cfg.Logf != nil {
				cfg.Logf("metadata: bootstrap the cluster map: %v", err)
			}
			cancel()
			continue
		}
		if cm != nil {
			m.meta.resume.tick(ctx, m, cm, cfg)
			rep.Tick(ctx, cm)
		}
	}
}

// poller is the follower of a node without a replica of the metadata group.
type poller struct {
	mv     *Mover
	logged bool
}

func (p *poller) close() {
	if p.mv != nil {
		p.mv.close()
	}
}

// MapWait is how long a metadata leader holds a node's poll for a map newer
// than the node's (KEFIR.SLOTS META MAP SINCE e WAIT ms): long enough that
// an idle cluster's polls cost the leader one request per node every two
// seconds, short against a connection's read timeout.
const MapWait = 2 * time.Second

// noWait reports whether the leader answered that it does not hold polls
// (an older version): the poller then asks at the old pace.
func (p *poller) noWait() bool { return p.mv != nil && p.mv.noWait }

// poll asks the metadata group's leader for its map once, held until it
// changes or MapWait passes (the seeds are recomputed each time: the
// group's members may have changed).
func (p *poller) poll(ctx context.Context, m *Multi, cfg FollowConfig, every time.Duration) {
	seeds := m.metaSeeds()
	if len(seeds) == 0 {
		return
	}
	if p.mv == nil {
		p.mv = &Mover{Password: cfg.Password, TLS: cfg.TLS, RetryFor: every}
	}
	p.mv.Seeds = seeds
	pctx, cancel := context.WithTimeout(ctx, 5*every+MapWait)
	err := m.pollMap(pctx, p.mv, MapWait)
	cancel()
	if err != nil && !p.logged && cfg.Logf != nil {
		cfg.Logf("metadata: poll the map: %v", err) // once: the group may be starting
		p.logged = true
	}
}

// DefaultLease is a move driver's lease: it renews it (a claim in the
// metadata group) every quarter of it and stops driving if it could not for
// a whole one; a move whose beat has not moved for two leases is taken over.
const DefaultLease = 2 * time.Second

// resumer takes over, at the metadata group's leader, a move in flight
// whose driver stopped renewing its lease (killed, cut off): it watches the
// move's beat (MoveWatch), and after two leases without a change claims it
// with the beat it saw and runs Mover.Move (ResumeMover), which resumes
// from the groups' tables.
type resumer struct {
	mu      sync.Mutex
	watch   MoveWatch
	running bool
	wg      sync.WaitGroup
}

// MoveWatch is the resumer's decision, pure (the caller gives the time and
// the map its replica applied; no clock, goroutine or I/O), so that the
// move simulation (internal/vrshard, move_sim_test.go) runs the one the
// node runs: a move in flight is due to be taken over once its beat has
// not changed for two leases of watching. A watch starts afresh at a new
// leader (its node's first tick as leader), so a driver is given two whole
// leases by whichever node watches it.
type MoveWatch struct {
	epoch, beat uint64
	since       time.Time
}

// Due reports the move of cm to take over now, if any.
func (w *MoveWatch) Due(now time.Time, cm *kv.ClusterMap, lease time.Duration) (kv.MapMove, bool) {
	if cm == nil || len(cm.Moves) == 0 {
		w.epoch = 0
		return kv.MapMove{}, false
	}
	mv := cm.Moves[0]
	if mv.Epoch != w.epoch || mv.Beat != w.beat {
		w.epoch, w.beat, w.since = mv.Epoch, mv.Beat, now
		return kv.MapMove{}, false
	}
	if lease <= 0 {
		lease = DefaultLease
	}
	if now.Sub(w.since) < 2*lease {
		return kv.MapMove{}, false
	}
	return mv, true
}

// Reset forgets what the watch saw (a take-over runs: the next watch
// starts afresh when it ends).
func (w *MoveWatch) Reset() { w.epoch = 0 }

// ResumeMover is the driver that takes over rec for node self: it claims
// the move at the beat its watch saw (TakeOver, no second watch) and holds
// it under lease like any driver. The caller sets Seeds, credentials and
// Logf (and, simulated, Transport, Clock and Rand) and runs Move.
func ResumeMover(self uint64, rec kv.MapMove, lease time.Duration) *Mover {
	if lease <= 0 {
		lease = DefaultLease
	}
	return &Mover{Meta: true, Lease: lease, Driver: fmt.Sprintf("node %d (resumed)", self), TakeOver: rec.Beat}
}

func (r *resumer) tick(ctx context.Context, m *Multi, cm *kv.ClusterMap, cfg FollowConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		r.watch.Reset()
		return
	}
	mv, due := r.watch.Due(time.Now(), cm, cfg.Lease)
	if !due {
		return
	}
	r.running = true
	r.wg.Add(1)
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	go func() {
		defer r.wg.Done()
		d := ResumeMover(m.self, mv, cfg.Lease)
		d.Seeds, d.Password, d.TLS, d.Logf = cfg.Seeds, cfg.Password, cfg.TLS, logf
		rs := slices.Clone(mv.Slots)
		logf("metadata: the move of %s from group %d to group %d at epoch %d has had no driver for %v (last driver %q): resuming it",
			FormatSlotRanges(rs), mv.From, mv.To, mv.Epoch, 2*d.Lease, mv.Driver)
		// A record marked for abort (move-slots --abort) is settled: rolled
		// back before its hand-over, finished after (Mover.settle).
		res, err := d.Move(ctx, GroupID(mv.From), GroupID(mv.To), rs)
		if errors.Is(err, ErrMoveRolledBack) {
			logf("metadata: resumed move at epoch %d, marked for abort, rolled back", mv.Epoch)
		} else if err != nil {
			logf("metadata: resumed move at epoch %d: %v", mv.Epoch, err)
		} else {
			logf("metadata: resumed move at epoch %d done (%s)", res.Epoch, res.Resumed)
		}
		r.mu.Lock()
		r.running = false
		r.watch.Reset()
		r.mu.Unlock()
	}()
}

func (r *resumer) wait() { r.wg.Wait() }
