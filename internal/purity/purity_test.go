package purity

import (
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// cores are the deterministic cores of this module — the protocol cores and
// the state machine they order (internal/kv), and the contract between a
// core and its host (internal/core): no goroutines, clocks,
// randomness or I/O, in themselves or in anything of the module they import.
// internal/chain is the chain replication core (issue 30), internal/chainwire
// its message codec (pure as well: the host and the simulator share it).
var cores = []string{"internal/vr", "internal/kv", "internal/core", "internal/chain", "internal/chainwire"}

func moduleRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// frontDoors are the packages that serve clients; engines are what they must
// not reach (issue 26): a protocol core, an engine's host or its peer codec.
// The front door knows a replica through shard.Replica and cluster.Group,
// and the binary wires the engine in.
var (
	frontDoors = []string{"internal/server", "internal/cluster"}
	engines    = []string{
		"github.com/kefirdb/kefir/internal/vr",
		"github.com/kefirdb/kefir/internal/vrshard",
		"github.com/kefirdb/kefir/internal/wire",
		"github.com/kefirdb/kefir/internal/chain",
		"github.com/kefirdb/kefir/internal/chainwire",
	}
)

func TestFrontDoorImportsNoEngine(t *testing.T) {
	root := moduleRoot(t)
	for _, fd := range frontDoors {
		deps, err := Deps(root, "github.com/kefirdb/kefir", filepath.Join(root, fd))
		if err != nil {
			t.Fatal(err)
		}
		if bad := reaches(deps, engines); len(bad) > 0 {
			t.Errorf("%s reaches %v through its imports %v; it must know replicas only through shard.Replica and internal/cluster", fd, bad, deps)
		}
	}
}

// reaches returns the packages of banned that deps holds.
func reaches(deps, banned []string) []string {
	var out []string
	for _, d := range deps {
		if slices.Contains(banned, d) {
			out = append(out, d)
		}
	}
	return out
}

// Deps must see what a package reaches through another: core imports dep.
func TestDepsFindsAnIndirectImport(t *testing.T) {
	deps, err := Deps("testdata/mod", "example.com/m", "testdata/mod/core")
	if err != nil {
		t.Fatal(err)
	}
	if got := reaches(deps, []string{"example.com/m/dep"}); len(got) != 1 {
		t.Fatalf("Deps(core) = %v; want example.com/m/dep", deps)
	}
	if deps, err := Deps("testdata/mod", "example.com/m", "testdata/mod/clean"); err != nil || len(deps) != 0 {
		t.Fatalf("Deps(clean) = %v, %v; want none", deps, err)
	}
}

func TestProtocolCoresArePure(t *testing.T) {
	root := moduleRoot(t)
	for _, c := range cores {
		vs, err := Check(root, "github.com/kefirdb/kefir", filepath.Join(root, c))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			t.Errorf("%s is a deterministic core and must stay pure: %s", c, v)
		}
	}
}

// The check must be able to fail: a package that starts a goroutine, waits in
// a select, reads the clock (under another name), draws a random number and,
// through an import of its own module, touches a file.
func TestCheckFindsEveryKindOfImpurity(t *testing.T) {
	vs, err := Check("testdata/mod", "example.com/m", "testdata/mod/core")
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, v := range vs {
		all = append(all, v.String())
	}
	got := strings.Join(all, "\n")
	for _, want := range []string{
		`core.go:5:2: imports "math/rand"`,
		"core.go:12:2: starts a goroutine",
		"core.go:14:2: waits in a select",
		"core.go:18:6: uses time.Now",
		`dep.go:4:8: imports "os"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing violation %q; got:\n%s", want, got)
		}
	}
	if len(vs) != 5 {
		t.Errorf("got %d violations, want 5:\n%s", len(vs), got)
	}
}

func TestCheckPassesAPurePackage(t *testing.T) {
	vs, err := Check("testdata/mod", "example.com/m", "testdata/mod/clean")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 0 {
		t.Fatalf("violations in a pure package: %v", vs)
	}
	if _, err := Check("testdata/mod", "example.com/m", "testdata/mod/missing"); err == nil {
		t.Fatal("a package that does not exist passed")
	}
}
