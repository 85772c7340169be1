package cluster

import (
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// PlanDrain takes every slot of the drained group, and only those, to the
// other groups, in contiguous ranges that never cross a row change of
// either table, and leaves the others about even: by weight, and by slot
// counts when the drained group's slots weigh nothing.
func TestPlanDrain(t *testing.T) {
	three := func() []PlanGroup {
		return []PlanGroup{
			{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 5460}}},
			{ID: 2, Slots: []kv.SlotRange{{Start: 5461, End: 10922}}},
			{ID: 3, Slots: []kv.SlotRange{{Start: 10923, End: 16383}}},
		}
	}
	apply := func(t *testing.T, groups []PlanGroup, p Plan, drain GroupID) []GroupID {
		t.Helper()
		owner := make([]GroupID, Slots)
		for _, g := range groups {
			for _, r := range g.Slots {
				for s := int(r.Start); s <= int(r.End); s++ {
					owner[s] = g.ID
				}
			}
		}
		for _, m := range p.Moves {
			if m.From != drain || m.To == drain {
				t.Fatalf("move %+v is not from the drained group %d", m, drain)
			}
			for s := int(m.Slots.Start); s <= int(m.Slots.End); s++ {
				if owner[s] != drain {
					t.Fatalf("move %+v takes slot %d of group %d", m, s, owner[s])
				}
				owner[s] = m.To
			}
		}
		for s, o := range owner {
			if o == drain {
				t.Fatalf("slot %d left in group %d: %+v", s, drain, p.Moves)
			}
		}
		return owner
	}
	count := func(owner []GroupID, g GroupID) (n int) {
		for _, o := range owner {
			if o == g {
				n++
			}
		}
		return n
	}
	t.Run("uniform", func(t *testing.T) {
		gs := three()
		p := PlanDrain(gs, uniformWeights(1), 2)
		owner := apply(t, gs, p, 2)
		if len(p.Moves) != 2 || count(owner, 1) != Slots/2 || count(owner, 3) != Slots/2 {
			t.Fatalf("plan %+v: group 1 %d slots, group 3 %d", p.Moves, count(owner, 1), count(owner, 3))
		}
	})
	t.Run("empty slots by count", func(t *testing.T) {
		gs := three()
		w := make([]int64, Slots)
		w[0] = 1000 // group 1 is heavy by keys; the drained group weighs nothing
		p := PlanDrain(gs, w, 2)
		owner := apply(t, gs, p, 2)
		if len(p.Moves) != 2 || count(owner, 1) != Slots/2 {
			t.Fatalf("plan %+v: group 1 %d slots", p.Moves, count(owner, 1))
		}
	})
	t.Run("heavy elsewhere", func(t *testing.T) {
		gs := three()
		w := uniformWeights(1)
		for s := 0; s <= 5460; s++ {
			w[s] = 3 // group 1 is above the mean already: all goes to 3
		}
		p := PlanDrain(gs, w, 2)
		owner := apply(t, gs, p, 2)
		if count(owner, 1) != 5461 {
			t.Fatalf("plan %+v gave the heavy group slots", p.Moves)
		}
	})
	t.Run("tables cut", func(t *testing.T) {
		gs := three()
		gs[1].Table = []SlotRunInfo{{Start: 5461, End: 6000, State: "owned"}, {Start: 6001, End: 10922, State: "owned", Epoch: 2}}
		gs[2].Table = []SlotRunInfo{{Start: 0, End: 7999, State: "none"}, {Start: 8000, End: 10922, State: "none", Peer: 2, Epoch: 2}}
		p := PlanDrain(gs, uniformWeights(1), 2)
		apply(t, gs, p, 2)
		for _, m := range p.Moves {
			for _, c := range []uint16{6001} {
				if m.Slots.Start < c && m.Slots.End >= c {
					t.Fatalf("move %+v crosses the source's row change at %d", m, c)
				}
			}
			if m.To == 3 && m.Slots.Start < 8000 && m.Slots.End >= 8000 {
				t.Fatalf("move %+v crosses the destination's row change at 8000", m)
			}
		}
	})
	if p := PlanDrain(three()[:1], uniformWeights(1), 1); len(p.Moves) != 0 {
		t.Fatalf("a lone group drained: %+v", p)
	}
}

// The remainder of the drained group's slots after every other group got
// to the mean stays in the last move, rather than a move of its own to the
// group that is still the lightest (a run of three groups, the drained one
// in the middle, left a one-slot move at its end).
func TestPlanDrainKeepsTheRemainderInTheLastMove(t *testing.T) {
	gs := []PlanGroup{
		{ID: 1, Slots: []kv.SlotRange{{Start: 0, End: 5460}}},
		{ID: 2, Slots: []kv.SlotRange{{Start: 5461, End: 10922}}},
		{ID: 3, Slots: []kv.SlotRange{{Start: 10923, End: 16383}}},
	}
	w := uniformWeights(100)
	w[10922] = 250 // the drained group's last slot is a little heavier
	p := PlanDrain(gs, w, 2)
	if len(p.Moves) != 2 || p.Moves[1].Slots.End != 10922 {
		t.Fatalf("plan: %+v", p.Moves)
	}
}
