package transport

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestNoEngineImports: the transport moves opaque, group-addressed frames
// for every engine a node hosts, so neither it nor the frame package may
// know an engine (internal/vr, internal/wire) or a driver: of this module
// the transport imports internal/frame only, and internal/frame nothing.
// Test files may use VR's codec as a payload.
func TestNoEngineImports(t *testing.T) {
	const module = "github.com/kefirdb/kefir/"
	allowed := map[string][]string{
		".":         {module + "internal/frame"},
		"../frame/": nil,
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(p, module) && !slices.Contains(ok, p) {
					t.Errorf("%s imports %s: the peer transport must stay engine-neutral", f, p)
				}
			}
		}
	}
}
