package vrshard

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// REVIEW (finding 7): an EXEC that creates two hashes gives them the
// generations version and version+1<<48 (kv.newHashGen counts the hashes
// the op creates). A crash that keeps the first hash's records and loses
// the second's: replay reads the first hash's own metadata record
// (ReplayReadsOwnRecord, now for every RunsCommands kind), so it does not
// count as created, and the second hash gets generation version — the
// first hash's. The two hashes then share their field rows.
// (The same holds for EVAL, before today's change; EXEC inherits it.)
func TestReviewReplayOfAnExecCreatingTwoHashesKeepsTheirGenerationsApart(t *testing.T) {
	// h1 is a string that expired before the EXEC (its record is there):
	// the EXEC's HSET h1 creates a hash.
	exec := execOp(nil, []string{"HSET", "h1", "a", "1"}, []string{"HSET", "h2", "b", "2"})
	exec.Now = 1000
	ops := []testOp{{op: kv.Op{Kind: kv.KindSet, Key: []byte("h1"), Value: []byte("old"), ExpireAt: 500, Now: 1}}, {op: exec, client: 9, seq: 1}}

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
