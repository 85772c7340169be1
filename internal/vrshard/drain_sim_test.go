package vrshard

import (
	"context"
	"fmt"
	"slices"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
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

// drainRun is the operator of a node's drain.
type drainRun struct {
	s  *sim.Sim
	cl *simCluster
	// old: the drained node; nw: the new one (0-based); spare: by group,
	// the address its new member takes on nw.
	old, nw  int
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
func newDrain(c *simCluster) *drainRun {
	old := c.nodes - 1
	var gs []kcluster.GroupID
	for _, a := range c.hosted[old] {
		gs = append(gs, c.group[a])
	}
	first := len(c.node)
	c.addSpares(len(gs), true)
	d := &drainRun{cl: c, old: old, nw: c.nodes - 1, spare: map[kcluster.GroupID]int{}}
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
		d.log = append(d.log, fmt.Sprintf("%v: node %d is drained: its groups go to node %d", d.s.Now(), d.old+1, d.nw+1))
	})
}

func (d *drainRun) next(now time.Duration) (*kcluster.Mover, moverJob) {
	if !d.due || d.running || d.finished || now < d.nextAt {
		return nil, nil
	}
	d.running = true
	mv := &kcluster.Mover{RetryFor: time.Second}
	for k := range d.cl.seeds {
		mv.Seeds = append(mv.Seeds, nodeAddr(k))
	}
	old, nw := uint64(d.old+1), kcluster.Member{ID: uint64(d.nw + 1), ClientAddr: nodeAddr(d.nw), PeerAddr: fmt.Sprintf("peer%d", d.nw)}
	return mv, func(ctx context.Context, mv *kcluster.Mover) (any, error) {
		cm, err := mv.MetaMap(ctx)
		if err != nil {
			return nil, err
		}
		plan, err := kcluster.PlanNodeChange(cm, old, nw)
		if err != nil {
			return nil, err
		}
		if _, err := mv.AddNode(ctx, nw.ID, nw.ClientAddr, nw.PeerAddr); err != nil {
			return nil, err
		}
		var out []kcluster.GroupConfig
		for _, ch := range plan {
			gc, err := mv.ReconfigureGroup(ctx, ch.Group, ch.Members)
			if err != nil {
				return out, err
			}
			if _, err := mv.SetMembers(ctx, ch.Group, gc.Epoch, gc.Members); err != nil {
				return out, err
			}
			d.joined(ch.Group, gc)
			out = append(out, gc)
		}
		return out, nil
	}
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
	s.After(0, func() {
		c.hosted[d.nw] = append(c.hosted[d.nw], sp)
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
