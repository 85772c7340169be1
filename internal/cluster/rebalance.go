package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// Rebalancing (kefir cluster rebalance; docs/design/cluster.md, "Rebalance"):
// each slot gets a weight (its bytes, its keys, or its keys written during a
// sample: KEFIR.SLOTS STATS at each group's leader), PlanRebalance chooses
// contiguous slot-range moves that bring every group within a tolerance of
// the mean, and each move runs through Mover.Move, one at a time.

// Weigh names what a rebalance weighs a slot by.
const (
	ByBytes = "bytes" // the slot's keys' bytes (key, metadata, value, a hash's fields)
	ByKeys  = "keys"  // the slot's keys
	ByLoad  = "load"  // the slot's keys written and reads served during a sample
)

// PlanGroup is a group as the planner sees it: its id, the slots it owns,
// and its slot table (KEFIR.SLOTS TABLE; nil: none yet, which Mover.Move
// makes from the map, uniform). Mover.Move takes only a range whose rows
// (state, peer, epoch) are uniform at both groups, and a slot keeps the
// peer and epoch of the move that brought it (or took it away), so the
// planner splits the runs it moves at every row change of either table.
type PlanGroup struct {
	ID    GroupID
	Slots []kv.SlotRange
	Table []SlotRunInfo
}

// PlannedMove is one move of a plan: a contiguous range, and its weight.
type PlannedMove struct {
	From   GroupID      `json:"from"`
	To     GroupID      `json:"to"`
	Slots  kv.SlotRange `json:"slots"`
	Weight int64        `json:"weight"`
}

// GroupWeight is a group's weight before and after a plan.
type GroupWeight struct {
	ID     GroupID `json:"id"`
	Before int64   `json:"before"`
	After  int64   `json:"after"`
}

// Plan is what PlanRebalance chose.
type Plan struct {
	Moves     []PlannedMove `json:"moves"`
	Groups    []GroupWeight `json:"groups"`
	Mean      float64       `json:"mean"`
	Tolerance float64       `json:"tolerance"`
	// Balanced: after the moves every group is within Tolerance of the
	// mean (false: the weights cannot be split finer — one heavy slot —
	// or MaxMoves stopped it).
	Balanced bool `json:"balanced"`
}

// PlanRebalance returns the moves that bring every group's weight within
// tolerance (a fraction: 0.1 is 10 %) of the mean, at most maxMoves of them
// (0: no bound but the planner's own, 64). weight has a weight per slot
// (len Slots); a slot no group owns is ignored.
//
// Greedy, and deterministic: while a group is out of tolerance, it moves
// from the heaviest group (ties: the lower id) to the lightest one a prefix
// or a suffix of one of the heaviest's contiguous runs of slots — so that
// both groups' ranges stay contiguous and few — whose weight is nearest
// what brings one of the two to the mean (the smaller of the heaviest's
// excess and the lightest's gap) and that leaves the two closer to the
// mean than they were; ties go to a range next
// to one of the destination's (its ranges merge), then to fewer slots, then
// to the lower first slot. When the heaviest has no such move for the
// lightest (a slot heavier than the gap cannot be split), it tries the
// other pairs of a group above the mean and one below, by deviation; it
// stops when no pair has one. Runs end where either group's slot table
// changes row (PlanGroup.Table).
func PlanRebalance(groups []PlanGroup, weight []int64, tolerance float64, maxMoves int) Plan {
	if maxMoves <= 0 || maxMoves > MaxPlannedMoves {
		maxMoves = MaxPlannedMoves
	}
	p := Plan{Tolerance: tolerance}
	if len(weight) < Slots { // a slot past the end weighs nothing
		weight = append(slices.Clone(weight), make([]int64, Slots-len(weight))...)
	}
	owner := make([]int, Slots) // index into groups, -1: none
	for s := range owner {
		owner[s] = -1
	}
	load := make([]int64, len(groups))
	var total int64
	for i, g := range groups {
		for _, r := range g.Slots {
			for s := int(r.Start); s <= int(r.End) && s < Slots; s++ {
				owner[s] = i
				load[i] += weight[s]
				total += weight[s]
			}
		}
	}
	// cut[i][s]: slot s's row differs from slot s-1's in group i's table
	// (a move may not cross it); a planned move cuts both tables at its
	// ends (it gives its range a fresh epoch there).
	cut := make([][]bool, len(groups))
	for i, g := range groups {
		p.Groups = append(p.Groups, GroupWeight{ID: g.ID, Before: load[i]})
		cut[i] = make([]bool, Slots+1)
		for _, r := range g.Table {
			if r.Start > 0 && int(r.Start) < Slots {
				cut[i][r.Start] = true
			}
		}
	}
	if len(groups) == 0 {
		p.Balanced = true
		return p
	}
	p.Mean = float64(total) / float64(len(groups))
	// mean is the working mean: of the groups not set aside (fixed: a
	// heaviest group none of whose ranges helps any lighter one, its one
	// heavy slot, say); the others are balanced around it.
	mean := p.Mean
	fixed := make([]bool, len(groups))
	dev := func(x int64) float64 { return math.Abs(float64(x) - mean) }
	within := func(all bool) bool {
		m := mean
		if all {
			m = p.Mean
		}
		for i, l := range load {
			if (all || !fixed[i]) && math.Abs(float64(l)-m) > tolerance*m {
				return false
			}
		}
		return true
	}
	type cand struct {
		start, end int
		w          int64
		score      float64
		adjacent   bool
	}
	// search returns the best move from src to dst, nil if none helps.
	search := func(src, dst int) *cand {
		var best *cand
		now := max(dev(load[src]), dev(load[dst]))
		// The ideal move brings one of the two to the mean and the
		// other no further past it.
		want := min(float64(load[src])-mean, mean-float64(load[dst]))
		consider := func(start, end int, moved int64) {
			if moved <= 0 || max(dev(load[src]-moved), dev(load[dst]+moved)) >= now {
				return // no better than not moving
			}
			c := cand{start: start, end: end, w: moved, score: math.Abs(float64(moved) - want)}
			c.adjacent = start > 0 && owner[start-1] == dst || end+1 < Slots && owner[end+1] == dst
			switch {
			case best == nil, c.score < best.score:
			case c.score > best.score:
				return
			case c.adjacent != best.adjacent:
				if !c.adjacent {
					return
				}
			case c.end-c.start != best.end-best.start:
				if c.end-c.start > best.end-best.start {
					return
				}
			case c.start >= best.start:
				return
			}
			best = &c
		}
		// The source's maximal runs uniform in both tables: each prefix
		// and each suffix.
		for s := 0; s < Slots; {
			if owner[s] != src {
				s++
				continue
			}
			e := s
			for e+1 < Slots && owner[e+1] == src && !cut[src][e+1] && !cut[dst][e+1] {
				e++
			}
			var sum int64
			for x := s; x <= e; x++ {
				sum += weight[x]
				consider(s, x, sum)
			}
			sum = 0
			for x := e; x > s; x-- { // the whole run was a prefix already
				sum += weight[x]
				consider(x, e, sum)
			}
			s = e + 1
		}
		return best
	}
	for len(p.Moves) < maxMoves && !within(false) {
		// The heaviest group to the lightest first; when no range of
		// the heaviest helps (one slot heavier than the gap), the next
		// pairs in order of deviation: sources above the mean from the
		// heaviest down, destinations below it from the lightest up
		// (ties: the lower id). When no pair has a move, the heaviest
		// is set aside and the rest balanced around their own mean.
		// Each move lowers the sum of the squared deviations from the
		// working mean, and each setting aside removes a group, so the
		// loop ends.
		var above, below []int
		for i := range groups {
			if fixed[i] {
				continue
			}
			if float64(load[i]) > mean {
				above = append(above, i)
			} else if float64(load[i]) < mean {
				below = append(below, i)
			}
		}
		slices.SortStableFunc(above, func(a, b int) int {
			return cmp.Or(cmp.Compare(load[b], load[a]), cmp.Compare(groups[a].ID, groups[b].ID))
		})
		slices.SortStableFunc(below, func(a, b int) int {
			return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(groups[a].ID, groups[b].ID))
		})
		var best *cand
		src, dst := -1, -1
	pairs:
		for _, i := range above {
			for _, j := range below {
				if best = search(i, j); best != nil {
					src, dst = i, j
					break pairs
				}
			}
		}
		if best == nil {
			if len(above) == 0 {
				break
			}
			fixed[above[0]] = true
			var sum int64
			n := 0
			for i, l := range load {
				if !fixed[i] {
					sum, n = sum+l, n+1
				}
			}
			if n < 2 {
				break
			}
			mean = float64(sum) / float64(n)
			continue
		}
		for s := best.start; s <= best.end; s++ {
			owner[s] = dst
		}
		for _, i := range []int{src, dst} {
			cut[i][best.start], cut[i][best.end+1] = true, true
		}
		load[src] -= best.w
		load[dst] += best.w
		p.Moves = append(p.Moves, PlannedMove{From: groups[src].ID, To: groups[dst].ID,
			Slots: kv.SlotRange{Start: uint16(best.start), End: uint16(best.end)}, Weight: best.w})
	}
	for i := range groups {
		p.Groups[i].After = load[i]
	}
	p.Balanced = within(true)
	return p
}

// PlanDrain returns the moves that take every slot of group drain to the
// other groups (kefir cluster remove-group), as PlanRebalance's Plan, run by
// the same Rebalancer: the drained group's slots in order, each contiguous
// run (cut where either table's row changes, as PlanRebalance cuts) given
// to the group that is lightest when the run starts, until that group
// reaches the mean the others will have once drain is empty; then the next
// lightest. So the groups end about even (each one's excess over that mean
// is less than one slot's weight, unless it was above it before) with few
// moves: about one per other group, plus one per cut. A drained group whose
// slots weigh nothing (an empty one, by keys or bytes) is split by slot
// counts instead, so its ranges still spread out. Pure and deterministic;
// no bound on the moves (every slot must go).
func PlanDrain(groups []PlanGroup, weight []int64, drain GroupID) Plan {
	p := Plan{Balanced: true}
	if len(weight) < Slots {
		weight = append(slices.Clone(weight), make([]int64, Slots-len(weight))...)
	}
	owner := make([]int, Slots)
	for s := range owner {
		owner[s] = -1
	}
	src := -1
	var others []int
	for i, g := range groups {
		if g.ID == drain {
			src = i
		} else {
			others = append(others, i)
		}
		for _, r := range g.Slots {
			for s := int(r.Start); s <= int(r.End) && s < Slots; s++ {
				owner[s] = i
			}
		}
	}
	if src < 0 || len(others) == 0 {
		return p
	}
	var drained int64
	for s, o := range owner {
		if o == src {
			drained += weight[s]
		}
	}
	w := func(s int) int64 { return weight[s] }
	if drained == 0 {
		w = func(s int) int64 {
			if owner[s] < 0 {
				return 0
			}
			return 1
		}
	}
	load := make([]int64, len(groups))
	var total int64
	for s, o := range owner {
		if o >= 0 {
			load[o] += w(s)
			total += w(s)
		}
	}
	for i, g := range groups {
		p.Groups = append(p.Groups, GroupWeight{ID: g.ID, Before: load[i]})
	}
	p.Mean = float64(total) / float64(len(others))
	cut := func(i, s int) bool {
		for _, r := range groups[i].Table {
			if int(r.Start) == s {
				return true
			}
		}
		return false
	}
	lightest := func() int {
		best := others[0]
		for _, i := range others[1:] {
			if load[i] < load[best] || load[i] == load[best] && groups[i].ID < groups[best].ID {
				best = i
			}
		}
		return best
	}
	start, dst := -1, -1
	var moved int64
	flush := func(end int) {
		if start < 0 {
			return
		}
		load[dst] += moved
		load[src] -= moved
		p.Moves = append(p.Moves, PlannedMove{From: drain, To: groups[dst].ID,
			Slots: kv.SlotRange{Start: uint16(start), End: uint16(end)}, Weight: moved})
		start, moved = -1, 0
	}
	for s := 0; s < Slots; s++ {
		if owner[s] != src {
			flush(s - 1)
			continue
		}
		// The destination is full once the next slot would take it past
		// the mean, if another group is lighter than it is then (else it
		// stays the lightest: the range goes on, rather than a move of
		// its own for the remainder).
		full := func() bool {
			after := load[dst] + moved
			if moved == 0 || float64(after+w(s)) <= p.Mean {
				return false
			}
			return slices.ContainsFunc(others, func(i int) bool { return i != dst && load[i] < after })
		}
		if start >= 0 && (cut(src, s) || cut(dst, s) || full()) {
			flush(s - 1)
		}
		if start < 0 {
			start, dst = s, lightest()
		}
		moved += w(s)
	}
	flush(Slots - 1)
	for i := range groups {
		p.Groups[i].After = load[i]
	}
	return p
}

// MaxPlannedMoves bounds a plan.
const MaxPlannedMoves = 64

// String renders p for a terminal.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mean %.0f, tolerance %.0f %%\n", p.Mean, 100*p.Tolerance)
	for _, g := range p.Groups {
		fmt.Fprintf(&b, "  group %d: %d -> %d\n", g.ID, g.Before, g.After)
	}
	if len(p.Moves) == 0 {
		b.WriteString("no move\n")
	}
	for i, m := range p.Moves {
		fmt.Fprintf(&b, "move %d: slots %d-%d (weight %d) from group %d to group %d\n", i+1, m.Slots.Start, m.Slots.End, m.Weight, m.From, m.To)
	}
	if !p.Balanced {
		b.WriteString("not balanced within the tolerance after these moves (a slot heavier than the gap, or --max-moves)\n")
	}
	return b.String()
}

// SlotWeights reads every group's per-slot statistics at its leader
// (KEFIR.SLOTS STATS, page by page, resting PagePause between pages) and
// returns each slot's weight by what (ByBytes, ByKeys, ByLoad), counted only
// at the group cm says owns the slot (a group's engine may still hold
// copies of slots it handed over, or is importing). ByLoad reads each
// group's engine version, waits sample, reads each group's version again,
// and weighs a slot by its keys written between the two (the upper bound
// keeps a group scanned later from counting the writes made while the
// groups before it were scanned: every group's window is the sample), plus
// the reads every node served of it in the sample (KEFIR.SLOTS READS
// before and after: nodeReads).
func (mv *Mover) SlotWeights(ctx context.Context, cm *kv.ClusterMap, what string, sample time.Duration) ([]int64, error) {
	since := make(map[uint64]uint64, len(cm.Groups))
	until := make(map[uint64]uint64, len(cm.Groups))
	for _, g := range cm.Groups {
		since[g.ID] = math.MaxInt64
	}
	version := func(g uint64) (uint64, error) {
		_, at, err := mv.slotStatsPage(ctx, GroupID(g), nil, 1, math.MaxInt64, 0, nil)
		return at, err
	}
	weight := make([]int64, Slots)
	var readsBefore map[uint64]map[uint16]uint64
	switch what {
	case ByBytes, ByKeys:
	case ByLoad:
		readsBefore = mv.nodeReads(ctx, cm)
		for _, g := range cm.Groups {
			at, err := version(g.ID)
			if err != nil {
				return nil, err
			}
			since[g.ID] = at
		}
		t := time.NewTimer(sample)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		for _, g := range cm.Groups {
			at, err := version(g.ID)
			if err != nil {
				return nil, err
			}
			until[g.ID] = at
		}
		// The reads each node served in the sample, per slot, counted
		// for the slot whatever group served it (one read weighs as one
		// written key).
		for node, after := range mv.nodeReads(ctx, cm) {
			before := readsBefore[node]
			for slot, n := range after {
				if b := before[slot]; b <= n {
					n -= b // else the node restarted: its counters began again
				}
				weight[slot] += int64(n)
			}
		}
	default:
		return nil, fmt.Errorf("rebalance: weigh by %q: bytes, keys or load", what)
	}
	for _, g := range cm.Groups {
		var cursor []byte
		for page := 0; ; page++ {
			if page > 0 {
				if err := mv.rest(ctx); err != nil {
					return nil, err
				}
			}
			next, _, err := mv.slotStatsPage(ctx, GroupID(g.ID), cursor, 8*mv.page(), since[g.ID], until[g.ID], func(slot uint16, st SlotStat) {
				if cm.Owner(slot) != g.ID {
					return
				}
				switch what {
				case ByBytes:
					weight[slot] += st.Bytes
				case ByKeys:
					weight[slot] += st.Keys
				case ByLoad:
					weight[slot] += st.Written
				}
			})
			if err != nil {
				return nil, err
			}
			if len(next) == 0 {
				break
			}
			cursor = next
		}
	}
	return weight, nil
}

// slotStatsPage is one KEFIR.SLOTS STATS at group id's leader.
func (mv *Mover) slotStatsPage(ctx context.Context, id GroupID, cursor []byte, limit int, since, until uint64, visit func(uint16, SlotStat)) (next []byte, at uint64, err error) {
	args := [][]byte{[]byte("KEFIR.SLOTS"), []byte("STATS"), []byte(strconv.FormatUint(uint64(id), 10)),
		cursor, []byte(strconv.Itoa(limit)), []byte(strconv.FormatUint(since, 10))}
	if until != 0 {
		args = append(args, []byte(strconv.FormatUint(until, 10)))
	}
	v, err := mv.doBytes(ctx, args)
	if err != nil {
		return nil, 0, fmt.Errorf("rebalance: group %d's slot statistics: %w", id, err)
	}
	if v.Kind != resp.Array || len(v.Elems) != 3 || len(v.Elems[2].Elems)%4 != 0 {
		return nil, 0, fmt.Errorf("rebalance: group %d's slot statistics: unexpected reply", id)
	}
	es := v.Elems[2].Elems
	for i := 0; visit != nil && i+3 < len(es); i += 4 {
		visit(uint16(es[i].Int), SlotStat{Keys: es[i+1].Int, Bytes: es[i+2].Int, Written: es[i+3].Int})
	}
	return v.Elems[0].Str, uint64(v.Elems[1].Int), nil
}

// nodeReads asks every node of cm for the reads it served per slot
// (KEFIR.SLOTS READS, at the node itself: a node's counters are its own),
// by node id. A node that does not answer (down) counts for nothing, and is
// logged: the sample then misses the reads it served.
func (mv *Mover) nodeReads(ctx context.Context, cm *kv.ClusterMap) map[uint64]map[uint16]uint64 {
	out := make(map[uint64]map[uint16]uint64, len(cm.Nodes))
	for _, n := range cm.Nodes {
		v, err := mv.roundTrip(ctx, n.ClientAddr, [][]byte{[]byte("KEFIR.SLOTS"), []byte("READS")})
		if err == nil && v.Kind == resp.Error {
			err = errors.New(string(v.Str))
		}
		if err != nil || v.Kind != resp.Array || len(v.Elems)%2 != 0 {
			mv.logf("rebalance: node %d (%s): no read counts (%v): its reads are not weighed", n.ID, n.ClientAddr, err)
			continue
		}
		m := make(map[uint16]uint64, len(v.Elems)/2)
		for i := 0; i+1 < len(v.Elems); i += 2 {
			if s := v.Elems[i].Int; s >= 0 && s < Slots && v.Elems[i+1].Int > 0 {
				m[uint16(s)] = uint64(v.Elems[i+1].Int)
			}
		}
		out[n.ID] = m
	}
	return out
}

// PlanGroups returns the map's groups as the planner takes them.
func PlanGroups(cm *kv.ClusterMap) []PlanGroup {
	out := make([]PlanGroup, 0, len(cm.Groups))
	for _, g := range cm.Groups {
		out = append(out, PlanGroup{ID: GroupID(g.ID), Slots: g.Slots})
	}
	return out
}

// PlanTables reads each group's slot table at its leader into groups (the
// planner moves only ranges uniform in both groups' tables), and refuses
// to plan while a group's table has slots migrating or importing (a move
// in flight that the map does not list yet, or one left part way: finish
// or abort it with move-slots first).
func (mv *Mover) PlanTables(ctx context.Context, groups []PlanGroup) error {
	for i := range groups {
		t, err := mv.Table(ctx, groups[i].ID)
		if err != nil {
			return fmt.Errorf("rebalance: %w", err)
		}
		for _, r := range t {
			if r.State == "migrating" || r.State == "importing" {
				return fmt.Errorf("rebalance: slots %d-%d are %s at group %d (peer %d, epoch %d): a move is in flight; finish or abort it with move-slots first",
					r.Start, r.End, r.State, groups[i].ID, r.Peer, r.Epoch)
			}
		}
		groups[i].Table = t
	}
	return nil
}

// Rebalancer runs a plan's moves one at a time, each through Mover.Move (the
// one move mechanism: recorded, leased and resumable as kefir cluster
// move-slots), each by a fresh Mover from NewMover.
type Rebalancer struct {
	NewMover func() *Mover
	// Adaptive paces each move by a Prober (the mover's PagePause is then
	// unused); MaxPause bounds its pause (default 250 ms: about a page's
	// work four times over, so a move goes on at a fifth of its unpaced
	// rate at worst, however noisy the probe).
	Adaptive bool
	MaxPause time.Duration
	// Baseline is how long the probe measures the steady p99 before each
	// move (default 1 s).
	Baseline time.Duration
	Logf     func(format string, args ...any)
}

// RebalanceMove is a planned move and what running it did.
type RebalanceMove struct {
	PlannedMove
	Result MoveResult   `json:"result"`
	Probe  *ProbeResult `json:"probe,omitempty"`
}

// Run runs p's moves in order and returns what each did; it stops at the
// first that fails (rerun, it plans again from the map; a move that
// stopped part way is finished by move-slots or the metadata group).
func (rb *Rebalancer) Run(ctx context.Context, p Plan) ([]RebalanceMove, error) {
	var out []RebalanceMove
	for i, m := range p.Moves {
		res, probe, err := rb.move(ctx, fmt.Sprintf("move %d/%d", i+1, len(p.Moves)), m.From, m.To, []kv.SlotRange{m.Slots}, true)
		out = append(out, RebalanceMove{PlannedMove: m, Result: res, Probe: probe})
		if err != nil {
			return out, fmt.Errorf("rebalance: move %d of %d (slots %d-%d from group %d to group %d): %w", i+1, len(p.Moves), m.Slots.Start, m.Slots.End, m.From, m.To, err)
		}
	}
	return out, nil
}

// Move runs one move of rs from group from to group to, as Run runs each
// of a plan's (kefir cluster move-slots: paced by the probe unless a fixed
// pause is asked for). A move of rs already under way is resumed, as
// Mover.Move does.
func (rb *Rebalancer) Move(ctx context.Context, from, to GroupID, rs []kv.SlotRange) (MoveResult, *ProbeResult, error) {
	return rb.move(ctx, "move", from, to, rs, false)
}

// move runs one move; planned: it is a plan's, made from tables that showed
// no move in flight, which must still be so.
func (rb *Rebalancer) move(ctx context.Context, name string, from, to GroupID, rs []kv.SlotRange, planned bool) (MoveResult, *ProbeResult, error) {
	mv := rb.NewMover()
	// Another driver's move may have started since the plan (or the
	// previous move): both groups' tables must show none.
	if planned {
		if err := mv.PlanTables(ctx, []PlanGroup{{ID: from}, {ID: to}}); err != nil {
			mv.Close()
			return MoveResult{}, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	var pr *Prober
	if rb.Adaptive {
		prefix := ProbeKeyPrefix()
		targets, err := rb.probeTargets(ctx, from, to, rs, prefix)
		if err != nil {
			mv.Close()
			return MoveResult{}, nil, err
		}
		pr = &Prober{Targets: targets, Writes: true, Password: mv.Password, TLS: mv.TLS, Baseline: rb.Baseline, Logf: rb.Logf,
			Ctl: PaceController{Step: pauseStep, Start: pauseStep, Patience: pacePatience, Max: orDefault(rb.MaxPause, 250*time.Millisecond)}}
		pr.Resolve = func(ctx context.Context) ([][2]string, error) { return rb.probeTargets(ctx, from, to, rs, prefix) }
		if err := pr.Start(ctx); err != nil {
			mv.Close()
			return MoveResult{}, nil, err
		}
		mv.Pacer = pr
		rb.logf("%s: steady probe p99 %v, bound %v; probe keys %v", name, pr.steady.Round(10*time.Microsecond), pr.Ctl.Bound.Round(10*time.Microsecond), targets)
	}
	res, err := mv.Move(ctx, from, to, rs)
	if pr == nil {
		return res, nil, err
	}
	r := pr.Stop()
	rb.logf("%s: probe p99 %v during the move (steady %v), max page pause %v, %d slowdowns",
		name, r.DuringP99.Round(10*time.Microsecond), r.SteadyP99.Round(10*time.Microsecond), r.MaxPause, r.Slowdowns)
	return res, &r, err
}

// pauseStep is the adaptive pace's first and smallest non-zero pause: about
// half of what a page of 1024 small keys takes a loaded leader (copy or
// purge), so that one step halves the move's rate at most; the pace starts
// there and drops to none only once the probe shows room.
const pauseStep = 20 * time.Millisecond

// pacePatience is how many quiet probe windows (~100 ms each) in a row the
// pace waits for before it halves its pause (PaceController.Patience).
const pacePatience = 3

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (rb *Rebalancer) logf(format string, args ...any) {
	if rb.Logf != nil {
		rb.Logf(format, args...)
	}
}

// probeTargets returns the probe's (address, key) pairs for the move of rs
// from group from to group to: a key
// the source keeps (one of the moving slots if it keeps none) at the
// source's leader, and a key of the destination's at its leader (none if it
// owns no slot yet). The probe reads and writes them and deletes them when
// it stops (their names say what they are: prefix, ProbeKeyPrefix).
func (rb *Rebalancer) probeTargets(ctx context.Context, from, to GroupID, rs []kv.SlotRange, prefix string) ([][2]string, error) {
	st, err := rb.NewMover().Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("rebalance: the map for the probe: %w", err)
	}
	moving := InRanges(rs)
	find := func(ok func(uint16) bool) string { return string(KeyWhere(prefix, ok)) }
	addr := func(g GroupID) string {
		if a := st.Leaders[uint64(g)]; a != "" {
			return a
		}
		return st.MetaLeader
	}
	var out [][2]string
	k := find(func(s uint16) bool { return st.Map.Owner(s) == uint64(from) && !moving(s) })
	if k == "" {
		k = find(moving)
	}
	out = append(out, [2]string{addr(from), k})
	if k := find(func(s uint16) bool { return st.Map.Owner(s) == uint64(to) }); k != "" {
		out = append(out, [2]string{addr(to), k})
	}
	return out, nil
}
