package kv

import (
	"fmt"
	"slices"
	"testing"
)

// A small KEYS inside a writing op (a prefix of 10 keys among 10,000),
// with an applier's ordered Lister (ApplyOptions.OrderedList: walked as
// listed, stopped at the limit or the budget) and with an unordered one
// (the range listed and sorted first, the path before the budget). The
// budget's wrapper (overlay.budgeted) is on both.
func BenchmarkSmallKeysInOp(b *testing.B) {
	var keys []string
	m := map[string][]byte{}
	for i := range 10_000 {
		k := fmt.Sprintf("user:%05d", i)
		keys = append(keys, k)
		m[k] = []byte("v")
	}
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
		v, ok := m[string(k)]
		return v, nil, 1, ok, nil
	}
	list := func(start, end []byte, visit func([]byte) bool) error {
		i, _ := slices.BinarySearch(keys, string(start))
		for ; i < len(keys) && (end == nil || keys[i] < string(end)); i++ {
			if !visit([]byte(keys[i])) {
				return nil
			}
		}
		return nil
	}
	for _, ordered := range []bool{false, true} {
		b.Run(fmt.Sprintf("ordered=%v", ordered), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
				o.list, o.listOrdered = list, ordered
				if _, err := o.exec(&Op{Kind: KindSet, Key: []byte("w"), Value: []byte("1")}); err != nil {
					b.Fatal(err)
				}
				res, err := o.exec(&Op{Kind: KindScan, Key: []byte("user:0012"), End: []byte("user:0013"), Limit: OpScanLimit})
				if err != nil || len(res.Array) != 20 {
					b.Fatal(len(res.Array), err)
				}
			}
		})
	}
}

// A point read inside an op: the range-read budget must add nothing to it.
func BenchmarkGetInOp(b *testing.B) {
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) { return []byte("v"), nil, 1, true, nil }
	o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
	sub := &Op{Kind: KindGet, Key: []byte("k")}
	b.ReportAllocs()
	for b.Loop() {
		sub.Kind, sub.Key = KindGet, []byte("k")
		if _, err := o.exec(sub); err != nil {
			b.Fatal(err)
		}
	}
}
