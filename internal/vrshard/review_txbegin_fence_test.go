package vrshard

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// REVIEW (finding 2): TxBegin is not behind the slot fence. Read refuses a
// key of a slot its group handed over (fenceRead); TxBegin of that key at
// the source answers a snapshot taken after the hand-over, which reads the
// source's frozen copy while the destination takes writes. A read-only
// KEFIR.TX commits without the log, so its stale reads are answered as a
// committed transaction.
func TestReviewTxBeginAtTheSourceAfterAHandOverIsFenced(t *testing.T) {
	log := slog.New(slog.NewTextHandler(&logBuffer{}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nt := newNodeTransports(t, 3, log)
	g1 := groupWith(t, nt, 1, log, nil)
	g2 := groupWith(t, nt, 2, log, nil)
	const timeout = 10 * time.Second
	must := func(g *cluster, op kv.Op) kv.Result {
		t.Helper()
		res, err := g.write(op, shard.ReqID{}, timeout)
		if err != nil {
			t.Fatalf("%s: %v", op.Kind, err)
		}
		return res
	}
	all := []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}
	must(g1, slotOp(kv.KindSlotInit, all, 0, 0, 1))
	must(g2, slotOp(kv.KindSlotInit, nil, 0, 0, 1))
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
}
