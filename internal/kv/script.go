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

// applyScript runs a script op (see the top of this file).
func applyScript(get Getter, version uint64, op *Op, maxValue int) (Result, []string, map[string]overlayRec, error) {
	if runScript == nil {
		return Result{}, nil, nil, ErrNoScripting
	}
	if op.Delta < 0 || op.Delta > int64(len(op.Keys)) {
		return Result{}, nil, nil, fmt.Errorf("%w: script numkeys %d of %d arguments", ErrInvalidOp, op.Delta, len(op.Keys))
	}
	writes := map[string]overlayRec{}
	var order []string // keys in order of first write: the emit order
	var readVer uint64
	view := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if r, ok := writes[string(key)]; ok {
			return r.data, r.meta, version, !r.tomb, nil
		}
		return get(key)
	}
	// A script reads through get only: a scan it could ask for would have
	// to merge the overlay into the store's order. The one range read its
	// commands make is a point (HGET's field row), served by view.
	point := func(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
		if len(end) != len(start)+1 || end[len(start)] != 0 || !bytes.HasPrefix(end, start) {
			return fmt.Errorf("%w: a range read in a script", ErrInvalidOp)
		}
		data, meta, ver, ok, err := view(start)
		if err != nil || !ok {
			return err
		}
		visit(start, data, meta, ver)
		return nil
	}
	type staged struct {
		key, data, meta []byte
		tomb            bool
	}
	var batch []staged
	var gens uint32 // hashes created so far: each gets its own generation (newHashGen)
	exec := func(sub *Op) (Result, error) {
		sub.Now = op.Now // the script's one clock
		sub.scriptGens = &gens
		if op.Cond == DeclaredKeysOnly {
			if err := declaredOnly(op, sub); err != nil {
				return Result{}, err
			}
		}
		if !sub.Kind.IsUpdate() {
			if sub.Kind == KindScan {
				return Result{}, fmt.Errorf("%w: %v in a script", ErrInvalidOp, sub.Kind)
			}
			res, err := Read(view, point, sub, 0)
			readVer = max(readVer, res.Version)
			return res, err
		}
		if op.Kind == KindEvalRO {
			return Result{}, ErrScriptReadOnly
		}
		if sub.Kind == KindFlush || isScriptKind(sub.Kind) || sub.Kind == KindExpireIfDue {
			return Result{}, fmt.Errorf("%w: %v in a script", ErrInvalidOp, sub.Kind)
		}
		batch = batch[:0]
		res, err := Apply(view, version, sub, maxValue, func(key, value, meta []byte, tomb bool) {
			// Copied: key and value may alias the sub-op's buffers, which
			// the interpreter reuses.
			batch = append(batch, staged{append([]byte(nil), key...), append([]byte(nil), value...), append([]byte(nil), meta...), tomb})
		})
		if err != nil {
			return Result{}, err // the sub-op has no effect (Apply's contract)
		}
		for _, s := range batch {
			// The engine refuses a batch with an oversize record, and with it
			// the op on every replica: refused here, as a command error.
			if len(s.key) > ScriptMaxKey || (maxValue > 0 && len(s.data) > maxValue) {
				return Result{}, fmt.Errorf("%w: a record of a %d-byte key and a %d-byte value is too large", ErrInvalidOp, len(s.key), len(s.data))
			}
		}
		for _, s := range batch {
			k := string(s.key)
			if _, ok := writes[k]; !ok {
				order = append(order, k)
			}
			if len(s.meta) == 0 {
				s.meta = nil
			}
			writes[k] = overlayRec{data: s.data, meta: s.meta, tomb: s.tomb}
		}
		return res, nil
	}
	reply, raised := runScript(op, exec)
	res := Result{Kind: ResReply, Bulk: reply, Version: readVer}
	if raised {
		return res, nil, nil, nil
	}
	if len(order) > 0 {
		res.Version = version
	}
	return res, order, writes, nil
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
	res, _, _, err := applyScript(get, 0, &o, 0)
	return res, err
}

// applyScriptOp is Apply's case for the script kinds.
func applyScriptOp(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	o := *op // a copy, so that the callers' ops do not escape (readScript)
	res, order, writes, err := applyScript(get, version, &o, maxValue)
	if err != nil {
		return Result{}, err
	}
	for _, k := range order {
		r := writes[k]
		if r.tomb {
			emit([]byte(k), nil, nil, true)
		} else {
			put(emit, []byte(k), r.data, r.meta)
		}
	}
	return res, nil
}
