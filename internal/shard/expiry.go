package shard

import (
	"errors"
	"fmt"
	"time"

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
	next, err = db.MetaKeys(from, walk, upTo(&cands, max))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("%w: expiry walk: %w", ErrUnavailable, err)
	}
	sampled, err = eachMeta(db, cands, func(k, meta []byte) {
		if kv.Expired(meta, now) {
			expired = append(expired, k)
		}
	})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("%w: expiry read: %w", ErrUnavailable, err)
	}
	return expired, sampled, next, nil
}

// upTo is a storage.DB.MetaKeys callback that collects keys into *keys
// until it holds max.
func upTo(keys *[][]byte, max int) func([]byte) bool {
	return func(k []byte) bool {
		*keys = append(*keys, k)
		return len(*keys) < max
	}
}

// eachMeta reads the meta of each of keys that is still stored and not
// reserved (a sample MetaKeys took, read outside its lock), calls fn with
// it, and returns how many it read: the one reading loop of active
// expiry's sample and INFO's TTL sample.
func eachMeta(db *storage.DB, keys [][]byte, fn func(key, meta []byte)) (n int, err error) {
	for _, k := range keys {
		if kv.IsReserved(k) {
			continue
		}
		v, err := db.GetShared(k)
		if errors.Is(err, storage.ErrNotFound) {
			continue // deleted since the walk
		}
		if err != nil {
			return n, err
		}
		n++
		fn(k, v.Meta)
	}
	return n, nil
}

// Active expiry's adaptive cycle (docs/design/expiry.md, Redis's): each
// tick runs rounds, each sampling ExpirySample keys with meta (walking at
// most ExpiryWalk index entries) and deleting the expired ones; the cycle
// goes on with another round while more than 1/ExpiryStaleFrac of a sample
// had expired, for at most a quarter of the tick on the runner's clock.
const (
	// DefaultActiveExpiry is the cycle's tick by default (Redis's hz 10).
	DefaultActiveExpiry = 100 * time.Millisecond

	ExpirySample    = 256  // keys with meta sampled per round
	ExpiryWalk      = 4096 // index entries walked per round at most
	ExpiryStaleFrac = 10   // go on while more than 1/ExpiryStaleFrac expired
)

// ExpiryRound is one round of the cycle over db from cursor at now (unix ms,
// the clock of the leader or single node that deletes): the keys to delete
// (FindExpired), where the next round goes on, and whether the cycle
// should run another round this tick (the walk is not at its end and more
// than 1/ExpiryStaleFrac of the sample expired). The one copy of the
// decision, for the single node's cycle (internal/server) and the replica
// host's (vrshard), whose clocks drive it.
func ExpiryRound(db *storage.DB, cursor []byte, now int64) (expired [][]byte, next []byte, more bool, err error) {
	expired, sampled, next, err := FindExpired(db, cursor, now, ExpiryWalk, ExpirySample)
	if err != nil {
		return nil, cursor, false, err
	}
	more = next != nil && sampled > 0 && len(expired)*ExpiryStaleFrac > sampled
	return expired, next, more, nil
}

// TTLSampleKeys and TTLSampleWalk bound SampleTTL: INFO keyspace's avg_ttl
// reads at most this many values, walking at most this many index entries.
const (
	TTLSampleKeys = 128
	TTLSampleWalk = 4096
)

// SampleTTL estimates INFO keyspace's avg_ttl over db at now (unix ms): it
// reads the keys with meta from the key from on (wrapping to the start once
// if the walk ends first), at most TTLSampleKeys of them, and returns the
// sum of the remaining times to live of those with an expiry not yet passed
// and how many they are. Redis's avg_ttl is an estimate too (a running
// average of its expiry cycle's samples); sampling at INFO time gives every
// replica one, followers included, which run no expiry cycle, and costs
// nothing on the write path.
func SampleTTL(db *storage.DB, from []byte, now int64) (sum int64, n int, err error) {
	var keys [][]byte
	collect := upTo(&keys, TTLSampleKeys)
	next, err := db.MetaKeys(from, TTLSampleWalk, collect)
	if err == nil && next == nil && len(from) > 0 && len(keys) < TTLSampleKeys {
		_, err = db.MetaKeys(nil, TTLSampleWalk, func(k []byte) bool {
			if string(k) >= string(from) {
				return false // back where the first walk began
			}
			return collect(k)
		})
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%w: ttl sample: %w", ErrUnavailable, err)
	}
	_, err = eachMeta(db, keys, func(_, meta []byte) {
		if at := kv.ExpireAt(meta); at != 0 && at >= now {
			sum += at - now
			n++
		}
	})
	if err != nil {
		return 0, 0, fmt.Errorf("%w: ttl sample read: %w", ErrUnavailable, err)
	}
	return sum, n, nil
}
