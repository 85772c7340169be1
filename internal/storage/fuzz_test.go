package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// encode encodes r as a format 2 record at position 0.
func encode(r Record) []byte { return appendRecord(nil, &r, 0, 0, 0, 0) }

// encodeV1 encodes r as a format 1 record (the format before zero-filled segments).
func encodeV1(r Record, flags uint8, floor uint64) []byte {
	b := make([]byte, hdrSize1+len(r.Key)+len(r.Value))
	putHeader(b, &r, flags, floor)
	copy(b[hdrSize1:], r.Key)
	copy(b[hdrSize1+len(r.Key):], r.Value)
	binary.LittleEndian.PutUint32(b, crc32.Checksum(b[4:], seglog.CRCTable))
	return b
}

// FuzzDecodeRecord: decoding arbitrary bytes never panics, and whatever decodes
// re-encodes to exactly the bytes it came from (so a record is accepted only whole).
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encode(Record{Key: []byte("k"), Value: []byte("v"), Version: 1, Timestamp: 2}))
	f.Add(encode(Record{Key: []byte("key"), Version: 7, Tombstone: true}))
	f.Add([]byte{})
	f.Add(encodeV1(Record{Key: []byte("k"), Value: []byte("v"), Version: 1, Timestamp: 2}, flagCopy, 9))
	f.Add(make([]byte, hdrSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, _ := parseHeader(b)
		h, key, val, ok := decodeRecord(b, h.pos)
		if !ok {
			return
		}
		r := Record{Key: key, Value: val, Version: h.version, Timestamp: h.ts, Tombstone: h.flags&flagTombstone != 0}
		again := encodeV1(r, h.flags&^flagTombstone, h.floor)
		if h.v2() {
			again = appendRecord(nil, &r, h.flags&^(flagTombstone|flagPositioned), h.floor, h.pos, h.synced)
		}
		if !bytes.Equal(again, b[:h.size()]) {
			t.Fatalf("decoded record re-encodes differently")
		}
	})
}

// FuzzRecovery: opening a log segment (format 1: no format mark) with arbitrary contents
// never panics; it either reports corruption or opens an engine whose every indexed
// value reads back.
func FuzzRecovery(f *testing.F) {
	var log []byte
	for i, k := range []string{"a", "b", "a", "c"} {
		log = append(log, encodeV1(Record{Key: []byte(k), Value: []byte("value"), Version: uint64(i + 1)}, 0, 0)...)
	}
	f.Add(log)
	f.Add(log[:len(log)-3])
	f.Add(append(append([]byte{}, log...), 1, 2, 3))
	flipped := bytes.Clone(log)
	flipped[hdrSize1+1] ^= 1
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
