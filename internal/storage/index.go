package storage

import (
	"slices"
	"unsafe"
)

// ver is one version of a key in the index. 32 bytes; a key with one version costs one
// item (56 bytes in a B+tree leaf) plus its key bytes in the arena.
type ver struct {
	version uint64
	ts      int64
	pos     uint64 // start of the record in the logical log
	size    uint32 // record size
	flags   uint32 // verTombstone | verPruned | verMeta | verCounted
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
)

func (v ver) tombstone() bool { return v.flags&verTombstone != 0 }
func (v ver) hasMeta() bool   { return v.flags&verMeta != 0 }
func (v ver) counted() bool   { return v.flags&verCounted != 0 }
func (v ver) end() Pos        { return Pos(v.pos + uint64(v.size)) }

// item is a key and its versions, newest first: v is the newest, older (nil for the
// common single-version key) the rest. The slice behind older is never modified in
// place, so a checkpoint that copied an item under the lock can read it after.
type item struct {
	kref  uint64 // the key, in the tree's arena
	v     ver
	older *[]ver
	// tag is the key's 8 bytes after its leaf's lpre, as an integer (tree.retag),
	// which the leaf search compares instead of the key: the key lives in the
	// arena, and dereferencing it at every step of a binary search was a cache
	// miss each — a quarter of a pipelined GET's CPU over 100,000 random keys
	// (docs/design/hashes.md, "Pipelined, session 21"). Set by the tree, not by makeItem.
	tag uint64
}

// keyString views b as a string without copying, for lookups that do not retain it.
func keyString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func (it *item) n() int {
	if it.older == nil {
		return 1
	}
	return 1 + len(*it.older)
}

func (it *item) at(i int) ver {
	if i == 0 {
		return it.v
	}
	return (*it.older)[i-1]
}

// versions appends the item's versions, newest first, to dst.
func (it *item) versions(dst []ver) []ver {
	dst = append(dst, it.v)
	if it.older != nil {
		dst = append(dst, *it.older...)
	}
	return dst
}

func makeItem(kref uint64, vs []ver) item {
	it := item{kref: kref, v: vs[0]}
	if len(vs) > 1 {
		older := slices.Clone(vs[1:])
		it.older = &older
	}
	return it
}

// pick returns the index of the newest version <= at, or -1. gone reports that the
// version asked for is older than every retained one and older ones were pruned.
func (it *item) pick(at uint64) (i int, gone bool) {
	n := it.n()
	for i = 0; i < n; i++ {
		if it.at(i).version <= at {
			return i, false
		}
	}
	return -1, it.at(n-1).flags&verPruned != 0
}
