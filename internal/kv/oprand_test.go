package kv

import "testing"

// An op's random source is a function of its version and clock: the same on
// every replica and in replay, another for another op.
func TestOpRandIsTheOps(t *testing.T) {
	seq := func(version uint64, now int64) [8]int {
		r := NewOpRand(version, now)
		var out [8]int
		for i := range out {
			out[i] = r.IntN(1000)
		}
		return out
	}
	first, again := seq(7, 1000), seq(7, 1000)
	if first != again {
		t.Fatal("one op, two sequences")
	}
	if first == seq(8, 1000) || first == seq(7, 1001) {
		t.Fatal("two ops, one sequence")
	}
}

// An EXEC that holds a script or a flush may write keys it does not name, so
// it counts as writing the whole keyspace, as an EVAL or a flush does (vrshard's index of writes
// by key); one without a script writes only its keys.
func TestExecWithAScriptOrAFlushWritesAll(t *testing.T) {
	tx := func(cmds ...[][]byte) *Op {
		return &Op{Kind: KindExec, Value: EncodeTx(nil, cmds, nil)}
	}
	set := [][]byte{[]byte("SET"), []byte("k"), []byte("v")}
	for _, c := range []struct {
		op   *Op
		want bool
	}{
		{tx(set), false},
		{tx(set, [][]byte{[]byte("eval"), []byte("return 1"), []byte("0")}), true},
		{tx([][]byte{[]byte("EVALSHA"), []byte("abc"), []byte("0")}), true},
		{tx(set, [][]byte{[]byte("flushdb")}), true},
		{tx([][]byte{[]byte("FLUSHALL"), []byte("ASYNC")}), true},
		{&Op{Kind: KindExec, Value: []byte("not a transaction")}, false},
	} {
		if got := c.op.WritesAll(); got != c.want {
			t.Errorf("%q: WritesAll %v", c.op.Value, got)
		}
	}
}
