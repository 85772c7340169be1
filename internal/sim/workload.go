package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
)

// KV is a key-value workload over a few hot keys, so operations collide. Every
// written value is unique ("c<client>-<n>"), as the checkers want. Weights
// pick the operation kind; all zero means reads and puts half and half.
type KV struct {
	Keys                        int
	Get, Put, Delete, CAS, Incr float64
	// Cons and Dur are attached to every operation (zero = server default).
	Cons level.Consistency
	Dur  level.Durability
}

// Next implements Workload.
func (w KV) Next(rng *rand.Rand, client, seq int) check.Op {
	keys := max(w.Keys, 1)
	op := check.Op{Key: fmt.Sprintf("k%d", rng.IntN(keys)), Cons: w.Cons, Dur: w.Dur}
	weights := [5]float64{w.Get, w.Put, w.Delete, w.CAS, w.Incr}
	var sum float64
	for _, x := range weights {
		sum += x
	}
	if sum == 0 {
		weights, sum = [5]float64{1, 1, 0, 0, 0}, 2
	}
	x := rng.Float64() * sum
	k := 0
	for k < len(weights)-1 && x >= weights[k] {
		x -= weights[k]
		k++
	}
	val := fmt.Sprintf("c%d-%d", client, seq)
	switch k {
	case 0:
		op.Kind = check.Get
	case 1:
		op.Kind, op.Value = check.Put, val
	case 2:
		op.Kind = check.Delete
	case 3:
		// Expect a value this client may have written recently, so some CASes
		// succeed.
		op.Kind, op.Value = check.CAS, val
		op.Expect = fmt.Sprintf("c%d-%d", rng.IntN(client+1), max(seq-1-rng.IntN(3), 0))
	case 4:
		op.Kind, op.Delta = check.Incr, 1
		op.Key = "n" + op.Key
	}
	return op
}
