package vrshard

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/shard"
)

// A write travels through the VR log as vr.Request.Data:
//
//	format byte (1) | proposer uvarint | local seq uvarint | timestamp varint |
//	kind byte | flags byte | delta varint | key | value | expected | nkeys uvarint | keys...
//
// (byte strings are uvarint length + bytes). The proposer and local seq let the
// replica that proposed a write without a client id (plain Redis clients: the
// core's client table does not answer those) find its waiter when the entry is
// applied; the timestamp is the proposer's wall clock, carried in the entry so
// that every replica stores the same record timestamps.

const dataFormat = 1

// ErrCorruptEntry: an entry's Data or a cached result does not decode. It
// means a bug or a corrupted log that passed its checksum; the replica stops.
var ErrCorruptEntry = errors.New("vrshard: undecodable log entry")

type header struct {
	proposer uint64
	seq      uint64
	ts       int64
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeOp appends the encoding of a write to b.
func encodeOp(b []byte, h header, op *shard.Op) []byte {
	b = append(b, dataFormat)
	b = binary.AppendUvarint(b, h.proposer)
	b = binary.AppendUvarint(b, h.seq)
	b = binary.AppendVarint(b, h.ts)
	flags := byte(op.Cond) & 3
	if op.ReturnOld {
		flags |= 4
	}
	b = append(b, byte(op.Kind), flags)
	b = binary.AppendVarint(b, op.Delta)
	b = appendBytes(b, op.Key)
	b = appendBytes(b, op.Value)
	b = appendBytes(b, op.Expected)
	b = binary.AppendUvarint(b, uint64(len(op.Keys)))
	for _, k := range op.Keys {
		b = appendBytes(b, k)
	}
	return b
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = ErrCorruptEntry
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = ErrCorruptEntry
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = ErrCorruptEntry
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// bytes returns a slice aliasing the input (entries are immutable).
func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.err = ErrCorruptEntry
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

// forgetFormat marks the leader's internal entry that forgets client-table
// rows (docs/design/client-table.md):
//
//	format byte (2) | timestamp varint | below uvarint
//
// Applying it deletes every row whose version is below `below`. A binary
// without it stops on the entry (ErrCorruptEntry).
const forgetFormat = 2

func encodeForget(ts int64, below uint64) []byte {
	b := []byte{forgetFormat}
	b = binary.AppendVarint(b, ts)
	return binary.AppendUvarint(b, below)
}

// decodeForget decodes a forgetFormat entry; ok is false for any other.
func decodeForget(data []byte) (ts int64, below uint64, ok bool, err error) {
	if len(data) == 0 || data[0] != forgetFormat {
		return 0, 0, false, nil
	}
	r := reader{b: data[1:]}
	ts, below = r.varint(), r.uvarint()
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrCorruptEntry, len(r.b))
	}
	return ts, below, true, r.err
}

// decodeOp decodes Data. The op's slices alias data.
func decodeOp(data []byte) (header, shard.Op, error) {
	r := reader{b: data}
	if r.byte() != dataFormat {
		return header{}, shard.Op{}, fmt.Errorf("%w: unknown format", ErrCorruptEntry)
	}
	var h header
	var op shard.Op
	h.proposer, h.seq, h.ts = r.uvarint(), r.uvarint(), r.varint()
	op.Kind = shard.Kind(r.byte())
	flags := r.byte()
	op.Cond, op.ReturnOld = shard.Cond(flags&3), flags&4 != 0
	op.Delta = r.varint()
	op.Key, op.Value, op.Expected = r.bytes(), r.bytes(), r.bytes()
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.err = ErrCorruptEntry
	}
	if r.err == nil && n > 0 {
		op.Keys = make([][]byte, n)
		for i := range op.Keys {
			op.Keys[i] = r.bytes()
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrCorruptEntry, len(r.b))
	}
	if r.err != nil {
		return header{}, shard.Op{}, r.err
	}
	if !op.Kind.IsUpdate() || op.Kind > shard.KindCAS {
		return header{}, shard.Op{}, fmt.Errorf("%w: %v is not a write", ErrCorruptEntry, op.Kind)
	}
	return h, op, nil
}

// An operation's outcome is part of the replicated state (the client table
// caches it), so errors a write can deterministically produce are encoded as
// codes, not as text that could differ between builds.
var resultErrs = []error{nil, shard.ErrWrongType, shard.ErrOverflow, shard.ErrReservedKey, shard.ErrInvalidOp}

// encodeResult appends the encoding of a write's outcome: kind byte | int varint |
// version uvarint | error code byte | error text | bulk (the rest).
func encodeResult(b []byte, res shard.Result, err error) []byte {
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
	b = appendBytes(b, []byte(msg))
	return append(b, res.Bulk...)
}

// resultError is an operation error decoded from the client table.
type resultError struct {
	sentinel error
	msg      string
}

func (e *resultError) Error() string { return e.msg }
func (e *resultError) Unwrap() error { return e.sentinel }

func decodeResult(b []byte) (shard.Result, error, error) {
	r := reader{b: b}
	var res shard.Result
	res.Kind = shard.ResultKind(r.byte())
	res.Int = r.varint()
	res.Version = r.uvarint()
	code := r.byte()
	msg := r.bytes()
	if r.err != nil {
		return shard.Result{}, nil, r.err
	}
	if res.Kind == shard.ResBulk {
		res.Bulk = append([]byte{}, r.b...)
	}
	if code == 0 {
		return res, nil, nil
	}
	var sentinel error
	if int(code) < len(resultErrs) {
		sentinel = resultErrs[code]
	}
	return shard.Result{}, &resultError{sentinel: sentinel, msg: string(msg)}, nil
}
