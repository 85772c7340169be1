package storage

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/kefirdb/kefir/internal/seglog"
)

// On-disk record layout (little endian), format 2:
//
//	0  crc32c  u32   over bytes [4, end)
//	4  keyLen  u32
//	8  valLen  u32
//	12 version u64
//	20 ts      i64
//	28 flags   u8    flagTombstone | flagCopy | flagPositioned | flagMeta | flagBatchCont
//	29 floor   u64   for compaction copies: the key's newest version when it was copied
//	37 pos     u64   the record's own position in the logical log
//	45 synced  u64   a position below which the log was durable when the record was made
//	53 key, [metaLen u8, meta (flagMeta only)], value
//
// Meta (flagMeta set) is a short opaque byte string the caller owns (internal/kv keeps
// a value's type and expiry there, docs/design/expiry.md). It sits between the key and
// the value so that meta and value are one contiguous payload: the value cache holds
// that payload as is. A record without meta (the common case) has neither the flag nor
// the length byte, so it costs nothing extra; records written before meta existed read
// unchanged.
//
// The floor lets recovery tell a retained old version (its key still has a version >=
// floor) from a version of a key whose tombstone compaction has since dropped (nothing
// >= floor survives, so the copy must not resurrect the key).
//
// pos and synced (format 2, flagPositioned set) exist for zero-filled segments
// (docs/design/zero-filled-logs.md): a record is valid only at the position it claims,
// and a valid record found after the end of the log whose synced mark lies beyond that
// end proves the end is damage below a completed fsync, not a torn tail.
//
// Format 1 (written before zero-filled segments) has no pos and synced: flagPositioned is
// clear and the key follows the floor at offset 37. It is still read (see formatMark).
const (
	hdrSize1       = 37 // format 1 header
	hdrSize        = 53 // format 2 header: every record written today
	flagTombstone  = 1 << 0
	flagCopy       = 1 << 1
	flagPositioned = 1 << 2
	flagMeta       = 1 << 3 // a metaLen byte and meta follow the key (format 2 only)
	// flagBatchCont: more records of the same Append follow this one. Every
	// record of a multi-record Append but its last carries it, so recovery
	// can tell a batch the crash cut short (its last record is missing) and
	// drop it whole. A record without it ends its batch: the records of older
	// builds, which never set it, are batches of one and read unchanged. A
	// build before this flag refuses such a record (unknown flag): downgrading
	// after an upgraded build wrote a multi-record batch is not supported.
	flagBatchCont = 1 << 4
	flagsKnown    = flagTombstone | flagCopy | flagPositioned | flagMeta | flagBatchCont

	// MaxMetaSize bounds Record.Meta (its length is one byte on disk).
	MaxMetaSize = 255

	// Hard framing limits used when decoding, independent of the configured limits so
	// that lowering MaxValueSize never makes an existing log unreadable.
	maxKeyLenHard = 1 << 24
	maxValLenHard = 1 << 30
)

type recHdr struct {
	keyLen, valLen uint32
	version        uint64
	ts             int64
	flags          uint8
	floor          uint64
	pos, synced    uint64 // format 2 only
	hdr            int    // header size: hdrSize1 or hdrSize
	metaLen        int    // flagMeta: meta bytes after the key's metaLen byte
}

// v2 reports whether the record is format 2 (carries its position and a synced mark).
func (h recHdr) v2() bool { return h.flags&flagPositioned != 0 }

// recordSize is the size of a (format 2) record.
func recordSize(keyLen, valLen int) int { return hdrSize + keyLen + valLen }

// recSize is the size of r as a (format 2) record, meta included.
func recSize(r *Record) int {
	n := recordSize(len(r.Key), len(r.Value))
	if len(r.Meta) > 0 {
		n += 1 + len(r.Meta)
	}
	return n
}

// appendRecord encodes r at the end of dst as a format 2 record at log position pos,
// carrying the durable mark synced (<= pos).
func appendRecord(dst []byte, r *Record, flags uint8, floor, pos, synced uint64) []byte {
	n := recSize(r)
	start := len(dst)
	dst = grow(dst, n)
	b := dst[start : start+n]
	if len(r.Meta) > 0 {
		flags |= flagMeta
	}
	putHeader(b, r, flags|flagPositioned, floor)
	binary.LittleEndian.PutUint64(b[37:], pos)
	binary.LittleEndian.PutUint64(b[45:], synced)
	copy(b[hdrSize:], r.Key)
	vo := hdrSize + len(r.Key)
	if len(r.Meta) > 0 {
		b[vo] = byte(len(r.Meta))
		copy(b[vo+1:], r.Meta)
		vo += 1 + len(r.Meta)
	}
	copy(b[vo:], r.Value)
	binary.LittleEndian.PutUint32(b[0:], crc32.Checksum(b[4:], seglog.CRCTable))
	return dst
}

// putHeader writes the fields both formats share (all but the CRC).
func putHeader(b []byte, r *Record, flags uint8, floor uint64) {
	binary.LittleEndian.PutUint32(b[4:], uint32(len(r.Key)))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(r.Value)))
	binary.LittleEndian.PutUint64(b[12:], r.Version)
	binary.LittleEndian.PutUint64(b[20:], uint64(r.Timestamp))
	if r.Tombstone {
		flags |= flagTombstone
	}
	b[28] = flags
	binary.LittleEndian.PutUint64(b[29:], floor)
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// parseHeader decodes and sanity-checks a header of either format; it does not check
// the CRC or the position.
func parseHeader(b []byte) (recHdr, bool) {
	if len(b) < hdrSize1 {
		return recHdr{}, false
	}
	h := recHdr{
		keyLen:  binary.LittleEndian.Uint32(b[4:]),
		valLen:  binary.LittleEndian.Uint32(b[8:]),
		version: binary.LittleEndian.Uint64(b[12:]),
		ts:      int64(binary.LittleEndian.Uint64(b[20:])),
		flags:   b[28],
		floor:   binary.LittleEndian.Uint64(b[29:]),
		hdr:     hdrSize1,
	}
	if h.keyLen == 0 || h.keyLen > maxKeyLenHard || h.valLen > maxValLenHard || h.flags&^flagsKnown != 0 {
		return recHdr{}, false
	}
	if h.flags&flagTombstone != 0 && (h.valLen != 0 || h.flags&flagMeta != 0) {
		return recHdr{}, false
	}
	if h.flags&flagMeta != 0 && !h.v2() {
		return recHdr{}, false
	}
	if h.v2() {
		if len(b) < hdrSize {
			return recHdr{}, false
		}
		h.pos = binary.LittleEndian.Uint64(b[37:])
		h.synced = binary.LittleEndian.Uint64(b[45:])
		h.hdr = hdrSize
		if h.synced > h.pos {
			return recHdr{}, false
		}
	}
	return h, true
}

func (h recHdr) size() int { return h.hdr + int(h.keyLen) + h.metaSize() + int(h.valLen) }

// metaSize is the bytes meta takes in the record: its length byte and itself.
func (h recHdr) metaSize() int {
	if h.flags&flagMeta == 0 {
		return 0
	}
	return 1 + h.metaLen
}

// decodeRecord decodes the record at the start of b, which lies at log position at. It
// returns the header, the record's size and ok=false if b does not start with a complete
// record whose checksum matches or, for format 2, whose claimed position is not at.
// key and value alias b.
func decodeRecord(b []byte, at uint64) (h recHdr, key, val []byte, ok bool) {
	h, ok = parseHeader(b)
	if !ok || (h.v2() && h.pos != at) {
		return h, nil, nil, false
	}
	if h.flags&flagMeta != 0 {
		mo := h.hdr + int(h.keyLen)
		if len(b) <= mo || b[mo] == 0 {
			return h, nil, nil, false
		}
		h.metaLen = int(b[mo])
	}
	n := h.size()
	if len(b) < n {
		return h, nil, nil, false
	}
	if binary.LittleEndian.Uint32(b[0:]) != crc32.Checksum(b[4:n], seglog.CRCTable) {
		return h, nil, nil, false
	}
	key = b[h.hdr : h.hdr+int(h.keyLen)]
	val = b[h.hdr+int(h.keyLen)+h.metaSize() : n]
	return h, key, val, true
}

// payload returns the bytes of the record b (decoded as h) after its key: the value,
// preceded by the meta length byte and meta if the record has meta. The value cache
// holds payloads; splitPayload takes them apart.
func payload(b []byte, h recHdr) []byte {
	return b[h.hdr+int(h.keyLen) : h.size()]
}

// splitPayload splits a payload (see payload) of a record with meta (hasMeta, the
// index's verMeta) into meta and value. Without meta the payload is the value.
func splitPayload(p []byte, hasMeta bool) (meta, val []byte) {
	if !hasMeta || len(p) == 0 {
		return nil, p
	}
	n := 1 + int(p[0])
	if n > len(p) {
		return nil, p // cannot happen for a payload decodeRecord checked
	}
	return p[1:n:n], p[n:]
}
