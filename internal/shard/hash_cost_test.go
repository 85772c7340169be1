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

// An HGET reads each field's row as a point lookup (kv.PointRange served
// by snapshotScan) and answers what the scan it replaces answered: HGETALL
// (a real scan) and HMGET agree on every field, present, deleted, never
// set, and of a hash deleted and created again (whose old rows remain).
func TestHGetPointReadsAgreeWithScan(t *testing.T) {
	s, _ := openHashShard(t)
	write := func(op kv.Op) {
		t.Helper()
		if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
			t.Fatalf("%v: %v", op.Kind, err)
		}
	}
	h := []byte("h")
	write(kv.Op{Kind: kv.KindHDel, Key: h, Keys: [][]byte{[]byte("f1"), []byte("f2")}})
	write(kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{[]byte("f3"), []byte("new"), []byte("f\x00"), []byte("zero")}})
	write(kv.Op{Kind: kv.KindDel, Key: []byte("g"), Keys: [][]byte{[]byte("g")}})
	write(kv.Op{Kind: kv.KindHSet, Key: []byte("g"), Keys: [][]byte{[]byte("a"), []byte("1")}})
	write(kv.Op{Kind: kv.KindDel, Key: []byte("g"), Keys: [][]byte{[]byte("g")}})
	write(kv.Op{Kind: kv.KindHSet, Key: []byte("g"), Keys: [][]byte{[]byte("b"), []byte("2")}})
	for _, key := range []string{"h", "g", "none"} {
		all, err := s.Read(ctx, kv.Op{Kind: kv.KindHGetAll, Key: []byte(key)}, level.Consistency{}, Session{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for i := 0; i+1 < len(all.Array); i += 2 {
			want[string(all.Array[i])] = string(all.Array[i+1])
		}
		if key == "g" && (len(want) != 1 || want["b"] != "2") {
			t.Fatalf("HGETALL g = %q, want b 2 only (the hash was deleted and created again)", all.Array)
		}
		fields := [][]byte{[]byte("f0"), []byte("f1"), []byte("f2"), []byte("f3"), []byte("f"), []byte("f\x00"), []byte("a"), []byte("b"), []byte("zz")}
		got, err := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: []byte(key), Keys: fields}, level.Consistency{}, Session{})
		if err != nil || len(got.Array) != len(fields) {
			t.Fatalf("HMGET %s = %+v, %v", key, got, err)
		}
		for i, f := range fields {
			w, ok := want[string(f)]
			if g := got.Array[i]; (g != nil) != ok || string(g) != w {
				t.Errorf("HGET %s %q = %q (present %v), HGETALL has %q (present %v)", key, f, g, g != nil, w, ok)
			}
		}
	}
}
