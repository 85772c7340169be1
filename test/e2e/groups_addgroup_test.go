package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Growing a cluster (issue 28; docs/cluster.md, "Growing a cluster";
// docs/design/cluster.md §7 "Several groups"): a 3-node cluster of two
// groups under a checked workload (linearizable reads, sync writes and CAS
// on keys of every part of the keyspace) and sync writers; nodes 4, 5 and 6
// start with --join and wait to be named; `kefir cluster add-node` records
// them; bad add-group calls are refused before anything changes;
// `kefir cluster add-group --members 4,5,6` records group 3 with no slots
// and the three nodes bootstrap it from the map; a rerun is a no-op;
// `kefir cluster rebalance --by keys` under the load gives group 3 a fair
// share of the slots. At the end: every node's CLUSTER SLOTS and SHARDS
// name nodes 4-6, writes were acknowledged in group 3, every acknowledged
// write reads back at all six nodes, the history is linearizable; node 5
// SIGKILLed and restarted (no --join) comes back as a member of group 3 from
// its directory, with every acknowledged write of group 3's slots. Then
// group 4 on running nodes 1, 2 (started from flags) and 6: started while
// they run, given 100 of group 1's slots by move-slots, serving them; node 1 restarted
// reopens it from its directory.
func TestGroupsAddAGroupAndRebalance(t *testing.T) {
	g := cluster.StartGroups(t, 3, "1=1,2,3:0-8191;2=2,3,1:8192-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()
	// Keys the rebalance weighs: 1,500, even over the slots.
	var cmds [][]string
	for i := range 1500 {
		cmds = append(cmds, []string{"SET", "a" + strconv.Itoa(i), "v"})
		if len(cmds) == 500 {
			pipelineRetry(t, live[i%3], cmds...)
			cmds = cmds[:0]
		}
	}
	// Checked keys over the whole keyspace (some end in group 3).
	var keys []string
	for i := 0; len(keys) < 8; i++ {
		k := "k" + strconv.Itoa(i)
		if int(kv.KeySlot([]byte(k)))*8/16384 == len(keys) {
			keys = append(keys, k)
		}
	}
	load := startGroupLoad(t, live, keys, nil)

	// Three new nodes, started empty with --join: they wait to be named.
	var news []*cluster.Node
	for id := 4; id <= 6; id++ {
		n := cluster.NewNode(t, "n"+strconv.Itoa(id))
		n.Args = []string{"--replica-id", strconv.Itoa(id), "--join", live[0] + "," + live[1], "--cluster-secret", "e2e-groups-secret"}
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		news = append(news, n)
	}
	for _, n := range news {
		if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n.Logs(), "does not name node") }) {
			t.Fatalf("%s did not wait to be named:\n%s", n.ID, n.Logs())
		}
	}
	addr := "--addr=" + live[1]
	for i, n := range news {
		out, err := kefirCluster(t, "add-node", addr, "--id", strconv.Itoa(i+4), "--client-addr", n.ClientAddr, "--peer-addr", n.PeerAddr)
		if err != nil {
			t.Fatalf("add-node %d: %v\n%s", i+4, err, out)
		}
	}
	mapOf := func() *kv.ClusterMap {
		var cm *kv.ClusterMap
		if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { cm = localMap(live[0]); return cm != nil }) {
			t.Fatal("node 1 has no map")
		}
		return cm
	}
	e0 := mapOf().Epoch
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"add-group", addr, "--members", "4,5"}, "needs an odd number"},
		{[]string{"add-group", addr, "--members", "4,5,9"}, "node 9 is not a node of the cluster map"},
		{[]string{"add-group", addr, "--members", "4,5,5"}, "member 5 listed twice"},
		{[]string{"add-group", addr, "--members", "4,5,6", "--id", "1"}, "group 1 is in the map already"},
		{[]string{"add-group", addr, "--members", "4,5,6", "--id", "65535"}, "data groups' ids are 1 to"},
	} {
		out, err := kefirCluster(t, bad.args...)
		if err == nil || !strings.Contains(out, bad.want) || !strings.Contains(out, "nothing changed") {
			t.Fatalf("kefir cluster %v: %v, want %q and nothing changed:\n%s", bad.args, err, bad.want, out)
		}
	}
	if e := mapOf().Epoch; e != e0 {
		t.Fatalf("refused add-groups moved the map from epoch %d to %d", e0, e)
	}
	out, err := kefirCluster(t, "add-group", addr, "--members", "4,5,6")
	if err != nil || !strings.Contains(out, "group 3 with members [4 5 6] is in the map") || !strings.Contains(out, "group 3 is running") {
		t.Fatalf("add-group: %v\n%s", err, out)
	}
	t.Logf("add-group:\n%s", strings.TrimSpace(out))
	for _, n := range news {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("%s did not start serving: %v\n%s", n.ID, err, n.Logs())
		}
	}
	e1 := mapOf().Epoch
	// Before it owns slots: CLUSTER SHARDS lists it with none (as Redis a
	// master without slots), kefir cluster status with its leader.
	if v, err := cluster.Command(news[0].ClientAddr, "CLUSTER", "SHARDS"); err != nil || v.Kind != resp.Array || len(v.Elems) != 3 {
		t.Fatalf("CLUSTER SHARDS with group 3 of no slots: %v %v", err, v)
	}
	if st, err := kefirCluster(t, "status", addr); err != nil || !regexp.MustCompile(`3  members \[4 5 6\]  leader 127\.0\.0\.1:[0-9]+  slots none \(0\)`).MatchString(st) {
		t.Fatalf("kefir cluster status with group 3 of no slots: %v\n%s", err, st)
	}
	if out, err := kefirCluster(t, "add-group", addr, "--members", "4,5,6"); err != nil || !strings.Contains(out, "group 3 with members") {
		t.Fatalf("add-group again: %v\n%s", err, out)
	}
	if e := mapOf().Epoch; e != e1 {
		t.Fatalf("a rerun of add-group moved the map from epoch %d to %d", e1, e)
	}

	// The rebalance, under the load: group 3 gets a fair share.
	time.Sleep(300 * time.Millisecond)
	res, log := runRebalance(t, g, "--by", "keys", "--page-pause", "0")
	t.Logf("rebalance: %+v\n%s", res.Plan, log)
	cm := mapOf()
	g3, ok := cm.Group(3)
	if !ok {
		t.Fatalf("no group 3 in the map: %+v", cm)
	}
	var n3 int
	for _, r := range g3.Slots {
		n3 += int(r.End-r.Start) + 1
	}
	if n3 < 16384/3*8/10 || n3 > 16384/3*12/10 {
		t.Fatalf("group 3 owns %d slots after the rebalance (%v), want about a third", n3, g3.Slots)
	}
	// Some checked keys moved to group 3: their histories span two groups.
	if !slices.ContainsFunc(keys, func(k string) bool { return cm.Owner(kv.KeySlot([]byte(k))) == 3 }) {
		t.Fatalf("no checked key is in group 3's slots %v", g3.Slots)
	}
	// Writes acknowledged in group 3's slots, after the rebalance.
	before := len(load.Acked())
	time.Sleep(time.Second)
	load.Stop()
	acked := load.Acked()
	in3 := 0
	for k := range acked {
		if cm.Owner(kv.KeySlot([]byte(k))) == 3 {
			in3++
		}
	}
	if in3 == 0 || len(acked) == before {
		t.Fatalf("%d writes acknowledged in group 3's slots, %d after the rebalance", in3, len(acked)-before)
	}
	// CLUSTER SLOTS and SHARDS name the new nodes, at every node.
	all := append(slices.Clone(live), news[0].ClientAddr, news[1].ClientAddr, news[2].ClientAddr)
	for _, a := range all {
		var got []string
		if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool {
			got = slotsAddrs(t, a)
			return len(got) == 6
		}) {
			t.Fatalf("CLUSTER SLOTS at %s names %v, want all six nodes", a, got)
		}
		v, err := cluster.Command(a, "CLUSTER", "SHARDS")
		if err != nil || v.Kind != resp.Array || len(v.Elems) != 3 {
			t.Fatalf("CLUSTER SHARDS at %s: %v %+v", a, err, v)
		}
		for _, n := range news {
			_, port, _ := net.SplitHostPort(n.ClientAddr)
			if !strings.Contains(fmt.Sprint(v), port) {
				t.Fatalf("CLUSTER SHARDS at %s does not name %s (%s): %v", a, n.ID, n.ClientAddr, v)
			}
		}
	}
	// Every acknowledged write, at every node's own replicas.
	t.Logf("%d sync writes acknowledged, %d in group 3's slots", len(acked), in3)
	for _, a := range all {
		readBack(t, a, acked)
	}
	load.CheckLinearizable(t)

	// Node 5 SIGKILLed; group 3 goes on with nodes 4 and 6; node 5
	// restarted without --join comes back from its directory as a member
	// of group 3 (no second bootstrap) and catches up.
	n5 := news[1]
	n5.Kill()
	c := dialGroup(t, all[:3])
	more := putInSlots(t, c, "after-kill-", "group 3 with node 5 down", func(slot uint16) bool { return cm.Owner(slot) == 3 })
	// Its record says it bootstrapped: the restart (and any later open,
	// even one whose vr/ is gone) does not start the group anew.
	if b, err := os.ReadFile(filepath.Join(n5.Dir, "group-3", "kefir-join.json")); err != nil || !strings.Contains(string(b), `"created":true`) || !strings.Contains(string(b), `"opened":true`) {
		t.Fatalf("node 5's record of group 3: %v %s", err, b)
	}
	n5.Args = []string{"--replica-id", "5", "--cluster-secret", "e2e-groups-secret"}
	n5.Restart()
	if gc, err := groupConfigOf(t, n5.ClientAddr, 3); err != nil || gc.Epoch != 0 || !slices.Equal(gc.Members, []uint64{4, 5, 6}) {
		t.Fatalf("restarted node 5's replica of group 3: %s %v", gc, err)
	}
	for k, v := range acked {
		if cm.Owner(kv.KeySlot([]byte(k))) == 3 {
			more[k] = v
		}
	}
	readBack(t, n5.ClientAddr, more)

	// A group on running nodes, two of them started from their flags
	// (nodes 1 and 2) and one that joined (node 6): they start it while
	// they run (the map names them); it gets slots by move-slots and
	// serves them; node 1 restarted from its flags reopens it from its
	// directory.
	out, err = kefirCluster(t, "add-group", addr, "--members", "1,2,6")
	if err != nil || !strings.Contains(out, "group 4 is running") {
		t.Fatalf("add-group 1,2,6: %v\n%s", err, out)
	}
	// 100 slots group 1 still owns: which end of its range the rebalance
	// gave group 3 depends on where the load's keys fell (0-2805 once).
	lo := -1
	for s := 0; s+99 < kv.NumSlots && lo < 0; s++ {
		lo = s
		for x := s; x <= s+99; x++ {
			if cm.Owner(uint16(x)) != 1 {
				lo = -1
				break
			}
		}
	}
	if lo < 0 {
		t.Fatalf("group 1 owns no 100 consecutive slots after the rebalance: %+v", cm)
	}
	hi := lo + 99
	if out, err := kefirCluster(t, "move-slots", addr, "--from", "1", "--to", "4", "--slots", fmt.Sprintf("%d-%d", lo, hi)); err != nil {
		t.Fatalf("move-slots to group 4: %v\n%s", err, out)
	}
	in4 := putInSlots(t, c, "g4-", "group 4", func(slot uint16) bool { return int(slot) >= lo && int(slot) <= hi })
	n1 := g.Nodes[0]
	const started = "named by the map in a new group: started it as one of its first members"
	if strings.Count(n1.Logs(), started) != 1 {
		t.Fatalf("node 1 did not start group 4 while running:\n%s", n1.Logs())
	}
	n1.Kill()
	n1.Restart()
	if gc, err := groupConfigOf(t, n1.ClientAddr, 4); err != nil || gc.Epoch != 0 || !slices.Equal(gc.Members, []uint64{1, 2, 6}) {
		t.Fatalf("restarted node 1's replica of group 4: %s %v\n%s", gc, err, n1.Logs())
	}
	if strings.Count(n1.Logs(), started) != 1 {
		t.Fatalf("restarted node 1 started group 4 anew instead of reopening its replica:\n%s", n1.Logs())
	}
	readBack(t, n1.ClientAddr, in4)
	readBack(t, news[2].ClientAddr, in4)
}
