package shard

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/storage"
)

// stagedLinearSearch is what stagedRec answers: the newest record of key.
func stagedLinearSearch(recs []storage.Record, key []byte) *storage.Record {
	for i := len(recs) - 1; i >= 0; i-- {
		if bytes.Equal(recs[i].Key, key) {
			return &recs[i]
		}
	}
	return nil
}

// The staged records' index answers as a search of the whole chunk does:
// chunks of up to 3,000 records (so three times as many keys as slots, and
// most slots hold chains), keys that repeat (the newest record wins), keys
// of one length that differ only in their middle (same last bytes: one slot),
// the empty key, truncates to any length (a failed write's records dropped,
// a chunk appended) and records staged again after them, and a generation
// counter that wraps. A lookup that stops at the slot's newest record, or a
// truncate that keeps the dropped records in the index, fails it.
func TestStagedIndexAgreesWithALinearSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 5))
	key := func() []byte {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1: // one slot for all: the last 8 bytes and the length agree
			return []byte(fmt.Sprintf("m%04d-tail-end", rng.IntN(50)))
		default:
			return []byte(fmt.Sprintf("k%d", rng.IntN(4000)))
		}
	}
	s := &Shard{}
	for round := range 200 {
		if round == 100 {
			s.stagedGen = ^uint32(0) - 1 // wraps within the next rounds
		}
		n := rng.IntN(3000)
		if round%10 == 0 {
			n = rng.IntN(40)
		}
		for len(s.recs) < n {
			s.recs = append(s.recs, storage.Record{Key: key(), Version: uint64(len(s.recs))})
			if rng.IntN(50) == 0 { // a lookup mid-chunk indexes what is staged so far
				k := key()
				if got, want := s.stagedRec(k), stagedLinearSearch(s.recs, k); got != want {
					t.Fatalf("round %d, %d staged: stagedRec(%q) = %p, want %p", round, len(s.recs), k, got, want)
				}
			}
		}
		for range 300 {
			k := key()
			if got, want := s.stagedRec(k), stagedLinearSearch(s.recs, k); got != want {
				t.Fatalf("round %d, %d staged: stagedRec(%q) = %p, want %p", round, len(s.recs), k, got, want)
			}
		}
		if rng.IntN(3) == 0 {
			s.truncate(0) // the chunk appended
		} else {
			s.truncate(rng.IntN(len(s.recs) + 1)) // a failed write's records dropped
		}
	}
}
