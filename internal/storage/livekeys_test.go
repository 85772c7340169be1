package storage

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

// Stats.LiveKeys and CountLive count the keys a read finds: a deleted key
// stops counting at its deletion, not when compaction drops its tombstone
// (DBSIZE counts these; issue 25 item 11). The count stays right through every
// way the index changes: appends with and without retained versions, replay
// and hint-file recovery, and compaction.
func TestLiveKeysCountOnlyWhatAReadFinds(t *testing.T) {
	for _, keep := range []int{1, 3} {
		t.Run(fmt.Sprintf("keep%d", keep), func(t *testing.T) {
			fs := vfs.NewMem()
			o := memOpts(fs)
			o.Retention.KeepVersions = keep
			db := mustOpen(t, o)
			ver := uint64(0)
			next := func() uint64 { ver++; return ver }
			for i := 0; i < 300; i++ {
				put(t, db, fmt.Sprintf("k%03d", i%100), next(), fmt.Sprintf("v%d", i))
			}
			for i := 0; i < 100; i += 4 {
				del(t, db, fmt.Sprintf("k%03d", i), next())
			}
			del(t, db, "never-written", next())
			put(t, db, "k000", next(), "back") // a deleted key written again counts again
			put(t, db, "\xff\xffrow/1", next(), "internal")
			const want = 100 - 25 + 1 + 1
			check := func(when string, db *DB) {
				t.Helper()
				if st := db.Stats(); st.LiveKeys != want {
					t.Errorf("%s: LiveKeys %d (Keys %d), want %d", when, st.LiveKeys, st.Keys, want)
				}
				if n := db.CountLive([]byte("\xff\xff"), nil); n != 1 {
					t.Errorf("%s: CountLive(\\xff\\xff, end) = %d, want 1", when, n)
				}
				if n := db.CountLive([]byte("k010"), []byte("k020")); n != 8 { // k012 and k016 deleted
					t.Errorf("%s: CountLive(k010, k020) = %d, want 8", when, n)
				}
				if err := db.idx.check(); err != nil {
					t.Errorf("%s: %v", when, err)
				}
			}
			check("after appends", db)
			if _, err := db.Sync(db.LastPos()); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = mustOpen(t, o)
			check("reopened (hint file)", db)
			if err := db.Compact(); err != nil {
				t.Fatal(err)
			}
			check("compacted", db)
			if _, err := db.Sync(db.LastPos()); err != nil {
				t.Fatal(err)
			}
			fs.Crash(nil)
			db = mustOpen(t, o)
			defer db.Close()
			check("recovered after a crash", db)
		})
	}
}
