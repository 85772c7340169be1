package shard

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A single node's multi-record writes are all-or-nothing across a crash
// that tears the log (vfs.Mem keeps a random prefix of what was not
// synced): an unacknowledged HSET of many fields and an MSET of many keys
// survive whole or not at all. Before the engine's batches were atomic
// (storage's flagBatchCont) a crash kept a prefix of the op's records: some
// fields or keys, and a hash whose HLEN (its metadata record, written
// first) counted fields it did not have.
func TestMultiRecordWritesAreAllOrNothingAcrossACrash(t *testing.T) {
	const fields, keys = 30, 30
	outcomes := map[string]int{}
	for seed := int64(1); seed <= 40; seed++ {
		fs := vfs.NewMem()
		db, s := openTornable(t, fs, seed)
		if _, err := s.Write(ctx, set("base", "v"), level.Sync, ReqID{}); err != nil {
			t.Fatal(err)
		}
		hset := kv.Op{Kind: kv.KindHSet, Key: []byte("hash")}
		for i := range fields {
			hset.Keys = append(hset.Keys, []byte(fmt.Sprint("f", i)), []byte("value-of-some-length"))
		}
		mset := kv.Op{Kind: kv.KindMSet}
		for i := range keys {
			mset.Keys = append(mset.Keys, []byte(fmt.Sprintf("m%02d", i)), []byte("value-of-some-length"))
		}
		// Async: nothing syncs them, so the crash tears them (the next
		// append puts each one's records in the file, unsynced).
		for _, op := range []kv.Op{hset, mset, set("zz", "x")} {
			if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
				t.Fatal(err)
			}
		}
		fs.Crash(rand.New(rand.NewSource(seed)))
		_ = s.Close()
		_ = db.Close()
		db, s = openTornable(t, fs, seed)
		read := func(op kv.Op) kv.Result {
			r, err := s.Read(ctx, op, level.ConsLinearizable, Session{})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		n := read(kv.Op{Kind: kv.KindHLen, Key: []byte("hash")}).Int
		all := len(read(kv.Op{Kind: kv.KindHGetAll, Key: []byte("hash")}).Array) / 2
		present := 0
		for i := range keys {
			if read(kv.Op{Kind: kv.KindGet, Key: []byte(fmt.Sprintf("m%02d", i))}).Kind == kv.ResBulk {
				present++
			}
		}
		switch {
		case n != int64(all):
			t.Errorf("seed %d: HLEN %d but HGETALL has %d fields: a torn HSET", seed, n, all)
		case all != 0 && all != fields:
			t.Errorf("seed %d: %d of %d fields of one HSET survived", seed, all, fields)
		case present != 0 && present != keys:
			t.Errorf("seed %d: %d of %d keys of one MSET survived", seed, present, keys)
		default:
			outcomes[fmt.Sprintf("hset:%v mset:%v", all == fields, present == keys)]++
		}
		_ = s.Close()
		_ = db.Close()
	}
	t.Logf("outcomes over 40 torn crashes: %v", outcomes)
	if outcomes["hset:true mset:true"] == 0 || outcomes["hset:false mset:false"] == 0 {
		t.Errorf("the crashes did not tear the writes both ways (%v): the test exercises nothing", outcomes)
	}
}
