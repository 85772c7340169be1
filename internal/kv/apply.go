package kv

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// Getter reads the state an operation is evaluated against: key's value and
// version, exists false for a key that is absent or deleted. For a miss, a
// store that knows the deletion's version may return it (a read reports it
// as the version it saw); 0 otherwise. An error is the store's own failure,
// not an outcome of the operation: Apply and Read return it unchanged (the
// caller wraps it as its "unavailable") and it must never be cached as the
// op's result.
//
// A func rather than an interface: a caller's closure (its chunk of staged
// records in front of the engine) then stays on its stack, so a read or a
// write through here allocates nothing for it.
//
// meta is the record's meta (storage.Record.Meta: type and expiry,
// expiry.go), nil for a plain string. A stored key whose expiry has passed is
// returned like any other: Apply and Read decide with op.Now that it is
// absent.
type Getter func(key []byte) (data, meta []byte, version uint64, exists bool, err error)

// Emit receives a record an operation writes: key's new value, or its
// deletion (tombstone, value nil). Every record of one operation has the
// version Apply was given; the caller stores them with it (and a timestamp of
// its choosing: the state machine has no clock). An op writes each key at
// most once. key and value alias the op's slices (or, for INCRBY and APPEND,
// a new value): the caller copies what it keeps past them.
//
// A func, like Getter, so that the caller stages records straight into its
// own batch (a storage.Record slice) without a copy in between.
//
// meta is the record's meta (nil: a string without expiry; always nil for a
// tombstone); the caller stores it with the value (storage.Record.Meta).
type Emit func(key, value, meta []byte, tombstone bool)

// Apply evaluates the write op at version against the state get reads (the
// state as of version-1: the store, with whatever the caller staged before
// this op in front of it), hands the records it writes to emit and returns
// the op's result. It is deterministic: the same op at the same version over
// the same state gives the same records and result, which is what lets every
// replica of a group evaluate a committed op on its own and a replica replay
// one after a crash.
//
// An op that writes nothing (a SET NX of an existing key, a DEL of absent
// keys) emits nothing and its result's Version is the version it read: a
// caller that hands out versions (internal/shard) consumes one only if
// records came. GETSET's and SET GET's Bulk aliases what get returned.
//
// maxValue (0: no limit) is the store's value limit, checked where only
// evaluation knows the size (APPEND); the caller checks the op's own sizes
// (Op.CheckSizes) where it accepts it.
//
// On error (the op's own, ErrWrongType..., or get's, returned unchanged) the
// op has no effect: the caller discards whatever emit received for it (a
// DEL whose read of a later key failed).
//
// Keys whose expiry is before op.Now are absent to every op (expiry.go).
//
// A write of a key that a prepared cross-group transaction locks does not
// apply (txLockGate, xgtx.go).
func Apply(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	if res, err, locked := txLockGate(get, op); locked {
		return res, err
	}
	return apply(get, version, op, maxValue, emit)
}

// ApplyLockFree is Apply for a state that can hold no cross-group
// transaction's locks — the single node's (internal/shard): prepares exist
// only in a cluster of groups, whose replicas apply through ApplyWith. It
// skips the lock rule's lookup of the count record, which was 6.2 % of a
// single node's pipelined SET's instructions (docs/design/transactions.md).
func ApplyLockFree(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	return apply(get, version, op, maxValue, emit)
}

// apply is Apply past the lock gate.
func apply(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	if isExpiryKind(op.Kind) {
		return applyExpiry(get, version, op, emit)
	}
	if isScriptKind(op.Kind) {
		return applyScriptOp(get, nil, false, version, op, maxValue, emit) // script.go; ApplyWith passes a Lister
	}
	if isSlotKind(op.Kind) {
		return applySlotOp(get, version, op, emit) // slots.go
	}
	if op.Kind == KindExec {
		return applyExec(get, nil, false, version, op, maxValue, emit) // tx.go; ApplyWith passes a Lister
	}
	if op.Kind == KindTxCommit {
		return applyTxCommit(get, version, op, maxValue, emit) // itx.go
	}
	if isXgtxKind(op.Kind) {
		return applyXgtx(get, version, op, maxValue, emit) // xgtx.go
	}
	switch op.Kind {
	case KindSet:
		if err := CheckKey(op.Key); err != nil {
			return Result{}, err
		}
		var old, oldMeta []byte
		var oldVer uint64
		exists, stored := false, false
		gone := op.ExpireAt != 0 && op.ExpireAt <= op.Now // SET EXAT in the past
		// A plain SET (EX or not) reads nothing: the common case stays a blind write.
		if op.Cond != Always || op.ReturnOld || op.TTL&TTLKeep != 0 || gone {
			var err error
			if old, oldMeta, oldVer, exists, stored, err = lookup(get, op.Key, op.Now); err != nil {
				return Result{}, err
			}
			if exists && op.ReturnOld {
				// SET GET answers the old string: WRONGTYPE on a hash (a
				// plain SET replaces whatever the key holds).
				if err := notString(oldMeta); err != nil {
					return Result{}, err
				}
			}
		}
		res := Result{Kind: ResOK}
		if op.ReturnOld {
			res = Result{Kind: ResNil}
			if exists {
				res = Result{Kind: ResBulk, Bulk: old}
			}
		}
		if (op.Cond == IfAbsent && exists) || (op.Cond == IfPresent && !exists) {
			if !op.ReturnOld {
				res.Kind = ResNil
			}
			res.Version = oldVer
			return res, nil
		}
		if gone {
			// Expired as it is set: Redis deletes it at once (and replicates a DEL).
			res.Version = oldVer
			if stored {
				emit(op.Key, nil, nil, true)
				res.Version = version
			}
			return res, nil
		}
		var meta []byte
		switch {
		case op.TTL&TTLKeep != 0:
			if exists {
				// The expiry only: the value is a string now, whatever the
				// key held (a hash's type byte must not survive).
				meta = EncodeMeta(TypeString, ExpireAt(oldMeta))
			}
		case op.ExpireAt != 0:
			meta = EncodeMeta(TypeString, op.ExpireAt)
		}
		put(emit, op.Key, op.Value, meta)
		res.Version = version
		return res, nil

	case KindMSet:
		if len(op.Keys) == 0 || len(op.Keys)%2 != 0 {
			return Result{}, fmt.Errorf("%w: MSET needs key value pairs", ErrInvalidOp)
		}
		for i := 0; i < len(op.Keys); i += 2 {
			if err := CheckKey(op.Keys[i]); err != nil {
				return Result{}, err
			}
		}
		// One version for the whole MSET: it is one atomic update. A key
		// named twice (MSET a 1 a 2) keeps the last value, in one record: a
		// store holds one state per key and version (the storage engine
		// refuses a second record of a key at one version, and with it the
		// whole batch).
		for i := 0; i < len(op.Keys); i += 2 {
			if !dupAfter(op.Keys, i) {
				put(emit, op.Keys[i], op.Keys[i+1], nil) // MSET clears expiries, as SET does
			}
		}
		return Result{Kind: ResOK, Version: version}, nil

	case KindDel:
		for _, k := range op.Keys {
			if err := CheckKey(k); err != nil {
				return Result{}, err
			}
		}
		var n int64
		var ver uint64
		for i, k := range op.Keys {
			// DEL a a counts a once: the second sees the first's deletion.
			if dupBefore(op.Keys, i) {
				continue
			}
			_, _, _, live, stored, err := lookup(get, k, op.Now)
			if err != nil {
				return Result{}, err
			}
			if !stored {
				continue
			}
			// An expired key is deleted too (as Redis's lookup does) but
			// not counted: it was already absent.
			ver = version
			emit(k, nil, nil, true)
			if live {
				n++
			}
		}
		return Result{Kind: ResInt, Int: n, Version: ver}, nil

	case KindIncrBy:
		if err := CheckKey(op.Key); err != nil {
			return Result{}, err
		}
		old, meta, _, exists, _, err := lookup(get, op.Key, op.Now)
		if err == nil && exists {
			err = notString(meta)
		}
		if err != nil {
			return Result{}, err
		}
		cur, err := addInt(old, exists, op.Delta, ErrWrongType)
		if err != nil {
			return Result{}, err
		}
		put(emit, op.Key, strconv.AppendInt(nil, cur, 10), meta) // INCR keeps the expiry
		return Result{Kind: ResInt, Int: cur, Version: version}, nil

	case KindGetSet:
		if err := CheckKey(op.Key); err != nil {
			return Result{}, err
		}
		old, oldMeta, _, exists, _, err := lookup(get, op.Key, op.Now)
		if err == nil && exists {
			err = notString(oldMeta)
		}
		if err != nil {
			return Result{}, err
		}
		res := Result{Kind: ResNil}
		if exists {
			res = Result{Kind: ResBulk, Bulk: old}
		}
		put(emit, op.Key, op.Value, nil) // GETSET clears the expiry, as SET does
		res.Version = version
		return res, nil

	case KindAppend:
		if err := CheckKey(op.Key); err != nil {
			return Result{}, err
		}
		old, meta, _, _, _, err := lookup(get, op.Key, op.Now)
		if err == nil {
			err = notString(meta)
		}
		if err != nil {
			return Result{}, err
		}
		if n := len(old) + len(op.Value); maxValue > 0 && n > maxValue {
			// Known only here, so refused here: the store would refuse the
			// whole batch the record came in (on a replica, every replica
			// that applies the op).
			return Result{}, fmt.Errorf("%w: APPEND would make a value of %d bytes > %d", ErrInvalidOp, n, maxValue)
		}
		nv := make([]byte, 0, len(old)+len(op.Value))
		nv = append(append(nv, old...), op.Value...)
		put(emit, op.Key, nv, meta) // APPEND keeps the expiry
		return Result{Kind: ResInt, Int: int64(len(nv)), Version: version}, nil

	case KindCAS:
		if err := CheckKey(op.Key); err != nil {
			return Result{}, err
		}
		old, oldMeta, oldVer, exists, _, err := lookup(get, op.Key, op.Now)
		if err == nil && exists {
			err = notString(oldMeta)
		}
		if err != nil {
			return Result{}, err
		}
		if !exists || !bytes.Equal(old, op.Expected) {
			return Result{Kind: ResInt, Int: 0, Version: oldVer}, nil
		}
		put(emit, op.Key, op.Value, nil) // a swap is a SET: it clears the expiry
		return Result{Kind: ResInt, Int: 1, Version: version}, nil
	}
	if res, err, ok := applyMore(get, version, op, maxValue, emit); ok {
		return res, err
	}
	return Result{}, fmt.Errorf("%w: %v is not a write", ErrInvalidOp, op.Kind)
}

// put emits key's new value and meta; a value is never nil (nil means a deletion).
func put(emit Emit, key, value, meta []byte) {
	if value == nil {
		value = []byte{}
	}
	emit(key, value, meta, false)
}

// CheckKey refuses the keys no write may store: the empty key (the store
// has none; ErrInvalidOp) and the reserved ones (ErrReservedKey). Apply
// checks every key it writes; a replica that answers a write before
// applying it checks them first.
func CheckKey(k []byte) error {
	if len(k) == 0 {
		return fmt.Errorf("%w: empty key", ErrInvalidOp)
	}
	if IsReserved(k) {
		return ErrReservedKey
	}
	return nil
}

// dupAfter reports whether MSET's key at i (keys alternate key, value) is
// named again later.
func dupAfter(kvs [][]byte, i int) bool {
	for j := i + 2; j < len(kvs); j += 2 {
		if bytes.Equal(kvs[j], kvs[i]) {
			return true
		}
	}
	return false
}

func dupBefore(keys [][]byte, i int) bool {
	for j := 0; j < i; j++ {
		if bytes.Equal(keys[j], keys[i]) {
			return true
		}
	}
	return false
}

// addInt is INCRBY's (and HINCRBY's) arithmetic: old (0 if !exists) plus
// delta. An old value that is no integer is notInt (each command has its
// text); a sum out of int64's range is ErrOverflow.
func addInt(old []byte, exists bool, delta int64, notInt error) (int64, error) {
	var cur int64
	if exists {
		var err error
		if cur, err = ParseInt(old); err != nil {
			return 0, notInt
		}
	}
	if (delta > 0 && cur > math.MaxInt64-delta) || (delta < 0 && cur < math.MinInt64-delta) {
		return 0, ErrOverflow
	}
	return cur + delta, nil
}

// ParseInt parses a stored value as INCR does: a decimal int64, nothing else
// (no sign '+', no leading zeros, at most 20 bytes); else ErrWrongType.
func ParseInt(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, ErrWrongType
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || (len(b) > 1 && (b[0] == '0' || (b[0] == '-' && b[1] == '0'))) || b[0] == '+' {
		return 0, ErrWrongType
	}
	return n, nil
}
