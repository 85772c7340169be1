package storage

import (
	"fmt"
	"strings"
	"testing"
)

// TestActiveSegmentMapped: the active segment is memory-mapped over its file's length
// (a new engine's zero-filled first segment, every zero-filled segment a roll starts,
// the last segment at a reopen), and records written through the file after the
// mapping was made read back right through it, by scans and point reads (no value
// cache: every read goes to the segment), while the log rolls over (a sealed segment's
// reads stop at its end) and after a reopen, where records appended past the mapping
// are read with pread. Scans of the active segment used to cost a pread per scattered
// record (docs/design/scans.md).
func TestActiveSegmentMapped(t *testing.T) {
	dir := t.TempDir()
	o := Options{Devices: []Device{{Dir: dir}}, SegmentSize: 256 << 10, CacheBytes: -1}
	db := mustOpen(t, o)
	mappedActive := 0
	active := func(when string) {
		t.Helper()
		db.mu.RLock()
		defer db.mu.RUnlock()
		s := db.segs[len(db.segs)-1]
		if p := s.mm.Load(); p != nil {
			mappedActive++
		} else if s.zeroSize > 0 || s.fileSize > s.size {
			t.Fatalf("%s: the active segment %s (%d bytes of zeros) is not mapped", when, s.path, s.zeroSize)
		}
		for _, old := range db.segs[:len(db.segs)-1] {
			if p := old.mm.Load(); p != nil && int64(len(*p)) > old.size {
				t.Fatalf("%s: sealed segment %s reads %d mapped bytes past its end", when, old.path, int64(len(*p))-old.size)
			}
		}
	}
	active("new engine")
	val := func(i int) string { return fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 900+i%50)) }
	const n = 600 // ~570 KB: the log rolls twice
	check := func(when string, upto int) {
		t.Helper()
		for i := 0; i < upto; i += 37 {
			wantGet(t, db, fmt.Sprintf("k%05d", i), val(i))
		}
		wantScanOfKeys(t, db, when, upto, val)
	}
	rolls := db.rolls.Load()
	for i := 0; i < n; i++ {
		put(t, db, fmt.Sprintf("k%05d", i), uint64(i+1), val(i))
		if i%25 == 24 {
			if _, err := db.Sync(db.LastPos()); err != nil { // written: read from the segment, not the buffer
				t.Fatal(err)
			}
			check(fmt.Sprintf("after %d records", i+1), i+1)
			active(fmt.Sprintf("after %d records", i+1))
		}
	}
	if db.rolls.Load()-rolls < 2 {
		t.Fatalf("the log rolled %d times, want at least 2", db.rolls.Load()-rolls)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if mappedActive == 0 {
		t.Fatal("no active segment was mapped")
	}
	db = mustOpen(t, o)
	defer db.Close()
	mappedActive = 0
	active("reopened")
	if mappedActive == 0 {
		t.Fatal("reopened: the last segment is not mapped")
	}
	check("reopened", n)
	for i := n; i < n+30; i++ { // past the mapping (or into a new segment)
		put(t, db, fmt.Sprintf("k%05d", i), uint64(i+1), val(i))
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	check("appended after the reopen", n+30)
}

// wantScanOfKeys fails the test unless a scan of db returns exactly keys
// k00000 .. k(upto-1), in order, key i with value val(i).
func wantScanOfKeys(t *testing.T, db *DB, when string, upto int, val func(int) string) {
	t.Helper()
	i := 0
	err := db.Scan(nil, nil, 0, 0, func(k []byte, v Value) bool {
		if string(k) != fmt.Sprintf("k%05d", i) || string(v.Data) != val(i) {
			t.Fatalf("%s: scan: %s = %.20q…, want k%05d", when, k, v.Data, i)
		}
		i++
		return true
	})
	if err != nil || i != upto {
		t.Fatalf("%s: scan: %d keys of %d, %v", when, i, upto, err)
	}
}
