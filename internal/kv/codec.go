package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// The codec of writes and their outcomes, for whoever stores or ships them:
// a replication log's entries (internal/vrshard prefixes its own header), a
// replicated client table's cached results, the simulator's log.
//
// A write:
//
//	kind byte | flags byte (cond: 2 bits, return-old: 4, expiry: 8) | delta varint |
//	key | value | expected | nkeys uvarint | keys... |
//	[now varint | expire-at varint | ttl flags byte]   (flag 8 only)
//
// The expiry trailer (Op.Now, ExpireAt, TTL) is written only when one of them
// is set, after everything older builds wrote, so an op an older build logged
// decodes unchanged (Now 0: it has no expiry to decide, as nothing had one).
// (byte strings are uvarint length + bytes). A scan's End and Limit are not
// encoded: reads are not logged. The format is on disk (the VR log): a
// change needs a new format byte in the caller's header.

// ErrCorrupt: bytes that do not decode as the codec's format.
var ErrCorrupt = errors.New("kv: undecodable")

// OpLen is the length of op's encoding (AppendOp): a caller sizes its
// buffer once rather than growing it field by field (a 128-byte SET into an
// empty slice took five allocations), and no larger than it needs (a log
// keeps the buffer).
func OpLen(op *Op) int {
	n := 2 + VarintLen(op.Delta) + BytesLen(op.Key) + BytesLen(op.Value) + BytesLen(op.Expected) + UvarintLen(uint64(len(op.Keys)))
	for _, k := range op.Keys {
		n += BytesLen(k)
	}
	if op.Now != 0 || op.ExpireAt != 0 || op.TTL != 0 {
		n += VarintLen(op.Now) + VarintLen(op.ExpireAt) + 1
	}
	return n
}

// UvarintLen is the length of x's encoding by binary.AppendUvarint.
func UvarintLen(x uint64) int { return max(1, (bits.Len64(x)+6)/7) }

// VarintLen is the length of x's encoding by binary.AppendVarint.
func VarintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return UvarintLen(ux)
}

// BytesLen is the length of b's encoding by AppendBytes.
func BytesLen(b []byte) int { return UvarintLen(uint64(len(b))) + len(b) }

// AppendOp appends the encoding of op to b.
func AppendOp(b []byte, op *Op) []byte {
	flags := byte(op.Cond) & 3
	if op.ReturnOld {
		flags |= 4
	}
	trailer := op.Now != 0 || op.ExpireAt != 0 || op.TTL != 0
	if trailer {
		flags |= 8
	}
	b = append(b, byte(op.Kind), flags)
	b = binary.AppendVarint(b, op.Delta)
	b = AppendBytes(b, op.Key)
	b = AppendBytes(b, op.Value)
	b = AppendBytes(b, op.Expected)
	b = binary.AppendUvarint(b, uint64(len(op.Keys)))
	for _, k := range op.Keys {
		b = AppendBytes(b, k)
	}
	if trailer {
		b = binary.AppendVarint(b, op.Now)
		b = binary.AppendVarint(b, op.ExpireAt)
		b = append(b, byte(op.TTL))
	}
	return b
}

// DecodeOp decodes an op AppendOp encoded, all of b. The op's slices alias b.
func DecodeOp(b []byte) (Op, error) {
	d := Decoder{B: b}
	var op Op
	op.Kind = Kind(d.Byte())
	flags := d.Byte()
	op.Cond, op.ReturnOld = Cond(flags&3), flags&4 != 0
	op.Delta = d.Varint()
	op.Key, op.Value, op.Expected = d.Bytes(), d.Bytes(), d.Bytes()
	n := d.Uvarint()
	if n > uint64(len(d.B)) {
		d.Err = ErrCorrupt
	}
	if d.Err == nil && n > 0 {
		op.Keys = make([][]byte, n)
		for i := range op.Keys {
			op.Keys[i] = d.Bytes()
		}
	}
	if flags&8 != 0 {
		op.Now, op.ExpireAt, op.TTL = d.Varint(), d.Varint(), TTLFlag(d.Byte())
	}
	if flags&^15 != 0 && d.Err == nil {
		d.Err = fmt.Errorf("%w: unknown op flags %#x", ErrCorrupt, flags)
	}
	if d.Err == nil && len(d.B) != 0 {
		d.Err = fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.B))
	}
	if d.Err != nil {
		return Op{}, d.Err
	}
	if !op.Kind.known() {
		return Op{}, fmt.Errorf("%w: unknown op kind %d", ErrCorrupt, op.Kind)
	}
	return op, nil
}

// An operation's outcome is part of the replicated state (a client table
// caches it), so errors a write can deterministically produce are encoded as
// codes, not as text that could differ between builds.
// New errors are appended: a code is on disk (client rows, the VR log). Code
// 5 (nil) is retired: it was "unknown, text only" while the list had five
// entries, and a row written then must not decode as a newer sentinel.
var resultErrs = []error{nil, ErrWrongType, ErrOverflow, ErrReservedKey, ErrInvalidOp, nil,
	ErrNoSuchKey, ErrSameObject, ErrNotFloat, ErrNaN, ErrTooBig,
	ErrWrongKind, ErrHashNotInt, ErrHashNotFloat, ErrHashCopy, ErrHashCopyTooBig,
	ErrSlotMoved, ErrSlotTransition, ErrSlotStaleRequest, ErrTxLocked, ErrHashNaN}

// AppendResult appends the encoding of a write's outcome (result, or the op's
// error) to b: kind byte | int varint | version uvarint | error code byte |
// error text | bulk (the rest). Array results (reads) are not encoded.
func AppendResult(b []byte, res Result, err error) []byte {
	code := byte(0)
	msg := ""
	if err != nil {
		code = byte(len(resultErrs)) // unknown: keep the text
		for i, e := range resultErrs[1:] {
			if errors.Is(err, e) {
				code = byte(i + 1)
				break
			}
		}
		msg = err.Error()
	}
	b = append(b, byte(res.Kind))
	b = binary.AppendVarint(b, res.Int)
	b = binary.AppendUvarint(b, res.Version)
	b = append(b, code)
	b = AppendBytes(b, []byte(msg))
	return append(b, res.Bulk...)
}

// resultError is an operation error decoded from its encoding: the original
// text, and the sentinel (errors.Is) its code names.
type resultError struct {
	sentinel error
	msg      string
}

func (e *resultError) Error() string { return e.msg }
func (e *resultError) Unwrap() error { return e.sentinel }

// DecodeResult decodes an outcome AppendResult encoded: the result or the
// op's error (opErr), or err if b does not decode. The Bulk is a copy.
func DecodeResult(b []byte) (res Result, opErr error, err error) {
	d := Decoder{B: b}
	res.Kind = ResultKind(d.Byte())
	res.Int = d.Varint()
	res.Version = d.Uvarint()
	code := d.Byte()
	msg := d.Bytes()
	if d.Err != nil {
		return Result{}, nil, d.Err
	}
	if res.Kind == ResBulk || res.Kind == ResReply {
		res.Bulk = append([]byte{}, d.B...)
	}
	if code == 0 {
		return res, nil, nil
	}
	var sentinel error
	if int(code) < len(resultErrs) {
		sentinel = resultErrs[code]
	}
	return Result{}, &resultError{sentinel: sentinel, msg: string(msg)}, nil
}

// AppendBytes appends s as a byte string: uvarint length, then the bytes.
func AppendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decoder reads the codec's fields from B, consuming it. The first failure
// sticks in Err (ErrCorrupt) and every later read returns zero, so a caller
// checks once after a run of reads.
type Decoder struct {
	B   []byte
	Err error
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() uint64 {
	if d.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.Err = ErrCorrupt
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Varint reads a signed varint.
func (d *Decoder) Varint() int64 {
	if d.Err != nil {
		return 0
	}
	v, n := binary.Varint(d.B)
	if n <= 0 {
		d.Err = ErrCorrupt
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if d.Err != nil || len(d.B) == 0 {
		d.Err = ErrCorrupt
		return 0
	}
	c := d.B[0]
	d.B = d.B[1:]
	return c
}

// Bytes reads a byte string; the slice aliases B (capacity capped, so an
// append to it cannot overwrite what follows).
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	if d.Err != nil || n > uint64(len(d.B)) {
		d.Err = ErrCorrupt
		return nil
	}
	s := d.B[:n:n]
	d.B = d.B[n:]
	return s
}
