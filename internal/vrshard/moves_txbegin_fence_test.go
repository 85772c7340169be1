package vrshard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// TxBegin is behind the slot fence, as of its snapshot: Read refuses a key
// of a slot its group handed over (fenceRead), and so must TxBegin of that
// key at the source — a snapshot taken after the hand-over reads the
// source's frozen copy while the destination takes writes, and a read-only
// KEFIR.TX commits without the log, so its stale reads would be answered as
// a committed transaction.
func TestTxBeginAtTheSourceAfterAHandOverIsFenced(t *testing.T) {
	g1, g2, must := twoSlotGroups(t, nil)
	const timeout = 10 * time.Second
	k := "acct"
	s := kv.KeySlot([]byte(k))
	must(g1, set(k, "old"))
	moveSlots(t, g1, g2, []kv.SlotRange{{Start: s, End: s}}, func() {})
	must(g2, set(k, "new")) // acknowledged at the slot's owner
	src := leaderOf(g1, timeout)
	if _, err := src.Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{}); !errors.Is(err, kv.ErrSlotMoved) {
		t.Fatalf("GET at the source after the hand-over: %v, want the fence's refusal", err)
	}
	snap, err := src.TxBegin(context.Background(), []byte(k))
	if err == nil {
		defer snap.Close()
		data, _, _, _, _ := snap.Get([]byte(k))
		t.Fatalf("TxBegin at the source after the hand-over: a snapshot at %d that reads k=%q (the owner has %q); want the fence's refusal",
			snap.Version(), data, "new")
	}
	var se *kv.SlotError
	if !errors.As(err, &se) || se.State != kv.SlotNone || se.Slot != s {
		t.Fatalf("TxBegin at the source after the hand-over: %v, want the read fence's *kv.SlotError (slot %d none)", err, s)
	}
	// The destination's snapshot serves the key: the owner's value.
	dst := leaderOf(g2, timeout)
	snap, err = dst.TxBegin(context.Background(), []byte(k))
	if err != nil {
		t.Fatalf("TxBegin at the slot's owner: %v", err)
	}
	defer snap.Close()
	if data, _, _, _, err := snap.Get([]byte(k)); err != nil || string(data) != "new" {
		t.Fatalf("the owner's snapshot reads %q, %v; want \"new\"", data, err)
	}
}
