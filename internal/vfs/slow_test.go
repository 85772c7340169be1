package vfs

import (
	"path/filepath"
	"testing"
	"time"
)

// SlowSync slows File.Sync by the extra delay and nothing else: writes,
// reads, directory syncs and renames take the wrapped disk's time; a failing
// fsync still fails (after the delay); SyncTimed's hook hears the real
// fsync's duration, not the emulated one; the optional interfaces callers
// type-assert survive the wrapping, exactly as the wrapped file has them.
func TestSlowSyncDelaysOnlyFsync(t *testing.T) {
	const extra = 60 * time.Millisecond
	elapsed := func(f func() error) time.Duration {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if fs := SlowSync(Default, 0); fs != Default {
		t.Fatalf("SlowSync(fs, 0) = %T, want fs itself", fs)
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		fs   FS
		dir  string
	}{{"os", Default, dir}, {"mem", NewMem(), "d"}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := SlowSync(tc.fs, extra)
			name := filepath.Join(tc.dir, "f")
			if err := fs.MkdirAll(tc.dir); err != nil {
				t.Fatal(err)
			}
			f, err := fs.Create(name)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			// Fast operations: each well under the delay (the fastest of a
			// few, so one stall of a loaded machine does not decide).
			fastest := time.Hour
			for range 3 {
				fastest = min(fastest, elapsed(func() error { _, err := f.Write([]byte("x")); return err }))
				fastest = min(fastest, elapsed(func() error { return fs.SyncDir(tc.dir) }))
				fastest = min(fastest, elapsed(func() error { _, err := f.ReadAt(make([]byte, 1), 0); return err }))
			}
			if fastest >= extra {
				t.Errorf("a write, read or directory sync took %v: only fsync is slowed", fastest)
			}
			if d := elapsed(f.Sync); d < extra {
				t.Errorf("Sync took %v, want at least the emulated %v", d, extra)
			}
			var heard time.Duration
			if d := elapsed(func() error { return SyncTimed(f, func(d time.Duration) { heard = d }) }); d < extra {
				t.Errorf("SyncTimed took %v, want at least the emulated %v", d, extra)
			}
			if heard >= extra {
				t.Errorf("SyncTimed's hook heard %v: the emulated delay, not the real fsync", heard)
			}
			g, err := fs.OpenRW(name)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if d := elapsed(g.Sync); d < extra {
				t.Errorf("Sync of a reopened file took %v, want at least %v", d, extra)
			}
			// The optional interfaces: as the wrapped file has them.
			raw, err := tc.fs.Open(name)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			_, rw := raw.(WriterAt)
			_, rp := raw.(Preallocator)
			_, rm := raw.(Mapper)
			_, sw := g.(WriterAt)
			_, sp := g.(Preallocator)
			_, sm := g.(Mapper)
			if rw != sw || rp != sp || rm != sm {
				t.Errorf("optional interfaces (writer-at, preallocator, mapper): wrapped %v %v %v, slowed %v %v %v", rw, rp, rm, sw, sp, sm)
			}
		})
	}
	// A failing fsync fails through the wrapper too.
	m := NewMem()
	fs := SlowSync(m, time.Millisecond)
	f, err := fs.Create("g")
	if err != nil {
		t.Fatal(err)
	}
	m.FailSyncs(1)
	if err := f.Sync(); err == nil {
		t.Errorf("Sync after FailSyncs(1) = %v, want the disk's error", err)
	}
}
