package storage

import (
	"fmt"
	"strings"
	"testing"
)

// TestAppendedActiveSegmentMapped: an engine that appends to its segments instead
// of zero-filling them (NoZeroFill: a VR replica's) maps its active segment as the
// log writes it (growMap): once, SegmentSize ahead of the file, and every flush
// lengthens what readers see to the written end — so a scan of the newest records
// copies every one of them from the mapping, none with a pread (the old steps left
// up to 8 MiB unmapped, and this test fails on them); never a readable byte past the
// file; a sealed one is mapped whole; and every read stays correct throughout.
func TestAppendedActiveSegmentMapped(t *testing.T) {
	o := Options{Devices: []Device{{Dir: t.TempDir()}}, SegmentSize: 20 << 20, CacheBytes: -1, NoZeroFill: true}
	db := mustOpen(t, o)
	val := func(i int) string { return fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 1000+i%50)) }
	const n = 22000 // ~22 MB: the log rolls once
	check := func(when string, upto int) {
		t.Helper()
		wantScanOfKeys(t, db, when, upto, val)
	}
	grown := 0
	for i := 0; i < n; i++ {
		put(t, db, fmt.Sprintf("k%05d", i), uint64(i+1), val(i))
		if i%1000 != 999 {
			continue
		}
		if _, err := db.Sync(db.LastPos()); err != nil { // written: read from the segment
			t.Fatal(err)
		}
		check(fmt.Sprintf("after %d records", i+1), i+1)
		db.mu.RLock()
		act := db.segs[len(db.segs)-1]
		p := act.mm.Load()
		if act.zeroSize != 0 {
			t.Fatalf("segment %s was zero-filled with NoZeroFill", act.path)
		}
		if p == nil || int64(len(*p)) != act.size {
			t.Fatalf("after %d records: the active segment holds %d bytes and maps %d for reads", i+1, act.size, mappedLen(p))
		}
		if int64(len(*p)) > act.fileSize {
			t.Fatalf("after %d records: %d bytes readable through the mapping past the file's %d", i+1, int64(len(*p)), act.fileSize)
		}
		if int64(cap(*p)) < o.SegmentSize {
			t.Fatalf("after %d records: the active segment's mapping reserves %d bytes, want SegmentSize %d", i+1, cap(*p), o.SegmentSize)
		}
		grown += len(act.outgrown)
		for _, old := range db.segs[:len(db.segs)-1] {
			if q := old.mm.Load(); q == nil || int64(len(*q)) != old.size {
				t.Fatalf("after %d records: sealed segment %s (%d bytes) maps %d", i+1, old.path, old.size, mappedLen(q))
			}
		}
		db.mu.RUnlock()
	}
	if db.rolls.Load() < 1 {
		t.Fatal("the log did not roll")
	}
	if grown != 0 {
		t.Fatalf("%d mappings were replaced: an active segment within SegmentSize is mapped once", grown)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func mappedLen(p *[]byte) int {
	if p == nil {
		return 0
	}
	return len(*p)
}

// TestAppendedSegmentPastReservation: a record larger than SegmentSize makes an
// appended segment longer than growMap's reservation; its mapping then covers the
// file's whole length, and every record reads the same.
func TestAppendedSegmentPastReservation(t *testing.T) {
	o := Options{Devices: []Device{{Dir: t.TempDir()}}, SegmentSize: 64 << 10, CacheBytes: -1, NoZeroFill: true}
	db := mustOpen(t, o)
	small := strings.Repeat("s", 100)
	big := strings.Repeat("B", 100<<10)
	put(t, db, "a", 1, small)
	put(t, db, "b", 2, big)
	put(t, db, "c", 3, small)
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	db.mu.RLock()
	for _, s := range db.segs {
		if p := s.mm.Load(); p == nil || int64(len(*p)) != s.size {
			t.Errorf("segment %s holds %d bytes, maps %d for reads", s.path, s.size, mappedLen(p))
		}
	}
	db.mu.RUnlock()
	wantGet(t, db, "a", small)
	wantGet(t, db, "b", big)
	wantGet(t, db, "c", small)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
