package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// Hashes with field-level storage (issue 27; docs/design/hashes.md), laid
// out as Kvrocks lays its types over RocksDB:
//
//   - the hash's user key holds a small metadata record: meta type TypeHash
//     (and the key's expiry, so fields inherit the key's TTL), value =
//     generation (8 bytes little endian) | field count (uvarint);
//   - each field is a row of its own under the reserved key
//     HashRowPrefix(generation)+field, value = the field's value.
//
// The generation is the version of the op that created the hash: versions
// are never handed out twice, so a hash created after an earlier one of the
// same name was deleted (DEL, SET over it, expiry) cannot see the old one's
// rows. That makes DEL, SET over a hash, EXPIRE and RENAME O(1) — they touch
// only the metadata record; RENAME moves it verbatim and the rows follow,
// since their key holds no user key. The rows of a dead generation stay as
// garbage until FLUSHDB deletes every row (docs/design/hashes.md says what
// they cost and what is left to do). COPY of a hash is refused: the copy
// would share its generation's rows.
//
// Every hash write rewrites the metadata record, even when the count does
// not change (HSET of an existing field): whoever tracks reads and writes by
// key (a replicated replica's follower reads, the nilext read check) then
// sees a hash's every change on its user key. An engine that tracks nothing
// so (the single node) may ask for the rows alone then
// (ApplyOptions.SparseHashMeta): one record per HSET of an existing field,
// not two.

// TypeHash is the type byte of a hash's metadata record.
const TypeHash byte = 1

// Hash write kinds, numbered from 96 (kinds are on disk: the VR log).
const (
	// KindHSet sets the fields of Keys (field, value, field, value...) in
	// the hash Key; result: how many fields are new (Delta 1: HMSET, which
	// answers OK). Cond IfAbsent is HSETNX (one pair: 1 if set, else 0).
	KindHSet Kind = 96 + iota
	// KindHDel deletes the fields Keys of Key; result: how many existed.
	// The hash's last field deletes the key.
	KindHDel
	// KindHIncrBy adds Delta to the integer field Keys[0] of Key.
	KindHIncrBy
	// KindHIncrByFloat adds the decimal Value to the field Keys[0] of Key.
	KindHIncrByFloat
	// KindHSweep deletes rows of a dead hash generation (the orphan-row
	// sweeper, HashSweepOp): the rows of fields Keys of generation
	// uint64(Delta), if the generation's marker still names Key and Key
	// does not hold that generation, and with Value SweepLast the marker.
	KindHSweep
	kindHashWriteEnd
)

// Hash read kinds, numbered from 112 (not updates: Kind.IsUpdate).
const (
	// KindHGet reads the fields Keys of Key: an array of their values, nil
	// for a missing field (HGET, HMGET, HEXISTS, HSTRLEN are shaped from it).
	KindHGet Kind = 112 + iota
	// KindHLen answers Key's field count.
	KindHLen
	// KindHGetAll answers field, value, field, value... in field order
	// (HGETALL, HKEYS, HVALS, HRANDFIELD are shaped from it).
	KindHGetAll
	// KindHScan answers field, value... in field order from the field Value
	// (inclusive; nil: the first), at most Limit fields (HSCAN's page).
	KindHScan
	kindHashReadEnd
)

var hashKindNames = [...]string{"hset", "hdel", "hincrby", "hincrbyfloat", "hsweep"}
var hashReadNames = [...]string{"hget", "hlen", "hgetall", "hscan"}

func isHashWrite(k Kind) bool { return k >= KindHSet && k < kindHashWriteEnd }
func isHashRead(k Kind) bool  { return k >= KindHGet && k < kindHashReadEnd }

// IsHashRead reports whether k is a read of a hash: it reads the metadata
// record of op.Key and rows under the reserved prefix through the Scanner,
// so a caller of Read must hand it one, and it must see one state (MultiKey).
// Whoever tracks reads by key may let op.Key stand for the rows where every
// hash write writes it: a replica group, not the single node, whose writes
// of existing fields may touch only rows (ApplyOptions.SparseHashMeta).
func IsHashRead(k Kind) bool { return isHashRead(k) }

// Errors of the hash commands (texts are Redis's; codec.go codes them).
var (
	// ErrWrongKind: the command does not apply to the type of the key's
	// value; the server answers Redis's -WRONGTYPE reply.
	ErrWrongKind    = errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")
	ErrHashNotInt   = errors.New("hash value is not an integer")
	ErrHashNotFloat = errors.New("hash value is not a float")
	// ErrHashNaN: HINCRBYFLOAT's increment is infinite (Redis checks it
	// before the field; INCRBYFLOAT answers ErrNaN instead).
	ErrHashNaN = errors.New("value is NaN or Infinity")
	// ErrHashCopyTooBig: COPY of a hash of more than MaxHashCopyFields
	// fields (or MaxHashCopyBytes of them) is refused: its copy is one op's
	// records, one engine batch.
	// ErrHashCopy is retired (COPY of a hash was refused before it was
	// built); it keeps its result code, which client rows on disk may hold.
	ErrHashCopy       = errors.New("COPY of a hash is not supported yet")
	ErrHashCopyTooBig = fmt.Errorf("COPY of a hash of more than %d fields or %d bytes is not supported", MaxHashCopyFields, MaxHashCopyBytes)
)

// The bounds of COPY of a hash: the copy writes a row per field in the one
// op (one engine batch, one replicated op applied at once on every
// replica), so it is bounded like the other ops that write many records.
const (
	MaxHashCopyFields = 1 << 16
	MaxHashCopyBytes  = 64 << 20
)

// hashRows is the reserved prefix of every hash field row.
var hashRows = ReservedKey("h/")

// hashMarkers is the reserved prefix of the generation markers: the op that
// creates a hash's generation g also writes hashMarker(g) = the user key
// (RENAME rewrites it), so that the sweeper (HashSweepOp) can find the rows
// of generations that died (DEL, SET over the hash, expiry, RENAME or COPY
// over it) — a death that a blind SET over a hash cannot record itself.
var hashMarkers = ReservedKey("hk/")

func hashMarker(gen uint64) []byte {
	b := make([]byte, 0, len(hashMarkers)+8)
	b = append(b, hashMarkers...)
	return binary.BigEndian.AppendUint64(b, gen)
}

func isHashMarker(key []byte) bool { return bytes.HasPrefix(key, hashMarkers) }

// HashMarkers is the key range [start, end) of the generation markers.
func HashMarkers() (start, end []byte) {
	return append([]byte(nil), hashMarkers...), PrefixEnd(hashMarkers)
}

// ParseHashMarker reads a marker row: the generation it stands for and the
// user key it names.
func ParseHashMarker(key, value []byte) (gen uint64, userKey []byte, ok bool) {
	if !isHashMarker(key) || len(key) != len(hashMarkers)+8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(key[len(hashMarkers):]), value, true
}

// HashRowPrefix is the prefix of the rows of the hash of generation gen.
func HashRowPrefix(gen uint64) []byte {
	b := make([]byte, 0, len(hashRows)+8+16)
	b = append(b, hashRows...)
	return binary.BigEndian.AppendUint64(b, gen)
}

// IsHashRow reports whether key is a hash field row (which a flush deletes
// with the user keys).
func IsHashRow(key []byte) bool { return bytes.HasPrefix(key, hashRows) }

// HashRowOverhead is how much longer a field's row key is than the field.
var HashRowOverhead = len(hashRows) + 8

func hashRowKey(gen uint64, field []byte) []byte {
	return appendHashRowKey(make([]byte, 0, len(hashRows)+8+len(field)), gen, field)
}

func appendHashRowKey(b []byte, gen uint64, field []byte) []byte {
	b = append(b, hashRows...)
	return append(binary.BigEndian.AppendUint64(b, gen), field...)
}

// hashMetaMax bounds the metadata record's value: generation and count.
const hashMetaMax = 8 + binary.MaxVarintLen64

func appendHashMeta(b []byte, gen uint64, n int64) []byte {
	b = binary.LittleEndian.AppendUint64(b, gen)
	return binary.AppendUvarint(b, uint64(n))
}

// hashTypeMeta is the meta of a hash without expiry, shared by every
// metadata record a write emits (records are never modified in place), so
// that an HSET does not allocate it.
var hashTypeMeta = EncodeMeta(TypeHash, 0)

// Prober reports whether key holds a value (a record that is not a
// deletion) without reading it. A hash write asks it of the field rows whose
// values it does not need — HSET and HSETNX (is the field new?), HDEL (did
// it exist?) — because reading a row back was most of what an HSET cost
// (docs/design/hashes.md, Throughput). Field rows have no expiry of their
// own, so stored is live. nil: the Getter answers.
type Prober func(key []byte) (exists bool, err error)

func decodeHashMeta(b []byte) (gen uint64, n int64, err error) {
	if len(b) < 8 {
		return 0, 0, fmt.Errorf("%w: hash metadata of %d bytes", ErrCorrupt, len(b))
	}
	gen = binary.LittleEndian.Uint64(b)
	// Counts below 2^21 (three bytes) inline: binary.Uvarint's loop was
	// ~45 instructions of every hash write (docs/design/hashes.md,
	// "Pipelined, session 25"); TestDecodeHashMetaAgreesWithUvarint.
	switch c := b[8:]; {
	case len(c) >= 1 && c[0] < 0x80:
		return gen, int64(c[0]), nil
	case len(c) >= 2 && c[1] < 0x80:
		return gen, int64(c[0]&0x7f) | int64(c[1])<<7, nil
	case len(c) >= 3 && c[2] < 0x80: // (c[0], c[1] >= 0x80: the cases above)
		return gen, int64(c[0]&0x7f) | int64(c[1]&0x7f)<<7 | int64(c[2])<<14, nil
	}
	c, k := binary.Uvarint(b[8:])
	if k <= 0 {
		return 0, 0, fmt.Errorf("%w: hash metadata count", ErrCorrupt)
	}
	return gen, int64(c), nil
}

// notString is the error of a string command on a key of another type.
func notString(meta []byte) error {
	if MetaType(meta) != TypeString {
		return ErrWrongKind
	}
	return nil
}

// hashState is a hash's metadata as a write finds it.
type hashState struct {
	live     bool
	created  bool // this op makes the generation (its marker is written)
	gen      uint64
	n        int64
	expireAt int64
	ver      uint64 // the version read (a write that writes nothing answers it)
}

// ErrScriptTooManyHashes: a script created more hashes than one op can
// give generations to (newHashGen).
var ErrScriptTooManyHashes = fmt.Errorf("%w: a script may create at most %d hashes", ErrInvalidOp, maxScriptHashes)

// maxScriptHashes bounds the hashes one script creates: the count takes
// the generation's top 16 bits, above the op's version.
const maxScriptHashes = 1 << 16

// newHashGen returns the generation of a hash op creates at version: the
// version, which no other op's hash had. The ops of one script share its
// version, and a script may create several hashes (or delete one and create
// it again): its k-th new hash gets version + k<<48, unique as long as
// versions stay below 2^48 (op numbers: centuries at a million ops/s).
// Without this two hashes of one script shared their rows, and a hash
// deleted and recreated by a script got its old fields back.
//
// In a crash replay the applier's getter answers a hash whose metadata record
// the engine kept as that record (ReplayReadsOwnRecord): the hash the first
// run created reads as existing, with the generation it got, and is not
// created again. The hashes created after it must still get the generations
// they got the first time, so the ones read back are marked taken (ownGen)
// and skipped, never handed to a second hash: the first run handed out
// 0, 1, 2, … in order, and the replay hands out the same numbers minus the
// ones it reads back. (Not exact for a hash the op deleted and created
// again: only the last of its generations is read back.)
func newHashGen(op *Op, version uint64) (uint64, error) {
	if op.scriptGens == nil {
		return version, nil
	}
	g := op.scriptGens
	k := g.next
	for slices.Contains(g.taken, k) {
		k++
	}
	if k >= maxScriptHashes || (k > 0 && version >= 1<<48) {
		return 0, ErrScriptTooManyHashes
	}
	g.next = k + 1
	return version + uint64(k)<<48, nil
}

// hashGens is the generations a script op (or EXEC) handed its new hashes.
type hashGens struct {
	next  uint32   // the next number k (newHashGen)
	taken []uint32 // numbers read back from the op's own records (ownGen)
}

// ownGen notes a live hash of generation gen read at version ver by op (at
// version): one of op's own creation, read back in a crash replay, takes its
// number out of the ones newHashGen hands out.
func ownGen(op *Op, version, ver, gen uint64) {
	const low = 1<<48 - 1
	if op.scriptGens == nil || ver != version || gen&low != version&low {
		return
	}
	if k := uint32(gen >> 48); k >= op.scriptGens.next && !slices.Contains(op.scriptGens.taken, k) {
		op.scriptGens.taken = append(op.scriptGens.taken, k)
	}
}

// read reads op.Key's hash as a write at version finds it (a new one, of
// a generation no other hash had, if the key holds nothing). Into *h, not
// returned: a hashState returned by value was ~25 instructions of a
// pipelined HSET.
func (h *hashState) read(get Getter, op *Op, version uint64) error {
	// lookup's read and expiry rule, without its call: the call and its
	// six results were ~30 instructions of a pipelined HSET
	// (docs/design/hashes.md, "Pipelined, session 28").
	data, meta, ver, live, err := get(op.Key)
	if err != nil {
		return err
	}
	if live && Expired(meta, op.Now) {
		live = false
	}
	if !live {
		// A new hash: a generation no other hash had.
		gen, err := newHashGen(op, version)
		if err != nil {
			return err
		}
		*h = hashState{gen: gen, ver: ver, created: true}
		return nil
	}
	if MetaType(meta) != TypeHash {
		return ErrWrongKind
	}
	gen, n, err := decodeHashMeta(data)
	if err != nil {
		return err
	}
	ownGen(op, version, ver, gen)
	*h = hashState{live: true, gen: gen, n: n, expireAt: ExpireAt(meta), ver: ver}
	return nil
}

// field reads the row whose key is row (only a live hash has rows).
func (h *hashState) field(get Getter, row []byte) ([]byte, bool, error) {
	if !h.live {
		return nil, false, nil
	}
	data, _, _, ok, err := get(row)
	return data, ok, err
}

// exists reports whether the row whose key is row exists, through has if
// the caller gave one (no read of the row's value), else through get.
func (h *hashState) exists(get Getter, has Prober, row []byte) (bool, error) {
	if !h.live {
		return false, nil
	}
	if has != nil {
		return has(row)
	}
	_, _, _, ok, err := get(row)
	return ok, err
}

// hashRow is a field row a write emits: its key (the row's, not the
// field's) and its value; value nil deletes it.
type hashRow struct{ key, value []byte }

// rowKeys lays out the row keys of fields in one allocation, with room
// after them for the metadata record's value (emit takes it from there):
// an HSET's records then cost one allocation, not one per key.
type rowKeys struct{ buf []byte }

func newRowKeys(fields [][]byte, step int, scratch *[]byte) rowKeys {
	n := hashMetaMax
	for i := 0; i < len(fields); i += step {
		n += len(hashRows) + 8 + len(fields[i])
	}
	return rowKeysOf(n, scratch)
}

// rowKeysOf is newRowKeys of n bytes.
func rowKeysOf(n int, scratch *[]byte) rowKeys {
	if scratch != nil {
		return rowKeys{buf: takeScratch(scratch, n)}
	}
	return rowKeys{buf: make([]byte, 0, n)}
}

// takeScratch takes n bytes from the end of the arena *a
// (ApplyOptions.Scratch): length 0, capacity n. An arena without room is
// replaced by a larger one, never grown in place: the records emitted
// before point into the old one.
func takeScratch(a *[]byte, n int) []byte {
	b := *a
	if cap(b)-len(b) < n {
		b = make([]byte, 0, max(2*cap(b), 4<<10, n))
	}
	start := len(b)
	*a = b[:start+n]
	return b[start : start : start+n]
}

// key returns the row key of field (capacity-limited: the next key shares
// the buffer).
func (r *rowKeys) key(gen uint64, field []byte) []byte {
	start := len(r.buf)
	r.buf = appendHashRowKey(r.buf, gen, field)
	return r.buf[start:len(r.buf):len(r.buf)]
}

// emit emits the hash's metadata record (n fields; none deletes the key),
// then, if the op at version created the generation, its marker, then its
// rows; keys has room for the metadata's value. (A replay that reads the
// op's own metadata record finds gen == version too, so it restages a
// marker the crash lost.)
func (h *hashState) emit(emit Emit, key []byte, version uint64, rows []hashRow, keys *rowKeys) {
	if h.n <= 0 {
		emit(key, nil, nil, true)
	} else {
		meta := hashTypeMeta
		if h.expireAt != 0 {
			meta = EncodeMeta(TypeHash, h.expireAt)
		}
		start := len(keys.buf)
		keys.buf = appendHashMeta(keys.buf, h.gen, h.n)
		put(emit, key, keys.buf[start:len(keys.buf):len(keys.buf)], meta)
		if h.created || h.gen == version {
			// (gen == version: a replay that read this op's own metadata
			// record restages the marker a crash lost. A script's later
			// hashes, version + k<<48, do not: a lost marker of theirs
			// leaves their rows to FLUSHDB once dead.)
			put(emit, hashMarker(h.gen), key, nil)
		}
	}
	emitRows(emit, rows)
}

// emitRows emits a hash write's field rows (value nil: a deletion).
func emitRows(emit Emit, rows []hashRow) {
	for _, r := range rows {
		if r.value == nil {
			emit(r.key, nil, nil, true)
		} else {
			put(emit, r.key, r.value, nil)
		}
	}
}

// HashMeta is a live hash's metadata record without an expiry, decoded:
// what the single node's writer keeps of the hash its HSETs write, so that
// an HSET of one field neither reads nor decodes the record
// (shard.hsetFast). Only a hash without an expiry: one with an expiry is
// judged at each op's clock, which the generic path does.
type HashMeta struct {
	Gen uint64 // the generation its rows' keys carry
	N   int64  // its field count
	Ver uint64 // the version of the record it was decoded from, or of the one written since
	pre [hashRowPre]byte
}

// hashRowPre is the length of the part of a row's key before its field:
// hashRows and the generation (TestHashRowPreIsTheRowKeysHead).
const hashRowPre = 18

// LiveHashMeta decodes key's record as a Getter answered it (data, meta,
// version, ok): ok if it is a hash without an expiry, whatever the clock.
func LiveHashMeta(data, meta []byte, ver uint64, live bool) (m HashMeta, ok bool) {
	if !live || MetaType(meta) != TypeHash || ExpireAt(meta) != 0 {
		return HashMeta{}, false
	}
	gen, n, err := decodeHashMeta(data)
	if err != nil || n <= 0 {
		return HashMeta{}, false
	}
	m = HashMeta{Gen: gen, N: n, Ver: ver}
	appendHashRowKey(m.pre[:0], gen, nil)
	return m, true
}

// RowKey returns the key of field's row, taken from the arena *scratch
// (ApplyOptions.Scratch's, by takeScratch, inlined), its head copied from
// m: appendHashRowKey's three appends, each with its capacity check and a
// call of memmove, were ~40 instructions of a pipelined HSET.
func (m *HashMeta) RowKey(scratch *[]byte, field []byte) []byte {
	n := hashRowPre + len(field)
	b := takeScratch(scratch, n)[:n]
	*(*[hashRowPre]byte)(b) = m.pre
	copy(b[hashRowPre:], field)
	return b
}

// Record returns the value and meta of the metadata record of the hash m
// describes, the value taken from the arena *scratch.
func (m *HashMeta) Record(scratch *[]byte) (value, meta []byte) {
	return appendHashMeta(takeScratch(scratch, hashMetaMax), m.Gen, m.N), hashTypeMeta
}

// ReplayReadsOwnRecord reports whether a replica replaying an op of kind k
// after a crash, finding that the engine holds the op's own record of a key
// and nothing older (retention dropped the state before the op), must read
// that record rather than absence. A hash write must: the keys of the rows
// it writes derive from the generation in its hash's metadata record, which
// the op's own record carries unchanged (or, for a hash the op created, as
// the op's version), so reading it restages the rows a crash lost under
// their real keys. (The other ops read such a key as absent: their records
// of it are skipped, and absence is what lets an all-or-nothing op such as
// MSETNX restage its other keys.) So must a script, of a hash's record
// (meta is the own record's: a script may write hashes and strings alike).
func ReplayReadsOwnRecord(k Kind, meta []byte) bool {
	return isHashWrite(k) || (RunsCommands(k) && MetaType(meta) == TypeHash)
}

// ApplyHash evaluates the hash writes (HSET, HDEL, HINCRBY, HINCRBYFLOAT,
// the sweeper's; any other kind is ErrInvalidOp) for ApplyWithOptions and
// Apply; the single node's writer calls it for HSET directly, as it calls
// Apply for SET — ApplyWithOptions's dispatch and its nine arguments were
// ~60 instructions of a pipelined HSET (docs/design/hashes.md, "Pipelined,
// session 25"). has (nil: get answers) tells whether a field row exists
// where its value is not needed. With ApplyOptions.SparseHashMeta a write
// that leaves the metadata as it was emits only its rows. The lock rule
// of cross-group transactions applies as in Apply (txLockGate) unless
// o.NoTxLocks.
func ApplyHash(get Getter, has Prober, version uint64, op *Op, emit Emit, o ApplyOptions) (res Result, err error) {
	err = ApplyHashTo(get, has, version, op, emit, o, &res)
	return res, err
}

// ApplyHashTo is ApplyHash with its result written in *res (zero on
// entry), not returned: the single node's writer passes its request's
// own Result, where each return of the 96-byte Result (ApplyHash's, then
// the writer's apply's, then its assignment) copied it once more, ~40
// instructions of a pipelined HSET (docs/design/hashes.md, "Pipelined,
// session 28"). The lock gate and the evaluation are one function, and an
// HSET skips the checks of the other kinds: the call past the gate and
// those checks were ~20 instructions of a pipelined HSET
// (docs/design/hashes.md, "Pipelined, session 31").
func ApplyHashTo(get Getter, has Prober, version uint64, op *Op, emit Emit, o ApplyOptions, res *Result) (err error) {
	if !o.NoTxLocks {
		if r, err, locked := txLockGate(get, op); locked {
			*res = r
			return err
		}
	}
	if op.Kind != KindHSet {
		if !isHashWrite(op.Kind) {
			return fmt.Errorf("%w: %v is not a hash write", ErrInvalidOp, op.Kind)
		}
		if op.Kind == KindHSweep {
			*res, err = applyHashSweep(get, version, op, emit)
			return err
		}
	}
	if err := CheckKey(op.Key); err != nil {
		return err
	}
	if len(op.Keys) == 0 || (op.Kind == KindHSet && len(op.Keys)%2 != 0) {
		return fmt.Errorf("%w: %v needs fields", ErrInvalidOp, op.Kind)
	}
	if op.Kind == KindHIncrByFloat {
		inc, ok := ParseLongDouble(op.Value)
		if !ok {
			return ErrNotFloat // Redis checks the increment first
		}
		if inc.IsInf() {
			return ErrHashNaN
		}
	}
	var h hashState
	if err := h.read(get, op, version); err != nil {
		return err
	}
	// The metadata record is emitted first, then the rows: an engine that
	// recovers a prefix of an op's records after a crash then holds the
	// metadata of any op whose rows it holds, and a replay that finds only
	// that record reads the generation from it (ReplayReadsOwnRecord).
	//
	// Each kind in a function of its own, writing its result in place (a
	// Result is 96 bytes, and each return copied it): in one function of
	// every kind the HSET's few steps compiled to spills around a frame of
	// ~1.6 KB, and the append of its one row alone was ~45 instructions
	// (docs/design/hashes.md, "Pipelined, session 25").
	switch op.Kind {
	case KindHSet:
		return h.set(get, has, version, op, emit, o, res)
	case KindHDel:
		return h.del(get, has, version, op, emit, o, res)
	default: // KindHIncrBy, KindHIncrByFloat
		return h.incr(get, version, op, emit, o, res)
	}
}

// applyHash is ApplyHash past the lock gate (its callers in this package
// passed it).
func applyHash(get Getter, has Prober, version uint64, op *Op, emit Emit, o ApplyOptions) (Result, error) {
	o.NoTxLocks = true
	var res Result
	err := ApplyHashTo(get, has, version, op, emit, o, &res)
	return res, err
}

// set is HSET, HMSET (op.Delta 1: answers OK) and HSETNX (op.Cond
// IfAbsent) on the hash h read, its result in *res. One field, the
// commonest write of a hash, takes the steps of setMany's loop without it:
// its duplicate check, its list of rows (zeroed at every call, being on
// the stack) and its bookkeeping were ~120 instructions of a pipelined
// HSET (docs/design/hashes.md, "Pipelined, session 25").
// TestHSetOfOneFieldAgreesWithTheLoop holds the two to one another.
func (h *hashState) set(get Getter, has Prober, version uint64, op *Op, emit Emit, o ApplyOptions, res *Result) error {
	if len(op.Keys) != 2 {
		return h.setMany(get, has, version, op, emit, o, res)
	}
	keys := rowKeysOf(hashMetaMax+len(hashRows)+8+len(op.Keys[0]), o.Scratch) // newRowKeys's sum, of one field
	row := keys.key(h.gen, op.Keys[0])
	exists, err := h.exists(get, has, row)
	if err != nil {
		return err
	}
	switch {
	case exists && op.Cond == IfAbsent:
		*res = Result{Kind: ResInt, Int: 0, Version: h.ver}
		return nil
	case exists && o.SparseHashMeta: // exists: the hash is live
		put(emit, row, op.Keys[1], nil) // count, generation and expiry stay
	default:
		var added int64
		if !exists {
			added = 1
		}
		h.n += added
		rows := [1]hashRow{{key: row, value: op.Keys[1]}}
		h.emit(emit, op.Key, version, rows[:], &keys)
		if op.Delta != 1 {
			*res = Result{Kind: ResInt, Int: added, Version: version}
			return nil
		}
	}
	if op.Delta == 1 {
		*res = Result{Kind: ResOK, Version: version}
		return nil
	}
	*res = Result{Kind: ResInt, Int: 0, Version: version}
	return nil
}

// setMany is set of any number of fields.
func (h *hashState) setMany(get Getter, has Prober, version uint64, op *Op, emit Emit, o ApplyOptions, res *Result) error {
	var added int64
	keys := newRowKeys(op.Keys, 2, o.Scratch)
	rows := make([]hashRow, 0, 4) // on the stack (zeroing eight cost an HSET ~25 instructions)
	for i := 0; i < len(op.Keys); i += 2 {
		if dupAfter(op.Keys, i) {
			continue // HSET h f 1 f 2: one row, the last value
		}
		row := keys.key(h.gen, op.Keys[i])
		exists, err := h.exists(get, has, row)
		if err != nil {
			return err
		}
		if exists && op.Cond == IfAbsent {
			*res = Result{Kind: ResInt, Int: 0, Version: h.ver}
			return nil
		}
		if !exists {
			added++
		}
		rows = append(rows, hashRow{key: row, value: op.Keys[i+1]})
	}
	if o.SparseHashMeta && h.live && added == 0 {
		emitRows(emit, rows) // count, generation and expiry stay
	} else {
		h.n += added
		h.emit(emit, op.Key, version, rows, &keys)
	}
	if op.Delta == 1 {
		*res = Result{Kind: ResOK, Version: version}
	} else {
		*res = Result{Kind: ResInt, Int: added, Version: version}
	}
	return nil
}

// del is HDEL on the hash h read, its result in *res.
func (h *hashState) del(get Getter, has Prober, version uint64, op *Op, emit Emit, o ApplyOptions, res *Result) error {
	if !h.live {
		*res = Result{Kind: ResInt, Int: 0, Version: h.ver}
		return nil
	}
	var removed int64
	rows := make([]hashRow, 0, 4)
	keys := newRowKeys(op.Keys, 1, o.Scratch)
	for i, f := range op.Keys {
		if dupBefore(op.Keys, i) {
			continue
		}
		row := keys.key(h.gen, f)
		exists, err := h.exists(get, has, row)
		if err != nil {
			return err
		}
		if exists {
			removed++
			rows = append(rows, hashRow{key: row}) // a deletion
		}
	}
	if removed == 0 {
		*res = Result{Kind: ResInt, Int: 0, Version: h.ver}
		return nil
	}
	h.n -= removed
	h.emit(emit, op.Key, version, rows, &keys)
	*res = Result{Kind: ResInt, Int: removed, Version: version}
	return nil
}

// incr is HINCRBY and HINCRBYFLOAT on the hash h read, its result in *res.
func (h *hashState) incr(get Getter, version uint64, op *Op, emit Emit, o ApplyOptions, res *Result) error {
	keys := newRowKeys(op.Keys[:1], 1, o.Scratch)
	row := keys.key(h.gen, op.Keys[0])
	old, exists, err := h.field(get, row)
	if err != nil {
		return err
	}
	var nv []byte
	r := Result{Version: version}
	if op.Kind == KindHIncrBy {
		cur, err := addInt(old, exists, op.Delta, ErrHashNotInt)
		if err != nil {
			return err
		}
		nv = strconv.AppendInt(nil, cur, 10)
		r.Kind, r.Int = ResInt, cur
	} else {
		if nv, err = addLongDouble(old, exists, op.Value, ErrHashNotFloat); err != nil {
			return err
		}
		r.Kind, r.Bulk = ResBulk, nv
	}
	nrows := []hashRow{{key: row, value: nv}}
	if o.SparseHashMeta && exists { // exists: the hash is live
		emitRows(emit, nrows)
	} else {
		if !exists {
			h.n++
		}
		h.emit(emit, op.Key, version, nrows, &keys)
	}
	*res = r
	return nil
}

// PointRange reports whether a scan of [start, end) for at most limit keys
// reads the one key start: end is start followed by a zero byte, the next
// key. An HGET reads each field's row so (a read's Getter hides reserved
// keys); a Scanner may serve it as a point lookup of start, which costs less
// than a scan (internal/shard's does).
func PointRange(start, end []byte, limit int) bool {
	n := len(start)
	return limit == 1 && len(end) == n+1 && end[n] == 0 && bytes.Equal(start, end[:n])
}

// AppendHashFieldRow appends to dst the key of field's row in the hash whose
// live metadata record is (data, meta), for a reader that serves a one-field
// HGET itself as Read would (the single node's fast path, shard.hgetField):
// ErrWrongKind for a key of another type.
func AppendHashFieldRow(dst, data, meta, field []byte) ([]byte, error) {
	if MetaType(meta) != TypeHash {
		return nil, ErrWrongKind
	}
	gen, _, err := decodeHashMeta(data)
	if err != nil {
		return nil, err
	}
	return appendHashRowKey(dst, gen, field), nil
}

// readHash serves the hash reads for Read: the metadata through get, the
// rows through scan (the Getter of a read hides reserved keys).
func readHash(get Getter, scan Scanner, op *Op) (Result, error) {
	if IsReserved(op.Key) {
		return Result{}, ErrReservedKey
	}
	data, meta, ver, live, _, err := lookup(get, op.Key, op.Now)
	if err != nil {
		return Result{}, err
	}
	res := Result{Version: ver}
	var gen uint64
	var n int64
	if live {
		if MetaType(meta) != TypeHash {
			return Result{}, ErrWrongKind
		}
		if gen, n, err = decodeHashMeta(data); err != nil {
			return Result{}, err
		}
	}
	switch op.Kind {
	case KindHLen:
		res.Kind, res.Int = ResInt, n
		return res, nil
	case KindHGet:
		res.Kind, res.Array = ResArray, make([][]byte, len(op.Keys))
		if !live {
			return res, nil
		}
		if scan == nil {
			return Result{}, fmt.Errorf("%w: a hash read needs the caller's scanner", ErrInvalidOp)
		}
		for i, f := range op.Keys {
			// A point range (PointRange), which a scanner may serve as a
			// lookup of the row rather than a scan.
			end := append(appendHashRowKey(make([]byte, 0, len(hashRows)+8+len(f)+1), gen, f), 0)
			row := end[:len(end)-1]
			err := scan(row, end, 1, func(k, v, _ []byte, version uint64) bool {
				if bytes.Equal(k, row) {
					res.Array[i] = v
					if res.Array[i] == nil {
						res.Array[i] = []byte{}
					}
					res.Version = max(res.Version, version)
				}
				return false
			})
			if err != nil {
				return Result{}, err
			}
		}
		return res, nil
	case KindHGetAll, KindHScan:
		res.Kind, res.Array = ResArray, [][]byte{}
		if !live {
			return res, nil
		}
		if scan == nil {
			return Result{}, fmt.Errorf("%w: a hash read needs the caller's scanner", ErrInvalidOp)
		}
		p := HashRowPrefix(gen)
		start, limit := p, 0
		if op.Kind == KindHScan {
			start, limit = append(p[:len(p):len(p)], op.Value...), max(op.Limit, 1)
		}
		err := scan(start, PrefixEnd(p), limit, func(k, v, _ []byte, version uint64) bool {
			if v == nil {
				v = []byte{}
			}
			res.Array = append(res.Array, k[len(p):], v)
			res.Version = max(res.Version, version)
			return true
		})
		if err != nil {
			return Result{}, err
		}
		return res, nil
	}
	return Result{}, fmt.Errorf("%w: %v is not a hash read", ErrInvalidOp, op.Kind)
}

// copyHash is COPY of the hash rec at op.Keys[0] to op.Keys[1] (whose
// existence applyMove has checked): a new hash of generation version with
// the source's expiry and a row per field, which list and get read. It costs
// O(fields) in the one op, bounded by MaxHashCopyFields and
// MaxHashCopyBytes (ErrHashCopyTooBig past them); a hash that COPY REPLACE
// overwrites dies like one SET overwrites (its rows are the sweeper's).
func copyHash(get Getter, list Lister, version uint64, op *Op, rec record, srcVer uint64, emit Emit) (Result, error) {
	if list == nil {
		return Result{}, fmt.Errorf("%w: COPY of a hash needs the caller's key lister (ApplyWith)", ErrInvalidOp)
	}
	gen, _, err := decodeHashMeta(rec.data)
	if err != nil {
		return Result{}, err
	}
	dstGen, err := newHashGen(op, version)
	if err != nil {
		return Result{}, err
	}
	p := HashRowPrefix(gen)
	var rows []hashRow
	size := 0
	var gerr error
	err = list(p, PrefixEnd(p), func(k []byte) bool {
		if !bytes.HasPrefix(k, p) {
			return true // a lister may hand out a superset
		}
		data, _, _, ok, err := get(k)
		if err != nil {
			gerr = err
			return false
		}
		if !ok {
			return true
		}
		size += len(k) + len(data)
		if len(rows) >= MaxHashCopyFields || size > MaxHashCopyBytes {
			gerr = ErrHashCopyTooBig
			return false
		}
		if data == nil {
			data = []byte{}
		}
		rows = append(rows, hashRow{key: appendHashRowKey(nil, dstGen, k[len(p):]), value: data})
		return true
	})
	if err == nil {
		err = gerr
	}
	if err != nil {
		return Result{}, err
	}
	if len(rows) == 0 {
		// Metadata without rows is no hash (a torn write on an engine
		// without batch atomicity): nothing to copy.
		return Result{Kind: ResInt, Int: 0, Version: srcVer}, nil
	}
	dst := hashState{live: true, created: true, gen: dstGen, n: int64(len(rows)), expireAt: ExpireAt(rec.meta)}
	keys := rowKeys{buf: make([]byte, 0, hashMetaMax)} // room for the metadata's value
	dst.emit(emit, op.Keys[1], version, rows, &keys)
	return Result{Kind: ResInt, Int: 1, Version: version}, nil
}

// SweepLast is the Value of a KindHSweep op that deletes a dead
// generation's last rows and then its marker.
var SweepLast = []byte{1}

// HashSweepOp is the op the sweeper proposes for the dead generation gen
// whose marker names key: delete the rows of fields, and the marker too if
// last (they are the generation's last rows). The op rechecks at apply that
// the generation is dead (applyHashSweep), as KindExpireIfDue rechecks
// expiry, so a proposal made from a stale view deletes nothing live.
func HashSweepOp(key []byte, gen uint64, fields [][]byte, last bool) Op {
	op := Op{Kind: KindHSweep, Key: key, Delta: int64(gen), Keys: fields}
	if last {
		op.Value = SweepLast
	}
	return op
}

// HashRowField splits a row key into its generation and field.
func HashRowField(key []byte) (gen uint64, field []byte, ok bool) {
	if !IsHashRow(key) || len(key) < len(hashRows)+8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(key[len(hashRows):]), key[len(hashRows)+8:], true
}

// HashGenDead reports whether generation gen, whose marker names key, is
// dead in the state get reads: key holds no stored hash of that generation.
// An expired hash still stored counts as live — active expiry deletes its
// metadata first — so that no replica (a follower reading with its own
// clock) finds metadata whose rows are gone. Death is final: no op writes
// rows of a generation its key does not hold, and generations are never
// handed out twice.
func HashGenDead(get Getter, key []byte, gen uint64) (bool, error) {
	data, meta, _, ok, err := get(key)
	if err != nil {
		return false, err
	}
	if !ok || MetaType(meta) != TypeHash {
		return true, nil
	}
	g, _, err := decodeHashMeta(data)
	if err != nil {
		return false, err
	}
	return g != gen, nil
}

// applyHashSweep is KindHSweep: it deletes what it was given only if the
// generation's marker still names op.Key (RENAME moves a hash, and rewrites
// its marker, between the proposal and here) and that key does not hold
// the generation. Result: how many rows it deleted.
func applyHashSweep(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	gen := uint64(op.Delta)
	mk := hashMarker(gen)
	named, _, mver, ok, err := get(mk)
	if err != nil {
		return Result{}, err
	}
	if !ok || !bytes.Equal(named, op.Key) {
		return Result{Kind: ResInt, Int: 0, Version: mver}, nil
	}
	dead, err := HashGenDead(get, op.Key, gen)
	if err != nil || !dead {
		return Result{Kind: ResInt, Int: 0, Version: mver}, err
	}
	var n int64
	for i, f := range op.Keys {
		if dupBefore(op.Keys, i) {
			continue
		}
		row := hashRowKey(gen, f)
		_, _, _, ok, err := get(row)
		if err != nil {
			return Result{}, err
		}
		if ok {
			emit(row, nil, nil, true)
			n++
		}
	}
	if bytes.Equal(op.Value, SweepLast) {
		emit(mk, nil, nil, true)
	}
	return Result{Kind: ResInt, Int: n, Version: version}, nil
}

// HashGen returns the generation a hash's metadata record (its user key's
// value) names: its field rows are under HashRowPrefix(gen).
func HashGen(data []byte) (uint64, error) {
	gen, _, err := decodeHashMeta(data)
	return gen, err
}
