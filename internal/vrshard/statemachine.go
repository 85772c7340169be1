package vrshard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// The state machine: a write at VR op v becomes records of version v. Its
// evaluation is a copy of internal/shard's apply logic (shard.go, Shard.apply),
// changed in two ways: every record of one op carries the op number as its
// version (so versions agree on every replica and a session token means the
// same thing everywhere), and a read-modify-write reads the state as of op v-1
// (so replaying an op after a crash evaluates it exactly as the first time).
// TODO(merge): once internal/shard exposes its apply as a reusable
// deterministic function (op + version → records + result), use it here.

// clientPrefix keys the client-table rows this package keeps in the engine:
// one per client id, rewritten (version = op) by each of the client's writes
// in the same Append as the write. After a crash they give the results of ops
// the engine already holds, for the VR core's client table.
var clientPrefix = append(append([]byte(nil), shard.ReservedPrefix...), "vrclient/"...)

// clientEnd ends the range of client rows: clientPrefix with its last byte
// ('/') incremented.
var clientEnd = append(append([]byte(nil), shard.ReservedPrefix...), "vrclient0"...)

func clientKey(id uint64) []byte {
	k := make([]byte, len(clientPrefix)+8)
	copy(k, clientPrefix)
	binary.BigEndian.PutUint64(k[len(clientPrefix):], id)
	return k
}

type overlayVal struct {
	data    []byte
	version uint64
	exists  bool
}

// applier turns committed entries into engine records. It is used by the
// driver goroutine only.
type applier struct {
	db *storage.DB
	// replayTo: ops up to here may already be (partly) in the engine: it held
	// them when the replica started or restored a snapshot. Their records are
	// written only for keys that lack them.
	replayTo uint64
	recs     []storage.Record
	overlay  map[string]overlayVal
	// cur is the op being evaluated; reads see state as of cur-1.
	cur uint64
	// appendUnchecked (a mutation): APPEND writes a value above the engine's
	// limit, which fails the apply and stops the replica.
	appendUnchecked bool

	// rows maps the client ids that have a row in the engine (or staged in
	// the batch) to the row's version; nrows is its size as of the last
	// Append, for Status (read by any goroutine): the engine counts the rows
	// among its keys, and DBSIZE must not (docs/design/client-table.md).
	rows  map[uint64]uint64
	nrows atomic.Int64

	// mark is the version of the engine's applied mark (0: none) and views
	// the view history (engine_mark.go); viewsChanged says views changed
	// since the driver last published it.
	mark         uint64
	markTop      uint64 // the newest version of appliedKey, deleted or not
	views        []viewStart
	viewTop      uint64 // the last op views covers
	viewsChanged bool
	// nreserved is reservedRows as of the last Append, for Status.
	nreserved atomic.Int64
}

func newApplier(db *storage.DB) *applier {
	return &applier{db: db, replayTo: db.LastVersion(), overlay: map[string]overlayVal{}, rows: map[uint64]uint64{}}
}

// loadRows reads which client ids have a row in the engine: at start, and
// after a snapshot changed the engine.
func (a *applier) loadRows() error {
	rows := map[uint64]uint64{}
	err := a.db.Scan(clientPrefix, clientEnd, 0, 0, func(k []byte, v storage.Value) bool {
		if len(k) == len(clientPrefix)+8 {
			rows[binary.BigEndian.Uint64(k[len(clientPrefix):])] = v.Version
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("vrshard: load client rows: %w", err)
	}
	a.rows = rows
	a.nrows.Store(int64(len(rows)))
	return nil
}

// applyForget evaluates the leader's forget entry at op v: every client row
// whose version is below `below` gets a tombstone of version v. The leader
// picks below no higher than the oldest op in its core's client table, so only
// rows of clients the core has dropped go (docs/design/client-table.md). The
// predicate is monotone in the row's version, so a replay stages exactly the
// tombstones a crash lost (settle drops those the engine holds).
func (a *applier) applyForget(v, below uint64, ts int64) {
	a.cur = v
	start := len(a.recs)
	ids := make([]uint64, 0, 16)
	for id, ver := range a.rows {
		if ver < below {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		delete(a.rows, id)
		a.recs = append(a.recs, storage.Record{Key: clientKey(id), Version: v, Timestamp: ts, Tombstone: true})
	}
	a.settle(start, v, v <= a.replayTo)
}

// begin starts a batch: records accumulate until flush.
func (a *applier) begin() {
	a.recs = a.recs[:0]
	clear(a.overlay)
}

// flush appends the batch's records with one Append (no fsync: the VR log is
// the durable copy; see doc.go).
func (a *applier) flush() error {
	a.nreserved.Store(int64(a.reservedRows()))
	if len(a.recs) == 0 {
		a.nrows.Store(int64(len(a.rows))) // a replay may change rows and stage nothing
		return nil
	}
	_, err := a.db.Append(a.recs...)
	clear(a.recs) // drop references to entry data
	a.recs = a.recs[:0]
	clear(a.overlay)
	if err != nil {
		return fmt.Errorf("vrshard: apply: append: %w", err)
	}
	a.nrows.Store(int64(len(a.rows)))
	return nil
}

// applyOp evaluates a write at op v. client != 0 also stages its client-table
// row (first, so that a crash that kept any record of the op kept the row).
func (a *applier) applyOp(op *shard.Op, v uint64, ts int64, client, reqNum uint64) (shard.Result, error, error) {
	a.cur = v
	start := len(a.recs)
	replay := v <= a.replayTo
	if replay && client != 0 {
		// The result of an op the engine already holds is in its client row.
		if cv, err := a.db.Get(clientKey(client)); err == nil && cv.Version == v {
			if seq, n := binary.Uvarint(cv.Data); n > 0 && seq == reqNum {
				res, opErr, derr := decodeResult(cv.Data[n:])
				if derr == nil {
					// The row is this op's: a replayed older op of the
					// client may have set a lower version (applyForget).
					a.rows[client] = v
					if err := a.replayFilter(op, v, ts, start); err != nil {
						return shard.Result{}, nil, err
					}
					return res, opErr, nil
				}
			}
		}
	}
	if client != 0 {
		a.recs = append(a.recs, storage.Record{Key: clientKey(client), Version: v, Timestamp: ts})
		a.rows[client] = v
	}
	res, opErr := a.eval(op, v, ts)
	if errors.Is(opErr, shard.ErrUnavailable) {
		// The engine failed a read: not an outcome of the op but of this
		// replica, which must stop rather than cache it.
		a.recs = a.recs[:start]
		return shard.Result{}, nil, opErr
	}
	if client != 0 {
		row := binary.AppendUvarint(nil, reqNum)
		row = encodeResult(row, res, opErr)
		a.recs[start].Value = row
	}
	if opErr != nil {
		// A failed op writes nothing but its client row.
		a.recs = a.recs[:start+min(1, len(a.recs)-start)]
		if client == 0 {
			a.recs = a.recs[:start]
		}
	}
	a.settle(start, v, replay)
	return res, opErr, nil
}

// replayFilter stages nothing new for an op whose result came from the engine,
// except the records of it that a crash lost (the engine recovers a prefix of
// the records of the last op it applied).
func (a *applier) replayFilter(op *shard.Op, v uint64, ts int64, start int) error {
	if _, err := a.eval(op, v, ts); err != nil {
		a.recs = a.recs[:start]
		if errors.Is(err, shard.ErrUnavailable) {
			return err
		}
		return nil
	}
	a.settle(start, v, true)
	return nil
}

// settle ends an op's evaluation: in replay, it drops the staged records
// (from index start) whose key the engine already holds at version >= v, and
// forgets those keys in the overlay — their evaluation may have read a later
// state (see current), and later ops must read the engine's real value; the
// kept records become visible to the rest of the batch.
func (a *applier) settle(start int, v uint64, replay bool) {
	if replay {
		kept := a.recs[:start]
		for _, r := range a.recs[start:] {
			if vs, err := a.db.Versions(r.Key); err == nil && len(vs) > 0 && vs[0].Version >= v {
				delete(a.overlay, string(r.Key))
				continue
			}
			kept = append(kept, r)
		}
		a.recs = kept
	}
	for _, r := range a.recs[start:] {
		a.overlay[string(r.Key)] = overlayVal{data: r.Value, version: r.Version, exists: !r.Tombstone}
	}
}

// current returns key's value as of op cur-1: the batch's staged records first,
// then the engine.
func (a *applier) current(key []byte) ([]byte, uint64, bool, error) {
	if o, ok := a.overlay[string(key)]; ok {
		return o.data, o.version, o.exists, nil
	}
	for i := len(a.recs) - 1; i >= 0 && a.recs[i].Version == a.cur; i-- {
		if bytes.Equal(a.recs[i].Key, key) {
			r := &a.recs[i]
			return r.Value, r.Version, !r.Tombstone, nil
		}
	}
	var v storage.Value
	var err error
	if a.cur <= a.replayTo {
		v, err = a.db.GetAt(key, a.cur-1)
		if errors.Is(err, storage.ErrVersionGone) {
			// Retention dropped the version before op cur, so a later op
			// (already in the engine) overwrote the key: the record this op
			// would write is there or superseded and will be skipped, and the
			// result is only needed if the client row has it. Any value will do.
			v, err = a.db.Get(key)
		}
	} else {
		v, err = a.db.Get(key)
	}
	if errors.Is(err, storage.ErrNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("%w: get: %w", shard.ErrUnavailable, err)
	}
	return v.Data, v.Version, true, nil
}

func checkKey(k []byte) error {
	if len(k) == 0 {
		return fmt.Errorf("%w: empty key", shard.ErrInvalidOp)
	}
	if bytes.HasPrefix(k, shard.ReservedPrefix) {
		return shard.ErrReservedKey
	}
	return nil
}

func (a *applier) put(key, value []byte, tomb bool, v uint64, ts int64) {
	if value == nil && !tomb {
		value = []byte{}
	}
	// A key written twice by one op (MSET a 1 a 2) keeps the last value: the
	// engine wants versions strictly increasing per key.
	for i := len(a.recs) - 1; i >= 0 && a.recs[i].Version == v; i-- {
		if bytes.Equal(a.recs[i].Key, key) {
			a.recs[i].Value, a.recs[i].Tombstone = value, tomb
			return
		}
	}
	a.recs = append(a.recs, storage.Record{Key: key, Value: value, Version: v, Timestamp: ts, Tombstone: tomb})
}

// eval is shard.Shard.apply with version v for every record.
func (a *applier) eval(op *shard.Op, v uint64, ts int64) (shard.Result, error) {
	switch op.Kind {
	case shard.KindSet:
		if err := checkKey(op.Key); err != nil {
			return shard.Result{}, err
		}
		var old []byte
		var oldVer uint64
		exists := false
		if op.Cond != shard.Always || op.ReturnOld {
			var err error
			if old, oldVer, exists, err = a.current(op.Key); err != nil {
				return shard.Result{}, err
			}
		}
		res := shard.Result{Kind: shard.ResOK}
		if op.ReturnOld {
			res = shard.Result{Kind: shard.ResNil}
			if exists {
				res = shard.Result{Kind: shard.ResBulk, Bulk: bytes.Clone(old)}
			}
		}
		if (op.Cond == shard.IfAbsent && exists) || (op.Cond == shard.IfPresent && !exists) {
			if !op.ReturnOld {
				res.Kind = shard.ResNil
			}
			res.Version = oldVer
			return res, nil
		}
		a.put(op.Key, op.Value, false, v, ts)
		res.Version = v
		return res, nil

	case shard.KindMSet:
		if len(op.Keys) == 0 || len(op.Keys)%2 != 0 {
			return shard.Result{}, fmt.Errorf("%w: MSET needs key value pairs", shard.ErrInvalidOp)
		}
		for i := 0; i < len(op.Keys); i += 2 {
			if err := checkKey(op.Keys[i]); err != nil {
				return shard.Result{}, err
			}
		}
		for i := 0; i < len(op.Keys); i += 2 {
			a.put(op.Keys[i], op.Keys[i+1], false, v, ts)
		}
		return shard.Result{Kind: shard.ResOK, Version: v}, nil

	case shard.KindDel:
		for _, k := range op.Keys {
			if err := checkKey(k); err != nil {
				return shard.Result{}, err
			}
		}
		var n int64
		var ver uint64
		for i, k := range op.Keys {
			_, _, exists, err := a.current(k)
			if err != nil {
				return shard.Result{}, err
			}
			if !exists || dupBefore(op.Keys, i) {
				continue
			}
			ver = v
			a.put(k, nil, true, v, ts)
			n++
		}
		return shard.Result{Kind: shard.ResInt, Int: n, Version: ver}, nil

	case shard.KindIncrBy:
		if err := checkKey(op.Key); err != nil {
			return shard.Result{}, err
		}
		old, _, exists, err := a.current(op.Key)
		if err != nil {
			return shard.Result{}, err
		}
		var cur int64
		if exists {
			if cur, err = parseInt(old); err != nil {
				return shard.Result{}, err
			}
		}
		if (op.Delta > 0 && cur > math.MaxInt64-op.Delta) || (op.Delta < 0 && cur < math.MinInt64-op.Delta) {
			return shard.Result{}, shard.ErrOverflow
		}
		cur += op.Delta
		a.put(op.Key, strconv.AppendInt(nil, cur, 10), false, v, ts)
		return shard.Result{Kind: shard.ResInt, Int: cur, Version: v}, nil

	case shard.KindGetSet:
		if err := checkKey(op.Key); err != nil {
			return shard.Result{}, err
		}
		old, _, exists, err := a.current(op.Key)
		if err != nil {
			return shard.Result{}, err
		}
		res := shard.Result{Kind: shard.ResNil}
		if exists {
			res = shard.Result{Kind: shard.ResBulk, Bulk: bytes.Clone(old)}
		}
		a.put(op.Key, op.Value, false, v, ts)
		res.Version = v
		return res, nil

	case shard.KindAppend:
		if err := checkKey(op.Key); err != nil {
			return shard.Result{}, err
		}
		old, _, _, err := a.current(op.Key)
		if err != nil {
			return shard.Result{}, err
		}
		if n, max := len(old)+len(op.Value), a.db.MaxValueSize(); n > max && !a.appendUnchecked {
			// Known only here, so refused here: the engine would fail the
			// batch, and with it every replica that applies the op.
			return shard.Result{}, fmt.Errorf("%w: APPEND would make a value of %d bytes > %d", shard.ErrInvalidOp, n, max)
		}
		nv := make([]byte, 0, len(old)+len(op.Value))
		nv = append(append(nv, old...), op.Value...)
		a.put(op.Key, nv, false, v, ts)
		return shard.Result{Kind: shard.ResInt, Int: int64(len(nv)), Version: v}, nil

	case shard.KindCAS:
		if err := checkKey(op.Key); err != nil {
			return shard.Result{}, err
		}
		old, oldVer, exists, err := a.current(op.Key)
		if err != nil {
			return shard.Result{}, err
		}
		if !exists || !bytes.Equal(old, op.Expected) {
			return shard.Result{Kind: shard.ResInt, Int: 0, Version: oldVer}, nil
		}
		a.put(op.Key, op.Value, false, v, ts)
		return shard.Result{Kind: shard.ResInt, Int: 1, Version: v}, nil
	}
	return shard.Result{}, fmt.Errorf("%w: %v is not a write", shard.ErrInvalidOp, op.Kind)
}

func dupBefore(keys [][]byte, i int) bool {
	for j := 0; j < i; j++ {
		if bytes.Equal(keys[j], keys[i]) {
			return true
		}
	}
	return false
}

// parseInt parses a stored value as INCR does: a decimal int64, nothing else.
func parseInt(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, shard.ErrWrongType
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || (len(b) > 1 && (b[0] == '0' || (b[0] == '-' && b[1] == '0'))) || b[0] == '+' {
		return 0, shard.ErrWrongType
	}
	return n, nil
}
