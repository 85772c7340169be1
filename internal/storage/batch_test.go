package storage

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/vfs"
)

// tornBatches appends a synced record, then an unsynced batch of n records
// and a record after it (which puts the batch in the file), crashes the file
// system (a random prefix of the unsynced bytes survives) and reopens: it
// returns how many of the batch's records each seed kept.
func tornBatches(t *testing.T, o Options, seeds, n int) []int {
	t.Helper()
	var kept []int
	for seed := 1; seed <= seeds; seed++ {
		fs := vfs.NewMem()
		oo := o
		oo.FS = fs
		oo.NoZeroFill = seed%2 == 0
		oo.WriteBufferSize = 1 << 10 // the append after the batch writes it to the file
		db := mustOpen(t, oo)
		if _, err := db.Append(Record{Key: []byte("base"), Value: []byte("v"), Version: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Sync(db.LastPos()); err != nil {
			t.Fatal(err)
		}
		batch := make([]Record, n)
		for i := range batch {
			batch[i] = Record{Key: []byte(fmt.Sprintf("b%03d", i)), Value: []byte("value-of-some-length"), Version: 2}
		}
		if _, err := db.Append(batch...); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Append(Record{Key: []byte("after"), Value: []byte("v"), Version: 3}); err != nil {
			t.Fatal(err)
		}
		fs.Crash(rand.New(rand.NewSource(int64(seed))))
		db.Close()
		db = mustOpen(t, oo)
		k := 0
		for i := range batch {
			if _, err := db.Get(batch[i].Key); err == nil {
				k++
			}
		}
		if _, err := db.Get([]byte("base")); err != nil {
			t.Fatalf("seed %d: the synced record is gone: %v", seed, err)
		}
		// The engine goes on from the cut: a new batch and a reopen.
		if _, err := db.Append(Record{Key: []byte("new1"), Value: []byte("v"), Version: 10}, Record{Key: []byte("new2"), Value: []byte("v"), Version: 10}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Sync(db.LastPos()); err != nil {
			t.Fatal(err)
		}
		db.Close()
		db = mustOpen(t, oo)
		for _, key := range []string{"new1", "new2"} {
			if _, err := db.Get([]byte(key)); err != nil {
				t.Fatalf("seed %d: %s after the cut: %v", seed, key, err)
			}
		}
		k2 := 0
		for i := range batch {
			if _, err := db.Get(batch[i].Key); err == nil {
				k2++
			}
		}
		if k2 != k {
			t.Fatalf("seed %d: %d of the batch's records before a reopen, %d after", seed, k, k2)
		}
		db.Close()
		kept = append(kept, k)
	}
	return kept
}

// One Append is all-or-nothing across a crash that tears the log inside it:
// recovery drops a batch whose last record is missing (flagBatchCont), and
// the engine goes on from there.
func TestBatchIsAllOrNothingAcrossACrash(t *testing.T) {
	const n = 40
	whole, none := 0, 0
	for seed, k := range tornBatches(t, memOpts(nil), 40, n) {
		switch k {
		case n:
			whole++
		case 0:
			none++
		default:
			t.Errorf("seed %d: %d of a batch of %d records survived", seed+1, k, n)
		}
	}
	if whole == 0 || none == 0 {
		t.Fatalf("the crashes did not keep the batch both ways (%d whole, %d none): the test exercises nothing", whole, none)
	}
}

// Mutation noBatchCont (an engine that marks no batch, as before): the same
// crashes keep a part of the batch, which the test above would report.
func TestBatchIsAllOrNothingCatchesUnmarkedBatches(t *testing.T) {
	mutation.Require(t)
	o := memOpts(nil)
	o.mut.noBatchCont = true
	torn := 0
	for _, k := range tornBatches(t, o, 40, 40) {
		if k != 0 && k != 40 {
			torn++
		}
	}
	if torn == 0 {
		t.Fatal("no seed tore an unmarked batch: the test cannot see the bug")
	}
}
