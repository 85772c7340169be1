package kv

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// applyCase is one write over a small state at version 10.
type applyCase struct {
	name string
	op   Op
	max  int
	recs []string // "key=value" or "key=-" (deletion), in emit order
	res  Result
	err  error
}

func runApplyCases(t *testing.T, base []string, list func(mem) Lister, cases []applyCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := state(base...)
			var l Lister
			if list != nil {
				l = list(st)
			}
			var got []string
			res, err := ApplyWith(st.get, l, nil, 10, &c.op, c.max, func(key, value, _ []byte, tomb bool) {
				if tomb {
					got = append(got, string(key)+"=-")
				} else {
					got = append(got, string(key)+"="+string(value))
				}
			})
			if !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if err != nil {
				if len(got) != 0 {
					t.Errorf("a failed op emitted %q", got)
				}
				return
			}
			if !reflect.DeepEqual(res, c.res) {
				t.Errorf("result = %+v, want %+v", res, c.res)
			}
			if !slices.Equal(got, c.recs) {
				t.Errorf("records = %q, want %q", got, c.recs)
			}
		})
	}
}

// memLister lists every key of m, deleted ones too (a superset, as a Lister
// may give), in order.
func memLister(m mem) Lister {
	return func(_, _ []byte, visit func([]byte) bool) error {
		ks := make([]string, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		for _, k := range ks {
			if !visit([]byte(k)) {
				break
			}
		}
		return nil
	}
}

func TestApplyKeyspace(t *testing.T) {
	base := []string{"a=1@3", "s=hello@4", "gone=-@7", reserved + "=r@2"}
	runApplyCases(t, base, memLister, []applyCase{
		{"rename", Op{Kind: KindRename, Keys: keys("a", "n")}, 0, []string{"n=1", "a=-"}, Result{Kind: ResOK, Version: 10}, nil},
		{"rename over an existing key", Op{Kind: KindRename, Keys: keys("a", "s")}, 0, []string{"s=1", "a=-"}, Result{Kind: ResOK, Version: 10}, nil},
		{"rename missing", Op{Kind: KindRename, Keys: keys("n", "a")}, 0, nil, Result{}, ErrNoSuchKey},
		{"rename deleted", Op{Kind: KindRename, Keys: keys("gone", "a")}, 0, nil, Result{}, ErrNoSuchKey},
		{"rename onto itself", Op{Kind: KindRename, Keys: keys("a", "a")}, 0, nil, Result{Kind: ResOK, Version: 3}, nil},
		{"rename missing onto itself", Op{Kind: KindRename, Keys: keys("n", "n")}, 0, nil, Result{}, ErrNoSuchKey},
		{"rename to reserved", Op{Kind: KindRename, Keys: keys("a", reserved)}, 0, nil, Result{}, ErrReservedKey},
		{"rename from reserved", Op{Kind: KindRename, Keys: keys(reserved, "a")}, 0, nil, Result{}, ErrReservedKey},
		{"renamenx", Op{Kind: KindRename, Keys: keys("a", "n"), Cond: IfAbsent}, 0, []string{"n=1", "a=-"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"renamenx onto existing", Op{Kind: KindRename, Keys: keys("a", "s"), Cond: IfAbsent}, 0, nil, Result{Kind: ResInt, Version: 4}, nil},
		{"renamenx onto deleted", Op{Kind: KindRename, Keys: keys("a", "gone"), Cond: IfAbsent}, 0, []string{"gone=1", "a=-"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"renamenx onto itself", Op{Kind: KindRename, Keys: keys("a", "a"), Cond: IfAbsent}, 0, nil, Result{Kind: ResInt, Version: 3}, nil},
		{"renamenx missing", Op{Kind: KindRename, Keys: keys("n", "m"), Cond: IfAbsent}, 0, nil, Result{}, ErrNoSuchKey},

		{"copy", Op{Kind: KindCopy, Keys: keys("a", "n"), Cond: IfAbsent}, 0, []string{"n=1"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"copy onto existing", Op{Kind: KindCopy, Keys: keys("a", "s"), Cond: IfAbsent}, 0, nil, Result{Kind: ResInt, Version: 4}, nil},
		{"copy replace", Op{Kind: KindCopy, Keys: keys("a", "s")}, 0, []string{"s=1"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"copy missing", Op{Kind: KindCopy, Keys: keys("gone", "s")}, 0, nil, Result{Kind: ResInt, Version: 7}, nil},
		{"copy onto itself", Op{Kind: KindCopy, Keys: keys("a", "a")}, 0, nil, Result{}, ErrSameObject},

		{"getdel", Op{Kind: KindGetDel, Key: b("s")}, 0, []string{"s=-"}, Result{Kind: ResBulk, Bulk: b("hello"), Version: 10}, nil},
		{"getdel missing", Op{Kind: KindGetDel, Key: b("gone")}, 0, nil, Result{Kind: ResNil, Version: 7}, nil},
		{"getdel reserved", Op{Kind: KindGetDel, Key: b(reserved)}, 0, nil, Result{}, ErrReservedKey},

		// The mark first (the crash-atomicity of a single node's flush
		// depends on it), then a tombstone per live user key only.
		{"flush", Op{Kind: KindFlush}, 0, []string{string(FlushMark) + "=", "a=-", "s=-"}, Result{Kind: ResOK, Version: 10}, nil},
	})
	// Without a lister a flush is refused, never half done.
	if _, err := Apply(state(base...).get, 10, &Op{Kind: KindFlush}, 0, func([]byte, []byte, []byte, bool) { t.Error("emitted") }); !errors.Is(err, ErrInvalidOp) {
		t.Errorf("flush without a lister: %v", err)
	}
}

func TestApplyStrings(t *testing.T) {
	base := []string{"a=1@3", "s=hello@4", "f=10.50@5", "e=5.0e3@5", "bits=\x00@6", "gone=-@7", "big=1.7e308@8"}
	runApplyCases(t, base, nil, []applyCase{
		{"setrange inside", Op{Kind: KindSetRange, Key: b("s"), Delta: 1, Value: b("EL")}, 0, []string{"s=hELlo"}, Result{Kind: ResInt, Int: 5, Version: 10}, nil},
		{"setrange past the end pads with zeros", Op{Kind: KindSetRange, Key: b("s"), Delta: 7, Value: b("!")}, 0, []string{"s=hello\x00\x00!"}, Result{Kind: ResInt, Int: 8, Version: 10}, nil},
		{"setrange missing", Op{Kind: KindSetRange, Key: b("n"), Delta: 2, Value: b("x")}, 0, []string{"n=\x00\x00x"}, Result{Kind: ResInt, Int: 3, Version: 10}, nil},
		{"setrange nothing on missing", Op{Kind: KindSetRange, Key: b("n"), Delta: 2}, 0, nil, Result{Kind: ResInt}, nil},
		{"setrange nothing on existing", Op{Kind: KindSetRange, Key: b("s"), Delta: 100}, 0, nil, Result{Kind: ResInt, Int: 5, Version: 4}, nil},
		{"setrange over the limit", Op{Kind: KindSetRange, Key: b("s"), Delta: 8, Value: b("xx")}, 9, nil, Result{}, ErrTooBig},

		{"incrbyfloat", Op{Kind: KindIncrByFloat, Key: b("f"), Value: b("0.1")}, 0, []string{"f=10.6"}, Result{Kind: ResBulk, Bulk: b("10.6"), Version: 10}, nil},
		{"incrbyfloat exponent", Op{Kind: KindIncrByFloat, Key: b("e"), Value: b("2.0e2")}, 0, []string{"e=5200"}, Result{Kind: ResBulk, Bulk: b("5200"), Version: 10}, nil},
		{"incrbyfloat missing", Op{Kind: KindIncrByFloat, Key: b("n"), Value: b("-3")}, 0, []string{"n=-3"}, Result{Kind: ResBulk, Bulk: b("-3"), Version: 10}, nil},
		{"incrbyfloat integer value", Op{Kind: KindIncrByFloat, Key: b("a"), Value: b("0.5")}, 0, []string{"a=1.5"}, Result{Kind: ResBulk, Bulk: b("1.5"), Version: 10}, nil},
		{"incrbyfloat 0.1+0.2 as long double", Op{Kind: KindIncrByFloat, Key: b("n"), Value: b("0.3")}, 0, []string{"n=0.3"}, Result{Kind: ResBulk, Bulk: b("0.3"), Version: 10}, nil},
		{"incrbyfloat not a float", Op{Kind: KindIncrByFloat, Key: b("s"), Value: b("1")}, 0, nil, Result{}, ErrNotFloat},
		{"incrbyfloat bad increment", Op{Kind: KindIncrByFloat, Key: b("f"), Value: b("x")}, 0, nil, Result{}, ErrNotFloat},
		{"incrbyfloat nan", Op{Kind: KindIncrByFloat, Key: b("f"), Value: b("nan")}, 0, nil, Result{}, ErrNotFloat},
		{"incrbyfloat inf", Op{Kind: KindIncrByFloat, Key: b("f"), Value: b("inf")}, 0, nil, Result{}, ErrNaN},
		{"incrbyfloat space", Op{Kind: KindIncrByFloat, Key: b("f"), Value: b(" 1")}, 0, nil, Result{}, ErrNotFloat},

		{"msetnx", Op{Kind: KindMSetNX, Keys: keys("n", "1", "m", "2", "n", "3")}, 0, []string{"m=2", "n=3"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"msetnx with deleted", Op{Kind: KindMSetNX, Keys: keys("gone", "1")}, 0, []string{"gone=1"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"msetnx one exists", Op{Kind: KindMSetNX, Keys: keys("n", "1", "a", "2")}, 0, nil, Result{Kind: ResInt, Version: 3}, nil},
		{"msetnx odd", Op{Kind: KindMSetNX, Keys: keys("n")}, 0, nil, Result{}, ErrInvalidOp},
		{"msetnx reserved", Op{Kind: KindMSetNX, Keys: keys("n", "1", reserved, "2")}, 0, nil, Result{}, ErrReservedKey},

		{"setbit", Op{Kind: KindSetBit, Key: b("bits"), Delta: 1, Value: b("1")}, 0, []string{"bits=\x40"}, Result{Kind: ResInt, Version: 10}, nil},
		{"setbit grows", Op{Kind: KindSetBit, Key: b("n"), Delta: 15, Value: b("1")}, 0, []string{"n=\x00\x01"}, Result{Kind: ResInt, Version: 10}, nil},
		{"setbit old 1", Op{Kind: KindSetBit, Key: b("a"), Delta: 7, Value: b("0")}, 0, []string{"a=0"}, Result{Kind: ResInt, Int: 1, Version: 10}, nil},
		{"setbit over the limit", Op{Kind: KindSetBit, Key: b("n"), Delta: 80, Value: b("1")}, 10, nil, Result{}, ErrTooBig},
		{"setbit bad bit", Op{Kind: KindSetBit, Key: b("n"), Delta: 1, Value: b("2")}, 0, nil, Result{}, ErrInvalidOp},
	})
}

func TestOpCodecRoundTripMoreKinds(t *testing.T) {
	for _, op := range []Op{
		{Kind: KindRename, Keys: keys("a", "b"), Cond: IfAbsent},
		{Kind: KindCopy, Keys: keys("a", "b")},
		{Kind: KindGetDel, Key: b("k")},
		{Kind: KindFlush},
		{Kind: KindSetRange, Key: b("k"), Delta: 1 << 40, Value: b("v")},
		{Kind: KindIncrByFloat, Key: b("k"), Value: b("1.5")},
		{Kind: KindMSetNX, Keys: keys("a", "1")},
		{Kind: KindSetBit, Key: b("k"), Delta: 7, Value: b("1")},
	} {
		enc := AppendOp(nil, &op)
		got, err := DecodeOp(enc)
		if err != nil || got.Kind != op.Kind || !bytes.Equal(AppendOp(nil, &got), enc) {
			t.Errorf("%v: decoded %+v, %v", op.Kind, got, err)
		}
		if !op.Kind.IsUpdate() || op.Kind.String() == "" {
			t.Errorf("%v: not an update", op.Kind)
		}
	}
	if _, err := DecodeOp(AppendOp(nil, &Op{Kind: kindMoreEnd})); !errors.Is(err, ErrCorrupt) {
		t.Errorf("kind %d decoded: %v", kindMoreEnd, err)
	}
}

func TestStringReads(t *testing.T) {
	v := []byte("This is a string")
	for _, c := range []struct {
		s, e int64
		want string
	}{{0, 3, "This"}, {-3, -1, "ing"}, {0, -1, "This is a string"}, {10, 100, "string"}, {-1, -5, ""}, {5, 3, ""}, {-100, 2, "Thi"}} {
		if got := GetRange(v, c.s, c.e); string(got) != c.want {
			t.Errorf("GetRange(%d, %d) = %q, want %q", c.s, c.e, got, c.want)
		}
	}
	fb := []byte("foobar")
	for _, c := range []struct {
		ranged bool
		s, e   int64
		bit    bool
		want   int64
	}{{false, 0, 0, false, 26}, {true, 0, 0, false, 4}, {true, 1, 1, false, 6}, {true, 1, 1, true, 1}, {true, 5, 30, true, 17}, {true, -2, -1, false, 7}, {true, -1, -2, false, 0}} {
		if got := BitCount(fb, c.ranged, c.s, c.e, c.bit); got != c.want {
			t.Errorf("BitCount(%v %d %d bit=%v) = %d, want %d", c.ranged, c.s, c.e, c.bit, got, c.want)
		}
	}
	ff := []byte("\xff\xf0\x00")
	for _, c := range []struct {
		bit   int64
		hasS  bool
		s     int64
		hasE  bool
		e     int64
		isBit bool
		want  int64
	}{
		{0, false, 0, false, 0, false, 12}, {1, true, 2, false, 0, false, -1}, {1, true, 1, false, 0, false, 8},
		{0, true, 0, true, 0, false, -1}, {1, true, 7, true, 15, true, 7}, {0, true, 7, true, 11, true, -1},
		{0, true, 7, true, 12, true, 12},
	} {
		if got := BitPos(ff, true, c.bit, c.hasS, c.s, c.hasE, c.e, c.isBit); got != c.want {
			t.Errorf("BitPos(%+v) = %d, want %d", c, got, c.want)
		}
	}
	if BitPos(nil, false, 0, false, 0, false, 0, false) != 0 || BitPos(nil, false, 1, false, 0, false, 0, false) != -1 {
		t.Error("a missing key is all zeros")
	}
	if GetBit([]byte("\x40"), 1) != 1 || GetBit([]byte("\x40"), 0) != 0 || GetBit(nil, 100) != 0 {
		t.Error("GetBit")
	}
}

// Every new write that stores a key the caller names is refused up front
// when the key (or value) is over the engine's limits: the engine would
// refuse the batch, and on a replica every replica applying the op.
func TestCheckSizesOfMoreKinds(t *testing.T) {
	long := string(bytes.Repeat([]byte("k"), 9))
	for _, op := range []Op{
		{Kind: KindRename, Keys: keys("a", long)},
		{Kind: KindCopy, Keys: keys("a", long)},
		{Kind: KindSetRange, Key: b("a"), Value: bytes.Repeat([]byte("v"), 9)},
		{Kind: KindIncrByFloat, Key: b(long), Value: b("1")},
		{Kind: KindSetBit, Key: b(long), Value: b("1")},
		{Kind: KindMSetNX, Keys: keys(long, "1")},
	} {
		if err := op.CheckSizes(8, 8); !errors.Is(err, ErrInvalidOp) {
			t.Errorf("%v: CheckSizes = %v, want ErrInvalidOp", op.Kind, err)
		}
	}
	if err := (&Op{Kind: KindRename, Keys: keys("a", "b")}).CheckSizes(8, 8); err != nil {
		t.Errorf("a small rename: %v", err)
	}
}
