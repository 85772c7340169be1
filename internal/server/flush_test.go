package server

import (
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// FLUSHALL and FLUSHDB at a node of two groups empty both groups, at a node
// that leads neither (both parts forwarded) and at one that leads one; the
// syntax is checked as for one group; while a group moves slots the flush
// is refused there with TRYAGAIN and an error that says how many groups
// were flushed; after the move's states are rolled back it works again.
// On the code before, FLUSHALL at a node of several groups was refused.
func TestFlushAllAcrossGroups(t *testing.T) {
	g := startTwoGroups(t)
	l1, l2 := groupLeaders(g, 1)[0], groupLeaders(g, 2)[0]
	none, one := -1, l1
	for i := range g.nodes {
		if i != l1 && i != l2 {
			none = i
			break
		}
	}
	keys := map[cluster.GroupID][]string{}
	fill := func(c *client) {
		t.Helper()
		for _, id := range []cluster.GroupID{1, 2} {
			keys[id] = nil
			for _, p := range []string{"a", "b", "c"} {
				k := keyOfGroup(id, p)
				keys[id] = append(keys[id], k)
				c.expect("SET " + k + " v => OK")
			}
		}
	}
	empty := func(c *client) {
		t.Helper()
		for id, ks := range keys {
			for _, k := range ks {
				if got := c.do("GET", k); got != "(nil)" {
					t.Fatalf("group %d's key %s = %s after the flush", id, k, got)
				}
			}
		}
	}
	if none >= 0 {
		c := dial(t, g.nodes[none])
		fill(c)
		c.expect("FLUSHALL => OK")
		empty(c)
	}
	c := dial(t, g.nodes[one])
	fill(c)
	c.expect(`
FLUSHDB NOW => ERR syntax error
FLUSHDB ASYNC => OK`)
	empty(c)
	empty(dial(t, g.nodes[l2]))
	c.expect("SET " + keys[2][0] + " again => OK")

	// A group's part that reaches another group (its route key's slot
	// moved, or the sender's map was stale) is refused there, not applied:
	// group 2's part routed by a key of group 1.
	wrong := kv.AppendOp(nil, &kv.Op{Kind: kv.KindFlush, Key: []byte(keyOfGroup(1, "route")), Delta: 2})
	c.expect("SET " + keys[1][0] + " stays => OK")
	if got := dial(t, g.nodes[l1]).do("KEFIR.TXAPPLY", string(wrong)); !strings.HasPrefix(got, "TRYAGAIN group 2's flush was routed to group 1") {
		t.Fatalf("a flush for group 2 routed to group 1 = %s", got)
	}
	if v := c.do("GET", keys[1][0]); v != `"stays"` {
		t.Fatalf("a misrouted flush deleted %s: %s", keys[1][0], v)
	}

	// A move of slots 0-9 from group 1 to group 2, as its first step
	// leaves the tables: group 1 migrating, group 2 importing.
	lc1, lc2 := dial(t, g.nodes[l1]), dial(t, g.nodes[l2])
	epoch := "2"
	lc1.expect("KEFIR.SLOTS INIT 1 1 => (integer)*")
	lc2.expect("KEFIR.SLOTS INIT 2 1 => (integer)*")
	lc1.expect("KEFIR.SLOTS SET 1 migrating 2 " + epoch + " 0-9 => (integer)*")
	lc2.expect("KEFIR.SLOTS SET 2 importing 1 " + epoch + " 0-9 => (integer)*")
	got := c.do("FLUSHALL")
	if !strings.HasPrefix(got, "TRYAGAIN FLUSHALL flushed 0 of 2 groups") || !strings.Contains(got, "moving slots 0-9") {
		t.Fatalf("FLUSHALL during a move = %s", got)
	}
	if v := c.do("GET", keys[2][0]); v != `"again"` {
		t.Fatalf("a refused FLUSHALL deleted %s: %s", keys[2][0], v)
	}
	lc1.expect("KEFIR.SLOTS SET 1 owned 0 " + epoch + " 0-9 => (integer)*")
	lc2.expect("KEFIR.SLOTS SET 2 none 1 " + epoch + " 0-9 => (integer)*")
	deadline := time.Now().Add(5 * time.Second)
	for got := c.do("FLUSHALL"); got != "OK"; got = c.do("FLUSHALL") {
		if time.Now().After(deadline) {
			t.Fatalf("FLUSHALL after the move rolled back = %s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	empty(c)
}
