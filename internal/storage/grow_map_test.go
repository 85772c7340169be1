package storage

import (
	"fmt"
	"strings"
	"testing"
)

// TestAppendedActiveSegmentMapped: an engine that appends to its segments instead
// of zero-filling them (NoZeroFill: a VR replica's) maps its active segment as the
// log writes it (growMap), so a scan of the newest records copies them from the
// mapping instead of a pread each; a sealed one is mapped whole; the replaced
// mappings are released at Close; and every read stays correct throughout.
func TestAppendedActiveSegmentMapped(t *testing.T) {
	o := Options{Devices: []Device{{Dir: t.TempDir()}}, SegmentSize: 20 << 20, CacheBytes: -1, NoZeroFill: true}
	db := mustOpen(t, o)
	val := func(i int) string { return fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 1000+i%50)) }
	const n = 22000 // ~22 MB: the log rolls once, and the active segment grows by growMapStep
	check := func(when string, upto int) {
		t.Helper()
		wantScanOfKeys(t, db, when, upto, val)
	}
	grown, stepped := 0, false
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
		if act.size >= minGrowMap && (p == nil || act.size-int64(len(*p)) >= min(int64(len(*p)), growMapStep)) {
			t.Fatalf("after %d records: the active segment holds %d bytes and maps %d", i+1, act.size, mappedLen(p))
		}
		if p != nil && int64(len(*p)) > act.fileSize {
			t.Fatalf("after %d records: %d bytes mapped past the file's %d", i+1, int64(len(*p)), act.fileSize)
		}
		grown += len(act.outgrown)
		if n := len(act.outgrown); n > 0 && int64(len(act.outgrown[n-1])) >= growMapStep {
			stepped = true
		}
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
	if grown == 0 {
		t.Fatal("no mapping was ever replaced by a longer one")
	}
	if !stepped {
		t.Fatal("the active segment never grew by growMapStep")
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
