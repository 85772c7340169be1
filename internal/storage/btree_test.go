package storage

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// The index tree behaves as a sorted map under random inserts, updates, removes and
// scans, in random and in ascending key order, and keeps its invariants.
func TestTreeMatchesSortedMap(t *testing.T) {
	for _, mode := range []string{"random", "ordered", "shared-prefixes"} {
		ordered := mode == "ordered"
		for seed := int64(0); seed < 20; seed++ {
			rng := rand.New(rand.NewSource(seed))
			tr := newTree()
			model := map[string]uint64{}
			next := 0
			for step := 0; step < 5000; step++ {
				var key string
				if ordered {
					next++
					key = fmt.Sprintf("%08d", next-rng.Intn(3))
				} else if mode == "shared-prefixes" {
					// Keys longer and shorter than the 8-byte prefix, many sharing it.
					key = fmt.Sprintf("prefix%0*d", rng.Intn(8), rng.Intn(500))
				} else {
					key = fmt.Sprintf("%04d", rng.Intn(3000))
				}
				switch r := rng.Intn(10); {
				case r < 6:
					if p := tr.get(key); p != nil {
						p.v.version++
						model[key]++
					} else {
						tr.insert(tr.newItem([]byte(key), []ver{{version: 1}}))
						model[key] = 1
					}
				case r < 9:
					if tr.remove(key) != (model[key] != 0) {
						t.Fatalf("remove(%s) disagrees with the model", key)
					}
					delete(model, key)
				default:
					var want []string
					for k := range model {
						if k >= key {
							want = append(want, k)
						}
					}
					slices.Sort(want)
					want = want[:min(len(want), 10)]
					var got []string
					tr.ascend(key, func(it *item) bool {
						k := tr.keyOf(it)
						if it.v.version != model[k] {
							t.Fatalf("item %s version %d, model %d", k, it.v.version, model[k])
						}
						got = append(got, k)
						return len(got) < 10
					})
					if !slices.Equal(got, want) {
						t.Fatalf("ascend(%s) = %v, want %v", key, got, want)
					}
				}
			}
			if err := tr.check(); err != nil || tr.Len() != len(model) {
				t.Fatalf("seed %d: %v, len %d vs %d", seed, err, tr.Len(), len(model))
			}
		}
	}
}

// The invariant check itself fails on a broken tree.
func TestTreeCheckCanFail(t *testing.T) {
	tr := newTree()
	for i := 0; i < 200; i++ {
		tr.insert(tr.newItem([]byte(fmt.Sprintf("%04d", i)), []ver{{}}))
	}
	if err := tr.check(); err != nil {
		t.Fatal(err)
	}
	leaf := tr.root.kids[1]
	leaf.items[0].kref, leaf.items[1].kref = leaf.items[1].kref, leaf.items[0].kref
	if tr.check() == nil {
		t.Fatal("check accepted out-of-order keys")
	}
}

// In-order loading fills leaves completely.
func TestTreeInOrderLoadIsDense(t *testing.T) {
	tr := newTree()
	for i := 0; i < leafMax*100; i++ {
		tr.insert(tr.newItem([]byte(fmt.Sprintf("%08d", i)), []ver{{}}))
	}
	leaves := 0
	var walk func(n *bnode)
	walk = func(n *bnode) {
		if n.isLeaf() {
			leaves++
			return
		}
		for _, k := range n.kids {
			walk(k)
		}
	}
	walk(tr.root)
	if leaves != 100 {
		t.Fatalf("%d leaves for %d in-order keys, want 100", leaves, leafMax*100)
	}
}

func TestPrefixOrderAgreesWithKeyOrder(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 100000; i++ {
		a := string(randBytes(rng))
		b := string(randBytes(rng))
		if a < b && prefix(a) > prefix(b) {
			t.Fatalf("%q < %q but prefix %x > %x", a, b, prefix(a), prefix(b))
		}
	}
}

func randBytes(rng *rand.Rand) []byte {
	b := make([]byte, rng.Intn(12))
	for i := range b {
		b[i] = byte(rng.Intn(3)) // small alphabet: lots of ties and zero bytes
	}
	return b
}

func TestKeyArenaRoundTrips(t *testing.T) {
	var a keyArena
	rng := rand.New(rand.NewSource(2))
	refs := map[uint64]string{}
	for i := 0; i < 5000; i++ {
		n := 1 + rng.Intn(600)
		if i%1000 == 0 {
			n = arenaBigKey + rng.Intn(1000) // a chunk of its own
		}
		k := make([]byte, n)
		rng.Read(k)
		refs[a.add(k)] = string(k)
	}
	if len(a.chunks) < 3 {
		t.Fatalf("only %d chunks: chunk boundaries not exercised", len(a.chunks))
	}
	for ref, want := range refs {
		if got := a.get(ref); got != want {
			t.Fatalf("ref %x: got %d bytes, want %d", ref, len(got), len(want))
		}
	}
}

func TestTreeLoadInOrder(t *testing.T) {
	tr := newTree()
	for i := 0; i < 10000; i++ {
		tr.load(tr.newItem([]byte(fmt.Sprintf("%08d", i)), []ver{{version: uint64(i)}}))
	}
	if err := tr.check(); err != nil || tr.Len() != 10000 {
		t.Fatalf("%v, len %d", err, tr.Len())
	}
	if p := tr.get("00004242"); p == nil || p.v.version != 4242 {
		t.Fatal("loaded key not found")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an out-of-order load was accepted")
		}
	}()
	tr.load(tr.newItem([]byte("00000001x"), []ver{{}}))
}
