package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// ErrPoweredOff is returned by every operation on a Mem after a scheduled power cut
// (CrashAfter) has happened and before Crash "reboots" it.
var ErrPoweredOff = errors.New("vfs: powered off")

// ErrStaleHandle is returned by a File opened before the last Crash.
var ErrStaleHandle = errors.New("vfs: file handle from before the crash")

// ErrInjected is the cause of injected I/O errors (failed fsync, failed write).
var ErrInjected error = syscall.EIO

// Mem is an in-memory FS that models a power cut.
//
// The model: a file's contents are durable up to its last successful Sync; a file's
// name (create, rename, remove) is durable once its directory is synced with SyncDir.
// Crash reverts both to their durable state and may keep a seeded random prefix of each
// file's unsynced appended bytes, optionally scribbling over the last few of them (a
// torn write). A failed fsync loses the bytes it should have written, as Linux does:
// the kernel marks the pages clean, so a later successful fsync does not write them and
// after a crash they read back as zeros.
//
// In-place overwrites (WriteAt below the durable size) are tracked per 4 KiB page: Crash
// gives each page overwritten since the last sync, independently, its old durable
// contents, its new contents, or a mix of the two at 512-byte sector boundaries (sectors
// are atomic, pages are not). Pages not overwritten keep their durable contents. A failed
// fsync loses overwritten pages too: they keep their old durable contents until written
// again, even across a later successful fsync.
//
// Mem is safe for concurrent use; it starts no goroutines and has no hidden randomness.
type Mem struct {
	mu      sync.Mutex
	files   map[string]*memNode // current namespace
	durable map[string]*memNode // namespace as of the last SyncDir of each directory
	dirs    map[string]bool
	epoch   int

	capacity   int64 // 0 = unlimited
	failSyncs  int
	failWrites int
	opsLeft    int // mutating operations before a power cut; <0 = none scheduled
	off        bool

	syncs int64 // successful fsyncs (files and directories), for tests and benchmarks
	ops   int64 // mutating operations attempted

	// keepOverwrites is a test-only mutation: Crash keeps every unsynced in-place
	// overwrite, a model that never loses them. The crash tests must catch it.
	keepOverwrites bool
}

// memPage and memSector are the units of the overwrite crash model: the page cache
// writes back whole pages, and a disk writes a sector atomically or not at all.
const (
	memPage   = 4096
	memSector = 512
)

type memNode struct {
	data   []byte
	durLen int    // data[:durLen] is durable, unless base != nil
	base   []byte // durable contents when they are not a prefix of data
	// [lostLo, lostHi) was dropped by a failed fsync; the next sync makes it zeros.
	// It is byte-exact and nothing written later shrinks it (a WriteAt into it is lost
	// too: pessimistic, where lost pages below are exact).
	lostLo, lostHi int
	// old maps each page overwritten in place since the last sync to its durable bytes
	// (the page's part below the durable size), saved before the first overwrite. When
	// base == nil the durable contents are data[:durLen] with these pages put back.
	old map[int][]byte
	// lost maps each page whose overwrite a failed fsync dropped to its durable bytes:
	// the disk still holds them and the page cache thinks the page clean, so they stay
	// durable (a crash restores them, a successful sync does not write over them) until
	// the page is written again.
	lost map[int][]byte
}

// durable returns the file's durable contents (a fresh copy).
func (nd *memNode) durable() []byte {
	if nd.base != nil {
		return append([]byte(nil), nd.base...)
	}
	d := append([]byte(nil), nd.data[:nd.durLen]...)
	for pg, b := range nd.old {
		copy(d[pg*memPage:], b)
	}
	for pg, b := range nd.lost {
		copy(d[pg*memPage:], b)
	}
	return d
}

// durSize returns the durable file size.
func (nd *memNode) durSize() int {
	if nd.base != nil {
		return len(nd.base)
	}
	return nd.durLen
}

// NewMem returns an empty in-memory file system with the root directory "/" and ".".
func NewMem() *Mem {
	return &Mem{
		files:   map[string]*memNode{},
		durable: map[string]*memNode{},
		dirs:    map[string]bool{"/": true, ".": true},
		opsLeft: -1,
	}
}

// SetCapacity limits the total size of all files to n bytes (0 = unlimited). Writes
// beyond it write what fits and fail with an error wrapping ErrNoSpace; creating a file
// on a full disk fails the same way.
func (m *Mem) SetCapacity(n int64) {
	m.mu.Lock()
	m.capacity = n
	m.mu.Unlock()
}

// Used returns the total size of all files in the current namespace.
func (m *Mem) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usedLocked()
}

func (m *Mem) usedLocked() int64 {
	var n int64
	for _, nd := range m.files {
		n += int64(len(nd.data))
	}
	return n
}

// FailSyncs makes the next n fsyncs (File.Sync or SyncDir) fail with EIO.
func (m *Mem) FailSyncs(n int) {
	m.mu.Lock()
	m.failSyncs = n
	m.mu.Unlock()
}

// FailWrites makes the next n writes fail with EIO, writing nothing.
func (m *Mem) FailWrites(n int) {
	m.mu.Lock()
	m.failWrites = n
	m.mu.Unlock()
}

// CrashAfter schedules a power cut: after n more mutating operations (write, sync,
// truncate, create, rename, remove, dir sync) every operation fails with ErrPoweredOff
// until Crash is called. n < 0 cancels.
func (m *Mem) CrashAfter(n int) {
	m.mu.Lock()
	m.opsLeft = n
	m.mu.Unlock()
}

// PoweredOff reports whether a scheduled power cut has happened.
func (m *Mem) PoweredOff() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.off
}

// Syncs returns the number of successful fsyncs so far.
func (m *Mem) Syncs() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

// Ops returns the number of mutating operations attempted so far.
func (m *Mem) Ops() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ops
}

// Crash simulates a power cut and reboot: unsynced names and bytes are lost, handles
// opened before become stale, scheduled faults are cleared. If rng is non-nil, each
// file keeps a random prefix of its unsynced appended bytes and, half of the time, the
// last up to 16 kept bytes are overwritten with garbage (a torn write); then each page
// overwritten in place since the last sync gets its old contents, its new contents or a
// sector-by-sector mix. With rng nil exactly the durable state survives.
func (m *Mem) Crash(rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Iterate names in sorted order so a seed always produces the same disk.
	names := make([]string, 0, len(m.durable))
	for name := range m.durable {
		names = append(names, name)
	}
	sort.Strings(names)
	files := make(map[string]*memNode, len(names))
	done := map[*memNode]*memNode{}
	for _, name := range names {
		old := m.durable[name]
		if nd, ok := done[old]; ok { // hard links are not modelled, but be safe
			files[name] = nd
			continue
		}
		keep := old.durable()
		// With base set (a truncation below the durable size, or pages a failed fsync
		// dropped) exactly the durable contents survive.
		if old.base == nil {
			if rng != nil && len(old.data) > old.durLen {
				unsynced := old.data[old.durLen:]
				k := rng.Intn(len(unsynced) + 1)
				tail := append([]byte(nil), unsynced[:k]...)
				if k > 0 && rng.Intn(2) == 0 {
					n := 1 + rng.Intn(min(16, k))
					for i := k - n; i < k; i++ {
						tail[i] = byte(rng.Intn(256))
					}
				}
				keep = append(keep, tail...)
			}
			// Drawn after the append tail so files without overwrites consume the
			// rng exactly as before overwrites existed.
			if rng != nil || m.keepOverwrites {
				// In page order, so a seed always makes the same choices.
				for _, pg := range slices.Sorted(maps.Keys(old.old)) {
					crashPage(keep, old, pg, rng, m.keepOverwrites)
				}
			}
		}
		nd := &memNode{data: keep, durLen: len(keep)}
		done[old] = nd
		files[name] = nd
	}
	m.files = files
	m.durable = make(map[string]*memNode, len(files))
	for k, v := range files {
		m.durable[k] = v
	}
	m.epoch++
	m.off = false
	m.opsLeft = -1
	m.failSyncs = 0
	m.failWrites = 0
}

// crashPage decides what page pg of nd holds after a power cut, writing it into keep
// (which holds the durable contents): the old bytes, the new bytes, or per sector either.
func crashPage(keep []byte, nd *memNode, pg int, rng *rand.Rand, keepNew bool) {
	lo := pg * memPage
	hi := lo + len(nd.old[pg]) // the part of the page below the durable size
	newb := nd.data[lo:hi]
	if keepNew {
		copy(keep[lo:hi], newb)
		return
	}
	switch rng.Intn(5) {
	case 0, 1: // the page never reached the disk: keep already holds the old bytes
	case 2, 3:
		copy(keep[lo:hi], newb)
	default: // torn: the write-back stopped part way, sector by sector in any order
		for s := lo; s < hi; s += memSector {
			if rng.Intn(2) == 0 {
				e := min(s+memSector, hi)
				copy(keep[s:e], nd.data[s:e])
			}
		}
	}
}

func clean(name string) string { return filepath.Clean(name) }

// mutate accounts for one mutating operation and reports whether the power is on.
func (m *Mem) mutate() error {
	m.ops++
	if m.off {
		return ErrPoweredOff
	}
	if m.opsLeft == 0 {
		m.off = true
		return ErrPoweredOff
	}
	if m.opsLeft > 0 {
		m.opsLeft--
	}
	return nil
}

func (m *Mem) checkDir(op, name string) error {
	if !m.dirs[filepath.Dir(name)] {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return nil
}

// Create implements FS.
func (m *Mem) Create(name string) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.mutate(); err != nil {
		return nil, &fs.PathError{Op: "create", Path: name, Err: err}
	}
	if err := m.checkDir("create", name); err != nil {
		return nil, err
	}
	if m.capacity > 0 && m.usedLocked() >= m.capacity {
		// A full disk has no room for the new directory entry either.
		return nil, &fs.PathError{Op: "create", Path: name, Err: ErrNoSpace}
	}
	nd := &memNode{}
	m.files[name] = nd
	return &memFile{m: m, nd: nd, name: name, epoch: m.epoch, rw: true}, nil
}

func (m *Mem) open(op, name string, rw bool) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return nil, &fs.PathError{Op: op, Path: name, Err: ErrPoweredOff}
	}
	nd, ok := m.files[name]
	if !ok {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return &memFile{m: m, nd: nd, name: name, epoch: m.epoch, rw: rw}, nil
}

// Open implements FS.
func (m *Mem) Open(name string) (File, error) { return m.open("open", name, false) }

// OpenRW implements FS.
func (m *Mem) OpenRW(name string) (File, error) { return m.open("open", name, true) }

// Rename implements FS.
func (m *Mem) Rename(oldname, newname string) error {
	oldname, newname = clean(oldname), clean(newname)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.mutate(); err != nil {
		return &fs.PathError{Op: "rename", Path: oldname, Err: err}
	}
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
func (m *Mem) Remove(name string) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.mutate(); err != nil {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	if _, ok := m.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(m.files, name)
	return nil
}

// ReadDir implements FS.
func (m *Mem) ReadDir(dir string) ([]string, error) {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: ErrPoweredOff}
	}
	if !m.dirs[dir] {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: fs.ErrNotExist}
	}
	return listDir(m.files, m.dirs, dir), nil
}

// MkdirAll implements FS. Directories are durable at once (the model is about files).
func (m *Mem) MkdirAll(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return &fs.PathError{Op: "mkdir", Path: dir, Err: ErrPoweredOff}
	}
	return mkdirAll(m.files, m.dirs, dir)
}

// SyncDir implements FS.
func (m *Mem) SyncDir(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.mutate(); err != nil {
		return &fs.PathError{Op: "syncdir", Path: dir, Err: err}
	}
	if !m.dirs[dir] {
		return &fs.PathError{Op: "syncdir", Path: dir, Err: fs.ErrNotExist}
	}
	if m.failSyncs > 0 {
		m.failSyncs--
		return &fs.PathError{Op: "syncdir", Path: dir, Err: ErrInjected}
	}
	for name := range m.durable {
		if filepath.Dir(name) == dir {
			delete(m.durable, name)
		}
	}
	for name, nd := range m.files {
		if filepath.Dir(name) == dir {
			m.durable[name] = nd
		}
	}
	m.syncs++
	return nil
}

// Stat implements FS.
func (m *Mem) Stat(name string) (int64, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return 0, &fs.PathError{Op: "stat", Path: name, Err: ErrPoweredOff}
	}
	if nd, ok := m.files[name]; ok {
		return int64(len(nd.data)), nil
	}
	if m.dirs[name] {
		return 0, nil
	}
	return 0, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

// String lists the files and their sizes, for test failure messages.
func (m *Mem) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.files))
	for name := range m.files {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		nd := m.files[name]
		fmt.Fprintf(&b, "%s %d (durable %d)\n", name, len(nd.data), nd.durLen)
	}
	return b.String()
}

type memFile struct {
	m      *Mem
	nd     *memNode
	name   string
	epoch  int
	rw     bool
	closed bool
}

func (f *memFile) check(op string) error {
	if f.closed {
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrClosed}
	}
	if f.epoch != f.m.epoch {
		return &fs.PathError{Op: op, Path: f.name, Err: ErrStaleHandle}
	}
	return nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if f.m.off {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: ErrPoweredOff}
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	if off >= int64(len(f.nd.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.nd.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// startWrite makes the checks and fault injections every write goes through, in order:
// a stale or closed handle, a read-only handle, the power (a mutating operation), a
// negative offset (WriteAt), an injected write failure. Called with m.mu held.
func (f *memFile) startWrite(off int64) error {
	if err := f.check("write"); err != nil {
		return err
	}
	if !f.rw {
		return &fs.PathError{Op: "write", Path: f.name, Err: fs.ErrPermission}
	}
	if err := f.m.mutate(); err != nil {
		return &fs.PathError{Op: "write", Path: f.name, Err: err}
	}
	if off < 0 {
		return &fs.PathError{Op: "write", Path: f.name, Err: fs.ErrInvalid}
	}
	if f.m.failWrites > 0 {
		f.m.failWrites--
		return &fs.PathError{Op: "write", Path: f.name, Err: ErrInjected}
	}
	return nil
}

func (f *memFile) Write(p []byte) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.startWrite(0); err != nil {
		return 0, err
	}
	n := len(p)
	var err error
	if f.m.capacity > 0 {
		free := f.m.capacity - f.m.usedLocked()
		if free < 0 {
			free = 0
		}
		if int64(n) > free {
			n = int(free)
			err = &fs.PathError{Op: "write", Path: f.name, Err: ErrNoSpace}
		}
	}
	f.nd.data = append(f.nd.data, p[:n]...)
	return n, err
}

// WriteAt implements WriterAt. Below the durable size it overwrites in place (see the
// crash model on Mem); beyond the current size it extends the file, zeros filling any
// gap, and the new bytes are unsynced appended bytes.
func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.startWrite(off); err != nil {
		return 0, err
	}
	nd := f.nd
	n := len(p)
	var err error
	if end := off + int64(n); f.m.capacity > 0 && end > int64(len(nd.data)) {
		// Only growth needs space; write what fits below the capacity.
		limit := int64(len(nd.data)) + max(0, f.m.capacity-f.m.usedLocked())
		if end > limit {
			n = int(max(0, min(int64(n), limit-off)))
			err = &fs.PathError{Op: "write", Path: f.name, Err: ErrNoSpace}
		}
	}
	if n == 0 {
		return 0, err
	}
	lo, hi := int(off), int(off)+n
	// Save the durable bytes of every page this write overwrites in place, once per
	// sync interval. (With base != nil a crash restores base whole, but a failed fsync
	// still needs to know which pages it dropped.)
	dur := nd.durSize()
	for pg := lo / memPage; pg*memPage < min(hi, dur); pg++ {
		if _, ok := nd.old[pg]; ok {
			continue
		}
		if nd.old == nil {
			nd.old = map[int][]byte{}
		}
		if b, ok := nd.lost[pg]; ok {
			// Written again after a failed fsync: dirty once more, and the disk
			// still holds the bytes that fsync dropped.
			nd.old[pg] = b
			delete(nd.lost, pg)
			continue
		}
		s, e := pg*memPage, min((pg+1)*memPage, dur)
		if nd.base != nil {
			nd.old[pg] = append([]byte(nil), nd.base[s:e]...)
		} else {
			nd.old[pg] = append([]byte(nil), nd.data[s:e]...)
		}
	}
	if hi > len(nd.data) {
		nd.data = append(nd.data, make([]byte, hi-len(nd.data))...)
	}
	copy(nd.data[lo:hi], p[:n])
	return n, err
}

func (f *memFile) Sync() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("sync"); err != nil {
		return err
	}
	if err := f.m.mutate(); err != nil {
		return &fs.PathError{Op: "sync", Path: f.name, Err: err}
	}
	nd := f.nd
	if f.m.failSyncs > 0 {
		f.m.failSyncs--
		if len(nd.data) > nd.durLen {
			lo, hi := nd.durLen, len(nd.data)
			if nd.lostHi > nd.lostLo {
				lo, hi = min(lo, nd.lostLo), max(hi, nd.lostHi)
			}
			nd.lostLo, nd.lostHi = lo, hi
		}
		// The overwritten pages are dropped too: the disk keeps their old bytes.
		if nd.lost == nil && len(nd.old) > 0 {
			nd.lost = map[int][]byte{}
		}
		maps.Copy(nd.lost, nd.old)
		nd.old = nil
		return &fs.PathError{Op: "sync", Path: f.name, Err: ErrInjected}
	}
	if nd.lostHi > nd.lostLo || len(nd.lost) > 0 {
		// The pages a failed fsync dropped never reach the disk.
		base := append([]byte(nil), nd.data...)
		for i := nd.lostLo; i < nd.lostHi && i < len(base); i++ {
			base[i] = 0
		}
		for pg, b := range nd.lost {
			if lo := pg * memPage; lo < len(base) {
				copy(base[lo:], b)
			}
		}
		nd.base, nd.durLen = base, len(base)
		nd.lostLo, nd.lostHi = 0, 0
		nd.lost = nil
	} else {
		nd.base, nd.durLen = nil, len(nd.data)
	}
	nd.old = nil
	f.m.syncs++
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("truncate"); err != nil {
		return err
	}
	if !f.rw {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: fs.ErrPermission}
	}
	if err := f.m.mutate(); err != nil {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: err}
	}
	nd := f.nd
	if size < 0 {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: fs.ErrInvalid}
	}
	if int(size) < nd.durLen && nd.base == nil {
		// The durable contents are no longer a prefix of the file. From here on a
		// crash restores exactly them, unsynced overwrites included (as for appends).
		nd.base = nd.durable()
	}
	if int(size) <= len(nd.data) {
		nd.data = nd.data[:size]
	} else {
		nd.data = append(nd.data, make([]byte, int(size)-len(nd.data))...)
	}
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("stat"); err != nil {
		return 0, err
	}
	return int64(len(f.nd.data)), nil
}

func (f *memFile) Close() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	f.closed = true
	return nil
}
