package server

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A move of group 1's slots to group 2 whose driver stops right after its
// first step (the destination importing, the source not yet migrating),
// then rolled back (move-slots --abort): the cluster is at rest, group 1
// serves its slots as before. A keyspace scan at level session (and
// linearizable) returns both groups' keys; before Mover.rollBack took the
// source to the move's epoch it failed with TRYAGAIN forever: the source's
// entry (owned at its old epoch) ranked below the destination's none at
// the move's epoch (cluster/slotrank.go), so its keys were dropped as
// behind and its slots served by no group.
func TestScanAfterAMoveAbortedBeforeTheSourceMigrated(t *testing.T) {
	g := startMoveGroups(t)
	ka, kb := keyOfGroup(1, "src"), keyOfGroup(2, "other")
	c := dial(t, g.nodes[0])
	c.expect(`SET ` + ka + ` a0 => OK`)
	c.expect(`SET ` + kb + ` b0 => OK`)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rs := []kv.SlotRange{{Start: 0, End: 8191}}
	seeds := []string{g.cfgs[0].ClientAddr, g.cfgs[1].ClientAddr}
	// stopAfterImporting runs a move of rs from group 1 to group 2 whose
	// driver stops right after the destination's importing step.
	stopAfterImporting := func() {
		t.Helper()
		stopped, stop := context.WithCancel(ctx)
		defer stop()
		mv := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Driver: t.Name(),
			AfterStep: func(step string) {
				if step == "importing" {
					stop()
				}
			}}
		defer mv.Close()
		if _, err := mv.Move(stopped, 1, 2, rs); err == nil {
			t.Fatal("the move went on past its importing step")
		}
	}
	abort := func() {
		t.Helper()
		ab := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Driver: t.Name() + "-abort"}
		defer ab.Close()
		if err := ab.Abort(ctx, 1, 2, rs); err != nil {
			t.Fatalf("abort: %v", err)
		}
	}
	scan := func(lvl string) string {
		rc := dial(t, g.nodes[2])
		rc.expect(`KEFIR.CONSISTENCY ` + lvl + ` => OK`)
		return rc.do("KEFIR.SCAN", "", "")
	}
	served := func(got string) bool { return strings.Contains(got, `"`+ka+`"`) && strings.Contains(got, `"`+kb+`"`) }

	stopAfterImporting()
	abort()
	for _, lvl := range []string{"session", "linearizable"} {
		if got := scan(lvl); !served(got) {
			t.Fatalf("KEFIR.SCAN at level %s after the aborted move: %s, want %s and %s", lvl, got, ka, kb)
		}
	}

	// The tables an older build's abort left (the destination back at
	// none at the move's epoch, the source owned at its older one): the
	// scan fails, and move-slots --abort run again repairs them.
	stopAfterImporting()
	mv := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second}
	defer mv.Close()
	tab, err := mv.Table(ctx, 2)
	if err != nil || len(tab) == 0 {
		t.Fatalf("group 2's table: %v %v", tab, err)
	}
	e := tab[0].Epoch
	if tab[0].State != "importing" || tab[0].Start != 0 {
		t.Fatalf("group 2's table %+v: want slots 0- importing", tab)
	}
	if got := dial(t, g.nodes[1]).do("KEFIR.SLOTS", "SET", "2", "none", "1", strconv.FormatUint(e, 10), "0-8191"); strings.Contains(got, "ERR") {
		t.Fatalf("group 2 gives up importing: %s", got)
	}
	if got := scan("session"); !strings.Contains(got, "TRYAGAIN") {
		t.Fatalf("KEFIR.SCAN after an older build's abort: %s, want TRYAGAIN (the source taken as behind)", got)
	}
	abort()
	if got := scan("session"); !served(got) {
		t.Fatalf("KEFIR.SCAN after the older build's abort was repaired: %s, want %s and %s", got, ka, kb)
	}
}

// startMoveGroups starts three nodes, each the one member of a group:
// group 1 owns slots 0-8191, group 2 the rest, group 3 none (a move's
// next destination), and waits for the three leaders.
func startMoveGroups(t *testing.T) *group {
	t.Helper()
	g := startGroupWith(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{2}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
			{ID: 3, Members: []uint64{3}},
		}
	})
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		return len(groupLeaders(g, 1)) == 1 && len(groupLeaders(g, 2)) == 1 && len(groupLeaders(g, 3)) == 1
	}) {
		t.Fatal("the groups have no leaders")
	}
	return g
}
