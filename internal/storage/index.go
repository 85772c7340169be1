package storage

import (
	"fmt"
	"slices"
	"unsafe"
)

// ver is one version of a key in the index. 32 bytes; a key with one version costs one
// item (48 bytes in a B+tree leaf) plus its key bytes in the arena.
type ver struct {
	version uint64
	ts      int64
	pos     uint64 // start of the record in the logical log
	size    uint32 // record size
	// verTombstone | verPruned | verMeta | verCounted (verFlags), and in an item's
	// newest version, above them, the slot of its older versions (olderShift).
	flags uint32
}

const (
	verTombstone = 1 << 0
	// verPruned marks a key's oldest retained version when older ones were dropped, so
	// GetAt below it can say ErrVersionGone rather than ErrNotFound.
	verPruned = 1 << 1
	// verMeta marks a version whose record carries meta (Record.Meta): its cached
	// payload starts with the meta (splitPayload), and a caller looking for keys with
	// meta (expiry) can skip the others without reading them. The index keeps no
	// copy of the meta itself.
	verMeta = 1 << 2
	// verCounted marks a version with meta that Options.CountMeta counts
	// (Stats.MetaKeys); with no CountMeta, every version with meta. Hint files
	// keep it with the other flags (from KFHINT02 on).
	verCounted = 1 << 3
	// verFlags is every flag a version has; a hint file stores these and no other bit.
	verFlags = verTombstone | verPruned | verMeta | verCounted
	// olderShift: the bits of an item's v.flags above verFlags hold the slot of the
	// key's older versions in the tree's side table (tree.older), 0 for none. The
	// slot belongs to the item, not to a version: tree.vers clears it in what it
	// hands out, so it never reaches a hint file or a caller. 28 bits: at most
	// olderMax keys with older versions at once (makeItem panics past it; each costs
	// at least 100 bytes of index, so that is ~27 GB of it).
	olderShift = 4
	olderMax   = 1<<(32-olderShift) - 1
)

func (v ver) tombstone() bool { return v.flags&verTombstone != 0 }
func (v ver) hasMeta() bool   { return v.flags&verMeta != 0 }
func (v ver) end() Pos        { return Pos(v.pos + uint64(v.size)) }

// item is a key and its newest version, as a B+tree leaf holds it: 48 bytes, with no
// pointer. A key's older versions (most keys have none: retention keeps them only for
// snapshots, KeepVersions or KeepFor) are in the tree's side table, at the slot that
// v.flags holds above verFlags (olderShift); tree.vers reads both. They were a pointer
// in the item until the leaves' search tags (tag) grew it from 48 to 56 bytes and the
// index past its 64-bytes-a-key target at random (docs/design/hashes.md, "Items back
// to 48 bytes").
type item struct {
	kref uint64 // the key, in the tree's arena
	v    ver
	// tag is the key's 8 bytes after its leaf's lpre, as an integer (tree.retag),
	// which the leaf search compares instead of the key: the key lives in the
	// arena, and dereferencing it at every step of a binary search was a cache
	// miss each — a quarter of a pipelined GET's CPU over 100,000 random keys
	// (docs/design/hashes.md, "Pipelined, session 21"). Set by the tree, not by makeItem.
	tag uint64
}

// slot is the side-table slot of the key's versions older than it.v, 0 for none.
func (it *item) slot() uint32 { return it.v.flags >> olderShift }

// hasOlder reports whether the key has versions older than it.v (in the side table).
func (it *item) hasOlder() bool { return it.v.flags>>olderShift != 0 }

// keyString views b as a string without copying, for lookups that do not retain it.
func keyString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// vlist is a key's versions, newest first, read from the tree under its lock (tree.vers):
// the newest from the item, the rest from the side table. The array behind older is never
// modified in place (makeItem stores a fresh one), so a vlist stays valid after the lock
// is released: a checkpoint copies them under the read lock and writes them out after.
type vlist struct {
	v     ver
	older []ver
}

func (l *vlist) n() int { return 1 + len(l.older) }

func (l *vlist) at(i int) ver {
	if i == 0 {
		return l.v
	}
	return l.older[i-1]
}

// appendTo appends the versions, newest first, to dst.
func (l *vlist) appendTo(dst []ver) []ver {
	dst = append(dst, l.v)
	return append(dst, l.older...)
}

// pick returns the index of the newest version <= at, or -1. gone reports that the
// version asked for is older than every retained one and older ones were pruned.
func (l *vlist) pick(at uint64) (i int, gone bool) {
	n := l.n()
	for i = 0; i < n; i++ {
		if l.at(i).version <= at {
			return i, false
		}
	}
	return -1, l.at(n-1).flags&verPruned != 0
}

// vers returns it's versions (it is in t, or a copy of one of t's items made under the
// same lock). A key with one version costs no lookup.
func (t *tree) vers(it *item) vlist {
	l := vlist{v: it.v}
	if s := it.slot(); s != 0 {
		l.v.flags &= verFlags
		l.older = t.older[s]
	}
	return l
}

// makeItem returns prev (an item of t, or a new one) with versions vs (newest first,
// distinct): vs[1:] go to prev's side-table slot (a fresh copy) or a new one, and a key
// left with one version gives its slot back. The caller stores the item it returns in
// prev's place (insert, load, update, Set): slots are the items', not the keys'.
func (t *tree) makeItem(prev item, vs []ver) item {
	s := prev.slot()
	it := item{kref: prev.kref, v: vs[0]}
	it.v.flags &= verFlags
	switch {
	case len(vs) > 1:
		if s == 0 {
			s = t.takeSlot()
		}
		t.older[s] = slices.Clone(vs[1:])
		it.v.flags |= s << olderShift
	case s != 0:
		t.older[s] = nil // for the garbage collector, and check
		t.olderFree = append(t.olderFree, s)
	}
	return it
}

// takeSlot returns a free side-table slot.
func (t *tree) takeSlot() uint32 {
	if n := len(t.olderFree); n > 0 {
		s := t.olderFree[n-1]
		t.olderFree = t.olderFree[:n-1]
		return s
	}
	if len(t.older) == 0 {
		t.older = append(t.older, nil) // slot 0 means none
	}
	if len(t.older) > olderMax {
		panic(fmt.Sprintf("storage: more than %d keys with older versions: the index's side table is full", olderMax))
	}
	t.older = append(t.older, nil)
	return uint32(len(t.older) - 1)
}
