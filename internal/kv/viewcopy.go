package kv

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// View copies: the view history of a move's source group, imported with
// its slots (docs/design/cluster.md §8, "The detection of a lost cad/async
// write, across a move").
//
// A session token names, per group, the op of its last write and read and
// the view that op was ordered in; a replica of that group whose applied op
// there has another view knows a view change dropped what the session saw
// (shard.ErrSessionLost). A slot's new group has nothing of the old group's
// log, so the move brings the old group's view history along: one record
// per source group, SlotViewsKey(group), holding the view starts of that
// group's committed ops up to Top. The destination's replicas judge a
// token's part of the source group against it, wherever the source is
// hosted or whether it still exists.
//
// Two copies of one group's history are both prefixes of the same history
// (each row describes committed ops, which never change view), so merging
// keeps the one that reaches further (MergeViewCopy). A copy's rows also
// travel on with a later move of any slot of the group that holds it: a
// slot moved A→B→C leaves C with A's rows as well as B's.

// ViewStart says that group ops from Op on (up to the next start) were
// ordered in View.
type ViewStart struct{ Op, View uint64 }

// ViewCopy is a group's view history as a move carries it: Starts (by Op,
// strictly increasing, none above Top) covers the ops from Starts[0].Op to
// Top; ops below the first start are not known (applied before the group
// recorded views).
type ViewCopy struct {
	Top    uint64
	Starts []ViewStart
}

// GroupViews is one group's copy (a KEFIR.SLOTS VIEWS row).
type GroupViews struct {
	Group uint32
	ViewCopy
}

// SlotViewsPrefix starts the keys of the view copies a group imported.
var SlotViewsPrefix = ReservedKey("slotviews/")

// SlotViewsEnd ends their range (SlotViewsPrefix with '/' incremented).
var SlotViewsEnd = ReservedKey("slotviews0")

// SlotViewsKey is the key of group's copy.
func SlotViewsKey(group uint32) []byte {
	return binary.BigEndian.AppendUint32(append(make([]byte, 0, len(SlotViewsPrefix)+4), SlotViewsPrefix...), group)
}

// SlotViewsGroup is SlotViewsKey's inverse.
func SlotViewsGroup(k []byte) (uint32, bool) {
	if len(k) != len(SlotViewsPrefix)+4 || string(k[:len(SlotViewsPrefix)]) != string(SlotViewsPrefix) {
		return 0, false
	}
	return binary.BigEndian.Uint32(k[len(SlotViewsPrefix):]), true
}

// maxViewStarts bounds a copy's rows on decode (one per view change of the
// group: a copy of more would be a corrupt one).
const maxViewStarts = 1 << 20

// AppendViewCopy appends c's encoding: uvarint Top, uvarint n, then per
// start the uvarint distance from the previous start's op (the first: from
// 0) and the uvarint view. A few bytes per view change of the group.
func AppendViewCopy(b []byte, c ViewCopy) []byte {
	b = binary.AppendUvarint(b, c.Top)
	b = binary.AppendUvarint(b, uint64(len(c.Starts)))
	prev := uint64(0)
	for _, s := range c.Starts {
		b = binary.AppendUvarint(b, s.Op-prev)
		b = binary.AppendUvarint(b, s.View)
		prev = s.Op
	}
	return b
}

// DecodeViewCopy decodes AppendViewCopy's encoding, refusing one whose
// starts are not strictly increasing or reach above Top (ErrInvalidOp).
func DecodeViewCopy(b []byte) (ViewCopy, error) {
	d := Decoder{B: b}
	c := ViewCopy{Top: d.Uvarint()}
	n := d.Uvarint()
	if d.Err != nil || n > maxViewStarts || n > uint64(len(d.B)) {
		return ViewCopy{}, fmt.Errorf("%w: a view copy of %d rows in %d bytes", ErrInvalidOp, n, len(b))
	}
	c.Starts = make([]ViewStart, 0, n)
	prev := uint64(0)
	for i := range n {
		delta, view := d.Uvarint(), d.Uvarint()
		op := prev + delta
		if d.Err != nil || (i > 0 && delta == 0) || op < prev || op > c.Top {
			return ViewCopy{}, fmt.Errorf("%w: a view copy's row %d", ErrInvalidOp, i)
		}
		c.Starts = append(c.Starts, ViewStart{Op: op, View: view})
		prev = op
	}
	if len(d.B) != 0 {
		return ViewCopy{}, fmt.Errorf("%w: a view copy with %d bytes after its rows", ErrInvalidOp, len(d.B))
	}
	return c, nil
}

// MergeViewCopy returns the copy of one group's history to keep of two:
// both are prefixes of it, so the one that reaches further (a tie keeps
// old).
func MergeViewCopy(old, c ViewCopy) ViewCopy {
	if c.Top > old.Top {
		return c
	}
	return old
}

// View returns the view op v was ordered in if c covers it.
func (c ViewCopy) View(v uint64) (uint64, bool) {
	if v == 0 || v > c.Top {
		return 0, false
	}
	return ViewAt(c.Starts, v)
}

// ViewAt returns the view op v was ordered in by history h (sorted by Op:
// each start holds from its op up to the next start); ok false if h does
// not reach back to v. The one search of a view history: a group's own
// (vrshard) and a copy of another's.
func ViewAt(h []ViewStart, v uint64) (view uint64, ok bool) {
	i, found := slices.BinarySearchFunc(h, v, func(s ViewStart, v uint64) int {
		switch {
		case s.Op < v:
			return -1
		case s.Op > v:
			return 1
		}
		return 0
	})
	if !found {
		if i == 0 {
			return 0, false // older than the history
		}
		i--
	}
	return h[i].View, true
}

// slotViewsMark is the meta of an import entry that carries a view copy
// (key SlotViewsKey, payload AppendViewCopy's). Its key is reserved: a
// build that does not know the entry refuses the whole import op at its
// key check (ErrReservedKey) before it writes anything, so a group whose
// replicas run mixed builds keeps the same user state and slot table on
// all of them — only the new builds hold the copy, which only they read.
// The mover sends the copies in an op of their own for that reason.
var slotViewsMark = []byte{0xfd}

// AppendSlotViews appends to an import's Keys group's view copy c.
func AppendSlotViews(keys [][]byte, group uint32, c ViewCopy) [][]byte {
	return append(keys, SlotViewsKey(group), slotViewsMark, AppendViewCopy(nil, c))
}

// applySlotViews writes an import's view copy, merged with the copy of the
// group the importing group already holds.
func applySlotViews(get Getter, key, payload []byte, emit Emit) error {
	c, err := DecodeViewCopy(payload)
	if err != nil {
		return err
	}
	old, _, _, ok, err := get(key)
	if err != nil {
		return err
	}
	if ok {
		if oc, derr := DecodeViewCopy(old); derr == nil && MergeViewCopy(oc, c).Top == oc.Top {
			return nil // the copy held reaches as far
		}
	}
	put(emit, key, payload, nil)
	return nil
}
