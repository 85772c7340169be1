package vrshard

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/vr"
)

// Draining a node in the move simulation (moveOptions.drain, with the
// metadata group; docs/design/cluster.md §9): while the faults last, the
// cluster's last node — running, a member of several data groups, and on
// the small clusters (node 3) of the metadata group too — is replaced as a
// whole by a new node, as kefir
// cluster replace-node --old N --new M does on a cluster with a map: the
// operator (a fourth coroutine, drainRun) reads the map at the metadata
// leader, plans with the production planner (cluster.PlanNodeChange: every
// group of N, N's place taken by M), records M (ADDNODE), then per group
// reconfigures it (KEFIR.GROUP RECONFIG GROUP g, Mover.ReconfigureGroup) and
// records its members (SETMEMBERS); a rerun after an error plans what is
// left. Each group's new member is opened on M once its group answered
// (Membership.Apply, an empty disk); N's replicas leave their groups and
// retire, and N is left hosting nothing. The replication auditor then
// finds every group of N, the metadata group included, at three members on
// three nodes, none on N.
//
// Placed (moveOptions.placed, on a scale cluster): N dies for good instead
// (every replica it hosts crashed, its disk wiped), and the operator runs
// kefir cluster replace-node --old N without --new, as the command does:
// the map read at the metadata leader, the nodes' liveness asked (the
// simulation's answer to a PING: a node that hosts a replica up; never N
// nor the dead spare), the production placement
// (cluster.PlanReplacePlaced: each of N's groups takes the live node not in
// it hosting the fewest replicas), each group's own configuration read
// first (the command's rebaseChange rule for a rerun), then the
// reconfiguration and SETMEMBERS. The map also has a node that was added
// and died (the dead spare: it hosts nothing, so placement would favour it
// if it forgot the liveness answer); a group's new member is opened on its
// chosen node, if that node runs. The replication auditor then finds each
// of N's groups at three members on three distinct nodes, every one up.
//
// Repaired (moveOptions.repair, with placed): the same death, and nobody
// runs a command: the metadata group's nodes run the production
// cluster.Repairer on the simulation's clock and network, and the leader's
// re-creates N's groups once N has been silent for simRepairAfter
// (repairSim, repair_sim_test.go) with its own Repairer.Repair, once place
// has put the spares.
//
// Every form runs the command's loop, cluster.NodeChange (placedRun,
// explicitJob, Repairer.Repair): the groups' reconfigurations, SETMEMBERS, the catch-up
// wait and the placed rerun rule are production's; the simulation only
// opens each new member where its group's answer names it (joined).

// drainRun is the operator of a node's drain.
type drainRun struct {
	s  *sim.Sim
	cl *simCluster
	// old: the drained node; nw: the new one (0-based); spare: by group,
	// the address its new member takes on nw (placed: on the node
	// placement chose, set when it chose). dead: placed, the spare node
	// added to the map that never runs.
	old, nw int
	placed  bool
	// repair: moveOptions.repair (the metadata leaders' repairers run it:
	// repairSim, repair_sim_test.go; this operator is idle).
	repair   bool
	dead     int
	spare    map[kcluster.GroupID]int
	due      bool
	running  bool
	finished bool
	nextAt   time.Duration
	reruns   int
	lastErr  error
	log      []string
}

// newDrain prepares the drain of the cluster's last node: a new node and
// a spare address per group it hosts.
func newDrain(c *simCluster, placed, repair bool) *drainRun {
	old := c.nodes - 1
	if placed {
		// The one before: on cluster.EvenGroups' 9 nodes, node 8, whose
		// group [6 7 8] has the least loaded nodes (3 replicas each) as
		// members beside it and 9 outside — a placement that forgot the
		// members would choose 6.
		old--
	}
	var gs []kcluster.GroupID
	for _, a := range c.hosted[old] {
		gs = append(gs, c.group[a])
	}
	first := len(c.node)
	c.addSpares(len(gs), true)
	// The repairer watches from the start (its watch must see the node
	// answer first).
	d := &drainRun{cl: c, old: old, nw: c.nodes - 1, spare: map[kcluster.GroupID]int{}, placed: placed, repair: repair, dead: -1}
	if placed {
		if slices.Contains(gs, kcluster.MetaGroupID) {
			panic("drainRun: a placed drain of a metadata member (a scale cluster's last node is none)")
		}
		d.dead, d.nw = d.nw, -1
		c.dead = map[int]bool{d.dead: true}
	}
	for i, g := range gs {
		sp := first + i
		d.spare[g] = sp
		c.spares = slices.DeleteFunc(c.spares, func(x int) bool { return x == sp })
		c.node[sp], c.group[sp] = d.nw, g
		if g == kcluster.MetaGroupID {
			c.meta.all = append(c.meta.all, sp)
		}
	}
	return d
}

// schedule makes the drain due at a time drawn within the faults.
func (d *drainRun) schedule(until time.Duration) {
	d.s.After(100*time.Millisecond+time.Duration(d.s.Rand().Int64N(int64(until-200*time.Millisecond))), func() {
		d.due = true
		if d.placed {
			// Dead for good: every replica of the node crashed, its
			// directory gone.
			c := d.cl
			for _, a := range slices.Clone(c.hosted[d.old]) {
				d.s.Crash(a)
				d.s.Wipe(a)
				c.lost[a] = true
				c.unhost(a)
			}
			c.dead[d.old] = true
			d.log = append(d.log, fmt.Sprintf("%v: node %d died for good: its groups are placed on the cluster's nodes", d.s.Now(), d.old+1))
			return
		}
		d.log = append(d.log, fmt.Sprintf("%v: node %d is drained: its groups go to node %d", d.s.Now(), d.old+1, d.nw+1))
	})
}

// live is the simulation's answer to the command's PING of node id: a node
// that is not dead for good and hosts a replica that is up. A node hosting
// nothing does not answer, as in production: one started with kefir server
// --join listens only once the map names it, one that retired has exited.
func (c *simCluster) live(id uint64) bool {
	k := int(id) - 1
	if k < 0 || k >= c.nodes || c.dead[k] {
		return false
	}
	return slices.ContainsFunc(c.hosted[k], func(a int) bool { return c.s.Up(a) })
}

// placedJob is kefir cluster replace-node --old N without --new
// (groupsChange's placed path): the dead spare recorded in the map (it was
// added, then died: ADDNODE, a no-op once there), the map read, the
// production placement over the nodes' liveness, and the plan run as the
// command runs it (placedRun).
func (d *drainRun) placedJob(ctx context.Context, mv *kcluster.Mover) (any, error) {
	if _, err := mv.AddNode(ctx, uint64(d.dead+1), nodeAddr(d.dead), fmt.Sprintf("peer%d", d.dead), ""); err != nil {
		return nil, err
	}
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return nil, err
	}
	plan, err := kcluster.PlanReplacePlaced(cm, uint64(d.old+1), d.cl.live)
	if err != nil {
		return nil, err
	}
	return plan, d.placedRun(ctx, mv, cm, plan)
}

// placedRun runs a placed plan of N's groups (made against cm) with the
// command's loop: before it, each group's spare address is put on the node
// the plan chose for it, unless the group's own configuration no longer
// has N (it changed before the map said so: the loop then keeps its
// members, and the spare stays where the earlier run put it).
func (d *drainRun) placedRun(ctx context.Context, mv *kcluster.Mover, cm *kv.ClusterMap, plan []kcluster.GroupChange) error {
	d.place(ctx, mv, cm, plan)
	return d.nodeChange(mv, nil).Run(ctx, cm, plan)
}

// place puts each group's spare address on the node plan (made against cm)
// chose for it, as placedRun does before its loop.
func (d *drainRun) place(ctx context.Context, mv *kcluster.Mover, cm *kv.ClusterMap, plan []kcluster.GroupChange) {
	c, old := d.cl, uint64(d.old+1)
	for _, ch := range plan {
		if cur, err := mv.GroupConfigOf(ctx, ch.Group); err == nil && !slices.Contains(cur.Members, old) {
			continue
		}
		on := int(kcluster.PlacedOn(cm, ch, old)) - 1
		c.node[d.spare[ch.Group]] = on
		d.log = append(d.log, fmt.Sprintf("%v: group %d's replica of node %d placed on node %d: %v", d.s.Now(), ch.Group, old, on+1, ch.Members))
	}
}

// nodeChange is the command's loop for this drain through mv (placed, or
// with new nodes), each group's new member opened as its group answers
// (joined).
func (d *drainRun) nodeChange(mv *kcluster.Mover, news []kcluster.Member) *kcluster.NodeChange {
	return &kcluster.NodeChange{Cmd: "replace-node", Meta: mv, Leaving: []uint64{uint64(d.old + 1)},
		NewNodes: news, CatchUp: kcluster.CaughtUpWait, Done: func(sd kcluster.StepDone) {
			d.joined(kcluster.GroupID(sd.Group), kcluster.GroupConfig{Membership: kcluster.Membership{Epoch: sd.Epoch, Start: sd.Start, Members: sd.Members, Previous: sd.Previous}})
		}}
}

func (d *drainRun) next(now time.Duration) (*kcluster.Mover, moverJob) {
	if d.repair || !d.due || d.running || d.finished || now < d.nextAt {
		return nil, nil
	}
	d.running = true
	mv := &kcluster.Mover{RetryFor: time.Second}
	for k := range d.cl.seeds {
		mv.Seeds = append(mv.Seeds, nodeAddr(k))
	}
	if d.placed {
		return mv, d.placedJob
	}
	return mv, d.explicitJob
}

// explicitJob is kefir cluster replace-node --old N --new M: the map read,
// the production planner (PlanNodeChange), and the command's loop, which
// records M (ADDNODE) first.
func (d *drainRun) explicitJob(ctx context.Context, mv *kcluster.Mover) (any, error) {
	nw := kcluster.Member{ID: uint64(d.nw + 1), ClientAddr: nodeAddr(d.nw), PeerAddr: fmt.Sprintf("peer%d", d.nw)}
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return nil, err
	}
	plan, err := kcluster.PlanNodeChange(cm, uint64(d.old+1), nw)
	if err != nil {
		return nil, err
	}
	return plan, d.nodeChange(mv, []kcluster.Member{nw}).Run(ctx, cm, plan)
}

// joined records group g's configuration gc (its members as the map now
// names them) and opens its new member on the new node, as the node does
// when the map names it (syncGroups). Runs on the operator's coroutine,
// while the simulator waits: the start is scheduled.
func (d *drainRun) joined(g kcluster.GroupID, gc kcluster.GroupConfig) {
	c, s := d.cl, d.s
	vm := vr.Membership{Epoch: gc.Epoch, Start: gc.Start}
	var members []int
	for _, id := range gc.Members {
		a := c.replicaOn(g, int(id)-1)
		members = append(members, a)
		vm.Members = append(vm.Members, uint64(a)+1)
	}
	for _, id := range gc.Previous {
		vm.Previous = append(vm.Previous, uint64(c.replicaOn(g, int(id)-1))+1)
	}
	if g == kcluster.MetaGroupID {
		c.meta.addrs = members
	} else {
		c.members[g-1] = members
		c.setMembers(g, gc.Members)
	}
	sp := d.spare[g]
	if c.joined[sp] != nil {
		return // a rerun's answer: opened already
	}
	c.joined[sp] = &simJoin{group: g, m: vm}
	d.log = append(d.log, fmt.Sprintf("%v: group %d reconfigured to epoch %d, members %v (replicas)", s.Now(), g, vm.Epoch, vm.Members))
	on := c.node[sp]
	if c.dead[on] {
		return // a dead node opens nothing (placement must not choose one)
	}
	s.After(0, func() {
		c.hosted[on] = append(c.hosted[on], sp)
		s.Crash(sp)
		s.Restart(sp)
	})
}

func (d *drainRun) kill(time.Duration) bool { return false }
func (d *drainRun) afterStep(string) bool   { return false }

func (d *drainRun) done(now time.Duration, _ any, err error) {
	d.running = false
	if err != nil {
		d.reruns++
		d.lastErr = err
		d.nextAt = now + 20*time.Millisecond
		return
	}
	d.finished = true
	d.log = append(d.log, fmt.Sprintf("%v: node %d drained", d.s.Now(), d.old+1))
}

// placedOn is the nodes (1-based) the placed drain put the groups' new
// members on, in group order.
func (d *drainRun) placedOn() []int {
	var out []int
	for _, g := range slices.Sorted(maps.Keys(d.spare)) {
		out = append(out, d.cl.node[d.spare[g]]+1)
	}
	return out
}

// TestMoveSimPlaced: a node of a 9-node, 12-group cluster dies for good
// amid the moves, the nemesis (or power cuts) and whole-node crashes, and
// its groups are re-created on the cluster's live nodes by the production
// placement (kefir cluster replace-node --old N without --new: see
// drainRun); the map also names a node that died. Every checker of
// moveSim, and the replication auditor: each group back at three members
// on three distinct nodes, all up. 4 seeds each (about 20 s); KEFIR_SOAK=1: 100.
func TestMoveSimPlaced(t *testing.T) {
	seeds := 4
	if soakOn() {
		seeds = 100
	} else if raceOn {
		seeds = 1 // one goroutine: little for the detector, 5–10× the time
	}
	sc := func() *moveScale { return &moveScale{nodes: 9, groups: 12, keys: 8, clients: 6, ops: 60} }
	for _, tc := range []struct {
		name string
		o    moveOptions
	}{
		{"faults", moveOptions{meta: true, drain: true, placed: true, scale: sc(), faults: true, leaderCrashes: true, moverDeaths: true}},
		{"powercuts", moveOptions{meta: true, drain: true, placed: true, scale: sc(), powerCuts: true, leaderCrashes: true, moverDeaths: true}},
		// Nobody runs the command: the metadata leader's repairer does.
		{"repair", moveOptions{meta: true, drain: true, placed: true, repair: true, scale: sc(), faults: true, leaderCrashes: true, moverDeaths: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) error {
				var sum string
				err := moveSim(seed, trace, tc.o, &sum)
				if err == nil && !strings.Contains(sum, "placed on the cluster's nodes: true") {
					return fmt.Errorf("the placed replacement did not finish: %s", sum)
				}
				if testing.Verbose() {
					t.Logf("seed %d: %s", seed, sum)
				}
				return err
			})
		})
	}
}

// TestMoveSimPlacedCatchesMutations: a placement that forgets the liveness
// answer chooses the dead node of the map (it hosts nothing: the least
// loaded), whose replica never opens; one that forgets the group's members
// asks a group for a node it has (the reconfiguration is refused, and the
// group stays at two). The replication auditor catches both; the
// linearizability checker cannot (every group keeps a majority).
func TestMoveSimPlacedCatchesMutations(t *testing.T) {
	mutation.Require(t)
	o := moveOptions{meta: true, drain: true, placed: true, scale: &moveScale{nodes: 9, groups: 12, keys: 8, clients: 6, ops: 60}, faults: true, leaderCrashes: true, moverDeaths: true}
	const seed = 1
	if err := moveSim(seed, nil, o, nil); err != nil {
		t.Fatalf("seed %d fails with placement done right: %v", seed, err)
	}
	for _, tc := range []struct {
		name string
		set  func(*moveOptions)
	}{
		{"ignoresLive", func(o *moveOptions) { o.placeIgnoresLive = true }},
		{"ignoresMembers", func(o *moveOptions) { o.placeIgnoresMembers = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := o
			tc.set(&o)
			var sum string
			err := moveSim(seed, nil, o, &sum)
			if err == nil {
				t.Fatalf("seed %d: not caught: %s", seed, sum)
			}
			t.Logf("caught: %v", firstLine(err))
		})
	}
}
