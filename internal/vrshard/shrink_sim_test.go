package vrshard

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/vr"
)

// Groups of five shrinking to three: kefir cluster remove-node proper in
// the move simulation (moveOptions.shrink, with the metadata group; issue
// 28, docs/design/cluster.md §9). On the small cluster (two data groups and
// the metadata group on nodes 1-3) two new nodes, 4 and 5, join every group
// — kefir cluster add-members --group G --new 4@…,5@… for each group, the
// metadata group last — and then nodes 1 and 2 leave every group: kefir
// cluster remove-node --id 1,2, whose plan (cluster.PlanRemoveNodes) takes
// each group of five to three. The operator (shrinkRun, a coroutine)
// runs each command as runClusterMembership does: the map read at the
// metadata leader, the production planner (cluster.PlanAddMembers,
// cluster.PlanRemoveNodes), ADDNODE of the new nodes, then per group the
// wait for the members the group's last change added to catch up
// (cluster.Mover.WaitCaughtUp: KEFIR.GROUP PROGRESS at the group's leader),
// the reconfiguration (KEFIR.GROUP RECONFIG, the production
// Replica.ReconfigureStepped under it) and SETMEMBERS; a rerun after an
// error plans what is left. New members open on nodes 4 and 5 as their
// group answers and pull its state through VR; the members on nodes 1 and
// 2 leave and retire. All the while the mover moves slots between the
// groups, under the nemesis or power cuts, leader crashes after steps,
// mover deaths and take-overs. At the end the replication auditor finds
// every group — the metadata group too — at three members on nodes 3, 4
// and 5, each up and holding what the group committed, and the replicas
// of nodes 1 and 2 retired.

// shrinkOut and shrinkIn: the nodes (ids) that leave every group, and the
// new ones that join it.
var (
	shrinkOut = []uint64{1, 2}
	shrinkIn  = []uint64{4, 5}
)

// replyProgress answers KEFIR.GROUP PROGRESS GROUP g as the server's
// writeProgress does: at the group's leader, [epoch, start op, commit op,
// [[member, persisted op, applied op], ...]] of the followers it heard
// from (members as node ids); elsewhere -MOVED to the leader's node.
func (n *hostNode) replyProgress(from sim.Addr, seq uint64, g kcluster.GroupID) {
	if err := (simSlots{n}).led(g); err != nil {
		n.replySlots(from, seq, errValue(err))
		return
	}
	c := n.cl
	m, st := hostedGroup{n.r}.Membership(), hostedGroup{n.r}.State()
	num := func(x uint64) resp.Value { return resp.Value{Kind: resp.Int, Int: int64(x)} }
	fs := resp.Value{Kind: resp.Array, Elems: []resp.Value{}}
	for _, f := range st.Followers {
		fs.Elems = append(fs.Elems, resp.Value{Kind: resp.Array, Elems: []resp.Value{num(uint64(c.node[f.ID-1] + 1)), num(f.Persisted), num(f.Applied)}})
	}
	n.replySlots(from, seq, resp.Value{Kind: resp.Array, Elems: []resp.Value{num(m.Epoch), num(m.Start), num(st.Commit), fs}})
}

// shrinkRun is the operator of the add-members and the remove-node.
type shrinkRun struct {
	s  *sim.Sim
	cl *simCluster
	// phase: "add-members", "remove-node", "" (finished).
	phase   string
	due     bool
	running bool
	nextAt  time.Duration
	changes int // reconfigurations answered
	reruns  int
	lastErr error
	log     []string
}

// newShrink places, for every group (the metadata group's too), a replica
// on each of two new nodes: the addresses their new members take.
func newShrink(c *simCluster) *shrinkRun {
	gs := []kcluster.GroupID{kcluster.MetaGroupID}
	for g := range c.groups() {
		gs = append(gs, kcluster.GroupID(g+1))
	}
	for range shrinkIn {
		k := c.nodes
		first := len(c.node)
		c.addSpares(len(gs), true)
		for i, g := range gs {
			sp := first + i
			c.spares = slices.DeleteFunc(c.spares, func(x int) bool { return x == sp })
			c.node[sp], c.group[sp] = k, g
			if g == kcluster.MetaGroupID {
				c.meta.all = append(c.meta.all, sp)
			}
		}
	}
	return &shrinkRun{cl: c, phase: "add-members"}
}

// schedule makes the operator due at a time drawn within the faults.
func (r *shrinkRun) schedule(until time.Duration) {
	r.s.After(100*time.Millisecond+time.Duration(r.s.Rand().Int64N(int64(until/2))), func() {
		r.due = true
		r.log = append(r.log, fmt.Sprintf("%v: nodes %v join every group, then nodes %v leave them", r.s.Now(), shrinkIn, shrinkOut))
	})
}

func (r *shrinkRun) next(now time.Duration) (*kcluster.Mover, moverJob) {
	if !r.due || r.phase == "" || r.running || now < r.nextAt {
		return nil, nil
	}
	r.running = true
	mv := &kcluster.Mover{RetryFor: time.Second}
	for k := range r.cl.seeds {
		mv.Seeds = append(mv.Seeds, nodeAddr(k))
	}
	phase := r.phase
	return mv, func(ctx context.Context, mv *kcluster.Mover) (any, error) {
		if phase == "add-members" {
			return nil, r.addMembers(ctx, mv)
		}
		return nil, r.removeNodes(ctx, mv)
	}
}

// addMembers is kefir cluster add-members --group G --new 4@…,5@… for the
// data groups, then the metadata group (a node joins the metadata group
// only once it is a member of a data group): each planned from the map as
// it is then.
func (r *shrinkRun) addMembers(ctx context.Context, mv *kcluster.Mover) error {
	var news []kcluster.Member
	for _, id := range shrinkIn {
		k := int(id) - 1
		news = append(news, kcluster.Member{ID: id, ClientAddr: nodeAddr(k), PeerAddr: fmt.Sprintf("peer%d", k)})
	}
	gs := []kcluster.GroupID{}
	for g := range r.cl.groups() {
		gs = append(gs, kcluster.GroupID(g+1))
	}
	gs = append(gs, kcluster.MetaGroupID)
	for _, g := range gs {
		cm, err := mv.MetaMap(ctx)
		if err != nil {
			return err
		}
		ch, unknown, err := kcluster.PlanAddMembers(cm, g, news)
		if err != nil {
			return err
		}
		for _, n := range unknown {
			if _, err := mv.AddNode(ctx, n.ID, n.ClientAddr, n.PeerAddr, ""); err != nil {
				return err
			}
		}
		if len(ch.Members) == 0 {
			// Recorded already: a rerun (SETMEMBERS's answer was lost).
			if err := r.resync(ctx, mv, cm, g); err != nil {
				return err
			}
			continue
		}
		if err := r.change(ctx, mv, ch, nil); err != nil {
			return err
		}
	}
	return nil
}

// removeNodes is kefir cluster remove-node --id 1,2: every group with
// either, planned from the map (cluster.PlanRemoveNodes: each group of
// five to three; a rerun plans what is left).
func (r *shrinkRun) removeNodes(ctx context.Context, mv *kcluster.Mover) error {
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return err
	}
	out := func(id uint64) bool { return slices.Contains(shrinkOut, id) }
	in := slices.ContainsFunc(cm.MetaMembers(), out)
	for _, g := range cm.Groups {
		in = in || slices.ContainsFunc(g.Members, out)
	}
	if !in {
		// Done: a rerun after the last change was recorded (its answer
		// lost).
		for _, g := range append(r.dataGroups(), kcluster.MetaGroupID) {
			if err := r.resync(ctx, mv, cm, g); err != nil {
				return err
			}
		}
		return nil
	}
	plan, err := kcluster.PlanRemoveNodes(cm, shrinkOut)
	if err != nil {
		return err
	}
	for _, ch := range plan {
		if err := r.change(ctx, mv, ch, shrinkOut); err != nil {
			return err
		}
	}
	return nil
}

// change is one group's step of a membership command (runClusterMembership):
// wait for the members the group's last change added to catch up (unless
// the group made this change already: a rerun), reconfigure, record the
// members in the map, and open the new members on their nodes.
func (r *shrinkRun) change(ctx context.Context, mv *kcluster.Mover, ch kcluster.GroupChange, leaving []uint64) error {
	cur, err := mv.GroupConfigOf(ctx, ch.Group)
	if err != nil {
		return err
	}
	if !kcluster.SameIDs(cur.Members, ch.Members) {
		if err := mv.WaitCaughtUp(ctx, ch.Group, cur.Members, cur.Previous, leaving, 2*time.Second, nil); err != nil {
			return err
		}
	}
	gc, err := mv.ReconfigureGroup(ctx, ch.Group, cur.Epoch, ch.Members)
	if err != nil {
		return err
	}
	if _, err := mv.SetMembers(ctx, ch.Group, gc.Epoch, gc.Members); err != nil {
		return err
	}
	r.joined(ch.Group, gc)
	return nil
}

// dataGroups are the data groups' ids.
func (r *shrinkRun) dataGroups() []kcluster.GroupID {
	var gs []kcluster.GroupID
	for g := range r.cl.groups() {
		gs = append(gs, kcluster.GroupID(g+1))
	}
	return gs
}

// resync brings the simulation's record of group g's members (and its new
// members' nodes) to what the map records, where a rerun finds a change
// recorded whose answer the operator did not get: the group's
// configuration as the reconfiguration to the map's list answers it (a
// no-op: the current set answers the current configuration).
func (r *shrinkRun) resync(ctx context.Context, mv *kcluster.Mover, cm *kv.ClusterMap, g kcluster.GroupID) error {
	c := r.cl
	var want []uint64
	rec := c.meta.addrs
	if g == kcluster.MetaGroupID {
		want = cm.MetaMembers()
	} else if mg, ok := cm.Group(uint64(g)); ok {
		want, rec = mg.Members, c.members[g-1]
	}
	var have []uint64
	for _, a := range rec {
		have = append(have, uint64(c.node[a]+1))
	}
	if kcluster.SameIDs(have, want) {
		return nil
	}
	cur, err := mv.GroupConfigOf(ctx, g)
	if err != nil {
		return err
	}
	gc, err := mv.ReconfigureGroup(ctx, g, cur.Epoch, want)
	if err != nil {
		return err
	}
	r.joined(g, gc)
	return nil
}

// joined records group g's configuration gc (its members as the map now
// names them) and opens its members new to the run on their nodes, as a
// node does when the map names it (syncGroups). Runs on the operator's
// coroutine while the simulator waits: the starts are scheduled.
func (r *shrinkRun) joined(g kcluster.GroupID, gc kcluster.GroupConfig) {
	c, s := r.cl, r.s
	r.changes++
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
	r.log = append(r.log, fmt.Sprintf("%v: group %d reconfigured to epoch %d, members (nodes) %v, previous %v", s.Now(), g, vm.Epoch, gc.Members, gc.Previous))
	for _, a := range members {
		if k := c.node[a]; !slices.Contains(shrinkIn, uint64(k+1)) || c.joined[a] != nil {
			continue // a first member, or opened already (a rerun's answer)
		}
		c.joined[a] = &simJoin{group: g, m: vm}
		s.After(0, func() {
			c.hosted[c.node[a]] = append(c.hosted[c.node[a]], a)
			s.Crash(a)
			s.Restart(a)
		})
	}
}

func (r *shrinkRun) kill(time.Duration) bool { return false }
func (r *shrinkRun) afterStep(string) bool   { return false }

func (r *shrinkRun) done(now time.Duration, _ any, err error) {
	r.running = false
	if err != nil {
		r.reruns++
		r.lastErr = err
		r.log = append(r.log, fmt.Sprintf("%v: %s: %v", r.s.Now(), r.phase, err))
		r.nextAt = now + 20*time.Millisecond
		return
	}
	r.log = append(r.log, fmt.Sprintf("%v: %s finished", r.s.Now(), r.phase))
	if r.phase == "add-members" {
		r.phase = "remove-node"
		return
	}
	r.phase = ""
}

// shrunk is the end of a run with shrink: both commands finished, and every
// group's configuration (as the replication auditor then checks it) on
// nodes 3, 4 and 5.
func shrunk(c *simCluster, r *shrinkRun) error {
	if r.phase != "" {
		return fmt.Errorf("the %s did not finish 8 s after the faults ended (last error: %v)", r.phase, r.lastErr)
	}
	want := []int{2, 3, 4}
	check := func(name string, ms []int) error {
		var nodes []int
		for _, a := range ms {
			nodes = append(nodes, c.node[a])
		}
		slices.Sort(nodes)
		if !slices.Equal(nodes, want) {
			return fmt.Errorf("%s is on nodes (0-based) %v, want %v", name, nodes, want)
		}
		return nil
	}
	for g, ms := range c.members {
		if err := check(fmt.Sprintf("group %d", g+1), ms); err != nil {
			return err
		}
	}
	return check("the metadata group", c.meta.addrs)
}

// TestMoveSimShrink runs kefir cluster add-members (every group of three
// to five) and remove-node (five to three) through the production planners
// and reconfiguration in the move simulation with the metadata group and
// the moves (shrinkRun): under the nemesis (5 seeds) and power cuts (2);
// KEFIR_SOAK=1: 150 and 75; KEFIR_SIM_SEEDS=n: n of each.
func TestMoveSimShrink(t *testing.T) {
	seeds := 5
	if soakOn() {
		seeds = 150
	}
	for _, tc := range []struct {
		name string
		o    moveOptions
		n    int
	}{
		{"faults", moveOptions{meta: true, shrink: true, faults: true, leaderCrashes: true, moverDeaths: true}, seeds},
		{"powercuts", moveOptions{meta: true, shrink: true, powerCuts: true, leaderCrashes: true, moverDeaths: true}, seeds / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim.Explore(t, 1, max(tc.n, 1), func(seed uint64, trace io.Writer) error {
				var sum string
				err := moveSim(seed, trace, tc.o, &sum)
				if testing.Verbose() {
					t.Logf("seed %d: %s", seed, sum)
				}
				if err == nil && !strings.Contains(sum, "groups of five to three: true") {
					return fmt.Errorf("the shrink did not run: %s", sum)
				}
				return err
			})
		})
	}
}

// TestMoveSimShrinkCatchesMutations: cluster.MultiMut.RemoveNodesSkipsMeta,
// "remove-node plans the data groups only" (the removed nodes stay in the
// metadata group, which then runs on five members, two of them on nodes
// the operator took away), is caught at a seed clean without it, with and
// without faults, by the replication auditor; linearizability cannot see
// it (every group still serves).
func TestMoveSimShrinkCatchesMutations(t *testing.T) {
	mutation.Require(t)
	const want = "the metadata group 65535: 5 members"
	for _, tc := range []struct {
		name string
		o    moveOptions
	}{
		{"calm", moveOptions{meta: true, shrink: true}},
		{"faults", moveOptions{meta: true, shrink: true, faults: true, leaderCrashes: true, moverDeaths: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const seed = 1
			if err := moveSim(seed, nil, tc.o, nil); err != nil {
				t.Fatalf("seed %d fails without the mutation: %v", seed, err)
			}
			o := tc.o
			o.skipMeta = true
			err := moveSim(seed, nil, o, nil)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("seed %d: RemoveNodesSkipsMeta not caught by %q: %v", seed, want, err)
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				if strings.Contains(l, want) {
					t.Logf("caught: %s", l)
				}
			}
		})
	}
}
