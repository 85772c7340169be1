package vfs

import (
	"errors"
	"io"
	"io/fs"
	"math/rand"
	"syscall"
	"testing"
)

func mustWrite(t *testing.T, f File, s string) {
	t.Helper()
	if n, err := f.Write([]byte(s)); err != nil || n != len(s) {
		t.Fatalf("write %q: n=%d err=%v", s, n, err)
	}
}

func readAll(t *testing.T, fsys FS, name string) string {
	t.Helper()
	f, err := fsys.Open(name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return string(buf)
}

// forBothFS runs a contract test against the real file system (in a temporary
// directory), against Mem, and against RAM.
func forBothFS(t *testing.T, test func(t *testing.T, fsys FS, dir string)) {
	t.Run("os", func(t *testing.T) { test(t, Default, t.TempDir()) })
	t.Run("mem", func(t *testing.T) { test(t, NewMem(), "/data") })
	t.Run("ram", func(t *testing.T) { test(t, NewRAM(), "/data") })
}

// Both implementations satisfy the same contract.
func TestFSContract(t *testing.T) {
	forBothFS(t, func(t *testing.T, fsys FS, dir string) {
		if err := fsys.MkdirAll(Join(dir, "sub")); err != nil {
			t.Fatal(err)
		}
		f, err := fsys.Create(Join(dir, "a"))
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, f, "hello ")
		mustWrite(t, f, "world")
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := f.ReadAt(buf, 6); err != nil || string(buf) != "world" {
			t.Fatalf("ReadAt = %q, %v", buf, err)
		}
		if _, err := f.ReadAt(buf, 8); !errors.Is(err, io.EOF) {
			t.Fatalf("short ReadAt err = %v, want EOF", err)
		}
		if err := f.Truncate(5); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, f, "!") // appends at the new end
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, fsys, Join(dir, "a")); got != "hello!" {
			t.Fatalf("contents = %q", got)
		}
		if size, err := fsys.Stat(Join(dir, "a")); err != nil || size != 6 {
			t.Fatalf("Stat = %d, %v", size, err)
		}
		rw, err := fsys.OpenRW(Join(dir, "a"))
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, rw, "?")
		rw.Close()
		if got := readAll(t, fsys, Join(dir, "a")); got != "hello!?" {
			t.Fatalf("contents after OpenRW append = %q", got)
		}
		if err := fsys.Rename(Join(dir, "a"), Join(dir, "b")); err != nil {
			t.Fatal(err)
		}
		if err := fsys.SyncDir(dir); err != nil {
			t.Fatal(err)
		}
		names, err := fsys.ReadDir(dir)
		if err != nil || len(names) != 2 || names[0] != "b" || names[1] != "sub" {
			t.Fatalf("ReadDir = %v, %v", names, err)
		}
		if _, err := fsys.Open(Join(dir, "a")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("open renamed-away file: %v", err)
		}
		if err := fsys.Remove(Join(dir, "b")); err != nil {
			t.Fatal(err)
		}
		if _, err := fsys.Stat(Join(dir, "b")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("stat removed: %v", err)
		}
	})
}

func TestCrashDropsUnsyncedBytes(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	f, _ := m.Create("/d/f")
	mustWrite(t, f, "durable")
	f.Sync()
	m.SyncDir("/d")
	mustWrite(t, f, "-lost")
	m.Crash(nil)
	if got := readAll(t, m, "/d/f"); got != "durable" {
		t.Fatalf("after crash = %q, want %q", got, "durable")
	}
	if _, err := f.Write([]byte("x")); !errors.Is(err, ErrStaleHandle) {
		t.Fatalf("old handle write err = %v, want ErrStaleHandle", err)
	}
}

func TestCrashDropsUnsyncedNames(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	g, _ := m.Create("/d/kept")
	g.Sync()
	m.SyncDir("/d")
	f, _ := m.Create("/d/synced-data-only")
	mustWrite(t, f, "x")
	f.Sync()                          // contents synced, directory not: the name is lost
	m.Rename("/d/kept", "/d/renamed") // not synced: reverts
	m.Crash(nil)
	names, _ := m.ReadDir("/d")
	if len(names) != 1 || names[0] != "kept" {
		t.Fatalf("after crash names = %v, want [kept]", names)
	}
	// And the check can fail: with the dir synced the name survives.
	m2 := NewMem()
	m2.MkdirAll("/d")
	h, _ := m2.Create("/d/x")
	h.Sync()
	m2.SyncDir("/d")
	m2.Crash(nil)
	if names, _ := m2.ReadDir("/d"); len(names) != 1 {
		t.Fatalf("synced name lost: %v", names)
	}
}

func TestCrashTearIsSeededPrefix(t *testing.T) {
	run := func(seed int64) string {
		m := NewMem()
		m.MkdirAll("/d")
		f, _ := m.Create("/d/f")
		mustWrite(t, f, "AAAA")
		f.Sync()
		m.SyncDir("/d")
		mustWrite(t, f, "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB")
		m.Crash(rand.New(rand.NewSource(seed)))
		return readAll(t, m, "/d/f")
	}
	sawTear, sawPartial := false, false
	for seed := int64(0); seed < 50; seed++ {
		got := run(seed)
		if got != run(seed) {
			t.Fatalf("seed %d not deterministic", seed)
		}
		if len(got) < 4 || got[:4] != "AAAA" || len(got) > 36 {
			t.Fatalf("seed %d: durable prefix damaged: %q", seed, got)
		}
		tail := got[4:]
		if tail != "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"[:len(tail)] {
			sawTear = true
		}
		if len(tail) > 0 && len(tail) < 32 {
			sawPartial = true
		}
	}
	if !sawTear || !sawPartial {
		t.Fatalf("50 seeds never tore (%v) or kept a partial tail (%v)", sawTear, sawPartial)
	}
}

func TestFailedSyncLosesPages(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	f, _ := m.Create("/d/f")
	mustWrite(t, f, "ok")
	f.Sync()
	m.SyncDir("/d")
	mustWrite(t, f, "XY")
	m.FailSyncs(1)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("sync err = %v, want EIO", err)
	}
	// A retry "succeeds" but the pages were already dropped: fsyncgate.
	mustWrite(t, f, "Z")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	m.Crash(nil)
	if got := readAll(t, m, "/d/f"); got != "ok\x00\x00Z" {
		t.Fatalf("after crash = %q, want %q", got, "ok\x00\x00Z")
	}
}

func TestDiskFull(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	m.SetCapacity(10)
	f, _ := m.Create("/d/f")
	mustWrite(t, f, "12345678")
	n, err := f.Write([]byte("abcd"))
	if n != 2 || !errors.Is(err, syscall.ENOSPC) || !IsNoSpace(err) {
		t.Fatalf("write over capacity: n=%d err=%v", n, err)
	}
	f.Truncate(4)
	if _, err := f.Write([]byte("abcd")); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
	if IsNoSpace(syscall.EIO) {
		t.Fatal("IsNoSpace(EIO) = true")
	}
}

func TestCrashAfterOps(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	f, _ := m.Create("/d/f") // op 1
	m.CrashAfter(2)
	mustWrite(t, f, "a") // op 2 of the budget... 1
	if err := f.Sync(); err != nil {
		t.Fatal(err) // 2
	}
	if _, err := f.Write([]byte("b")); !errors.Is(err, ErrPoweredOff) {
		t.Fatalf("write after power cut: %v", err)
	}
	if !m.PoweredOff() {
		t.Fatal("PoweredOff = false")
	}
	if _, err := m.Open("/d/f"); !errors.Is(err, ErrPoweredOff) {
		t.Fatalf("open after power cut: %v", err)
	}
	m.Crash(nil)
	// The file's name was never synced, so it is gone.
	if _, err := m.Stat("/d/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after crash: %v", err)
	}
}

// WriteFileDurably leaves the whole file after a power cut, and nothing of
// its temporary file; a plain write and rename (no syncs) loses it.
func TestWriteFileDurablySurvivesAPowerCut(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("/d"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileDurably(m, "/d", "/d/id.json", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	// The unsynced way, for contrast: nothing of it is durable.
	f, err := m.Create("/d/plain.tmp")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "x")
	f.Close()
	if err := m.Rename("/d/plain.tmp", "/d/plain"); err != nil {
		t.Fatal(err)
	}
	m.Crash(nil)
	if got := readAll(t, m, "/d/id.json"); got != `{"a":1}` {
		t.Fatalf("after a power cut: %q", got)
	}
	names, _ := m.ReadDir("/d")
	if len(names) != 1 || names[0] != "id.json" {
		t.Fatalf("files after the power cut: %v, want [id.json]", names)
	}
}
