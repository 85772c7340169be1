// Package purity checks that a deterministic protocol core stays pure: no
// goroutines, no clock, no randomness and no I/O, in the core package and in
// every package of this module it imports. The simulator can replay a core
// only because of this, so the rule is enforced by a test (purity_test.go)
// rather than by review; pebble's lint tests are the model.
//
// It reads source with go/parser only, so the test needs no toolchain beyond
// the Go standard library. It is test support: nothing in a production binary
// imports it, and it imports nothing of Kefir.
package purity

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ForbiddenImports are the standard packages a core must not import directly.
// fmt, errors, time (for time.Duration) and the like are allowed; which of
// their functions may be called is checked separately (forbiddenCalls).
var ForbiddenImports = map[string]string{
	"net":           "network I/O",
	"net/http":      "network I/O",
	"os":            "files, processes and the environment",
	"os/exec":       "processes",
	"os/signal":     "signals",
	"io/fs":         "files",
	"io/ioutil":     "files",
	"syscall":       "system calls",
	"sync":          "locks imply goroutines; a core is driven by one caller",
	"sync/atomic":   "atomics imply goroutines; a core is driven by one caller",
	"math/rand":     "randomness (the simulator must choose every random value)",
	"math/rand/v2":  "randomness (the simulator must choose every random value)",
	"crypto/rand":   "randomness (the simulator must choose every random value)",
	"log":           "output belongs to the driver",
	"log/slog":      "output belongs to the driver",
	"runtime":       "scheduling and process state",
	"unsafe":        "no reason in a protocol core",
	"context":       "cancellation is the driver's; a core has no blocking calls",
	"os/user":       "the environment",
	"path/filepath": "files",
}

// forbiddenCalls are package-level functions that read a clock, sleep, start
// timers or write to the process's output.
var forbiddenCalls = map[string]map[string]string{
	"time": {
		"Now": "reads the clock", "Since": "reads the clock", "Until": "reads the clock",
		"Sleep": "sleeps", "After": "starts a timer", "AfterFunc": "starts a timer",
		"NewTimer": "starts a timer", "NewTicker": "starts a timer", "Tick": "starts a timer",
	},
	"fmt": {
		"Print": "writes to stdout", "Printf": "writes to stdout", "Println": "writes to stdout",
		"Scan": "reads stdin", "Scanf": "reads stdin", "Scanln": "reads stdin",
	},
}

// Violation is one rule a package breaks, at a source position.
type Violation struct {
	Pos  token.Position
	What string
}

func (v Violation) String() string { return fmt.Sprintf("%s: %s", v.Pos, v.What) }

// Check parses the non-test Go files of the package in dir and, recursively,
// of every package under modulePath it imports (found below moduleRoot), and
// returns every violation: a forbidden import, a go statement, a select
// statement, or a call of a forbidden function.
func Check(moduleRoot, modulePath, dir string) ([]Violation, error) {
	vs, _, err := walk(moduleRoot, modulePath, dir)
	return vs, err
}

// Deps returns the packages under modulePath that the package in dir
// imports, directly or through others, by their non-test files (sorted
// import paths). Unlike `go list -deps` it sees every file whatever its
// build tags, so a dependency one platform's or tag's build has counts.
func Deps(moduleRoot, modulePath, dir string) ([]string, error) {
	_, deps, err := walk(moduleRoot, modulePath, dir)
	return deps, err
}

// walk visits the package in dir and every package of modulePath it
// imports, and returns their violations and the import paths it visited
// (dir's own excluded).
func walk(moduleRoot, modulePath, dir string) ([]Violation, []string, error) {
	seen := map[string]bool{}
	var out []Violation
	var deps []string
	var visit func(dir string) error
	visit = func(dir string) error {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		if seen[abs] {
			return nil
		}
		seen[abs] = true
		vs, internal, err := checkDir(abs, modulePath)
		if err != nil {
			return err
		}
		out = append(out, vs...)
		for _, imp := range internal {
			rel := strings.TrimPrefix(strings.TrimPrefix(imp, modulePath), "/")
			sub := filepath.Join(moduleRoot, filepath.FromSlash(rel))
			if a, err := filepath.Abs(sub); err == nil && !seen[a] {
				deps = append(deps, imp)
			}
			if err := visit(sub); err != nil {
				return err
			}
		}
		return nil
	}
	if err := visit(dir); err != nil {
		return nil, nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	sort.Strings(deps)
	return out, deps, nil
}

// checkDir checks one package directory; it returns its violations and the
// imports of it that belong to modulePath.
func checkDir(dir, modulePath string) ([]Violation, []string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("purity: read package %s: %w", dir, err)
	}
	fset := token.NewFileSet()
	var out []Violation
	internal := map[string]bool{}
	files := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, fmt.Errorf("purity: %w", err)
		}
		files++
		aliases := map[string]string{} // local name -> import path, for the call checks
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if why, bad := ForbiddenImports[path]; bad {
				out = append(out, Violation{fset.Position(imp.Pos()), fmt.Sprintf("imports %q (%s)", path, why)})
			}
			if path == modulePath || strings.HasPrefix(path, modulePath+"/") {
				internal[path] = true
			}
			local := path[strings.LastIndex(path, "/")+1:]
			if imp.Name != nil {
				local = imp.Name.Name
			}
			aliases[local] = path
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				out = append(out, Violation{fset.Position(n.Pos()), "starts a goroutine"})
			case *ast.SelectStmt:
				out = append(out, Violation{fset.Position(n.Pos()), "waits in a select (a core never blocks)"})
			case *ast.SelectorExpr:
				id, ok := n.X.(*ast.Ident)
				if !ok {
					break
				}
				if why, bad := forbiddenCalls[aliases[id.Name]][n.Sel.Name]; bad {
					out = append(out, Violation{fset.Position(n.Pos()), fmt.Sprintf("uses %s.%s (%s)", aliases[id.Name], n.Sel.Name, why)})
				}
			}
			return true
		})
	}
	if files == 0 {
		return nil, nil, fmt.Errorf("purity: no Go files in %s", dir)
	}
	keys := make([]string, 0, len(internal))
	for k := range internal {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return out, keys, nil
}
