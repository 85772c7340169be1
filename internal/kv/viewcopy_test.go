package kv

import (
	"errors"
	"reflect"
	"testing"
)

// A view copy round-trips, answers an op's view within its rows (none below
// its first row or above its top), and refuses malformed encodings.
func TestViewCopyEncoding(t *testing.T) {
	c := ViewCopy{Top: 900, Starts: []ViewStart{{Op: 5, View: 1}, {Op: 40, View: 3}, {Op: 41, View: 7}, {Op: 900, View: 8}}}
	b := AppendViewCopy(nil, c)
	got, err := DecodeViewCopy(b)
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, c)
	}
	t.Logf("%d rows: %d bytes", len(c.Starts), len(b))
	for _, q := range []struct {
		op, view uint64
		ok       bool
	}{{0, 0, false}, {4, 0, false}, {5, 1, true}, {39, 1, true}, {40, 3, true}, {41, 7, true}, {899, 7, true}, {900, 8, true}, {901, 0, false}} {
		if v, ok := c.View(q.op); v != q.view || ok != q.ok {
			t.Errorf("op %d: view %d %v, want %d %v", q.op, v, ok, q.view, q.ok)
		}
	}
	if got, err := DecodeViewCopy(AppendViewCopy(nil, ViewCopy{Top: 3})); err != nil || got.Top != 3 || len(got.Starts) != 0 {
		t.Fatalf("an empty history: %+v %v", got, err)
	}
	for name, bad := range map[string]ViewCopy{
		"a start above top": {Top: 10, Starts: []ViewStart{{Op: 11, View: 1}}},
		"starts repeated":   {Top: 10, Starts: []ViewStart{{Op: 2, View: 1}, {Op: 2, View: 2}}},
	} {
		if _, err := DecodeViewCopy(AppendViewCopy(nil, bad)); !errors.Is(err, ErrInvalidOp) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, b := range [][]byte{nil, {1}, {1, 200}, append(AppendViewCopy(nil, c), 0)} {
		if _, err := DecodeViewCopy(b); !errors.Is(err, ErrInvalidOp) {
			t.Errorf("%x: %v", b, err)
		}
	}
	// Two copies of one history: the longer is kept, whichever came first.
	short := ViewCopy{Top: 40, Starts: c.Starts[:2]}
	if m := MergeViewCopy(short, c); m.Top != c.Top {
		t.Fatalf("merge kept %+v", m)
	}
	if m := MergeViewCopy(c, short); m.Top != c.Top {
		t.Fatalf("merge kept %+v", m)
	}
}

// An import's view copy is stored under its group's key, only while the
// group imports slots, merged with the copy it holds (the longer kept); its
// key is reserved, so a build that does not know the entry refuses the op
// at its key check and writes nothing (the mixed-version argument).
func TestSlotImportViewCopies(t *testing.T) {
	m := mem{}
	views := func() ViewCopy {
		t.Helper()
		data, _, _, ok, err := m.get(SlotViewsKey(7))
		if err != nil || !ok {
			t.Fatalf("no copy of group 7: %v", err)
		}
		c, err := DecodeViewCopy(data)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	long := ViewCopy{Top: 90, Starts: []ViewStart{{Op: 1, View: 1}, {Op: 50, View: 4}}}
	short := ViewCopy{Top: 60, Starts: long.Starts}
	imp := func(c ViewCopy) *Op { return &Op{Kind: KindSlotImport, Keys: AppendSlotViews(nil, 7, c)} }
	applyTo(t, m, 1, &Op{Kind: KindSlotInit, Key: EncodeSlotRanges([]SlotRange{{301, 301}}), Delta: 1})
	if _, err := applyTo(t, m, 2, imp(long)); !errors.Is(err, ErrSlotTransition) {
		t.Fatalf("a view copy with no slot importing: %v", err)
	}
	if _, err := applyTo(t, m, 3, slotSet([]SlotRange{{300, 300}}, SlotImporting, 7, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := applyTo(t, m, 4, imp(short)); err != nil {
		t.Fatal(err)
	}
	if c := views(); c.Top != 60 {
		t.Fatalf("copy %+v", c)
	}
	if _, err := applyTo(t, m, 5, imp(long)); err != nil {
		t.Fatal(err)
	}
	if _, err := applyTo(t, m, 6, imp(short)); err != nil {
		t.Fatal(err)
	}
	if c := views(); !reflect.DeepEqual(c, long) {
		t.Fatalf("after the longer and then the shorter copy: %+v, want %+v", c, long)
	}
	bad := &Op{Kind: KindSlotImport, Keys: [][]byte{SlotViewsKey(7), slotViewsMark, {1, 5, 2, 1}}}
	if _, err := applyTo(t, m, 7, bad); !errors.Is(err, ErrInvalidOp) {
		t.Fatalf("a malformed copy: %v", err)
	}
	if err := CheckKey(SlotViewsKey(7)); !errors.Is(err, ErrReservedKey) {
		t.Fatalf("a view copy's key is not reserved: %v", err)
	}
}

// The check a session read makes per part of another group per hosted
// group with a copy: one binary search over the group's view changes
// (1,000 here: far more than a group sees).
func BenchmarkViewCopyView(b *testing.B) {
	c := ViewCopy{Top: 1 << 40}
	for i := range 1000 {
		c.Starts = append(c.Starts, ViewStart{Op: uint64(i)<<20 + 1, View: uint64(i + 1)})
	}
	b.Logf("1,000 rows: %d bytes encoded", len(AppendViewCopy(nil, c)))
	for i := 0; b.Loop(); i++ {
		if _, ok := c.View(uint64(i)<<10 + 1); !ok {
			b.Fatal("not covered")
		}
	}
}
