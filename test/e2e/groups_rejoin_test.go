package e2e

import (
	"context"
	"fmt"
	"os"
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

// A node named again in a data group its replica retired from (issue 28;
// docs/cluster.md "Replacing a failed node", docs/design/cluster.md
// "Rejoining a group"): groups 1=1,2,3; 2=3,4,5; 3=1,4,5. replace-node
// --old 4 --group 2 moves group 2 to [3 2 5] (node 4's replica of it
// retires; node 4 stays up for groups 3); node 5 dies and replace-node
// --old 5 places group 2 on node 4 again ([3 2 4]). Node 4's replica must
// be a member for good: after node 4 restarts and node 2 dies, group 2 runs
// on {3, 4} with every acknowledged write. Run with node 4 up throughout
// (its retired replica, still open, takes part again) and with node 4
// restarted between its retirement and the re-add (the replica is opened
// again from its directory).
func TestGroupsRejoinARetiredGroup(t *testing.T) {
	for _, restartBetween := range []bool{false, true} {
		t.Run(fmt.Sprintf("restartBetween=%v", restartBetween), func(t *testing.T) {
			testRejoinRetired(t, restartBetween)
		})
	}
}

func testRejoinRetired(t *testing.T, restartBetween bool) {
	g := cluster.StartGroups(t, 5, "1=1,2,3:0-5000;2=3,4,5:5001-10000;3=1,4,5:10001-16383")
	g.WaitLeaders(20 * time.Second)
	n2, n3, n4, n5 := g.Nodes[1], g.Nodes[2], g.Nodes[3], g.Nodes[4]
	tomb := filepath.Join(n4.Dir, "group-2", "kefir-retired.json")
	addr := "--addr=" + g.Nodes[0].ClientAddr + "," + n2.ClientAddr

	var keys []string // group 2's (slots 5001-10000), acknowledged
	write := func(prefix string, n int, addrs []string) {
		t.Helper()
		for i := 0; n > 0; i++ {
			k := prefix + strconv.Itoa(i)
			if s := kv.KeySlot([]byte(k)); s < 5001 || s > 10000 {
				continue
			}
			if err := setSomewhere(addrs, k, "v-"+k); err != nil {
				t.Fatalf("SET %s: %v", k, err)
			}
			keys, n = append(keys, k), n-1
		}
	}
	write("a", 30, g.Addrs())

	out, err := kefirCluster(t, "replace-node", addr, "--old", "4", "--group", "2")
	if err != nil {
		t.Fatalf("replace-node --old 4 --group 2: %v\n%s", err, out)
	}
	if !testgroup.Until(15*time.Second, 50*time.Millisecond, func() bool { _, err := os.Stat(tomb); return err == nil }) {
		t.Fatalf("node 4's replica of group 2 did not retire:\n%s", n4.Logs())
	}
	write("b", 30, g.Addrs())
	// Node 2 holds group 2's epoch start before node 5 goes (a new member
	// that has not caught up would leave [3 2 5] without a majority).
	caughtUp(t, g.Addrs(), 2)
	t.Logf("node 4's replica of group 2 retired; group 2 caught up")
	if restartBetween {
		n4.Kill()
		n4.Start()
		if !strings.Contains(n4.Logs(), "not opening a group this node's replica retired from") {
			t.Fatalf("node 4 opened its retired replica of group 2 at a restart:\n%s", n4.Logs())
		}
	}

	n5.Kill()
	out, err = kefirCluster(t, "replace-node", addr, "--old", "5")
	if err != nil {
		t.Fatalf("replace-node --old 5: %v\n%s", err, out)
	}
	live := []string{g.Nodes[0].ClientAddr, n2.ClientAddr, n3.ClientAddr, n4.ClientAddr}
	var members []uint64
	if !testgroup.Until(15*time.Second, 100*time.Millisecond, func() bool {
		c, err := groupConfigOf(t, n3.ClientAddr, 2)
		members = c.Members
		return err == nil && !slices.Contains(c.Members, 5)
	}) {
		t.Fatalf("group 2 still names node 5: %v\n%s", members, out)
	}
	if !slices.Contains(members, 4) {
		t.Fatalf("placement put group 2 on %v, not on node 4 (the case under test):\n%s", members, out)
	}
	// Node 4 takes its replica back: the retired record goes (durably:
	// the restart below opens the replica).
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { _, err := os.Stat(tomb); return os.IsNotExist(err) }) {
		t.Errorf("node 4 is named in group 2 again (%v) but keeps its retired record", members)
	}
	// Each way back is the one under test: the open replica un-retired,
	// or the closed one reopened from its directory.
	want := "is a member again: its retired record is removed"
	if restartBetween {
		want = "reopened the replica from its directory"
	}
	if !testgroup.Until(5*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n4.Logs(), want) }) {
		t.Errorf("node 4 does not log %q", want)
	}
	caughtUp(t, live, 2)
	t.Logf("group 2 is %v again, caught up", members)
	write("c", 100, live)

	n4.Kill()
	n4.Start()
	if strings.Contains(n4.Logs(), "not opening a group this node's replica retired from") && !restartBetween {
		t.Errorf("node 4 did not open its replica of group 2 at a restart")
	}
	// Group 2 is [3 2 4]: with node 2 gone it runs on {3, 4}, which must
	// hold every acknowledged write.
	n2.Kill()
	live = []string{g.Nodes[0].ClientAddr, n3.ClientAddr, n4.ClientAddr}
	write("d", 20, live)
	for _, k := range keys {
		v, err := getSomewhere(live, k)
		if err != nil || v != "v-"+k {
			t.Fatalf("GET %s with group 2 on nodes 3 and 4: %q, %v (want %q)\nnode 4:\n%s", k, v, err, "v-"+k, n4.Logs())
		}
	}
}

// caughtUp waits until every member of group id persisted its epoch's
// start (KEFIR.GROUP PROGRESS at its leader, through seeds).
func caughtUp(t *testing.T, seeds []string, id int) {
	t.Helper()
	mv := &kcluster.Mover{Seeds: seeds, RetryFor: time.Second}
	defer mv.Close()
	var p kcluster.GroupProgress
	var err error
	if !testgroup.Until(30*time.Second, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if p, err = mv.GroupProgress(ctx, kcluster.GroupID(id)); err != nil {
			return false
		}
		for _, op := range p.Persisted {
			if op < p.Start {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("group %d's members did not catch up: %+v, %v", id, p, err)
	}
}

// setSomewhere sets k to v through any of addrs (a node that does not
// route it, or a group between leaders, is tried again), for up to 20 s.
func setSomewhere(addrs []string, k, v string) error {
	_, err := commandSomewhere(addrs, "SET", k, v)
	return err
}

// getSomewhere reads k through any of addrs, as setSomewhere.
func getSomewhere(addrs []string, k string) (string, error) {
	r, err := commandSomewhere(addrs, "GET", k)
	if err != nil {
		return "", err
	}
	if r.Kind != resp.Bulk {
		return "", fmt.Errorf("GET %s: %s reply %q", k, r.Kind, r.Str)
	}
	return string(r.Str), nil
}

// commandSomewhere runs args at the first of addrs that answers it with
// no error (a node that does not route the key answers MOVED, a group
// between leaders an error), trying for up to 20 s.
func commandSomewhere(addrs []string, args ...string) (resp.Value, error) {
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, a := range addrs {
			r, err := cluster.Command(a, args...)
			if err == nil && r.Kind == resp.Error {
				err = fmt.Errorf("%s: %s", a, r.Str)
			}
			if err == nil {
				return r, nil
			}
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return resp.Value{}, fmt.Errorf("%v: %w", args, last)
}
