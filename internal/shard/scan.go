package shard

import (
	"bytes"

	"github.com/kefirdb/kefir/internal/storage"
)

// Scanner is the part of the engine a user scan needs.
type Scanner interface {
	Scan(start, end []byte, at uint64, limit int, fn func(key []byte, v storage.Value) bool) error
}

// AtSnapshot is a Scanner that reads at snap's version whatever version it is
// asked for: ScanUser continues a scan with several engine calls, and every one
// must see the same state.
func AtSnapshot(snap *storage.Snapshot) Scanner { return snapScanner{snap} }

type snapScanner struct{ s *storage.Snapshot }

func (s snapScanner) Scan(start, end []byte, _ uint64, limit int, fn func(key []byte, v storage.Value) bool) error {
	return s.s.Scan(start, end, limit, fn)
}

// ScanUser visits the user keys in [start, end) (end nil = unbounded) in order, at
// most limit of them and about maxScanBytes of keys and values, skipping the
// shard's reserved keys. It passes the limit down to the engine, which reads values
// in batches of that size — a LIMIT 1 scan must not read a thousand values — and
// continues past reserved keys the engine counted against it. Keys and values
// handed to visit are safe to keep.
func ScanUser(db Scanner, start, end []byte, limit int, visit func(key []byte, v storage.Value)) error {
	n, size := 0, 0
	from := start
	for {
		want := limit - n
		visited, full := 0, false
		var last []byte
		err := db.Scan(from, end, 0, want, func(k []byte, v storage.Value) bool {
			visited++
			last = k
			if bytes.HasPrefix(k, ReservedPrefix) {
				return true
			}
			visit(k, v)
			n++
			size += len(k) + len(v.Data)
			full = n >= limit || size >= maxScanBytes
			return !full
		})
		if err != nil || full || visited < want {
			return err
		}
		// The engine stopped at want keys, some of them reserved: go on after the last.
		from = append(append(make([]byte, 0, len(last)+1), last...), 0)
	}
}
