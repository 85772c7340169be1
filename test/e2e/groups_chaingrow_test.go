package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// chainLoad is groupLoad on the chain tests' cluster (a VR group 1 on slots
// 0-8191, a chain group 2 on 8192-16383): four keys in the chain's slots
// and two in the VR group's, with the writes acknowledged in the chain's
// slots counted, so that a test can wait for the chain to take writes.
type chainLoad struct {
	*groupLoad
	keys []string
	mu   sync.Mutex
	acks int
}

func inChainSlots(k string) bool { return kv.KeySlot([]byte(k)) >= 8192 }

// startChainLoad starts the load through live.
func startChainLoad(t *testing.T, live []string) *chainLoad {
	t.Helper()
	l := &chainLoad{}
	for i, nc, nv := 0, 0, 0; nc < 4 || nv < 2; i++ {
		k := "r" + strconv.Itoa(i)
		if inChainSlots(k) && nc < 4 {
			l.keys, nc = append(l.keys, k), nc+1
		} else if !inChainSlots(k) && nv < 2 {
			l.keys, nv = append(l.keys, k), nv+1
		}
	}
	l.groupLoad = startGroupLoad(t, live, l.keys, func(k string) {
		if inChainSlots(k) {
			l.mu.Lock()
			l.acks++
			l.mu.Unlock()
		}
	})
	return l
}

// ChainAcks is how many writes in the chain's slots were acknowledged.
func (l *chainLoad) ChainAcks() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks
}

// WaitChainWrites fails the test unless n more writes in the chain's slots
// are acknowledged within 20 s.
func (l *chainLoad) WaitChainWrites(t *testing.T, what string, n int) {
	t.Helper()
	from := l.ChainAcks()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return l.ChainAcks() >= from+n }) {
		t.Fatalf("%s: %d writes acknowledged in the chain's slots in 20 s", what, l.ChainAcks()-from)
	}
}

// startChainCluster starts the chain tests' cluster — five nodes, a VR
// group 1 on nodes 1-3 (the metadata members, where the chain's masters
// run) and a chain group 2 of [4 5 3] — and the load through nodes 1-3,
// their client addresses live.
func startChainCluster(t *testing.T) (g *cluster.Groups, live []string, load *chainLoad) {
	t.Helper()
	g = cluster.StartGroups(t, 5, "1=1,2,3:0-8191;2=4,5,3:8192-16383", "--chain-groups", "2")
	g.WaitLeaders(20 * time.Second)
	live = g.Addrs()[:3]
	return g, live, startChainLoad(t, live)
}

// Finish stops the load and fails the test unless every acknowledged
// write reads back at each of addrs and the checked history is
// linearizable.
func (l *chainLoad) Finish(t *testing.T, addrs []string) {
	t.Helper()
	l.Stop()
	acked := l.Acked()
	for _, a := range addrs {
		readBack(t, a, acked)
	}
	t.Logf("%d sync writes acknowledged (%d in the chain's slots), every one read back at %v", len(acked), l.ChainAcks(), addrs)
	l.CheckLinearizable(t)
}

// chainOf is chain group 2's members as node addr's map names them (nil:
// no map).
func chainOf(addr string) []uint64 {
	if cm := localMap(addr); cm != nil {
		if g2, ok := cm.Group(2); ok {
			return g2.Members
		}
	}
	return nil
}

// Growing a chain group back after a failure (issues 28 and 30;
// docs/cluster.md "Growing a group"): five nodes, a VR group 1 on nodes
// 1-3 (the metadata members, where the chain's masters run) and a chain
// group 2 of [4 5 3]. Checked clients and sync writers run on keys of both
// groups through nodes 1-3. Node 5, the chain's middle, is SIGKILLed: its
// master fails it within --fail-after and the map names [4 3], one
// shorter. `kefir cluster add-members --group 2 --replicas 3` places the
// missing member on the least loaded live node not in the chain — node 1
// (nodes 1 and 2 host two replicas each: group 1 and the metadata group;
// ties to the lower id) — by a wish its master carries out: node 1 opens an
// empty member, is joined before the tail, and the map names [4 1 3]. A
// rerun changes nothing. The chain takes writes throughout; every
// acknowledged write reads back at nodes 1-3, and the history is
// linearizable.
func TestGroupsChainGrowAfterFailure(t *testing.T) {
	g, live, load := startChainCluster(t)
	addr := "--addr=" + live[0]
	load.WaitChainWrites(t, "before the failure", 30)

	g.Nodes[4].Kill()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return slices.Equal(chainOf(live[0]), []uint64{4, 3}) }) {
		t.Fatalf("the master did not drop the killed node 5: the map names the chain %v", chainOf(live[0]))
	}
	load.WaitChainWrites(t, "after the failure", 30)

	start := time.Now()
	out, err := kefirCluster(t, "add-members", addr, "--group", "2", "--replicas", "3")
	if err != nil || !strings.Contains(out, "placing group 2's new members on nodes [1]") || !strings.Contains(out, "chain group 2 is [4 1 3]") {
		t.Fatalf("add-members --group 2 --replicas 3: %v\n%s", err, out)
	}
	t.Logf("add-members --group 2 --replicas 3 (%v):\n%s", time.Since(start).Round(10*time.Millisecond), strings.TrimSpace(out))
	for _, a := range live {
		if !testgroup.Until(10*time.Second, 20*time.Millisecond, func() bool { return slices.Equal(chainOf(a), []uint64{4, 1, 3}) }) {
			t.Fatalf("node %s's map names the chain %v, want [4 1 3]", a, chainOf(a))
		}
	}
	// Node 1 took node 5's place: the map no longer keeps it for a
	// replace-node to re-create.
	if cm := localMap(live[0]); cm == nil || func() bool { g2, ok := cm.Group(2); return !ok || g2.Dropped != nil }() {
		t.Fatalf("node 1's map after the growth: %+v, want chain 2 with nothing dropped", cm)
	}
	out, err = kefirCluster(t, "add-members", addr, "--group", "2", "--replicas", "3")
	if err != nil || !strings.Contains(out, "nothing left to do") || strings.Contains(out, "placing") {
		t.Fatalf("a rerun of add-members --group 2 --replicas 3: %v\n%s", err, out)
	}
	load.WaitChainWrites(t, "after the growth", 30)
	load.Finish(t, live)
}

// Replacing a node its chains dropped (issues 28 and 30; docs/cluster.md
// "Replacing or removing a chain's member"): the cluster of
// TestGroupsChainGrowAfterFailure, node 5 SIGKILLed and dropped by the
// chain's master, so the map names [4 3] and remembers node 5 as dropped
// from it. `kefir cluster replace-node --old 5`, run after, re-creates
// node 5's place on the least loaded live node not in the chain (node 1)
// and keeps node 5 out: the map names [4 1 3], a rerun has nothing left
// to do, and node 5 started again on its old directory is refused by the
// master, retires its member and exits 0, rather than rejoining as a
// fourth. The chain takes writes throughout; every acknowledged write reads
// back at nodes 1-3, and the history is linearizable.
func TestGroupsChainReplaceDroppedNode(t *testing.T) {
	g, live, load := startChainCluster(t)
	addr := "--addr=" + live[0]
	load.WaitChainWrites(t, "before the failure", 30)

	n5 := g.Nodes[4]
	n5.Kill()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		cm := localMap(live[0])
		g2, ok := cm.Group(2)
		return ok && slices.Equal(g2.Members, []uint64{4, 3}) && slices.Equal(g2.Dropped, []uint64{5})
	}) {
		t.Fatalf("the map does not name the chain [4 3] with node 5 dropped: %+v", localMap(live[0]).Groups)
	}
	start := time.Now()
	out, err := kefirCluster(t, "replace-node", addr, "--old", "5")
	if err != nil || !strings.Contains(out, "placing node 5's replica of group 2 on node 1") || !strings.Contains(out, "chain group 2 is [4 1 3]") {
		t.Fatalf("replace-node --old 5 after the chain dropped it: %v\n%s", err, out)
	}
	t.Logf("replace-node --old 5 (%v):\n%s", time.Since(start).Round(10*time.Millisecond), strings.TrimSpace(out))
	out, err = kefirCluster(t, "replace-node", addr, "--old", "5")
	if err != nil || !strings.Contains(out, "nothing left to do") || strings.Contains(out, "placing") {
		t.Fatalf("a rerun of replace-node --old 5: %v\n%s", err, out)
	}
	load.WaitChainWrites(t, "after the replacement", 30)
	if err := n5.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if code := n5.Wait(30 * time.Second); code != 0 || !strings.Contains(n5.Logs(), "its member retires") {
		t.Fatalf("node 5 on its old directory: exit %d, want 0 with its member's retirement:\n%s", code, n5.Logs())
	}
	if ms := chainOf(live[0]); !slices.Equal(ms, []uint64{4, 1, 3}) {
		t.Fatalf("the chain after node 5's restart: %v, want [4 1 3]", ms)
	}
	load.WaitChainWrites(t, "after node 5's restart", 30)
	load.Finish(t, live)
}

// The automatic repair of a chain's member (issues 28 and 30;
// docs/cluster.md "Automatic repair"): the chain tests' cluster with
// --repair-after 3s. Node 5, the chain's middle and in no other group, is
// SIGKILLed: its master drops it within --fail-after (the map names [4 3]
// and remembers 5 as dropped by failure), and with nobody running a
// command the metadata leader's repairer re-creates its place once it has
// been silent for 3 s — the chain is three long again, on live nodes. Every
// acknowledged write reads back; the history is linearizable.
func TestGroupsChainRepairedUnattended(t *testing.T) {
	g := cluster.StartGroups(t, 5, "1=1,2,3:0-8191;2=4,5,3:8192-16383", "--chain-groups", "2", "--repair-after", "3s")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()[:3]
	load := startChainLoad(t, live)
	load.WaitChainWrites(t, "before the failure", 30)

	start := time.Now()
	g.Nodes[4].Kill()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return slices.Equal(chainOf(live[0]), []uint64{4, 3}) }) {
		t.Fatalf("the master did not drop the killed node 5: the map names the chain %v", chainOf(live[0]))
	}
	repaired := func(a string) bool {
		ms := chainOf(a)
		return len(ms) == 3 && !slices.Contains(ms, 5) && slices.Contains(ms, 4) && slices.Contains(ms, 3)
	}
	for _, a := range live {
		if !testgroup.Until(30*time.Second, 50*time.Millisecond, func() bool { return repaired(a) }) {
			t.Fatalf("node %s's map names the chain %v 30 s after node 5's failure, want three members without 5:\n%s", a, chainOf(a), g.Nodes[0].Logs())
		}
	}
	t.Logf("chain group 2 is %v %v after node 5 was killed", chainOf(live[0]), time.Since(start).Round(10*time.Millisecond))
	load.WaitChainWrites(t, "after the repair", 30)
	load.Finish(t, live)
}

// A chain's new node that dies before it joins (issues 28 and 30;
// docs/cluster.md "Automatic repair"): the chain tests' cluster with
// --repair-after 3s. `kefir cluster add-members --group 2 --new 6@...`
// names a node that never starts (a new machine that died first): the map
// wants it in the chain, the master keeps the chain one longer for it, and
// the command times out. With nobody running another command, the metadata
// leader's repairer, node 6 silent for 3 s, withdraws its join and places
// the chain's new member on a live node (node 1: the least loaded outside
// the chain): the map names the chain four long without node 6, and no
// longer wants node 6 in (it keeps it out, in Leaving). Then `kefir cluster
// remove-node --id 6` takes node 6 out of the map, and the chain's Leaving
// entry with it (before, the map refused it for as long as Leaving named
// it: for ever). The chain takes writes throughout; every acknowledged
// write reads back at nodes 1-3; the history is linearizable.
func TestGroupsChainDeadJoinerRepaired(t *testing.T) {
	g := cluster.StartGroups(t, 5, "1=1,2,3:0-8191;2=4,5,3:8192-16383", "--chain-groups", "2", "--repair-after", "3s")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()[:3]
	addr := "--addr=" + live[0]
	load := startChainLoad(t, live)
	load.WaitChainWrites(t, "before the growth", 30)

	n6 := cluster.NewNode(t, "n6") // its addresses; never started
	out, err := kefirCluster(t, "add-members", addr, "--group", "2", "--new", fmt.Sprintf("6@%s/%s", n6.PeerAddr, n6.ClientAddr), "--timeout", "2s")
	if err == nil {
		t.Fatalf("add-members --new 6 of a node that never starts returned:\n%s", out)
	}
	t.Logf("add-members --group 2 --new 6 (node 6 never starts): %v\n%s", err, strings.TrimSpace(out))
	start := time.Now()
	repaired := func(a string) bool {
		cm := localMap(a)
		if cm == nil {
			return false
		}
		g2, ok := cm.Group(2)
		return ok && len(g2.Members) == 4 && slices.Contains(g2.Members, 1) && !slices.Contains(g2.Members, 6) &&
			len(g2.Joining) == 0 && slices.Contains(g2.Leaving, 6)
	}
	for _, a := range live {
		if !testgroup.Until(30*time.Second, 50*time.Millisecond, func() bool { return repaired(a) }) {
			t.Fatalf("node %s's map names chain group 2 as %+v 30 s after node 6's join was asked for, want four members with node 1, node 6 no longer joining:\n%s",
				a, func() any { g2, _ := localMap(a).Group(2); return g2 }(), g.Nodes[0].Logs())
		}
	}
	t.Logf("chain group 2 is %v %v after the join of node 6 was asked for", chainOf(live[0]), time.Since(start).Round(10*time.Millisecond))
	load.WaitChainWrites(t, "after the repair", 30)

	out, err = kefirCluster(t, "remove-node", addr, "--id", "6")
	if err != nil || !strings.Contains(out, "node 6 is out of the map") {
		t.Fatalf("remove-node --id 6: %v\n%s", err, out)
	}
	if !testgroup.Until(10*time.Second, 20*time.Millisecond, func() bool {
		cm := localMap(live[0])
		g2, ok := cm.Group(2)
		return ok && !slices.Contains(cm.NodeIDs(), 6) && !slices.Contains(g2.Leaving, 6)
	}) {
		cm := localMap(live[0])
		t.Fatalf("after remove-node --id 6: nodes %v, groups %+v", cm.NodeIDs(), cm.Groups)
	}
	load.WaitChainWrites(t, "after node 6's removal", 30)
	load.Finish(t, live)
}
