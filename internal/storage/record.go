package storage

import (
	"encoding/binary"
	"hash/crc32"
)

// On-disk record layout (little endian):
//
//	0  crc32c  u32   over bytes [4, end)
//	4  keyLen  u32
//	8  valLen  u32
//	12 version u64
//	20 ts      i64
//	28 flags   u8    flagTombstone | flagCopy
//	29 floor   u64   for compaction copies: the key's newest version when it was copied
//	37 key, value
//
// The floor lets recovery tell a retained old version (its key still has a version >=
// floor) from a version of a key whose tombstone compaction has since dropped (nothing
// >= floor survives, so the copy must not resurrect the key).
const (
	hdrSize       = 37
	flagTombstone = 1 << 0
	flagCopy      = 1 << 1
	flagsKnown    = flagTombstone | flagCopy

	// Hard framing limits used when decoding, independent of the configured limits so
	// that lowering MaxValueSize never makes an existing log unreadable.
	maxKeyLenHard = 1 << 24
	maxValLenHard = 1 << 30
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

type recHdr struct {
	keyLen, valLen uint32
	version        uint64
	ts             int64
	flags          uint8
	floor          uint64
}

func recordSize(keyLen, valLen int) int { return hdrSize + keyLen + valLen }

// appendRecord encodes r at the end of dst.
func appendRecord(dst []byte, r *Record, flags uint8, floor uint64) []byte {
	n := recordSize(len(r.Key), len(r.Value))
	start := len(dst)
	dst = grow(dst, n)
	b := dst[start : start+n]
	binary.LittleEndian.PutUint32(b[4:], uint32(len(r.Key)))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(r.Value)))
	binary.LittleEndian.PutUint64(b[12:], r.Version)
	binary.LittleEndian.PutUint64(b[20:], uint64(r.Timestamp))
	if r.Tombstone {
		flags |= flagTombstone
	}
	b[28] = flags
	binary.LittleEndian.PutUint64(b[29:], floor)
	copy(b[hdrSize:], r.Key)
	copy(b[hdrSize+len(r.Key):], r.Value)
	binary.LittleEndian.PutUint32(b[0:], crc32.Checksum(b[4:], crcTable))
	return dst
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// parseHeader decodes and sanity-checks a header; it does not check the CRC.
func parseHeader(b []byte) (recHdr, bool) {
	if len(b) < hdrSize {
		return recHdr{}, false
	}
	h := recHdr{
		keyLen:  binary.LittleEndian.Uint32(b[4:]),
		valLen:  binary.LittleEndian.Uint32(b[8:]),
		version: binary.LittleEndian.Uint64(b[12:]),
		ts:      int64(binary.LittleEndian.Uint64(b[20:])),
		flags:   b[28],
		floor:   binary.LittleEndian.Uint64(b[29:]),
	}
	if h.keyLen == 0 || h.keyLen > maxKeyLenHard || h.valLen > maxValLenHard || h.flags&^flagsKnown != 0 {
		return recHdr{}, false
	}
	if h.flags&flagTombstone != 0 && h.valLen != 0 {
		return recHdr{}, false
	}
	return h, true
}

func (h recHdr) size() int { return recordSize(int(h.keyLen), int(h.valLen)) }

// decodeRecord decodes the record at the start of b. It returns the header, the record's
// size and ok=false if b does not start with a complete record whose checksum matches.
// key and value alias b.
func decodeRecord(b []byte) (h recHdr, key, val []byte, ok bool) {
	h, ok = parseHeader(b)
	if !ok {
		return h, nil, nil, false
	}
	n := h.size()
	if len(b) < n {
		return h, nil, nil, false
	}
	if binary.LittleEndian.Uint32(b[0:]) != crc32.Checksum(b[4:n], crcTable) {
		return h, nil, nil, false
	}
	key = b[hdrSize : hdrSize+int(h.keyLen)]
	val = b[hdrSize+int(h.keyLen) : n]
	return h, key, val, true
}
