package transport

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"
)

// A reconfiguring VR group's replicas of adjacent epochs run different
// configuration hashes: the rule AdmitConfigs sets lets the peers it names
// through, and only those; a different cluster stays refused whatever the
// rule says.
func TestAdmitConfigsLetsNamedPeersOfAnotherConfigurationThrough(t *testing.T) {
	nodes := cluster(t, 3, func(c *vrConfig) {
		c.ConfigHash = 0xaaaa
		if c.Self == 1 {
			c.ConfigHash = 0xbbbb // a later epoch
		}
	})
	a, b, c := nodes[0], nodes[1], nodes[2]
	a.tr.AdmitConfigs(func(node, _ uint64) bool { return node == 2 || node == 3 })
	b.tr.AdmitConfigs(func(node, _ uint64) bool { return node == 1 })
	c.tr.AdmitConfigs(func(node, _ uint64) bool { return node == 2 }) // node 1 is not its peer in any epoch
	mustSend(t, a.tr, 2, msg(1, 2, 1))
	b.in.wait(t, 1, 5*time.Second)
	mustSend(t, b.tr, 1, msg(2, 1, 2))
	a.in.wait(t, 1, 5*time.Second)
	eventually(t, 5*time.Second, func() bool {
		mustSend(t, a.tr, 3, msg(1, 3, 3))
		time.Sleep(5 * time.Millisecond)
		return c.tr.Stats().IdentityRefusals > 0
	}, "node 3 to refuse node 1")
	if n := c.in.count(); n != 0 {
		t.Fatalf("node 3 delivered %d messages from a configuration its rule does not admit", n)
	}

	other := cluster(t, 2, func(c *vrConfig) {
		if c.Self == 1 {
			c.Cluster = 8
		}
	})
	for _, nd := range other {
		nd.tr.AdmitConfigs(func(uint64, uint64) bool { return true })
	}
	eventually(t, 5*time.Second, func() bool {
		mustSend(t, other[0].tr, 2, msg(1, 2, 1))
		time.Sleep(5 * time.Millisecond)
		return other[1].tr.Stats().IdentityRefusals > 0
	}, "a node of another cluster to be refused")
	if n := other[1].in.count(); n != 0 {
		t.Fatalf("delivered %d messages from another cluster", n)
	}
}

// AddPeer makes a node that joined after New reachable both ways; a known
// id at another address is an error.
func TestAddPeerReachesANewNode(t *testing.T) {
	lns, peers := listeners(t, 3)
	old := map[uint64]string{1: peers[1], 2: peers[2]}
	var nodes []*node
	for i, pm := range []map[uint64]string{old, old, peers} {
		nd := &node{id: uint64(i + 1), ln: lns[i], in: newInbox(), log: &logBuf{}}
		tr, err := newVR(vrConfig{Config: Config{Self: nd.id, Peers: pm, ClusterSecret: testSecret, Cluster: 7, ConfigHash: 1,
			Logger: slog.New(slog.NewTextHandler(nd.log, nil)), DialBackoff: 5 * time.Millisecond}, Handler: nd.in.handle})
		if err != nil {
			t.Fatal(err)
		}
		nd.tr = tr
		go tr.Serve(lns[i])
		t.Cleanup(func() { tr.Close() })
		nodes = append(nodes, nd)
	}
	a, c := nodes[0], nodes[2]
	if err := a.tr.sendVR(3, msg(1, 3, 1)); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("send to a node not yet added: %v, want ErrUnknownPeer", err)
	}
	if err := a.tr.AddPeer(3, peers[3]); err != nil || !a.tr.HasPeer(3) {
		t.Fatalf("AddPeer: %v, HasPeer %v", err, a.tr.HasPeer(3))
	}
	if err := a.tr.AddPeer(3, peers[3]); err != nil {
		t.Fatalf("adding a known peer again: %v", err)
	}
	if err := a.tr.AddPeer(3, "127.0.0.1:1"); err == nil {
		t.Fatal("a known peer at another address was accepted")
	}
	mustSend(t, a.tr, 3, msg(1, 3, 1))
	c.in.wait(t, 1, 5*time.Second)
	mustSend(t, c.tr, 1, msg(3, 1, 2))
	if rcv := a.in.wait(t, 1, 5*time.Second); !slices.ContainsFunc(rcv, func(g got) bool { return g.from == 3 }) {
		t.Fatalf("node 1 got %+v, want a message from node 3", rcv)
	}
}
