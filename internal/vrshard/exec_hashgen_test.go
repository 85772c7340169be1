package vrshard

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// An op that creates two hashes (EXEC or EVAL) gives them the generations
// version and version+1<<48 (kv.newHashGen counts the hashes the op creates).
// A crash keeps the first hash's records and loses the second's: replay reads
// the first hash's own metadata record (ReplayReadsOwnRecord), so it does not
// count as created; the number it got must still not be handed to the second
// hash (kv.ownGen), or the two hashes share their field rows.
func TestReplayOfAnOpCreatingTwoHashesKeepsTheirGenerationsApart(t *testing.T) {
	eval := kv.Op{Kind: kv.KindEval, Delta: 2, Keys: [][]byte{[]byte("h1"), []byte("h2")},
		Value: []byte("redis.call('hset', KEYS[1], 'a', '1'); return redis.call('hset', KEYS[2], 'b', '2')")}
	for name, op := range map[string]kv.Op{
		"exec": execOp(nil, []string{"HSET", "h1", "a", "1"}, []string{"HSET", "h2", "b", "2"}),
		"eval": eval,
	} {
		t.Run(name, func(t *testing.T) { replayTwoHashes(t, op) })
	}
}

func replayTwoHashes(t *testing.T, op kv.Op) {
	// h1 is a string that expired before the op (its record is there): the
	// op's HSET h1 creates a hash.
	op.Now = 1000
	ops := []testOp{{op: kv.Op{Kind: kv.KindSet, Key: []byte("h1"), Value: []byte("old"), ExpireAt: 500, Now: 1}}, {op: op, client: 9, seq: 1}}

	// The first run's records of op 2, in the order the engine gets them.
	ref := openMemEngine(t, vfs.NewMem())
	a := newApplier(ref)
	applyAll(t, a, ops[:1])
	a.begin()
	if _, _, err := a.applyOp(&ops[1].op, 2, 1, 9, 1); err != nil {
		t.Fatal(err)
	}
	recs := append([]storage.Record(nil), a.recs...)
	want := map[string]string{}
	for _, r := range recs {
		want[string(r.Key)] = string(r.Value)
	}
	// The crash keeps the client row and h1's records (a prefix), not h2's.
	cut := 0
	for i, r := range recs {
		if string(r.Key) == "h2" {
			cut = i
			break
		}
	}
	if cut == 0 {
		t.Fatalf("no h2 record among %d", len(recs))
	}
	db := openMemEngine(t, vfs.NewMem())
	applyAll(t, newApplier(db), ops[:1])
	for _, r := range recs[:cut] {
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	applyAll(t, newApplier(db), ops)
	got := dump(t, db)
	for _, r := range recs {
		if w := fmt.Sprintf("%q@%d", r.Value, r.Version); got[string(r.Key)] != w && !r.Tombstone {
			t.Errorf("after replay %q = %s, first run %s", r.Key, got[string(r.Key)], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("after replay %d records, first run %d: %v", len(got), len(want), got)
	}
}
