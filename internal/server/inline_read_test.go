//go:build linux

package server

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
)

// A leader's event loop serves reads that need not wait (readInline) in
// the loop, in pipeline order with the writes that go to a goroutine, and
// leaves a read of an acknowledged cad write that is not yet readable to
// the goroutine path, which waits for it: the read never returns the value
// from before the write.
func TestLeaderServesReadsOnTheLoop(t *testing.T) {
	useIOModel(t, IOEpoll)
	g := startGroupWith(t, func(c *Config) { c.Durability = level.CAD })
	l := g.leader(t)
	lc := dial(t, g.nodes[l])
	// c and d are written sync (durable when acknowledged) and never again:
	// reads of them never wait.
	lc.expect(`
KEFIR.CALL DURABILITY sync CMD SET c 1 => OK
KEFIR.CALL DURABILITY sync CMD SET d 1 => OK
GET c => "1"
`)
	before := g.nodes[l].inlineReads.Load()
	// Reads first (the loop), then a cad write (a goroutine), then reads
	// of what it wrote: replies in order, each read seeing the write before
	// it.
	script := [][]string{
		{"GET", "c"}, {"MGET", "c", "d"}, {"EXISTS", "c", "zz"}, {"KEFIR.CALL", "CONSISTENCY", "linearizable", "CMD", "GET", "d"},
		{"SET", "a", "2"}, {"GET", "a"}, {"STRLEN", "d"}, {"SET", "a", "3"}, {"GET", "a"},
	}
	want := []string{`"1"`, `["1", "1"]`, "(integer) 1", `"1"`, "OK", `"2"`, "(integer) 1", "OK", `"3"`}
	for range 20 {
		for _, args := range script {
			lc.send(args...)
		}
		for i, w := range want {
			if got := lc.reply(); got != w {
				t.Fatalf("pipeline reply %d (%v): got %s, want %s", i, script[i], got, w)
			}
		}
	}
	if n := g.nodes[l].inlineReads.Load() - before; n < 20*4 {
		t.Fatalf("%d reads ran on the leader's loop, want at least %d (the four reads before each write)", n, 20*4)
	}
	// The lease reads are visible to operators.
	for _, name := range []string{"kefir_vr_local_lease_reads_total", "kefir_vr_lease_reads_total"} {
		if metricValue(t, g.nodes[l], name) == 0 {
			t.Fatalf("/metrics: %s missing or zero after %d inline reads", name, g.nodes[l].inlineReads.Load())
		}
	}
	// A cad write acknowledged to one connection is seen by a read on
	// another at once, whether the loop or a goroutine serves it.
	oc := dial(t, g.nodes[l])
	for i := range 200 {
		v := string(rune('a' + i%26))
		lc.expect(`SET hot ` + v + ` => OK`)
		oc.expect(`GET hot => "` + v + `"`)
	}
}

// A leader's event loop serves a transaction's snapshot reads, ABORT,
// PREPARE, a read-only COMMIT and, under its lease, BEGIN itself
// (txInline) rather than handing each to a worker goroutine, and leaves a
// COMMIT with writes, and a BEGIN it cannot serve at once (a follower's), to
// the worker: the loop's count grows by the commands it served, and the
// snapshot reads still answer the snapshot's values and the transaction's
// own writes.
func TestLeaderServesTxReadsOnTheLoop(t *testing.T) {
	useIOModel(t, IOEpoll)
	g := startGroup(t)
	l := g.leader(t)
	a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
	a.expect(`
SET x abc => OK
KEFIR.TX BEGIN => (integer) 1
`)
	b.expect(`
SET x changed => OK
`)
	before := g.nodes[l].inlineReads.Load()
	a.expect(`
KEFIR.TX GET 1 x => "abc"
KEFIR.TX MGET 1 x nx => ["abc", (nil)]
KEFIR.TX EXISTS 1 x nx => (integer) 1
KEFIR.TX GETRANGE 1 x 1 2 => "bc"
KEFIR.TX GETBIT 1 x 1 => (integer) 1
KEFIR.TX GET 9 x => ERR no such transaction*
KEFIR.TX PREPARE 1 => (nil)
`)
	if n := g.nodes[l].inlineReads.Load() - before; n != 7 {
		t.Fatalf("%d KEFIR.TX commands ran on the leader's loop, want 7 (5 snapshot reads, an unknown handle, a read-only PREPARE)", n)
	}
	// A buffered write and a COMMIT with writes leave the loop; the
	// transaction's read of its own write does not.
	a.expect(`
KEFIR.TX BEGIN => (integer) 2
KEFIR.TX SET 2 y 1 => OK
`)
	before = g.nodes[l].inlineReads.Load()
	a.expect(`
KEFIR.TX GET 2 y => "1"
KEFIR.TX COMMIT 2 => (integer)*
`)
	if n := g.nodes[l].inlineReads.Load() - before; n != 1 {
		t.Fatalf("%d commands ran on the leader's loop, want 1 (the GET, not the COMMIT with writes)", n)
	}
	// BEGIN runs on the loop while the leader's lease runs (as a lease
	// read does): most of 20 do on an unloaded leader.
	before = g.nodes[l].inlineReads.Load()
	for i := range 20 {
		h := strconv.Itoa(3 + i)
		a.expect("KEFIR.TX BEGIN => (integer) " + h + "\nKEFIR.TX GET " + h + " y => \"1\"\nKEFIR.TX ABORT " + h + " => OK")
	}
	if n := g.nodes[l].inlineReads.Load() - before; n < 40+10 {
		t.Fatalf("%d commands ran on the leader's loop, want at least 50 (20 GETs, 20 ABORTs, most of 20 BEGINs)", n)
	}
	// A follower cannot serve BEGIN at once: its worker answers, as before.
	f := (l + 1) % len(g.nodes)
	before = g.nodes[f].inlineReads.Load()
	if got := dial(t, g.nodes[f]).do("KEFIR.TX", "BEGIN"); strings.HasPrefix(got, "(integer)") {
		t.Fatalf("a follower began a transaction: %s", got)
	}
	if n := g.nodes[f].inlineReads.Load() - before; n != 0 {
		t.Fatalf("%d commands ran on the follower's loop, want 0 (its BEGIN waits)", n)
	}
}
