package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A node whose last group is removed from the map (kefir cluster
// remove-group) stays up, empty (docs/cluster.md "Shrinking a cluster";
// docs/design/cluster.md "An empty node"). Nodes 1-3 run group 1 (every
// slot) and the metadata group; node 4's only group is group 2 (no slots),
// which is removed. Node 4 does not retire: it answers PING and CLUSTER
// commands and forwards reads and writes of any slot. Restarted from its
// flags (which still name group 2) it comes back empty and serving, not
// refused. A group added on it (add-group --members 4) starts there, and a
// slot moved to that group is served: the node is a node like any other.
func TestEmptyNodeStaysUp(t *testing.T) {
	cfgs := groupsConfigs(t, 4, []cluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 16383}}},
		{ID: 2, Members: []uint64{4}},
	})
	ms := cfgs[0].Members
	nodes := startConfigs(t, cfgs)
	n4 := func() *Server { return nodes[3] }
	do := func(s *Server, want string, args ...string) {
		t.Helper()
		var got string
		if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
			got = dial(t, s).do(args...)
			return got == want
		}) {
			t.Fatalf("%v at node %d: %s, want %s", args, s.cfg.ReplicaID, got, want)
		}
	}
	do(n4(), "OK", "SET", "a", "1")

	mv := &cluster.Mover{Seeds: []string{ms[0].ClientAddr, ms[1].ClientAddr}, RetryFor: 20 * time.Second, Meta: true, Driver: "TestEmptyNodeStaysUp"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mv.RemoveGroup(ctx, 2, cm.Epoch); err != nil {
		t.Fatal(err)
	}
	tomb := filepath.Join(groupDir(cfgs[3].DataDir, 2), retiredFile)
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		_, err := os.Stat(tomb)
		return err == nil
	}) {
		t.Fatal("node 4 did not retire its replica of the removed group 2")
	}
	time.Sleep(3 * groupsPoll) // a node that retires as a whole does so at once
	if hs := n4().multi.Hosted(); len(hs) != 0 {
		t.Errorf("node 4 still routes to its replica of the removed group: %+v", hs[0].Spec)
	}
	// serves checks that node 4 is up and serving, empty.
	serves := func(phase string) {
		t.Helper()
		select {
		case <-n4().Retired():
			t.Fatalf("%s: node 4 retired as a whole: %v", phase, n4().RetiredErr())
		default:
		}
		if _, err := os.Stat(filepath.Join(cfgs[3].DataDir, retiredFile)); err == nil {
			t.Fatalf("%s: node 4 recorded its retirement", phase)
		}
		do(n4(), "PONG", "PING")
		do(n4(), `"1"`, "GET", "a")
		do(n4(), "OK", "SET", "b", "2")
		do(nodes[0], `"2"`, "GET", "b")
		c := dial(t, n4())
		if got := c.do("CLUSTER", "MYID"); got == "" || strings.HasPrefix(got, "ERR") {
			t.Fatalf("%s: CLUSTER MYID at node 4: %s", phase, got)
		}
		// CLUSTER SLOTS: group 1 has every slot.
		if got := c.do("CLUSTER", "SLOTS"); !strings.HasPrefix(got, "[[(integer) 0, (integer) 16383, [") {
			t.Fatalf("%s: CLUSTER SLOTS at node 4: %s", phase, got)
		}
		if got := c.do("INFO", "replication"); !strings.Contains(got, "vr_status:empty") {
			t.Fatalf("%s: INFO replication at node 4 does not say it is empty: %s", phase, got)
		}
		// The admin port: /status, /metrics, /healthz (ok) and the page.
		for _, path := range []string{"/status", "/metrics", "/healthz", "/"} {
			r, err := http.Get("http://" + n4().HTTPAddr().String() + path)
			if err != nil {
				t.Fatalf("%s: GET %s at node 4: %v", phase, path, err)
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				t.Fatalf("%s: GET %s at node 4: %s %s", phase, path, r.Status, b)
			}
		}
	}
	serves("after the removal")

	// Restarted from its flags, which still name group 2.
	nodes[3].Close()
	nodes[3] = startConfig(t, cfgs[3])
	if len(n4().multi.Hosted()) != 0 {
		t.Fatalf("restarted node 4 hosts %+v", n4().multi.Hosted())
	}
	serves("after a restart")

	// A group added on it (add-group --members 4) starts there and
	// serves the slots moved to it.
	if _, err := mv.AddGroup(ctx, 3, []uint64{4}, kv.EngineVR); err != nil {
		t.Fatal(err)
	}
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return len(groupLeaders(&group{nodes: nodes}, 3)) == 1 }) {
		t.Fatal("node 4 did not start the group added on it")
	}
	k := keyOfGroup(1, "e")
	slot := kv.SlotRange{Start: cluster.Slot([]byte(k)), End: cluster.Slot([]byte(k))}
	if _, err := mv.Move(ctx, 1, 3, []kv.SlotRange{slot}); err != nil {
		t.Fatalf("move slot %d to group 3: %v", slot.Start, err)
	}
	do(nodes[0], "OK", "SET", k, "x")
	do(n4(), `"x"`, "GET", k)
	if st, ok := n4().multi.GroupState(3); !ok || !st.IsLeader {
		t.Fatalf("node 4's replica of group 3: %+v %v", st, ok)
	}
}

// A node whose every group took it out (VR retired each replica; no
// removal) and that hosts no metadata replica retired as a whole, even
// when its own record is missing (a crash between the last group's
// record and the node's, retireReplica): a restart refuses, as before
// empty nodes existed, rather than bringing a replaced node back as an
// empty one that placement would choose first. A node emptied by a
// removal starts empty.
func TestEmptyNodeRestartAfterRetirement(t *testing.T) {
	cfgs := groupsConfigs(t, 4, []cluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 16383}}},
		{ID: 2, Members: []uint64{4}},
	})
	cfg := cfgs[3]
	record := func(removedAt uint64) {
		t.Helper()
		dir := groupDir(cfg.DataDir, 2)
		b, _ := json.Marshal(retiredRecord{Cluster: cfg.ClusterID, Replica: 4, Epoch: 2, Members: []uint64{5}, RemovedAt: removedAt})
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, retiredFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	record(0)
	if s, err := startNode(cfg); !errors.Is(err, ErrRetired) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("node 4, whose only group retired it (no node record): %v, want ErrRetired", err)
	}
	record(7)
	s := startConfig(t, cfg)
	if len(s.multi.Hosted()) != 0 || !s.emptiedByRemoval {
		t.Fatalf("node 4, whose only group was removed: hosts %+v, emptied by removal %v", s.multi.Hosted(), s.emptiedByRemoval)
	}
}

// An empty node's metadata replica retires: the node retires as a whole
// if no removal emptied it (its last data replica VR-retired before a
// restart that opened it with its metadata replica only), and stays up if
// one did.
func TestEmptyNodeMetaRetires(t *testing.T) {
	for _, removal := range []bool{false, true} {
		dir := t.TempDir()
		slots, err := cluster.NewSlotMap(1, []cluster.GroupSpec{{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 16383}}}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := cluster.NewMulti(slots, 4, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{cfg: Config{ReplicaID: 4, ClusterID: 42, DataDir: dir}, log: slog.New(slog.DiscardHandler), multi: m,
			emptiedByRemoval: removal, groups: &groupsState{retired: make(chan struct{})}}
		if err := os.MkdirAll(groupDir(dir, cluster.MetaGroupID), 0o755); err != nil {
			t.Fatal(err)
		}
		lg := cluster.LocalGroup{Spec: cluster.GroupSpec{ID: cluster.MetaGroupID},
			Hosted: cluster.Hosted{Group: retiredGroup{m: cluster.Membership{Epoch: 3, Members: []uint64{1, 2, 3}}}}}
		gone := s.retireMeta(lg)
		_, statErr := os.Stat(filepath.Join(dir, retiredFile))
		if removal && (gone || statErr == nil) {
			t.Errorf("a node emptied by a removal retired as a whole when its metadata replica retired")
		}
		if !removal && (!gone || statErr != nil || !errors.Is(s.RetiredErr(), ErrRetired)) {
			t.Errorf("a node whose groups all retired it stays up once its metadata replica retired too: gone %v, record %v, err %v", gone, statErr, s.RetiredErr())
		}
	}
}

// A node that hosts nothing leaves the cluster only on a map that took it
// out, not on one from before it was added (leftMap). Node 4 joined at map
// epoch 7 (its joinFile's map_epoch). The first map a restarted node polls
// may come from a metadata leader just elected, whose commit point is
// behind node 4's addition, or from one cut off from the others: a map at
// epoch 6 without node 4 must not retire it for good; nor one at epoch 7
// (an addition while a move is in flight keeps the epoch). A map at epoch
// 8 without it does: the removal. A node that saw itself at epoch 9
// ignores a map at 9 without it the same way.
func TestLeftMapOnlyAfterTheNodeWasNamed(t *testing.T) {
	mapAt := func(epoch uint64, ids ...uint64) *kv.ClusterMap {
		cm := &kv.ClusterMap{Epoch: epoch}
		for _, id := range ids {
			cm.Nodes = append(cm.Nodes, kv.MapNode{ID: id})
		}
		return cm
	}
	namedAt := uint64(7) // the joinFile's
	for _, c := range []struct {
		cm   *kv.ClusterMap
		want bool
	}{
		{mapAt(6, 1, 2, 3), false}, // from before node 4 joined
		{mapAt(7, 1, 2, 3), false}, // the same epoch: before its addition too
		{mapAt(8, 1, 2, 3), true},  // taken out
		{&kv.ClusterMap{Epoch: 9}, false},
	} {
		n := namedAt
		if got := leftMap(c.cm, 4, &n); got != c.want {
			t.Errorf("node 4 named at epoch 7, map at epoch %d with nodes %v: left %v, want %v", c.cm.Epoch, c.cm.NodeIDs(), got, c.want)
		}
	}
	n := namedAt
	if leftMap(mapAt(9, 1, 2, 3, 4), 4, &n) || n != 9 {
		t.Fatalf("a map at epoch 9 naming node 4: namedAt %d, want 9", n)
	}
	if leftMap(mapAt(9, 1, 2, 3), 4, &n) || !leftMap(mapAt(10, 1, 2, 3), 4, &n) {
		t.Fatalf("node 4 seen at epoch 9: a map at 9 without it retires it, or one at 10 does not")
	}
}

// A node taken out of the map retires as a whole only once it hosts
// nothing here (leavesMap's two guards): a data replica, or a replica of
// the metadata group, still open keeps it up until that replica retires
// by its own group's change.
func TestLeavesMapOnlyHostingNothing(t *testing.T) {
	out := &kv.ClusterMap{Epoch: 8, Nodes: []kv.MapNode{{ID: 1}, {ID: 2}, {ID: 3}}}
	for _, c := range []struct {
		name      string
		hosted    int
		hostsMeta bool
		want      bool
	}{
		{"a data replica open", 1, false, false},
		{"the metadata replica open", 0, true, false},
		{"both", 2, true, false},
		{"nothing", 0, false, true},
	} {
		n := uint64(7)
		if got := leavesMap(out, 4, &n, c.hosted, c.hostsMeta); got != c.want {
			t.Errorf("node 4 out of the map at epoch 8, %s: leaves %v, want %v", c.name, got, c.want)
		}
	}
	// Named by the map: never, whatever it hosts.
	n := uint64(7)
	if leavesMap(&kv.ClusterMap{Epoch: 8, Nodes: []kv.MapNode{{ID: 4}}}, 4, &n, 0, false) {
		t.Error("node 4 named by the map leaves it")
	}
}

// A chain member retires once its chain is done with it (leftChain): the
// record no longer has it, and the map wants it out (Leaving) or no longer
// has its node — remove-node took the node out after it left the chain,
// and the map's Leaving entry went with it (kv's removeNode), so without
// the second way a member still open then (its node down or slow during
// the change) never retired, and its node, hosting it, never left.
func TestLeftChain(t *testing.T) {
	for _, c := range []struct {
		name     string
		g        kv.MapGroup
		outOfMap bool
		want     bool
	}{
		{"leaving, out of the record", kv.MapGroup{Members: []uint64{1, 3}, Leaving: []uint64{4}}, false, true},
		{"leaving, still a member (draining)", kv.MapGroup{Members: []uint64{1, 4, 3}, Leaving: []uint64{4}}, false, false},
		{"out of the map and the record", kv.MapGroup{Members: []uint64{1, 3}}, true, true},
		{"out of the map, still a member", kv.MapGroup{Members: []uint64{1, 4, 3}}, true, false},
		{"out of the map, joining", kv.MapGroup{Members: []uint64{1, 3}, Joining: []uint64{4}}, true, false},
		{"in the map, out of the record (dropped: may rejoin)", kv.MapGroup{Members: []uint64{1, 3}, Dropped: []uint64{4}}, false, false},
	} {
		c.g.Engine = kv.EngineChain
		if got := leftChain(&c.g, 4, c.outOfMap); got != c.want {
			t.Errorf("%s: node 4 left the chain %v, want %v", c.name, got, c.want)
		}
	}
	if leftChain(&kv.MapGroup{Members: []uint64{1, 3}}, 4, true) {
		t.Error("a VR group's replica retired as a chain member")
	}
}

// A node joining a cluster of groups records the epoch of the map that
// named it in its joinFile, and a restart reads it back: leftMap's floor
// survives the restart.
func TestJoinFileKeepsTheMapEpoch(t *testing.T) {
	dir := t.TempDir()
	b, err := json.Marshal(joinRecord{Cluster: 42, Replica: 4, Members: "1@127.0.0.1:1/127.0.0.1:2,4@127.0.0.1:3/127.0.0.1:4", Groups: "1=1:0-16383", MapEpoch: 7})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, joinFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := PrepareJoin(context.Background(), Config{DataDir: dir, ReplicaID: 4}, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.joinedGroups || cfg.namedAtMapEpoch != 7 {
		t.Fatalf("after a restart: joinedGroups %v, namedAtMapEpoch %d, want true, 7", cfg.joinedGroups, cfg.namedAtMapEpoch)
	}
}
