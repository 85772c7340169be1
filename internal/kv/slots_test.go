package kv

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
)

// applyTo applies op at version v to m, storing what it emits.
func applyTo(t *testing.T, m mem, v uint64, op *Op) (Result, error) {
	t.Helper()
	var recs []Record
	res, err := ApplyWith(m.get, nil, nil, v, op, 0, func(k, val, meta []byte, tomb bool) {
		recs = append(recs, Record{Key: append([]byte(nil), k...), Value: append([]byte(nil), val...), Meta: meta, Tombstone: tomb})
	})
	if err != nil {
		return res, err
	}
	for _, r := range recs {
		m[string(r.Key)] = memVal{val: string(r.Value), ver: v, del: r.Tombstone, meta: r.Meta}
	}
	return res, nil
}

// applier applies ops to m one after another, each at the next version (1,
// 2, …), as a group's log would.
func applier(t *testing.T, m mem) func(op *Op) (Result, error) {
	v := uint64(0)
	return func(op *Op) (Result, error) {
		v++
		return applyTo(t, m, v, op)
	}
}

func slotSet(rs []SlotRange, st SlotState, peer, epoch uint64) *Op {
	return &Op{Kind: KindSlotSet, Key: EncodeSlotRanges(rs), Cond: Cond(st), Value: []byte(strconv.FormatUint(peer, 10)), Delta: int64(epoch)}
}

// A key of a slot other than slot 0's, found by search.
func keyOfSlot(slot uint16) []byte {
	for i := 0; ; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		if KeySlot(k) == slot {
			return k
		}
	}
}

func TestSlotTableCodecAndRuns(t *testing.T) {
	tb := NewSlotTable([]SlotRange{{0, 99}, {200, 300}}, 3)
	tb, err := tb.Set([]SlotRange{{50, 60}}, SlotMigrating, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSlotTable(AppendSlotTable(nil, tb))
	if err != nil || *got != *tb {
		t.Fatalf("round trip: %v (equal %v)", err, got != nil && *got == *tb)
	}
	if n := len(tb.Runs()); n != 6 {
		t.Fatalf("runs %d, want 6: %+v", n, tb.Runs())
	}
	if tb.Epoch() != 4 {
		t.Fatalf("epoch %d", tb.Epoch())
	}
	if _, err := DecodeSlotTable(AppendSlotTable(nil, tb)[:5]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated table decoded: %v", err)
	}
}

func TestSlotTransitions(t *testing.T) {
	r := []SlotRange{{10, 20}}
	src := NewSlotTable(r, 1)
	dst := NewSlotTable(nil, 1)
	step := func(tb *SlotTable, st SlotState, peer, epoch uint64) *SlotTable {
		t.Helper()
		n, err := tb.Set(r, st, peer, epoch)
		if err != nil {
			t.Fatalf("%s peer %d epoch %d: %v", st, peer, epoch, err)
		}
		// A retried step is a no-op.
		if again, err := n.Set(r, st, peer, epoch); err != nil || *again != *n {
			t.Fatalf("retried %s: %v", st, err)
		}
		return n
	}
	refused := func(tb *SlotTable, st SlotState, peer, epoch uint64) {
		t.Helper()
		if _, err := tb.Set(r, st, peer, epoch); !errors.Is(err, ErrSlotTransition) {
			t.Fatalf("%s peer %d epoch %d from %+v: %v, want ErrSlotTransition", st, peer, epoch, tb.Entry(10), err)
		}
	}
	refused(dst, SlotOwned, 0, 2)     // owning without importing
	refused(src, SlotNone, 2, 2)      // handing over without migrating
	refused(src, SlotImporting, 2, 2) // importing an owned slot
	dst = step(dst, SlotImporting, 1, 2)
	src = step(src, SlotMigrating, 2, 2)
	refused(src, SlotNone, 3, 2)      // to another peer than the move's
	refused(src, SlotMigrating, 3, 2) // a second move of a moving slot
	refused(src, SlotNone, 2, 1)      // an epoch that goes down
	src = step(src, SlotNone, 2, 2)
	dst = step(dst, SlotOwned, 0, 2)
	if e := src.Entry(15); e.State.Serves() || e.Peer != 2 || e.Epoch != 2 {
		t.Fatalf("source after hand-over: %+v", e)
	}
	if e := dst.Entry(15); e.State != SlotOwned || e.Epoch != 2 {
		t.Fatalf("destination after hand-over: %+v", e)
	}
	refused(src, SlotOwned, 0, 3) // the source cannot take it back
	// A rolled-back move: migrating -> owned, importing -> none.
	src2 := step(NewSlotTable(r, 1), SlotMigrating, 2, 2)
	step(src2, SlotOwned, 0, 2)
	dst2 := step(NewSlotTable(nil, 1), SlotImporting, 1, 2)
	step(dst2, SlotNone, 1, 2)
}

func TestSlotFenceRefusesUnownedKeys(t *testing.T) {
	owned := keyOfSlot(100)
	moving := keyOfSlot(101)
	gone := keyOfSlot(102)
	m := mem{}
	v := uint64(1)
	next := func() uint64 { v++; return v }
	if _, err := applyTo(t, m, next(), &Op{Kind: KindSlotInit, Key: EncodeSlotRanges([]SlotRange{{100, 102}}), Delta: 1}); err != nil {
		t.Fatal(err)
	}
	// Init is a no-op on a group that has a table.
	if res, err := applyTo(t, m, next(), &Op{Kind: KindSlotInit, Key: EncodeSlotRanges([]SlotRange{{0, 16383}}), Delta: 9}); err != nil || res.Int != 1 {
		t.Fatalf("second init: %+v %v", res, err)
	}
	for _, op := range []*Op{
		slotSet([]SlotRange{{101, 102}}, SlotMigrating, 7, 2),
		slotSet([]SlotRange{{102, 102}}, SlotNone, 7, 2),
	} {
		if _, err := applyTo(t, m, next(), op); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := ReadSlotTable(m.get)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op   Op
		want bool
	}{
		{Op{Kind: KindSet, Key: owned, Value: b("v")}, true},
		{Op{Kind: KindSet, Key: moving, Value: b("v")}, true}, // a migrating slot is served until the hand-over
		{Op{Kind: KindSet, Key: gone, Value: b("v")}, false},
		{Op{Kind: KindGet, Key: gone}, false},
		{Op{Kind: KindHSet, Key: gone, Keys: keys("f", "v")}, false},
		{Op{Kind: KindMSet, Keys: [][]byte{owned, b("1"), gone, b("2")}}, false},
		{Op{Kind: KindSet, Key: keyOfSlot(5), Value: b("v")}, false}, // never owned
		// A sweep of a dead generation's rows passes: the group cleans its
		// own rows of a hash that moved away.
		{HashSweepOp(gone, 7, keys("f"), true), true},
	} {
		err := tb.Check(&c.op)
		if (err == nil) != c.want {
			t.Fatalf("%s %q: fence %v, want served %v", c.op.Kind, c.op.Key, err, c.want)
		}
		if err != nil {
			se, ok := ParseSlotError(err)
			if !ok || !errors.Is(err, ErrSlotMoved) {
				t.Fatalf("refusal %v is not a slot error", err)
			}
			// The refusal survives the client table's codec (its text).
			_, opErr, derr := DecodeResult(AppendResult(nil, Result{}, err))
			back, ok := ParseSlotError(opErr)
			if derr != nil || !ok || back != se {
				t.Fatalf("decoded refusal %v (%+v), want %+v", opErr, back, se)
			}
			if c.op.Key != nil && string(c.op.Key) == string(gone) && (se.Peer != 7 || se.Epoch != 2 || se.State != SlotNone) {
				t.Fatalf("refusal of the handed-over slot: %+v", se)
			}
		}
	}
	// A stale step is refused and changes nothing.
	if _, err := applyTo(t, m, next(), slotSet([]SlotRange{{101, 101}}, SlotNone, 7, 1)); !errors.Is(err, ErrSlotTransition) {
		t.Fatalf("stale hand-over: %v", err)
	}
}

func TestSlotImportWritesStringsHashesAndDeletions(t *testing.T) {
	str, hash, del, other := keyOfSlot(200), []byte("{"+string(keyOfSlot(200))+"}h"), []byte("{"+string(keyOfSlot(200))+"}d"), keyOfSlot(201)
	m := mem{}
	applyTo(t, m, 1, &Op{Kind: KindSlotInit, Key: EncodeSlotRanges(nil), Delta: 1})
	if _, err := applyTo(t, m, 2, slotSet([]SlotRange{{200, 200}}, SlotImporting, 1, 2)); err != nil {
		t.Fatal(err)
	}
	m[string(del)] = memVal{val: "stale", ver: 2}
	var ks [][]byte
	ttl := EncodeMeta(TypeString, 5000)
	ks = AppendSlotImport(ks, str, ttl, b("sv"), nil, false)
	ks = AppendSlotImport(ks, hash, EncodeMeta(TypeHash, 6000), nil, keys("f1", "a", "f2", "b"), false)
	ks = AppendSlotImport(ks, del, nil, nil, nil, true)
	if _, err := applyTo(t, m, 3, &Op{Kind: KindSlotImport, Keys: append(ks[:len(ks):len(ks)], AppendSlotImport(nil, other, nil, b("x"), nil, false)...)}); !errors.Is(err, ErrSlotTransition) {
		t.Fatalf("import of a slot not importing: %v", err)
	}
	res, err := applyTo(t, m, 3, &Op{Kind: KindSlotImport, Keys: ks})
	if err != nil || res.Int != 3 {
		t.Fatalf("import: %+v %v", res, err)
	}
	// The group owns the slot: reads see what was imported.
	applyTo(t, m, 4, slotSet([]SlotRange{{200, 200}}, SlotOwned, 0, 2))
	read := func(op Op) Result {
		t.Helper()
		op.Now = 1000
		res, err := Read(m.get, m.scan, &op, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := read(Op{Kind: KindGet, Key: str}); string(r.Bulk) != "sv" {
		t.Fatalf("string: %+v", r)
	}
	if r := read(Op{Kind: KindTTL, Key: str}); r.Int != 4 && r.Int != 4000 {
		t.Fatalf("string TTL: %+v", r)
	}
	if r := read(Op{Kind: KindHGet, Key: hash, Keys: keys("f1", "f2")}); len(r.Array) != 2 || string(r.Array[0]) != "a" || string(r.Array[1]) != "b" {
		t.Fatalf("hash: %+v", r)
	}
	if r := read(Op{Kind: KindExists, Keys: [][]byte{del}}); r.Int != 0 {
		t.Fatalf("deleted key: %+v", r)
	}
	// A write to the hash works on the imported generation.
	if _, err := applyTo(t, m, 5, &Op{Kind: KindHSet, Key: hash, Keys: keys("f3", "c"), Now: 1000}); err != nil {
		t.Fatal(err)
	}
	if r := read(Op{Kind: KindHLen, Key: hash}); r.Int != 3 {
		t.Fatalf("HLEN after HSET: %+v", r)
	}
}

// Request marks: an import keeps each client's latest mark; a write of an
// imported slot at or below its client's mark is answered from it (the same
// request) or refused (an older one), a later request and a slot never
// imported are not marked.
func TestSlotImportMarksAndMovedRequest(t *testing.T) {
	k := keyOfSlot(300)
	m := mem{}
	applyTo(t, m, 1, &Op{Kind: KindSlotInit, Key: EncodeSlotRanges([]SlotRange{{301, 301}}), Delta: 1})
	if _, err := applyTo(t, m, 2, slotSet([]SlotRange{{300, 300}}, SlotImporting, 1, 2)); err != nil {
		t.Fatal(err)
	}
	row := func(req uint64, n int64) []byte {
		b, _ := AppendClientRow(nil, req, Result{Kind: ResInt, Int: n, Version: 40}, nil)
		return b
	}
	if _, err := applyTo(t, m, 3, &Op{Kind: KindSlotImport, Keys: AppendSlotClientMark(nil, 9, row(5, 7))}); err != nil {
		t.Fatal(err)
	}
	// An older mark of the client (an earlier move's) does not replace it.
	if _, err := applyTo(t, m, 4, &Op{Kind: KindSlotImport, Keys: AppendSlotClientMark(nil, 9, row(3, 1))}); err != nil {
		t.Fatal(err)
	}
	applyTo(t, m, 5, slotSet([]SlotRange{{300, 300}}, SlotOwned, 1, 2))
	tb, err := ReadSlotTable(m.get)
	if err != nil {
		t.Fatal(err)
	}
	incr := &Op{Kind: KindIncrBy, Key: k, Delta: 1}
	for _, c := range []struct {
		client, req uint64
		op          *Op
		hit         bool
		want        error
		int         int64
	}{
		{9, 5, incr, true, nil, 7},
		{9, 4, incr, true, ErrSlotStaleRequest, 0},
		{9, 6, incr, false, nil, 0},
		{8, 1, incr, false, nil, 0}, // no mark
		{9, 5, &Op{Kind: KindIncrBy, Key: keyOfSlot(301), Delta: 1}, false, nil, 0}, // never imported
		// MSET's values are not keys: a value of the imported slot does not mark it.
		{9, 5, &Op{Kind: KindMSet, Keys: [][]byte{keyOfSlot(301), k}}, false, nil, 0},
	} {
		res, opErr, hit, err := MovedRequest(m.get, tb, c.op, c.client, c.req)
		if err != nil || hit != c.hit || !errors.Is(opErr, c.want) || (c.want == nil && res.Int != c.int) {
			t.Errorf("client %d request %d: %+v %v hit %v %v", c.client, c.req, res, opErr, hit, err)
		}
	}
	// A mark comes only with slots being imported.
	if _, err := applyTo(t, m, 6, &Op{Kind: KindSlotImport, Keys: AppendSlotClientMark(nil, 9, row(8, 1))}); !errors.Is(err, ErrSlotTransition) {
		t.Fatalf("a mark with no slot importing: %v", err)
	}
	// The imported slot moving on (migrating, its entry naming where it
	// goes next): a retry of the request its old group ran is still
	// answered from the mark, not run again.
	if _, err := applyTo(t, m, 7, slotSet([]SlotRange{{300, 300}}, SlotMigrating, 3, 3)); err != nil {
		t.Fatal(err)
	}
	if tb, err = ReadSlotTable(m.get); err != nil {
		t.Fatal(err)
	}
	if res, opErr, hit, err := MovedRequest(m.get, tb, incr, 9, 5); err != nil || !hit || opErr != nil || res.Int != 7 {
		t.Fatalf("a retry at a migrating slot: %+v %v hit %v %v", res, opErr, hit, err)
	}
}
