package vrshard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

type testOp struct {
	op     kv.Op
	client uint64
	seq    uint64
}

// genOps is a deterministic mix of every write kind over a few keys, with
// and without client ids, including multi-key ops (whose records a crash can
// split).
func genOps(rng *rand.Rand, n int) []testOp {
	keys := []string{"a", "b", "c", "d"}
	k := func() []byte { return []byte(keys[rng.IntN(len(keys))]) }
	var out []testOp
	seqs := map[uint64]uint64{}
	for i := range n {
		var op kv.Op
		f := func() []byte { return []byte(keys[rng.IntN(3)]) } // a hash field
		switch rng.IntN(20) {
		case 0:
			op = kv.Op{Kind: kv.KindSet, Key: k(), Value: []byte(fmt.Sprint("v", i))}
		case 1:
			op = kv.Op{Kind: kv.KindMSet, Keys: [][]byte{k(), []byte(fmt.Sprint("m", i)), k(), []byte(fmt.Sprint("n", i))}}
		case 2:
			op = kv.Op{Kind: kv.KindDel, Keys: [][]byte{k(), k()}}
		case 3:
			op = kv.Op{Kind: kv.KindIncrBy, Key: []byte("ctr"), Delta: int64(rng.IntN(5) + 1)}
		case 4:
			op = kv.Op{Kind: kv.KindAppend, Key: k(), Value: []byte("+")}
		case 5:
			op = kv.Op{Kind: kv.KindSet, Key: k(), Value: []byte(fmt.Sprint("nx", i)), Cond: kv.IfAbsent, ReturnOld: true}
		case 6:
			// The orphan-row sweeper's op, for a generation that may be
			// any op's (hashes take their op's version): mostly a no-op,
			// sometimes the rows of a dead hash, whose replay must agree.
			op = kv.HashSweepOp(k(), uint64(rng.IntN(i+1)+1), [][]byte{f(), f()}, rng.IntN(2) == 0)
		case 7:
			op = kv.Op{Kind: kv.KindRename, Keys: [][]byte{k(), k()}, Cond: kv.Cond(rng.IntN(2))}
		case 8:
			op = kv.Op{Kind: kv.KindCopy, Keys: [][]byte{k(), k()}, Cond: kv.Cond(rng.IntN(2))}
		case 9:
			op = kv.Op{Kind: kv.KindGetDel, Key: k()}
		case 10:
			op = kv.Op{Kind: kv.KindSetRange, Key: k(), Delta: int64(rng.IntN(6)), Value: []byte("xy")}
		case 11:
			op = kv.Op{Kind: kv.KindIncrByFloat, Key: []byte("fl"), Value: []byte("0.1")}
		case 12:
			op = kv.Op{Kind: kv.KindMSetNX, Keys: [][]byte{k(), []byte("nx"), k(), []byte("ny")}}
		case 13:
			op = kv.Op{Kind: kv.KindSetBit, Key: k(), Delta: int64(rng.IntN(40)), Value: []byte("1")}
		case 14:
			if rng.IntN(4) == 0 {
				op = kv.Op{Kind: kv.KindFlush}
			} else {
				op = kv.Op{Kind: kv.KindSet, Key: k(), Value: []byte(fmt.Sprint("v", i))}
			}
		case 16:
			// Hashes read their metadata and field rows: replay must read
			// them as of the op before (a key of the string ops too, so
			// that WRONGTYPE and SET-over-a-hash replay as well).
			op = kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{f(), []byte(fmt.Sprint("hv", i)), f(), []byte("w")}}
		case 17:
			op = kv.Op{Kind: kv.KindHDel, Key: []byte("h"), Keys: [][]byte{f(), f()}}
		case 18:
			op = kv.Op{Kind: kv.KindHIncrBy, Key: []byte("h"), Keys: [][]byte{[]byte("n")}, Delta: 1}
		case 19:
			op = kv.Op{Kind: kv.KindHSet, Key: k(), Keys: [][]byte{f(), []byte("x")}, Cond: kv.Cond(rng.IntN(2))}
		default:
			op = kv.Op{Kind: kv.KindGetSet, Key: k(), Value: []byte(fmt.Sprint("g", i))}
		}
		t := testOp{op: op}
		if rng.IntN(3) > 0 {
			t.client = uint64(rng.IntN(3) + 1)
			seqs[t.client]++
			t.seq = seqs[t.client]
		}
		out = append(out, t)
	}
	return out
}

type outcome struct {
	res kv.Result
	err string
}

// applyAll applies ops (op numbers from 1) in batches of 5.
func applyAll(t *testing.T, a *applier, ops []testOp) []outcome {
	t.Helper()
	var out []outcome
	for i := 0; i < len(ops); i += 5 {
		a.begin()
		for j := i; j < min(i+5, len(ops)); j++ {
			o := ops[j]
			res, opErr, err := a.applyOp(&o.op, uint64(j+1), 1, o.client, o.seq)
			if err != nil {
				t.Fatalf("op %d: %v", j+1, err)
			}
			oc := outcome{res: res}
			if opErr != nil {
				oc.err = opErr.Error()
			}
			out = append(out, oc)
		}
		if err := a.flush(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func dump(t *testing.T, db *storage.DB) map[string]string {
	t.Helper()
	m := map[string]string{}
	if err := db.Scan(nil, nil, 0, 0, func(k []byte, v storage.Value) bool {
		m[string(k)] = fmt.Sprintf("%q@%d", v.Data, v.Version)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

// reachableDump is dump without the hash field rows no hash refers to:
// the garbage of dead generations (kv/hash.go), which a replay may leave
// where the first run did not (an HDEL that emptied its hash, cut short by
// the crash, restages no row deletions: the hash is gone either way) and
// which no read can see.
func reachableDump(t *testing.T, db *storage.DB) map[string]string {
	t.Helper()
	m := dump(t, db)
	live := map[string]bool{}
	if err := db.Scan(nil, nil, 0, 0, func(k []byte, v storage.Value) bool {
		if !kv.IsReserved(k) && kv.MetaType(v.Meta) == kv.TypeHash && len(v.Data) >= 8 {
			live[string(kv.HashRowPrefix(binary.LittleEndian.Uint64(v.Data)))] = true
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for k := range m {
		if kv.IsHashRow([]byte(k)) && !live[k[:kv.HashRowOverhead]] {
			delete(m, k)
		}
	}
	return m
}

func openMemEngine(t *testing.T, fs vfs.FS) *storage.DB {
	t.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/engine"}}, FS: fs,
		WriteBufferSize: 97, SegmentSize: 4096, Inline: true})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// The engine is never fsynced on the write path: a crash keeps a random
// prefix of what was appended, possibly ending inside an op's records. The
// replica then re-applies every op after its checkpoint (here: all of them);
// the state and the client-visible results must equal those of a run that
// never crashed.
func TestReplayAfterEngineCrashRestoresStateAndResults(t *testing.T) {
	checkReplayAfterCrash(t, func(seed uint64) []testOp { return genOps(rand.New(rand.NewPCG(seed, 0)), 60) })
}

// checkReplayAfterCrash is TestReplayAfterEngineCrashRestoresStateAndResults
// over the ops gen makes for each of 60 seeds.
func checkReplayAfterCrash(t *testing.T, gen func(seed uint64) []testOp) {
	t.Helper()
	partial := 0
	for seed := uint64(1); seed <= 60; seed++ {
		ops := gen(seed)

		ref := openMemEngine(t, vfs.NewMem())
		want := applyAll(t, newApplier(ref), ops)
		wantState := reachableDump(t, ref)

		mem := vfs.NewMem()
		db := openMemEngine(t, mem)
		applyAll(t, newApplier(db), ops)
		mem.Crash(mrand.New(mrand.NewSource(int64(seed))))
		db2 := openMemEngine(t, mem)
		l := db2.LastVersion()
		if l > 0 && l < uint64(len(ops)) {
			partial++
		}
		got := applyAll(t, newApplier(db2), ops)
		if gs := reachableDump(t, db2); !reflect.DeepEqual(gs, wantState) {
			t.Fatalf("seed %d (engine recovered to version %d): state after replay\n%v\nwant\n%v", seed, l, gs, wantState)
		}
		// The client table keeps each client's latest request only: a
		// client retries nothing older (it got those replies), so those are
		// the results a replay must reproduce.
		latest := map[uint64]int{}
		for i, o := range ops {
			if o.client != 0 {
				latest[o.client] = i
			}
		}
		for _, i := range latest {
			if !reflect.DeepEqual(got[i], want[i]) && !bytes.Equal(got[i].res.Bulk, want[i].res.Bulk) || got[i].err != want[i].err || got[i].res.Version != want[i].res.Version || got[i].res.Int != want[i].res.Int {
				t.Fatalf("seed %d: op %d (%v, client %d) replayed result %+v, first run %+v", seed, i+1, ops[i].op.Kind, ops[i].client, got[i], want[i])
			}
		}
	}
	if partial < 10 {
		t.Fatalf("only %d of 60 crashes left the engine partly applied: the test does not exercise replay", partial)
	}
}

// A replay that writes records the engine already has must be refused by
// the engine (versions strictly increase per key) — so the skip logic above
// is what makes replay work, not luck.
func TestEngineRefusesDuplicateVersions(t *testing.T) {
	db := openMemEngine(t, vfs.NewMem())
	a := newApplier(db)
	ops := []testOp{{op: set("k", "1")}}
	applyAll(t, a, ops)
	a.replayTo = 0 // pretend the op is new: no skipping
	a.begin()
	if _, _, err := a.applyOp(&ops[0].op, 1, 1, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.flush(); err == nil {
		t.Fatal("re-appending version 1 of k succeeded; the replay test would not notice double writes")
	}
}

// An all-or-nothing op cut short by a crash: the engine kept MSETNX's record
// of its first key (over an older deletion retention has dropped) but not
// its second. Replay must read the first key as it was before the op
// (absent), not as the op left it, or it evaluates MSETNX as "a key exists"
// and never writes the second key.
func TestReplayFinishesAnMSetNXCutShort(t *testing.T) {
	db := openMemEngine(t, vfs.NewMem())
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("k1"), Value: []byte("old")}},
		{op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k1")}}},
		{op: kv.Op{Kind: kv.KindMSetNX, Keys: [][]byte{[]byte("k1"), []byte("x"), []byte("k2"), []byte("y")}}},
	}
	// What the engine holds after the crash: ops 1 and 2 whole, op 3's
	// first record only.
	for _, r := range []storage.Record{
		{Key: []byte("k1"), Value: []byte("old"), Version: 1},
		{Key: []byte("k1"), Version: 2, Tombstone: true},
		{Key: []byte("k1"), Value: []byte("x"), Version: 3},
	} {
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	applyAll(t, newApplier(db), ops)
	got := dump(t, db)
	if got["k1"] != `"x"@3` || got["k2"] != `"y"@3` {
		t.Fatalf("after replay: %v; want k1 and k2 both written by op 3", got)
	}
}

// A hash write cut short by a crash: the engine kept HSET's metadata record
// (emitted first) and its first field's row, not its second's, and
// retention dropped the metadata's older version. Replay must restage the
// lost row under the hash's real generation, which only the op's own
// metadata record still carries (kv.ReplayReadsOwnRecord): read as absent,
// the hash would look new and the row would go to a generation no one reads.
func TestReplayFinishesAnHSetCutShort(t *testing.T) {
	db := openMemEngine(t, vfs.NewMem())
	h := []byte("h")
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{[]byte("a"), []byte("1")}}},
		{op: kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{[]byte("b"), []byte("2"), []byte("c"), []byte("3")}}},
	}
	// What the first run wrote: op 1 whole, then op 2 but for its last
	// record (the row of c).
	records := func(ops []testOp) []storage.Record {
		ref := openMemEngine(t, vfs.NewMem())
		applyAll(t, newApplier(ref), ops)
		var recs []storage.Record
		if err := ref.Scan(nil, nil, 0, 0, func(k []byte, v storage.Value) bool {
			recs = append(recs, storage.Record{Key: k, Value: v.Data, Meta: v.Meta, Version: v.Version})
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return recs
	}
	for _, r := range records(ops[:1]) {
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	lost := false
	for _, r := range records(ops) {
		if r.Version != 2 {
			continue
		}
		if kv.IsHashRow(r.Key) && bytes.HasSuffix(r.Key, []byte("c")) {
			lost = true
			continue
		}
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if !lost {
		t.Fatal("no row of field c")
	}
	if _, err := db.GetAt(h, 1); !errors.Is(err, storage.ErrVersionGone) {
		t.Fatalf("GetAt(h, 1): %v; the test needs retention to have dropped h's older version", err)
	}
	ref := openMemEngine(t, vfs.NewMem())
	applyAll(t, newApplier(ref), ops)
	applyAll(t, newApplier(db), ops)
	if got, want := reachableDump(t, db), reachableDump(t, ref); !reflect.DeepEqual(got, want) {
		t.Fatalf("after replay:\n%v\nwant\n%v", got, want)
	}
}
