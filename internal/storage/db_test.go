package storage

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// memOpts returns options for an engine on a fresh in-memory disk, with every file
// operation on the caller's goroutine so a seed always replays the same way.
func memOpts(fs vfs.FS) Options {
	return Options{Devices: []Device{{Dir: "/db"}}, FS: fs, SegmentSize: 4 << 10, CacheBytes: -1, Inline: true}
}

func mustOpen(t testing.TB, o Options) *DB {
	t.Helper()
	db, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return db
}

func put(t testing.TB, db *DB, key string, ver uint64, val string) Pos {
	t.Helper()
	p, err := db.Append(Record{Key: []byte(key), Value: []byte(val), Version: ver, Timestamp: int64(ver)})
	if err != nil {
		t.Fatalf("Append(%s@%d): %v", key, ver, err)
	}
	return p
}

func del(t testing.TB, db *DB, key string, ver uint64) {
	t.Helper()
	if _, err := db.Append(Record{Key: []byte(key), Version: ver, Timestamp: int64(ver), Tombstone: true}); err != nil {
		t.Fatalf("delete %s@%d: %v", key, ver, err)
	}
}

func wantGet(t testing.TB, db *DB, key, want string) {
	t.Helper()
	v, err := db.Get([]byte(key))
	if want == "" {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(%s) = %q, %v; want ErrNotFound", key, v.Data, err)
		}
		return
	}
	if err != nil || string(v.Data) != want {
		t.Fatalf("Get(%s) = %q, %v; want %q", key, v.Data, err, want)
	}
}

func TestPutGetDeleteOverwrite(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	defer db.Close()
	put(t, db, "a", 1, "one")
	put(t, db, "b", 2, "two")
	put(t, db, "a", 3, "uno")
	wantGet(t, db, "a", "uno")
	wantGet(t, db, "b", "two")
	wantGet(t, db, "c", "")
	del(t, db, "b", 4)
	wantGet(t, db, "b", "")
	// An empty value is a value, not a deletion.
	put(t, db, "e", 5, "")
	if v, err := db.Get([]byte("e")); err != nil || v.Data == nil || len(v.Data) != 0 || v.Version != 5 {
		t.Fatalf("Get(e) = %+v, %v", v, err)
	}
	if db.LastVersion() != 5 {
		t.Fatalf("LastVersion = %d", db.LastVersion())
	}
}

func TestBadInput(t *testing.T) {
	o := memOpts(vfs.NewMem())
	o.MaxKeySize, o.MaxValueSize = 8, 16
	db := mustOpen(t, o)
	defer db.Close()
	cases := []struct {
		rec  Record
		want error
	}{
		{Record{Key: nil, Version: 1}, ErrEmptyKey},
		{Record{Key: []byte("123456789"), Version: 1}, ErrKeyTooLarge},
		{Record{Key: []byte("k"), Value: make([]byte, 17), Version: 1}, ErrValueTooLarge},
	}
	for _, c := range cases {
		if _, err := db.Append(c.rec); !errors.Is(err, c.want) {
			t.Errorf("Append(%q, %d bytes) = %v, want %v", c.rec.Key, len(c.rec.Value), err, c.want)
		}
	}
	put(t, db, "k", 5, "v5")
	// Versions are strictly increasing per key; a batch with a bad record applies nothing.
	_, err := db.Append(Record{Key: []byte("x"), Version: 9}, Record{Key: []byte("k"), Version: 5})
	if !errors.Is(err, ErrVersionOrder) {
		t.Fatalf("stale version: %v", err)
	}
	_, err = db.Append(Record{Key: []byte("y"), Version: 9}, Record{Key: []byte("y"), Version: 8})
	if !errors.Is(err, ErrVersionOrder) {
		t.Fatalf("decreasing versions within a batch: %v", err)
	}
	wantGet(t, db, "x", "")
	wantGet(t, db, "y", "")
}

func TestReopenRecoversEverythingSynced(t *testing.T) {
	fs := vfs.NewMem()
	db := mustOpen(t, memOpts(fs))
	for i := 0; i < 500; i++ { // spans many 4 KiB segments
		put(t, db, fmt.Sprintf("k%03d", i%100), uint64(i+1), fmt.Sprintf("v%d", i))
	}
	del(t, db, "k007", 1000)
	last := db.LastPos()
	if p, err := db.Sync(last); err != nil || p != last {
		t.Fatalf("Sync = %d, %v; want %d", p, err, last)
	}
	if db.Stats().Segments < 5 {
		t.Fatalf("expected several segments, got %d", db.Stats().Segments)
	}
	fs.Crash(nil)
	db2 := mustOpen(t, memOpts(fs))
	defer db2.Close()
	if db2.LastPos() != last || db2.DurablePos() != last || db2.LastVersion() != 1000 {
		t.Fatalf("reopened at %d/%d v%d, want %d v1000", db2.LastPos(), db2.DurablePos(), db2.LastVersion(), last)
	}
	for k := 0; k < 100; k++ {
		want := fmt.Sprintf("v%d", 400+k)
		if k == 7 {
			want = ""
		}
		wantGet(t, db2, fmt.Sprintf("k%03d", k), want)
	}
	// Appends continue after the recovered position.
	p := put(t, db2, "new", 1001, "x")
	if p <= last {
		t.Fatalf("append after reopen at %d <= %d", p, last)
	}
}

func TestScan(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	defer db.Close()
	for i := 0; i < 300; i++ {
		put(t, db, fmt.Sprintf("k%03d", i), uint64(i+1), fmt.Sprintf("v%d", i))
	}
	snap := db.Snapshot(300)
	defer snap.Close()
	del(t, db, "k005", 400)
	put(t, db, "k006", 401, "new6")
	var got []string
	err := db.Scan([]byte("k003"), []byte("k200"), 0, 5, func(k []byte, v Value) bool {
		got = append(got, string(k)+"="+string(v.Data))
		return true
	})
	want := []string{"k003=v3", "k004=v4", "k006=new6", "k007=v7", "k008=v8"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Scan = %v, %v; want %v", got, err, want)
	}
	// At an older version, the deleted key is there and the overwrite is not.
	got = nil
	snap.Scan([]byte("k004"), []byte("k007"), 0, func(k []byte, v Value) bool {
		got = append(got, string(k)+"="+string(v.Data))
		return true
	})
	want = []string{"k004=v4", "k005=v5", "k006=v6"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Scan at 300 = %v; want %v", got, want)
	}
	// Unbounded scan across many batches sees every live key once, in order.
	n, prev := 0, ""
	db.Scan(nil, nil, 0, 0, func(k []byte, v Value) bool {
		if string(k) <= prev {
			t.Fatalf("out of order: %s after %s", k, prev)
		}
		prev = string(k)
		n++
		return true
	})
	if n != 299 {
		t.Fatalf("full scan saw %d keys, want 299", n)
	}
}

func TestVersionsAndRetention(t *testing.T) {
	o := memOpts(vfs.NewMem())
	o.Retention.KeepVersions = 3
	db := mustOpen(t, o)
	defer db.Close()
	for v := uint64(10); v <= 50; v += 10 {
		put(t, db, "k", v, fmt.Sprintf("v%d", v))
	}
	vs, err := db.Versions([]byte("k"))
	if err != nil || len(vs) != 3 || vs[0].Version != 50 || vs[2].Version != 30 {
		t.Fatalf("Versions = %+v, %v; want 50,40,30", vs, err)
	}
	if v, err := db.GetAt([]byte("k"), 45); err != nil || string(v.Data) != "v40" {
		t.Fatalf("GetAt 45 = %q, %v", v.Data, err)
	}
	if _, err := db.GetAt([]byte("k"), 25); !errors.Is(err, ErrVersionGone) {
		t.Fatalf("GetAt below retention = %v, want ErrVersionGone", err)
	}
	lo, hi, err := db.VersionRange([]byte("k"), 45)
	if err != nil || lo != 40 || hi != 49 {
		t.Fatalf("VersionRange(45) = %d,%d,%v; want 40,49", lo, hi, err)
	}
	lo, hi, _ = db.VersionRange([]byte("k"), 70)
	if lo != 50 || hi != math.MaxUint64 {
		t.Fatalf("VersionRange(70) = %d,%d; want 50,max", lo, hi)
	}
	lo, hi, _ = db.VersionRange([]byte("nokey"), 70)
	if lo != 0 || hi != math.MaxUint64 {
		t.Fatalf("VersionRange(missing) = %d,%d", lo, hi)
	}
}

func TestSnapshotPinsVersions(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem())) // retention: newest only
	defer db.Close()
	put(t, db, "k", 1, "a")
	put(t, db, "other", 2, "o")
	snap := db.Snapshot(0)
	if snap.Version() != 2 {
		t.Fatalf("snapshot at %d", snap.Version())
	}
	put(t, db, "k", 3, "b")
	put(t, db, "k", 4, "c")
	if v, err := snap.Get([]byte("k")); err != nil || string(v.Data) != "a" {
		t.Fatalf("snapshot Get = %q, %v; want a", v.Data, err)
	}
	vs, _ := db.Versions([]byte("k"))
	if len(vs) != 2 || vs[1].Version != 1 { // 3 is garbage: no snapshot reads it
		t.Fatalf("Versions with snapshot = %+v; want [4 1]", vs)
	}
	snap.Close()
	put(t, db, "k", 5, "d")
	if vs, _ := db.Versions([]byte("k")); len(vs) != 1 {
		t.Fatalf("Versions after snapshot closed = %+v; want only 5", vs)
	}
}

func TestGroupCommitSharesFsync(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) { groupCommitSharesFsync(t, inline) })
	}
}

func groupCommitSharesFsync(t *testing.T, inline bool) {
	fs := slowSyncFS{vfs.NewMem()}
	o := memOpts(fs)
	o.SegmentSize = 1 << 20
	o.Inline = inline
	db := mustOpen(t, o)
	defer db.Close()
	const writers, each = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				key := []byte(fmt.Sprintf("w%02d-%03d", w, i))
				p, err := db.Append(Record{Key: key, Value: key, Version: uint64(i + 1)})
				if err == nil {
					var d Pos
					d, err = db.Sync(p)
					if err == nil && d < p {
						err = fmt.Errorf("Sync(%d) returned durable %d", p, d)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := db.Stats()
	if st.Appends != writers*each {
		t.Fatalf("appends = %d", st.Appends)
	}
	t.Logf("%d appends, %d fsyncs, %d writes", st.Appends, st.Syncs, st.Writes)
	// Each writer waits for its own fsync, so without sharing there would be one per append.
	if st.Syncs*4 > st.Appends {
		t.Fatalf("%d fsyncs for %d appends: group commit is not sharing fsyncs", st.Syncs, st.Appends)
	}
	for w := 0; w < writers; w++ {
		k := fmt.Sprintf("w%02d-%03d", w, each-1)
		wantGet(t, db, k, k)
	}
}

// slowSyncFS makes fsync take a millisecond, as on a real disk, so concurrent Syncs overlap.
type slowSyncFS struct{ *vfs.Mem }

type slowSyncFile struct{ vfs.File }

func (f slowSyncFile) Sync() error {
	time.Sleep(time.Millisecond)
	return f.File.Sync()
}

func (fs slowSyncFS) Create(name string) (vfs.File, error) {
	f, err := fs.Mem.Create(name)
	if err != nil {
		return nil, err
	}
	return slowSyncFile{f}, nil
}

func (fs slowSyncFS) OpenRW(name string) (vfs.File, error) {
	f, err := fs.Mem.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return slowSyncFile{f}, nil
}

func TestAppendDoesNotSync(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	// The inline filler's fsyncs (of the next segment's zero-filled file) would count.
	o.mut.fill, o.mut.setFill = seglog.FillOff, true
	db := mustOpen(t, o)
	before := fs.Syncs()
	for i := 0; i < 20; i++ {
		put(t, db, "k", uint64(i+1), "small")
	}
	if fs.Syncs() != before {
		t.Fatalf("Append fsynced (%d -> %d)", before, fs.Syncs())
	}
	if db.DurablePos() == db.LastPos() {
		t.Fatal("DurablePos caught up without a Sync")
	}
	// The unsynced records vanish in a power cut: Append alone is not durable.
	fs.Crash(nil)
	db2 := mustOpen(t, memOpts(fs))
	defer db2.Close()
	wantGet(t, db2, "k", "")
}

func TestFsyncFailureFailsEngine(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) { fsyncFailureFailsEngine(t, inline) })
	}
}

func fsyncFailureFailsEngine(t *testing.T, inline bool) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.Inline = inline
	db := mustOpen(t, o)
	defer db.Close()
	p := put(t, db, "a", 1, "x")
	fs.FailSyncs(1)
	if _, err := db.Sync(p); !errors.Is(err, ErrFailed) {
		t.Fatalf("Sync with failing fsync = %v, want ErrFailed", err)
	}
	// Never retry and pretend: the next Sync must not succeed even though fsync would.
	if _, err := db.Sync(p); !errors.Is(err, ErrFailed) {
		t.Fatalf("second Sync = %v, want ErrFailed", err)
	}
	if _, err := db.Append(Record{Key: []byte("b"), Version: 2}); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after failure = %v, want ErrFailed", err)
	}
	if db.Stats().Failed == nil {
		t.Fatal("Stats.Failed is nil")
	}
	wantGet(t, db, "a", "x") // reads keep working
}

func TestDiskFull(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) { diskFull(t, inline) })
	}
}

func diskFull(t *testing.T, inline bool) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 1 << 20
	o.Inline = inline
	// Appended segments: a write in place over zero-filled blocks needs no space.
	o.mut.fill, o.mut.setFill = seglog.FillOff, true
	db := mustOpen(t, o)
	put(t, db, "ok", 1, "fits")
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	fs.SetCapacity(fs.Used() + 100)
	p := put(t, db, "big", 2, string(make([]byte, 500)))
	if _, err := db.Sync(p); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("Sync on a full disk = %v, want ErrDiskFull", err)
	}
	if errors.Is(db.Stats().Failed, ErrFailed) {
		t.Fatal("disk full failed the engine")
	}
	wantGet(t, db, "big", string(make([]byte, 500))) // still served from memory
	// Space comes back: the same data is written and synced.
	fs.SetCapacity(0)
	if d, err := db.Sync(p); err != nil || d < p {
		t.Fatalf("Sync after freeing space = %d, %v", d, err)
	}
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	defer db2.Close()
	wantGet(t, db2, "ok", "fits")
	wantGet(t, db2, "big", string(make([]byte, 500)))
}

func TestClosed(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	put(t, db, "a", 1, "x")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Append(Record{Key: []byte("b"), Version: 2}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close = %v", err)
	}
	if _, err := db.Get([]byte("a")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close = %v", err)
	}
}

func TestRealFiles(t *testing.T) {
	dir := t.TempDir()
	o := Options{Devices: []Device{{Dir: dir}}, SegmentSize: 8 << 10}
	db := mustOpen(t, o)
	for i := 0; i < 200; i++ {
		put(t, db, fmt.Sprintf("k%d", i), uint64(i+1), fmt.Sprint(i))
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	wantGet(t, db, "k5", "5") // from the file (through the cache)
	wantGet(t, db, "k5", "5") // cache hit
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db2 := mustOpen(t, o)
	defer db2.Close()
	wantGet(t, db2, "k199", "199")
}

// The batch order check skips its per-key look-ups when versions do not fall, start
// above every stored version and never repeat a key within one version; it must never
// accept a batch the full check rejects.
func TestBatchOrderFastPathAgreesWithFullCheck(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	defer db.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	fast, fastShared := 0, 0 // fast-path batches; those with a version shared by two keys
	for i := 0; i < 2000; i++ {
		n := 2 + rng.IntN(12)
		recs := make([]Record, n)
		v := db.LastVersion() - min(db.LastVersion(), uint64(rng.IntN(3))) // sometimes at or below lastV
		for j := range recs {
			v += uint64(rng.IntN(3)) // sometimes equal: not rising
			recs[j] = Record{Key: []byte(fmt.Sprintf("k%d", rng.IntN(6))), Value: []byte("v"), Version: v}
		}
		db.mu.Lock()
		full := db.checkOrderFullLocked(recs)
		got := db.checkOrderLocked(recs)
		if risingAbove(recs, db.lastV) {
			fast++
			for j := 1; j < n; j++ {
				if recs[j].Version == recs[j-1].Version {
					fastShared++
					break
				}
			}
		}
		db.mu.Unlock()
		if (got == nil) != (full == nil) {
			t.Fatalf("batch %d %v: checkOrderLocked = %v, full check = %v", i, recs, got, full)
		}
		if got == nil {
			if _, err := db.Append(recs...); err != nil {
				t.Fatalf("Append of a checked batch: %v", err)
			}
		}
	}
	if fast < 100 || fastShared < 20 {
		t.Fatalf("only %d batches took the fast path, %d with a shared version: the test does not exercise it", fast, fastShared)
	}
}

// An engine opened with NoZeroFill never writes a zero-filled file: every segment is
// appended to, so no segment holds more bytes than its records. A directory moves
// between the two modes in both directions without losing a record.
func TestNoZeroFillAppendsSegments(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.Inline = false // the background filler is the one that must stay idle
	o.SegmentSize = 16 << 10
	o.NoZeroFill = true
	ver := uint64(0)
	from := uint64(0) // segments from this id on were created with NoZeroFill
	noZeros := func(db *DB) {
		t.Helper()
		names, err := fs.ReadDir("/db")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if n == zeroName {
				t.Fatalf("%s exists with NoZeroFill (after version %d)", zeroName, ver)
			}
		}
		// A background seal installs segments under mu while writes go on.
		db.mu.RLock()
		defer db.mu.RUnlock()
		for _, s := range db.segs {
			size, err := fs.Stat(s.path)
			if err != nil {
				t.Fatal(err)
			}
			if end := int64(uint64(db.next) - s.id); s.id >= from && s == db.segs[len(db.segs)-1] && size > end {
				t.Fatalf("active segment %s is %d bytes on disk, %d written: zero-filled", s.path, size, end)
			}
		}
	}
	db := mustOpen(t, o)
	write := func(db *DB, n int) {
		for i := 0; i < n; i++ {
			ver++
			put(t, db, fmt.Sprintf("k%d", ver%50), ver, strings.Repeat("v", 100))
			if o.NoZeroFill && ver%37 == 0 {
				noZeros(db)
			}
		}
		if _, err := db.Sync(db.LastPos()); err != nil {
			t.Fatal(err)
		}
	}
	write(db, 1000) // several segments (about seven)
	db.mu.RLock()
	segs := len(db.segs)
	db.mu.RUnlock()
	if segs < 2 { // a background seal running late lets a segment grow
		t.Fatalf("only %d segments: the test does not roll", segs)
	}
	noZeros(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for _, nz := range []bool{false, true} { // zero-filled, then appended again
		o.NoZeroFill = nz
		db = mustOpen(t, o)
		from = db.segs[len(db.segs)-1].id + 1 // the active one may have been zero-filled
		wantGet(t, db, fmt.Sprintf("k%d", ver%50), strings.Repeat("v", 100))
		write(db, 300)
		if nz {
			noZeros(db)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	db = mustOpen(t, o)
	defer db.Close()
	for k := uint64(0); k < 50; k++ {
		wantGet(t, db, fmt.Sprintf("k%d", k), strings.Repeat("v", 100))
	}
}
