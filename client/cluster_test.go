package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// fakeSlots is a CLUSTER SLOTS reply: one range of every slot whose master
// is addrs[0] and whose replicas are the rest.
func fakeSlots(addrs ...string) resp.Value {
	e := resp.Value{Kind: resp.Array, Elems: []resp.Value{intv(0), intv(16383)}}
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		p, _ := strconv.ParseInt(port, 10, 64)
		e.Elems = append(e.Elems, resp.Value{Kind: resp.Array, Elems: []resp.Value{bulk([]byte(host)), intv(p), bulk([]byte("id"))}})
	}
	return resp.Value{Kind: resp.Array, Elems: []resp.Value{e}}
}

func (s *testServer) setSlots(v resp.Value, epoch uint64) {
	s.mu.Lock()
	s.slots, s.epoch = v, epoch
	s.mu.Unlock()
}

// routedTo returns the address the client routes key's slot to.
func routedTo(c *Client, key string) string {
	return c.rt.route(int(keySlot(key))).addrs[0]
}

// Dial asks INFO cluster once; a node that does not say cluster_enabled:1
// (a single group says 0; this fake knows no INFO) gets today's client:
// no slot map, every call on the client's own pool, nothing else on the
// wire.
func TestDialAsksInfoClusterOnce(t *testing.T) {
	s := newTestServer(t)
	ctx := testCtx(t)
	c, err := Dial(ctx, s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.rt != nil {
		t.Fatal("a node without cluster_enabled:1 gave a slot map")
	}
	if err := c.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	got := s.commands()
	if len(got) != 3 || got[0] != "INFO cluster" || got[2] != "GET k" {
		t.Fatalf("server saw %q, want INFO cluster, the SET, GET k", got)
	}
}

// -ASK sends its call once to the node it names, after ASKING on the same
// connection, and changes no route (Redis Cluster's rule); -MOVED sends its
// call to the node it names and fetches the map again, from that node
// first, which then routes the slot there.
func TestClusterAskIsOneShotAndMovedRefreshesTheMap(t *testing.T) {
	a, b := newTestServer(t), newTestServer(t)
	slotsAtA := fakeSlots(a.addr()[0], b.addr()[0])
	a.setSlots(slotsAtA, 1)
	b.setSlots(slotsAtA, 1)
	slot := keySlot("k")
	a.redirect = func(argv []string, _ bool) (resp.Value, bool) {
		switch {
		case argv[0] == "GET" && argv[1] == "k":
			return errv(fmt.Sprintf("ASK %d %s", slot, b.addr()[0])), true
		case argv[0] == "SET" && argv[1] == "moved":
			return errv(fmt.Sprintf("MOVED %d %s", keySlot("moved"), b.addr()[0])), true
		}
		return resp.Value{}, false
	}
	b.redirect = func(argv []string, asking bool) (resp.Value, bool) {
		if argv[0] == "GET" && argv[1] == "k" && !asking {
			return errv(fmt.Sprintf("MOVED %d %s", slot, a.addr()[0])), true
		}
		return resp.Value{}, false
	}
	b.set("k", "at-b")
	ctx := testCtx(t)
	c, err := Dial(ctx, a.addr(), WithReplicaReads(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.rt == nil || routedTo(c, "k") != a.addr()[0] {
		t.Fatal("no slot map routing to the fake master")
	}
	v, err := c.Get(ctx, "k")
	if err != nil || string(v) != "at-b" {
		t.Fatalf("Get k after -ASK = %q, %v; want B's value", v, err)
	}
	if got := routedTo(c, "k"); got != a.addr()[0] {
		t.Fatalf("after -ASK the slot routes to %s, want A still", got)
	}
	bc := b.commands()
	if len(bc) < 2 || bc[len(bc)-2] != "ASKING" || bc[len(bc)-1] != "GET k" {
		t.Fatalf("B saw %q, want ASKING then GET k", bc)
	}
	refreshes := c.rt.refreshes.Load()

	// The slots move to B: A answers -MOVED, B's map names B.
	b.setSlots(fakeSlots(b.addr()[0], a.addr()[0]), 2)
	if err := c.Put(ctx, "moved", []byte("v")); err != nil {
		t.Fatalf("Put after -MOVED: %v", err)
	}
	if got := string(b.data["moved"]); got != "v" {
		t.Fatalf("B has %q for the moved key", got)
	}
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return routedTo(c, "moved") == b.addr()[0] }) {
		t.Fatalf("the map was not refreshed after -MOVED (%d fetches before, %d now)", refreshes, c.rt.refreshes.Load())
	}
	// An older map (a node that has not seen the move) is not installed.
	a.setSlots(slotsAtA, 1)
	c.rt.refreshSoon(a.addr()[0])
	n := c.rt.refreshes.Load()
	testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return c.rt.refreshes.Load() > n })
	if got := routedTo(c, "moved"); got != b.addr()[0] {
		t.Fatalf("a map of epoch 1 replaced one of epoch 2: the slot routes to %s", got)
	}
}

// A slot move under the client's writes and reads: keys of the moving
// slots and of others, written and read back (linearizable) by several
// goroutines while kefir cluster move-slots' Mover moves 0-2047 from group
// 1 to group 2. No call fails, every read returns its writer's last value,
// and the client's map routes the moved slots to group 2's leader after.
func TestClusterFollowsASlotMove(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithRetryUnavailable(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	moving := []kcluster.GroupSpec{{Slots: []kcluster.SlotRange{{Start: 0, End: 2047}}}, {Slots: []kcluster.SlotRange{{Start: 2048, End: 16383}}}}
	keys := keysOf(moving, 24)
	fetched := c.rt.refreshes.Load()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ops atomic.Int64
	errc := make(chan error, 8)
	for w := range 4 {
		wg.Go(func() {
			mine := append(keys[0][w*6:(w+1)*6:(w+1)*6], keys[1][w*6:(w+1)*6]...)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := mine[n%len(mine)]
				val := []byte(fmt.Sprint(w, "-", n))
				if err := c.Put(ctx, k, val); err != nil {
					errc <- fmt.Errorf("Put %s: %w", k, err)
					return
				}
				got, err := c.Get(ctx, k, WithConsistency(Linearizable))
				if err != nil || string(got) != string(val) {
					errc <- fmt.Errorf("Get %s = %q, %v; want %q", k, got, err, val)
					return
				}
				ops.Add(1)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	var seeds []string
	for _, n := range nodes {
		seeds = append(seeds, n.ClientAddr().String())
	}
	mv := &kcluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Meta: true, Driver: t.Name()}
	defer mv.Close()
	before := ops.Load()
	res, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: 0, End: 2047}})
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("move: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("%d calls during the move (%v), %d map fetches", ops.Load()-before, res, c.rt.refreshes.Load()-fetched)
	leader2 := ""
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool {
		for _, g := range nodes[1].Status().Groups {
			if g.ID == 2 && g.Leader != 0 {
				leader2 = nodes[g.Leader-1].ClientAddr().String()
			}
		}
		return leader2 != "" && routedTo(c, keys[0][0]) == leader2
	}) {
		t.Fatalf("after the move slot %d routes to %s, want group 2's leader %s (%d map fetches)",
			keySlot(keys[0][0]), routedTo(c, keys[0][0]), leader2, c.rt.refreshes.Load()-fetched)
	}
	// The moved keys now go straight to group 2's leader.
	fwd := forwardedBy(nodes)
	for _, k := range keys[0] {
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if d := forwardedBy(nodes) - fwd; d != 0 {
		t.Fatalf("%d reads of moved keys were forwarded after the map's refresh", d)
	}
}

// A leader change in one group while another group's calls go on: the
// node leading group g is closed; calls to g's keys are retried (the
// client fetches the map, and follows -MOVED to the new leader) and
// succeed — but for a write in flight at the closed leader, which may end
// with ErrUnknownOutcome, as in one group — while calls to another group's
// keys, whose leader stays, go on (the same allowance), and the map names
// g's new leader after.
func TestClusterLeaderChangeInOneGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	// g: a group led by another node than node 1 (the client's seed); h: a
	// group whose leader is not g's.
	st := nodes[0].Status().Groups
	g, h := -1, -1
	for i, gs := range st {
		if g < 0 && gs.Leader != 1 {
			g = i
		}
	}
	for i, gs := range st {
		if i != g && gs.Leader != st[g].Leader {
			h = i
		}
	}
	if g < 0 || h < 0 {
		t.Skipf("leaders %+v: no group led away from node 1 and another led elsewhere", st)
	}
	victim := int(st[g].Leader - 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithRetryUnavailable(15*time.Second), WithMaxRetries(5))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := keysOf(kefirUpLayout, 4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var okG, okH atomic.Int64
	var worstH atomic.Int64
	errc := make(chan error, 8)
	run := func(ks []string, ok *atomic.Int64, worst *atomic.Int64) {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			k := ks[n%len(ks)]
			start := time.Now()
			if err := c.Put(ctx, k, []byte(fmt.Sprint(n))); err != nil && !errors.Is(err, ErrUnknownOutcome) {
				errc <- fmt.Errorf("Put %s: %w", k, err)
				return
			}
			if worst != nil {
				if d := int64(time.Since(start)); d > worst.Load() {
					worst.Store(d)
				}
			}
			ok.Add(1)
		}
	}
	wg.Go(func() { run(keys[g], &okG, nil) })
	wg.Go(func() { run(keys[h], &okH, &worstH) })
	time.Sleep(200 * time.Millisecond)
	nodes[victim].Close()
	nodes[victim] = nil
	h0 := okH.Load()
	killed := time.Now()
	var newLeader uint64
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
		for _, n := range nodes {
			if n != nil {
				if l := n.Status().Groups[g].Leader; l != 0 && l != uint64(victim+1) {
					newLeader = l
					return true
				}
			}
		}
		return false
	}) {
		t.Fatal("group g elected no new leader")
	}
	elected := time.Since(killed)
	g0 := okG.Load()
	if !testgroup.Until(15*time.Second, 10*time.Millisecond, func() bool { return okG.Load() > g0+20 }) {
		t.Fatal("group g's calls did not resume after the election")
	}
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("group %d's leader %d closed; new leader %d after %v; group %d's calls meanwhile: %d (slowest %v)",
		g+1, victim+1, newLeader, elected, h+1, okH.Load()-h0, time.Duration(worstH.Load()))
	if okH.Load() == h0 {
		t.Fatalf("group %d's calls stopped while group %d changed leaders", h+1, g+1)
	}
	want := nodes[newLeader-1].ClientAddr().String()
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { return routedTo(c, keys[g][0]) == want }) {
		t.Fatalf("the map routes group %d to %s, want its new leader %s", g+1, routedTo(c, keys[g][0]), want)
	}
}

// Per-call levels in a cluster: reads any replica may serve (eventual,
// session reads of a Session) go to the members of their key's group,
// spread; linearizable and cross-client-monotonic reads go to its leader
// only; a Session reads its writes to every group; MultiPut and MultiGet
// over keys of every group are split by slot and merged in order.
func TestClusterPerCallLevels(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wire := &wireLog{}
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithRetryUnavailable(5*time.Second), func(o *options) { o.wrapConn = wire.wrap })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := keysOf(kefirUpLayout, 3)
	s := c.Session()
	for _, ks := range keys {
		if err := s.Put(ctx, ks[0], []byte("s-"+ks[0]), WithDurability(CAD)); err != nil {
			t.Fatal(err)
		}
	}
	for _, ks := range keys {
		if v, err := s.Get(ctx, ks[0], WithConsistency(SessionConsistency)); err != nil || string(v) != "s-"+ks[0] {
			t.Fatalf("session Get %s = %q, %v", ks[0], v, err)
		}
	}
	if tok := s.Token(); !strings.HasPrefix(tok, "v3.") || strings.Count(tok, ":") < 3 {
		t.Fatalf("session token %q: want a part per group", tok)
	}
	leaderAddr := func(k string) string { return c.rt.route(int(keySlot(k))).addrs[0] }
	for _, ks := range keys {
		k := ks[0]
		wire.reset()
		for range 30 {
			// A follower may not have applied the write yet: eventual.
			if _, err := c.Get(ctx, k, WithConsistency(Eventual)); err != nil && !errors.Is(err, ErrNotFound) {
				t.Fatal(err)
			}
			if _, err := c.Get(ctx, k, WithConsistency(Linearizable)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Get(ctx, k, WithConsistency(CrossClientMonotonic)); err != nil {
				t.Fatal(err)
			}
		}
		spread := 0
		for _, n := range nodes {
			a := n.ClientAddr().String()
			if wire.count(a, "eventual") > 0 {
				spread++
			}
			if a != leaderAddr(k) && (wire.count(a, "linearizable") > 0 || wire.count(a, "cross-client-monotonic") > 0) {
				t.Fatalf("key %s: strong reads went to %s, not its leader %s", k, a, leaderAddr(k))
			}
		}
		if spread < 2 || wire.count(leaderAddr(k), "linearizable") != 30 {
			t.Fatalf("key %s: eventual reads at %d nodes (want the group's 3, at least 2), linearizable at the leader %d (want 30)",
				k, spread, wire.count(leaderAddr(k), "linearizable"))
		}
	}

	var kvs []KV
	var all []string
	for i := range keys[0] {
		for _, ks := range keys {
			kvs = append(kvs, KV{Key: ks[i] + "m", Value: []byte("m-" + ks[i])})
			all = append(all, ks[i]+"m")
		}
	}
	if err := c.MultiPut(ctx, kvs, WithDurability(Sync)); err != nil {
		t.Fatalf("MultiPut over three groups: %v", err)
	}
	vals, err := c.MultiGet(ctx, append(all, "missing"), WithConsistency(Linearizable))
	if err != nil {
		t.Fatalf("MultiGet over three groups: %v", err)
	}
	for i, kv := range kvs {
		if string(vals[i]) != string(kv.Value) {
			t.Fatalf("MultiGet[%d] (%s) = %q, want %q", i, kv.Key, vals[i], kv.Value)
		}
	}
	if vals[len(kvs)] != nil {
		t.Fatalf("MultiGet of a missing key = %q, want nil", vals[len(kvs)])
	}
}

// WithCluster(true) against a single group: one group owns every slot, the
// client routes through the map to its leader, and multi-key calls are not
// split (the group takes keys of any slots in one command).
func TestClusterPathOnOneGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	nodes := startGroup(t)
	l := leaderOf(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{nodes[(l+1)%3].ClientAddr().String()}, WithCluster(true), WithRetryUnavailable(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.rt == nil || c.rt.crossSlot {
		t.Fatal("WithCluster(true) on one group: want a map, without splitting by slot")
	}
	if got, want := routedTo(c, "a"), nodes[l].ClientAddr().String(); got != want {
		t.Fatalf("routes to %s, want the leader %s", got, want)
	}
	if parts := c.rt.splitKeys([]string{"a", "b", "c", "d"}); len(parts) != 1 {
		t.Fatalf("keys of four slots in %d parts, want 1", len(parts))
	}
	if err := c.MultiPut(ctx, []KV{{"a", []byte("1")}, {"b", []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	if v, err := c.MultiGet(ctx, []string{"a", "b"}); err != nil || string(v[0]) != "1" || string(v[1]) != "2" {
		t.Fatalf("MultiGet = %q, %v", v, err)
	}
}
