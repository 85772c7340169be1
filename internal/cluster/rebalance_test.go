package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// uniform gives every slot weight w.
func uniformWeights(w int64) []int64 {
	ws := make([]int64, Slots)
	for i := range ws {
		ws[i] = w
	}
	return ws
}

// checkPlan applies p to groups and checks what every plan must hold: each
// move takes a range its source owns whole at that point, a prefix or a
// suffix of one of its runs (so both groups stay contiguous; with tables,
// of a run uniform in them, which the table tests check), and the weights
// after are the plan's. It returns each group's runs after.
func checkPlan(t *testing.T, groups []PlanGroup, w []int64, p Plan) map[GroupID]int {
	t.Helper()
	owner := make([]GroupID, Slots)
	tables := false
	for _, g := range groups {
		tables = tables || g.Table != nil
		for _, r := range g.Slots {
			for s := int(r.Start); s <= int(r.End); s++ {
				owner[s] = g.ID
			}
		}
	}
	for i, m := range p.Moves {
		if m.From == m.To {
			t.Fatalf("move %d: from and to are both %d", i, m.From)
		}
		var sum int64
		for s := int(m.Slots.Start); s <= int(m.Slots.End); s++ {
			if owner[s] != m.From {
				t.Fatalf("move %d (%+v): slot %d is group %d's, not the source's", i, m, s, owner[s])
			}
			sum += w[s]
		}
		if sum != m.Weight {
			t.Fatalf("move %d: weight %d, slots weigh %d", i, m.Weight, sum)
		}
		before := m.Slots.Start > 0 && owner[m.Slots.Start-1] == m.From
		after := int(m.Slots.End)+1 < Slots && owner[m.Slots.End+1] == m.From
		if before && after && !tables {
			t.Fatalf("move %d (%+v) splits a run of group %d in two", i, m, m.From)
		}
		for s := int(m.Slots.Start); s <= int(m.Slots.End); s++ {
			owner[s] = m.To
		}
	}
	load := map[GroupID]int64{}
	runs := map[GroupID]int{}
	for s := 0; s < Slots; s++ {
		load[owner[s]] += w[s]
		if s == 0 || owner[s-1] != owner[s] {
			runs[owner[s]]++
		}
	}
	for _, g := range p.Groups {
		if load[g.ID] != g.After {
			t.Fatalf("group %d weighs %d after the moves, the plan says %d", g.ID, load[g.ID], g.After)
		}
	}
	return runs
}

func TestPlanRebalanceSkewedTwoGroups(t *testing.T) {
	groups := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 12287}}}, {ID: 2, Slots: []kv.SlotRange{{Start: 12288, End: 16383}}}}
	w := uniformWeights(3)
	p := PlanRebalance(groups, w, 0.1, 0)
	runs := checkPlan(t, groups, w, p)
	// One move: the quarter next to group 2's slots, so each keeps one run.
	if len(p.Moves) != 1 || p.Moves[0] != (PlannedMove{From: 1, To: 2, Slots: kv.SlotRange{Start: 8192, End: 12287}, Weight: 3 * 4096}) || !p.Balanced {
		t.Fatalf("plan %+v", p)
	}
	if runs[1] != 1 || runs[2] != 1 {
		t.Fatalf("runs after: %v", runs)
	}
}

func TestPlanRebalanceHotSlots(t *testing.T) {
	// Group 1 owns the first half with 100 hot slots in its middle;
	// group 2 the second half, lightly loaded.
	groups := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 8191}}}, {ID: 2, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}}}
	w := make([]int64, Slots)
	for s := 4000; s < 4100; s++ {
		w[s] = 100
	}
	for s := 8192; s < Slots; s += 8 {
		w[s] = 1
	}
	p := PlanRebalance(groups, w, 0.1, 0)
	runs := checkPlan(t, groups, w, p)
	if !p.Balanced || len(p.Moves) != 1 || p.Moves[0].Slots.End != 8191 {
		t.Fatalf("plan %+v (want one suffix of group 1's run, ending next to group 2)", p)
	}
	if runs[1] != 1 || runs[2] != 1 {
		t.Fatalf("runs after: %v", runs)
	}
	// The moved range starts in the hot slots, and no further left than
	// it must: slots beyond the hot ones weigh nothing, and fewer slots win.
	if s := p.Moves[0].Slots.Start; s < 4000 || s >= 4100 {
		t.Fatalf("the move starts at %d, not in the hot slots", s)
	}
}

func TestPlanRebalanceAlreadyBalancedOneGroupAndNothing(t *testing.T) {
	half := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 8191}}}, {ID: 2, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}}}
	// Within 10 %: 8192 against 7800 slots' worth.
	w := uniformWeights(10)
	for s := 8192; s < 8192+392; s++ {
		w[s] = 0
	}
	for name, c := range map[string]struct {
		groups []PlanGroup
		w      []int64
	}{
		"balanced":  {half, w},
		"one group": {[]PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 16383}}}}, uniformWeights(1)},
		"no weight": {half, make([]int64, Slots)},
		"no group":  {nil, uniformWeights(1)},
	} {
		p := PlanRebalance(c.groups, c.w, 0.1, 0)
		if len(p.Moves) != 0 || !p.Balanced {
			t.Fatalf("%s: plan %+v, want no move", name, p)
		}
	}
}

func TestPlanRebalanceEmptyGroupsAndTies(t *testing.T) {
	// Groups 3 and 4 own nothing; 1 and 2 tie as the heaviest: 1 gives
	// first (the lower id), to 3 (the lower id of the lightest).
	groups := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 8191}}}, {ID: 2, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}}, {ID: 3}, {ID: 4}}
	w := uniformWeights(1)
	p := PlanRebalance(groups, w, 0.1, 0)
	runs := checkPlan(t, groups, w, p)
	if !p.Balanced {
		t.Fatalf("plan %+v not balanced", p)
	}
	if m := p.Moves[0]; m.From != 1 || m.To != 3 {
		t.Fatalf("first move %+v, want 1 -> 3", m)
	}
	if len(p.Moves) != 2 {
		t.Fatalf("plan %+v: want two moves (a quarter each from 1 and 2)", p)
	}
	for id, n := range runs {
		if n != 1 {
			t.Fatalf("group %d has %d runs after the plan: %+v", id, n, p)
		}
	}
	// Deterministic: the same input, the same plan.
	if q := PlanRebalance(groups, w, 0.1, 0); fmt.Sprint(q) != fmt.Sprint(p) {
		t.Fatalf("two plans of one input differ:\n%v\n%v", p, q)
	}
}

func TestPlanRebalanceStopsWhereItCannotHelp(t *testing.T) {
	// All the weight in one slot: moving it only moves the imbalance.
	groups := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 8191}}}, {ID: 2, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}}}
	w := make([]int64, Slots)
	w[5] = 1000
	if p := PlanRebalance(groups, w, 0.1, 0); len(p.Moves) != 0 || p.Balanced {
		t.Fatalf("plan %+v: want no move, not balanced", p)
	}
	// The heaviest cannot help the lightest (its one heavy slot), but
	// the next heaviest can: group 2 gives group 3 about 300.
	three3 := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 99}}}, {ID: 2, Slots: []kv.SlotRange{{Start: 100, End: 8191}}},
		{ID: 3, Slots: []kv.SlotRange{{Start: 8192, End: 16383}}}}
	w3 := make([]int64, Slots)
	w3[5] = 1000
	for s := 100; s < 700; s++ {
		w3[s] = 1
	}
	p3 := PlanRebalance(three3, w3, 0.1, 0)
	checkPlan(t, three3, w3, p3)
	if len(p3.Moves) == 0 || p3.Moves[0].From != 2 || p3.Moves[0].To != 3 || p3.Groups[2].After < 250 || p3.Groups[2].After > 350 {
		t.Fatalf("plan %v: want about 300 from group 2 to group 3", p3)
	}
	// --max-moves bounds the plan.
	three := []PlanGroup{{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 16383}}}, {ID: 2}, {ID: 3}}
	p := PlanRebalance(three, uniformWeights(1), 0.1, 1)
	checkPlan(t, three, uniformWeights(1), p)
	if len(p.Moves) != 1 || p.Balanced {
		t.Fatalf("plan %+v: want one move, not balanced", p)
	}
	if p := PlanRebalance(three, uniformWeights(1), 0.1, 0); len(p.Moves) != 2 || !p.Balanced {
		t.Fatalf("plan %+v: want two moves, balanced", p)
	}
}

func TestPaceControllerSlowsDownAndSpeedsUpWithinItsLimits(t *testing.T) {
	ms := time.Millisecond
	c := PaceController{Bound: 10 * ms, Min: 0, Max: 100 * ms, Step: 5 * ms}
	if c.Pause() != 0 {
		t.Fatalf("starts at %v, want Min", c.Pause())
	}
	// Over the bound: slower each time, up to Max and no further.
	var got []time.Duration
	for i := 0; i < 7; i++ {
		got = append(got, c.Observe(30*ms))
	}
	if want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 100 * ms, 100 * ms}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("over the bound: pauses %v, want %v", got, want)
	}
	// Between half the bound and the bound: kept.
	if p := c.Observe(7 * ms); p != 100*ms {
		t.Fatalf("near the bound: %v, want it kept at 100ms", p)
	}
	// Well under it: faster each time, down to Min and no further.
	got = got[:0]
	for i := 0; i < 7; i++ {
		got = append(got, c.Observe(ms))
	}
	if want := []time.Duration{50 * ms, 25 * ms, 12500 * time.Microsecond, 6250 * time.Microsecond, 0, 0, 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("under the bound: pauses %v, want %v", got, want)
	}
	if c.Slowdowns() != 7 {
		t.Fatalf("slowdowns %d, want 7", c.Slowdowns())
	}
	// A first pause: held until the first observation.
	c = PaceController{Bound: 10 * ms, Max: 100 * ms, Step: 5 * ms, Start: 20 * ms}
	if c.Pause() != 20*ms || c.Observe(7*ms) != 20*ms || c.Observe(ms) != 10*ms {
		t.Fatalf("Start 20ms: %v", c.Pause())
	}
	// Patience: a halving needs that many quiet observations in a row;
	// one above the bound doubles at once and starts the count again, so
	// does one between half the bound and the bound.
	c = PaceController{Bound: 10 * ms, Max: 100 * ms, Step: 5 * ms, Start: 40 * ms, Patience: 3}
	obs := []time.Duration{ms, ms, 7 * ms, ms, ms, ms, 30 * ms, ms, ms, ms}
	want := []time.Duration{40 * ms, 40 * ms, 40 * ms, 40 * ms, 40 * ms, 20 * ms, 40 * ms, 40 * ms, 40 * ms, 20 * ms}
	for i, q := range obs {
		if got := c.Observe(q); got != want[i] {
			t.Fatalf("patience 3, observation %d (%v): pause %v, want %v", i, q, got, want[i])
		}
	}
	// A floor above zero holds too.
	c = PaceController{Bound: 10 * ms, Min: 2 * ms, Max: 8 * ms, Step: 5 * ms}
	for i := 0; i < 5; i++ {
		if p := c.Observe(ms); p != 2*ms {
			t.Fatalf("under the bound with Min 2ms: %v", p)
		}
	}
	for i := 0; i < 5; i++ {
		if p := c.Observe(time.Second); p < 2*ms || p > 8*ms {
			t.Fatalf("over the bound with Max 8ms: %v", p)
		}
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(101-i))
	}
	if p := Percentile(s, 0.99); p != 99 {
		t.Fatalf("p99 of 1..100 = %v", p)
	}
	if p := Percentile(s, 0.5); p != 50 {
		t.Fatalf("p50 of 1..100 = %v", p)
	}
	if Percentile(nil, 0.99) != 0 || Percentile([]time.Duration{7}, 0.99) != 7 {
		t.Fatal("edge cases")
	}
}

// StatsSlots counts keys and bytes per slot, keys written above a version,
// skips the reserved range, counts a hash's fields, and pages.
func TestStatsSlotsCountsKeysBytesAndWrites(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ver := uint64(0)
	get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		v, err := db.Get(key)
		if errors.Is(err, storage.ErrNotFound) {
			return nil, nil, 0, false, nil
		}
		if err != nil {
			return nil, nil, 0, false, err
		}
		return v.Data, v.Meta, v.Version, true, nil
	}
	apply := func(op kv.Op) {
		t.Helper()
		ver++
		var recs []storage.Record
		if _, err := kv.Apply(get, ver, &op, 1<<20, func(key, value, meta []byte, tomb bool) {
			recs = append(recs, storage.Record{Key: append([]byte(nil), key...), Value: append([]byte(nil), value...), Meta: append([]byte(nil), meta...), Tombstone: tomb, Version: ver})
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Append(recs...); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uint16]SlotStat{}
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("key%d", i)
		apply(kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("0123456789")})
		e := want[Slot([]byte(k))]
		e.Keys++
		e.Bytes += int64(len(k) + 10)
		want[Slot([]byte(k))] = e
	}
	mid := ver
	var upper uint64
	wantUpTo := map[uint16]int64{} // written in (mid, upper]
	for i := 40; i < 50; i++ {     // written again above mid
		k := fmt.Sprintf("key%d", i)
		apply(kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("0123456789")})
		e := want[Slot([]byte(k))]
		e.Written++
		want[Slot([]byte(k))] = e
		if i < 45 {
			wantUpTo[Slot([]byte(k))]++
			upper = ver
		}
	}
	// Reserved records are not keys.
	if _, err := db.Append(storage.Record{Key: kv.ClusterMapKey, Value: []byte("x"), Version: ver + 1}); err != nil {
		t.Fatal(err)
	}
	ver++
	apply(kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte("field"), []byte("value-of-the-field")}})
	// User keys after the reserved range in key order (a cursor of one
	// key per page crosses it).
	for _, k := range []string{"\xff\xffzzz", "\xff\xffzzz2"} {
		apply(kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("0123456789")})
		e := want[Slot([]byte(k))]
		e.Keys++
		e.Written++
		e.Bytes += int64(len(k) + 10)
		want[Slot([]byte(k))] = e
	}
	sumUntil := func(limit int, until uint64) map[uint16]SlotStat {
		got := map[uint16]SlotStat{}
		var cursor []byte
		for pages := 0; ; pages++ {
			st, err := StatsSlots(db, cursor, limit, mid, until)
			if err != nil {
				t.Fatal(err)
			}
			for s, e := range st.Slots {
				g := got[s]
				g.Keys, g.Bytes, g.Written = g.Keys+e.Keys, g.Bytes+e.Bytes, g.Written+e.Written
				got[s] = g
			}
			if st.Next == nil {
				return got
			}
			if pages > 100 {
				t.Fatal("no end")
			}
			cursor = st.Next
		}
	}
	sum := func(limit int) map[uint16]SlotStat { return sumUntil(limit, 0) }
	all := sum(1000)
	h := all[Slot([]byte("h"))]
	if h.Written < 1 || h.Bytes < int64(len("h")+len("field")+len("value-of-the-field")) {
		t.Fatalf("the hash's slot: %+v: its fields not counted", h)
	}
	delete(all, Slot([]byte("h")))
	for s, e := range want {
		if s == Slot([]byte("h")) {
			continue
		}
		if all[s].Keys != e.Keys || all[s].Written != e.Written || all[s].Bytes < e.Bytes {
			t.Fatalf("slot %d: %+v, want %+v (bytes at least: the value's metadata counts too)", s, all[s], e)
		}
	}
	for _, limit := range []int{1, 7} {
		if paged := sum(limit); fmt.Sprint(paged) != fmt.Sprint(sum(1000)) {
			t.Fatalf("pages of %d sum to %v, one page %v", limit, paged, sum(1000))
		}
	}
	// An upper bound: only the keys written in (since, until] count (a
	// load sample's window, however late the group is scanned).
	for s, e := range sumUntil(7, upper) {
		if s != Slot([]byte("h")) && e.Written != wantUpTo[s] {
			t.Fatalf("slot %d: %d keys written in (%d, %d], want %d", s, e.Written, mid, upper, wantUpTo[s])
		}
	}
}

type countingPacer struct {
	n int
	d time.Duration
}

func (p *countingPacer) Pause() time.Duration { p.n++; return p.d }

// A Mover's Pacer (the adaptive rate limit) replaces PagePause page by
// page: an hour's PagePause is not slept.
func TestMoverPacerReplacesPagePause(t *testing.T) {
	f, addr := startFakeSlots(t, 40)
	p := &countingPacer{d: time.Millisecond}
	mv := &Mover{Seeds: []string{addr}, Page: 10, PagePause: time.Hour, Pacer: p}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: 0, End: 99}})
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	if res.Copied != 40 || len(f.keys["2"]) != 40 {
		t.Fatalf("move: %+v", res)
	}
	if p.n < 8 { // 4 pre-copy pages and 3 rests between the purge's 4 loads, at least
		t.Fatalf("the pacer was asked %d times", p.n)
	}
}
