package check

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
)

// A transaction workload for CheckTxns: TxnGen makes random transactions
// from a seed, and RunTxns runs them from concurrent processes against any
// store behind a TxnRunner (an in-memory reference store in the tests, the
// real server once it has transactions), recording the history.

// ErrTxnAborted marks a transaction that definitely did not commit (a
// conflict, EXEC answering nil): a TxnRunner returns an error wrapping it.
var ErrTxnAborted = errors.New("check: transaction aborted")

// TxnRunner executes transactions against a store.
type TxnRunner interface {
	// Run executes t.Mops as one transaction for process t.Process and
	// returns them with the reads filled in (a list read's List non-nil).
	// An error wrapping ErrTxnAborted means it did not commit; any other
	// error leaves its outcome unknown.
	Run(ctx context.Context, t Txn) ([]Mop, error)
}

// TxnWorkload shapes generated transactions. Zero fields take the defaults.
type TxnWorkload struct {
	Seed      int64
	Processes int // concurrent processes (default 4)
	Keys      int // keys in use at a time (default 8)
	MaxMops   int // micro-ops per transaction, 1..MaxMops (default 4)
	// ReadPercent of the micro-ops are reads (default 50).
	ReadPercent int
	// MaxWritesPerKey: a key written this many times is retired for a fresh
	// one, so that list reads stay short (default 64).
	MaxWritesPerKey int
	// Register generates rw-register writes instead of list appends.
	Register bool
	// KeyPrefix is prepended to every key ("k0", "k1", ...), e.g. a hash
	// tag to keep a run's keys in one slot of a cluster.
	KeyPrefix string
}

func (w TxnWorkload) withDefaults() TxnWorkload {
	if w.Processes <= 0 {
		w.Processes = 4
	}
	if w.Keys <= 0 {
		w.Keys = 8
	}
	if w.MaxMops <= 0 {
		w.MaxMops = 4
	}
	if w.ReadPercent <= 0 {
		w.ReadPercent = 50
	}
	if w.MaxWritesPerKey <= 0 {
		w.MaxWritesPerKey = 64
	}
	return w
}

// TxnGen generates transactions: the same seed and the same sequence of
// calls give the same transactions. Written values are unique per key
// (1, 2, 3... per key). Safe for concurrent use.
type TxnGen struct {
	mu      sync.Mutex
	w       TxnWorkload
	rng     *rand.Rand
	slots   []int       // key ids in use
	written map[int]int // key id -> values written so far
	nextKey int
}

// NewTxnGen returns a generator for w.
func NewTxnGen(w TxnWorkload) *TxnGen {
	w = w.withDefaults()
	g := &TxnGen{w: w, rng: rand.New(rand.NewSource(w.Seed)), written: map[int]int{}}
	for i := 0; i < w.Keys; i++ {
		g.slots = append(g.slots, i)
	}
	g.nextKey = w.Keys
	return g
}

// Next returns the micro-ops of a new transaction.
func (g *TxnGen) Next() []Mop {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 1 + g.rng.Intn(g.w.MaxMops)
	mops := make([]Mop, 0, n)
	for i := 0; i < n; i++ {
		slot := g.rng.Intn(len(g.slots))
		id := g.slots[slot]
		key := fmt.Sprintf("%sk%d", g.w.KeyPrefix, id)
		if g.rng.Intn(100) < g.w.ReadPercent {
			m := Mop{Kind: MopRead, Key: key}
			if !g.w.Register {
				m.List = []int{}
			}
			mops = append(mops, m)
			continue
		}
		g.written[id]++
		kind := MopAppend
		if g.w.Register {
			kind = MopWrite
		}
		mops = append(mops, Mop{Kind: kind, Key: key, Value: g.written[id]})
		if g.written[id] >= g.w.MaxWritesPerKey {
			delete(g.written, id)
			g.slots[slot] = g.nextKey
			g.nextKey++
		}
	}
	return mops
}

// RunTxns runs n generated transactions of w from w.Processes concurrent
// processes against r and returns the history (times from the monotonic
// clock). A process whose transaction ends unknown is replaced by a fresh
// process id, as in Jepsen: the old one may still be in flight, and its
// session order no longer means anything. It stops early, returning what
// it recorded and ctx's error, when ctx is done.
func RunTxns(ctx context.Context, r TxnRunner, w TxnWorkload, n int) (TxnHistory, error) {
	w = w.withDefaults()
	gen := NewTxnGen(w)
	rec := NewTxnRecorder(nil)
	var left atomic.Int64
	left.Store(int64(n))
	var nextProc atomic.Int64
	nextProc.Store(int64(w.Processes))
	var wg sync.WaitGroup
	for p := 0; p < w.Processes; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for ctx.Err() == nil && left.Add(-1) >= 0 {
				t := Txn{Process: p, Mops: gen.Next()}
				t.ID = rec.Invoke(t)
				mops, err := r.Run(ctx, t)
				switch {
				case err == nil:
					rec.Complete(t.ID, mops)
				case errors.Is(err, ErrTxnAborted):
					rec.Fail(t.ID)
				default:
					rec.Unknown(t.ID)
					p = int(nextProc.Add(1) - 1)
				}
			}
		}(p)
	}
	wg.Wait()
	return rec.History(), ctx.Err()
}
