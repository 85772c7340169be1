package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// A second `kefir server` on a live node's --dir exits at once, naming the
// holder's pid, and leaves the directory alone: the first node serves on, and
// its next start (after a graceful stop) records no crash. Before the lock the
// second process recovered the directory as if the first had crashed, wrote a
// hole and a new reservation into it, and only then failed to bind its port.
func TestSecondServerOnALiveDirectoryExitsAtOnce(t *testing.T) {
	const crashLine = "versions handed out before a crash were not on disk"
	n := cluster.NewNode(t, "n1")
	n.Start()
	if got := redisCLI(t, n.ClientAddr, "SET", "a", "1"); got != "OK" {
		t.Fatalf("SET: %s", got)
	}
	// Its own ports, the same directory: only the lock can stop it.
	intruder := cluster.NewNode(t, "n1-again")
	intruder.Dir = n.Dir
	start := time.Now()
	startExpectExit(t, intruder)
	took := time.Since(start)
	logs := intruder.Logs()
	if !strings.Contains(logs, "in use by another kefir process (pid "+strconv.Itoa(n.Pid())+";") {
		t.Fatalf("the second server's refusal does not name the holder's pid %d:\n%s", n.Pid(), logs)
	}
	if strings.Contains(logs, crashLine) || strings.Contains(logs, "shard open") {
		t.Fatalf("the second server opened the directory before refusing:\n%s", logs)
	}
	if took > 5*time.Second {
		t.Fatalf("the second server took %v to refuse", took)
	}
	if got := redisCLI(t, n.ClientAddr, "GET", "a"); got != "1" {
		t.Fatalf("GET a on the first node = %q", got)
	}
	if code := n.Stop(); code != 0 {
		t.Fatalf("graceful stop exited %d", code)
	}
	before := len(n.Logs())
	n.Start()
	if restart := n.Logs()[before:]; strings.Contains(restart, crashLine) {
		t.Fatalf("the first node's restart after a graceful stop records a crash:\n%s", restart)
	}
	if got := redisCLI(t, n.ClientAddr, "GET", "a"); got != "1" {
		t.Fatalf("GET a after the restart = %q", got)
	}
	t.Logf("the second server refused in %v", took.Round(time.Millisecond))
}

// The same for a replica's directory.
func TestSecondServerOnALiveReplicaDirectoryExitsAtOnce(t *testing.T) {
	g := startGroup(t)
	g.leader(-1)
	n := g.nodes[1]
	intruder := cluster.NewNode(t, "n2-again")
	intruder.Dir = n.Dir
	intruder.Args = replicaArgs(g.members, 2, false)
	startExpectExit(t, intruder)
	if logs := intruder.Logs(); !strings.Contains(logs, "in use by another kefir process (pid "+strconv.Itoa(n.Pid())+";") {
		t.Fatalf("the second replica's refusal does not name the holder's pid %d:\n%s", n.Pid(), logs)
	}
	if got := redisCLI(t, n.ClientAddr, "SET", "a", "1"); got != "OK" {
		t.Fatalf("SET through the live replica: %s", got)
	}
}
