package vrshard

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// genTxOps is genOps with half of the ops replaced by transaction
// commits of two or three writes (SET, INCRBY, DEL) whose checks name the
// versions the keys have when the commit applies — so most commit, and
// their records are several keys' that a crash can split — or, one in
// eight, an older version, so some abort.
func genTxOps(t *testing.T) func(seed uint64) []testOp {
	return func(seed uint64) []testOp {
		ops := genOps(rand.New(rand.NewPCG(seed, 0)), 60)
		rng := rand.New(rand.NewPCG(seed, 2))
		keys := []string{"x", "y", "z", "w"} // apart from genOps's, whose hashes an INCRBY would fail on
		db := openMemEngine(t, vfs.NewMem())
		a := newApplier(db)
		for i := range ops {
			if rng.IntN(2) == 0 {
				stale := rng.IntN(8) == 0
				var writes []kv.Op
				var checks []kv.TxCheck
				for _, j := range rng.Perm(4)[:2+rng.IntN(2)] {
					k := []byte(keys[j])
					switch rng.IntN(3) {
					case 0:
						writes = append(writes, kv.Op{Kind: kv.KindSet, Key: k, Value: fmt.Appendf(nil, "%d", i)})
					case 1:
						writes = append(writes, kv.Op{Kind: kv.KindDel, Keys: [][]byte{k}})
					default:
						// INCRBY of a key that holds a word fails the commit
						// (its error, nothing landing): also an outcome.
						writes = append(writes, kv.Op{Kind: kv.KindIncrBy, Key: k, Delta: 1})
					}
					v, err := db.Get(k)
					if err != nil && !errors.Is(err, storage.ErrNotFound) {
						t.Fatal(err)
					}
					ver := v.Version
					if stale && ver > 0 {
						ver--
					}
					checks = append(checks, kv.TxCheck{Key: k, Version: ver})
				}
				op, err := kv.NewTxCommit(uint64(i), kv.TxSerializable, kv.TxOrigin{}, checks, writes)
				if err != nil {
					t.Fatal(err)
				}
				ops[i].op = op
			}
			a.begin()
			if _, _, err := a.applyOp(&ops[i].op, uint64(i+1), 1, ops[i].client, ops[i].seq); err != nil {
				t.Fatal(err)
			}
			if err := a.flush(); err != nil {
				t.Fatal(err)
			}
		}
		return ops
	}
}

// A transaction's commit is one op: replayed after an engine crash (part of
// its records kept, part lost), it leaves the state and gives the results
// of a run that never crashed. Before the applier reported a commit's own
// surviving records by the op's version, replay read a key the commit had
// deleted as absent, failed its check and answered -TXABORT, restaging none
// of the records the crash lost.
func TestTxCommitReplayAfterEngineCrash(t *testing.T) {
	checkReplayAfterCrash(t, genTxOps(t))
}

// A transaction's commit cut short by a crash: the engine kept its deletion
// of k1 (emitted first; retention dropped k1's older version) but not its
// write of k2. Replay must pass the commit's check of k1 — which now reads
// the commit's own tombstone — and restage k2. Read as plain "absent", k1
// failed its check (it existed at the start), the replayed commit answered
// -TXABORT and k2's write was lost: half a transaction.
func TestReplayFinishesATxCommitCutShort(t *testing.T) {
	db := openMemEngine(t, vfs.NewMem())
	commit, err := kv.NewTxCommit(1, kv.TxSI, kv.TxOrigin{},
		[]kv.TxCheck{{Key: []byte("k1"), Version: 1}, {Key: []byte("k2"), Version: 0}},
		[]kv.Op{{Kind: kv.KindDel, Keys: [][]byte{[]byte("k1")}}, {Kind: kv.KindSet, Key: []byte("k2"), Value: []byte("y")}})
	if err != nil {
		t.Fatal(err)
	}
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindSet, Key: []byte("k1"), Value: []byte("old")}},
		{op: commit, client: 9, seq: 1},
	}
	// What the engine holds after the crash: op 1, and op 2's first record.
	for _, r := range []storage.Record{
		{Key: []byte("k1"), Value: []byte("old"), Version: 1},
		{Key: []byte("k1"), Version: 2, Tombstone: true},
	} {
		if _, err := db.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	out := applyAll(t, newApplier(db), ops)
	got := dump(t, db)
	if _, ok := got["k1"]; ok || got["k2"] != `"y"@2` || string(out[1].res.Bulk) != ":2\r\n" {
		t.Fatalf("after replay: %v, commit answered %q; want k1 deleted and k2 written by op 2, committed", got, out[1].res.Bulk)
	}
}
