package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/vfs"
)

// Zero-filled segments (docs/design/zero-filled-logs.md, "Built for the storage log"):
// the active segment is a file of zero bytes, written and synced before it was needed,
// and records are written in place at the log's logical end. The file does not grow, so
// an fdatasync has no file size or extent to commit (on this machine's disk about 83 us
// p50 against 184 us for an append). A filler prepares the next segment's file (zeroName
// in the next device's directory) once the active segment's zeros are a quarter used; a
// roll renames it into place. If none is ready the roll creates an empty, preallocated
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

// fillMode says when the next segment's file is zero-filled.
type fillMode int

const (
	// fillAsync: on a goroutine (the default).
	fillAsync fillMode = iota
	// fillInline: on the goroutine that asks, under the engine's lock (Options.Inline:
	// the order of file operations is deterministic).
	fillInline
	// fillManual: only the first segment of a new engine, and when a test calls
	// fillNow (tests: a roll that finds no file ready).
	fillManual
	// fillOff: never; every segment is appended to.
	fillOff
)

// mutations are deliberate bugs the tests switch on to show they catch them.
type mutations struct {
	// skipZeroTail: recovery leaves the bytes after the log's end as they are, so a
	// stale record can be resurrected by a later record that ends where it begins.
	skipZeroTail bool
	// ignoreSynced: recovery takes the first bad record of the last segment as the end
	// even when a valid record after it says the log was durable past it.
	ignoreSynced bool
	// fill overrides the fill mode (0: from Options.Inline).
	fill fillMode
	// setFill: fill is set.
	setFill bool
}

// zeroName is the filler's file in a device directory; a roll renames it to the new
// segment's name. Recovery removes it (".tmp"): it may be incomplete or unsynced.
const zeroName = "zero-segment.tmp"

// filler makes the next segment's zero-filled file.
type filler struct {
	fs   vfs.FS
	mode fillMode

	mu      sync.Mutex
	ready   bool        // path is complete: zero-filled and synced
	path    string      // the file being filled or ready
	busy    bool        // a fill is running
	stopped atomic.Bool // set under mu (claim checks it there); read without it by fills
	wg      sync.WaitGroup

	// afterClaim, if set, runs after an async claim, before its goroutine starts
	// (tests: close racing a request).
	afterClaim func()
}

// request asks for a zero-filled file of size bytes in dir (the next segment's
// device), unless one is ready there or being filled. A ready file in another
// directory is dropped.
func (f *filler) request(dir string, size int64) {
	if f.mode != fillAsync && f.mode != fillInline {
		return
	}
	if !f.claim(dir, f.mode == fillAsync) {
		return
	}
	if f.mode == fillInline {
		f.run(size)
		return
	}
	if f.afterClaim != nil {
		f.afterClaim()
	}
	go func() {
		defer f.wg.Done()
		f.run(size)
	}()
}

// fillNow fills a file of size bytes in dir on the caller's goroutine, whatever the
// mode (except fillOff), unless one is ready there or being filled.
func (f *filler) fillNow(dir string, size int64) {
	if f.mode != fillOff && f.claim(dir, false) {
		f.run(size)
	}
}

// readyIn reports whether a zero-filled file is ready in dir.
func (f *filler) readyIn(dir string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready && f.path == vfs.Join(dir, zeroName)
}

// claim marks a fill of dir's file as running and reports true, unless the filler is
// stopped, or a file is being filled or is ready in dir. With async it also counts the
// goroutine the caller is about to start in wg, under the same lock as the stopped
// check: close sets stopped under that lock too, so either close sees the goroutine
// counted and waits for it, or the claim sees stopped. (Checking stopped before the lock
// and counting after it let close return, and a new engine open the directory, before a
// fill began: that fill's file then appeared, and its failed fill removed it by name,
// under the new engine.)
func (f *filler) claim(dir string, async bool) bool {
	path := vfs.Join(dir, zeroName)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped.Load() || f.busy || (f.ready && f.path == path) {
		return false
	}
	if f.ready {
		_ = f.fs.Remove(f.path) // for another device: the chain moved on
		f.ready = false
	}
	f.busy, f.path = true, path
	if async {
		f.wg.Add(1)
	}
	return true
}

func (f *filler) run(size int64) {
	f.mu.Lock()
	path := f.path
	f.mu.Unlock()
	err := f.zeroFill(path, size)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.busy = false
	if err != nil {
		_ = f.fs.Remove(path)
		return
	}
	f.ready = true
}

func (f *filler) zeroFill(path string, size int64) error {
	if f.stopped.Load() {
		return vfs.ErrStopped // close came first: create nothing
	}
	file, err := f.fs.Create(path)
	if err != nil {
		return err
	}
	defer file.Close()
	if _, ok := file.(vfs.WriterAt); !ok {
		return errors.New("storage: no positional writes on this file system")
	}
	// The file's name needs no directory sync here: the roll that takes it renames it
	// and syncs the directory, and recovery deletes it if that never happened.
	return vfs.ZeroFill(file, size, f.stopped.Load)
}

// take returns the path of the ready zero-filled file in dir, or "" if none is ready
// there.
func (f *filler) take(dir string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ready || f.path != vfs.Join(dir, zeroName) {
		return ""
	}
	f.ready = false
	return f.path
}

// idle reports whether no fill is running (tests).
func (f *filler) idle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.busy
}

// close stops the filler and waits for its goroutine: no fill runs once it returns.
func (f *filler) close() {
	f.mu.Lock()
	f.stopped.Store(true)
	f.mu.Unlock()
	f.wg.Wait()
}

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
	if string(b[:8]) != formatMagic || crc32.Checksum(b[:20], crcTable) != binary.LittleEndian.Uint32(b[20:]) {
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
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], crcTable))
	if err := db.writeDurably(dir, final, b[:]); err != nil {
		return fmt.Errorf("storage: format mark %s: %w", final, err)
	}
	db.fmtFrom = from
	return nil
}

// validAfterEnd looks for a format 2 record after the end of the last segment (data
// holds the segment from file offset base; the end is at data[end:]) that says the log
// was durable past the end, and returns its offset in data, or -1. Valid records with a
// lower mark are stale: written, never synced, landed while an earlier page did not.
func validAfterEnd(data []byte, end int, segID, base uint64) int {
	endPos := segID + base + uint64(end)
	for i := end + 1; i+hdrSize <= len(data); {
		if binary.LittleEndian.Uint64(data[i+4:]) == 0 {
			// No record starts at i..i+4: its key length would be zero.
			i += 5
			continue
		}
		at := segID + base + uint64(i)
		if h, _, _, ok := decodeRecord(data[i:], at); ok && h.v2() && h.synced > endPos {
			return i
		}
		i++
	}
	return -1
}
