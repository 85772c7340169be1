package vrshard

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A cross-group transaction's ops (prepare, decide, resolve; kv/xgtx.go)
// replayed after an engine crash — part of an op's records kept, part lost
// — leave the state (user keys, locks, prepared and decision records) and
// give the results of a run that never crashed, with plain writes of locked
// keys refused in between. Two slots of the one group ({a} and {b}) are the
// transactions' two parts, {a} their primary. The resolve emits the
// prepared record's deletion last: a crash that kept it kept every record
// before it, so its replay — which, retention having dropped the record's
// older version, reads it as absent and lands nothing — loses nothing.
func TestXgtxReplayAfterEngineCrash(t *testing.T) {
	checkReplayAfterCrash(t, func(seed uint64) []testOp {
		rng := rand.New(rand.NewPCG(seed, 3))
		keys := [2][]string{{"{a}1", "{a}2"}, {"{b}1", "{b}2"}}
		db := openMemEngine(t, vfs.NewMem())
		a := newApplier(db)
		type open struct {
			id      string
			decided bool
			commit  bool
		}
		var txs []*open
		var ops []testOp
		var seq uint64
		prepare := func(id string, side int) kv.Op {
			var writes []kv.Op
			var checks []kv.TxCheck
			for _, k := range keys[side] {
				if rng.IntN(3) == 0 {
					continue
				}
				switch rng.IntN(3) {
				case 0:
					writes = append(writes, kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: fmt.Appendf(nil, "%s", id)})
				case 1:
					writes = append(writes, kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte(k)}})
				}
				v, err := db.Get([]byte(k))
				if err != nil && !errors.Is(err, storage.ErrNotFound) {
					t.Fatal(err)
				}
				checks = append(checks, kv.TxCheck{Key: []byte(k), Version: v.Version})
			}
			if len(checks) == 0 {
				checks = append(checks, kv.TxCheck{Key: []byte(keys[side][0])})
			}
			op, err := kv.NewTxPrepare([]byte(id), []byte(keys[0][0]), 0, kv.TxOrigin{}, checks, writes)
			if err != nil {
				t.Fatal(err)
			}
			return op
		}
		for i := range 70 {
			var o testOp
			switch r := rng.IntN(10); {
			case r < 3 || len(txs) == 0:
				tx := &open{id: fmt.Sprint("t", i)}
				txs = append(txs, tx)
				o.op = prepare(tx.id, 0)
			case r < 5:
				tx := txs[rng.IntN(len(txs))]
				o.op = prepare(tx.id, 1)
			case r < 7:
				tx := txs[rng.IntN(len(txs))]
				tx.decided, tx.commit = true, rng.IntN(3) > 0
				o.op = kv.NewTxDecide([]byte(tx.id), []byte(keys[0][0]), tx.commit)
			case r < 8:
				tx := txs[rng.IntN(len(txs))]
				o.op = kv.NewTxResolve([]byte(tx.id), []byte(keys[1][0]), tx.commit)
			default:
				k := []byte(keys[rng.IntN(2)][rng.IntN(2)])
				o.op = kv.Op{Kind: kv.KindIncrBy, Key: k, Delta: 1}
				if rng.IntN(2) == 0 {
					o.op = kv.Op{Kind: kv.KindSet, Key: k, Value: fmt.Appendf(nil, "%d", i)}
				}
				seq++
				o.client, o.seq = 7, seq
			}
			ops = append(ops, o)
			a.begin()
			if _, _, err := a.applyOp(&ops[i].op, uint64(i+1), 1, o.client, o.seq); err != nil {
				t.Fatal(err)
			}
			if err := a.flush(); err != nil {
				t.Fatal(err)
			}
		}
		return ops
	})
}

// Every crash point inside a resolve: the engine kept the ops before it and
// a prefix of the resolve's records, in the order it emitted them (the
// engine recovers a prefix of its log). Replay must reach the state of a run
// that never crashed. With the prepared record's deletion emitted before the
// prepared-parts list (the first order), the prefix that kept the deletion
// and lost the list left a part listed that no record backs: its replay read
// the record as gone and restaged nothing.
func TestXgtxResolveCutShortAnywhere(t *testing.T) {
	prep, err := kv.NewTxPrepare([]byte("t1"), []byte("{a}1"), 1, kv.TxOrigin{},
		[]kv.TxCheck{{Key: []byte("{a}1"), Version: 1}, {Key: []byte("{a}2")}},
		[]kv.Op{{Kind: kv.KindSet, Key: []byte("{a}1"), Value: []byte("new")}, {Kind: kv.KindSet, Key: []byte("{a}2"), Value: []byte("two")}})
	if err != nil {
		t.Fatal(err)
	}
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("{a}1"), Value: []byte("old")}},
		{op: prep},
		{op: kv.NewTxDecide([]byte("t1"), []byte("{a}1"), true)},
	}
	ref := openMemEngine(t, vfs.NewMem())
	a := newApplier(ref)
	var last []storage.Record // the decide's records, in emission order
	for i := range ops {
		a.begin()
		if _, _, err := a.applyOp(&ops[i].op, uint64(i+1), 1, 0, 0); err != nil {
			t.Fatal(err)
		}
		if i == len(ops)-1 {
			for _, r := range a.recs {
				r.Key, r.Value = append([]byte(nil), r.Key...), append([]byte(nil), r.Value...)
				last = append(last, r)
			}
		}
		if err := a.flush(); err != nil {
			t.Fatal(err)
		}
	}
	want := dump(t, ref)
	for p := 0; p <= len(last); p++ {
		db := openMemEngine(t, vfs.NewMem())
		b := newApplier(db)
		for i := range ops[:len(ops)-1] {
			b.begin()
			if _, _, err := b.applyOp(&ops[i].op, uint64(i+1), 1, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := b.flush(); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range last[:p] {
			if _, err := db.Append(r); err != nil {
				t.Fatal(err)
			}
		}
		applyAll(t, newApplier(db), ops)
		if got := dump(t, db); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("crash after %d of the decide's %d records: state after replay\n%v\nwant\n%v", p, len(last), got, want)
		}
	}
}
