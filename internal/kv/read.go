package kv

import "fmt"

// Scanner visits the store's keys in [start, end) (end nil: unbounded) in
// order, at most limit of them (0: no limit), with their value and version,
// until visit returns false. It visits reserved keys too (ScanUser skips
// them). Every call of one scan must see the same state: ScanUser may call it
// several times to continue past reserved keys. Keys and values handed to
// visit are safe to keep (values read into the op's ScanBuf: as long as the
// caller keeps that buffer).
// meta is the record's meta (Getter).
type Scanner func(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error

// DefaultScanLimit is a scan's limit when the op names none.
const DefaultScanLimit = 1000

// MaxScanBytes bounds the keys and values one scan returns: a scan that
// returned fewer keys than its limit stopped at its range's end only if what
// it returned is smaller (an iteration must not take a full page for the end).
const MaxScanBytes = 64 << 20

// Read evaluates the read op (GET, MGET, EXISTS, STRLEN, SCAN) against the
// state get and scan read, with a scan's limit capped at maxScan. Reserved
// keys read as absent. Which state that is — the latest, one snapshot for
// every key of a multi-key read (MultiKey), an overlay of pending writes —
// is the caller's choice, made in get and scan; so are their errors (Read
// returns them unchanged).
//
// The result's values alias what get and scan returned (read-only). Result
// Version is the highest version read (0 if nothing; a miss counts with the
// version get reports for it).
//
// A key whose expiry is before op.Now reads as absent: the caller sets Now
// from its clock (and, on a replica that may lag the leader's clock, the
// drift bound: docs/consistency.md).
func Read(get Getter, scan Scanner, op *Op, maxScan int) (Result, error) {
	var res Result
	if isHashRead(op.Kind) {
		return readHash(get, scan, op)
	}
	switch op.Kind {
	case KindEvalRO:
		return readScript(get, scan, op) // script.go
	case KindWatch:
		return readWatch(get, scan, op) // tx.go
	case KindExecRO:
		return readExec(get, scan, op) // tx.go
	case KindTTL:
		return readTTL(get, op)
	case KindGet, KindStrlen:
		data, version, ok, err := getUser(get, op.Key, op.Now)
		if err != nil {
			return Result{}, err
		}
		if ok && data == nil {
			return Result{}, ErrWrongKind
		}
		return PointResult(op.Kind, data, version, ok), nil
	case KindMGet, KindExists:
		if op.Kind == KindMGet {
			res.Kind = ResArray
			res.Array = make([][]byte, len(op.Keys))
		} else {
			res.Kind = ResInt
		}
		for i, k := range op.Keys {
			data, version, ok, err := getUser(get, k, op.Now)
			if err != nil {
				return Result{}, err
			}
			res.Version = max(res.Version, version)
			if !ok {
				continue
			}
			if op.Kind == KindMGet {
				// MGET answers nil for a key of another type, as Redis does
				// (data stays nil: getUser's live non-string); LCS's read
				// (ReturnOld) is refused, as Redis's LCS is.
				if data == nil && op.ReturnOld {
					return Result{}, ErrWrongKind
				}
				res.Array[i] = data
			} else {
				res.Int++
			}
		}
	case KindScan:
		limit := op.Limit
		if limit <= 0 {
			limit = DefaultScanLimit
		}
		return readScan(scan, op, min(limit, maxScan))
	default:
		return Result{}, fmt.Errorf("%w: %v is not a read", ErrInvalidOp, op.Kind)
	}
	return res, nil
}

// PointResult is the result of a GET or STRLEN (kind) that read data at
// version (ok false: a miss). Read builds its single-key results with it; a
// front door's hot path that reads one key itself (internal/shard) does too.
func PointResult(kind Kind, data []byte, version uint64, ok bool) Result {
	res := Result{Kind: ResNil, Version: version}
	if kind == KindStrlen {
		res.Kind = ResInt
	}
	if ok {
		if kind == KindStrlen {
			res.Int = int64(len(data))
		} else {
			res.Kind, res.Bulk = ResBulk, data
		}
	}
	return res
}

// getUser is get for a user key at now: a reserved or expired key is absent.
func getUser(get Getter, k []byte, now int64) ([]byte, uint64, bool, error) {
	if IsReserved(k) {
		return nil, 0, false, nil
	}
	data, meta, version, live, _, err := lookup(get, k, now)
	if live && MetaType(meta) != TypeString {
		// Present, but not a string: nil data (GET, STRLEN answer
		// WRONGTYPE; MGET nil; EXISTS counts it).
		return nil, version, true, err
	}
	if live && data == nil {
		data = []byte{}
	}
	return data, version, live, err
}

// readScan serves KindScan for Read. It is its own function so that the
// closure capturing its result does not move Read's result to the heap for
// every GET (an allocation per read, ~8 % of the CPU of a pipelined GET
// benchmark).
func readScan(scan Scanner, op *Op, limit int) (Result, error) {
	// Sized for the common short range (a key and a value per entry): growing it
	// from empty took eight allocations and copies for a 64-key scan.
	res := Result{Kind: ResArray, Array: make([][]byte, 0, 2*min(max(limit, 1), scanArrayHint))}
	err := ScanUser(scan, op.Key, op.End, limit, op.Now, func(k, data []byte, version uint64) {
		res.Array = append(res.Array, k, data)
		res.Version = max(res.Version, version)
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// scanArrayHint bounds readScan's first allocation: a scan's limit may be
// large while the range holds few keys. At 64 a YCSB-E scan (LIMIT 1..100)
// grew its array once, a second allocation of twice the size: half the bytes
// a scan still allocated once its values went into a lent buffer
// (docs/design/scans.md); at 128 its LIMIT sizes it exactly.
const scanArrayHint = 128

// MultiKey reports whether op reads several keys (a scan, or MGET/EXISTS of
// more than one). Those must read one state for all their keys (a snapshot):
// a read that saw one key before a write and another after it would return a
// state that never existed.
func MultiKey(op *Op) bool {
	switch op.Kind {
	case KindScan, KindHGet, KindHLen, KindHGetAll, KindHScan, KindEvalRO, KindWatch, KindExecRO:
		return true // a hash read (and a watch: of a hash) reads the metadata and rows of one state; a script, any keys
	case KindMGet, KindExists:
		return len(op.Keys) > 1
	}
	return false
}

// ScanUser visits the user keys in [start, end) (end nil = unbounded) in order, at
// most limit of them and about MaxScanBytes of keys and values, skipping the
// reserved keys and those expired at now (unix ms). It passes the limit down to scan, whose engine reads values
// in batches of that size — a LIMIT 1 scan must not read a thousand values — and
// continues past reserved keys the engine counted against it.
func ScanUser(scan Scanner, start, end []byte, limit int, now int64, visit func(key, data []byte, version uint64)) error {
	n, size := 0, 0
	from := start
	for {
		want := limit - n
		visited, full := 0, false
		var last []byte
		err := scan(from, end, want, func(k, data, meta []byte, version uint64) bool {
			visited++
			last = k
			if IsReserved(k) || Expired(meta, now) {
				return true
			}
			visit(k, data, version)
			n++
			size += len(k) + len(data)
			full = n >= limit || size >= MaxScanBytes
			return !full
		})
		if err != nil || full || visited < want {
			return err
		}
		// The engine stopped at want keys, some of them reserved: go on after the last.
		from = append(append(make([]byte, 0, len(last)+1), last...), 0)
	}
}
