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
// none of its writes land). It must be deterministic: a function of op and
// of what exec returns.
type ScriptRunner func(op *Op, exec ScriptExec) (reply []byte, raised bool)

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
	// scan, if set, serves the point range reads (a hash's field row) of
	// keys the overlay does not hold: a reader's getter may hide reserved
	// keys (a read-only transaction, KindExecRO, reads rows so).
	scan Scanner
}

type staged struct {
	key, data, meta []byte
	tomb            bool
}

func newOverlay(get Getter, version uint64, op *Op, maxValue int) *overlay {
	return &overlay{get: get, version: version, maxValue: maxValue, op: op, writes: map[string]overlayRec{}}
}

func (o *overlay) view(key []byte) ([]byte, []byte, uint64, bool, error) {
	if r, ok := o.writes[string(key)]; ok {
		return r.data, r.meta, o.version, !r.tomb, nil
	}
	return o.get(key)
}

// point serves the one range read the commands make, a point (HGET's field
// row): a scan would have to merge the overlay into the store's order.
func (o *overlay) point(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	if len(end) != len(start)+1 || end[len(start)] != 0 || !bytes.HasPrefix(end, start) {
		return fmt.Errorf("%w: a range read in a script", ErrInvalidOp)
	}
	if _, mine := o.writes[string(start)]; !mine && o.scan != nil {
		return o.scan(start, end, limit, visit)
	}
	data, meta, ver, ok, err := o.view(start)
	if err != nil || !ok {
		return err
	}
	visit(start, data, meta, ver)
	return nil
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
		if sub.Kind == KindScan || sub.Kind == KindWatch {
			return Result{}, fmt.Errorf("%w: %v in a script", ErrInvalidOp, sub.Kind)
		}
		res, err := Read(o.view, o.point, sub, 0)
		o.readVer = max(o.readVer, res.Version)
		return res, err
	}
	if op.Kind == KindEvalRO || op.Kind == KindExecRO {
		return Result{}, ErrScriptReadOnly
	}
	if sub.Kind == KindFlush || RunsCommands(sub.Kind) || sub.Kind == KindExpireIfDue {
		return Result{}, fmt.Errorf("%w: %v in a script", ErrInvalidOp, sub.Kind)
	}
	return o.stage(sub)
}

// stage evaluates the write sub at the overlay's version against the overlay
// and, if it succeeds, keeps its records there; on error nothing changes.
// Scripts and MULTI/EXEC reach it through exec, interactive transactions
// through TxOverlay (itx.go).
func (o *overlay) stage(sub *Op) (Result, error) {
	o.batch = o.batch[:0]
	res, err := apply(o.view, o.version, sub, o.maxValue, func(key, value, meta []byte, tomb bool) {
		// Copied: key and value may alias the sub-op's buffers, which
		// the interpreter reuses.
		o.batch = append(o.batch, staged{append([]byte(nil), key...), append([]byte(nil), value...), append([]byte(nil), meta...), tomb})
	})
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
// order.
func (o *overlay) emitAll(emit Emit) {
	for _, k := range o.order {
		r := o.writes[k]
		if r.tomb {
			emit([]byte(k), nil, nil, true)
		} else {
			put(emit, []byte(k), r.data, r.meta)
		}
	}
}

// applyScript runs a script op (see the top of this file).
func applyScript(get Getter, version uint64, op *Op, maxValue int) (Result, *overlay, error) {
	if runScript == nil {
		return Result{}, nil, ErrNoScripting
	}
	if op.Delta < 0 || op.Delta > int64(len(op.Keys)) {
		return Result{}, nil, fmt.Errorf("%w: script numkeys %d of %d arguments", ErrInvalidOp, op.Delta, len(op.Keys))
	}
	o := newOverlay(get, version, op, maxValue)
	reply, raised := runScript(op, o.exec)
	res := Result{Kind: ResReply, Bulk: reply, Version: o.readVer}
	if raised {
		return res, nil, nil
	}
	if len(o.order) > 0 {
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
		return ErrScriptUndeclaredKey
	}
	return nil
}

// readScript is Read's case for KindEvalRO (it writes nothing). The
// interpreter keeps the op it is handed, which would make every caller's op
// escape to the heap, the GET hot path's too (TestCachedGetDoesNotAllocate,
// internal/shard): it gets a copy.
func readScript(get Getter, op *Op) (Result, error) {
	o := *op
	res, _, err := applyScript(get, 0, &o, 0)
	return res, err
}

// applyScriptOp is Apply's case for the script kinds.
func applyScriptOp(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	o := *op // a copy, so that the callers' ops do not escape (readScript)
	res, ov, err := applyScript(get, version, &o, maxValue)
	if err != nil {
		return Result{}, err
	}
	if ov != nil {
		ov.emitAll(emit)
	}
	return res, nil
}
