package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Shrinking a cluster by a group (issue 28; docs/cluster.md, "Shrinking a
// cluster"; docs/design/cluster.md §7 "Removing a group"): three nodes,
// groups 1, 2 and 3 on all three, under a checked workload (keys of every
// group) and sync writers throughout. Bad removals are refused before
// anything changes (the metadata group, an unknown group), and the map's
// removal of a group that still owns slots is refused. `kefir cluster
// remove-group --id 2`, slowed down, is SIGKILLed in the middle of its first
// move; the map still has group 2, and its removal is refused while the move
// is in flight. Run again it finishes the move, spreads the rest of group
// 2's slots over groups 1 and 3 and removes it: the map lists group 2 as
// removed, every node's CLUSTER SHARDS and kefir cluster status leave it
// out, and every node stops its replica of group 2 and deletes its data,
// keeping the tombstone. A third run is a no-op. Then group 1 — the first
// group each node opened, whose engine is the node's own handle — is
// removed too: its replicas leave the routing at once and their data goes
// at the next start. Removing group 3, the last, is refused. Every
// acknowledged write reads back at every node, the history is
// linearizable, and node 3 restarted from its flags (which still name
// groups 1 and 2) opens neither and deletes group 1's data.
func TestGroupsRemoveAGroup(t *testing.T) {
	g := cluster.StartGroups(t, 3, "1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()
	// Keys in group 2's slots, so that its move takes a while.
	var cmds [][]string
	for i := 0; len(cmds) < 400; i++ {
		k := "p" + strconv.Itoa(i)
		if s := kv.KeySlot([]byte(k)); s >= 5461 && s <= 10922 {
			cmds = append(cmds, []string{"SET", k, "v" + k})
		}
	}
	pipelineRetry(t, live[0], cmds...)
	var keys []string
	for i := 0; len(keys) < 6; i++ {
		k := "k" + strconv.Itoa(i)
		if int(kv.KeySlot([]byte(k)))*6/16384 == len(keys) {
			keys = append(keys, k)
		}
	}
	load := startGroupLoad(t, live, keys, nil)
	addr := "--addr=" + strings.Join(live, ",")
	mapOf := func() *kv.ClusterMap {
		t.Helper()
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
		{[]string{"remove-group", addr, "--id", "65535"}, "is the metadata group"},
		{[]string{"remove-group", addr, "--id", "7"}, "no group 7 in the cluster map"},
	} {
		out, err := kefirCluster(t, bad.args...)
		if err == nil || !strings.Contains(out, bad.want) || !strings.Contains(out, "nothing changed") {
			t.Fatalf("kefir cluster %v: %v, want %q and nothing changed:\n%s", bad.args, err, bad.want, out)
		}
	}
	// The map's op itself, at the metadata leader (the command checks
	// first; the map refuses on its own too).
	// removeInMap asks the metadata group itself, following its leader,
	// and asks again while it has none (a view change under the box's
	// load: "UNAVAILABLE no leader"), for up to 20 s.
	removeInMap := func(epoch uint64) (resp.Value, error) {
		a := live[0]
		deadline := time.Now().Add(20 * time.Second)
		for redirects := 0; redirects < 3; {
			v, err := cluster.Command(a, "KEFIR.SLOTS", "META", "REMOVEGROUP", "2", strconv.FormatUint(epoch, 10))
			if err == nil && v.Kind == resp.Error && strings.HasPrefix(string(v.Str), "UNAVAILABLE") && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if err != nil || v.Kind != resp.Error || !strings.HasPrefix(string(v.Str), "MOVED ") {
				return v, err
			}
			a = strings.TrimPrefix(string(v.Str), "MOVED ")
			redirects++
		}
		return resp.Value{}, fmt.Errorf("redirected too often")
	}
	if v, err := removeInMap(e0); err != nil || v.Kind != resp.Error || !strings.Contains(string(v.Str), "group 2 owns slots") {
		t.Fatalf("the map's removal of a group that owns slots: %v %s", err, v.Str)
	}
	if e := mapOf().Epoch; e != e0 {
		t.Fatalf("refused removals moved the map from epoch %d to %d", e0, e)
	}

	// The first run, slowed down and SIGKILLed in its move.
	drv := exec.Command(cluster.Binary(t), "cluster", "remove-group", addr, "--id", "2", "--page", "5", "--page-pause", "100ms", "--lease", "1s")
	var out testgroup.Buffer
	drv.Stdout, drv.Stderr = &out, &out
	if err := drv.Start(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(out.String(), "recorded the move") }) {
		_ = drv.Process.Kill()
		t.Fatalf("remove-group did not start moving group 2's slots:\n%s", out.String())
	}
	time.Sleep(500 * time.Millisecond)
	_ = drv.Process.Kill()
	_ = drv.Wait()
	t.Logf("first run, killed after %v:\n%s", time.Since(t0).Round(time.Millisecond), out.String())
	cm := mapOf()
	if _, ok := cm.Group(2); !ok || len(cm.Moves) != 1 || cm.Moves[0].From != 2 {
		t.Fatalf("after the first run died the map should have group 2 and its move in flight: %+v", cm)
	}
	if v, err := removeInMap(cm.Epoch); err != nil || v.Kind != resp.Error || !strings.Contains(string(v.Str), "is in flight") {
		t.Fatalf("the map's removal of a group whose move is in flight: %v %s", err, v.Str)
	}

	// The rerun finishes the move, then removes the group.
	t1 := time.Now()
	res, err := kefirCluster(t, "remove-group", addr, "--id", "2", "--page-pause", "0", "--lease", "1s")
	if err != nil || !strings.Contains(res, "group 2 is removed from the map at epoch") {
		t.Fatalf("remove-group again: %v\n%s", err, res)
	}
	t.Logf("rerun (%v):\n%s", time.Since(t1).Round(time.Millisecond), strings.TrimSpace(res))
	cm = mapOf()
	if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool { cm = mapOf(); return len(cm.Removed) == 1 }) {
		t.Fatalf("node 1's map does not have group 2 removed: %+v", cm)
	}
	_, ok1 := cm.Group(1)
	_, ok3 := cm.Group(3)
	if _, ok := cm.Group(2); ok || !ok1 || !ok3 || cm.Removed[0] != 2 || len(cm.Groups) != 2 || len(cm.Moves) != 0 ||
		cm.Owner(5461) == 2 || cm.Owner(10922) == 2 || cm.Owner(5461) == cm.Owner(10922) {
		t.Fatalf("the map after the removal (group 2's slots to groups 1 and 3): %+v", cm)
	}
	e1 := cm.Epoch
	if out, err := kefirCluster(t, "remove-group", addr, "--id", "2"); err != nil || !strings.Contains(out, "group 2 is not in the map (removed") {
		t.Fatalf("remove-group a third time: %v\n%s", err, out)
	}
	if e := mapOf().Epoch; e != e1 {
		t.Fatalf("the rerun moved the map from epoch %d to %d", e1, e)
	}

	// gone checks that node n no longer hosts group gid and keeps its
	// tombstone, its data deleted (unless kept until the next start),
	// and that its cluster replies show shards groups.
	gone := func(n *cluster.Node, gid int, dataDeleted bool, shards int) {
		t.Helper()
		dir := filepath.Join(n.Dir, "group-"+strconv.Itoa(gid))
		if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool {
			_, err := os.Stat(filepath.Join(dir, "kefir-retired.json"))
			_, errData := os.Stat(filepath.Join(dir, "vr"))
			return err == nil && dataDeleted == os.IsNotExist(errData)
		}) {
			_, errData := os.Stat(filepath.Join(dir, "vr"))
			t.Fatalf("%s: no tombstone of group %d, or its data deleted %v, want %v:\n%s", n.ID, gid, os.IsNotExist(errData), dataDeleted, n.Logs())
		}
		// The tombstone is written before the replica leaves the routing
		// (a crash between the two must not reopen it), so the node may
		// answer for the group a moment after the tombstone appears.
		var gc kcluster.GroupConfig
		if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool {
			var err error
			gc, err = groupConfigOf(t, n.ClientAddr, gid)
			return err != nil
		}) {
			t.Fatalf("%s still answers for group %d: %s", n.ID, gid, gc)
		}
		var v resp.Value
		var err error
		if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool {
			v, err = cluster.Command(n.ClientAddr, "CLUSTER", "SHARDS")
			return err == nil && v.Kind == resp.Array && len(v.Elems) == shards
		}) {
			t.Fatalf("CLUSTER SHARDS at %s after group %d's removal: %v %v", n.ID, gid, err, v)
		}
	}
	// Every node retired its replica of group 2: stopped, data deleted,
	// the tombstone kept; the cluster replies and status leave it out.
	for _, n := range g.Nodes {
		gone(n, 2, true, 2)
		if !strings.Contains(n.Logs(), "the group was removed from the cluster map: stopped this node's replica of it and deleted its data") {
			t.Fatalf("%s did not log its replica's retirement:\n%s", n.ID, n.Logs())
		}
	}
	if st, err := kefirCluster(t, "status", addr); err != nil || strings.Contains(st, "  2  members") || !strings.Contains(st, "  1  members") {
		t.Fatalf("kefir cluster status after the removal: %v\n%s", err, st)
	}

	// Group 1, each node's first: out of the routing at once, its data
	// deleted at the next start. Then group 3 is the last.
	t2 := time.Now()
	if out, err := kefirCluster(t, "remove-group", addr, "--id", "1", "--page-pause", "0"); err != nil || !strings.Contains(out, "group 1 is removed from the map") {
		t.Fatalf("remove-group --id 1: %v\n%s", err, out)
	}
	t.Logf("remove-group --id 1: %v", time.Since(t2).Round(time.Millisecond))
	for _, n := range g.Nodes {
		gone(n, 1, false, 1)
		if !strings.Contains(n.Logs(), "it is closed at shutdown and its data deleted at the next start") {
			t.Fatalf("%s did not log its replica's retirement:\n%s", n.ID, n.Logs())
		}
	}
	e2 := mapOf().Epoch
	if out, err := kefirCluster(t, "remove-group", addr, "--id", "3"); err == nil || !strings.Contains(out, "last data group") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("remove-group of the last group: %v\n%s", err, out)
	}
	if cm := mapOf(); cm.Epoch != e2 || len(cm.Groups) != 1 || cm.Groups[0].ID != 3 || !slices.Equal(cm.Removed, []uint64{1, 2}) {
		t.Fatalf("the map after removing groups 1 and 2 (and refusing 3): %+v", cm)
	}
	time.Sleep(500 * time.Millisecond) // writes after the removals
	load.Stop()
	acked := load.Acked()
	for _, c := range cmds {
		acked[c[1]] = c[2]
	}
	t.Logf("%d acknowledged writes (400 preloaded in group 2's slots)", len(acked))
	if v, err := cluster.Command(live[0], "DBSIZE"); err != nil || v.Int < int64(len(acked)) {
		t.Fatalf("DBSIZE after the removals: %v %v, want at least %d", err, v.Int, len(acked))
	}
	for _, a := range live {
		readBack(t, a, acked)
	}
	load.CheckLinearizable(t)

	// Node 3 restarted from its flags, which still name groups 1 and 2:
	// it opens neither, and deletes group 1's data.
	n3 := g.Nodes[2]
	n3.Kill()
	n3.Restart()
	if strings.Count(n3.Logs(), "not opening a group this node's replica retired from") != 2 ||
		!strings.Contains(n3.Logs(), "deleted the data of a removed group's replica") {
		t.Fatalf("restarted node 3 did not skip groups 1 and 2:\n%s", n3.Logs())
	}
	gone(n3, 1, true, 1)
	gone(n3, 2, true, 1)
	readBack(t, n3.ClientAddr, acked)
}
