package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// While a move is in flight the metadata group records a node's zone
// without moving the map's epoch (kv's KindMapAddNode), so a node that
// polls the map (no metadata replica: it adopts only a newer epoch) sees
// its zone only at the move's end. Its recorder, answered, must not ask
// again meanwhile: each ask is a no-op op in the metadata group's log,
// and a long move (a paced rebalance) would get one every zoneRecheck
// from every such node. Once the epoch moves and the map has the zone,
// it asks no more.
func TestMultiZoneNoAsksWhileTheEpochStays(t *testing.T) {
	z := newZoneMeta(t, false) // a move in flight: the epoch stays
	m4 := z.node4(t)
	mu, cm := &z.mu, z.cm
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(z.asks)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m4.FollowMap(ctx, FollowConfig{Every: 20 * time.Millisecond, Zone: "rack-b"})
	}()
	defer func() { cancel(); <-done }()
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { return count() == 1 }) {
		t.Fatalf("node 4 did not ask for its zone")
	}
	time.Sleep(zoneRecheck + zoneRecheck/4) // past the next ask the recorder would make
	if n := count(); n != 1 {
		t.Fatalf("node 4 asked %d times while the map's epoch stayed (a move in flight), want once", n)
	}
	mu.Lock()
	cm.Epoch++ // the move's end
	mu.Unlock()
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool {
		c := m4.ClusterMap()
		return c != nil && c.Epoch == 3 && c.Nodes[3].Zone == "rack-b"
	}) {
		t.Fatalf("node 4 did not learn its zone at the move's end: %+v", m4.ClusterMap())
	}
	time.Sleep(zoneRecheck + zoneRecheck/4)
	if n := count(); n != 1 {
		t.Fatalf("node 4 asked %d times, want once", n)
	}
}

// KEFIR.SLOTS META ADDNODE id client peer [ZONE z]: the zone (any case of
// the keyword) goes into the op's key; an add without one is the key of
// the builds before zones; an empty zone (no way to clear one: leave ZONE
// out), a bad zone, another keyword or a stray argument is refused before
// anything is proposed.
func TestMetaCommandAddNodeZone(t *testing.T) {
	parse := func(args ...string) (kv.Op, error) {
		b := [][]byte{[]byte("KEFIR.SLOTS"), []byte("META"), []byte("ADDNODE"), []byte("4"), []byte("c:4"), []byte("p:4")}
		for _, a := range args {
			b = append(b, []byte(a))
		}
		c, err := MetaCommand(b)
		return c.Op, err
	}
	for _, c := range []struct {
		args []string
		zone string
	}{{nil, ""}, {[]string{"ZONE", "eu-1a"}, "eu-1a"}, {[]string{"zone", "r7"}, "r7"}} {
		op, err := parse(c.args...)
		if err != nil || op.Kind != kv.KindMapAddNode {
			t.Fatalf("ADDNODE %v: %+v %v", c.args, op, err)
		}
		nd, err := kv.DecodeMapNode(op.Key)
		if err != nil || nd != (kv.MapNode{ID: 4, ClientAddr: "c:4", PeerAddr: "p:4", Zone: c.zone}) {
			t.Fatalf("ADDNODE %v: node %+v %v", c.args, nd, err)
		}
		if c.zone == "" && !bytes.Equal(op.Key, kv.AppendMapNode(nil, nd)) {
			t.Fatalf("ADDNODE without a zone: key %x, the older builds' %x", op.Key, kv.AppendMapNode(nil, nd))
		}
	}
	for _, args := range [][]string{{"ZONE", ""}, {"ZONE", "rack 1"}, {"ZONE", "a,b"}, {"ZONE", strings.Repeat("z", kv.MaxZoneLen+1)}, {"RACK", "a"}, {"ZONE"}, {"ZONE", "a", "b"}} {
		if op, err := parse(args...); err == nil {
			t.Fatalf("ADDNODE %q: accepted as %+v", args, op)
		}
	}
}

// Five replicas over three zones must not give one zone three of them: a
// VR group of five loses its majority with such a zone. Once every zone
// has a replica of the group, placement takes a node in the zone with
// the fewest (then the least loaded, as before), so the five spread 2, 2,
// 1 — whatever the node ids, here racks of consecutive ids (nodes 1-3 in
// a, 4-6 in b, 7-9 in c, all idle), where the least loaded alone took
// 2 and 3 after 1, 4, 7. The same for a growth (add-members --replicas 5)
// and for the metadata group's.
func TestPlaceZonesNoZoneTakesAMajority(t *testing.T) {
	all := func(uint64) bool { return true }
	cm := &kv.ClusterMap{Epoch: 3, Nodes: zonedNodes("a", "a", "a", "b", "b", "b", "c", "c", "c")}
	most := func(ms []uint64) int {
		n := map[string]int{}
		for _, id := range ms {
			n[cm.Nodes[id-1].Zone]++
		}
		return max(n["a"], n["b"], n["c"])
	}
	ms, err := PlaceGroup(cm, 5, all)
	if err != nil || len(ms) != 5 || most(ms) != 2 {
		t.Fatalf("PlaceGroup of 5 on three zones: %v %v (%s), want at most 2 in a zone", ms, err, SharedZones(cm, ms))
	}
	// Groups 2 and 3 make every node a data node (the metadata group
	// takes no other).
	grown := &kv.ClusterMap{Epoch: 3, Nodes: cm.Nodes, Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 4, 7}}, {ID: 2, Members: []uint64{2, 5, 8}}, {ID: 3, Members: []uint64{3, 6, 9}}},
		Meta: []uint64{1, 4, 7}, MetaEpoch: 1}
	for _, g := range []GroupID{1, MetaGroupID} {
		add, err := PlaceMembers(grown, g, 5, all)
		if ms := append([]uint64{1, 4, 7}, add...); err != nil || len(ms) != 5 || most(ms) != 2 {
			t.Fatalf("PlaceMembers of %s to 5 on three zones: %v %v (%s), want at most 2 in a zone", GroupName(g), ms, err, SharedZones(grown, ms))
		}
	}
}

// zoneMeta is a fake metadata leader for the zone recorder's tests: it
// serves the cluster map (node 4 at n4:4 / n4:14, no zone, epoch 2) and
// takes ADDNODE … ZONE, recording each ask ("id client peer ZONE z") and
// setting node 4's zone — moving the epoch, or not when bump is false (a
// move in flight). mu guards cm and asks.
type zoneMeta struct {
	mu     sync.Mutex
	cm     *kv.ClusterMap
	asks   []string
	static *SlotMap
	leader string
}

func newZoneMeta(t *testing.T, bump bool) *zoneMeta {
	t.Helper()
	static, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	z := &zoneMeta{static: static}
	z.cm = BootstrapMap(static, []Member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4, ClientAddr: "n4:4", PeerAddr: "n4:14"}})
	z.cm.Epoch = 2
	z.leader = fakeLeader(t, func(_ int, args []string) string {
		z.mu.Lock()
		defer z.mu.Unlock()
		switch {
		case len(args) >= 3 && args[0] == "KEFIR.SLOTS" && args[1] == "META" && args[2] == "MAP":
			b, _ := json.Marshal(z.cm)
			return fmt.Sprintf("$%d\r\n%s\r\n", len(b), b)
		case len(args) == 8 && args[2] == "ADDNODE" && args[6] == "ZONE":
			z.asks = append(z.asks, strings.Join(args[3:], " "))
			z.cm.Nodes[3].Zone = args[7]
			if bump {
				z.cm.Epoch++
			}
			return fmt.Sprintf(":%d\r\n", z.cm.Epoch)
		}
		return "-ERR unexpected\r\n"
	})
	return z
}

// node4 is node 4 of the map, hosting group 1, whose peers' client
// addresses are the fake leader's.
func (z *zoneMeta) node4(t *testing.T) *Multi {
	t.Helper()
	members := []Member{{ID: 1, ClientAddr: z.leader}, {ID: 2, ClientAddr: z.leader}, {ID: 3, ClientAddr: z.leader}, {ID: 4, ClientAddr: "n4:4"}}
	spec1, _ := z.static.Group(1)
	m, err := NewMulti(z.static, 4, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: &fakeReplica{name: "g1"}, Group: &stateGroup{}}}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
