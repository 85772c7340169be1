package kv

import (
	"bytes"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

// has is mem's Prober: whether key holds a value, as get would say.
func (m mem) has(key []byte) (bool, error) {
	v, ok := m[string(key)]
	return ok && !v.del, nil
}

// A hash write given a Prober evaluates exactly as one without: the same
// results and the same records, over random histories (randomHashOp).
func TestHashProberAgreesWithGetter(t *testing.T) {
	rng := rand.New(rand.NewSource(27))
	for run := 0; run < 50; run++ {
		plain, probed := mem{}, mem{}
		for ver := uint64(2); ver < 200; ver++ {
			op := randomHashOp(rng, ver)
			type rec struct {
				key, value, meta string
				tomb             bool
			}
			apply := func(m mem, has Prober) ([]rec, string) {
				var recs []rec
				res, err := ApplyWith(m.get, nil, has, ver, &op, 0, func(key, value, meta []byte, tomb bool) {
					recs = append(recs, rec{string(key), string(value), string(meta), tomb})
				})
				for _, r := range recs {
					m[r.key] = memVal{val: r.value, ver: ver, del: r.tomb, meta: []byte(r.meta)}
				}
				return recs, fmt.Sprintf("%s v%d", show(res, err), res.Version)
			}
			wantRecs, want := apply(plain, nil)
			gotRecs, got := apply(probed, probed.has)
			if got != want || !reflect.DeepEqual(gotRecs, wantRecs) {
				t.Fatalf("run %d, %v %q %q at %d: with a prober %s %v, without %s %v",
					run, op.Kind, op.Key, op.Keys, ver, got, gotRecs, want, wantRecs)
			}
		}
	}
}

// HSET, HSETNX and HDEL read no field row's value when given a Prober:
// only their hash's metadata record goes through the Getter. Reading each
// row back (a pread of the engine's segment and a cache insert) was most
// of what an HSET cost (docs/design/hashes.md, Throughput). HINCRBY needs
// its field's value and reads it.
func TestHashWritesProbeRowsWithoutReadingThem(t *testing.T) {
	r := newHashRun(t)
	k := []byte("h")
	if _, err := r.write(Op{Kind: KindHSet, Key: k, Keys: bs("a", "1", "b", "2")}); err != nil {
		t.Fatal(err)
	}
	for _, op := range []Op{
		{Kind: KindHSet, Key: k, Keys: bs("a", "3", "c", "4")},
		{Kind: KindHSet, Key: k, Keys: bs("a", "5"), Cond: IfAbsent},
		{Kind: KindHDel, Key: k, Keys: bs("b", "zz")},
		{Kind: KindHIncrBy, Key: k, Keys: bs("n"), Delta: 2},
	} {
		var read [][]byte
		get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
			read = append(read, bytes.Clone(key))
			return r.m.get(key)
		}
		r.ver++
		op.Now = r.now
		if _, err := ApplyWith(get, nil, r.m.has, r.ver, &op, 0, func(key, value, meta []byte, tomb bool) {
			r.m[string(key)] = memVal{val: string(value), ver: r.ver, del: tomb, meta: meta}
		}); err != nil {
			t.Fatalf("%v: %v", op.Kind, err)
		}
		// The lock gate's one lookup (xgtx.go: nothing is locked), then
		// the key.
		want := [][]byte{txLockCount, k}
		if op.Kind == KindHIncrBy {
			gen, _, err := decodeHashMeta([]byte(r.m["h"].val))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, hashRowKey(gen, []byte("n")))
		}
		if !reflect.DeepEqual(read, want) {
			t.Errorf("%v read %q through the Getter, want %q", op.Kind, read, want)
		}
	}
}

// PointRange is exactly [k, k\x00) with limit 1: a scanner that serves it
// as a lookup of k returns what the scan would.
func TestPointRange(t *testing.T) {
	k := []byte("row")
	for _, c := range []struct {
		end   string
		limit int
		want  bool
	}{
		{"row\x00", 1, true},
		{"row\x00", 2, false},
		{"row\x00", 0, false},
		{"row\x01", 1, false},
		{"rox\x00", 1, false},
		{"row", 1, false},
		{"row\x00\x00", 1, false},
		{"", 1, false},
	} {
		if got := PointRange(k, []byte(c.end), c.limit); got != c.want {
			t.Errorf("PointRange(%q, %q, %d) = %v, want %v", k, c.end, c.limit, got, c.want)
		}
	}
	if !PointRange(nil, []byte{0}, 1) {
		t.Errorf("PointRange of the empty key is false")
	}
}

// randomHashOp is an op of a random hash history over two hashes h0, h1 of
// six fields: HSET, HMSET, HSETNX, HDEL (fields may repeat), HINCRBY,
// HINCRBYFLOAT, DEL and EXPIRE, at version ver (its clock is 1000+ver).
func randomHashOp(rng *rand.Rand, ver uint64) Op {
	field := func() []byte { return []byte(fmt.Sprint("f", rng.Intn(6))) }
	op := Op{Key: []byte(fmt.Sprint("h", rng.Intn(2))), Now: 1000 + int64(ver)}
	switch rng.Intn(8) {
	case 0, 1, 2:
		op.Kind = KindHSet
		for n := 1 + rng.Intn(3); n > 0; n-- {
			op.Keys = append(op.Keys, field(), []byte(fmt.Sprint(ver)))
		}
		if rng.Intn(4) == 0 {
			op.Delta = 1 // HMSET
		}
	case 3:
		op.Kind, op.Cond, op.Keys = KindHSet, IfAbsent, [][]byte{field(), []byte("nx")}
	case 4:
		op.Kind = KindHDel
		for n := 1 + rng.Intn(3); n > 0; n-- {
			op.Keys = append(op.Keys, field())
		}
	case 5:
		op.Kind, op.Keys, op.Delta = KindHIncrBy, [][]byte{[]byte("n")}, 1
	case 6:
		op.Kind, op.Keys, op.Value = KindHIncrByFloat, [][]byte{[]byte("x")}, []byte("0.5")
	case 7:
		op.Kind = KindDel
		op.Keys = [][]byte{op.Key}
		if rng.Intn(2) == 0 {
			op.Kind, op.Keys = KindExpire, nil
			op.ExpireAt = op.Now + int64(rng.Intn(20))
		}
	}
	return op
}
