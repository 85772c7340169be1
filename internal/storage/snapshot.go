package storage

import (
	"errors"
	"slices"
)

// Snapshot is a consistent read view at a version. While it is open, the retention policy
// keeps every version it can read (for each key, the newest version <= its version).
type Snapshot struct {
	db     *DB
	at     uint64
	closed bool
}

// Snapshot pins the versions a reader at version at needs. at 0 means the last version.
// Close it when done.
func (db *DB) Snapshot(at uint64) *Snapshot {
	db.mu.Lock()
	defer db.mu.Unlock()
	if at == 0 {
		at = db.lastV
	}
	i, _ := slices.BinarySearch(db.snaps, at)
	db.snaps = slices.Insert(db.snaps, i, at)
	return &Snapshot{db: db, at: at}
}

// Version returns the version the snapshot reads at.
func (s *Snapshot) Version() uint64 { return s.at }

// Get reads key at the snapshot's version.
func (s *Snapshot) Get(key []byte) (Value, error) {
	v, err := s.db.getAt(key, s.at, false)
	if errors.Is(err, ErrVersionGone) {
		// The snapshot pinned the version it reads since before anything could be
		// pruned, so nothing retained at or below it means the key did not exist.
		return Value{}, ErrNotFound
	}
	return v, err
}

// Scan scans at the snapshot's version (see DB.Scan).
func (s *Snapshot) Scan(start, end []byte, limit int, fn func(key []byte, v Value) bool) error {
	return s.db.scanAt(start, end, s.at, limit, nil, fn)
}

// ScanInto is Scan reading the values into *buf (see DB.ScanInto).
func (s *Snapshot) ScanInto(start, end []byte, limit int, buf *[]byte, fn func(key []byte, v Value) bool) error {
	return s.db.scanAt(start, end, s.at, limit, buf, fn)
}

// Close unpins the snapshot's versions. They become garbage if nothing else keeps them.
func (s *Snapshot) Close() error {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	i, found := slices.BinarySearch(db.snaps, s.at)
	if !found {
		panic("storage: open snapshot missing from the pinned list")
	}
	db.snaps = slices.Delete(db.snaps, i, i+1)
	return nil
}
