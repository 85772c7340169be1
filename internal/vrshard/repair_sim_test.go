package vrshard

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/sim"
)

// The metadata leaders' repairers in the move simulation
// (moveOptions.repair; docs/design/cluster.md, "Automatic repair"): every
// node that hosts a replica of the metadata group runs the production
// cluster.Repairer, as Multi.FollowMap does — ticked every 50 ms, Tick
// with the map its replica applied while the replica leads, Lost while it
// does not, a new Repairer when the node's process restarts (its metadata
// replica crashed) — on the simulation's clock. Its jobs (a probe round, a
// repair) run as coroutines in lockstep (moverNode, a pool of repairSlots),
// so the production probe rounds, one-repair-at-a-time rule and cancel on
// deposition run under the simulator: a probe is a PING over the simulated
// network to each node of the map (answered by any replica of the node
// that is up; a node dead for good, or with every replica down, does not
// answer), and a repair runs the production Repairer.Repair (its
// NodeChange), once the drain's place has put each group's spare where the
// plan chose.
//
// A new member opens where the leader's map names it (followMap, as a node
// follows the map: syncGroups), so a group a cancelled repair changed and
// recorded without hearing back is followed too.
//
// The scenario: node N dies for good amid the faults (drainRun's placed
// death); once its repair starts, its repairer's node is deposed (its
// metadata replica cut off from the other replicas for 300 ms, so that
// they elect another leader, whose repairer starts afresh) or crashed (a
// new process: its jobs die with it), drawn; and another node, alive, is
// cut off from the repairers for a quarter to a half of --repair-after.
// The auditor: a repairer never has two repairs in flight; a repair whose
// node stopped leading sends nothing once its repairer was told (Lost); a
// node is repaired only when no PING of the repairer's got its answer for
// --repair-after; and the replication auditor at the end finds N's groups
// at three members on live nodes.

// simRepairAfter is the repairers' --repair-after in the simulation: twice
// the probe period (probeEvery's floor, 500 ms), so that one lost PING does
// not judge a node dead.
const simRepairAfter = time.Second

// repairSlots is how many coroutines the repairers' jobs share: a probe
// and a repair at each of two repairers at once (a deposed one's and its
// successor's), and a spare for a mutation's second repair.
const repairSlots = 5

// repairSim is the repairers of the metadata group's nodes and the pool of
// coroutines their jobs run on.
type repairSim struct {
	s     *sim.Sim
	cl    *simCluster
	d     *drainRun
	rep   map[int]*repairerAt // by node (0-based)
	queue []*repairJob        // started (Repairer.Go), not yet on a slot
	jobs  []*repairJob        // jobs started, not yet returned
	slots []*moverNode
	// The scenario: depose (or crash) the node whose repairer repairs N
	// once; cut node cut (0-based; -1: none yet) off from the repairers
	// for cutFor.
	deposeDrawn  bool
	cut          int
	cutFor       time.Duration
	deposed      int // repairs in flight when their node stopped leading
	killed       int // repairs that died with their node
	repairs      int // repairs started
	refused      int // repairs of another node than N (refused: Exec's error)
	most         int // most repairs in flight at once, all repairers
	err          error
	log          []string
	leaderTrail  []int // the nodes that led, in order (a change appended)
	lastLeader   int
	deposeAction string
	// answered: by repairer, by node (0-based), when a PING of its probe
	// last got the node's answer.
	answered map[*repairerAt]map[int]time.Duration
	// cutJudged: the cut node was judged dead (its repair refused).
	cutJudged bool
}

// repairerAt is one node process's repairer.
type repairerAt struct {
	node int
	host *hostNode // the process's metadata replica
	r    *kcluster.Repairer
}

// repairJob is one job a Repairer started.
type repairJob struct {
	at      *repairerAt
	what    string
	repair  bool
	mv      *kcluster.Mover
	job     func(ctx context.Context, mv *kcluster.Mover)
	deposed bool // its repairer was told Lost while it ran
	dead    bool // its node's process died
	// answers: a probe's, by node (0-based), when its PING got the
	// node's answer (the watch learns them when the round returns).
	answers map[int]time.Duration
}

// repairSlot is a coroutine of the pool: it runs the queue's jobs one after
// the other.
type repairSlot struct {
	rs  *repairSim
	cur *repairJob
}

func newRepairSim(cl *simCluster, d *drainRun) *repairSim {
	rs := &repairSim{cl: cl, d: d, rep: map[int]*repairerAt{}, cut: -1, lastLeader: -1, answered: map[*repairerAt]map[int]time.Duration{}}
	for range repairSlots {
		rs.slots = append(rs.slots, &moverNode{run: &repairSlot{rs: rs}, cl: cl})
	}
	return rs
}

// start schedules the repairers' ticks and the cut node.
func (rs *repairSim) start(faultsUntil time.Duration) {
	s := rs.s
	var tick func()
	tick = func() {
		rs.tick()
		s.After(50*time.Millisecond, tick)
	}
	s.After(50*time.Millisecond, tick)
	// A live node cut off from the repairers for less than half of
	// --repair-after: neither N nor the dead spare, nor the one whose
	// repairer is watched (a metadata node keeps its replica's view).
	s.After(100*time.Millisecond+time.Duration(s.Rand().Int64N(int64(faultsUntil))), func() {
		var cand []int
		for k := range rs.cl.nodes {
			if k != rs.d.old && k != rs.d.dead && len(rs.cl.hosted[k]) > 0 {
				cand = append(cand, k)
			}
		}
		rs.cut = cand[s.Rand().IntN(len(cand))]
		rs.cutFor = simRepairAfter/4 + time.Duration(s.Rand().Int64N(int64(simRepairAfter/4)))
		rs.log = append(rs.log, fmt.Sprintf("%v: node %d cut off from the repairers for %v", s.Now(), rs.cut+1, rs.cutFor))
		rs.cutLinks(true)
		s.After(rs.cutFor, func() { rs.cutLinks(false) })
	})
}

// cutLinks blocks (or unblocks) the links between the pool's coroutines
// and the cut node's replicas, both ways.
func (rs *repairSim) cutLinks(block bool) {
	for _, sl := range rs.slots {
		for _, a := range rs.cl.hosted[rs.cut] {
			from, to := sl.addr, sim.Addr(a)
			if block {
				rs.s.Block(from, to)
				rs.s.Block(to, from)
			} else {
				rs.s.Unblock(from, to)
				rs.s.Unblock(to, from)
			}
		}
	}
}

func (rs *repairSim) fail(format string, a ...any) {
	if rs.err == nil {
		rs.err = fmt.Errorf("%v: the repairers' auditor: %s", rs.s.Now(), fmt.Sprintf(format, a...))
	}
}

// tick is Multi.FollowMap's tick at every node hosting a metadata replica.
func (rs *repairSim) tick() {
	s, c := rs.s, rs.cl
	rs.followMap()
	for _, a := range c.meta.addrs {
		k := c.node[a]
		at := rs.rep[k]
		n, up := s.Replica(a).(*hostNode)
		if !s.Up(a) || !up || (at != nil && at.host != n) {
			// The node's process died (and maybe restarted): its repairer
			// and its jobs with it.
			if at != nil {
				for _, j := range rs.jobs {
					if j.at == at && !j.dead {
						j.dead = true
						if j.repair {
							rs.killed++
						}
					}
				}
				delete(rs.rep, k)
				at = nil
			}
			if !s.Up(a) || !up {
				continue
			}
		}
		if at == nil {
			at = &repairerAt{node: k, host: n}
			at.r = &kcluster.Repairer{After: simRepairAfter, Net: &kcluster.Mover{Seeds: c.seedAddrs(), Clock: simNodeClock{s}},
				Probe: simProbe, Go: func(_ context.Context, what string, mv *kcluster.Mover, job func(context.Context, *kcluster.Mover)) {
					rs.spawn(at, what, mv, job)
				},
				Exec: func(ctx context.Context, mv *kcluster.Mover, cm *kv.ClusterMap, d kcluster.RepairDecision) error {
					return rs.exec(ctx, at, mv, cm, d)
				},
				Logf: func(format string, a ...any) {
					rs.log = append(rs.log, fmt.Sprintf("%v: node %d: ", s.Now(), k+1)+fmt.Sprintf(format, a...))
				}}
			rs.rep[k] = at
		}
		if n.leads() {
			if rs.lastLeader != k {
				rs.lastLeader = k
				rs.leaderTrail = append(rs.leaderTrail, k+1)
			}
			if cm, _ := n.metaMap(); cm != nil {
				at.r.Tick(context.Background(), cm)
			}
			continue
		}
		for _, j := range rs.jobs {
			if j.at == at && !j.dead && !j.deposed {
				j.deposed = true
				if j.repair {
					rs.deposed++
					rs.log = append(rs.log, fmt.Sprintf("%v: node %d no longer leads the metadata group: its %s is cancelled", s.Now(), k+1, j.what))
				}
			}
		}
		at.r.Lost()
	}
}

// spawn is Repairer.Go: the job waits for a free slot of the pool.
func (rs *repairSim) spawn(at *repairerAt, what string, mv *kcluster.Mover, job func(context.Context, *kcluster.Mover)) {
	j := &repairJob{at: at, what: what, repair: strings.HasPrefix(what, "repair"), mv: mv, job: job}
	rs.queue = append(rs.queue, j)
	rs.jobs = append(rs.jobs, j)
	if !j.repair {
		return
	}
	rs.repairs++
	mine, all := 0, 0
	for _, x := range rs.jobs {
		if x.repair {
			all++
			if x.at == at && !x.dead {
				mine++
			}
		}
	}
	if mine > 1 {
		rs.fail("node %d's repairer started a %s with %d repairs of its own in flight (one at a time)", at.node+1, what, mine-1)
	}
	rs.most = max(rs.most, all)
	// Judged by the rounds that returned before now: none heard the node
	// for --repair-after.
	var node int
	fmt.Sscanf(what, "repair of node %d", &node)
	if last, ok := rs.answered[at][node-1]; ok && rs.s.Now()-last < simRepairAfter {
		rs.fail("node %d's repairer repairs node %d, whose answer to a PING of its probe arrived %v ago (--repair-after %v)", at.node+1, node, rs.s.Now()-last, simRepairAfter)
	}
	rs.log = append(rs.log, fmt.Sprintf("%v: node %d's repairer starts a %s", rs.s.Now(), at.node+1, what))
	if !rs.deposeDrawn && strings.HasSuffix(what, fmt.Sprintf("node %d", rs.d.old+1)) {
		rs.deposeDrawn = true
		rs.depose(at)
	}
}

// depose cuts the repairing node's metadata replica off from every other
// replica for 300 ms (the others elect a leader; it learns of the new view
// when the links come back), or crashes it (restarted 20-80 ms later: a new
// process), 0-100 ms after its repair started, drawn.
func (rs *repairSim) depose(at *repairerAt) {
	s := rs.s
	crash := s.Rand().IntN(2) == 0
	s.After(time.Duration(s.Rand().IntN(100))*time.Millisecond, func() {
		a := rs.cl.replicaAt(at.node, kcluster.MetaGroupID)
		if a < 0 || !s.Up(a) || rs.rep[at.node] != at {
			return
		}
		if crash {
			rs.deposeAction = fmt.Sprintf("node %d's metadata replica crashed during its repair", at.node+1)
			s.Crash(a)
			s.After(time.Duration(20+s.Rand().IntN(60))*time.Millisecond, func() {
				if !s.Up(a) {
					s.Restart(a)
				}
			})
			return
		}
		rs.deposeAction = fmt.Sprintf("node %d's metadata replica cut off for 300 ms during its repair", at.node+1)
		for b := range s.Config().Replicas {
			if b != a {
				s.Block(sim.Addr(a), sim.Addr(b))
				s.Block(sim.Addr(b), sim.Addr(a))
			}
		}
		s.After(300*time.Millisecond, func() {
			for b := range s.Config().Replicas {
				if b != a {
					s.Unblock(sim.Addr(a), sim.Addr(b))
					s.Unblock(sim.Addr(b), sim.Addr(a))
				}
			}
		})
	})
}

// exec is Repairer.Exec: N's groups by at's production Repair (its log
// lines and NodeChange, as a node runs it), once the drain's place has put
// each group's spare on the node the plan chose; each new member opens
// where the leader's map names it (followMap). A decision for another node — one whose PINGs were lost for
// --repair-after, or every replica of which was down that long — is
// refused (the simulation re-creates N's replicas only; the repairer tries
// it again later). The auditor: the node did not answer a PING of this
// repairer's for --repair-after (checked when it decides: spawn).
func (rs *repairSim) exec(ctx context.Context, at *repairerAt, mv *kcluster.Mover, cm *kv.ClusterMap, d kcluster.RepairDecision) error {
	old := uint64(rs.d.old + 1)
	if d.Node != old {
		if int(d.Node)-1 == rs.cut {
			rs.cutJudged = true
		}
		rs.refused++
		return fmt.Errorf("the simulation re-creates node %d's replicas only, not node %d's", old, d.Node)
	}
	if len(d.Skipped) > 0 {
		return fmt.Errorf("node %d's groups skipped (N's groups never lose a majority): %+v", old, d.Skipped)
	}
	rs.d.log = append(rs.d.log, fmt.Sprintf("%v: the repairer re-creates node %d's replicas", rs.s.Now(), old))
	rs.d.place(ctx, mv, cm, d.Plan)
	err := at.r.Repair(ctx, mv, cm, d)
	if err != nil {
		rs.d.reruns++
		rs.d.lastErr = err
	}
	return err
}

// followMap opens each of N's groups' new members once the metadata
// leader's map names its node (a node follows the map: syncGroups), in the
// configuration a member of the group that has it holds.
func (rs *repairSim) followMap() {
	c, d, s := rs.cl, rs.d, rs.s
	n := c.metaLeader()
	if n == nil {
		return
	}
	cm, _ := n.metaMap()
	if cm == nil {
		return
	}
	old := uint64(d.old + 1)
	if !d.finished && c.dead[d.old] && !slices.ContainsFunc(cm.Groups, func(g kv.MapGroup) bool { return slices.Contains(g.Members, old) }) {
		// Repaired: the map names N in no group (the repair that did it
		// may not have heard back).
		d.finished = true
		d.log = append(d.log, fmt.Sprintf("%v: node %d repaired: the map names it in no group", s.Now(), old))
	}
	// In group order: each opening schedules its replica's start, so a map's
	// order would make two runs of one seed differ.
	for _, g := range slices.Sorted(maps.Keys(d.spare)) {
		sp := d.spare[g]
		if c.joined[sp] != nil || c.node[sp] < 0 || !slices.Contains(kcluster.GroupMembersOf(cm, g), uint64(c.node[sp]+1)) {
			continue
		}
		for a, ga := range c.group {
			h, ok := s.Replica(a).(*hostNode)
			if ga != g || a == sp || !ok || !s.Up(a) {
				continue
			}
			m := hostedGroup{h.r}.Membership()
			if !slices.Contains(m.Members, uint64(sp)+1) {
				continue
			}
			nodes := func(ids []uint64) []uint64 {
				var out []uint64
				for _, id := range ids {
					out = append(out, uint64(c.node[id-1]+1))
				}
				return out
			}
			rs.log = append(rs.log, fmt.Sprintf("%v: the map names node %d in group %d: its member opens", s.Now(), c.node[sp]+1, g))
			d.joined(g, kcluster.GroupConfig{Membership: kcluster.Membership{Epoch: m.Epoch, Start: m.Start, Members: nodes(m.Members), Previous: nodes(m.Previous)}})
			break
		}
	}
}

// simProbe is Repairer.Probe in the simulation: a PING over the simulated
// network to every node of cm, one after the other, each asked twice at
// most (one round trip's timeout each).
func simProbe(ctx context.Context, mv *kcluster.Mover, cm *kv.ClusterMap) map[uint64]bool {
	live := map[uint64]bool{}
	for _, n := range cm.Nodes {
		for range 2 {
			v, err := mv.Transport(ctx, n.ClientAddr, [][]byte{[]byte("PING")})
			if err == nil && string(v.Str) == "PONG" {
				live[n.ID] = true
				break
			}
			if ctx.Err() != nil {
				return live
			}
		}
	}
	return live
}

// simNodeClock is a repairer's clock: the simulation's (a repairer's time
// is read at its node's tick, between events). Its jobs sleep on their
// coroutine's.
type simNodeClock struct{ s *sim.Sim }

func (c simNodeClock) Now() time.Time { return time.Unix(0, simEpoch+int64(c.s.Now())) }

func (c simNodeClock) Sleep(context.Context, time.Duration) error {
	panic("simNodeClock: a repairer's job sleeps on its coroutine's clock")
}

// seedAddrs is the client address of every node of the static map.
func (c *simCluster) seedAddrs() []string {
	var out []string
	for k := range c.seeds {
		out = append(out, nodeAddr(k))
	}
	return out
}

func (p *repairSlot) next(time.Duration) (*kcluster.Mover, moverJob) {
	rs := p.rs
	for len(rs.queue) > 0 {
		j := rs.queue[0]
		rs.queue = rs.queue[1:]
		if j.dead {
			// Its node died before it started.
			rs.jobs = slices.DeleteFunc(rs.jobs, func(x *repairJob) bool { return x == j })
			continue
		}
		p.cur = j
		return j.mv, func(ctx context.Context, mv *kcluster.Mover) (any, error) {
			if !j.repair {
				// The auditor's truth: which node answered this
				// repairer's PING, when.
				inner := mv.Transport
				mv.Transport = func(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
					v, err := inner(ctx, addr, args)
					if err == nil && string(v.Str) == "PONG" {
						k, _ := strconv.Atoi(strings.TrimPrefix(addr, "node"))
						if j.answers == nil {
							j.answers = map[int]time.Duration{}
						}
						j.answers[k] = rs.s.Now()
					}
					return v, err
				}
			} else {
				// The auditor: once its repairer was told Lost, a repair
				// sends nothing (its context is cancelled).
				inner := mv.Transport
				mv.Transport = func(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
					if j.deposed && !j.dead && ctx.Err() == nil {
						rs.fail("node %d's %s went on after its node stopped leading: %s to %s", j.at.node+1, j.what, args[0], addr)
					}
					return inner(ctx, addr, args)
				}
			}
			j.job(ctx, mv)
			return nil, nil
		}
	}
	return nil, nil
}

// kill: a job dies with its node's process.
func (p *repairSlot) kill(time.Duration) bool { return p.cur != nil && p.cur.dead }

func (p *repairSlot) afterStep(string) bool { return false }

func (p *repairSlot) done(time.Duration, any, error) {
	rs, j := p.rs, p.cur
	p.cur = nil
	rs.jobs = slices.DeleteFunc(rs.jobs, func(x *repairJob) bool { return x == j })
	if j.answers != nil && !j.deposed {
		// The round's answers, as its repairer's watch took them (a
		// round its repairer lost the lead during is dropped).
		if rs.answered[j.at] == nil {
			rs.answered[j.at] = map[int]time.Duration{}
		}
		for k, t := range j.answers {
			rs.answered[j.at][k] = t
		}
	}
}

// busy: a repair in flight or waiting.
func (rs *repairSim) busy() bool {
	return slices.ContainsFunc(rs.jobs, func(j *repairJob) bool { return j.repair })
}

func (rs *repairSim) summary() string {
	return fmt.Sprintf("repairers: %d repairs started (%d of another node refused, %d deposed, %d died with their node, at most %d in flight), leaders %v; %s; node %d cut off for %v (judged dead: %t)",
		rs.repairs, rs.refused, rs.deposed, rs.killed, rs.most, rs.leaderTrail, rs.deposeAction, rs.cut+1, rs.cutFor, rs.cutJudged)
}

// TestMoveSimRepairCatchesMutations: the repairers' auditor catches each
// deliberate bug of the production Repairer in the move simulation — a
// second repair started beside the running one (RepairMut.Concurrent), a
// deposed leader's repair that goes on (IgnoresDeposition: seed 2's leader
// is cut off mid-repair) — where the same seed passes with the repairer
// right. (IgnoresAfter, a node judged dead at its first unanswered probe,
// is TestRepairWatchMutationsCaught's: here a round that waits out two
// dead nodes' PINGs lasts about --repair-after, so the PING auditor cannot
// tell.)
func TestMoveSimRepairCatchesMutations(t *testing.T) {
	mutation.Require(t)
	if raceOn {
		t.Skip("the race run keeps TestMoveSimPlaced/repair's one seed")
	}
	o := moveOptions{meta: true, drain: true, placed: true, repair: true, scale: &moveScale{nodes: 9, groups: 12, keys: 8, clients: 6, ops: 60}, faults: true, leaderCrashes: true, moverDeaths: true}
	const seed = 2
	if err := moveSim(seed, nil, o, nil); err != nil {
		t.Fatalf("seed %d fails with the repairer right: %v", seed, err)
	}
	for _, tc := range []struct {
		name string
		set  *bool
	}{
		{"Concurrent", &kcluster.RepairMut.Concurrent},
		{"IgnoresDeposition", &kcluster.RepairMut.IgnoresDeposition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			*tc.set = true
			defer func() { *tc.set = false }()
			var sum string
			err := moveSim(seed, nil, o, &sum)
			if err == nil || !strings.Contains(err.Error(), "the repairers' auditor") {
				t.Fatalf("seed %d: not caught by the repairers' auditor (%v): %s", seed, err, sum)
			}
			t.Logf("caught: %v", firstLine(err))
		})
	}
}
