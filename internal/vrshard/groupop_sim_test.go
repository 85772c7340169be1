package vrshard

import (
	"context"
	"errors"
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
)

// Rebalance and remove-group in the move simulation (moveOptions.groupOps,
// with the metadata group; issue 28, docs/design/cluster.md §9): on the
// three-group cluster, where group 1 owns every slot (as after two
// add-groups; with moveOptions.addGroup, group 3 is added by the operator
// first: kefir cluster add-group, its replicas started by their nodes once
// they see it in the map, startAdded), an operator (groupOpRun, a coroutine beside the resumer)
// runs kefir cluster rebalance and then kefir cluster remove-group --id
// groupOpRemoved, each as the command runs it: the map read at the metadata
// leader, the groups' tables (cluster.Mover.PlanTables: no move in flight),
// the slots weighed by keys (Mover.SlotWeights: KEFIR.SLOTS STATS at each
// group's leader), the production planner (cluster.PlanRebalance,
// cluster.PlanDrain) and its moves run one at a time by the production
// cluster.Rebalancer, each a recorded Mover under a lease; the drained
// group leaves the map (Mover.RemoveGroup, compare-and-set by the map's
// epoch) once the map shows it owns nothing. The moves are long ranges of
// thousands of slots, not the main runs' three. The main mover is idle.
//
// Under the nemesis or power cuts, leader crashes after steps, and the
// operator killed right after a step now and then (its move recorded in
// flight): the metadata leader's resumer takes the move over after two
// leases, and the operator's command is run again four leases later, as an
// operator reruns it (remove-group finishes a move left in flight first,
// as the command does; rebalance plans again from the map). A node retires
// its replica of the removed group once its metadata replica applied a map
// that lists the group removed (the server's retireRemoved), and a client
// whose cached map names a removed group refreshes it (CLUSTER SLOTS).
//
// Checks, on top of moveSim's (linearizability across the moves, no slot
// owned by two groups at one epoch, every step recorded, the map settled):
// groupOpsSettled — the removed group is out of the map and every one of
// its replicas retired; every slot of the cluster is owned by exactly one
// live group's leader table, the group the map names, at an epoch no
// higher than the map's.

// groupOpRemoved is the group the operator removes: group 1, the static
// map's owner of every slot (the nodes' and clients' fallback map names
// it for every key until they learn otherwise).
const groupOpRemoved = kcluster.GroupID(1)

// groupOpRun is the operator of a rebalance and a remove-group.
type groupOpRun struct {
	s  *sim.Sim
	cl *simCluster
	o  moveOptions
	// phase: "rebalance", "remove", "" (finished); running: a command is
	// under way; killed: it died after a step (its next run waits four
	// leases: the resumer finishes its move first, most of the time).
	phase    string
	running  bool
	killed   bool
	nextAt   time.Duration
	reruns   int
	kills    int
	crashes  int
	moves    int // moves the Rebalancer finished
	lastErr  error
	planned  []string
	removeAt uint64 // the map epoch the removal answered
	// moveNo, lastNo: the remove-group plan's move under way and its last
	// (opKillAfter); killedAt: the step the operator was killed after.
	moveNo, lastNo int
	killedAt       string
	log            []string
	// live: an operator's move-slots --abort of the remove-group's first
	// move while it runs (moveOptions.liveAbort).
	live *liveAbortRun
}

func newGroupOps(c *simCluster, o moveOptions) *groupOpRun {
	r := &groupOpRun{cl: c, o: o, phase: "rebalance", nextAt: 50 * time.Millisecond}
	if o.addGroup {
		r.phase = "add-group"
	}
	return r
}

// newMover is a Mover of the operator (the coroutine's transport and
// clock): meta, for the Rebalancer's moves (recorded under a lease, as
// the command's rebalancer makes them).
func (r *groupOpRun) newMover(base *kcluster.Mover, meta bool) *kcluster.Mover {
	mv := &kcluster.Mover{Seeds: base.Seeds, Transport: base.Transport, Clock: base.Clock, AfterStep: base.AfterStep,
		Page: 2, PagePause: time.Millisecond, RetryFor: time.Second}
	if meta {
		mv.Meta, mv.Lease, mv.Driver = true, metaLease, "kefir cluster "+r.phase
		mv.Rand = func() uint64 { return r.s.Rand().Uint64() }
	}
	return mv
}

func (r *groupOpRun) next(now time.Duration) (*kcluster.Mover, moverJob) {
	if r.phase == "" || r.running || now < r.nextAt {
		return nil, nil
	}
	r.running = true
	mv := &kcluster.Mover{RetryFor: time.Second}
	for k := range r.cl.seeds {
		mv.Seeds = append(mv.Seeds, nodeAddr(k))
	}
	phase := r.phase
	return mv, func(ctx context.Context, mv *kcluster.Mover) (any, error) {
		rb := &kcluster.Rebalancer{NewMover: func() *kcluster.Mover {
			r.moveNo++
			return r.newMover(mv, true)
		}}
		switch phase {
		case "add-group":
			return nil, r.addGroup(ctx, mv)
		case "rebalance":
			return nil, r.rebalance(ctx, mv, rb)
		}
		return nil, r.removeGroup(ctx, mv, rb)
	}
}

// addGroup is kefir cluster add-group --id 3 without --members
// (runClusterAddGroup's placed path): the map read, its three replicas
// placed on the live nodes (cluster.PlaceGroup over the simulation's
// liveness: on the three nodes, all of them, or too few live and the
// command fails and is run again), unless the map has the group an earlier
// run added (cluster.PlacedEarlier: a rerun never places it twice); the
// group recorded in the map with no slots (a rerun after the record finds
// it there), then the wait until a member answers with a leader — the
// nodes start the group's replicas when they see it in the map
// (startAdded), bootstrapping its first view from the map's list.
func (r *groupOpRun) addGroup(ctx context.Context, mv *kcluster.Mover) error {
	g := kcluster.GroupID(r.cl.groups())
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return err
	}
	members := []uint64(nil)
	if eg, ok := kcluster.PlacedEarlier(cm, movesGroupSize, uint64(g), kv.EngineVR); ok {
		members = eg.Members
	} else if members, err = kcluster.PlaceGroup(cm, movesGroupSize, r.cl.live); err != nil {
		return err
	}
	if !sameIDs(members, []uint64{1, 2, 3}) {
		// The simulated group's replicas live on nodes 1-3 (its static
		// addresses): the only nodes there are.
		return fmt.Errorf("add-group placed group %d on nodes %v: the simulation's nodes are 1-3", g, members)
	}
	r.log = append(r.log, fmt.Sprintf("%v: add-group places group %d on nodes %v", r.s.Now(), g, members))
	if _, err := mv.AddGroup(ctx, g, members, kv.EngineVR); err != nil {
		return err
	}
	for {
		gc, err := mv.GroupConfigOf(ctx, g)
		if err == nil && gc.Leader != 0 {
			return nil
		}
		if err := mv.Clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// startAdded is the server's syncGroups at node k, whose metadata replica
// applied cm: its replica of a group the map now has and the node never
// started is started, bootstrapping the group's first view (its first
// start, with no directory).
func (c *simCluster) startAdded(k int, cm *kv.ClusterMap) {
	// In group order: each start is scheduled, and a map's order would make
	// two runs of one seed differ.
	for _, g := range slices.Sorted(maps.Keys(c.unadded)) {
		a := c.replicaAt(k, g)
		if _, ok := cm.Group(uint64(g)); !ok || a < 0 || c.addedOn[a] {
			continue
		}
		c.addedOn[a] = true
		c.s.After(0, func() {
			c.s.Crash(a)
			c.s.Restart(a)
		})
	}
}

// weigh is rebalanceFlags.weighSlots (cmd/kefir) by keys: the groups'
// tables, then each slot's keys at the group the map says owns it.
func weigh(ctx context.Context, mv *kcluster.Mover, cm *kv.ClusterMap) ([]kcluster.PlanGroup, []int64, error) {
	groups := kcluster.PlanGroups(cm)
	if err := mv.PlanTables(ctx, groups); err != nil {
		return nil, nil, err
	}
	w, err := mv.SlotWeights(ctx, cm, kcluster.ByKeys, 0)
	return groups, w, err
}

// rebalance is kefir cluster rebalance --by keys: refused while the map
// records a move in flight (a rerun after the operator died waits for the
// resumer to finish it), else planned and run.
func (r *groupOpRun) rebalance(ctx context.Context, mv *kcluster.Mover, rb *kcluster.Rebalancer) error {
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return err
	}
	if len(cm.Moves) > 0 {
		m := cm.Moves[0]
		return fmt.Errorf("rebalance: %w (slots %v from group %d to group %d)", errInFlight, m.Slots, m.From, m.To)
	}
	groups, w, err := weigh(ctx, mv, cm)
	if err != nil {
		return err
	}
	plan := kcluster.PlanRebalance(groups, w, 0.1, 0)
	r.plannedLog(cm.Epoch, plan)
	done, err := rb.Run(ctx, plan)
	r.moves += finished(done)
	return err
}

// removeGroup is kefir cluster remove-group --id groupOpRemoved: the
// command's loop (cluster.GroupRemoval) with the simulation's mover, by
// keys, pausing a lease after a move in flight it could not finish.
func (r *groupOpRun) removeGroup(ctx context.Context, mv *kcluster.Mover, rb *kcluster.Rebalancer) error {
	rm := &kcluster.GroupRemoval{
		Group:      groupOpRemoved,
		Rebalancer: rb,
		Meta:       func(f func(*kcluster.Mover) error) error { return f(mv) },
		Weigh: func(ctx context.Context, cm *kv.ClusterMap) ([]kcluster.PlanGroup, []int64, error) {
			return weigh(ctx, mv, cm)
		},
		Pause: func(ctx context.Context) error { return mv.Clock.Sleep(ctx, metaLease) },
		Planned: func(cm *kv.ClusterMap, _ int, plan kcluster.Plan) bool {
			r.plannedLog(cm.Epoch, plan)
			r.moveNo, r.lastNo = 0, len(plan.Moves)
			return true
		},
		Moved: func(done []kcluster.RebalanceMove) { r.moves += finished(done) },
	}
	epoch, _, _, err := rm.Run(ctx)
	if errors.Is(err, kcluster.ErrRemovedAlready) {
		return nil
	}
	if err == nil {
		r.removeAt = epoch
	}
	return err
}

// errInFlight: kefir cluster rebalance refuses to plan while the map
// records a move in flight (the operator runs it again a lease later).
var errInFlight = errors.New("a move is in flight")

// finished counts the moves of a Rebalancer's run that finished.
func finished(done []kcluster.RebalanceMove) int {
	n := 0
	for _, m := range done {
		if m.Result.Epoch != 0 {
			n++
		}
	}
	return n
}

func (r *groupOpRun) plannedLog(epoch uint64, p kcluster.Plan) {
	var b strings.Builder
	for _, m := range p.Moves {
		fmt.Fprintf(&b, " %d-%d:%d->%d", m.Slots.Start, m.Slots.End, m.From, m.To)
	}
	r.planned = append(r.planned, fmt.Sprintf("%s at map epoch %d:%s", r.phase, epoch, b.String()))
	r.log = append(r.log, fmt.Sprintf("%v: %s plans at map epoch %d:%s", r.s.Now(), r.phase, epoch, b.String()))
}

// kill: the operator dies only right after a step (afterStep).
func (r *groupOpRun) kill(time.Duration) bool { return false }

// afterStep: while the faults last, the operator dies right after one
// step in twelve (its move recorded in flight, its lease lapsing), and the
// leader of a data group crashes after one in four (restarted 20-80 ms
// later).
func (r *groupOpRun) afterStep(step string) bool {
	if r.live != nil && r.o.liveAbort == step && r.phase == "remove" && r.moveNo == 1 {
		r.live.trigger(0, 0, nil) // the first drain move, live (meta_sim_test.go)
	}
	if step == "planned" {
		return false // the record written, not a step of the groups: nothing drawn
	}
	if r.o.opKillAfter == step && r.killedAt == "" && r.phase == "remove" && r.moveNo == r.lastNo {
		r.kills++
		r.killed, r.killedAt = true, step
		return true
	}
	if r.s.Now() >= r.faultsUntil() {
		return false
	}
	rng := r.s.Rand()
	if r.o.moverDeaths && rng.IntN(12) == 0 {
		r.kills++
		r.killed = true
		return true
	}
	if !r.o.leaderCrashes || rng.IntN(4) != 0 {
		return false
	}
	s, c := r.s, r.cl
	g := kcluster.GroupID(1 + rng.IntN(c.groups()))
	s.After(0, func() {
		for _, a := range c.members[g-1] {
			if node, ok := s.Replica(a).(*hostNode); ok && node.r.isLeader.Load() && !c.lost[a] {
				s.Crash(a)
				r.crashes++
				s.After(time.Duration(20+s.Rand().IntN(60))*time.Millisecond, func() {
					if !c.lost[a] {
						s.Restart(a)
					}
				})
				return
			}
		}
	})
	return false
}

// faultsUntil is moveRun's: the faults end at 0.8 s.
func (r *groupOpRun) faultsUntil() time.Duration { return 800 * time.Millisecond }

func (r *groupOpRun) done(now time.Duration, _ any, err error) {
	r.running = false
	if err != nil {
		r.reruns++
		r.lastErr = err
		r.log = append(r.log, fmt.Sprintf("%v: %s: %v", r.s.Now(), r.phase, err))
		r.nextAt = now + 20*time.Millisecond
		if errors.Is(err, errInFlight) {
			r.nextAt = now + metaLease
		}
		if r.killed {
			// Recorded: the metadata leader's resumer takes its move over
			// after two leases; the operator reruns the command later.
			r.nextAt = now + 4*metaLease
		}
		r.killed = false
		return
	}
	r.killed = false
	r.lastErr = nil
	r.log = append(r.log, fmt.Sprintf("%v: %s finished", r.s.Now(), r.phase))
	switch r.phase {
	case "add-group":
		r.phase = "rebalance"
	case "rebalance":
		r.phase = "remove"
	default:
		r.phase = ""
	}
	r.nextAt = now + 20*time.Millisecond
}

// retireRemoved is the server's retireRemoved at node k, whose metadata
// replica applied cm: its replica of a group cm lists removed retires —
// taken out of the routing, stopped and never started again.
func (c *simCluster) retireRemoved(k int, cm *kv.ClusterMap) {
	for _, id := range cm.Removed {
		g := kcluster.GroupID(id)
		c.removed[g] = true
		a := c.replicaAt(k, g)
		if a < 0 || c.lost[a] {
			continue
		}
		c.lost[a] = true
		c.retirements++
		c.unhost(a)
		c.s.After(0, func() {
			if c.s.Up(a) {
				c.s.Crash(a)
			}
		})
	}
}

// latestMap is the newest map a node routes by (what a cluster client's
// topology refresh gets from the nodes: CLUSTER SLOTS), or nil.
func (c *simCluster) latestMap() *kcluster.SlotMap {
	var sm *kcluster.SlotMap
	if c.meta == nil {
		return nil
	}
	for _, m := range c.meta.routes {
		if sm == nil || m.Epoch > sm.Epoch {
			sm = m
		}
	}
	return sm
}

// groupOpsSettled is the end of a run with groupOps: the removed group is
// out of the leader's map (listed removed) and every replica of it retired;
// every slot is owned by exactly one live group's leader table — the group
// the map names, at an epoch no higher than the map's.
func groupOpsSettled(c *simCluster, r *groupOpRun) error {
	if r.phase != "" {
		return fmt.Errorf("the %s did not finish 12 s after the faults ended (last error: %v)", r.phase, r.lastErr)
	}
	n := c.metaLeader()
	if n == nil {
		return errors.New("the metadata group has no leader after the faults ended")
	}
	cm, _ := n.metaMap()
	if _, ok := cm.Group(uint64(groupOpRemoved)); ok || !slices.Contains(cm.Removed, uint64(groupOpRemoved)) {
		return fmt.Errorf("the map (epoch %d) still has group %d (removed: %v)", cm.Epoch, groupOpRemoved, cm.Removed)
	}
	if r.o.addGroup {
		g, ok := cm.Group(uint64(c.groups()))
		if !ok || len(g.Slots) == 0 {
			return fmt.Errorf("the map (epoch %d) does not give the added group %d any slot: %+v", cm.Epoch, c.groups(), cm.Groups)
		}
	}
	for _, a := range c.members[groupOpRemoved-1] {
		if _, runs := c.s.Replica(a).(*hostNode); !c.lost[a] || runs {
			return fmt.Errorf("group %d was removed, but its replica %d (node %d) did not retire", groupOpRemoved, a, c.node[a]+1)
		}
	}
	sm, err := kcluster.SlotMapOf(cm)
	if err != nil {
		return err
	}
	type own struct {
		g     kcluster.GroupID
		epoch uint64
	}
	owners := make([][]own, kv.NumSlots)
	for gi, ms := range c.members {
		g := kcluster.GroupID(gi + 1)
		if c.removed[g] {
			continue
		}
		var t *kv.SlotTable
		for _, a := range ms {
			if node, ok := c.s.Replica(a).(*hostNode); ok && node.leads() {
				t = node.r.SlotTable()
			}
		}
		if t == nil {
			return fmt.Errorf("group %d has no leader (or no table) after the faults ended", g)
		}
		for sl := range kv.NumSlots {
			if e := t.Entry(uint16(sl)); e.State == kv.SlotOwned {
				owners[sl] = append(owners[sl], own{g, e.Epoch})
			}
		}
	}
	for sl, os := range owners {
		switch {
		case len(os) == 0:
			return fmt.Errorf("slot %d is owned by no live group's table at the end (the map, epoch %d, gives it to group %d)", sl, cm.Epoch, sm.Owner(uint16(sl)))
		case len(os) > 1:
			return fmt.Errorf("slot %d is owned by groups %d (epoch %d) and %d (epoch %d) at the end", sl, os[0].g, os[0].epoch, os[1].g, os[1].epoch)
		case sm.Owner(uint16(sl)) != os[0].g || os[0].epoch > cm.Epoch:
			return fmt.Errorf("slot %d: the map (epoch %d) gives it to group %d, group %d's table owns it at epoch %d", sl, cm.Epoch, sm.Owner(uint16(sl)), os[0].g, os[0].epoch)
		}
	}
	return nil
}

// TestMoveSimGroupOps runs kefir cluster rebalance and remove-group's
// production planners and driver in the move simulation with the metadata
// group (groupOpRun): under the nemesis (10 seeds) and power cuts (5),
// and with add-group first under the nemesis (5), with leader crashes
// after steps and the operator killed after a step; KEFIR_SOAK=1: 300, 150
// and 150; KEFIR_SIM_SEEDS=n: n of each.
func TestMoveSimGroupOps(t *testing.T) {
	seeds := 10
	if soakOn() {
		seeds = 300
	}
	for _, tc := range []struct {
		name string
		o    moveOptions
		n    int
	}{
		{"faults", moveOptions{meta: true, groupOps: true, groups: 3, faults: true, leaderCrashes: true, moverDeaths: true}, seeds},
		{"powercuts", moveOptions{meta: true, groupOps: true, groups: 3, powerCuts: true, leaderCrashes: true, moverDeaths: true}, seeds / 2},
		// Group 3 added first (add-group), then the rebalance fills it.
		{"addgroup", moveOptions{meta: true, groupOps: true, addGroup: true, groups: 3, faults: true, leaderCrashes: true, moverDeaths: true}, seeds / 2},
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

// TestMoveSimGroupOpsCatchesMutations: the operator killed right after the
// pre-copy of the remove-group plan's last move (opKillAfter), at a seed
// clean without a mutation (the resumer finishes the recorded move, the
// rerun removes the group once its slots left), with and without faults.
// cluster.MultiMut.DoneBeforeCopy, "a recorded move's end written before
// its steps", is caught by groupOpsSettled: the map gives the move's
// slots to the destination at once, so the rerun finds the group owning
// nothing and removes it while it still holds the only copy of them (the
// destination only imports: nobody resumes a move the map records done),
// and its replicas retire — "slot … is owned by no live group's table".
// cluster.MultiMut.PlanAfterHandOver is caught through the Rebalancer's
// moves as through the mover's (recorded).
func TestMoveSimGroupOpsCatchesMutations(t *testing.T) {
	mutation.Require(t)
	calm := moveOptions{meta: true, groupOps: true, groups: 3, opKillAfter: "precopy"}
	faults := calm
	faults.faults, faults.leaderCrashes, faults.moverDeaths = true, true, true
	const seed = 1
	for _, tc := range []struct {
		name string
		o    moveOptions
		set  func(*moveOptions)
		want string
	}{
		{"DoneBeforeCopy/calm", calm, func(o *moveOptions) { o.doneEarly = true }, "is owned by no live group's table at the end"},
		{"DoneBeforeCopy/faults", faults, func(o *moveOptions) { o.doneEarly = true }, "is owned by no live group's table at the end"},
		{"PlanAfterHandOver/faults", faults, func(o *moveOptions) { o.planLate = true }, "a move no map of the metadata group records"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := moveSim(seed, nil, tc.o, nil); err != nil {
				t.Fatalf("seed %d fails without the mutation: %v", seed, err)
			}
			o := tc.o
			tc.set(&o)
			err := moveSim(seed, nil, o, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("seed %d: the mutation was not caught by %q: %v", seed, tc.want, err)
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				if strings.Contains(l, tc.want) {
					t.Logf("caught: %s", l)
				}
			}
		})
	}
}
