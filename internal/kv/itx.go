package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
)

// Interactive transactions (KEFIR.TX; issue 29; docs/design/transactions.md,
// "Interactive transactions").
//
// A transaction reads from a snapshot of the engine at its start version and
// buffers its writes at the front door; its commit is ONE op of the state
// machine, KindTxCommit, carrying the start version, the isolation, the keys
// to validate with the version each had at the start, and the writes. Every
// replica evaluates it at apply against the state as of op−1 (Apply's
// getter), so the decision — commit or abort — is a function of the log and
// holds across a leader change and a crash replay:
//
//   - validation: every checked key must still have the version it had at
//     the start (0: absent). A key written in the window (start, op) has a
//     newer version; one deleted in it is absent where it existed. Under SI
//     the checked keys are the written ones (first committer wins on
//     write-write conflicts); under SERIALIZABLE also every key read. A
//     failed check answers -TXABORT and lands nothing.
//   - the writes run in order over an overlay of the transaction's own
//     earlier writes (TxOverlay) and land together, one record per key, at
//     the op's one version; a write that fails (INCRBY of a non-integer)
//     lands none of them and answers its error.
//
// The reply is RESP2 bytes (ResReply): the committed version, or the error.
// The client table caches it like any result, so a commit retried with its
// request id is answered, never validated again.

// KindTxCommit is an interactive transaction's commit, from the block
// 176–183 given to interactive transactions.
const (
	KindTxCommit Kind = 176 + iota
	kindItxEnd
)

func isItxKind(k Kind) bool { return k >= KindTxCommit && k < kindItxEnd }

// Isolation levels of a transaction, carried in a KindTxCommit's Cond.
const (
	// TxSI is snapshot isolation: validate the written keys.
	TxSI Cond = 0
	// TxSerializable also validates every key read.
	TxSerializable Cond = 1
)

// TxCheck is a key a commit validates: Version is the version the
// transaction's snapshot had of it (0: absent).
type TxCheck struct {
	Key     []byte
	Version uint64
	// Ranges (nil: the whole key) are the bits of the key the transaction
	// accessed: a write of the key in the window that touched none of them
	// is no conflict (itxrange.go).
	Ranges []TxRange
}

// Write opcodes of a KindTxCommit's Keys (opcode, key, argument triples).
const (
	txSet    = 'S'
	txDel    = 'D'
	txIncrBy = 'I'
	// txSetRange's argument is the offset (uvarint) then the bytes;
	// txSetBit's the bit offset (uvarint) then '0' or '1'.
	txSetRange = 'R'
	txSetBit   = 'B'
	// txBitField's argument is KindBitField's Value.
	txBitField = 'F'
)

// txOriginTag starts the origin section of a commit's Value, after the
// checks.
const txOriginTag = 1

// NewTxCommit builds the commit op of a transaction that started at start,
// whose snapshot had origin (SlotOrigin of its keys' slot: the checks'
// versions are that group's): checks and the origin go in Value, writes
// (SET, DEL of one key, INCRBY, SETRANGE, SETBIT, BITFIELD; nothing else) in
// Keys as (opcode, key, argument) triples. The slices are aliased. If any
// check has Ranges, Value starts with txRangedMark and every check carries
// its ranges (a count, 0 for the whole key, then the ranges).
func NewTxCommit(start uint64, iso Cond, origin TxOrigin, checks []TxCheck, writes []Op) (Op, error) {
	op := Op{Kind: KindTxCommit, Delta: int64(start), Cond: iso, Keys: make([][]byte, 0, 3*len(writes))}
	ranged := false
	for _, c := range checks {
		ranged = ranged || c.Ranges != nil
	}
	var b []byte
	if ranged {
		b = append(b, txRangedMark...)
	}
	b = binary.AppendUvarint(b, uint64(len(checks)))
	for _, c := range checks {
		b = AppendBytes(b, c.Key)
		b = binary.AppendUvarint(b, c.Version)
		if ranged {
			b = appendRanges(b, c.Ranges)
		}
	}
	b = origin.append(append(b, txOriginTag))
	op.Value = b
	for i := range writes {
		w := &writes[i]
		switch {
		case w.Kind == KindSet && w.Cond == Always && !w.ReturnOld && w.ExpireAt == 0 && w.TTL == 0:
			op.Keys = append(op.Keys, []byte{txSet}, w.Key, w.Value)
		case w.Kind == KindDel && len(w.Keys) == 1:
			op.Keys = append(op.Keys, []byte{txDel}, w.Keys[0], nil)
		case w.Kind == KindIncrBy:
			op.Keys = append(op.Keys, []byte{txIncrBy}, w.Key, strconv.AppendInt(nil, w.Delta, 10))
		case w.Kind == KindSetRange && w.Delta >= 0:
			op.Keys = append(op.Keys, []byte{txSetRange}, w.Key, append(binary.AppendUvarint(nil, uint64(w.Delta)), w.Value...))
		case w.Kind == KindBitField:
			op.Keys = append(op.Keys, []byte{txBitField}, w.Key, w.Value)
		case w.Kind == KindSetBit && w.Delta >= 0 && len(w.Value) == 1:
			op.Keys = append(op.Keys, []byte{txSetBit}, w.Key, append(binary.AppendUvarint(nil, uint64(w.Delta)), w.Value...))
		default:
			return Op{}, fmt.Errorf("%w: %v in a transaction", ErrInvalidOp, w.Kind)
		}
	}
	return op, nil
}

// DecodeTxCommit returns a KindTxCommit's checks and writes.
func DecodeTxCommit(op *Op) (checks []TxCheck, writes []Op, err error) {
	checks, writes, _, err = decodeTxCommit(op)
	return checks, writes, err
}

// decodeTxCommit is DecodeTxCommit, and the commit's origin (never nil
// without an error).
func decodeTxCommit(op *Op) (checks []TxCheck, writes []Op, origin *TxOrigin, err error) {
	if (op.Kind != KindTxCommit && op.Kind != KindTxPrepare) || len(op.Keys)%3 != 0 || op.Delta < 0 || (op.Cond != TxSI && op.Cond != TxSerializable) {
		return nil, nil, nil, fmt.Errorf("%w: malformed transaction commit", ErrInvalidOp)
	}
	ranged := txIsRanged(op)
	d := Decoder{B: op.Value}
	if ranged {
		d.B = d.B[len(txRangedMark):]
	}
	n := d.Uvarint()
	if n > uint64(len(op.Value)) {
		return nil, nil, nil, fmt.Errorf("%w: transaction commit of %d checks in %d bytes", ErrInvalidOp, n, len(op.Value))
	}
	checks = make([]TxCheck, 0, n)
	for i := uint64(0); i < n && d.Err == nil; i++ {
		c := TxCheck{Key: d.Bytes(), Version: d.Uvarint()}
		if ranged {
			if c.Ranges = decodeRanges(&d); len(c.Ranges) == 0 {
				c.Ranges = nil // the whole key
			}
		}
		checks = append(checks, c)
	}
	if d.Err == nil {
		// Every commit carries its origin (there is no older format in any
		// log), so a commit cut short after its checks is corrupt, not a
		// commit to validate on versions alone.
		if len(d.B) == 0 || d.Byte() != txOriginTag {
			return nil, nil, nil, fmt.Errorf("%w: transaction commit's origin: missing or unknown tag", ErrInvalidOp)
		}
		origin = &TxOrigin{Epoch: d.Uvarint(), State: SlotState(d.Byte())}
		if d.Err == nil && origin.State >= slotStateEnd {
			return nil, nil, nil, fmt.Errorf("%w: transaction commit's origin: slot state %d", ErrInvalidOp, origin.State)
		}
	}
	if d.Err != nil || len(d.B) != 0 {
		return nil, nil, nil, fmt.Errorf("%w: transaction commit's checks: corrupt", ErrInvalidOp)
	}
	writes = make([]Op, 0, len(op.Keys)/3)
	for i := 0; i < len(op.Keys); i += 3 {
		code, key, arg := op.Keys[i], op.Keys[i+1], op.Keys[i+2]
		if len(code) != 1 {
			return nil, nil, nil, fmt.Errorf("%w: transaction write opcode %q", ErrInvalidOp, code)
		}
		w := Op{Key: key, Now: op.Now}
		switch code[0] {
		case txSet:
			w.Kind, w.Value = KindSet, arg
		case txDel:
			w = Op{Kind: KindDel, Keys: [][]byte{key}, Now: op.Now}
		case txIncrBy:
			delta, err := strconv.ParseInt(string(arg), 10, 64)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%w: transaction INCRBY of %q", ErrInvalidOp, arg)
			}
			w.Kind, w.Delta = KindIncrBy, delta
		case txBitField:
			w.Kind, w.Value = KindBitField, arg
		case txSetRange, txSetBit:
			off, n := binary.Uvarint(arg)
			if n <= 0 || off > 1<<62 || (code[0] == txSetBit && len(arg)-n != 1) {
				return nil, nil, nil, fmt.Errorf("%w: transaction %c write argument %q", ErrInvalidOp, code[0], arg)
			}
			w.Kind, w.Delta, w.Value = KindSetRange, int64(off), arg[n:]
			if code[0] == txSetBit {
				w.Kind = KindSetBit
			}
		default:
			return nil, nil, nil, fmt.Errorf("%w: transaction write opcode %q", ErrInvalidOp, code)
		}
		writes = append(writes, w)
	}
	return checks, writes, origin, nil
}

// txWrittenKeys is WrittenKeys of a KindTxCommit (every key of its writes).
func txWrittenKeys(op *Op) [][]byte {
	ks := make([][]byte, 0, len(op.Keys)/3)
	for i := 1; i < len(op.Keys); i += 3 {
		ks = append(ks, op.Keys[i])
	}
	return ks
}

// txRoutingKeys is RoutingKeys of a KindTxCommit: its written keys and its
// checked ones (a transaction is of one slot).
func txRoutingKeys(op *Op) [][]byte {
	ks := txWrittenKeys(op)
	if checks, _, err := DecodeTxCommit(op); err == nil {
		for _, c := range checks {
			ks = append(ks, c.Key)
		}
	}
	return ks
}

// TxOverlay is an interactive transaction's writes not yet landed, kept by
// the front door between commands: evaluated one by one (Apply) against a
// state with the earlier ones in front of it (View), and emitted together at
// the end, one record per key in the order the keys were first written. It
// is the overlay scripts and MULTI/EXEC run over (script.go), held across
// calls.
type TxOverlay struct {
	o *overlay
}

// Len is the number of keys written.
func (t *TxOverlay) Len() int {
	if t.o == nil {
		return 0
	}
	return len(t.o.order)
}

// View returns get with the overlay in front of it; a key the overlay holds
// reports version.
func (t *TxOverlay) View(get Getter, version uint64) Getter {
	return func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if t.o != nil {
			if r, ok := t.o.writes[string(key)]; ok {
				return r.data, r.meta, version, !r.tomb, nil
			}
		}
		return get(key)
	}
}

// Apply evaluates the write op at version against View(get, version) and,
// if it succeeds, puts its records in the overlay. On error nothing changes.
func (t *TxOverlay) Apply(get Getter, version uint64, op *Op, maxValue int) (Result, error) {
	if t.o == nil {
		t.o = newOverlay(get, version, nil, maxValue)
	}
	t.o.get, t.o.version, t.o.maxValue = get, version, maxValue
	return t.o.stage(op)
}

// Emit hands the overlay's records to emit.
func (t *TxOverlay) Emit(emit Emit) {
	if t.o != nil {
		_ = t.o.emitAll(emit) // it never flushes (stage only), emitAll's one error
	}
}

// TxConflict is the key a commit's validation failed on.
type TxConflict struct {
	Key      []byte
	Start    uint64 // the transaction's start version
	Expected uint64 // the key's version at the start (0: absent)
	Found    uint64 // its version as of the commit (0: absent or expired)
	// Moved: the key's slot changed hands (or began to) since the start:
	// the versions are another group's, not comparable (TxOrigin).
	Moved    bool
	From, To TxOrigin
}

func (c *TxConflict) Error() string {
	if c.Moved {
		return fmt.Sprintf("TXABORT conflict on key '%s': its slot moved (epoch %d %s at the start, epoch %d %s here) after the transaction's start version %d",
			clipKey(c.Key), c.From.Epoch, c.From.State, c.To.Epoch, c.To.State, c.Start)
	}
	what := fmt.Sprintf("written at version %d", c.Found)
	if c.Found == 0 {
		what = "deleted or expired"
	}
	return fmt.Sprintf("TXABORT conflict on key '%s': %s after the transaction's start version %d", clipKey(c.Key), what, c.Start)
}

func clipKey(k []byte) string {
	if len(k) > 64 {
		return strconv.Quote(string(k[:64]))[1:] + "..."
	}
	s := strconv.Quote(string(k))
	return s[1 : len(s)-1]
}

// TxValidate checks op's (a KindTxCommit at version) keys against get (the
// state as of version−1): nil if every one has the version it had at the
// start, a *TxConflict for the first that does not. A key not live at the
// op's clock (op.Now: absent, deleted or expired, as Observe counts it) has
// version 0, as the transaction notes a key not live when it read it
// (server's itxn.get): a key that expired in the window — same record, same
// version — is a conflict, for the writes are evaluated at op.Now, where the
// value the transaction read and computed from is gone. A key whose version
// is the op's own is the op's own record, read back by a crash replay of the
// op (the applier's getter reports it so): the op passed this check when it
// first ran, or that record would not exist.
//
// origin (nil: not checked) is the group the
// checks' versions are of: a key whose slot has another origin here is a
// conflict, whatever its version (a slot moved between the start and the
// commit; TxOrigin).
func TxValidate(get Getter, version uint64, op *Op, origin *TxOrigin, checks []TxCheck) error {
	conflict, err := txConflict(get, version, op, origin, checks, false)
	if err != nil {
		return err
	}
	if conflict != nil {
		return conflict
	}
	return nil // not conflict: a nil *TxConflict is a non-nil error
}

// txConflict is the first of checks' conflicts (txCheckKey, sure as there),
// or nil: TxValidate's loop and TxDoomed's.
func txConflict(get Getter, version uint64, op *Op, origin *TxOrigin, checks []TxCheck, sure bool) (*TxConflict, error) {
	for _, c := range checks {
		if conflict, err := txCheckKey(get, version, op, origin, c, sure); err != nil || conflict != nil {
			return conflict, err
		}
	}
	return nil, nil
}

// txCheckKey is validation's decision on one check: a conflict, or nil.
//
// With sure false it is TxValidate's, at apply: get is the state as of op
// version−1. With sure true it is a leader's early check (TxDoomed): get is a
// committed state as of op version (the leader's read point, which every op
// it will order follows), and a conflict is answered only if validation at
// apply must find one on this key, whatever is ordered in between and
// whatever clock (op.Now) a retry of the same request carries. So it says
// nothing (nil) of a check it cannot be sure of:
//   - a key of another origin here: versions of another group;
//   - a key absent at the start (Version 0): a key created in the window and
//     deleted again is absent at apply, which passes;
//   - a key that read a version this state does not have yet (above version);
//   - a key whose record is still the one the transaction saw: only its
//     expiry at op.Now can fail it, and a retry's clock may differ;
//   - a ranged check of a record with an expiry, for the same reason.
//
// Otherwise the key's record here is newer than the one the transaction saw
// (or gone), and every later record of it is newer still: a whole check must
// fail at apply; a ranged one walks the access record from here, and the walk
// at apply goes through this version (a later write of the key replaced this
// record) and then along the same entries, so it fails too.
func txCheckKey(get Getter, version uint64, op *Op, origin *TxOrigin, c TxCheck, sure bool) (*TxConflict, error) {
	if origin != nil {
		o, err := SlotOrigin(get, c.Key)
		if err != nil {
			return nil, err
		}
		if o != *origin {
			if sure {
				return nil, nil
			}
			return &TxConflict{Key: c.Key, Start: uint64(op.Delta), Moved: true, From: *origin, To: o}, nil
		}
	}
	if sure && (c.Version == 0 || c.Version > version) {
		return nil, nil
	}
	_, meta, ver, live, stored, err := lookup(get, c.Key, op.Now)
	if err != nil {
		return nil, err
	}
	if sure && stored && ver <= c.Version {
		return nil, nil
	}
	if !sure && ver == version && version != 0 {
		return nil, nil // our own record, in a replay (ownRecord)
	}
	if !live {
		ver = 0
	}
	if ver == c.Version {
		return nil, nil
	}
	if c.Ranges != nil {
		// A ranged check of a record with an expiry depends on the clock
		// (the walk starts from the live version, 0 once expired), and a
		// retry's clock is not its first attempt's: left to apply. An
		// expired record comes back from lookup without its meta, so
		// !live covers the expiry that has already passed.
		if sure && stored && (!live || HasExpiry(meta)) {
			return nil, nil
		}
		ok, err := rangedCheck(get, c, ver)
		if err != nil || ok {
			return nil, err
		}
	}
	return &TxConflict{Key: c.Key, Start: uint64(op.Delta), Expected: c.Version, Found: ver}, nil
}

// txCommitParts decodes a commit for its evaluation: its checks, writes and
// origin, or the error its evaluation answers before validating.
func txCommitParts(op *Op) (checks []TxCheck, writes []Op, origin *TxOrigin, err error) {
	checks, writes, origin, err = decodeTxCommit(op)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, w := range writes {
		if err := CheckKey(w.RoutingKey()); err != nil {
			return nil, nil, nil, err
		}
	}
	return checks, writes, origin, nil
}

// applyTxCommit is Apply's case for KindTxCommit (see the top of this file).
func applyTxCommit(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	checks, writes, origin, err := txCommitParts(op)
	if err != nil {
		return Result{}, err
	}
	if err := TxValidate(get, version, op, origin, checks); err != nil {
		var c *TxConflict
		if errors.As(err, &c) {
			return Result{Kind: ResReply, Bulk: respError(c.Error())}, nil
		}
		return Result{}, err // the store's failure: not an outcome
	}
	var ov TxOverlay
	ranged := txIsRanged(op)
	var acc []txKeyAccess // only if the commit is ranged
	for i := range writes {
		w := &writes[i]
		var a *txKeyAccess
		before := 0
		if ranged {
			k := w.RoutingKey()
			for j := range acc {
				if bytes.Equal(acc[j].key, k) {
					a = &acc[j]
				}
			}
			if a == nil {
				acc = append(acc, txKeyAccess{key: k})
				a = &acc[len(acc)-1]
			}
			old, _, _, _, err := getLive(ov.View(get, version), k, w.Now)
			if err != nil {
				return Result{}, err
			}
			before = len(old)
		}
		if _, err := ov.Apply(get, version, w, maxValue); err != nil {
			if msg, ok := TxErrorText(err); ok {
				return Result{Kind: ResReply, Bulk: respError(msg)}, nil
			}
			return Result{}, err
		}
		if a != nil {
			if w.Kind != KindSetRange && w.Kind != KindSetBit && w.Kind != KindBitField {
				a.whole = true
				continue
			}
			now, _, _, _, err := getLive(ov.View(get, version), a.key, w.Now)
			if err != nil {
				return Result{}, err
			}
			a.ranges = append(a.ranges, writeRanges(w, before, len(now))...)
		}
	}
	// The access rows first: a crash that keeps a key's record keeps its row.
	if err := emitAccessRows(get, version, acc, emit); err != nil {
		return Result{}, err
	}
	ov.Emit(emit)
	res := Result{Kind: ResReply, Bulk: fmt.Appendf(nil, ":%d\r\n", version)}
	if ov.Len() > 0 {
		res.Version = version
	}
	return res, nil
}

// RoutingKey is the one key of a single-key write (Key, or DEL's only key).
func (op *Op) RoutingKey() []byte {
	if len(op.Key) == 0 && len(op.Keys) == 1 {
		return op.Keys[0]
	}
	return op.Key
}

// TxErrorText is the RESP error text (prefix included) of an op's own error
// raised by a transaction's write, ok false for a store's failure.
func TxErrorText(err error) (string, bool) {
	switch {
	case errors.Is(err, ErrWrongKind):
		return ErrWrongKind.Error(), true
	case errors.Is(err, ErrWrongType):
		return "ERR value is not an integer or out of range", true
	case errors.Is(err, ErrOverflow), errors.Is(err, ErrReservedKey), errors.Is(err, ErrInvalidOp), errors.Is(err, ErrTooBig):
		return "ERR " + err.Error(), true
	}
	return "", false
}

func respError(msg string) []byte {
	b := make([]byte, 0, len(msg)+3)
	b = append(b, '-')
	for _, c := range []byte(msg) {
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}
