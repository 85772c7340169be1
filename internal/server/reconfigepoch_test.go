package server

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// KEFIR.GROUP RECONFIG GROUP g EPOCH e is a compare-and-set: two changes
// planned against the same configuration (an operator's replace-node and
// the repairer's, say) — the second is refused with -EPOCHMOVED naming
// where the group is, instead of undoing the first. Group 1 [1 2 3] at
// epoch e: 3 -> 4 lands; 2 -> 5, planned against e as [1 5 3], would bring
// node 3 back and drop node 4. A request without EPOCH (an older caller's)
// is not tied to any configuration, and the current set again answers the
// configuration unchanged whatever the epoch (a retry of a change made).
func TestReconfigRefusesAStaleEpoch(t *testing.T) {
	cfgs := groupsConfigs(t, 5, []cluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 16383}}},
		{ID: 2, Members: []uint64{4}},
		{ID: 3, Members: []uint64{5}},
	})
	ms := cfgs[0].Members
	startConfigs(t, cfgs)
	mv := &cluster.Mover{Seeds: []string{ms[0].ClientAddr, ms[1].ClientAddr}, RetryFor: 20 * time.Second}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cur, err := mv.GroupConfigOf(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	first, err := mv.ReconfigureGroup(ctx, 1, cur.Epoch, []uint64{1, 2, 4})
	if err != nil || first.Epoch != cur.Epoch+1 || !cluster.SameIDs(first.Members, []uint64{1, 2, 4}) {
		t.Fatalf("3 -> 4 from epoch %d: %s %v", cur.Epoch, first, err)
	}
	_, err = mv.ReconfigureGroup(ctx, 1, cur.Epoch, []uint64{1, 5, 3})
	var moved *cluster.EpochMovedError
	if !errors.As(err, &moved) || moved.Group != 1 || moved.Expected != cur.Epoch || moved.Epoch != first.Epoch || !cluster.SameIDs(moved.Members, []uint64{1, 2, 4}) ||
		!strings.Contains(err.Error(), "EPOCHMOVED") {
		t.Fatalf("2 -> 5 planned against epoch %d, at epoch %d: %v, want -EPOCHMOVED naming epoch %d, members [1 2 4]", cur.Epoch, first.Epoch, err, first.Epoch)
	}
	now, err := mv.GroupConfigOf(ctx, 1)
	if err != nil || now.Epoch != first.Epoch || !cluster.SameIDs(now.Members, []uint64{1, 2, 4}) {
		t.Fatalf("after the refusal the group is %s %v, want epoch %d [1 2 4]", now, err, first.Epoch)
	}
	// A retry of the change made: answered unchanged.
	if again, err := mv.ReconfigureGroup(ctx, 1, cur.Epoch, []uint64{4, 2, 1}); err != nil || again.Epoch != first.Epoch {
		t.Fatalf("a retry of 3 -> 4: %s %v", again, err)
	}
	// Bad EPOCH arguments are refused before anything changes (by any
	// node hosting the group).
	c := dialAddr(t, ms[0].ClientAddr)
	for args, want := range map[string]string{
		"KEFIR.GROUP RECONFIG GROUP 1 EPOCH x 1 2 4": "is not a configuration epoch",
		"KEFIR.GROUP RECONFIG GROUP 1 EPOCH 3":       "followed by the members",
	} {
		if got := c.do(strings.Fields(args)...); !strings.Contains(got, want) {
			t.Errorf("%s: %s, want %q", args, got, want)
		}
	}
	// Without EPOCH (an older caller's): whatever the configuration is.
	// At the leader, following -MOVED.
	addr, got := ms[0].ClientAddr, ""
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		got = dialAddr(t, addr).do("KEFIR.GROUP", "RECONFIG", "GROUP", "1", "1", "2", "5")
		if f := strings.Fields(got); len(f) > 0 && strings.Contains(got, "MOVED ") {
			addr = f[len(f)-1]
		}
		return !strings.Contains(got, "MOVED") && !strings.Contains(got, "UNAVAILABLE")
	}) || strings.Contains(got, "EPOCHMOVED") || strings.Contains(got, "ERR") {
		t.Fatalf("RECONFIG without EPOCH: %s", got)
	}
	if now, err := mv.GroupConfigOf(ctx, 1); err != nil || !slices.Contains(now.Members, 5) {
		t.Fatalf("after RECONFIG without EPOCH: %s %v", now, err)
	}
}

// A single group's KEFIR.GROUP RECONFIG EPOCH e (kefir cluster
// replace-node/remove-node/add-members without --groups) is the same
// compare-and-set: [1 2 3] -> [1] from epoch e lands; [1 2 3] -> [1 2 3 ...]
// planned against e too is refused, -EPOCHMOVED naming epoch e+1 and [1].
func TestSingleGroupReconfigRefusesAStaleEpoch(t *testing.T) {
	g := startGroup(t)
	mv := &cluster.Mover{RetryFor: 20 * time.Second}
	for _, c := range g.cfgs {
		mv.Seeds = append(mv.Seeds, c.ClientAddr)
	}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cur, err := mv.GroupConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := mv.Reconfigure(ctx, cur.Epoch, []cluster.Member{{ID: 1}})
	if err != nil || first.Epoch != cur.Epoch+1 {
		t.Fatalf("[1 2 3] -> [1] from epoch %d: %s %v", cur.Epoch, first, err)
	}
	_, err = mv.Reconfigure(ctx, cur.Epoch, []cluster.Member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4, PeerAddr: "127.0.0.1:1", ClientAddr: "127.0.0.1:2"}, {ID: 5, PeerAddr: "127.0.0.1:3", ClientAddr: "127.0.0.1:4"}})
	var moved *cluster.EpochMovedError
	if !errors.As(err, &moved) || moved.Group != 0 || moved.Expected != cur.Epoch || moved.Epoch != first.Epoch || !slices.Equal(moved.Members, []uint64{1}) {
		t.Fatalf("a change planned against epoch %d at epoch %d: %v, want -EPOCHMOVED naming [1]", cur.Epoch, first.Epoch, err)
	}
	// Refused before anything changed: the new nodes' addresses were not
	// written into the group's record either.
	now, err := mv.GroupConfig(ctx)
	if err != nil || now.Epoch != first.Epoch {
		t.Fatalf("after the refusal: %s %v", now, err)
	}
	if _, ok := now.Addr(4); ok {
		t.Fatalf("the refused change recorded node 4's addresses: %s %v", now, now.Addrs)
	}
}
