// Package simkv is what the deterministic simulators need around the one
// state machine (internal/kv), kept once for both of them: internal/vr's
// core simulator and internal/vrshard's host simulator (TestHostSim).
//
//   - The mapping between the checkers' operations (check.Op, check.Result)
//     and kv's (kv.Op, kv.Result): which kv op executes a checker's write,
//     and how a kv result reads as the checker's result. Both simulators
//     judge their histories with internal/check, so both need it, and one
//     copy keeps them judging the same thing.
//   - Store, the in-memory engine a simulated VR core applies committed ops
//     to. The evaluation is kv's (kv.Apply, kv.Read); the ops and results
//     travel in kv's codec (kv.AppendOp in the log's entries, kv.AppendResult
//     in the core's client table: the bytes a vrshard replica keeps there).
//     What Store adds is what the storage engine is to a process: keys with
//     their records, and an image of them for snapshots and checkpoints.
//     The host simulator needs no Store: it runs the real engine.
//
// Like kv it is deterministic and does no I/O.
package simkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
)

// ---- the checkers' operations as kv ops ----

// ToKV is the kv op that executes the checker's write op. An expiry
// (check.Op.ExpireAt) is absolute, in ns on the recorder's clock; epoch is
// where that clock's zero is on the servers' wall clock (ns), and kv counts
// in unix ms (a PXAT).
func ToKV(op check.Op, epoch int64) kv.Op {
	key := []byte(op.Key)
	switch op.Kind {
	case check.Put:
		o := kv.Op{Kind: kv.KindSet, Key: key, Value: []byte(op.Value)}
		if op.ExpireAt != 0 {
			o.ExpireAt = (epoch + op.ExpireAt) / int64(time.Millisecond)
		}
		return o
	case check.Delete:
		return kv.Op{Kind: kv.KindDel, Keys: [][]byte{key}}
	case check.CAS:
		return kv.Op{Kind: kv.KindCAS, Key: key, Expected: []byte(op.Expect), Value: []byte(op.Value)}
	case check.Incr:
		return kv.Op{Kind: kv.KindIncrBy, Key: key, Delta: op.Delta}
	case check.Expire:
		return kv.Op{Kind: kv.KindExpire, Key: key, ExpireAt: (epoch + op.ExpireAt) / int64(time.Millisecond)}
	case check.Persist:
		return kv.Op{Kind: kv.KindPersist, Key: key}
	}
	panic(fmt.Sprintf("simkv: %v is not a write", op.Kind))
}

// AppendOp appends the checker's write op in kv's codec (a log entry's
// Data), stamped with the proposer's clock now (unix ms; 0: none, for runs
// without expiry): the only clock the state machine reads.
func AppendOp(b []byte, op check.Op, now int64) []byte {
	k := ToKV(op, 0)
	k.Now = now
	return kv.AppendOp(b, &k)
}

// WriteResult is how the checker reads a write's kv result: the version it
// wrote, whether a CAS swapped, an INCR's new value.
func WriteResult(kind check.Kind, res kv.Result) check.Result {
	out := check.Result{Found: true, Version: res.Version}
	switch kind {
	case check.CAS, check.Expire, check.Persist:
		out.Found = res.Int == 1
	case check.Incr:
		out.Value = strconv.FormatInt(res.Int, 10)
	}
	return out
}

// DecodeWrite reads a write's result as the core's client table holds it
// (kv.AppendResult) for the checker. The simulators' workloads have no op
// that fails (INCR has keys of its own) and their client protocols no
// error reply, so an op error is the caller's bug to report.
func DecodeWrite(kind check.Kind, b []byte) (check.Result, error) {
	res, opErr, err := kv.DecodeResult(b)
	if err != nil {
		return check.Result{}, fmt.Errorf("simkv: decode a %v result: %w", kind, err)
	}
	if opErr != nil {
		return check.Result{}, fmt.Errorf("simkv: the %v failed: %w", kind, opErr)
	}
	return WriteResult(kind, res), nil
}

// ReadResult is how the checker reads a GET's kv result.
func ReadResult(res kv.Result) check.Result {
	return check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Version: res.Version}
}

// TTLOp is the kv op of the checker's expiry read (check.TTL): a
// PEXPIRETIME, whose absolute answer TTLResult maps back to the recorder's
// clock (PTTL's would depend on the serving replica's clock).
func TTLOp(op check.Op) kv.Op {
	return kv.Op{Kind: kv.KindTTL, Key: []byte(op.Key), Delta: kv.UnitPExpireTime}
}

// TTLResult is how the checker reads a PEXPIRETIME's kv result: -2 absent,
// -1 live without expiry, else the expiry in unix ms, which epoch (as for
// ToKV) turns into ns on the recorder's clock.
func TTLResult(res kv.Result, epoch int64) check.Result {
	out := check.Result{Found: res.Int != -2, Version: res.Version}
	if res.Int >= 0 {
		out.ExpireAt = res.Int*int64(time.Millisecond) - epoch
	}
	return out
}

// ReadKey is a GET of key evaluated by kv.Read over get, deciding expiry at
// now (unix ms, the serving replica's clock; 0: nothing expires).
func ReadKey(get kv.Getter, key string, now int64) check.Result {
	res, err := kv.Read(get, nil, &kv.Op{Kind: kv.KindGet, Key: []byte(key), Now: now}, 0)
	if err != nil {
		panic(fmt.Sprintf("simkv: read %q: %v", key, err))
	}
	return ReadResult(res)
}

// ---- the in-memory engine ----

// Record is one key's state in a Store: a value (with its meta, kv.EncodeMeta:
// an expiry) or a deletion, and the version (op number) that wrote it.
type Record struct {
	Exists  bool
	Data    string
	Meta    string
	Version uint64
}

// Getter is the record as a kv.Getter of any key: a read of one record that
// is not (or not yet) in a Store, such as an acknowledged write a leader
// keeps in front of its state machine.
func (r Record) Getter() kv.Getter {
	return func([]byte) ([]byte, []byte, uint64, bool, error) {
		return []byte(r.Data), []byte(r.Meta), r.Version, r.Exists, nil
	}
}

// Store is a simulated replica's state machine state: what kv.Apply reads
// and its records update. The zero Store is empty and ready.
type Store struct {
	m map[string]Record
}

// Get is the store as a kv.Getter. A deleted key reports its deletion's
// version, so a read of it tells the checkers which write it saw.
func (s *Store) Get(key []byte) ([]byte, []byte, uint64, bool, error) {
	r := s.m[string(key)]
	return []byte(r.Data), []byte(r.Meta), r.Version, r.Exists, nil
}

// Record is key's record (the zero Record if the store never had it).
func (s *Store) Record(key string) Record { return s.m[key] }

// Put replaces key's record outside the state machine: only a test's
// mutation (a replica that changes its state on its own) does that.
func (s *Store) Put(key string, r Record) {
	if s.m == nil {
		s.m = map[string]Record{}
	}
	s.m[key] = r
}

// Keys returns the keys the store has a record of (deletions included), in
// order: a caller that acts on them must not depend on a map's order, or a
// run would not replay from its seed.
func (s *Store) Keys() []string { return slices.Sorted(maps.Keys(s.m)) }

// Apply executes the write op at version (the op number) with kv.Apply and
// keeps its records if it succeeded; an op that fails writes nothing.
func (s *Store) Apply(version uint64, op *kv.Op) (kv.Result, error) {
	type rec struct {
		key string
		r   Record
	}
	var recs []rec
	res, opErr := kv.Apply(s.Get, version, op, 0, func(key, value, meta []byte, tomb bool) {
		recs = append(recs, rec{string(key), Record{Exists: !tomb, Data: string(value), Meta: string(meta), Version: version}})
	})
	if opErr == nil {
		for _, x := range recs {
			s.Put(x.key, x.r)
		}
	}
	return res, opErr
}

// ApplyEntry executes a committed entry's Data (an op in kv's codec) at op
// number version and returns its result in kv's codec, for the core's client
// table. clock, if not 0, replaces the op's Now: the mutation of a state
// machine that reads its own clock instead of the proposer's.
func (s *Store) ApplyEntry(version uint64, data []byte, clock int64) []byte {
	op, err := kv.DecodeOp(data)
	if err != nil {
		panic(fmt.Sprintf("simkv: apply op %d: %v", version, err))
	}
	if clock != 0 {
		op.Now = clock
	}
	res, opErr := s.Apply(version, &op)
	return kv.AppendResult(nil, res, opErr)
}

// Image encodes the store for a snapshot or a checkpoint: its records in key
// order, so equal stores have equal images. Layout: count uvarint, then per
// key: key, exists byte, version uvarint, data, meta (byte strings as
// uvarint length + bytes).
func (s *Store) Image() []byte {
	var b []byte
	b = binary.AppendUvarint(b, uint64(len(s.m)))
	for _, k := range s.Keys() {
		r := s.m[k]
		b = kv.AppendBytes(b, []byte(k))
		x := byte(0)
		if r.Exists {
			x = 1
		}
		b = append(b, x)
		b = binary.AppendUvarint(b, r.Version)
		b = kv.AppendBytes(b, []byte(r.Data))
		b = kv.AppendBytes(b, []byte(r.Meta))
	}
	return b
}

// errImage: an image that does not decode.
var errImage = errors.New("simkv: corrupt store image")

// LoadImage returns the store an Image encoded.
func LoadImage(b []byte) (*Store, error) {
	d := kv.Decoder{B: b}
	n := d.Uvarint()
	if d.Err == nil && n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d keys in %d bytes", errImage, n, len(b))
	}
	s := &Store{m: make(map[string]Record, n)}
	for i := uint64(0); i < n && d.Err == nil; i++ {
		k := string(d.Bytes())
		r := Record{Exists: d.Byte() == 1, Version: d.Uvarint()}
		r.Data, r.Meta = string(d.Bytes()), string(d.Bytes())
		s.m[k] = r
	}
	if d.Err != nil {
		return nil, fmt.Errorf("%w: %w", errImage, d.Err)
	}
	return s, nil
}
