package server

import (
	"fmt"
	"testing"
)

// KEFIR.TOPOLOGY names the group in leader order and the fast path's mode;
// a single node answers zeros.
func TestTopology(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	got := dial(t, g.nodes[0]).do("KEFIR.TOPOLOGY")
	want := fmt.Sprintf("[(integer) 42, (integer) %d, (integer) %d, (integer) 1, (integer) 1, [[(integer) 1, %q], [(integer) 2, %q], [(integer) 3, %q]]]",
		g.nodes[l].vr.Info().View, l+1, g.cfgs[0].Members[0].ClientAddr, g.cfgs[0].Members[1].ClientAddr, g.cfgs[0].Members[2].ClientAddr)
	if got != want {
		t.Fatalf("KEFIR.TOPOLOGY = %s\nwant %s", got, want)
	}
	if got := dial(t, startServer(t, nil)).do("KEFIR.TOPOLOGY"); got != "[(integer) 0, (integer) 0, (integer) 0, (integer) 0, (integer) 0, []]" {
		t.Fatalf("single node KEFIR.TOPOLOGY = %s", got)
	}
}

// KEFIR.NILEXT acks with [view, replica id, leader]; a client that gathers
// the acks of every replica (the supermajority of 3) has completed the
// write, and a linearizable read then sees it. Everything a redis-cli user
// could get wrong is refused with no ack.
func TestNilextDirectTakeAndValidation(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	view := g.nodes[l].vr.Info().View
	for i, s := range g.nodes {
		lead := 0
		if i == l {
			lead = 1
		}
		dial(t, s).expect(fmt.Sprintf(`KEFIR.NILEXT 77 1 sync SET dk dv => [(integer) %d, (integer) %d, (integer) %d]`, view, i+1, lead))
	}
	dial(t, g.nodes[(l+1)%3]).expect(`GET dk => "dv"`)

	c := dial(t, g.nodes[l])
	c.expect(`
KEFIR.NILEXT 77 2 cad MSET a 1 b 2 => [*
KEFIR.NILEXT 77 2 cad MSET a 1 b 2 => [*
KEFIR.NILEXT 77 1 sync SET dk old => ERR KEFIR.NILEXT: vrshard: nilext request older*
KEFIR.NILEXT 0 1 sync SET k v => ERR KEFIR.NILEXT: client id*
KEFIR.NILEXT 78 0 sync SET k v => ERR KEFIR.NILEXT: client id*
KEFIR.NILEXT x 1 sync SET k v => ERR KEFIR.NILEXT: client id*
KEFIR.NILEXT 78 1 never SET k v => ERR KEFIR.NILEXT:*
KEFIR.NILEXT 78 1 sync SET k v NX => ERR KEFIR.NILEXT takes only*
KEFIR.NILEXT 78 1 sync SET k => ERR wrong number*
KEFIR.NILEXT 78 1 sync SET k v GET x => ERR KEFIR.NILEXT takes only*
KEFIR.NILEXT 78 1 sync MSET a 1 b => ERR KEFIR.NILEXT takes only*
KEFIR.NILEXT 78 1 sync INCR a b c => ERR KEFIR.NILEXT takes only*
KEFIR.NILEXT 78 1 sync DEL a b c => ERR KEFIR.NILEXT takes only*
`)
	// A key above the engine's limit would fail only when applied, after
	// the ack: refused up front.
	if got := c.do("KEFIR.NILEXT", "79", "1", "sync", "SET", string(make([]byte, 64<<10+1)), "v"); got[:26] != "ERR KEFIR.NILEXT: vrshard:" {
		t.Fatalf("oversized key: %s", got)
	}
	// Off without --nilext.
	plain := startGroup(t)
	dial(t, plain.nodes[plain.leader(t)]).expect(`KEFIR.NILEXT 1 1 sync SET k v => ERR KEFIR.NILEXT: the nilext fast path is off*`)
	if taken, refused := g.nodes[l].vr.NilextDirectStats(); taken < 3 || refused < 1 {
		t.Fatalf("leader took %d and refused %d direct updates", taken, refused)
	}
}
