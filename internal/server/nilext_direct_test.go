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
		vrOf(g.nodes[l]).Info().View, l+1, g.cfgs[0].Members[0].ClientAddr, g.cfgs[0].Members[1].ClientAddr, g.cfgs[0].Members[2].ClientAddr)
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
	view := vrOf(g.nodes[l]).Info().View
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
	if taken, refused := vrOf(g.nodes[l]).NilextDirectStats(); taken < 3 || refused < 1 {
		t.Fatalf("leader took %d and refused %d direct updates", taken, refused)
	}
}

// KEFIR.NILEXT BATCH: one reply per update, an error only for the update
// that is wrong; a malformed batch is refused whole.
func TestNilextDirectBatch(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	view := vrOf(g.nodes[l]).Info().View
	ack := fmt.Sprintf("[(integer) %d, (integer) %d, (integer) 1]", view, l+1)
	c := dial(t, g.nodes[l])
	c.expect(`
KEFIR.NILEXT BATCH 3 11 1 sync 1 a 1 12 1 cad 2 b 2 c 3 0 1 sync 1 d 4 => [` + ack + `, ` + ack + `, ERR KEFIR.NILEXT: client id and request number must be non-zero unsigned integers]
KEFIR.NILEXT BATCH 1 11 1 sync 1 a 1 => [` + ack + `]
KEFIR.NILEXT BATCH 2 11 1 sync 1 a 1 => ERR KEFIR.NILEXT BATCH*
KEFIR.NILEXT BATCH 1 11 2 sync 2 a 1 b => ERR KEFIR.NILEXT BATCH*
KEFIR.NILEXT BATCH 1 11 2 sync 1 a 1 extra => ERR KEFIR.NILEXT BATCH*
KEFIR.NILEXT BATCH 0 11 2 sync 1 a 1 => ERR KEFIR.NILEXT BATCH*
KEFIR.NILEXT BATCH 1 13 1 never 1 a 1 => [ERR KEFIR.NILEXT:*
`)
	// Every replica took 11/1 and 12/1 from the batch: a linearizable read
	// sees them once the client holds the acks of all three.
	for i, s := range g.nodes {
		if i != l {
			dial(t, s).do("KEFIR.NILEXT", "BATCH", "2", "11", "1", "sync", "1", "a", "1", "12", "1", "cad", "2", "b", "2", "c", "3")
		}
	}
	dial(t, g.nodes[(l+1)%3]).expect(`
GET a => "1"
MGET b c => ["2", "3"]`)
}
