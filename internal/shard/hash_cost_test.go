package shard

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
)

// getCounter is an engine that counts its Gets (the writer's reads) and its
// GetShareds (the read path's); Has and the rest pass through.
type getCounter struct {
	*storage.DB
	gets   int
	shared atomic.Int64 // reads run on many goroutines
}

func (e *getCounter) Get(key []byte) (storage.Value, error) {
	e.gets++
	return e.DB.Get(key)
}

func (e *getCounter) GetShared(key []byte) (storage.Value, error) {
	e.shared.Add(1)
	return e.DB.GetShared(key)
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
// per HSET cannot grow back silently (BenchmarkApplyHash measures it). Its
// row keys live in the batch's scratch arena (kv.ApplyOptions.Scratch): 0.06
// allocations per HSET (the batch's one engine read of the metadata), 1.06
// before.
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
	const bound = 0.5
	t.Logf("%.2f allocations per HSET", n)
	if n > bound {
		t.Errorf("an HSET allocates %.2f times, want at most %.1f", n, bound)
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

// A long batch (and a short one) reads its own earlier writes as writes applied one at a time would, also
// after a write of the batch failed and its records were dropped: random
// INCRs (failing on a key SET to a non-number), HSETs, HDELs, SETs and DELs,
// applied in batches of 100 on one shard and one by one on another.
func TestLongBatchReadsItsStagedWrites(t *testing.T) {
	for _, n := range []int{100, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testBatchReadsItsStagedWrites(t, n) })
	}
}

func testBatchReadsItsStagedWrites(t *testing.T, batch int) {
	batched, _ := openHashShard(t)
	single, _ := openHashShard(t)
	rng := rand.New(rand.NewPCG(27, 2))
	key := func() []byte { return []byte{'k', byte('0' + rng.IntN(8))} }
	field := func() []byte { return []byte{'f', byte('0' + rng.IntN(12))} }
	for round := 0; round < 20; round++ {
		reqs := make([]WriteReq, batch)
		for i := range reqs {
			var op kv.Op
			switch rng.IntN(6) {
			case 0, 1:
				op = kv.Op{Kind: kv.KindIncrBy, Key: key(), Delta: 1}
			case 2:
				op = kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{field(), []byte("v"), field(), []byte("w")}}
			case 3:
				op = kv.Op{Kind: kv.KindHDel, Key: []byte("h"), Keys: [][]byte{field()}}
			case 4:
				op = kv.Op{Kind: kv.KindSet, Key: key(), Value: []byte("x")} // the next INCR of it fails
			case 5:
				k := key()
				op = kv.Op{Kind: kv.KindDel, Key: k, Keys: [][]byte{k}}
			}
			reqs[i] = WriteReq{Op: op}
		}
		if _, err := batched.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			want, werr := single.Write(ctx, reqs[i].Op, level.Async, ReqID{})
			got, gerr := reqs[i].Result, reqs[i].Err
			if fmt.Sprint(gerr) != fmt.Sprint(werr) || got.Kind != want.Kind || got.Int != want.Int || string(got.Bulk) != string(want.Bulk) {
				t.Fatalf("round %d write %d %v %q %q: in a batch %+v, %v; alone %+v, %v",
					round, i, reqs[i].Op.Kind, reqs[i].Op.Key, reqs[i].Op.Keys, got, gerr, want, werr)
			}
		}
	}
}

// failingGet is an engine whose Get of one key fails.
type failingGet struct {
	*storage.DB
	bad string
}

func (e *failingGet) Get(key []byte) (storage.Value, error) {
	if string(key) == e.bad {
		return storage.Value{}, fmt.Errorf("injected read failure")
	}
	return e.DB.Get(key)
}

// A write that staged records and then failed (DEL k bad: k's deletion is
// staged, the read of bad fails) leaves nothing of itself in a long batch's
// index of staged records: the next write's records take the same
// positions, and a read of k must find the engine's k, not whatever record
// now sits where k's deletion was.
func TestFailedWriteLeavesNothingInTheStagedIndex(t *testing.T) {
	for _, n := range []int{300, 33, 2} { // past a chunk, a long batch, a short one
		t.Run(fmt.Sprint(n), func(t *testing.T) { testFailedWriteLeavesNothingStaged(t, n) })
	}
}

func testFailedWriteLeavesNothingStaged(t *testing.T, before int) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(&failingGet{DB: db, bad: "bad"}, Options{Logger: slog.New(slog.DiscardHandler), NoBackgroundSync: true, Durability: level.Async})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close(); db.Close() }()
	if _, err := s.Write(ctx, kv.Op{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("5")}, level.Async, ReqID{}); err != nil {
		t.Fatal(err)
	}
	var reqs []WriteReq
	for i := 0; i < before; i++ {
		reqs = append(reqs, WriteReq{Op: kv.Op{Kind: kv.KindSet, Key: []byte(fmt.Sprint("x", i)), Value: []byte("x")}})
	}
	reqs = append(reqs,
		WriteReq{Op: kv.Op{Kind: kv.KindDel, Key: []byte("k"), Keys: [][]byte{[]byte("k"), []byte("bad")}}},
		WriteReq{Op: kv.Op{Kind: kv.KindSet, Key: []byte("y"), Value: []byte("not a number")}},
		WriteReq{Op: kv.Op{Kind: kv.KindIncrBy, Key: []byte("k"), Delta: 1}})
	if _, err := s.Apply(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	n := len(reqs)
	if reqs[n-3].Err == nil {
		t.Fatalf("DEL k bad succeeded: the injected failure did not happen")
	}
	if r := reqs[n-1]; r.Err != nil || r.Result.Int != 6 {
		t.Fatalf("INCR k after the failed DEL = %+v, %v; want 6", r.Result, r.Err)
	}
}

// The writer's memo of an engine read answers current before the staged
// index (Shard.memoCur) only while no record of its key was staged after
// the read. A write that read the key, checked the records staged so far,
// and then failed (DEL a h bad: a's and h's deletions staged, the read of
// bad fails) is dropped, and the next write's records take its positions:
// the memo must not take them as checked. Here SET h takes the position of
// the failed DEL's first record, and the HSET of h after it must find the
// string, not the memo's hash.
func TestFailedWriteDropsTheCurrentMemo(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(&failingGet{DB: db, bad: "bad"}, Options{Logger: slog.New(slog.DiscardHandler), NoBackgroundSync: true, Durability: level.Async})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close(); db.Close() }()
	for _, op := range []kv.Op{
		{Kind: kv.KindSet, Key: []byte("a"), Value: []byte("1")},
		{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte("f"), []byte("v")}},
	} {
		if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := []WriteReq{
		{Op: kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte("f"), []byte("w")}}},
		{Op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("a"), []byte("h"), []byte("bad")}}},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("h"), Value: []byte("s")}},
		{Op: kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte("f"), []byte("z")}}},
	}
	if _, err := s.Apply(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if reqs[1].Err == nil {
		t.Fatalf("DEL a h bad succeeded: the injected failure did not happen")
	}
	if r := reqs[3]; !errors.Is(r.Err, kv.ErrWrongKind) {
		t.Fatalf("HSET h after SET h in the same batch = %+v, %v; want WRONGTYPE", r.Result, r.Err)
	}
}

// One node writes an HSET of fields that all exist as their rows alone
// (kv.ApplyOptions.SparseHashMeta): the hash's metadata record keeps its
// version, and an HGET of the field still answers the HSET's version (its
// row's), which the read's durability and session checks go by.
func TestHSetOfExistingFieldsWritesOnlyItsRows(t *testing.T) {
	s, e := openHashShard(t)
	h := []byte("h")
	before, err := e.Versions(h)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Write(ctx, kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{[]byte("f1"), []byte("x")}}, level.Async, ReqID{})
	if err != nil || res.Int != 0 {
		t.Fatalf("HSET of an existing field: %+v, %v", res, err)
	}
	after, err := e.Versions(h)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) || after[0].Version != before[0].Version {
		t.Errorf("HSET of an existing field rewrote the metadata record: versions %+v, before %+v", after, before)
	}
	got, err := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: h, Keys: [][]byte{[]byte("f1")}}, level.ConsLinearizable, Session{})
	if err != nil || len(got.Array) != 1 || string(got.Array[0]) != "x" || got.Version != res.Version {
		t.Errorf("HGET h f1 after the HSET: %q at version %d (%v), want \"x\" at %d", got.Array, got.Version, err, res.Version)
	}
	n, err := s.Read(ctx, kv.Op{Kind: kv.KindHLen, Key: h}, level.ConsLinearizable, Session{})
	if err != nil || n.Int != 10 {
		t.Errorf("HLEN h: %d (%v), want 10", n.Int, err)
	}
}

// A pipelined batch of HSETs of existing fields of one hash reads the
// hash's metadata record from the engine once: they stage nothing under
// its key (kv.ApplyOptions.SparseHashMeta), and the first one's decoded
// record (hsetFast's hm) answers the later ones, a new field's too. The
// next Apply reads none: no other append came since.
func TestPipelinedHSetsReadTheMetadataOnce(t *testing.T) {
	s, e := openHashShard(t)
	reqs := make([]WriteReq, 16)
	for round := 0; round < 2; round++ {
		for i := range reqs {
			reqs[i] = WriteReq{Op: kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{{'f', byte('0' + i%10)}, []byte("v")}}}
		}
		reqs[8].Op.Keys[0] = []byte(fmt.Sprint("new", round))
		e.gets = 0
		if _, err := s.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			if reqs[i].Err != nil || reqs[i].Result.Int != map[bool]int64{true: 1, false: 0}[i == 8] {
				t.Fatalf("round %d HSET %d: %+v, %v", round, i, reqs[i].Result, reqs[i].Err)
			}
		}
		if want := 1 - round; e.gets != want {
			t.Errorf("round %d: a batch of 16 HSETs of h read %d records from the engine, want %d", round, e.gets, want)
		}
	}
	n, err := s.Read(ctx, kv.Op{Kind: kv.KindHLen, Key: []byte("h")}, level.ConsLinearizable, Session{})
	if err != nil || n.Int != 12 {
		t.Errorf("HLEN h: %d (%v), want 12", n.Int, err)
	}
}
