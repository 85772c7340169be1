package vrshard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// Pipelines under faults (docs/design/cad.md §12). A RESP connection that
// pipelines [SET k v; GET k'] has the server Apply the SET (a sync blind
// write now returns at its ordered point), run the GET — after waiting for
// the SET if k' = k, as the front door does — and release both replies
// once the SET is applied. Linearizability alone cannot see a GET of k
// that misses the SET before it (the two overlap), so the workload also
// checks the pipeline's own order: a read of the key the same pipeline
// just wrote returns that write or a later one. (The front door's wait has
// its own test and mutation: internal/server/sync_pipeline_test.go.)

type pipeStats struct {
	sameKey    atomic.Int64 // completed [put k; read k] pipelines
	mu         sync.Mutex
	violations []string
}

func (p *pipeStats) violate(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.violations) < 5 {
		p.violations = append(p.violations, msg)
	}
}

// doPipelined runs put h and a read behind it as one pipeline at the
// leader guess, once (any failure leaves both outcomes unknown, as the
// server then sends neither reply).
func (w *workload) doPipelined(h, client int, sop kv.Op, id shard.ReqID, rng *rand.Rand) {
	key := string(sop.Key)
	rkey := key
	if rng.IntN(2) == 0 {
		rkey = w.keys[rng.IntN(len(w.keys))]
	}
	// The read is another caller's on the same connection (the recorder
	// allows one operation in flight per client), as when the Go client
	// pipelines its callers' calls.
	rh := w.rec.Invoke(check.Op{Client: client + 10000, Key: rkey, Kind: check.Get, Cons: level.ConsLinearizable})
	target := w.leaderGuess()
	r := w.replica(target)
	if r == nil {
		w.rec.Unknown(h)
		w.rec.Unknown(rh)
		time.Sleep(5 * time.Millisecond)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	reqs := []shard.WriteReq{{Op: sop, Durability: level.Sync, ID: id}}
	wp, err := r.Apply(ctx, reqs)
	if err != nil || reqs[0].Err != nil {
		w.rec.Unknown(h)
		w.rec.Unknown(rh)
		time.Sleep(5 * time.Millisecond)
		return
	}
	var res kv.Result
	var rp shard.Pending
	var rerr error
	if rkey == key {
		// The front door's barrier: the read waits for the write.
		if err := r.Wait(ctx, wp); err != nil {
			w.rec.Unknown(h)
			w.rec.Unknown(rh)
			return
		}
	}
	res, rp, rerr = r.ReadDeferred(ctx, get(rkey), level.ConsLinearizable, shard.Session{})
	if err := r.Wait(ctx, wp); err != nil {
		w.rec.Unknown(h)
		w.rec.Unknown(rh)
		return
	}
	if rerr == nil && !rp.IsZero() {
		w.deferred.Add(1)
		rerr = r.Wait(ctx, rp)
	}
	put := reqs[0].Result
	w.rec.Complete(h, check.Result{Version: put.Version, Node: target})
	if rerr != nil {
		w.rec.Unknown(rh)
		return
	}
	w.rec.Complete(rh, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Version: res.Version, Node: target})
	if rkey == key {
		w.pipe.sameKey.Add(1)
		if res.Version < put.Version {
			w.pipe.violate(fmt.Sprintf("client %d: [SET %s at op %d; GET %s] read %q at op %d", client, key, put.Version, key, res.Bulk, res.Version))
		}
	}
}

func pipelinedWorkload(t *testing.T, kills bool, d time.Duration, seed uint64) (*workload, check.History) {
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 200
		o.KeepTail = 20
	})
	c.leader(5 * time.Second)
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 5, keys: workloadKeys("x", "y", "z"), pipelined: true, deferredReads: true}
	return w, runWorkload(t, w, d, kills, seed)
}

func TestPipelinedSyncWritesUnderFaultsAreLinearizableAndInOrder(t *testing.T) {
	w, h := pipelinedWorkload(t, true, workloadTime(), 11)
	ok, unknown := summarize(h)
	t.Logf("%d operations: %d ok, %d unknown, %d crashes; %d same-key pipelines, %d reads deferred", len(h.Ops), ok, unknown, len(h.Crashes), w.pipe.sameKey.Load(), w.deferred.Load())
	if ok < 100 || w.pipe.sameKey.Load() < 20 {
		t.Fatalf("%d operations, %d same-key pipelines completed: the test tested nothing", ok, w.pipe.sameKey.Load())
	}
	if v := check.Linearizable(h, linOptions()); !v.OK {
		t.Fatalf("history not linearizable:\n%v", v)
	}
	if len(w.pipe.violations) > 0 {
		t.Fatalf("a read missed the write pipelined before it: %v", w.pipe.violations)
	}
}
