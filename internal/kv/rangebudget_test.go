package kv

import (
	"errors"
	"fmt"
	"testing"
)

// budgetStore is a map store of n string keys k00000... (expired ones too,
// if expiredFrom < n: keys from it on expired at the op's clock, 1000) and
// a Lister of it that names ghosts as well (deleted keys an engine has not
// compacted yet: a replica-local superset, which the budget must not count).
func budgetStore(n, expiredFrom, ghosts int) (Getter, Lister) {
	m := map[string][]byte{}
	var names []string
	for i := range n {
		k := fmt.Sprintf("k%05d", i)
		var meta []byte
		if i >= expiredFrom {
			meta = EncodeMeta(TypeString, 500)
		}
		m[k] = meta
		names = append(names, k)
	}
	for i := range ghosts {
		names = append(names, fmt.Sprintf("g%05d", i))
	}
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
		meta, ok := m[string(k)]
		if !ok {
			return nil, nil, 0, false, nil
		}
		return []byte("v"), meta, 1, true, nil
	}
	list := func(start, end []byte, visit func([]byte) bool) error {
		for _, k := range names {
			if k >= string(start) && (end == nil || k < string(end)) && !visit([]byte(k)) {
				return nil
			}
		}
		return nil
	}
	return get, list
}

// keysPages reads the whole keyspace as KEYS and DBSIZE do inside an op
// (command.Keys: KindScan pages of OpScanLimit through overlay.exec) and
// returns how many keys it read.
func keysPages(o *overlay) (int, error) {
	n := 0
	var from []byte
	for {
		res, err := o.exec(&Op{Kind: KindScan, Key: from, Limit: OpScanLimit})
		if err != nil {
			return n, err
		}
		n += len(res.Array) / 2
		if len(res.Array)/2 < OpScanLimit {
			return n, nil
		}
		from = append(append([]byte(nil), res.Array[len(res.Array)-2]...), 0)
	}
}

// An op's range reads walk at most OpRangeReadKeys keys, all its commands
// together: a KEYS (or DBSIZE) over more fails with ErrOpRangeReads, one over
// exactly that many does not. Without the budget a writing EXEC's DBSIZE
// walked every key on every replica's apply path (~0.6 s at 400,000 keys).
func TestOpRangeReadsBudget(t *testing.T) {
	for _, c := range []struct {
		keys int
		fail bool
	}{{OpRangeReadKeys, false}, {OpRangeReadKeys + 1, true}} {
		get, list := budgetStore(c.keys, c.keys, 0)
		o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
		o.list = list
		n, err := keysPages(o)
		if c.fail != errors.Is(err, ErrOpRangeReads) || (!c.fail && n != c.keys) {
			t.Fatalf("%d keys: read %d, error %v (want failure: %v)", c.keys, n, err, c.fail)
		}
	}
}

// The budget is one per op, across its commands; a key is counted whether
// it is expired or not and whether a pattern matches it (it is walked), a
// deleted key a replica's listing still names is not (that would differ by
// replica), a point read (HGET's field row) is not, and once it is spent
// the op's point reads and writes (a flush) still run.
func TestOpRangeReadsBudgetCounts(t *testing.T) {
	// 30 keys, the last 10 expired: a read walks 30, answers 20.
	for _, ghosts := range []int{0, 500} {
		get, list := budgetStore(30, 20, ghosts)
		o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
		o.list, o.walkCap = list, 50
		res, err := o.exec(&Op{Kind: KindScan, Limit: 1000})
		if err != nil || len(res.Array) != 40 || o.walked != 30 {
			t.Fatalf("ghosts %d: first read: %d keys, %d walked, %v", ghosts, len(res.Array)/2, o.walked, err)
		}
		// A range of 10 keys: 40 walked.
		if _, err := o.exec(&Op{Kind: KindScan, Key: []byte("k00010"), End: []byte("k00020"), Limit: 1000}); err != nil || o.walked != 40 {
			t.Fatalf("ghosts %d: second read: %d walked, %v", ghosts, o.walked, err)
		}
		// The whole keyspace again: 30 more than the 10 left.
		if _, err := o.exec(&Op{Kind: KindScan, Limit: 1000}); !errors.Is(err, ErrOpRangeReads) {
			t.Fatalf("ghosts %d: third read over the budget: %v", ghosts, err)
		}
		// Every later range read fails at once, even of a range with no
		// key (a script's pcall loop lists no range again).
		if _, err := o.exec(&Op{Kind: KindScan, Key: []byte("x"), Limit: 1000}); !errors.Is(err, ErrOpRangeReads) {
			t.Fatalf("ghosts %d: a read after the budget is spent: %v", ghosts, err)
		}
		if res, err := o.exec(&Op{Kind: KindGet, Key: []byte("k00001")}); err != nil || string(res.Bulk) != "v" {
			t.Fatalf("ghosts %d: GET after the budget: %q %v", ghosts, res.Bulk, err)
		}
		if _, err := o.exec(&Op{Kind: KindSet, Key: []byte("w"), Value: []byte("1")}); err != nil {
			t.Fatalf("ghosts %d: SET after the budget: %v", ghosts, err)
		}
		if _, err := o.exec(&Op{Kind: KindFlush}); err != nil {
			t.Fatalf("ghosts %d: FLUSHDB after the budget: %v", ghosts, err)
		}
		var out []string
		if err := o.emitAll(func(k, _, _ []byte, _ bool) { out = append(out, string(k)) }); err != nil || len(out) != 31 {
			// Its mark and a tombstone for each of the 30 stored keys
			// (expired too); the SET before it is erased.
			t.Fatalf("ghosts %d: the flush emitted %d records %v, %v", ghosts, len(out), out, err)
		}
	}
}

// A hash's rows count as keys walked (HGETALL, HKEYS, HVALS, HSCAN); a
// one-field HGET is a lookup and does not.
func TestOpRangeReadsBudgetHash(t *testing.T) {
	get, list := budgetStore(0, 0, 0)
	o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
	o.list, o.walkCap = list, 5
	fields := [][]byte{}
	for i := range 4 {
		fields = append(fields, []byte(fmt.Sprintf("f%d", i)), []byte("v"))
	}
	if _, err := o.exec(&Op{Kind: KindHSet, Key: []byte("h"), Keys: fields}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if res, err := o.exec(&Op{Kind: KindHGet, Key: []byte("h"), Keys: [][]byte{[]byte("f1")}}); err != nil || len(res.Array) != 1 || string(res.Array[0]) != "v" {
			t.Fatalf("HGET: %q %v", res.Array, err)
		}
	}
	if res, err := o.exec(&Op{Kind: KindHGetAll, Key: []byte("h")}); err != nil || len(res.Array) != 8 || o.walked != 4 {
		t.Fatalf("HGETALL: %d elements, %d walked, %v", len(res.Array), o.walked, err)
	}
	if _, err := o.exec(&Op{Kind: KindHGetAll, Key: []byte("h")}); !errors.Is(err, ErrOpRangeReads) {
		t.Fatalf("HGETALL over the budget: %v", err)
	}
}

// With an applier's Lister in key order (ApplyOptions.OrderedList, both
// appliers') a range read over the budget stops listing at it: a DBSIZE over
// a big keyspace lists the budget's keys and one, not the keyspace (before,
// the whole range was listed and sorted first: ~0.4 s of apply at 1.6
// million keys). The answers are the unordered path's.
func TestOpRangeReadsBudgetStopsTheListing(t *testing.T) {
	const n, budget = 5000, 100
	get, list := budgetStore(n, n, 0)
	listed := 0
	counting := func(start, end []byte, visit func([]byte) bool) error {
		return list(start, end, func(k []byte) bool { listed++; return visit(k) })
	}
	for _, ordered := range []bool{false, true} {
		o := newOverlay(get, 7, &Op{Kind: KindExec, Now: 1000}, 0)
		o.list, o.listOrdered, o.walkCap = counting, ordered, budget
		listed = 0
		res, err := o.exec(&Op{Kind: KindScan, Key: []byte("k00100"), Limit: 50})
		if err != nil || len(res.Array) != 100 || string(res.Array[0]) != "k00100" || string(res.Array[98]) != "k00149" {
			t.Fatalf("ordered %v: a page of 50: %d keys, %v", ordered, len(res.Array)/2, err)
		}
		if ordered && listed > 50 {
			t.Fatalf("ordered: a page of 50 listed %d keys", listed)
		}
		if _, err := o.exec(&Op{Kind: KindScan, Limit: OpScanLimit}); !errors.Is(err, ErrOpRangeReads) {
			t.Fatalf("ordered %v: over the budget: %v", ordered, err)
		}
		if ordered && listed > 50+budget-50+1 {
			t.Fatalf("ordered: listed %d keys for a budget of %d", listed, budget)
		}
		if !ordered && listed < n {
			t.Fatalf("unordered: listed %d (the whole range: %d)", listed, n)
		}
	}
}
