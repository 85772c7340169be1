package storage

import (
	"cmp"
	"math/rand"
	"slices"
	"testing"
)

// TestSortByPos: sortByPos orders a batch's misses by log position exactly as a sort
// by comparison does — batches of every size up to scanBatch, positions small, large
// (near the packing's limit) and past it (the comparison fallback), misses that skip
// hits — and reuses its scratch.
func TestSortByPos(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var order []uint64
	for round := 0; round < 2000; round++ {
		n := 1 + rng.Intn(scanBatch)
		hits := make([]scanHit, n)
		seen := map[uint64]bool{}
		for i := range hits {
			var pos uint64
			for pos == 0 || seen[pos] {
				switch round % 4 {
				case 0:
					pos = uint64(rng.Intn(1 << 20)) // a young log
				case 1:
					pos = 1<<(64-posShift) - 1 - uint64(rng.Intn(1<<20)) // just inside the packing
				case 2:
					pos = rng.Uint64() // mostly past it: the fallback
				default:
					pos = uint64(rng.Int63n(1 << 40))
				}
			}
			seen[pos] = true
			hits[i].v.pos = pos
		}
		var miss []int
		for i := range hits {
			if rng.Intn(5) != 0 {
				miss = append(miss, i)
			}
		}
		want := slices.Clone(miss)
		slices.SortFunc(want, func(a, b int) int {
			if hits[a].v.pos < hits[b].v.pos {
				return -1
			}
			return 1
		})
		order = sortByPos(hits, miss, order[:0])
		if !slices.Equal(miss, want) {
			t.Fatalf("round %d (%d hits, %d misses): sorted %v, want %v", round, n, len(miss), miss, want)
		}
	}
	if cap(order) == 0 {
		t.Fatal("the scratch was never used")
	}
}

// BenchmarkSortMisses: a 50-key batch's misses (scattered positions, as YCSB-E's) put
// in log order — "func" the comparison sort readBatch used, "packed" sortByPos.
func BenchmarkSortMisses(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	hits := make([]scanHit, 50)
	for i := range hits {
		hits[i].v.pos = uint64(rng.Int63n(100 << 20))
	}
	miss := make([]int, len(hits))
	reset := func() {
		for k := range miss {
			miss[k] = k
		}
	}
	b.Run("func", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			reset()
			slices.SortFunc(miss, func(a, b int) int { return cmp.Compare(hits[a].v.pos, hits[b].v.pos) })
		}
	})
	b.Run("packed", func(b *testing.B) {
		var order []uint64
		for i := 0; i < b.N; i++ {
			reset()
			order = sortByPos(hits, miss, order[:0])
		}
	})
}
