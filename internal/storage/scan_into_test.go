package storage

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

// TestScanIntoReusesBuffer: ScanInto reads a scan's values into the caller's
// buffer. A second scan with the buffer emptied reuses its array (no value
// buffer allocated); the values of a scan longer than one batch stay valid
// when the buffer has to grow mid-scan (the earlier batches keep the old
// array); and the value cache never aliases the buffer, so a caller that
// reuses it (overwrites it) changes neither the cache nor a later read.
func TestScanIntoReusesBuffer(t *testing.T) {
	o := memOpts(vfs.NewMem()) // pread segments: the scan fills the value cache
	o.SegmentSize, o.CacheBytes = 1<<20, 1<<20
	db := mustOpen(t, o)
	defer db.Close()
	const n = 3*scanBatch + 7 // several batches
	val := func(i int) string { return fmt.Sprintf("value-%04d-%0200d", i, i) }
	for i := 0; i < n; i++ {
		put(t, db, fmt.Sprintf("k%04d", i), uint64(i+1), val(i))
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	scan := func(buf *[]byte) (vals [][]byte) {
		t.Helper()
		err := db.ScanInto([]byte("k"), []byte("l"), 0, 0, buf, func(k []byte, v Value) bool {
			if want := fmt.Sprintf("k%04d", len(vals)); string(k) != want {
				t.Fatalf("scan: key %q, want %q", k, want)
			}
			vals = append(vals, v.Data)
			return true
		})
		if err != nil || len(vals) != n {
			t.Fatalf("scan: %d keys, %v", len(vals), err)
		}
		return vals
	}
	check := func(what string, vals [][]byte) {
		t.Helper()
		for i, v := range vals {
			if string(v) != val(i) {
				t.Fatalf("%s: value %d = %.20q…, want %.20q…", what, i, v, val(i))
			}
		}
	}
	buf := make([]byte, 0, 1000) // too small: grows during the scan
	vals := scan(&buf)
	check("first scan, after the buffer grew", vals)
	if len(buf) == 0 || cap(buf) <= 1000 {
		t.Fatalf("buffer len %d cap %d: the scan did not read into it", len(buf), cap(buf))
	}
	// Reuse: empty it, overwrite what it held, scan again.
	buf = buf[:cap(buf)]
	for i := range buf {
		buf[i] = 'X'
	}
	buf = buf[:0]
	arr := &buf[:1][0]
	vals = scan(&buf)
	check("second scan, into the reused buffer", vals)
	if &buf[0] != arr {
		t.Errorf("second scan replaced the buffer (cap %d): it had room for every value", cap(buf))
	}
	for i := range buf {
		buf[i] = 'Y'
	}
	wantGet(t, db, "k0005", val(5)) // the cache copied what it kept
	check("a scan without a buffer, after the caller overwrote its own", scan(nil))
}
