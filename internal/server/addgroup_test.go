package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// A new group is bootstrapped once per member: only by a member the map
// names in a data group still at its first configuration (member epoch 0;
// never the metadata group, never a reconfigured group, whose new members
// pull), and only at the replica's first open — a record of a created
// replica that says it bootstrapped (its vr/ lost since), or whose vr/
// directory exists (a restart), opens without Bootstrap, as does a record
// of a replica that joined.
func TestNewGroupBootstrapsOnlyAtItsFirstOpen(t *testing.T) {
	for _, tc := range []struct {
		g    kv.MapGroup
		want bool
	}{
		{kv.MapGroup{ID: 3, Members: []uint64{4, 5, 6}}, true},
		{kv.MapGroup{ID: 3, Members: []uint64{4, 5, 7}, MemberEpoch: 1}, false},
		{kv.MapGroup{ID: uint64(cluster.MetaGroupID), Members: []uint64{1, 2, 3}}, false},
	} {
		if got := created(tc.g); got != tc.want {
			t.Errorf("created(%+v) = %v, want %v", tc.g, got, tc.want)
		}
	}
	s := &Server{cfg: Config{DataDir: t.TempDir()}}
	dir := groupDir(s.cfg.DataDir, 3)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	made := joinRecord{Created: true}
	if !s.firstOpen(made, dir) {
		t.Fatal("a created group's first open does not bootstrap")
	}
	if s.firstOpen(joinRecord{}, dir) {
		t.Fatal("a joined group's replica bootstraps")
	}
	if s.firstOpen(joinRecord{Created: true, Opened: true}, dir) {
		t.Fatal("a created group's replica bootstraps again after its record says it did (its vr/ lost)")
	}
	if err := os.MkdirAll(filepath.Join(dir, "vr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if s.firstOpen(made, dir) {
		t.Fatal("a created group's replica bootstraps again once its vr/ exists (a restart)")
	}
}
