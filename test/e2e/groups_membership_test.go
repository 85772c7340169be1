package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Replacing a failed node in a cluster of several groups (issue 28;
// docs/cluster.md, "Replacing a failed node"; docs/design/cluster.md §7).

// node4Groups: node 4 hosts a replica of both groups (it leads group 2: its
// kill makes group 2 change views before it is reconfigured) and is not one of the
// metadata group's members (the three lowest ids).
const node4Groups = "1=1,2,4:0-8191;2=4,3,1:8192-16383"

// keysOfTwoGroups returns three keys (prefix plus a number) of node4Groups'
// group 1 (slots 0-8191) and three of its group 2.
func keysOfTwoGroups(prefix string) []string {
	var keys []string
	for i, n1, n2 := 0, 0, 0; n1 < 3 || n2 < 3; i++ {
		k := prefix + strconv.Itoa(i)
		if s := kv.KeySlot([]byte(k)); s <= 8191 && n1 < 3 {
			keys, n1 = append(keys, k), n1+1
		} else if s > 8191 && n2 < 3 {
			keys, n2 = append(keys, k), n2+1
		}
	}
	return keys
}

// groupConfigOf asks a node for data group g's configuration.
func groupConfigOf(t *testing.T, addr string, g int) (kcluster.GroupConfig, error) {
	t.Helper()
	v, err := cluster.Command(addr, "KEFIR.GROUP", "CONFIG", "GROUP", strconv.Itoa(g))
	if err != nil {
		return kcluster.GroupConfig{}, err
	}
	if v.Kind == resp.Error {
		return kcluster.GroupConfig{}, fmt.Errorf("%s", v.Str)
	}
	return kcluster.DecodeGroupConfig(v)
}

// slotsAddrs returns the client addresses CLUSTER SLOTS at addr names.
func slotsAddrs(t *testing.T, addr string) []string {
	t.Helper()
	v, err := cluster.Command(addr, "CLUSTER", "SLOTS")
	if err != nil || v.Kind != resp.Array {
		t.Fatalf("CLUSTER SLOTS at %s: %v %s", addr, err, v.Str)
	}
	var out []string
	for _, r := range v.Elems {
		for _, m := range r.Elems[2:] {
			a := net.JoinHostPort(string(m.Elems[0].Str), strconv.FormatInt(m.Elems[1].Int, 10))
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.Sort(out)
	return out
}

// A 4-node cluster of two groups under a checked workload (keys in both
// groups, through nodes 1-3) and sync writers: node 4, a member of both
// groups, is SIGKILLed; node 5 starts with --join and waits to be named;
// bad replace-node/remove-node calls are refused before anything changes;
// `kefir cluster replace-node --old 4 --new 5@... --group 1` reconfigures
// group 1 and records it in the map, and node 5 starts as its member;
// group 2 is reconfigured by hand (KEFIR.GROUP RECONFIG, as a command that
// died before recording it would leave it), its leader records it in the
// map, and node 5 joins it while it runs; it pulls both groups' state, and
// writes go on in both groups. At the end:
// every node's CLUSTER SLOTS names node 5 and not node 4, both groups are
// at epoch 2 with node 5, every acknowledged write reads back at node 5
// (and nodes 1-3), the history is linearizable; node 4 restarted on its old
// directory with its old flags retires from both groups and exits 0, then
// refuses to start; node 5 restarts without --join; a rerun of the command
// is a no-op.
func TestGroupsReplaceAFailedNode(t *testing.T) {
	g := cluster.StartGroups(t, 4, node4Groups)
	g.WaitLeaders(20 * time.Second)
	// Keys of both groups: three in group 1's slots, three in group 2's.
	keys := keysOfTwoGroups("m")
	live := g.Addrs()[:3]
	var cut atomic.Bool
	var afterCut [2]atomic.Int64 // acknowledged after the replacement, by group
	load := startGroupLoad(t, live, keys, func(k string) {
		if cut.Load() {
			afterCut[min(kv.KeySlot([]byte(k))/8192, 1)].Add(1)
		}
	})
	time.Sleep(500 * time.Millisecond)
	n4 := g.Nodes[3]
	n4.Kill()

	n5 := cluster.NewNode(t, "n5")
	n5.Args = []string{"--replica-id", "5", "--join", g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr, "--cluster-secret", "e2e-groups-secret"}
	if err := n5.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n5.Logs(), "does not name node 5 yet") }) {
		t.Fatalf("node 5 did not wait to be named:\n%s", n5.Logs())
	}

	epochOf := func() uint64 {
		var cm *kv.ClusterMap
		if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { cm = localMap(g.Nodes[0].ClientAddr); return cm != nil }) {
			t.Fatal("node 1 has no map")
		}
		return cm.Epoch
	}
	e0 := epochOf()
	newSpec := fmt.Sprintf("5@%s/%s", n5.PeerAddr, n5.ClientAddr)
	addr := "--addr=" + g.Nodes[1].ClientAddr
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"replace-node", addr, "--old", "9", "--new", newSpec}, "node 9 is not a node of the cluster map"},
		{[]string{"replace-node", addr, "--old", "4", "--new", "2@127.0.0.1:1/127.0.0.1:2"}, "node id 2 is already used"},
		{[]string{"replace-node", addr, "--old", "4", "--new", fmt.Sprintf("1@%s/%s", g.Nodes[0].PeerAddr, g.Nodes[0].ClientAddr)}, "node 1 is already a member of group 1"},
		{[]string{"remove-node", addr, "--id", "4"}, "would leave group 1 with 2 members"},
	} {
		out, err := kefirCluster(t, bad.args...)
		if err == nil || !strings.Contains(out, bad.want) || !strings.Contains(out, "nothing changed") {
			t.Fatalf("kefir cluster %v: %v, want %q and nothing changed:\n%s", bad.args, err, bad.want, out)
		}
	}
	if e := epochOf(); e != e0 {
		t.Fatalf("refused changes moved the map from epoch %d to %d", e0, e)
	}

	// Group 1 first (--group: as if the command had died after it): node 5
	// starts as a member of group 1; then a rerun does group 2, which
	// node 5, running, joins when the map names it there.
	out, err := kefirCluster(t, "replace-node", addr, "--old", "4", "--new", newSpec, "--group", "1")
	if err != nil || !strings.Contains(out, "group 1 is at epoch 1") || strings.Contains(out, "group 2 is") {
		t.Fatalf("replace-node --group 1: %v\n%s", err, out)
	}
	t.Logf("replace-node --group 1:\n%s", strings.TrimSpace(out))
	if err := n5.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("node 5 did not start serving: %v\n%s", err, n5.Logs())
	}
	if c, err := groupConfigOf(t, n5.ClientAddr, 1); err != nil || c.Epoch != 1 {
		t.Fatalf("node 5's replica of group 1: %s %v", c, err)
	}
	time.Sleep(300 * time.Millisecond)
	// Group 2 as a replace-node that died right after the reconfiguration
	// would leave it: KEFIR.GROUP RECONFIG at the group's leader, and no
	// SETMEMBERS. The group's leader records its members in the map
	// itself, and node 5, running, joins group 2 when the map names it.
	mv := &kcluster.Mover{Seeds: live}
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	res, err := mv.ReconfigureGroup(rctx, 2, 0, []uint64{3, 5, 1})
	rcancel()
	mv.Close()
	if err != nil || res.Epoch != 1 {
		t.Fatalf("KEFIR.GROUP RECONFIG GROUP 2: %s %v", res, err)
	}
	cut.Store(true)
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
		cm := localMap(g.Nodes[0].ClientAddr)
		mg, ok := cm.Group(2)
		return ok && mg.MemberEpoch == 1 && slices.Contains(mg.Members, 5)
	}) {
		t.Fatalf("the map did not follow group 2's reconfiguration: %+v", localMap(g.Nodes[0].ClientAddr))
	}
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		return strings.Contains(n5.Logs(), "joined it as a new member") && strings.Contains(n5.Logs(), "group=2")
	}) {
		t.Fatalf("node 5 did not join group 2 while running:\n%s", n5.Logs())
	}
	for gi := 1; gi <= 2; gi++ {
		var c kcluster.GroupConfig
		if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
			c, err = groupConfigOf(t, n5.ClientAddr, gi)
			return err == nil && c.Epoch == 1
		}) || !slices.Equal(sortedIDs(c.Members), map[int][]uint64{1: {1, 2, 5}, 2: {1, 3, 5}}[gi]) {
			t.Fatalf("node 5's replica of group %d: %s %v\n%s", gi, c, err, n5.Logs())
		}
	}
	// Writes go on in both groups, some through node 5.
	c5 := dialGroup(t, []string{n5.ClientAddr})
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		k := fmt.Sprintf("n5-%d", i)
		if err := c5.Put(ctx, k, []byte("v"), client.WithDurability(client.Sync)); err != nil {
			t.Fatalf("a write through node 5: %v", err)
		}
		cancel()
		load.Ack(k, "v")
	}
	time.Sleep(time.Second)
	load.Stop()
	acked := load.Acked()
	if afterCut[0].Load() == 0 || afterCut[1].Load() == 0 {
		t.Fatalf("writes acknowledged after the replacement: group 1 %d, group 2 %d", afterCut[0].Load(), afterCut[1].Load())
	}
	want := []string{g.Nodes[0].ClientAddr, g.Nodes[1].ClientAddr, g.Nodes[2].ClientAddr, n5.ClientAddr}
	slices.Sort(want)
	for _, a := range append(live, n5.ClientAddr) {
		var got []string
		if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool {
			got = slotsAddrs(t, a)
			return slices.Equal(got, want)
		}) {
			t.Fatalf("CLUSTER SLOTS at %s names %v, want %v (node 4 was %s)", a, got, want, n4.ClientAddr)
		}
	}
	// Every acknowledged write, at every node's own replicas (eventual
	// reads are served where they land): node 5 pulled both groups' state.
	t.Logf("%d sync writes acknowledged (%d / %d after the replacement)", len(acked), afterCut[0].Load(), afterCut[1].Load())
	for _, a := range append(live, n5.ClientAddr) {
		readBack(t, a, acked)
	}
	load.CheckLinearizable(t)

	// Node 4 on its old directory with its old flags: its replicas learn
	// the groups moved on, retire, and the node, left with no replica,
	// records it and exits cleanly; started again, it refuses.
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if code := n4.Wait(30 * time.Second); code != 0 || !strings.Contains(n4.Logs(), "left every group it hosted") {
		t.Fatalf("node 4 on its old directory: exit %d, want 0 with the retirement:\n%s", code, n4.Logs())
	}
	startExpectExit(t, n4)
	if !strings.Contains(n4.Logs(), "left every group") || !strings.Contains(n4.Logs(), "wipe --dir") {
		t.Fatalf("a retired directory not refused with a clear error:\n%s", n4.Logs())
	}
	// Node 5 restarts without --join (its directory records the groups),
	// and a rerun of the command changes nothing.
	n5.Args = []string{"--replica-id", "5", "--cluster-secret", "e2e-groups-secret"}
	n5.Restart()
	for gi := 1; gi <= 2; gi++ {
		if c, err := groupConfigOf(t, n5.ClientAddr, gi); err != nil || c.Epoch != 1 {
			t.Fatalf("restarted node 5's replica of group %d: %s %v", gi, c, err)
		}
	}
	e1 := epochOf()
	if out, err := kefirCluster(t, "replace-node", addr, "--old", "4", "--new", newSpec); err != nil || !strings.Contains(out, "nothing left to do") {
		t.Fatalf("replace-node again: %v\n%s", err, out)
	}
	if e := epochOf(); e != e1 {
		t.Fatalf("a rerun moved the map from epoch %d to %d", e1, e)
	}
	if v, err := cluster.Command(n5.ClientAddr, "GET", keys[0]); err != nil || v.Kind == resp.Error {
		t.Fatalf("a read through the restarted node 5: %v %s", err, v.Str)
	}
}

// remove-node in a cluster of several groups: nodes 4 and 5, members of
// group 1 (five members) and group 2 ([3 4 5]), are removed together,
// first from group 1 alone (--group 1: the map keeps them, as they still
// host group 2, said so, exit 0), then from the rest; group 1 goes on with
// three, group 2 with one, the map records it, nodes 4 and 5, left with no
// replica, retire and exit 0, and the map's node list drops them. Removing
// one node of a group of five, leaving four, is refused before anything
// changes.
func TestGroupsRemoveNodes(t *testing.T) {
	g := cluster.StartGroups(t, 5, "1=1,2,3,4,5:0-8191;2=3,4,5:8192-16383")
	g.WaitLeaders(20 * time.Second)
	addr := "--addr=" + g.Nodes[0].ClientAddr
	var cm0 *kv.ClusterMap
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { cm0 = localMap(g.Nodes[0].ClientAddr); return cm0 != nil }) {
		t.Fatal("node 1 has no map")
	}
	e0 := cm0.Epoch
	if out, err := kefirCluster(t, "remove-node", addr, "--id", "3"); err == nil || !strings.Contains(out, "would leave group 1 with 4 members") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("remove-node --id 3: %v\n%s", err, out)
	}
	// Out of group 1 only: nodes 4 and 5 still host group 2, so the map
	// keeps them — said so, and the group's removal done (exit 0).
	out, err := kefirCluster(t, "remove-node", addr, "--id", "4,5", "--group", "1")
	if err != nil || !reconfiguredTo(out, 1, 1, 1, 2, 3) || strings.Contains(out, "group 2 is") || strings.Contains(out, "out of the map") ||
		!strings.Contains(out, "node 4 still hosts group 2: the map keeps it") || !strings.Contains(out, "node 5 still hosts group 2") || strings.Contains(out, "again later") {
		t.Fatalf("remove-node --id 4,5 --group 1: %v\n%s", err, out)
	}
	out, err = kefirCluster(t, "remove-node", addr, "--id", "4,5")
	if err != nil || !reconfiguredTo(out, 2, 1, 3) || strings.Contains(out, "group 1 is") ||
		!strings.Contains(out, "node 4 is out of the map") || !strings.Contains(out, "node 5 is out of the map") {
		t.Fatalf("remove-node --id 4,5: %v\n%s", err, out)
	}
	for _, n := range g.Nodes[3:] {
		if code := n.Wait(30 * time.Second); code != 0 || !strings.Contains(n.Logs(), "left every group it hosted") {
			t.Fatalf("%s after its removal: exit %d, want 0 with the retirement:\n%s", n.ID, code, n.Logs())
		}
	}
	// The groups' changes, then each node out of the map's node list.
	if cm := localMap(g.Nodes[1].ClientAddr); cm == nil || cm.Epoch != e0+4 || !slices.Equal(cm.Groups[0].Members, []uint64{1, 2, 3}) || cm.Groups[0].MemberEpoch != 1 ||
		!slices.Equal(cm.NodeIDs(), []uint64{1, 2, 3}) {
		t.Fatalf("the map after the removal: %+v", cm)
	}
	want := []string{g.Nodes[0].ClientAddr, g.Nodes[1].ClientAddr, g.Nodes[2].ClientAddr}
	slices.Sort(want)
	if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool { return slices.Equal(slotsAddrs(t, g.Nodes[2].ClientAddr), want) }) {
		t.Fatalf("CLUSTER SLOTS at node 3: %v", slotsAddrs(t, g.Nodes[2].ClientAddr))
	}
	c := dialGroup(t, g.Addrs()[:3])
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		k := "r" + strconv.Itoa(i)
		if err := c.Put(ctx, k, []byte("v"), client.WithDurability(client.Sync)); err != nil {
			t.Fatalf("a write after the removal: %v", err)
		}
		if v, err := c.Get(ctx, k); err != nil || string(v) != "v" {
			t.Fatalf("a read after the removal: %q %v", v, err)
		}
		cancel()
	}
}

// Replacing a node that hosts a replica of the metadata group: in a
// 3-node cluster every node is one. Node 3 is SIGKILLed under writes,
// node 4 joins, and replace-node moves groups 1, 2 and the metadata group
// to node 4; the map records the metadata group's members. Then node 1 is
// SIGKILLed too: with the metadata group at [1 2 4] it still has a
// majority, so the map still changes (add-node), and writes go on. Without
// the metadata group's reconfiguration ([1 2 3], two of them down) the
// add-node could not commit. Node 3 restarted on its directory retires from
// all three groups and exits 0.
func TestGroupsReplaceAMetadataMember(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	c := dialGroup(t, g.Addrs()[:2])
	put := func(k string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := c.Put(ctx, k, []byte("v-"+k), client.WithDurability(client.Sync)); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	for i := range 50 {
		put("a" + strconv.Itoa(i))
	}
	n3 := g.Nodes[2]
	n3.Kill()
	n4 := cluster.NewNode(t, "n4")
	n4.Args = []string{"--replica-id", "4", "--join", g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr, "--cluster-secret", "e2e-groups-secret"}
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	out, err := kefirCluster(t, "replace-node", "--addr="+g.Nodes[1].ClientAddr, "--old", "3", "--new", fmt.Sprintf("4@%s/%s", n4.PeerAddr, n4.ClientAddr))
	if err != nil || !strings.Contains(out, "group 1 is at epoch 1") || !strings.Contains(out, "group 2 is at epoch 1") || !strings.Contains(out, "group 65535 is at epoch 1") {
		t.Fatalf("replace-node: %v\n%s", err, out)
	}
	t.Logf("replace-node:\n%s", strings.TrimSpace(out))
	if err := n4.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("node 4 did not start serving: %v\n%s", err, n4.Logs())
	}
	var cm *kv.ClusterMap
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		cm = localMap(n4.ClientAddr) // node 4's own replica of the metadata group
		return cm != nil && slices.Equal(sortedIDs(cm.MetaMembers()), []uint64{1, 2, 4})
	}) {
		t.Fatalf("node 4's replica of the metadata group: %+v\n%s", cm, n4.Logs())
	}
	for i := range 50 {
		put("b" + strconv.Itoa(i))
	}
	// Node 1 down as well: the metadata group [1 2 4] keeps a majority.
	g.Nodes[0].Kill()
	c = dialGroup(t, []string{g.Nodes[1].ClientAddr, n4.ClientAddr})
	out, err = kefirCluster(t, "add-node", "--addr="+g.Nodes[1].ClientAddr+","+n4.ClientAddr, "--id", "9", "--client-addr", "127.0.0.1:1", "--peer-addr", "127.0.0.1:2")
	if err != nil || !strings.Contains(out, "node 9 is in the map") {
		t.Fatalf("add-node with nodes 1 and 3 down: %v\n%s", err, out)
	}
	for i := range 50 {
		put("c" + strconv.Itoa(i))
	}
	for _, p := range []string{"a", "b", "c"} {
		for i := range 50 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			k := p + strconv.Itoa(i)
			if v, err := c.Get(ctx, k); err != nil || string(v) != "v-"+k {
				t.Fatalf("get %s: %q %v", k, v, err)
			}
			cancel()
		}
	}
	// Node 3 on its old directory: retires from the three groups, exits 0.
	if err := n3.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if code := n3.Wait(30 * time.Second); code != 0 || !strings.Contains(n3.Logs(), "left every group it hosted") {
		t.Fatalf("node 3 on its old directory: exit %d, want 0 with the retirement:\n%s", code, n3.Logs())
	}
	// Node 4 restarted from its directory alone (node 1 still down): it
	// reopens its replicas of the three groups from their join records,
	// and the map moves again.
	n4.Args = []string{"--replica-id", "4", "--cluster-secret", "e2e-groups-secret"}
	n4.Restart()
	out, err = kefirCluster(t, "add-node", "--addr="+n4.ClientAddr+","+g.Nodes[1].ClientAddr, "--id", "10", "--client-addr", "127.0.0.1:3", "--peer-addr", "127.0.0.1:4")
	if err != nil || !strings.Contains(out, "node 10 is in the map") {
		t.Fatalf("add-node after node 4's restart: %v\n%s", err, out)
	}
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
		cm = localMap(n4.ClientAddr)
		return cm != nil && slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == 10 })
	}) {
		t.Fatalf("restarted node 4's metadata replica: %+v", cm)
	}
	put("d0")
}
