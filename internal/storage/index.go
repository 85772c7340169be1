package storage

import (
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
	flags   uint32 // verTombstone | verPruned | verMeta | verCounted; verOlder on an item's newest
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
	// verOlder is set on an item's newest version (item.v) when the key has older
	// versions, which then are in the tree's side table (tree.older) under the
	// item's kref. It belongs to the item, not to a version: tree.vers clears it in
	// what it hands out, so it never reaches a hint file or a caller.
	verOlder = 1 << 4
	// verFlags is every flag a version stored outside the index (a hint file) may carry.
	verFlags = verTombstone | verPruned | verMeta | verCounted
)

func (v ver) tombstone() bool { return v.flags&verTombstone != 0 }
func (v ver) hasMeta() bool   { return v.flags&verMeta != 0 }
func (v ver) counted() bool   { return v.flags&verCounted != 0 }
func (v ver) end() Pos        { return Pos(v.pos + uint64(v.size)) }

// item is a key and its newest version, as a B+tree leaf holds it: 48 bytes, with no
// pointer. A key's older versions (most keys have none: retention keeps them only for
// snapshots, KeepVersions or KeepFor) are in the tree's side table, flagged by verOlder
// in v; tree.vers reads both. They were a pointer in the item until the leaves' search
// tags (tag) grew it from 48 to 56 bytes and the index past its 64-bytes-a-key target
// at random (docs/design/hashes.md, "Items back to 48 bytes").
type item struct {
	kref uint64 // the key, in the tree's arena; also its key in the side table
	v    ver
	// tag is the key's 8 bytes after its leaf's lpre, as an integer (tree.retag),
	// which the leaf search compares instead of the key: the key lives in the
	// arena, and dereferencing it at every step of a binary search was a cache
	// miss each — a quarter of a pipelined GET's CPU over 100,000 random keys
	// (docs/design/hashes.md, "Pipelined, session 21"). Set by the tree, not by makeItem.
	tag uint64
}

// hasOlder reports whether the key has versions older than it.v (in the side table).
func (it *item) hasOlder() bool { return it.v.flags&verOlder != 0 }

// keyString views b as a string without copying, for lookups that do not retain it.
func keyString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// vlist is a key's versions, newest first, read from the tree under its lock (tree.vers):
// the newest from the item, the rest from the side table. The slice behind older is never
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
	if it.hasOlder() {
		l.v.flags &^= verOlder
		l.older = t.older[it.kref]
	}
	return l
}

// makeItem returns the item for the key at kref with versions vs (newest first, distinct,
// none flagged verOlder) and records vs[1:] as its older versions in the side table (a
// fresh copy), or forgets any it had. The caller stores the item (insert, load, update,
// Set): the side table is keyed by kref, which an item keeps for its life.
func (t *tree) makeItem(kref uint64, vs []ver) item {
	it := item{kref: kref, v: vs[0]}
	it.v.flags &^= verOlder
	if len(vs) > 1 {
		it.v.flags |= verOlder
		if t.older == nil {
			t.older = make(map[uint64][]ver)
		}
		t.older[kref] = slices.Clone(vs[1:])
	} else if t.older != nil {
		delete(t.older, kref)
	}
	return it
}
