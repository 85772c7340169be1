package shard

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// An APPEND whose result would outgrow the engine's value limit is refused as
// that write's error; the writes batched with it are applied (the engine
// would have failed the whole batch).
func TestAppendPastTheValueLimitIsTheWritesOwnError(t *testing.T) {
	s := limitedShard(t, 1<<10, 0)
	ctx := context.Background()
	chunk := []byte(strings.Repeat("a", 600))
	if _, err := s.Write(ctx, kv.Op{Kind: kv.KindAppend, Key: []byte("k"), Value: chunk}, level.Sync, ReqID{}); err != nil {
		t.Fatal(err)
	}
	reqs := []WriteReq{
		{Op: kv.Op{Kind: kv.KindAppend, Key: []byte("k"), Value: chunk}, Durability: level.Sync},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("x"), Value: []byte("1")}, Durability: level.Sync},
	}
	p, err := s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(reqs[0].Err, kv.ErrInvalidOp) || reqs[1].Err != nil {
		t.Fatalf("APPEND past the limit: %v; SET batched with it: %v", reqs[0].Err, reqs[1].Err)
	}
	for k, want := range map[string]int{"k": 600, "x": 1} {
		r, err := s.Read(ctx, kv.Op{Kind: kv.KindStrlen, Key: []byte(k)}, level.ConsLinearizable, Session{})
		if err != nil || r.Int != int64(want) {
			t.Fatalf("STRLEN %s: %+v, %v; want %d", k, r, err, want)
		}
	}
}

// A SET or MSET with a key or value the engine refuses fails alone; the
// writes batched with it are applied.
func TestOversizeWriteFailsAloneInItsBatch(t *testing.T) {
	s := limitedShard(t, 1<<10, 64)
	ctx := context.Background()
	big, longKey := []byte(strings.Repeat("v", 1<<10+1)), []byte(strings.Repeat("k", 65))
	reqs := []WriteReq{
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("a"), Value: big}, Durability: level.Sync},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("b"), Value: []byte("1")}, Durability: level.Sync},
		{Op: kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("c"), []byte("2"), longKey, []byte("3")}}, Durability: level.Sync},
		{Op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{longKey}}, Durability: level.Sync},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("d"), Value: []byte("4")}, Durability: level.Sync},
	}
	p, err := s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	for i, ok := range []bool{false, true, false, true, true} {
		if (reqs[i].Err == nil) != ok || (!ok && !errors.Is(reqs[i].Err, kv.ErrInvalidOp)) {
			t.Fatalf("write %d: %+v, %v; want accepted=%v (else kv.ErrInvalidOp)", i, reqs[i].Result, reqs[i].Err, ok)
		}
	}
	if reqs[3].Result.Int != 0 {
		t.Fatalf("DEL of an oversize key: %+v; want 0", reqs[3].Result)
	}
	r, err := s.Read(ctx, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")}}, level.ConsLinearizable, Session{})
	if err != nil || r.Array[0] != nil || string(r.Array[1]) != "1" || r.Array[2] != nil || string(r.Array[3]) != "4" {
		t.Fatalf("MGET a b c d: %+v, %v; want [nil 1 nil 4]", r, err)
	}
}

// limitedShard is a shard on an in-memory engine that stores values up to
// maxVal bytes and keys up to maxKey (0: the engine's default).
func limitedShard(t *testing.T, maxVal, maxKey int) *Shard {
	t.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/data"}}, FS: vfs.NewMem(), MaxValueSize: maxVal, MaxKeySize: maxKey})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	return s
}
