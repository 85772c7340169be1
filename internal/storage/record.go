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
//	28 flags   u8    flagTombstone | flagCopy | flagPositioned
//	29 floor   u64   for compaction copies: the key's newest version when it was copied
//	37 pos     u64   the record's own position in the logical log
//	45 synced  u64   a position below which the log was durable when the record was made
//	53 key, value
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
	flagsKnown     = flagTombstone | flagCopy | flagPositioned

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
}

// v2 reports whether the record is format 2 (carries its position and a synced mark).
func (h recHdr) v2() bool { return h.flags&flagPositioned != 0 }

// recordSize is the size of a (format 2) record.
func recordSize(keyLen, valLen int) int { return hdrSize + keyLen + valLen }

// appendRecord encodes r at the end of dst as a format 2 record at log position pos,
// carrying the durable mark synced (<= pos).
func appendRecord(dst []byte, r *Record, flags uint8, floor, pos, synced uint64) []byte {
	n := recordSize(len(r.Key), len(r.Value))
	start := len(dst)
	dst = grow(dst, n)
	b := dst[start : start+n]
	putHeader(b, r, flags|flagPositioned, floor)
	binary.LittleEndian.PutUint64(b[37:], pos)
	binary.LittleEndian.PutUint64(b[45:], synced)
	copy(b[hdrSize:], r.Key)
	copy(b[hdrSize+len(r.Key):], r.Value)
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
	if h.flags&flagTombstone != 0 && h.valLen != 0 {
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

func (h recHdr) size() int { return h.hdr + int(h.keyLen) + int(h.valLen) }

// decodeRecord decodes the record at the start of b, which lies at log position at. It
// returns the header, the record's size and ok=false if b does not start with a complete
// record whose checksum matches or, for format 2, whose claimed position is not at.
// key and value alias b.
func decodeRecord(b []byte, at uint64) (h recHdr, key, val []byte, ok bool) {
	h, ok = parseHeader(b)
	if !ok || (h.v2() && h.pos != at) {
		return h, nil, nil, false
	}
	n := h.size()
	if len(b) < n {
		return h, nil, nil, false
	}
	if binary.LittleEndian.Uint32(b[0:]) != crc32.Checksum(b[4:n], seglog.CRCTable) {
		return h, nil, nil, false
	}
	key = b[h.hdr : h.hdr+int(h.keyLen)]
	val = b[h.hdr+int(h.keyLen) : n]
	return h, key, val, true
}
