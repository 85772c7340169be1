package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Replacing a node of a running VR group (issue 28, membership;
// docs/cluster.md, "Replacing a failed node").

// kefirCluster runs `kefir cluster ARGS...` and returns its output.
func kefirCluster(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(cluster.Binary(t), append([]string{"cluster"}, args...)...).CombinedOutput()
	return string(out), err
}

// groupConfig asks a node for its group's configuration.
func groupConfig(t *testing.T, addr string) kcluster.GroupConfig {
	t.Helper()
	v, err := cluster.Command(addr, "KEFIR.GROUP", "CONFIG")
	if err != nil {
		t.Fatalf("KEFIR.GROUP CONFIG at %s: %v", addr, err)
	}
	c, err := kcluster.DecodeGroupConfig(v)
	if err != nil {
		t.Fatalf("KEFIR.GROUP CONFIG at %s: %v", addr, err)
	}
	return c
}

// A 3-node group under the linearizability workload: node 3 is SIGKILLed,
// node 4 starts with --join (before the operator acts: it waits to be
// named), `kefir cluster replace-node` replaces 3 by 4, and writes go on.
// Then node 1 restarts with its original flags (naming node 3) and serves
// in the new epoch, and the workload's history is checked: linearizable,
// every acknowledged write on nodes 1, 2 and 4 (node 4 caught up). Node 3
// restarted on its old directory learns it left, records it and exits;
// started again, it refuses.
func TestReplaceAFailedNode(t *testing.T) {
	g := startGroup(t)
	g.settledLeader(-1)
	w := startWorkload(t, g)
	time.Sleep(500 * time.Millisecond)
	n3 := g.nodes[2]
	n3.Kill()

	n4 := cluster.NewNode(t, "n4")
	n4.Args = []string{"--replica-id", "4", "--join", g.nodes[0].ClientAddr + "," + g.nodes[1].ClientAddr, "--cluster-secret", groupSecret}
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n4.Logs(), "does not name this node yet") }) {
		t.Fatalf("node 4 did not wait to be named:\n%s", n4.Logs())
	}
	newSpec := fmt.Sprintf("4@%s/%s", n4.PeerAddr, n4.ClientAddr)
	out, err := kefirCluster(t, "replace-node", "--addr", g.nodes[1].ClientAddr, "--old", "3", "--new", newSpec)
	if err != nil || !strings.Contains(out, "epoch 1, members") || !strings.Contains(out, newSpec) {
		t.Fatalf("replace-node: %v\n%s", err, out)
	}
	t.Logf("replace-node: %s", strings.TrimSpace(out))
	w.cut.Store(true)
	if err := n4.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("node 4 did not start serving: %v\n%s", err, n4.Logs())
	}
	ng := &group{t: t, nodes: []*cluster.Node{g.nodes[0], g.nodes[1], n4}}
	ng.caughtUp(2, ng.leader(-1))
	if c := groupConfig(t, n4.ClientAddr); c.Epoch != 1 || !slices.Contains(c.Members, 4) || slices.Contains(c.Members, 3) {
		t.Fatalf("node 4's configuration: %s", c)
	}

	// Node 1 restarted with its original flags (--members names node 3):
	// it runs the configuration its disk holds, and knows node 4's
	// addresses from the group's record.
	g.nodes[0].Restart()
	if !strings.Contains(g.nodes[0].Logs(), "supersedes --members") {
		t.Fatalf("node 1 did not log that its disk's configuration supersedes --members:\n%s", g.nodes[0].Logs())
	}
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		st, err := status(g.nodes[0])
		return err == nil && (st.Role == "leader" || st.Role == "follower")
	}) {
		t.Fatalf("restarted node 1 does not serve:\n%s", g.nodes[0].Logs())
	}
	if c := groupConfig(t, g.nodes[0].ClientAddr); c.Epoch != 1 || !slices.Equal(sortedIDs(c.Members), []uint64{1, 2, 4}) {
		t.Fatalf("restarted node 1's configuration: %s", c)
	}
	// Its CLUSTER replies name the new members (addresses from the
	// group's record; the flags named node 3).
	if nodes := redisCLI(t, g.nodes[0].ClientAddr, "CLUSTER", "NODES"); !strings.Contains(nodes, n4.ClientAddr) || strings.Contains(nodes, n3.ClientAddr) {
		t.Fatalf("CLUSTER NODES at the restarted node 1:\n%s", nodes)
	}
	time.Sleep(time.Second) // writes through the restarted node
	w.finish(t, ng)

	// Node 3 on its old directory with its old flags: told the group moved
	// on, it retires, records it and exits cleanly; it disturbs nothing.
	if err := n3.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if code := n3.Wait(30 * time.Second); code != 0 || !strings.Contains(n3.Logs(), "left group") {
		t.Fatalf("node 3 on its old directory: exit %d, want 0 with the retirement:\n%s", code, n3.Logs())
	}
	startExpectExit(t, n3)
	if !strings.Contains(n3.Logs(), "this node left its group") || !strings.Contains(n3.Logs(), "wipe --dir") {
		t.Fatalf("a retired directory not refused with a clear error:\n%s", n3.Logs())
	}
	if c := groupConfig(t, g.nodes[1].ClientAddr); c.Epoch != 1 || !slices.Equal(sortedIDs(c.Members), []uint64{1, 2, 4}) {
		t.Fatalf("the group after node 3 came back: %s", c)
	}
	// Node 2 restarted with the new member list in its flags is accepted
	// too (its identity file records both lists).
	n2 := g.nodes[1]
	parts := strings.Split(g.members, ",")
	n2.Args = replicaArgs(strings.Join([]string{parts[0], parts[1], newSpec}, ","), 2, false)
	n2.Restart()
	if c := groupConfig(t, n2.ClientAddr); c.Epoch != 1 || !slices.Equal(sortedIDs(c.Members), []uint64{1, 2, 4}) {
		t.Fatalf("node 2 restarted with the new members: %s", c)
	}
	ng.caughtUp(1, ng.leader(-1))
	// Node 4 restarts from its directory alone: no --join.
	n4.Args = []string{"--replica-id", "4", "--cluster-secret", groupSecret}
	n4.Restart()
	ng.caughtUp(2, ng.leader(-1))
}

// reconfiguredTo reports whether a kefir cluster command's output says
// group g is at epoch e with members want, in any order: the command
// prints them in the order the group answers, its leader first, and which
// member leads depends on the view changes of the moment.
func reconfiguredTo(out string, g, e uint64, want ...uint64) bool {
	m := regexp.MustCompile(fmt.Sprintf(`group %d is at epoch %d, members \[([0-9 ]*)\]`, g, e)).FindStringSubmatch(out)
	if m == nil {
		return false
	}
	var got []uint64
	for _, f := range strings.Fields(m[1]) {
		id, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return false
		}
		got = append(got, id)
	}
	return slices.Equal(sortedIDs(got), sortedIDs(want))
}

func sortedIDs(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// Bad requests change nothing: replace-node naming a non-member, or a new
// node that is already a member, remove-node leaving an even group, an
// unreachable address. Then node 3 is replaced by node 5, started after
// replace-node, and remove-node of two members leaves a group of one that
// serves; the removed nodes retire and exit.
func TestMembershipCommandsRefuseBadChanges(t *testing.T) {
	g := startGroup(t)
	g.settledLeader(-1)
	addr := g.nodes[0].ClientAddr
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replace-node", "--addr", addr, "--old", "9", "--new", "4@127.0.0.1:1/127.0.0.1:2"}, "node 9 is not a member"},
		{[]string{"replace-node", "--addr", addr, "--old", "3", "--new", "2@127.0.0.1:1/127.0.0.1:2"}, "node 2 is already a member"},
		{[]string{"remove-node", "--addr", addr, "--id", "3"}, "odd number"},
		{[]string{"remove-node", "--addr", addr, "--id", "1,2,3"}, "odd number"},
		{[]string{"remove-node", "--addr", "127.0.0.1:1", "--id", "2,3"}, "cannot get the group's configuration from 127.0.0.1:1"},
	} {
		out, err := kefirCluster(t, tc.args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %v, want an error with %q:\n%s", tc.args, err, tc.want, out)
		}
	}
	if c := groupConfig(t, g.nodes[2].ClientAddr); c.Epoch != 0 || len(c.Members) != 3 {
		t.Fatalf("a refused change changed the group: %s", c)
	}

	// A new node started after replace-node finds itself named at once.
	g.nodes[2].Kill()
	n5 := cluster.NewNode(t, "n5")
	spec := fmt.Sprintf("5@%s/%s", n5.PeerAddr, n5.ClientAddr)
	if out, err := kefirCluster(t, "replace-node", "--addr", g.nodes[1].ClientAddr, "--old", "3", "--new", spec); err != nil {
		t.Fatalf("replace-node 3 by 5: %v\n%s", err, out)
	}
	n5.Args = []string{"--replica-id", "5", "--join", addr, "--cluster-secret", groupSecret}
	n5.Start()
	ng := &group{t: t, nodes: []*cluster.Node{g.nodes[0], g.nodes[1], n5}}
	ng.caughtUp(2, ng.leader(-1))

	out, err := kefirCluster(t, "remove-node", "--addr", n5.ClientAddr, "--id", "2,5")
	if err != nil || !strings.Contains(out, "epoch 2, members 1@") {
		t.Fatalf("remove-node 2,5: %v\n%s", err, out)
	}
	for _, n := range ng.nodes[1:] {
		if code := n.Wait(20 * time.Second); code != 0 || !strings.Contains(n.Logs(), "left group") {
			t.Fatalf("%s: exit %d, want 0 after retiring:\n%s", n.ID, code, n.Logs())
		}
	}
	c := dialGroup(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Put(ctx, "after", []byte("one")); err != nil {
		t.Fatalf("a write to the group of one: %v", err)
	}
}
