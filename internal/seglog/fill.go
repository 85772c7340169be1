package seglog

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/vfs"
)

// FillMode says when the next segment's file is zero-filled.
type FillMode int

const (
	// FillAsync: on a goroutine (the default of both logs).
	FillAsync FillMode = iota
	// FillInline: on the goroutine that asks (tests and the simulator: the order of
	// file operations is deterministic).
	FillInline
	// FillManual: only when the log calls FillNow (its first segment) or a test does
	// (tests: a roll that finds no file ready).
	FillManual
	// FillOff: never; every segment is appended to.
	FillOff
)

// ErrNoWriteAt: the file system's files cannot be written in place, so a zero-filled
// file is of no use.
var ErrNoWriteAt = errors.New("seglog: no positional writes on this file system")

// Filler makes the next segment's zero-filled file: name in the directory it is asked
// for (the storage log spreads segments over devices, so the next one's directory
// changes). A roll takes the ready file (Take) and renames it into place; recovery
// removes a leftover one (its name ends in TmpSuffix).
type Filler struct {
	fs   vfs.FS
	name string
	mode FillMode

	mu      sync.Mutex
	ready   bool        // path is complete: zero-filled and synced
	path    string      // the file being filled or ready
	busy    bool        // a fill is running
	stopped atomic.Bool // set under mu (claim checks it there); read without it by fills
	wg      sync.WaitGroup

	// AfterClaim, if set, runs after an async claim, before its goroutine starts
	// (tests: Close racing a Request).
	AfterClaim func()
}

// NewFiller returns a filler that makes files called name (which must end in
// TmpSuffix) on fs, in mode.
func NewFiller(fs vfs.FS, name string, mode FillMode) *Filler {
	return &Filler{fs: fs, name: name, mode: mode}
}

// Mode returns the filler's mode.
func (f *Filler) Mode() FillMode { return f.mode }

// Request asks for a zero-filled file of size bytes in dir, unless one is ready there
// or being filled: on a goroutine (FillAsync), on the caller's (FillInline), or not at
// all (FillManual, FillOff). A ready file in another directory is dropped.
func (f *Filler) Request(dir string, size int64) {
	if f.mode != FillAsync && f.mode != FillInline {
		return
	}
	if !f.claim(dir, f.mode == FillAsync) {
		return
	}
	if f.mode == FillInline {
		f.run(size)
		return
	}
	if f.AfterClaim != nil {
		f.AfterClaim()
	}
	go func() {
		defer f.wg.Done()
		f.run(size)
	}()
}

// FillNow fills a file of size bytes in dir on the caller's goroutine, whatever the
// mode (except FillOff), unless one is ready there or being filled. A log fills its
// first segment this way: nothing waits on its write path yet.
func (f *Filler) FillNow(dir string, size int64) {
	if f.mode != FillOff && f.claim(dir, false) {
		f.run(size)
	}
}

// ReadyIn reports whether a zero-filled file is ready in dir.
func (f *Filler) ReadyIn(dir string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready && f.path == vfs.Join(dir, f.name)
}

// claim marks a fill of dir's file as running and reports true, unless the filler is
// stopped, or a file is being filled or is ready in dir. With async it also counts the
// goroutine the caller is about to start in wg, under the same lock as the stopped
// check: Close sets stopped under that lock too, so either Close sees the goroutine
// counted and waits for it, or the claim sees stopped. (Checking stopped before the
// lock and counting after it let Close return, and a new log open the directory,
// before a fill began: that fill's file then appeared, and its failed fill removed it
// by name, under the new log.)
func (f *Filler) claim(dir string, async bool) bool {
	path := vfs.Join(dir, f.name)
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

func (f *Filler) run(size int64) {
	f.mu.Lock()
	path := f.path
	f.mu.Unlock()
	touched, err := f.zeroFill(path, size)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.busy = false
	if err != nil {
		if touched {
			_ = f.fs.Remove(path)
		}
		return
	}
	f.ready = true
}

// zeroFill makes the file. touched reports whether it tried to create it: a fill that
// Close stopped before that touches nothing, not even by name.
func (f *Filler) zeroFill(path string, size int64) (touched bool, err error) {
	if f.stopped.Load() {
		return false, vfs.ErrStopped // Close came first: create nothing
	}
	file, err := f.fs.Create(path)
	if err != nil {
		return true, err
	}
	defer file.Close()
	if _, ok := file.(vfs.WriterAt); !ok {
		return true, ErrNoWriteAt
	}
	// The file's name needs no directory sync here: the roll that takes it renames it
	// and syncs the directory, and recovery deletes it if that never happened.
	return true, vfs.ZeroFill(file, size, f.stopped.Load)
}

// Take returns the path of the ready zero-filled file in dir, or "" if none is ready
// there. The caller owns the file from then on: it renames it into place, or removes
// it.
func (f *Filler) Take(dir string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ready || f.path != vfs.Join(dir, f.name) {
		return ""
	}
	f.ready = false
	return f.path
}

// Idle reports whether no fill is running (tests).
func (f *Filler) Idle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.busy
}

// Close stops the filler and waits for its goroutine: no fill runs once it returns,
// and none starts after.
func (f *Filler) Close() {
	f.mu.Lock()
	f.stopped.Store(true)
	f.mu.Unlock()
	f.wg.Wait()
}

// TakeOpen takes the ready zero-filled file in dir for a roll and opens it for writing
// in place, renamed to dest first unless dest is "". It returns the file, its size and
// its path, or nil if none is ready there or a step fails: then the file is removed,
// or, if it was already renamed, left at dest for the caller to create anew (Create
// truncates). The caller makes the name durable (a directory sync).
//
// The two logs differ in when the file gets its final name: the storage log renames
// it first (a sealed segment followed by an empty one is a valid log), the replication
// log writes its first records under the temporary name and renames it once they are
// durable (recovery trusts the newest segment).
func (f *Filler) TakeOpen(dir, dest string) (vfs.File, int64, string) {
	path := f.Take(dir)
	if path == "" {
		return nil, 0, ""
	}
	if dest != "" {
		if err := f.fs.Rename(path, dest); err != nil {
			_ = f.fs.Remove(path)
			return nil, 0, ""
		}
		path = dest
	}
	file, size, err := openZeroFilled(f.fs, path)
	if err != nil {
		if dest == "" {
			_ = f.fs.Remove(path)
		}
		return nil, 0, ""
	}
	return file, size, path
}

// openZeroFilled opens a zero-filled file for writing in place and returns it with its
// size. It fails if the file system cannot write in place.
func openZeroFilled(fs vfs.FS, path string) (vfs.File, int64, error) {
	f, err := fs.OpenRW(path)
	if err != nil {
		return nil, 0, err
	}
	if _, ok := f.(vfs.WriterAt); !ok {
		f.Close()
		return nil, 0, ErrNoWriteAt
	}
	size, err := f.Size()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, size, nil
}
