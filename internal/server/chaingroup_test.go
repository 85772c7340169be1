package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
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

// A chain group's members follow the map to their masters (issue 30;
// docs/design/chain.md "A chain in a cluster of groups"): six nodes, VR
// group 1 on 1-3 (the metadata members), a chain group 2 of 6, 4, 5 (head
// 6). kefir cluster replace-node's steps replace metadata members 2 and 3
// by 4 and 5 (chain members themselves, so their masters speak through
// their members), node 1 is stopped, then the chain's head: the repair can
// only come from a master on the new metadata membership (4 or 5), and
// writes to the chain go on at [4 5]. It fails when the members keep the
// metadata members of the group's creation (followChainMasters off): no
// master hears them, and the acting one's orders are refused.
func TestChainGroupFollowsTheMetadataMembers(t *testing.T) {
	cfgs := groupsConfigs(t, 6, []cluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{6, 4, 5}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
	}, 2)
	ms := cfgs[0].Members
	nodes := startConfigs(t, cfgs)
	node := func(id uint64) *Server { return nodes[id-1] }
	var keys []string
	for i := 0; len(keys) < 40; i++ {
		if k := fmt.Sprint("m", i); cluster.Slot([]byte(k)) >= 8192 {
			keys = append(keys, k)
		}
	}
	// set writes keys[from:to] through node via, each retried (a repair
	// or a takeover in progress answers errors meanwhile) for up to 20 s.
	set := func(via uint64, from, to int) {
		t.Helper()
		for _, k := range keys[from:to] {
			var got string
			if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
				got = dial(t, node(via)).do("SET", k, "v"+k)
				return got == "OK"
			}) {
				t.Fatalf("SET %s through node %d: %s", k, via, got)
			}
		}
	}
	set(1, 0, 10)

	// kefir cluster replace-node's steps (cmd/kefir groupsChange): the
	// plan, then per group the leader's reconfiguration and the map's
	// record; metadata members 2 and 3 by chain members 4 and 5.
	mv := &cluster.Mover{Seeds: []string{ms[0].ClientAddr, ms[3].ClientAddr, ms[4].ClientAddr}, RetryFor: 20 * time.Second, Meta: true,
		Driver: "TestChainGroupFollowsTheMetadataMembers"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, r := range [][2]uint64{{2, 4}, {3, 5}} {
		cm, err := mv.MetaMap(ctx)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := cluster.PlanNodeChange(cm, r[0], cluster.Member{ID: r[1], PeerAddr: ms[r[1]-1].PeerAddr, ClientAddr: ms[r[1]-1].ClientAddr})
		if err != nil {
			t.Fatalf("replace %d by %d: %v", r[0], r[1], err)
		}
		for _, step := range plan {
			var seeds []string
			for _, id := range step.Members {
				if id != r[1] {
					seeds = append(seeds, ms[id-1].ClientAddr)
				}
			}
			gmv := &cluster.Mover{Seeds: seeds, RetryFor: 20 * time.Second}
			cur, err := gmv.GroupConfigOf(ctx, step.Group)
			if err != nil {
				t.Fatalf("replace %d by %d: group %d: %v", r[0], r[1], step.Group, err)
			}
			res, err := gmv.ReconfigureGroup(ctx, step.Group, cur.Epoch, step.Members)
			gmv.Close()
			if err != nil {
				t.Fatalf("replace %d by %d: group %d: %v", r[0], r[1], step.Group, err)
			}
			if _, err := mv.SetMembers(ctx, step.Group, res.Epoch, res.Members); err != nil {
				t.Fatalf("replace %d by %d: record group %d: %v", r[0], r[1], step.Group, err)
			}
		}
		// The next change only once the new member runs in every group
		// (as an operator waits: replacing 3 while 4 still pulls the
		// metadata group's state leaves [1 4 5] with one working member).
		if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
			for _, step := range plan {
				if st, ok := node(r[1]).multi.GroupState(step.Group); !ok || !st.Normal {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("node %d does not run every group it replaced node %d in", r[1], r[0])
		}
	}
	set(4, 10, 20)

	// Node 1, the last of the first metadata members, stops: the metadata
	// group is 4 and 5 now, and so is every master that can act.
	nodes[0].Close()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		for _, id := range []uint64{4, 5} {
			if st, ok := node(id).multi.GroupState(cluster.MetaGroupID); ok && st.Normal && st.IsLeader {
				return true
			}
		}
		return false
	}) {
		t.Fatal("no metadata leader among nodes 4 and 5")
	}
	set(5, 20, 25)
	// The chain's head fails: a master at 4 or 5 repairs it.
	start := time.Now()
	node(6).Close()
	set(5, 25, 40)
	t.Logf("writes to the chain again %v after its head stopped", time.Since(start).Round(time.Millisecond))
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		st, ok := node(4).multi.GroupState(2)
		return ok && st.Normal && st.Leader == 4
	}) {
		st, _ := node(4).multi.GroupState(2)
		t.Fatalf("node 4 is not the chain's head after the repair: %+v", st)
	}
	for _, id := range []uint64{4, 5} {
		lg, ok := hostedGroup(node(id), 2)
		if got := lg.Hosted.Replica.(*vrshard.Replica).ChainMasters(); !ok || !slices.Equal(got, []uint64{1, 4, 5}) {
			t.Fatalf("node %d's chain member sends to masters %v, want the map's metadata members [1 4 5]", id, got)
		}
		c := dial(t, node(id))
		for _, k := range keys {
			if got := c.do("GET", k); got != fmt.Sprintf("%q", "v"+k) {
				t.Fatalf("GET %s at node %d: %s", k, id, got)
			}
		}
	}
}

// hostedGroup is node s's replica of group id, if it hosts one.
func hostedGroup(s *Server, id cluster.GroupID) (cluster.LocalGroup, bool) {
	for _, lg := range s.multi.Hosted() {
		if lg.Spec.ID == id {
			return lg, true
		}
	}
	return cluster.LocalGroup{}, false
}

func testLogger(id uint64) *slog.Logger {
	if os.Getenv("KEFIR_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", id)
}

// kefir chain restart --group G (POST /chain/restart?group=G&without=N at the
// admin port) reaches a cluster's chain group's master: nodes 1-3 run VR
// group 1 and the metadata group, the chain group 2 is [4 5]. Both chain
// members stop; node 4 restarts, node 5 does not (its disk gone for good,
// say): the whole-chain restart waits for 5 until the operator forgoes it
// at the metadata leader's master, then the chain runs from node 4 and
// every acknowledged write is there. Before, the admin port asked only a
// single chain's master (404 at a cluster's nodes).
func TestChainGroupRestartWithout(t *testing.T) {
	cfgs := groupsConfigs(t, 5, []cluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{4, 5}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
	}, 2)
	nodes := make([]*Server, len(cfgs))
	start := func(i int) {
		t.Helper()
		nodes[i] = startConfig(t, cfgs[i])
	}
	for i := range cfgs {
		start(i)
	}
	var keys []string
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Sprint("r", i); cluster.Slot([]byte(k)) >= 8192 {
			keys = append(keys, k)
		}
	}
	set := func(from, to int) {
		t.Helper()
		for _, k := range keys[from:to] {
			var got string
			if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
				got = dial(t, nodes[0]).do("SET", k, "v"+k)
				return got == "OK"
			}) {
				t.Fatalf("SET %s through node 1: %s", k, got)
			}
		}
	}
	set(0, 10)
	nodes[3].Close()
	nodes[4].Close()
	start(3) // node 4 comes back; node 5 does not
	// The operator's request, at each metadata node's admin port in turn
	// (as kefir chain restart does), until the acting master answers: 503
	// at a master that does not act, 409 while the chain is not down yet
	// (its master has not failed both members).
	restart := func(i int) (int, string) {
		resp, err := http.Post("http://"+nodes[i].HTTPAddr().String()+"/chain/restart?group=2&without=5", "", nil)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var answers []string
	if !testgroup.Until(20*time.Second, 100*time.Millisecond, func() bool {
		answers = answers[:0]
		for i := range 3 {
			code, msg := restart(i)
			if code == http.StatusOK {
				t.Logf("node %d's master: %s", i+1, strings.TrimSpace(msg))
				return true
			}
			answers = append(answers, fmt.Sprintf("node %d: %d %s", i+1, code, strings.TrimSpace(msg)))
		}
		return false
	}) {
		t.Fatalf("no metadata node's master restarted chain group 2: %q", answers)
	}
	// A node running no master of the group (node 4: not a metadata member).
	if code, msg := restart(3); code != http.StatusNotFound {
		t.Fatalf("node 4, no master: %d %s, want 404", code, msg)
	}
	set(10, 20)
	c := dial(t, nodes[3])
	for _, k := range keys {
		if got := c.do("GET", k); got != fmt.Sprintf("%q", "v"+k) {
			t.Fatalf("GET %s at node 4: %s", k, got)
		}
	}
}

// kefir cluster replace-node of a chain's member, in process (the race
// detector's view of it; e2e TestGroupsChainReplaceNode runs it with real
// processes, a linearizability check and a SIGKILLed head): VR group 1 on
// nodes 1-3 (the metadata members), chain group 2 of [4 3], and node 5 a
// VR group of its own. The command's steps (cmd/kefir chainChange): the
// plan, one wish recorded in the map (KEFIR.SLOTS META CHAINWANT), then the
// wait until the map's chain has node 5 and not node 4. Node 5 opens an
// empty member of the chain (the map's Joining names it), the master joins
// it before the tail and fails node 4, whose node retires its member (its
// last group: it records its retirement); every write, before and after,
// reads back at node 5.
func TestChainGroupReplaceMember(t *testing.T) {
	cfgs := groupsConfigs(t, 5, []cluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{4, 3}, Slots: []cluster.SlotRange{{Start: 8192, End: 12287}}},
		{ID: 3, Members: []uint64{5}, Slots: []cluster.SlotRange{{Start: 12288, End: 16383}}},
	}, 2)
	ms := cfgs[0].Members
	nodes := startConfigs(t, cfgs)
	node := func(id uint64) *Server { return nodes[id-1] }
	var keys []string
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Sprint("c", i); cluster.Slot([]byte(k)) >= 8192 && cluster.Slot([]byte(k)) < 12288 {
			keys = append(keys, k)
		}
	}
	set := func(from, to int) {
		t.Helper()
		for _, k := range keys[from:to] {
			var got string
			if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
				got = dial(t, node(1)).do("SET", k, "v"+k)
				return got == "OK"
			}) {
				t.Fatalf("SET %s: %s", k, got)
			}
		}
	}
	set(0, 10)

	mv := &cluster.Mover{Seeds: []string{ms[0].ClientAddr, ms[1].ClientAddr}, RetryFor: 20 * time.Second}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := cluster.PlanNodeChange(cm, 4, cluster.Member{ID: 5, PeerAddr: ms[4].PeerAddr, ClientAddr: ms[4].ClientAddr})
	if err != nil || len(plan) != 1 || !plan[0].Chain || !slices.Equal(plan[0].Members, []uint64{5, 3}) {
		t.Fatalf("the plan: %+v %v", plan, err)
	}
	if _, err := mv.ChainWant(ctx, plan[0], cm.Epoch); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		cm, err := mv.MetaMap(ctx)
		return err == nil && cluster.ChainChangeDone(cm, plan[0])
	}) {
		cm, _ := mv.MetaMap(ctx)
		t.Fatalf("the map's chain did not become [5 3]: %+v", cm.Groups)
	}
	t.Logf("the map's chain is [5 3] %v after the wish", time.Since(start).Round(time.Millisecond))
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		return CheckRetired(groupDir(node(4).cfg.DataDir, 2)) != nil
	}) {
		t.Fatal("node 4 did not retire its member of the chain")
	}
	set(10, 20)
	c := dial(t, node(5))
	for _, k := range keys {
		var got string
		if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
			got = c.do("GET", k)
			return got == fmt.Sprintf("%q", "v"+k)
		}) {
			t.Fatalf("GET %s at node 5: %s", k, got)
		}
	}
}
