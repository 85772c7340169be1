package kv

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func chainOp(kind Kind, c ChainConfig, expect int64) *Op {
	return &Op{Kind: kind, Key: AppendChainConfig(nil, &c), Delta: expect}
}

func TestChainConfigCodec(t *testing.T) {
	c := &ChainConfig{Group: 1, Epoch: 7, Members: []uint64{3, 1, 2}, Joiner: 4}
	b := AppendChainConfig(nil, c)
	got, err := DecodeChainConfig(b)
	if err != nil || !got.Equal(c) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for i := range len(b) {
		if _, err := DecodeChainConfig(b[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a configuration cut at %d decoded: %v", i, err)
		}
	}
	for _, bad := range []ChainConfig{
		{Group: 1},
		{Group: 1, Members: []uint64{1, 0}},
		{Group: 1, Members: []uint64{1, 2, 1}},
	} {
		if _, err := DecodeChainConfig(AppendChainConfig(nil, &bad)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%+v decoded: %v", bad, err)
		}
	}
	if _, err := DecodeChainConfig(append(b, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatal("trailing bytes decoded")
	}
}

// The chain ops: the first configuration once (a second init, another
// node's, is a no-op), then compare-and-set by epoch: a set from the
// recorded epoch lands, a set from a stale epoch (a master that loaded an
// older record) or lowering the epoch is refused and changes nothing, the
// same configuration again is a retry; each chain group has its own record,
// and no map is needed (a lone chain's metadata group has none).
func TestChainConfigOps(t *testing.T) {
	m := mem{}
	v := uint64(0)
	apply := func(op *Op) (Result, error) {
		v++
		return applyTo(t, m, v, op)
	}
	read := func(group uint64) *ChainConfig {
		t.Helper()
		c, err := ReadChainConfig(m.get, group)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	start := ChainConfig{Group: 1, Members: []uint64{1, 2, 3}}
	if _, err := apply(chainOp(KindMapChainSet, start, 0)); !errors.Is(err, ErrSlotTransition) || read(1) != nil {
		t.Fatalf("a set before the init: %v", err)
	}
	if res, err := apply(chainOp(KindMapChainInit, start, 0)); err != nil || res.Int != 0 || res.Version == 0 {
		t.Fatalf("init: %+v %v", res, err)
	}
	other := ChainConfig{Group: 1, Epoch: 5, Members: []uint64{2, 3}}
	if res, err := apply(chainOp(KindMapChainInit, other, 0)); err != nil || res.Version != 0 || !read(1).Equal(&start) {
		t.Fatalf("a second init changed the record: %+v %v", res, err)
	}
	failed := ChainConfig{Group: 1, Epoch: 1, Members: []uint64{1, 3}}
	if res, err := apply(chainOp(KindMapChainSet, failed, 0)); err != nil || res.Int != 1 || res.Version == 0 || !read(1).Equal(&failed) {
		t.Fatalf("set from the recorded epoch: %+v %v", res, err)
	}
	if res, err := apply(chainOp(KindMapChainSet, failed, 0)); err != nil || res.Version != 0 {
		t.Fatalf("the same set again: %+v %v", res, err)
	}
	stale := ChainConfig{Group: 1, Epoch: 1, Members: []uint64{1, 2}}
	if _, err := apply(chainOp(KindMapChainSet, stale, 0)); !errors.Is(err, ErrSlotTransition) || !read(1).Equal(&failed) {
		t.Fatalf("a set from a stale epoch: %v (record %+v)", err, read(1))
	}
	lower := ChainConfig{Group: 1, Epoch: 0, Members: []uint64{1, 3}, Joiner: 2}
	if _, err := apply(chainOp(KindMapChainSet, lower, 1)); !errors.Is(err, ErrSlotTransition) || !read(1).Equal(&failed) {
		t.Fatalf("a set lowering the epoch: %v", err)
	}
	joining := ChainConfig{Group: 1, Epoch: 1, Members: []uint64{1, 3}, Joiner: 2}
	if res, err := apply(chainOp(KindMapChainSet, joining, 1)); err != nil || res.Int != 1 || !read(1).Equal(&joining) {
		t.Fatalf("a join at the same epoch: %+v %v", res, err)
	}
	// A set expecting another record at the same epoch (a commit that
	// timed out, landing after this join was recorded) is refused.
	late := chainOp(KindMapChainSet, ChainConfig{Group: 1, Epoch: 2, Members: []uint64{1}}, 1)
	late.Expected = AppendChainConfig(nil, &failed)
	if _, err := apply(late); !errors.Is(err, ErrSlotTransition) || !read(1).Equal(&joining) {
		t.Fatalf("a set expecting another record at the same epoch: %v (record %+v)", err, read(1))
	}
	late.Expected = AppendChainConfig(nil, &joining)
	if res, err := apply(late); err != nil || res.Int != 2 || read(1).Epoch != 2 {
		t.Fatalf("a set expecting the record: %+v %v", res, err)
	}
	if _, err := apply(&Op{Kind: KindMapChainSet, Key: []byte{1}}); !errors.Is(err, ErrInvalidOp) {
		t.Fatalf("a corrupt configuration: %v", err)
	}
	if res, err := apply(chainOp(KindMapChainInit, ChainConfig{Group: 2, Members: []uint64{4, 5}}, 0)); err != nil || res.Version == 0 || read(2) == nil || read(1).Epoch != 2 {
		t.Fatalf("a second chain's init: %+v %v", res, err)
	}
	for _, k := range []Kind{KindMapChainInit, KindMapChainSet} {
		op := chainOp(k, ChainConfig{Group: 9, Members: []uint64{1}}, 0)
		if k < 169 || k > 171 || !IsSlotKind(k) || !k.known() || !k.IsUpdate() || k.String() == "" {
			t.Fatalf("kind %d: not a known slot update in 169-171", k)
		}
		if ks, _ := op.RoutingKeys(); ks != nil {
			t.Fatalf("%s routes by keys %q", k, ks)
		}
		// The cluster map too: a chain group's members follow the record.
		if ws := op.WrittenKeys(); len(ws) != 2 || string(ws[0]) != string(ChainConfigKey(9)) || string(ws[1]) != string(ClusterMapKey) {
			t.Fatalf("%s writes %q", k, ws)
		}
	}
}

// FuzzChainConfig: any bytes either fail to decode or round-trip, and an
// op of either kind with them as Key never panics and writes only a record
// that decodes.
func FuzzChainConfig(f *testing.F) {
	f.Add(AppendChainConfig(nil, &ChainConfig{Group: 1, Epoch: 2, Members: []uint64{1, 2, 3}, Joiner: 4}), int64(2))
	f.Add([]byte{1, 0, 0, 0}, int64(0))
	f.Fuzz(func(t *testing.T, b []byte, expect int64) {
		c, err := DecodeChainConfig(b)
		if err == nil {
			if d, err := DecodeChainConfig(AppendChainConfig(nil, c)); err != nil || !d.Equal(c) {
				t.Fatalf("%x: round trip %+v %v", b, d, err)
			}
		}
		m := mem{}
		for i, k := range []Kind{KindMapChainInit, KindMapChainSet, KindMapChainSet} {
			_, _ = applyTo(t, m, uint64(i+1), &Op{Kind: k, Key: b, Delta: expect})
		}
		for key, v := range m {
			if _, err := DecodeChainConfig([]byte(v.val)); err != nil {
				t.Fatalf("%q holds %x: %v", key, v.val, err)
			}
		}
	})
}

// TestMapChainWant: KindMapChainWant records a chain group's nodes to add
// and to remove — compare-and-set by the map's epoch, the same wish again a
// no-op at any epoch, the refusals — and the chain's record, as the master
// carries the wish out, clears a node from Joining once it is a member,
// while Leaving keeps a node the chain dropped (the master never joins it
// again).
func TestMapChainWant(t *testing.T) {
	m := mem{}
	apply := applier(t, m)
	initMap(t, apply)
	for _, id := range []uint64{4, 5} {
		nd := MapNode{ID: id, ClientAddr: fmt.Sprintf("127.0.0.1:%d", id), PeerAddr: fmt.Sprintf("127.0.0.1:1%d", id)}
		if _, err := apply(&Op{Kind: KindMapAddNode, Key: AppendMapNode(nil, nd)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := apply(&Op{Kind: KindMapAddGroup, Key: AppendMapAddGroup(nil, MapAddGroup{MapMembers: MapMembers{Group: 3, Members: []uint64{1, 2, 3}}, Engine: EngineChain})}); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(chainOp(KindMapChainInit, ChainConfig{Group: 3, Members: []uint64{1, 2, 3}}, 0)); err != nil {
		t.Fatal(err)
	}
	want := func(w MapChainWant) (Result, error) {
		return apply(&Op{Kind: KindMapChainWant, Key: AppendMapChainWant(nil, w)})
	}
	group := func() MapGroup { g, _ := readMap(t, m).Group(3); return *g }
	e := readMap(t, m).Epoch
	for _, bad := range []MapChainWant{
		{Group: 1, Epoch: e, Join: []uint64{4}},                         // a VR group
		{Group: 9, Epoch: e, Join: []uint64{4}},                         // no such group
		{Group: 3, Epoch: e, Join: []uint64{7}},                         // not a node
		{Group: 3, Epoch: e, Join: []uint64{4}, Leave: []uint64{4}},     // both
		{Group: 3, Epoch: e, Leave: []uint64{1, 2, 3}},                  // no member left
		{Group: 3, Epoch: e - 1, Join: []uint64{4}, Leave: []uint64{2}}, // a stale plan
	} {
		if _, err := want(bad); !errors.Is(err, ErrSlotTransition) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if readMap(t, m).Epoch != e {
		t.Fatal("a refused wish moved the map")
	}
	replace := MapChainWant{Group: 3, Epoch: e, Join: []uint64{4}, Leave: []uint64{2}}
	if res, err := want(replace); err != nil || res.Int != int64(e+1) || res.Version == 0 {
		t.Fatalf("replace 2 by 4: %+v %v", res, err)
	}
	if g := group(); !slices.Equal(g.Joining, []uint64{4}) || !slices.Equal(g.Leaving, []uint64{2}) || !slices.Equal(g.Members, []uint64{1, 2, 3}) {
		t.Fatalf("the wish: %+v", g)
	}
	if res, err := want(replace); err != nil || res.Version != 0 || res.Int != int64(e+1) {
		t.Fatalf("the same wish again (a stale epoch, a rerun): %+v %v", res, err)
	}
	// The master's FLUSH puts 4 in the list (before the tail) as the
	// joiner: still wanted (a failure during the flush aborts the join).
	// Its flush done, the record drops the joiner: Joining clears, Leaving
	// stays.
	flushing := ChainConfig{Group: 3, Epoch: 1, Members: []uint64{1, 2, 4, 3}, Joiner: 4}
	if _, err := apply(chainOp(KindMapChainSet, flushing, 0)); err != nil {
		t.Fatal(err)
	}
	if g := group(); !slices.Equal(g.Joining, []uint64{4}) || !slices.Equal(g.Members, []uint64{1, 2, 4, 3}) {
		t.Fatalf("while 4 flushes: %+v", g)
	}
	joined := ChainConfig{Group: 3, Epoch: 1, Members: []uint64{1, 2, 4, 3}}
	if _, err := apply(chainOp(KindMapChainSet, joined, 1)); err != nil {
		t.Fatal(err)
	}
	if g := group(); g.Joining != nil || !slices.Equal(g.Leaving, []uint64{2}) || !slices.Equal(g.Members, []uint64{1, 2, 4, 3}) {
		t.Fatalf("after 4's join: %+v", g)
	}
	// It fails 2: the map drops it and keeps it in Leaving.
	if _, err := apply(chainOp(KindMapChainSet, ChainConfig{Group: 3, Epoch: 2, Members: []uint64{1, 4, 3}}, 1)); err != nil {
		t.Fatal(err)
	}
	g := group()
	if g.Joining != nil || !slices.Equal(g.Leaving, []uint64{2}) || !slices.Equal(g.Members, []uint64{1, 4, 3}) {
		t.Fatalf("after 2 left: %+v", g)
	}
	// The command run again plans nothing new: a no-op.
	if res, err := want(MapChainWant{Group: 3, Epoch: 1, Leave: []uint64{2}}); err != nil || res.Version != 0 {
		t.Fatalf("a rerun once done: %+v %v", res, err)
	}
	// Removing 3 adds to Leaving; taking 2 back drops it from Leaving.
	e = readMap(t, m).Epoch
	if _, err := want(MapChainWant{Group: 3, Epoch: e, Join: []uint64{2}, Leave: []uint64{3}}); err != nil {
		t.Fatal(err)
	}
	if g := group(); !slices.Equal(g.Joining, []uint64{2}) || !slices.Equal(g.Leaving, []uint64{3}) {
		t.Fatalf("2 back, 3 out: %+v", g)
	}
	if err := readMap(t, m).Check(); err != nil {
		t.Fatal(err)
	}
	if ws := (&Op{Kind: KindMapChainWant, Key: AppendMapChainWant(nil, replace)}).WrittenKeys(); len(ws) != 1 || string(ws[0]) != string(ClusterMapKey) {
		t.Fatalf("the wish writes %q", ws)
	}
	if k := KindMapChainWant; k != 175 || !IsSlotKind(k) || !k.known() || !k.IsUpdate() || k.String() != "mapchainwant" {
		t.Fatalf("kind %d (%s): not the cluster block's last known update", k, k)
	}
	b := AppendMapChainWant(nil, replace)
	for i := range len(b) {
		if _, err := DecodeMapChainWant(b[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a wish cut at %d decoded: %v", i, err)
		}
	}
}

// TestMapChainWantRerunWhileTheJoinerFlushes: the command run again (or
// any wish naming the same node to add) while the master flushes the
// joiner — the record, hence the map's list, has it as a member, but as
// the joiner, which followChain keeps in Joining because a failure during
// the flush aborts the join — must keep it in Joining. Dropped there, the
// map no longer wants it: an aborted flush leaves it out for good (the
// master counts the chain one shorter), and kefir cluster replace-node
// reports the change done.
func TestMapChainWantRerunWhileTheJoinerFlushes(t *testing.T) {
	m := mem{}
	apply := applier(t, m)
	initMap(t, apply)
	nd := MapNode{ID: 4, ClientAddr: "127.0.0.1:4", PeerAddr: "127.0.0.1:14"}
	if _, err := apply(&Op{Kind: KindMapAddNode, Key: AppendMapNode(nil, nd)}); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(&Op{Kind: KindMapAddGroup, Key: AppendMapAddGroup(nil, MapAddGroup{MapMembers: MapMembers{Group: 3, Members: []uint64{1, 2, 3}}, Engine: EngineChain})}); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(chainOp(KindMapChainInit, ChainConfig{Group: 3, Members: []uint64{1, 2, 3}}, 0)); err != nil {
		t.Fatal(err)
	}
	replace := MapChainWant{Group: 3, Epoch: readMap(t, m).Epoch, Join: []uint64{4}, Leave: []uint64{2}}
	if _, err := apply(&Op{Kind: KindMapChainWant, Key: AppendMapChainWant(nil, replace)}); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(chainOp(KindMapChainSet, ChainConfig{Group: 3, Epoch: 1, Members: []uint64{1, 2, 4, 3}, Joiner: 4}, 0)); err != nil {
		t.Fatal(err)
	}
	replace.Epoch = readMap(t, m).Epoch
	if _, err := apply(&Op{Kind: KindMapChainWant, Key: AppendMapChainWant(nil, replace)}); err != nil {
		t.Fatal(err)
	}
	g, _ := readMap(t, m).Group(3)
	if !slices.Equal(g.Joining, []uint64{4}) || !slices.Equal(g.Leaving, []uint64{2}) {
		t.Fatalf("the wish again while 4 flushes: joining %v, leaving %v; want [4] [2]", g.Joining, g.Leaving)
	}
}

// TestMapChainWantKeepsAnotherWishsJoin: a wish adds to the chain's change
// under way, as it adds to Leaving: replace 2 by 4 (node 4 not started yet:
// the command timed out, "start the node and run the command again"), then
// remove-node 3 — the second wish must not drop node 4 from Joining, or the
// master carries out "2 and 3 out, no one in" and the chain of three runs
// on one member. Naming a joining node to remove is how its join is given
// up.
func TestMapChainWantKeepsAnotherWishsJoin(t *testing.T) {
	m := mem{}
	apply := applier(t, m)
	initMap(t, apply)
	nd := MapNode{ID: 4, ClientAddr: "127.0.0.1:4", PeerAddr: "127.0.0.1:14"}
	if _, err := apply(&Op{Kind: KindMapAddNode, Key: AppendMapNode(nil, nd)}); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(&Op{Kind: KindMapAddGroup, Key: AppendMapAddGroup(nil, MapAddGroup{MapMembers: MapMembers{Group: 3, Members: []uint64{1, 2, 3}}, Engine: EngineChain})}); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(chainOp(KindMapChainInit, ChainConfig{Group: 3, Members: []uint64{1, 2, 3}}, 0)); err != nil {
		t.Fatal(err)
	}
	want := func(w MapChainWant) {
		t.Helper()
		w.Epoch = readMap(t, m).Epoch
		if _, err := apply(&Op{Kind: KindMapChainWant, Key: AppendMapChainWant(nil, w)}); err != nil {
			t.Fatal(err)
		}
	}
	group := func() MapGroup { g, _ := readMap(t, m).Group(3); return *g }
	want(MapChainWant{Group: 3, Join: []uint64{4}, Leave: []uint64{2}})
	want(MapChainWant{Group: 3, Leave: []uint64{3}})
	if g := group(); !slices.Equal(g.Joining, []uint64{4}) || !slices.Equal(g.Leaving, []uint64{2, 3}) {
		t.Fatalf("replace 2 by 4, then remove 3: joining %v, leaving %v; want [4] [2 3]", g.Joining, g.Leaving)
	}
	want(MapChainWant{Group: 3, Leave: []uint64{4}})
	if g := group(); g.Joining != nil || !slices.Equal(g.Leaving, []uint64{2, 3, 4}) {
		t.Fatalf("4's join given up: joining %v, leaving %v; want [] [2 3 4]", g.Joining, g.Leaving)
	}
}
