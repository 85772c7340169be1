package vrshard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// chainReadAt reads k at node i (linearizable), once, within 500 ms.
func (g *chainGroup) chainReadAt(i int, k string) (kv.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return g.reps[i].Read(ctx, get(k), level.ConsLinearizable, shard.Session{})
}

// TestChainCRAQReadWhileAnUpdateIsInFlight: a chain of three log members
// under SU whose middle member's log fsyncs are held (gatedFS), so an update is
// dirty at the head and at the middle — held there, not yet at the tail —
// until the test lets them go. A linearizable read at the head, and at the middle, is not
// answered from there (neither the dirty value nor the older one, which an
// answered write might already have replaced): it is sent to the tail at
// once (a NotLeaderError naming node 3, which the front door forwards),
// and the tail, where the key is clean, answers the committed value while
// the write is still in flight. A read of another, clean key is answered at
// the head at once. Once the write is answered every member serves the new
// value. With the mutation chainReadDirty (a member serves its dirty value)
// the head answers v2 while the tail answers v1, and the test fails.
func TestChainCRAQReadWhileAnUpdateIsInFlight(t *testing.T) {
	if err := craqInFlight(t, false); err != nil {
		t.Fatal(err)
	}
}

func TestChainCRAQReadDirtyMutation(t *testing.T) {
	if !mutation.On {
		t.Skip("needs -tags mutations")
	}
	err := craqInFlight(t, true)
	if err == nil {
		t.Fatal("chainReadDirty: a member serving its dirty value was not caught")
	}
	t.Logf("chainReadDirty caught: %v", err)
}

func craqInFlight(t *testing.T, dirty bool) error {
	gate := newGatedFS(vfs.OS{}) // the middle's log fsyncs
	g := newModeChain(t, chain.SU, func(i int, o *Options) {
		if i == 1 {
			o.FS = gate
		}
		o.mut.chainReadDirty = dirty
	})
	g.write(0, set("k", "v1"), shard.ReqID{Client: 5, Seq: 1})
	g.write(0, set("other", "o"), shard.ReqID{Client: 5, Seq: 2})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	for i := range 3 {
		if got := g.read(i, "k"); got != "v1" {
			return fmt.Errorf("before: GET k at node %d = %q", i+1, got)
		}
	}
	w := startGatedWrite(g, gate, set("k", "v2"), shard.ReqID{Client: 5, Seq: 3})
	defer w.finish()
	// The head holds the update as soon as it took it; the middle once it
	// arrived (it is then waiting for its disk).
	for _, i := range []int{0, 1} {
		var res kv.Result
		var err error
		if !testgroup.Until(time.Second, 2*time.Millisecond, func() bool {
			res, err = g.chainReadAt(i, "k")
			return err != nil || string(res.Bulk) != "v1"
		}) {
			return fmt.Errorf("node %d kept answering v1 for a second: the update never reached it", i+1)
		}
		if err == nil {
			return fmt.Errorf("GET k at node %d while v2 is in flight = %q (served there, dirty)", i+1, res.Bulk)
		}
		if !isRedirectTo(err, 3) {
			return fmt.Errorf("GET k at node %d while v2 is in flight: %v, want it sent to the tail (node 3)", i+1, err)
		}
	}
	start := time.Now()
	res, err := g.chainReadAt(2, "k")
	if err != nil || string(res.Bulk) != "v1" {
		return fmt.Errorf("GET k at the tail while v2 is in flight = %q, %v; want v1, the committed value", res.Bulk, err)
	}
	if took := time.Since(start); took > 300*time.Millisecond {
		return fmt.Errorf("the tail answered in %v: it waited", took)
	}
	if res, err := g.chainReadAt(0, "other"); err != nil || string(res.Bulk) != "o" {
		return fmt.Errorf("GET other (clean) at the head = %q, %v", res.Bulk, err)
	}
	if w.answered.Load() {
		return fmt.Errorf("the write of v2 was answered before the reads: the update was not in flight")
	}
	if st := g.reps[0].Stats(); st.ChainToTail == 0 || st.ChainClean == 0 {
		return fmt.Errorf("head stats %+v: want reads sent to the tail and clean reads", st)
	}
	if err := w.finish(); err != nil {
		return fmt.Errorf("the write of v2: %v", err)
	}
	for i := range 3 {
		if got := g.read(i, "k"); got != "v2" {
			return fmt.Errorf("after: GET k at node %d = %q", i+1, got)
		}
	}
	return nil
}

// TestChainReadsAtEveryMemberLinearizable: under SU and AUSI, clients write
// (SET, CAS) at the head and read linearizably at a random member,
// following a redirect to the node it names (the tail, for a key dirty
// where the read came; the head, for a member without its lease yet), as
// the front door forwards; the history of three hot keys is linearizable.
// Under SU the middle member's disk is 5 ms slower per fsync, so updates
// sit dirty upstream of it. With the mutation chainReadDirty the checker
// fails (TestChainReadsAtEveryMemberMutation).
func TestChainReadsAtEveryMemberLinearizable(t *testing.T) {
	for _, mode := range []chain.Mode{chain.SU, chain.AUSI} {
		t.Run(mode.String(), func(t *testing.T) {
			h, st := chainReadHistory(t, mode, nil, false)
			ok, unknown := summarize(h)
			t.Logf("%v: %d operations, %d ok, %d unknown; reads at each member %v, served clean %d, sent to the tail %d, waited %d",
				mode, len(h.Ops), ok, unknown, st.at, st.clean, st.toTail, st.waits)
			if ok < 100 || st.clean == 0 || st.toTail == 0 {
				t.Fatalf("%v: too little happened (%d ok, %d clean, %d to the tail): the test proves nothing", mode, ok, st.clean, st.toTail)
			}
			for i, n := range st.at {
				if n == 0 {
					t.Fatalf("%v: no read answered at node %d", mode, i+1)
				}
			}
			if v := check.Linearizable(h, linOptions()); !v.OK {
				t.Fatalf("%v: history not linearizable:\n%v", mode, v)
			}
		})
	}
}

func TestChainReadsAtEveryMemberMutation(t *testing.T) {
	if !mutation.On {
		t.Skip("needs -tags mutations")
	}
	h, _ := chainReadHistory(t, chain.SU, func(o *Options) { o.mut.chainReadDirty = true }, false)
	if v := check.Linearizable(h, linOptions()); v.OK {
		t.Fatal("chainReadDirty: a member serving dirty values, and the history is still linearizable: not caught")
	}
	t.Log("chainReadDirty: history not linearizable: caught")
}

// TestChainReadsAtEveryMemberVersionQuery is the workload of
// TestChainReadsAtEveryMemberLinearizable with CRAQ's version query on
// (Options.AskTail, to the tail in this process): a read of a key dirty
// where it came asks the tail's version and is answered there, waiting
// for its apply when the tail is ahead; the history stays linearizable.
func TestChainReadsAtEveryMemberVersionQuery(t *testing.T) {
	for _, mode := range []chain.Mode{chain.SU, chain.AUSI} {
		t.Run(mode.String(), func(t *testing.T) {
			h, st := chainReadHistory(t, mode, nil, true)
			ok, unknown := summarize(h)
			t.Logf("%v: %d operations, %d ok, %d unknown; reads at each member %v, served clean %d, at the tail's version %d (from a held update %d), sent to the tail %d (after a failed query or a long wait %d), waited %d",
				mode, len(h.Ops), ok, unknown, st.at, st.clean, st.version, st.held, st.toTail, st.fallbacks, st.waits)
			if ok < 100 || st.clean == 0 || st.version == 0 {
				t.Fatalf("%v: too little happened (%d ok, %d clean, %d at the tail's version): the test proves nothing", mode, ok, st.clean, st.version)
			}
			if v := check.Linearizable(h, linOptions()); !v.OK {
				t.Fatalf("%v: history not linearizable:\n%v", mode, v)
			}
		})
	}
}

// TestChainReadsAtEveryMemberHeldNewestMutation: the version-query workload
// with the mutation chainHeldNewest (a dirty read answered from the newest
// update held at the member, whatever the tail's version: values not yet
// committed) is not linearizable.
func TestChainReadsAtEveryMemberHeldNewestMutation(t *testing.T) {
	mutation.Require(t)
	h, st := chainReadHistory(t, chain.SU, func(o *Options) { o.mut.chainHeldNewest = true }, true)
	if v := check.Linearizable(h, linOptions()); v.OK {
		t.Fatalf("chainHeldNewest: members serving held updates the tail had not committed (%d held reads), and the history is still linearizable: not caught", st.held)
	}
	t.Log("chainHeldNewest: history not linearizable: caught")
}

type chainReadStats struct {
	at                                             [3]int
	clean, toTail, waits, version, fallbacks, held uint64
}

// chainReadHistory runs the workload of TestChainReadsAtEveryMemberLinearizable
// for 2 s and returns its history.
// With version, the members ask the tail's version for a dirty key; mut
// (nil: none) switches a mutation on at every member.
func chainReadHistory(t *testing.T, mode chain.Mode, mut func(o *Options), version bool) (check.History, chainReadStats) {
	var q versionQuery
	slow := newGatedFS(vfs.OS{}) // the middle's log fsyncs
	if mode == chain.SU {
		slow.delay.Store(int64(5 * time.Millisecond))
	}
	g := newModeChain(t, mode, func(i int, o *Options) {
		if i == 1 {
			o.FS = slow
		}
		if mut != nil {
			mut(o)
		}
		if version {
			q.tune(i, o)
		}
	})
	q.g.Store(g)
	keys := []string{"x", "y", "z"}
	g.write(0, set("warm", "w"), shard.ReqID{Client: 5, Seq: 1}) // the leases, the links
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	rec := check.NewRecorder(nil)
	var mu sync.Mutex
	var st chainReadStats
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			var seq uint64
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[rng.IntN(len(keys))]
				op := check.Op{Client: c, Key: key}
				var sop kv.Op
				switch p := rng.IntN(10); {
				case p < 6:
					op.Kind, op.Cons = check.Get, level.ConsLinearizable
					sop = get(key)
				case p < 9:
					op.Kind, op.Value, op.Dur = check.Put, fmt.Sprintf("c%d-%d", c, n), level.Sync
					sop = set(key, op.Value)
				default:
					op.Kind, op.Dur = check.CAS, level.Sync
					op.Expect, op.Value = fmt.Sprintf("c%d-%d", rng.IntN(4), rng.IntN(n+1)), fmt.Sprintf("c%d-%d", c, n)
					sop = kv.Op{Kind: kv.KindCAS, Key: []byte(key), Expected: []byte(op.Expect), Value: []byte(op.Value)}
				}
				h := rec.Invoke(op)
				if op.Kind == check.Get {
					at := rng.IntN(3)
					deadline := time.Now().Add(2 * time.Second)
					for {
						ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
						res, err := g.reps[at].Read(ctx, sop, level.ConsLinearizable, shard.Session{})
						cancel()
						if err == nil {
							rec.Complete(h, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Version: res.Version, Node: at})
							mu.Lock()
							st.at[at]++
							mu.Unlock()
							break
						}
						if time.Now().After(deadline) {
							rec.Unknown(h)
							break
						}
						if id, _, ok := LeaderOf(err); ok && id >= 1 && id <= 3 {
							at = int(id - 1) // the front door's forward
						} else {
							time.Sleep(5 * time.Millisecond)
						}
					}
					continue
				}
				seq++
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				res, err := g.reps[0].Write(ctx, sop, level.Sync, shard.ReqID{Client: uint64(100 + c), Seq: seq})
				cancel()
				if err != nil {
					rec.Unknown(h) // a write refused or timed out: its outcome unknown
					continue
				}
				out := check.Result{Version: res.Version, Node: 0}
				if op.Kind == check.CAS {
					out.Found = res.Int == 1
				}
				rec.Complete(h, out)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	for _, r := range g.reps {
		s := r.Stats()
		st.clean += s.ChainClean
		st.toTail += s.ChainToTail
		st.waits += s.ChainWaits
		st.version += s.ChainVersionReads
		st.fallbacks += s.ChainVersionFallbacks
		st.held += s.ChainHeldReads
	}
	return rec.History(), st
}

// gatedWrite is a write at a chain's head held in flight by gate (a
// member's log fsyncs): startGatedWrite holds the gate and sends the write
// in the background; answered says whether its reply came; finish lets the
// fsyncs go and returns the write's error (nil after the first call, so a
// deferred finish is harmless).
type gatedWrite struct {
	gate     *gatedFS
	answered atomic.Bool
	done     chan error
	finished bool
}

func startGatedWrite(g *chainGroup, gate *gatedFS, op kv.Op, id shard.ReqID) *gatedWrite {
	w := &gatedWrite{gate: gate, done: make(chan error, 1)}
	gate.hold()
	go func() {
		_, err := g.tryWrite(0, op, id)
		w.answered.Store(true)
		w.done <- err
	}()
	return w
}

func (w *gatedWrite) finish() error {
	if w.finished {
		return nil
	}
	w.finished = true
	w.gate.release()
	return <-w.done
}
