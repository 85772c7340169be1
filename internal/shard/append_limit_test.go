package shard

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// An APPEND whose result would outgrow the engine's value limit is refused as
// that write's error; the writes batched with it are applied (the engine
// would have failed the whole batch).
func TestAppendPastTheValueLimitIsTheWritesOwnError(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/data"}}, FS: vfs.NewMem(), MaxValueSize: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	ctx := context.Background()
	chunk := []byte(strings.Repeat("a", 600))
	if _, err := s.Write(ctx, Op{Kind: KindAppend, Key: []byte("k"), Value: chunk}, level.Sync, ReqID{}); err != nil {
		t.Fatal(err)
	}
	reqs := []WriteReq{
		{Op: Op{Kind: KindAppend, Key: []byte("k"), Value: chunk}, Durability: level.Sync},
		{Op: Op{Kind: KindSet, Key: []byte("x"), Value: []byte("1")}, Durability: level.Sync},
	}
	p, err := s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(reqs[0].Err, ErrInvalidOp) || reqs[1].Err != nil {
		t.Fatalf("APPEND past the limit: %v; SET batched with it: %v", reqs[0].Err, reqs[1].Err)
	}
	for k, want := range map[string]int{"k": 600, "x": 1} {
		r, err := s.Read(ctx, Op{Kind: KindStrlen, Key: []byte(k)}, level.ConsLinearizable, Session{})
		if err != nil || r.Int != int64(want) {
			t.Fatalf("STRLEN %s: %+v, %v; want %d", k, r, err, want)
		}
	}
}
