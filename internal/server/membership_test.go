package server

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/cluster"
)

// A node that joined a group restarts from its data directory's record of
// the configuration it was named in: no --join, no --members needed (stale
// ones are superseded), and another --replica-id is refused.
func TestPrepareJoinFromItsDirectory(t *testing.T) {
	dir := t.TempDir()
	jr := joinRecord{Cluster: 9, Replica: 4, Members: "1@p1:1/c1:1,2@p2:1/c2:1,4@p4:1/c4:1", Epoch: 1, Start: 77, Previous: []uint64{1, 2, 3}}
	b, _ := json.Marshal(jr)
	if err := os.WriteFile(filepath.Join(dir, joinFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	logged := ""
	logf := func(f string, _ ...any) { logged += f }
	stale, _ := ParseMembers("1@p1:1/c1:1,2@p2:1/c2:1,3@p3:1/c3:1")
	cfg, err := PrepareJoin(context.Background(), Config{DataDir: dir, ReplicaID: 4, Members: stale}, logf)
	if err != nil {
		t.Fatal(err)
	}
	want := &cluster.Membership{Epoch: 1, Members: []uint64{1, 2, 4}, Start: 77, Previous: []uint64{1, 2, 3}}
	if cfg.ClusterID != 9 || FormatMembers(cfg.Members) != jr.Members || !reflect.DeepEqual(cfg.Membership, want) {
		t.Fatalf("resolved cluster %d, members %s, membership %+v", cfg.ClusterID, FormatMembers(cfg.Members), cfg.Membership)
	}
	if !strings.Contains(logged, "supersedes --members") {
		t.Fatalf("stale --members not logged as superseded: %q", logged)
	}
	if _, err := PrepareJoin(context.Background(), Config{DataDir: dir, ReplicaID: 5}, logf); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("another --replica-id: %v, want ErrStaleConfig", err)
	}
	// Without a record or --join, nothing changes.
	plain := Config{DataDir: t.TempDir(), ReplicaID: 1, Members: stale}
	if cfg, err := PrepareJoin(context.Background(), plain, logf); err != nil || cfg.Membership != nil || len(cfg.Members) != 3 {
		t.Fatalf("a node without a join: %+v, %v", cfg, err)
	}
}

// --join refuses what a new member must not have, before it asks anyone.
func TestPrepareJoinRefusesBadFlags(t *testing.T) {
	ms, _ := ParseMembers("1@p1:1/c1:1")
	for name, cfg := range map[string]Config{
		"members":   {Join: "127.0.0.1:1", ReplicaID: 4, Members: ms},
		"bootstrap": {Join: "127.0.0.1:1", ReplicaID: 4, Bootstrap: true},
		"no id":     {Join: "127.0.0.1:1"},
	} {
		cfg.DataDir = t.TempDir()
		if _, err := PrepareJoin(context.Background(), cfg, func(string, ...any) {}); err == nil || !strings.Contains(err.Error(), "--join") {
			t.Errorf("%s: %v, want a --join error", name, err)
		}
	}
}

// A directory whose replica retired is refused, by PrepareJoin (kefir
// server) and by New, with the group's new members named.
func TestRetiredDirectoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	b, _ := json.Marshal(retiredRecord{Cluster: 9, Replica: 3, Epoch: 1, Members: []uint64{1, 2, 4}})
	if err := os.WriteFile(filepath.Join(dir, retiredFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PrepareJoin(context.Background(), Config{DataDir: dir}, func(string, ...any) {}); !errors.Is(err, ErrRetired) ||
		!strings.Contains(err.Error(), "members are [1 2 4]") || !strings.Contains(err.Error(), "wipe --dir") {
		t.Fatalf("PrepareJoin: %v", err)
	}
	ms, _ := ParseMembers("1@127.0.0.1:1/127.0.0.1:2,2@127.0.0.1:3/127.0.0.1:4,3@127.0.0.1:5/127.0.0.1:6")
	_, err := New(Config{DataDir: dir, Members: ms, ReplicaID: 3, ClusterID: 9, ClusterSecret: "s", PeerAddr: "127.0.0.1:5",
		OpenReplica: func(cluster.ReplicaSpec) (cluster.Hosted, error) {
			t.Fatal("a retired replica was opened")
			return cluster.Hosted{}, nil
		}})
	if !errors.Is(err, ErrRetired) {
		t.Fatalf("New: %v, want ErrRetired", err)
	}
}
