// Package vfs is the small file-system interface Kefir's storage engine writes through,
// with two implementations: OS (the real file system, real fsync) and Mem (an in-memory
// file system that models what survives a power cut and injects faults: lost unsynced
// bytes, torn writes, failing fsync, a full disk, a power cut after N operations).
//
// Mem exists so crash-recovery can be tested deterministically over thousands of seeds
// and so the deterministic simulator can give each simulated replica its own disk. It
// therefore starts no goroutines, reads no clock and draws randomness only from the
// *rand.Rand a test passes in.
//
// It must not import any other Kefir package.
package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
)

// File is an open file. Write always appends at the end of the file; positional writes
// are the optional WriterAt, so code that only appends keeps the simple crash model
// (durable prefix + unsynced suffix).
type File interface {
	io.ReaderAt
	// Write appends p at the end of the file. A short write returns an error.
	Write(p []byte) (int, error)
	// Sync makes the file's contents durable (fsync). It does not make the file's
	// name durable; that needs FS.SyncDir on its directory.
	Sync() error
	// Truncate cuts the file to size bytes (not durable until Sync).
	Truncate(size int64) error
	// Size returns the current length of the file.
	Size() (int64, error)
	Close() error
}

// Preallocator is implemented by files that can reserve space ahead of appends without
// changing their size (fallocate with KEEP_SIZE). Optional: callers type-assert.
type Preallocator interface {
	Preallocate(off, n int64) error
}

// WriterAt is implemented by files that can overwrite in place: WriteAt writes p at
// offset off, whatever the file's size. Writing beyond the end extends the file and the
// gap reads as zeros (a hole), as pwrite does. A short write returns an error, and so
// does WriteAt on a file opened read-only (Open). Optional: callers type-assert. Both OS
// and Mem files implement it.
//
// Crash semantics (what Mem models, and what a disk with 4 KiB pages and 512-byte atomic
// sectors allows): until the next successful Sync, each page overwritten in place may,
// after a power cut, hold its old durable contents, its new contents, or a mix of the
// two at sector boundaries; pages not written since the last Sync keep their contents.
// Bytes written beyond the durable size follow the append rules (a prefix survives).
type WriterAt interface {
	WriteAt(p []byte, off int64) (int, error)
}

// Mapper is implemented by files that can be memory-mapped read-only, so reads of cached
// pages cost a copy instead of a system call. Optional: callers type-assert and fall back
// to ReadAt. Release a mapping with Unmap.
type Mapper interface {
	Map(size int64) ([]byte, error)
}

// SyncTimed syncs f and, if onSync is set, tells it how long the Sync took,
// on this goroutine, before returning (the engine's and the replication log's
// fsync histogram). On a SlowSync file onSync hears the real fsync's duration
// and the emulated extra follows it. The clock is read
// only when someone listens, so the simulator's runs read none.
func SyncTimed(f File, onSync func(time.Duration)) error {
	if onSync == nil {
		return f.Sync()
	}
	if s := slowOf(f); s != nil {
		return s.syncTimed(onSync) // SlowSync: time the real fsync, not the emulated extra
	}
	start := time.Now()
	err := f.Sync()
	onSync(time.Since(start))
	return err
}

// FS is the file-system interface. Paths are slash- or OS-separated; Mem cleans them.
type FS interface {
	// Create creates (or truncates) name for reading and writing (appends; WriterAt).
	Create(name string) (File, error)
	// Open opens an existing file read-only.
	Open(name string) (File, error)
	// OpenRW opens an existing file for reading, writing (appends; WriterAt) and truncating.
	OpenRW(name string) (File, error)
	// Rename atomically renames oldname to newname, replacing newname
	// (durable once the directory is synced).
	Rename(oldname, newname string) error
	// Remove deletes a file (durable once the directory is synced).
	Remove(name string) error
	// ReadDir returns the names of the entries in dir, sorted.
	ReadDir(dir string) ([]string, error)
	// MkdirAll creates dir and its parents.
	MkdirAll(dir string) error
	// SyncDir makes the creates, renames and removes in dir durable.
	SyncDir(dir string) error
	// Stat returns the size of name, or an error wrapping fs.ErrNotExist.
	Stat(name string) (size int64, err error)
}

// ErrNoSpace is returned (wrapped) when the disk is full. errors.Is(err, syscall.ENOSPC)
// also holds, so code written against the real file system branches the same way.
var ErrNoSpace error = noSpace{}

type noSpace struct{}

func (noSpace) Error() string        { return "no space left on device" }
func (noSpace) Is(target error) bool { return target == syscall.ENOSPC }

// IsNoSpace reports whether err means the disk is full (ours or the OS's ENOSPC).
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrNoSpace)
}

// OS is the real file system.
type OS struct{}

// Default is the real file system.
var Default FS = OS{}

// osFile is an OS file. Writable files are opened with O_APPEND, so Write appends
// atomically with one write(2). That descriptor cannot do positional writes (Go refuses
// WriteAt on it, and Linux's pwrite on an O_APPEND descriptor ignores the offset), so
// WriteAt uses a second descriptor on the same file, opened on first use. fdatasync
// flushes the file, not a descriptor, so Sync covers writes through both.
//
// (Opening without O_APPEND and seeking to the end before each Write was measured at
// about 0.35 us more per 2,800-byte Write, a cost on every append to buy positional
// writes that only new code uses; docs/design/zero-filled-logs.md step 4.)
type osFile struct {
	*os.File
	writable bool

	mu sync.Mutex
	pw *os.File // the positional-write descriptor, nil until the first WriteAt
}

// WriteAt implements WriterAt with pwrite on the positional-write descriptor.
func (f *osFile) WriteAt(p []byte, off int64) (int, error) {
	if !f.writable {
		return 0, &os.PathError{Op: "write", Path: f.Name(), Err: os.ErrPermission}
	}
	f.mu.Lock()
	if f.pw == nil {
		pw, err := reopenForWriteAt(f.File)
		if err != nil {
			f.mu.Unlock()
			return 0, fmt.Errorf("vfs: open %s for positional writes: %w", f.Name(), err)
		}
		f.pw = pw
	}
	pw := f.pw
	f.mu.Unlock()
	return pw.WriteAt(p, off)
}

// Close closes the file and its positional-write descriptor, if any.
func (f *osFile) Close() error {
	f.mu.Lock()
	pw := f.pw
	f.pw = nil
	f.mu.Unlock()
	err := f.File.Close()
	if pw != nil {
		if perr := pw.Close(); err == nil {
			err = perr
		}
	}
	return err
}

type osSyncError struct {
	name string
	err  error
}

func (e *osSyncError) Error() string { return "sync " + e.name + ": " + e.err.Error() }
func (e *osSyncError) Unwrap() error { return e.err }

func (f *osFile) Size() (int64, error) {
	st, err := f.File.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Create implements FS.
func (OS) Create(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &osFile{File: f, writable: true}, nil
}

// Open implements FS.
func (OS) Open(name string) (File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return &osFile{File: f}, nil
}

// OpenRW implements FS.
func (OS) OpenRW(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	return &osFile{File: f, writable: true}, nil
}

// Rename implements FS.
func (OS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Remove implements FS.
func (OS) Remove(name string) error { return os.Remove(name) }

// ReadDir implements FS.
func (OS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	sort.Strings(names)
	return names, nil
}

// MkdirAll implements FS.
func (OS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

// SyncDir implements FS.
func (OS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	cerr := d.Close()
	if serr != nil {
		return serr
	}
	return cerr
}

// Stat implements FS.
func (OS) Stat(name string) (int64, error) {
	st, err := os.Stat(name)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Join is filepath.Join, re-exported so callers need not mix packages.
func Join(elem ...string) string { return filepath.Join(elem...) }

// WriteFileDurably writes b as the whole file final in dir, durably and
// atomically: a temporary file (final + ".tmp"), synced, renamed into place,
// and the directory synced, so a crash leaves either no final or all of it.
func WriteFileDurably(fs FS, dir, final string, b []byte) error {
	tmp := final + ".tmp"
	f, err := fs.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return Publish(fs, f, err, dir, tmp, final)
}

// Publish ends the atomic write of a file: unless writing f (the temporary
// file tmp in dir) failed with err, it syncs and closes f, renames it to
// final and syncs the directory. It closes f in every case. The tail of
// WriteFileDurably, for writers that stream their file rather than write
// one buffer.
func Publish(fs FS, f File, err error, dir, tmp, final string) error {
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, final)
	}
	if err == nil {
		err = fs.SyncDir(dir)
	}
	return err
}
