package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Fine-grained (bit-range) conflicts of interactive transactions (issue 29,
// "Fine-grained conflicts"; docs/design/transactions.md, "Fine-grained
// conflicts"; Isotope's mark_accessed, digest 001 §3).
//
// A check may carry Ranges: the bits of the key the transaction accessed
// (SETRANGE, SETBIT, GETRANGE, GETBIT, KEFIR.TX ACCESS). Its key's version
// having moved in the window is then not by itself a conflict: validation
// walks the key's access record — the ranges each recent write of the key
// touched — back from the key's version to the version the transaction saw,
// and aborts only if one of those writes overlaps the ranges, or if a link
// is missing.
//
// The access record is a reserved row of the key (accessRowKey), written by
// a commit in the same batch as the key's record (before it: the engine
// keeps a prefix of a batch across a crash, so a surviving key record has
// its row), at the op's version. Each entry is (version, prev, ranges): the
// commit at version wrote the key's record over the record of version prev
// (0: absent), touching only ranges. Only a commit whose every write of the
// key is ranged writes an entry. Any other write of the key — SET, DEL,
// INCRBY, an expiry, a SETRANGE outside a transaction, a transaction's SET —
// writes none, so the chain from the key's version breaks at it: a whole-key
// write conflicts with every range, the key-grain decision. The row keeps
// the new entry and the chain it continues, at most txAccessKeep entries:
// older ones are dropped, and a transaction whose start is further back than
// the chain reaches falls back to the key-grain decision (abort). All of it
// is state at op−1, so every replica, a crash replay and a replica restored
// from a snapshot decide alike.

// TxRange is the bits [Lo, Hi) of a value.
type TxRange struct{ Lo, Hi uint64 }

// TxLength is the pseudo-range of a value's length, far past any bit: a
// write that grows the value touches it, and so does a read of the length
// (SETRANGE's reply, the new length).
var TxLength = TxRange{Lo: 1 << 62, Hi: 1<<62 + 1}

// txAccessKeep bounds a key's access record (entries, newest first).
const txAccessKeep = 32

// txRangedMark starts a KindTxCommit's Value whose checks carry ranges: a
// count of 0 followed by more bytes, which the format without ranges never
// has (0 checks, nothing after).
var txRangedMark = []byte{0, 'R'}

func txIsRanged(op *Op) bool { return bytes.HasPrefix(op.Value, txRangedMark) }

// accessRows is the reserved prefix of the access records.
var accessRows = ReservedKey("ar/")

func accessRowKey(key []byte) []byte { return append(append([]byte(nil), accessRows...), key...) }

// IsAccessRow reports whether key is a transaction access record (a flush
// deletes them with the user keys).
func IsAccessRow(key []byte) bool { return bytes.HasPrefix(key, accessRows) }

// txAccess is one entry of an access record.
type txAccess struct {
	Version, Prev uint64
	Ranges        []TxRange
}

func encodeAccess(es []txAccess) []byte {
	b := binary.AppendUvarint(nil, uint64(len(es)))
	for _, e := range es {
		b = binary.AppendUvarint(b, e.Version)
		b = binary.AppendUvarint(b, e.Prev)
		b = appendRanges(b, e.Ranges)
	}
	return b
}

// decodeAccess reads an access record; a corrupt one reads as empty (every
// replica holds the same bytes, so the key-grain fallback is the same).
func decodeAccess(b []byte) []txAccess {
	d := Decoder{B: b}
	n := d.Uvarint()
	if n > uint64(len(b)) {
		return nil
	}
	// One backing array for every entry's ranges: a record is read at
	// every ranged commit of its key.
	es := make([]txAccess, 0, n)
	ends := make([]int, 0, n)
	var all []TxRange
	for i := uint64(0); i < n && d.Err == nil; i++ {
		es = append(es, txAccess{Version: d.Uvarint(), Prev: d.Uvarint()})
		m := d.Uvarint()
		if m > uint64(len(d.B)) {
			return nil
		}
		for j := uint64(0); j < m && d.Err == nil; j++ {
			all = append(all, TxRange{Lo: d.Uvarint(), Hi: d.Uvarint()})
		}
		ends = append(ends, len(all))
	}
	if d.Err != nil {
		return nil
	}
	lo := 0
	for i := range es {
		es[i].Ranges = all[lo:ends[i]:ends[i]]
		lo = ends[i]
	}
	return es
}

func appendRanges(b []byte, rs []TxRange) []byte {
	b = binary.AppendUvarint(b, uint64(len(rs)))
	for _, r := range rs {
		b = binary.AppendUvarint(b, r.Lo)
		b = binary.AppendUvarint(b, r.Hi)
	}
	return b
}

func decodeRanges(d *Decoder) []TxRange {
	n := d.Uvarint()
	if n > uint64(len(d.B)) {
		d.Err = fmt.Errorf("%w: %d ranges in %d bytes", ErrInvalidOp, n, len(d.B))
		return nil
	}
	rs := make([]TxRange, 0, n)
	for i := uint64(0); i < n && d.Err == nil; i++ {
		rs = append(rs, TxRange{Lo: d.Uvarint(), Hi: d.Uvarint()})
	}
	return rs
}

func overlaps(a, b []TxRange) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Lo < y.Hi && y.Lo < x.Hi {
				return true
			}
		}
	}
	return false
}

// rangedCheck validates a check with ranges whose key has version found
// (0: absent), not the one the transaction saw: nil if the access record
// links found back to the check's version through writes none of which
// overlaps the check's ranges.
func rangedCheck(get Getter, c TxCheck, found uint64) (bool, error) {
	row, _, _, ok, err := get(accessRowKey(c.Key))
	if err != nil || !ok {
		return false, err
	}
	es := decodeAccess(row)
	v := found
	for v != c.Version {
		e := findAccess(es, v)
		if e == nil || e.Prev >= e.Version || overlaps(e.Ranges, c.Ranges) {
			return false, nil
		}
		v = e.Prev
	}
	return true, nil
}

func findAccess(es []txAccess, v uint64) *txAccess {
	for i := range es {
		if es[i].Version == v {
			return &es[i]
		}
	}
	return nil
}

// txKeyAccess is what a commit's writes did to one key: ranged (every write
// of it a SETRANGE or SETBIT) and the bits they touched.
type txKeyAccess struct {
	key    []byte
	whole  bool
	ranges []TxRange
}

// writeRanges is the bits a ranged write touched, given the value's length
// in bytes before and after it: what it wrote, and the bytes it added (a
// length a GETRANGE past the end saw is changed there).
func writeRanges(w *Op, before, after int) []TxRange {
	var rs []TxRange
	switch w.Kind {
	case KindSetRange:
		if len(w.Value) > 0 {
			rs = append(rs, TxRange{uint64(w.Delta) * 8, (uint64(w.Delta) + uint64(len(w.Value))) * 8})
		}
	case KindSetBit:
		rs = append(rs, TxRange{uint64(w.Delta), uint64(w.Delta) + 1})
	case KindBitField:
		if ops, err := DecodeBitField(w.Value); err == nil {
			_, rs = BitFieldRanges(ops)
		}
	}
	if after > before {
		rs = append(rs, TxRange{uint64(before) * 8, uint64(after) * 8}, TxLength)
	}
	return rs
}

// emitAccessRows writes the access record of every key the commit at
// version wrote with ranged writes only (see the top of this file).
func emitAccessRows(get Getter, version uint64, acc []txKeyAccess, emit Emit) error {
	for _, a := range acc {
		if a.whole || len(a.ranges) == 0 {
			continue
		}
		rk := accessRowKey(a.key)
		row, _, _, ok, err := get(rk)
		if err != nil {
			return err
		}
		var es []txAccess
		if ok {
			es = decodeAccess(row)
		}
		if e := findAccess(es, version); e != nil {
			// A crash replay of this op: its row survived (it is emitted
			// before the key's record); it is rewritten as it was.
			put(emit, rk, row, nil)
			continue
		}
		_, _, prev, exists, err := get(a.key)
		if err != nil {
			return err
		}
		if !exists {
			prev = 0
		}
		out := []txAccess{{Version: version, Prev: prev, Ranges: a.ranges}}
		for v := prev; v != 0 && len(out) < txAccessKeep; {
			e := findAccess(es, v)
			if e == nil || e.Prev >= e.Version {
				break
			}
			out = append(out, *e)
			v = e.Prev
		}
		put(emit, rk, encodeAccess(out), nil)
	}
	return nil
}
