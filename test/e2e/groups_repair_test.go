package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Automatic repair (issue 28: "its replicas are re-created on other nodes
// from the surviving members"; docs/cluster.md, "Automatic repair"): the
// cluster of TestGroupsReplaceAFailedNodeOnTheClustersNodes started with
// --repair-after 3s, node 4 (a member of both groups, group 2's first
// leader) SIGKILLed under a checked workload, and nobody runs a command:
// the metadata group's leader finds node 4 silent for 3 s and places its
// replicas as replace-node --old 4 would — group 1 [1 2 4] on node 3,
// group 2 [4 3 1] on node 2 — so every group is back to three live
// replicas, every acknowledged write reads back at every node, writes go
// on in both groups, and the history is linearizable. The leader's log
// says what it did.
func TestGroupsRepairAFailedNodeUnattended(t *testing.T) {
	g := cluster.StartGroups(t, 4, node4Groups, "--repair-after", "3s")
	g.WaitLeaders(20 * time.Second)
	l := startNode4Load(t, g, "r")
	killed := time.Now()
	g.Nodes[3].Kill()
	// 3 s of silence, a probe round (0.5 s), two reconfigurations and
	// their catch-up: well within 40 s on a loaded box.
	l.checkReplaced(t, g, 40*time.Second)
	t.Logf("node 4's replicas re-created (and the writes checked) within %v of its SIGKILL", time.Since(killed).Round(100*time.Millisecond))
	var logs string
	for _, n := range g.Nodes[:3] {
		logs += n.Logs()
	}
	for _, w := range []string{"placing its replica of group 1 on node 3", "placing its replica of group 2 on node 2", "node 4's replica of group 2 re-created"} {
		if !strings.Contains(logs, w) {
			t.Fatalf("no node's log says %q:\n%s", w, logs)
		}
	}
}
