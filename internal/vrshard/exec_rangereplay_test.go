package vrshard

import (
	"bytes"
	"maps"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A crash replay of an EXEC that mixes range reads with writes: for every
// prefix of the op's records a crash may keep, replay must land exactly the
// first run's records and answer its reply. The range reads (KEYS, SCAN,
// DBSIZE, HGETALL, and COPY of a hash, which lists its rows) list the
// engine's keys, among them the op's own records that survived, which the
// applier's getter reads as "absent at the op's own version": the merged
// scan (kv.mergeScan over the applier's Lister) must hide those and show the
// overlay's, or the records the replay re-evaluates differ.
//
// An EXEC's writes do not depend on its reads; a script's do: the EVAL
// writes a key per key KEYS lists, so a replay that listed its own new keys
// (kept by the crash) would write more.
func TestReplayOfAnExecWithRangeReads(t *testing.T) {
	cmds := [][]string{
		{"KEYS", "*"}, {"SET", "a", "1"}, {"HSET", "h", "f", "v", "g", "w"}, {"DEL", "old"}, {"HGETALL", "h"},
		{"SCAN", "0"}, {"RENAME", "a", "b"}, {"COPY", "h", "h2"}, {"HDEL", "h0", "x"}, {"HGETALL", "h0"},
		{"DBSIZE"}, {"KEYS", "*"}, {"TYPE", "h2"},
	}
	var cs [][][]byte
	for _, c := range cmds {
		var argv [][]byte
		for _, a := range c {
			argv = append(argv, []byte(a))
		}
		cs = append(cs, argv)
	}
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("h"), []byte("h2"), []byte("old"), []byte("h0")}
	exec := kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cs, nil), Keys: keys, Delta: int64(len(keys)), Now: 1000}
	eval := kv.Op{Kind: kv.KindEval, Now: 1000, Value: []byte(`redis.call('set', 'a', '1'); redis.call('del', 'old')
redis.call('hset', 'h', 'f', 'v', 'g', 'w'); redis.call('copy', 'h', 'h2')
local n = 0
for _, k in ipairs(redis.call('keys', '*')) do
  redis.call('set', 'seen:' .. k, redis.call('type', k).ok .. redis.call('hlen', 'h2')); n = n + 1
end
return {n, redis.call('scan', 0), redis.call('dbsize'), redis.call('hgetall', 'h2')}`)}
	for name, op := range map[string]kv.Op{"exec": exec, "eval": eval} {
		t.Run(name, func(t *testing.T) { replayRangeReads(t, op, "h2\r\n") })
	}
}

// RANDOMKEY and HRANDFIELD inside an EXEC or an EVAL pick with the op's
// random source (kv.OpRand: its version and clock): the first run on one
// engine, the same ops on another (a second replica) and every crash replay
// pick the same keys and fields, and a script that writes what it picked
// writes the same records. Fails if the picks draw from anything else (a
// process-wide source: each run picks anew).
func TestReplayOfAnExecWithRandomReads(t *testing.T) {
	var cs [][][]byte
	for _, c := range []string{"SET a 1", "HSET h f v g w k x", "RANDOMKEY", "RANDOMKEY", "HRANDFIELD h -5 WITHVALUES",
		"HRANDFIELD h", "HRANDFIELD h 2", "DEL old", "RANDOMKEY", "HRANDFIELD h0 -3"} {
		var argv [][]byte
		for _, a := range strings.Fields(c) {
			argv = append(argv, []byte(a))
		}
		cs = append(cs, argv)
	}
	keys := [][]byte{[]byte("a"), []byte("h"), []byte("old"), []byte("h0")}
	exec := kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cs, nil), Keys: keys, Delta: int64(len(keys)), Now: 1000}
	eval := kv.Op{Kind: kv.KindEval, Now: 1000, Value: []byte(`redis.call('hset', 'h', 'f', 'v', 'g', 'w', 'k', 'x')
for i = 1, 6 do redis.call('set', 'pick' .. i, redis.call('randomkey')) end
for i, f in ipairs(redis.call('hrandfield', 'h', -4)) do redis.call('set', 'field' .. i, f) end
return {redis.call('randomkey'), redis.call('hrandfield', 'h', 2, 'withvalues'), redis.call('hrandfield', 'h0')}`)}
	// EVAL inside an EXEC: its commands run over the transaction's overlay,
	// between the EXEC's other commands; one raises after writing (its
	// writes stay, as in Redis).
	inTx := [][][]byte{{[]byte("SET"), []byte("a"), []byte("1")},
		{[]byte("EVAL"), eval.Value, []byte("0")},
		{[]byte("EVAL"), []byte("redis.call('set', 'raised', redis.call('randomkey')); redis.call('hset', 'h3', 'f', 'v'); error('boom')"), []byte("0")},
		{[]byte("KEYS"), []byte("*")}, {[]byte("HRANDFIELD"), []byte("h3"), []byte("-2"), []byte("WITHVALUES")}}
	execEval := kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, inTx, nil), Keys: keys, Delta: int64(len(keys)), Now: 1000}
	for name, op := range map[string]kv.Op{"exec": exec, "eval": eval, "eval in exec": execEval} {
		t.Run(name, func(t *testing.T) { replayRangeReads(t, op, "") })
	}
}

// A crash replay of an EXEC and an EVAL holding FLUSHDB: the op's records
// are the flush's mark, the tombstones of the state's keys (old, a, h0 and
// its rows) and then only what it wrote after the flush (b, h2); the writes
// before it (a, h0's new field) are erased. For every prefix of them a crash
// may keep, replay lands exactly the first run's records and reply: the
// commands after the flush read an empty store plus their own writes in
// both runs, whatever own records survived.
func TestReplayOfAnExecWithAFlush(t *testing.T) {
	var cs [][][]byte
	for _, c := range []string{"SET a 1", "HSET h0 z 9", "GET old", "FLUSHDB", "GET a", "HGETALL h0", "SET b 2",
		"HSET h2 f v g w", "KEYS *", "DBSIZE", "HGETALL h2", "RANDOMKEY", "SCAN 0"} {
		var argv [][]byte
		for _, a := range strings.Fields(c) {
			argv = append(argv, []byte(a))
		}
		cs = append(cs, argv)
	}
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("h0"), []byte("h2"), []byte("old")}
	exec := kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cs, nil), Keys: keys, Delta: int64(len(keys)), Now: 1000}
	eval := kv.Op{Kind: kv.KindEval, Now: 1000, Value: []byte(`redis.call('set', 'a', '1'); redis.call('hset', 'h0', 'z', '9')
local before = redis.call('dbsize')
redis.call('flushdb')
redis.call('set', 'b', redis.call('dbsize')); redis.call('hset', 'h2', 'f', 'v', 'g', 'w')
return {before, redis.call('keys', '*'), redis.call('hgetall', 'h0')}`)}
	for name, op := range map[string]kv.Op{"exec": exec, "eval": eval} {
		t.Run(name, func(t *testing.T) { replayRangeReads(t, op, "") })
	}
}

// replayRangeReads checks every crash replay of op (after three ops that
// write old, h0 and a) against its first run; the first run's reply must
// contain mark.
func replayRangeReads(t *testing.T, op kv.Op, mark string) {
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("old"), Value: []byte("o"), Now: 1}},
		{op: kv.Op{Kind: kv.KindHSet, Key: []byte("h0"), Keys: [][]byte{[]byte("x"), []byte("1"), []byte("y"), []byte("2")}, Now: 1}},
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("a"), Value: []byte("before"), Now: 1}},
		{op: op, client: 9, seq: 1},
	}
	// The first run: its records, its reply, the state after it.
	ref := openMemEngine(t, vfs.NewMem())
	a := newApplier(ref)
	applyAll(t, a, ops[:3])
	a.begin()
	res, opErr, err := a.applyOp(&ops[3].op, 4, 1, 9, 1)
	if err != nil || opErr != nil {
		t.Fatal(err, opErr)
	}
	reply := string(res.Bulk)
	recs := append([]storage.Record(nil), a.recs...)
	whole := openMemEngine(t, vfs.NewMem())
	applyAll(t, newApplier(whole), ops)
	want := dump(t, whole)
	t.Logf("first run: %d records, reply %q", len(recs), reply)
	if !strings.Contains(reply, mark) || len(recs) < 5 {
		t.Fatalf("the first run: %d records, reply %q", len(recs), reply)
	}
	if !bytes.HasPrefix(recs[0].Key, kv.ClientRowPrefix) {
		t.Fatalf("the client row is not the first record: %q", recs[0].Key)
	}
	// A crash keeps a prefix of the batch, and the client row is its first
	// record: nothing (the op evaluated anew, its reply too), or the row and
	// some of the others (the reply is the row's; the lost records are
	// re-evaluated, reading the kept ones as the op's own). A row lost with
	// later records kept is not a prefix; replayed so, even a point GET of
	// a key whose older record retention dropped answers differently (the
	// getter reads the op's own record as absent), range reads or none.
	for cut := 0; cut <= len(recs); cut++ {
		db := openMemEngine(t, vfs.NewMem())
		applyAll(t, newApplier(db), ops[:3])
		for _, r := range recs[:cut] {
			if _, err := db.Append(r); err != nil {
				t.Fatal(err)
			}
		}
		out := applyAll(t, newApplier(db), ops)
		if got := dump(t, db); !maps.Equal(got, want) {
			t.Errorf("%d of %d records kept: after replay %v, first run %v", cut, len(recs), got, want)
		}
		if got := string(out[3].res.Bulk); got != reply {
			t.Errorf("%d of %d records kept: replay answered %q, first run %q", cut, len(recs), got, reply)
		}
	}
}
