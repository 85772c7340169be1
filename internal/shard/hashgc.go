package shard

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// FindHashGarbage is the finding half of the orphan-row sweeper
// (docs/design/hashes.md, "Garbage"): it walks the hashes' generation
// markers of db from the marker from on, examining at most markers of them,
// and for each generation that is dead (kv.HashGenDead: its key no longer
// holds it) returns sweep ops (kv.HashSweepOp) deleting its rows, at most
// rows of them in all, the marker with a generation's last page. next is
// where the next call continues (nil: the walk reached the end and starts
// over; a generation cut short by the rows budget is resumed).
//
// Like FindExpired it only proposes: the leader (or a single node) submits
// the ops through the replicated write path, and each op rechecks at apply
// that its generation is dead, so a stale view deletes nothing live.
// Replicas never sweep on their own.
func FindHashGarbage(db *storage.DB, from []byte, markers, rows int) (ops []kv.Op, next []byte, err error) {
	start, end := kv.HashMarkers()
	if from != nil {
		start = from
	}
	type marker struct {
		key, user []byte
		gen       uint64
	}
	var ms []marker
	if err := db.Scan(start, end, 0, markers+1, func(k []byte, v storage.Value) bool {
		if gen, user, ok := kv.ParseHashMarker(k, v.Data); ok {
			ms = append(ms, marker{key: bytes.Clone(k), user: bytes.Clone(user), gen: gen})
		}
		return true
	}); err != nil {
		return nil, nil, fmt.Errorf("%w: hash sweep walk: %w", ErrUnavailable, err)
	}
	if len(ms) > markers {
		next = ms[markers].key
		ms = ms[:markers]
	}
	get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		v, err := db.Get(key) // stored, expired or not: kv.HashGenDead decides
		if errors.Is(err, storage.ErrNotFound) {
			return nil, nil, 0, false, nil
		}
		if err != nil {
			return nil, nil, 0, false, fmt.Errorf("%w: hash sweep read: %w", ErrUnavailable, err)
		}
		return v.Data, v.Meta, v.Version, true, nil
	}
	for _, m := range ms {
		dead, err := kv.HashGenDead(get, m.user, m.gen)
		if err != nil {
			return nil, nil, err
		}
		if !dead {
			continue
		}
		budget := rows
		p := kv.HashRowPrefix(m.gen)
		var fields [][]byte
		if err := db.Scan(p, kv.PrefixEnd(p), 0, budget+1, func(k []byte, _ storage.Value) bool {
			if _, f, ok := kv.HashRowField(k); ok {
				fields = append(fields, bytes.Clone(f))
			}
			return true
		}); err != nil {
			return nil, nil, fmt.Errorf("%w: hash sweep rows: %w", ErrUnavailable, err)
		}
		last := len(fields) <= budget
		if !last {
			fields = fields[:budget]
		}
		ops = append(ops, kv.HashSweepOp(m.user, m.gen, fields, last))
		rows -= len(fields)
		if !last || rows <= 0 {
			// Resume at this marker (a generation cut short) or after it.
			next = m.key
			if last {
				next = append(append([]byte(nil), m.key...), 0)
			}
			return ops, next, nil
		}
	}
	return ops, next, nil
}
