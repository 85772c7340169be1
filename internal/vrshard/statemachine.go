package vrshard

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// The state machine: a write at VR op v becomes records of version v. Its
// evaluation is internal/kv's (kv.Apply), the one the single node runs, with
// two parameters of this engine's: every record of one op carries the op
// number as its version (so versions agree on every replica and a session
// token means the same thing everywhere), and a read-modify-write reads the
// state as of op v-1 (current: the batch's earlier ops over the engine; in
// replay the engine as of v-1), so replaying an op after a crash evaluates it
// exactly as the first time. The client-table rows are kv's (kv.ClientRowKey,
// kv.AppendClientRow: the one row format every engine writes); which rows this
// engine keeps and the replay filter are its own.
//
// One row per client id, rewritten (version = op) by each of the client's
// writes in the same Append as the write. After a crash they give the results
// of ops the engine already holds, for the VR core's client table.

type overlayVal struct {
	data    []byte
	meta    []byte
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
	// curKind is its kind (current's replay rule: kv.ReplayReadsOwnRecord).
	curKind kv.Kind
	// hasFn is has as a kv.Prober, made once (a method value per op allocates).
	hasFn kv.Prober
	// stageFn is stage as a kv.Emit, made once for the same reason (a
	// closure over the op's version and timestamp was one allocation per
	// op); eval sets the version and timestamp it stamps.
	stageFn kv.Emit
	stageV  uint64
	stageTS int64
	// probeKey is the key has last asked the engine about (storage.DB.Probe)
	// and probeHint its hint: eval gives the hint to the record of that same
	// key (the same bytes: a hash write probes a row's key, then stages it),
	// so that the engine's insert starts from the key's item. Reset per op.
	probeKey  []byte
	probeHint storage.Hint
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
	// copies are the view copies the group imported, by source group, as
	// of the last Append (any goroutine; engine_mark.go).
	copies atomic.Pointer[map[uint32]kv.ViewCopy]

	// The group's slot table (kv/slots.go), the fence every write passes at
	// apply: slots is the table as of the op being evaluated when slotsOK
	// (outside replay: invalidated by every slot op staged); slotsVer the
	// version of the record it was decoded from (replay reads the record as
	// of op cur-1 and decodes it only when that version changes). pubSlots
	// is the table as of the last Append, for reads (any goroutine);
	// slotsDirty says a slot op was staged since. unfenced (a mutation):
	// the group applies writes and serves reads of slots it does not own.
	slots      *kv.SlotTable
	slotsOK    bool
	slotsVer   uint64
	slotsDirty bool
	pubSlots   atomic.Pointer[kv.SlotTable]
	unfenced   bool
	// movedTwice (a mutation): a write whose request the slot's old group
	// ran before the hand-over runs again (kv.MovedRequest skipped).
	movedTwice bool
	// txUnvalidated (a mutation): EXEC's watches and a commit's checks are
	// dropped before the op is evaluated (unvalidated).
	txUnvalidated bool

	// txFree: in the batch being evaluated, the state as of the op being
	// evaluated holds no prepared cross-group transaction (kv's count
	// record is absent), so the lock rule's lookup is skipped
	// (kv.ApplyOptions.NoTxLocks). Found by one lookup and kept until a
	// two-phase op is evaluated (only those write the count record) or the
	// batch ends (begin): a batch is never rolled back into the next, a
	// snapshot installs between batches, and a replayed op (which reads
	// older states) never uses it. txFreeStale (a mutation): a two-phase op
	// does not clear it.
	txFree      bool
	txFreeStale bool
	// txDirty: a two-phase op was evaluated since the last Append;
	// txLocked says, as of the last Append (any goroutine), whether the
	// engine may hold a prepared cross-group transaction — false only when
	// its count record was found absent after the batch that last
	// evaluated a two-phase op, or at open and after a snapshot (loadRows).
	// The leader's reads and writes check it before the engine
	// (Replica.TxLockFree); it is stored before the batch's replies are
	// released, so a prepare is answered only once it shows.
	txDirty  bool
	txLocked atomic.Bool
}

// errMarkHit: evalFenced's result is a mark's (kv.MovedRequest), not the
// op's evaluation; it staged nothing.
var errMarkHit = errors.New("vrshard: answered from a moved slot's request mark")

// stage (kv.Emit) stages a record the op eval evaluates writes.
func (a *applier) stage(key, value, meta []byte, tomb bool) {
	var h storage.Hint
	if len(key) == len(a.probeKey) && unsafe.SliceData(key) == unsafe.SliceData(a.probeKey) {
		h = a.probeHint // the bytes has probed (kv's row keys are never rewritten)
	}
	a.recs = append(a.recs, storage.Record{Key: key, Value: value, Meta: meta, Version: a.stageV, Timestamp: a.stageTS, Tombstone: tomb, Hint: h})
}

func newApplier(db *storage.DB) *applier {
	a := &applier{db: db, replayTo: db.LastVersion(), overlay: map[string]overlayVal{}, rows: map[uint64]uint64{}}
	a.hasFn, a.stageFn = a.has, a.stage
	a.txLocked.Store(true) // unknown until loadRows
	return a
}

// loadRows reads which client ids have a row in the engine: at start, and
// after a snapshot changed the engine.
func (a *applier) loadRows() error {
	rows := map[uint64]uint64{}
	err := a.db.Scan(kv.ClientRowPrefix, kv.ClientRowEnd, 0, 0, func(k []byte, v storage.Value) bool {
		if id, err := kv.ClientRowID(kv.ClientRowPrefix, k); err == nil {
			rows[id] = v.Version
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("vrshard: load client rows: %w", err)
	}
	a.rows = rows
	a.nrows.Store(int64(len(rows)))
	a.publishTxLocked()
	if err := a.loadViewCopies(); err != nil {
		return err
	}
	return a.loadSlots()
}

// publishTxLocked stores whether the engine holds a prepared cross-group
// transaction (txLocked): true if its count record is there or does not
// read.
func (a *applier) publishTxLocked() {
	n, err := kv.TxLockCount(a.db.Lookup)
	a.txLocked.Store(err != nil || n > 0)
	a.txDirty = false
}

// loadSlots reads the slot table from the engine: at start and after a
// snapshot changed the engine (with the client rows, loadRows).
func (a *applier) loadSlots() error {
	a.slots, a.slotsOK, a.slotsVer, a.slotsDirty = nil, false, 0, false
	v, err := a.db.Get(kv.SlotTableKey)
	if errors.Is(err, storage.ErrNotFound) {
		a.pubSlots.Store(nil)
		return nil
	}
	if err != nil {
		return fmt.Errorf("vrshard: load slot table: %w", err)
	}
	t, err := kv.DecodeSlotTable(v.Data)
	if err != nil {
		return fmt.Errorf("vrshard: load slot table: %w", err)
	}
	a.pubSlots.Store(t)
	return nil
}

// slotTable returns the table as of op cur-1 (nil: the group has none and is
// unfenced).
func (a *applier) slotTable() (*kv.SlotTable, error) {
	replay := a.cur <= a.replayTo
	if a.slotsOK && !replay {
		return a.slots, nil
	}
	data, _, ver, ok, err := a.current(kv.SlotTableKey)
	if err != nil {
		return nil, err
	}
	if !ok {
		a.slots, a.slotsVer = nil, 0
	} else if a.slots == nil || ver != a.slotsVer {
		t, err := kv.DecodeSlotTable(data)
		if err != nil {
			return nil, fmt.Errorf("%w: slot table: %w", shard.ErrUnavailable, err)
		}
		a.slots, a.slotsVer = t, ver
	}
	a.slotsOK = !replay
	return a.slots, nil
}

// evalFenced is eval behind the slot fence: a write of a key whose slot
// the group does not serve is refused (*kv.SlotError, an outcome of the op
// that the client table caches like any other) and writes nothing; a write
// of client's request reqNum of a slot the group imported that may have run
// at the slot's old group is answered from that group's mark or refused
// (kv.MovedRequest), and writes nothing either.
func (a *applier) evalFenced(op *kv.Op, v uint64, ts int64, client, reqNum uint64) (kv.Result, error) {
	a.cur = v
	t, err := a.slotTable()
	if err != nil {
		return kv.Result{}, err
	}
	if ferr := t.Check(op); ferr != nil && !(mutation.On && a.unfenced) {
		return kv.Result{}, ferr
	}
	if res, opErr, hit, err := kv.MovedRequest(a.current, t, op, client, reqNum); err != nil {
		return kv.Result{}, fmt.Errorf("%w: %w", shard.ErrUnavailable, err)
	} else if hit && !(mutation.On && a.movedTwice) {
		if opErr != nil {
			return kv.Result{}, opErr
		}
		return res, errMarkHit
	}
	res, err := a.eval(op, v, ts)
	if err == nil && kv.IsSlotKind(op.Kind) {
		a.slotsOK, a.slotsDirty = false, true
	}
	return res, err
}

// clientRow is the value of client's row for op reqNum's outcome
// (kv.AppendClientRow). A reply the row cannot hold, over the engine's
// largest value (the front door's MaxBulk: KEYS * inside MULTI over a large
// keyspace, an EVAL's long string, GETDEL of a value of MaxBulk bytes), had
// failed the batch's Append on every replica, which stopped, and again at
// each restart's replay: a group stopped for good by one request. The row
// records errReplyNotRecorded instead: the write is applied and its first
// reply (from the core's table, which keeps the whole outcome) is whole; a
// retry answered from the row (after a restart) learns that it was
// applied, not its reply. Deterministic: every replica's engine has the
// same MaxValueSize, and replay reads the row as written.
func (a *applier) clientRow(reqNum uint64, res kv.Result, opErr error) []byte {
	row, _ := kv.AppendClientRow(nil, reqNum, res, opErr)
	if max := a.db.MaxValueSize(); max > 0 && len(row) > max {
		row, _ = kv.AppendClientRow(nil, reqNum, kv.Result{}, fmt.Errorf("%w (%d bytes)", errReplyNotRecorded, len(row)))
	}
	return row
}

// errReplyNotRecorded is the outcome clientRow records for a reply too
// large for the row.
var errReplyNotRecorded = errors.New("ERR the command was applied, but its reply is larger than the largest value this group stores (max-bulk), so it was not kept for a retry")

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
		a.recs = append(a.recs, storage.Record{Key: kv.ClientRowKey(id), Version: v, Timestamp: ts, Tombstone: true})
	}
	a.settle(start, v, v <= a.replayTo)
}

// begin starts a batch: records accumulate until flush.
func (a *applier) begin() {
	a.recs = a.recs[:0]
	clear(a.overlay)
	a.txFree = false
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
	if a.txDirty {
		a.publishTxLocked()
	}
	if a.slotsDirty {
		// Published before the batch's replies are released: a read that
		// starts after a hand-over was acknowledged is fenced by it.
		a.slotsOK = false
		// An import may have brought a view copy: published before the
		// table, so that a read the take-over lets through (in this batch
		// or a later one) finds the copy (cluster.Multi.otherParts).
		if err := a.loadViewCopies(); err != nil {
			return err
		}
		if err := a.loadSlots(); err != nil {
			return err
		}
	}
	return nil
}

// clientRow is client's row in db as its table entry (Op: the row's
// version), found false if it has none (or, with the error, if it does not
// read or decode).
func clientRow(db *storage.DB, client uint64) (e kv.ClientEntry, found bool, err error) {
	key := kv.ClientRowKey(client)
	v, err := db.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return kv.ClientEntry{}, false, nil
	}
	if err != nil {
		return kv.ClientEntry{}, false, err
	}
	e, err = kv.DecodeClientRow(key, v.Data, v.Version, v.Timestamp)
	return e, err == nil, err
}

// applyOp evaluates a write at op v. client != 0 also stages its client-table
// row (first, so that a crash that kept any record of the op kept the row).
func (a *applier) applyOp(op *kv.Op, v uint64, ts int64, client, reqNum uint64) (kv.Result, error, error) {
	a.cur = v
	start := len(a.recs)
	replay := v <= a.replayTo
	if replay && client != 0 {
		// The result of an op the engine already holds is in its client row.
		if e, ok, _ := clientRow(a.db, client); ok && e.Op == v && e.ReqNum == reqNum {
			res, opErr, derr := decodeResult(e.Result)
			if derr == nil {
				// The row is this op's: a replayed older op of the
				// client may have set a lower version (applyForget).
				a.rows[client] = v
				if err := a.replayFilter(op, v, ts, client, reqNum, start); err != nil {
					return kv.Result{}, nil, err
				}
				return res, opErr, nil
			}
		}
	}
	if client != 0 {
		a.recs = append(a.recs, storage.Record{Key: kv.ClientRowKey(client), Version: v, Timestamp: ts})
		a.rows[client] = v
	}
	res, opErr := a.evalFenced(op, v, ts, client, reqNum)
	if opErr == errMarkHit {
		// The request ran at the slot's old group: its outcome there, and
		// nothing written here but the client row.
		opErr = nil
	}
	if errors.Is(opErr, shard.ErrUnavailable) {
		// The engine failed a read: not an outcome of the op but of this
		// replica, which must stop rather than cache it.
		a.recs = a.recs[:start]
		return kv.Result{}, nil, opErr
	}
	if client != 0 {
		a.recs[start].Value = a.clientRow(reqNum, res, opErr)
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
// the records of the last op it applied). The op is evaluated as its first run
// was, as client's request reqNum: one answered from a moved slot's request
// mark (or refused as stale, kv.MovedRequest) wrote nothing then, and any
// error here stages nothing now.
func (a *applier) replayFilter(op *kv.Op, v uint64, ts int64, client, reqNum uint64, start int) error {
	if _, err := a.evalFenced(op, v, ts, client, reqNum); err != nil {
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
	if replay && v < a.replayTo {
		// The engine holds a record of a later op, and it recovers a prefix
		// of the log: every record of this op is there. Nothing is staged,
		// even for a key the engine has no record of at v: an op that reads
		// one key and writes another (RENAME, COPY, MSETNX) may have been
		// evaluated against a later state (current's ErrVersionGone case)
		// and staged a write the first run never made.
		for _, r := range a.recs[start:] {
			delete(a.overlay, string(r.Key))
		}
		a.recs = a.recs[:start]
		return
	}
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
		a.overlay[string(r.Key)] = overlayVal{data: r.Value, meta: r.Meta, version: r.Version, exists: !r.Tombstone}
	}
}

// current returns key's value as of op cur-1 (kv.Apply's Getter): the
// batch's earlier ops first (the overlay), then the engine.
func (a *applier) current(key []byte) ([]byte, []byte, uint64, bool, error) {
	if o, ok := a.overlay[string(key)]; ok {
		if !o.exists {
			// A key the batch deleted is absent at version 0, as the
			// engine answers it once the batch is in: an op's result (a
			// missed CAS's version, kept in its client-table row) must
			// not depend on whether the replica applied the deletion in
			// the same batch (TestHostSimCasAfterDelete).
			return nil, nil, 0, false, nil
		}
		return o.data, o.meta, o.version, true, nil
	}
	var v storage.Value
	var err error
	if a.cur <= a.replayTo {
		v, err = a.db.GetAt(key, a.cur-1)
		if errors.Is(err, storage.ErrVersionGone) && a.cur == a.replayTo {
			if vs, verr := a.db.Versions(key); verr == nil && len(vs) > 0 && vs[0].Version == a.cur {
				if !vs[0].Tombstone {
					// A hash write (or a script's, of a hash): its own
					// record carries the generation its rows' keys
					// derive from.
					// So must a transaction's commit of its access row (its own
					// row holds the entries the commit's checks walk, and the
					// commit rewrites it as it was: kv/itxrange.go).
					ownRow := a.curKind == kv.KindTxCommit && kv.IsAccessRow(key)
					if own, gerr := a.db.Get(key); gerr == nil && own.Version == a.cur && (ownRow || kv.ReplayReadsOwnRecord(a.curKind, own.Meta)) {
						return own.Data, own.Meta, own.Version, true, nil
					}
				}
				// The engine kept this op's own record of key (the last op
				// it holds, perhaps in part) and nothing older: key was
				// absent before it, or the op overwrote it blindly. Absent
				// is what lets an all-or-nothing op (MSETNX) re-stage the
				// records of its other keys that the crash lost.
				if kv.ValidatesOwnRecord(a.curKind) {
					// A transaction's commit validates its keys' versions
					// (kv.TxValidate), an EXEC its watches (kv.Observe):
					// absent, with the op's own version, says this record
					// is its own, which exists only because the check
					// passed when the op first ran.
					return nil, nil, a.cur, false, nil
				}
				return nil, nil, 0, false, nil
			}
		}
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
		return nil, nil, 0, false, nil
	}
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("%w: get: %w", shard.ErrUnavailable, err)
	}
	return v.Data, v.Meta, v.Version, true, nil
}

// has is current for a caller that needs only whether key holds a value
// (kv.Prober; the hash writes ask it of field rows): the engine's index
// answers, without reading the record back. An op being replayed asks
// current, whose replay rules read older versions.
func (a *applier) has(key []byte) (bool, error) {
	if a.cur <= a.replayTo {
		_, _, _, ok, err := a.current(key)
		return ok, err
	}
	if o, ok := a.overlay[string(key)]; ok {
		return o.exists, nil
	}
	ok, h, err := a.db.Probe(key)
	if err != nil {
		return false, fmt.Errorf("%w: has: %w", shard.ErrUnavailable, err)
	}
	a.probeKey, a.probeHint = key, h
	return ok, nil
}

// eval evaluates a write at op v (kv.Apply) and stages its records, every
// one of version v.
func (a *applier) eval(op *kv.Op, v uint64, ts int64) (kv.Result, error) {
	maxVal := a.db.MaxValueSize()
	if mutation.On && a.appendUnchecked {
		maxVal = 0
	}
	var list kv.Lister
	if op.Lists() {
		list = a.listKeys
	}
	a.curKind = op.Kind
	if mutation.On && a.txUnvalidated {
		op = unvalidated(op)
	}
	o := kv.ApplyOptions{OrderedList: true} // listKeys
	switch {
	case kv.IsXgtxKind(op.Kind):
		if !(mutation.On && a.txFreeStale) {
			a.txFree = false // a prepare adds to the count record
		}
		a.txDirty = true
	case v > a.replayTo && op.Kind.IsUpdate():
		if !a.txFree {
			n, err := kv.TxLockCount(a.current)
			a.txFree = err == nil && n == 0
		}
		o.NoTxLocks = a.txFree
	}
	a.probeKey = nil // an earlier op's
	a.stageV, a.stageTS = v, ts
	res, err := kv.ApplyWithOptions(a.current, list, a.hasFn, v, op, maxVal, a.stageFn, o)
	if err != nil {
		return kv.Result{}, err // the callers drop what was staged
	}
	if res.Kind == kv.ResBulk {
		// The old value may alias a staged record of this batch, and the
		// result outlives the batch (waiters, the client table).
		res.Bulk = bytes.Clone(res.Bulk)
	}
	return res, nil
}

// listKeys is the applier's kv.Lister for a flush or a COPY (kv.Op.Lists):
// every key of [start, end) the engine's index holds (deleted ones too:
// current decides, as of op cur-1, in replay too) and the batch's staged
// keys of the range, merged in key order, each once (kv.ApplyOptions.
// OrderedList: a script's or transaction's range read stops listing at its
// limit or its op's range-read budget). A staged key the engine also holds
// is dropped in the merge, where the two meet, not by asking the engine
// first: a background compaction may drop a tombstone-only key from the
// index between the question and the walk, and the key the batch wrote
// again would be listed by neither (TestListKeysSeesStagedKeysThroughACompaction).
func (a *applier) listKeys(start, end []byte, visit func(key []byte) bool) error {
	staged := make([]string, 0, len(a.overlay))
	for k := range a.overlay {
		if (start != nil && k < string(start)) || (end != nil && k >= string(end)) {
			continue
		}
		staged = append(staged, k)
	}
	slices.Sort(staged) // deterministic order: the records are the log's
	i, stop := 0, false
	if err := a.db.Keys(start, end, func(k []byte) bool {
		for ; i < len(staged) && staged[i] < string(k); i++ {
			if !visit([]byte(staged[i])) {
				stop = true
				return false
			}
		}
		if i < len(staged) && staged[i] == string(k) {
			i++ // staged and in the engine: listed once
		}
		stop = !visit(k)
		return !stop
	}); err != nil {
		return fmt.Errorf("%w: list keys: %w", shard.ErrUnavailable, err)
	}
	for ; !stop && i < len(staged); i++ {
		stop = !visit([]byte(staged[i]))
	}
	return nil
}

// unvalidated is the txUnvalidated mutation: op without what validates it,
// an EXEC without its watches, a KEFIR.TX commit without its checks (an op
// that does not decode is left to fail as it would).
func unvalidated(op *kv.Op) *kv.Op {
	switch op.Kind {
	case kv.KindExec:
		cmds, _, err := kv.DecodeTx(op.Value)
		if err != nil {
			return op
		}
		o := *op
		o.Value = kv.EncodeTx(nil, cmds, nil)
		return &o
	case kv.KindTxCommit:
		return recommitted(op, func([]kv.TxCheck) []kv.TxCheck { return nil })
	}
	return op
}

// recommitted is the KEFIR.TX commit op with its checks as edit makes them,
// for the mutations that tamper with validation (unvalidated, doomMutated);
// op itself if it does not decode. A single group's origin (zero): the
// mutations' tests run one group.
func recommitted(op *kv.Op, edit func([]kv.TxCheck) []kv.TxCheck) *kv.Op {
	checks, writes, err := kv.DecodeTxCommit(op)
	if err != nil {
		return op
	}
	n, err := kv.NewTxCommit(uint64(op.Delta), op.Cond, kv.TxOrigin{}, edit(checks), writes)
	if err != nil {
		return op
	}
	o := *op
	o.Keys, o.Value = n.Keys, n.Value
	return &o
}
