package vrshard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/storage"
)

// The metadata group in the move simulation (moveOptions.meta; issue 28,
// docs/design/cluster.md §4 and §9): a VR group of three production
// replicas in stepped mode, hosted by the first three nodes (as
// cluster.MetaMembers places it), whose state is the cluster map. Its
// leader bootstraps the map from the static one (KindMapInit, as
// Multi.FollowMap does); the mover records every move there (Mover.Meta:
// PLAN before its first step, a lease renewed by CLAIM, DONE after the
// purge; every step fenced by the driver's epoch and beat), through the
// KEFIR.SLOTS META translation the server runs (cluster.MetaCommand); the
// nodes route by the map their replica applied over their tables
// (cluster.SlotOwner with the map followed, as Multi.owner); and a mover
// killed mid-move is not run again at once: the node that leads the
// metadata group watches the move's beat (cluster.MoveWatch, the resumer's
// decision) and, two leases later, takes it over with the production
// driver (cluster.ResumeMover: a claim at the beat it saw, then Mover.Move
// from the groups' tables) as a third coroutine (resumeRun). The killed
// mover's command is run again four leases later, as an operator reruns
// kefir cluster move-slots: it finds the move done, or takes it over itself
// after watching its beat (two takers: the claim's compare-and-set lets one
// win). Replacements record the new node (ADDNODE) and the group's members
// (SETMEMBERS) in the map after the reconfiguration, as kefir cluster
// replace-node does.
//
// Checks, on top of moveSim's: the map's epoch never goes down at any
// metadata replica, across its restarts (metaStepped); every map any
// replica applied gives each slot one owner and two maps at one epoch agree
// (check.SlotOwners); and at the end every started move was finished or
// rolled back — the map records none in flight and names, for every moved
// slot, the group whose table owns it (metaSettled).

// metaLease is the movers' lease in the simulation (DefaultLease is 2 s,
// longer than a run's moves): renewed every quarter of it, a move taken
// over after two of them without a renewal. A claim's round trip times out
// at moverTimeout on a lossy network: at 300 ms (two tries) drivers lost
// their lease so often that a move now and then did not finish within the
// 4 s after the faults (seeds 195 of faults, 158 of power cuts).
const metaLease = 500 * time.Millisecond

// metaState is the simulation's account of the metadata group.
type metaState struct {
	// addrs: the group's members (replica addresses; first on nodes
	// 1-3); static: those first three, started with the run; all: every
	// replica it ever had (a drain of a metadata member adds one).
	addrs, static, all []int
	// seen: by replica, the last map record version and epoch it applied
	// and the incarnation that did (inc); obs: every distinct map applied,
	// for check.SlotOwners; err: the first map epoch that went down while
	// a replica ran; back: the restarts whose replica came back with an
	// older map than it had applied (a committed op it applied before
	// its own log had it durable: VR applies what a majority holds).
	seen map[int][2]uint64
	inc  map[int]*hostNode
	obs  []check.MapObservation
	err  error
	back int
	// planned: the epochs of the moves some replica's map recorded in
	// flight; top: the highest map epoch applied.
	planned map[uint64]bool
	top     uint64
	// checkAborts (moveOptions.abort): handedOver checks that a move some
	// map showed marked for abort (kv.MapMove.AbortWanted) before its
	// source applied its hand-over is never handed over. from: each
	// recorded move's source, by epoch; marked: the moves marked; handed:
	// the moves a replica of their source applied the hand-over of.
	checkAborts    bool
	from           map[uint64]uint64
	marked, handed map[uint64]bool
	// routes: by node, the map it routes by and its epoch (never lower:
	// Multi.adopt), as its replica applied it.
	routes map[int]*kcluster.SlotMap
}

// addMeta places the metadata group's three replicas on the first three
// nodes (kv.DefaultMetaMembers: the lowest ids), at the addresses after the
// data groups' (before any spare).
func (c *simCluster) addMeta() {
	c.meta = &metaState{seen: map[int][2]uint64{}, inc: map[int]*hostNode{}, planned: map[uint64]bool{}, routes: map[int]*kcluster.SlotMap{},
		from: map[uint64]uint64{}, marked: map[uint64]bool{}, handed: map[uint64]bool{}}
	for k := range movesGroupSize {
		a := len(c.node)
		c.meta.addrs = append(c.meta.addrs, a)
		c.meta.static = append(c.meta.static, a)
		c.meta.all = append(c.meta.all, a)
		c.node = append(c.node, k)
		c.group = append(c.group, kcluster.MetaGroupID)
		c.tabs = append(c.tabs, nil)
		c.hosted[k] = append(c.hosted[k], a)
	}
}

func (c *simCluster) isMeta(a int) bool { return c.meta != nil && slices.Contains(c.meta.all, a) }

// metaCluster is the metadata group's VR cluster id (a replica's, as
// newHostNode numbers its first members' block of addresses).
func (c *simCluster) metaCluster() uint64 { return 7 + uint64(c.meta.static[0]/movesGroupSize) }

// metaMap is the map replica n applied (nil: none yet) and its record's
// version.
func (n *hostNode) metaMap() (*kv.ClusterMap, uint64) {
	v, err := n.r.db.Get(kv.ClusterMapKey)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, 0
	}
	if err != nil {
		panic(fmt.Sprintf("replica %d: read the cluster map: %v", n.id, err))
	}
	cm, err := kv.DecodeClusterMap(v.Data)
	if err != nil {
		panic(fmt.Sprintf("replica %d: the cluster map at version %d: %v", n.id, v.Version, err))
	}
	return cm, v.Version
}

// metaVersion is the version of the map record replica n applied (0:
// none), without decoding it.
func (n *hostNode) metaVersion() uint64 {
	v, err := n.r.db.Get(kv.ClusterMapKey)
	if err != nil {
		return 0
	}
	return v.Version
}

// leads reports whether replica n leads its group.
func (n *hostNode) leads() bool { return n.r.failed() == nil && n.r.isLeader.Load() }

// bootMap is the map the group starts with (cluster.BootstrapMap of the
// static map and the nodes).
func (c *simCluster) bootMap() *kv.ClusterMap {
	var ms []kcluster.Member
	for k := range c.seeds {
		ms = append(ms, kcluster.Member{ID: uint64(k + 1), ClientAddr: nodeAddr(k), PeerAddr: fmt.Sprintf("peer%d", k)})
	}
	sm := c.smap
	if len(c.unadded) > 0 {
		// Without the groups an add-group adds later (groupop_sim_test.go).
		gs := slices.DeleteFunc(slices.Clone(sm.Groups), func(g kcluster.GroupSpec) bool { return c.unadded[g.ID] })
		var err error
		if sm, err = kcluster.NewSlotMap(sm.Epoch, gs); err != nil {
			panic(err)
		}
	}
	return kcluster.BootstrapMap(sm, ms)
}

// metaStepped follows metadata replica n after its step: its leader
// proposes the first map while it has none (Multi.FollowMap's bootstrap),
// and a map it applied is checked (its epoch never below the one it
// applied before, across restarts), recorded for check.SlotOwners and
// adopted by its node's routing if newer (Multi.adopt).
func (c *simCluster) metaStepped(n *hostNode) {
	ms, a := c.meta, int(n.id)
	ver := n.metaVersion()
	if ver == 0 {
		if n.leads() && !n.booting {
			n.booting = true
			reqs := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindMapInit, Key: kv.AppendClusterMap(nil, c.bootMap())}, Durability: level.Sync}}
			if w := n.r.ProposeStepped(reqs); w != nil {
				n.slots = append(n.slots, hostSlotWrite{from: -1, w: w, meta: true})
			} else {
				n.booting = false
			}
		}
		return
	}
	if ms.seen[a][0] == ver && ms.inc[a] == n {
		return
	}
	cm, _ := n.metaMap()
	k := c.node[a]
	if last := ms.seen[a][1]; cm.Epoch < last {
		switch {
		case ms.inc[a] != n:
			// Restarted with less than it had applied: its node routes by
			// this map from its start (Multi.HostMeta reads it), its
			// tables and the fences correcting it, until the replica
			// catches up.
			ms.back++
			if sm := ms.routes[k]; sm != nil && sm.Epoch > cm.Epoch {
				delete(ms.routes, k)
			}
		case ms.err == nil:
			ms.err = fmt.Errorf("metadata replica %d (node %d): the map's epoch went down from %d to %d (record version %d) while it ran", a, k+1, last, cm.Epoch, ver)
		}
	}
	ms.seen[a], ms.inc[a] = [2]uint64{ver, cm.Epoch}, n
	o := check.MapObservation{Source: fmt.Sprintf("metadata replica %d at version %d", a, ver), Epoch: cm.Epoch}
	for _, g := range cm.Groups {
		for _, r := range g.Slots {
			o.Ranges = append(o.Ranges, check.OwnedRange{Start: r.Start, End: r.End, Group: g.ID})
		}
	}
	ms.obs = append(ms.obs, o)
	ms.top = max(ms.top, cm.Epoch)
	for _, mv := range cm.Moves {
		ms.planned[mv.Epoch] = true
		ms.from[mv.Epoch] = mv.From
		if mv.AbortWanted {
			ms.marked[mv.Epoch] = true
		}
	}
	if len(cm.Removed) > 0 {
		c.retireRemoved(k, cm) // groupop_sim_test.go
	}
	if len(c.unadded) > 0 {
		c.startAdded(k, cm) // groupop_sim_test.go
	}
	if cur := ms.routes[k]; cur == nil || cm.Epoch > cur.Epoch {
		sm, err := kcluster.SlotMapOf(cm)
		if err != nil {
			panic(fmt.Sprintf("metadata replica %d: %v", a, err))
		}
		ms.routes[k] = sm
	}
}

// routeMap is the map node k routes by and whether it is the metadata
// group's (cluster.SlotOwner's followed): the map its metadata replica
// applied, once it has one; else the static map (a node without a
// metadata replica polls the leader in production; here it keeps the
// static map, its tables correcting it).
func (c *simCluster) routeMap(k int) (*kcluster.SlotMap, bool) {
	if c.meta != nil {
		if sm := c.meta.routes[k]; sm != nil {
			return sm, true
		}
	}
	return c.smap, false
}

// onMeta runs KEFIR.SLOTS META at a metadata replica as the server's
// metaCmd does: the shared translation, then the map (MAP) or the op
// proposed, at the group's leader; elsewhere -MOVED to the leader's node.
func (n *hostNode) onMeta(from sim.Addr, m moverReq) {
	cmd, err := kcluster.MetaCommand(m.Args)
	if err == nil {
		err = simSlots{n}.led(kcluster.MetaGroupID)
	}
	if err != nil {
		n.replySlots(from, m.Seq, errValue(err))
		return
	}
	if cmd.Map {
		cm, _ := n.metaMap()
		switch {
		case cm == nil:
			n.replySlots(from, m.Seq, resp.Value{Kind: resp.Error, Str: []byte("TRYAGAIN the metadata group has no map yet (bootstrapping)")})
		case cmd.Since > 0 && cm.Epoch <= cmd.Since:
			n.replySlots(from, m.Seq, resp.Value{Kind: resp.Null})
		default:
			b, err := json.Marshal(cm)
			if err != nil {
				panic(err)
			}
			n.replySlots(from, m.Seq, resp.Value{Kind: resp.Bulk, Str: b})
		}
		return
	}
	reqs := []shard.WriteReq{{Op: cmd.Op, Durability: level.Sync}}
	w := n.r.ProposeStepped(reqs)
	if w == nil {
		n.replySlots(from, m.Seq, errValue(reqs[0].Err))
		return
	}
	n.slots = append(n.slots, hostSlotWrite{from: from, seq: m.Seq, w: w, meta: true})
}

// metaLeader is the metadata replica that leads (nil: none up leads).
func (c *simCluster) metaLeader() *hostNode {
	for _, a := range c.meta.addrs {
		if n, ok := c.s.Replica(a).(*hostNode); ok && n.leads() {
			return n
		}
	}
	return nil
}

// resumeRun is the resumer of the node that leads the metadata group (the
// production resumer's decision, cluster.MoveWatch, per node; its driver,
// cluster.ResumeMover): a move whose beat stood still for two leases is
// taken over and run to its end from the groups' tables. One take-over at
// a time, on the node that started it; it dies with that node's metadata
// replica (the node's process).
type resumeRun struct {
	s      *sim.Sim
	cl     *simCluster
	watch  map[int]*kcluster.MoveWatch // by node
	node   int                         // the node running a take-over
	runs   int
	ok     int
	deaths int
	// rolledBack: take-overs that found the record marked for abort and
	// rolled the move back (Mover.settle).
	rolledBack int
	log        []string
}

func (r *resumeRun) next(time.Duration) (*kcluster.Mover, moverJob) {
	n := r.cl.metaLeader()
	if n == nil {
		return nil, nil
	}
	cm, _ := n.metaMap()
	k := r.cl.node[n.id]
	w := r.watch[k]
	if w == nil {
		w = &kcluster.MoveWatch{}
		r.watch[k] = w
	}
	rec, due := w.Due(time.Unix(0, simEpoch+int64(r.s.Now())), cm, metaLease)
	if !due {
		return nil, nil
	}
	w.Reset()
	r.node, r.runs = k, r.runs+1
	mv := kcluster.ResumeMover(uint64(k+1), rec, metaLease)
	mv.Page, mv.PagePause, mv.RetryFor = 2, time.Millisecond, time.Second
	mv.Rand = func() uint64 { return r.s.Rand().Uint64() }
	for x := range r.cl.seeds {
		mv.Seeds = append(mv.Seeds, nodeAddr(x))
	}
	r.log = append(r.log, fmt.Sprintf("%v: node %d takes over the move at epoch %d (driver %q, beat %d)", r.s.Now(), k+1, rec.Epoch, rec.Driver, rec.Beat))
	from, to, rs := kcluster.GroupID(rec.From), kcluster.GroupID(rec.To), slices.Clone(rec.Slots)
	return mv, func(ctx context.Context, mv *kcluster.Mover) (any, error) {
		return mv.Move(ctx, from, to, rs)
	}
}

// kill: the take-over dies with its node's metadata replica.
func (r *resumeRun) kill(time.Duration) bool {
	if a := r.cl.replicaAt(r.node, kcluster.MetaGroupID); a >= 0 && r.s.Up(a) {
		return false
	}
	r.deaths++
	return true
}

func (r *resumeRun) afterStep(string) bool { return false }

func (r *resumeRun) done(_ time.Duration, v any, err error) {
	if errors.Is(err, kcluster.ErrMoveRolledBack) {
		r.rolledBack++
	}
	if err != nil {
		r.log = append(r.log, fmt.Sprintf("%v: node %d's take-over: %v", r.s.Now(), r.node+1, err))
		return
	}
	r.ok++
	res := v.(kcluster.MoveResult)
	r.log = append(r.log, fmt.Sprintf("%v: node %d's take-over finished the move at epoch %d (resumed: %q)", r.s.Now(), r.node+1, res.Epoch, res.Resumed))
}

// metaSettled is the end of a run with the metadata group: every map a
// replica applied passes check.SlotOwners, no map epoch went down, the
// leader's map records no move in flight (each started move finished or
// was rolled back) and gives every slot the moves touched to the group
// whose table owns it now.
func metaSettled(c *simCluster, rs []kv.SlotRange, at map[uint16]kcluster.GroupID) error {
	ms := c.meta
	if ms.err != nil {
		return ms.err
	}
	if vs := check.SlotOwners(ms.obs); len(vs) > 0 {
		return fmt.Errorf("the metadata group's maps: %s", vs[0].Reason)
	}
	n := c.metaLeader()
	if n == nil {
		return errors.New("the metadata group has no leader after the faults ended")
	}
	cm, _ := n.metaMap()
	if cm == nil {
		return errors.New("the metadata group has no map after the run")
	}
	if len(cm.Moves) > 0 {
		mv := cm.Moves[0]
		return fmt.Errorf("the map (epoch %d) still records the move of %v from group %d to group %d at epoch %d in flight (driver %q, beat %d): it was neither finished nor rolled back",
			cm.Epoch, mv.Slots, mv.From, mv.To, mv.Epoch, mv.Driver, mv.Beat)
	}
	// Each group's members as its last reconfiguration answered them
	// (SETMEMBERS after a replacement).
	for gi, ms := range c.members {
		if c.removed[kcluster.GroupID(gi+1)] {
			continue // out of the map (groupop_sim_test.go)
		}
		var want []uint64
		for _, a := range ms {
			want = append(want, uint64(c.node[a]+1))
		}
		i := slices.IndexFunc(cm.Groups, func(g kv.MapGroup) bool { return g.ID == uint64(gi+1) })
		if i < 0 || !sameIDs(cm.Groups[i].Members, want) {
			return fmt.Errorf("the map (epoch %d) does not record group %d's members %v: %+v", cm.Epoch, gi+1, want, cm.Groups)
		}
	}
	sm, err := kcluster.SlotMapOf(cm)
	if err != nil {
		return err
	}
	var slots []uint16
	for _, r := range rs {
		for sl := int(r.Start); sl <= int(r.End); sl++ {
			slots = append(slots, uint16(sl))
		}
	}
	for sl := range at {
		slots = append(slots, sl)
	}
	for _, sl := range slots {
		owner, epoch := kcluster.GroupID(0), uint64(0)
		for g := range c.groups() {
			for _, a := range c.members[g] {
				node, ok := c.s.Replica(a).(*hostNode)
				if !ok || !node.leads() {
					continue
				}
				if t := node.r.SlotTable(); t != nil {
					if e := t.Entry(sl); e.State == kv.SlotOwned && e.Epoch >= epoch {
						owner, epoch = kcluster.GroupID(g+1), e.Epoch
					}
				}
			}
		}
		if owner != 0 && (sm.Owner(sl) != owner || epoch > cm.Epoch) {
			return fmt.Errorf("slot %d: the map (epoch %d) gives it to group %d, group %d's table owns it at epoch %d", sl, cm.Epoch, sm.Owner(sl), owner, epoch)
		}
	}
	return nil
}

// TestMoveSimMeta runs the move simulation with the metadata group
// (moveOptions.meta): the moves recorded under a lease, the nodes routing
// by the map, killed movers taken over by the metadata leader's resumer,
// the metadata group's replicas crashed and partitioned with the others
// (the nemesis, power cuts, whole nodes); moveSim's checkers and
// metaSettled's. KEFIR_SOAK=1: 500, 250, 250, 100, 100, 250 seeds;
// KEFIR_SIM_SEEDS=n: n of each.
func TestMoveSimMeta(t *testing.T) {
	seeds := 10
	if soakOn() {
		seeds = 500
	}
	for _, tc := range []struct {
		name string
		o    moveOptions
		n    int
	}{
		{"faults", moveOptions{meta: true, faults: true, leaderCrashes: true, moverDeaths: true}, seeds},
		{"powercuts", moveOptions{meta: true, powerCuts: true, leaderCrashes: true, moverDeaths: true}, seeds / 2},
		{"replace", moveOptions{meta: true, faults: true, leaderCrashes: true, moverDeaths: true, replace: 1}, seeds / 2},
		{"9x12", moveOptions{meta: true, scale: &moveScale{nodes: 9, groups: 12, keys: 8, clients: 6, ops: 60, replace: 2}, faults: true, leaderCrashes: true, moverDeaths: true, replace: 2}, seeds / 5},
		{"drain", moveOptions{meta: true, drain: true, scale: &moveScale{nodes: 9, groups: 12, keys: 8, clients: 6, ops: 60}, faults: true, leaderCrashes: true, moverDeaths: true}, seeds / 5},
		// Node 3 of three: both data groups and the metadata group move
		// to a new node 4.
		{"drainmeta", moveOptions{meta: true, drain: true, faults: true, leaderCrashes: true, moverDeaths: true}, seeds / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim.Explore(t, 1, max(tc.n, 1), func(seed uint64, trace io.Writer) error {
				var sum string
				err := moveSim(seed, trace, tc.o, &sum)
				if testing.Verbose() {
					t.Logf("seed %d: %s", seed, sum)
				}
				return err
			})
		})
	}
}

// TestMoveSimMetaTakeOverAfterEachStep kills the mover right after each
// step of the first move in turn (as TestMoveSimResumesAfterEachStep) with
// the move recorded: the metadata leader's resumer must take it over —
// claim it at the beat it watched stand still, fence the groups at its
// own beat — and finish it from the tables before the killed command is
// run again.
func TestMoveSimMetaTakeOverAfterEachStep(t *testing.T) {
	for _, step := range []string{"importing", "migrating", "precopy-page", "precopy", "handover", "finalcopy", "owned"} {
		t.Run(step, func(t *testing.T) {
			sim.Explore(t, 1, 1, func(seed uint64, trace io.Writer) error {
				var sum string
				err := moveSim(seed, trace, moveOptions{meta: true, killAfter: step}, &sum)
				if err == nil && !strings.Contains(sum, "take-overs by the metadata leader (1 finished") {
					return fmt.Errorf("the metadata leader did not finish the move the mover died in after %s: %s", step, sum)
				}
				return err
			})
		})
	}
}

// recorded checks a data group's step of a move at epoch e (a slot
// migrating or importing), as replica a applied it: the metadata group
// recorded the move before (a map some replica applied names it in flight,
// or is at e or later: done or rolled back). The driver plans the move
// before its first step and takes the answer only once the plan applied at
// the metadata leader, so a step no applied map knows was sent unrecorded:
// a driver that died then would leave it to no one.
func (c *simCluster) recorded(a int, sl uint16, e kv.SlotEntry) {
	ms := c.meta
	if ms == nil || c.ownErr != nil || ms.planned[e.Epoch] || ms.top >= e.Epoch {
		return
	}
	c.ownErr = fmt.Errorf("slot %d is %s at group %d's replica %d at epoch %d, a move no map of the metadata group records (maps up to epoch %d)",
		sl, e.State, c.group[a], a, e.Epoch, ms.top)
}

// handedOver checks a slot of group g handed over at epoch e (none, with a
// peer): if g is the source of the move recorded at e and no replica of it
// applied that hand-over before, the move must not be marked for abort
// already. Valid where the move's first driver died right after a step
// (moveOptions.abort with killAfter): nothing it sent can hand the move
// over after the mark, so only a driver that took a marked record over and
// drove it forward (instead of settling it: Mover.settle) can.
func (c *simCluster) handedOver(g uint64, sl uint16, e kv.SlotEntry) {
	ms := c.meta
	if ms == nil || c.ownErr != nil || ms.handed[e.Epoch] {
		return
	}
	if from, ok := ms.from[e.Epoch]; !ok || from != g {
		return
	}
	ms.handed[e.Epoch] = true
	if ms.checkAborts && ms.marked[e.Epoch] {
		c.ownErr = fmt.Errorf("slot %d was handed over by group %d at epoch %d after the move was marked for abort before its hand-over (a driver drove a move marked to be rolled back forward)", sl, g, e.Epoch)
	}
}

// TestMoveSimMetaCatchesMutations: cluster.MultiMut.PlanAfterHandOver, "the
// metadata record is written after the hand-over instead of before" (a
// driver that dies before its hand-over leaves the groups mid-move with no
// record, and no resumer finishes the move), is caught at a seed clean
// without it, with and without faults, by the check that every step a
// group applies belongs to a move the metadata group recorded (recorded).
// Linearizability cannot see it: the source serves the slots until its
// hand-over, whoever finishes the move.
func TestMoveSimMetaCatchesMutations(t *testing.T) {
	mutation.Require(t)
	const want = "a move no map of the metadata group records"
	for _, tc := range []struct {
		name string
		o    moveOptions
	}{
		{"calm", moveOptions{meta: true}},
		{"faults", moveOptions{meta: true, faults: true, leaderCrashes: true, moverDeaths: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const seed = 1
			if err := moveSim(seed, nil, tc.o, nil); err != nil {
				t.Fatalf("seed %d fails without the mutation: %v", seed, err)
			}
			o := tc.o
			o.planLate = true
			err := moveSim(seed, nil, o, nil)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("seed %d: PlanAfterHandOver not caught by %q: %v", seed, want, err)
			}
			t.Logf("caught: %s", firstLine(err))
		})
	}
}

// TestMoveSimMetaAbortAfterEachStep: the mover killed right after each
// step of the first move, its move recorded, and kefir cluster move-slots
// --abort run at once (Mover.Abort with the record) while the metadata
// leader's resumer watches the same beat to finish it. The abort claims the
// record at once with the abort mark (the resumer, which would claim only
// after two leases of an unmoving beat, then finds it marked, and a take-over
// of a marked record settles it rather than driving it forward), fences both
// groups and decides on their tables: before the hand-over it rolls the
// move back, after it it finishes the move and says it could not roll it
// back (docs/design/cluster.md §9). Every checker must hold.
func TestMoveSimMetaAbortAfterEachStep(t *testing.T) {
	for _, tc := range []struct{ step, want string }{
		{"importing", "abort: rolled back"},
		{"migrating", "abort: rolled back"},
		{"precopy-page", "abort: rolled back"},
		{"precopy", "abort: rolled back"},
		{"handover", "abort: refused: move-slots: abort: the move of"},
		{"finalcopy", "abort: refused: move-slots: abort: the move of"},
		{"owned", "abort: refused: move-slots: abort: the move of"},
	} {
		t.Run(tc.step, func(t *testing.T) {
			sim.Explore(t, 1, 1, func(seed uint64, trace io.Writer) error {
				var sum string
				if err := moveSim(seed, trace, moveOptions{meta: true, killAfter: tc.step, abort: true}, &sum); err != nil {
					return err
				}
				if !strings.Contains(sum, tc.want) {
					return fmt.Errorf("after %s the abort did not end as %q: %s", tc.step, tc.want, sum)
				}
				if strings.Contains(sum, "refused") && !strings.Contains(sum, "it was finished instead") {
					return fmt.Errorf("after %s the abort was refused without finishing the move: %s", tc.step, sum)
				}
				return nil
			})
		})
		// With the nemesis and leader crashes after steps (two seeds): the
		// abort may fail on the faults (and the move is then resumed),
		// but never finishes a move stopped before its hand-over, and
		// every checker holds (handedOver among them).
		t.Run("faults/"+tc.step, func(t *testing.T) {
			sim.Explore(t, 1, 2, func(seed uint64, trace io.Writer) error {
				var sum string
				if err := moveSim(seed, trace, moveOptions{meta: true, killAfter: tc.step, abort: true, faults: true, leaderCrashes: true}, &sum); err != nil {
					return err
				}
				if !strings.Contains(sum, "abort: ") {
					return fmt.Errorf("after %s the abort did not run: %s", tc.step, sum)
				}
				if strings.Contains(tc.want, "rolled back") && strings.Contains(sum, "it was finished instead") {
					return fmt.Errorf("after %s the abort finished the move: %s", tc.step, sum)
				}
				return nil
			})
		})
	}
}

// TestMoveSimMetaAbortCatchesMutations: the mover killed after the pre-copy
// of a recorded move, move-slots --abort run at once and killed right after
// it claimed the record (marked for abort) and fenced both groups: the
// metadata leader's resumer takes the marked record over and must settle it
// as the abort would — roll it back, the hand-over never reached. Clean at
// seed 1. cluster.MultiMut.IgnoreAbortMark (a take-over drives a marked
// record forward, its claims unmarked) is caught: the record refuses its
// claims, the move is never ended. With kv.MapMut.ClaimIgnoresAbortMark too
// (a marked record takes unmarked claims) the take-over hands the move over
// and handedOver fires.
func TestMoveSimMetaAbortCatchesMutations(t *testing.T) {
	mutation.Require(t)
	o := moveOptions{meta: true, killAfter: "precopy", abort: true, abortKillAfter: "abort-fenced"}
	const seed = 1
	var sum string
	if err := moveSim(seed, nil, o, &sum); err != nil {
		t.Fatalf("seed %d fails without a mutation: %v", seed, err)
	}
	if !strings.Contains(sum, "abort: died after abort-fenced") || !strings.Contains(sum, "1 rolled back") {
		t.Fatalf("the abort was not killed after its fence, or the resumer did not roll the move back: %s", sum)
	}
	t.Logf("clean: %s", sum)
	for _, tc := range []struct {
		name string
		mut  func(*moveOptions)
		want string
	}{
		{"IgnoreAbortMark", func(o *moveOptions) { o.ignoreMark = true }, "did not finish"},
		{"IgnoreAbortMark+ClaimIgnoresAbortMark", func(o *moveOptions) { o.ignoreMark, o.markOff = true, true }, "after the move was marked for abort"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo := o
			tc.mut(&mo)
			err := moveSim(seed, nil, mo, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("seed %d: %s not caught by %q: %v", seed, tc.name, tc.want, err)
			}
			t.Logf("caught: %s", firstLine(err))
		})
	}
}

// liveAbortRun is an operator's kefir cluster move-slots --abort run while
// the first move's driver is alive (moveOptions.liveAbort): started 0-15 ms
// after that driver's step, it claims the record at once with the abort
// mark, fences both groups and decides on their tables, while the driver
// goes on until one of its steps or renewals is refused. Whatever the
// interleaving, an abort that says it rolled the move back must be right:
// the source never hands over at the move's epoch (settled, with every
// checker of the run: the map's owners are the tables').
type liveAbortRun struct {
	s        *sim.Sim
	cl       *simCluster
	at       time.Duration // when the abort starts (0: not triggered)
	from, to kcluster.GroupID
	rs       []kv.SlotRange
	started  bool
	finished bool
	// fwd: the forward driver's address; replicas: how many there are
	// (addresses 0 to replicas-1).
	fwd      sim.Addr
	replicas int
	// result: what came of it ("rolled back", or the abort's error).
	result string
	// killAfter: the abort dies right after that step (died: it did).
	killAfter, died string
	// reversed: the abort names the move's ranges in the reverse order.
	reversed bool
	// unrecorded: the abort runs as --record=false (Meta off).
	unrecorded bool
}

// trigger schedules the abort of the move of rs from from to to.
func (r *liveAbortRun) trigger(from, to kcluster.GroupID, rs []kv.SlotRange) {
	if r.at != 0 {
		return
	}
	rng := r.s.Rand()
	r.at = r.s.Now() + time.Duration(rng.IntN(16))*time.Millisecond + 1
	r.from, r.to, r.rs = from, to, slices.Clone(rs)
	if r.reversed {
		slices.Reverse(r.rs)
	}
	r.result = "triggered"
	// The driver's next messages are held in the network for 60-140 ms
	// (under the mover's 150 ms timeout): its next step, sent before the
	// abort's claim, lands after the abort decided — the step in flight
	// the groups' fence must refuse.
	for a := range r.replicas {
		r.s.Hold(r.fwd, sim.Addr(a))
	}
	r.s.After(time.Duration(60+rng.IntN(81))*time.Millisecond, func() {
		for a := range r.replicas {
			r.s.Release(r.fwd, sim.Addr(a))
		}
	})
}

func (r *liveAbortRun) busy() bool { return r.at != 0 && !r.finished }

func (r *liveAbortRun) next(time.Duration) (*kcluster.Mover, moverJob) {
	if r.started || r.at == 0 || r.s.Now() < r.at {
		return nil, nil
	}
	if r.from == 0 {
		// Triggered by the operator of a remove-group (groupOpRun): the
		// move in flight, as the metadata leader's map records it.
		n := r.cl.metaLeader()
		if n == nil {
			return nil, nil
		}
		cm, _ := n.metaMap()
		if cm == nil || len(cm.Moves) == 0 {
			r.started, r.finished, r.result = true, true, "no move in flight to abort"
			return nil, nil
		}
		r.from, r.to, r.rs = kcluster.GroupID(cm.Moves[0].From), kcluster.GroupID(cm.Moves[0].To), slices.Clone(cm.Moves[0].Slots)
	}
	r.started = true
	mv := &kcluster.Mover{Page: 2, PagePause: time.Millisecond, RetryFor: time.Second,
		Meta: !r.unrecorded, Lease: metaLease, Driver: "aborter"}
	mv.Rand = func() uint64 { return r.s.Rand().Uint64() }
	for k := range r.cl.seeds {
		mv.Seeds = append(mv.Seeds, nodeAddr(k))
	}
	from, to, rs := r.from, r.to, r.rs
	return mv, func(ctx context.Context, mv *kcluster.Mover) (any, error) {
		return kcluster.MoveResult{}, mv.Abort(ctx, from, to, rs)
	}
}

func (r *liveAbortRun) kill(time.Duration) bool { return false }

// afterStep: the abort dies right after its step of that name
// (moveOptions.abortKillAfter, abort-fenced): whoever takes the marked
// record over next settles it.
func (r *liveAbortRun) afterStep(step string) bool {
	if r.killAfter != "" && step == r.killAfter {
		r.died = step
		return true
	}
	return false
}

func (r *liveAbortRun) done(_ time.Duration, _ any, err error) {
	r.finished = true
	if r.died != "" {
		r.result = "died after " + r.died
		return
	}
	if err != nil {
		r.result = "refused: " + err.Error()
		return
	}
	r.result = "rolled back"
}

// settled checks the abort's end: it ran and finished, and if it said
// it rolled the move back, the move's source never applied its hand-over
// at the epoch the abort marked (one move is ever marked in such a run);
// if it marked none, it came too late (the move was over).
func (r *liveAbortRun) settled() error {
	ms := r.cl.meta
	switch {
	case !r.started:
		return errors.New("the live abort never started (its step was not reached)")
	case r.result == "no move in flight to abort":
		return nil
	case !r.finished:
		return errors.New("the live abort did not finish")
	case len(ms.marked) == 0:
		if strings.Contains(r.result, "only a move before its hand-over can be rolled back") {
			return nil // too late: the driver had ended the move
		}
		if r.reversed && strings.Contains(r.result, "abort it by those") {
			return nil // refused: the record names the slots otherwise
		}
		if r.unrecorded && strings.Contains(r.result, "is recorded in the metadata group") {
			return nil // refused: an unrecorded rollback under the record
		}
		return fmt.Errorf("the live abort marked no move (%s)", r.result)
	case r.result != "rolled back":
		// Finished instead, or failed part way (a metadata leader that
		// did not answer for a lease): the record, marked, is settled by
		// whoever takes it over next (metaSettled: no move left in flight).
		return nil
	}
	for e := range ms.marked {
		if ms.handed[e] {
			return fmt.Errorf("the live abort rolled the move at epoch %d back, and its source handed it over at that epoch", e)
		}
	}
	return nil
}

// TestMoveSimMetaAbortRacesALiveDriver: move-slots --abort run while the
// first move's driver is alive, 0-15 ms after each of its steps (planned:
// its record written, before its first step). The abort claims the record
// at once and fences both groups (Mover.settle): whatever the driver had
// applied before a group's fence stays, nothing it sends after lands, so
// the tables the abort reads are final — it rolls the move back before the
// hand-over (and the source never hands over at that epoch) or finishes
// it. Every checker of the run holds (the map's owners are the tables'),
// also with the nemesis and leader crashes (faults/, two seeds each),
// with the abort naming the slots in another order (reversed/: refused),
// of a remove-group's drain move (removegroup/) and with the abort killed
// right after its fences (died/, two seeds each).
// With cluster.MultiMut.AbortSkipsFence (the tables read unfenced) the
// driver's steps land after the abort's decision: caught.
func TestMoveSimMetaAbortRacesALiveDriver(t *testing.T) {
	for _, step := range []string{"planned", "importing", "migrating", "precopy-page", "precopy", "handover", "finalcopy"} {
		t.Run(step, func(t *testing.T) {
			sim.Explore(t, 1, 4, func(seed uint64, trace io.Writer) error {
				var sum string
				if err := moveSim(seed, trace, moveOptions{meta: true, liveAbort: step}, &sum); err != nil {
					return err
				}
				t.Logf("seed %d after %s: %s", seed, step, sum[strings.Index(sum, "live abort"):])
				return nil
			})
		})
		// With the nemesis and leader crashes after steps (two seeds).
		t.Run("faults/"+step, func(t *testing.T) {
			sim.Explore(t, 1, 2, func(seed uint64, trace io.Writer) error {
				return moveSim(seed, trace, moveOptions{meta: true, liveAbort: step, faults: true, leaderCrashes: true}, nil)
			})
		})
		// The abort names the move's slots in another order (two
		// seeds): refused, saying how the record names them — not
		// rolled back from the tables, unclaimed and unfenced, under
		// the live driver (two owners of a slot, before the refusal).
		t.Run("reversed/"+step, func(t *testing.T) {
			sim.Explore(t, 1, 2, func(seed uint64, trace io.Writer) error {
				var sum string
				if err := moveSim(seed, trace, moveOptions{meta: true, liveAbort: step, abortReversed: true}, &sum); err != nil {
					return err
				}
				if !strings.Contains(sum, "abort it by those") && !strings.Contains(sum, "only a move before its hand-over") {
					return fmt.Errorf("the live abort of the slots in another order was not refused: %s", sum)
				}
				return nil
			})
		})
		// The abort runs as --record=false (two seeds): refused while
		// the move is recorded — a rollback from the tables, unclaimed
		// and unfenced, under the live driver made two owners of a slot.
		t.Run("unrecorded/"+step, func(t *testing.T) {
			seeds := 2
			if raceOn {
				seeds = 1 // one goroutine: little for the detector
			}
			sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) error {
				var sum string
				if err := moveSim(seed, trace, moveOptions{meta: true, liveAbort: step, abortUnrecorded: true}, &sum); err != nil {
					return err
				}
				if !strings.Contains(sum, "is recorded in the metadata group") && !strings.Contains(sum, "only a move before its hand-over") {
					return fmt.Errorf("the live abort without the record was not refused: %s", sum)
				}
				return nil
			})
		})
		// The abort of a remove-group's first drain move, live (two
		// seeds): cluster.GroupRemoval meets the move rolled back (or
		// finished), plans the drain again and removes the group
		// (groupOpsSettled).
		t.Run("removegroup/"+step, func(t *testing.T) {
			sim.Explore(t, 1, 2, func(seed uint64, trace io.Writer) error {
				return moveSim(seed, trace, moveOptions{meta: true, groupOps: true, groups: 3, liveAbort: step}, nil)
			})
		})
		// The abort dies right after its fences (two seeds): the record
		// marked, the live driver fenced off; whoever takes the record
		// over next (the resumer, or the driver's own rerun after
		// watching the beat) settles it.
		t.Run("died/"+step, func(t *testing.T) {
			sim.Explore(t, 1, 2, func(seed uint64, trace io.Writer) error {
				var sum string
				if err := moveSim(seed, trace, moveOptions{meta: true, liveAbort: step, abortKillAfter: "abort-fenced"}, &sum); err != nil {
					return err
				}
				if !strings.Contains(sum, "live abort: died after abort-fenced") {
					return fmt.Errorf("the live abort was not killed after its fences: %s", sum)
				}
				return nil
			})
		})
	}
}

// TestMoveSimMetaAbortRacesALiveDriverCatchesMutations:
// cluster.MultiMut.AbortSkipsFence (the abort reads the tables without
// fencing the groups) is caught when the abort comes right after the
// move's record and before its first step, that step in flight as the
// abort decides: the abort finds nothing to roll back and records the
// abort, the driver's held step lands after it, and the move goes on
// with no record, so its slots are served by neither group in the end.
// Only there: once a step was taken, the rollback's own steps are fenced
// driver steps to both groups (since review31a's rollBack takes the source
// to the move's epoch even when it had not migrated yet), so a fence-less
// abort is refused by neither and the held step is refused after it
// (seeds 1-3 of importing, migrating, precopy-page, precopy and handover
// pass with the mutation: the explicit fence is what "planned" needs).
func TestMoveSimMetaAbortRacesALiveDriverCatchesMutations(t *testing.T) {
	mutation.Require(t)
	const seed, step = 1, "planned"
	var sum string
	if err := moveSim(seed, nil, moveOptions{meta: true, liveAbort: step}, &sum); err != nil {
		t.Fatalf("seed %d fails without a mutation: %v", seed, err)
	}
	err := moveSim(seed, nil, moveOptions{meta: true, liveAbort: step, skipFence: true}, nil)
	if err == nil {
		t.Fatalf("seed %d: AbortSkipsFence not caught after %s", seed, step)
	}
	t.Logf("caught: %v", err)
}
