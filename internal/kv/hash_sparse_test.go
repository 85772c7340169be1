package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"testing"
)

// With ApplyOptions.SparseHashMeta a hash write answers the same and leaves
// a state every read answers the same from as without (a read's version
// may be older: an HGET of a field the write did not touch no longer sees
// its metadata record; one of a field it wrote sees the row's version),
// over random histories (randomHashOp); and it writes fewer records.
func TestSparseHashMetaAgreesWithDense(t *testing.T) {
	rng := rand.New(rand.NewSource(28))
	var denseRecs, sparseRecs int
	for run := 0; run < 50; run++ {
		dense, sparse := mem{}, mem{}
		for ver := uint64(2); ver < 200; ver++ {
			op := randomHashOp(rng, ver)
			key, now := op.Key, op.Now
			apply := func(m mem, sparse bool) (string, uint64, int) {
				n := 0
				emit := func(key, value, meta []byte, tomb bool) {
					m[string(key)] = memVal{val: string(value), ver: ver, del: tomb, meta: meta}
					n++
				}
				o := ApplyOptions{SparseHashMeta: sparse}
				if sparse && isHashWrite(op.Kind) {
					// The single node's entry (ApplyHash) on the sparse side.
					res, err := ApplyHash(m.get, m.has, ver, &op, emit, o)
					return show(res, err), res.Version, n
				}
				res, err := ApplyWithOptions(m.get, nil, m.has, ver, &op, 0, emit, o)
				return show(res, err), res.Version, n
			}
			// A write that writes nothing (HDEL of absent fields, HSETNX
			// of a present one) answers its metadata's version, which may
			// be older sparse.
			want, wv, nd := apply(dense, false)
			got, gv, ns := apply(sparse, true)
			denseRecs, sparseRecs = denseRecs+nd, sparseRecs+ns
			if got != want || gv > wv || (ns > 0 && gv != ver) {
				t.Fatalf("run %d, %v %q %q at %d: sparse %s v%d, dense %s v%d", run, op.Kind, op.Key, op.Keys, ver, got, gv, want, wv)
			}
			for _, rd := range []Op{
				{Kind: KindHGet, Key: key, Keys: bs("f0", "f1", "f2", "f3", "f4", "f5", "n", "x")},
				{Kind: KindHGet, Key: key, Keys: bs(fmt.Sprint("f", rng.Intn(6)))},
				{Kind: KindHLen, Key: key},
				{Kind: KindHGetAll, Key: key},
				{Kind: KindTTL, Key: key},
			} {
				rd.Now = now
				read := func(m mem) (string, uint64) {
					res, err := Read(m.get, m.scan, &rd, 1000)
					return show(res, err), res.Version
				}
				// The version of what a read saw may be older sparse: an
				// HGET of a field the write did not touch no longer sees
				// the write's metadata record.
				got, gv := read(sparse)
				want, wv := read(dense)
				if got != want || gv > wv {
					t.Fatalf("run %d, after %v %q %q at %d: %v %q reads %s v%d sparse, %s v%d dense", run, op.Kind, op.Key, op.Keys, ver, rd.Kind, rd.Keys, got, gv, want, wv)
				}
			}
		}
	}
	if sparseRecs >= denseRecs {
		t.Fatalf("sparse wrote %d records, dense %d: it should write fewer", sparseRecs, denseRecs)
	}
}

// With SparseHashMeta an HSET or HINCRBY of fields that all exist writes
// only their rows; one that adds a field, or creates the hash, writes the
// metadata too.
func TestSparseHashMetaWritesOnlyRows(t *testing.T) {
	m := mem{}
	ver := uint64(1)
	write := func(op Op) []string {
		ver++
		op.Now = 1000
		var keys []string
		if _, err := ApplyWithOptions(m.get, nil, m.has, ver, &op, 0, func(key, value, meta []byte, tomb bool) {
			m[string(key)] = memVal{val: string(value), ver: ver, del: tomb, meta: meta}
			keys = append(keys, string(key))
		}, ApplyOptions{SparseHashMeta: true}); err != nil {
			t.Fatalf("%v: %v", op.Kind, err)
		}
		return keys
	}
	k := []byte("h")
	for _, c := range []struct {
		op   Op
		meta bool
		rows int
	}{
		{Op{Kind: KindHSet, Key: k, Keys: bs("a", "1", "b", "2")}, true, 2}, // creates: meta, marker, rows
		{Op{Kind: KindHSet, Key: k, Keys: bs("a", "3")}, false, 1},
		{Op{Kind: KindHSet, Key: k, Keys: bs("a", "4", "b", "5"), Delta: 1}, false, 2},
		{Op{Kind: KindHSet, Key: k, Keys: bs("a", "4", "c", "5")}, true, 2},
		{Op{Kind: KindHIncrBy, Key: k, Keys: bs("n"), Delta: 1}, true, 1},
		{Op{Kind: KindHIncrBy, Key: k, Keys: bs("n"), Delta: 1}, false, 1},
		{Op{Kind: KindHIncrByFloat, Key: k, Keys: bs("n"), Value: []byte("1.5")}, false, 1},
		{Op{Kind: KindHDel, Key: k, Keys: bs("a")}, true, 1},
	} {
		keys := write(c.op)
		var meta bool
		rows := 0
		for _, key := range keys {
			switch {
			case key == string(k):
				meta = true
			case IsHashRow([]byte(key)):
				rows++
			}
		}
		if meta != c.meta || rows != c.rows {
			t.Errorf("%v %q wrote %q: metadata %v and %d rows, want %v and %d", c.op.Kind, c.op.Keys, keys, meta, rows, c.meta, c.rows)
		}
	}
}

// ApplyHash takes hash writes only: any other kind is refused, not
// evaluated as a hash write of its key.
func TestApplyHashRefusesOtherKinds(t *testing.T) {
	m := mem{}
	for _, op := range []Op{
		{Kind: KindSet, Key: []byte("k"), Value: []byte("v")},
		{Kind: KindHGet, Key: []byte("h"), Keys: bs("f")},
	} {
		_, err := ApplyHash(m.get, m.has, 2, &op, func(key, value, meta []byte, tomb bool) {
			t.Fatalf("%v emitted %q", op.Kind, key)
		}, ApplyOptions{})
		if !errors.Is(err, ErrInvalidOp) {
			t.Fatalf("ApplyHash of %v: %v, want ErrInvalidOp", op.Kind, err)
		}
	}
}

// An HSET, HMSET or HSETNX of one field takes its own path (set), not the
// loop of several fields (setMany); the two must write the same records
// and answer the same. The same op with its field named twice (f v f v:
// one row, the last value) takes the loop, so random histories
// (randomHashOp) applied each way, sparse and dense, must agree record for
// record.
func TestHSetOfOneFieldAgreesWithTheLoop(t *testing.T) {
	rng := rand.New(rand.NewSource(25))
	type rec struct {
		key, value, meta string
		tomb             bool
	}
	ones := 0
	for run := 0; run < 100; run++ {
		sparse := run%2 == 0
		one, loop := mem{}, mem{}
		for ver := uint64(2); ver < 100; ver++ {
			op := randomHashOp(rng, ver)
			twice := op
			if op.Kind == KindHSet && len(op.Keys) == 2 {
				twice.Keys = [][]byte{op.Keys[0], []byte("first"), op.Keys[0], op.Keys[1]}
				ones++
			}
			apply := func(m mem, op *Op) (string, uint64, []rec) {
				var recs []rec
				res, err := ApplyWithOptions(m.get, nil, m.has, ver, op, 0, func(key, value, meta []byte, tomb bool) {
					m[string(key)] = memVal{val: string(value), ver: ver, del: tomb, meta: meta}
					recs = append(recs, rec{string(key), string(value), string(meta), tomb})
				}, ApplyOptions{SparseHashMeta: sparse})
				return show(res, err), res.Version, recs
			}
			got, gv, grecs := apply(one, &op)
			want, wv, wrecs := apply(loop, &twice)
			if got != want || gv != wv || fmt.Sprint(grecs) != fmt.Sprint(wrecs) {
				t.Fatalf("run %d (sparse %v), %v %q %q at %d: one field %s v%d %+v; the loop %s v%d %+v",
					run, sparse, op.Kind, op.Key, op.Keys, ver, got, gv, grecs, want, wv, wrecs)
			}
		}
	}
	if ones < 1000 {
		t.Fatalf("%d one-field HSETs: too few to compare", ones)
	}
}

// decodeHashMeta reads counts of up to three bytes inline and the rest with
// binary.Uvarint: both must agree with Uvarint on every count a metadata
// record may carry, around each byte boundary, and on truncated ones.
func TestDecodeHashMetaAgreesWithUvarint(t *testing.T) {
	rng := rand.New(rand.NewSource(21))
	var counts []uint64
	for shift := 0; shift < 64; shift += 7 {
		for _, d := range []int64{-2, -1, 0, 1, 2} {
			counts = append(counts, uint64(int64(1)<<shift+d))
		}
	}
	for i := 0; i < 10000; i++ {
		counts = append(counts, rng.Uint64()>>rng.Intn(64))
	}
	for _, n := range counts {
		full := appendHashMeta(nil, 0x0102030405060708, int64(n))
		for cut := 8; cut <= len(full); cut++ {
			b := full[:cut]
			gen, got, err := decodeHashMeta(b)
			c, k := binary.Uvarint(b[8:])
			if k <= 0 {
				if err == nil {
					t.Fatalf("count %d cut to %d bytes: decoded %d, want an error", n, cut, got)
				}
				continue
			}
			if err != nil || gen != 0x0102030405060708 || got != int64(c) {
				t.Fatalf("count %d cut to %d bytes: %x %d %v, want %d", n, cut, gen, got, err, c)
			}
		}
	}
}

// Every hash write refuses what it refused before ApplyHashTo gave HSET an
// entry of its own (past the other kinds' checks): an empty key, a reserved
// one (the front door checks neither for a hash write, so this is what keeps
// a client's HSET off the store's own records: hash markers and rows, lock
// records), and an HSET with a field missing its value — on each entry:
// ApplyHash (the lock gate), ApplyHashTo with the single node's options
// (internal/shard's HSET) and Apply (applyHash, past the gate). Nothing is
// emitted.
func TestHashWritesRefuseBadKeysOnEveryEntry(t *testing.T) {
	reserved := string(ReservedKey("x"))
	ops := func(key string) []Op {
		k := []byte(key)
		return []Op{
			{Kind: KindHSet, Key: k, Keys: bs("f", "v")},
			{Kind: KindHSet, Key: k, Keys: bs("f", "v", "g", "w")},
			{Kind: KindHSet, Key: k, Keys: bs("f", "v"), Delta: 1},       // HMSET
			{Kind: KindHSet, Key: k, Keys: bs("f", "v"), Cond: IfAbsent}, // HSETNX
			{Kind: KindHDel, Key: k, Keys: bs("f")},
			{Kind: KindHIncrBy, Key: k, Keys: bs("f"), Delta: 1},
			{Kind: KindHIncrByFloat, Key: k, Keys: bs("f"), Value: []byte("1.5")},
		}
	}
	type entry struct {
		name  string
		apply func(m mem, op *Op, emit Emit) error
	}
	var scratch []byte
	entries := []entry{
		{"ApplyHash", func(m mem, op *Op, emit Emit) error {
			_, err := ApplyHash(m.get, m.has, 2, op, emit, ApplyOptions{})
			return err
		}},
		{"ApplyHashTo (single node)", func(m mem, op *Op, emit Emit) error {
			var res Result
			return ApplyHashTo(m.get, m.has, 2, op, emit, ApplyOptions{SparseHashMeta: true, Scratch: &scratch, NoTxLocks: true}, &res)
		}},
		{"Apply", func(m mem, op *Op, emit Emit) error {
			_, err := Apply(m.get, 2, op, 0, emit)
			return err
		}},
	}
	cases := []struct {
		key  string
		want error
	}{{"", ErrInvalidOp}, {reserved, ErrReservedKey}}
	for _, e := range entries {
		for _, c := range cases {
			for _, op := range ops(c.key) {
				m := mem{}
				err := e.apply(m, &op, func(key, _, _ []byte, _ bool) {
					t.Errorf("%s of %v %q emitted %q", e.name, op.Kind, c.key, key)
				})
				if !errors.Is(err, c.want) {
					t.Errorf("%s of %v %q (fields %q): %v, want %v", e.name, op.Kind, c.key, op.Keys, err, c.want)
				}
			}
		}
		op := Op{Kind: KindHSet, Key: []byte("h"), Keys: bs("f", "v", "g")}
		err := e.apply(mem{}, &op, func(key, _, _ []byte, _ bool) {
			t.Errorf("%s of an HSET of fields %q emitted %q", e.name, op.Keys, key)
		})
		if !errors.Is(err, ErrInvalidOp) {
			t.Errorf("%s of an HSET of fields %q: %v, want ErrInvalidOp", e.name, op.Keys, err)
		}
	}
}
