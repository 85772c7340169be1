package vfs

import (
	"fmt"
	"time"
)

// SlowSync wraps fs so that every File.Sync, after the real one returns,
// sleeps extra more: a slower disk than this machine's, for benchmarks
// (kefir server --fsync-extra-delay; e.g. the SSDs of the CAD paper). The real
// fsync happens first, so nothing is reported durable that is not; the data
// is only reported durable later, as on the slower disk. Writes, reads and
// directory syncs are not slowed. extra <= 0 returns fs unchanged.
//
// The emulation lives here, at the disk, and not in a hook of the code that
// syncs: every log and file above the FS sees the same slower disk, and no
// measuring hook carries a sleep. SyncTimed still reports the real fsync's
// duration (the fsync histogram measures this machine's disk), then sleeps.
//
// It sleeps on the wall clock, so it is for real runs only: the simulator's
// disks (Mem without a wrapper) read no clock.
func SlowSync(fs FS, extra time.Duration) FS {
	if extra <= 0 {
		return fs
	}
	return slowFS{FS: fs, extra: extra}
}

type slowFS struct {
	FS
	extra time.Duration
}

func (s slowFS) Create(name string) (File, error) { return s.wrap(s.FS.Create(name)) }
func (s slowFS) Open(name string) (File, error)   { return s.wrap(s.FS.Open(name)) }
func (s slowFS) OpenRW(name string) (File, error) { return s.wrap(s.FS.OpenRW(name)) }

func (s slowFS) wrap(f File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	sf := &slowFile{File: f, extra: s.extra}
	// Keep the optional interfaces callers type-assert, exactly those the
	// file has, for the combinations the file systems here produce (OS on
	// Linux: all three; OS elsewhere: positional writes and preallocation;
	// Mem: positional writes).
	wa, w := f.(WriterAt)
	pa, p := f.(Preallocator)
	ma, m := f.(Mapper)
	switch {
	case w && p && m:
		return slowFileWPM{sf, wa, pa, ma}, nil
	case w && p:
		return slowFileWP{sf, wa, pa}, nil
	case w && !m:
		return slowFileW{sf, wa}, nil
	case !w && !p && !m:
		return sf, nil
	}
	return nil, fmt.Errorf("vfs: SlowSync cannot wrap %T (writer-at %v, preallocator %v, mapper %v)", f, w, p, m)
}

// slowFile is a file of a SlowSync FS; the slowFile* types add the optional
// interfaces of the file it wraps.
type slowFile struct {
	File
	extra time.Duration
}

type slowFileW struct {
	*slowFile
	WriterAt
}

type slowFileWP struct {
	*slowFile
	WriterAt
	Preallocator
}

type slowFileWPM struct {
	*slowFile
	WriterAt
	Preallocator
	Mapper
}

// Sync is the real fsync, then the emulated disk's extra time.
func (f *slowFile) Sync() error {
	err := f.File.Sync()
	time.Sleep(f.extra)
	return err
}

// slowOf returns f's slowFile if f is a SlowSync file, else nil. A switch on
// the concrete types, not an interface assertion, so the fsync path of every
// other file pays a few type-word compares and no itab lookup.
func slowOf(f File) *slowFile {
	switch s := f.(type) {
	case *slowFile:
		return s
	case slowFileW:
		return s.slowFile
	case slowFileWP:
		return s.slowFile
	case slowFileWPM:
		return s.slowFile
	}
	return nil
}

// syncTimed is SyncTimed for a slowed file: onSync hears the real fsync's
// duration, and the sleep follows it, before the caller learns the sync is done.
func (f *slowFile) syncTimed(onSync func(time.Duration)) error {
	start := time.Now()
	err := f.File.Sync()
	onSync(time.Since(start))
	time.Sleep(f.extra)
	return err
}
