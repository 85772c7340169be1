package vrshard

import (
	"strconv"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A write answered from a moved slot's request mark (kv.MovedRequest: the
// request already ran at the slot's old group) writes nothing but its client
// row. Replayed after a restart as the engine's last op, applyOp finds its
// client row and calls replayFilter, which must evaluate the op as the same
// client's request: evaluated as client 0 it skipped MovedRequest and staged
// the op's records, which settle kept (the engine has no record of the key
// at that version) — the retried INCRBY that ran once at the source ran
// again at the destination, behind an answer that says it did not.
func TestReplayOfAMarkAnsweredWriteWritesNothing(t *testing.T) {
	k := []byte("counter")
	s := kv.KeySlot(k)
	rs := kv.EncodeSlotRanges([]kv.SlotRange{{Start: s, End: s}})
	const client = 9
	row, _ := kv.AppendClientRow(nil, 1, kv.Result{Kind: kv.ResInt, Int: 6}, nil) // the source ran request 1: INCRBY -> 6
	var imp [][]byte
	imp = kv.AppendSlotImport(imp, k, nil, []byte("6"), nil, false)
	imp = kv.AppendSlotClientMark(imp, client, row)
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSlotInit, Key: kv.EncodeSlotRanges(nil), Delta: 1}},
		{op: kv.Op{Kind: kv.KindSlotSet, Key: rs, Cond: kv.Cond(kv.SlotImporting), Value: []byte(strconv.Itoa(1)), Delta: 2}},
		{op: kv.Op{Kind: kv.KindSlotImport, Keys: imp}},
		{op: kv.Op{Kind: kv.KindSlotSet, Key: rs, Cond: kv.Cond(kv.SlotOwned), Value: []byte(strconv.Itoa(1)), Delta: 2}},
		// The client's retry of request 1 at the destination.
		{op: kv.Op{Kind: kv.KindIncrBy, Key: k, Delta: 1}, client: client, seq: 1},
	}
	db := openMemEngine(t, vfs.NewMem())
	first := applyAll(t, newApplier(db), ops)
	if first[4].err != "" || first[4].res.Int != 6 || dump(t, db)["counter"] != `"6"@3` {
		t.Fatalf("first run: %+v, state %v; want the mark's answer 6 and counter untouched", first[4], dump(t, db))
	}
	// A restart: the engine holds every op; the log replays them.
	again := applyAll(t, newApplier(db), ops)
	if got := dump(t, db)["counter"]; got != `"6"@3` || again[4].res.Int != 6 {
		t.Fatalf("after the replay counter is %s (answer %+v); want \"6\"@3: the retry answered from the mark ran again at replay", got, again[4])
	}
}
