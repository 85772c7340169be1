package e2e

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	keys := keysOfTwoGroups("p")
	live := g.Addrs()[:3]
	var cut atomic.Bool
	var afterCut [2]atomic.Int64
	load := startGroupLoad(t, live, keys, func(k string) {
		if cut.Load() {
			afterCut[min(kv.KeySlot([]byte(k))/8192, 1)].Add(1)
		}
	})
	time.Sleep(500 * time.Millisecond)
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
	cut.Store(true)
	want := map[int][]uint64{1: {1, 2, 3}, 2: {1, 2, 3}}
	for gi := 1; gi <= 2; gi++ {
		for _, n := range g.Nodes[:3] {
			var c kcluster.GroupConfig
			if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
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
	e1 := cm.Epoch
	if out, err := kefirCluster(t, "replace-node", addr, "--old", "4"); err != nil || !strings.Contains(out, "nothing left to do") {
		t.Fatalf("replace-node --old 4 again: %v\n%s", err, out)
	}
	if cm := localMap(g.Nodes[0].ClientAddr); cm == nil || cm.Epoch != e1 {
		t.Fatalf("a rerun moved the map from epoch %d: %+v", e1, cm)
	}
}
