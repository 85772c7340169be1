package ycsb

import (
	"path/filepath"
	"testing"

	"github.com/kefirdb/kefir/internal/purity"
)

// The workloads, runner and generators must not depend on what they measure: Kefir is
// one DB among several (its driver is kefirdb, beside the peers' drivers in bench/).
// purity.Deps reads the non-test files' imports, and the imports' own.
func TestImportsNoKefirPackage(t *testing.T) {
	const module = "github.com/kefirdb/kefir"
	root := filepath.Join("..", "..")
	for dir, ok := range map[string]string{"internal/ycsb": module + "/internal/ycsb/gen", "internal/ycsb/gen": ""} {
		deps, err := purity.Deps(root, module, filepath.Join(root, dir))
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, p := range deps {
			if p != ok {
				t.Errorf("%s reaches %s", dir, p)
			}
		}
	}
}
