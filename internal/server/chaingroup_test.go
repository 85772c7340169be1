package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// A chain group in a cluster of groups, in process (the race detector's
// view of it; e2e TestGroupsChainGroup runs it with real processes and
// kills): three nodes of VR group 1, owning every slot; KEFIR.SLOTS META
// ADDGROUP 2 ENGINE chain 2 3 records a chain of nodes 2 and 3, which they
// start; every metadata node (1-3) runs its master — node 1, no member,
// on its own registration of the group on the transport, nodes 2 and 3
// through their members. A move gives the chain half of the slots; writes
// through node 1 (forwarded to the head) read back at every node.
func TestChainGroupInACluster(t *testing.T) {
	g := startGroupWith(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 16383}}}}
		c.OpenChainReplica = vrshard.OpenChainGroup(vrshard.ChainStoreOptions{})
	})
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return len(groupLeaders(g, 1)) == 1 }) {
		t.Fatal("group 1 has no leader")
	}
	// The metadata leader records the chain (the others answer -MOVED;
	// until the metadata group has a leader and its map, every node
	// refuses: retried, as kefir cluster add-group does).
	added := false
	var last []string
	testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		last = last[:0]
		for _, s := range g.nodes {
			got := dial(t, s).do("KEFIR.SLOTS", "META", "ADDGROUP", "2", "ENGINE", "chain", "2", "3")
			if strings.HasPrefix(got, "(integer)") {
				added = true
				return true
			}
			last = append(last, got)
		}
		return false
	})
	if !added {
		t.Fatalf("no node recorded group 2: %q", last)
	}
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		for i, s := range g.nodes {
			st, ok := s.multi.GroupState(2)
			if i > 0 && (!ok || !st.Normal || st.Leader != 2) {
				return false
			}
		}
		return true
	}) {
		t.Fatal("nodes 2 and 3 did not start the chain with head 2")
	}
	if _, ok := g.nodes[0].multi.GroupState(2); ok {
		t.Fatal("node 1 hosts a member of a chain of nodes 2 and 3")
	}
	mv := &cluster.Mover{Seeds: []string{g.cfgs[0].ClientAddr, g.cfgs[1].ClientAddr}, RetryFor: 10 * time.Second, Meta: true, Driver: "TestChainGroupInACluster"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: 8192, End: 16383}}); err != nil {
		t.Fatalf("move to the chain: %v", err)
	}
	var keys []string
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Sprint("c", i); cluster.Slot([]byte(k)) >= 8192 {
			keys = append(keys, k)
		}
	}
	c := dial(t, g.nodes[0])
	for _, k := range keys {
		if got := c.do("SET", k, "v"+k); got != "OK" {
			t.Fatalf("SET %s through node 1: %s", k, got)
		}
	}
	for i, s := range g.nodes {
		c := dial(t, s)
		for _, k := range keys {
			if got := c.do("GET", k); got != fmt.Sprintf("%q", "v"+k) {
				t.Fatalf("GET %s at node %d: %s", k, i+1, got)
			}
		}
	}
	// CLUSTER SLOTS names the chain's members so (the Go client's
	// WithChainReads spreads strong reads over them): every node of group
	// 2's ranges carries kefir-engine chain, group 1's nodes nothing.
	cs := dial(t, g.nodes[0])
	cs.send("CLUSTER", "SLOTS")
	v, err := cs.rd.ReadValue()
	if err != nil {
		t.Fatal(err)
	}
	chainRanges := 0
	for _, r := range v.Elems {
		inChain := r.Elems[0].Int >= 8192
		for _, n := range r.Elems[2:] {
			md := show(n.Elems[3])
			if want := fmt.Sprintf("[%q, %q]", ClusterEngineField, kv.EngineChain); inChain && md != want || !inChain && md != "[]" {
				t.Fatalf("CLUSTER SLOTS range %d-%d: node metadata %s (range in the chain: %v)", r.Elems[0].Int, r.Elems[1].Int, md, inChain)
			}
		}
		if inChain {
			chainRanges++
		}
	}
	if chainRanges == 0 {
		t.Fatalf("CLUSTER SLOTS names no range of the chain: %s", show(v))
	}
	// The chain's writes went through its own log: node 3's member
	// applied them (not group 1's replica, which gave the slots away).
	if st, ok := g.nodes[2].multi.GroupState(2); !ok || st.Applied < uint64(len(keys)) {
		t.Fatalf("node 3's chain member applied %d ops, want ≥ %d", st.Applied, len(keys))
	}
}
