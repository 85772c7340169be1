package storage

import (
	"fmt"
	"strings"
	"unsafe"
)

// tree is the index's ordered map: a B+tree of items by key, written for memory density.
//
// A general B-tree splits full nodes in half, so a tree filled in key order (a bulk
// load, a hint file, sequential keys) ends half empty; and a slice-backed node that
// splits keeps the other half of its array alive. Here nodes are fixed-capacity arrays
// allocated once, and a full node on the rightmost path that receives a key past its
// end starts a new node instead of splitting, so in-order loads fill nodes completely.
// Random inserts split in half as usual (about 69% full on average).
//
// Items live inline in the leaves; get returns a pointer to the item so an update costs
// one descent. A pointer is valid until the next insert or remove. Not safe for
// concurrent mutation; the DB's lock guards it.
type tree struct {
	root *bnode
	n    int
	// live counts the items whose newest version is not a deletion: the keys a
	// read finds (DBSIZE counts these, not n, which keeps deleted keys until
	// compaction drops their tombstones). Every mutation keeps it: insert,
	// load, Set, remove and update.
	live int
	// withMeta counts the live items whose newest version carries meta
	// that Options.CountMeta counts (verCounted: for kv, keys with an
	// expiry), kept alongside live.
	withMeta int
	arena    keyArena
	// older holds the versions after the newest of every key that has more
	// than one, newest first, at the slot its item's flags name (item.slot;
	// slot 0 is unused); olderFree lists the empty slots. Every item with a
	// slot has its own, and every non-empty slot has an item (check). Kept
	// out of the leaves, where a pointer per item cost every key 8 bytes for
	// the few that have older versions (item); a slice indexed from the
	// item's own bits, not a map by key, because a map's entry cost more than
	// the pointer did (docs/design/hashes.md, "Items back to 48 bytes").
	// Written under the DB's write lock (makeItem, remove), read under its
	// read lock (vers).
	older     [][]ver
	olderFree []uint32
}

// Hint is where a probe (DB.Probe) found a key's item: its leaf and index
// there, and the leaf's change count (bnode.mods) then; or, for a key the
// probe did not find, the leaf whose range holds it and ^j, j the index its
// item would take there. A writer that probes a key it is about to write (an
// HSET's field row) gives the hint back with the key's record (Record.Hint),
// and the insert starts from the item, or knows the key is new and puts it
// in the leaf (hinted, insertHinted), instead of walking the tree again. It
// is checked, not trusted: any change of the leaf's list of items since (an
// insert or removal in it, a split, a share, a move of items) changes mods,
// and the insert walks as without one. The zero Hint is none.
//
// It replaced the tree's 64 fingers, slots by a hash of the key that the
// probe filled and the insert read back, each checked against its key
// (tree.holds: the key's length, the leaf's lpre, its tag, and the arena's
// bytes): the check and the slot's hash were ~190 instructions of a
// pipelined HSET, and a chunk of 256 records overwrote most slots before
// their inserts read them (docs/design/hashes.md, "Pipelined, session 26").
type Hint struct {
	t    *tree
	leaf *bnode
	i    int32
	mods uint32
}

// findHint is get that also returns a hint to the item it finds, or, if
// key has none, to the leaf and index its item would take (i ^index).
func (t *tree) findHint(key string) (*item, Hint) {
	n, i, ok := t.lookup(key)
	if !ok {
		return nil, t.hintAt(n, i, ok)
	}
	return &n.items[i], t.hintAt(n, i, ok)
}

// hintAt is the hint to what lookup returned: for a key it did not find,
// i is ^j, j the index its item would take (insertHinted).
func (t *tree) hintAt(n *bnode, i int, ok bool) Hint {
	if !ok {
		i = ^i
	}
	return Hint{t: t, leaf: n, i: int32(i), mods: n.mods}
}

// hinted is get of key starting from h, a hint that findHint returned for
// key: while the leaf's list of items has not changed since (mods), its i-th
// item is the one findHint found, key's, or key still has none (i < 0). That
// holds because a key is only ever inserted into the leaf whose range holds
// it (an insert counts in mods), and a leaf's range only shrinks when items
// move out of it (a split, a share: counted too); an unlinked sibling's
// range goes to a neighbour, growing it. An absent key's hint saves a new
// key's insert the get's descent it would repeat (a new field's row, ~8 %
// of the HSETs of a pipelined run: docs/design/hashes.md, "Session 35").
// The caller holds the write lock. TestHintedAgreesWithGet.
func (t *tree) hinted(key string, h Hint) *item {
	if n := h.leaf; n != nil && h.t == t && n.mods == h.mods {
		if h.i < 0 {
			return nil
		}
		if it := &n.items[h.i]; refLen(it.kref) == len(key) { // (a guard: the lengths are at hand)
			return it
		}
	}
	return t.get(key)
}

// insertHinted is insert of it, whose key must not be present, given h, a
// hint findHint returned for its key: while the hint's leaf has not changed
// (mods) and has room, the item goes in that leaf at the index the probe
// found (i ^j), and the insert's descent from the root is not repeated.
// That is what insert does then: the leaf is the one it descends to (as for
// hinted: key's item would go in it), unchanged, so its search finds the
// same index; and an insert into a leaf with room touches no inner node (a
// full one splits or shares: insert's). A new field's row of a pipelined
// HSET, ~300 instructions an insert (docs/design/hashes.md, "Session 36").
// TestAbsentHintsAgainstModel.
func (t *tree) insertHinted(it item, h Hint) {
	n := h.leaf
	if n == nil || h.t != t || n.mods != h.mods || h.i >= 0 || len(n.items) >= leafMax {
		t.insert(it)
		return
	}
	n.mods++ // items from the index on move
	it.tag = t.fitLeaf(n, t.keyOf(&it))
	n.items = insertAt(n.items, int(^h.i), it)
	t.n++
	t.live += liveness(&it)
	t.withMeta += metaness(&it)
}

// bMax is the inner-node fanout. leafMax is chosen so a leaf's item array (48-byte
// items) fills a 4 KiB allocation size class: 85 × 48 = 4080 bytes.
const (
	bMax    = 64
	leafMax = 85
)

// bnode is a leaf (kids == nil: items) or an inner node (keys, kids). In an inner node
// every key in kids[i] is >= keys[i] and < keys[i+1]; keys[0] is never compared.
type bnode struct {
	items []item
	keys  []bkey
	kids  []*bnode
	// pre (inner nodes) is a prefix that every separator but keys[0] shares, and
	// each separator's pfx is its 8 bytes after pre. Keys that share long
	// prefixes (a hash's field rows share 30 bytes: kv's reserved prefix, the
	// generation, the fields' own) would otherwise tie on their first 8 bytes
	// everywhere, and every step of a descent would dereference a separator and
	// compare it byte by byte. Inserting a separator that lacks pre shortens it
	// (fitKey); an inner split recomputes it (rekey); removals leave it valid.
	pre string
	// lpre (leaves) is a prefix every item's key shares, and each item's tag is
	// its key's 8 bytes after it: the leaf search compares tags and
	// dereferences a key only on a tie. A key inserted without lpre shortens
	// it (fitLeaf); a split or a share recomputes it from the leaf's first and
	// last keys (retag); removals leave it valid. Its own copy: the arena reuses
	// a removed key's bytes.
	lpre string
	// mods (leaves) counts the changes of items' list: an item inserted or
	// removed, items moved to or from another leaf. A Hint to item i holds
	// while mods is what it was (an item updated in place keeps its slot).
	// A wrap needs 2^32 changes of one leaf between a probe and its insert.
	mods uint32
}

// bkey is an inner-node separator with its 8 bytes after its node's pre as an
// integer, so descending compares integers in one cache line and dereferences a key
// only on a tie.
type bkey struct {
	pfx uint64
	key string
}

// prefixAt is prefix of k's bytes after the first skip.
func prefixAt(k string, skip int) uint64 {
	if skip >= len(k) {
		return 0
	}
	return prefix(k[skip:])
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+8 <= n && a[i:i+8] == b[i:i+8] {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// rekey sets inner node n's pre to the longest prefix its separators (keys[1:])
// share and every separator's pfx after it. It dereferences every separator, so
// it runs only where a node is made or split, not per insert.
func (n *bnode) rekey() {
	n.pre = ""
	if len(n.keys) > 1 {
		first, last := n.keys[1].key, n.keys[len(n.keys)-1].key
		n.pre = first[:commonPrefix(first, last)] // sorted: what the ends share, all do
	}
	for i := range n.keys {
		n.keys[i].pfx = prefixAt(n.keys[i].key, len(n.pre))
	}
}

// fitKey sets keys[i]'s pfx after its key changed or arrived, first shortening
// pre to what that key shares with it. The other separators' bytes between the
// new and the old end of pre are pre's own, so their pfx shift without a
// dereference.
func (n *bnode) fitKey(i int) {
	k := n.keys[i].key
	if i == 0 {
		n.keys[0].pfx = 0 // never compared
		return
	}
	if !strings.HasPrefix(k, n.pre) {
		a, b := len(n.pre), commonPrefix(k, n.pre)
		head := prefix(n.pre[b:a])
		for j := 1; j < len(n.keys); j++ {
			if a-b >= 8 {
				n.keys[j].pfx = head
			} else {
				n.keys[j].pfx = head | n.keys[j].pfx>>(8*(a-b))
			}
		}
		n.pre = n.pre[:b]
	}
	n.keys[i].pfx = prefixAt(k, len(n.pre))
}

// insertKey inserts separator k at i (>= 1) of inner node n.
func (n *bnode) insertKey(i int, k string) {
	n.keys = insertAt(n.keys, i, bkey{key: k})
	if len(n.keys) == 2 {
		n.rekey()
		return
	}
	n.fitKey(i)
}

// setKey replaces separator i of inner node n with k.
func (n *bnode) setKey(i int, k string) {
	n.keys[i].key = k
	n.fitKey(i)
}

// prefix is k's first 8 bytes, big-endian, zero-padded: prefix order agrees with key
// order wherever prefixes differ.
func prefix(k string) uint64 {
	if len(k) >= 8 {
		// One load and a byte swap (the compiler combines these), not the
		// loop below: a descent takes a prefix at every inner node, and a
		// write's finger (fingerOf) one of every key, ~130 instructions a
		// time with the loop.
		return uint64(k[7]) | uint64(k[6])<<8 | uint64(k[5])<<16 | uint64(k[4])<<24 |
			uint64(k[3])<<32 | uint64(k[2])<<40 | uint64(k[1])<<48 | uint64(k[0])<<56
	}
	// Shorter keys are the common case too: what follows a long shared
	// prefix (a leaf's lpre, a node's pre) is often 3–7 bytes, and the
	// byte loop this replaces was the most instructions of any function in
	// a pipelined HSET or SET over 100,000 random keys (~700 and ~300 a
	// request, a retag taking one per item of the leaf;
	// docs/design/hashes.md, "Pipelined, session 25"). Two loads that
	// overlap instead: the bytes both cover are ORed in twice, the same
	// bits at the same place.
	switch n := len(k); {
	case n >= 4:
		hi := uint64(k[0])<<24 | uint64(k[1])<<16 | uint64(k[2])<<8 | uint64(k[3])
		lo := uint64(k[n-4])<<24 | uint64(k[n-3])<<16 | uint64(k[n-2])<<8 | uint64(k[n-1])
		return hi<<32 | lo<<(8*(8-n))
	case n >= 2:
		hi := uint64(k[0])<<8 | uint64(k[1])
		lo := uint64(k[n-2])<<8 | uint64(k[n-1])
		return hi<<48 | lo<<(8*(8-n))
	case n == 1:
		return uint64(k[0]) << 56
	}
	return 0
}

func newLeaf() *bnode         { return &bnode{items: make([]item, 0, leafMax)} }
func (n *bnode) isLeaf() bool { return n.kids == nil }
func newTree() *tree          { return &tree{root: newLeaf()} }
func (t *tree) Len() int      { return t.n }
func (t *tree) Live() int     { return t.live }

// WithMeta is the number of live keys whose newest version carries meta.
func (t *tree) WithMeta() int { return t.withMeta }

// metaness is 1 for a live item whose newest version carries meta. It and
// liveness read the flags in place: ver's methods (value receivers) copied
// the item's 32-byte ver to the stack at each call, six copies an update
// (~35 instructions of every write; docs/design/hashes.md, "Session 36").
func metaness(it *item) int {
	if it.v.flags&(verTombstone|verCounted) != verCounted {
		return 0
	}
	return 1
}

// liveness is 1 for an item a read finds (its newest version is not a
// deletion), 0 for one that only remembers a deletion.
func liveness(it *item) int {
	if it.v.flags&verTombstone != 0 {
		return 0
	}
	return 1
}

// update replaces the item p points at (from get) with it, keeping live.
func (t *tree) update(p *item, it item) {
	t.live += liveness(&it) - liveness(p)
	t.withMeta += metaness(&it) - metaness(p)
	it.tag = p.tag // the same key in the same leaf
	*p = it
}
func newInner() *bnode { return &bnode{keys: make([]bkey, 0, bMax), kids: make([]*bnode, 0, bMax)} }
func (t *tree) firstKey(n *bnode) string {
	for !n.isLeaf() {
		n = n.kids[0]
	}
	if len(n.items) == 0 {
		return ""
	}
	return t.keyOf(&n.items[0])
}

// childIndex returns the child of inner node n whose range holds key.
func childIndex(n *bnode, key string) int {
	keys := n.keys
	lo, hi := 1, len(keys)
	if lo >= hi {
		return 0
	}
	skip := len(n.pre)
	if skip > 0 {
		if kp := key[:min(len(key), skip)]; kp != n.pre {
			if kp < n.pre {
				return 0 // below every separator
			}
			return len(keys) - 1 // above every separator
		}
	}
	kp := prefixAt(key, skip)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if keys[m].pfx < kp || keys[m].pfx == kp && keys[m].key[skip:] <= key[skip:] {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo - 1
}

// search returns the index in leaf n of the first item >= key and whether it
// is equal. It compares the items' tags (their 8 bytes after n.lpre) with
// key's, and a key's bytes only on a tie: a tag is in the item, a key in the
// arena, a cache miss away.
func (t *tree) search(n *bnode, key string) (int, bool) {
	items := n.items
	skip := len(n.lpre)
	if skip > 0 {
		if kp := key[:min(len(key), skip)]; kp != n.lpre {
			if kp < n.lpre {
				return 0, false // below every key of the leaf
			}
			return len(items), false // above every key
		}
	}
	kp := prefixAt(key, skip)
	lo, hi := 0, len(items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch tg := items[m].tag; {
		case tg < kp:
			lo = m + 1
		case tg > kp:
			hi = m
		default: // a tie (usually key's own item): the keys decide, and equal ones end the search
			var c int
			if il := refLen(items[m].kref); il <= skip+8 && len(key) <= skip+8 {
				// Both keys end within their tags, which then hold all they
				// have after lpre (zero-padded): the shorter is the smaller,
				// equal lengths are equal keys. No read of the key.
				c = il - len(key)
			} else {
				c = strings.Compare(t.keyOf(&items[m]), key)
			}
			switch {
			case c < 0:
				lo = m + 1
			case c > 0:
				hi = m
			default:
				return m, true
			}
		}
	}
	return lo, false
}

// retag sets leaf n's lpre to the prefix its first and last keys share (which
// every key between them shares) and every item's tag after it.
func (t *tree) retag(n *bnode) {
	if len(n.items) == 0 {
		n.lpre = ""
		return
	}
	first, last := t.keyOf(&n.items[0]), t.keyOf(&n.items[len(n.items)-1])
	n.lpre = strings.Clone(first[:commonPrefix(first, last)])
	t.tagItems(n)
}

// tagItems sets every item's tag of leaf n after its lpre.
func (t *tree) tagItems(n *bnode) {
	for i := range n.items {
		n.items[i].tag = prefixAt(t.keyOf(&n.items[i]), len(n.lpre))
	}
}

// fitLeaf makes leaf n ready to take key: lpre shortened to what key shares
// with it (and every tag recomputed after it) if key lacks it. It returns
// key's tag.
func (t *tree) fitLeaf(n *bnode, key string) uint64 {
	if len(n.items) == 0 {
		n.lpre = strings.Clone(key) // the next key shortens it to what they share
	} else if !strings.HasPrefix(key, n.lpre) {
		n.lpre = n.lpre[:commonPrefix(n.lpre, key)]
		t.tagItems(n)
	}
	return prefixAt(key, len(n.lpre))
}

// get returns a pointer to key's item, or nil.
func (t *tree) get(key string) *item {
	if n, i, ok := t.lookup(key); ok {
		return &n.items[i]
	}
	return nil
}

// lookup returns the leaf whose range holds key and the index there of
// key's item, if it has one (ok), else of the first item after it.
func (t *tree) lookup(key string) (n *bnode, i int, ok bool) {
	n = t.root
	for !n.isLeaf() {
		n = n.kids[childIndex(n, key)]
	}
	i, ok = t.search(n, key)
	return n, i, ok
}

// insert adds it; its key must not be present.
func (t *tree) insert(it item) {
	right, sep := t.ins(t.root, it, true)
	if right != nil {
		root := newInner()
		root.keys = append(root.keys, bkey{key: t.firstKey(t.root)}, bkey{key: sep})
		root.kids = append(root.kids, t.root, right)
		root.rekey()
		t.root = root
	}
	t.n++
	t.live += liveness(&it)
	t.withMeta += metaness(&it)
}

func (t *tree) ins(n *bnode, it item, rightmost bool) (*bnode, string) {
	key := t.keyOf(&it)
	if n.isLeaf() {
		i, found := t.search(n, key)
		if found {
			panic("storage: index insert of a present key")
		}
		n.mods++ // items from i on move (or, in a split, to r: a new leaf)
		if len(n.items) < leafMax {
			it.tag = t.fitLeaf(n, key)
			n.items = insertAt(n.items, i, it)
			return nil, ""
		}
		// A split retags both halves (retag): n's lpre is not shortened
		// for a key that may land in the new leaf.
		r := newLeaf()
		if rightmost && i == len(n.items) {
			r.items = append(r.items, it)
			t.retag(r)
			return r, key
		}
		mid := leafMax / 2
		r.items = append(r.items, n.items[mid:]...)
		clear(n.items[mid:])
		n.items = n.items[:mid]
		if i <= mid {
			n.items = insertAt(n.items, i, it)
		} else {
			r.items = insertAt(r.items, i-mid, it)
		}
		t.retag(n)
		t.retag(r)
		return r, t.keyOf(&r.items[0])
	}
	ci := childIndex(n, key)
	if k := n.kids[ci]; k.isLeaf() && len(k.items) == leafMax && t.shareLeaf(n, ci) {
		ci = childIndex(n, key)
	}
	kid, sep := t.ins(n.kids[ci], it, rightmost && ci == len(n.kids)-1)
	if kid == nil {
		return nil, ""
	}
	at := ci + 1
	if len(n.kids) < bMax {
		n.insertKey(at, sep)
		n.kids = insertAt(n.kids, at, kid)
		return nil, ""
	}
	r := newInner()
	if rightmost && at == len(n.kids) {
		r.keys = append(r.keys, bkey{key: sep})
		r.kids = append(r.kids, kid)
		r.rekey()
		return r, sep
	}
	mid := bMax / 2
	r.keys = append(r.keys, n.keys[mid:]...)
	r.kids = append(r.kids, n.kids[mid:]...)
	clear(n.keys[mid:])
	clear(n.kids[mid:])
	n.keys, n.kids = n.keys[:mid], n.kids[:mid]
	if at <= mid {
		n.keys = insertAt(n.keys, at, bkey{key: sep})
		n.kids = insertAt(n.kids, at, kid)
	} else {
		r.keys = insertAt(r.keys, at-mid, bkey{key: sep})
		r.kids = insertAt(r.kids, at-mid, kid)
	}
	n.rekey()
	r.rekey()
	return r, r.keys[0].key
}

// shareLeaf makes room in the full leaf kids[ci] by moving items to a sibling leaf with
// room (as a B*-tree does), instead of splitting. It keeps randomly filled leaves about
// 80% full instead of 69%, which is most of the index's memory.
func (t *tree) shareLeaf(n *bnode, ci int) bool {
	k := n.kids[ci]
	if ci+1 < len(n.kids) {
		if r := n.kids[ci+1]; len(r.items) < leafMax-1 {
			m := (leafMax - len(r.items)) / 2
			old := len(r.items)
			r.items = r.items[:old+m]
			copy(r.items[m:], r.items[:old])
			copy(r.items[:m], k.items[len(k.items)-m:])
			k.mods++
			r.mods++
			clear(k.items[len(k.items)-m:])
			k.items = k.items[:len(k.items)-m]
			n.setKey(ci+1, t.keyOf(&r.items[0]))
			t.retag(k)
			t.retag(r)
			return true
		}
	}
	if ci > 0 {
		if l := n.kids[ci-1]; len(l.items) < leafMax-1 {
			m := (leafMax - len(l.items)) / 2
			l.items = append(l.items, k.items[:m]...)
			k.mods++
			l.mods++ // (appended to: counted all the same)
			copy(k.items, k.items[m:])
			clear(k.items[len(k.items)-m:])
			k.items = k.items[:len(k.items)-m]
			n.setKey(ci, t.keyOf(&k.items[0]))
			t.retag(k)
			t.retag(l)
			return true
		}
	}
	return false
}

// load inserts it, whose key must be greater than every key in the tree (a bulk load in
// key order, as from a hint file): it walks the rightmost path with no key comparisons
// and appends, falling back to insert only when the last leaf is full.
func (t *tree) load(it item) {
	n := t.root
	for !n.isLeaf() {
		n = n.kids[len(n.kids)-1]
	}
	if len(n.items) > 0 && t.keyOf(&n.items[len(n.items)-1]) >= t.keyOf(&it) {
		panic("storage: index load out of key order")
	}
	if len(n.items) < leafMax {
		it.tag = t.fitLeaf(n, t.keyOf(&it))
		n.items = append(n.items, it)
		n.mods++ // (an append moves no item: counted all the same)
		t.n++
		t.live += liveness(&it)
		t.withMeta += metaness(&it)
		return
	}
	t.insert(it)
}

// insertAt inserts v at i within s's existing capacity.
func insertAt[T any](s []T, i int, v T) []T {
	s = s[:len(s)+1]
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

// remove deletes key and reports whether it was present. Empty nodes are unlinked;
// other underfull nodes are left alone (they refill as keys arrive).
func (t *tree) remove(key string) bool {
	p := t.get(key)
	if p == nil {
		return false
	}
	t.live -= liveness(p)
	t.withMeta -= metaness(p)
	if s := p.slot(); s != 0 {
		t.older[s] = nil
		t.olderFree = append(t.olderFree, s)
	}
	t.rm(t.root, key)
	t.n--
	for !t.root.isLeaf() && len(t.root.kids) == 1 {
		t.root = t.root.kids[0]
	}
	if !t.root.isLeaf() && len(t.root.kids) == 0 {
		t.root = newLeaf()
	}
	return true
}

// rm returns whether key was found and whether n is now empty.
func (t *tree) rm(n *bnode, key string) (found, empty bool) {
	if n.isLeaf() {
		i, ok := t.search(n, key)
		if !ok {
			return false, false
		}
		t.arena.free(n.items[i].kref)
		n.mods++
		copy(n.items[i:], n.items[i+1:])
		n.items[len(n.items)-1] = item{}
		n.items = n.items[:len(n.items)-1]
		return true, len(n.items) == 0
	}
	ci := childIndex(n, key)
	found, empty = t.rm(n.kids[ci], key)
	if empty {
		copy(n.keys[ci:], n.keys[ci+1:])
		copy(n.kids[ci:], n.kids[ci+1:])
		n.keys[len(n.keys)-1] = bkey{}
		n.kids[len(n.kids)-1] = nil
		n.keys, n.kids = n.keys[:len(n.keys)-1], n.kids[:len(n.kids)-1]
	}
	return found, len(n.kids) == 0
}

// ascend calls fn for each item with key >= pivot, in order, until fn returns false.
func (t *tree) ascend(pivot string, fn func(*item) bool) { t.asc(t.root, pivot, fn) }

func (t *tree) asc(n *bnode, pivot string, fn func(*item) bool) bool {
	if n.isLeaf() {
		for i, _ := t.search(n, pivot); i < len(n.items); i++ {
			if !fn(&n.items[i]) {
				return false
			}
		}
		return true
	}
	for ci := childIndex(n, pivot); ci < len(n.kids); ci++ {
		if !t.asc(n.kids[ci], pivot, fn) {
			return false
		}
	}
	return true
}

// check verifies the tree's invariants (for tests).
func (t *tree) check() error {
	count, live, withMeta := 0, 0, 0
	slots := make([]bool, len(t.older)) // the slots items hold
	prev := ""
	first := true
	var walk func(n *bnode, lo, hi string, hasHi bool) error
	walk = func(n *bnode, lo, hi string, hasHi bool) error {
		if n.isLeaf() {
			for i := range n.items {
				k := t.keyOf(&n.items[i])
				if (!first && k <= prev) || k < lo || (hasHi && k >= hi) {
					return errTree
				}
				if !strings.HasPrefix(k, n.lpre) || n.items[i].tag != prefixAt(k, len(n.lpre)) {
					return errTree // the leaf search would miss it
				}
				if err := t.checkVersions(&n.items[i], slots); err != nil {
					return err
				}
				prev, first = k, false
				count++
				live += liveness(&n.items[i])
				withMeta += metaness(&n.items[i])
			}
			return nil
		}
		if len(n.keys) != len(n.kids) || len(n.kids) == 0 {
			return errTree
		}
		for i := 1; i < len(n.keys); i++ {
			if k := n.keys[i]; !strings.HasPrefix(k.key, n.pre) || k.pfx != prefixAt(k.key, len(n.pre)) {
				return errTree
			}
		}
		for i, k := range n.kids {
			klo, khi, kHas := lo, hi, hasHi
			if i > 0 {
				klo = n.keys[i].key
			}
			if i+1 < len(n.kids) {
				khi, kHas = n.keys[i+1].key, true
			}
			if err := walk(k, klo, khi, kHas); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(t.root, "", "", false); err != nil {
		return err
	}
	if count != t.n || live != t.live || withMeta != t.withMeta {
		return errTree
	}
	free := make([]bool, len(t.older))
	for _, s := range t.olderFree {
		if s == 0 || int(s) >= len(t.older) || free[s] || slots[s] {
			return fmt.Errorf("%w: free side-table slot %d is out of range, listed twice or held", errTree, s)
		}
		free[s] = true
	}
	for s := 1; s < len(t.older); s++ {
		if !slots[s] && !free[s] {
			return fmt.Errorf("%w: side-table slot %d is neither held nor free", errTree, s)
		}
	}
	return nil
}

// checkVersions verifies it's versions (for check) and marks its side-table slot in
// slots: a slot in range, non-empty, held by no other item (and an empty slot held by
// none); versions falling strictly, newest first; no older version with bits beyond
// verFlags.
func (t *tree) checkVersions(it *item, slots []bool) error {
	var older []ver
	if s := it.slot(); s != 0 {
		if int(s) >= len(t.older) || slots[s] || len(t.older[s]) == 0 {
			return fmt.Errorf("%w: key %q: side-table slot %d is out of range, shared or empty", errTree, t.keyOf(it), s)
		}
		slots[s] = true
		older = t.older[s]
	}
	prev := it.v.version
	for _, v := range older {
		if v.version >= prev || v.flags&^verFlags != 0 {
			return fmt.Errorf("%w: key %q: older version %d (flags %#x) after %d", errTree, t.keyOf(it), v.version, v.flags, prev)
		}
		prev = v.version
	}
	return nil
}

var errTree = errorString("storage: index B+tree invariant violated")

type errorString string

func (e errorString) Error() string { return string(e) }

// Get returns a copy of key's item.
func (t *tree) Get(key string) (item, bool) {
	if p := t.get(key); p != nil {
		return *p, true
	}
	return item{}, false
}

// Set inserts it or replaces the item with its key.
func (t *tree) Set(it item) {
	if p := t.get(t.keyOf(&it)); p != nil {
		t.update(p, it)
		return
	}
	t.insert(it)
}

// Delete removes key.
func (t *tree) Delete(key string) { t.remove(key) }

// Scan calls fn for every item in order until it returns false.
func (t *tree) Scan(fn func(it item) bool) { t.ascend("", func(p *item) bool { return fn(*p) }) }

// keyArena stores the index's keys back to back in large pointer-free chunks. An item
// holds a 64-bit reference instead of a string, so the B+tree leaves hold no pointer
// per key and the garbage collector neither scans nor marks a million key objects on
// every cycle (with one heap object per key, GC work grew with the key count and stole
// the read path's CPU). Keys of removed items are not reused: their bytes are counted
// as garbage and reclaimed when the engine is reopened.
type keyArena struct {
	chunks  [][]byte
	garbage int64
}

// A reference packs chunk (20 bits) | offset (20 bits) | length (24 bits).
const (
	arenaChunk   = 1 << 20
	arenaBigKey  = 64 << 10 // keys at least this long get a chunk of their own
	refLenBits   = 24
	refOffBits   = 20
	refChunkBits = 20
)

func (a *keyArena) add(k []byte) uint64 {
	if len(k) >= 1<<refLenBits {
		panic("storage: key too long for the index arena")
	}
	ci := len(a.chunks) - 1
	if len(k) >= arenaBigKey {
		a.chunks = append(a.chunks, append(make([]byte, 0, len(k)), k...))
		ci = len(a.chunks) - 1
	} else if ci < 0 || len(a.chunks[ci])+len(k) > cap(a.chunks[ci]) || cap(a.chunks[ci]) != arenaChunk {
		a.chunks = append(a.chunks, make([]byte, 0, arenaChunk))
		ci = len(a.chunks) - 1
	}
	if ci >= 1<<refChunkBits {
		panic("storage: index arena exhausted")
	}
	c := a.chunks[ci]
	off := len(c)
	a.chunks[ci] = append(c, k...)
	return uint64(ci)<<(refOffBits+refLenBits) | uint64(off)<<refLenBits | uint64(len(k))
}

func (a *keyArena) get(ref uint64) string {
	n := int(ref & (1<<refLenBits - 1))
	if n == 0 {
		return ""
	}
	off := int(ref >> refLenBits & (1<<refOffBits - 1))
	c := a.chunks[ref>>(refOffBits+refLenBits)]
	return unsafe.String(&c[off], n)
}

// refLen is the length of the key ref refers to, read from the reference.
func refLen(ref uint64) int { return int(ref & (1<<refLenBits - 1)) }

func (a *keyArena) free(ref uint64) { a.garbage += int64(ref & (1<<refLenBits - 1)) }

// keyOf returns it's key, backed by the arena (never modified; safe to keep).
func (t *tree) keyOf(it *item) string { return t.arena.get(it.kref) }

// newItem makes an item for key (copied into the arena) with versions vs.
func (t *tree) newItem(key []byte, vs []ver) item {
	return t.makeItem(item{kref: t.arena.add(key)}, vs)
}
