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

// An op's reply goes into its client's row, a record the engine must
// accept: one over the engine's largest value (MaxValueSize, the front
// door's MaxBulk) failed the batch's Append on every replica, which
// stopped, and again at each restart's replay, a group stopped for good by
// one request. Inside MULTI, KEYS * over ~900,000 keys (a 16 MiB reply)
// did it, as did GETDEL of a value of MaxBulk bytes. Such an op applies and
// answers its reply; its row records that the reply was not kept, which a
// replay answers (a retry after a restart learns the op was applied).
func TestReplyOverTheLargestValueIsNotRecorded(t *testing.T) {
	const max = 4 << 10
	open := func() *storage.DB {
		db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/engine"}}, FS: vfs.NewMem(),
			WriteBufferSize: 97, SegmentSize: 1 << 20, Inline: true, MaxValueSize: max})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	var ops []testOp
	for i := range 300 {
		ops = append(ops, testOp{op: kv.Op{Kind: kv.KindSet, Key: []byte(fmt.Sprintf("key:%08d", i)), Value: []byte("v"), Now: 1}})
	}
	ops = append(ops, testOp{op: kv.Op{Kind: kv.KindSet, Key: []byte("big"), Value: make([]byte, max), Now: 1}, client: 8, seq: 1})
	keys := [][]byte{[]byte("x")}
	exec := kv.Op{Kind: kv.KindExec, Now: 1000, Keys: keys, Delta: 1, Value: kv.EncodeTx(nil, [][][]byte{
		{[]byte("SET"), []byte("x"), []byte("1")}, {[]byte("KEYS"), []byte("*")}}, nil)}
	ops = append(ops,
		testOp{op: exec, client: 9, seq: 1},
		testOp{op: kv.Op{Kind: kv.KindGetDel, Key: []byte("big"), Now: 1}, client: 8, seq: 2})
	db := open()
	out := applyAll(t, newApplier(db), ops) // fails on an Append error
	n := len(ops)
	if out[n-2].err != "" || !strings.Contains(string(out[n-2].res.Bulk), "key:00000299") || out[n-1].err != "" || len(out[n-1].res.Bulk) != max {
		t.Fatalf("first run: EXEC %q (%d bytes), GETDEL %q (%d bytes): want their replies", out[n-2].err, len(out[n-2].res.Bulk), out[n-1].err, len(out[n-1].res.Bulk))
	}
	want := dump(t, db)
	if _, ok := want["x"]; !ok {
		t.Errorf("the EXEC did not write x")
	}
	if _, ok := want["big"]; ok {
		t.Errorf("the GETDEL did not delete big")
	}
	// Replay over an engine that kept every record: the rows' outcomes, the
	// same state.
	again := applyAll(t, newApplier(db), ops)
	for i := range out {
		w := out[i]
		if i >= n-2 {
			w = outcome{err: "ERR the command was applied, but its reply is larger"}
		}
		if !strings.HasPrefix(again[i].err, w.err) || string(again[i].res.Bulk) != string(w.res.Bulk) {
			t.Errorf("op %d replayed: %q %.40q, want %q %.40q", i+1, again[i].err, again[i].res.Bulk, w.err, w.res.Bulk)
		}
	}
	if got := dump(t, db); !maps.Equal(got, want) {
		t.Errorf("replay changed the state")
	}
}
