package storage

import (
	"fmt"
	"strings"
	"testing"
)

// TestActiveSegmentMapped: the active segment is memory-mapped from its start (a new
// engine, every roll, a reopen), and records written through the file after the
// mapping was made read back right through it, by scans and point reads (no value
// cache: every read goes to the segment), while the log rolls over and after a reopen.
// Scans of the active segment used to cost a pread per scattered record
// (docs/design/scans.md).
func TestActiveSegmentMapped(t *testing.T) {
	dir := t.TempDir()
	o := Options{Devices: []Device{{Dir: dir}}, SegmentSize: 256 << 10, CacheBytes: -1}
	db := mustOpen(t, o)
	active := func(when string) {
		t.Helper()
		db.mu.RLock()
		s := db.segs[len(db.segs)-1]
		db.mu.RUnlock()
		if s.mm.Load() == nil {
			t.Fatalf("%s: the active segment %s is not mapped", when, s.path)
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
	db = mustOpen(t, o)
	defer db.Close()
	active("reopened")
	check("reopened", n)
}
