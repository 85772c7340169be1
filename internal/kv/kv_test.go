package kv

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// mem is a store for the tests: key → value at a version; a deletion is a
// value with del set (a miss that reports its version, as a store may).
type mem map[string]memVal

type memVal struct {
	val  string
	ver  uint64
	del  bool
	meta []byte
}

func (m mem) get(key []byte) ([]byte, []byte, uint64, bool, error) {
	v, ok := m[string(key)]
	if !ok {
		return nil, nil, 0, false, nil
	}
	if v.del {
		return nil, nil, v.ver, false, nil
	}
	return []byte(v.val), v.meta, v.ver, true, nil
}

func (m mem) scan(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if !v.del && k >= string(start) && (end == nil || k < string(end)) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for i, k := range keys {
		if limit > 0 && i == limit {
			break
		}
		if !visit([]byte(k), []byte(m[k].val), m[k].meta, m[k].ver) {
			break
		}
	}
	return nil
}

// state builds a store from "key=value@version" and "key=-@version" (deleted).
func state(kvs ...string) mem {
	m := mem{}
	for _, s := range kvs {
		k, rest, _ := strings.Cut(s, "=")
		val, ver, _ := strings.Cut(rest, "@")
		var v uint64
		fmt.Sscan(ver, &v)
		e := m[k]
		e.val, e.ver, e.del = val, v, val == "-"
		if e.del {
			e.val = ""
		}
		m[k] = e
	}
	return m
}

func b(s string) []byte { return []byte(s) }

func keys(ks ...string) [][]byte {
	out := make([][]byte, len(ks))
	for i, k := range ks {
		out[i] = b(k)
	}
	return out
}

var reserved = string(ReservedPrefix) + "x"

// Record is what Emit receives, collected.
type Record struct {
	Key, Value, Meta []byte
	Tombstone        bool
}

// Every write kind's results and errors, at version 10 over a small state.
func TestApply(t *testing.T) {
	base := []string{"a=1@3", "s=hello@4", "big=9223372036854775806@5", "neg=-9223372036854775807@6", "gone=-@7",
		"plus=+1@8", "zero=01@8"}
	cases := []struct {
		name string
		op   Op
		max  int
		recs []string // "key=value" or "key=-" (deletion)
		res  Result
		err  error
	}{
		{"set", Op{Kind: KindSet, Key: b("a"), Value: b("x")}, 0, []string{"a=x"}, Result{Kind: ResOK, Version: 10}, nil},
		{"set new key", Op{Kind: KindSet, Key: b("n"), Value: b("x")}, 0, []string{"n=x"}, Result{Kind: ResOK, Version: 10}, nil},
		{"set nil value stores empty", Op{Kind: KindSet, Key: b("n")}, 0, []string{"n="}, Result{Kind: ResOK, Version: 10}, nil},
		{"set nx existing", Op{Kind: KindSet, Key: b("a"), Value: b("x"), Cond: IfAbsent}, 0, nil, Result{Kind: ResNil, Version: 3}, nil},
		{"set nx absent", Op{Kind: KindSet, Key: b("n"), Value: b("x"), Cond: IfAbsent}, 0, []string{"n=x"}, Result{Kind: ResOK, Version: 10}, nil},
		{"set nx deleted", Op{Kind: KindSet, Key: b("gone"), Value: b("x"), Cond: IfAbsent}, 0, []string{"gone=x"}, Result{Kind: ResOK, Version: 10}, nil},
		{"set xx absent", Op{Kind: KindSet, Key: b("n"), Value: b("x"), Cond: IfPresent}, 0, nil, Result{Kind: ResNil}, nil},
		{"set xx existing", Op{Kind: KindSet, Key: b("a"), Value: b("x"), Cond: IfPresent}, 0, []string{"a=x"}, Result{Kind: ResOK, Version: 10}, nil},
		{"set get existing", Op{Kind: KindSet, Key: b("a"), Value: b("x"), ReturnOld: true}, 0, []string{"a=x"}, Result{Kind: ResBulk, Bulk: b("1"), Version: 10}, nil},
		{"set get absent", Op{Kind: KindSet, Key: b("n"), Value: b("x"), ReturnOld: true}, 0, []string{"n=x"}, Result{Kind: ResNil, Version: 10}, nil},
		{"set nx get existing", Op{Kind: KindSet, Key: b("a"), Value: b("x"), Cond: IfAbsent, ReturnOld: true}, 0, nil, Result{Kind: ResBulk, Bulk: b("1"), Version: 3}, nil},
		{"set xx get absent", Op{Kind: KindSet, Key: b("n"), Value: b("x"), Cond: IfPresent, ReturnOld: true}, 0, nil, Result{Kind: ResNil}, nil},
		{"set reserved", Op{Kind: KindSet, Key: b(reserved), Value: b("x")}, 0, nil, Result{}, ErrReservedKey},
		{"set empty key", Op{Kind: KindSet, Key: b(""), Value: b("x")}, 0, nil, Result{}, ErrInvalidOp},

		{"getset existing", Op{Kind: KindGetSet, Key: b("s"), Value: b("x")}, 0, []string{"s=x"}, Result{Kind: ResBulk, Bulk: b("hello"), Version: 10}, nil},
		{"getset absent", Op{Kind: KindGetSet, Key: b("n"), Value: b("x")}, 0, []string{"n=x"}, Result{Kind: ResNil, Version: 10}, nil},
		{"getset reserved", Op{Kind: KindGetSet, Key: b(reserved), Value: b("x")}, 0, nil, Result{}, ErrReservedKey},

		{"incrby absent", Op{Kind: KindIncrBy, Key: b("n"), Delta: 5}, 0, []string{"n=5"}, Result{Kind: ResInt, Int: 5, Version: 10}, nil},
		{"incrby existing", Op{Kind: KindIncrBy, Key: b("a"), Delta: -3}, 0, []string{"a=-2"}, Result{Kind: ResInt, Int: -2, Version: 10}, nil},
		{"incrby deleted", Op{Kind: KindIncrBy, Key: b("gone"), Delta: 1}, 0, []string{"gone=1"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"incrby non-integer", Op{Kind: KindIncrBy, Key: b("s"), Delta: 1}, 0, nil, Result{}, ErrWrongType},
		{"incrby plus sign", Op{Kind: KindIncrBy, Key: b("plus"), Delta: 1}, 0, nil, Result{}, ErrWrongType},
		{"incrby leading zero", Op{Kind: KindIncrBy, Key: b("zero"), Delta: 1}, 0, nil, Result{}, ErrWrongType},
		{"incrby to max", Op{Kind: KindIncrBy, Key: b("big"), Delta: 1}, 0, []string{"big=9223372036854775807"}, Result{Kind: ResInt, Int: math.MaxInt64, Version: 10}, nil},
		{"incrby overflow", Op{Kind: KindIncrBy, Key: b("big"), Delta: 2}, 0, nil, Result{}, ErrOverflow},
		{"incrby underflow", Op{Kind: KindIncrBy, Key: b("neg"), Delta: -2}, 0, nil, Result{}, ErrOverflow},
		{"incrby reserved", Op{Kind: KindIncrBy, Key: b(reserved), Delta: 1}, 0, nil, Result{}, ErrReservedKey},

		{"append existing", Op{Kind: KindAppend, Key: b("s"), Value: b("!")}, 0, []string{"s=hello!"}, Result{Kind: ResInt, Int: 6, Version: 10}, nil},
		{"append absent", Op{Kind: KindAppend, Key: b("n"), Value: b("ab")}, 0, []string{"n=ab"}, Result{Kind: ResInt, Int: 2, Version: 10}, nil},
		{"append at the limit", Op{Kind: KindAppend, Key: b("s"), Value: b("!")}, 6, []string{"s=hello!"}, Result{Kind: ResInt, Int: 6, Version: 10}, nil},
		{"append over the limit", Op{Kind: KindAppend, Key: b("s"), Value: b("!!")}, 6, nil, Result{}, ErrInvalidOp},

		{"cas match", Op{Kind: KindCAS, Key: b("a"), Expected: b("1"), Value: b("2")}, 0, []string{"a=2"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"cas mismatch", Op{Kind: KindCAS, Key: b("a"), Expected: b("7"), Value: b("2")}, 0, nil, Result{Kind: ResInt, Int: 0, Version: 3}, nil},
		{"cas absent", Op{Kind: KindCAS, Key: b("n"), Expected: b(""), Value: b("2")}, 0, nil, Result{Kind: ResInt, Int: 0}, nil},
		{"cas reserved", Op{Kind: KindCAS, Key: b(reserved), Expected: b("1"), Value: b("2")}, 0, nil, Result{}, ErrReservedKey},

		{"mset", Op{Kind: KindMSet, Keys: keys("a", "x", "n", "y")}, 0, []string{"a=x", "n=y"}, Result{Kind: ResOK, Version: 10}, nil},
		{"mset same key twice keeps the last", Op{Kind: KindMSet, Keys: keys("a", "x", "n", "y", "a", "z")}, 0, []string{"n=y", "a=z"}, Result{Kind: ResOK, Version: 10}, nil},
		{"mset odd", Op{Kind: KindMSet, Keys: keys("a", "x", "n")}, 0, nil, Result{}, ErrInvalidOp},
		{"mset empty", Op{Kind: KindMSet}, 0, nil, Result{}, ErrInvalidOp},
		{"mset reserved writes nothing", Op{Kind: KindMSet, Keys: keys("a", "x", reserved, "y")}, 0, nil, Result{}, ErrReservedKey},

		{"del counts existing keys once", Op{Kind: KindDel, Keys: keys("a", "n", "a", "gone", "s")}, 0, []string{"a=-", "s=-"}, Result{Kind: ResInt, Int: 2, Version: 10}, nil},
		{"del of absent keys", Op{Kind: KindDel, Keys: keys("n", "gone")}, 0, nil, Result{Kind: ResInt}, nil},
		{"del reserved", Op{Kind: KindDel, Keys: keys("a", reserved)}, 0, nil, Result{}, ErrReservedKey},

		{"a read is not a write", Op{Kind: KindGet, Key: b("a")}, 0, nil, Result{}, ErrInvalidOp},
		{"unknown kind", Op{Kind: Kind(99), Key: b("a")}, 0, nil, Result{}, ErrInvalidOp},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := state(base...)
			var out []Record
			res, err := Apply(st.get, 10, &c.op, c.max, func(key, value, meta []byte, tomb bool) {
				out = append(out, Record{Key: key, Value: value, Meta: meta, Tombstone: tomb})
			})
			if !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if err != nil {
				// An op's own error is found before it writes anything.
				if len(out) != 0 {
					t.Errorf("a failed op emitted %d records", len(out))
				}
				return
			}
			if !reflect.DeepEqual(res, c.res) {
				t.Errorf("result = %+v, want %+v", res, c.res)
			}
			var got []string
			for _, r := range out {
				switch {
				case r.Tombstone && r.Value != nil:
					t.Errorf("deletion of %q carries a value", r.Key)
				case !r.Tombstone && r.Value == nil:
					t.Errorf("value of %q is nil, want empty", r.Key)
				}
				if r.Tombstone {
					got = append(got, string(r.Key)+"=-")
				} else {
					got = append(got, string(r.Key)+"="+string(r.Value))
				}
			}
			if !slices.Equal(got, c.recs) {
				t.Errorf("records = %q, want %q", got, c.recs)
			}
		})
	}
}

// A store failure is not an outcome: Apply returns it as it came, with no
// result.
func TestApplyReturnsTheStoreError(t *testing.T) {
	boom := errors.New("disk on fire")
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
		if string(k) == "bad" {
			return nil, nil, 0, false, boom
		}
		if IsReserved(k) {
			return nil, nil, 0, false, nil // no cross-group locks (xgtx.go)
		}
		return []byte("1"), nil, 1, true, nil
	}
	for _, op := range []Op{
		{Kind: KindSet, Key: b("bad"), Value: b("x"), Cond: IfAbsent},
		{Kind: KindIncrBy, Key: b("bad"), Delta: 1},
		{Kind: KindGetSet, Key: b("bad")},
		{Kind: KindAppend, Key: b("bad")},
		{Kind: KindCAS, Key: b("bad")},
		{Kind: KindDel, Keys: keys("ok", "bad")},
	} {
		res, err := Apply(get, 5, &op, 0, func([]byte, []byte, []byte, bool) {})
		if err != boom || !reflect.DeepEqual(res, Result{}) {
			t.Errorf("%v: result %+v, err %v; want none and the store's error", op.Kind, res, err)
		}
	}
}

func TestRead(t *testing.T) {
	st := state("a=1@3", "bb=hello@4", "c=3@9", "gone=-@7", reserved+"=secret@8")
	cases := []struct {
		name    string
		op      Op
		maxScan int
		res     Result
		err     error
	}{
		{"get", Op{Kind: KindGet, Key: b("bb")}, 0, Result{Kind: ResBulk, Bulk: b("hello"), Version: 4}, nil},
		{"get absent", Op{Kind: KindGet, Key: b("n")}, 0, Result{Kind: ResNil}, nil},
		// A miss reports the version the store gives for it (its deletion's).
		{"get deleted", Op{Kind: KindGet, Key: b("gone")}, 0, Result{Kind: ResNil, Version: 7}, nil},
		{"get reserved", Op{Kind: KindGet, Key: b(reserved)}, 0, Result{Kind: ResNil}, nil},
		{"strlen", Op{Kind: KindStrlen, Key: b("bb")}, 0, Result{Kind: ResInt, Int: 5, Version: 4}, nil},
		{"strlen absent", Op{Kind: KindStrlen, Key: b("n")}, 0, Result{Kind: ResInt}, nil},
		{"mget", Op{Kind: KindMGet, Keys: keys("a", "n", reserved, "c")}, 0,
			Result{Kind: ResArray, Array: [][]byte{b("1"), nil, nil, b("3")}, Version: 9}, nil},
		{"exists counts every named key", Op{Kind: KindExists, Keys: keys("a", "a", "n", reserved, "bb")}, 0, Result{Kind: ResInt, Int: 3, Version: 4}, nil},
		{"scan skips reserved and deleted keys", Op{Kind: KindScan}, 100,
			Result{Kind: ResArray, Array: keys("a", "1", "bb", "hello", "c", "3"), Version: 9}, nil},
		{"scan range", Op{Kind: KindScan, Key: b("b"), End: b("c")}, 100, Result{Kind: ResArray, Array: keys("bb", "hello"), Version: 4}, nil},
		{"scan limit", Op{Kind: KindScan, Limit: 2}, 100, Result{Kind: ResArray, Array: keys("a", "1", "bb", "hello"), Version: 4}, nil},
		{"scan capped by maxScan", Op{Kind: KindScan, Limit: 50}, 1, Result{Kind: ResArray, Array: keys("a", "1"), Version: 3}, nil},
		{"scan of nothing is an empty array", Op{Kind: KindScan, Key: b("x")}, 100, Result{Kind: ResArray, Array: [][]byte{}}, nil},
		{"a write is not a read", Op{Kind: KindSet, Key: b("a")}, 0, Result{}, ErrInvalidOp},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Read(st.get, st.scan, &c.op, c.maxScan)
			if !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if !reflect.DeepEqual(res, c.res) {
				t.Errorf("result = %+v, want %+v", res, c.res)
			}
		})
	}
	boom := errors.New("disk on fire")
	fail := func([]byte) ([]byte, []byte, uint64, bool, error) { return nil, nil, 0, false, boom }
	for _, op := range []Op{{Kind: KindGet, Key: b("a")}, {Kind: KindMGet, Keys: keys("a")}} {
		if _, err := Read(fail, nil, &op, 0); err != boom {
			t.Errorf("%v over a failing store: err %v, want the store's", op.Kind, err)
		}
	}
}

func TestMultiKey(t *testing.T) {
	for _, c := range []struct {
		op   Op
		want bool
	}{
		{Op{Kind: KindGet, Key: b("a")}, false},
		{Op{Kind: KindMGet, Keys: keys("a")}, false},
		{Op{Kind: KindMGet, Keys: keys("a", "b")}, true},
		{Op{Kind: KindExists, Keys: keys("a", "b")}, true},
		{Op{Kind: KindScan}, true},
	} {
		if got := MultiKey(&c.op); got != c.want {
			t.Errorf("MultiKey(%v of %d keys) = %t", c.op.Kind, len(c.op.Keys), got)
		}
	}
}

// The same ops over the same state give the same records and results: what
// lets every replica evaluate committed ops on its own.
func TestApplyIsDeterministic(t *testing.T) {
	ops := []Op{
		{Kind: KindSet, Key: b("a"), Value: b("1")},
		{Kind: KindIncrBy, Key: b("a"), Delta: 4},
		{Kind: KindAppend, Key: b("a"), Value: b("0")},
		{Kind: KindMSet, Keys: keys("b", "x", "c", "y")},
		{Kind: KindCAS, Key: b("b"), Expected: b("x"), Value: b("z")},
		{Kind: KindSet, Key: b("c"), Value: b("w"), ReturnOld: true, Cond: IfPresent},
		{Kind: KindDel, Keys: keys("a", "c", "d")},
		{Kind: KindGetSet, Key: b("b"), Value: b("q")},
	}
	run := func() []string {
		st := mem{}
		var log []string
		for i, op := range ops {
			v := uint64(i + 1)
			var recs []Record
			res, err := Apply(st.get, v, &op, 0, func(key, value, meta []byte, tomb bool) {
				recs = append(recs, Record{Key: key, Value: value, Meta: meta, Tombstone: tomb})
			})
			for _, r := range recs {
				st[string(r.Key)] = memVal{string(r.Value), v, r.Tombstone, r.Meta}
			}
			log = append(log, fmt.Sprintf("%d %+v %+v %v", v, recs, res, err))
		}
		return log
	}
	first, second := run(), run()
	if !slices.Equal(first, second) {
		t.Fatalf("two runs differ:\n%q\n%q", first, second)
	}
	if want := "8 [{Key:[98] Value:[113] Meta:[] Tombstone:false}] {Kind:3 Int:0 Bulk:[122]"; !strings.HasPrefix(first[7], want) {
		t.Fatalf("last op: %s, want prefix %s", first[7], want)
	}
}

func TestOpCodecRoundTrip(t *testing.T) {
	for _, op := range []Op{
		{Kind: KindSet, Key: b("k"), Value: b("v"), Cond: IfAbsent, ReturnOld: true},
		{Kind: KindSet, Key: b("k"), Value: []byte{}, Cond: IfPresent},
		{Kind: KindIncrBy, Key: b("n"), Delta: math.MinInt64},
		{Kind: KindCAS, Key: b("k"), Expected: b("old"), Value: b("new")},
		{Kind: KindMSet, Keys: keys("a", "1", "b", "")},
		{Kind: KindDel, Keys: keys("a", "b")},
		{Kind: KindAppend, Key: b("k"), Value: bytes.Repeat(b("x"), 300)},
		// Every field set, the integers at their longest varints, and at
		// the lengths where a varint takes another byte.
		{Kind: KindSet, Key: b("k"), Value: b("v"), Expected: b("e"), Keys: keys("a"), Delta: math.MinInt64,
			Now: math.MinInt64, ExpireAt: math.MaxInt64, TTL: 1},
		{Kind: KindSet, Key: bytes.Repeat(b("k"), 127), Value: bytes.Repeat(b("v"), 128), Delta: -64, Now: 63, ExpireAt: -65},
		{Kind: KindSet, Key: b("k"), Value: bytes.Repeat(b("v"), 16384), Delta: 64, TTL: 2},
		{Kind: KindMSet, Keys: [][]byte{bytes.Repeat(b("a"), 16383), b("1")}, Now: 1},
	} {
		enc := AppendOp(nil, &op)
		if len(enc) != OpLen(&op) {
			t.Errorf("%v: encoded in %d bytes, OpLen says %d", op.Kind, len(enc), OpLen(&op))
		}
		got, err := DecodeOp(enc)
		if err != nil {
			t.Fatalf("%v: %v", op.Kind, err)
		}
		// Empty and nil byte strings decode alike; compare the encodings.
		if again := AppendOp(nil, &got); !bytes.Equal(again, enc) || got.Kind != op.Kind || got.Cond != op.Cond ||
			got.ReturnOld != op.ReturnOld || got.Delta != op.Delta || !bytes.Equal(got.Key, op.Key) {
			t.Errorf("%+v decoded as %+v", op, got)
		}
	}
	good := AppendOp(nil, &Op{Kind: KindSet, Key: b("k"), Value: b("v")})
	for name, bad := range map[string][]byte{
		"empty":          nil,
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(slices.Clone(good), 0),
		"unknown kind":   append([]byte{200}, good[1:]...), // 99 is HINCRBYFLOAT since hashes
		"kind zero":      append([]byte{0}, good[1:]...),
		"too many keys":  append(slices.Clone(good[:len(good)-1]), 200),
	} {
		if _, err := DecodeOp(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err %v, want ErrCorrupt", name, err)
		}
	}
}

func TestResultCodecRoundTrip(t *testing.T) {
	for _, res := range []Result{
		{Kind: ResOK, Version: 7},
		{Kind: ResInt, Int: -42, Version: 1 << 40},
		{Kind: ResBulk, Bulk: b("old value"), Version: 3},
		{Kind: ResNil},
	} {
		got, opErr, err := DecodeResult(AppendResult(nil, res, nil))
		if err != nil || opErr != nil || !reflect.DeepEqual(got, res) {
			t.Errorf("%+v decoded as %+v, %v, %v", res, got, opErr, err)
		}
	}
	// Known errors keep their identity (by code) and text; others their text.
	for _, e := range []error{ErrWrongType, ErrOverflow, ErrReservedKey, fmt.Errorf("%w: empty key", ErrInvalidOp), errors.New("something else")} {
		_, opErr, err := DecodeResult(AppendResult(nil, Result{}, e))
		if err != nil || opErr == nil || opErr.Error() != e.Error() {
			t.Fatalf("%v decoded as %v, %v", e, opErr, err)
		}
		for _, s := range resultErrs[1:] {
			if errors.Is(e, s) != errors.Is(opErr, s) {
				t.Errorf("%v decoded as %v: errors.Is(%v) differs", e, opErr, s)
			}
		}
	}
	if _, _, err := DecodeResult([]byte{byte(ResOK)}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a truncated result: err %v, want ErrCorrupt", err)
	}
}

func TestCheckSizesAndWrittenKeys(t *testing.T) {
	op := Op{Kind: KindMSet, Keys: keys("a", "12345", "bb", "1")}
	if err := op.CheckSizes(2, 5); err != nil {
		t.Errorf("within limits: %v", err)
	}
	if err := op.CheckSizes(1, 5); !errors.Is(err, ErrInvalidOp) {
		t.Errorf("key over the limit: %v", err)
	}
	if err := op.CheckSizes(2, 4); !errors.Is(err, ErrInvalidOp) {
		t.Errorf("value over the limit: %v", err)
	}
	if got := op.WrittenKeys(); !reflect.DeepEqual(got, keys("a", "bb")) {
		t.Errorf("WrittenKeys = %q", got)
	}
	if err := (&Op{Kind: KindDel, Keys: keys("toolongkey")}).CheckSizes(2, 2); err != nil {
		t.Errorf("DEL refused: %v", err)
	}
}

// The state machine's own cost per write, without a store: a SET (no read)
// and an INCRBY (a read, a parse, a new value). Next to an applied op in
// internal/vrshard (BenchmarkApplierApply: ~1.3 µs per op, in the engine)
// it is a few percent at most.
func BenchmarkApply(b *testing.B) {
	for _, c := range []struct {
		name string
		op   Op
	}{
		{"set", Op{Kind: KindSet, Key: []byte("key-000001"), Value: make([]byte, 100)}},
		{"incrby", Op{Kind: KindIncrBy, Key: []byte("ctr"), Delta: 1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			val := []byte("12345")
			get := func([]byte) ([]byte, []byte, uint64, bool, error) { return val, nil, 1, true, nil }
			n := 0
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Apply(get, uint64(i+2), &c.op, 0, func([]byte, []byte, []byte, bool) { n++ }); err != nil {
					b.Fatal(err)
				}
			}
			if n != b.N {
				b.Fatalf("%d records for %d ops", n, b.N)
			}
		})
	}
}

// A Result is copied into every request's reply slot: Group (a node of
// several groups) lives in padding and must not make it larger.
func TestResultSize(t *testing.T) {
	if n := unsafe.Sizeof(Result{}); unsafe.Sizeof(uintptr(0)) == 8 && n != 88 {
		t.Fatalf("unsafe.Sizeof(kv.Result{}) = %d, want 88", n)
	}
}
