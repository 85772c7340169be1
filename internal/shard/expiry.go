package shard

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// FindExpired samples the keys of db that carry meta (storage.DB.MetaKeys:
// the index's flag, no per-key expiry copy in memory), from the key from on,
// at most max of them and walking at most walk index entries, and returns
// those expired at now (kv.Expired), how many it sampled and where the next
// call continues (nil: the walk reached the end and starts over).
//
// It is the finding half of active expiry (docs/design/expiry.md): the
// leader proposes a kv.KindExpireIfDue of the keys it returns, which
// rechecks each with the op's own Now, so a write that lands in between
// wins. Only the leader (or a single node) deletes: replicas never do.
func FindExpired(db *storage.DB, from []byte, now int64, walk, max int) (expired [][]byte, sampled int, next []byte, err error) {
	var cands [][]byte
	next, err = db.MetaKeys(from, walk, func(k []byte) bool {
		cands = append(cands, k)
		return len(cands) < max
	})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("%w: expiry walk: %w", ErrUnavailable, err)
	}
	for _, k := range cands {
		if kv.IsReserved(k) {
			continue
		}
		v, err := db.GetShared(k)
		if errors.Is(err, storage.ErrNotFound) {
			continue // deleted since the walk
		}
		if err != nil {
			return nil, 0, nil, fmt.Errorf("%w: expiry read: %w", ErrUnavailable, err)
		}
		sampled++
		if kv.Expired(v.Meta, now) {
			expired = append(expired, k)
		}
	}
	return expired, sampled, next, nil
}
