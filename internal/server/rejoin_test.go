package server

import (
	"log/slog"
	"os"
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

// retiredGroup is a hosted VR group whose State says retired while its
// durable configuration is m.
type retiredGroup struct {
	cluster.Group
	cluster.Reconfigurable
	m cluster.Membership
}

func (g retiredGroup) State() cluster.State           { return cluster.State{Retired: true} }
func (g retiredGroup) Membership() cluster.Membership { return g.m }

// TestRetireGroupNamedAgain: a replica that a later epoch named again
// between the watcher's look at its State (retired) and retireGroup's read
// of its configuration is a member: it is not recorded retired (the record
// would carry the epoch that names it, which rejoining never passes).
func TestRetireGroupNamedAgain(t *testing.T) {
	dir := t.TempDir()
	s := &Server{cfg: Config{ReplicaID: 4, DataDir: dir}, log: slog.New(slog.DiscardHandler),
		groups: &groupsState{rejoinable: map[cluster.GroupID]retiredReplica{}, logged: map[cluster.GroupID]bool{}}}
	if err := os.MkdirAll(groupDir(dir, 2), 0o755); err != nil {
		t.Fatal(err)
	}
	lg := cluster.LocalGroup{Spec: cluster.GroupSpec{ID: 2, Members: []uint64{3, 4, 5}},
		Hosted: cluster.Hosted{Group: retiredGroup{m: cluster.Membership{Epoch: 3, Members: []uint64{3, 2, 4}}}}}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("retireGroup went on to retire a replica its configuration names: %v", p)
			}
		}()
		if s.retireGroup(lg, 0) {
			t.Error("retireGroup reports the node retired")
		}
	}()
	if _, ok, _ := readRetired(groupDir(dir, 2)); ok {
		t.Error("a replica its group's configuration names at epoch 3 was recorded retired")
	}
	if _, ok := s.groups.rejoinable[2]; ok {
		t.Error("a member was noted as a retired replica")
	}
}
