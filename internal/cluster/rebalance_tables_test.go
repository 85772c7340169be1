package cluster

import (
	"context"
	"math/rand"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// simTables models the groups' slot tables as Mover.Move leaves them: a
// group's first table owns its slots at epoch 1; a move gives its range a
// fresh epoch (one above both tables' highest), none with the destination
// as peer at the source, owned with the source as peer at the destination.
type simTables map[GroupID][]SlotRunInfo

func newSimTables(owner []GroupID, ids []GroupID) simTables {
	t := simTables{}
	for _, id := range ids {
		rows := make([]SlotRunInfo, Slots)
		for s := range rows {
			rows[s] = SlotRunInfo{Start: uint16(s), End: uint16(s), State: "none"}
			if owner[s] == id {
				rows[s].State, rows[s].Epoch = "owned", 1
			}
		}
		t[id] = rows
	}
	return t
}

// runs returns id's table as KEFIR.SLOTS TABLE lists it (runs of equal rows).
func (t simTables) runs(id GroupID) []SlotRunInfo {
	var out []SlotRunInfo
	for _, r := range t[id] {
		if n := len(out); n > 0 && out[n-1].sameRow(r) {
			out[n-1].End = r.End
			continue
		}
		out = append(out, r)
	}
	return out
}

// move checks what Mover.Move checks of a fresh move (uniform rows at both
// ends, owned at the source and none at the destination) and applies it.
func (t simTables) move(from, to GroupID, r kv.SlotRange) error {
	in := InRanges([]kv.SlotRange{r})
	src, err := uniform(t.runs(from), in, from)
	if err != nil {
		return err
	}
	dst, err := uniform(t.runs(to), in, to)
	if err != nil {
		return err
	}
	if src.State != "owned" || dst.State != "none" {
		return errNoRecord // not a fresh move; the caller says which
	}
	e := max(maxEpoch(t[from]), maxEpoch(t[to])) + 1
	for s := int(r.Start); s <= int(r.End); s++ {
		t[from][s] = SlotRunInfo{Start: uint16(s), End: uint16(s), State: "none", Peer: uint64(to), Epoch: e}
		t[to][s] = SlotRunInfo{Start: uint16(s), End: uint16(s), State: "owned", Peer: uint64(from), Epoch: e}
	}
	return nil
}

func (t simTables) planGroups(ids []GroupID) []PlanGroup {
	var out []PlanGroup
	for _, id := range ids {
		g := PlanGroup{ID: id, Table: t.runs(id)}
		for _, r := range g.Table {
			if r.State == "owned" {
				g.Slots = append(g.Slots, kv.SlotRange{Start: r.Start, End: r.End})
			}
		}
		out = append(out, g)
	}
	return out
}

// The review's reproduction: after the e2e test's move group 2 owns
// 8192-12287 (from group 1, epoch 2) and 12288-16383 (its own, epoch 1);
// load on 12288 on made the planner move 8192-12970 back, which Mover.Move
// refuses (two rows at group 2).
func TestPlanRebalanceRespectsTableRowsAfterAMove(t *testing.T) {
	ids := []GroupID{1, 2}
	tabs := newSimTables(func() []GroupID {
		o := make([]GroupID, Slots)
		for s := range o {
			o[s] = 1
			if s >= 12288 {
				o[s] = 2
			}
		}
		return o
	}(), ids)
	if err := tabs.move(1, 2, kv.SlotRange{Start: 8192, End: 12287}); err != nil {
		t.Fatal(err)
	}
	w := make([]int64, Slots)
	for s := 12288; s < Slots; s++ {
		w[s] = 10
	}
	for s := 8192; s < 12288; s++ {
		w[s] = 1
	}
	groups := tabs.planGroups(ids)
	p := PlanRebalance(groups, w, 0.1, 0)
	if len(p.Moves) == 0 {
		t.Fatalf("plan %v: want a move", p)
	}
	checkPlan(t, groups, w, p)
	for i, m := range p.Moves {
		if err := tabs.move(m.From, m.To, m.Slots); err != nil {
			t.Fatalf("move %d (%+v) of the plan:\n%v\nMover.Move would refuse it: %v", i+1, m, p, err)
		}
	}
}

// Random layouts, several rebalances in a row, each plan's moves applied to
// the simulated tables: every planned move is one Mover.Move takes.
func TestPlanRebalanceMovesAreUniformInTheTables(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for trial := 0; trial < 30; trial++ {
		n := 2 + rng.Intn(3)
		var ids []GroupID
		for i := 1; i <= n; i++ {
			ids = append(ids, GroupID(i))
		}
		owner := make([]GroupID, Slots)
		for s := range owner {
			owner[s] = ids[s*n/Slots]
		}
		tabs := newSimTables(owner, ids)
		for round := 0; round < 4; round++ {
			w := make([]int64, Slots)
			hot := rng.Intn(Slots)
			for s := range w {
				w[s] = int64(rng.Intn(3))
				if d := s - hot; d >= 0 && d < 3000 {
					w[s] += 20
				}
			}
			groups := tabs.planGroups(ids)
			p := PlanRebalance(groups, w, 0.05, 0)
			checkPlan(t, groups, w, p)
			for i, m := range p.Moves {
				if err := tabs.move(m.From, m.To, m.Slots); err != nil {
					t.Fatalf("trial %d round %d: move %d (%+v) of the plan:\n%v\nMover.Move would refuse it: %v", trial, round, i+1, m, p, err)
				}
			}
		}
	}
}

// A table with slots migrating or importing (a move in flight the map may
// not list yet) stops the rebalance before it plans, and before each move.
func TestRebalanceRefusesAMoveInFlightInATable(t *testing.T) {
	f, addr := startFakeSlots(t, 10)
	f.mu.Lock()
	r := f.tables["2"]
	r.State, r.Peer = "importing", 1
	f.tables["2"] = r
	f.mu.Unlock()
	mv := &Mover{Seeds: []string{addr}}
	defer mv.Close()
	groups := []PlanGroup{{ID: 1}, {ID: 2}}
	if err := mv.PlanTables(context.Background(), groups); err == nil || !strings.Contains(err.Error(), "importing at group 2") {
		t.Fatalf("PlanTables with group 2 importing: %v", err)
	}
	rb := &Rebalancer{NewMover: func() *Mover { return &Mover{Seeds: []string{addr}} }}
	p := Plan{Moves: []PlannedMove{{From: 1, To: 2, Slots: kv.SlotRange{Start: 0, End: 9}}}}
	if _, err := rb.Run(context.Background(), p); err == nil || !strings.Contains(err.Error(), "in flight") {
		t.Fatalf("Run with group 2 importing: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.events {
		if strings.HasPrefix(e.cmd, "SET") {
			t.Fatalf("Run sent %q", e.cmd)
		}
	}
}
