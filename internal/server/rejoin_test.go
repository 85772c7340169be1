package server

import (
	"testing"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// TestMayRejoin: which map entries take back a closed retired replica.
// Only a later member epoch of a VR data group naming the node; never a
// lagging map (the retirement's epoch or earlier), a removed group, the
// metadata group or a chain.
func TestMayRejoin(t *testing.T) {
	s := &Server{cfg: Config{ReplicaID: 4}}
	retired := retiredRecord{Epoch: 1, Members: []uint64{3, 2, 5}}
	for _, c := range []struct {
		name string
		g    kv.MapGroup
		r    retiredRecord
		want bool
	}{
		{"later epoch names it", kv.MapGroup{ID: 2, Members: []uint64{3, 2, 4}, MemberEpoch: 2}, retired, true},
		{"the retirement's epoch (a lagging map)", kv.MapGroup{ID: 2, Members: []uint64{3, 4, 5}, MemberEpoch: 1}, retired, false},
		{"an earlier epoch", kv.MapGroup{ID: 2, Members: []uint64{3, 4, 5}, MemberEpoch: 0}, retired, false},
		{"later epoch without it", kv.MapGroup{ID: 2, Members: []uint64{3, 2, 1}, MemberEpoch: 2}, retired, false},
		{"a removed group", kv.MapGroup{ID: 2, Members: []uint64{3, 2, 4}, MemberEpoch: 2}, retiredRecord{Epoch: 1, RemovedAt: 7}, false},
		{"the metadata group", kv.MapGroup{ID: uint64(cluster.MetaGroupID), Members: []uint64{3, 2, 4}, MemberEpoch: 2}, retired, false},
		{"a chain", kv.MapGroup{ID: 2, Members: []uint64{3, 2, 4}, MemberEpoch: 2, Engine: kv.EngineChain}, retired, false},
	} {
		if got := s.mayRejoin(&c.g, c.r); got != c.want {
			t.Errorf("%s: mayRejoin = %v, want %v", c.name, got, c.want)
		}
	}
}
