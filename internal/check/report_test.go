package check

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
)

func TestAllSavesAReportThatReplays(t *testing.T) {
	var b hist
	b.put(0, "x", "a", 0, 10, dur(level.Sync))
	b.put(0, "x", "b", 20, 30, dur(level.Sync))
	b.get(1, "x", "a", 40, 50, cons(level.BoundedVersionsLevel(3)))
	b.get(1, "x", "a", 60, 70) // linearizable by default: stale
	b.crash(AllNodes, 80)
	dir := t.TempDir()
	vs := All(b.h, Options{Dir: dir})
	if len(vs) != 6 {
		t.Fatalf("want 6 verdicts, got %d", len(vs))
	}
	names := []string{"linearizable", "session", "cross-client-monotonic", "monotonic-state", "bounded-staleness", "durability"}
	for i, v := range vs {
		if v.Checker != names[i] {
			t.Fatalf("verdict %d is %s, want %s", i, v.Checker, names[i])
		}
	}
	if vs[0].OK || !vs[4].OK {
		t.Fatalf("want linearizability to fail and bounded(3) to pass: %v", vs)
	}
	if Errs(vs) == nil {
		t.Fatal("Errs() = nil for a failing report")
	}
	if _, err := os.Stat(filepath.Join(dir, "lin-x.html")); err != nil {
		t.Fatal(err)
	}
	h, err := LoadJSON(filepath.Join(dir, "history.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, b.h) {
		t.Fatalf("round trip changed the history:\n%+v\n%+v", h, b.h)
	}
	if again := All(h, Options{Lin: LinOptions{NoVisualization: true}}); !reflect.DeepEqual(again[0].Violations, vs[0].Violations) {
		t.Fatal("re-checking the saved history gives a different verdict")
	}
}

// Outcomes counts completed and unknown operations; failed ones are neither.
func TestOutcomesCountsCompletedAndUnknown(t *testing.T) {
	h := History{Ops: []Op{{Outcome: OK}, {Outcome: Unknown}, {Outcome: Failed}, {Outcome: OK}}}
	if ok, unknown := h.Outcomes(); ok != 2 || unknown != 1 {
		t.Fatalf("Outcomes() = %d ok, %d unknown; want 2 and 1", ok, unknown)
	}
}
