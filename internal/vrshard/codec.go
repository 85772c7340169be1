package vrshard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
)

// A write travels through the VR log as vr.Request.Data:
//
//	format byte (3) | proposer uvarint | local seq uvarint | timestamp varint |
//	op (kv.AppendOp: kind byte | flags byte | delta varint | key | value | expected | nkeys uvarint | keys...
//	    [| now | expire-at | ttl flags])
//
// Format 3 (key expiry) ops may carry kv's expiry trailer (the proposer's Now
// is in every write it proposes); format 1 entries, written before, never do
// and still decode. (2 is forgetFormat, the client-table entry.) A build that
// knows only format 1 refuses format 3 entries as corrupt: every member of a
// group must run a build that knows format 3 before one of them proposes
// (docs/operations.md).
//
// (byte strings are uvarint length + bytes). The proposer and local seq let the
// replica that proposed a write without a client id (plain Redis clients: the
// core's client table does not answer those) find its waiter when the entry is
// applied; the timestamp is the proposer's wall clock, carried in the entry so
// that every replica stores the same record timestamps.

const (
	dataFormat   = 3 // not 2: that is forgetFormat
	dataFormatV1 = 1 // before key expiry: no op carries an expiry trailer
)

// ErrCorruptEntry: an entry's Data or a cached result does not decode. It
// means a bug or a corrupted log that passed its checksum; the replica stops.
var ErrCorruptEntry = errors.New("vrshard: undecodable log entry")

type header struct {
	proposer uint64
	seq      uint64
	ts       int64
}

func appendBytes(b, s []byte) []byte { return kv.AppendBytes(b, s) }

// encodeOp appends the encoding of a write to b: the header, then the op
// (kv.AppendOp).
func encodeOp(b []byte, h header, op *kv.Op) []byte {
	b = slices.Grow(b, 1+kv.UvarintLen(h.proposer)+kv.UvarintLen(h.seq)+kv.VarintLen(h.ts)+kv.OpLen(op))
	b = append(b, dataFormat)
	b = binary.AppendUvarint(b, h.proposer)
	b = binary.AppendUvarint(b, h.seq)
	b = binary.AppendVarint(b, h.ts)
	return kv.AppendOp(b, op)
}

// reader decodes this package's own formats (entry headers, snapshots, WAL
// and d-log records) with kv's decoder; the first failure sticks in err as
// ErrCorruptEntry, and every later read returns zero.
type reader struct {
	b   []byte
	err error
}

func (r *reader) decoder() kv.Decoder { return kv.Decoder{B: r.b, Err: r.err} }

func (r *reader) update(d *kv.Decoder) {
	r.b = d.B
	if d.Err != nil && r.err == nil {
		r.err = ErrCorruptEntry
	}
}

func (r *reader) uvarint() uint64 {
	d := r.decoder()
	v := d.Uvarint()
	r.update(&d)
	return v
}

func (r *reader) varint() int64 {
	d := r.decoder()
	v := d.Varint()
	r.update(&d)
	return v
}

func (r *reader) byte() byte {
	d := r.decoder()
	c := d.Byte()
	r.update(&d)
	return c
}

// bytes returns a slice aliasing the input (entries are immutable).
func (r *reader) bytes() []byte {
	d := r.decoder()
	s := d.Bytes()
	r.update(&d)
	return s
}

// ids reads a count and that many ids (appendIDs); a count beyond the
// bytes left is corruption, not an allocation.
func (r *reader) ids() []uint64 {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		if r.err == nil {
			r.err = ErrCorruptEntry
		}
		return nil
	}
	ids := make([]uint64, 0, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		ids = append(ids, r.uvarint())
	}
	return ids
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
func decodeOp(data []byte) (header, kv.Op, error) {
	d := kv.Decoder{B: data}
	if f := d.Byte(); f != dataFormat && f != dataFormatV1 {
		return header{}, kv.Op{}, fmt.Errorf("%w: unknown format %d", ErrCorruptEntry, f)
	}
	var h header
	h.proposer, h.seq, h.ts = d.Uvarint(), d.Uvarint(), d.Varint()
	if d.Err != nil {
		return header{}, kv.Op{}, fmt.Errorf("%w: header: %w", ErrCorruptEntry, d.Err)
	}
	op, err := kv.DecodeOp(d.B)
	if err != nil {
		return header{}, kv.Op{}, fmt.Errorf("%w: %w", ErrCorruptEntry, err)
	}
	if !op.Kind.IsUpdate() {
		return header{}, kv.Op{}, fmt.Errorf("%w: %v is not a write", ErrCorruptEntry, op.Kind)
	}
	return h, op, nil
}

// The results the client table caches are encoded by kv.AppendResult.

// decodeResult is kv.DecodeResult with this package's error for bytes that
// do not decode.
func decodeResult(b []byte) (kv.Result, error, error) {
	res, opErr, err := kv.DecodeResult(b)
	if err != nil {
		return kv.Result{}, nil, fmt.Errorf("%w: %w", ErrCorruptEntry, err)
	}
	return res, opErr, nil
}
