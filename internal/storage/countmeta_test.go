package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Stats.MetaKeys counts the keys whose meta Options.CountMeta counts, after
// appends, compaction, a reopen from a hint file, a full replay, and a reopen
// with a hint file of the older format (KFHINT01, which lacks the flag): that
// one is not used, the log is replayed.
func TestCountMetaSurvivesEverything(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 1 << 10
	o.CountMeta = func(m []byte) bool { return len(m) > 1 }
	db := mustOpen(t, o)
	ver := uint64(0)
	// k%3: 0 no meta, 1 uncounted meta, 2 counted meta; the last round wins.
	for round := 0; round < 5; round++ {
		for k := 0; k < 30; k++ {
			var m []byte
			switch (k + round) % 3 {
			case 1:
				m = []byte{1}
			case 2:
				m = []byte{0, 1, 2, 3}
			}
			ver++
			if _, err := db.Append(Record{Key: []byte(fmt.Sprintf("k%02d", k)), Value: []byte("v"), Meta: m, Version: ver, Timestamp: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ver++
	if _, err := db.Append(Record{Key: []byte("k01"), Version: ver, Timestamp: 1, Tombstone: true}); err != nil {
		t.Fatal(err)
	}
	const want = 9 // ten keys end with counted meta, one of them deleted
	check := func(what string) {
		t.Helper()
		if got := db.Stats().MetaKeys; got != want {
			t.Fatalf("%s: MetaKeys = %d, want %d", what, got, want)
		}
		if err := db.idx.check(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		n := 0
		if _, err := db.MetaKeys(nil, 0, func([]byte) bool { n++; return true }); err != nil || n != 19 {
			t.Fatalf("%s: MetaKeys walk saw %d keys with meta, want 19 (%v)", what, n, err)
		}
	}
	check("appended")
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(); err != nil {
		t.Fatal(err)
	}
	check("compacted")
	if err := db.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = mustOpen(t, o)
	if db.Stats().HintPos == 0 {
		t.Fatal("reopen did not use the hint file")
	}
	check("reopened from hint")
	db.Close()

	// Make the hint an older build's, which has no verCounted flags: written
	// by an engine that counts nothing, then given magic KFHINT01 (checksum
	// fixed up).
	for _, p := range hintFiles(t, fs, "/db") {
		if err := fs.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	none := o
	none.CountMeta = func([]byte) bool { return false }
	db = mustOpen(t, none)
	if err := db.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	db.Close()
	hints := 0
	for _, p := range hintFiles(t, fs, "/db") {
		hints++
		rewrite(t, fs, p, func(b []byte) []byte {
			if string(b[:8]) != "KFHINT02" {
				t.Fatalf("hint magic %q", b[:8])
			}
			copy(b, "KFHINT01")
			binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], seglog.CRCTable))
			return b
		})
	}
	if hints == 0 {
		t.Fatal("no hint file")
	}
	db = mustOpen(t, o)
	if db.Stats().HintPos != 0 {
		t.Fatal("an old-format hint file was used")
	}
	check("reopened past an old hint")
	db.Close()
}
