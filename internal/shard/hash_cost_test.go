package shard

import (
	"log/slog"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
)

// getCounter is an engine that counts its Gets (Has and the rest pass through).
type getCounter struct {
	*storage.DB
	gets int
}

func (e *getCounter) Get(key []byte) (storage.Value, error) {
	e.gets++
	return e.DB.Get(key)
}

// openHashShard opens a shard over a counting engine holding a hash "h" of
// the fields f0..f9.
func openHashShard(tb testing.TB) (*Shard, *getCounter) {
	tb.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: tb.TempDir()}}})
	if err != nil {
		tb.Fatal(err)
	}
	e := &getCounter{DB: db}
	s, err := Open(e, Options{Logger: slog.New(slog.DiscardHandler), NoBackgroundSync: true, Durability: level.Async})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close(); db.Close() })
	fields := make([][]byte, 0, 20)
	for i := 0; i < 10; i++ {
		fields = append(fields, []byte{'f', byte('0' + i)}, []byte("v"))
	}
	if _, err := s.Write(ctx, kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: fields}, level.Async, ReqID{}); err != nil {
		tb.Fatal(err)
	}
	return s, e
}

// An HSET on a single node reads one record from the engine, its hash's
// metadata: whether each field is new comes from the engine's index
// (storage.DB.Has), not from reading the field's row back, which was most
// of what an HSET cost (docs/design/hashes.md, Throughput).
func TestHSetReadsOnlyItsMetadataRecord(t *testing.T) {
	s, e := openHashShard(t)
	for _, fields := range [][]string{{"f1", "x"}, {"f2", "x", "new", "x", "f3", "x"}} {
		op := kv.Op{Kind: kv.KindHSet, Key: []byte("h")}
		for _, f := range fields {
			op.Keys = append(op.Keys, []byte(f))
		}
		e.gets = 0
		if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
			t.Fatal(err)
		}
		if e.gets != 1 {
			t.Errorf("HSET h %q read %d records from the engine, want 1 (the metadata)", fields, e.gets)
		}
	}
}

// The allocations of an HSET of one existing field, through Shard.Apply in
// a batch of 16 as a pipelining client's arrive: a bound, so that the cost
// per HSET cannot grow back silently (BenchmarkApplyHash measures it).
func TestHSetAllocations(t *testing.T) {
	s, _ := openHashShard(t)
	reqs := make([]WriteReq, 16)
	ops := make([]kv.Op, len(reqs))
	for i := range ops {
		ops[i] = kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{{'f', byte('0' + i%10)}, []byte("v")}}
	}
	n := testing.AllocsPerRun(50, func() {
		for i := range reqs {
			reqs[i] = WriteReq{Op: ops[i]}
		}
		if _, err := s.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}) / float64(len(reqs))
	const bound = 2
	t.Logf("%.2f allocations per HSET", n)
	if n > bound {
		t.Errorf("an HSET allocates %.2f times, want at most %d", n, bound)
	}
}
