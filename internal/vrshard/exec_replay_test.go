package vrshard

import (
	"encoding/binary"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A crash replay of an EXEC with a WATCH (TestReplayFinishesATxCommitCutShort
// for EXEC). The EXEC (op 2) watched k1 (live at version 1) and wrote k1 then
// k2; a crash kept its record of k1 (retention had dropped k1's older one)
// and lost k2's. Replay reads k1 through current(), which answers "absent,
// at the op's own version" for a record of the op's own: the watch compares
// unequal, and runExec must recognise the op's own record (kv.ownRecord) as a
// watch that passed, or the replayed EXEC answers a null array and restages
// nothing: k2's write, of a transaction whose "+OK +OK" was acknowledged, is
// lost. Both with the client row lost (the op evaluated anew) and kept
// (replayFilter re-evaluates it for the records the crash lost).
func TestReplayFinishesAWatchedExecCutShort(t *testing.T) {
	for _, keepRow := range []bool{false, true} {
		db := openMemEngine(t, vfs.NewMem())
		// WATCH k1: live at version 1, its origin epoch 0 (a group without
		// a slot table).
		seen := append(binary.AppendUvarint([]byte{3}, 1), 0, 0)
		exec := execOp([]kv.Watch{{Key: []byte("k1"), Seen: seen}}, []string{"SET", "k1", "x"}, []string{"SET", "k2", "y"})
		ops := []testOp{
			{op: kv.Op{Kind: kv.KindSet, Key: []byte("k1"), Value: []byte("old")}},
			{op: exec, client: 9, seq: 1},
		}
		// The engine after the crash: op 1, and op 2's first records.
		recs := []storage.Record{{Key: []byte("k1"), Value: []byte("old"), Version: 1}}
		if keepRow {
			row, _ := kv.AppendClientRow(nil, 1, kv.Result{Kind: kv.ResReply, Bulk: []byte("*2\r\n+OK\r\n+OK\r\n"), Version: 2}, nil)
			recs = append(recs, storage.Record{Key: kv.ClientRowKey(9), Value: row, Version: 2})
		}
		recs = append(recs, storage.Record{Key: []byte("k1"), Value: []byte("x"), Version: 2})
		for _, r := range recs {
			if _, err := db.Append(r); err != nil {
				t.Fatal(err)
			}
		}
		out := applyAll(t, newApplier(db), ops)
		got := dump(t, db)
		if got["k2"] != `"y"@2` || string(out[1].res.Bulk) != "*2\r\n+OK\r\n+OK\r\n" {
			t.Fatalf("row kept %v: after replay: %v, exec answered %q; want k2 written by op 2 and the exec's reply", keepRow, got, out[1].res.Bulk)
		}
	}
}
