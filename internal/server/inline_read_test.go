//go:build linux

package server

import (
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
