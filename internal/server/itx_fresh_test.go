package server

import (
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/transport"
)

// longFreshWait lets a first read wait for a commit in flight while a test
// keeps the leader isolated.
func longFreshWait(t *testing.T) {
	old := txFreshWait
	txFreshWait = 5 * time.Second
	t.Cleanup(func() { txFreshWait = old })
}

// startIsolatableGroup is startGroup for the tests that isolate its leader
// (isolate) to keep a commit in flight for a while: a view-change timeout
// of 5 s, so that no view change ends the isolation early on a loaded box
// (the default 300 ms is shorter than two sleeps and a heal stretched by
// load, and a new leader answers the commit "outcome unknown").
func startIsolatableGroup(t *testing.T, mod func(*Config)) *group {
	return startGroupWith(t, func(c *Config) {
		c.ViewChangeTimeout = 5 * time.Second
		if mod != nil {
			mod(c)
		}
	})
}

// isolate cuts (or heals) the group's node l off from the other members: a
// commit it proposes then stays in flight. Start the group with
// startIsolatableGroup.
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
	g := startIsolatableGroup(t, nil)
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
		g := startIsolatableGroup(t, nil)
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
	g := startIsolatableGroup(t, nil)
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

// A node of several groups (--groups) takes a transaction's start at its
// first key, in the key's group (txSlot): the first read there waits for a
// commit in flight at that group's leader first (cluster.Multi's
// TxAwaitWriters, the key's group), then reads its result, and the
// read-modify-write commits. Two groups over the three nodes, each led by a
// different node; the test isolates the leader of the key's group.
func TestTxFirstReadWaitsForACommitInFlightInAClusterOfGroups(t *testing.T) {
	longFreshWait(t)
	key := "{fresh}k"
	slot := cluster.Slot([]byte(key))
	g := startIsolatableGroup(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{2, 3, 1}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
		}
	})
	gid := cluster.GroupID(1)
	if slot >= 8192 {
		gid = 2
	}
	// The key's group's leader, once every node agrees on it.
	l := -1
	if !testgroup.Until(20*time.Second, 10*time.Millisecond, func() bool {
		id, _, ok := g.nodes[0].multi.Leader(gid)
		for _, n := range g.nodes[1:] {
			if o, _, ok2 := n.multi.Leader(gid); !ok || !ok2 || o != id {
				return false
			}
		}
		l = int(id) - 1
		return true
	}) {
		t.Fatalf("group %d has no agreed leader", gid)
	}
	isolate := func(on bool) {
		tr := g.nodes[l].multi.Hosted()[0].Hosted.Transport
		for i, cfg := range g.cfgs {
			if i != l {
				if err := tr.SetLinkFault(cfg.ReplicaID, transport.Fault{Partition: on}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
	a.expect(`SET ` + key + ` 1 => OK`)
	ha := txBegin(t, a, "SERIALIZABLE")
	hb := txBegin(t, b, "SERIALIZABLE")
	a.expect(`
KEFIR.TX GET ` + ha + ` ` + key + ` => "1"
KEFIR.TX SET ` + ha + ` ` + key + ` 2 => OK
`)
	isolate(true)
	a.send("KEFIR.TX", "COMMIT", ha) // proposed; cannot commit while isolated
	time.Sleep(50 * time.Millisecond)
	b.send("KEFIR.TX", "GET", hb, key)
	time.Sleep(100 * time.Millisecond)
	isolate(false)
	if got := a.reply(); !strings.HasPrefix(got, "(integer)") {
		t.Fatalf("first commit: %s", got)
	}
	if got := b.reply(); got != `"2"` {
		t.Fatalf("the second transaction's first read, behind the first commit: %s, want \"2\" (the commit in flight)", got)
	}
	b.expect(`KEFIR.TX SET ` + hb + ` ` + key + ` 3 => OK`)
	if got := b.do("KEFIR.TX", "COMMIT", hb); !strings.HasPrefix(got, "(integer)") {
		t.Fatalf("second commit: %s; want a commit (its read was of the first's result)", got)
	}
	if got := b.do("GET", key); got != `"3"` {
		t.Fatalf("%s = %s, want 3", key, got)
	}
}
