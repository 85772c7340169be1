package shard

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// keyLister is an Engine that lists its keys without reading their records
// (storage.DB.Keys). Optional: an engine without it is listed with Scan.
type keyLister interface {
	Keys(start, end []byte, fn func(key []byte) bool) error
}

var _ keyLister = (*storage.DB)(nil)

// listEngineKeys visits every key of db in [start, end) (nil: unbounded;
// with a keyLister, deleted ones too).
func listEngineKeys(db Engine, start, end []byte, visit func(key []byte) bool) error {
	var err error
	if kl, ok := db.(keyLister); ok {
		err = kl.Keys(start, end, visit)
	} else {
		err = db.Scan(start, end, 0, 0, func(k []byte, _ storage.Value) bool { return visit(k) })
	}
	if err != nil {
		return fmt.Errorf("%w: list keys: %w", ErrUnavailable, err)
	}
	return nil
}

// flushReaders returns the Getter and the Lister a flush (or a COPY, which
// lists a hash's rows: kv.Op.Lists) is evaluated with
// when the chunk being built holds staged records s.recs[:staged]: the
// engine's keys and the staged keys the engine does not hold yet, each once,
// in key order, read through the staged records first. Both look only at the
// records staged before the flush, never at the tombstones it stages, so a
// flush of n keys costs n engine reads, not n² record comparisons.
func (s *Shard) flushReaders(staged int) (kv.Getter, kv.Lister) {
	before := s.recs[:staged:staged]
	get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		for i := len(before) - 1; i >= 0; i-- {
			if r := &before[i]; bytes.Equal(r.Key, key) {
				return r.Value, r.Meta, r.Version, !r.Tombstone, nil
			}
		}
		return s.engineGet(key)
	}
	// The engine's keys in order, with the staged keys merged in, each
	// once (kv.ApplyOptions.OrderedList: a script's or transaction's range
	// read stops listing at its limit or budget). A staged key the engine
	// lists too is dropped where the two meet, not by asking the engine
	// first: the background compaction may drop a tombstone-only key from
	// the index between the question and the walk, and a key deleted in
	// the engine and written again in this chunk would be listed by neither
	// (TestFlushReadersListStagedKeysThroughACompaction).
	list := func(start, end []byte, visit func(key []byte) bool) error {
		var extra [][]byte
		for i := range before {
			k := before[i].Key
			if (start != nil && bytes.Compare(k, start) < 0) || (end != nil && bytes.Compare(k, end) >= 0) {
				continue
			}
			extra = append(extra, k)
		}
		slices.SortFunc(extra, bytes.Compare)
		extra = slices.CompactFunc(extra, bytes.Equal)
		i, stop := 0, false
		if err := listEngineKeys(s.db, start, end, func(k []byte) bool {
			for ; i < len(extra) && bytes.Compare(extra[i], k) < 0; i++ {
				if !visit(extra[i]) {
					stop = true
					return false
				}
			}
			if i < len(extra) && bytes.Equal(extra[i], k) {
				i++ // staged and listed by the engine: once
			}
			stop = !visit(k)
			return !stop
		}); err != nil || stop {
			return err
		}
		for ; i < len(extra); i++ {
			if !visit(extra[i]) {
				return nil
			}
		}
		return nil
	}
	return get, list
}

// finishFlush completes a flush a crash interrupted. A flush's records are
// one batch, its mark (kv.FlushMark) first; the engine recovers a prefix of
// a batch, so a kept tombstone of the flush means a kept mark, and a lost
// mark means no tombstone was kept: every user key the flush found is then
// either gone (the mark is here: this finishes it) or all there (FLUSHDB is
// all-or-nothing across kill -9). A key whose newest version is below the
// mark's was written before the flush and is deleted at the mark's version;
// a later write has a higher version and stays. The mark is deleted after
// (so a later open does not walk the keyspace again), at a version of its
// own, in the same synced batch. Called by Open after openVersions.
func (s *Shard) finishFlush() error {
	mark, err := s.db.Get(kv.FlushMark)
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read flush mark: %w", err)
	}
	var recs []storage.Record
	var verr error
	if err := listEngineKeys(s.db, nil, nil, func(k []byte) bool {
		if !kv.FlushDeletes(k) {
			return true
		}
		vs, err := s.db.Versions(k)
		if err != nil {
			if !errors.Is(err, storage.ErrNotFound) {
				verr = err
				return false
			}
			return true
		}
		if len(vs) > 0 && !vs[0].Tombstone && kv.FlushPending(mark.Version, vs[0].Version, k) {
			recs = append(recs, storage.Record{Key: k, Version: mark.Version, Timestamp: mark.Timestamp, Tombstone: true})
		}
		return true
	}); err != nil {
		return err
	}
	if verr != nil {
		return fmt.Errorf("finish flush: %w", verr)
	}
	v := s.next
	s.next++
	recs = append(recs, storage.Record{Key: kv.FlushMark, Version: v, Timestamp: s.opts.Now().UnixNano(), Tombstone: true})
	if err := s.appendSynced(recs...); err != nil {
		return fmt.Errorf("finish flush: %w", err)
	}
	if n := len(recs) - 1; n > 0 {
		s.log.Warn("finished a FLUSHDB interrupted by a crash", "keys_deleted", n, "flush_version", mark.Version)
	}
	return nil
}
