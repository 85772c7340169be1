package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// A failed node's replicas re-created on the nodes the cluster has
// (issue 28: "its replicas are re-created on other nodes from the
// surviving members"; docs/cluster.md, "Replacing a failed node"): a
// 4-node cluster of two groups under a checked workload, node 4 (a member
// of both, group 2's first leader) SIGKILLed, and `kefir cluster
// replace-node --old 4` with no new node: each group takes the live node
// of the map not in it — group 1 [1 2 4] node 3, group 2 [4 3 1] node 2 —
// which pulls the group's state while it serves its other groups. Every
// acknowledged write reads back at every node, writes go on in both groups
// after the change, the history is linearizable, and a rerun changes
// nothing.
func TestGroupsReplaceAFailedNodeOnTheClustersNodes(t *testing.T) {
	g := cluster.StartGroups(t, 4, node4Groups)
	g.WaitLeaders(20 * time.Second)
	l := startNode4Load(t, g, "p")
	g.Nodes[3].Kill()

	addr := "--addr=" + g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr
	out, err := kefirCluster(t, "replace-node", addr, "--old", "4")
	if err != nil {
		t.Fatalf("replace-node --old 4: %v\n%s", err, out)
	}
	t.Logf("replace-node --old 4:\n%s", strings.TrimSpace(out))
	for _, w := range []string{"placing node 4's replica of group 1 on node 3", "placing node 4's replica of group 2 on node 2", "group 1 is at epoch 1", "group 2 is at epoch 1"} {
		if !strings.Contains(out, w) {
			t.Fatalf("replace-node --old 4 did not say %q:\n%s", w, out)
		}
	}
	cm := l.checkReplaced(t, g, 20*time.Second)
	e1 := cm.Epoch
	if out, err := kefirCluster(t, "replace-node", addr, "--old", "4"); err != nil || !strings.Contains(out, "nothing left to do") {
		t.Fatalf("replace-node --old 4 again: %v\n%s", err, out)
	}
	if cm := localMap(g.Nodes[0].ClientAddr); cm == nil || cm.Epoch != e1 {
		t.Fatalf("a rerun moved the map from epoch %d: %+v", e1, cm)
	}
}

// node4Load is a checked workload on node4Groups' cluster at its nodes
// 1-3 (live), counting the writes acknowledged in each group after cut.
type node4Load struct {
	live     []string
	load     *groupLoad
	cut      atomic.Bool
	afterCut [2]atomic.Int64
}

// startNode4Load starts it on keys of both groups (prefix) and lets it run
// half a second.
func startNode4Load(t *testing.T, g *cluster.Groups, prefix string) *node4Load {
	l := &node4Load{live: g.Addrs()[:3]}
	l.load = startGroupLoad(t, l.live, keysOfTwoGroups(prefix), func(k string) {
		if l.cut.Load() {
			l.afterCut[min(kv.KeySlot([]byte(k))/8192, 1)].Add(1)
		}
	})
	time.Sleep(500 * time.Millisecond)
	return l
}

// checkReplaced checks the cluster once node 4's replicas went to the
// other nodes (replace-node --old 4, or the repairer): from now on, each
// group is at epoch 1 with members {1, 2, 3} at every live node (within
// wait) and in node 1's map, writes are acknowledged in both groups, every
// acknowledged write reads back at every live node, and the history is
// linearizable. It stops the load and returns node 1's map.
func (l *node4Load) checkReplaced(t *testing.T, g *cluster.Groups, wait time.Duration) *kv.ClusterMap {
	live, load, afterCut := l.live, l.load, &l.afterCut
	t.Helper()
	var err error
	l.cut.Store(true)
	want := map[int][]uint64{1: {1, 2, 3}, 2: {1, 2, 3}}
	for gi := 1; gi <= 2; gi++ {
		for _, n := range g.Nodes[:3] {
			var c kcluster.GroupConfig
			if !testgroup.Until(wait, 50*time.Millisecond, func() bool {
				c, err = groupConfigOf(t, n.ClientAddr, gi)
				return err == nil && c.Epoch == 1
			}) || !slices.Equal(sortedIDs(c.Members), want[gi]) {
				t.Fatalf("%s's view of group %d: %s %v\n%s", n.ClientAddr, gi, c, err, n.Logs())
			}
		}
	}
	// Node 1's replica of the metadata group may be a follower a commit
	// behind the leader that recorded the change (after a view change
	// under load): waited for, not read once.
	var cm *kv.ClusterMap
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
		cm = localMap(g.Nodes[0].ClientAddr)
		if cm == nil {
			return false
		}
		for gi := uint64(1); gi <= 2; gi++ {
			if mg, ok := cm.Group(gi); !ok || !slices.Equal(sortedIDs(mg.Members), want[int(gi)]) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("node 1's map does not name groups 1 and 2 on %v: %+v", want, cm)
	}
	if !testgroup.Until(15*time.Second, 100*time.Millisecond, func() bool { return afterCut[0].Load() > 0 && afterCut[1].Load() > 0 }) {
		t.Fatalf("writes acknowledged after the replacement: group 1 %d, group 2 %d", afterCut[0].Load(), afterCut[1].Load())
	}
	load.Stop()
	acked := load.Acked()
	t.Logf("%d sync writes acknowledged (%d / %d after the replacement)", len(acked), afterCut[0].Load(), afterCut[1].Load())
	for _, a := range live {
		readBack(t, a, acked)
	}
	load.CheckLinearizable(t)
	return cm
}

// Placement of a new group and of a group's new members (docs/cluster.md,
// "Growing a cluster" and "Growing a group"): five nodes, group 1 on 1-3
// and group 2 on 4, 5, 1 (the metadata group on 1-3); node 4 SIGKILLed.
// `kefir cluster add-group` without --members places group 3 on the live
// nodes hosting the fewest replicas — 5 (one), then 2 and 3 (two each,
// ties to the lower id), never the dead 4, which hosts as few as 5 — its
// members start it, and a rerun takes the group it finds instead of
// placing a second; move-slots gives it 100 slots and it serves their keys.
// `add-members --group 3 --replicas 5` is refused while only node 1 is
// outside it and up (nothing changed); with node 4 back it places nodes 4
// and 1, the group grows to five, node 4 reads back its keys, and a rerun
// has nothing left to do.
func TestGroupsPlaceANewGroupAndItsMembers(t *testing.T) {
	g := cluster.StartGroups(t, 5, "1=1,2,3:0-8191;2=4,5,1:8192-16383")
	g.WaitLeaders(20 * time.Second)
	g.Nodes[3].Kill()
	addr := "--addr=" + g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr
	mapOf := func() *kv.ClusterMap {
		var cm *kv.ClusterMap
		if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { cm = localMap(g.Nodes[0].ClientAddr); return cm != nil }) {
			t.Fatal("node 1 has no map")
		}
		return cm
	}

	out, err := kefirCluster(t, "add-group", addr)
	if err != nil {
		t.Fatalf("add-group: %v\n%s", err, out)
	}
	t.Logf("add-group:\n%s", strings.TrimSpace(out))
	for _, w := range []string{"placing the new group's 3 replicas on nodes [5 2 3]", "group 3 with members [5 2 3] is in the map", "group 3 is running"} {
		if !strings.Contains(out, w) {
			t.Fatalf("add-group did not say %q:\n%s", w, out)
		}
	}
	e1 := mapOf().Epoch
	if out, err := kefirCluster(t, "add-group", addr); err != nil || !strings.Contains(out, "taken as this command's earlier run") || !strings.Contains(out, "group 3 with members [5 2 3]") {
		t.Fatalf("add-group again: %v\n%s", err, out)
	}
	if e := mapOf().Epoch; e != e1 {
		t.Fatalf("a rerun of add-group moved the map from epoch %d to %d", e1, e)
	}

	if out, err := kefirCluster(t, "move-slots", addr, "--from", "1", "--to", "3", "--slots", "0-99", "--page-pause", "0"); err != nil {
		t.Fatalf("move-slots 0-99 to group 3: %v\n%s", err, out)
	}
	if cm := mapOf(); cm.Owner(0) != 3 || cm.Owner(99) != 3 {
		t.Fatalf("the map after move-slots: %+v", cm)
	}
	c := dialGroup(t, []string{g.Nodes[4].ClientAddr, g.Nodes[1].ClientAddr})
	in3 := putInSlots(t, c, "p3-", "group 3", func(slot uint16) bool { return slot <= 99 })
	readBack(t, g.Nodes[4].ClientAddr, in3)

	e2 := mapOf().Epoch
	out, err = kefirCluster(t, "add-members", addr, "--group", "3", "--replicas", "5")
	if err == nil || !strings.Contains(out, "2 more distinct live nodes not in it") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("add-members --replicas 5 with one node up outside group 3: %v\n%s", err, out)
	}
	if e := mapOf().Epoch; e != e2 {
		t.Fatalf("a refused add-members moved the map from epoch %d to %d", e2, e)
	}
	g.Nodes[3].Start()
	out, err = kefirCluster(t, "add-members", addr, "--group", "3", "--replicas", "5")
	if err != nil || !strings.Contains(out, "placing group 3's new members on nodes [4 1]") || !strings.Contains(out, "group 3 is at epoch 1, members") {
		t.Fatalf("add-members --group 3 --replicas 5: %v\n%s", err, out)
	}
	t.Logf("add-members:\n%s", strings.TrimSpace(out))
	// Node 4 opens its replica once its map names it there (a poll).
	var gc kcluster.GroupConfig
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		gc, err = groupConfigOf(t, g.Nodes[3].ClientAddr, 3)
		return err == nil && gc.Epoch == 1
	}) || !slices.Equal(sortedIDs(gc.Members), []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("node 4's view of group 3: %s %v\n%s", gc, err, g.Nodes[3].Logs())
	}
	readBack(t, g.Nodes[3].ClientAddr, in3)
	if out, err := kefirCluster(t, "add-members", addr, "--group", "3", "--replicas", "5"); err != nil || !strings.Contains(out, "nothing left to do") {
		t.Fatalf("add-members again: %v\n%s", err, out)
	}
}

// Placement and new nodes (docs/cluster.md, "Growing a cluster"): nodes 4
// and 5 started with --join serve once add-node put them in the map, so
// placement chooses them (they host nothing) — until session 32 a joining
// node listened only once a command named it in a group, and placement
// never could. Node 5 killed: a placed add-group of 5 is refused naming
// it, one of 3 goes on node 4 first and says node 5 was not considered.
func TestGroupsPlacementChoosesNodesThatJoined(t *testing.T) {
	g := cluster.StartGroups(t, 3, "1=1,2,3:0-8191;2=2,3,1:8192-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()
	addr := "--addr=" + live[1]
	var news []*cluster.Node
	for id := 4; id <= 5; id++ {
		n := cluster.NewNode(t, "n"+strconv.Itoa(id))
		n.Args = []string{"--replica-id", strconv.Itoa(id), "--join", live[0] + "," + live[1], "--cluster-secret", "e2e-groups-secret"}
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n.Logs(), "does not name node") }) {
			t.Fatalf("%s did not wait to be named:\n%s", n.ID, n.Logs())
		}
		if out, err := kefirCluster(t, "add-node", addr, "--id", strconv.Itoa(id), "--client-addr", n.ClientAddr, "--peer-addr", n.PeerAddr); err != nil {
			t.Fatalf("add-node %d: %v\n%s", id, err, out)
		}
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("%s in the map does not serve: %v\n%s", n.ID, err, n.Logs())
		}
		news = append(news, n)
	}
	news[1].Kill()
	const silent = "nodes [5] host no replica and do not answer"
	out, err := kefirCluster(t, "add-group", addr, "--replicas", "5", "--wait", "0")
	if err == nil || !strings.Contains(out, silent) || !strings.Contains(out, "nothing changed") {
		t.Fatalf("add-group --replicas 5 with node 5 down: %v\n%s", err, out)
	}
	out, err = kefirCluster(t, "add-group", addr)
	if err != nil || !strings.Contains(out, "placing the new group's 3 replicas on nodes [4 1 2]") || !strings.Contains(out, silent) {
		t.Fatalf("add-group with node 4 joined and node 5 down: %v\n%s", err, out)
	}
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(news[0].Logs(), "group=3") }) {
		t.Fatalf("node 4 did not open group 3:\n%s", news[0].Logs())
	}
}

// putInSlots writes 20 keys named prefix+i whose slots in accepts, each
// acknowledged durable (sync), through c, and returns them with their
// values (what names the slots' owner in a failure).
func putInSlots(t *testing.T, c *client.Client, prefix, what string, in func(slot uint16) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; len(out) < 20; i++ {
		k := prefix + strconv.Itoa(i)
		if !in(kv.KeySlot([]byte(k))) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := c.Put(ctx, k, []byte("v"+k), client.WithDurability(client.Sync))
		cancel()
		if err != nil {
			t.Fatalf("a write to %s (key %s): %v", what, k, err)
		}
		out[k] = "v" + k
	}
	return out
}

// A node that hosts nothing leaves the cluster: kefir cluster remove-node
// takes node 4 (joined, in the map, in no group) out of the map; the node,
// seeing a map without itself, records its retirement and exits; a
// restart refuses; status no longer lists it; a rerun says it is not a
// node of the map.
func TestGroupsRemoveAnEmptyNode(t *testing.T) {
	g := cluster.StartGroups(t, 3, "1=1,2,3:0-8191;2=2,3,1:8192-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()
	addr := "--addr=" + live[1]
	n4 := cluster.NewNode(t, "n4")
	n4.Args = []string{"--replica-id", "4", "--join", live[0] + "," + live[1], "--cluster-secret", "e2e-groups-secret"}
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n4.Logs(), "does not name node") }) {
		t.Fatalf("node 4 did not wait to be named:\n%s", n4.Logs())
	}
	if out, err := kefirCluster(t, "add-node", addr, "--id", "4", "--client-addr", n4.ClientAddr, "--peer-addr", n4.PeerAddr); err != nil {
		t.Fatalf("add-node 4: %v\n%s", err, out)
	}
	if err := n4.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("node 4 in the map does not serve: %v\n%s", err, n4.Logs())
	}
	// Node 1 hosts replicas (and the metadata group's): refused.
	if out, err := kefirCluster(t, "remove-node", addr, "--id", "1"); err == nil {
		t.Fatalf("remove-node of node 1 (groups 1 and 2 of three) succeeded:\n%s", out)
	}
	out, err := kefirCluster(t, "remove-node", addr, "--id", "4")
	if err != nil || !strings.Contains(out, "node 4 is out of the map at epoch") {
		t.Fatalf("remove-node of the empty node 4: %v\n%s", err, out)
	}
	n4.Wait(20 * time.Second)
	if !strings.Contains(n4.Logs(), "taken out of the cluster map") {
		t.Fatalf("node 4 does not say why it stopped:\n%s", n4.Logs())
	}
	if b, err := os.ReadFile(filepath.Join(n4.Dir, "kefir-retired.json")); err != nil || !strings.Contains(string(b), "left_map_at_epoch") {
		t.Fatalf("node 4's retirement record: %v %s", err, b)
	}
	if out, err := kefirCluster(t, "status", addr); err != nil || strings.Contains(out, "client "+n4.ClientAddr) {
		t.Fatalf("status after the removal lists node 4: %v\n%s", err, out)
	}
	if out, err := kefirCluster(t, "remove-node", addr, "--id", "4"); err == nil || !strings.Contains(out, "node 4 is not a node of the cluster map") {
		t.Fatalf("remove-node 4 again: %v\n%s", err, out)
	}
	n4.Args = []string{"--replica-id", "4", "--cluster-secret", "e2e-groups-secret"}
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	n4.Wait(20 * time.Second)
	if !strings.Contains(n4.Logs(), "refusing to start") {
		t.Fatalf("node 4 restarted after leaving the map:\n%s", n4.Logs())
	}
}
