package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// `kefir up` grows a cluster of groups: run again on its directory with
// more --nodes, it starts the new nodes empty and records them in the
// map; each serves at once (forwarding what it does not host), a group
// can be placed on it, and a restart brings it back as it was. Every
// other change of the layout is refused before a node starts, saying how
// to run the cluster.
func TestUpGrowsAClusterOfGroups(t *testing.T) {
	base := freeBase(t, 4)
	dir := t.TempDir()
	a := upAddrsOf(base, 4)
	u := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--nodes", "3", "--groups", "2")
	if r := setOnce(a.client[0], "before", "grown"); r != "+OK" {
		t.Fatalf("SET before: %s", r)
	}
	u.stop(t)

	u = startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--nodes", "4", "--groups", "2")
	if !strings.Contains(u.banner, "Added to the cluster, hosting no replica yet: n4") {
		t.Fatalf("the banner does not say n4 was added:\n%s", u.banner)
	}
	// n4 serves at once: it forwards what it does not host.
	if v, err := cluster.Command(a.client[3], "GET", "before"); err != nil || string(v.Str) != "grown" {
		t.Fatalf("GET through n4: %+v %v\n%s", v, err, u.Logs())
	}
	if out, err := kefirCluster(t, "status", "--addr", a.client[0]); err != nil || !strings.Contains(out, fmt.Sprintf("4  client %s", a.client[3])) {
		t.Fatalf("cluster status does not list n4: %v\n%s", err, out)
	}
	// Restarted before any group is placed on it: it comes back empty,
	// serving (a node that never had a group is not a retired one).
	u.stop(t)
	u = startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--nodes", "4", "--groups", "2")
	if strings.Contains(u.banner, "Added to the cluster") {
		t.Fatalf("a restart says it added nodes:\n%s", u.banner)
	}
	if v, err := cluster.Command(a.client[3], "GET", "before"); err != nil || string(v.Str) != "grown" {
		t.Fatalf("GET through n4 restarted empty: %+v %v\n%s", v, err, u.Logs())
	}
	// A group placed on it, given slots, serves their keys.
	if out, err := kefirCluster(t, "add-group", "--addr", a.client[0], "--members", "4,1,2"); err != nil {
		t.Fatalf("add-group on n4: %v\n%s", err, out)
	}
	if out, err := kefirCluster(t, "move-slots", "--addr", a.client[0], "--from", "1", "--to", "3", "--slots", "0-99"); err != nil {
		t.Fatalf("move-slots to n4's group: %v\n%s", err, out)
	}
	in3 := map[string]string{}
	for i := 0; len(in3) < 10; i++ {
		k := "g3-" + strconv.Itoa(i)
		if kv.KeySlot([]byte(k)) > 99 {
			continue
		}
		if r := setOnce(a.client[3], k, "v"+k); r != "+OK" {
			t.Fatalf("SET %s at n4: %s", k, r)
		}
		in3[k] = "v" + k
	}
	u.stop(t)

	// Restarted with the same flags: n4 comes back from its directory,
	// hosting group 3; nothing is added.
	u = startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--nodes", "4", "--groups", "2")
	if strings.Contains(u.banner, "Added to the cluster") {
		t.Fatalf("a restart says it added nodes:\n%s", u.banner)
	}
	for _, addr := range a.client {
		for k, want := range in3 {
			v, err := cluster.Command(addr, "GET", k)
			if err != nil || string(v.Str) != want {
				t.Fatalf("GET %s at %s after the restart: %+v %v", k, addr, v, err)
			}
		}
	}
	u.stop(t)

	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--nodes", "3", "--groups", "2"}, "node directories up to n4"},
		{[]string{"--nodes", "4", "--groups", "3"}, "started with --groups 2, not 3"},
	} {
		args := append([]string{"up", "--dir", dir, "--base-port", strconv.Itoa(base)}, c.args...)
		out, err := exec.Command(cluster.Binary(t), args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.says) || !strings.Contains(string(out), "run kefir up --dir "+dir+" --nodes 4 --groups 2") {
			t.Errorf("kefir up %v: %v, want it refused saying %q and how to run the cluster:\n%s", c.args, err, c.says, out)
		}
	}
}

// A new node's directory without its join record (the node was killed
// between creating it and recording what the map told it, or kefir up
// stopped then) is a node that has not joined yet: the next kefir up
// starts it with --join again, rather than as a node with neither --join
// nor a record, which cannot start.
func TestUpGrowsPastAnUnjoinedNodeDirectory(t *testing.T) {
	base := freeBase(t, 4)
	dir := t.TempDir()
	a := upAddrsOf(base, 4)
	u := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--nodes", "3", "--groups", "2")
	u.stop(t)
	if err := os.Mkdir(filepath.Join(dir, "n4"), 0o755); err != nil {
		t.Fatal(err)
	}
	u = startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--nodes", "4", "--groups", "2")
	if !strings.Contains(u.banner, "Added to the cluster, hosting no replica yet: n4") {
		t.Fatalf("the banner does not say n4 was added:\n%s", u.banner)
	}
	if r := setOnce(a.client[3], "through", "n4"); r != "+OK" {
		t.Fatalf("SET through n4: %s", r)
	}
	u.stop(t)
}
