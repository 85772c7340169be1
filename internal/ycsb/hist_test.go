package ycsb

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// exactQuantile is the nearest-rank quantile of sorted values: the reference every
// histogram quantile is checked against.
func exactQuantile(sorted []int64, q float64) int64 {
	rank := max(int(math.Ceil(q/100*float64(len(sorted)))), 1)
	return sorted[rank-1]
}

func TestHistogramQuantilesAreWithinAThousandthOfTheExactOnes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Log-uniform from 1 ns to ~100 s: every magnitude the runner records.
	var vals []int64
	h := &Histogram{}
	var sum float64
	for range 200_000 {
		v := int64(math.Exp(r.Float64() * math.Log(1e11)))
		vals = append(vals, v)
		h.Record(v)
		sum += float64(v)
	}
	slices.Sort(vals)
	for _, q := range []float64{0, 1, 10, 50, 90, 99, 99.9, 99.99, 100} {
		got, want := h.ValueAtQuantile(q), exactQuantile(vals, q)
		if got < want || float64(got-want) > float64(want)/1024+1 {
			t.Errorf("p%v = %d, exact %d: off by more than 1/1024 (or below it)", q, got, want)
		}
	}
	if h.Count() != int64(len(vals)) || h.Max() != vals[len(vals)-1] {
		t.Errorf("count %d max %d, want %d and %d", h.Count(), h.Max(), len(vals), vals[len(vals)-1])
	}
	if m := h.Mean(); math.Abs(m-sum/float64(len(vals))) > 1e-6*m {
		t.Errorf("mean %v, want %v", m, sum/float64(len(vals)))
	}
}

func TestHistogramBucketsTileTheValues(t *testing.T) {
	// Every value falls in the bucket whose bounds contain it, and consecutive buckets
	// meet without gaps: the index and the bounds are each other's inverse.
	for i := 1; i < histSub+histHalf*histMaxShift; i++ {
		if histLowest(i) != histHighest(i-1)+1 {
			t.Fatalf("bucket %d starts at %d, bucket %d ends at %d", i, histLowest(i), i-1, histHighest(i-1))
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		v := int64(r.Uint64N(1 << 42))
		i := histIndex(v)
		if v < histLowest(i) || v > histHighest(i) {
			t.Fatalf("%d in bucket %d = [%d, %d]", v, i, histLowest(i), histHighest(i))
		}
	}
}

func TestHistogramMergeEqualsRecordingEverything(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	all, a, b := &Histogram{}, &Histogram{}, &Histogram{}
	for i := range 50_000 {
		v := int64(r.ExpFloat64() * float64(200*time.Microsecond))
		if i%3 == 0 {
			v *= 1000 // b gets the long tail: its counts are longer than a's
			b.Record(v)
		} else {
			a.Record(v)
		}
		all.Record(v)
	}
	a.Merge(b)
	a.Merge(nil)
	a.Merge(&Histogram{})
	for _, q := range []float64{1, 50, 99, 99.9, 100} {
		if a.ValueAtQuantile(q) != all.ValueAtQuantile(q) {
			t.Errorf("p%v: merged %d, recorded together %d", q, a.ValueAtQuantile(q), all.ValueAtQuantile(q))
		}
	}
	if a.Count() != all.Count() || a.Max() != all.Max() || math.Abs(a.Mean()-all.Mean()) > 1e-9*all.Mean() {
		t.Errorf("merged count/max/mean %d/%d/%v, together %d/%d/%v", a.Count(), a.Max(), a.Mean(), all.Count(), all.Max(), all.Mean())
	}
	var empty Histogram
	if empty.ValueAtQuantile(99) != 0 || empty.Mean() != 0 || empty.Count() != 0 {
		t.Error("an empty histogram reports values")
	}
}
