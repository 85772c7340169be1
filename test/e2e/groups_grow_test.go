package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Growing a group (issue 28; docs/cluster.md, "Growing a group"): a
// 3-node cluster of two groups under a checked workload on group 1's keys;
// nodes 4 and 5 start with --join and wait to be named; bad add-members
// calls are refused before anything changes; `kefir cluster add-members
// --group 1 --new 4@...,5@...` reconfigures group 1 to five members and
// records it in the map; nodes 4 and 5 start their replicas and pull the
// state. Then nodes 2 and 3 are SIGKILLed: group 1, with three of its five
// members (1, 4, 5), goes on taking sync writes — with three members it
// would have stopped. The metadata group grows by the same nodes and
// still records a change with nodes 2 and 3 down. Every acknowledged write
// reads back at node 4 and 5, the history is linearizable, and a rerun is
// a no-op.
func TestGroupsAddMembers(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		if k := "g" + strconv.Itoa(i); kv.KeySlot([]byte(k)) <= 8191 {
			keys = append(keys, k)
		}
	}
	var grown atomic.Bool
	var afterGrow atomic.Int64
	load := startGroupLoad(t, g.Addrs(), keys, func(string) {
		if grown.Load() {
			afterGrow.Add(1)
		}
	})
	news := make([]*cluster.Node, 2)
	var specs []string
	for i := range news {
		id := 4 + i
		n := cluster.NewNode(t, "n"+strconv.Itoa(id))
		n.Args = []string{"--replica-id", strconv.Itoa(id), "--join", g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr, "--cluster-secret", "e2e-groups-secret"}
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		news[i] = n
		specs = append(specs, fmt.Sprintf("%d@%s/%s", id, n.PeerAddr, n.ClientAddr))
	}
	for _, n := range news {
		if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n.Logs(), "does not name node") }) {
			t.Fatalf("%s did not wait to be named:\n%s", n.ID, n.Logs())
		}
	}
	cm0 := localMap(g.Nodes[0].ClientAddr)
	if cm0 == nil {
		t.Fatal("node 1 has no map")
	}
	addr := "--addr=" + g.Nodes[1].ClientAddr
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"add-members", addr, "--group", "1", "--new", specs[0]}, "would leave group 1 with 4 members"},
		{[]string{"add-members", addr, "--group", "1", "--new", "2," + specs[0]}, "node 2 is already a member of group 1"},
		{[]string{"add-members", addr, "--group", "9", "--new", strings.Join(specs, ",")}, "group 9 is not a group"},
		{[]string{"add-members", addr, "--new", strings.Join(specs, ",")}, "needs --group G"},
	} {
		out, err := kefirCluster(t, bad.args...)
		if err == nil || !strings.Contains(out, bad.want) {
			t.Fatalf("kefir cluster %v: %v, want %q:\n%s", bad.args, err, bad.want, out)
		}
	}
	if cm := localMap(g.Nodes[0].ClientAddr); cm == nil || cm.Epoch != cm0.Epoch {
		t.Fatalf("refused changes moved the map from epoch %d: %+v", cm0.Epoch, cm)
	}

	out, err := kefirCluster(t, "add-members", addr, "--group", "1", "--new", strings.Join(specs, ","))
	if err != nil || !reconfiguredTo(out, 1, 1, 1, 2, 3, 4, 5) {
		t.Fatalf("add-members: %v\n%s", err, out)
	}
	grown.Store(true)
	for _, n := range news {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("%s did not start serving: %v\n%s", n.ID, err, n.Logs())
		}
		var c, ok = groupConfigOf(t, n.ClientAddr, 1)
		if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
			c, ok = groupConfigOf(t, n.ClientAddr, 1)
			return ok == nil && c.Epoch == 1
		}) {
			t.Fatalf("%s's replica of group 1: %s %v", n.ID, c, ok)
		}
	}
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
		cm := localMap(g.Nodes[2].ClientAddr)
		mg, ok := cm.Group(1)
		return ok && mg.MemberEpoch == 1 && slices.Equal(mg.Members, []uint64{1, 2, 3, 4, 5})
	}) {
		t.Fatalf("the map did not record group 1's five members: %+v", localMap(g.Nodes[2].ClientAddr))
	}
	if out, err := kefirCluster(t, "add-members", addr, "--group", "1", "--new", strings.Join(specs, ",")); err != nil || !strings.Contains(out, "nothing left to do") {
		t.Fatalf("add-members again: %v\n%s", err, out)
	}
	// The metadata group grows by the same two nodes (by id: the map knows
	// them now), so the map keeps changing with two of five down too.
	out, err = kefirCluster(t, "add-members", addr, "--group", "65535", "--new", "4,5")
	if err != nil || !reconfiguredTo(out, 65535, 1, 1, 2, 3, 4, 5) {
		t.Fatalf("add-members to the metadata group: %v\n%s", err, out)
	}
	// Let the new members catch up under the load, then take two of the
	// original three away: group 1 keeps a majority of its five.
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { return afterGrow.Load() >= 20 }) {
		t.Fatalf("%d writes acknowledged after the growth", afterGrow.Load())
	}
	time.Sleep(500 * time.Millisecond)
	load.Stop()
	acked := load.Acked()
	for _, n := range news {
		readBack(t, n.ClientAddr, acked)
	}
	load.CheckLinearizable(t)
	g.Nodes[1].Kill()
	g.Nodes[2].Kill()
	c := dialGroup(t, []string{news[0].ClientAddr, news[1].ClientAddr, g.Nodes[0].ClientAddr})
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := c.Put(ctx, k, []byte("after"), client.WithDurability(client.Sync))
		cancel()
		if err != nil {
			t.Fatalf("a sync write to group 1 with nodes 2 and 3 down: %v", err)
		}
	}
	// The metadata group (1, 4, 5 of five) still records a change.
	if out, err := kefirCluster(t, "add-node", "--addr="+news[0].ClientAddr, "--id", "9", "--client-addr", "127.0.0.1:1", "--peer-addr", "127.0.0.1:2"); err != nil {
		t.Fatalf("add-node with nodes 2 and 3 down: %v\n%s", err, out)
	}
	for _, n := range append([]*cluster.Node{g.Nodes[0]}, news...) {
		readBack(t, n.ClientAddr, map[string]string{keys[0]: "after", keys[1]: "after"})
	}
}

// Growing a single VR group (no cluster map): nodes 4 and 5 start with
// --join, `kefir cluster add-members --new 4@...,5@...` makes the group
// five, both catch up; nodes 2 and 3 SIGKILLed, the group (1, 4, 5) still
// commits. Adding one member (an even group) is refused before anything
// changes.
func TestAddMembersToASingleGroup(t *testing.T) {
	g := startGroup(t)
	g.settledLeader(-1)
	var nodes []*cluster.Node
	var specs []string
	for _, id := range []int{4, 5} {
		n := cluster.NewNode(t, "n"+strconv.Itoa(id))
		n.Args = []string{"--replica-id", strconv.Itoa(id), "--join", g.nodes[0].ClientAddr + "," + g.nodes[1].ClientAddr, "--cluster-secret", groupSecret}
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		specs = append(specs, fmt.Sprintf("%d@%s/%s", id, n.PeerAddr, n.ClientAddr))
	}
	if out, err := kefirCluster(t, "add-members", "--addr", g.nodes[1].ClientAddr, "--new", specs[0]); err == nil || !strings.Contains(out, "odd number") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("add one member: %v\n%s", err, out)
	}
	out, err := kefirCluster(t, "add-members", "--addr", g.nodes[1].ClientAddr, "--new", strings.Join(specs, ","))
	if err != nil || !strings.Contains(out, "epoch 1, members") || !strings.Contains(out, specs[1]) {
		t.Fatalf("add-members: %v\n%s", err, out)
	}
	for _, n := range nodes {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("%s did not start serving: %v\n%s", n.ID, err, n.Logs())
		}
	}
	ng := &group{t: t, nodes: append([]*cluster.Node{g.nodes[0], g.nodes[1], g.nodes[2]}, nodes...)}
	leader := ng.leader(-1)
	ng.caughtUp(3, leader)
	ng.caughtUp(4, leader)
	if c := groupConfig(t, nodes[0].ClientAddr); c.Epoch != 1 || !slices.Equal(sortedIDs(c.Members), []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("node 4's configuration: %s", c)
	}
	g.nodes[1].Kill()
	g.nodes[2].Kill()
	c := dialGroup(t, []string{nodes[0].ClientAddr, nodes[1].ClientAddr, g.nodes[0].ClientAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Put(ctx, "after", []byte("five"), client.WithDurability(client.Sync)); err != nil {
		t.Fatalf("a sync write with two of five down: %v", err)
	}
	if v, err := c.Get(ctx, "after"); err != nil || string(v) != "five" {
		t.Fatalf("read back: %q %v", v, err)
	}
}

// A change to a group waits for the members its last change added to pull
// its state (kefir cluster ... --catch-up-wait, cluster.Mover.WaitCaughtUp):
// group 1 grows by node 4 (running) and node 6 (named, not started yet);
// removing nodes 2 and 3 then would leave [1 4 6] with one working member,
// so it is refused, saying node 6 has not caught up, and nothing changes.
// Once node 6 starts and pulls the state, the same command goes through and
// the group of [1 4 6] takes sync writes.
func TestGroupChangeWaitsForNewMembersToCatchUp(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	var nodes []*cluster.Node
	var specs []string
	for _, id := range []int{4, 6} {
		n := cluster.NewNode(t, "n"+strconv.Itoa(id))
		n.Args = []string{"--replica-id", strconv.Itoa(id), "--join", g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr, "--cluster-secret", "e2e-groups-secret"}
		nodes = append(nodes, n)
		specs = append(specs, fmt.Sprintf("%d@%s/%s", id, n.PeerAddr, n.ClientAddr))
	}
	if err := nodes[0].StartNoWait(); err != nil {
		t.Fatal(err)
	}
	c := dialGroup(t, g.Addrs())
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.Put(ctx, fmt.Sprintf("w%d", i), []byte("v"), client.WithDurability(client.Sync)); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	addr := "--addr=" + g.Nodes[0].ClientAddr
	if out, err := kefirCluster(t, "add-members", addr, "--group", "1", "--new", strings.Join(specs, ",")); err != nil {
		t.Fatalf("add-members: %v\n%s", err, out)
	}
	out, err := kefirCluster(t, "remove-node", addr, "--id", "2,3", "--group", "1", "--catch-up-wait", "1s")
	if err == nil || !strings.Contains(out, "node 6 (persisted op 0") || !strings.Contains(out, "nothing changed for group 1") {
		t.Fatalf("remove-node 2,3 while node 6 has not started: %v, want a refusal naming node 6:\n%s", err, out)
	}
	if cm := localMap(g.Nodes[0].ClientAddr); cm == nil || len(cm.Groups[0].Members) != 5 {
		t.Fatalf("the refused change moved group 1: %+v", cm)
	}
	if err := nodes[1].StartNoWait(); err != nil {
		t.Fatal(err)
	}
	out, err = kefirCluster(t, "remove-node", addr, "--id", "2,3", "--group", "1")
	if err != nil || !strings.Contains(out, "group 1 is at epoch 2, members [1 4 6]") {
		t.Fatalf("remove-node 2,3 once node 6 runs: %v\n%s", err, out)
	}
	g.Nodes[1].Kill()
	g.Nodes[2].Kill()
	c4 := dialGroup(t, []string{nodes[0].ClientAddr, nodes[1].ClientAddr, g.Nodes[0].ClientAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 5 {
		k := keyOfSlots(t, 0, 8191, i)
		if err := c4.Put(ctx, k, []byte("after"), client.WithDurability(client.Sync)); err != nil {
			t.Fatalf("a sync write to group [1 4 6]: %v", err)
		}
	}
}

// keyOfSlots returns the i-th key "s<n>" whose slot is in [lo, hi].
func keyOfSlots(t *testing.T, lo, hi uint16, i int) string {
	t.Helper()
	for n, found := 0, 0; n < 1_000_000; n++ {
		k := "s" + strconv.Itoa(n)
		if s := kv.KeySlot([]byte(k)); s >= lo && s <= hi {
			if found == i {
				return k
			}
			found++
		}
	}
	t.Fatal("no key")
	return ""
}
