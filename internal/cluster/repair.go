package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Automatic repair (docs/cluster.md, "Automatic repair"; docs/design/
// cluster.md §"Automatic repair"): FAWN-KV's manager re-creates a failed
// node's replicas on the nodes it has (digest 002 §2). Here the metadata
// group's leader does, with the placed replace-node's own loop
// (PlanReplacePlaced, then NodeChange): it pings every node of the map, and
// a node that hosts a replica and has not answered for --repair-after is
// replaced in each of its groups by the live node placement picks, exactly
// as `kefir cluster replace-node --old N` would. Only the leader repairs, at
// most one node at a time, never while a move is recorded in flight, and
// never a group a majority of whose members do not answer (VR cannot
// reconfigure it without their quorum: the group is skipped and logged).

// DefaultRepairAfter is kefir server's --repair-after: how long a node that
// hosts replicas may go unanswered before its replicas are re-created
// elsewhere. As CockroachDB's server.time_until_store_dead (5 min): longer
// than a restart, an upgrade or a brief partition, each of which would
// otherwise cost a full copy of the node's data (and the node's own copy,
// retired when it comes back), and short against the time to a second
// failure in the same groups.
const DefaultRepairAfter = 5 * time.Minute

// RepairWatch is the repairer's decision, pure (the caller gives the time,
// each probe's outcome and the map its replica applied; no clock,
// goroutine or I/O), so that it is tested with an injected clock and a
// simulation can run the one the node runs. A watch starts afresh at a new
// leader (Reset when the node stops leading), so every node is given a
// whole --repair-after by the leader that watches it before it is judged.
type RepairWatch struct {
	seen  map[uint64]time.Time // when the node last answered, or the watch first saw it
	up    map[uint64]bool      // it answered the last probe
	retry map[uint64]time.Time // a repair of it failed: not again before
}

// RepairSkip is a group of the dead node the watch does not repair: Down
// of its members do not answer, a majority (Chain: all of them).
type RepairSkip struct {
	Group   GroupID
	Members []uint64
	Down    []uint64
	Chain   bool
}

// String is the group, its members and those not answering, and the rule
// that skips it (a VR group's, or a chain's).
func (s RepairSkip) String() string {
	why := "a majority of its members do not answer: VR cannot reconfigure it without their quorum"
	if s.Chain {
		why = "none of its members answers: a chain is repaired through a member that holds its state"
	}
	return fmt.Sprintf("%s (members %v, not answering %v): %s", GroupName(s.Group), s.Members, s.Down, why)
}

// stuckMessage is what the repairer logs (once) for a dead node it does
// not repair: PlanReplacePlaced's refusal, or the groups skipped, each
// with its rule.
func stuckMessage(s RepairDecision, after time.Duration) string {
	if s.Err != nil {
		return fmt.Sprintf("node %d has not answered for %v: %v", s.Node, after, s.Err)
	}
	var sk []string
	for _, x := range s.Skipped {
		sk = append(sk, x.String())
	}
	return fmt.Sprintf("node %d has not answered for %v, but its groups cannot be repaired now — %s — so it is not repaired (bring their nodes back)", s.Node, after, strings.Join(sk, "; "))
}

// RepairDecision is what the watch decided for one dead node: Plan to run
// (may be empty when every group is skipped), Skipped groups, or Err (no
// plan: PlanReplacePlaced's refusal, such as no live node to take its
// place).
type RepairDecision struct {
	Node    uint64
	Plan    []GroupChange
	Skipped []RepairSkip
	Err     error
}

// RepairMutations are the repairer's deliberate bugs (internal/mutation),
// which its tests switch on to show they catch them.
type RepairMutations struct {
	// IgnoresAfter: a node is judged dead at its first unanswered probe,
	// not after --repair-after (every restart becomes a full copy).
	IgnoresAfter bool
	// IgnoresQuorum: a group a majority of whose members do not answer is
	// planned anyway (its reconfiguration cannot commit).
	IgnoresQuorum bool
	// Concurrent: the leader starts a due repair while another runs (two
	// repairers of one node).
	Concurrent bool
	// IgnoresDeposition: losing the leadership does not cancel the repair
	// in hand (a deposed leader's repair goes on beside the new one's).
	IgnoresDeposition bool
}

// RepairMut is the process's RepairMutations (tests only; read under
// mutation.On).
var RepairMut RepairMutations

// Observe records a probe of node id at now: ok, it answered.
func (w *RepairWatch) Observe(now time.Time, id uint64, ok bool) {
	w.init()
	w.up[id] = ok
	if ok {
		w.seen[id] = now
		delete(w.retry, id)
	} else if _, known := w.seen[id]; !known {
		w.seen[id] = now
	}
}

// Failed records that a repair of id failed at now: not tried again for
// after (the next probes may change the picture; a rerun finishes it).
func (w *RepairWatch) Failed(now time.Time, id uint64, after time.Duration) {
	w.init()
	w.retry[id] = now.Add(after)
}

// Reset forgets everything (the node stopped leading).
func (w *RepairWatch) Reset() { *w = RepairWatch{} }

func (w *RepairWatch) init() {
	if w.seen == nil {
		w.seen, w.up, w.retry = map[uint64]time.Time{}, map[uint64]bool{}, map[uint64]time.Time{}
	}
}

// dead: id has not answered for after (by this watch).
func (w *RepairWatch) dead(now time.Time, id uint64, after time.Duration) bool {
	seen, known := w.seen[id]
	if !known || w.up[id] {
		return false
	}
	if mutation.On && RepairMut.IgnoresAfter {
		return true
	}
	return now.Sub(seen) >= after
}

// Due returns the repair to run now, if any: the lowest-id node of cm that
// is a member of a group and has not answered for after, with the plan
// PlanReplacePlaced makes for it (live: the nodes that answered their last
// probe) less the groups skipped for lack of a quorum of answering members.
// Nothing is due while cm records a move in flight (a move's driver and a
// reconfiguration are not run together by the repairer: the move finishes
// first), for a node whose repair failed less than after ago, or with
// after <= 0 (repair off). The decisions returned beside are those of dead
// nodes that have nothing to run (every group skipped, or no plan), for the
// caller to log.
func (w *RepairWatch) Due(now time.Time, cm *kv.ClusterMap, after time.Duration) (due RepairDecision, ok bool, stuck []RepairDecision) {
	if after <= 0 || cm == nil {
		return RepairDecision{}, false, nil
	}
	w.init()
	var groups []kv.MapGroup // mapGroups(cm), made at the first silent node
	for _, n := range cm.Nodes {
		if _, known := w.seen[n.ID]; !known {
			w.seen[n.ID] = now // watched from now: a whole after to answer
		}
	}
	if len(cm.Moves) > 0 { // the move finishes first; the watch goes on counting
		return RepairDecision{}, false, nil
	}
	live := func(id uint64) bool { return w.up[id] }
	for _, n := range cm.Nodes {
		id := n.ID
		// Liveness first: a map lookup, while membership scans every
		// group, and Due runs at each FollowMap tick (50 ms) with,
		// mostly, nobody dead (BenchmarkRepairWatchDue).
		if !w.dead(now, id, after) {
			continue
		}
		if groups == nil {
			groups = mapGroups(cm)
		}
		// A member; a chain's member its master dropped by failure
		// (kv.MapGroup.Dropped): the chain repaired around it within
		// --fail-after, long before --repair-after, and runs one short
		// until its place is re-created; or a node a chain wants in
		// (Joining) that died before it was linked in: the master keeps
		// the chain one longer for it and a replace's leaving member
		// waits for it, until the repair withdraws the join and places
		// another (PlanReplacePlaced plans each).
		if !slices.ContainsFunc(groups, func(g kv.MapGroup) bool {
			return slices.Contains(g.Members, id) || g.IsChain() && (slices.Contains(g.Dropped, id) || slices.Contains(g.Joining, id))
		}) {
			continue
		}
		if r, failed := w.retry[id]; failed && now.Before(r) {
			continue
		}
		d := RepairDecision{Node: id}
		plan, err := PlanReplacePlaced(cm, id, live)
		if err != nil {
			d.Err = err
			stuck = append(stuck, d)
			continue
		}
		for _, ch := range plan {
			i := slices.IndexFunc(groups, func(g kv.MapGroup) bool { return g.ID == uint64(ch.Group) })
			g := groups[i]
			var down []uint64
			for _, m := range g.Members {
				if !w.up[m] {
					down = append(down, m)
				}
			}
			// VR reconfigures a group through its current epoch's quorum
			// (a majority of its members); a chain through any one member
			// that has the state.
			lost := 2*len(down) > len(g.Members)
			if g.IsChain() {
				lost = len(down) == len(g.Members)
			}
			if lost && !(mutation.On && RepairMut.IgnoresQuorum) {
				d.Skipped = append(d.Skipped, RepairSkip{Group: ch.Group, Members: g.Members, Down: down, Chain: g.IsChain()})
				continue
			}
			d.Plan = append(d.Plan, ch)
		}
		if len(d.Plan) == 0 {
			stuck = append(stuck, d)
			continue
		}
		return d, true, stuck
	}
	return RepairDecision{}, false, stuck
}

// Repairer runs RepairWatch at the metadata group's leader (FollowMap's
// leader tick): a probe round of every node of the map every probeEvery,
// and a due repair run by NodeChange, one at a time, cancelled when the
// node stops leading (the next leader's watch starts afresh and gives every
// node a whole --repair-after before it repairs). One copy for the node and
// the move simulation (internal/vrshard, TestMoveSimPlaced/repair): the
// node's time, its probe, its network and the way its jobs run beside the
// caller's loop are injected (Net, Probe, Go), so the simulation runs this
// policy — the probe rounds, the one-repair rule, the cancel on deposition
// — on its clock and network, in lockstep, as it runs the Mover.
type Repairer struct {
	// After is --repair-after (0: no repair).
	After time.Duration
	// Net is how the repairer reaches the cluster: each probe round and
	// repair gets a Mover with its Seeds, Password, TLS, Transport and
	// Clock (like). Its Clock is also the repairer's time (nil: the real
	// clock). nil: a Mover without seeds (a probe needs none).
	Net *Mover
	// Probe asks every node of cm whether it answers (nil: LiveNodes, a
	// PING to each at once; the simulation: a PING over its network).
	Probe func(ctx context.Context, mv *Mover, cm *kv.ClusterMap) map[uint64]bool
	// Go runs job, named what ("probe", "repair of node N"), beside the
	// caller (nil: a goroutine given ctx and mv). The simulation runs it
	// as a coroutine in lockstep with its scheduler, with the coroutine's
	// own context, and its Transport and Clock put on mv.
	Go func(ctx context.Context, what string, mv *Mover, job func(ctx context.Context, mv *Mover))
	// Exec runs a due repair through mv, a Mover to the metadata group
	// (nil: Repair, as replace-node --old does; tests stand in for the
	// cluster).
	Exec func(ctx context.Context, mv *Mover, cm *kv.ClusterMap, d RepairDecision) error
	// Logf says what the repairer does (nil: nothing).
	Logf func(format string, args ...any)

	mu        sync.Mutex
	watch     RepairWatch
	probing   bool
	lastProbe time.Time
	gen       int // raised by Lost: a job of an earlier term is dropped
	running   bool
	cancel    context.CancelFunc
	logged    map[string]bool // stuck decisions said once each
	wg        sync.WaitGroup
}

// probeEvery is how often the repairer pings every node: a tenth of
// --repair-after, within half a second and five seconds.
func probeEvery(after time.Duration) time.Duration {
	return min(max(after/10, 500*time.Millisecond), 5*time.Second)
}

// mover is a Mover to the metadata group built from Net (its seeds and
// connection settings; none: real time, no seeds), retrying for retryFor.
func (r *Repairer) mover(retryFor time.Duration) *Mover {
	var seeds []string
	if r.Net != nil {
		seeds = r.Net.Seeds
	}
	return r.Net.like(seeds, retryFor)
}

func (r *Repairer) now() time.Time { return r.Net.clock().Now() }

func (r *Repairer) logf(format string, a ...any) {
	if r.Logf != nil {
		r.Logf(format, a...)
	}
}

// spawn runs job beside the caller (Go). Under r.mu.
func (r *Repairer) spawn(ctx context.Context, what string, mv *Mover, job func(context.Context, *Mover)) {
	if r.Go != nil {
		r.Go(ctx, what, mv, job)
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		job(ctx, mv)
	}()
}

// Lost is told that this node does not lead the metadata group: the watch
// is forgotten and a repair in hand cancelled.
func (r *Repairer) Lost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil && !(mutation.On && RepairMut.IgnoresDeposition) {
		r.cancel()
		r.cancel = nil
	}
	r.watch.Reset()
	r.logged = nil
	r.lastProbe = time.Time{}
	r.gen++
}

// Tick is the leader's tick with cm, the map its replica applied: a probe
// round started if one is due, and a due repair started if none runs.
func (r *Repairer) Tick(ctx context.Context, cm *kv.ClusterMap) {
	after := r.After
	if after <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if !r.probing && now.Sub(r.lastProbe) >= probeEvery(after) {
		r.probing, r.lastProbe = true, now
		gen := r.gen
		r.spawn(ctx, "probe", r.mover(0), func(ctx context.Context, mv *Mover) {
			probe := r.Probe
			if probe == nil {
				probe = func(ctx context.Context, mv *Mover, cm *kv.ClusterMap) map[uint64]bool {
					return LiveNodes(ctx, mv, cm, 0)
				}
			}
			live := probe(ctx, mv, cm)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.probing = false
			if r.gen != gen { // Lost meanwhile: a stale round
				return
			}
			at := r.now()
			for _, n := range cm.Nodes {
				r.watch.Observe(at, n.ID, live[n.ID])
			}
		})
	}
	if r.running && !(mutation.On && RepairMut.Concurrent) {
		return
	}
	d, due, stuck := r.watch.Due(now, cm, after)
	for _, s := range stuck {
		msg := stuckMessage(s, after)
		if !r.logged[msg] {
			if r.logged == nil {
				r.logged = map[string]bool{}
			}
			r.logged[msg] = true
			r.logf("metadata: repair: %s", msg)
		}
	}
	if !due {
		return
	}
	r.running = true
	gen := r.gen
	r.spawn(ctx, fmt.Sprintf("repair of node %d", d.Node), r.mover(30*time.Second), func(ctx context.Context, mv *Mover) {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		r.mu.Lock()
		if r.gen != gen && !(mutation.On && RepairMut.IgnoresDeposition) {
			// Lost before it started: cancelled before its first step.
			r.running = false
			r.mu.Unlock()
			return
		}
		r.cancel = cancel
		r.mu.Unlock()
		exec := r.Exec
		if exec == nil {
			exec = r.Repair
		}
		err := exec(rctx, mv, cm, d)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.running = false
		if err != nil {
			r.logf("metadata: repair of node %d: %v (tried again in %v)", d.Node, err, after)
			r.watch.Failed(r.now(), d.Node, after)
		}
	})
}

// Repair re-creates d.Node's replicas by d.Plan (made against cm), as
// replace-node --old does, through mv (to the metadata group).
func (r *Repairer) Repair(ctx context.Context, mv *Mover, cm *kv.ClusterMap, d RepairDecision) error {
	for _, ch := range d.Plan {
		r.logf("metadata: repair: node %d has not answered for %v: placing its replica of %s on node %d%s", d.Node, r.After, GroupName(ch.Group), PlacedOn(cm, ch, d.Node), ZoneNote(cm, ch))
	}
	for _, s := range d.Skipped {
		r.logf("metadata: repair: node %d: not repairing %s", d.Node, s)
	}
	defer mv.Close()
	nc := &NodeChange{Cmd: fmt.Sprintf("repair of node %d", d.Node), Meta: mv, Leaving: []uint64{d.Node}, CatchUp: CaughtUpWait,
		Logf: func(format string, a ...any) { r.logf("metadata: repair: "+format, a...) },
		Done: func(s StepDone) {
			r.logf("metadata: repair: node %d's replica of %s re-created: members %v (map epoch %d)", d.Node, GroupName(GroupID(s.Group)), s.Members, s.MapEpoch)
		}}
	return nc.Run(ctx, cm, d.Plan)
}

// Wait returns once every job the repairer started (Go nil) returned.
func (r *Repairer) Wait() { r.wg.Wait() }
