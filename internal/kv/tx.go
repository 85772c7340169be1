package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
)

// Transactions (MULTI/EXEC/WATCH; docs/design/transactions.md, issue 29).
//
// An EXEC is ONE op of the state machine, KindExec, shaped like a script
// (script.go): the op carries the queued commands' argument vectors and the
// connection's watches; every replica, at apply, first compares each watched
// key's observation (Observe) with the state as of op−1 — any difference and
// the transaction applies nothing and answers a null array — and otherwise
// runs the commands in order over an overlay of the transaction's own writes.
// All their records land at the op's version, after the last command. A
// command's runtime error (WRONGTYPE, not an integer) is that command's
// element of the reply and the others apply, as in Redis. The reply (RESP2,
// ResReply) is cached in the client table like a script's, so a retried
// request id is answered from it, never applied twice.
//
// Turning an argument vector into a kv op is internal/command's and
// internal/script's (kv is a pure core and does not parse Redis commands):
// internal/script registers the parser with RegisterCommands from its init,
// next to the interpreter.

// Transaction op kinds, from issue 29's block 136–159.
const (
	// KindExec is EXEC: Value is EncodeTx's encoding of the queued commands
	// and the watches; Keys are every key the commands and the watches name
	// (for routing: Delta is len(Keys), the declared keys as a script's).
	// An update.
	KindExec Kind = 136 + iota
	// KindWatch is WATCH's read: for each of Keys, Observe's observation
	// (Result.Array). A read, of one snapshot when there are several keys.
	KindWatch
	// KindExecRO is an EXEC whose commands are all reads, laid out as
	// KindExec's: served as a read (Read; one snapshot) at the connection's
	// level rather than logged. A write in it is refused.
	KindExecRO
	kindTxEnd
)

func isTxKind(k Kind) bool { return k >= KindExec && k < kindTxEnd }

// RunsCommands reports whether ops of kind k run commands of their own over
// an overlay: the scripts and EXEC. A router marks them DeclaredKeysOnly at a
// node of several groups.
func RunsCommands(k Kind) bool { return isScriptKind(k) || k == KindExec || k == KindExecRO }

// Watch is a watched key and what WATCH observed of it (Observe).
type Watch struct {
	Key, Seen []byte
}

// CommandRunner runs one command of a transaction, argv as the client sent
// it, through exec (the transaction's overlay), and appends its reply (RESP2,
// an error reply for a runtime error) to b. now is the op's clock (a SET EX
// of the transaction expires relative to it), rnd its random source (its
// RANDOMKEY and HRANDFIELD pick with it). Deterministic: a function of argv,
// now, rnd and what exec returns.
type CommandRunner func(b []byte, argv [][]byte, now int64, rnd *OpRand, exec ScriptExec) []byte

var runCommand CommandRunner

// RegisterCommands installs the command parser (internal/script's init). A
// second registration panics.
func RegisterCommands(r CommandRunner) {
	if runCommand != nil {
		panic("kv: transaction commands registered twice")
	}
	runCommand = r
}

// Observe is what a WATCH of key sees in the state get reads at now: a key
// that is absent, deleted or expired is "not live" (first byte 0), whatever
// version a store reports for its miss (a read path and an applier may report
// a deletion's version differently); a live key is 1 and the highest version
// of its records, which every write of the key changes. EXEC's apply
// compares the same function over the state as of op−1 with the bytes WATCH
// saw: different bytes, the key was modified (or expired, as Redis 7 counts
// it).
//
// A version is an op number of one replica group, meaningless in another:
// after a slot move the key's records at the destination carry the import
// op's number, which may equal the one WATCH saw at the source. So the
// observation ends with its origin (SlotOrigin: the epoch and state of the
// key's slot in the group's table; zero without a table), flagged by bit
// obsOrigin of the first byte, and a WATCH taken at another group compares
// unequal whatever the numbers. The origin is mandatory: an observation
// without it is refused (DecodeTx, checkObservation). Only development builds
// of main between the EXEC op (1dbc3c6) and the origin (950ae21) logged such
// EXECs, and Kefir has had no release, so no log a user holds carries one.
//
// A hash's records are its metadata record and its field rows; rows gives
// the highest version among the live rows in [start, end). A replica group
// rewrites the metadata at every hash write, but a single node writes only
// the rows of an HSET of existing fields (ApplyOptions.SparseHashMeta), so
// the rows must be looked at: a WATCH of a hash costs a walk of its fields,
// at WATCH and at EXEC.
func Observe(get Getter, rows func(start, end []byte) (uint64, error), key []byte, now int64) ([]byte, error) {
	b, err := observeVersion(get, rows, key, now)
	if err != nil {
		return nil, err
	}
	o, err := SlotOrigin(get, key)
	if err != nil {
		return nil, err
	}
	b[0] |= obsOrigin
	return o.append(b), nil
}

// obsLive and obsOrigin are the flags of an observation's first byte.
const (
	obsLive   = 1 // a version follows
	obsOrigin = 2 // the origin (TxOrigin) ends it; every observation has it
)

// ErrTxWatchFormat: an EXEC's watch carries bytes that are not an
// observation Observe makes (checkObservation).
var ErrTxWatchFormat = fmt.Errorf("%w: malformed WATCH observation", ErrInvalidOp)

// checkObservation refuses what Observe cannot have made: flags other than
// obsLive and obsOrigin, no origin, a version that does not decode, bytes
// after the origin. An observation without its origin would compare versions
// without knowing which group's op numbers they are (a slot move in between
// could pass unseen); no release ever logged one (see Observe).
func checkObservation(seen []byte) error {
	if len(seen) == 0 {
		return fmt.Errorf("%w: empty", ErrTxWatchFormat)
	}
	if seen[0]&^(obsLive|obsOrigin) != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrTxWatchFormat, seen[0])
	}
	if seen[0]&obsOrigin == 0 {
		return fmt.Errorf("%w: no origin (the format of development builds before the origin was added; no release logged it)", ErrTxWatchFormat)
	}
	if _, ok := observedOrigin(seen); !ok {
		return fmt.Errorf("%w: %d bytes do not decode as one", ErrTxWatchFormat, len(seen))
	}
	return nil
}

// observeVersion is an observation without its origin: liveness, version.
func observeVersion(get Getter, rows func(start, end []byte) (uint64, error), key []byte, now int64) ([]byte, error) {
	b := []byte{0}
	if IsReserved(key) {
		return b, nil
	}
	data, meta, ver, live, _, err := lookup(get, key, now)
	if err != nil {
		return nil, err
	}
	if !live {
		return b, nil
	}
	if MetaType(meta) == TypeHash {
		gen, _, err := decodeHashMeta(data)
		if err != nil {
			return nil, err
		}
		p := HashRowPrefix(gen)
		rv, err := rows(p, PrefixEnd(p))
		if err != nil {
			return nil, err
		}
		ver = max(ver, rv)
	}
	b[0] |= obsLive
	b = binary.AppendUvarint(b, ver)
	return b, nil
}

// observedVersion is the version in an observation (0: not live).
func observedVersion(seen []byte) uint64 {
	if len(seen) == 0 || seen[0]&obsLive == 0 {
		return 0
	}
	v, _ := binary.Uvarint(seen[1:])
	return v
}

// TxOrigin is where a group's version numbers of a key come from: the
// epoch and state of the key's slot in the group's table (SlotTableKey).
// Two observations of a key compare versions only if they have the same
// origin: a slot moved (or began moving, or was rolled back) in between
// changes its epoch or state, and versions read at another group are
// another log's op numbers. Zero for a group without a table (a single
// group, or a cluster group no move touched yet).
type TxOrigin struct {
	Epoch uint64
	State SlotState
}

func (o TxOrigin) append(b []byte) []byte {
	return append(binary.AppendUvarint(b, o.Epoch), byte(o.State))
}

// SlotOrigin reads key's origin through get (the group's table, a reserved
// record every getter of a group's state reads).
func SlotOrigin(get Getter, key []byte) (TxOrigin, error) {
	data, _, _, ok, err := get(SlotTableKey)
	if err != nil || !ok {
		return TxOrigin{}, err
	}
	e, err := slotEntryOf(data, KeySlot(key))
	if err != nil {
		return TxOrigin{}, err
	}
	return TxOrigin{Epoch: e.Epoch, State: e.State}, nil
}

// ValidatesOwnRecord reports whether ops of kind k check what they read
// before writing (EXEC its watches, a KEFIR.TX commit its keys' versions) and
// so must, in a crash replay, recognise a record of their own as a check that
// passed: an applier's getter reports a key whose only record it still holds
// is the op's own as absent with the op's version (vrshard's current), or,
// for a hash (ReplayReadsOwnRecord), as that record.
func ValidatesOwnRecord(k Kind) bool { return k == KindTxCommit || k == KindExec }

// ownRecord reports whether get, the state as of op version−1, answers key
// with a record of op version itself: only a crash replay of the op does (see
// ValidatesOwnRecord), and the op wrote that record only because every one of
// its checks passed the first time — all of them, the transaction being all
// or nothing — so a check that now differs passed. Redoing the check would
// answer differently from the first run and drop the writes the crash lost.
func ownRecord(get Getter, version uint64, key []byte) (bool, error) {
	if version == 0 {
		return false, nil // a read (EXEC of reads) has no version of its own
	}
	_, _, ver, _, err := get(key)
	return ver == version, err
}

// scanRows is Observe's rows for a reader: the highest version scan visits.
func scanRows(scan Scanner) func(start, end []byte) (uint64, error) {
	return func(start, end []byte) (uint64, error) {
		if scan == nil {
			return 0, fmt.Errorf("%w: a watch of a hash needs a scanner", ErrInvalidOp)
		}
		var v uint64
		err := scan(start, end, 0, func(_, _, _ []byte, ver uint64) bool {
			v = max(v, ver)
			return true
		})
		return v, err
	}
}

// listRows is Observe's rows for an applier: the rows list names, read
// through get (a listed key may be deleted).
func listRows(get Getter, list Lister) func(start, end []byte) (uint64, error) {
	return func(start, end []byte) (uint64, error) {
		if list == nil {
			return 0, fmt.Errorf("%w: an exec watching a hash needs a lister", ErrInvalidOp)
		}
		var v uint64
		var gerr error
		err := list(start, end, func(k []byte) bool {
			_, _, ver, ok, err := get(k)
			if err != nil {
				gerr = err
				return false
			}
			if ok {
				v = max(v, ver)
			}
			return true
		})
		return v, errors.Join(err, gerr)
	}
}

// readWatch is Read's case for KindWatch.
func readWatch(get Getter, scan Scanner, op *Op) (Result, error) {
	res := Result{Kind: ResArray, Array: make([][]byte, len(op.Keys))}
	for i, k := range op.Keys {
		seen, err := Observe(get, scanRows(scan), k, op.Now)
		if err != nil {
			return Result{}, err
		}
		res.Array[i] = seen
		res.Version = max(res.Version, observedVersion(seen))
	}
	return res, nil
}

// MaxTxCommands bounds the commands of one transaction (and MaxTxWatches its
// watches): the op is one log entry, applied in one step by every replica.
const (
	MaxTxCommands = 1 << 16
	MaxTxWatches  = 1 << 16
)

// EncodeTx appends the encoding of a transaction's commands and watches to b:
//
//	ncmds uvarint | per command: argc uvarint, argc byte strings |
//	nwatch uvarint | per watch: key, seen (byte strings)
func EncodeTx(b []byte, cmds [][][]byte, watches []Watch) []byte {
	b = binary.AppendUvarint(b, uint64(len(cmds)))
	for _, argv := range cmds {
		b = binary.AppendUvarint(b, uint64(len(argv)))
		for _, a := range argv {
			b = AppendBytes(b, a)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(watches)))
	for _, w := range watches {
		b = AppendBytes(b, w.Key)
		b = AppendBytes(b, w.Seen)
	}
	return b
}

// ErrTxCorrupt: an EXEC op's Value does not decode (EncodeTx).
var ErrTxCorrupt = fmt.Errorf("%w: undecodable transaction", ErrInvalidOp)

// DecodeTx decodes EncodeTx's encoding, all of b, and checks that each watch is an
// observation Observe makes, origin included (checkObservation). The slices
// alias b.
func DecodeTx(b []byte) (cmds [][][]byte, watches []Watch, err error) {
	d := Decoder{B: b}
	n := d.Uvarint()
	// Every command takes at least one byte: a count above what is left is
	// corrupt (and must not size an allocation).
	if d.Err != nil || n > MaxTxCommands || n > uint64(len(d.B)) {
		return nil, nil, ErrTxCorrupt
	}
	cmds = make([][][]byte, n)
	for i := range cmds {
		argc := d.Uvarint()
		if d.Err != nil || argc == 0 || argc > uint64(len(d.B)) {
			return nil, nil, ErrTxCorrupt
		}
		argv := make([][]byte, argc)
		for j := range argv {
			argv[j] = d.Bytes()
		}
		if d.Err != nil {
			return nil, nil, ErrTxCorrupt
		}
		cmds[i] = argv
	}
	nw := d.Uvarint()
	if d.Err != nil || nw > MaxTxWatches || nw > uint64(len(d.B)) {
		return nil, nil, ErrTxCorrupt
	}
	if nw > 0 {
		watches = make([]Watch, nw)
	}
	for i := range watches {
		watches[i] = Watch{Key: d.Bytes(), Seen: d.Bytes()}
	}
	if d.Err != nil || len(d.B) != 0 {
		return nil, nil, ErrTxCorrupt
	}
	for _, w := range watches {
		if err := checkObservation(w.Seen); err != nil {
			return nil, nil, fmt.Errorf("%w (watch of key %q)", err, w.Key)
		}
	}
	return cmds, watches, nil
}

// ErrNoTxCommands: no command parser is linked into this binary.
var ErrNoTxCommands = errors.New("kv: transaction commands are not linked into this build")

// NullArray is the reply of an EXEC whose watched key was modified (RESP2;
// the front door writes RESP3's null for it).
var NullArray = []byte("*-1\r\n")

// applyExec is Apply's case for KindExec (see the top of this file).
func applyExec(get Getter, list Lister, ordered bool, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	o := *op // a copy, so that the callers' ops do not escape
	res, ov, err := runExec(get, nil, list, ordered, listRows(get, list), version, &o, maxValue)
	if err == nil && ov != nil {
		if err := ov.emitAll(emit); err != nil {
			return Result{}, err
		}
	}
	return res, err
}

// execParts decodes an EXEC (or EXEC of reads) for its evaluation: its
// commands and watches, or the error its evaluation answers before any watch.
func execParts(op *Op) (cmds [][][]byte, watches []Watch, err error) {
	if runCommand == nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidOp, ErrNoTxCommands)
	}
	cmds, watches, err = DecodeTx(op.Value)
	if err != nil {
		return nil, nil, err
	}
	if op.Delta != int64(len(op.Keys)) {
		return nil, nil, fmt.Errorf("%w: exec declares %d of %d keys", ErrInvalidOp, op.Delta, len(op.Keys))
	}
	return cmds, watches, nil
}

// watchChanged is EXEC's decision on one watch: whether the key is modified
// since WATCH saw it.
//
// With sure false it is apply's: get (rows: a hash's rows) is the state as
// of op version−1, and the key is modified if Observe there differs from
// what WATCH saw and the difference is not the op's own record in a replay
// (ownRecord). With sure true it is a leader's early check (TxDoomed): get
// is a committed state as of op version, which every op the leader orders
// follows, and the answer is true only if apply must find the key modified,
// whatever is ordered in between and whatever clock a retry carries. That
// holds when WATCH saw the key live, at a version this state has (at most
// version), under the origin the key has here, and the key's record here is
// newer or gone: every later record is newer still, and an observation's
// version is at least its record's. It says nothing (false) of a key WATCH
// saw absent (it may be absent again at apply), nor of one whose record is
// still the one seen (only its expiry at the op's clock could change it), and
// needs no rows.
func watchChanged(get Getter, rows func(start, end []byte) (uint64, error), version uint64, now int64, w Watch, sure bool) (bool, error) {
	if sure {
		e := observedVersion(w.Seen)
		o, ok := observedOrigin(w.Seen)
		if e == 0 || e > version || !ok {
			return false, nil
		}
		here, err := SlotOrigin(get, w.Key)
		if err != nil || here != o {
			return false, err
		}
		_, _, ver, stored, err := get(w.Key)
		return err == nil && (!stored || ver > e), err
	}
	seen, err := Observe(get, rows, w.Key, now)
	if err != nil || bytes.Equal(seen, w.Seen) {
		return false, err
	}
	own, err := ownRecord(get, version, w.Key)
	return !own, err
}

// watchesChanged is whether any of watches changed (watchChanged, sure as
// there): runExec's loop and TxDoomed's.
func watchesChanged(get Getter, rows func(start, end []byte) (uint64, error), version uint64, now int64, watches []Watch, sure bool) (bool, error) {
	for _, w := range watches {
		if changed, err := watchChanged(get, rows, version, now, w, sure); err != nil || changed {
			return changed, err
		}
	}
	return false, nil
}

// observedOrigin is the origin an observation ends with; false if it has
// none, or if the version and the origin do not decode as exactly the rest
// (checkObservation's test of the layout).
func observedOrigin(seen []byte) (TxOrigin, bool) {
	if len(seen) == 0 || seen[0]&obsOrigin == 0 {
		return TxOrigin{}, false
	}
	d := Decoder{B: seen[1:]}
	if seen[0]&obsLive != 0 {
		d.Uvarint()
	}
	o := TxOrigin{Epoch: d.Uvarint(), State: SlotState(d.Byte())}
	return o, d.Err == nil && len(d.B) == 0
}

// execWritesAll reports whether the transaction tx (an EXEC's Value) holds
// an EVAL or EVALSHA (a script may write keys it did not declare) or a
// FLUSHDB or FLUSHALL: such an EXEC writes the whole keyspace
// (Op.WritesAll), as an EVAL or a flush does. A transaction that does not
// decode runs nothing.
func execWritesAll(tx []byte) bool {
	cmds, _, err := DecodeTx(tx)
	if err != nil {
		return false
	}
	for _, argv := range cmds {
		if len(argv) == 0 {
			continue
		}
		for _, name := range []string{"EVAL", "EVALSHA", "FLUSHDB", "FLUSHALL"} {
			if bytes.EqualFold(argv[0], []byte(name)) {
				return true
			}
		}
	}
	return false
}

// readExec is Read's case for KindExecRO.
func readExec(get Getter, scan Scanner, op *Op) (Result, error) {
	o := *op
	res, _, err := runExec(get, scan, nil, false, scanRows(scan), 0, &o, 0)
	return res, err
}

// runExec compares op's watches with the state get reads (rows: a hash's
// rows, Observe) and, if none changed, runs its commands over an overlay,
// which it returns (nil: a watched key changed, nothing to emit). scan (a
// reader's) or list (an applier's; ordered: ApplyOptions.OrderedList)
// serves the commands' range reads.
func runExec(get Getter, scan Scanner, list Lister, ordered bool, rows func(start, end []byte) (uint64, error), version uint64, op *Op, maxValue int) (Result, *overlay, error) {
	cmds, watches, err := execParts(op)
	if err != nil {
		return Result{}, nil, err
	}
	changed, err := watchesChanged(get, rows, version, op.Now, watches, false)
	if err != nil {
		return Result{}, nil, err
	}
	if changed {
		return Result{Kind: ResReply, Bulk: NullArray}, nil, nil
	}
	ov := newOverlay(get, version, op, maxValue)
	ov.scan, ov.list, ov.listOrdered = scan, list, ordered
	reply := append(strconv.AppendInt([]byte{'*'}, int64(len(cmds)), 10), '\r', '\n')
	rnd := NewOpRand(version, op.Now)
	for _, argv := range cmds {
		reply = runCommand(reply, argv, op.Now, rnd, ov.exec)
	}
	res := Result{Kind: ResReply, Bulk: reply, Version: ov.readVer}
	if len(ov.order) > 0 || ov.flushed {
		res.Version = version
	}
	return res, ov, nil
}
