package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// The meta layout on disk: the flag, then the length byte and meta between the key and
// the value, inside the checksum; a record without meta is byte for byte what it was.
func TestMetaRecordLayout(t *testing.T) {
	plain := appendRecord(nil, &Record{Key: []byte("k"), Value: []byte("v"), Version: 7, Timestamp: 9}, 0, 0, 100, 50)
	if len(plain) != hdrSize+2 || plain[28] != flagPositioned {
		t.Fatalf("plain record: %d bytes, flags %#x; want %d, %#x", len(plain), plain[28], hdrSize+2, flagPositioned)
	}
	meta := []byte{0, 1, 2, 3}
	b := appendRecord(nil, &Record{Key: []byte("k"), Value: []byte("v"), Meta: meta, Version: 7, Timestamp: 9}, 0, 0, 100, 50)
	if len(b) != len(plain)+1+len(meta) {
		t.Fatalf("meta record is %d bytes, want %d", len(b), len(plain)+1+len(meta))
	}
	if b[28] != flagPositioned|flagMeta || b[hdrSize] != 'k' || b[hdrSize+1] != 4 ||
		!bytes.Equal(b[hdrSize+2:hdrSize+6], meta) || b[hdrSize+6] != 'v' {
		t.Fatalf("meta record layout: % x", b[hdrSize:])
	}
	h, k, v, ok := decodeRecord(b, 100)
	if !ok || string(k) != "k" || string(v) != "v" || h.size() != len(b) {
		t.Fatalf("decode: ok %v key %q val %q size %d", ok, k, v, h.size())
	}
	if m, val := splitPayload(payload(b, h), true); !bytes.Equal(m, meta) || string(val) != "v" {
		t.Fatalf("payload split: meta % x val %q", m, val)
	}
	// The meta is under the checksum.
	b[hdrSize+3] ^= 1
	if _, _, _, ok := decodeRecord(b, 100); ok {
		t.Fatal("a flipped meta byte passed the checksum")
	}
	// A meta record cut inside its meta does not decode.
	b[hdrSize+3] ^= 1
	if _, _, _, ok := decodeRecord(b[:hdrSize+3], 100); ok {
		t.Fatal("a truncated meta record decoded")
	}
	// A zero meta length is not a valid encoding (empty meta has no flag).
	z := bytes.Clone(plain)
	z[28] |= flagMeta
	z = append(z[:hdrSize+1], append([]byte{0}, z[hdrSize+1:]...)...)
	binary.LittleEndian.PutUint32(z, crcOf(z))
	if _, _, _, ok := decodeRecord(z, 100); ok {
		t.Fatal("a record with flagMeta and meta length 0 decoded")
	}
}

// Meta comes back with the value from every place a value is read (write buffer, disk,
// cache, scans, snapshots) and survives compaction, a checkpoint (hint file) and a full
// replay; a key without meta reads with nil Meta.
func TestMetaSurvivesEverything(t *testing.T) {
	for _, cache := range []int64{-1, 1 << 20} {
		t.Run(fmt.Sprint("cache", cache), func(t *testing.T) {
			fs := vfs.NewMem()
			o := memOpts(fs)
			o.SegmentSize = 1 << 10
			o.CacheBytes = cache
			db := mustOpen(t, o)
			metaOf := func(k int) []byte {
				if k%2 == 0 {
					return nil
				}
				return []byte{0, byte(k), 0xff}
			}
			ver := uint64(0)
			for round := 0; round < 10; round++ {
				for k := 0; k < 20; k++ {
					ver++
					if _, err := db.Append(Record{Key: []byte(fmt.Sprintf("k%02d", k)), Value: []byte(fmt.Sprintf("r%d-%020d", round, k)),
						Meta: metaOf(k + round), Version: ver, Timestamp: 1}); err != nil {
						t.Fatal(err)
					}
				}
			}
			check := func(db *DB, what string) {
				t.Helper()
				for pass := 0; pass < 2; pass++ { // the second pass hits the cache
					for k := 0; k < 20; k++ {
						v, err := db.Get([]byte(fmt.Sprintf("k%02d", k)))
						if err != nil || string(v.Data) != fmt.Sprintf("r9-%020d", k) || !bytes.Equal(v.Meta, metaOf(k+9)) {
							t.Fatalf("%s: Get k%02d = %q meta % x, %v", what, k, v.Data, v.Meta, err)
						}
						sv, err := db.GetShared([]byte(fmt.Sprintf("k%02d", k)))
						if err != nil || !bytes.Equal(sv.Meta, metaOf(k+9)) || !bytes.Equal(sv.Data, v.Data) {
							t.Fatalf("%s: GetShared k%02d = %q meta % x, %v", what, k, sv.Data, sv.Meta, err)
						}
					}
				}
				n := 0
				err := db.Scan(nil, nil, 0, 0, func(key []byte, v Value) bool {
					k := n
					n++
					if !bytes.Equal(v.Meta, metaOf(k+9)) || string(v.Data) != fmt.Sprintf("r9-%020d", k) {
						t.Fatalf("%s: Scan %s = %q meta % x", what, key, v.Data, v.Meta)
					}
					return true
				})
				if err != nil || n != 20 {
					t.Fatalf("%s: scan saw %d keys, %v", what, n, err)
				}
				if got := db.Stats().MetaKeys; got != 10 {
					t.Fatalf("%s: Stats().MetaKeys = %d, want 10", what, got)
				}
				if err := db.idx.check(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				snap := db.Snapshot(0)
				v, err := snap.Get([]byte("k01"))
				snap.Close()
				if err != nil || !bytes.Equal(v.Meta, metaOf(10)) {
					t.Fatalf("%s: snapshot Get = meta % x, %v", what, v.Meta, err)
				}
			}
			check(db, "write buffer")
			if _, err := db.Sync(db.LastPos()); err != nil {
				t.Fatal(err)
			}
			check(db, "disk")
			if err := db.Compact(); err != nil {
				t.Fatal(err)
			}
			if db.Stats().Compactions == 0 {
				t.Fatal("nothing was compacted")
			}
			check(db, "compacted")
			if err := db.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			db.Close()
			db = mustOpen(t, o)
			if db.Stats().HintPos == 0 {
				t.Fatal("reopen did not use the hint file")
			}
			check(db, "reopened from hint")
			db.Close()
			for _, p := range hintFiles(t, fs, "/db") {
				if err := fs.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
			db = mustOpen(t, o)
			if db.Stats().HintPos != 0 {
				t.Fatal("reopen used a hint file")
			}
			check(db, "replayed")
			db.Close()
		})
	}
}

func TestMetaBadInput(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	defer db.Close()
	if _, err := db.Append(Record{Key: []byte("k"), Version: 1, Tombstone: true, Meta: []byte{1}}); err == nil {
		t.Fatal("a tombstone with meta was accepted")
	}
	if _, err := db.Append(Record{Key: []byte("k"), Version: 1, Meta: make([]byte, MaxMetaSize+1)}); err == nil {
		t.Fatal("an oversize meta was accepted")
	}
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b[4:], seglog.CRCTable) }

// MetaKeys visits exactly the keys whose newest version has meta, in order,
// and resumes where it stopped.
func TestMetaKeys(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	defer db.Close()
	want := []string{}
	for i := 0; i < 100; i++ {
		k := fmt.Sprintf("k%03d", i)
		r := Record{Key: []byte(k), Value: []byte("v"), Version: uint64(i + 1)}
		if i%3 == 0 {
			r.Meta = []byte{0, 1}
		}
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	// k000 loses its meta, k003 is deleted: neither is visited.
	if _, err := db.Append(Record{Key: []byte("k000"), Value: []byte("v"), Version: 200},
		Record{Key: []byte("k003"), Version: 200, Tombstone: true}); err != nil {
		t.Fatal(err)
	}
	for i := 6; i < 100; i += 3 {
		want = append(want, fmt.Sprintf("k%03d", i))
	}
	if got := db.Stats().MetaKeys; got != len(want) {
		t.Fatalf("Stats().MetaKeys = %d, want %d", got, len(want))
	}
	var got []string
	var from []byte
	for rounds := 0; ; rounds++ {
		if rounds > 100 {
			t.Fatal("MetaKeys does not progress")
		}
		stop := 0
		next, err := db.MetaKeys(from, 7, func(k []byte) bool {
			got = append(got, string(k))
			stop++
			return stop < 2 // stop early too, half the time
		})
		if err != nil {
			t.Fatal(err)
		}
		if next == nil {
			break
		}
		from = next
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("MetaKeys visited %v, want %v", got, want)
	}
}

// hintFiles lists the paths of the hint files in dir.
func hintFiles(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, ".hint") {
			out = append(out, dir+"/"+n)
		}
	}
	return out
}
