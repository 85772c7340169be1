package vrshard

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Fine-grained transaction conflicts across an engine crash: half of the
// ops are commits of one or two ranged writes (SETBIT, SETRANGE) to two
// keys whose checks name a version the key had up to four writes ago, with
// the written bits as ranges — so the decision walks the keys' access
// records — and now and then a whole-key SET that breaks the chain. A crash
// keeps part of the records; replay must reach the same state (access
// records included) and the same commit/abort replies as a run that never
// crashed.
func TestTxRangedCommitReplayAfterEngineCrash(t *testing.T) {
	var fine, aborts int
	gen := func(seed uint64) []testOp {
		ops := genOps(rand.New(rand.NewPCG(seed, 0)), 60)
		rng := rand.New(rand.NewPCG(seed, 3))
		keys := []string{"bx", "by"}
		hist := map[string][]uint64{}
		db := openMemEngine(t, vfs.NewMem())
		a := newApplier(db)
		version := func(k []byte) uint64 {
			v, err := db.Get(k)
			if errors.Is(err, storage.ErrNotFound) {
				return 0
			}
			if err != nil {
				t.Fatal(err)
			}
			return v.Version
		}
		for i := range ops {
			moved := false
			if rng.IntN(2) == 0 {
				var writes []kv.Op
				var checks []kv.TxCheck
				for _, j := range rng.Perm(2)[:1+rng.IntN(2)] {
					k := []byte(keys[j])
					off := int64(rng.IntN(64))
					var rs []kv.TxRange
					switch rng.IntN(6) {
					case 0:
						writes = append(writes, kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("whole")})
					case 1:
						writes = append(writes, kv.Op{Kind: kv.KindSetRange, Key: k, Delta: off / 8, Value: []byte("r")})
						rs = []kv.TxRange{{Lo: uint64(off/8) * 8, Hi: uint64(off/8)*8 + 8}}
					default:
						writes = append(writes, kv.Op{Kind: kv.KindSetBit, Key: k, Delta: off, Value: []byte{byte('0' + rng.IntN(2))}})
						rs = []kv.TxRange{{Lo: uint64(off), Hi: uint64(off) + 1}}
					}
					h := append([]uint64{0}, hist[keys[j]]...)
					ver := h[max(0, len(h)-1-rng.IntN(4))]
					moved = moved || ver != version(k)
					checks = append(checks, kv.TxCheck{Key: k, Version: ver, Ranges: rs})
				}
				op, err := kv.NewTxCommit(uint64(i), kv.TxSI, kv.TxOrigin{}, checks, writes)
				if err != nil {
					t.Fatal(err)
				}
				ops[i].op = op
			}
			a.begin()
			res, _, err := a.applyOp(&ops[i].op, uint64(i+1), 1, ops[i].client, ops[i].seq)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.flush(); err != nil {
				t.Fatal(err)
			}
			if ops[i].op.Kind == kv.KindTxCommit {
				switch {
				case strings.HasPrefix(string(res.Bulk), "-TXABORT"):
					aborts++
				case moved:
					fine++ // committed though a checked key moved
				}
				for _, k := range keys {
					if v := version([]byte(k)); v != 0 && (len(hist[k]) == 0 || hist[k][len(hist[k])-1] != v) {
						hist[k] = append(hist[k], v)
					}
				}
			}
		}
		return ops
	}
	checkReplayAfterCrash(t, gen)
	if fine < 20 || aborts < 20 {
		t.Fatalf("%d commits past a moved key, %d aborts: the generator does not exercise both decisions", fine, aborts)
	}
}

// A ranged commit cut short by a crash, at each point of its batch: its
// access row is emitted first, so the engine keeps nothing, the row, or the
// row and the key's record. Replay must finish it to the state and reply of
// a run that never crashed — the row rewritten as it was, not rebuilt from
// the commit's own key record (whose version hides the one it replaced).
func TestReplayFinishesARangedCommitCutShort(t *testing.T) {
	k := []byte("k")
	commit := func(start uint64, bit int64) kv.Op {
		op, err := kv.NewTxCommit(start, kv.TxSI, kv.TxOrigin{},
			[]kv.TxCheck{{Key: k, Version: 1, Ranges: []kv.TxRange{{Lo: uint64(bit), Hi: uint64(bit) + 1}}}},
			[]kv.Op{{Kind: kv.KindSetBit, Key: k, Delta: bit, Value: []byte("1")}})
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: k, Value: []byte("\x00\x00")}},
		{op: commit(1, 1), client: 9, seq: 1},
		{op: commit(1, 9), client: 9, seq: 2},
	}
	ref := openMemEngine(t, vfs.NewMem())
	want := applyAll(t, newApplier(ref), ops)
	if string(want[2].res.Bulk) != ":3\r\n" {
		t.Fatalf("second flip answered %q: not a fine-grained commit", want[2].res.Bulk)
	}
	var recs []storage.Record // op 3's: its row, then its key
	if err := ref.Scan(nil, nil, 0, 0, func(key []byte, v storage.Value) bool {
		r := storage.Record{Key: append([]byte(nil), key...), Value: v.Data, Version: v.Version}
		switch {
		case v.Version != 3 || kv.IsReserved(key) && !kv.IsAccessRow(key):
		case kv.IsAccessRow(key):
			recs = append([]storage.Record{r}, recs...)
		default:
			recs = append(recs, r)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for cut := 0; cut <= 2; cut++ {
		db := openMemEngine(t, vfs.NewMem())
		// Ops 1 and 2 whole, op 3's first cut records.
		applyAll(t, newApplier(db), ops[:2])
		var keep []storage.Record
		n := 0
		for _, r := range recs {
			if r.Version == 3 && n < cut {
				keep = append(keep, r)
				n++
			}
		}
		for _, r := range keep {
			if _, err := db.Append(r); err != nil {
				t.Fatal(err)
			}
		}
		got := applyAll(t, newApplier(db), ops)
		if gs, ws := dump(t, db), dump(t, ref); !mapsEqual(gs, ws) || string(got[2].res.Bulk) != ":3\r\n" {
			t.Fatalf("cut after %d of op 3's records: replay answered %q, state\n%v\nwant\n%v", cut, got[2].res.Bulk, gs, ws)
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
