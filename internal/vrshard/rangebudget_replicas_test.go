package vrshard

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// The range-read budget (kv.OpRangeReadKeys) answers alike on every replica
// whatever each engine holds besides the state: replica B's engine also
// holds reserved rows of its own (as its applied mark and view history) and
// tombstones of keys deleted long ago that A's compaction dropped (ghosts),
// and both apply the same batch: new keys, a deletion and an overwrite of
// the engine's keys still pending in the batch's overlay, a key created and
// deleted in the batch, then EXECs and
// scripts whose range reads walk exactly the budget (answered) or one key
// more (the error), and a FLUSHDB earlier in the batch. The replies and the
// user keys' state must be the same on both: counting a reserved row or a
// ghost, or stopping the ordered listing on one, would fail one replica's
// read at the budget and not the other's.
func TestRangeReadBudgetIsTheSameOnEveryReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 keys")
	}
	tx := func(keys []string, cmds ...string) kv.Op {
		var cs [][][]byte
		for _, c := range cmds {
			var argv [][]byte
			for _, a := range strings.Fields(c) {
				argv = append(argv, []byte(a))
			}
			cs = append(cs, argv)
		}
		var ks [][]byte
		for _, k := range keys {
			ks = append(ks, []byte(k))
		}
		return kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cs, nil), Keys: ks, Delta: int64(len(ks)), Now: 1000}
	}
	eval := func(body string) kv.Op { return kv.Op{Kind: kv.KindEval, Now: 1000, Value: []byte(body)} }
	// The state: OpRangeReadKeys+1 keys k000000..., of which the batch
	// below deletes one and adds x: the budget exactly.
	var load []testOp
	const n = kv.OpRangeReadKeys + 1
	for lo := 0; lo < n; lo += 1000 {
		op := kv.Op{Kind: kv.KindMSet, Now: 1}
		for i := lo; i < min(lo+1000, n); i++ {
			op.Keys = append(op.Keys, []byte(fmt.Sprintf("k%06d", i)), []byte("v"))
		}
		load = append(load, testOp{op: op})
	}
	load = append(load, testOp{op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k000001")}, Now: 1}})
	load = append(load, testOp{op: kv.Op{Kind: kv.KindSet, Key: []byte("k000001"), Value: []byte("back"), Now: 1}})
	// One batch (applyAll applies 5 ops a batch: padded to start one).
	for len(load)%5 != 0 {
		load = append(load, testOp{op: kv.Op{Kind: kv.KindSet, Key: []byte("k000000"), Value: []byte("v"), Now: 1}})
	}
	budgetOps := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("x"), Value: []byte("1"), Now: 1000}},                 // pending new key
		{op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k000005"), []byte("k000006")}, Now: 1000}}, // pending deletions
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("k000007"), Value: []byte("w"), Now: 1000}},           // pending overwrite
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("tmp"), Value: []byte("1"), Now: 1000}},               // created and
		{op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("tmp")}, Now: 1000}},                        // deleted in the batch
		{op: tx([]string{"y"}, "DBSIZE", "SET y 1", "GET x")},                                          // at the budget (y after it)
		{op: tx([]string{"z"}, "SET z 1", "DBSIZE", "GET x"), client: 7, seq: 1},                       // one over
		{op: eval(`local n = redis.call('dbsize'); redis.call('set', 'n1', n); return n`)},
		{op: eval(`redis.call('set', 'w', '1'); local r = redis.pcall('keys', '*'); redis.call('set', 'n2', type(r) == 'table' and #r or r.err); return r.err`)},
		{op: eval(`redis.call('del', 'n1', 'n2', 'w', 'y', 'z'); return #redis.call('keys', 'k*')`)},
		{op: tx(nil, "SCAN 0 COUNT 5", "KEYS k00000*", "RANDOMKEY", "DBSIZE")},
		{op: kv.Op{Kind: kv.KindFlush}}, // a flush earlier in the batch
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("after"), Value: []byte("1"), Now: 1000}},
		{op: tx(nil, "KEYS *", "DBSIZE", "SCAN 0")},
	}
	for len(budgetOps)%5 != 0 {
		budgetOps = append(budgetOps, testOp{op: kv.Op{Kind: kv.KindSet, Key: []byte("pad"), Value: []byte("1"), Now: 1000}})
	}
	ops := append(load, budgetOps...)
	var outs [2][]outcome
	var dumps [2]map[string]string
	for r := range 2 {
		db := openMemEngine(t, vfs.NewMem())
		a := newApplier(db)
		applyAll(t, a, ops[:len(load)])
		if r == 1 {
			// Replica B: its own reserved rows, and tombstones of
			// deleted keys its compaction has not dropped (both at
			// the last op's version, as a replica's mark is).
			v := uint64(len(load))
			var recs []storage.Record
			for i := range 50 {
				recs = append(recs, storage.Record{Key: kv.ReservedKey(fmt.Sprintf("test-local/%03d", i)), Value: []byte("r"), Version: v})
				recs = append(recs, storage.Record{Key: []byte(fmt.Sprintf("ghost%03d", i)), Tombstone: true, Version: v})
				recs = append(recs, storage.Record{Key: []byte(fmt.Sprintf("k000000g%03d", i)), Tombstone: true, Version: v})
			}
			if _, err := db.Append(recs...); err != nil {
				t.Fatal(err)
			}
		}
		// The budget's batch, on an applier past replay (a fresh one
		// would replay nothing: every op is newer than the engine).
		a = newApplier(db)
		a.begin()
		for j, o := range budgetOps {
			res, opErr, err := a.applyOp(&o.op, uint64(len(load)+j+1), 1, o.client, o.seq)
			if err != nil {
				t.Fatalf("replica %d op %d: %v", r, j, err)
			}
			oc := outcome{res: res}
			if opErr != nil {
				oc.err = opErr.Error()
			}
			outs[r] = append(outs[r], oc)
		}
		if err := a.flush(); err != nil {
			t.Fatal(err)
		}
		dumps[r] = map[string]string{}
		for k, v := range dump(t, db) {
			if !kv.IsReserved([]byte(k)) || kv.IsHashRow([]byte(k)) || strings.Contains(k, "client") {
				dumps[r][k] = v
			}
		}
		delete(dumps[r], string(kv.ReservedKey("test-local/")))
	}
	errElem := "-" + kv.ErrOpRangeReads.Error()
	for j := range budgetOps {
		a, b := outs[0][j], outs[1][j]
		if string(a.res.Bulk) != string(b.res.Bulk) || a.res.Int != b.res.Int || a.err != b.err {
			t.Errorf("op %d: replica A answered %.300q %d %q, B %.300q %d %q", j, a.res.Bulk, a.res.Int, a.err, b.res.Bulk, b.res.Int, b.err)
		}
	}
	for k := range dumps[1] {
		if strings.Contains(k, "test-local") {
			delete(dumps[1], k)
		}
	}
	if !maps.Equal(dumps[0], dumps[1]) {
		t.Errorf("the replicas' states differ: %d and %d keys", len(dumps[0]), len(dumps[1]))
		for k, v := range dumps[0] {
			if dumps[1][k] != v {
				t.Errorf("%q: A %s, B %s", k, v, dumps[1][k])
			}
		}
	}
	// And the answers are the budget's: at it DBSIZE answers, one over it
	// fails; a script's call raises (n1 unwritten), pcall returns.
	o := outs[0]
	if got := string(o[5].res.Bulk); got != fmt.Sprintf("*3\r\n:%d\r\n+OK\r\n$1\r\n1\r\n", kv.OpRangeReadKeys) {
		t.Errorf("EXEC at the budget: %q", got)
	}
	if got := string(o[6].res.Bulk); got != "*3\r\n+OK\r\n"+errElem+"\r\n$1\r\n1\r\n" {
		t.Errorf("EXEC over the budget: %.300q", got)
	}
	if got := string(o[7].res.Bulk); !strings.Contains(got, "may walk at most") {
		t.Errorf("script over the budget: %.300q", got)
	}
	if got := string(o[13].res.Bulk); got != "*3\r\n*1\r\n$5\r\nafter\r\n:1\r\n*2\r\n$1\r\n0\r\n*1\r\n$5\r\nafter\r\n" {
		t.Errorf("EXEC after a flush earlier in the batch: %q", got)
	}
	for j, oc := range o {
		t.Logf("op %d: %.120q %q", j, oc.res.Bulk, oc.err)
	}
}
