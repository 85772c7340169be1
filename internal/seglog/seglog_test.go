package seglog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"math/rand"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/seglog/seglogtest"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Tests of the mechanism the two logs share. The logs' own power-cut and corruption
// tests (internal/storage crash_test.go, zero_test.go; internal/vrshard wal_test.go,
// wal_zero_test.go) run it end to end on vfs.Mem.

const zeroName = "zero" + TmpSuffix

func newMem(t *testing.T) *vfs.Mem {
	t.Helper()
	mem := vfs.NewMem()
	if err := mem.MkdirAll("/db"); err != nil {
		t.Fatal(err)
	}
	return mem
}

// Close stops the filler and must leave no fill behind: a fill that starts after it
// returned would create the next segment's file under whatever log opens the
// directory next, and remove it by name when its stopped fill fails (the scenario of
// TestRemoveLeftoverVanished, in production: Close with writes in flight, then Open).
// Here close runs in the window between a request's claim and the start of its
// goroutine. (Moved from internal/storage; the replication log's copy of the filler
// had neither this fix nor the test.)
func TestFillerCloseWaitsForAClaimedFill(t *testing.T) {
	mem := newMem(t)
	f := NewFiller(mem, zeroName, FillAsync)
	closed := make(chan struct{})
	early := false
	f.AfterClaim = func() {
		go func() { f.Close(); close(closed) }()
		select {
		case <-closed:
			early = true
		case <-time.After(100 * time.Millisecond):
			// close waits for the claimed fill (it cannot start until this returns).
		}
	}
	ops := mem.Ops()
	f.Request("/db", 64<<10)
	seglogtest.WaitOrFail(t, closed, "close")
	if n := mem.Ops() - ops; n != 0 {
		t.Fatalf("a fill claimed before close made %d file operations, want none", n)
	}
	if early {
		t.Fatal("close returned while a claimed fill had not started")
	}
	if !f.Idle() {
		t.Fatal("a fill is still running after close returned")
	}
	if _, err := mem.Stat("/db/" + zeroName); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the stopped fill's file after close: %v, want none", err)
	}
	// A request after close claims nothing.
	f.AfterClaim = func() { t.Fatal("a request after close claimed a fill") }
	f.Request("/db", 64<<10)
}

// noWriteAtFS hides vfs.WriterAt from its files: a file system that cannot overwrite
// in place.
type noWriteAtFS struct{ *vfs.Mem }

type plainFile struct{ vfs.File }

func (n noWriteAtFS) Create(name string) (vfs.File, error) {
	f, err := n.Mem.Create(name)
	if err != nil {
		return nil, err
	}
	return plainFile{f}, nil
}

func (n noWriteAtFS) OpenRW(name string) (vfs.File, error) {
	f, err := n.Mem.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return plainFile{f}, nil
}

// A filler makes one file at a time, in the directory asked for: a request for
// another directory drops the ready file; Take hands a ready file over once.
func TestFillerFillsOneFileWhereAsked(t *testing.T) {
	mem := newMem(t)
	if err := mem.MkdirAll("/db2"); err != nil {
		t.Fatal(err)
	}
	f := NewFiller(mem, zeroName, FillInline)
	defer f.Close()
	syncs := mem.Syncs()
	f.Request("/db", 8<<10)
	if !f.ReadyIn("/db") || f.ReadyIn("/db2") {
		t.Fatal("an inline request did not leave a ready file in /db")
	}
	b := seglogtest.ReadFile(t, mem, "/db/"+zeroName)
	if len(b) != 8<<10 || !bytes.Equal(b, make([]byte, len(b))) {
		t.Fatalf("the zero-filled file holds %d bytes, not 8 KiB of zeros", len(b))
	}
	if mem.Syncs() == syncs {
		t.Fatal("the zero-filled file is not synced")
	}
	f.Request("/db2", 8<<10)
	if f.ReadyIn("/db") || !f.ReadyIn("/db2") {
		t.Fatal("a request for /db2 did not move the ready file there")
	}
	if _, err := mem.Stat("/db/" + zeroName); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the dropped file in /db: %v, want removed", err)
	}
	if zf, _, p := f.TakeOpen("/db", ""); zf != nil {
		t.Fatalf("TakeOpen(/db) = %q with no file ready there", p)
	}
	// Taken under its own name (the replication log's roll).
	zf, size, p := f.TakeOpen("/db2", "")
	if zf == nil || p != "/db2/"+zeroName || size != 8<<10 {
		t.Fatalf("TakeOpen(/db2) = %v, %d bytes, %q", zf, size, p)
	}
	zf.Close()
	if zf, _, p := f.TakeOpen("/db2", ""); zf != nil {
		t.Fatalf("a second TakeOpen returned %q", p)
	}
	// Taken renamed (the storage log's roll).
	f.Request("/db", 8<<10)
	zf, size, p = f.TakeOpen("/db", "/db/seg")
	if zf == nil || p != "/db/seg" || size != 8<<10 {
		t.Fatalf("TakeOpen(/db, /db/seg) = %v, %d bytes, %q", zf, size, p)
	}
	zf.Close()
	if _, err := mem.Stat("/db/" + zeroName); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the filler's name after a renaming take: %v, want gone", err)
	}

	manual := NewFiller(mem, "m"+TmpSuffix, FillManual)
	manual.Request("/db", 4<<10)
	if manual.ReadyIn("/db") {
		t.Fatal("a manual filler filled on request")
	}
	manual.FillNow("/db", 4<<10)
	if !manual.ReadyIn("/db") {
		t.Fatal("FillNow did not fill")
	}
	off := NewFiller(mem, "o"+TmpSuffix, FillOff)
	off.FillNow("/db", 4<<10)
	if off.ReadyIn("/db") {
		t.Fatal("FillNow filled with FillOff")
	}
}

// On a file system that cannot write in place a fill fails and leaves no file, and a
// zero-filled file cannot be opened for a roll.
func TestFillerNeedsWriteAt(t *testing.T) {
	mem := newMem(t)
	nw := noWriteAtFS{mem}
	f := NewFiller(nw, zeroName, FillInline)
	f.Request("/db", 4<<10)
	if f.ReadyIn("/db") {
		t.Fatal("a fill without WriteAt reported a ready file")
	}
	if _, err := mem.Stat("/db/" + zeroName); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the failed fill's file: %v, want removed", err)
	}
	zf, err := mem.Create("/db/x")
	if err != nil {
		t.Fatal(err)
	}
	zf.Close()
	if _, _, err := openZeroFilled(nw, "/db/x"); !errors.Is(err, ErrNoWriteAt) {
		t.Fatalf("openZeroFilled without WriteAt: %v", err)
	}
}

// A leftover that vanished before recovery removed it is removed; any other failure
// to remove it is an error.
func TestRemoveLeftoverVanished(t *testing.T) {
	mem := newMem(t)
	if err := RemoveLeftover(mem, "/db/gone"+TmpSuffix); err != nil {
		t.Fatalf("a vanished leftover: %v", err)
	}
	f, err := mem.Create("/db/x" + TmpSuffix)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := RemoveLeftover(mem, "/db/x"+TmpSuffix); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Stat("/db/x" + TmpSuffix); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after RemoveLeftover: %v", err)
	}
	if f, err = mem.Create("/db/y" + TmpSuffix); err != nil {
		t.Fatal(err)
	}
	f.Close()
	mem.CrashAfter(0) // every operation fails from here on
	if err := RemoveLeftover(mem, "/db/y"+TmpSuffix); err == nil {
		t.Fatal("a failed removal was not reported")
	}
	if !IsTmp("a"+TmpSuffix) || IsTmp("a.log") {
		t.Fatal("IsTmp")
	}
}

// Writes go in place while the file has zeros left, extend it past them, then
// append; a failed write is taken back.
func TestWriteAtEndInPlaceThenAppended(t *testing.T) {
	mem := newMem(t)
	f, err := mem.Create("/db/s")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := vfs.ZeroFill(f, 16, nil); err != nil {
		t.Fatal(err)
	}
	size, fileSize := int64(0), int64(16)
	write := func(p string, wantInPlace bool) {
		t.Helper()
		n, inPlace, err := WriteAtEnd(f, []byte(p), size, fileSize)
		if err != nil || n != len(p) || inPlace != wantInPlace {
			t.Fatalf("WriteAtEnd(%q) = %d, in place %v, %v", p, n, inPlace, err)
		}
		size += int64(n)
		fileSize = max(fileSize, size)
	}
	write("0123456789", true)
	write("abcdefghij", true) // past the zeros: extends the file
	write("XY", false)
	if b := seglogtest.ReadFile(t, mem, "/db/s"); string(b) != "0123456789abcdefghijXY" {
		t.Fatalf("file %q", b)
	}
	// Undo of an appended write cuts it off; of one in place writes zeros back and
	// cuts what it extended.
	if err := UndoWrite(f, 20, 22, 2, false); err != nil {
		t.Fatal(err)
	}
	if err := UndoWrite(f, 4, 16, 16, true); err != nil {
		t.Fatal(err)
	}
	want := append([]byte("0123"), make([]byte, 12)...)
	if b := seglogtest.ReadFile(t, mem, "/db/s"); !bytes.Equal(b, want) {
		t.Fatalf("after undo %q, want %q", b, want)
	}
}

// The scan after the end finds exactly what a scan at every offset finds: skipping
// zero words must never skip a record's start. Records here: a 4-byte nonzero length
// at lenAt, a byte saying "proves" at hdr-1; a record is "valid" at i if its length
// field reads one of two magics, one of them zero but for its top byte (a record
// starting five bytes into a zero word).
func TestScanPastEndMatchesFullScan(t *testing.T) {
	const hdr, lenAt = 16, 4
	magics := [2]uint32{0x01020304, 0x01000000}
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 2000; round++ {
		b := make([]byte, 64+rng.Intn(200))
		for k := rng.Intn(6); k > 0; k-- {
			i := rng.Intn(len(b))
			if i+hdr > len(b) {
				continue
			}
			binary.LittleEndian.PutUint32(b[i+lenAt:], magics[rng.Intn(2)])
			b[i+hdr-1] = byte(rng.Intn(2))
		}
		for k := rng.Intn(4); k > 0; k-- {
			b[rng.Intn(len(b))] = byte(rng.Intn(256)) // noise
		}
		proves := func(i int) bool {
			l := binary.LittleEndian.Uint32(b[i+lenAt:])
			return (l == magics[0] || l == magics[1]) && b[i+hdr-1] == 1
		}
		end := rng.Intn(len(b) / 2)
		want := -1
		for i := end + 1; i+hdr <= len(b); i++ {
			if proves(i) {
				want = i
				break
			}
		}
		if got := ScanPastEnd(b, end, hdr, lenAt, proves); got != want {
			t.Fatalf("round %d: ScanPastEnd = %d, a scan of every offset finds %d", round, got, want)
		}
	}
}

// EndTail zeroes every non-zero block after the end on a file written in place (and
// skips it under the skipZero mutation), and cuts the file where it cannot be written
// in place.
func TestEndTail(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inPlace  bool
		skipZero bool
	}{{"zeroed", true, false}, {"mutation", true, true}, {"cut", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			mem := newMem(t)
			var fsys vfs.FS = mem
			if !tc.inPlace {
				fsys = noWriteAtFS{mem}
			}
			data := make([]byte, 3*4096)
			copy(data, "records")
			copy(data[5000:], "stale")
			f, err := fsys.Create("/db/s")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(data); err != nil {
				t.Fatal(err)
			}
			const end = 7
			size, zeroed, err := EndTail(f, data[end:], end, int64(len(data)), tc.skipZero)
			if err != nil {
				t.Fatal(err)
			}
			got := seglogtest.ReadFile(t, mem, "/db/s")
			switch {
			case !tc.inPlace:
				if size != end || string(got) != "records" {
					t.Fatalf("cut: size %d, file %q", size, got)
				}
			case tc.skipZero:
				if zeroed != 0 || !bytes.Equal(got, data) {
					t.Fatal("the mutation wrote")
				}
			default:
				want := make([]byte, len(data))
				copy(want, "records")
				if size != int64(len(data)) || zeroed != 4096 || !bytes.Equal(got, want) {
					t.Fatalf("zeroed %d bytes, size %d, stale bytes left: %v", zeroed, size, !bytes.Equal(got, want))
				}
			}
		})
	}
}

// The durable point is the logical end when the last completed fsync started, and
// never goes down.
func TestSyncedFileMark(t *testing.T) {
	mem := newMem(t)
	f, err := mem.Create("/db/s")
	if err != nil {
		t.Fatal(err)
	}
	var syncs int
	memSyncs := mem.Syncs()
	sf := NewSyncedFile(f, 0, func(time.Duration) { syncs++ })
	defer sf.Close()
	if _, err := sf.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if sf.Synced() != 0 {
		t.Fatal("durable before any fsync")
	}
	sf.SetEnd(100)
	if err := sf.Sync(); err != nil {
		t.Fatal(err)
	}
	if sf.Synced() != 100 || syncs != 1 || mem.Syncs() != memSyncs+1 {
		t.Fatalf("after a sync: mark %d, %d syncs timed, %d fsyncs", sf.Synced(), syncs, mem.Syncs()-memSyncs)
	}
	sf.MarkSynced(40)
	if sf.Synced() != 100 {
		t.Fatalf("the mark went down to %d", sf.Synced())
	}
	mem.CrashAfter(0)
	sf.SetEnd(200)
	if err := sf.Sync(); err == nil || sf.Synced() != 100 {
		t.Fatalf("a failed fsync: %v, mark %d", err, sf.Synced())
	}
}
