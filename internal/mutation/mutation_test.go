package mutation

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// gatedPackages are the packages whose mutations and test hooks are gated by
// On, with the ones that live outside a `mutations` struct (a copy a helper
// keeps, a field of the type it breaks).
var gatedPackages = map[string][]string{
	"../kv":          nil,
	"../script":      nil,
	"../vr":          nil,
	"../chain":       nil,
	"../chainmaster": nil,
	"../vrshard":     {"appendUnchecked"},
	"../storage":     nil,
	"../shard":       {"tornMultiReads", "staleHashMeta", "betweenKeys"},
	"../server":      nil,
	"../cluster":     nil,
}

// notMutations are bool fields of a mutations struct that are not bugs but a
// test's choice among real behaviours, kept in both builds: storage's fill
// mode override picks one of the engine's real fill modes.
var notMutations = []string{"setFill"}

// mutationFields returns the fields of the package's mutations structs (any
// struct type whose name ends in "utations") that are mutations (bools) or
// test hooks (funcs, delays).
func mutationFields(files []*ast.File) map[string]bool {
	fields := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !strings.HasSuffix(ts.Name.Name, "utations") {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fl := range st.Fields.List {
				hook := false
				switch t := fl.Type.(type) {
				case *ast.Ident:
					hook = t.Name == "bool"
				case *ast.FuncType:
					hook = true
				case *ast.SelectorExpr:
					// time.Duration (a delay hook); atomic.Bool (internal/server's
					// mutations, flipped while other tests' event loops read them).
					hook = t.Sel.Name == "Duration" || t.Sel.Name == "Bool"
				}
				for _, name := range fl.Names {
					if hook && !slices.Contains(notMutations, name.Name) {
						fields[name.Name] = true
					}
				}
			}
			return false
		})
	}
	return fields
}

// isMut reports whether e is `mut` or `<anything>.mut`.
func isMut(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name == "mut"
	case *ast.SelectorExpr:
		return x.Sel.Name == "mut"
	}
	return false
}

func isOn(e ast.Expr) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := s.X.(*ast.Ident)
	return ok && id.Name == "mutation" && s.Sel.Name == "On"
}

// leftmost returns the leftmost operand of a chain of &&.
func leftmost(e ast.Expr) ast.Expr {
	for {
		switch x := e.(type) {
		case *ast.BinaryExpr:
			if x.Op != token.LAND {
				return e
			}
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		default:
			return e
		}
	}
}

// ungated returns the positions of reads of mutations and hooks in files
// that are neither the right operand of `mutation.On && …` nor inside an if
// statement (its init, condition or then-branch) whose condition is
// `mutation.On && …` or `mutation.On`. Writes (assignment targets) are
// allowed: only tests set them, and a write decides nothing.
func ungated(fset *token.FileSet, files []*ast.File, extra []string) []string {
	fields := mutationFields(files)
	var out []string
	for _, f := range files {
		var stack []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			defer func() { stack = append(stack, n) }()
			sel, ok := n.(*ast.SelectorExpr)
			if !ok || !(fields[sel.Sel.Name] && isMut(sel.X) || slices.Contains(extra, sel.Sel.Name)) {
				return true
			}
			// The read is the selector, or for an atomic mutation the
			// call of its Load method: `mutation.On && mut.f.Load()`.
			read, up := ast.Expr(sel), len(stack)
			if up >= 2 {
				if ld, ok := stack[up-1].(*ast.SelectorExpr); ok && ld.X == ast.Expr(sel) && ld.Sel.Name == "Store" {
					return true // a write, as an assignment is
				}
				if ld, ok := stack[up-1].(*ast.SelectorExpr); ok && ld.X == ast.Expr(sel) && ld.Sel.Name == "Load" {
					if call, ok := stack[up-2].(*ast.CallExpr); ok && call.Fun == ast.Expr(ld) {
						read, up = call, up-2
					}
				}
			}
			if up > 0 {
				switch p := stack[up-1].(type) {
				case *ast.AssignStmt:
					if slices.Contains(p.Lhs, read) {
						return true
					}
				case *ast.BinaryExpr:
					if p.Op == token.LAND && p.Y == read && isOn(p.X) {
						return true
					}
				}
			}
			for i := len(stack) - 1; i >= 0; i-- {
				ifs, ok := stack[i].(*ast.IfStmt)
				if !ok || !isOn(leftmost(ifs.Cond)) {
					continue
				}
				child := ast.Node(sel)
				if i+1 < len(stack) {
					child = stack[i+1]
				}
				if child != ifs.Else {
					return true
				}
			}
			out = append(out, fset.Position(sel.Pos()).String())
			return true
		})
	}
	return out
}

func parseDir(t *testing.T, dir string) (*token.FileSet, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fset, files
}

// TestEveryMutationReadIsGated: in the production code of the gated
// packages, every read of a mutation is guarded by On, so the default build
// compiles every mutation path away.
func TestEveryMutationReadIsGated(t *testing.T) {
	for dir, extra := range gatedPackages {
		fset, files := parseDir(t, dir)
		if len(mutationFields(files))+len(extra) == 0 {
			t.Fatalf("%s: no mutations found: the test has lost track of them", dir)
		}
		if bad := ungated(fset, files, extra); len(bad) > 0 {
			t.Errorf("%s: mutation reads not guarded by mutation.On (write them `mutation.On && x.mut.f`):\n%s", dir, strings.Join(bad, "\n"))
		}
	}
}

// TestUngatedMutationReadIsCaught: the check above fails on a read without
// the guard, on one whose guard is not mutation.On, on one guarded on the
// wrong side, on a hook read outside a guarded if, on one in the else
// branch of one and on an atomic mutation's ungated Load; it accepts the
// guarded forms and writes (assignments, an atomic's Store).
func TestUngatedMutationReadIsCaught(t *testing.T) {
	const src = `package p

type mutations struct {
	broken bool
	hook   func()
}

type R struct{ mut mutations; on bool }

func (r *R) f() {
	if r.mut.broken { // ungated
	}
	if r.on && r.mut.broken { // ungated: not mutation.On
	}
	if r.mut.broken && mutation.On { // ungated: wrong side
	}
	if mutation.On && r.mut.broken { // gated
	}
	if !(mutation.On && r.mut.broken) { // gated
	}
	r.mut.broken = true // a write
	if h := r.mut.hook; h != nil { // ungated hook
	}
	if h := r.mut.hook; mutation.On && h != nil { // gated hook
	}
	if mutation.On {
		_ = r.mut.hook // gated
	} else {
		_ = r.mut.hook // ungated: the else branch
	}
}

type atomicMutations struct{ flipped atomic.Bool }

var mut atomicMutations

func g() {
	if mut.flipped.Load() { // ungated atomic
	}
	if mutation.On && mut.flipped.Load() { // gated atomic
	}
	_ = !(mutation.On && mut.flipped.Load()) // gated atomic
	mut.flipped.Store(true) // a write (a method call, not a read)
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	bad := ungated(fset, []*ast.File{f}, nil)
	var lines []string
	for _, b := range bad {
		lines = append(lines, strings.Split(b, ":")[1])
	}
	if want := []string{"11", "13", "15", "22", "29", "38"}; !slices.Equal(lines, want) {
		t.Fatalf("flagged %v, want lines %v", bad, want)
	}
}

// TestOnIsTheBuildTag: On says which build this is (the Makefile and .ci/run
// run the tests with -tags mutations, the binaries are built without).
func TestOnIsTheBuildTag(t *testing.T) {
	t.Logf("mutation.On = %v", On)
	skipped := false
	Require(skipRecorder{&skipped})
	if skipped == On {
		t.Fatalf("Require skipped = %v with On = %v", skipped, On)
	}
}

type skipRecorder struct{ skipped *bool }

func (skipRecorder) Helper()            {}
func (s skipRecorder) Skip(args ...any) { *s.skipped = true }
