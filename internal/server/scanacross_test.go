package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A keyspace scan (SCAN, KEYS, KEFIR.SCAN), DBSIZE and RANDOMKEY at any
// node of a cluster whose nodes do not all host every group (issue 28;
// docs/cluster.md "Keyspace scans"): group 1 on nodes 1-3, group 2 on node
// 3 alone. Nodes 1 and 2 read group 2's part at node 3 (KEFIR.GROUPSCAN),
// and a node that does not lead group 1 reads its linearizable part at its
// leader: every node returns all of the keys, once per SCAN iteration
// (pages of 13), and counts them all (level session:
// TestSessionScanAcrossNodes). Before, nodes 1 and 2 answered
// "a keyspace scan needs every group on this node" and counted only group
// 1's keys.
func TestKeyspaceScansAcrossNodes(t *testing.T) {
	g := startGroupOnNode3(t)
	w := dial(t, g.nodes[0])
	var want []string
	in2 := 0
	for i := range 150 {
		k := fmt.Sprintf("key:%03d", i)
		if got := w.do("SET", k, "v"); got != "OK" {
			t.Fatalf("SET %s = %s", k, got)
		}
		want = append(want, k)
		if cluster.Slot([]byte(k)) > 8191 {
			in2++
		}
	}
	if in2 == 0 || in2 == len(want) {
		t.Fatalf("%d of %d keys in group 2: want both groups", in2, len(want))
	}
	slices.Sort(want)
	for i, s := range g.nodes {
		c := dial(t, s)
		var got []string
		for cursor, pages := "0", 0; ; pages++ {
			r := c.doRaw("SCAN", cursor, "COUNT", "13")
			got = append(got, r.items...)
			if cursor = r.cursor; cursor == "0" || pages > 100 {
				break
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("node %d: SCAN returned %d keys (%d distinct), want the %d written", i+1, len(got), len(slices.Compact(slices.Clone(got))), len(want))
		}
		// DBSIZE counts what the replicas asked have applied: a follower's
		// may lag the last writes for a moment.
		var n string
		if !testgroup.Until(5*time.Second, 20*time.Millisecond, func() bool {
			n = c.do("DBSIZE")
			return n == fmt.Sprintf("(integer) %d", len(want))
		}) {
			t.Fatalf("node %d: DBSIZE = %s, want %d", i+1, n, len(want))
		}
		if keys := c.do("KEYS", "key:*"); strings.Count(keys, `"key:`) != len(want) {
			t.Fatalf("node %d: KEYS key:* = %.200s..., want %d keys", i+1, keys, len(want))
		}
		if pairs := c.do("KEFIR.SCAN", "", "", "LIMIT", "1000"); strings.Count(pairs, `"key:`) != len(want) {
			t.Fatalf("node %d: KEFIR.SCAN = %.200s..., want %d keys", i+1, pairs, len(want))
		}
		if k := c.do("RANDOMKEY"); !strings.HasPrefix(k, `"key:`) {
			t.Fatalf("node %d: RANDOMKEY = %s", i+1, k)
		}
	}
}

// A keyspace scan at level session at a node that does not host a group
// (node 1; group 2 is on node 3 alone) reads that group's part at its node
// for the session's part of it: KEFIR.GROUPSCAN under KEFIR.CALL SESSION.
// A session that wrote a key of group 2 through node 3 sees it in SCAN,
// KEYS and KEFIR.SCAN through node 1, and its token then has read group 2
// at least as far as its write. A token whose group 2 part names a write a
// view change dropped (as TestSessionLostInOneGroupIsLostAtEvery makes one)
// is lost at node 1's scan too — found at node 3, which judges the part it
// was sent; with the session not carried (ScanSessionNotCarried) node 3
// serves it. Before, node 1 refused a scan at level session.
func TestSessionScanAcrossNodes(t *testing.T) {
	g := startGroupOnNode3(t)
	kb := keyOfGroup(2, "mine")
	w := dial(t, g.nodes[2])
	w.expect(`KEFIR.CONSISTENCY session => OK`)
	w.expect(`SET ` + kb + ` v => OK`)
	tok := strings.Trim(w.do("KEFIR.SESSION"), `"`)
	written, err := shard.ParseSession(tok)
	if err != nil || written.For(2).LastWrite == 0 || !written.For(2).WriteViewKnown {
		t.Fatalf("the writer's token %q: %+v %v", tok, written, err)
	}
	c := dial(t, g.nodes[0])
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`KEFIR.SESSION ` + tok + ` => OK`)
	if got := c.do("KEYS", "*"); !strings.Contains(got, `"`+kb+`"`) {
		t.Fatalf("KEYS * at node 1 at level session: %.200s, want the session's %s", got, kb)
	}
	if r := c.doRaw("SCAN", "0", "COUNT", "100"); !slices.Contains(r.items, kb) {
		t.Fatalf("SCAN at node 1 at level session: %q, want the session's %s", r.items, kb)
	}
	if got := c.do("KEFIR.SCAN", "", "", "LIMIT", "100"); !strings.Contains(got, `"`+kb+`"`) {
		t.Fatalf("KEFIR.SCAN at node 1 at level session: %.200s", got)
	}
	after, err := shard.ParseSession(strings.Trim(c.do("KEFIR.SESSION"), `"`))
	if err != nil || after.For(2).MaxRead < written.For(2).LastWrite {
		t.Fatalf("the token after the scans: %+v (%v), want group 2 read up to its write %d", after, err, written.For(2).LastWrite)
	}

	p := written.For(2)
	p.WriteView++ // the op went to another view's write
	lost := shard.Session{}.AfterWrite(kv.Result{Version: p.LastWrite, View: p.WriteView, ViewKnown: true, Group: 2}.Pos())
	scanLost := func() string {
		c := dial(t, g.nodes[0])
		c.expect(`KEFIR.CONSISTENCY session => OK`)
		c.expect(`KEFIR.SESSION ` + lost.String() + ` => OK`)
		return c.do("KEYS", "*")
	}
	if got := scanLost(); !strings.Contains(got, "lost") {
		t.Fatalf("KEYS at node 1 with a token whose group 2 part is lost: %.200s, want the lost session's error", got)
	}
	if mutation.On {
		cluster.MultiMut.ScanSessionNotCarried.Store(true)
		got := scanLost()
		cluster.MultiMut.ScanSessionNotCarried.Store(false)
		if strings.Contains(got, "lost") {
			t.Fatalf("ScanSessionNotCarried not caught: %.200s", got)
		}
		t.Logf("with ScanSessionNotCarried node 1 serves the lost session: %.100s", got)
	}
}

// DBSIZE at a node that does not host a group asks a node of it again
// while that node is down (dbSize → groupKeys): node 3, group 2's only
// member, stops and comes back half a second later on its data, and a
// DBSIZE at node 1 sent meanwhile answers every key rather than failing.
func TestDBSizeWaitsForAGroupsNode(t *testing.T) {
	g := startGroupOnNode3(t)
	w := dial(t, g.nodes[0])
	for i := range 40 {
		if got := w.do("SET", fmt.Sprintf("d%02d", i), "v"); got != "OK" {
			t.Fatalf("SET = %s", got)
		}
	}
	c := dial(t, g.nodes[0])
	if !testgroup.Until(5*time.Second, 20*time.Millisecond, func() bool { return c.do("DBSIZE") == "(integer) 40" }) {
		t.Fatalf("DBSIZE = %s before the stop", c.do("DBSIZE"))
	}
	cfg := g.cfgs[2]
	cfg.Bootstrap = false
	if err := g.nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	back := make(chan *Server, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		s, err := startNode(cfg)
		if err != nil {
			t.Error(err)
			back <- nil
			return
		}
		back <- s
	}()
	got := c.do("DBSIZE")
	if s := <-back; s != nil {
		t.Cleanup(func() { s.Close() })
	}
	if got != "(integer) 40" {
		t.Fatalf("DBSIZE at node 1 while group 2's node restarts = %s, want 40", got)
	}
}

// startGroupOnNode3 starts three nodes where group 1 (slots 0-8191) has a
// replica on each and group 2 (the rest) only on node 3, and waits for both
// groups' leaders: nodes 1 and 2 host one group of two.
func startGroupOnNode3(t *testing.T) *group {
	t.Helper()
	g := startGroupWith(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{3}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
		}
	})
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		return len(groupLeaders(g, 1)) == 1 && len(groupLeaders(g, 2)) == 1
	}) {
		t.Fatal("the groups have no leaders")
	}
	return g
}
