package storage

// Keys calls fn for every key in [start, end) (end nil = no bound) that the
// index holds, in order, deleted keys (tombstones not yet compacted away)
// included, until fn returns false. It reads no record: it is for callers
// that decide about each key themselves (a flush deletes whatever a key holds
// as of its own state, internal/kv.Lister) and must not pay a value read per
// key. The keys handed to fn are copies, safe to keep. It does not see one
// state: keys appended while it runs may or may not be visited (it holds the
// index lock per batch of keysBatch keys, not for the whole walk).
func (db *DB) Keys(start, end []byte, fn func(key []byte) bool) error {
	from := string(start)
	inclusive := true
	batch := make([][]byte, 0, keysBatch)
	for {
		batch = batch[:0]
		db.mu.RLock()
		if db.closed {
			db.mu.RUnlock()
			return ErrClosed
		}
		db.idx.ascend(from, func(it *item) bool {
			key := db.idx.keyOf(it)
			if !inclusive && key == from {
				return true
			}
			if end != nil && key >= keyString(end) {
				return false
			}
			batch = append(batch, []byte(key))
			return len(batch) < keysBatch
		})
		db.mu.RUnlock()
		for _, k := range batch {
			if !fn(k) {
				return nil
			}
		}
		if len(batch) < keysBatch {
			return nil
		}
		from = string(batch[len(batch)-1])
		inclusive = false
	}
}

const keysBatch = 1024
