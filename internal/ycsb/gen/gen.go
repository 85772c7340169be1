// Package gen holds the key-choice generators of YCSB's core workloads: uniform, zipfian,
// scrambled zipfian (θ = 0.99 by default), skewed-latest, and the counters that hand out
// insert keys. The algorithms follow YCSB's Java generators (Gray et al., "Quickly
// Generating Billion-Record Synthetic Databases", SIGMOD 1994), so a "zipfian workload"
// here means what it means in every published YCSB figure.
//
// Generators are split in two: an immutable (or internally synchronised) description that
// many client goroutines share, and a *rand.Rand that each goroutine owns. Computing a
// zeta constant costs O(n) pow() calls, so it is done once per run, never per client.
//
// It must not import any other Kefir package: the comparison harness (bench/ycsb) measures
// Kefir against other systems with it, and its generators must not depend on the thing
// being measured.
package gen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// ZipfianConstant is YCSB's default skew, θ = 0.99.
const ZipfianConstant = 0.99

// Chooser picks item numbers. Next must be safe for concurrent use as long as every
// goroutine passes its own *rand.Rand.
type Chooser interface {
	// Next returns an item number in the chooser's current range.
	Next(r *rand.Rand) uint64
}

// Uniform picks uniformly from [0, N).
type Uniform struct{ N uint64 }

// Next implements Chooser.
func (u Uniform) Next(r *rand.Rand) uint64 { return r.Uint64N(u.N) }

// Zipfian picks from [0, n) with P(i) ∝ 1/(i+1)^θ: item 0 is the most popular. The item
// count may grow (for workloads with inserts); the zeta sum is then extended
// incrementally, as YCSB does, under a lock that is only taken when the count grows.
type Zipfian struct {
	theta, alpha, zeta2 float64

	mu sync.Mutex
	c  atomic.Pointer[zipfConsts]
}

// zipfConsts are the constants for one item count; replaced as a whole when n grows.
type zipfConsts struct {
	n    uint64
	zeta float64
	eta  float64
}

// NewZipfian returns a zipfian chooser over [0, n) with skew theta (0 < theta < 1).
func NewZipfian(n uint64, theta float64) *Zipfian {
	if n == 0 {
		panic("gen: zipfian over zero items")
	}
	return newZipfianWithZeta(n, theta, zeta(0, n, theta, 0))
}

// newZipfianWithZeta is NewZipfian with ζ(n, θ) given, for item counts too large to sum.
func newZipfianWithZeta(n uint64, theta, zetan float64) *Zipfian {
	if theta <= 0 || theta >= 1 {
		panic(fmt.Sprintf("gen: zipfian theta %v outside (0,1)", theta))
	}
	z := &Zipfian{theta: theta, alpha: 1 / (1 - theta), zeta2: zeta(0, 2, theta, 0)}
	z.c.Store(z.consts(n, zetan))
	return z
}

func (z *Zipfian) consts(n uint64, zetan float64) *zipfConsts {
	eta := (1 - math.Pow(2/float64(n), 1-z.theta)) / (1 - z.zeta2/zetan)
	return &zipfConsts{n: n, zeta: zetan, eta: eta}
}

// zeta returns sum + Σ_{i=from+1..to} 1/i^θ: the incremental form lets a growing item
// count extend the previous sum instead of recomputing it.
func zeta(from, to uint64, theta, sum float64) float64 {
	for i := from; i < to; i++ {
		sum += 1 / math.Pow(float64(i+1), theta)
	}
	return sum
}

// Zeta returns the normalising constant Σ_{i=1..n} 1/i^θ (exported for tests and reports).
func Zeta(n uint64, theta float64) float64 { return zeta(0, n, theta, 0) }

// N returns the current item count.
func (z *Zipfian) N() uint64 { return z.c.Load().n }

// Next implements Chooser over the current item count.
func (z *Zipfian) Next(r *rand.Rand) uint64 { return z.nextWith(r, z.c.Load()) }

// NextN draws over [0, n), growing the item count first if n is larger than it.
// A smaller n than the current count is served from the larger distribution and clamped,
// which is what YCSB does too (the count only ever grows in a run).
func (z *Zipfian) NextN(r *rand.Rand, n uint64) uint64 {
	c := z.c.Load()
	if n > c.n {
		z.mu.Lock()
		c = z.c.Load()
		if n > c.n {
			c = z.consts(n, zeta(c.n, n, z.theta, c.zeta))
			z.c.Store(c)
		}
		z.mu.Unlock()
	}
	v := z.nextWith(r, c)
	if v >= n {
		v = n - 1
	}
	return v
}

func (z *Zipfian) nextWith(r *rand.Rand, c *zipfConsts) uint64 {
	u := r.Float64()
	uz := u * c.zeta
	if uz < 1 {
		return 0
	}
	if uz < 1+math.Pow(0.5, z.theta) {
		return 1
	}
	v := uint64(float64(c.n) * math.Pow(c.eta*u-c.eta+1, z.alpha))
	if v >= c.n {
		v = c.n - 1
	}
	return v
}

// ScrambledZipfian is YCSB's requestdistribution=zipfian: a zipfian over a fixed space of
// 10¹⁰ items whose draws are hashed onto the n records, so the hot keys are spread over
// the key space and — what matters more — the skew does not depend on the record count.
// The hottest record gets about 1/ζ(10¹⁰, θ) of the requests (3.8 % at θ = 0.99) however
// many records there are, plus whatever the hash folds onto it. A zipfian over n items
// instead gives its first item 1/ζ(n, θ): 9.1 % at n = 20,000, so a "YCSB zipfian" built
// that way sends two to three times as many requests to the hottest keys as YCSB does
// (YCSB's ScrambledZipfianGenerator, with its ITEM_COUNT and ZETAN constants).
type ScrambledZipfian struct {
	z *Zipfian
	n uint64
}

// scrambledItems is YCSB's ScrambledZipfianGenerator.ITEM_COUNT.
const scrambledItems = 10_000_000_000

// ycsbZetan is YCSB's ScrambledZipfianGenerator.ZETAN, ζ(10¹⁰, 0.99), which YCSB
// precomputes because the sum has 10¹⁰ terms.
const ycsbZetan = 26.46902820178302

// NewScrambledZipfian returns YCSB's scrambled zipfian chooser over [0, n) with skew theta.
func NewScrambledZipfian(n uint64, theta float64) *ScrambledZipfian {
	if n == 0 {
		panic("gen: scrambled zipfian over zero items")
	}
	zetan := ycsbZetan
	if theta != ZipfianConstant {
		zetan = approxZeta(scrambledItems, theta)
	}
	return &ScrambledZipfian{z: newZipfianWithZeta(scrambledItems, theta, zetan), n: n}
}

// Next implements Chooser.
func (s *ScrambledZipfian) Next(r *rand.Rand) uint64 { return FNV64(s.z.Next(r)) % s.n }

// approxZeta returns ζ(n, θ) = Σ_{i=1..n} 1/i^θ for an n too large to sum term by term:
// the first million terms exactly, the rest by the Euler–Maclaurin formula (integral,
// half the end terms, the first derivative correction), which is exact to about 1e-12
// relative here because the terms are smooth and slowly varying past a million.
func approxZeta(n uint64, theta float64) float64 {
	const exact = 1_000_000
	if n <= exact {
		return zeta(0, n, theta, 0)
	}
	f := func(x float64) float64 { return math.Pow(x, -theta) }
	df := func(x float64) float64 { return -theta * math.Pow(x, -theta-1) }
	a, b := float64(exact), float64(n)
	integral := (math.Pow(b, 1-theta) - math.Pow(a, 1-theta)) / (1 - theta)
	tail := integral + (f(b)-f(a))/2 + (df(b)-df(a))/12
	return zeta(0, exact, theta, 0) + tail
}

// Latest favours the most recently inserted items: item max-1 is the most popular,
// where max is the counter's acknowledged limit (YCSB's SkewedLatestGenerator).
type Latest struct {
	ctr *Counter
	z   *Zipfian
}

// NewLatest returns a chooser skewed towards ctr's newest acknowledged items.
func NewLatest(ctr *Counter, theta float64) *Latest {
	n := ctr.Limit()
	if n == 0 {
		n = 1
	}
	return &Latest{ctr: ctr, z: NewZipfian(n, theta)}
}

// Next implements Chooser.
func (l *Latest) Next(r *rand.Rand) uint64 {
	max := l.ctr.Limit()
	if max == 0 {
		return 0
	}
	return max - 1 - l.z.NextN(r, max)
}

// Counter hands out insert item numbers in order and tracks which have been
// acknowledged, so that readers only choose items whose insert has completed
// (YCSB's AcknowledgedCounterGenerator). Inserts complete out of order under
// concurrency; Limit is the end of the contiguous acknowledged prefix.
type Counter struct {
	next  atomic.Uint64
	limit atomic.Uint64

	mu     sync.Mutex
	window []bool // window[i % len] marks item i acknowledged, for limit <= i < limit+len
}

// counterWindow bounds how far acknowledgements may run ahead of the slowest insert.
const counterWindow = 1 << 16

// NewCounter returns a counter whose items [0, start) are already acknowledged.
func NewCounter(start uint64) *Counter {
	c := &Counter{window: make([]bool, counterWindow)}
	c.next.Store(start)
	c.limit.Store(start)
	return c
}

// Next returns the next item number to insert.
func (c *Counter) Next() uint64 { return c.next.Add(1) - 1 }

// Limit returns the number of items known to be inserted: every item below it was acknowledged.
func (c *Counter) Limit() uint64 { return c.limit.Load() }

// Ack records that item i's insert completed. It returns an error if i is too far ahead
// of the oldest unacknowledged item (a stuck insert), which the runner reports.
func (c *Counter) Ack(i uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	lim := c.limit.Load()
	if i < lim {
		return fmt.Errorf("gen: item %d acknowledged twice (limit %d)", i, lim)
	}
	if i-lim >= counterWindow {
		return fmt.Errorf("gen: item %d acknowledged %d ahead of the oldest pending insert %d", i, i-lim, lim)
	}
	c.window[i%counterWindow] = true
	for c.window[lim%counterWindow] {
		c.window[lim%counterWindow] = false
		lim++
	}
	c.limit.Store(lim)
	return nil
}

// FNV64 is YCSB's Utils.fnvhash64 of an item number (used to scramble and to name keys):
// FNV-1a over its eight bytes, then the absolute value of the result read as Java's signed
// long, so key names are YCSB's. (Which records are hot can still differ: YCSB's
// CoreWorkload hashes its draws modulo the record count plus one plus the inserts it
// expects, and redraws past the last insert; the shape of the distribution is the same.)
func FNV64(v uint64) uint64 {
	const offset, prime = 0xCBF29CE484222325, 1099511628211
	h := uint64(offset)
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= prime
		v >>= 8
	}
	if s := int64(h); s < 0 && s != math.MinInt64 {
		h = uint64(-s)
	}
	return h
}
