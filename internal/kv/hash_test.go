package kv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// hashRun applies ops one after the other over a mem store, as a shard does
// (each at its own version), and reads with Read.
type hashRun struct {
	t   *testing.T
	m   mem
	ver uint64
	now int64
}

func newHashRun(t *testing.T) *hashRun { return &hashRun{t: t, m: mem{}, ver: 1, now: 1000} }

func (r *hashRun) write(op Op) (Result, error) {
	r.ver++
	op.Now = r.now
	return ApplyWith(r.m.get, memLister(r.m), nil, r.ver, &op, 0, func(key, value, meta []byte, tomb bool) {
		r.m[string(key)] = memVal{val: string(value), ver: r.ver, del: tomb, meta: meta}
	})
}

func (r *hashRun) read(op Op) (Result, error) {
	op.Now = r.now
	return Read(r.m.get, r.m.scan, &op, 1000)
}

func bs(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func show(res Result, err error) string {
	if err != nil {
		return "err " + err.Error()
	}
	switch res.Kind {
	case ResInt:
		return fmt.Sprint(res.Int)
	case ResOK:
		return "OK"
	case ResNil:
		return "nil"
	case ResBulk:
		return string(res.Bulk)
	case ResArray:
		s := "["
		for i, b := range res.Array {
			if i > 0 {
				s += " "
			}
			if b == nil {
				s += "nil"
			} else {
				s += string(b)
			}
		}
		return s + "]"
	}
	return "?"
}

func TestHashSemantics(t *testing.T) {
	r := newHashRun(t)
	k := []byte("h")
	steps := []struct {
		op    Op
		write bool
		want  string
	}{
		{Op{Kind: KindHSet, Key: k, Keys: bs("a", "1", "b", "2", "a", "3")}, true, "2"},
		{Op{Kind: KindHGetAll, Key: k}, false, "[a 3 b 2]"},
		{Op{Kind: KindHSet, Key: k, Keys: bs("b", "20", "c", "30")}, true, "1"},
		{Op{Kind: KindHLen, Key: k}, false, "3"},
		{Op{Kind: KindHGet, Key: k, Keys: bs("a", "zz", "c")}, false, "[3 nil 30]"},
		{Op{Kind: KindHSet, Key: k, Keys: bs("a", "x"), Cond: IfAbsent}, true, "0"},
		{Op{Kind: KindHSet, Key: k, Keys: bs("d", ""), Cond: IfAbsent}, true, "1"},
		{Op{Kind: KindHSet, Key: k, Keys: bs("e", "5"), Delta: 1}, true, "OK"},
		{Op{Kind: KindHIncrBy, Key: k, Keys: bs("e"), Delta: 10}, true, "15"},
		{Op{Kind: KindHIncrBy, Key: k, Keys: bs("n"), Delta: -2}, true, "-2"},
		{Op{Kind: KindHIncrBy, Key: k, Keys: bs("c"), Delta: 9223372036854775807}, true, "err increment or decrement would overflow"},
		{Op{Kind: KindHIncrBy, Key: k, Keys: bs("d"), Delta: 1}, true, "err hash value is not an integer"},
		{Op{Kind: KindHIncrByFloat, Key: k, Keys: bs("e"), Value: []byte("0.5")}, true, "15.5"},
		{Op{Kind: KindHIncrByFloat, Key: k, Keys: bs("d"), Value: []byte("1")}, true, "err hash value is not a float"},
		{Op{Kind: KindHDel, Key: k, Keys: bs("a", "a", "zz", "b")}, true, "2"},
		{Op{Kind: KindHGetAll, Key: k}, false, "[c 30 d  e 15.5 n -2]"},
		// HSCAN's pages: from a field (inclusive), at most Limit fields.
		{Op{Kind: KindHScan, Key: k, Limit: 2}, false, "[c 30 d ]"},
		{Op{Kind: KindHScan, Key: k, Value: []byte("d\x00"), Limit: 2}, false, "[e 15.5 n -2]"},
		{Op{Kind: KindHScan, Key: k, Value: []byte("o"), Limit: 2}, false, "[]"},
		// Strings and hashes do not mix.
		{Op{Kind: KindGet, Key: k}, false, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindStrlen, Key: k}, false, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindMGet, Keys: bs("h", "nokey")}, false, "[nil nil]"},
		{Op{Kind: KindExists, Keys: bs("h")}, false, "1"},
		{Op{Kind: KindIncrBy, Key: k, Delta: 1}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindAppend, Key: k, Value: []byte("x")}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindGetSet, Key: k, Value: []byte("x")}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindGetDel, Key: k}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindSetRange, Key: k, Value: []byte("x")}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindSet, Key: k, Value: []byte("x"), ReturnOld: true}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindSet, Key: k, Value: []byte("x"), Cond: IfAbsent}, true, "nil"},
		{Op{Kind: KindHSet, Key: []byte("s"), Keys: bs("f", "v")}, true, "1"},
		{Op{Kind: KindSet, Key: []byte("str"), Value: []byte("v")}, true, "OK"},
		{Op{Kind: KindHSet, Key: []byte("str"), Keys: bs("f", "v")}, true, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindHGet, Key: []byte("str"), Keys: bs("f")}, false, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindHLen, Key: []byte("str")}, false, "err " + ErrWrongKind.Error()},
		{Op{Kind: KindHDel, Key: []byte("str"), Keys: bs("f")}, true, "err " + ErrWrongKind.Error()},
		// COPY of a hash copies its fields under a generation of its own;
		// RENAME carries the fields.
		{Op{Kind: KindCopy, Keys: bs("h", "hc"), Cond: IfAbsent}, true, "1"},
		{Op{Kind: KindCopy, Keys: bs("h", "hc"), Cond: IfAbsent}, true, "0"},
		{Op{Kind: KindHSet, Key: []byte("hc"), Keys: bs("c", "copy")}, true, "0"},
		{Op{Kind: KindHGetAll, Key: []byte("hc")}, false, "[c copy d  e 15.5 n -2]"},
		{Op{Kind: KindRename, Keys: bs("h", "h2")}, true, "OK"},
		{Op{Kind: KindHLen, Key: k}, false, "0"},
		{Op{Kind: KindHGetAll, Key: []byte("h2")}, false, "[c 30 d  e 15.5 n -2]"},
		// DEL, then a new hash of the same name: the old fields are unreachable.
		{Op{Kind: KindDel, Keys: bs("h2")}, true, "1"},
		{Op{Kind: KindHGetAll, Key: []byte("h2")}, false, "[]"},
		{Op{Kind: KindHSet, Key: []byte("h2"), Keys: bs("z", "1")}, true, "1"},
		{Op{Kind: KindHGetAll, Key: []byte("h2")}, false, "[z 1]"},
		// SET over a hash replaces it; a new hash there starts empty.
		{Op{Kind: KindSet, Key: []byte("h2"), Value: []byte("plain")}, true, "OK"},
		{Op{Kind: KindGet, Key: []byte("h2")}, false, "plain"},
		{Op{Kind: KindDel, Keys: bs("h2")}, true, "1"},
		{Op{Kind: KindHSet, Key: []byte("h2"), Keys: bs("y", "2")}, true, "1"},
		{Op{Kind: KindHGetAll, Key: []byte("h2")}, false, "[y 2]"},
		// The last field's HDEL deletes the key.
		{Op{Kind: KindHDel, Key: []byte("h2"), Keys: bs("y")}, true, "1"},
		{Op{Kind: KindExists, Keys: bs("h2")}, false, "0"},
		// Fields inherit the key's expiry.
		{Op{Kind: KindExpire, Key: []byte("s"), ExpireAt: 2000}, true, "1"},
		{Op{Kind: KindHSet, Key: []byte("s"), Keys: bs("g", "w")}, true, "1"},
		{Op{Kind: KindTTL, Key: []byte("s")}, false, "1000"},
		{Op{Kind: KindGetEx, Key: []byte("s"), TTL: TTLPersist}, true, "err " + ErrWrongKind.Error()},
	}
	for i, s := range steps {
		var got string
		if s.write {
			got = show(r.write(s.op))
		} else {
			got = show(r.read(s.op))
		}
		if got != s.want {
			t.Fatalf("step %d %v %q: got %q, want %q", i, s.op.Kind, s.op.Keys, got, s.want)
		}
	}
	// At its expiry's very millisecond the hash is still live (Expired:
	// now > at): an HSET adds a field to it.
	r.now = 2000
	if got := show(r.write(Op{Kind: KindHSet, Key: []byte("s"), Keys: bs("h", "x")})); got != "1" {
		t.Fatalf("HSET at the hash's expiry: %s", got)
	}
	if got := show(r.read(Op{Kind: KindHLen, Key: []byte("s")})); got != "3" {
		t.Fatalf("HLEN after an HSET at the hash's expiry: %s", got)
	}
	// After its expiry the hash and its fields are gone, and a new hash of
	// the name does not see them.
	r.now = 2001
	if got := show(r.read(Op{Kind: KindHGetAll, Key: []byte("s")})); got != "[]" {
		t.Fatalf("expired hash reads %s", got)
	}
	if got := show(r.write(Op{Kind: KindHSet, Key: []byte("s"), Keys: bs("q", "1")})); got != "1" {
		t.Fatalf("HSET over an expired hash: %s", got)
	}
	if got := show(r.read(Op{Kind: KindHGetAll, Key: []byte("s")})); got != "[q 1]" {
		t.Fatalf("new hash over an expired one reads %s", got)
	}
	if got := show(r.read(Op{Kind: KindTTL, Key: []byte("s")})); got != "-1" {
		t.Fatalf("new hash TTL %s", got)
	}
	// FLUSHDB deletes the field rows too, the garbage ones included.
	if _, err := r.write(Op{Kind: KindFlush}); err != nil {
		t.Fatal(err)
	}
	for key, v := range r.m {
		if !v.del && key != string(FlushMark) {
			t.Errorf("after FLUSHDB %q is still stored", key)
		}
	}
}

// TestHashSetWritesTwoRecords: HSET of one field of a big hash writes its
// row and the metadata, never the other fields.
func TestHashSetWritesTwoRecords(t *testing.T) {
	r := newHashRun(t)
	k := []byte("big")
	for i := 0; i < 100; i++ {
		if _, err := r.write(Op{Kind: KindHSet, Key: k, Keys: bs(fmt.Sprint("f", i), "v")}); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	op := Op{Kind: KindHSet, Key: k, Keys: bs("f7", "new")}
	_, err := Apply(r.m.get, 1000, &op, 0, func(_, _, _ []byte, _ bool) { n++ })
	if err != nil || n != 2 {
		t.Fatalf("HSET of one field emitted %d records (err %v), want 2", n, err)
	}
}

func TestHashCodec(t *testing.T) {
	for _, op := range []Op{
		{Kind: KindHSet, Key: []byte("h"), Keys: bs("f", "v"), Delta: 1, Cond: IfAbsent},
		{Kind: KindHDel, Key: []byte("h"), Keys: bs("f", "g")},
		{Kind: KindHIncrBy, Key: []byte("h"), Keys: bs("f"), Delta: -3},
		{Kind: KindHIncrByFloat, Key: []byte("h"), Keys: bs("f"), Value: []byte("1.5")},
	} {
		got, err := DecodeOp(AppendOp(nil, &op))
		if err != nil || !reflect.DeepEqual(AppendOp(nil, &got), AppendOp(nil, &op)) || got.Kind != op.Kind || got.Delta != op.Delta || got.Cond != op.Cond || len(got.Keys) != len(op.Keys) {
			t.Errorf("%v round trip: %+v, %v", op.Kind, got, err)
		}
		if !op.Kind.IsUpdate() {
			t.Errorf("%v is not an update", op.Kind)
		}
	}
	for _, k := range []Kind{KindHGet, KindHLen, KindHGetAll} {
		if k.IsUpdate() {
			t.Errorf("%v is an update", k)
		}
	}
	for _, e := range []error{ErrWrongKind, ErrHashNotInt, ErrHashNotFloat, ErrHashCopy, ErrHashCopyTooBig} {
		_, opErr, err := DecodeResult(AppendResult(nil, Result{}, e))
		if err != nil || !errors.Is(opErr, e) {
			t.Errorf("%v: decoded %v, %v", e, opErr, err)
		}
	}
}

// A field's row key is longer than the field: CheckSizes refuses a field
// whose row would pass the engine's key limit, and a value past its value
// limit, before the op reaches the engine (which would refuse its batch).
func TestHashCheckSizes(t *testing.T) {
	const maxKey, maxVal = 64, 8
	long := make([]byte, maxKey-HashRowOverhead+1)
	for _, c := range []struct {
		op Op
		ok bool
	}{
		{Op{Kind: KindHSet, Key: []byte("h"), Keys: bs("f", "12345678")}, true},
		{Op{Kind: KindHSet, Key: []byte("h"), Keys: bs("f", "123456789")}, false},
		{Op{Kind: KindHSet, Key: []byte("h"), Keys: [][]byte{long, []byte("v")}}, false},
		{Op{Kind: KindHSet, Key: []byte("h"), Keys: [][]byte{long[1:], []byte("v")}}, true},
		{Op{Kind: KindHDel, Key: []byte("h"), Keys: [][]byte{[]byte("a"), long}}, false},
		{Op{Kind: KindHIncrBy, Key: []byte("h"), Keys: [][]byte{long}}, false},
		{Op{Kind: KindHIncrBy, Key: make([]byte, maxKey+1), Keys: bs("f")}, false},
	} {
		if err := c.op.CheckSizes(maxKey, maxVal); (err == nil) != c.ok {
			t.Errorf("%v %d keys: CheckSizes = %v, want ok %v", c.op.Kind, len(c.op.Keys), err, c.ok)
		}
	}
}

// CheckSizes's one-field HSET path agrees with its loop, which an HSET of
// the same field twice takes (the same sizes, in the same order), at every
// length of key, field and value around the limits: it fails if the path
// forgets a limit, the row key's overhead, or is off by one at one.
func TestCheckSizesOfOneFieldHSetAgreesWithTheLoop(t *testing.T) {
	const maxKey, maxVal = 40, 12
	buf := make([]byte, maxKey+2)
	n := 0
	for k := maxKey - 2; k <= maxKey+1; k++ {
		for f := maxKey - HashRowOverhead - 2; f <= maxKey-HashRowOverhead+1; f++ {
			for v := maxVal - 2; v <= maxVal+1; v++ {
				one := Op{Kind: KindHSet, Key: buf[:k], Keys: [][]byte{buf[:f], buf[:v]}}
				twice := Op{Kind: KindHSet, Key: buf[:k], Keys: [][]byte{buf[:f], buf[:v], buf[:f], buf[:v]}}
				fast, loop := one.CheckSizes(maxKey, maxVal), twice.CheckSizes(maxKey, maxVal)
				if (fast == nil) != (loop == nil) || (fast != nil && fast.Error() != loop.Error()) {
					t.Errorf("key %d field %d value %d: CheckSizes = %v, the loop's %v", k, f, v, fast, loop)
				}
				if fast != nil {
					n++
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no size was refused: the test checks nothing")
	}
}

// takeScratch hands out room that no later take overlaps, past the
// arena's growth: each take is filled to its capacity with its own byte
// and read back after the last. It fails if a take's capacity runs into
// the next, or a full arena is reused from its start instead of replaced
// (the records emitted before point into it).
func TestTakeScratchDoesNotOverlap(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	var arena []byte
	var takes [][]byte
	for i := 0; i < 2000; i++ {
		n := 1 + rnd.IntN(300)
		b := takeScratch(&arena, n)
		if len(b) != 0 || cap(b) != n {
			t.Fatalf("take %d of %d bytes: len %d cap %d", i, n, len(b), cap(b))
		}
		b = b[:n]
		for j := range b {
			b[j] = byte(i)
		}
		takes = append(takes, b)
	}
	for k, tk := range takes {
		for _, c := range tk {
			if c != byte(k) {
				t.Fatalf("take %d holds %d, want %d: a later take overlapped it", k, c, byte(k))
			}
		}
	}
}
