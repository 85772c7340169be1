package vrshard

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/vfs"
)

// Zero-filled segments (docs/design/zero-filled-logs.md): a filler writes the
// next segment's file full of zeros and fsyncs it before it is needed, so the
// log's writes overwrite blocks that are already allocated and written, and
// an fdatasync has no file size or extent to commit (on this machine's disk
// about 83 µs p50 against 187 µs for an append).

// fillMode says when the next segment is zero-filled.
type fillMode int

const (
	// fillAsync: on a goroutine, started at open and after every roll, one
	// segment ahead (replicas).
	fillAsync fillMode = iota
	// fillInline: at open and at the end of every roll, on the caller's
	// goroutine (tests: the order of file operations is deterministic).
	fillInline
	// fillManual: only the first segment and when a test calls fillNow.
	fillManual
	// fillOff: never; every segment is appended to.
	fillOff
)

// walConfig configures a WAL. The zero-filled size of a segment is twice the
// logical size of the one before it (what one checkpoint interval wrote,
// with room for a burst), rounded up to a MiB, within [minSeg, maxSeg]. A
// segment that fills up goes on by appending.
//
// Why these sizes: a checkpoint rolls the segment every 20,000 ops or 64 MiB
// of log (Options.CheckpointOps, CheckpointBytes). With 16-byte keys and
// 128-byte values an op is ~170 bytes of log, so an interval writes ~3.4 MB;
// with 1 KB values ~21 MB. Zero-filling a fixed 64 MiB ahead would cost 20
// bytes of background writes per byte of log in the first case; twice the
// last interval costs two. minSeg keeps small intervals (and the first
// segment, sized before any history) in place; maxSeg bounds the space
// reserved ahead, and covers CheckpointBytes' interval, the largest.
type walConfig struct {
	fill           fillMode
	minSeg, maxSeg int64
	// onSync, if set, is told how long each fsync of a segment took
	// (Options.OnLogSync); it runs on the goroutine that synced.
	onSync func(time.Duration)
	mut    walMutations
}

// walMutations are deliberate bugs the WAL's tests switch on to show they
// catch them.
type walMutations struct {
	// skipZeroTail: recovery leaves the bytes after the log's end as they
	// are, so a stale record can be resurrected.
	skipZeroTail bool
	// ignorePos: a record is valid wherever it lies, not only at the offset
	// it claims.
	ignorePos bool
	// ignoreSynced: recovery takes the first bad record as the end even when
	// a record says the log was durable past it.
	ignoreSynced bool
}

func defaultWALConfig() walConfig {
	return walConfig{fill: fillAsync, minSeg: 4 << 20, maxSeg: 64 << 20}
}

// zeroName is the filler's file, renamed to wal-<n>.log by the roll that
// takes it. Recovery removes it (tmpSuffix): a roll may have written into it
// before a crash, and it is cheap to make again.
const zeroName = "wal-zero" + tmpSuffix

// segSizeAfter returns the zero-filled size of the segment to follow one
// whose log ended at end.
func (c walConfig) segSizeAfter(end int64) int64 {
	const mib = 1 << 20
	s := (2*end + mib - 1) / mib * mib
	return min(max(s, c.minSeg), max(c.maxSeg, c.minSeg))
}

// segFile is the active segment. Its Sync (the replica runs it on another
// goroutine while the driver writes) records what it made durable: the
// logical end when it started. Every record carries that mark.
type segFile struct {
	vfs.File
	end    atomic.Int64 // logical end: bytes written so far
	synced atomic.Int64 // every byte below it is durable
	onSync func(time.Duration)
}

func (f *segFile) Sync() error {
	end := f.end.Load()
	if err := vfs.SyncTimed(f.File, f.onSync); err != nil {
		return err
	}
	for {
		s := f.synced.Load()
		if end <= s || f.synced.CompareAndSwap(s, end) {
			return nil
		}
	}
}

// filler makes the next segment's zero-filled file (zeroName).
type filler struct {
	fs   vfs.FS
	path string
	mode fillMode

	mu      sync.Mutex
	ready   bool  // path is complete: zero-filled and synced
	size    int64 // its size
	busy    bool  // a goroutine is filling it
	stopped atomic.Bool
	wg      sync.WaitGroup
}

func newFiller(w *wal) *filler {
	return &filler{fs: w.fs, path: vfs.Join(w.dir, zeroName), mode: w.cfg.fill}
}

// requestFill asks for the next segment's file, sized after a segment whose
// log ended at end.
func (w *wal) requestFill(end int64) {
	if w.writeAt < 0 {
		return // the file system cannot overwrite in place
	}
	size := w.cfg.segSizeAfter(end)
	switch w.cfg.fill {
	case fillAsync:
		f := w.fill
		if !f.claim() {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.run(size)
		}()
	case fillInline:
		w.fill.fillNow(size)
	}
}

// fillNow fills the next segment's file on the caller's goroutine, unless
// one is ready or being filled.
func (f *filler) fillNow(size int64) {
	if f.claim() {
		f.run(size)
	}
}

// claim marks a fill as running and reports true, unless the filler is off
// or stopped, or a file is ready or being filled.
func (f *filler) claim() bool {
	if f.mode == fillOff || f.stopped.Load() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy || f.ready {
		return false
	}
	f.busy = true
	return true
}

func (f *filler) run(size int64) {
	err := f.zeroFill(size)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.busy = false
	if err != nil {
		_ = f.fs.Remove(f.path)
		return
	}
	f.ready, f.size = true, size
}

// zeroFill writes size zero bytes to a new file at f.path and fsyncs it
// (vfs.ZeroFill). The file's name needs no directory sync here: the roll
// that takes it renames it and syncs the directory, and recovery deletes it
// if that never happened.
func (f *filler) zeroFill(size int64) error {
	file, err := f.fs.Create(f.path)
	if err != nil {
		return err
	}
	defer file.Close()
	return vfs.ZeroFill(file, size, f.stopped.Load)
}

// take returns the ready zero-filled file, open for writing, with its size
// and path; or nil if none is ready.
func (f *filler) take() (vfs.File, int64, string) {
	f.mu.Lock()
	ready, size := f.ready, f.size
	f.ready = false
	f.mu.Unlock()
	if !ready {
		return nil, 0, ""
	}
	file, err := f.fs.OpenRW(f.path)
	if err != nil {
		return nil, 0, ""
	}
	if _, ok := file.(vfs.WriterAt); !ok {
		file.Close()
		_ = f.fs.Remove(f.path)
		return nil, 0, ""
	}
	return file, size, f.path
}

// idle reports whether no fill is running (tests).
func (f *filler) idle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.busy
}

// close stops the filler and waits for its goroutine.
func (f *filler) close() {
	f.stopped.Store(true)
	f.wg.Wait()
}
