package vrshard

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/transport"
)

// nodeTransports starts n node transports (ids 1..n) on loopback, each
// serving its own listener, as internal/server does for a node.
type nodeTransports struct {
	t     testing.TB
	peers map[uint64]string
	trs   []*transport.Transport
	log   *slog.Logger
}

func newNodeTransports(t testing.TB, n int, log *slog.Logger) *nodeTransports {
	nt := &nodeTransports{t: t, peers: map[uint64]string{}, trs: make([]*transport.Transport, n), log: log}
	lns := make([]net.Listener, n)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		nt.peers[uint64(i+1)] = ln.Addr().String()
	}
	for i := range n {
		nt.start(i, lns[i])
	}
	// Registered first, so it runs after every replica's Close.
	t.Cleanup(func() {
		for _, tr := range nt.trs {
			if tr != nil {
				tr.Close()
			}
		}
	})
	return nt
}

// start starts node i's transport on ln (nil: listen on its address again).
func (nt *nodeTransports) start(i int, ln net.Listener) {
	nt.t.Helper()
	id := uint64(i + 1)
	for try := 0; ln == nil; try++ {
		var err error
		if ln, err = net.Listen("tcp", nt.peers[id]); err != nil {
			if try == 50 {
				nt.t.Fatalf("relisten on %s: %v", nt.peers[id], err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	tr, err := transport.New(transport.Config{Self: id, Peers: nt.peers, ClusterSecret: "test-secret", Cluster: 77,
		Logger: nt.log, DialBackoff: 5 * time.Millisecond})
	if err != nil {
		nt.t.Fatal(err)
	}
	go tr.Serve(ln)
	nt.trs[i] = tr
}

// groupOn opens a 3-replica VR group whose replica on node i uses node i's
// transport. Each group has its own VR cluster id (100+group), so a message
// delivered to the wrong group would be refused by its core, which logs the
// mismatch.
func groupOn(t testing.TB, nt *nodeTransports, group uint64, log *slog.Logger) *cluster {
	return groupWith(t, nt, group, log, nil)
}

func (c *cluster) openOn(i int, bootstrap bool) {
	c.t.Helper()
	r, err := Open(c.options(i, bootstrap, nil))
	if err != nil {
		c.t.Fatalf("open replica %d: %v", c.ids[i], err)
	}
	c.reps[i] = r
}

// TestTwoGroupsShareThreeNodeTransports (issue 26 item 4): two VR groups
// whose replicas live on the same three node transports, over real TCP,
// each make progress, never see each other's messages, and both recover
// when a node's transport (every connection to and from it) is killed and
// restarted under them, and when one group's replica restarts on a node
// transport that stays up.
func TestTwoGroupsShareThreeNodeTransports(t *testing.T) {
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nt := newNodeTransports(t, 3, log)
	groups := map[uint64]*cluster{1: groupOn(t, nt, 1, log), 2: groupOn(t, nt, 2, log)}
	key := func(g uint64, i int) string { return fmt.Sprintf("g%d-k%d", g, i) }
	last := map[uint64]uint64{}
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			for g, c := range groups {
				res, err := c.write(set(key(g, i), fmt.Sprint(i)), shard.ReqID{Client: 9, Seq: uint64(i + 1)}, 10*time.Second)
				if err != nil {
					t.Fatalf("group %d write %d: %v", g, i, err)
				}
				last[g] = res.Version
			}
		}
	}
	write(0, 20)
	for g, c := range groups {
		c.waitApplied(last[g], 10*time.Second)
	}

	// Kill node 3: both its replicas and its transport, so every connection
	// to and from it is cut; the other two nodes keep both groups going.
	for _, c := range groups {
		c.kill(2)
	}
	nt.trs[2].Close()
	nt.trs[2] = nil
	write(20, 40)
	// Restart it: a new transport on the same address, both replicas from
	// their disks. Both groups catch it up over the new connections.
	nt.start(2, nil)
	for _, c := range groups {
		c.openOn(2, false)
	}
	write(40, 45)
	// One group's replica on node 1 stops and reopens on the same node
	// transport (its endpoint is unregistered and registered again) while
	// the other group's replica there keeps running.
	groups[1].reps[0].Close()
	groups[1].reps[0] = nil
	write(45, 48)
	groups[1].openOn(0, false)
	write(48, 50)
	for g, c := range groups {
		c.waitApplied(last[g], 15*time.Second)
		for i := range c.reps {
			c.expectValue(i, key(g, 0), "0")
			c.expectValue(i, key(g, 49), "49")
			// The other group's keys never reached this group's state.
			c.expectValue(i, key(3-g, 0), "")
		}
	}
	for i, tr := range nt.trs {
		st := tr.Stats()
		if st.Total.Corrupt != 0 || st.Total.Spoofed != 0 || st.ProtocolErrors != 0 || st.IdentityRefusals != 0 {
			t.Errorf("node %d transport: %+v", i+1, st)
		}
		if st.Total.Received == 0 {
			t.Errorf("node %d received nothing", i+1)
		}
	}
	// A message delivered to the other group's replica is refused by its
	// core for its cluster id ("cluster 101, ours is 102") and logged.
	if s := logs.String(); strings.Contains(s, "cluster 10") && strings.Contains(s, "ours is 10") {
		t.Fatalf("a group saw the other group's messages:\n%s", s)
	}
}
