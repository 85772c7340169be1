package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Cross-group transactions: two-phase commit over replica groups, with
// optimistic reads and locks taken at prepare (docs/design/transactions.md,
// "Cross-group transactions"). Three ops of the state machine:
//
//   - KindTxPrepare, in every participant (a slot the transaction read or
//     wrote a key of: its part there, TxPartID; two parts may share a
//     group): validated at apply as a KindTxCommit is (txCommitParts,
//     TxValidate: one copy), plus every checked or written key must be
//     unlocked. Passing, it evaluates its writes (over the same overlay a
//     commit uses) and records, durably in the group's state, the prepared
//     transaction: the records its writes will land, the keys it locks, its
//     primary's routing key and its prepare time (the op's Now). Every
//     locked key gets a lock record naming the transaction and whether it
//     is written or only read.
//   - KindTxDecide, at the primary: records commit or abort for the
//     transaction; the first decision wins, a later one is answered with
//     it. The primary's own prepared part resolves in the same op.
//   - KindTxResolve, at every other participant: lands the prepared records
//     (commit) or not (abort), and drops the locks. Idempotent.
//
// Two more collect the decisions (docs/design/transactions.md, "Collecting
// the decisions"): KindTxForget tells the primary that participants of a
// commit have resolved it, and KindTxCollect raises a group's low-water
// mark and deletes the settled decisions below it. Transaction ids carry
// their coordinator's clock (NewTxID); below the mark an id with no
// decision is forgotten: its prepare does not lock, its decide records
// nothing (TxForgottenReply).
//
// Every record is a reserved key (ReservedPrefix), so it is part of the
// state every replica derives from the log — it survives restart, snapshot
// transfer and crash replay without a table of its own to rebuild — and it
// stays out of SCAN, KEYS, DBSIZE and slot moves, which skip reserved keys.
//
// The lock rule (txLockGate) is evaluated at apply on every replica, from
// the state: any other write of a locked key, or a commit or prepare that
// checks one, does not apply. One reserved record listing the prepared
// parts keeps the common case to one lookup per write: absent, nothing is
// locked.

// Reserved key spaces of cross-group transactions.
var (
	// txLockCount holds the number of prepared parts of the group
	// (uvarint) and their part ids; absent when there are none.
	txLockCount = ReservedKey("xcount")
	// txLocks + key: the lock of key (encodeTxLock: a mode byte, then the
	// txid of the writer or the reader holding it, or the txids of the
	// readers sharing it).
	txLocks = ReservedKey("xl/")
	// TxPreparedPrefix + part id (TxPartID): a prepared transaction's
	// part in one slot (encode).
	TxPreparedPrefix = ReservedKey("xp/")
	// TxDecisionPrefix + txid: the primary's decision (TxDecision).
	TxDecisionPrefix = ReservedKey("xd/")
	// txPendingList holds the ids of the commit decisions of this group
	// whose participants have not all resolved (TxDecision.Pending not
	// empty), in the encoding of txLockCount; absent when there are none.
	// A slot's hand-over waits for those whose primary is in it: decision
	// records never move with a slot, and a participant that asks the
	// slot's next owner would find no decision there and abort a
	// transaction this group committed.
	txPendingList = ReservedKey("xpend")
	// txMark holds the group's low-water mark of cross-group transactions
	// (varint, unix ms): a transaction whose id is older (TxIDTime) and
	// that has no decision record here is forgotten — decided and
	// collected, or never to be decided — its prepare does not lock and
	// its decide records nothing (see "Collecting the decisions" in
	// docs/design/transactions.md). Absent: 0.
	txMark = ReservedKey("xmark")
)

// Lock modes.
const (
	// TxLockWrite: the transaction writes the key. Nothing else may write
	// or check it, and a linearizable read of it waits for the resolve.
	TxLockWrite = 'W'
	// TxLockRead: the transaction read the key. Nothing else may write it
	// or prepare a write of it; reads go on, and other prepared
	// transactions that only read it share the lock (txLockShared).
	TxLockRead = 'R'
	// txLockShared is the record of a read lock two or more transactions
	// share: the mode byte, then each txid length-prefixed (AppendBytes).
	// One reader keeps TxLockRead's form, 'R' and its txid, which is also
	// every read lock's record from before locks were shared.
	txLockShared = 'S'
)

// Decisions (KindTxDecide and KindTxResolve's Cond).
const (
	TxAbort  Cond = 0
	TxCommit Cond = 1
)

const (
	txCommitted = 'C'
	txAborted   = 'A'
)

// TxIDMax bounds a transaction id's length.
const TxIDMax = 64

// ErrTxLocked: a write (or EXEC) of a key that a prepared cross-group
// transaction locks did not apply; retry it once the transaction is
// resolved (the front door does). Its code is in codec.go's resultErrs.
var ErrTxLocked = errors.New("key locked by a prepared cross-group transaction")

// TxLockedError is ErrTxLocked naming the key and the transaction.
type TxLockedError struct {
	Key  []byte
	TxID []byte
}

func (e *TxLockedError) Error() string {
	return fmt.Sprintf("%v: key '%s', transaction %x", ErrTxLocked, clipKey(e.Key), e.TxID)
}

// Unwrap makes errors.Is(err, ErrTxLocked) hold.
func (e *TxLockedError) Unwrap() error { return ErrTxLocked }

// XgtxMutations are deliberate bugs the tests switch on to show that they
// catch them (internal/mutation); exported for vrshard's cross-group
// simulation (TestXgSimCatchesMutations), set only before a run.
type XgtxMutations struct {
	// WriteReadLocked: the gate lets a write of a read-locked key apply.
	WriteReadLocked bool
	// ResolveIgnoresDecision: a resolve lands the prepared writes whatever
	// the decision.
	ResolveIgnoresDecision bool
	// PrepareSkipsLocks: a prepare does not check that its keys are
	// unlocked (two prepared transactions may lock one key).
	PrepareSkipsLocks bool
	// CollectIgnoresPending: a collect deletes a commit decision whose
	// participants have not all resolved (a push then learns nothing and
	// aborts its part).
	CollectIgnoresPending bool
	// IgnoreMark: prepares and decides do not consult the low-water mark
	// (a decision deleted is as if never made).
	IgnoreMark bool
	// MoveIgnoresPending: a slot's hand-over does not wait for the commit
	// decisions whose primary is in it and which a participant has not
	// resolved (the next owner has no record: a push there aborts).
	MoveIgnoresPending bool
	// ReadLockAdmitsWriter: a prepare conflicts with another's lock only
	// if both write the key, so a writer's prepare takes a key another
	// prepared transaction read-locks (and a reader's one another
	// write-locks): shared read locks that do not exclude writers.
	ReadLockAdmitsWriter bool
}

// XgtxMut is the process's XgtxMutations (tests only; read under mutation.On).
var XgtxMut XgtxMutations

// The two-phase ops, of the block 184–191 given to cross-group
// transactions.
const (
	KindTxPrepare Kind = 184 + iota
	KindTxDecide
	KindTxResolve
	// KindTxForget, at the primary: the participants named (Keys) have
	// resolved a committed transaction; when none is left its decision
	// may be collected.
	KindTxForget
	// KindTxCollect, at a group: raises its low-water mark to Delta (unix
	// ms) and deletes the decisions of the transactions named (Keys) that
	// are below it and settled.
	KindTxCollect
	kindXgtxEnd
)

var xgtxKindNames = [...]string{"txprepare", "txdecide", "txresolve", "txforget", "txcollect"}

func isXgtxKind(k Kind) bool { return k >= KindTxPrepare && k < kindXgtxEnd }

// IsXgtxKind reports whether k is one of the cross-group transactions'
// ops (prepare, decide, resolve, forget, collect): idempotent by
// transaction id, sent without request ids, never held behind a lock.
func IsXgtxKind(k Kind) bool { return isXgtxKind(k) }

func txLockKey(key []byte) []byte { return append(append([]byte(nil), txLocks...), key...) }

func txPreparedKey(part []byte) []byte {
	return append(append([]byte(nil), TxPreparedPrefix...), part...)
}

// TxPartID names transaction txid's part in the slot of key: a transaction
// prepares once per slot it names (each slot has its own snapshot origin),
// so two of its parts may be prepared in one group, and each keeps its own
// record (keyed by txid alone, the second prepare would answer as the
// first, locking and validating nothing: found by the e2e bank test).
func TxPartID(txid, key []byte) []byte {
	return binary.BigEndian.AppendUint16(append([]byte(nil), txid...), KeySlot(key))
}

func txDecisionKey(txid []byte) []byte {
	return append(append([]byte(nil), TxDecisionPrefix...), txid...)
}

// TxLockCount is the number of prepared cross-group transactions in the
// state get reads (0: nothing is locked).
func TxLockCount(get Getter) (uint64, error) {
	data, _, _, ok, err := get(txLockCount)
	if err != nil || !ok {
		return 0, err
	}
	n, k := binary.Uvarint(data)
	if k <= 0 {
		return 0, fmt.Errorf("%w: lock count record", ErrCorrupt)
	}
	return n, nil
}

// TxPreparedIDs returns the ids of the prepared transactions in the state
// get reads.
func TxPreparedIDs(get Getter) ([][]byte, error) { return readIDList(get, txLockCount) }

// putPreparedIDs emits the count record of ids (a deletion if none).
func putPreparedIDs(emit Emit, ids [][]byte) { putIDList(emit, txLockCount, ids) }

// readIDList reads a list record of ids (txLockCount, txPendingList).
func readIDList(get Getter, key []byte) ([][]byte, error) {
	data, _, _, ok, err := get(key)
	if err != nil || !ok {
		return nil, err
	}
	d := Decoder{B: data}
	n := d.Uvarint()
	if n > uint64(len(data)) {
		return nil, fmt.Errorf("%w: id list record %q", ErrCorrupt, key)
	}
	ids := make([][]byte, 0, n)
	for i := uint64(0); i < n && d.Err == nil; i++ {
		ids = append(ids, d.Bytes())
	}
	if d.Err != nil || len(d.B) != 0 {
		return nil, fmt.Errorf("%w: id list record %q", ErrCorrupt, key)
	}
	return ids, nil
}

// putIDList emits the list record key of ids (a deletion if none).
func putIDList(emit Emit, key []byte, ids [][]byte) {
	if len(ids) == 0 {
		emit(key, nil, nil, true)
		return
	}
	b := binary.AppendUvarint(nil, uint64(len(ids)))
	for _, id := range ids {
		b = AppendBytes(b, id)
	}
	put(emit, key, b, nil)
}

// TxPendingIDs returns the ids of this group's commit decisions that some
// participant has not resolved yet (as far as the primary knows).
func TxPendingIDs(get Getter) ([][]byte, error) { return readIDList(get, txPendingList) }

// setTxPending adds txid to the pending list (on) or takes it out.
func setTxPending(get Getter, emit Emit, txid []byte, on bool) error {
	ids, err := TxPendingIDs(get)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(ids, func(id []byte) bool { return bytes.Equal(id, txid) })
	switch {
	case on && i < 0:
		ids = append(ids, txid)
	case !on && i >= 0:
		ids = slices.Delete(ids, i, i+1)
	default:
		return nil
	}
	putIDList(emit, txPendingList, ids)
	return nil
}

// txLockedSlot returns a slot of rs that a prepared transaction holds a
// lock in, and the transaction; ok false if none: a slot's hand-over waits
// until it holds no locks (locks never move with a slot).
func txLockedSlot(get Getter, rs []SlotRange) (slot uint16, txid []byte, ok bool, err error) {
	ids, err := TxPreparedIDs(get)
	if err != nil {
		return 0, nil, false, err
	}
	for _, id := range ids {
		p, prepared, err := TxPreparedOf(get, id)
		if err != nil {
			return 0, nil, false, err
		}
		if !prepared {
			continue
		}
		for _, l := range p.Locks {
			if s := KeySlot(l.Key); InSlotRanges(s, rs) {
				return s, id, true, nil
			}
		}
	}
	return txPendingSlot(get, rs)
}

// txPendingSlot returns a slot of rs that is the primary of a commit
// decision of this group not every participant has resolved, and the
// transaction; ok false if none (txPendingList says why a hand-over waits).
func txPendingSlot(get Getter, rs []SlotRange) (slot uint16, txid []byte, ok bool, err error) {
	if mutation.On && XgtxMut.MoveIgnoresPending {
		return 0, nil, false, nil
	}
	ids, err := TxPendingIDs(get)
	if err != nil || len(ids) == 0 {
		return 0, nil, false, err
	}
	for _, id := range ids {
		d, ok, err := TxDecisionOf(get, id)
		if err != nil {
			return 0, nil, false, err
		}
		if ok && d.Commit && len(d.Pending) > 0 {
			if s := KeySlot(d.Primary); InSlotRanges(s, rs) {
				return s, id, true, nil
			}
		}
	}
	return 0, nil, false, nil
}

// TxLockOf returns key's lock: a transaction holding it (the first of the
// readers sharing a read lock) and the mode (TxLockWrite, TxLockRead); ok
// false if none does.
func TxLockOf(get Getter, key []byte) (txid []byte, mode byte, ok bool, err error) {
	mode, holders, ok, err := txLockHolders(get, key)
	if err != nil || !ok {
		return nil, 0, false, err
	}
	return holders[0], mode, true, nil
}

// txLockHolders returns key's lock: its mode (TxLockWrite, TxLockRead) and
// every transaction holding it (one writer, or one or more readers); ok
// false if none does. The txids alias the record.
func txLockHolders(get Getter, key []byte) (mode byte, holders [][]byte, ok bool, err error) {
	data, _, _, ok, err := get(txLockKey(key))
	if err != nil || !ok {
		return 0, nil, false, err
	}
	if len(data) < 2 {
		return 0, nil, false, fmt.Errorf("%w: lock record of %q", ErrCorrupt, key)
	}
	switch data[0] {
	case TxLockWrite, TxLockRead:
		return data[0], [][]byte{data[1:]}, true, nil
	case txLockShared:
		d := Decoder{B: data[1:]}
		for len(d.B) > 0 && d.Err == nil {
			holders = append(holders, d.Bytes())
		}
		if d.Err != nil || len(holders) == 0 {
			return 0, nil, false, fmt.Errorf("%w: shared lock record of %q", ErrCorrupt, key)
		}
		return TxLockRead, holders, true, nil
	}
	return 0, nil, false, fmt.Errorf("%w: lock record of %q: mode %q", ErrCorrupt, key, data[0])
}

// encodeTxLock is the lock record of mode held by holders (one, or for a
// read lock one or more).
func encodeTxLock(mode byte, holders [][]byte) []byte {
	if mode == TxLockWrite || len(holders) == 1 {
		return append([]byte{mode}, holders[0]...)
	}
	b := []byte{txLockShared}
	for _, h := range holders {
		b = AppendBytes(b, h)
	}
	return b
}

// TxWriteLocked reports whether a prepared transaction writes key: a
// linearizable read of it must wait for the resolve (a read-locked key may
// be read). One lookup when nothing is locked.
func TxWriteLocked(get Getter, key []byte) (bool, error) {
	if n, err := TxLockCount(get); err != nil || n == 0 {
		return false, err
	}
	_, mode, ok, err := TxLockOf(get, key)
	return ok && mode == TxLockWrite, err
}

// txLockGate is the lock rule at apply, for every op Apply and ApplyWith
// evaluate: ok true (and the op's result) if op must not apply because a
// key it writes is locked by a prepared transaction, or a key it only
// checks (a KindTxCommit's read) is write-locked: a read lock is shared. A
// KEFIR.TX commit answers -TXABORT (its client retries the whole
// transaction); any other write ErrTxLocked (the front door retries it once
// the lock is gone). Reads, slot ops and the two-phase ops themselves pass
// (a prepare checks its keys itself).
func txLockGate(get Getter, op *Op) (Result, error, bool) {
	if !op.Kind.IsUpdate() || isSlotKind(op.Kind) || isXgtxKind(op.Kind) || op.Kind == KindHSweep {
		return Result{}, nil, false
	}
	n, err := TxLockCount(get)
	if err != nil {
		return Result{}, err, true
	}
	if n == 0 {
		return Result{}, nil, false
	}
	var keys [][]byte
	written := -1 // keys[:written] are written, the rest only checked (a commit's)
	switch {
	case op.Kind == KindTxCommit:
		keys = txRoutingKeys(op) // written, then checked
		written = len(txWrittenKeys(op))
	case op.Kind == KindEval && op.Cond == DeclaredKeysOnly:
		keys, _ = op.RoutingKeys()
	case op.WritesAll() && op.Cond != DeclaredKeysOnly:
		// A flush, or a script (or an EXEC holding one) that may write
		// any key: refused while
		// anything is locked.
		return Result{}, fmt.Errorf("%w: %v while %d transactions are prepared", ErrTxLocked, op.Kind, n), true
	default:
		keys = op.WrittenKeys() // an EXEC's: every key it names
	}
	for i, k := range keys {
		txid, mode, ok, err := TxLockOf(get, k)
		if err != nil {
			return Result{}, err, true
		}
		if !ok {
			continue
		}
		if mutation.On && XgtxMut.WriteReadLocked && mode == TxLockRead && op.Kind != KindTxCommit {
			continue
		}
		if written >= 0 && i >= written && mode == TxLockRead {
			// A key the commit only reads shares a read lock, as a
			// prepare's read does (shared read locks): neither changes it.
			continue
		}
		if op.Kind == KindTxCommit {
			return Result{Kind: ResReply, Bulk: respError(txLockedAbort(k, txid, uint64(op.Delta)))}, nil, true
		}
		return Result{}, &TxLockedError{Key: k, TxID: txid}, true
	}
	return Result{}, nil, false
}

func txLockedAbort(key, txid []byte, start uint64) string {
	return fmt.Sprintf("TXABORT conflict on key '%s': locked by prepared transaction %x after the transaction's start version %d", clipKey(key), txid, start)
}

// NewTxPrepare builds the prepare op of a cross-group transaction txid for
// one participant group: its checks there (every key read and written, as
// SERIALIZABLE: each group's snapshot is its own, not one cut, so validating
// the written keys alone would not isolate the transaction), its writes
// there, and primary, the routing key of the group that decides. The start
// and origin are the group's snapshot's. Ranged checks are not taken: the
// coordinator sends whole keys.
func NewTxPrepare(txid []byte, primary []byte, start uint64, origin TxOrigin, checks []TxCheck, writes []Op) (Op, error) {
	if len(txid) == 0 || len(txid) > TxIDMax {
		return Op{}, fmt.Errorf("%w: transaction id of %d bytes", ErrInvalidOp, len(txid))
	}
	for _, c := range checks {
		if c.Ranges != nil {
			return Op{}, fmt.Errorf("%w: ranged check in a cross-group transaction", ErrInvalidOp)
		}
	}
	op, err := NewTxCommit(start, TxSerializable, origin, checks, writes)
	if err != nil {
		return Op{}, err
	}
	op.Kind, op.Key, op.Expected = KindTxPrepare, txid, primary
	return op, nil
}

// NewTxDecide builds the decision of txid at its primary, routed by the
// primary's key. parts are a key of each other participant's slot (the
// coordinator's commit names them): a commit's record keeps them until
// each has resolved (KindTxForget), and only then may it be collected.
func NewTxDecide(txid, primary []byte, commit bool, parts ...[]byte) Op {
	op := Op{Kind: KindTxDecide, Key: txid, Expected: primary}
	if commit {
		op.Cond = TxCommit
		op.Keys = parts
	}
	return op
}

// NewTxForget tells txid's primary that the participants of the slots of
// parts have resolved it.
func NewTxForget(txid, primary []byte, parts [][]byte) Op {
	return Op{Kind: KindTxForget, Key: txid, Expected: primary, Keys: parts}
}

// NewTxCollect raises the low-water mark of routing's group to mark (unix
// ms) and deletes there the decisions of txids that are settled and older
// than the mark.
func NewTxCollect(routing []byte, mark int64, txids [][]byte) Op {
	return Op{Kind: KindTxCollect, Expected: routing, Delta: mark, Keys: txids}
}

// NewTxID is a transaction id: the coordinator's clock (unix ms, 8 bytes
// big-endian), which the low-water mark is compared with, then nonce
// (random bytes: unique).
func NewTxID(ms int64, nonce []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(nonce)), uint64(ms)), nonce...)
}

// TxIDTime is the time NewTxID put in txid (unix ms), or math.MaxInt64 for
// an id without one (shorter than 8 bytes, or an id of 16 random bytes from
// before collection whose first bytes read as negative): such a
// transaction is never below a mark — its decision is never collected,
// and its prepare never refused by one.
func TxIDTime(txid []byte) int64 {
	if len(txid) < 8 {
		return math.MaxInt64
	}
	t := int64(binary.BigEndian.Uint64(txid))
	if t < 0 {
		return math.MaxInt64
	}
	return t
}

// TxMark is the low-water mark of the group whose state get reads (unix
// ms; 0 if none yet).
func TxMark(get Getter) (int64, error) {
	data, _, _, ok, err := get(txMark)
	if err != nil || !ok {
		return 0, err
	}
	m, k := binary.Varint(data)
	if k <= 0 {
		return 0, fmt.Errorf("%w: low-water mark record", ErrCorrupt)
	}
	return m, nil
}

// txForgotten reports whether txid is below the group's mark: with no
// decision record here, it was decided and collected or will never be
// decided.
func txForgotten(get Getter, txid []byte) (bool, error) {
	if mutation.On && XgtxMut.IgnoreMark {
		return false, nil
	}
	m, err := TxMark(get)
	return TxIDTime(txid) < m, err
}

// NewTxResolve builds txid's resolve at a participant, routed by one of its
// keys there.
func NewTxResolve(txid, routing []byte, commit bool) Op {
	op := NewTxDecide(txid, routing, commit)
	op.Kind = KindTxResolve
	return op
}

// TxPrepared is a prepared transaction as its group records it.
type TxPrepared struct {
	TxID []byte
	// Primary is the routing key of the group that decides.
	Primary []byte
	// Prepared is the prepare op's clock (unix ms): a leader pushes a
	// transaction prepared long ago.
	Prepared int64
	// Records are what the writes land on commit.
	Records []TxRecord
	// Locks are the keys locked, with their modes.
	Locks []TxLock
}

// TxRecord is one record a prepared transaction lands.
type TxRecord struct {
	Key, Value, Meta []byte
	Tombstone        bool
}

// TxLock is one key a prepared transaction locks.
type TxLock struct {
	Key  []byte
	Mode byte
}

func (p *TxPrepared) encode() []byte {
	b := AppendBytes(nil, p.TxID)
	b = AppendBytes(b, p.Primary)
	b = binary.AppendVarint(b, p.Prepared)
	b = binary.AppendUvarint(b, uint64(len(p.Records)))
	for _, r := range p.Records {
		b = AppendBytes(b, r.Key)
		b = AppendBytes(b, r.Value)
		b = AppendBytes(b, r.Meta)
		t := byte(0)
		if r.Tombstone {
			t = 1
		}
		b = append(b, t)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Locks)))
	for _, l := range p.Locks {
		b = AppendBytes(b, l.Key)
		b = append(b, l.Mode)
	}
	return b
}

// DecodeTxPrepared decodes a prepared record's value. The slices alias
// data.
func DecodeTxPrepared(data []byte) (TxPrepared, error) {
	var p TxPrepared
	d := Decoder{B: data}
	p.TxID = d.Bytes()
	p.Primary = d.Bytes()
	p.Prepared = d.Varint()
	n := d.Uvarint()
	if n > uint64(len(data)) {
		return TxPrepared{}, fmt.Errorf("%w: prepared record of %d records", ErrCorrupt, n)
	}
	for i := uint64(0); i < n && d.Err == nil; i++ {
		r := TxRecord{Key: d.Bytes(), Value: d.Bytes(), Meta: d.Bytes()}
		r.Tombstone = d.Byte() == 1
		p.Records = append(p.Records, r)
	}
	n = d.Uvarint()
	if n > uint64(len(data)) {
		return TxPrepared{}, fmt.Errorf("%w: prepared record of %d locks", ErrCorrupt, n)
	}
	for i := uint64(0); i < n && d.Err == nil; i++ {
		p.Locks = append(p.Locks, TxLock{Key: d.Bytes(), Mode: d.Byte()})
	}
	if d.Err != nil || len(d.B) != 0 {
		return TxPrepared{}, fmt.Errorf("%w: prepared record", ErrCorrupt)
	}
	return p, nil
}

// TxPreparedOf reads the prepared record of part (TxPartID); ok false if
// there is none.
func TxPreparedOf(get Getter, part []byte) (TxPrepared, bool, error) {
	data, _, _, ok, err := get(txPreparedKey(part))
	if err != nil || !ok {
		return TxPrepared{}, false, err
	}
	p, err := DecodeTxPrepared(data)
	return p, err == nil, err
}

// TxDecision is a transaction's decision as its primary records it.
type TxDecision struct {
	TxID   []byte
	Commit bool
	// Decided is the decide op's clock (unix ms): the primary's sweep
	// settles a commit whose participants are still pending long after.
	Decided int64
	// Primary is the primary's routing key (the decide's).
	Primary []byte
	// Pending are a key of each participant's slot that has not resolved
	// the commit yet (as far as the primary knows: KindTxForget).
	Pending [][]byte
	// Legacy: a record from before collection (one byte): its
	// participants are unknown, so a commit is never collected.
	Legacy bool
}

// Settled reports whether the decision may be collected once its
// transaction is below the mark: an abort always (a participant that asks
// later, finding it forgotten, aborts — what it would have learned), a
// commit once every participant has resolved it.
func (d *TxDecision) Settled() bool {
	if mutation.On && XgtxMut.CollectIgnoresPending {
		return !d.Legacy
	}
	return !d.Commit || (!d.Legacy && len(d.Pending) == 0)
}

func (d *TxDecision) encode() []byte {
	b := []byte{txAborted}
	if d.Commit {
		b[0] = txCommitted
	}
	b = binary.AppendVarint(b, d.Decided)
	b = AppendBytes(b, d.Primary)
	b = binary.AppendUvarint(b, uint64(len(d.Pending)))
	for _, k := range d.Pending {
		b = AppendBytes(b, k)
	}
	return b
}

// DecodeTxDecision decodes txid's decision record. The slices alias data.
func DecodeTxDecision(txid, data []byte) (TxDecision, error) {
	if len(data) == 0 || (data[0] != txCommitted && data[0] != txAborted) {
		return TxDecision{}, fmt.Errorf("%w: decision record of %x", ErrCorrupt, txid)
	}
	d := TxDecision{TxID: txid, Commit: data[0] == txCommitted}
	if len(data) == 1 {
		d.Legacy = true
		return d, nil
	}
	dec := Decoder{B: data[1:]}
	d.Decided = dec.Varint()
	d.Primary = dec.Bytes()
	n := dec.Uvarint()
	if n > uint64(len(data)) {
		return TxDecision{}, fmt.Errorf("%w: decision record of %x", ErrCorrupt, txid)
	}
	for i := uint64(0); i < n && dec.Err == nil; i++ {
		d.Pending = append(d.Pending, dec.Bytes())
	}
	if dec.Err != nil || len(dec.B) != 0 {
		return TxDecision{}, fmt.Errorf("%w: decision record of %x", ErrCorrupt, txid)
	}
	return d, nil
}

// TxDecisionOf reads txid's decision at its primary; ok false if there is
// none (undecided, or forgotten: txForgotten).
func TxDecisionOf(get Getter, txid []byte) (TxDecision, bool, error) {
	data, _, _, ok, err := get(txDecisionKey(txid))
	if err != nil || !ok {
		return TxDecision{}, false, err
	}
	d, err := DecodeTxDecision(txid, data)
	return d, err == nil, err
}

// txDecisionOf reads txid's decision at its primary: 0 if undecided.
func txDecisionOf(get Getter, txid []byte) (byte, error) {
	d, ok, err := TxDecisionOf(get, txid)
	switch {
	case err != nil || !ok:
		return 0, err
	case d.Commit:
		return txCommitted, nil
	}
	return txAborted, nil
}

// Replies of the two-phase ops (ResReply, RESP): a prepare answers
// TxPreparedReply or its -TXABORT; a decide and a resolve TxCommittedReply
// or TxAbortedReply (a resolve with nothing to resolve answers the
// decision it was given).
var (
	TxPreparedReply  = []byte("+PREPARED\r\n")
	TxCommittedReply = []byte("+COMMITTED\r\n")
	TxAbortedReply   = []byte("+ABORTED\r\n")
	// TxForgottenReply answers a decide of a transaction below the
	// group's low-water mark with no decision record: its decision was
	// collected (every participant had resolved it), or it was never
	// decided and never will be. A push aborts its part on it (a part
	// prepared now is a prepare that came late: the transaction aborted,
	// or committed and this part had landed its records before the
	// decision was collected); a coordinator that asked commit does not
	// know its outcome.
	TxForgottenReply = []byte("+FORGOTTEN\r\n")
	txForgetReply    = []byte("+OK\r\n")
)

// txCollectMax bounds the transactions one collect names.
const txCollectMax = 4096

func applyXgtx(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	if op.Kind == KindTxCollect {
		return applyTxCollect(get, version, op, emit)
	}
	txid := op.Key
	if len(txid) == 0 || len(txid) > TxIDMax {
		return Result{}, fmt.Errorf("%w: transaction id of %d bytes", ErrInvalidOp, len(txid))
	}
	switch op.Kind {
	case KindTxPrepare:
		return applyTxPrepare(get, version, op, maxValue, emit)
	case KindTxDecide:
		if op.Cond != TxAbort && op.Cond != TxCommit {
			return Result{}, fmt.Errorf("%w: decision %d", ErrInvalidOp, op.Cond)
		}
		d, err := txDecisionOf(get, txid)
		if err != nil {
			return Result{}, err
		}
		if d != 0 {
			// The first decision wins (a push and the coordinator race
			// here; the log orders them).
			return txDecisionReply(d == txCommitted), nil
		}
		part := TxPartID(txid, op.Expected)
		p, prepared, err := TxPreparedOf(get, part)
		if err != nil {
			return Result{}, err
		}
		if !prepared {
			// Below the mark, with no record, the transaction is forgotten:
			// recording a decision now could contradict the one collected
			// (the first decision wins only while it is kept).
			if old, err := txForgotten(get, txid); err != nil || old {
				return Result{Kind: ResReply, Bulk: TxForgottenReply}, err
			}
		}
		// A commit needs the primary's own prepare: without it (never
		// applied here, or a bug) the only safe decision is abort.
		commit := op.Cond == TxCommit && prepared
		rec := TxDecision{Commit: commit, Decided: op.Now, Primary: op.Expected}
		if commit {
			rec.Pending = txOtherParts(op.Keys, op.Expected)
			if len(rec.Pending) > 0 {
				if err := setTxPending(get, emit, txid, true); err != nil {
					return Result{}, err
				}
			}
		}
		put(emit, txDecisionKey(txid), rec.encode(), nil)
		if prepared {
			if err := txResolve(get, part, p, commit, emit); err != nil {
				return Result{}, err
			}
		}
		res := txDecisionReply(commit)
		res.Version = version
		return res, nil
	case KindTxResolve:
		if op.Cond != TxAbort && op.Cond != TxCommit {
			return Result{}, fmt.Errorf("%w: decision %d", ErrInvalidOp, op.Cond)
		}
		commit := op.Cond == TxCommit
		part := TxPartID(txid, op.Expected)
		p, prepared, err := TxPreparedOf(get, part)
		if err != nil || !prepared {
			// Resolved already (or never prepared here): nothing to do.
			return txDecisionReply(commit), err
		}
		if err := txResolve(get, part, p, commit, emit); err != nil {
			return Result{}, err
		}
		res := txDecisionReply(commit)
		res.Version = version
		return res, nil
	case KindTxForget:
		d, ok, err := TxDecisionOf(get, txid)
		if err != nil || !ok || !d.Commit || len(d.Pending) == 0 {
			return Result{Kind: ResReply, Bulk: txForgetReply}, err
		}
		left := slices.DeleteFunc(slices.Clone(d.Pending), func(k []byte) bool {
			return slices.ContainsFunc(op.Keys, func(r []byte) bool { return KeySlot(r) == KeySlot(k) })
		})
		if len(left) != len(d.Pending) {
			d.Pending = left
			put(emit, txDecisionKey(txid), d.encode(), nil)
			if len(left) == 0 {
				if err := setTxPending(get, emit, txid, false); err != nil {
					return Result{}, err
				}
			}
		}
		return Result{Kind: ResReply, Bulk: txForgetReply, Version: version}, nil
	}
	return Result{}, fmt.Errorf("%w: %v", ErrInvalidOp, op.Kind)
}

// txOtherParts is a key of each slot of parts but primary's, one per slot:
// the participants a commit waits for before it may be collected.
func txOtherParts(parts [][]byte, primary []byte) [][]byte {
	var out [][]byte
	for _, k := range parts {
		s := KeySlot(k)
		if s == KeySlot(primary) || slices.ContainsFunc(out, func(o []byte) bool { return KeySlot(o) == s }) {
			continue
		}
		out = append(out, k)
	}
	return out
}

// applyTxCollect is Apply's case for KindTxCollect: the mark rises to the
// op's (never falls), then every named decision that is settled and below
// the mark is deleted. Deleting only below the mark is what keeps a
// deleted decision's fate known: a later decide of that transaction finds
// it forgotten and records nothing, a later prepare does not lock.
func applyTxCollect(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	if len(op.Keys) > txCollectMax {
		return Result{}, fmt.Errorf("%w: a collect of %d transactions", ErrInvalidOp, len(op.Keys))
	}
	mark, err := TxMark(get)
	if err != nil {
		return Result{}, err
	}
	if op.Delta > mark {
		mark = op.Delta
		emit(txMark, binary.AppendVarint(nil, mark), nil, false)
	}
	n := 0
	for _, txid := range op.Keys {
		if len(txid) == 0 || len(txid) > TxIDMax || TxIDTime(txid) >= mark {
			continue
		}
		d, ok, err := TxDecisionOf(get, txid)
		if err != nil {
			return Result{}, err
		}
		if ok && d.Settled() {
			emit(txDecisionKey(txid), nil, nil, true)
			n++
		}
	}
	return Result{Kind: ResReply, Bulk: fmt.Appendf(nil, "+COLLECTED %d\r\n", n), Version: version}, nil
}

func txDecisionReply(commit bool) Result {
	if commit {
		return Result{Kind: ResReply, Bulk: TxCommittedReply}
	}
	return Result{Kind: ResReply, Bulk: TxAbortedReply}
}

// applyTxPrepare is Apply's case for KindTxPrepare (see the top of this
// file).
func applyTxPrepare(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	txid := op.Key
	checks, writes, origin, err := txCommitParts(op)
	if err != nil {
		return Result{}, err
	}
	var first []byte
	switch {
	case len(writes) > 0:
		first = writes[0].RoutingKey()
	case len(checks) > 0:
		first = checks[0].Key
	default:
		return Result{}, fmt.Errorf("%w: prepare of no key", ErrInvalidOp)
	}
	for i := range writes {
		if KeySlot(writes[i].RoutingKey()) != KeySlot(first) {
			return Result{}, fmt.Errorf("%w: a prepare names keys of several slots", ErrInvalidOp)
		}
	}
	for _, c := range checks {
		if KeySlot(c.Key) != KeySlot(first) {
			return Result{}, fmt.Errorf("%w: a prepare names keys of several slots", ErrInvalidOp)
		}
	}
	part := TxPartID(txid, first)
	if _, prepared, err := TxPreparedOf(get, part); err != nil || prepared {
		// Prepared already: the same part's prepare again (a retry under a
		// new request id) answers as the first did.
		return Result{Kind: ResReply, Bulk: TxPreparedReply}, err
	}
	if d, err := txDecisionOf(get, txid); err != nil || d != 0 {
		// Decided here (this is its primary) before this prepare arrived:
		// a push aborted it. It must not lock.
		return Result{Kind: ResReply, Bulk: respError(fmt.Sprintf("TXABORT transaction %x was aborted before its prepare", txid))}, err
	}
	if old, err := txForgotten(get, txid); err != nil || old {
		// Below the mark: its decision, if it had one here, may be
		// collected, so a lock taken now could be decided against it.
		return Result{Kind: ResReply, Bulk: respError(fmt.Sprintf("TXABORT transaction %x is older than its group's low-water mark of cross-group transactions (its decisions kept a minute); retry", txid))}, err
	}
	if len(op.Expected) == 0 {
		return Result{}, fmt.Errorf("%w: prepare without its primary's key", ErrInvalidOp)
	}
	if txIsRanged(op) {
		return Result{}, fmt.Errorf("%w: ranged check in a cross-group transaction", ErrInvalidOp)
	}
	// The keys it locks: written ones for write, the others it checks for
	// read. Every one must be free.
	var locks []TxLock
	addLock := func(k []byte, mode byte) {
		for i := range locks {
			if bytes.Equal(locks[i].Key, k) {
				if mode == TxLockWrite {
					locks[i].Mode = mode
				}
				return
			}
		}
		locks = append(locks, TxLock{Key: k, Mode: mode})
	}
	for i := range writes {
		addLock(writes[i].RoutingKey(), TxLockWrite)
	}
	for _, c := range checks {
		addLock(c.Key, TxLockRead)
	}
	// A slot on its way out takes no new locks: its hand-over waits until
	// it holds none (TxLockedSlots), and locks never move with a slot.
	for _, l := range locks {
		o, err := SlotOrigin(get, l.Key)
		if err != nil {
			return Result{}, err
		}
		if o.State == SlotMigrating {
			return Result{Kind: ResReply, Bulk: respError(fmt.Sprintf("TXABORT key '%s': its slot %d is migrating to another group; retry", clipKey(l.Key), KeySlot(l.Key)))}, nil
		}
	}
	n, err := TxLockCount(get)
	if err != nil {
		return Result{}, err
	}
	// The holders of each lock taken: a key another prepared transaction
	// read-locks is shared by a prepare that only reads it (neither can
	// change it, so both reads stay what they validated until their
	// resolves); a writer's prepare and a reader's of a write-locked key
	// abort, as a prepare of a key any lock holds did before locks were
	// shared.
	shared := make([][][]byte, len(locks))
	if n > 0 && !(mutation.On && XgtxMut.PrepareSkipsLocks) {
		for i, l := range locks {
			mode, holders, ok, err := txLockHolders(get, l.Key)
			if err != nil {
				return Result{}, err
			}
			if !ok {
				continue
			}
			if mode == TxLockRead && l.Mode == TxLockRead {
				shared[i] = holders
				continue
			}
			if mutation.On && XgtxMut.ReadLockAdmitsWriter && (mode == TxLockRead || l.Mode == TxLockRead) {
				if mode == TxLockRead {
					shared[i] = holders // the reader's record kept below, unless the writer's replaces it
				}
				continue
			}
			return Result{Kind: ResReply, Bulk: respError(txLockedAbort(l.Key, holders[0], uint64(op.Delta)))}, nil
		}
	}
	if err := TxValidate(get, version, op, origin, checks); err != nil {
		var c *TxConflict
		if errors.As(err, &c) {
			return Result{Kind: ResReply, Bulk: respError(c.Error())}, nil
		}
		return Result{}, err
	}
	// The writes are evaluated now, over the state they were validated
	// against, and their records kept: nothing can change the keys until
	// the resolve (they are locked), so landing these records then is
	// landing the writes then.
	var ov TxOverlay
	for i := range writes {
		if _, err := ov.Apply(get, version, &writes[i], maxValue); err != nil {
			if msg, ok := TxErrorText(err); ok {
				return Result{Kind: ResReply, Bulk: respError(msg)}, nil
			}
			return Result{}, err
		}
	}
	p := TxPrepared{TxID: txid, Primary: op.Expected, Prepared: op.Now, Locks: locks}
	ov.Emit(func(key, value, meta []byte, tomb bool) {
		p.Records = append(p.Records, TxRecord{Key: key, Value: value, Meta: meta, Tombstone: tomb})
	})
	put(emit, txPreparedKey(part), p.encode(), nil)
	for i, l := range locks {
		if mutation.On && XgtxMut.ReadLockAdmitsWriter && l.Mode == TxLockRead {
			if mode, _, ok, err := txLockHolders(get, l.Key); err != nil {
				return Result{}, err
			} else if ok && mode == TxLockWrite {
				continue // a reader let into a write lock: the writer's record stays
			}
		}
		holders := [][]byte{txid}
		if l.Mode == TxLockRead && len(shared[i]) > 0 {
			holders = append(slices.Clone(shared[i]), txid)
		}
		put(emit, txLockKey(l.Key), encodeTxLock(l.Mode, holders), nil)
	}
	ids, err := TxPreparedIDs(get)
	if err != nil {
		return Result{}, err
	}
	putPreparedIDs(emit, append(ids, part))
	return Result{Kind: ResReply, Bulk: TxPreparedReply, Version: version}, nil
}

// txResolve lands p's records (part's) if commit, and drops its locks and
// its prepared record, counting it out.
func txResolve(get Getter, part []byte, p TxPrepared, commit bool, emit Emit) error {
	ids, err := TxPreparedIDs(get)
	if err != nil {
		return err
	}
	if commit || (mutation.On && XgtxMut.ResolveIgnoresDecision) {
		for _, r := range p.Records {
			if r.Tombstone {
				emit(r.Key, nil, nil, true)
			} else {
				put(emit, r.Key, r.Value, r.Meta)
			}
		}
	}
	for _, l := range p.Locks {
		mode, holders, ok, err := txLockHolders(get, l.Key)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(holders), func(h []byte) bool { return bytes.Equal(h, p.TxID) })
		switch {
		case len(rest) == len(holders):
			// Not this transaction's (a retried prepare's lock that an
			// earlier resolve released, then taken by another).
		case len(rest) == 0:
			emit(txLockKey(l.Key), nil, nil, true)
		default:
			// The other readers keep it.
			put(emit, txLockKey(l.Key), encodeTxLock(mode, rest), nil)
		}
	}
	putPreparedIDs(emit, slices.DeleteFunc(ids, func(id []byte) bool { return bytes.Equal(id, part) }))
	// The prepared record's deletion last: a crash keeps a prefix of an
	// op's records, and a replay that finds this deletion reads the record
	// as gone (retention keeps no older version) and restages nothing, so
	// every other record of the resolve must already be there.
	emit(txPreparedKey(part), nil, nil, true)
	return nil
}
