package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A keyspace scan judges the session's part of a group that no longer
// exists by the view copies its slots' moves brought (cluster.Multi.scanCopies).
// Group 1 (slots 0-8191) on node 1, group 2 (the rest) on node 3, groups 3
// and 4 (no slots) on nodes 2 and 1. A session at node 3 writes a key of each
// group; its token's group 1 part is made to name its write in another
// view (what a cad or async write a view change dropped leaves). Group 1's
// slots all move to group 2, which takes group 1's view history along, and
// group 1 is removed from the map: no scan reads group 1 any more. KEFIR.SCAN
// at node 3 with the lost token then fails naming group 1, judged by group
// 2's copy; before (and with the mutation ScanCopiesUnchecked) the page was
// served. A fresh session's scan returns both keys.
func TestSessionScanLostInARemovedGroup(t *testing.T) {
	g := startGroupWith(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{3}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
			{ID: 3, Members: []uint64{2}}, // a node is a member of some group
			{ID: 4, Members: []uint64{1}}, // node 1's group once group 1 is gone
		}
	})
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		return len(groupLeaders(g, 1)) == 1 && len(groupLeaders(g, 2)) == 1 && len(groupLeaders(g, 3)) == 1 && len(groupLeaders(g, 4)) == 1
	}) {
		t.Fatal("the groups have no leaders")
	}
	ka, kb := keyOfGroup(1, "lost"), keyOfGroup(2, "other")
	node3 := g.nodes[2]
	c := dial(t, node3)
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`SET ` + ka + ` a0 => OK`)
	c.expect(`SET ` + kb + ` b0 => OK`)
	tok := strings.Trim(c.do("KEFIR.SESSION"), `"`)
	s, err := shard.ParseSession(tok)
	if err != nil || len(s.Groups) != 2 || s.Groups[0].Group != 1 || !s.Groups[0].WriteViewKnown {
		t.Fatalf("token %q: %+v %v", tok, s, err)
	}
	s.Groups[0].WriteView++ // the op went to another view's write
	lost := s.String()

	mv := &cluster.Mover{Seeds: []string{g.cfgs[0].ClientAddr, g.cfgs[2].ClientAddr}, RetryFor: 10 * time.Second, Meta: true, Driver: "TestSessionScanLostInARemovedGroup"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: 0, End: 8191}})
	if err != nil {
		t.Fatalf("move group 1's slots to group 2: %v", err)
	}
	if res.ViewCopies < 1 {
		t.Fatalf("the move took %d view copies to group 2", res.ViewCopies)
	}
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mv.RemoveGroup(ctx, 1, cm.Epoch); err != nil {
		t.Fatal(err)
	}
	// Node 3's map names group 1 no more, and node 1 retired its
	// replica (which would judge the part for a scan's part read there).
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		if _, ok := node3.multi.Slots().Group(1); ok {
			return false
		}
		for _, lg := range g.nodes[0].multi.Hosted() {
			if lg.Spec.ID == 1 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("group 1 is still in node 3's map or hosted at node 1")
	}

	scan := func(tok string) string {
		t.Helper()
		rc := dial(t, node3)
		rc.expect(`KEFIR.CONSISTENCY session => OK`)
		if tok != "" {
			rc.expect(`KEFIR.SESSION ` + tok + ` => OK`)
		}
		return rc.do("KEFIR.SCAN", "", "")
	}
	isLost := func(got string) bool {
		return strings.Contains(got, "lost") && strings.Contains(got, "group 1")
	}
	if got := scan(lost); !isLost(got) {
		t.Fatalf("KEFIR.SCAN at node 3 once group 1 was removed, with a token whose group 1 write was dropped: %s, want the lost session's error naming group 1", got)
	}
	if mutation.On {
		cluster.MultiMut.ScanCopiesUnchecked.Store(true)
		got := scan(lost)
		cluster.MultiMut.ScanCopiesUnchecked.Store(false)
		if isLost(got) {
			t.Fatalf("ScanCopiesUnchecked not caught: %s", got)
		}
		t.Logf("with ScanCopiesUnchecked the lost session's scan is served: %s", got)
	}
	if got := scan(""); !strings.Contains(got, `"`+ka+`"`) || !strings.Contains(got, `"`+kb+`"`) {
		t.Fatalf("KEFIR.SCAN at node 3 with a fresh session: %s, want %s and %s", got, ka, kb)
	}
}
