package storage

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

func encode(r Record) []byte { return appendRecord(nil, &r, 0, 0) }

// FuzzDecodeRecord: decoding arbitrary bytes never panics, and whatever decodes
// re-encodes to exactly the bytes it came from (so a record is accepted only whole).
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encode(Record{Key: []byte("k"), Value: []byte("v"), Version: 1, Timestamp: 2}))
	f.Add(encode(Record{Key: []byte("key"), Version: 7, Tombstone: true}))
	f.Add([]byte{})
	f.Add(make([]byte, hdrSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, key, val, ok := decodeRecord(b)
		if !ok {
			return
		}
		r := Record{Key: key, Value: val, Version: h.version, Timestamp: h.ts, Tombstone: h.flags&flagTombstone != 0}
		again := appendRecord(nil, &r, h.flags&^flagTombstone, h.floor)
		if !bytes.Equal(again, b[:h.size()]) {
			t.Fatalf("decoded record re-encodes differently")
		}
	})
}

// FuzzRecovery: opening a log segment with arbitrary contents never panics; it either
// reports corruption or opens an engine whose every indexed value reads back.
func FuzzRecovery(f *testing.F) {
	var log []byte
	for i, k := range []string{"a", "b", "a", "c"} {
		log = append(log, encode(Record{Key: []byte(k), Value: []byte("value"), Version: uint64(i + 1)})...)
	}
	f.Add(log)
	f.Add(log[:len(log)-3])
	f.Add(append(append([]byte{}, log...), 1, 2, 3))
	flipped := bytes.Clone(log)
	flipped[hdrSize+1] ^= 1
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, b []byte) {
		fs := vfs.NewMem()
		fs.MkdirAll("/db")
		w, _ := fs.Create("/db/" + segName(0))
		w.Write(b)
		w.Sync()
		fs.SyncDir("/db")
		db, err := Open(memOpts(fs))
		if err != nil {
			var ce *CorruptionError
			if !errors.As(err, &ce) {
				t.Fatalf("Open failed without a CorruptionError: %v", err)
			}
			return
		}
		defer db.Close()
		err = db.Scan(nil, nil, 0, 0, func(k []byte, v Value) bool { return true })
		if err != nil {
			t.Fatalf("scan of a recovered log: %v", err)
		}
		if db.LastPos() > Pos(len(b)) {
			t.Fatalf("recovered past the end of the file")
		}
	})
}
