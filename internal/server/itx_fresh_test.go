package server

import (
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/transport"
)

// longFreshWait lets a first read wait for a commit in flight while a test
// keeps the leader isolated.
func longFreshWait(t *testing.T) {
	old := txFreshWait
	txFreshWait = 5 * time.Second
	t.Cleanup(func() { txFreshWait = old })
}

// isolate cuts (or heals) the group's node l off from the other members: a
// commit it proposes then stays in flight.
func (g *group) isolate(t *testing.T, l int, on bool) {
	t.Helper()
	r := vrOf(g.nodes[l])
	for i, cfg := range g.cfgs {
		if i != l {
			if err := r.Transport().SetLinkFault(cfg.ReplicaID, transport.Fault{Partition: on}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A transaction's first read of a key a commit in flight at the leader
// writes waits for that commit and reads its result (txRefresh): the
// read-modify-write then commits. Before, it read the state the commit
// replaced, from its start at BEGIN, and its commit aborted.
func TestTxFirstReadWaitsForACommitInFlight(t *testing.T) {
	longFreshWait(t)
	g := startGroup(t)
	l := g.leader(t)
	a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
	a.expect(`SET k 1 => OK`)
	ha := txBegin(t, a, "SERIALIZABLE")
	hb := txBegin(t, b, "SERIALIZABLE")
	a.expect(`
KEFIR.TX GET ` + ha + ` k => "1"
KEFIR.TX SET ` + ha + ` k 2 => OK
`)
	g.isolate(t, l, true)
	a.send("KEFIR.TX", "COMMIT", ha) // proposed; cannot commit while isolated
	time.Sleep(50 * time.Millisecond)
	b.send("KEFIR.TX", "GET", hb, "k")
	time.Sleep(100 * time.Millisecond)
	g.isolate(t, l, false)
	if got := a.reply(); !strings.HasPrefix(got, "(integer)") {
		t.Fatalf("first commit: %s", got)
	}
	if got := b.reply(); got != `"2"` {
		t.Fatalf("the second transaction's first read, behind the first commit: %s, want \"2\" (the commit in flight)", got)
	}
	b.expect(`KEFIR.TX SET ` + hb + ` k 3 => OK`)
	if got := b.do("KEFIR.TX", "COMMIT", hb); !strings.HasPrefix(got, "(integer)") {
		t.Fatalf("second commit: %s; want a commit (its read was of the first's result)", got)
	}
	if got := b.do("GET", "k"); got != `"3"` {
		t.Fatalf("k = %s, want 3", got)
	}
}

// Only the first read may take a new start: a transaction that read x, then
// reads y behind a commit in flight that writes x and y, must see y as of
// its snapshot — the mutation refreshAfterRead reads y from the newer
// state, and the read-only transaction commits a pair no serial order
// shows.
func TestTxRefreshAfterReadCaught(t *testing.T) {
	mutation.Require(t)
	longFreshWait(t)
	run := func() (x, y string) {
		g := startGroup(t)
		l := g.leader(t)
		a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
		a.expect(`MSET x 1 y 1 => OK`)
		ha := txBegin(t, a, "SERIALIZABLE")
		hb := txBegin(t, b, "SERIALIZABLE")
		a.expect(`
KEFIR.TX SET ` + ha + ` x 2 => OK
KEFIR.TX SET ` + ha + ` y 2 => OK
`)
		x = b.do("KEFIR.TX", "GET", hb, "x")
		g.isolate(t, l, true)
		a.send("KEFIR.TX", "COMMIT", ha)
		time.Sleep(50 * time.Millisecond)
		b.send("KEFIR.TX", "GET", hb, "y")
		time.Sleep(100 * time.Millisecond)
		g.isolate(t, l, false)
		a.reply()
		y = b.reply()
		b.expect(`KEFIR.TX COMMIT ` + hb + ` => (integer)*`)
		return x, y
	}
	if x, y := run(); x != y {
		t.Fatalf("read x = %s, y = %s: not one snapshot", x, y)
	}
	itxMut.refreshAfterRead.Store(true)
	defer itxMut.refreshAfterRead.Store(false)
	x, y := run()
	if x == y {
		t.Fatalf("refreshAfterRead not caught: x = %s, y = %s", x, y)
	}
	t.Logf("caught: refreshAfterRead read x = %s, y = %s", x, y)
}

// WATCH of a key an EXEC in flight at the leader writes waits for it and
// observes its result: the optimistic transaction then commits. Before, it
// observed the state the EXEC replaced and its EXEC answered nil.
func TestWatchWaitsForAnExecInFlight(t *testing.T) {
	longFreshWait(t)
	g := startGroup(t)
	l := g.leader(t)
	a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
	a.expect(`
SET k 1 => OK
WATCH k => OK
MULTI => OK
SET k 2 => QUEUED
`)
	g.isolate(t, l, true)
	a.send("EXEC")
	time.Sleep(50 * time.Millisecond)
	b.send("WATCH", "k")
	time.Sleep(100 * time.Millisecond)
	g.isolate(t, l, false)
	if got := a.reply(); got != "[OK]" {
		t.Fatalf("first EXEC: %s", got)
	}
	if got := b.reply(); got != "OK" {
		t.Fatalf("WATCH: %s", got)
	}
	b.expect(`
GET k => "2"
MULTI => OK
SET k 3 => QUEUED
EXEC => [OK]
GET k => "3"
`)
}
