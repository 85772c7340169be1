package client

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// TestChainReadsSpreadStrongLevels: which requests go to the next replica
// first. By default only the levels any VR replica may serve; with
// WithChainReads the strong ones too (a chain's every member serves them),
// whatever WithReplicaReads says of the weak ones; writes never.
func TestChainReadsSpreadStrongLevels(t *testing.T) {
	strong := []level.Consistency{{}, level.ConsLinearizable, {Kind: level.BoundedVersions, Versions: 3}}
	weak := []level.Consistency{{Kind: level.CrossClientMonotonic}, {Kind: level.Eventual}}
	for _, tc := range []struct {
		name                 string
		opts                 options
		wantStrong, wantWeak bool
	}{
		{"default", options{}, false, true},
		{"chain reads", options{chainReads: true}, true, true},
		{"chain reads, no replica reads", options{chainReads: true, leaderReadsOnly: true}, true, false},
		{"no replica reads", options{leaderReadsOnly: true}, false, false},
	} {
		c := &Client{opts: tc.opts}
		for _, cons := range strong {
			if got := c.spreads(&request{opts: callOptions{consistency: cons}}); got != tc.wantStrong {
				t.Errorf("%s: read at %v spread = %v, want %v", tc.name, cons, got, tc.wantStrong)
			}
		}
		for _, cons := range weak {
			if got := c.spreads(&request{opts: callOptions{consistency: cons}}); got != tc.wantWeak {
				t.Errorf("%s: read at %v spread = %v, want %v", tc.name, cons, got, tc.wantWeak)
			}
		}
		if c.spreads(&request{write: true, opts: callOptions{consistency: level.ConsLinearizable}}) {
			t.Errorf("%s: a write spread", tc.name)
		}
	}
}

// TestEngineFieldAgrees: the node metadata the client reads a chain group
// from is the server's.
func TestEngineFieldAgrees(t *testing.T) {
	if engineField != server.ClusterEngineField || engineChain != kv.EngineChain {
		t.Fatalf("client reads %s=%s, the server writes %s=%s", engineField, engineChain, server.ClusterEngineField, kv.EngineChain)
	}
}

// TestParseChainGroups: a CLUSTER SLOTS range whose nodes carry
// kefir-engine chain (RESP2's flat array or RESP3's map) is a chain group;
// one without metadata, or other metadata, is not — also when a VR group
// and a chain group have the same nodes in the same order.
func TestParseChainGroups(t *testing.T) {
	node := func(port int64, md resp.Value) resp.Value {
		return resp.Value{Kind: resp.Array, Elems: []resp.Value{
			{Kind: resp.Bulk, Str: []byte("127.0.0.1")}, {Kind: resp.Int, Int: port}, {Kind: resp.Bulk, Str: []byte("id")}, md}}
	}
	kvs := func(kind resp.Kind, pairs ...string) resp.Value {
		v := resp.Value{Kind: kind}
		for _, p := range pairs {
			v.Elems = append(v.Elems, resp.Value{Kind: resp.Bulk, Str: []byte(p)})
		}
		return v
	}
	rng := func(start, end int64, nodes ...resp.Value) resp.Value {
		return resp.Value{Kind: resp.Array, Elems: append([]resp.Value{{Kind: resp.Int, Int: start}, {Kind: resp.Int, Int: end}}, nodes...)}
	}
	reply := resp.Value{Kind: resp.Array, Elems: []resp.Value{
		rng(0, 99, node(1, kvs(resp.Array)), node(2, kvs(resp.Array))),                                                      // VR: no metadata
		rng(100, 199, node(1, kvs(resp.Array, "kefir-engine", "chain")), node(2, kvs(resp.Array, "kefir-engine", "chain"))), // RESP2; the VR group's nodes
		rng(200, 299, node(5, kvs(resp.Map, "hostname", "h", "kefir-engine", "chain"))),                                     // RESP3
		rng(300, 16383, node(6, kvs(resp.Map, "hostname", "h"))),
	}}
	r := &router{c: &Client{opts: options{poolSize: 1}}, nodes: map[string]*pool{}, stop: make(chan struct{})}
	defer r.close()
	m, err := r.parse(reply)
	if err != nil {
		t.Fatal(err)
	}
	r.m.Store(m)
	for slot, want := range map[int]bool{0: false, 150: true, 250: true, 5000: false} {
		if got := r.chain(slot); got != want {
			t.Errorf("slot %d: chain %v, want %v", slot, got, want)
		}
	}
	if !m.chainGroups() {
		t.Error("the map names chain groups: chainGroups false")
	}
}

// startChainNodes runs three in-process nodes of one chain group (kefir
// server --engine chain, SU; the master hosted by the nodes), and waits
// until every member serves a linearizable read.
func startChainNodes(t *testing.T) []*server.Server {
	t.Helper()
	nodes := startNodes(t, func(c *server.Config) {
		c.Chain = true
		c.HTTPAddr = "127.0.0.1:0" // the chain's read counters (/metrics)
		c.OpenReplica = vrshard.OpenHostedChainNode(0, vrshard.ChainStoreOptions{Mode: chain.SU})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, n := range nodes {
		c := dialGroup(t, ctx, []string{n.ClientAddr().String()}, nil)
		if err := c.Put(ctx, "warm", []byte("w")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	return nodes
}

// TestChainReadsLearnMembersFromTheMap: a client dialed to one member of a
// chain with WithChainReads learns the chain's members from the map
// (CLUSTER SLOTS: the chain's nodes say kefir-engine chain) and spreads
// linearizable reads over all three — each member's front door receives
// some, and each member serves some itself (kefir_chain_reads_*) — while a
// writer keeps updates in flight; every read returns a value no older than
// the last write answered before it began. Without the map (WithCluster
// (false): Dial's one address) no read goes elsewhere.
func TestChainReadsLearnMembersFromTheMap(t *testing.T) {
	nodes := startChainNodes(t)
	addrs := clientAddrs(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, learn := range []bool{true, false} {
		var wire wireLog
		opts := []Option{WithChainReads(true), WithRetryUnavailable(5 * time.Second), func(o *options) { o.wrapConn = wire.wrap }}
		if !learn {
			opts = append(opts, WithCluster(false))
		}
		c, err := Dial(ctx, addrs[:1], opts...)
		if err != nil {
			t.Fatal(err)
		}
		if learn != (c.rt != nil) {
			t.Fatalf("learn %v: the client routes by the map: %v", learn, c.rt != nil)
		}
		if err := c.Put(ctx, "k", []byte("0")); err != nil {
			t.Fatal(err)
		}
		var acked, begun atomic.Int64
		stop := make(chan struct{})
		werr := make(chan error, 1)
		go func() {
			defer close(werr)
			for v := int64(1); ; v++ {
				select {
				case <-stop:
					return
				default:
				}
				begun.Store(v)
				if err := c.Put(ctx, "k", []byte(strconv.FormatInt(v, 10))); err != nil {
					werr <- err
					return
				}
				acked.Store(v)
			}
		}()
		base := chainServed(t, nodes)
		for range 300 {
			low := acked.Load()
			got, err := c.Get(ctx, "k", WithConsistency(Linearizable))
			high := begun.Load()
			if err != nil {
				close(stop)
				t.Fatalf("learn %v: GET k: %v", learn, err)
			}
			v, _ := strconv.ParseInt(string(got), 10, 64)
			if v < low || v > high {
				close(stop)
				t.Fatalf("learn %v: GET k = %d, the writer's last answered %d before the read, latest begun %d after", learn, v, low, high)
			}
		}
		close(stop)
		if err := <-werr; err != nil {
			t.Fatalf("learn %v: the writer: %v", learn, err)
		}
		c.Close()
		var at []int
		for _, a := range addrs {
			at = append(at, wire.count(a, "linearizable"))
		}
		served := chainServed(t, nodes)
		for i := range served {
			served[i] -= base[i]
		}
		t.Logf("learn %v: linearizable reads sent to each member %v, served there %v", learn, at, served)
		for i, n := range at {
			if learn && (n == 0 || served[i] == 0) {
				t.Fatalf("learning the map, member %d was sent %d linearizable reads and served %v itself (sent %v, served %v)", i+1, n, served[i], at, served)
			}
			if !learn && i > 0 && n != 0 {
				t.Fatalf("without the map, %d linearizable reads were sent to member %d, which Dial was not given (%v)", n, i+1, at)
			}
		}
	}
}

// TestChainReadsNotSpreadOverAVRGroup: against a VR group (whose map names
// no chain) WithChainReads learns nothing from the map: the client does not
// route by it, and with Dial's one address a linearizable read goes to
// that node only.
func TestChainReadsNotSpreadOverAVRGroup(t *testing.T) {
	nodes := startNodes(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, clientAddrs(nodes)[:1], WithChainReads(true), WithRetryUnavailable(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.rt != nil {
		t.Fatal("a VR group's client routes by the map with WithChainReads")
	}
}

// chainServed is each node's count of strong reads its chain member served
// itself: clean, or at the tail's version.
func chainServed(t *testing.T, nodes []*server.Server) []float64 {
	t.Helper()
	var out []float64
	for _, n := range nodes {
		resp, err := http.Get("http://" + n.HTTPAddr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, line := range strings.Split(string(body), "\n") {
			for _, name := range []string{"kefir_chain_reads_clean_total ", "kefir_chain_reads_version_total "} {
				if v, ok := strings.CutPrefix(line, name); ok {
					f, _ := strconv.ParseFloat(v, 64)
					sum += f
				}
			}
		}
		out = append(out, sum)
	}
	return out
}

// TestChainReadsInAMixedCluster: a cluster of a VR group (slots 0-8191)
// and a chain group (8192-16383, kefir server --chain-groups), both on
// nodes 1-3. A client dialed to node 1 with WithChainReads spreads the
// linearizable reads of the chain's keys over the chain's three members
// (from the map), and sends the VR group's to its leader only (a VR
// follower serves none). Without the map's kefir-engine metadata (or
// without the client reading it) the chain's reads go to its head alone.
func TestChainReadsInAMixedCluster(t *testing.T) {
	groups := []kcluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: 8192, End: 16383}}},
	}
	nodes := startNodes(t, func(c *server.Config) {
		c.Groups = groups
		c.ChainGroups = []kcluster.GroupID{2}
		c.OpenChainReplica = vrshard.OpenChainGroup(vrshard.ChainStoreOptions{})
	})
	keys := keysOf(groups, 30)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wire wireLog
	c, err := Dial(ctx, clientAddrs(nodes)[:1], WithChainReads(true), WithRetryUnavailable(10*time.Second),
		func(o *options) { o.wrapConn = wire.wrap })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.rt == nil {
		t.Fatal("the client does not route by the cluster's map")
	}
	// Every key written (through the groups' leaders), and every chain
	// member serving strong reads (its lease: a member without one answers
	// -MOVED, and that read goes to the head).
	for _, ks := range keys {
		for _, k := range ks {
			if err := c.Put(ctx, k, []byte("v"+k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !testgroup.Until(10*time.Second, 20*time.Millisecond, func() bool {
		m := c.rt.m.Load()
		g := m.owner[keySlot(keys[1][0])]
		return g >= 0 && m.groups[g].chain
	}) {
		t.Fatal("the client's map does not name group 2 a chain")
	}
	for gi, ks := range keys {
		wire.reset()
		for range 3 {
			for _, k := range ks {
				v, err := c.Get(ctx, k, WithConsistency(Linearizable))
				if err != nil || string(v) != "v"+k {
					t.Fatalf("GET %s = %q, %v", k, v, err)
				}
			}
		}
		var at []int
		for _, a := range clientAddrs(nodes) {
			at = append(at, wire.count(a, "linearizable"))
		}
		t.Logf("group %d: linearizable reads sent to each node %v", gi+1, at)
		sent := 0
		for _, n := range at {
			if n > 0 {
				sent++
			}
		}
		if gi == 0 && sent != 1 {
			t.Fatalf("the VR group's linearizable reads went to %d nodes (%v): want its leader only", sent, at)
		}
		if gi == 1 && sent != 3 {
			t.Fatalf("the chain's linearizable reads went to %d nodes (%v): want all three members", sent, at)
		}
	}
}
