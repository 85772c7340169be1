package server

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// clusterScript are CLUSTER requests whose replies do not depend on the
// slot map: argument checks, arity, unknown subcommands and hash slots. A
// single redis-server in cluster mode (no slots assigned) answers them as a
// cluster of any size does, and a Kefir node (one group owning every slot)
// must answer them alike: clients and tools match these texts.
var clusterScript = []string{
	"CLUSTER KEYSLOT {}", "CLUSTER KEYSLOT {", "CLUSTER KEYSLOT a{}b{c}", "CLUSTER KEYSLOT a{b}c{d}",
	"CLUSTER KEYSLOT }{", "CLUSTER KEYSLOT", "CLUSTER KEYSLOT a b",
	"CLUSTER MYID x", "CLUSTER INFO x", "CLUSTER SLOTS x", "CLUSTER NODES x", "CLUSTER SHARDS x", "CLUSTER HELP x",
	"CLUSTER COUNTKEYSINSLOT", "CLUSTER COUNTKEYSINSLOT 1 2", "CLUSTER COUNTKEYSINSLOT 100",
	"CLUSTER COUNTKEYSINSLOT -1", "CLUSTER COUNTKEYSINSLOT 16384", "CLUSTER COUNTKEYSINSLOT abc",
	"CLUSTER GETKEYSINSLOT", "CLUSTER GETKEYSINSLOT 100", "CLUSTER GETKEYSINSLOT 100 10 x",
	"CLUSTER GETKEYSINSLOT 100 10", "CLUSTER GETKEYSINSLOT 100 0", "CLUSTER GETKEYSINSLOT 100 -1",
	"CLUSTER GETKEYSINSLOT 100 abc", "CLUSTER GETKEYSINSLOT abc 10", "CLUSTER GETKEYSINSLOT abc -1",
	"CLUSTER GETKEYSINSLOT 16384 10", "CLUSTER GETKEYSINSLOT -1 10", "CLUSTER GETKEYSINSLOT 99999 abc",
	"CLUSTER REPLICAS", "CLUSTER REPLICAS a b", "CLUSTER SLAVES", "CLUSTER REPLICAS nosuchnode",
	"CLUSTER SLAVES 0123456789012345678901234567890123456789",
	// Redis names an unknown node whole, however long.
	"CLUSTER REPLICAS 0123456789012345678901234567890123456789012345678901234567890123456789abcdef",
	"CLUSTER FOOBAR", "CLUSTER FooBar x y", "CLUSTER",
	"ASKING x", "READONLY x", "READWRITE x",
}

// TestClusterRepliesMatchRedis compares clusterScript's replies of a
// redis-server with --cluster-enabled yes (skipped without one) and of a
// Kefir node, and checks CLUSTER HELP's shape (Kefir lists only the
// subcommands it has).
func TestClusterRepliesMatchRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0") // the cluster bus port
	if err != nil {
		t.Fatal(err)
	}
	bus := l.Addr().(*net.TCPAddr).Port
	l.Close()
	rc := startRedis(t, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
		"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
	kc := dial(t, startServer(t, nil))
	for _, line := range clusterScript {
		args := strings.Fields(line)
		if want, got := rawReply(t, rc, args), rawReply(t, kc, args); want != got {
			t.Errorf("%s:\n  redis: %s\n  kefir: %s", line, want, got)
		}
	}
	// CLUSTER HELP: an array of status lines, the first one Redis's; the
	// unknown-subcommand error points at it.
	want, got := rawReply(t, rc, []string{"CLUSTER", "HELP"}), rawReply(t, kc, []string{"CLUSTER", "HELP"})
	first := func(s string) string { head, _, _ := strings.Cut(s, ", "); return head }
	if first(want) != first(got) {
		t.Errorf("CLUSTER HELP:\n  redis: %s\n  kefir: %s", want, got)
	}
	// CLUSTER REPLICAS of the node itself: a master with no replicas.
	for _, c := range []*client{rc, kc} {
		id := strings.Trim(c.do("CLUSTER", "MYID"), `"`)
		if got := c.do("CLUSTER", "REPLICAS", id); got != "[]" {
			t.Errorf("CLUSTER REPLICAS of a lone master %s: %s, want []", id, got)
		}
	}
	for _, sub := range []string{"COUNTKEYSINSLOT", "GETKEYSINSLOT", "INFO", "KEYSLOT", "MYID", "NODES", "SLOTS", "SHARDS", "REPLICAS"} {
		if !strings.Contains(got, sub) {
			t.Errorf("CLUSTER HELP does not name %s: %s", sub, got)
		}
	}
}
