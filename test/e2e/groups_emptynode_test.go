package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// A node whose last group is removed stays up, empty (issue 28;
// docs/cluster.md "Shrinking a cluster"; docs/design/cluster.md "An empty
// node"): the layout of `kefir up --nodes 5 --groups 3` (groups 1-3 on
// nodes 1-3, 2-4 and 3-5: node 5's only group is 3). `kefir cluster
// remove-group --id 3` moves group 3's slots away and removes it; node 5
// retires its replica (the tombstone kept) and keeps running: it answers
// PING and CLUSTER SLOTS, reads every acknowledged write and takes writes
// (forwarded), and `kefir cluster status` lists it with no groups. SIGKILLed
// and restarted from its flags (which still name group 3) it comes back
// empty and serving. Then `kefir cluster add-group --members 5,4,1` starts
// group 4 on it, `move-slots` gives group 4 100 slots, and writes to them
// read back at node 5.
func TestGroupsEmptyNodeStaysUp(t *testing.T) {
	g := cluster.StartGroups(t, 5, "1=1,2,3:0-5460;2=2,3,4:5461-10922;3=3,4,5:10923-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()
	n5 := g.Nodes[4]
	acked := map[string]string{}
	var cmds [][]string
	for i := range 300 {
		k := "e" + strconv.Itoa(i)
		cmds = append(cmds, []string{"SET", k, "v" + k})
		acked[k] = "v" + k
	}
	pipelineRetry(t, live[0], cmds...)
	addr := "--addr=" + strings.Join(live[:3], ",")
	out, err := kefirCluster(t, "remove-group", addr, "--id", "3", "--page-pause", "0")
	if err != nil || !strings.Contains(out, "group 3 is removed from the map at epoch") || !strings.Contains(out, "nodes [5] are in no other group: they stay up, empty") {
		t.Fatalf("remove-group --id 3: %v\n%s", err, out)
	}
	tomb := filepath.Join(n5.Dir, "group-3", "kefir-retired.json")
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
		_, err := os.Stat(tomb)
		return err == nil && strings.Contains(n5.Logs(), "this node hosts no group now")
	}) {
		t.Fatalf("node 5 did not retire its replica of group 3, or did not say it is empty:\n%s", n5.Logs())
	}
	// serves checks that node 5 runs and serves, empty.
	serves := func(phase string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond) // a node that retires as a whole exits at once
		if !n5.Running() {
			t.Fatalf("%s: node 5 exited (exit %d):\n%s", phase, n5.Wait(time.Second), n5.Logs())
		}
		if _, err := os.Stat(filepath.Join(n5.Dir, "kefir-retired.json")); err == nil {
			t.Fatalf("%s: node 5 recorded its retirement as a node", phase)
		}
		if v, err := cluster.Command(n5.ClientAddr, "PING"); err != nil || string(v.Str) != "PONG" {
			t.Fatalf("%s: PING at node 5: %v %v", phase, err, v)
		}
		if v, err := cluster.Command(n5.ClientAddr, "CLUSTER", "SLOTS"); err != nil || v.Kind != resp.Array || len(v.Elems) < 2 {
			t.Fatalf("%s: CLUSTER SLOTS at node 5: %v %v", phase, err, v)
		}
		readBack(t, n5.ClientAddr, acked)
		k := "w-" + phase
		pipelineRetry(t, n5.ClientAddr, []string{"SET", k, "x"})
		acked[k] = "x"
		readBack(t, live[0], map[string]string{k: "x"})
		st, err := kefirCluster(t, "status", addr)
		if err != nil || !strings.Contains(st, "  5  client "+n5.ClientAddr) || !strings.Contains(st, n5.PeerAddr+"  no groups (empty") {
			t.Fatalf("%s: kefir cluster status does not list node 5 with no groups: %v\n%s", phase, err, st)
		}
	}
	serves("removed")

	n5.Restart()
	if !strings.Contains(n5.Logs(), "starting empty") {
		t.Fatalf("restarted node 5 did not start empty:\n%s", n5.Logs())
	}
	serves("restarted")

	// A group on it again: add-group --members names it, move-slots gives
	// the group slots, and node 5 serves them.
	out, err = kefirCluster(t, "add-group", addr, "--members", "5,4,1")
	if err != nil || !strings.Contains(out, "group 4 is running") {
		t.Fatalf("add-group --members 5,4,1: %v\n%s", err, out)
	}
	if out, err := kefirCluster(t, "move-slots", addr, "--from", "1", "--to", "4", "--slots", "0-99"); err != nil {
		t.Fatalf("move-slots to group 4: %v\n%s", err, out)
	}
	in4 := putInSlots(t, dialGroup(t, []string{n5.ClientAddr}), "g4-", "group 4", func(slot uint16) bool { return slot <= 99 })
	readBack(t, n5.ClientAddr, in4)
	readBack(t, live[0], in4)
	if gc, err := groupConfigOf(t, n5.ClientAddr, 4); err != nil || fmt.Sprint(gc.Members) != "[5 4 1]" {
		t.Fatalf("node 5's replica of group 4: %s %v\n%s", gc, err, n5.Logs())
	}
	readBack(t, n5.ClientAddr, acked)
}
