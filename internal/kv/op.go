package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/token"
)

// Kind is the kind of an operation.
type Kind uint8

// Operation kinds. Reads first, then updates; IsUpdate relies on the order.
const (
	KindGet Kind = iota + 1
	KindMGet
	KindExists
	KindStrlen
	KindScan

	KindSet
	KindMSet
	KindDel
	KindIncrBy
	KindGetSet
	KindAppend
	KindCAS
)

var kindNames = [...]string{"invalid", "get", "mget", "exists", "strlen", "scan",
	"set", "mset", "del", "incrby", "getset", "append", "cas"}

func (k Kind) String() string {
	if isExpiryKind(k) {
		return expiryKindNames[k-KindTTL]
	}
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	if k >= KindRename && k < kindMoreEnd {
		return moreKindNames[k-KindRename]
	}
	if isHashWrite(k) {
		return hashKindNames[k-KindHSet]
	}
	if isHashRead(k) {
		return hashReadNames[k-KindHGet]
	}
	if isScriptKind(k) {
		return [...]string{"eval", "eval_ro"}[k-KindEval]
	}
	if isSlotKind(k) {
		return slotKindNames[k-KindSlotInit]
	}
	if isTxKind(k) {
		return [...]string{"exec", "watch", "exec_ro"}[k-KindExec]
	}
	if isItxKind(k) {
		return "txcommit"
	}
	if isXgtxKind(k) {
		return xgtxKindNames[k-KindTxPrepare]
	}
	if k == KindBitField {
		return "bitfield"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// IsUpdate reports whether operations of this kind modify state.
func (k Kind) IsUpdate() bool {
	if isExpiryKind(k) {
		return k != KindTTL
	}
	return k >= KindSet && !isHashRead(k) && k != KindEvalRO && k != KindWatch && k != KindExecRO
}

// Cond is SET's condition.
type Cond uint8

const (
	// Always sets unconditionally.
	Always Cond = iota
	// IfAbsent sets only if the key does not exist (NX).
	IfAbsent
	// IfPresent sets only if the key exists (XX).
	IfPresent
	// DeclaredKeysOnly (scripts only): the script may touch its declared
	// keys only — set by the router of a node of several groups, where a
	// script's op runs in the group of its declared keys' slot and any other
	// key may belong to another group (ErrScriptUndeclaredKey).
	DeclaredKeysOnly
)

// Op is one operation. Slices are read during Apply/Read and not kept afterwards
// (the engine copies what it stores), so callers may reuse their buffers once the
// call returns.
type Op struct {
	Kind Kind
	// Key is the key of single-key operations and the start of a scan.
	Key []byte
	// Keys are the keys of MGET, EXISTS and DEL; for MSET alternating key, value.
	Keys [][]byte
	// Value is the new value of SET, GETSET, CAS and the suffix of APPEND.
	Value []byte
	// Expected is CAS's expected current value.
	Expected []byte
	// Delta is INCRBY's increment.
	Delta int64
	// Cond and ReturnOld are SET's NX/XX and GET options. On KindMGet
	// ReturnOld asks for strings only: a key of another type is
	// ErrWrongKind rather than a nil (LCS's reads, as Redis's LCS answers).
	Cond      Cond
	ReturnOld bool
	// End (exclusive; nil = unbounded) and Limit (pairs) bound a scan.
	End   []byte
	Limit int

	// Expiry (expiry.go). Now is the unix milliseconds of the node that
	// proposed the write or serves the read: the only clock the state machine
	// knows, so "expired" is decided the same on every replica. ExpireAt is
	// the absolute expiry (unix ms, 0: none) SET EX/PX/EXAT/PXAT, SETEX,
	// GETEX and EXPIRE* set; TTL their options (KEEPTTL, PERSIST, NX|XX|GT|LT).
	Now      int64
	ExpireAt int64
	TTL      TTLFlag

	// ScanBuf (not encoded; nil: fresh memory), if set on a scan, is a buffer
	// the caller owns that the engine may read the scan's values into
	// (storage.DB.ScanInto): the Result's values then alias it, and the caller
	// must not reuse it until it is done with the Result (the server: until the
	// reply is encoded). It changes where the values live, not what the read
	// sees. Nothing that keeps a Result past its caller may set it.
	ScanBuf *[]byte

	// scriptGens (not encoded: set by the script runner on the ops its
	// redis.call makes) counts the hashes a script op created so far: each
	// needs a generation of its own, and they all share the op's version
	// (newHashGen).
	scriptGens *hashGens
}

// ResultKind says which field of a Result carries the answer.
type ResultKind uint8

const (
	// ResOK is a simple "OK".
	ResOK ResultKind = iota + 1
	// ResInt is an integer in Int.
	ResInt
	// ResBulk is a value in Bulk.
	ResBulk
	// ResNil is a null (missing key, failed SET NX/XX).
	ResNil
	// ResArray is Array: MGET values (nil = missing) or SCAN's key, value, key, value...
	ResArray
)

// Result is an operation's answer. Bulk and Array's elements are read-only: a read
// hands out the storage engine's cached bytes (storage.DB.GetShared) without copying,
// so a caller that wants to modify a value must copy it first.
type Result struct {
	Kind  ResultKind
	Int   int64
	Bulk  []byte
	Array [][]byte
	// Version is the version the operation wrote, or the highest version it read
	// (0 if it saw nothing); sessions advance by it.
	Version uint64
	// View, if ViewKnown, is the view whose log the op numbered Version was
	// ordered in (a replicated shard, where versions are op numbers): a view
	// change can drop an acknowledged cad or async write and give its number
	// to another op, and a session token carrying the view tells them apart
	// (internal/shard.ErrSessionLost). Unknown on a single node, whose versions are never
	// reused (versions.go).
	View      uint64
	ViewKnown bool
	// Group is the replica group that produced the result on a node of
	// several groups (cluster.Multi sets it), 0 elsewhere: a session token
	// keeps one position per group's log (token.Session.AfterRead). It
	// sits in ViewKnown's padding: a Result is no larger for it
	// (TestResultSize).
	Group uint32
}

// Pos is r's position for a session token: its version, view and group.
func (r Result) Pos() token.Pos {
	return token.Pos{Version: r.Version, View: r.View, ViewKnown: r.ViewKnown, Group: r.Group}
}

// Errors an operation itself produces: outcomes of the op, equal on every
// replica that evaluates it (the replicated client table caches them, by
// code: codec.go). The server maps them to -ERR (ErrWrongType as Redis's
// "-ERR value is not an integer or out of range"); their texts are the RESP
// message after the prefix. A replica's own failures (a store that cannot be
// read, a closed shard) are internal/shard's errors, not these.
var (
	ErrWrongType   = errors.New("value is not an integer or out of range")
	ErrOverflow    = errors.New("increment or decrement would overflow")
	ErrReservedKey = errors.New("keys starting with \\xff\\xffkefir are reserved")
	ErrInvalidOp   = errors.New("invalid operation")
)

// ReservedPrefix starts the keys a replica keeps for itself in the store (its
// client table, version reservations, applied mark...). Writes to them are
// refused (ErrReservedKey); reads see them as absent and scans skip them.
var ReservedPrefix = []byte("\xff\xffkefir/")

// ReservedKey returns the reserved key (or key prefix) ReservedPrefix+name,
// in a slice of its own.
func ReservedKey(name string) []byte {
	return append(append([]byte(nil), ReservedPrefix...), name...)
}

// IsReserved reports whether key is one of the reserved keys.
func IsReserved(key []byte) bool { return bytes.HasPrefix(key, ReservedPrefix) }

// WrittenKeys returns the keys op writes (or may write: a conditional write
// that turns out to write nothing is counted). DEL's keys count too. A flush
// writes every key and names none: see WritesAll.
//
// Small enough to inline: the one-key slice of the common writes is then
// the caller's, on its stack when it keeps none of it (every write's path
// asks two or three times).
func (op *Op) WrittenKeys() [][]byte {
	if writesKey[op.Kind] {
		return [][]byte{op.Key}
	}
	return op.writtenKeys()
}

// writesKey: the kinds that write exactly their Key. A hash write names its
// user key only: it always rewrites the metadata record there (hash.go),
// and its field rows are reserved.
var writesKey = func() (t [256]bool) {
	for _, k := range []Kind{KindSet, KindIncrBy, KindGetSet, KindAppend, KindCAS, KindExpire, KindPersist, KindGetEx,
		KindGetDel, KindSetRange, KindIncrByFloat, KindSetBit, KindBitField,
		KindHSet, KindHDel, KindHIncrBy, KindHIncrByFloat} {
		t[k] = true
	}
	return t
}()

// writtenKeys is WrittenKeys of the other kinds.
func (op *Op) writtenKeys() [][]byte {
	switch op.Kind {
	case KindRename:
		return op.Keys
	case KindCopy:
		if len(op.Keys) == 2 {
			return op.Keys[1:]
		}
	case KindMSet, KindMSetNX:
		ks := make([][]byte, 0, len(op.Keys)/2)
		for i := 0; i+1 < len(op.Keys); i += 2 {
			ks = append(ks, op.Keys[i])
		}
		return ks
	case KindSlotInit:
		return [][]byte{SlotTableKey}
	case KindSlotSet:
		if len(op.Expected) > 0 {
			return [][]byte{SlotTableKey, SlotFenceKey}
		}
		return [][]byte{SlotTableKey}
	case KindMapInit, KindMapMovePlan, KindMapMoveClaim, KindMapMoveDone, KindMapMoveAbort, KindMapAddNode, KindMapSetMembers, KindMapAddGroup, KindMapRemoveGroup, KindMapChainWant:
		return [][]byte{ClusterMapKey}
	case KindMapChainInit, KindMapChainSet:
		// The cluster map too: a chain group's members follow the record
		// (followChain).
		return [][]byte{ChainConfigKey(chainGroupOf(op)), ClusterMapKey}
	case KindGroupAddrs:
		return [][]byte{GroupAddrsKey}
	case KindSlotImport:
		ks := make([][]byte, 0, len(op.Keys)/3+1)
		if len(op.Expected) > 0 {
			ks = append(ks, SlotFenceKey)
		}
		for i := 0; i+2 < len(op.Keys); i += 3 {
			if bytes.Equal(op.Keys[i+1], slotClientMark) && len(op.Keys[i]) == 8 {
				ks = append(ks, SlotClientKey(binary.BigEndian.Uint64(op.Keys[i])))
			} else {
				ks = append(ks, op.Keys[i])
			}
		}
		return ks
	case KindDel, KindExpireIfDue:
		return op.Keys
	case KindTxCommit:
		return txWrittenKeys(op) // itx.go
	case KindTxPrepare, KindTxForget, KindTxCollect:
		// A prepare's writes land with its resolve (WritesAll); these write
		// only their own reserved records (a forget's and a collect's Keys
		// are transactions' ids and keys of other groups).
		return nil
	case KindEval:
		// Its declared keys; it may write others too, so it also WritesAll.
		if op.Delta >= 0 && op.Delta <= int64(len(op.Keys)) {
			return op.Keys[:op.Delta]
		}
	case KindExec:
		// Every key its commands and watches name (a superset of what it
		// writes).
		return op.Keys
	}
	return nil
}

// RoutingKeys returns the user keys op names, for routing it by slot, and
// the stride between them in the slice (2 for MSET's key, value pairs).
// Keys is not always keys: a hash op's Keys are its fields (and values), an
// EVAL's hold its arguments after the Delta declared keys; those route by
// their user key alone. A scan names a range, none of its keys: its Key is
// where the range starts, which may hash to a slot of another group (a
// SCAN cursor's next key), so a scan is not routed or fenced by it — its
// callers filter what it returns by slot. Other ops name either Key or Keys.
func (op *Op) RoutingKeys() (keys [][]byte, step int) {
	switch {
	case isSlotKind(op.Kind) || op.Kind == KindScan:
		// Sent to a group by id; an import's keys are its own to check.
		return nil, 1
	case isHashWrite(op.Kind) || isHashRead(op.Kind):
		return [][]byte{op.Key}, 1
	case RunsCommands(op.Kind):
		if op.Delta >= 0 && op.Delta <= int64(len(op.Keys)) {
			return op.Keys[:op.Delta], 1
		}
		return nil, 1
	case op.Kind == KindMSet || op.Kind == KindMSetNX:
		return op.Keys, 2
	case op.Kind == KindTxCommit || op.Kind == KindTxPrepare:
		return txRoutingKeys(op), 1 // itx.go
	case op.Kind == KindTxDecide || op.Kind == KindTxResolve || op.Kind == KindTxForget || op.Kind == KindTxCollect:
		// Sent to a group by a key of its own (the primary's, a
		// participant's): Expected (xgtx.go).
		return [][]byte{op.Expected}, 1
	case len(op.Key) > 0:
		return [][]byte{op.Key}, 1
	}
	return op.Keys, 1
}

// CheckSizes refuses (ErrInvalidOp) a write that stores a key longer than
// maxKey or a value longer than maxVal, the engine's limits: the engine would
// refuse the whole batch it came in, and a replicated op it refuses stops every
// replica that applies it. DEL is never refused (it writes a tombstone only for
// a key that exists, which an oversize key never does), nor an APPEND whose
// result outgrows maxVal: that is known only when it is applied.
func (op *Op) CheckSizes(maxKey, maxVal int) error {
	check := func(k, v []byte) error {
		if len(k) > maxKey {
			return fmt.Errorf("%w: key of %d bytes > %d", ErrInvalidOp, len(k), maxKey)
		}
		if len(v) > maxVal {
			return fmt.Errorf("%w: value of %d bytes > %d", ErrInvalidOp, len(v), maxVal)
		}
		return nil
	}
	switch op.Kind {
	case KindSet, KindGetSet, KindAppend, KindCAS, KindIncrBy, KindSetRange:
		return check(op.Key, op.Value)
	case KindIncrByFloat, KindSetBit, KindBitField:
		return check(op.Key, nil)
	case KindHSet, KindHDel, KindHIncrBy, KindHIncrByFloat:
		// A one-field HSET, the commonest hash write, is checked without
		// the closure's calls and the loop (~40 instructions of a
		// pipelined HSET; docs/design/hashes.md, "Pipelined, session 28").
		// One over a limit goes on, to the error that names it.
		// TestCheckSizesOfOneFieldHSetAgreesWithTheLoop.
		if op.Kind == KindHSet && len(op.Keys) == 2 && len(op.Key) <= maxKey &&
			len(op.Keys[0])+HashRowOverhead <= maxKey && len(op.Keys[1]) <= maxVal {
			return nil
		}
		if err := check(op.Key, nil); err != nil {
			return err
		}
		// A field is stored in a row whose key is longer than the field.
		for i := 0; i < len(op.Keys); i++ {
			if n := len(op.Keys[i]) + HashRowOverhead; n > maxKey {
				return fmt.Errorf("%w: hash field of %d bytes makes a row key of %d > %d", ErrInvalidOp, len(op.Keys[i]), n, maxKey)
			}
			if op.Kind == KindHSet && i+1 < len(op.Keys) {
				i++
				if len(op.Keys[i]) > maxVal {
					return fmt.Errorf("%w: value of %d bytes > %d", ErrInvalidOp, len(op.Keys[i]), maxVal)
				}
			}
		}
	case KindRename, KindCopy:
		// The destination gets the source's record, which fits: only the
		// key can be too long.
		for _, k := range op.Keys {
			if err := check(k, nil); err != nil {
				return err
			}
		}
	case KindTxCommit, KindTxPrepare:
		for i := 0; i+2 < len(op.Keys); i += 3 {
			if err := check(op.Keys[i+1], op.Keys[i+2]); err != nil {
				return err
			}
		}
	case KindMSet, KindMSetNX:
		for i := 0; i+1 < len(op.Keys); i += 2 {
			if err := check(op.Keys[i], op.Keys[i+1]); err != nil {
				return err
			}
		}
	case KindSlotImport:
		// Copied from a group with the same limits; a hash's fields are
		// checked as its rows are written (the engine refuses the op).
		for i := 0; i+2 < len(op.Keys); i += 3 {
			v := op.Keys[i+2]
			if MetaType(op.Keys[i+1]) == TypeHash || bytes.Equal(op.Keys[i+1], slotClientMark) {
				v = nil
			}
			if err := check(op.Keys[i], v); err != nil {
				return err
			}
		}
	}
	return nil
}

// WritesAll reports whether op may write any key (a flush): whoever tracks
// writes by key (WrittenKeys) must treat it as touching the whole keyspace.
//
// A script (KindEval) may write keys it did not declare (as Redis without
// cluster allows: docs/design/scripting.md), so it counts as one too.
//
// A cross-group transaction's decide and resolve land the writes its
// prepare recorded (xgtx.go), which the op itself does not name: they count
// too.
func (op *Op) WritesAll() bool {
	return op.Kind == KindFlush || op.Kind == KindEval || op.Kind == KindTxDecide || op.Kind == KindTxResolve ||
		op.Kind == KindExec && execWritesAll(op.Value)
}

// Lists reports whether op needs the caller's key Lister (ApplyWith): a
// flush lists the keyspace, a COPY the rows of a hash it may copy, an EXEC
// those of a hash it watches (Observe), an EXEC or an EVAL the ranges its
// commands read (SCAN, KEYS, HGETALL...: mergeScan).
func (op *Op) Lists() bool {
	return op.Kind == KindFlush || op.Kind == KindCopy || op.Kind == KindExec || op.Kind == KindEval
}
