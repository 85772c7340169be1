//go:build !nokefir

package main

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/storage"
)

func init() { openers["kefir"] = openKefir }

// kefirEngine drives internal/storage through its public API (docs/design/storage-api.md).
// Put is Append then Sync(pos): Append group-commits concurrent callers into one write,
// and concurrent Syncs share one fsync, so one fsync covers every writer waiting at that
// moment — the same durability as Pebble's Sync and bbolt's Batch.
type kefirEngine struct {
	db  *storage.DB
	ver *atomic.Uint64 // versions must increase per key; one counter across the run does that
}

// kefirVersions survives reopen so versions keep increasing across a Close/Open.
var kefirVersions atomic.Uint64

func openKefir(dir string, cfg Config) (Engine, error) {
	db, err := storage.Open(storage.Options{
		Devices:    []storage.Device{{Dir: dir}},
		CacheBytes: cfg.CacheBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("kefir open %s: %w", dir, err)
	}
	if lv := db.LastVersion(); lv > kefirVersions.Load() {
		kefirVersions.Store(lv)
	}
	return &kefirEngine{db: db, ver: &kefirVersions}, nil
}

func (e *kefirEngine) Put(key, val []byte) error {
	pos, err := e.db.Append(storage.Record{Key: key, Value: val, Version: e.ver.Add(1), Timestamp: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	_, err = e.db.Sync(pos)
	return err
}

func (e *kefirEngine) Load(keys, vals [][]byte) error {
	const per = 1024
	recs := make([]storage.Record, 0, per)
	now := time.Now().UnixNano()
	var last storage.Pos
	for i := range keys {
		recs = append(recs, storage.Record{Key: keys[i], Value: vals[i], Version: e.ver.Add(1), Timestamp: now})
		if len(recs) == per || i == len(keys)-1 {
			pos, err := e.db.Append(recs...)
			if err != nil {
				return fmt.Errorf("kefir load append: %w", err)
			}
			last = pos
			recs = recs[:0]
		}
	}
	if _, err := e.db.Sync(last); err != nil {
		return fmt.Errorf("kefir load sync: %w", err)
	}
	return nil
}

func (e *kefirEngine) Get(key, dst []byte) ([]byte, error) {
	v, err := e.db.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, errNotFound
	}
	if err != nil {
		return nil, err
	}
	return append(dst[:0], v.Data...), nil
}

func (e *kefirEngine) Scan(start []byte, n int) (int, error) {
	got := 0
	err := e.db.Scan(start, nil, 0, n, func(_ []byte, v storage.Value) bool {
		touch(v.Data)
		got++
		return got < n
	})
	return got, err
}

// Prepare writes the index hint files, so the reopen figure is "with hint files".
func (e *kefirEngine) Prepare() error { return e.db.Checkpoint() }

func (e *kefirEngine) Close() error { return e.db.Close() }

func (e *kefirEngine) fsyncs() int64 { return e.db.Stats().Syncs }
