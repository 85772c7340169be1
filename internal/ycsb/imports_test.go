package ycsb

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The workloads, runner and generators must not depend on what they measure: Kefir is
// one DB among several (its driver is kefirdb, beside the peers' drivers in bench/).
func TestImportsNoKefirPackage(t *testing.T) {
	for _, dir := range []string{".", "gen"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v (%d files)", dir, err, len(files))
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range af.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				if strings.HasPrefix(p, "github.com/kefirdb/kefir/") && p != "github.com/kefirdb/kefir/internal/ycsb/gen" {
					t.Errorf("%s imports %s", f, p)
				}
			}
		}
	}
}
