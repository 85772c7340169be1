package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Zero-filled segments (docs/design/zero-filled-logs.md, "Built for the storage log"):
// the active segment is a file of zero bytes, written and synced before it was needed,
// and records are written in place at the log's logical end. The file does not grow, so
// an fdatasync has no file size or extent to commit (on this machine's disk about 83 us
// p50 against 184 us for an append). A filler (seglog.Filler) prepares the next
// segment's file (zeroName in the next device's directory) once the active segment's
// zeros are a quarter used; a roll renames it into place. If none is ready the roll creates an empty, preallocated
// segment and appends to it, as before zero-filled segments.
//
// Sizes: a new engine's first segment is minZeroSize (a fresh engine reserves and writes
// 4 MiB, not 64, and tests on vfs.Mem hold no 64 MiB of zeros per engine); each next one
// twice the one before, up to SegmentSize. A segment smaller than SegmentSize ends where
// its zeros end once the next file is ready (it appends past them meanwhile), so an
// engine reaches full-size segments after five rolls (4, 8, 16, 32, 64 MiB).
//
// A sealed segment is truncated to its logical end before it is synced, so every rule
// about sealed segments (ids are positions, a.end() == b.id, compaction, hint files,
// readers by offset) sees exactly what an appended segment looked like.

// minZeroSize is the zero-filled size of a new engine's first segment.
const minZeroSize = 4 << 20

// mutations are deliberate bugs the tests switch on to show they catch them;
// the bugs are read only under mutation.On (internal/mutation), so the default
// build compiles them away. fill/setFill is a test's choice of a real fill mode.
type mutations struct {
	// skipZeroTail: recovery leaves the bytes after the log's end as they are, so a
	// stale record can be resurrected by a later record that ends where it begins.
	skipZeroTail bool
	// ignoreSynced: recovery takes the first bad record of the last segment as the end
	// even when a valid record after it says the log was durable past it.
	ignoreSynced bool
	// noBatchCont: Append marks no batch (flagBatchCont), as builds before it
	// did: a crash keeps a prefix of a multi-record batch.
	noBatchCont bool
	// fill overrides the fill mode (0: from Options.Inline).
	fill seglog.FillMode
	// setFill: fill is set.
	setFill bool
}

// zeroName is the filler's file in a device directory; a roll renames it to the new
// segment's name. Recovery removes it (seglog.TmpSuffix): it may be incomplete or
// unsynced.
const zeroName = "zero-segment" + seglog.TmpSuffix

// The format mark. A directory written by this code holds formatMarkName in the first
// device's directory: "KFLOGFMT" | version u32 (2) | from u64 | crc32c u32, where from
// is the log position at which format 2 records begin (0 for an engine created with
// format 2; the end of the log when an older directory was upgraded, everything before
// it then durable). Without it the directory is format 1 throughout.
//
// Its name is a gap file's name beyond every position: the code before format 2 sees a
// log that ends with a gap and refuses to open (a CorruptionError), instead of cutting
// the format 2 records of its last segment off as a torn tail.
const (
	formatMarkName  = "ffffffffffffffff.gap"
	formatMagic     = "KFLOGFMT"
	formatVersion   = 2
	formatMarkBytes = 8 + 4 + 8 + 4
)

// readFormatMark returns the position where format 2 begins.
func (db *DB) readFormatMark(path string) (uint64, error) {
	f, err := db.fs.Open(path)
	if err != nil {
		return 0, fmt.Errorf("storage: open %s: %w", path, err)
	}
	defer f.Close()
	var b [formatMarkBytes]byte
	if _, err := f.ReadAt(b[:], 0); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("storage: read %s: %w", path, err)
	}
	if string(b[:8]) != formatMagic || crc32.Checksum(b[:20], seglog.CRCTable) != binary.LittleEndian.Uint32(b[20:]) {
		return 0, &CorruptionError{File: path, Reason: "format mark damaged"}
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != formatVersion {
		return 0, &CorruptionError{File: path, Reason: fmt.Sprintf("log format %d, this code reads formats 1 and 2", v)}
	}
	return binary.LittleEndian.Uint64(b[12:]), nil
}

// writeFormatMark durably records that format 2 begins at position from.
func (db *DB) writeFormatMark(from uint64) error {
	dir := db.devs[0].dir
	final := vfs.Join(dir, formatMarkName)
	var b [formatMarkBytes]byte
	copy(b[:], formatMagic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	binary.LittleEndian.PutUint64(b[12:], from)
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], seglog.CRCTable))
	if err := db.writeDurably(dir, final, b[:]); err != nil {
		return fmt.Errorf("storage: format mark %s: %w", final, err)
	}
	db.fmtFrom = from
	return nil
}

// validAfterEnd looks for a format 2 record after the end of the last segment (data
// holds the segment from file offset base; the end is at data[end:]) that says the log
// was durable past the end, and returns its offset in data, or -1 (seglog.ScanPastEnd).
// A record's key length (at offset 4) is never zero.
func validAfterEnd(data []byte, end int, segID, base uint64) int {
	endPos := segID + base + uint64(end)
	return seglog.ScanPastEnd(data, end, hdrSize, 4, func(i int) bool {
		h, _, _, ok := decodeRecord(data[i:], segID+base+uint64(i))
		return ok && h.v2() && h.synced > endPos
	})
}
