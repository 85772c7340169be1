package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"testing"
)

func mustWriteAt(t *testing.T, f File, p []byte, off int64) {
	t.Helper()
	w, ok := f.(WriterAt)
	if !ok {
		t.Fatalf("%T does not implement WriterAt", f)
	}
	if n, err := w.WriteAt(p, off); err != nil || n != len(p) {
		t.Fatalf("WriteAt(%d bytes, %d): n=%d err=%v", len(p), off, n, err)
	}
}

// Both implementations overwrite in place, extend with a zero-filled hole past the end,
// and keep Write appending at the end whatever WriteAt and Truncate did before.
func TestWriteAtContract(t *testing.T) {
	forBothFS(t, func(t *testing.T, fsys FS, dir string) {
		name := Join(dir, "f")
		if err := fsys.MkdirAll(dir); err != nil {
			t.Fatal(err)
		}
		f, err := fsys.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, f, "0123456789")
		mustWriteAt(t, f, []byte("ab"), 2)
		if got := readAll(t, fsys, name); got != "01ab456789" {
			t.Fatalf("after overwrite = %q", got)
		}
		mustWriteAt(t, f, []byte("XY"), 12) // past the end: bytes 10 and 11 are a hole
		if got := readAll(t, fsys, name); got != "01ab456789\x00\x00XY" {
			t.Fatalf("after extending WriteAt = %q", got)
		}
		mustWrite(t, f, "!") // appends at the end, not at the file offset
		if got := readAll(t, fsys, name); got != "01ab456789\x00\x00XY!" {
			t.Fatalf("append after WriteAt = %q", got)
		}
		if err := f.Truncate(4); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, f, "z")
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, fsys, name); got != "01abz" {
			t.Fatalf("after truncate and append = %q", got)
		}
		rw, err := fsys.OpenRW(name)
		if err != nil {
			t.Fatal(err)
		}
		mustWriteAt(t, rw, []byte("Q"), 0)
		if _, err := rw.(WriterAt).WriteAt([]byte("x"), -1); err == nil {
			t.Fatal("WriteAt at a negative offset succeeded")
		}
		mustWrite(t, rw, "?")
		rw.Close()
		if got := readAll(t, fsys, name); got != "Q1abz?" {
			t.Fatalf("after OpenRW WriteAt and append = %q", got)
		}
		ro, err := fsys.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		w, ok := ro.(WriterAt)
		if !ok {
			t.Fatalf("read-only %T does not implement WriterAt", ro)
		}
		if _, err := w.WriteAt([]byte("x"), 0); err == nil {
			t.Fatal("WriteAt on a read-only file succeeded")
		}
	})
}

// pageOf returns a page-sized run of b.
func pageOf(b byte) []byte { return bytes.Repeat([]byte{b}, memPage) }

// syncedFile creates /d/f holding contents, synced and named durably.
func syncedFile(t *testing.T, m *Mem, contents []byte) File {
	t.Helper()
	if err := m.MkdirAll("/d"); err != nil {
		t.Fatal(err)
	}
	f, err := m.Create("/d/f")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.Write(contents); err != nil || n != len(contents) {
		t.Fatalf("write: n=%d err=%v", n, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/d"); err != nil {
		t.Fatal(err)
	}
	return f
}

// An overwrite followed by a successful Sync survives every crash.
func TestWriteAtSurvivesCrashAfterSync(t *testing.T) {
	for seed := int64(0); seed < 20; seed++ {
		m := NewMem()
		f := syncedFile(t, m, bytes.Repeat([]byte{'o'}, 3*memPage))
		mustWriteAt(t, f, bytes.Repeat([]byte{'N'}, memPage+1000), 2000)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		want := readAll(t, m, "/d/f")
		m.Crash(rand.New(rand.NewSource(seed)))
		if got := readAll(t, m, "/d/f"); got != want {
			t.Fatalf("seed %d: synced overwrite lost after crash", seed)
		}
	}
}

// overwriteOutcomes is the specification of an unsynced overwrite, checked over seeds:
// after a crash the file has its old size; each 512-byte sector the write touched holds
// its old or its new bytes and nothing else; every byte the write did not touch holds
// its durable value; the same seed gives the same disk; and over the seeds a page is
// seen old, new and torn (so the check can fail). It returns the first violation.
// keep switches on the mutation that keeps every unsynced overwrite.
func overwriteOutcomes(seeds int64, keep bool) error {
	const size = 4 * memPage
	// Page 0 untouched, page 1 fully overwritten, page 2 overwritten in its first 1000
	// bytes, page 3 untouched.
	lo, hi := memPage, 2*memPage+1000
	old := make([]byte, size)
	for i := range old {
		old[i] = byte('a' + i/memPage)
	}
	run := func(seed int64) ([]byte, error) {
		m := NewMem()
		m.keepOverwrites = keep
		if err := m.MkdirAll("/d"); err != nil {
			return nil, err
		}
		f, err := m.Create("/d/f")
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(old); err != nil {
			return nil, err
		}
		if err := f.Sync(); err != nil {
			return nil, err
		}
		if err := m.SyncDir("/d"); err != nil {
			return nil, err
		}
		if _, err := f.(WriterAt).WriteAt(bytes.Repeat([]byte{'N'}, hi-lo), int64(lo)); err != nil {
			return nil, err
		}
		m.Crash(rand.New(rand.NewSource(seed)))
		g, err := m.Open("/d/f")
		if err != nil {
			return nil, err
		}
		n, err := g.Size()
		if err != nil {
			return nil, err
		}
		got := make([]byte, n)
		if _, err := g.ReadAt(got, 0); err != nil {
			return nil, err
		}
		return got, nil
	}
	var sawOld, sawNew, sawTorn bool
	for seed := int64(0); seed < seeds; seed++ {
		got, err := run(seed)
		if err != nil {
			return err
		}
		again, err := run(seed)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, again) {
			return fmt.Errorf("seed %d: not deterministic", seed)
		}
		if len(got) != size {
			return fmt.Errorf("seed %d: size %d after crash, want %d", seed, len(got), size)
		}
		for i := range got {
			if (i < lo || i >= hi) && got[i] != old[i] {
				return fmt.Errorf("seed %d: byte %d, never overwritten, is %q, want %q", seed, i, got[i], old[i])
			}
		}
		for s := lo; s < hi; s += memSector {
			e := min(s+memSector, hi)
			if !bytes.Equal(got[s:e], old[s:e]) && !bytes.Equal(got[s:e], bytes.Repeat([]byte{'N'}, e-s)) {
				return fmt.Errorf("seed %d: sector at %d is neither old nor new: %q", seed, s, got[s:e])
			}
		}
		page := got[memPage : 2*memPage] // the fully overwritten page
		switch {
		case bytes.Equal(page, old[memPage:2*memPage]):
			sawOld = true
		case bytes.Equal(page, pageOf('N')):
			sawNew = true
		default:
			sawTorn = true
		}
	}
	if !sawOld || !sawNew || !sawTorn {
		return fmt.Errorf("%d seeds: page seen old %v, new %v, torn %v; want all three", seeds, sawOld, sawNew, sawTorn)
	}
	return nil
}

// Before Sync, a crash leaves each overwritten page old, new, or torn at sector
// boundaries, and nothing else.
func TestWriteAtCrashBeforeSyncOldOrNew(t *testing.T) {
	if err := overwriteOutcomes(200, false); err != nil {
		t.Fatal(err)
	}
}

// The check above catches a model that never loses an unsynced overwrite.
func TestMutationMemKeepsUnsyncedOverwrites(t *testing.T) {
	if err := overwriteOutcomes(200, true); err == nil {
		t.Fatal("a Mem that keeps every unsynced overwrite passed the crash specification")
	}
}

// The zero-filled log of docs/design/zero-filled-logs.md: a record written into a
// synced run of zeros reverts to zeros or keeps its bytes page by page, so a zero page
// may sit before a page that kept its data (recovery must not stop at the first zero).
func TestWriteAtZeroFilledRegion(t *testing.T) {
	rec := bytes.Repeat([]byte{'R'}, 5000) // spans pages 0 and 1
	const off = 100
	var zeroThenData bool
	for seed := int64(0); seed < 200; seed++ {
		m := NewMem()
		f := syncedFile(t, m, make([]byte, 3*memPage))
		mustWriteAt(t, f, rec, off)
		m.Crash(rand.New(rand.NewSource(seed)))
		got := []byte(readAll(t, m, "/d/f"))
		if len(got) != 3*memPage {
			t.Fatalf("seed %d: size %d, want %d", seed, len(got), 3*memPage)
		}
		for i, b := range got {
			in := i >= off && i < off+len(rec)
			if b != 0 && !(in && b == 'R') {
				t.Fatalf("seed %d: byte %d = %q, want zero or the record's", seed, i, b)
			}
		}
		if got[off] == 0 && got[memPage] == 'R' {
			zeroThenData = true
		}
	}
	if !zeroThenData {
		t.Fatal("200 seeds never left a zero page before a page that kept the record")
	}
}

// A failed fsync drops the overwritten pages, as Linux does (the pages are marked
// clean): a later successful fsync does not write them, so a crash brings back the old
// bytes. Writing the page again after the failure makes it dirty, and durable at the
// next successful sync.
func TestWriteAtFailedSyncLosesPages(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		m := NewMem()
		f := syncedFile(t, m, pageOf('o'))
		mustWriteAt(t, f, []byte("new"), 10)
		m.FailSyncs(1)
		if err := f.Sync(); err == nil {
			t.Fatal("injected sync failure did not fail")
		}
		if rewrite {
			mustWriteAt(t, f, []byte("NEW"), 10)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		m.Crash(rand.New(rand.NewSource(1)))
		got := readAll(t, m, "/d/f")
		want := "ooo"
		if rewrite {
			want = "NEW"
		}
		if got[10:13] != want || len(got) != memPage {
			t.Fatalf("rewrite=%v: bytes 10..13 = %q (size %d), want %q", rewrite, got[10:13], len(got), want)
		}
	}
}

// Writing past the end extends the file like an append: unsynced, a crash keeps a
// prefix of the extension (zeros of the hole, then the data) and never touches the
// durable bytes; synced, it all survives.
func TestWriteAtExtendsLikeAppend(t *testing.T) {
	full := "AAAA\x00\x00\x00\x00BBBBBBBBBBBBBBBB"
	for seed := int64(0); seed < 50; seed++ {
		m := NewMem()
		f := syncedFile(t, m, []byte("AAAA"))
		mustWriteAt(t, f, []byte("BBBBBBBBBBBBBBBB"), 8)
		if got := readAll(t, m, "/d/f"); got != full {
			t.Fatalf("before crash = %q", got)
		}
		m.Crash(rand.New(rand.NewSource(seed)))
		got := readAll(t, m, "/d/f")
		if len(got) < 4 || got[:4] != "AAAA" || len(got) > len(full) {
			t.Fatalf("seed %d: durable bytes damaged or file grew: %q", seed, got)
		}
	}
	m := NewMem()
	f := syncedFile(t, m, []byte("AAAA"))
	mustWriteAt(t, f, []byte("BBBBBBBBBBBBBBBB"), 8)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	m.Crash(rand.New(rand.NewSource(1)))
	if got := readAll(t, m, "/d/f"); got != full {
		t.Fatalf("synced extension after crash = %q", got)
	}
}

// Overwrites and appends since the last sync on one file: the durable prefix outside
// the overwritten page is intact, the page is old, new or torn, and the appended tail
// is a prefix of what was appended (possibly with the existing torn-tail garbage).
func TestWriteAtWithAppendsCrash(t *testing.T) {
	old := append(pageOf('a'), pageOf('b')...)
	for seed := int64(0); seed < 50; seed++ {
		m := NewMem()
		f := syncedFile(t, m, old)
		mustWriteAt(t, f, pageOf('N'), memPage)
		mustWrite(t, f, "tail-tail-tail-tail-tail")
		m.Crash(rand.New(rand.NewSource(seed)))
		got := []byte(readAll(t, m, "/d/f"))
		if len(got) < len(old) || len(got) > len(old)+24 {
			t.Fatalf("seed %d: size %d", seed, len(got))
		}
		if !bytes.Equal(got[:memPage], pageOf('a')) {
			t.Fatalf("seed %d: untouched page changed", seed)
		}
		for s := memPage; s < 2*memPage; s += memSector {
			sec := got[s : s+memSector]
			if !bytes.Equal(sec, old[s:s+memSector]) && !bytes.Equal(sec, pageOf('N')[:memSector]) {
				t.Fatalf("seed %d: sector at %d neither old nor new", seed, s)
			}
		}
	}
}

// Truncating below the durable size makes a crash restore exactly the durable contents
// (the existing rule), unsynced overwrites included.
func TestWriteAtThenTruncateBelowDurable(t *testing.T) {
	for seed := int64(0); seed < 20; seed++ {
		m := NewMem()
		old := append(pageOf('a'), pageOf('b')...)
		f := syncedFile(t, m, old)
		mustWriteAt(t, f, pageOf('N'), 0)
		if err := f.Truncate(100); err != nil {
			t.Fatal(err)
		}
		m.Crash(rand.New(rand.NewSource(seed)))
		if got := readAll(t, m, "/d/f"); got != string(old) {
			t.Fatalf("seed %d: after crash the file is not its durable contents (size %d)", seed, len(got))
		}
	}
}

// WriteAt shares Write's fault injection: a failed write writes nothing, a full disk
// writes what fits (growth only: overwriting in place needs no space), a power cut
// stops it.
func TestWriteAtFaults(t *testing.T) {
	m := NewMem()
	f := syncedFile(t, m, []byte("12345678"))
	w := f.(WriterAt)
	m.FailWrites(1)
	if n, err := w.WriteAt([]byte("x"), 0); n != 0 || !errors.Is(err, ErrInjected) {
		t.Fatalf("injected failure: n=%d err=%v", n, err)
	}
	m.SetCapacity(10)
	if n, err := w.WriteAt([]byte("abcd"), 0); n != 4 || err != nil {
		t.Fatalf("overwrite on a nearly full disk: n=%d err=%v", n, err)
	}
	if n, err := w.WriteAt([]byte("wxyz"), 6); n != 4 || err != nil {
		// Bytes 6..9 fit (8 used + 2 free), so all four land.
		t.Fatalf("write ending at capacity: n=%d err=%v", n, err)
	}
	if n, err := w.WriteAt([]byte("ZZ"), 9); n != 1 || !IsNoSpace(err) {
		t.Fatalf("write past capacity: n=%d err=%v", n, err)
	}
	if got := readAll(t, m, "/d/f"); got != "abcd56wxyZ" {
		t.Fatalf("contents = %q", got)
	}
	m.CrashAfter(0)
	if _, err := w.WriteAt([]byte("x"), 0); !errors.Is(err, ErrPoweredOff) {
		t.Fatalf("WriteAt after power cut: %v", err)
	}
}

// The OS positional-write descriptor reaches the file the handle has open, even after
// a rename (it is opened through /proc/self/fd on Linux), and Write keeps appending
// with O_APPEND next to it.
func TestOSWriteAtAfterRename(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("by-name reopen elsewhere")
	}
	dir := t.TempDir()
	f, err := Default.Create(Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWrite(t, f, "0123")
	if err := Default.Rename(Join(dir, "a"), Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	mustWriteAt(t, f, []byte("X"), 1)
	mustWrite(t, f, "4")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, Default, Join(dir, "b")); got != "0X234" {
		t.Fatalf("renamed file = %q, want %q", got, "0X234")
	}
}
