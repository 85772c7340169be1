package shard

import (
	"errors"
	"fmt"
)

// Kind is the kind of an operation on a shard.
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
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// IsUpdate reports whether operations of this kind modify state.
func (k Kind) IsUpdate() bool { return k >= KindSet }

// Cond is SET's condition.
type Cond uint8

const (
	// Always sets unconditionally.
	Always Cond = iota
	// IfAbsent sets only if the key does not exist (NX).
	IfAbsent
	// IfPresent sets only if the key exists (XX).
	IfPresent
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
	// Cond and ReturnOld are SET's NX/XX and GET options.
	Cond      Cond
	ReturnOld bool
	// End (exclusive; nil = unbounded) and Limit (pairs) bound a scan.
	End   []byte
	Limit int
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
	// (ErrSessionLost). Unknown on a single node, whose versions are never
	// reused (versions.go).
	View      uint64
	ViewKnown bool
}

// Errors callers branch on. The server maps them to RESP prefixes
// (docs/design/resp-extensions.md): ErrUnavailable → -UNAVAILABLE, the rest →
// -ERR (ErrWrongType as Redis's "-ERR value is not an integer or out of range"). Their texts are the RESP message after the prefix.
var (
	ErrWrongType    = errors.New("value is not an integer or out of range")
	ErrOverflow     = errors.New("increment or decrement would overflow")
	ErrReservedKey  = errors.New("keys starting with \\xff\\xffkefir are reserved")
	ErrStaleRequest = errors.New("stale request")
	ErrBadSession   = errors.New("invalid session token")
	// ErrSessionAhead means the session has seen versions this replica does not have
	// (after a crash lost unsynced writes, or a replica that lags).
	ErrSessionAhead = errors.New("session token is ahead of this replica")
	// ErrSessionLost means the session saw a version that a crash took back
	// (an async or cad write acknowledged before it was durable), or, in a
	// replica group, whose op a view change dropped and gave to another write:
	// serving it would silently drop its own writes. The client must start a
	// new session.
	ErrSessionLost = errors.New("session token refers to writes lost in a crash")
	ErrUnavailable = errors.New("shard unavailable")
	ErrClosed      = errors.New("shard closed")
	ErrInvalidOp   = errors.New("invalid operation")
)

// ReqID identifies a write for at-most-once execution: Client is a random non-zero
// id the client picks at start, Seq increases with each of its writes. The zero ReqID
// means "no id" (plain Redis clients).
type ReqID struct {
	Client uint64
	Seq    uint64
}

// IsZero reports whether the request carries no id.
func (r ReqID) IsZero() bool { return r.Client == 0 }

// WrittenKeys returns the keys op writes (or may write: a conditional write
// that turns out to write nothing is counted). DEL's keys count too.
func (op *Op) WrittenKeys() [][]byte {
	switch op.Kind {
	case KindSet, KindIncrBy, KindGetSet, KindAppend, KindCAS:
		return [][]byte{op.Key}
	case KindMSet:
		ks := make([][]byte, 0, len(op.Keys)/2)
		for i := 0; i+1 < len(op.Keys); i += 2 {
			ks = append(ks, op.Keys[i])
		}
		return ks
	case KindDel:
		return op.Keys
	}
	return nil
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
	case KindSet, KindGetSet, KindAppend, KindCAS, KindIncrBy:
		return check(op.Key, op.Value)
	case KindMSet:
		for i := 0; i+1 < len(op.Keys); i += 2 {
			if err := check(op.Keys[i], op.Keys[i+1]); err != nil {
				return err
			}
		}
	}
	return nil
}
