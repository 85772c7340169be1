package kv

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
)

// Scripts (EVAL, EVALSHA, EVAL_RO, EVALSHA_RO; docs/design/scripting.md).
//
// A script is ONE op of the state machine: the op carries the script's body
// (never its SHA, so no replica needs a script cache), its keys and its
// arguments, and every replica runs it at apply against the state as of
// op−1, with op.Now as its only clock. Its commands (redis.call) are kv ops
// evaluated by Apply and Read against an overlay of the script's own earlier
// writes; the records reach the caller's Emit only when the script has
// returned, one per key, so a script's writes land together, in the op's one
// version, or (the script raised an error) not at all.
//
// The Lua interpreter is not here: kv is a pure core (internal/purity), and
// the interpreter is a library this package must not import. internal/script
// registers itself (RegisterScripting) from its init; every engine that
// applies ops (internal/shard, internal/vrshard) imports it, so a replica
// that applies an EVAL always has the one interpreter.

// Script op kinds, from issue 27's block 128–135.
const (
	// KindEval runs Value (the script body) with Keys[:Delta] as KEYS and
	// Keys[Delta:] as ARGV: an update.
	KindEval Kind = 128 + iota
	// KindEvalRO is EVAL_RO: the same, but a command that writes is
	// refused. A read (Read; not Kind.IsUpdate), of every key (MultiKey:
	// one snapshot): a script may read keys it did not declare, so whoever
	// tracks reads by key treats it as a scan of the whole keyspace.
	KindEvalRO
	kindScriptEnd
)

func isScriptKind(k Kind) bool { return k >= KindEval && k < kindScriptEnd }

// IsScript reports whether k runs a script.
func IsScript(k Kind) bool { return isScriptKind(k) }

// ResReply is a result whose Bulk is a complete RESP2 reply (a script's:
// nested arrays, statuses and errors that the other kinds cannot carry). The
// front door writes it in the connection's protocol. Numbered apart from the
// other kinds (encoded in the client table's rows: codec.go), so that kinds
// added after ResArray cannot collide with it.
const ResReply ResultKind = 16

// ScriptExec runs one command of a script (a kv op the interpreter parsed
// from redis.call's arguments) against the script's state. Its op errors are
// the command's error reply; a write in a read-only script is refused with
// ErrScriptReadOnly.
type ScriptExec func(sub *Op) (Result, error)

// ScriptRunner runs op's script, calling exec for each redis.call, and
// returns its reply (RESP2) and whether the script raised an error (then
// none of its writes land). It must be deterministic: a function of op, of
// rnd (the op's random source, NewOpRand) and of what exec returns.
type ScriptRunner func(op *Op, rnd *OpRand, exec ScriptExec) (reply []byte, raised bool)

var runScript ScriptRunner

// RegisterScripting installs the interpreter (internal/script's init). A
// second registration panics: there is one interpreter.
func RegisterScripting(r ScriptRunner) {
	if runScript != nil {
		panic("kv: scripting registered twice")
	}
	runScript = r
}

// ErrScriptReadOnly refuses a write of an EVAL_RO script (the interpreter
// spells it as Redis does: "Write commands are not allowed from read-only
// scripts.").
var ErrScriptReadOnly = errors.New("write commands are not allowed from read-only scripts")

// ErrNoScripting: no interpreter is linked into this binary.
var ErrNoScripting = fmt.Errorf("%w: scripting is not linked into this build", ErrInvalidOp)

// ScriptMaxKey bounds the keys a script writes: the storage engine's
// default key limit (storage.Options.MaxKeySize), which Apply's callers do
// not pass in. An engine configured with a smaller limit refuses such a
// record (docs/design/scripting.md, "Left").
const ScriptMaxKey = 64 << 10

// OpScanLimit caps a range read (KindScan) of a script's or a transaction's
// command: the front door's page (KEYS reads in pages of it).
const OpScanLimit = 100_000

// OpRangeReadKeys caps the keys one op's commands may walk in range reads
// (KEYS, SCAN, DBSIZE, RANDOMKEY, HGETALL, HKEYS, HVALS, HSCAN, HRANDFIELD:
// every read that goes through overlay.scanRange other than a point), all
// of its commands together: a script or transaction runs at apply on every
// replica, at about 1.4 µs a key walked, and the group's other writes wait
// behind it (docs/design/transactions.md, "A budget for range reads"). A
// read that would walk past it fails with ErrOpRangeReads, that command's
// error. It is a constant, not a node's setting: the op is replicated and
// every replica must give it the same answer.
const OpRangeReadKeys = 100_000

// ErrOpRangeReads fails a range read of a script or transaction that would
// walk more than OpRangeReadKeys keys in the op.
var ErrOpRangeReads = fmt.Errorf("ERR a transaction or script may walk at most %d keys in range reads (KEYS, SCAN, DBSIZE, HGETALL...): read them with SCAN outside MULTI or the script", OpRangeReadKeys)

// overlayRec is a script's write to one key, not yet emitted.
type overlayRec struct {
	data, meta []byte
	tomb       bool
}

// overlay is the state a script's or a transaction's commands run against:
// their own earlier writes in front of the op's getter. Every command's
// records get the op's one version; they reach the engine (emit) only when
// the op is done, one per key, in the order the keys were first written.
// Scripts (KindEval, KindEvalRO) and transactions (KindExec, tx.go) share it:
// one copy of "run kv ops over their own writes at one version".
type overlay struct {
	get      Getter
	version  uint64
	maxValue int
	op       *Op
	writes   map[string]overlayRec
	order    []string // keys in order of first write: the emit order
	readVer  uint64
	gens     hashGens // the generations of the hashes created so far (newHashGen)
	batch    []staged
	// scan, if set, is the state's Scanner (a reader's: its getter may
	// hide reserved keys, so a read-only transaction, KindExecRO, reads a
	// hash's rows through it); list, if set, the state's Lister (an
	// applier's, ApplyWith). Either lets the commands read ranges (scan).
	scan Scanner
	list Lister
	// listOrdered: list visits keys in key order (ApplyOptions.OrderedList):
	// listScan walks it as it goes.
	listOrdered bool
	// listed are the ranges list listed last, sorted (listed): a range
	// read pages through its range (KEYS, SCAN: OpScanLimit keys a page;
	// ScanUser past expired keys), and the state before the op does not
	// change while it runs, so a page whose range one of them covers is
	// served from it rather than by listing the rest of the range again.
	listed [2]listing
	// flushed: a FLUSHDB or FLUSHALL ran (flush): the state before the op
	// reads as empty from then on, and emitAll emits the flush first.
	flushed bool
	// walked counts the keys the op's range reads have walked so far
	// (budgeted), against walkCap (OpRangeReadKeys; tests lower it).
	walked, walkCap int
	// rangeScan is budgeted(scanRange), the commands' range reads' Scanner.
	rangeScan Scanner
}

// listing is a range [start, end) of the state's keys as a Lister named
// them, sorted and deduplicated (a superset: some may be absent).
type listing struct {
	start, end []byte
	keys       []string
	ok         bool
}

// covers reports whether l holds every key of [start, end).
func (l *listing) covers(start, end []byte) bool {
	return l.ok && bytes.Compare(l.start, start) <= 0 && (l.end == nil || (end != nil && bytes.Compare(end, l.end) <= 0))
}

type staged struct {
	key, data, meta []byte
	tomb            bool
}

func newOverlay(get Getter, version uint64, op *Op, maxValue int) *overlay {
	return &overlay{get: get, version: version, maxValue: maxValue, op: op, writes: map[string]overlayRec{}, walkCap: OpRangeReadKeys}
}

// budgeted is scan counting, against the op's budget (OpRangeReadKeys), the
// keys it walks: every key the merged scan hands on, live or expired, matched
// by a pattern or not — a function of the state as of op−1 and the op's own
// writes, so every replica counts alike (the engine's listing does not count:
// it may name deleted keys not yet compacted, which differ by replica). A
// point range (HGET's field row) is a lookup and does not count. Once over,
// the read fails with ErrOpRangeReads, and so does every later range read of
// the op, at once (even of an empty range); point reads and writes go on. Only the commands' reads are
// budgeted (exec): a write that lists a range (COPY of a hash, FLUSHDB)
// never fails of it, so an op's writes do not depend on the budget.
func (o *overlay) budgeted(scan Scanner) Scanner {
	return func(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
		if PointRange(start, end, limit) {
			return scan(start, end, limit, visit)
		}
		if o.walked > o.walkCap {
			// An earlier read failed of the budget: this one fails
			// before it lists its range (a script's pcall loop).
			return ErrOpRangeReads
		}
		over := false
		err := scan(start, end, limit, func(k, data, meta []byte, version uint64) bool {
			if o.walked >= o.walkCap {
				over = true
				return false
			}
			o.walked++
			return visit(k, data, meta, version)
		})
		if err == nil && over {
			o.walked = o.walkCap + 1
			err = ErrOpRangeReads
		}
		return err
	}
}

func (o *overlay) view(key []byte) ([]byte, []byte, uint64, bool, error) {
	if r, ok := o.writes[string(key)]; ok {
		return r.data, r.meta, o.version, !r.tomb, nil
	}
	if o.flushed && FlushDeletes(key) {
		return nil, nil, 0, false, nil
	}
	return o.get(key)
}

// scanRange is the Scanner of the commands' range reads (a hash's rows,
// SCAN, KEYS...): the state's keys in [start, end) merged with the overlay's
// writes in key order (mergeScan). A point range (PointRange: HGET's field
// row) of an applier's state is a lookup through view, as it was before
// range reads: listing the range would cost more.
func (o *overlay) scanRange(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	base := o.scan
	if o.flushed {
		// Every key a command reads by range (user keys, a hash's rows) is
		// one a flush deletes: the state before the op has none left.
		base = func([]byte, []byte, int, func(key, data, meta []byte, version uint64) bool) error { return nil }
	}
	if base == nil {
		if PointRange(start, end, limit) {
			data, meta, ver, ok, err := o.view(start)
			if err != nil || !ok {
				return err
			}
			visit(start, data, meta, ver)
			return nil
		}
		if o.list == nil {
			return fmt.Errorf("%w: a range read needs the caller's scanner or key lister", ErrInvalidOp)
		}
		base = o.listScan
	}
	return mergeScan(base, o.writes, o.order, o.version, start, end, limit, visit)
}

// mergeScan visits the keys in [start, end) of base (the state before the
// op) with writes (the overlay's records, order their keys) in front of it,
// in key order, at most limit of them (0: no limit): a key the overlay
// deleted is hidden, one it wrote is visited with its record at version
// (the op's), wherever it falls among base's keys. It is the one merge every
// range read of a script or transaction goes through; ScanUser above it
// hides reserved and expired keys as at the front door.
func mergeScan(base Scanner, writes map[string]overlayRec, order []string, version uint64, start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	var mine []string
	for _, k := range order {
		if k >= string(start) && (end == nil || k < string(end)) {
			mine = append(mine, k)
		}
	}
	slices.Sort(mine)
	n, i := 0, 0
	done := false
	// own visits the overlay's record of mine[i] (a deletion: nothing) and
	// reports whether the scan goes on.
	own := func() bool {
		k := mine[i]
		i++
		r := writes[k]
		if r.tomb {
			return true
		}
		n++
		done = !visit([]byte(k), r.data, r.meta, version) || (limit > 0 && n >= limit)
		return !done
	}
	// The overlay hides at most len(mine) of base's keys: base reads that
	// many more than the limit, and no more.
	baseLimit := 0
	if limit > 0 {
		baseLimit = limit + len(mine)
	}
	err := base(start, end, baseLimit, func(k, data, meta []byte, ver uint64) bool {
		for i < len(mine) && mine[i] < string(k) {
			if !own() {
				return false
			}
		}
		if i < len(mine) && mine[i] == string(k) {
			return own() // the overlay's record stands for base's
		}
		n++
		done = !visit(k, data, meta, ver) || (limit > 0 && n >= limit)
		return !done
	})
	for err == nil && !done && i < len(mine) {
		own()
	}
	return err
}

// skipReserved is scan without the reserved keys' range (hash rows, client
// rows...), for a read of user keys (KindScan), which ScanUser would skip
// one by one: an applier's Lister would list, and its getter read, every
// one of them.
func skipReserved(scan Scanner) Scanner {
	rEnd := PrefixEnd(ReservedPrefix)
	return func(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
		n, stopped := 0, false
		count := func(k, d, m []byte, v uint64) bool {
			n++
			stopped = !visit(k, d, m, v)
			return !stopped
		}
		if bytes.Compare(start, ReservedPrefix) < 0 {
			e := ReservedPrefix
			if end != nil && bytes.Compare(end, e) < 0 {
				e = end
			}
			if err := scan(start, e, limit, count); err != nil || stopped || (limit > 0 && n >= limit) {
				return err
			}
		}
		if end != nil && bytes.Compare(end, rEnd) <= 0 {
			return nil
		}
		from := start
		if bytes.Compare(from, rEnd) < 0 {
			from = rEnd
		}
		rest := 0
		if limit > 0 {
			rest = limit - n
		}
		return scan(from, end, rest, count)
	}
}

// listMerged is a Lister of the overlay's state (scanRange): COPY of a hash
// lists the source's rows with it.
func (o *overlay) listMerged(start, end []byte, visit func(key []byte) bool) error {
	return o.scanRange(start, end, 0, func(k, _, _ []byte, _ uint64) bool { return visit(k) })
}

// listScan is the Scanner of an applier's state (o.list and o.get): the
// keys list names in [start, end) (in any order, a superset: Lister),
// sorted, each read through get (a listed key may be absent). A range is
// listed whole before its first visit, whatever the limit, once per op
// (listedKeys): a range read in an op that writes costs the range's size
// (docs/design/transactions.md).
func (o *overlay) listScan(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	if o.listOrdered {
		return o.listInOrder(start, end, limit, visit)
	}
	keys, err := o.listedKeys(start, end)
	if err != nil {
		return err
	}
	n := 0
	for _, k := range keys {
		if end != nil && k >= string(end) {
			break
		}
		data, meta, ver, ok, err := o.get([]byte(k))
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		n++
		if !visit([]byte(k), bytes.Clone(data), bytes.Clone(meta), ver) || (limit > 0 && n >= limit) {
			return nil
		}
	}
	return nil
}

// listInOrder is listScan for a Lister in key order: each key read through
// get as it is listed, the listing stopped at the limit or when visit says
// (the range-read budget: overlay.budgeted), so a read costs the keys it
// walks, not its range's size. What it visits is listScan's: the answer, and
// the budget's count, are the same either way.
func (o *overlay) listInOrder(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	n := 0
	var gerr error
	err := o.list(start, end, func(k []byte) bool {
		if bytes.Compare(k, start) < 0 || (end != nil && bytes.Compare(k, end) >= 0) {
			return true // a superset may name keys outside the range
		}
		data, meta, ver, ok, err := o.get(k)
		if err != nil {
			gerr = err
			return false
		}
		if !ok {
			return true
		}
		n++
		// Copies: a Lister's keys (a staged record's) and get's values
		// may be reused, and a read keeps what it visits.
		return visit(bytes.Clone(k), bytes.Clone(data), bytes.Clone(meta), ver) && (limit <= 0 || n < limit)
	})
	if err == nil {
		err = gerr
	}
	return err
}

// listedKeys returns the sorted keys of [start, end) o.list names, from the
// first key at or after start (and maybe past end: the caller stops there),
// through the op's two last listings (o.listed).
func (o *overlay) listedKeys(start, end []byte) ([]string, error) {
	for i := range o.listed {
		if l := &o.listed[i]; l.covers(start, end) {
			j, _ := slices.BinarySearch(l.keys, string(start))
			return l.keys[j:], nil
		}
	}
	var keys []string
	if err := o.list(start, end, func(k []byte) bool {
		keys = append(keys, string(k))
		return true
	}); err != nil {
		return nil, err
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	o.listed[1] = o.listed[0]
	o.listed[0] = listing{start: bytes.Clone(start), end: bytes.Clone(end), keys: keys, ok: true}
	j, _ := slices.BinarySearch(keys, string(start)) // a Lister's superset may hold keys below start
	return keys[j:], nil
}

// exec runs one command (a ScriptExec).
func (o *overlay) exec(sub *Op) (Result, error) {
	op := o.op
	sub.Now = op.Now // the op's one clock
	sub.scriptGens = &o.gens
	if op.Cond == DeclaredKeysOnly {
		if err := declaredOnly(op, sub); err != nil {
			return Result{}, err
		}
	}
	if !sub.Kind.IsUpdate() {
		if sub.Kind == KindWatch {
			return Result{}, fmt.Errorf("%w: %v in a script", ErrInvalidOp, sub.Kind)
		}
		if o.rangeScan == nil {
			// Made once per op: a closure per command was an allocation
			// of every GET in a transaction.
			o.rangeScan = o.budgeted(o.scanRange)
		}
		scan := o.rangeScan
		if sub.Kind == KindScan {
			scan = skipReserved(scan)
		}
		res, err := Read(o.view, scan, sub, OpScanLimit)
		o.readVer = max(o.readVer, res.Version)
		return res, err
	}
	if op.Kind == KindEvalRO || op.Kind == KindExecRO {
		return Result{}, ErrScriptReadOnly
	}
	if RunsCommands(sub.Kind) || sub.Kind == KindExpireIfDue {
		return Result{}, fmt.Errorf("%w: %v in a script", ErrInvalidOp, sub.Kind)
	}
	if sub.Kind == KindFlush {
		return o.flush()
	}
	return o.stage(sub)
}

// flush is FLUSHDB or FLUSHALL inside the op: the op's writes so far are
// erased (none is emitted) and the state before the op reads as empty from
// here on (view, scanRange), so the commands after it see an empty store
// plus their own writes. Its records are emitAll's: the flush's mark first,
// the tombstones of the state's keys, then the writes made after it — the
// flush erases everything before it in the op, so nothing written before
// it needs a record. They are one op's records: replay re-runs the op (a
// replica) and a single node's engine keeps its batch whole or drops it, so
// the transaction stays all or nothing (docs/design/transactions.md).
func (o *overlay) flush() (Result, error) {
	if o.list == nil {
		return Result{}, fmt.Errorf("%w: a flush needs the caller's key lister (ApplyWith)", ErrInvalidOp)
	}
	for _, k := range o.order {
		if FlushDeletes([]byte(k)) {
			delete(o.writes, k)
		}
	}
	o.order = slices.DeleteFunc(o.order, func(k string) bool { _, ok := o.writes[k]; return !ok })
	o.flushed = true
	// The generations of the hashes created after the flush count from 0
	// again (newHashGen): those before it left no record, and a crash
	// replay may count them otherwise — it reads a key whose flush
	// tombstone survived as absent (vrshard.applier.current), so an HSET
	// before the flush may create a hash the first run found. From here on
	// both runs read nothing but their own writes, and number alike.
	o.gens = hashGens{}
	return Result{Kind: ResOK, Version: o.version}, nil
}

// stage evaluates the write sub at the overlay's version against the overlay
// and, if it succeeds, keeps its records there; on error nothing changes.
// Scripts and MULTI/EXEC reach it through exec, interactive transactions
// through TxOverlay (itx.go).
func (o *overlay) stage(sub *Op) (Result, error) {
	o.batch = o.batch[:0]
	keep := func(key, value, meta []byte, tomb bool) {
		// Copied: key and value may alias the sub-op's buffers, which
		// the interpreter reuses.
		o.batch = append(o.batch, staged{append([]byte(nil), key...), append([]byte(nil), value...), append([]byte(nil), meta...), tomb})
	}
	var res Result
	var err error
	if sub.Kind == KindCopy && (o.list != nil || o.scan != nil) {
		// COPY of a hash lists the source's rows: the merged state's.
		res, err = applyMove(o.view, o.listMerged, o.version, sub, keep)
	} else {
		res, err = apply(o.view, o.version, sub, o.maxValue, keep)
	}
	if err != nil {
		return Result{}, err // the sub-op has no effect (Apply's contract)
	}
	for _, s := range o.batch {
		// The engine refuses a batch with an oversize record, and with it
		// the op on every replica: refused here, as a command error.
		if len(s.key) > ScriptMaxKey || (o.maxValue > 0 && len(s.data) > o.maxValue) {
			return Result{}, fmt.Errorf("%w: a record of a %d-byte key and a %d-byte value is too large", ErrInvalidOp, len(s.key), len(s.data))
		}
	}
	for _, s := range o.batch {
		k := string(s.key)
		if _, ok := o.writes[k]; !ok {
			o.order = append(o.order, k)
		}
		if len(s.meta) == 0 {
			s.meta = nil
		}
		o.writes[k] = overlayRec{data: s.data, meta: s.meta, tomb: s.tomb}
	}
	return res, nil
}

// emitAll hands the overlay's records to emit, one per key, in first-write
// order; after a flush's (flush), if the op flushed.
func (o *overlay) emitAll(emit Emit) error {
	if o.flushed {
		if err := emitFlush(o.get, o.list, o.writes, emit); err != nil {
			return err
		}
	}
	for _, k := range o.order {
		r := o.writes[k]
		if r.tomb {
			emit([]byte(k), nil, nil, true)
		} else {
			put(emit, []byte(k), r.data, r.meta)
		}
	}
	return nil
}

// applyScript runs a script op (see the top of this file).
func applyScript(get Getter, scan Scanner, list Lister, ordered bool, version uint64, op *Op, maxValue int) (Result, *overlay, error) {
	if runScript == nil {
		return Result{}, nil, ErrNoScripting
	}
	if op.Delta < 0 || op.Delta > int64(len(op.Keys)) {
		return Result{}, nil, fmt.Errorf("%w: script numkeys %d of %d arguments", ErrInvalidOp, op.Delta, len(op.Keys))
	}
	o := newOverlay(get, version, op, maxValue)
	o.scan, o.list, o.listOrdered = scan, list, ordered
	reply, raised := runScript(op, NewOpRand(version, op.Now), o.exec)
	res := Result{Kind: ResReply, Bulk: reply, Version: o.readVer}
	if raised {
		return res, nil, nil
	}
	if len(o.order) > 0 || o.flushed {
		res.Version = version
	}
	return res, o, nil
}

// ErrScriptUndeclaredKey refuses a command of a DeclaredKeysOnly script
// (at a node of several groups) on a key it did not declare.
var ErrScriptUndeclaredKey = errors.New("ERR Script attempted to access a key it did not declare; at a node of several groups a script may access only the keys it passes in KEYS")

// declaredOnly refuses sub, a command of script op, if it names a key op did
// not declare (Keys[:Delta]).
func declaredOnly(op, sub *Op) error {
	keys, step := sub.RoutingKeys()
	declared := op.Keys[:max(0, min(int(op.Delta), len(op.Keys)))]
	for i := 0; i < len(keys); i += step {
		if !slices.ContainsFunc(declared, func(d []byte) bool { return bytes.Equal(d, keys[i]) }) {
			return ErrScriptUndeclaredKey
		}
	}
	if sub.Kind == KindFlush {
		return ErrFlushOneGroup
	}
	if sub.Kind == KindScan {
		return ErrScanOneGroup
	}
	return nil
}

// ErrScanOneGroup refuses a keyspace read (SCAN, KEYS, DBSIZE, RANDOMKEY) of
// a DeclaredKeysOnly script or transaction: at a node of several groups the
// op is one group's and would answer that group's keys as the keyspace.
var ErrScanOneGroup = errors.New("ERR a script or transaction at a node of several groups cannot read the keyspace (SCAN, KEYS, DBSIZE, RANDOMKEY): it runs in one group, which holds only some of the keys")

// ErrFlushOneGroup refuses FLUSHDB or FLUSHALL in a DeclaredKeysOnly script
// or transaction: at a node of several groups the op is one group's and
// would flush only that group's keys (a flush on its own flushes them all).
var ErrFlushOneGroup = errors.New("ERR FLUSHDB and FLUSHALL inside a script or transaction at a node of several groups would flush one group's keys: send it on its own")

// readScript is Read's case for KindEvalRO (it writes nothing). The
// interpreter keeps the op it is handed, which would make every caller's op
// escape to the heap, the GET hot path's too (TestCachedGetDoesNotAllocate,
// internal/shard): it gets a copy.
func readScript(get Getter, scan Scanner, op *Op) (Result, error) {
	o := *op
	res, _, err := applyScript(get, scan, nil, false, 0, &o, 0)
	return res, err
}

// applyScriptOp is Apply's case for the script kinds.
func applyScriptOp(get Getter, list Lister, ordered bool, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	o := *op // a copy, so that the callers' ops do not escape (readScript)
	res, ov, err := applyScript(get, nil, list, ordered, version, &o, maxValue)
	if err != nil {
		return Result{}, err
	}
	if ov != nil {
		if err := ov.emitAll(emit); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}
