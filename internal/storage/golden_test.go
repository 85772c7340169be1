package storage

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/seglog/seglogtest"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A directory written by the code before internal/seglog (commit 7f562ff: five
// zero-filled 16 KiB segments, the last one partly written, the format mark and a
// leftover zero-segment.tmp, closed cleanly) opens with every value, and the log goes
// on. The archive was made at 7f562ff with this model on vfs.Mem (memOpts,
// SegmentSize 16 KiB): for i in [0, 900), key%03d of i%300 is deleted at version i+1
// if i%97 == 0, else set to i%40+1 copies of the letter 'a'+i%26; Sync; Close.
func TestOpensDirectoryWrittenBeforeSeglog(t *testing.T) {
	mem := vfs.NewMem()
	seglogtest.LoadDir(t, mem, "/db", "testdata/storage-7f562ff.tar.gz")
	o := memOpts(mem)
	o.SegmentSize = 16 << 10
	model := map[string]string{}
	for i := 0; i < 900; i++ {
		k := fmt.Sprintf("key%03d", i%300)
		if i%97 == 0 {
			model[k] = ""
			continue
		}
		model[k] = strings.Repeat(string(rune('a'+i%26)), i%40+1)
	}
	check := func(db *DB) {
		t.Helper()
		for k, v := range model {
			wantGet(t, db, k, v)
		}
	}
	db := mustOpen(t, o)
	if db.LastVersion() != 900 {
		t.Fatalf("last version %d, want 900", db.LastVersion())
	}
	check(db)
	for i := 900; i < 1300; i++ { // across rolls
		k := fmt.Sprintf("key%03d", i%300)
		model[k] = fmt.Sprint("new", i)
		put(t, db, k, uint64(i+1), model[k])
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	check(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	check(mustOpen(t, o))
}
