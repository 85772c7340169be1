package vrshard

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// The applier's ordered listing (listKeys) names every key of the batch's
// overlay exactly once, whatever the engine's compaction does while it
// lists. A key the batch writes again after the engine deleted it has, in
// the engine, only its tombstone, which compaction may drop at any moment
// (the background goroutine): the listing once decided before walking the
// engine that such a key was "listed with the engine's" (Versions found the
// tombstone), and a compaction between that check and the engine's walk
// reaching the key dropped it from both: a range read of the op missed a
// live key on this replica only (its budget count and its answer differing
// from the other replicas').
func TestListKeysSeesStagedKeysThroughACompaction(t *testing.T) {
	o := storage.Options{Devices: []storage.Device{{Dir: "/db"}}, FS: vfs.NewMem(), SegmentSize: 4 << 10, CacheBytes: -1, Inline: true, CompactionThreshold: 0.99}
	db, err := storage.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// zz written and deleted first (its tombstone in the head segment,
	// its sole version), then more than one engine listing batch of keys
	// before it (storage.DB.Keys lists 1,024 at a time) in later segments.
	ver := uint64(0)
	app := func(r storage.Record) {
		ver++
		r.Version = ver
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	app(storage.Record{Key: []byte("zz"), Value: []byte("old")})
	app(storage.Record{Key: []byte("zz"), Tombstone: true})
	for i := range 1500 {
		app(storage.Record{Key: []byte(fmt.Sprintf("k%05d", i)), Value: []byte("v")})
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	if vs, err := db.Versions([]byte("zz")); err != nil || len(vs) != 1 || !vs[0].Tombstone {
		t.Fatalf("zz's versions before: %+v %v", vs, err)
	}
	a := newApplier(db)
	a.begin()
	// The batch wrote zz again (an earlier op of the batch).
	a.overlay["zz"] = overlayVal{data: []byte("new"), version: ver + 1, exists: true}
	a.cur = ver + 2
	var got []string
	compacted := false
	if err := a.listKeys(nil, nil, func(k []byte) bool {
		if !compacted {
			// The engine compacts while the listing goes on.
			compacted = true
			if err := db.Compact(); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Versions([]byte("zz")); err == nil {
				t.Fatal("compaction kept zz's tombstone: the test does not exercise the race")
			}
		}
		got = append(got, string(k))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, k := range got {
		if k == "zz" {
			n++
		}
		if i > 0 && got[i-1] >= k {
			t.Fatalf("listing out of order or repeated at %d: %q then %q", i, got[i-1], k)
		}
	}
	if n != 1 || len(got) != 1501 {
		t.Fatalf("listed zz %d times (want 1) and %d keys (want 1501)", n, len(got))
	}
}
