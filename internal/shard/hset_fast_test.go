package shard

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
)

// plainEngine is a storage.DB seen through Engine alone: no change count
// (changeCounter), no probe (prober), no shared reads.
type plainEngine struct{ Engine }

// openFastShard opens a shard over a fresh engine, with hsetFast or
// without it (every HSET through kv.ApplyHashTo); plain: the engine is a
// plainEngine.
func openFastShard(t testing.TB, fast, plain bool) (*Shard, *storage.DB) {
	t.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	var e Engine = db
	if plain {
		e = plainEngine{db}
	}
	s, err := Open(e, Options{Logger: slog.New(slog.DiscardHandler), NoBackgroundSync: true, Durability: level.Async})
	if err != nil {
		t.Fatal(err)
	}
	s.noHSetFast = !fast
	t.Cleanup(func() { s.Close(); db.Close() })
	return s, db
}

// engineRecords lists every record db holds (reserved keys too: the rows
// and markers), with its version and meta.
func engineRecords(t *testing.T, db *storage.DB) []string {
	t.Helper()
	var out []string
	if err := db.Scan(nil, nil, 0, 0, func(key []byte, v storage.Value) bool {
		out = append(out, fmt.Sprintf("%q=%q meta %x v%d", key, v.Data, v.Meta, v.Version))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// The single node's one-field HSET (hsetFast) answers and writes what
// kv.ApplyHashTo does: random batches of one-field HSET, HSETNX and HMSET
// mixed with the writes that change a hash under it (a new field, HDEL of
// its last field, DEL, SET over it, EXPIRE and PERSIST, RENAME either way,
// HINCRBY, a failing write whose records are dropped, COPY either way, a
// DEL of both, an EXEC of HSET, HDEL and DEL, FLUSHDB; a quarter of them
// with a request id, whose client table row follows the write's records),
// in batches of one to 600 requests (past a chunk: hm survives an append),
// with a clock that passes the expiries, applied to two shards — one with
// the fast path, one without. Every reply and every record (rows and
// markers included) agree; also over an engine without a change count (hm
// is then dropped at each Apply's start, and by a chunk's append).
func TestHSetFastAgreesWithKv(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprint("plain=", plain), func(t *testing.T) { testHSetFastAgreesWithKv(t, plain) })
	}
}

func testHSetFastAgreesWithKv(t *testing.T, plain bool) {
	fast, fdb := openFastShard(t, true, plain)
	slow, sdb := openFastShard(t, false, false)
	rng := rand.New(rand.NewPCG(32, 7))
	hashes := []string{"h1", "h2"}
	field := func() []byte { return fmt.Appendf(nil, "f%02d", rng.IntN(30)) }
	now := int64(1_000_000)
	var seq uint64
	for round := range 150 {
		now += int64(rng.IntN(300))
		n := 1 + rng.IntN(8)
		switch rng.IntN(6) {
		case 0:
			n = 1 + rng.IntN(600)
		case 1:
			n = 1
		}
		reqs := make([]WriteReq, n)
		for i := range reqs {
			h := []byte(hashes[rng.IntN(len(hashes))])
			val := fmt.Appendf(nil, "v%d.%d", round, i)
			var op kv.Op
			switch r := rng.IntN(44); {
			case r < 22:
				op = kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{field(), val}}
			case r < 24:
				op = kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{field(), val}, Cond: kv.IfAbsent}
			case r < 26:
				op = kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{field(), val}, Delta: 1}
			case r < 27:
				op = kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{field(), val, field(), val}}
			case r < 31:
				op = kv.Op{Kind: kv.KindHDel, Key: h, Keys: [][]byte{field()}}
			case r < 32:
				op = kv.Op{Kind: kv.KindDel, Key: h, Keys: [][]byte{h}}
			case r < 33:
				op = kv.Op{Kind: kv.KindSet, Key: h, Value: val}
			case r < 35:
				op = kv.Op{Kind: kv.KindExpire, Key: h, ExpireAt: now + int64(rng.IntN(400))}
			case r < 36:
				op = kv.Op{Kind: kv.KindPersist, Key: h}
			case r < 37:
				op = kv.Op{Kind: kv.KindRename, Keys: [][]byte{h, []byte(hashes[rng.IntN(len(hashes))])}}
			case r < 38:
				op = kv.Op{Kind: kv.KindHIncrBy, Key: h, Keys: [][]byte{[]byte("i")}, Delta: 1}
			case r < 39: // fails (a field that is no integer): its records are dropped
				op = kv.Op{Kind: kv.KindHIncrBy, Key: h, Keys: [][]byte{field()}, Delta: 1}
			case r < 40: // a reserved key: refused
				op = kv.Op{Kind: kv.KindHSet, Key: []byte("\xff\xffkefir/x"), Keys: [][]byte{field(), val}}
			case r < 41:
				op = kv.Op{Kind: kv.KindCopy, Keys: [][]byte{h, []byte(hashes[rng.IntN(len(hashes))])}, Cond: kv.Cond(rng.IntN(2))}
			case r < 42:
				op = kv.Op{Kind: kv.KindDel, Key: h, Keys: [][]byte{[]byte(hashes[0]), []byte(hashes[1])}}
			case r < 43: // EXEC: a hash's writes inside a transaction
				cmds := [][][]byte{{[]byte("HSET"), h, field(), val}, {[]byte("HDEL"), h, field()}}
				if rng.IntN(2) == 0 {
					cmds = append(cmds, [][]byte{[]byte("DEL"), h})
				}
				cmds = append(cmds, [][]byte{[]byte("HSET"), h, field(), val})
				op = kv.Op{Kind: kv.KindExec, Keys: [][]byte{h}, Delta: 1, Value: kv.EncodeTx(nil, cmds, nil)}
			default:
				if rng.IntN(4) == 0 {
					op = kv.Op{Kind: kv.KindFlush}
				} else {
					op = kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{field(), val}}
				}
			}
			op.Now = now
			reqs[i] = WriteReq{Op: op}
			if rng.IntN(4) == 0 { // a client table row after the write's records
				seq++
				reqs[i].ID = ReqID{Client: 1, Seq: seq}
			}
		}
		reqs2 := make([]WriteReq, len(reqs))
		copy(reqs2, reqs)
		if _, err := fast.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		if _, err := slow.Apply(ctx, reqs2); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			a, b := &reqs[i], &reqs2[i]
			if !reflect.DeepEqual(a.Result, b.Result) || fmt.Sprint(a.Err) != fmt.Sprint(b.Err) {
				t.Fatalf("round %d write %d %v %q %q: fast path %+v, %v; kv %+v, %v",
					round, i, a.Op.Kind, a.Op.Key, a.Op.Keys, a.Result, a.Err, b.Result, b.Err)
			}
		}
		if got, want := engineRecords(t, fdb), engineRecords(t, sdb); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: the engines differ:\nfast path %q\nkv        %q", round, got, want)
		}
	}
}

// hsetFast's view of a hash (hm) outlives an Apply only while the engine's
// change count says no other append came: a record of the hash's key
// appended to the engine between two Applies (here directly; on one node
// every write is an Apply, so this stands for any writer a later change
// might add) is seen by the next HSET.
func TestHSetFastSeesAnAppendBetweenApplies(t *testing.T) {
	s, db := openFastShard(t, true, false)
	hset := func(f string) kv.Result {
		t.Helper()
		res, err := s.Write(ctx, kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte(f), []byte("v")}}, level.Async, ReqID{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	hset("f1")
	if res := hset("f1"); res.Int != 0 || !s.hmOK {
		t.Fatalf("HSET h f1 again: %+v, hm kept %v; want 0 through hsetFast", res, s.hmOK)
	}
	s.mu.Lock()
	_, err := db.Append(storage.Record{Key: []byte("h"), Version: s.next, Tombstone: true})
	s.next++
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if res := hset("f1"); res.Int != 1 {
		t.Errorf("HSET h f1 after h was deleted: %d, want 1 (a new hash)", res.Int)
	}
}

// Over an engine without a change count, a chunk's append within one Apply
// drops hm as the next Apply's start does: hsetFast checks only the
// records staged since hm's (hmN), and an append empties them. An HSETNX
// of an existing field loads hm staging nothing (hmN 0), a DEL of the hash
// follows in the same chunk, the chunk is appended; a later HSET of the
// batch must then create a new hash, not add to the deleted one (whose old
// field would come back).
func TestHSetFastDropsItsHashAtAChunksAppendWithoutAChangeCount(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprint("plain=", plain), func(t *testing.T) {
			fast, fdb := openFastShard(t, true, plain)
			slow, sdb := openFastShard(t, false, false)
			h := []byte("h")
			hset := func(f string, c kv.Cond) WriteReq {
				return WriteReq{Op: kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{[]byte(f), []byte("v")}, Cond: c}}
			}
			batches := [][]WriteReq{{hset("old", kv.Always)}, {hset("old", kv.IfAbsent), {Op: kv.Op{Kind: kv.KindDel, Key: h, Keys: [][]byte{h}}}}}
			for i := len(batches[1]); i <= chunk; i++ { // 256 records: the DEL and 255 SETs
				batches[1] = append(batches[1], WriteReq{Op: kv.Op{Kind: kv.KindSet, Key: fmt.Appendf(nil, "s%d", i), Value: []byte("x")}})
			}
			batches[1] = append(batches[1], hset("new", kv.Always))
			for _, reqs := range batches {
				reqs2 := append([]WriteReq(nil), reqs...)
				if _, err := fast.Apply(ctx, reqs); err != nil {
					t.Fatal(err)
				}
				if _, err := slow.Apply(ctx, reqs2); err != nil {
					t.Fatal(err)
				}
			}
			res, err := fast.Read(ctx, kv.Op{Kind: kv.KindHLen, Key: h}, level.ConsLinearizable, Session{})
			if err != nil || res.Int != 1 {
				t.Errorf("HLEN h after DEL h, HSET h new: %d, %v; want 1", res.Int, err)
			}
			hashRecords := func(db *storage.DB) (out []string) {
				for _, r := range engineRecords(t, db) {
					if !strings.HasPrefix(r, `"s`) { // not the SETs
						out = append(out, r)
					}
				}
				return out
			}
			if got, want := hashRecords(fdb), hashRecords(sdb); !reflect.DeepEqual(got, want) {
				t.Fatalf("the engines differ:\nfast path %q\nkv        %q", got, want)
			}
		})
	}
}

// failingAppends is a storage.DB whose appends fail while fail is set (a
// full disk, say): nothing of the batch is applied, and the change count
// does not move.
type failingAppends struct {
	*storage.DB
	fail bool
}

func (e *failingAppends) Append(recs ...storage.Record) (storage.Pos, error) {
	if e.fail {
		return 0, errors.New("injected append failure")
	}
	return e.DB.Append(recs...)
}

// A chunk whose append fails takes hsetFast's hash with it: hm counted the
// chunk's new fields, which the engine never got, and the engine's change
// count did not move to tell the next Apply.
func TestHSetFastForgetsAFailedAppend(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	e := &failingAppends{DB: db}
	s, err := Open(e, Options{Logger: slog.New(slog.DiscardHandler), NoBackgroundSync: true, Durability: level.Async})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	h := []byte("h")
	hset := func(f string) (kv.Result, error) {
		return s.Write(ctx, kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{[]byte(f), []byte("v")}}, level.Async, ReqID{})
	}
	for _, f := range []string{"a", "b"} { // b through hsetFast: hm kept past the append
		if res, err := hset(f); err != nil || res.Int != 1 {
			t.Fatalf("HSET h %s: %+v, %v", f, res, err)
		}
	}
	e.fail = true
	if _, err := hset("c"); err == nil {
		t.Fatal("HSET h c with a failing append: no error")
	}
	e.fail = false
	if res, err := hset("d"); err != nil || res.Int != 1 {
		t.Fatalf("HSET h d: %+v, %v", res, err)
	}
	res, err := s.Read(ctx, kv.Op{Kind: kv.KindHLen, Key: h}, level.ConsLinearizable, Session{})
	if err != nil || res.Int != 3 {
		t.Errorf("HLEN h after HSET a, b, d (c failed): %d, %v; want 3", res.Int, err)
	}
}

// Pipelined batches of 256 one-field HSETs of existing fields, each of
// another hash (hsetFast loads hm at each), with hsetFast and without it:
// the load must not cost in the chunk's size (a scan of the chunk for the
// hash's rows made it ~3x kv's path).
//
//	go test -run XXX -bench PipelinedHSetsOfManyHashes -benchtime 300000x -cpu 1 ./internal/shard/
func BenchmarkPipelinedHSetsOfManyHashes(b *testing.B) {
	for _, fast := range []bool{true, false} {
		b.Run(fmt.Sprint("fast=", fast), func(b *testing.B) {
			s, _ := openFastShard(b, fast, false)
			const hashes, batch = 4096, 256
			ops := make([]kv.Op, hashes)
			for i := range ops {
				ops[i] = kv.Op{Kind: kv.KindHSet, Key: fmt.Appendf(nil, "h%d", i), Keys: [][]byte{[]byte("f"), []byte("v")}}
			}
			reqs := make([]WriteReq, batch)
			apply := func(first int) {
				for j := range reqs {
					reqs[j] = WriteReq{Op: ops[(first+j*97)%hashes]}
				}
				if _, err := s.Apply(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < hashes; i += batch { // every hash exists
				for j := range reqs {
					reqs[j] = WriteReq{Op: ops[i+j]}
				}
				if _, err := s.Apply(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				apply(i)
			}
		})
	}
}
