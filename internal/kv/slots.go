package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/kefirdb/kefir/internal/keyslot"
	"slices"
	"strconv"
	"strings"
)

// Slot ownership in a group's replicated state (issue 28, docs/design/cluster.md).
//
// A group of a cluster owns hash slots. Which ones, and in what state, is
// part of the group's state machine: one reserved record (SlotTableKey) holds
// every slot's state, the peer group of a move and the map epoch the state was
// set at, changed only by ops in the group's own log (KindSlotInit,
// KindSlotSet) and read by every write the group applies (SlotTable.Check):
// a write of a key whose slot the group does not own is refused at apply, the
// same on every replica, whatever map the request was routed on. Being a
// record of the store, the table is in every snapshot, state transfer and
// crash replay like any key.
//
// A group that never got a table (SlotTableKey absent: a single group, or a
// cluster group no move touched yet) is unfenced: it serves what it is
// routed, as before slots could move.

// Slot ops (kinds 160-175 are the cluster's block).
const (
	// KindSlotInit gives a group without a table its first one: the slots
	// of Key's ranges (EncodeSlotRanges) owned at epoch Delta, every other
	// slot not owned. A no-op for a group that has a table.
	KindSlotInit Kind = 160 + iota
	// KindSlotSet moves Key's ranges to state Cond (a SlotState) with peer
	// group Value (decimal) at epoch Delta, if every slot may make that
	// transition (SlotTable.Set); otherwise nothing changes and the op fails
	// with ErrSlotTransition.
	KindSlotSet
	// KindSlotImport writes records copied from a move's source
	// (AppendSlotImport's entries in Keys) into slots the group is
	// importing.
	KindSlotImport
	// The metadata group's ops (clustermap.go): its state is the cluster
	// map, one reserved record (ClusterMapKey). Sent to the group by id, as
	// the slot ops are.
	KindMapInit
	KindMapMovePlan
	KindMapMoveClaim
	KindMapMoveDone
	KindMapMoveAbort
	KindMapAddNode
	// A chain's configuration in the metadata group (chainconf.go; issue
	// 30's block 169-171).
	KindMapChainInit
	KindMapChainSet
	// KindGroupAddrs records a VR group's member addresses in the group's
	// own state (groupaddrs.go), before a reconfiguration names a new
	// member: 171.
	KindGroupAddrs
	// KindMapSetMembers records a data group's members after its VR
	// reconfiguration (clustermap.go): 172.
	KindMapSetMembers
	// KindMapAddGroup records a new data group, owning no slots, in the
	// map (clustermap.go): 173.
	KindMapAddGroup
	// KindMapRemoveGroup takes a data group that owns no slots out of the
	// map (clustermap.go): 174.
	KindMapRemoveGroup
	// KindMapChainWant records on a chain group's map entry the nodes to
	// add to the chain and to remove from it (chainconf.go): 175, the
	// block's last.
	KindMapChainWant
	kindSlotEnd
)

// The cluster's kinds are 160-175: this fails to compile if they outgrow
// them (kindSlotEnd is one past the last).
var _ = [1]struct{}{}[(kindSlotEnd-1)/176]

func isSlotKind(k Kind) bool { return k >= KindSlotInit && k < kindSlotEnd }

// IsSlotKind reports whether k is one of the slot ops (the router sends
// them to a group by id, not by key).
func IsSlotKind(k Kind) bool { return isSlotKind(k) }

var slotKindNames = [...]string{"slotinit", "slotset", "slotimport",
	"mapinit", "mapmoveplan", "mapmoveclaim", "mapmovedone", "mapmoveabort", "mapaddnode",
	"mapchaininit", "mapchainset", "groupaddrs", "mapsetmembers", "mapaddgroup", "mapremovegroup", "mapchainwant"}

// NumSlots is the number of hash slots (Redis Cluster's 16384).
const NumSlots = keyslot.N

// SlotState is a slot's state in a group's table.
type SlotState uint8

const (
	// SlotNone: the group does not own the slot; Peer, if not 0, is the
	// group it handed it to.
	SlotNone SlotState = iota
	// SlotOwned: the group serves the slot; Peer, if not 0, is the group
	// it imported it from (or, after a move of it rolled back past its
	// migrating step, that move's destination: the origin is lost by
	// then, and a Peer not 0 is what keeps MovedRequest checking marks).
	SlotOwned
	// SlotMigrating: the group serves the slot while its keys are copied
	// to Peer.
	SlotMigrating
	// SlotImporting: the group receives the slot's keys from Peer and
	// serves none of them yet.
	SlotImporting
	slotStateEnd
)

var slotStateNames = [...]string{"none", "owned", "migrating", "importing"}

// KindSlotSet carries its state in Op.Cond, which the op codec stores in two
// bits: this fails to compile if the states outgrow them.
var _ = [1]struct{}{}[slotStateEnd-4]

func (s SlotState) String() string {
	if s < slotStateEnd {
		return slotStateNames[s]
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// ParseSlotState is String's inverse (case-insensitive).
func ParseSlotState(s string) (SlotState, bool) {
	for i, n := range slotStateNames {
		if strings.EqualFold(s, n) {
			return SlotState(i), true
		}
	}
	return 0, false
}

// Serves reports whether a group serves keys of a slot in state s.
func (s SlotState) Serves() bool { return s == SlotOwned || s == SlotMigrating }

// SlotEntry is one slot's row of a table.
type SlotEntry struct {
	State SlotState
	Peer  uint64
	Epoch uint64
}

// SlotTable is a group's account of every slot. Immutable once built: a
// change makes a new one (readers hold it without a lock).
type SlotTable struct {
	e [NumSlots]SlotEntry
}

// SlotTableKey is the reserved record that holds a group's table.
var SlotTableKey = ReservedKey("slots")

// Entry returns slot's row.
func (t *SlotTable) Entry(slot uint16) SlotEntry { return t.e[slot%NumSlots] }

// Epoch is the highest epoch of any slot.
func (t *SlotTable) Epoch() uint64 {
	var e uint64
	for i := range t.e {
		e = max(e, t.e[i].Epoch)
	}
	return e
}

// SlotRun is a run of consecutive slots with one row.
type SlotRun struct {
	Start, End uint16 // inclusive
	SlotEntry
}

// Runs returns the table as runs of equal rows, in slot order.
func (t *SlotTable) Runs() []SlotRun {
	var out []SlotRun
	for s := 0; s < NumSlots; s++ {
		if n := len(out); n > 0 && out[n-1].SlotEntry == t.e[s] && int(out[n-1].End) == s-1 {
			out[n-1].End = uint16(s)
			continue
		}
		out = append(out, SlotRun{Start: uint16(s), End: uint16(s), SlotEntry: t.e[s]})
	}
	return out
}

// AppendSlotTable appends t's encoding (its runs: start, end, state, peer,
// epoch as uvarints) to b.
func AppendSlotTable(b []byte, t *SlotTable) []byte {
	runs := t.Runs()
	b = binary.AppendUvarint(b, uint64(len(runs)))
	for _, r := range runs {
		b = binary.AppendUvarint(b, uint64(r.Start))
		b = binary.AppendUvarint(b, uint64(r.End))
		b = append(b, byte(r.State))
		b = binary.AppendUvarint(b, r.Peer)
		b = binary.AppendUvarint(b, r.Epoch)
	}
	return b
}

// DecodeSlotTable decodes AppendSlotTable's encoding; every slot must be
// covered exactly once.
func DecodeSlotTable(b []byte) (*SlotTable, error) {
	t := &SlotTable{}
	err := slotRuns(b, func(start, end uint16, e SlotEntry) bool {
		for s := int(start); s <= int(end); s++ {
			t.e[s] = e
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// slotRuns calls fn with each run of AppendSlotTable's encoding b, in slot
// order, until fn returns false; every slot must be covered exactly once
// (checked only when fn reads to the end).
func slotRuns(b []byte, fn func(start, end uint16, e SlotEntry) bool) error {
	d := Decoder{B: b}
	n := d.Uvarint()
	next := 0
	for i := uint64(0); i < n && d.Err == nil; i++ {
		start, end := d.Uvarint(), d.Uvarint()
		st := SlotState(d.Byte())
		peer, epoch := d.Uvarint(), d.Uvarint()
		if d.Err != nil || start != uint64(next) || end < start || end >= NumSlots || st >= slotStateEnd {
			return fmt.Errorf("%w: slot table run %d", ErrCorrupt, i)
		}
		if !fn(uint16(start), uint16(end), SlotEntry{State: st, Peer: peer, Epoch: epoch}) {
			return nil
		}
		next = int(end) + 1
	}
	if d.Err != nil || next != NumSlots || len(d.B) != 0 {
		return fmt.Errorf("%w: slot table covers %d slots", ErrCorrupt, next)
	}
	return nil
}

// slotEntryOf is slot's row of AppendSlotTable's encoding b, read off its
// runs without building the table (the fence of one key, a WATCH's and a
// transaction commit's origin: one row per key).
func slotEntryOf(b []byte, slot uint16) (SlotEntry, error) {
	var e SlotEntry
	found := false
	err := slotRuns(b, func(start, end uint16, run SlotEntry) bool {
		if slot > end {
			return true
		}
		e, found = run, true
		return false
	})
	if err == nil && !found {
		err = fmt.Errorf("%w: slot table without slot %d", ErrCorrupt, slot)
	}
	return e, err
}

// SlotRange is an inclusive range of slots.
type SlotRange struct{ Start, End uint16 }

// InSlotRanges reports whether slot s is in one of rs (the one copy: the
// map's and the moves' checks, cluster.InRanges).
func InSlotRanges(s uint16, rs []SlotRange) bool {
	for _, r := range rs {
		if s >= r.Start && s <= r.End {
			return true
		}
	}
	return false
}

// EncodeSlotRanges is the Key of KindSlotInit and KindSlotSet.
func EncodeSlotRanges(rs []SlotRange) []byte {
	b := binary.AppendUvarint(nil, uint64(len(rs)))
	for _, r := range rs {
		b = binary.AppendUvarint(b, uint64(r.Start))
		b = binary.AppendUvarint(b, uint64(r.End))
	}
	return b
}

// DecodeSlotRanges decodes EncodeSlotRanges's encoding.
func DecodeSlotRanges(b []byte) ([]SlotRange, error) {
	d := Decoder{B: b}
	n := d.Uvarint()
	if n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d slot ranges", ErrCorrupt, n)
	}
	rs := make([]SlotRange, 0, n)
	for range n {
		s, e := d.Uvarint(), d.Uvarint()
		if d.Err != nil || s > e || e >= NumSlots {
			return nil, fmt.Errorf("%w: slot range", ErrCorrupt)
		}
		rs = append(rs, SlotRange{uint16(s), uint16(e)})
	}
	if d.Err != nil || len(d.B) != 0 {
		return nil, fmt.Errorf("%w: slot ranges", ErrCorrupt)
	}
	return rs, nil
}

// Errors of the slot ops and of the fence (codes in codec.go's resultErrs).
var (
	// ErrSlotMoved: the group does not serve the key's slot (*SlotError
	// says which slot and where it went).
	ErrSlotMoved = errors.New("slot not served by this group")
	// ErrSlotTransition: a KindSlotSet or KindSlotImport whose slots are not
	// in a state that allows it (a move's step out of order, a stale epoch).
	ErrSlotTransition = errors.New("slot state transition refused")
	// ErrSlotStaleRequest: a write of a slot the group imported, whose
	// request number is older than the latest request of its client that
	// the slot's old group ran before the hand-over (MovedRequest).
	ErrSlotStaleRequest = errors.New("stale request: a later request of this client ran at the slot's old group before the slot moved")
)

// SlotError is the fence's refusal: key slot Slot is in state State here
// (SlotNone or SlotImporting) at epoch Epoch; Peer is the group the move
// names (0: none). Its text is kept in the client table (codec.go) and
// ParseSlotError reads it back.
type SlotError struct {
	Slot  uint16
	State SlotState
	Peer  uint64
	Epoch uint64
}

func (e *SlotError) Error() string {
	return fmt.Sprintf("slot %d is %s here, peer group %d, epoch %d", e.Slot, e.State, e.Peer, e.Epoch)
}

// Unwrap makes errors.Is(err, ErrSlotMoved) hold.
func (e *SlotError) Unwrap() error { return ErrSlotMoved }

// ParseSlotError returns the refusal err carries: a *SlotError, or one
// decoded from a client row (its text).
func ParseSlotError(err error) (SlotError, bool) {
	if err == nil || !errors.Is(err, ErrSlotMoved) {
		return SlotError{}, false
	}
	var se *SlotError
	if errors.As(err, &se) {
		return *se, true
	}
	var e SlotError
	var st string
	if _, serr := fmt.Sscanf(err.Error(), "slot %d is %s here, peer group %d, epoch %d", &e.Slot, &st, &e.Peer, &e.Epoch); serr != nil {
		return SlotError{}, false
	}
	st = strings.TrimSuffix(st, ",")
	e.State, _ = ParseSlotState(st)
	return e, true
}

// KeySlot is a key's hash slot, Redis Cluster's (internal/keyslot).
func KeySlot(key []byte) uint16 { return keyslot.Of(key) }

// HashTag returns the part of key that decides its slot (keyslot.HashTag).
func HashTag(key []byte) []byte { return keyslot.HashTag(key) }

// Check is the fence: nil if the group serves every key op routes by
// (RoutingKeys), else the first refused key's *SlotError. A nil table is
// unfenced. Keyless ops (a scan, a flush) are not checked here: their
// callers filter by slot. Nor is a hash sweep: it deletes rows of a
// generation dead in this group's own state (HashGenDead) and only reads
// its key, so it cleans a group's rows of a hash whose slot moved away.
func (t *SlotTable) Check(op *Op) error {
	if t == nil {
		return nil
	}
	return checkFence(op, func(s uint16) (SlotEntry, error) { return t.e[s], nil })
}

// CheckSlotTable is Check of the table enc encodes (AppendSlotTable; nil:
// no table), reading only the runs of op's keys: for a read of one state
// of the engine (a transaction's snapshot) against its own table, where
// decoding the whole table for each would cost more than the read.
func CheckSlotTable(enc []byte, op *Op) error {
	if enc == nil {
		return nil
	}
	return checkFence(op, func(s uint16) (SlotEntry, error) { return slotEntryOf(enc, s) })
}

// checkFence is Check with entry the table's row of a slot.
func checkFence(op *Op, entry func(uint16) (SlotEntry, error)) error {
	if isSlotKind(op.Kind) || op.Kind == KindHSweep {
		return nil
	}
	// MSET's Keys are key, value pairs: only every step-th is a key.
	keys, step := op.RoutingKeys()
	for i := 0; i < len(keys); i += step {
		s := KeySlot(keys[i])
		e, err := entry(s)
		if err != nil {
			return err
		}
		if !e.State.Serves() {
			return &SlotError{Slot: s, State: e.State, Peer: e.Peer, Epoch: e.Epoch}
		}
	}
	return nil
}

// Set returns t with rs moved to state st (peer, epoch), or
// ErrSlotTransition if a slot may not make that move:
//
//	owned     -> migrating(peer)        the source starts a move
//	none      -> importing(peer)        the destination starts one
//	migrating -> none(peer)             the source hands the slot over (fenced from here)
//	importing -> owned                  the destination takes it
//	migrating -> owned, importing -> none   a move rolled back
//
// Each is also allowed from the state it leads to with the same peer and
// epoch (a step retried after a crash is a no-op), and the epoch may not go
// down.
func (t *SlotTable) Set(rs []SlotRange, st SlotState, peer, epoch uint64) (*SlotTable, error) {
	n := *t
	for _, r := range rs {
		for s := int(r.Start); s <= int(r.End); s++ {
			cur := n.e[s]
			// An owned slot keeps the peer it came from (0: never
			// imported; after a rolled-back move, see SlotOwned):
			// MovedRequest checks the requests of its keys against the
			// old group's marks.
			want := SlotEntry{State: st, Peer: peer, Epoch: epoch}
			if cur == want {
				continue
			}
			ok := epoch >= cur.Epoch
			switch st {
			case SlotMigrating:
				ok = ok && cur.State == SlotOwned
			case SlotImporting:
				ok = ok && cur.State == SlotNone
			case SlotNone:
				ok = ok && (cur.State == SlotMigrating || cur.State == SlotImporting) && cur.Peer == peer
			case SlotOwned:
				ok = ok && (cur.State == SlotImporting || cur.State == SlotMigrating)
			default:
				ok = false
			}
			if !ok {
				return nil, fmt.Errorf("%w: slot %d is %s (peer %d, epoch %d), cannot become %s (peer %d, epoch %d)",
					ErrSlotTransition, s, cur.State, cur.Peer, cur.Epoch, st, peer, epoch)
			}
			n.e[s] = want
		}
	}
	return &n, nil
}

// NewSlotTable returns the table of a group that owns rs at epoch.
func NewSlotTable(rs []SlotRange, epoch uint64) *SlotTable {
	t := &SlotTable{}
	for _, r := range rs {
		for s := int(r.Start); s <= int(r.End); s++ {
			t.e[s] = SlotEntry{State: SlotOwned, Epoch: epoch}
		}
	}
	return t
}

// ReadSlotTable reads a group's table through get (nil, nil: none).
func ReadSlotTable(get Getter) (*SlotTable, error) {
	data, _, _, ok, err := get(SlotTableKey)
	if err != nil || !ok {
		return nil, err
	}
	return DecodeSlotTable(data)
}

// Request marks: the rows of the source's client table as of the hand-over
// (kv.ClientRowKey's values), imported with the slots. A client's request
// ids are one sequence across groups, so a retry (same id) of a write the
// source ran before the hand-over, arriving at the destination after it,
// has a request number no later than its client's mark there: MovedRequest
// answers it from the mark (the same request) or refuses it (an older one)
// instead of running it a second time.

// SlotClientPrefix starts the keys of the marks a group imported.
var SlotClientPrefix = ReservedKey("slotclient/")

// SlotClientKey is the key of client's mark.
func SlotClientKey(client uint64) []byte {
	return binary.BigEndian.AppendUint64(append(make([]byte, 0, len(SlotClientPrefix)+8), SlotClientPrefix...), client)
}

var slotClientMark = []byte{0xfe}

// AppendSlotClientMark appends to an import's Keys the mark of client: row,
// the value of its row at the source (AppendClientRow's).
func AppendSlotClientMark(keys [][]byte, client uint64, row []byte) [][]byte {
	return append(keys, binary.BigEndian.AppendUint64(nil, client), slotClientMark, row)
}

// MovedRequest decides a write of client's request reqNum at a group whose
// table is t: if the op writes a key of a slot the group imported (owned,
// with the peer it came from) and client has a mark there with request
// reqNum or a later one, the request may have run at the slot's old group —
// hit, with the mark's outcome for the same request, ErrSlotStaleRequest for
// an older one. err is get's.
func MovedRequest(get Getter, t *SlotTable, op *Op, client, reqNum uint64) (res Result, opErr error, hit bool, err error) {
	if t == nil || client == 0 || isSlotKind(op.Kind) {
		return Result{}, nil, false, nil
	}
	keys, step := op.RoutingKeys()
	imported := false
	for i := 0; i < len(keys); i += step {
		// A migrating slot may have been imported too (its entry names
		// where it goes next, not where it came from): a retry of a write
		// its old group ran can reach this group after it began moving the
		// slot on (found by the move simulation, docs/design/cluster.md §9).
		if e := t.e[KeySlot(keys[i])]; (e.State == SlotOwned && e.Peer != 0) || e.State == SlotMigrating {
			imported = true
			break
		}
	}
	if !imported {
		return Result{}, nil, false, nil
	}
	data, _, _, ok, err := get(SlotClientKey(client))
	if err != nil || !ok {
		return Result{}, nil, false, err
	}
	mark, n := binary.Uvarint(data)
	if n <= 0 || reqNum > mark {
		return Result{}, nil, false, nil
	}
	if reqNum < mark {
		return Result{}, ErrSlotStaleRequest, true, nil
	}
	res, opErr, derr := DecodeResult(data[n:])
	if derr != nil {
		return Result{}, nil, false, fmt.Errorf("%w: client %d's mark", ErrCorrupt, client)
	}
	return res, opErr, true, nil
}

// Slot import entries: key, meta, payload. A string's payload is its value
// and meta its meta; a hash's meta is its meta (TypeHash, expiry) and its
// payload the fields (uvarint n, then field and value byte strings); a
// deletion's meta is slotTomb.
var slotTomb = []byte{0xff}

// AppendSlotImport appends one entry to an import op's Keys. A hash's
// fields are pairs (field, value); nil meta and payload with del true is
// a deletion.
func AppendSlotImport(keys [][]byte, key, meta, value []byte, fields [][]byte, del bool) [][]byte {
	switch {
	case del:
		return append(keys, key, slotTomb, nil)
	case MetaType(meta) == TypeHash:
		b := binary.AppendUvarint(nil, uint64(len(fields)/2))
		for _, f := range fields {
			b = AppendBytes(b, f)
		}
		return append(keys, key, meta, b)
	}
	return append(keys, key, meta, value)
}

func applySlotOp(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	if op.Kind == KindGroupAddrs {
		return applyGroupAddrs(version, op, emit) // groupaddrs.go
	}
	if op.Kind >= KindMapInit {
		return applyMapOp(get, version, op, emit) // clustermap.go
	}
	fenced, err := checkDriverFence(get, op, emit) // clustermap.go
	if err != nil {
		return Result{}, err
	}
	t, err := ReadSlotTable(get)
	if err != nil {
		return Result{}, err
	}
	switch op.Kind {
	case KindSlotInit:
		if t != nil {
			return Result{Kind: ResInt, Int: int64(t.Epoch())}, nil
		}
		rs, err := DecodeSlotRanges(op.Key)
		if err != nil || op.Delta <= 0 {
			return Result{}, fmt.Errorf("%w: slot init", ErrInvalidOp)
		}
		put(emit, SlotTableKey, AppendSlotTable(nil, NewSlotTable(rs, uint64(op.Delta))), nil)
		return Result{Kind: ResInt, Int: op.Delta, Version: version}, nil
	case KindSlotSet:
		if t == nil {
			return Result{}, fmt.Errorf("%w: the group has no slot table (KindSlotInit first)", ErrSlotTransition)
		}
		rs, err := DecodeSlotRanges(op.Key)
		peer, perr := strconv.ParseUint(string(op.Value), 10, 64)
		if err != nil || perr != nil || op.Delta <= 0 || SlotState(op.Cond) >= slotStateEnd {
			return Result{}, fmt.Errorf("%w: slot set", ErrInvalidOp)
		}
		n, err := t.Set(rs, SlotState(op.Cond), peer, uint64(op.Delta))
		if err != nil {
			return Result{}, err
		}
		if *n != *t && SlotState(op.Cond) == SlotNone {
			// The hand-over (or a rollback at the destination) waits
			// until no prepared cross-group transaction locks a key of
			// the slots: locks never move (xgtx.go). A migrating slot
			// takes no new ones, so the wait ends with their resolves.
			if s, txid, locked, err := txLockedSlot(get, rs); err != nil {
				return Result{}, err
			} else if locked {
				return Result{}, fmt.Errorf("%w: slot %d, transaction %x: the hand-over waits for its resolve", ErrTxLocked, s, txid)
			}
		}
		if *n == *t {
			// A retried step (or a new driver's first: it raised the
			// driver fence).
			if fenced {
				return Result{Kind: ResInt, Int: op.Delta, Version: version}, nil
			}
			return Result{Kind: ResInt, Int: op.Delta}, nil
		}
		put(emit, SlotTableKey, AppendSlotTable(nil, n), nil)
		return Result{Kind: ResInt, Int: op.Delta, Version: version}, nil
	}
	return applySlotImport(get, t, version, op, emit)
}

// applySlotImport writes an import's entries, every one of a slot the group
// imports (or, for a deletion, of a slot it handed over: the purge of the
// source's copy): strings as they came, hashes under generations of this op
// (version + i<<48 for its i-th hash, as a script's), so that they never
// share rows with a hash of this group.
func applySlotImport(get Getter, t *SlotTable, version uint64, op *Op, emit Emit) (Result, error) {
	if len(op.Keys)%3 != 0 {
		return Result{}, fmt.Errorf("%w: slot import of %d fields", ErrInvalidOp, len(op.Keys))
	}
	for i := 0; i < len(op.Keys); i += 3 {
		if bytes.Equal(op.Keys[i+1], slotClientMark) {
			if len(op.Keys[i]) != 8 {
				return Result{}, fmt.Errorf("%w: slot import: a client mark of a %d-byte id", ErrInvalidOp, len(op.Keys[i]))
			}
			if t == nil || !slices.ContainsFunc(t.e[:], func(e SlotEntry) bool { return e.State == SlotImporting }) {
				return Result{}, fmt.Errorf("%w: client marks come with slots being imported", ErrSlotTransition)
			}
			continue
		}
		if bytes.Equal(op.Keys[i+1], slotViewsMark) {
			if _, ok := SlotViewsGroup(op.Keys[i]); !ok {
				return Result{}, fmt.Errorf("%w: slot import: a view copy's key", ErrInvalidOp)
			}
			if t == nil || !slices.ContainsFunc(t.e[:], func(e SlotEntry) bool { return e.State == SlotImporting }) {
				return Result{}, fmt.Errorf("%w: view copies come with slots being imported", ErrSlotTransition)
			}
			if _, err := DecodeViewCopy(op.Keys[i+2]); err != nil {
				return Result{}, err
			}
			continue
		}
		if err := CheckKey(op.Keys[i]); err != nil {
			return Result{}, err
		}
		s := KeySlot(op.Keys[i])
		// A deletion may also purge a key the group handed over (the
		// source's copy, once the destination owns the slot).
		purge := bytes.Equal(op.Keys[i+1], slotTomb) && t != nil && t.e[s].State == SlotNone
		if !purge && (t == nil || t.e[s].State != SlotImporting) {
			st := SlotNone
			if t != nil {
				st = t.e[s].State
			}
			return Result{}, fmt.Errorf("%w: import of a key of slot %d, which is %s here", ErrSlotTransition, s, st)
		}
	}
	hashes := uint64(0)
	written := 0
	for i := 0; i < len(op.Keys); i += 3 {
		key, meta, payload := op.Keys[i], op.Keys[i+1], op.Keys[i+2]
		switch {
		case bytes.Equal(meta, slotClientMark):
			req, n := binary.Uvarint(payload)
			if n <= 0 {
				return Result{}, fmt.Errorf("%w: slot import: a client mark", ErrCorrupt)
			}
			mk := SlotClientKey(binary.BigEndian.Uint64(key))
			old, _, _, ok, err := get(mk)
			if err != nil {
				return Result{}, err
			}
			if prev, m := binary.Uvarint(old); ok && m > 0 && prev >= req {
				continue // a later mark of the client came with an earlier move
			}
			put(emit, mk, payload, nil)
		case bytes.Equal(meta, slotViewsMark):
			if err := applySlotViews(get, key, payload, emit); err != nil {
				return Result{}, err
			}
		case bytes.Equal(meta, slotTomb):
			_, _, _, ok, err := get(key)
			if err != nil {
				return Result{}, err
			}
			if ok {
				emit(key, nil, nil, true)
				written++
			}
		case MetaType(meta) == TypeHash:
			if hashes >= maxScriptHashes || version >= 1<<48 {
				return Result{}, fmt.Errorf("%w: a slot import of more than %d hashes", ErrInvalidOp, maxScriptHashes)
			}
			gen := version + hashes<<48
			hashes++
			d := Decoder{B: payload}
			n := d.Uvarint()
			if n > uint64(len(payload)) {
				return Result{}, fmt.Errorf("%w: slot import hash", ErrCorrupt)
			}
			put(emit, key, appendHashMeta(nil, gen, int64(n)), meta)
			put(emit, hashMarker(gen), key, nil)
			for range n {
				f, v := d.Bytes(), d.Bytes()
				if d.Err != nil {
					return Result{}, fmt.Errorf("%w: slot import hash fields", ErrCorrupt)
				}
				put(emit, hashRowKey(gen, f), v, nil)
			}
			written++
		default:
			put(emit, key, payload, meta)
			written++
		}
	}
	return Result{Kind: ResInt, Int: int64(written), Version: version}, nil
}
