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
// did it, as did GETDEL of a value of MaxBulk bytes. Such an op fails
// instead, with nothing written but its row (the error), in the first run
// and in replay alike.
func TestReplyOverTheLargestValueFailsTheOp(t *testing.T) {
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
	for _, i := range []int{n - 2, n - 1} {
		if !strings.Contains(out[i].err, "reply") {
			t.Errorf("op %d: %q, %d bytes: want the reply-too-large error", i+1, out[i].err, len(out[i].res.Bulk))
		}
	}
	want := dump(t, db)
	if _, ok := want["x"]; ok {
		t.Errorf("the failed EXEC wrote x")
	}
	if _, ok := want["big"]; !ok {
		t.Errorf("the failed GETDEL deleted big")
	}
	// Replay over an engine that kept every record: the same outcomes.
	again := applyAll(t, newApplier(db), ops)
	for i := range out {
		if again[i].err != out[i].err || string(again[i].res.Bulk) != string(out[i].res.Bulk) {
			t.Errorf("op %d replayed: %q %q, first run %q %q", i+1, again[i].err, again[i].res.Bulk, out[i].err, out[i].res.Bulk)
		}
	}
	if got := dump(t, db); !maps.Equal(got, want) {
		t.Errorf("replay changed the state")
	}
}
