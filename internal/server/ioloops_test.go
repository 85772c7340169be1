package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Config.IOLoops sets the process's event-loop count (New hands it to
// setIOLoops); 0 keeps what is set, and with nothing set the count is one
// loop per two processors. The environment plays no part here: kefir
// server reads KEFIR_IO_LOOPS into the Config.
func TestIOLoopsFromConfig(t *testing.T) {
	old := ioLoops.Load()
	t.Cleanup(func() { ioLoops.Store(old) })
	t.Setenv("KEFIR_IO_LOOPS", "7") // ignored by the package

	ioLoops.Store(0)
	if got := loopCount(); got != defaultIOLoops {
		t.Errorf("unset: %d loops, want the default %d", got, defaultIOLoops)
	}
	cfg := Config{DataDir: t.TempDir(), IOLoops: 3}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := loopCount(); got != 3 {
		t.Errorf("Config.IOLoops 3: %d loops", got)
	}
	setIOLoops(0)
	if got := loopCount(); got != 3 {
		t.Errorf("IOLoops 0 after 3: %d loops, want 3 kept", got)
	}
}

// TestServerReadsNoEnvironment: configuration reaches internal/server through
// Config, not through environment reads deep in the package (issue 26, review
// item 7): kefir server's config loader reads KEFIR_IO_MODEL and
// KEFIR_IO_LOOPS into Config.IOModel and Config.IOLoops. The one exception is
// the Go runtime's own GOMAXPROCS, which the event loops check to see whether
// the processor count was chosen explicitly.
func TestServerReadsNoEnvironment(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range pkgs {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "os" || !slices.Contains([]string{"Getenv", "LookupEnv", "Environ"}, sel.Sel.Name) {
				return true
			}
			if len(call.Args) == 1 {
				if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Value == `"GOMAXPROCS"` {
					return true
				}
			}
			t.Errorf("%s: os.%s in internal/server: take the setting through Config (kefir server's config loader reads the environment)", fset.Position(call.Pos()), sel.Sel.Name)
			return true
		})
	}
}

// In-process servers without a Config.IOModel get the default model whatever
// KEFIR_IO_MODEL says (kefir server passes its resolved value in Config).
func TestIOModelComesFromConfig(t *testing.T) {
	old := CurrentIOModel()
	t.Cleanup(func() { SetIOModel(old) })
	t.Setenv("KEFIR_IO_MODEL", "goroutine") // ignored by the package
	SetIOModel(DefaultIOModel())
	s, err := New(Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if got := CurrentIOModel(); got != DefaultIOModel() {
		t.Errorf("no Config.IOModel: model %s, want the default %s", got, DefaultIOModel())
	}
	s, err = New(Config{DataDir: t.TempDir(), IOModel: IOGoroutine})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if got := CurrentIOModel(); got != IOGoroutine {
		t.Errorf("Config.IOModel goroutine: model %s", got)
	}
}
