package shard

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// Scanner is the part of the engine a user scan needs.
type Scanner interface {
	Scan(start, end []byte, at uint64, limit int, fn func(key []byte, v storage.Value) bool) error
}

// EngineScanner is db's latest state as a kv.Scanner. Each call reads the
// state as it is then: a caller that needs one state for a whole scan uses
// SnapshotScanner.
func EngineScanner(db Scanner) kv.Scanner {
	return func(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
		err := db.Scan(start, end, 0, limit, func(k []byte, v storage.Value) bool { return visit(k, v.Data, v.Meta, v.Version) })
		if err != nil {
			return fmt.Errorf("%w: scan: %w", ErrUnavailable, err)
		}
		return nil
	}
}

// SnapshotScanner is snap as a kv.Scanner: kv.ScanUser continues a scan with
// several engine calls, and every one must see the same state.
func SnapshotScanner(snap *storage.Snapshot) kv.Scanner { return snapshotScan(snap, nil, nil) }

// SnapshotScannerInto is SnapshotScanner reading the values into *buf
// (kv.Op.ScanBuf; nil: fresh memory), which the caller keeps until it is done
// with them (storage.Snapshot.ScanInto).
func SnapshotScannerInto(snap *storage.Snapshot, buf *[]byte) kv.Scanner {
	return snapshotScan(snap, nil, buf)
}

// snapshotScan is SnapshotScanner noting in *maxPos (if not nil) the highest
// log position of a value it visits, for the read durability check, and
// reading the values into *buf if buf is not nil (SnapshotScannerInto).
//
// A point range (kv.PointRange: an HGET's read of a field row) is a lookup
// of its key, which costs a GET's tree walk where a scan would cost an
// iterator and a value batch besides (most of an HGET's CPU before).
func snapshotScan(snap *storage.Snapshot, maxPos *storage.Pos, buf *[]byte) kv.Scanner {
	return func(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
		if kv.PointRange(start, end, limit) {
			v, err := snap.Get(start)
			if errors.Is(err, storage.ErrNotFound) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%w: get: %w", ErrUnavailable, err)
			}
			if maxPos != nil {
				*maxPos = max(*maxPos, v.Pos)
			}
			visit(start, v.Data, v.Meta, v.Version)
			return nil
		}
		err := snap.ScanInto(start, end, limit, buf, func(k []byte, v storage.Value) bool {
			if maxPos != nil {
				*maxPos = max(*maxPos, v.Pos)
			}
			return visit(k, v.Data, v.Meta, v.Version)
		})
		if err != nil {
			return fmt.Errorf("%w: scan: %w", ErrUnavailable, err)
		}
		return nil
	}
}
