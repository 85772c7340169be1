// Package stats holds the small summary statistics the benchmark drivers
// share (one copy: txbench, storagebench, chainjoin and ycsb each had their
// own median). It imports only the standard library.
package stats

import "slices"

// Median is the middle of xs (the mean of the two middle values for an even
// count), without reordering xs. An empty xs has median 0: the drivers'
// JSON outputs cannot carry a NaN, and they report "no samples" separately.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
