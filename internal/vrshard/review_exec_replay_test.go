package vrshard

import (
	"encoding/binary"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// REVIEW (finding 3): TestReplayFinishesATxCommitCutShort for an EXEC with
// a WATCH. The EXEC (op 2) watched k1 (live at version 1) and wrote k1 then
// k2; a crash kept its record of k1 (retention had dropped k1's older one)
// and lost k2's. Replay reads k1 through current(), which answers "absent"
// for a record of the op's own unless the op is a KindTxCommit (or a hash
// write); Observe then sees k1 not live, the watch fails, the replayed EXEC
// answers a null array and restages nothing: k2's write — of a transaction
// whose reply "+OK +OK" was acknowledged — is lost, half a transaction.
func TestReviewReplayFinishesAWatchedExecCutShort(t *testing.T) {
	db := openMemEngine(t, vfs.NewMem())
	seen := binary.AppendUvarint([]byte{1}, 1) // WATCH k1: live at version 1
	exec := execOp([]kv.Watch{{Key: []byte("k1"), Seen: seen}}, []string{"SET", "k1", "x"}, []string{"SET", "k2", "y"})
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("k1"), Value: []byte("old")}},
		{op: exec, client: 9, seq: 1},
	}
	// The engine after the crash: op 1, and op 2's first record.
	for _, r := range []storage.Record{
		{Key: []byte("k1"), Value: []byte("old"), Version: 1},
		{Key: []byte("k1"), Value: []byte("x"), Version: 2},
	} {
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	out := applyAll(t, newApplier(db), ops)
	got := dump(t, db)
	if got["k2"] != `"y"@2` || string(out[1].res.Bulk) != "*2\r\n+OK\r\n+OK\r\n" {
		t.Fatalf("after replay: %v, exec answered %q; want k2 written by op 2 and the exec's reply", got, out[1].res.Bulk)
	}
}
