package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// CLUSTER INFO's cluster_size is Redis's count of master nodes serving at
// least one slot, which clients and tools read as the number of shards'
// masters: two groups led by the same node are one master (CLUSTER NODES
// lists that node once, as master of both groups' slots). Fails where it
// counted the groups (2). (do shows the reply quoted: its CRLF as \r\n.)
func TestClusterInfoSizeCountsMasters(t *testing.T) {
	g := startGroupWith(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{1, 3, 2}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
		}
	})
	c := dial(t, g.nodes[1])
	var info string
	if !testgroup.Until(10*time.Second, 20*time.Millisecond, func() bool {
		info = c.do("CLUSTER", "INFO")
		return strings.Contains(info, "cluster_state:ok")
	}) {
		t.Fatalf("the cluster never reported ok: %s", info)
	}
	nodes := c.do("CLUSTER", "NODES")
	masters := strings.Count(nodes, "master")
	if masters != 1 || !strings.Contains(info, `cluster_size:1\r\n`) {
		t.Fatalf("one node leads both groups: CLUSTER NODES lists %d masters, CLUSTER INFO says\n%s", masters, info)
	}
	// CLUSTER REPLICAS (and SLAVES) of the master: the two other nodes'
	// CLUSTER NODES lines, without their newlines; of a replica, Redis's
	// error.
	text, err := strconv.Unquote(nodes)
	if err != nil {
		t.Fatalf("CLUSTER NODES: %s", nodes)
	}
	var master, replica string
	var want []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(l)
		if strings.Contains(f[2], "master") {
			master = f[0]
		} else {
			replica = f[0]
			want = append(want, strconv.Quote(l))
		}
	}
	wantReply := "[" + strings.Join(want, ", ") + "]"
	for _, sub := range []string{"REPLICAS", "SLAVES"} {
		if got := c.do("CLUSTER", sub, master); got != wantReply {
			t.Errorf("CLUSTER %s %s = %s, want %s", sub, master, got, wantReply)
		}
	}
	if got := c.do("CLUSTER", "REPLICAS", replica); got != "ERR The specified node is not a master" {
		t.Errorf("CLUSTER REPLICAS of replica %s = %s", replica, got)
	}
}
