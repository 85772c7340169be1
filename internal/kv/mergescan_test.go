package kv

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMergeScanMatchesAModel checks the overlay's merged scan (mergeScan,
// through scanRange over an applier's Lister, unordered or in key order, and
// over a reader's Scanner)
// against a model: the store's map with the overlay's writes applied,
// sorted. Random stores, overlays (writes, new keys, deletions), ranges and
// limits.
func TestMergeScanMatchesAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	key := func() string { return fmt.Sprintf("k%02d", rng.IntN(40)) }
	for iter := range 3000 {
		store := map[string]string{}
		for range rng.IntN(25) {
			store[key()] = "s" + key()
		}
		get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
			v, ok := store[string(k)]
			if !ok {
				return nil, nil, 0, false, nil
			}
			return []byte(v), nil, 1, true, nil
		}
		sorted := func() []string {
			ks := make([]string, 0, len(store))
			for k := range store {
				ks = append(ks, k)
			}
			slices.Sort(ks)
			return ks
		}
		// The applier's Lister: any order, a superset (absent keys too).
		list := func(start, end []byte, visit func([]byte) bool) error {
			ks := append(sorted(), "k99-absent")
			rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
			for _, k := range ks {
				if k >= string(start) && (end == nil || k < string(end)) && !visit([]byte(k)) {
					return nil
				}
			}
			return nil
		}
		// An applier's Lister in key order (ApplyOptions.OrderedList),
		// a superset too: absent keys among the others (a replica's
		// uncompacted deletions) and one key before the range.
		ghosts := []string{"k99-absent"}
		for range rng.IntN(6) {
			ghosts = append(ghosts, key()+"-absent")
		}
		ordered := func(start, end []byte, visit func([]byte) bool) error {
			ks := append(sorted(), ghosts...)
			slices.Sort(ks)
			ks = slices.Compact(ks)
			for i, k := range ks {
				if (k >= string(start) || (i+1 < len(ks) && ks[i+1] >= string(start))) && (end == nil || k < string(end)) && !visit([]byte(k)) {
					return nil
				}
			}
			return nil
		}
		scan := func(start, end []byte, limit int, visit func(k, d, m []byte, v uint64) bool) error {
			n := 0
			for _, k := range sorted() {
				if k < string(start) || (end != nil && k >= string(end)) {
					continue
				}
				n++
				if !visit([]byte(k), []byte(store[k]), nil, 1) || (limit > 0 && n >= limit) {
					return nil
				}
			}
			return nil
		}
		o := newOverlay(get, 7, &Op{}, 0)
		switch iter % 3 {
		case 0:
			o.list = list
		case 1:
			o.scan = scan
		case 2:
			o.list, o.listOrdered = ordered, true
		}
		model := map[string]string{}
		for k, v := range store {
			model[k] = v
		}
		for range rng.IntN(15) {
			k := key()
			if _, ok := o.writes[k]; !ok {
				o.order = append(o.order, k)
			}
			if rng.IntN(3) == 0 {
				o.writes[k] = overlayRec{tomb: true}
				delete(model, k)
			} else {
				v := "o" + key()
				o.writes[k] = overlayRec{data: []byte(v)}
				model[k] = v
			}
		}
		start := []byte(key())
		var end []byte
		if rng.IntN(2) == 0 {
			end = []byte(key())
		}
		limit := rng.IntN(8)
		var want []string
		for k, v := range model {
			if k >= string(start) && (end == nil || k < string(end)) {
				want = append(want, k+"="+v)
			}
		}
		slices.Sort(want)
		if limit > 0 && len(want) > limit {
			want = want[:limit]
		}
		var got []string
		// Through the range-read budget, which counts what the merged
		// scan hands on, whatever the Lister (ghosts included) names.
		err := o.budgeted(o.scanRange)(start, end, limit, func(k, d, _ []byte, _ uint64) bool {
			got = append(got, string(k)+"="+string(d))
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if o.walked != len(want) {
			t.Fatalf("iteration %d: [%s, %s) limit %d: the budget counted %d keys walked, want %d", iter, start, end, limit, o.walked, len(want))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("iteration %d: [%s, %s) limit %d over store %v, overlay order %v:\n got %v\nwant %v", iter, start, end, limit, store, o.order, got, want)
		}
	}
}

// A user-key scan of an op (skipReserved) never reads the reserved keys'
// range, and finds the user keys on both sides of it, at every limit.
func TestSkipReservedReadsNoReservedKey(t *testing.T) {
	keys := []string{"a", "\xff\xff\x00", string(ReservedKey("h/1")), string(ReservedKey("z")), "\xff\xffz", "\xff\xff\xff"}
	var read []string
	scan := func(start, end []byte, limit int, visit func(k, d, m []byte, v uint64) bool) error {
		n := 0
		for _, k := range keys {
			if k < string(start) || (end != nil && k >= string(end)) {
				continue
			}
			read = append(read, k)
			n++
			if !visit([]byte(k), []byte("v"), nil, 1) || (limit > 0 && n >= limit) {
				return nil
			}
		}
		return nil
	}
	want := []string{"a", "\xff\xff\x00", "\xff\xffz", "\xff\xff\xff"}
	for limit := 0; limit <= 5; limit++ {
		read = nil
		var got []string
		if err := ScanUser(skipReserved(scan), nil, nil, max(limit, 1)*10, 0, func(k, _ []byte, _ uint64) {
			got = append(got, string(k))
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: %q, want %q", limit, got, want)
		}
		for _, k := range read {
			if IsReserved([]byte(k)) {
				t.Fatalf("limit %d: read the reserved key %q", limit, k)
			}
		}
		var page []string
		err := skipReserved(scan)([]byte("a"), nil, limit, func(k, _, _ []byte, _ uint64) bool {
			page = append(page, string(k))
			return true
		})
		if n := min(limit, len(want)); err != nil || (limit > 0 && !slices.Equal(page, want[:n])) || (limit == 0 && !slices.Equal(page, want)) {
			t.Fatalf("limit %d: page %q, %v", limit, page, err)
		}
	}
}

// A writing op's range reads list the applier's state (an unordered Lister)
// once per range, not once per page: KEYS and SCAN inside an op read their
// range in pages (OpScanLimit keys), and ScanUser reads again after a page
// of expired or reserved keys, each a read of [from, end) with the same end.
// Listing the whole rest of the range for each page made a KEYS over n keys
// list about n²/(2·page) of them (2.5 per key at 400,000 keys, 5.5 at a
// million), all in the apply path of every replica.
func TestMergeScanListsARangeOnce(t *testing.T) {
	const n, page = 2000, 10
	var sorted []string
	for i := range n {
		sorted = append(sorted, fmt.Sprintf("k%05d", i))
	}
	listed := 0
	list := func(start, end []byte, visit func([]byte) bool) error {
		for _, k := range sorted {
			if k >= string(start) && (end == nil || k < string(end)) {
				listed++
				if !visit([]byte(k)) {
					return nil
				}
			}
		}
		return nil
	}
	for _, expired := range []bool{false, true} {
		meta := []byte(nil)
		if expired {
			meta = EncodeMeta(TypeString, 500) // expired at the op's clock, 1000
		}
		get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
			return []byte("v"), meta, 1, true, nil
		}
		o := newOverlay(get, 7, &Op{}, 0)
		o.list = list
		listed = 0
		got := 0
		var from []byte
		for {
			// A page as command.Keys reads one (kv.KindScan through
			// overlay.exec: skipReserved, ScanUser at the op's clock).
			visited := 0
			var last []byte
			err := ScanUser(skipReserved(o.scanRange), from, nil, page, 1000, func(k, _ []byte, _ uint64) {
				visited++
				last = k
			})
			if err != nil {
				t.Fatal(err)
			}
			got += visited
			if visited < page {
				break
			}
			from = append(append([]byte(nil), last...), 0)
		}
		want := n
		if expired {
			want = 0
		}
		if got != want || listed > 2*n {
			t.Fatalf("expired %v: read %d keys of %d, listing %d keys for it (at most %d)", expired, got, want, listed, 2*n)
		}
	}
}

// A keyspace read of an op's command (KindScan through overlay.exec, as
// KEYS, SCAN and DBSIZE make) skips the reserved keys' range (skipReserved):
// an applier's Lister would otherwise list, and its getter read, every hash
// row and client row of the store.
func TestOpKeyspaceReadSkipsReservedKeys(t *testing.T) {
	store := map[string]bool{"a": true, "z": true, "\xff\xff\xff": true}
	for i := range 100 {
		store[string(ReservedKey(fmt.Sprintf("row/%03d", i)))] = true
	}
	reserved := 0
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
		if IsReserved(k) {
			reserved++
		}
		if !store[string(k)] {
			return nil, nil, 0, false, nil
		}
		return []byte("v"), nil, 1, true, nil
	}
	list := func(start, end []byte, visit func([]byte) bool) error {
		for k := range store {
			if k >= string(start) && (end == nil || k < string(end)) && !visit([]byte(k)) {
				return nil
			}
		}
		return nil
	}
	o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
	o.list = list
	res, err := o.exec(&Op{Kind: KindScan, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Array) != 6 || reserved != 0 {
		t.Fatalf("read %d keys (%q), %d reserved keys read through the getter", len(res.Array)/2, res.Array, reserved)
	}
}
