package shard

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

var flushOp = kv.Op{Kind: kv.KindFlush}

// A flush deletes every user key, those staged earlier in its own batch
// included, keeps the shard's reserved rows, and a write after it in the
// same batch survives it.
func TestFlushDeletesEveryUserKey(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true})
	for i := range 100 {
		n.write(set(fmt.Sprint("k", i), "v"), level.Sync, ReqID{Client: 7, Seq: uint64(i + 1)})
	}
	n.write(kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k5")}}, level.Sync, ReqID{})
	reqs := []WriteReq{
		{Op: set("staged", "x"), Durability: level.Sync},
		{Op: flushOp, Durability: level.Sync},
		{Op: set("after", "y"), Durability: level.Sync},
	}
	p, err := n.s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.s.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Err != nil {
			t.Fatalf("%v: %v", r.Op.Kind, r.Err)
		}
	}
	for i := range 100 {
		if _, ok := n.get(fmt.Sprint("k", i)); ok {
			t.Fatalf("k%d survived the flush", i)
		}
	}
	if _, ok := n.get("staged"); ok {
		t.Fatal("a key staged before the flush in its batch survived it")
	}
	if v, ok := n.get("after"); !ok || v != "y" {
		t.Fatalf("the write after the flush: %q %v", v, ok)
	}
	// The client table (a reserved row) outlives a flush: a retry of an old
	// request is still answered from it.
	r := n.write(set("k1", "again"), level.Sync, ReqID{Client: 7, Seq: 100})
	if r.Kind != kv.ResOK {
		t.Fatalf("retry: %+v", r)
	}
	if _, ok := n.get("k1"); ok {
		t.Fatal("a deduplicated retry wrote again")
	}
}

// FLUSHDB on one node is all-or-nothing across a power cut at any point of
// its batch: the crash keeps a random prefix of the unsynced log, which may
// end inside the flush's tombstones; the engine then drops the batch whole
// (storage's flagBatchCont; TestMultiRecordWritesAreAllOrNothingAcrossACrash).
// finishFlush still completes a flush cut short in a log an older build
// wrote (no batch marks: its mark is the batch's first record). The flush is
// small enough that some seeds keep all of it. A hash's field rows, reserved
// keys, go too.
func TestFlushIsAllOrNothingAcrossACrash(t *testing.T) { tornFlushes(t, flushOp, "") }

// An EXEC holding FLUSHDB and a write after it (MULTI, FLUSHDB, SET after 1,
// EXEC) is as all-or-nothing: its batch is the flush's mark, its tombstones
// and the write, so a crash keeps the flush and the write together or
// neither (the flush without the write would be half a transaction).
func TestExecWithAFlushIsAllOrNothingAcrossACrash(t *testing.T) {
	tx := kv.EncodeTx(nil, [][][]byte{{[]byte("FLUSHDB")}, {[]byte("SET"), []byte("after"), []byte("1")}}, nil)
	tornFlushes(t, kv.Op{Kind: kv.KindExec, Value: tx, Keys: [][]byte{[]byte("after")}, Delta: 1}, "after")
}

// tornFlushes tears the write flush (a flush, or an EXEC holding one that
// also writes the key after, unless "") at 40 random points and checks that
// each crash kept all of it or none.
func tornFlushes(t *testing.T, flush kv.Op, after string) {
	const keys, hashFields = 40, 10
	outcomes := map[string]int{}
	for seed := int64(1); seed <= 40; seed++ {
		fs := vfs.NewMem()
		open := func() (*storage.DB, *Shard) { return openTornable(t, fs, seed) }
		db, s := open()
		batch := make([]WriteReq, 0, keys+1)
		for i := range keys {
			batch = append(batch, WriteReq{Op: set(fmt.Sprintf("key:%04d", i), "value"), Durability: level.Sync})
		}
		// A hash: its field rows (reserved keys) go with the flush too.
		hset := kv.Op{Kind: kv.KindHSet, Key: []byte("hash")}
		for i := range hashFields {
			hset.Keys = append(hset.Keys, []byte(fmt.Sprint("f", i)), []byte("v"))
		}
		batch = append(batch, WriteReq{Op: hset, Durability: level.Sync})
		p, err := s.Apply(ctx, batch)
		if err == nil {
			err = s.Wait(ctx, p)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Async: nothing syncs the flush, so the crash tears it.
		if _, err := s.Write(ctx, flush, level.Async, ReqID{}); err != nil {
			t.Fatal(err)
		}
		// The engine writes its buffer to the file at the next append:
		// this one puts the flush's records in the file, unsynced.
		if _, err := s.Write(ctx, set("zz", "x"), level.Async, ReqID{}); err != nil {
			t.Fatal(err)
		}
		fs.Crash(rand.New(rand.NewSource(seed)))
		_ = s.Close()
		_ = db.Close()
		db, s = open()
		present := 0
		for i := range keys {
			r, err := s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte(fmt.Sprintf("key:%04d", i))}, level.ConsLinearizable, Session{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Kind == kv.ResBulk {
				present++
			}
		}
		if after != "" {
			r, err := s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte(after)}, level.ConsLinearizable, Session{})
			if err != nil {
				t.Fatal(err)
			}
			if (r.Kind == kv.ResBulk) != (present == 0) {
				t.Errorf("seed %d: %d of %d keys survived the EXEC's flush, and its write after it: %v", seed, present, keys, r.Kind == kv.ResBulk)
			}
		}
		rows := 0
		if err := db.Scan(kv.ReservedPrefix, nil, 0, 0, func(k []byte, _ storage.Value) bool {
			if kv.IsHashRow(k) {
				rows++
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		switch {
		case present == 0 && rows == 0:
			outcomes["flushed"]++
		case present == keys && rows == hashFields:
			outcomes["kept"]++
		case rows != 0 && present == 0, rows != hashFields && present == keys:
			t.Errorf("seed %d: %d of %d hash rows survived a FLUSHDB that left %d of %d keys", seed, rows, hashFields, present, keys)
		default:
			t.Errorf("seed %d: %d of %d keys survived a torn FLUSHDB", seed, present, keys)
		}
		_ = s.Close()
		_ = db.Close()
	}
	t.Logf("outcomes over 40 torn flushes: %v", outcomes)
	if outcomes["flushed"] == 0 || outcomes["kept"] == 0 {
		t.Errorf("the crashes did not tear the flush both ways (%v): the test exercises nothing", outcomes)
	}
}

// A flush of many keys costs one read per key: its reads must not search the
// tombstones it has staged so far (the writer's chunk search is linear, so a
// flush of a million keys once took hours).
func TestFlushOfManyKeysIsLinear(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true, Logger: quiet})
	const keys = 50_000
	reqs := make([]WriteReq, 0, 1000)
	for i := 0; i < keys; i += 1000 {
		reqs = reqs[:0]
		for j := i; j < i+1000; j++ {
			reqs = append(reqs, WriteReq{Op: set(fmt.Sprintf("key:%07d", j), "v"), Durability: level.Async})
		}
		if _, err := n.s.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	n.write(flushOp, level.Sync, ReqID{})
	d := time.Since(start)
	t.Logf("FLUSHDB of %d keys: %v", keys, d)
	if d > 8*time.Second {
		t.Fatalf("FLUSHDB of %d keys took %v", keys, d)
	}
	if _, ok := n.get("key:0000000"); ok {
		t.Fatal("a key survived")
	}
}

// openTornable opens a shard on fs for a torn-crash test: a small write
// buffer, so that the append after an unsynced write puts it in the file,
// where fs.Crash keeps a random prefix of it; zero-filled segments or not
// by seed.
func openTornable(t *testing.T, fs vfs.FS, seed int64) (*storage.DB, *Shard) {
	t.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/data"}}, FS: fs, WriteBufferSize: 1 << 10, NoZeroFill: seed%2 == 0})
	if err != nil {
		t.Fatalf("seed %d: open storage: %v", seed, err)
	}
	s, err := Open(db, Options{NoBackgroundSync: true, Logger: quiet})
	if err != nil {
		t.Fatalf("seed %d: open shard: %v", seed, err)
	}
	return db, s
}

// Over an engine that lists keys by Scan (no keyLister: live keys only), a
// flush deletes a key that the engine holds deleted and its own batch
// writes again: Scan does not list it, so the batch's staged keys must.
func TestFlushDeletesAKeyRewrittenAfterADeletionWithoutAKeyLister(t *testing.T) {
	s, _ := openFastShard(t, true, true)
	k := []byte("k")
	for _, reqs := range [][]WriteReq{
		{{Op: set("k", "1")}, {Op: kv.Op{Kind: kv.KindDel, Key: k, Keys: [][]byte{k}}}},
		{{Op: set("k", "2")}, {Op: flushOp}},
	} {
		if _, err := s.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if r.Err != nil {
				t.Fatalf("%v: %v", r.Op.Kind, r.Err)
			}
		}
	}
	if res, err := s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: k}, level.ConsLinearizable, Session{}); err != nil || res.Kind != kv.ResNil {
		t.Errorf("GET k after SET k, DEL k, then SET k and FLUSHDB in one batch: %+v, %v; want nil", res, err)
	}
}
