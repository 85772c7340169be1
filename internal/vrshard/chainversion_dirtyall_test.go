package vrshard

import (
	"testing"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/shard"
)

// TestChainNeedAtTwoWritesAllInFlight: the version query's need when two
// ops writing keys they do not name (a flush, a script, a cross-group
// decide) are in flight at a member, the tail's version v between them.
// indexChain keeps only the highest such op (chainDirtyAll = f2 > v), so
// chainNeedAt drops it — but the lower one (f1 <= v) is committed at the
// tail and may have been answered (EVAL "SET k v2" replied) before the
// read began; its write of k is in no per-key index, so a member that has
// not applied f1 must wait for it, not answer k's value from before it.
// The index state is set by hand as indexChain leaves it (flushed at f1
// and f2, chainDirtyAll f2), both above what the member applied.
func TestChainNeedAtTwoWritesAllInFlight(t *testing.T) {
	g := newModeChain(t, chain.SU, nil)
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	r := g.reps[0]
	R := r.readable.Load()
	f1, f2 := R+1, R+2
	r.upd.flushed(f1)
	r.upd.flushed(f2)
	r.chainDirtyAll.Store(f2)
	op := get("k")
	if need := r.chainNeedAt(&op, f1); need < f1 {
		t.Fatalf("chainNeedAt(GET k, v=%d) with writes-all ops %d and %d in flight (R %d) = %d: a read answered before f1 is applied returns k as it was before f1, which the tail committed", f1, f1, f2, R, need)
	}
}
