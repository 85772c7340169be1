package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Replacing a chain group's members through the map (issues 28 and 30;
// docs/design/chain.md "A chain in a cluster of groups"): five nodes, a VR
// group 1 on nodes 1-3 (the metadata members, where the chain's masters
// run) and a chain group 2 of [4 5 3] (kefir server --chain-groups 2).
// Checked clients (linearizable reads, sync writes and CAS) and sync
// writers run on keys of both groups through nodes 1-3. `kefir cluster
// replace-node --old 5 --new 6@...` replaces the chain's middle member:
// node 6, started with --join, opens an empty member, the master joins it
// before the tail, then fails node 5 (after its last lease ran out), which
// retires and exits; the command returns once the map names [4 6 3]. Then
// the head, node 4, is SIGKILLed and replaced by node 7 the same way: the
// master fails the silent head, joins node 7, and the map names [6 7 3].
// A rerun of the command changes nothing. `kefir cluster remove-node --id
// 6` leaves the chain one shorter, [7 3], and node 6 retires. Every
// acknowledged write reads back at every live node, and the history is
// linearizable. Node 4 started again on its old directory retires its
// member and exits 0; node 7 restarts from its directory alone and is
// joined again.
func TestGroupsChainReplaceNode(t *testing.T) {
	g, live, load := startChainCluster(t)
	addr := "--addr=" + live[0]
	keys := load.keys
	waitChainWrites := func(what string, n int) {
		t.Helper()
		load.WaitChainWrites(t, what, n)
	}
	joinNode := func(id int) *cluster.Node {
		n := cluster.NewNode(t, "n"+strconv.Itoa(id))
		n.Args = []string{"--replica-id", strconv.Itoa(id), "--join", live[0] + "," + live[1], "--cluster-secret", "e2e-groups-secret"}
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	replace := func(old int, n *cluster.Node, want []uint64) {
		t.Helper()
		start := time.Now()
		out, err := kefirCluster(t, "replace-node", addr, "--old", strconv.Itoa(old), "--new", fmt.Sprintf("%s@%s/%s", strings.TrimPrefix(n.ID, "n"), n.PeerAddr, n.ClientAddr))
		if err != nil || !strings.Contains(out, fmt.Sprintf("chain group 2 is %v", want)) {
			t.Fatalf("replace-node --old %d: %v\n%s\nnew node:\n%s", old, err, out, n.Logs())
		}
		t.Logf("replace-node --old %d (%v):\n%s", old, time.Since(start).Round(10*time.Millisecond), strings.TrimSpace(out))
		if !slices.Equal(chainOf(live[0]), want) {
			t.Fatalf("node 1's map names the chain %v, want %v", chainOf(live[0]), want)
		}
	}
	waitChainWrites("before any change", 30)

	// The middle member, node 5, by node 6.
	n6 := joinNode(6)
	replace(5, n6, []uint64{4, 6, 3})
	if err := n6.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("node 6 is not serving: %v\n%s", err, n6.Logs())
	}
	n5 := g.Nodes[4]
	if code := n5.Wait(20 * time.Second); code != 0 || !strings.Contains(n5.Logs(), "its member retires") {
		t.Fatalf("node 5 did not retire and exit 0 (exit %d):\n%s", code, n5.Logs())
	}
	waitChainWrites("after the middle member's replacement", 30)

	// The head, node 4, SIGKILLed, by node 7.
	n7 := joinNode(7)
	g.Nodes[3].Kill()
	replace(4, n7, []uint64{6, 7, 3})
	waitChainWrites("after the head's replacement", 30)
	out, err := kefirCluster(t, "replace-node", addr, "--old", "4", "--new", fmt.Sprintf("7@%s/%s", n7.PeerAddr, n7.ClientAddr))
	if err != nil || !strings.Contains(out, "nothing left to do") || strings.Contains(out, "->") {
		t.Fatalf("a rerun of replace-node --old 4: %v\n%s", err, out)
	}
	rejoined := regexp.MustCompile(`chain master: joining" .*group=2 node=[45] `)
	for _, n := range g.Nodes[:3] {
		if l := rejoined.FindString(n.Logs()); l != "" {
			t.Fatalf("a master joined a removed node again: %s", l)
		}
	}
	// remove-node of a chain member: the chain is one shorter.
	out, err = kefirCluster(t, "remove-node", addr, "--id", "6")
	if err != nil || !strings.Contains(out, "chain group 2 is [7 3]") {
		t.Fatalf("remove-node --id 6: %v\n%s", err, out)
	}
	t.Logf("remove-node --id 6:\n%s", strings.TrimSpace(out))
	if code := n6.Wait(20 * time.Second); code != 0 {
		t.Fatalf("node 6 did not retire and exit 0 (exit %d):\n%s", code, n6.Logs())
	}
	waitChainWrites("after the removal", 30)
	load.Finish(t, append(slices.Clone(live), n7.ClientAddr))

	// Node 4, the replaced head, on its old directory with its old flags:
	// its member restarts as a joiner, the master refuses to join it (the
	// map removed it), and its node retires it and exits cleanly; node 7
	// restarts without --join (its directory records the chain).
	n4 := g.Nodes[3]
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if code := n4.Wait(30 * time.Second); code != 0 || !strings.Contains(n4.Logs(), "its member retires") || !strings.Contains(n4.Logs(), "left every group it hosted") {
		t.Fatalf("node 4 on its old directory: exit %d, want 0 with the retirement:\n%s", code, n4.Logs())
	}
	n7.Args = []string{"--replica-id", "7", "--cluster-secret", "e2e-groups-secret"}
	n7.Restart()
	if v, err := cluster.Command(live[0], "SET", keys[0]+"-after", "x"); err != nil || string(v.Str) != "OK" {
		t.Fatalf("a write to the chain after node 7's restart: %v %q", err, v.Str)
	}
	// Restarted, its member lost its place (the chain runs on node 3)
	// and is joined again, before the tail.
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return slices.Equal(chainOf(live[0]), []uint64{7, 3}) }) {
		t.Fatalf("the chain after node 7's restart: %v", chainOf(live[0]))
	}
}
