package transport

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/purity"
)

// TestNoEngineImports: the transport moves opaque, group-addressed frames
// for every engine a node hosts, so neither it nor the frame package may
// know an engine (internal/vr, internal/wire) or a driver: of this module
// the transport reaches internal/frame only, and internal/frame nothing.
// Test files may use VR's codec as a payload. purity.Deps reads the
// non-test files' imports, and the imports' own, whatever their build tags.
func TestNoEngineImports(t *testing.T) {
	const module = "github.com/kefirdb/kefir"
	root := filepath.Join("..", "..")
	allowed := map[string][]string{
		"internal/transport": {module + "/internal/frame"},
		"internal/frame":     nil,
	}
	for dir, ok := range allowed {
		deps, err := purity.Deps(root, module, filepath.Join(root, dir))
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, p := range deps {
			if !slices.Contains(ok, p) {
				t.Errorf("%s reaches %s: the peer transport must stay engine-neutral", dir, p)
			}
		}
	}
}
