package vrshard

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// TestChainJoinPagedUnderWrites: a member joining a compacted chain pulls
// the tail's snapshot a page at a time (docs/design/chain.md, "Paged
// snapshots") while writes go on at the head — SETs and INCRs, whose
// replay over a wrong state shows — and ends with exactly the other
// members' state. Its first attempt is crashed in the middle of its pages
// and restarted on the same disk: it recovers from the chain as a wiped
// member does, pages the snapshot again, and joins. With the mutation
// pageMovingVersion (each page read at the tail's version of the moment,
// not the capture's), the joiner's state differs: the log after the
// capture's op replays over pages that already hold some of it.
func TestChainJoinPagedUnderWrites(t *testing.T) {
	mutation.Require(t)
	if os.Getenv("KEFIR_SOAK") != "1" {
		// A known, untraced stall (docs/design/chain.md, "Paged
		// snapshots"): after the joiner's crash in the middle of its pages
		// the join sometimes never completes (the chain stays [1 3] for
		// 30 s) — in 0 of 15 runs at one hour and 6 of 6 the next, on the
		// same code. Kept out of make test until it is found.
		t.Skip("paged join after a joiner crash can stall (a known open bug): KEFIR_SOAK=1 runs it")
	}
	for _, moving := range []bool{false, true} {
		t.Run(fmt.Sprintf("moving=%t", moving), func(t *testing.T) {
			diff := pagedJoin(t, moving)
			switch {
			case !moving && diff != "":
				t.Fatalf("after the paged join: %s", diff)
			case moving && diff == "":
				t.Fatal("with pages read at a moving version every member still agrees: the test does not see it")
			case moving:
				t.Logf("caught: %s", diff)
			}
		})
	}
}

// pagedJoin runs the join (crashing the joiner's first attempt mid-pages
// unless moving) and returns the first difference between the members'
// states ("" if none).
func pagedJoin(t *testing.T, moving bool) string {
	const keys, counters = 150, 10
	var pagesIn [3]atomic.Int64 // the joiner's pages written so far, by node
	g := newChainGroupTuned(t, 0, func(i int, o *Options) {
		o.CheckpointOps, o.KeepTail = 64, 16
		// ~50 pages of ~512 B, paced to ~0.5 s, so writes come between them.
		o.Chain.SnapshotPage, o.Chain.PrecopyRate = 512, 48<<10
		o.mut.pageMovingVersion = moving
		o.mut.afterHandle = func(r *Replica) { pagesIn[i].Store(int64(r.pagesIn)) }
	})
	var seq atomic.Uint64
	val := strings.Repeat("v", 100)
	for k := range keys {
		g.write(0, set(fmt.Sprint("k", k), fmt.Sprint(val, k)), shard.ReqID{Client: 5, Seq: seq.Add(1)})
	}
	g.crash(1)
	g.waitMembers(1, 3)
	g.dirs[1] = t.TempDir() // node 2 comes back as a new node
	for k := range 200 {    // the tail compacts far past nothing
		g.write(0, set(fmt.Sprint("k", k%keys), fmt.Sprint(val, k)), shard.ReqID{Client: 5, Seq: seq.Add(1)})
	}

	// Writers at the head through the join.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var werr atomic.Value
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := uint64(10 + w)
			for n := uint64(1); ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				op := set(fmt.Sprint("k", (n*7+uint64(w))%keys), fmt.Sprint("w", w, "-", n))
				if n%2 == 0 {
					op = kv.Op{Kind: kv.KindIncrBy, Key: []byte(fmt.Sprint("c", n%counters)), Delta: 1}
				}
				if _, err := g.tryWrite(0, op, shard.ReqID{Client: client, Seq: n}); err != nil {
					werr.Store(err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	g.restart(1)
	if !moving {
		// The first attempt dies in the middle of its pages.
		if !testgroup.Until(10*time.Second, time.Millisecond, func() bool { return pagesIn[1].Load() >= 3 }) {
			t.Fatalf("the joiner wrote %d pages", pagesIn[1].Load())
		}
		g.crash(1)
		g.restart(1)
	}
	// Not g.waitMembers' 10 s: on a loaded box the master may wait out the
	// crashed incarnation's StartGrace (10 s) before it joins the new one.
	joinWait := 30 * time.Second
	if moving {
		// Pages read at a moving version may also keep the join from
		// completing (CI saw the chain stay [1 3] for 30 s): a failure the
		// test sees as well as a difference in state.
		joinWait = 10 * time.Second
	}
	if !testgroup.Until(joinWait, 10*time.Millisecond, func() bool { return slices.Equal(g.master.Members(), []uint64{1, 2, 3}) }) {
		if moving {
			close(stop)
			wg.Wait()
			return fmt.Sprintf("the join did not complete: chain %v", g.master.Members())
		}
		t.Fatalf("chain %v, want [1 2 3]", g.master.Members())
	}
	time.Sleep(200 * time.Millisecond) // writes after the join too
	close(stop)
	wg.Wait()
	if err, _ := werr.Load().(error); err != nil {
		t.Fatal(err)
	}
	g.write(0, set("last", "1"), shard.ReqID{Client: 5, Seq: seq.Add(1)})
	g.caughtUp(1, 0)
	g.caughtUp(2, 0)
	if st := g.reps[1].Stats(); st.SnapsLoaded == 0 {
		t.Fatalf("the joiner loaded no snapshot (stats %+v)", st)
	}
	// Every member's engine, key by key (each applied the same ops: the
	// same values at the same versions).
	value := func(i int, key string) string {
		v, err := g.reps[i].db.Get([]byte(key))
		if errors.Is(err, storage.ErrNotFound) {
			return "(none)"
		} else if err != nil {
			t.Fatalf("%s at node %d: %v", key, i+1, err)
		}
		return fmt.Sprintf("%q@%d", v.Data, v.Version)
	}
	for i := 1; i < 3; i++ {
		for k := range keys + counters {
			key := fmt.Sprint("k", k)
			if k >= keys {
				key = fmt.Sprint("c", k-keys)
			}
			if got, want := value(i, key), value(0, key); got != want {
				return fmt.Sprintf("%s at node %d = %s, at the head %s", key, i+1, got, want)
			}
		}
	}
	return ""
}
