package ycsb

import (
	"math"
	"math/bits"
)

// Histogram records latencies (or any non-negative int64) in log-linear buckets, as an
// HDR histogram does: exact below 2^histSubBits, and above that 2^(histSubBits-1)
// buckets per power of two, so every recorded value is known to within 1/1024 of itself
// (HDR's "3 significant digits") at any magnitude, from nanoseconds to hours, in a few
// hundred KiB at most.
//
// It is written here rather than taken from github.com/HdrHistogram/hdrhistogram-go
// because the main module's dependency list is kept short on purpose (`kefir bench`
// lives in the main binary, and the YCSB runner with it) and what the runner needs —
// record, merge, quantile, mean, max — is a hundred lines. Counts grow on demand, so
// a histogram of microsecond latencies never allocates the buckets of seconds.
//
// A Histogram is not safe for concurrent use; the runner gives each client its own
// and merges them.
type Histogram struct {
	counts []uint64
	total  uint64
	sum    float64
	min    int64
	max    int64
}

// histSubBits sets the precision: values below 2^histSubBits have a bucket each, and
// each power of two above has 2^(histSubBits-1) buckets, a relative width ≤ 2^-(histSubBits-1).
const histSubBits = 11

// histMaxShift bounds the magnitude: values past 2^(histSubBits+histMaxShift) ns (about
// 73 minutes) are recorded as that.
const histMaxShift = 31

const (
	histSub  = 1 << histSubBits
	histHalf = histSub / 2
)

// histIndex returns v's bucket.
func histIndex(v int64) int {
	if v < histSub {
		return int(max(v, 0))
	}
	shift := bits.Len64(uint64(v)) - histSubBits
	if shift > histMaxShift {
		shift, v = histMaxShift, (int64(histSub)<<histMaxShift)-1
	}
	m := int(v >> shift) // in [histHalf, histSub)
	return histSub + (shift-1)*histHalf + (m - histHalf)
}

// histHighest returns the largest value that falls in bucket i (what HDR calls the
// highest equivalent value): quantiles report it, so they never understate a latency.
func histHighest(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	shift := (i-histSub)/histHalf + 1
	m := int64(histHalf + (i-histSub)%histHalf)
	return (m+1)<<shift - 1
}

// histLowest returns the smallest value that falls in bucket i.
func histLowest(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	shift := (i-histSub)/histHalf + 1
	return int64(histHalf+(i-histSub)%histHalf) << shift
}

// CountAtLeast returns how many recorded values are ≥ v, to the histogram's precision
// (a value in v's own bucket counts if the bucket starts at v).
func (h *Histogram) CountAtLeast(v int64) int64 {
	var n uint64
	for i := len(h.counts) - 1; i >= 0 && histLowest(i) >= v; i-- {
		n += h.counts[i]
	}
	return int64(n)
}

// Record adds one value (negative values count as 0).
func (h *Histogram) Record(v int64) {
	v = max(v, 0)
	i := histIndex(v)
	if i >= len(h.counts) {
		h.grow(i)
	}
	h.counts[i]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	h.max = max(h.max, v)
	h.total++
	h.sum += float64(v)
}

// grow makes bucket i addressable, doubling so that a run of growing values
// reallocates O(log n) times.
func (h *Histogram) grow(i int) {
	n := max(i+1, 2*len(h.counts), 256)
	c := make([]uint64, n)
	copy(c, h.counts)
	h.counts = c
}

// Merge adds o's values to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.total == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		h.grow(len(o.counts) - 1)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.total += o.total
	h.sum += o.sum
}

// Count returns how many values were recorded.
func (h *Histogram) Count() int64 { return int64(h.total) }

// Mean returns the exact mean of the recorded values (0 if none).
func (h *Histogram) Mean() float64 {
	if h.total == 0 {
		return 0
	}
	return h.sum / float64(h.total)
}

// Max returns the largest value recorded, exactly.
func (h *Histogram) Max() int64 { return h.max }

// ValueAtQuantile returns the value below or at which q percent (0–100) of the
// recorded values lie, to the histogram's precision and never above Max (0 if empty).
func (h *Histogram) ValueAtQuantile(q float64) int64 {
	if h.total == 0 {
		return 0
	}
	q = min(max(q, 0), 100)
	rank := uint64(math.Ceil(q / 100 * float64(h.total)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(max(histHighest(i), h.min), h.max)
		}
	}
	return h.max
}
