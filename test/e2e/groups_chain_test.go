package e2e

import (
	"fmt"
	"regexp"
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

// A chain group inside a cluster of VR groups (issue 30, "per group in a
// cluster"; docs/design/chain.md "A chain in a cluster of groups"): four
// nodes, VR groups 1 (nodes 1-3) and 2 (nodes 2-4); `kefir cluster
// add-group --engine chain --members 4,2,3` records group 3 as a chain in
// the map, its members start it and every metadata node (1-3; node 1 is no
// member of the chain, so its master registers the group on its transport
// itself) runs its hosted master; move-slots gives it half of group 2's
// slots. Checked clients (linearizable reads, sync writes and CAS) and sync
// writers run on keys of all three groups through nodes 1-3; node 4 — the
// chain's head and a member of group 2 — is SIGKILLed: the master (at the
// metadata leader) repairs the chain to [2 3], the map follows the chain's
// record (node 1, no member, routes the chain's requests to the new head)
// and writes to its slots go on; node 4 restarted rejoins the chain. A move out of the chain and back
// under the load. Then node 1, the metadata leader, whose master acted so
// far, is SIGKILLed: a master at node 2 or 3 (a member of the chain) takes
// over and the chain keeps serving. At the end every acknowledged write
// reads back at every node, and the history is linearizable.
func TestGroupsChainGroup(t *testing.T) {
	g := cluster.StartGroups(t, 4, "1=1,2,3:0-8191;2=2,3,4:8192-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()[:3]
	addr := "--addr=" + live[0]
	out, err := kefirCluster(t, "add-group", addr, "--members", "2,4", "--engine", "raft")
	if err == nil || !strings.Contains(out, `--engine "raft"`) {
		t.Fatalf("add-group with an unknown engine: %v\n%s", err, out)
	}
	out, err = kefirCluster(t, "add-group", addr, "--members", "4,2,3", "--engine", "chain")
	if err != nil || !strings.Contains(out, "group 3 (chain) with members [4 2 3] is in the map") || !strings.Contains(out, "group 3 is running") {
		t.Fatalf("add-group --engine chain: %v\n%s", err, out)
	}
	t.Logf("add-group:\n%s", strings.TrimSpace(out))
	if cm := localMap(live[0]); cm == nil {
		t.Fatal("node 1 has no map")
	} else if g3, ok := cm.Group(3); !ok || !g3.IsChain() {
		t.Fatalf("the map's group 3 is not a chain: %+v", cm.Groups)
	}
	if out, err := kefirCluster(t, "move-slots", addr, "--from", "2", "--to", "3", "--slots", "8192-12287"); err != nil {
		t.Fatalf("move-slots to the chain group: %v\n%s", err, out)
	}
	groupOf := func(k string) int {
		s := int(kv.KeySlot([]byte(k)))
		switch {
		case s < 8192:
			return 1
		case s < 12288:
			return 3
		}
		return 2
	}
	// Checked keys: four in the chain's slots, two in each VR group's.
	want := map[int]int{1: 2, 2: 2, 3: 4}
	var keys []string
	for i := 0; len(keys) < 8; i++ {
		k := "k" + strconv.Itoa(i)
		if want[groupOf(k)] > 0 {
			want[groupOf(k)]--
			keys = append(keys, k)
		}
	}
	var perMu sync.Mutex
	perGroup := map[int]int{}
	load := startGroupLoad(t, live, keys, func(k string) {
		perMu.Lock()
		perGroup[groupOf(k)]++
		perMu.Unlock()
	})
	inChain := func() int {
		perMu.Lock()
		defer perMu.Unlock()
		return perGroup[3]
	}
	// waitChainWrites waits for n more acknowledged writes to the chain.
	waitChainWrites := func(what string, n int) {
		t.Helper()
		from := inChain()
		if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return inChain() >= from+n }) {
			t.Fatalf("%s: %d writes acknowledged in the chain's slots in 15 s", what, inChain()-from)
		}
	}
	waitChainWrites("before the kill", 50)

	// Node 4, the chain's head, SIGKILLed: a master repairs the chain.
	n4 := g.Nodes[3]
	n4.Kill()
	killed := time.Now()
	repaired := func() bool {
		for _, n := range g.Nodes[:3] {
			if strings.Contains(n.Logs(), `msg="chain master: member failed (no heartbeat)"`) {
				return true
			}
		}
		return false
	}
	if !testgroup.Until(10*time.Second, 20*time.Millisecond, repaired) {
		t.Fatal("no master failed node 4 within 10 s")
	}
	waitChainWrites("with node 4 down", 20)
	t.Logf("chain writes go on %v after the kill of its head", time.Since(killed).Round(10*time.Millisecond))
	// The map names the repaired chain, head first, at node 1 (which
	// hosts no member: it routes the chain's requests to the map's first
	// member), and a write through node 1 alone is answered.
	chainKey := keys[slices.IndexFunc(keys, func(k string) bool { return groupOf(k) == 3 })]
	mapMembers := func(a string) []uint64 {
		if cm := localMap(a); cm != nil {
			if g3, ok := cm.Group(3); ok {
				return g3.Members
			}
		}
		return nil
	}
	if !testgroup.Until(10*time.Second, 20*time.Millisecond, func() bool { return slices.Equal(mapMembers(live[0]), []uint64{2, 3}) }) {
		t.Fatalf("node 1's map names the chain as %v, want [2 3]", mapMembers(live[0]))
	}
	if st, err := kefirCluster(t, "status", addr); err != nil || !strings.Contains(st, "3  members [2 3] (a chain, head first) (dropped by failure: [4]; ") {
		t.Fatalf("kefir cluster status after the head's failure: %v\n%s", err, st)
	}
	if v, err := cluster.Command(live[0], "SET", chainKey+"-via-n1", "x"); err != nil || string(v.Str) != "OK" {
		t.Fatalf("a write to the chain through node 1 after the head's failure: %v %q", err, v.Str)
	}
	load.Ack(chainKey+"-via-n1", "x")

	// Restarted, it rejoins the chain (the master joins it before the tail).
	n4.Restart()
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return slices.Equal(mapMembers(live[0]), []uint64{2, 4, 3}) }) {
		t.Fatalf("node 1's map names the chain as %v after node 4's restart, want [2 4 3]", mapMembers(live[0]))
	}
	// A member again: the map no longer remembers it as dropped.
	if cm := localMap(live[0]); cm == nil || func() bool { g3, ok := cm.Group(3); return !ok || g3.Dropped != nil }() {
		t.Fatalf("node 1's map after node 4's rejoin: %+v, want chain 3 with nothing dropped", cm)
	}
	joined := regexp.MustCompile(`chain master: joining.*node=4`)
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
		for _, n := range g.Nodes[:3] {
			if joined.MatchString(n.Logs()) {
				return true
			}
		}
		return false
	}) {
		t.Fatal("no master joined node 4 again within 15 s")
	}
	// A move out of the chain and back, under the load.
	if out, err := kefirCluster(t, "move-slots", addr, "--from", "3", "--to", "1", "--slots", "8192-9000"); err != nil {
		t.Fatalf("move-slots out of the chain group: %v\n%s", err, out)
	}
	if out, err := kefirCluster(t, "move-slots", addr, "--from", "1", "--to", "3", "--slots", "8192-9000"); err != nil {
		t.Fatalf("move-slots back to the chain group: %v\n%s", err, out)
	}
	waitChainWrites("after the rejoin", 50)

	// Node 1 — the metadata group's leader, whose master (no member of
	// the chain: it registered the group on its transport) acted so far —
	// SIGKILLed: node 2's or 3's master, which speaks through its node's
	// chain member, takes over from the record; without it the members'
	// leases lapse within 500 ms and the chain stops serving.
	n1 := g.Nodes[0]
	n1.Kill()
	acting := regexp.MustCompile(`chain master: acting \(metadata leader\)`)
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
		return acting.MatchString(g.Nodes[1].Logs()) || acting.MatchString(g.Nodes[2].Logs())
	}) {
		t.Fatal("no master of node 2 or 3 took over within 15 s of node 1's kill")
	}
	waitChainWrites("after the metadata leader's kill", 50)
	time.Sleep(time.Second) // past the old leases: the new master grants them
	waitChainWrites("a second after the metadata leader's kill", 20)
	n1.Restart()
	load.Stop()

	// Every acknowledged write at every node (node 4's own chain member
	// serves the chain's slots' eventual reads once it is a member again).
	acked := load.Acked()
	for _, a := range g.Addrs() {
		readBack(t, a, acked)
	}
	perMu.Lock()
	t.Logf("%d sync writes acknowledged (per group %v), every one read back at the four nodes", len(acked), perGroup)
	perMu.Unlock()
	load.CheckLinearizable(t)
}

// kefir up --groups 3 --engine mixed: group 2 is a chain (kefir server
// --chain-groups 2, the map records it so), groups 1 and 3 VR; the banner
// says so; redis-cli -c writes and reads keys of every group through every
// node; stopped and started again on its data, the chain group comes back
// (its master restarts the whole chain) and serves every key written.
func TestUpMixedGroups(t *testing.T) {
	base := freeBase(t, 3)
	a := upAddrsOf(base, 3)
	dir := t.TempDir()
	u := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--groups", "3", "--engine", "mixed")
	if !strings.Contains(u.banner, "3 nodes hosting 3 3-replica groups") || !strings.Contains(u.banner, "Chain groups (their masters at the metadata group on n1-n3): 2;") {
		t.Fatalf("banner:\n%s", u.banner)
	}
	if cm := localMap(a.client[0]); cm == nil {
		t.Fatal("n1 has no map")
	} else if g1, _ := cm.Group(1); g1 == nil || g1.IsChain() {
		t.Fatalf("group 1 in the map: %+v", cm.Groups)
	} else if g2, _ := cm.Group(2); g2 == nil || !g2.IsChain() {
		t.Fatalf("group 2 in the map is not a chain: %+v", cm.Groups)
	}
	inChain := 0
	for i := range 12 {
		k := fmt.Sprintf("up%d", i)
		if s := kv.KeySlot([]byte(k)); s >= 16384/3 && s < 2*16384/3 {
			inChain++
		}
		if out := redisCLI(t, a.client[i%3], "-c", "set", k, strconv.Itoa(i)); out != "OK" {
			t.Fatalf("set %s: %q", k, out)
		}
	}
	if inChain == 0 {
		t.Fatal("no key in the chain group's slots")
	}
	readAll := func(when string) {
		t.Helper()
		for i := range 12 {
			if out := redisCLI(t, a.client[(i+1)%3], "-c", "get", fmt.Sprintf("up%d", i)); out != strconv.Itoa(i) {
				t.Fatalf("%s: get up%d = %q", when, i, out)
			}
		}
	}
	readAll("first start")
	u.stop(t)
	u = startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base), "--groups", "3", "--engine", "mixed")
	if !testgroup.Until(15*time.Second, 50*time.Millisecond, func() bool {
		return redisCLI(t, a.client[0], "-c", "set", "after-restart", "x") == "OK"
	}) {
		t.Fatal("no write after the restart")
	}
	readAll("after a restart on its data")
	u.stop(t)
}
