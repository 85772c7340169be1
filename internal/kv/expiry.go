package kv

import (
	"encoding/binary"
	"fmt"
)

// Key expiry (TTLs): the meta a record carries, the ops that set and read it,
// and the rule that decides whether a key has expired
// (docs/design/expiry.md).
//
// The state machine never reads a clock: every op carries Now, the unix
// milliseconds of the node that proposed it (a write) or serves it (a read),
// and "expired" is decided against op.Now only, so every replica that applies
// a write decides the same. A relative TTL (SET EX, EXPIRE) is turned into an
// absolute time (ExpireAt) by the front door with the same clock reading it
// puts in Now, as Redis 7 replicates PXAT.

// Expiry op kinds. They are numbered from kindExpiryBase, apart from the
// string kinds, so that kinds other parts add after KindCAS cannot collide
// with them: kinds are on disk (the VR log).
const (
	kindExpiryBase Kind = 64

	// KindTTL is a read: TTL, PTTL, EXPIRETIME, PEXPIRETIME (Op.Delta: TTLUnit).
	KindTTL Kind = kindExpiryBase + iota - 1
	// KindExpire sets Key's expiry to ExpireAt (EXPIRE, PEXPIRE, EXPIREAT,
	// PEXPIREAT), under Op.TTL's NX|XX|GT|LT; an expiry not after Now deletes
	// the key. Result 1 if it was set (or the key deleted), 0 if not.
	KindExpire
	// KindPersist removes Key's expiry: result 1 if it had one, else 0.
	KindPersist
	// KindGetEx answers Key's value (nil if absent) and sets its expiry to
	// ExpireAt, or removes it (TTLPersist). GETEX without options is a GET.
	KindGetEx
	// KindExpireIfDue deletes those of Keys that are stored and expired at Now:
	// the replicated delete of active expiry, which rechecks with its own Now
	// so that a write after the leader found the key expired wins. Result: the
	// number deleted.
	KindExpireIfDue
	kindExpiryEnd
)

var expiryKindNames = [...]string{"ttl", "expire", "persist", "getex", "expireifdue"}

func isExpiryKind(k Kind) bool { return k >= KindTTL && k < kindExpiryEnd }

// TTLFlag is an op's expiry options (Op.TTL).
type TTLFlag uint8

const (
	// TTLKeep (SET KEEPTTL) keeps the key's expiry; without it SET clears it.
	TTLKeep TTLFlag = 1 << iota
	// TTLPersist (GETEX PERSIST) removes the expiry.
	TTLPersist
	// TTLNX, TTLXX, TTLGT, TTLLT are EXPIRE's conditions: set only if the key
	// has no expiry, has one, the new one is later (no expiry counts as
	// infinite), or earlier.
	TTLNX
	TTLXX
	TTLGT
	TTLLT
)

// TTLUnit says what a KindTTL read answers (in Op.Delta).
const (
	UnitPTTL        = 0 // milliseconds left
	UnitTTL         = 1 // seconds left, rounded
	UnitPExpireTime = 2 // absolute unix milliseconds
	UnitExpireTime  = 3 // absolute unix seconds, rounded
)

// The meta a record carries (storage.Record.Meta), owned by kv: byte 0 is
// the value's type, then, if the key has an expiry, its absolute time in unix
// milliseconds, 8 bytes little endian. A string without expiry (the common
// case) has no meta at all. The encoding is self-contained, so a command
// that moves a key (RENAME, COPY) copies it verbatim.
const (
	// TypeString is the type byte of a string value.
	TypeString byte = 0
)

// metaLenTTL is the length of the meta of a key with an expiry.
const metaLenTTL = 9

// EncodeMeta returns the meta of a value of type typ expiring at expireAt
// (unix ms; 0: never). A string that never expires has none (nil).
func EncodeMeta(typ byte, expireAt int64) []byte {
	if expireAt == 0 {
		if typ == TypeString {
			return nil
		}
		return []byte{typ}
	}
	b := make([]byte, metaLenTTL)
	b[0] = typ
	binary.LittleEndian.PutUint64(b[1:], uint64(expireAt))
	return b
}

// MetaType is the type byte of meta (TypeString for none).
func MetaType(meta []byte) byte {
	if len(meta) == 0 {
		return TypeString
	}
	return meta[0]
}

// ExpireAt returns meta's expiry in unix milliseconds, 0 if none.
func ExpireAt(meta []byte) int64 {
	if len(meta) < metaLenTTL {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(meta[1:]))
}

// HasExpiry reports whether meta carries an expiry: what the engine's
// count of keys with meta (storage.Options.CountMeta, INFO keyspace's
// expires=) counts — a hash's type byte alone is not an expiry.
func HasExpiry(meta []byte) bool { return ExpireAt(meta) != 0 }

// Expired reports whether a value with meta has expired at now (unix ms):
// its expiry is before now, as Redis decides (a key is still there in the
// millisecond of its expiry).
func Expired(meta []byte, now int64) bool {
	at := ExpireAt(meta)
	return at != 0 && now > at
}

// withExpiry returns meta with its expiry replaced by at (0: removed).
func withExpiry(meta []byte, at int64) []byte { return EncodeMeta(MetaType(meta), at) }

// lookup reads key through get as of now: stored says a record exists (it may
// have expired), live that it exists and has not expired.
func lookup(get Getter, key []byte, now int64) (data, meta []byte, ver uint64, live, stored bool, err error) {
	data, meta, ver, stored, err = get(key)
	if err != nil || !stored {
		return nil, nil, ver, false, false, err
	}
	if Expired(meta, now) {
		return nil, nil, ver, false, true, nil
	}
	return data, meta, ver, true, true, nil
}

// applyExpiry evaluates the expiry write kinds for Apply.
func applyExpiry(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	switch op.Kind {
	case KindExpire, KindPersist, KindGetEx:
		if err := CheckKey(op.Key); err != nil {
			return Result{}, err
		}
		data, meta, oldVer, live, _, err := lookup(get, op.Key, op.Now)
		if err != nil {
			return Result{}, err
		}
		miss := Result{Kind: ResInt, Version: oldVer}
		if op.Kind == KindGetEx {
			miss.Kind = ResNil
		}
		if !live {
			return miss, nil
		}
		if op.Kind == KindGetEx {
			if err := notString(meta); err != nil {
				return Result{}, err
			}
		}
		cur := ExpireAt(meta)
		res := Result{Kind: ResInt, Int: 1, Version: version}
		if op.Kind == KindGetEx {
			res = Result{Kind: ResBulk, Bulk: data, Version: version}
		}
		switch {
		case op.Kind == KindPersist || (op.Kind == KindGetEx && op.TTL&TTLPersist != 0):
			if cur == 0 {
				if op.Kind == KindGetEx {
					miss = Result{Kind: ResBulk, Bulk: data, Version: oldVer}
				}
				return miss, nil
			}
			put(emit, op.Key, data, withExpiry(meta, 0))
			return res, nil
		case op.Kind == KindGetEx && op.ExpireAt == 0:
			return Result{Kind: ResBulk, Bulk: data, Version: oldVer}, nil
		}
		if op.Kind == KindExpire && !expireCondOK(op.TTL, cur, op.ExpireAt) {
			return miss, nil
		}
		if op.ExpireAt <= op.Now {
			// Already expired: deleted now, as Redis does (it replicates a DEL).
			emit(op.Key, nil, nil, true)
			return res, nil
		}
		put(emit, op.Key, data, withExpiry(meta, op.ExpireAt))
		return res, nil

	case KindExpireIfDue:
		var n int64
		var ver uint64
		for i, k := range op.Keys {
			if IsReserved(k) || len(k) == 0 || dupBefore(op.Keys, i) {
				continue
			}
			_, _, _, live, stored, err := lookup(get, k, op.Now)
			if err != nil {
				return Result{}, err
			}
			if stored && !live {
				emit(k, nil, nil, true)
				ver = version
				n++
			}
		}
		return Result{Kind: ResInt, Int: n, Version: ver}, nil
	}
	return Result{}, fmt.Errorf("%w: %v is not a write", ErrInvalidOp, op.Kind)
}

// expireCondOK is EXPIRE's NX|XX|GT|LT against the key's current expiry cur
// (0: none, which GT and LT treat as infinite, as Redis does).
func expireCondOK(f TTLFlag, cur, at int64) bool {
	switch {
	case f&TTLNX != 0:
		return cur == 0
	case f&TTLXX != 0 && cur == 0:
		return false
	case f&TTLGT != 0:
		return cur != 0 && at > cur
	case f&TTLLT != 0:
		return cur == 0 || at < cur
	}
	return true
}

// readTTL serves KindTTL: -2 for a missing (or expired) key, -1 for a key
// without expiry, else the time left or the expiry, in op.Delta's unit, with
// Redis's rounding.
func readTTL(get Getter, op *Op) (Result, error) {
	_, meta, ver, live, _, err := lookup(getUserGetter(get), op.Key, op.Now)
	if err != nil {
		return Result{}, err
	}
	res := Result{Kind: ResInt, Int: -2, Version: ver}
	if !live {
		return res, nil
	}
	at := ExpireAt(meta)
	if at == 0 {
		res.Int = -1
		return res, nil
	}
	t := at
	if op.Delta == UnitPTTL || op.Delta == UnitTTL {
		t = max(at-op.Now, 0)
	}
	if op.Delta == UnitTTL || op.Delta == UnitExpireTime {
		t = (t + 500) / 1000
	}
	res.Int = t
	return res, nil
}

// getUserGetter is get with reserved keys absent.
func getUserGetter(get Getter) Getter {
	return func(k []byte) ([]byte, []byte, uint64, bool, error) {
		if IsReserved(k) {
			return nil, nil, 0, false, nil
		}
		return get(k)
	}
}

// Live reports whether a value with meta, read at now, is visible: the one
// rule every read path that bypasses Read (a host's GET hot path) applies.
func Live(meta []byte, now int64) bool { return !Expired(meta, now) }
