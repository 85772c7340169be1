package kv

import (
	"bytes"
	"errors"
	"fmt"
)

// Keyspace and string long-tail write kinds (issue 27). They are numbered
// from 80, apart from the core kinds and the expiry kinds (64..., expiry.go),
// so that kinds added elsewhere do not take their numbers: a kind's number is
// on disk (the VR log). Every one is an update (Kind.IsUpdate: >= KindSet).
const (
	// KindRename moves Keys[0]'s record to Keys[1] (RENAME; Cond IfAbsent:
	// RENAMENX, which writes nothing if Keys[1] exists).
	KindRename Kind = 80 + iota
	// KindCopy copies Keys[0]'s record to Keys[1] (COPY; Cond Always:
	// REPLACE, else IfAbsent).
	KindCopy
	// KindGetDel deletes Key, answering its value (GETDEL).
	KindGetDel
	// KindFlush deletes every user key (FLUSHDB, FLUSHALL).
	KindFlush
	// KindSetRange overwrites Key's value from byte Delta with Value,
	// zero-padding (SETRANGE).
	KindSetRange
	// KindIncrByFloat adds the decimal Value to Key's (INCRBYFLOAT).
	KindIncrByFloat
	// KindMSetNX sets the pairs of Keys only if none of the keys exists.
	KindMSetNX
	// KindSetBit sets bit Delta of Key's value to Value ("0" or "1").
	KindSetBit
	kindMoreEnd
)

var moreKindNames = [...]string{"rename", "copy", "getdel", "flush", "setrange", "incrbyfloat", "msetnx", "setbit"}

// known reports whether k is a kind this build evaluates (DecodeOp refuses
// the others).
func (k Kind) known() bool {
	return (k >= KindGet && k <= KindCAS) || isExpiryKind(k) || (k >= KindRename && k < kindMoreEnd) ||
		isHashWrite(k) || isHashRead(k) || isScriptKind(k) || isSlotKind(k) || isTxKind(k) || isItxKind(k) || isXgtxKind(k) || k == KindBitField
}

// Errors of the keyspace and string commands: outcomes of the op, cached by
// code like the others (codec.go's resultErrs). Texts are Redis's.
var (
	ErrNoSuchKey  = errors.New("no such key")
	ErrSameObject = errors.New("source and destination objects are the same")
	ErrNotFloat   = errors.New("value is not a valid float")
	ErrNaN        = errors.New("increment would produce NaN or Infinity")
	// ErrTooBig: SETRANGE or SETBIT would make a value above the store's
	// limit (Redis's proto-max-bulk-len message).
	ErrTooBig = errors.New("string exceeds maximum allowed size (proto-max-bulk-len)")
)

// FlushMark is the reserved row a flush writes first, at its version, in the
// same batch as its tombstones. The engine keeps a prefix of a batch across a
// crash, so if any tombstone of a flush survived, the mark did: an engine
// that is not replicated (internal/shard) finishes the flush at open
// (FlushPending), which makes FLUSHDB all-or-nothing across kill -9. A VR
// replica needs no help: it replays the op from its log.
var FlushMark = ReservedKey("flush")

// Lister enumerates candidate keys in [start, end) (nil: unbounded) of the
// state an op is evaluated against: every key of the range that may exist
// there (a superset is fine: Apply asks the Getter about each), each once,
// in any order, until visit returns false. Only the ops Op.Lists names need
// it: KindFlush (the whole keyspace), KindCopy (a hash's rows), and the ops
// that run commands (KindExec, KindEval: their range reads, mergeScan).
type Lister func(start, end []byte, visit func(key []byte) bool) error

// record is what a stored key holds, as the Getter reports it. RENAME, COPY
// and GETDEL move or answer whole records through it, so what else a record
// carries besides its value (a TTL, a type) travels with it in one place.
type record struct {
	data, meta []byte
}

// getRecord reads key's record as of now (unix ms); ok false for a missing
// or expired key.
func getRecord(get Getter, key []byte, now int64) (record, uint64, bool, error) {
	data, meta, ver, ok, err := getLive(get, key, now)
	return record{data: data, meta: meta}, ver, ok, err
}

// getLive reads key as of now: ok false for a key that is missing or has
// expired (expiry.go's lookup, without "stored").
func getLive(get Getter, key []byte, now int64) (data, meta []byte, ver uint64, ok bool, err error) {
	data, meta, ver, ok, _, err = lookup(get, key, now)
	return data, meta, ver, ok, err
}

// putRecord emits rec as key's new record, its meta (type, TTL) with it.
func putRecord(emit Emit, key []byte, rec record) { put(emit, key, rec.data, rec.meta) }

// ApplyWith is Apply for a caller that can also list its state's keys,
// which FLUSHDB needs (Apply refuses a flush) and COPY of a hash, and tell
// whether a key exists without reading its value, which spares the hash
// writes a read of each field row (has may be nil: get answers).
func ApplyWith(get Getter, list Lister, has Prober, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	return ApplyWithOptions(get, list, has, version, op, maxValue, emit, ApplyOptions{})
}

// ApplyOptions are an engine's choices of how a write is laid out in
// records; the zero value is ApplyWith's.
type ApplyOptions struct {
	// SparseHashMeta: a hash write that changes neither the hash's field
	// count, generation nor expiry (HSET, HMSET, HINCRBY* of fields that all
	// exist) emits only its field rows, not the metadata record as well
	// (docs/design/hashes.md, "Rows without the metadata record"). Only an
	// engine that tracks nothing by the version of a hash's user key may
	// ask it: the single node (internal/shard). A replica group must not —
	// its follower read check (vrshard.cadNeed) lets the user key stand for
	// the rows, and its crash replay reads a script's row as absent when the
	// engine holds only the op's own record of it.
	SparseHashMeta bool
	// Scratch, if set, is an arena a hash write builds its row keys (and
	// its metadata record's value) in, instead of the heap: it takes its
	// bytes from the end of *Scratch (takeScratch; a full one is replaced,
	// never grown in place), which the caller leaves untouched until the
	// records emitted are written (the single node's batch arena, reused
	// once the batch is appended). Results never point into it. A slice,
	// not a function: the call through a func value and the method value's
	// wrapper were ~35 instructions of a pipelined HSET
	// (docs/design/hashes.md, "Pipelined, session 28").
	Scratch *[]byte
	// OrderedList: the Lister visits the keys of a range in key order
	// (each once; a superset still). A range read of a script or
	// transaction then walks its range as the Lister goes and stops at its
	// limit or the op's range-read budget (OpRangeReadKeys), rather than
	// listing and sorting the whole range first (overlay.listScan): with
	// it a failing DBSIZE over 1.6 million keys lists 100,001, not all.
	OrderedList bool
	// NoTxLocks: the state can hold no cross-group transaction's locks
	// (the single node: prepares exist only in a cluster of groups), so
	// the lock rule's lookup is skipped (ApplyLockFree).
	NoTxLocks bool
}

// ApplyWithOptions is ApplyWith with the engine's choices o.
func ApplyWithOptions(get Getter, list Lister, has Prober, version uint64, op *Op, maxValue int, emit Emit, o ApplyOptions) (Result, error) {
	if !o.NoTxLocks {
		if res, err, locked := txLockGate(get, op); locked {
			return res, err
		}
	}
	switch {
	case op.Kind == KindFlush:
		return applyFlush(get, list, version, emit)
	case op.Kind == KindCopy:
		return applyMove(get, list, version, op, emit)
	case op.Kind == KindExec:
		return applyExec(get, list, o.OrderedList, version, op, maxValue, emit) // tx.go
	case op.Kind == KindEval:
		return applyScriptOp(get, list, o.OrderedList, version, op, maxValue, emit) // script.go
	case isHashWrite(op.Kind):
		return applyHash(get, has, version, op, emit, o)
	}
	return apply(get, version, op, maxValue, emit)
}

// applyMore evaluates the kinds of this file and strings.go for Apply;
// handled false for any other kind.
func applyMore(get Getter, version uint64, op *Op, maxValue int, emit Emit) (res Result, err error, handled bool) {
	switch op.Kind {
	case KindRename, KindCopy:
		res, err = applyMove(get, nil, version, op, emit)
	case KindGetDel:
		res, err = applyGetDel(get, version, op, emit)
	case KindFlush:
		err = fmt.Errorf("%w: a flush needs the caller's key lister (ApplyWith)", ErrInvalidOp)
	case KindSetRange:
		res, err = applySetRange(get, version, op, maxValue, emit)
	case KindIncrByFloat:
		res, err = applyIncrByFloat(get, version, op, emit)
	case KindMSetNX:
		res, err = applyMSetNX(get, version, op, emit)
	case KindSetBit:
		res, err = applySetBit(get, version, op, maxValue, emit)
	case KindBitField:
		res, err = applyBitField(get, version, op, maxValue, emit)
	case KindHSet, KindHDel, KindHIncrBy, KindHIncrByFloat, KindHSweep:
		res, err = applyHash(get, nil, version, op, emit, ApplyOptions{})
	default:
		return Result{}, nil, false
	}
	return res, err, true
}

// applyMove is RENAME, RENAMENX and COPY, with Redis's replies: RENAME
// answers OK (an error for a missing source), RENAMENX and COPY 1 or 0.
// COPY of a hash lists the source's rows with list (copyHash).
func applyMove(get Getter, list Lister, version uint64, op *Op, emit Emit) (Result, error) {
	if len(op.Keys) != 2 {
		return Result{}, fmt.Errorf("%w: %v needs a source and a destination", ErrInvalidOp, op.Kind)
	}
	src, dst := op.Keys[0], op.Keys[1]
	for _, k := range op.Keys {
		if err := CheckKey(k); err != nil {
			return Result{}, err
		}
	}
	rename := op.Kind == KindRename
	nx := op.Cond == IfAbsent
	if !rename && bytes.Equal(src, dst) {
		return Result{}, ErrSameObject
	}
	rec, srcVer, ok, err := getRecord(get, src, op.Now)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		if rename {
			return Result{}, ErrNoSuchKey
		}
		return Result{Kind: ResInt, Int: 0, Version: srcVer}, nil
	}
	// As Redis: renaming a key onto itself changes nothing (RENAMENX says 0).
	if bytes.Equal(src, dst) {
		if nx {
			return Result{Kind: ResInt, Int: 0, Version: srcVer}, nil
		}
		return Result{Kind: ResOK, Version: srcVer}, nil
	}
	if nx {
		_, _, dstVer, exists, err := getLive(get, dst, op.Now)
		if err != nil {
			return Result{}, err
		}
		if exists {
			return Result{Kind: ResInt, Int: 0, Version: max(srcVer, dstVer)}, nil
		}
	}
	if MetaType(rec.meta) == TypeHash {
		if !rename {
			return copyHash(get, list, version, op, rec, srcVer, emit)
		}
		// The rows follow the metadata record; the generation's marker
		// must name the hash's new key, or the sweeper would take the
		// hash for dead (hash.go, hashMarker).
		gen, _, err := decodeHashMeta(rec.data)
		if err != nil {
			return Result{}, err
		}
		putRecord(emit, dst, rec)
		emit(src, nil, nil, true)
		put(emit, hashMarker(gen), dst, nil)
	} else {
		putRecord(emit, dst, rec)
		if rename {
			emit(src, nil, nil, true)
		}
	}
	if rename && !nx {
		return Result{Kind: ResOK, Version: version}, nil
	}
	return Result{Kind: ResInt, Int: 1, Version: version}, nil
}

func applyGetDel(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	if err := CheckKey(op.Key); err != nil {
		return Result{}, err
	}
	rec, ver, ok, err := getRecord(get, op.Key, op.Now)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{Kind: ResNil, Version: ver}, nil
	}
	if err := notString(rec.meta); err != nil {
		return Result{}, err
	}
	emit(op.Key, nil, nil, true)
	return Result{Kind: ResBulk, Bulk: rec.data, Version: version}, nil
}

// applyFlush deletes every user key list names that get finds, after the
// flush mark (FlushMark). It answers OK whatever it found: the reply reveals
// nothing of the state.
func applyFlush(get Getter, list Lister, version uint64, emit Emit) (Result, error) {
	if err := emitFlush(get, list, nil, emit); err != nil {
		return Result{}, err
	}
	return Result{Kind: ResOK, Version: version}, nil
}

// emitFlush emits a flush's records: its mark (FlushMark) first, then a
// tombstone for every key list names that a flush deletes and get finds,
// but those keep names (nil: none; an EXEC's keys written after its flush,
// whose own records follow: overlay.emitAll).
func emitFlush(get Getter, list Lister, keep map[string]overlayRec, emit Emit) error {
	if list == nil {
		return fmt.Errorf("%w: a flush needs the caller's key lister (ApplyWith)", ErrInvalidOp)
	}
	put(emit, FlushMark, nil, nil)
	var gerr error
	err := list(nil, nil, func(k []byte) bool {
		if !FlushDeletes(k) {
			return true
		}
		if _, ok := keep[string(k)]; ok {
			return true
		}
		// Every stored record goes, expired or not.
		_, _, _, ok, err := get(k)
		if err != nil {
			gerr = err
			return false
		}
		if ok {
			emit(k, nil, nil, true)
		}
		return true
	})
	if err == nil {
		err = gerr
	}
	return err
}

// FlushPending reports which keys an interrupted flush still has to delete,
// for an engine that finishes one at open: a flush at version markVersion
// deletes every user key whose newest version is older (a key written after
// the flush has a newer version and stays). The caller writes their
// tombstones at markVersion.
func FlushPending(markVersion, keyVersion uint64, key []byte) bool {
	return FlushDeletes(key) && keyVersion < markVersion
}

// FlushDeletes reports whether a flush deletes key: every user key and the
// hashes' field rows and generation markers (hash.go), the transactions'
// access records (itxrange.go), not the other reserved rows (a replica's
// client table, its marks).
func FlushDeletes(key []byte) bool {
	return !IsReserved(key) || IsHashRow(key) || isHashMarker(key) || IsAccessRow(key)
}
