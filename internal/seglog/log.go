package seglog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/vfs"
)

// CRCTable is the CRC-32C (Castagnoli) table of both logs' record formats.
var CRCTable = crc32.MakeTable(crc32.Castagnoli)

// TmpSuffix ends the name of every file a log never references by name: a segment or
// an index file being written, the filler's zero-filled file. Recovery removes them
// (RemoveLeftover); they become part of the log only through a rename.
const TmpSuffix = ".tmp"

// IsTmp reports whether name is a temporary file recovery removes.
func IsTmp(name string) bool { return strings.HasSuffix(name, TmpSuffix) }

// RemoveLeftover removes a temporary file recovery found. One that is already gone is
// what this wanted: a filler that outlived its log (a crash test's dropped log; before
// the Filler's close fix, a fill started as Close returned) removes its file by name
// when its write fails, and may do so between recovery's listing and this Remove. The
// name is never a segment's, so nothing durable is at stake. Any other failure is
// returned: the file may still be there.
func RemoveLeftover(fsys vfs.FS, path string) error {
	if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove leftover %s: %w", path, err)
	}
	return nil
}

// SyncedFile is an active segment whose Sync records what it made durable: the
// logical end when it started. A log stamps that mark ("synced up to") into every
// record it writes, so recovery can tell damage below a completed fsync from a torn
// tail (ScanPastEnd). Sync may run on another goroutine than the writes.
type SyncedFile struct {
	vfs.File
	end    atomic.Int64 // logical end: bytes written so far
	synced atomic.Int64 // every byte below it is durable
	onSync func(time.Duration)
}

// NewSyncedFile wraps f, whose logical end is end; onSync, if set, is told how long
// each fsync took.
func NewSyncedFile(f vfs.File, end int64, onSync func(time.Duration)) *SyncedFile {
	s := &SyncedFile{File: f, onSync: onSync}
	s.end.Store(end)
	return s
}

// Sync fsyncs the file and raises the durable point to the logical end it saw first.
func (f *SyncedFile) Sync() error {
	end := f.end.Load()
	if err := vfs.SyncTimed(f.File, f.onSync); err != nil {
		return err
	}
	f.MarkSynced(end)
	return nil
}

// MarkSynced records that every byte below end is durable (recovery, after its own
// fsync).
func (f *SyncedFile) MarkSynced(end int64) {
	for {
		s := f.synced.Load()
		if end <= s || f.synced.CompareAndSwap(s, end) {
			return
		}
	}
}

// Synced returns the durable point: every byte below it is durable.
func (f *SyncedFile) Synced() int64 { return f.synced.Load() }

// SetEnd records the logical end after a write.
func (f *SyncedFile) SetEnd(end int64) { f.end.Store(end) }

// WriteAtEnd writes p at the logical end size of a segment file f whose length is
// fileSize: in place over the zero-filled tail while size < fileSize (extending the
// file if p is longer than what is left), appended otherwise. f must implement
// vfs.WriterAt whenever fileSize > size (a log only keeps a tail on such files).
// inPlace says which; n is how much was written, even on error (UndoWrite).
func WriteAtEnd(f vfs.File, p []byte, size, fileSize int64) (n int, inPlace bool, err error) {
	if fileSize > size {
		n, err = f.(vfs.WriterAt).WriteAt(p, size)
		return n, true, err
	}
	n, err = f.Write(p)
	return n, false, err
}

// UndoWrite takes back the n bytes a failed WriteAtEnd left at the logical end size of
// f: cut off if appended, zeros again if written in place (and the file cut back to its
// length fileSize), so the file never holds part of a batch.
func UndoWrite(f vfs.File, size, fileSize int64, n int, inPlace bool) error {
	if !inPlace {
		return f.Truncate(size)
	}
	z := min(int64(n), fileSize-size)
	if _, err := f.(vfs.WriterAt).WriteAt(make([]byte, z), size); err != nil {
		return err
	}
	if size+int64(n) > fileSize {
		return f.Truncate(fileSize)
	}
	return nil
}

// ScanPastEnd looks in b, after the first bad record at b[end], for a record that
// proves the bad one is damage in the middle of the log and not a torn tail, and
// returns its offset in b, or -1. proves(i) parses a record of the log's format at
// b[i]; hdr is the format's header size (no record starts closer than that to the end
// of b); lenAt the offset in a header of a 4-byte length that no valid record has zero:
// where the 8 bytes at i+lenAt are zero no record starts at i..i+4, so the scan skips
// zeros five bytes at a time (a zero-filled tail costs a word compare per 5 bytes, not
// a parse per byte).
//
// The proof, in a log whose records carry a synced mark (format 2 of both logs): a
// record valid at the position it claims whose mark lies past end — end was below a
// completed fsync. Valid records with a lower mark are stale (written, never synced,
// landed while an earlier page did not) and prove nothing. In an appended log without
// marks (format 1 of both logs) any valid record after a bad one is the proof: a torn
// write damages only the end.
func ScanPastEnd(b []byte, end, hdr, lenAt int, proves func(i int) bool) int {
	for i := end + 1; i+hdr <= len(b) && i+lenAt+8 <= len(b); {
		if binary.LittleEndian.Uint64(b[i+lenAt:]) == 0 {
			i += 5
			continue
		}
		if proves(i) {
			return i
		}
		i++
	}
	return -1
}

// EndTail makes file offset end the end of the log in f, the active segment, whose
// length is fileSize; tail holds the file from end on. Nothing non-zero may stay
// behind the end: a later record ending where a stale one begins would resurrect it at
// the next recovery. On a file that can be written in place every 4 KiB block of the
// tail holding a non-zero byte is overwritten with zeros (skipZero skips it: a test's
// deliberate bug); otherwise the file is cut at end. It returns the file's new length
// and how many bytes were zeroed. The caller syncs.
func EndTail(f vfs.File, tail []byte, end, fileSize int64, skipZero bool) (newSize, zeroed int64, err error) {
	wa, ok := f.(vfs.WriterAt)
	if !ok {
		if fileSize > end {
			if err := f.Truncate(end); err != nil {
				return fileSize, 0, fmt.Errorf("cut the tail at %d: %w", end, err)
			}
		}
		return end, 0, nil
	}
	if skipZero {
		return fileSize, 0, nil
	}
	n, err := vfs.ZeroNonZero(wa, tail, end)
	if err != nil {
		return fileSize, n, fmt.Errorf("zero the tail from %d: %w", end, err)
	}
	return fileSize, n, nil
}
