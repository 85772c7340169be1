package testgroup

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestUntilReportsWhetherTheConditionHeld(t *testing.T) {
	n := 0
	if !Until(time.Second, time.Millisecond, func() bool { n++; return n == 3 }) {
		t.Fatal("Until gave up on a condition that held on the third poll")
	}
	if n != 3 {
		t.Fatalf("polled %d times after the condition held on the third", n)
	}
	start := time.Now()
	if Until(20*time.Millisecond, time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never held")
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("Until gave up after %v, before its 20ms deadline", d)
	}
}

func TestLeaderPrefersTheHighestView(t *testing.T) {
	views := []uint64{3, 0, 5} // members 0 and 2 call themselves leader
	l, ok := Leader(3, time.Second, time.Millisecond, func(i int) (bool, uint64) { return views[i] > 0, views[i] })
	if !ok || l != 2 {
		t.Fatalf("Leader = %d, %v; want 2 (view 5 beats view 3), true", l, ok)
	}
	if _, ok := Leader(3, 10*time.Millisecond, time.Millisecond, func(int) (bool, uint64) { return false, 0 }); ok {
		t.Fatal("Leader found one in a group where nobody leads")
	}
}

func TestSettledWaitsForAnUnbrokenAgreement(t *testing.T) {
	// The agreement breaks on the third sample: the settle clock restarts.
	n := 0
	start := time.Now()
	var broke time.Time
	l, ok := Settled(time.Second, 30*time.Millisecond, time.Millisecond, func() (int, bool) {
		n++
		if n == 3 {
			broke = time.Now()
			return 0, false
		}
		return 1, true
	})
	if !ok || l != 1 {
		t.Fatalf("Settled = %d, %v; want 1, true", l, ok)
	}
	if d := time.Since(broke); d < 30*time.Millisecond {
		t.Fatalf("settled %v after the agreement broke (started %v ago); want at least 30ms", d, time.Since(start))
	}
	// A leader that keeps changing never settles.
	n = 0
	if _, ok := Settled(50*time.Millisecond, 30*time.Millisecond, time.Millisecond, func() (int, bool) { n++; return n % 2, true }); ok {
		t.Fatal("Settled on a leader that changed at every sample")
	}
}

// The harness is test-only: no non-test file outside this package and the
// test/ tree (the e2e tests' own helper, test/e2e/cluster) imports it: a
// production binary must not carry test machinery.
func TestNoProductionCodeImportsTheHarness(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const self = "github.com/kefirdb/kefir/internal/testgroup"
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if filepath.Dir(path) == filepath.Join(root, "internal", "testgroup") {
			return nil
		}
		if strings.HasPrefix(path, filepath.Join(root, "test")+string(filepath.Separator)) {
			return nil // test/: the e2e tests and their helper, test/e2e/cluster
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == self {
				t.Errorf("%s imports the test-only harness %s", path, self)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s: is the walk looking in the right place?", checked, root)
	}
}
