package storage

// countMeta is the index flag verCounted for a record with meta m.
func (db *DB) countMeta(m []byte) uint32 {
	if db.opts.CountMeta == nil || db.opts.CountMeta(m) {
		return verCounted
	}
	return 0
}

// MetaKeys calls fn, in key order from start (inclusive), with each key whose
// newest version is a value carrying meta (Record.Meta) until fn returns
// false, examining at most walk index entries (walk <= 0: no bound). It
// returns the key to continue from, nil once it reached the end.
//
// It reads the index only (the verMeta flag), not the values, so a caller
// looking for expired keys (the leader's active expiry) walks the keyspace
// incrementally at the cost of a tree walk, under the read lock for at most
// walk entries, and reads the meta (Get) of only the keys it visits. fn runs
// under the engine's read lock: it must not call back into the engine.
func (db *DB) MetaKeys(start []byte, walk int, fn func(key []byte) bool) (next []byte, err error) {
	db.mu.RLock()
	defer db.mu.RUnlock()
	if db.closed {
		return nil, ErrClosed
	}
	n := 0
	db.idx.ascend(string(start), func(it *item) bool {
		key := db.idx.keyOf(it)
		if walk > 0 && n >= walk {
			next = []byte(key)
			return false
		}
		n++
		if it.v.hasMeta() && !it.v.tombstone() && !fn([]byte(key)) {
			next = append([]byte(key), 0) // continue after it
			return false
		}
		return true
	})
	return next, nil
}
