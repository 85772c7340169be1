package storage

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
)

// The index tree behaves as a sorted map under random inserts, updates, removes and
// scans, in random and in ascending key order, and keeps its invariants.
func TestTreeMatchesSortedMap(t *testing.T) {
	for _, mode := range []string{"random", "ordered", "shared-prefixes", "long-prefixes", "zeros"} {
		ordered := mode == "ordered"
		seeds, steps := int64(20), 5000
		if mode == "long-prefixes" {
			seeds, steps = 1, 60000 // three levels: inner nodes below the root
		}
		for seed := int64(0); seed < seeds; seed++ {
			rng := rand.New(rand.NewSource(seed))
			tr := newTree()
			model := map[string]uint64{}
			next := 0
			for step := 0; step < steps; step++ {
				var key string
				if ordered {
					next++
					key = fmt.Sprintf("%08d", next-rng.Intn(3))
				} else if mode == "shared-prefixes" {
					// Keys longer and shorter than the 8-byte prefix, many sharing it.
					key = fmt.Sprintf("prefix%0*d", rng.Intn(8), rng.Intn(500))
				} else if mode == "long-prefixes" {
					// As hash field rows lie: a long reserved prefix, a generation
					// (a few, so inner nodes straddle them), fields that share a
					// long prefix of their own or none, and other keys around them.
					switch r := rng.Intn(10); {
					case r == 0:
						key = fmt.Sprintf("k%d", rng.Intn(2000))
					case r == 1:
						key = fmt.Sprintf("\xff\xffkefir/h/\x00\x00\x00\x00\x00\x00\x00%c%d", '0'+rng.Intn(3), rng.Intn(500))
					default:
						key = fmt.Sprintf("\xff\xffkefir/h/\x00\x00\x00\x00\x00\x00\x00%celement:%0*d", '0'+rng.Intn(3), 8+rng.Intn(5), rng.Intn(20000))
					}
				} else if mode == "zeros" {
					// Keys that differ only in trailing zero bytes, which a tag's
					// zero padding cannot tell apart: only their lengths do.
					key = "z" + strings.Repeat("\x00", rng.Intn(12)) + string([]byte{byte(rng.Intn(3))})[:rng.Intn(2)] + strings.Repeat("\x00", rng.Intn(3))
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
				case mode == "long-prefixes" && rng.Intn(20) > 0:
					// The scan below is O(model) here: mostly look up instead.
					if p := tr.get(key); (p == nil) != (model[key] == 0) || p != nil && p.v.version != model[key] {
						t.Fatalf("get(%q) disagrees with the model (%d)", key, model[key])
					}
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
				if step%1000 == 999 {
					if err := tr.check(); err != nil {
						t.Fatalf("%s seed %d step %d: %v", mode, seed, step, err)
					}
				}
			}
			if mode == "long-prefixes" && (tr.root.isLeaf() || tr.root.kids[0].isLeaf()) {
				t.Fatalf("seed %d: the tree has fewer than three levels", seed)
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

// TestPrefixIsTheZeroPaddedBigEndianHead holds prefix's overlapping loads
// (keys of 1–7 bytes) to its definition, byte by byte, at every length and
// at every offset into a longer string (prefixAt's tails): a wrong shift or
// an overlap that lands a byte in the wrong place fails it.
func TestPrefixIsTheZeroPaddedBigEndianHead(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	want := func(k string) uint64 {
		var p uint64
		for i := 0; i < len(k) && i < 8; i++ {
			p |= uint64(k[i]) << (56 - 8*i)
		}
		return p
	}
	for i := 0; i < 20000; i++ {
		b := make([]byte, 1+rng.Intn(12))
		rng.Read(b)
		s := string(b)
		for skip := 0; skip <= len(s); skip++ {
			if got, w := prefix(s[skip:]), want(s[skip:]); got != w {
				t.Fatalf("prefix(%q) = %016x, want %016x", s[skip:], got, w)
			}
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

// Keys that share a long prefix, as a hash's field rows do (kv's reserved
// prefix, the generation, and here the fields' own "element:0000000"), are
// placed by integer compares: every inner node below the root carries the
// prefix its separators share (pre), and its separators' pfx, the 8 bytes after
// it, differ, so no descent compares a separator byte by byte. Without pre
// every pfx was "\xff\xffkefir" and every step of a descent a string compare.
func TestInnerNodesSkipSharedPrefixes(t *testing.T) {
	tr := newTree()
	rng := rand.New(rand.NewSource(3))
	const row = "\xff\xffkefir/h/\x00\x00\x00\x00\x00\x00\x00\x07element:"
	for _, i := range rng.Perm(100000) {
		tr.insert(tr.newItem(fmt.Appendf(nil, "%s%012d", row, i), []ver{{}}))
	}
	if err := tr.check(); err != nil {
		t.Fatal(err)
	}
	if tr.root.isLeaf() || tr.root.kids[0].isLeaf() {
		t.Fatal("want three levels")
	}
	for _, n := range tr.root.kids {
		if len(n.pre) < len(row)+7 { // "element:0000000" of 12 digits < 100000
			t.Fatalf("an inner node's pre is %q (%d bytes); its separators share %d", n.pre, len(n.pre), len(row)+7)
		}
		for i := 2; i < len(n.keys); i++ {
			if n.keys[i].pfx == n.keys[i-1].pfx {
				t.Fatalf("separators %q and %q tie on pfx", n.keys[i-1].key, n.keys[i].key)
			}
		}
	}
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("%s%012d", row, rng.Intn(100000))
		if p := tr.get(k); p == nil || tr.keyOf(p) != k {
			t.Fatalf("get(%q) missed", k)
		}
	}
}

// check fails on a separator whose pfx is not its 8 bytes after pre.
func TestTreeCheckSeesAStalePrefix(t *testing.T) {
	tr := newTree()
	for i := 0; i < 200; i++ {
		tr.insert(tr.newItem([]byte(fmt.Sprintf("same-prefix-%04d", i)), []ver{{}}))
	}
	if err := tr.check(); err != nil || len(tr.root.keys) < 2 {
		t.Fatal(err, len(tr.root.keys))
	}
	tr.root.keys[1].pfx = prefix(tr.root.keys[1].key) // as before pre
	if tr.check() == nil {
		t.Fatal("check accepted a separator's pfx taken from its first bytes")
	}
}

// check also holds each leaf's tags to its lpre: a tag taken from a key's
// first bytes (as if the leaf had no lpre), or an lpre a key lacks, is caught.
func TestTreeCheckSeesAStaleTag(t *testing.T) {
	tr := newTree()
	for i := 0; i < 200; i++ {
		tr.insert(tr.newItem([]byte(fmt.Sprintf("same-prefix-%04d", i)), []ver{{}}))
	}
	leaf := tr.root
	for !leaf.isLeaf() {
		leaf = leaf.kids[0]
	}
	if err := tr.check(); err != nil || leaf.lpre == "" {
		t.Fatalf("%v, lpre %q", err, leaf.lpre)
	}
	it := &leaf.items[1]
	good := it.tag
	it.tag = prefix(tr.keyOf(it))
	if tr.check() == nil {
		t.Fatal("check accepted a tag taken from the key's first bytes")
	}
	it.tag = good
	leaf.lpre += "x"
	if tr.check() == nil {
		t.Fatal("check accepted an lpre the leaf's keys lack")
	}
}

// A leaf whose keys tie on their tags (two key families in one leaf, so its
// lpre is empty and every "user:aaaaaaaa…" key has the same 8 bytes) still
// finds, inserts and removes each key in order: ties are decided by the keys.
func TestLeafSearchOnTiedTags(t *testing.T) {
	tr := newTree()
	var keys []string
	for i := 0; i < 60; i++ {
		keys = append(keys, fmt.Sprintf("user:aaaaaaaa-%03d", (i*37)%60))
	}
	keys = append(keys, "order:1", "zzz")
	for _, k := range keys {
		tr.insert(tr.newItem([]byte(k), []ver{{}}))
		if err := tr.check(); err != nil {
			t.Fatalf("after %q: %v", k, err)
		}
	}
	for _, k := range keys {
		if tr.get(k) == nil {
			t.Fatalf("%q not found", k)
		}
		if tr.get(k+"0") != nil || tr.get(k[:len(k)-1]) != nil {
			t.Fatalf("a neighbour of %q found", k)
		}
	}
	for _, k := range keys[:30] {
		if !tr.remove(k) {
			t.Fatalf("remove %q", k)
		}
	}
	if err := tr.check(); err != nil || tr.Len() != len(keys)-30 {
		t.Fatal(err, tr.Len())
	}
}

// BenchmarkTreeGet is a point lookup among 100,000 keys: "rows" shaped as a
// hash's field rows (38 bytes, 30 of them shared), "keys" as redis-benchmark's
// (key:000000012345).
func BenchmarkTreeGet(b *testing.B) {
	for _, shape := range []string{"rows", "keys"} {
		b.Run(shape, func(b *testing.B) {
			tr := newTree()
			keys := make([]string, 100000)
			for i := range keys {
				if shape == "rows" {
					keys[i] = fmt.Sprintf("\xff\xffkefir/h/\x00\x00\x00\x00\x00\x00\x00\x07element:%012d", i)
				} else {
					keys[i] = fmt.Sprintf("key:%012d", i)
				}
			}
			rng := rand.New(rand.NewSource(4))
			for _, i := range rng.Perm(len(keys)) {
				tr.insert(tr.newItem([]byte(keys[i]), []ver{{}}))
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if tr.get(keys[rng.Intn(len(keys))]) == nil {
					b.Fatal("missed")
				}
			}
		})
	}
}

// hinted answers what get answers whatever happened since the hint was
// taken (inserts that shift, split and share leaves, removes that shift,
// empty and unlink them): a hint holds only while its leaf's list of items
// is unchanged. Each leaf change that skips its count (bnode.mods) fails it:
// the hint then names the item that moved into its slot. Both outcomes must
// occur, or the test does not exercise them.
func TestHintedAgreesWithGet(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	tr := newTree()
	key := func(i int) string { return fmt.Sprintf("\xff\xffkefir/h/gen%d/element:%06d", i%2, i/2) }
	hits, absent, stale := 0, 0, 0
	for step := 0; step < 100000; step++ {
		// A probe of a random key, then up to three inserts or removes of
		// keys near it (its leaf's, or a neighbour's), in phases that grow
		// the tree (full leaves share and split) and shrink it (leaves empty
		// and are unlinked); then the hint must lead where get does.
		ki := rng.Intn(10000)
		k := key(ki)
		p, h := tr.findHint(k)
		if p != tr.get(k) || h.leaf == nil || (p == nil) != (h.i < 0) {
			t.Fatalf("step %d: findHint(%q) = %p, %+v; get %p", step, k, p, h, tr.get(k))
		}
		grow := step/5000%2 == 0
		for range rng.Intn(4) {
			k2 := key(min(max(ki+rng.Intn(401)-200, 0), 9999))
			if grow == (rng.Intn(4) > 0) {
				if tr.get(k2) == nil {
					tr.insert(tr.newItem([]byte(k2), []ver{{version: uint64(step)}}))
				}
			} else {
				tr.remove(k2)
			}
		}
		if got, want := tr.hinted(k, h), tr.get(k); got != want {
			t.Fatalf("step %d: hinted(%q) = %p, get %p", step, k, got, want)
		}
		switch {
		case h.leaf.mods != h.mods:
			stale++
		case h.i < 0:
			absent++
		default:
			hits++
		}
	}
	if err := tr.check(); err != nil {
		t.Fatal(err)
	}
	if hits == 0 || absent == 0 || stale == 0 {
		t.Fatalf("%d hints held (%d of absent keys), %d were stale: the test does not exercise all three", hits+absent, absent, stale)
	}
	// A hint of another tree is none.
	other := newTree()
	k := "\xff\xffkefir/h/gen0/element:000001"
	other.insert(other.newItem([]byte(k), []ver{{version: 1}}))
	_, h := other.findHint(k)
	if got := tr.hinted(k, h); got != tr.get(k) {
		t.Fatalf("hinted(%q) with another tree's hint = %p, get %p", k, got, tr.get(k))
	}
	// Nor does an insert follow it: the key goes in this tree's own leaf.
	k2 := k + "x"
	_, h = other.findHint(k2)
	n := tr.n
	tr.insertHinted(tr.newItem([]byte(k2), []ver{{version: 1}}), h)
	if tr.get(k2) == nil || other.get(k2) != nil || tr.n != n+1 || other.n != 1 {
		t.Fatalf("insertHinted(%q) with another tree's hint: in it %v, in the other %v", k2, tr.get(k2) != nil, other.get(k2) != nil)
	}
	if err := tr.check(); err != nil {
		t.Fatal(err)
	}
}

// An absent key's hint (findHint's i -1) answers "absent" only while the key
// really is absent, whatever happens between the probe and its use: many
// hints held at once over long stretches of inserts and removes near their
// keys (leaves fill, share, split), bulk removes that empty runs of leaves
// (unlinked: their ranges go to a neighbour; inner nodes emptied; the root
// collapsing), in-order loads past the right end, inserts below the left
// end; against a model (a map, and the scan's sorted keys: no key twice).
// Each hint is then used as DB.insertLocked uses it: "absent" inserts from
// the hint (insertHinted), and a wrong "absent" puts a second row of the key
// in the tree (or panics); an insert into a wrong leaf or at a wrong index
// leaves the key where get misses it, or out of order (check).
// Fails if any leaf change a key's range depends on skips bnode.mods (an
// insert into a leaf, a share's either side, a remove that may unlink it).
func TestAbsentHintsAgainstModel(t *testing.T) {
	type held struct {
		k string
		h Hint
	}
	for seed := int64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewSource(seed))
		tr := newTree()
		model := map[string]bool{}
		space := 3000 + rng.Intn(3000)
		key := func(i int) string { return fmt.Sprintf("\xff\xffkefir/h/g%d/f:%06d", i%3, i/3) }
		loads := 0 // keys past every other: "\xff\xffkefir/z..." in order
		lows := 0  // keys below every other, descending
		var hints []held
		absentHeld, absentUsed, inLeaf, maxHeight := 0, 0, 0, 0
		add := func(k string, v uint64) {
			if !model[k] {
				tr.insert(tr.newItem([]byte(k), []ver{{version: v}}))
				model[k] = true
			}
		}
		del := func(k string) {
			if tr.remove(k) != model[k] {
				t.Fatalf("seed %d: remove(%q) disagrees with the model (%v)", seed, k, model[k])
			}
			delete(model, k)
		}
		for step := 0; step < 15000; step++ {
			v := uint64(step + 1)
			// Probe: a new hint, of an absent key mostly; now and then of a
			// key the right end's loads or the left end's inserts will add.
			ki := rng.Intn(space)
			k := key(ki)
			switch rng.Intn(20) {
			case 0:
				k = fmt.Sprintf("\xff\xffkefir/z%07d", loads+1+rng.Intn(50))
			case 1:
				k = fmt.Sprintf("\x01%07d", 10000000-lows-1-rng.Intn(50))
			}
			if len(hints) < 150 {
				p, h := tr.findHint(k)
				if (p == nil) != !model[k] || (p == nil) != (h.i < 0) {
					t.Fatalf("seed %d step %d: findHint(%q) = %p, %+v; model %v", seed, step, k, p, h, model[k])
				}
				hints = append(hints, held{k, h})
			}
			// Changes: near the probed key, or elsewhere.
			switch r := rng.Intn(1000); {
			case r < 450: // inserts near ki: its leaf and neighbours fill, share, split
				for range 1 + rng.Intn(6) {
					add(key(min(max(ki+rng.Intn(301)-150, 0), space-1)), v)
				}
			case r < 800: // removes near ki
				for range 1 + rng.Intn(6) {
					del(key(min(max(ki+rng.Intn(301)-150, 0), space-1)))
				}
			case r < 860: // a run removed: leaves emptied and unlinked, inner nodes too
				lo := rng.Intn(space)
				for i := lo; i < min(space, lo+rng.Intn(600)); i++ {
					del(key(i))
				}
			case r < 900: // the right end: in-order loads, then inserts after them
				for range 1 + rng.Intn(100) {
					loads++
					k := fmt.Sprintf("\xff\xffkefir/z%07d", loads)
					tr.load(tr.newItem([]byte(k), []ver{{version: v}}))
					model[k] = true
				}
			case r < 930: // the left end: below every key
				for range 1 + rng.Intn(100) {
					lows++
					add(fmt.Sprintf("\x01%07d", 10000000-lows), v)
				}
			case r < 932: // almost everything removed: the root collapses
				for k := range model {
					if rng.Intn(50) != 0 {
						del(k)
					}
				}
			}
			// Every held hint leads where get does, and get agrees with the model.
			for _, x := range hints {
				got, want := tr.hinted(x.k, x.h), tr.get(x.k)
				if got != want || (want != nil) != model[x.k] {
					t.Fatalf("seed %d step %d: hinted(%q) = %p, get %p, model %v (hint %+v, leaf mods %d)",
						seed, step, x.k, got, want, model[x.k], x.h, x.h.leaf.mods)
				}
				if x.h.i < 0 && x.h.leaf.mods == x.h.mods {
					absentHeld++
				}
			}
			// Use some hints, as insertLocked does: absent -> insert.
			for range rng.Intn(3) {
				if len(hints) == 0 {
					break
				}
				j := rng.Intn(len(hints))
				x := hints[j]
				hints[j] = hints[len(hints)-1]
				hints = hints[:len(hints)-1]
				if x.h.i < 0 && x.h.leaf.mods == x.h.mods {
					absentUsed++
					if len(x.h.leaf.items) < leafMax {
						inLeaf++
					}
				}
				if tr.hinted(x.k, x.h) == nil && !strings.HasPrefix(x.k, "\xff\xffkefir/z") { // (the loads' keys: in order)
					tr.insertHinted(tr.newItem([]byte(x.k), []ver{{version: v}}), x.h)
					model[x.k] = true
					// In its leaf, where get finds it, at its place (a wrong
					// leaf or index: get misses it, or check below fails).
					if p := tr.get(x.k); p == nil || tr.keyOf(p) != x.k {
						t.Fatalf("seed %d step %d: %q inserted from hint %+v, get finds %p", seed, step, x.k, x.h, p)
					}
				}
			}
			height := 1
			for n := tr.root; !n.isLeaf(); n = n.kids[0] {
				height++
			}
			maxHeight = max(maxHeight, height)
			if step%1000 == 999 {
				if err := tr.check(); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				var keys []string
				tr.Scan(func(it item) bool { keys = append(keys, tr.keyOf(&it)); return true })
				if len(keys) != len(model) {
					t.Fatalf("seed %d step %d: %d keys scanned, model %d", seed, step, len(keys), len(model))
				}
				for i, k := range keys {
					if !model[k] || i > 0 && k <= keys[i-1] { // a second row of a key
						t.Fatalf("seed %d step %d: %q scanned after %q; in the model: %v", seed, step, k, keys[max(i-1, 0)], model[k])
					}
				}
			}
		}
		if absentHeld < 5000 || absentUsed < 300 || inLeaf < 100 || maxHeight < 3 {
			t.Fatalf("seed %d: %d absent hints held, %d used (%d inserted in their leaf), height up to %d: the test does not exercise them",
				seed, absentHeld, absentUsed, inLeaf, maxHeight)
		}
		t.Logf("seed %d: %d absent hints used, %d inserted in their leaf", seed, absentUsed, inLeaf)
	}
}
