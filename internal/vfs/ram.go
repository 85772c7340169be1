package vfs

import (
	"io"
	"io/fs"
	"path/filepath"
	"sync"
)

// RAM is an in-memory file system for data that need not outlive the process — a
// memory-only chain member's replica (vrshard, --chain-store memory) — where Mem is a
// model of a disk for tests. RAM has no crash model and no fault injection: Sync and
// SyncDir do nothing, and everything is gone with the process. A file is a list of
// fixed-size chunks, so a growing file is never copied (Mem grows one slice, copying the
// whole file as it grows, and keeps the durable bytes of every page overwritten since the
// last Sync: costs a test does not mind and a store of gigabytes does).
//
// RAM is safe for concurrent use. Names are cleaned as Mem cleans them.
type RAM struct {
	mu    sync.Mutex
	files map[string]*ramNode
	dirs  map[string]bool
}

// ramChunk is how much a file grows by at a time.
const ramChunk = 64 << 10

type ramNode struct {
	mu     sync.RWMutex
	chunks [][]byte // each ramChunk long; bytes past size are zero
	size   int64
}

// NewRAM returns an empty in-memory file system with the root directory "/" and ".".
func NewRAM() *RAM {
	return &RAM{files: map[string]*ramNode{}, dirs: map[string]bool{"/": true, ".": true}}
}

// Used returns the bytes the files hold (their sizes; the chunks allocated may be up to
// one chunk a file more).
func (m *RAM) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, nd := range m.files {
		nd.mu.RLock()
		n += nd.size
		nd.mu.RUnlock()
	}
	return n
}

func (m *RAM) checkDir(op, name string) error {
	if !m.dirs[filepath.Dir(name)] {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return nil
}

// Create implements FS.
func (m *RAM) Create(name string) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkDir("create", name); err != nil {
		return nil, err
	}
	nd := &ramNode{}
	m.files[name] = nd
	return &ramFile{nd: nd, name: name, rw: true}, nil
}

func (m *RAM) open(name string, rw bool) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	nd, ok := m.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &ramFile{nd: nd, name: name, rw: rw}, nil
}

// Open implements FS.
func (m *RAM) Open(name string) (File, error) { return m.open(name, false) }

// OpenRW implements FS.
func (m *RAM) OpenRW(name string) (File, error) { return m.open(name, true) }

// Rename implements FS.
func (m *RAM) Rename(oldname, newname string) error {
	oldname, newname = clean(oldname), clean(newname)
	m.mu.Lock()
	defer m.mu.Unlock()
	nd, ok := m.files[oldname]
	if !ok {
		return &fs.PathError{Op: "rename", Path: oldname, Err: fs.ErrNotExist}
	}
	if err := m.checkDir("rename", newname); err != nil {
		return err
	}
	delete(m.files, oldname)
	m.files[newname] = nd
	return nil
}

// Remove implements FS.
func (m *RAM) Remove(name string) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(m.files, name)
	return nil
}

// ReadDir implements FS.
func (m *RAM) ReadDir(dir string) ([]string, error) {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[dir] {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: fs.ErrNotExist}
	}
	return listDir(m.files, m.dirs, dir), nil
}

// MkdirAll implements FS.
func (m *RAM) MkdirAll(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	return mkdirAll(m.files, m.dirs, dir)
}

// SyncDir implements FS: nothing to make durable.
func (m *RAM) SyncDir(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[dir] {
		return &fs.PathError{Op: "syncdir", Path: dir, Err: fs.ErrNotExist}
	}
	return nil
}

// Stat implements FS.
func (m *RAM) Stat(name string) (int64, error) {
	name = clean(name)
	m.mu.Lock()
	nd, ok := m.files[name]
	isDir := m.dirs[name]
	m.mu.Unlock()
	if ok {
		nd.mu.RLock()
		defer nd.mu.RUnlock()
		return nd.size, nil
	}
	if isDir {
		return 0, nil
	}
	return 0, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

type ramFile struct {
	nd     *ramNode
	name   string
	rw     bool
	mu     sync.Mutex // closed
	closed bool
}

func (f *ramFile) check(op string, write bool) error {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrClosed}
	}
	if write && !f.rw {
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrPermission}
	}
	return nil
}

func (f *ramFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	nd := f.nd
	nd.mu.RLock()
	defer nd.mu.RUnlock()
	if off >= nd.size {
		return 0, io.EOF
	}
	want := min(int64(len(p)), nd.size-off)
	n := 0
	for int64(n) < want {
		at := off + int64(n)
		c := nd.chunks[at/ramChunk][at%ramChunk:]
		n += copy(p[n:want], c)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Write implements File: it appends at the end of the file.
func (f *ramFile) Write(p []byte) (int, error) { return f.write(p, 0, true) }

// WriteAt implements WriterAt; beyond the end it extends the file, zeros filling any gap.
func (f *ramFile) WriteAt(p []byte, off int64) (int, error) { return f.write(p, off, false) }

// write copies p to off, or with app to the end of the file (taken under
// the node's lock, so concurrent appends do not overlap).
func (f *ramFile) write(p []byte, off int64, app bool) (int, error) {
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: fs.ErrInvalid}
	}
	nd := f.nd
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if app {
		off = nd.size
	}
	nd.writeAt(p, off)
	return len(p), nil
}

// writeAt copies p to off, growing the file (nd.mu held).
func (nd *ramNode) writeAt(p []byte, off int64) {
	end := off + int64(len(p))
	for int64(len(nd.chunks))*ramChunk < end {
		nd.chunks = append(nd.chunks, make([]byte, ramChunk))
	}
	for n := 0; n < len(p); {
		at := off + int64(n)
		n += copy(nd.chunks[at/ramChunk][at%ramChunk:], p[n:])
	}
	nd.size = max(nd.size, end)
}

// Sync implements File: nothing to make durable.
func (f *ramFile) Sync() error { return f.check("sync", false) }

// Truncate implements File. Bytes cut off read as zeros if the file grows again.
func (f *ramFile) Truncate(size int64) error {
	if err := f.check("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: fs.ErrInvalid}
	}
	nd := f.nd
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if size >= nd.size {
		nd.writeAt(nil, size) // grows the chunks; the new bytes are zero
		return nil
	}
	keep := (size + ramChunk - 1) / ramChunk
	for i := keep; i < int64(len(nd.chunks)); i++ {
		nd.chunks[i] = nil
	}
	nd.chunks = nd.chunks[:keep]
	if r := size % ramChunk; r != 0 {
		clear(nd.chunks[keep-1][r:])
	}
	nd.size = size
	return nil
}

// Size implements File.
func (f *ramFile) Size() (int64, error) {
	if err := f.check("size", false); err != nil {
		return 0, err
	}
	f.nd.mu.RLock()
	defer f.nd.mu.RUnlock()
	return f.nd.size, nil
}

// Close implements File.
func (f *ramFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	f.closed = true
	return nil
}
