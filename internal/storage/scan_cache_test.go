package storage

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

// TestScanCachesScatteredRecords: a scan over records scattered in a segment read with
// pread (the in-memory file system maps nothing) puts each record it reads alone in the
// value cache, so the next scan over them takes them from there (readBatch); the values
// it returns are still fresh copies, so a caller that writes to one changes neither the
// cache nor a later read.
func TestScanCachesScatteredRecords(t *testing.T) {
	o := memOpts(vfs.NewMem())
	o.SegmentSize, o.CacheBytes = 1<<20, 1<<20
	db := mustOpen(t, o)
	defer db.Close()
	const n = 20
	filler := string(bytes.Repeat([]byte{'z'}, 2*scanGap)) // keeps the reads apart
	for i := 0; i < n; i++ {
		put(t, db, fmt.Sprintf("k%02d", i), uint64(2*i+1), fmt.Sprintf("value-%02d", i))
		put(t, db, fmt.Sprintf("z%02d", i), uint64(2*i+2), filler)
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	scan := func(mutate bool) {
		t.Helper()
		i := 0
		err := db.Scan([]byte("k"), []byte("l"), 0, 0, func(k []byte, v Value) bool {
			if want := fmt.Sprintf("value-%02d", i); string(k) != fmt.Sprintf("k%02d", i) || string(v.Data) != want {
				t.Fatalf("scan: %s = %q, want k%02d = %q", k, v.Data, i, want)
			}
			if mutate {
				v.Data[0] = 'X'
			}
			i++
			return true
		})
		if err != nil || i != n {
			t.Fatalf("scan: %d keys, %v", i, err)
		}
	}
	scan(true)
	hits := db.Stats().CacheHits
	scan(true)
	if got := db.Stats().CacheHits - hits; got != n {
		t.Fatalf("second scan: %d cache hits, want %d (one per scattered record)", got, n)
	}
	scan(false)
	wantGet(t, db, "k07", "value-07")
}
