package shard

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
)

// A read-modify-write reports state it read. Under cad that state may not be
// durable yet; the reply must wait until it is, or a crash takes back a value a
// client was told about (found by review: GETSET and a failed SET NX replied at once).
func TestReadModifyWriteRepliesOnlyWithDurableState(t *testing.T) {
	t.Run("GETSET at cad", func(t *testing.T) {
		n := newNode(t, Options{NoBackgroundSync: true})
		n.write(set("k", "v1"), level.CAD, ReqID{})
		r := n.write(kv.Op{Kind: kv.KindGetSet, Key: []byte("k"), Value: []byte("v2")}, level.CAD, ReqID{})
		if string(r.Bulk) != "v1" {
			t.Fatalf("getset = %q", r.Bulk)
		}
		n.crash(3)
		if v, ok := n.get("k"); !ok || v != "v1" && v != "v2" {
			t.Fatalf("GETSET returned v1 to a client, then a crash lost it: get = %q %v", v, ok)
		}
	})
	t.Run("failed SET NX at sync", func(t *testing.T) {
		n := newNode(t, Options{NoBackgroundSync: true})
		n.write(set("k", "v1"), level.CAD, ReqID{})
		r := n.write(kv.Op{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("x"), Cond: kv.IfAbsent}, level.Sync, ReqID{})
		if r.Kind != kv.ResNil {
			t.Fatalf("SET NX result = %+v, want nil (exists)", r)
		}
		n.crash(4)
		if _, ok := n.get("k"); !ok {
			t.Fatalf("SET NX (sync) told the client k exists, then a crash lost k")
		}
	})
	t.Run("plain SET at cad stays fast", func(t *testing.T) {
		n := newNode(t, Options{NoBackgroundSync: true})
		n.write(set("k", "v1"), level.CAD, ReqID{})
		n.write(set("k", "v2"), level.CAD, ReqID{})
		if st := n.s.Status(); st.Syncs != 0 {
			t.Fatalf("plain cad SETs (nil-externalizing) waited for %d syncs", st.Syncs)
		}
	})
}

// The limit a revealing write waits for (checkLimit) moves when a chunk
// holding checked (sync or cad) writes is appended (Apply reads checkPos,
// applyLimit), and a revealing write after such a chunk in the same batch
// must wait for it: it may report state that chunk wrote.
func TestRevealingWriteAfterACheckedChunkWaitsForIt(t *testing.T) {
	s, _ := openHashShard(t)
	hset := func(f string) WriteReq {
		return WriteReq{Op: kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte(f), []byte("v")}}, Durability: level.Async}
	}
	reqs := []WriteReq{hset("a")} // asks the limit in the first chunk
	for i := range chunk {        // async: the first chunk's append checks nothing
		reqs = append(reqs, WriteReq{Op: kv.Op{Kind: kv.KindSet, Key: fmt.Appendf(nil, "s%d", i), Value: []byte("x")}, Durability: level.Async})
	}
	mset := kv.Op{Kind: kv.KindMSet}
	for i := range chunk {
		mset.Keys = append(mset.Keys, fmt.Appendf(nil, "m%d", i), []byte("x"))
	}
	reqs = append(reqs, WriteReq{Op: mset, Durability: level.CAD}, hset("b"))
	p, err := s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if reqs[i].Err != nil {
			t.Fatalf("write %d: %v", i, reqs[i].Err)
		}
	}
	if cad := storage.Pos(s.checkPos.Load()); cad == 0 || p.SyncPos < cad {
		t.Errorf("the batch waits for position %d, below its cad chunk's %d: the last HSET's reply is not covered", p.SyncPos, cad)
	}
}
