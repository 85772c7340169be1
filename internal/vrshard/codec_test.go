package vrshard

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
)

func TestOpAndResultEncodingRoundTrip(t *testing.T) {
	ops := []kv.Op{
		{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("v"), Cond: kv.IfAbsent, ReturnOld: true},
		{Kind: kv.KindMSet, Keys: [][]byte{[]byte("a"), []byte("1"), []byte("b"), {}}},
		{Kind: kv.KindDel, Keys: [][]byte{[]byte("a")}},
		{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: -7},
		{Kind: kv.KindCAS, Key: []byte("k"), Expected: []byte("old"), Value: []byte("new")},
	}
	for _, op := range ops {
		h := header{proposer: 3, seq: 99, ts: -5}
		gh, got, err := decodeOp(encodeOp(nil, h, &op))
		if err != nil || gh != h {
			t.Fatalf("%v: header %+v, %v", op.Kind, gh, err)
		}
		norm := func(o kv.Op) kv.Op {
			for _, p := range []*[]byte{&o.Key, &o.Value, &o.Expected} {
				if len(*p) == 0 {
					*p = nil
				}
			}
			for i := range o.Keys {
				if len(o.Keys[i]) == 0 {
					o.Keys[i] = nil
				}
			}
			return o
		}
		if !reflect.DeepEqual(norm(got), norm(op)) {
			t.Fatalf("round trip:\n%+v\nwant\n%+v", got, op)
		}
	}
	if _, _, err := decodeOp([]byte{dataFormat, 1, 1, 0, byte(kv.KindGet), 0, 0, 0, 0, 0, 0}); !errors.Is(err, ErrCorruptEntry) {
		t.Fatalf("a read kind in the log decoded: %v", err)
	}
	res := kv.Result{Kind: kv.ResBulk, Bulk: []byte("x"), Version: 12, Int: 3}
	got, opErr, err := decodeResult(kv.AppendResult(nil, res, nil))
	if err != nil || opErr != nil || !reflect.DeepEqual(got, res) {
		t.Fatalf("result round trip: %+v %v %v", got, opErr, err)
	}
	_, opErr, err = decodeResult(kv.AppendResult(nil, kv.Result{}, kv.ErrWrongType))
	if err != nil || !errors.Is(opErr, kv.ErrWrongType) || opErr.Error() != kv.ErrWrongType.Error() {
		t.Fatalf("cached error: %v, %v", opErr, err)
	}
}

func FuzzDecodeOp(f *testing.F) {
	op := kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("a"), []byte("1")}}
	f.Add(encodeOp(nil, header{1, 2, 3}, &op))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, op, err := decodeOp(b)
		if err != nil {
			return
		}
		again := encodeOp(nil, h, &op)
		if _, _, err := decodeOp(again); err != nil {
			t.Fatalf("re-encoding of a decoded op fails: %v", err)
		}
	})
}

// TestWritePathAllocs: the encodings a write goes through on its way into
// a chain's log take one allocation each (sized once, exactly: kv.OpLen), and
// asking a SET for the keys it writes takes none when the caller keeps
// none of them (kv.Op.WrittenKeys inlines) — each was several per write on
// a memory chain's SET path (docs/design/chain.md, A6).
func TestWritePathAllocs(t *testing.T) {
	op := kv.Op{Kind: kv.KindSet, Key: []byte("key:000123"), Value: bytes.Repeat([]byte("v"), 128), Now: 1700000000000}
	h := header{proposer: 3, seq: 1 << 40, ts: 1700000000000000000}
	// Under the race detector slices.Grow takes two: the compiler turns
	// its append(s, make(...)...) into one allocation only when it does
	// not instrument the code (CI runs this package with -race).
	want := 1.0
	if raceOn {
		want = 2
	}
	var data []byte
	if n := testing.AllocsPerRun(100, func() { data = encodeOp(nil, h, &op) }); n != want {
		t.Errorf("encodeOp of a 128-byte SET: %v allocations, want %v", n, want)
	}
	req := core.Request{Client: 1 << 62, ReqNum: 1 << 62, Data: data}
	if n := testing.AllocsPerRun(100, func() { data = appendChainOp(nil, req) }); n != want {
		t.Errorf("appendChainOp: %v allocations, want %v", n, want)
	}
	sum := 0
	if n := testing.AllocsPerRun(100, func() {
		for _, k := range op.WrittenKeys() {
			sum += len(k)
		}
	}); n != 0 {
		t.Errorf("WrittenKeys of a SET: %v allocations, want 0", n)
	}
}
