package vrshard

import (
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

// The applier's kv.Prober (has: the engine's index, without reading the
// record) answers what its Getter (current) answers for every key, staged
// in the batch or in the engine, deleted, never written, and for an op
// being replayed (current's replay rules). The hash writes ask it of their
// field rows; TestReplayAfterEngineCrashRestoresStateAndResults runs them
// through crashes.
func TestApplierHasAgreesWithCurrent(t *testing.T) {
	db := openMemEngine(t, vfs.NewMem())
	ops := genOps(rand.New(rand.NewPCG(27, 27)), 300)
	a := newApplier(db)
	applyAll(t, a, ops[:250])
	check := func(a *applier, when string) {
		t.Helper()
		keys := []string{"never", "\xff\xffkefir/h/none"}
		for k := range dump(t, db) {
			keys = append(keys, k)
		}
		for k := range a.overlay {
			keys = append(keys, k)
		}
		for _, k := range keys {
			_, _, _, want, err := a.current([]byte(k))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := a.has([]byte(k)); err != nil || got != want {
				t.Errorf("%s: has(%q) = %v, %v; current finds a value: %v", when, k, got, err, want)
			}
		}
	}
	// A batch in progress: staged records in the overlay.
	a.begin()
	for j := 250; j < 260; j++ {
		o := ops[j]
		if _, _, err := a.applyOp(&o.op, uint64(j+1), 1, o.client, o.seq); err != nil {
			t.Fatal(err)
		}
	}
	a.cur = 261
	check(a, "batch")
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	// A replay: a new applier over the engine re-evaluates op 200.
	r := newApplier(db)
	r.cur = 200
	check(r, "replay")
}
