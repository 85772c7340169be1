package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// A live move of slots 0-4095 from group 1 to group 2 under concurrent
// clients that read (linearizable and cross-client-monotonic), put and CAS
// a few keys — most in the moving slots, one in each group's other slots —
// through every node, with the source group's leader SIGKILLed mid-copy and
// restarted after. Every key's history spans both groups; judged by the
// checkers:
//   - linearizable per key (check.Linearizable, strict), the
//     cross-client-monotonic reads included: in a cluster each group's
//     leader serves them as it serves linearizable reads, which is what
//     makes them sequentially consistent across groups
//     (cluster.Multi.CheckConsistency);
//   - cross-client monotonic (check.CrossClientMonotonic) as recorded.
func TestGroupsMoveUnderALinearizabilityWorkload(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	rs := []kv.SlotRange{{Start: 0, End: 4095}}
	var keys []string
	moving := 0
	for i := 0; len(keys) < 5; i++ {
		k := "lin" + strconv.Itoa(i)
		switch s := kv.KeySlot([]byte(k)); {
		case s <= 4095 && moving < 3:
			moving++
			keys = append(keys, k)
		case s > 4095 && s <= 8191 && len(keys) == moving && moving == 3:
			keys = append(keys, k) // group 1's, not moving
		case s >= 8192 && len(keys) == 4:
			keys = append(keys, k) // group 2's from the start
		}
	}
	// A pre-copy of several pages, so that the kill lands inside it.
	var cmds [][]string
	for i, n := 0, 0; n < 300; i++ {
		if k := "pre" + strconv.Itoa(i); kv.KeySlot([]byte(k)) <= 4095 {
			cmds = append(cmds, []string{"SET", k, "x"})
			n++
		}
	}
	pipelineRetry(t, g.Nodes[0].ClientAddr, cmds...)

	t0 := time.Now()
	clock := func() int64 { return int64(time.Since(t0)) }
	rec := check.NewRecorder(clock)
	var stop atomic.Bool
	var wg sync.WaitGroup
	readLevel := func(rng *rand.Rand) level.Consistency {
		if rng.IntN(2) == 0 {
			return level.ConsCrossClient
		}
		return level.ConsLinearizable
	}
	checkedClients(t, &wg, &stop, rec, g.Addrs(), keys, 4, readLevel)
	time.Sleep(time.Second)

	victim := g.SlotLeader(0)
	if victim < 0 {
		t.Fatal("no leader known for group 1")
	}
	seed := (victim + 1) % 3
	var pages atomic.Int32
	mv := &kcluster.Mover{Seeds: []string{g.Nodes[seed].ClientAddr, g.Nodes[(seed+1)%3].ClientAddr}, Logf: t.Logf, Page: 50,
		AfterStep: func(step string) {
			switch {
			case step == "precopy-page" && pages.Add(1) == 2:
				t.Logf("killing %s, group 1's leader, after 2 pages of the pre-copy", g.Nodes[victim].ID)
				g.Nodes[victim].Kill()
			case step == "precopy":
				time.Sleep(500 * time.Millisecond) // writes for the final copy to bring
			case step == "handover":
				time.Sleep(300 * time.Millisecond) // requests meet the held window
			}
		}}
	moveStart := clock()
	res, err := mv.Move(context.Background(), 1, 2, rs)
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	moveEnd := clock()
	if pages.Load() < 2 {
		t.Fatalf("the pre-copy had %d pages: the kill did not happen mid-copy", pages.Load())
	}
	t.Logf("move: %+v", res)
	g.Nodes[victim].Start()
	time.Sleep(time.Second) // traffic after the move, at the new owner
	stop.Store(true)
	wg.Wait()

	h := rec.History()
	ccm := 0
	lin := check.History{Ops: make([]check.Op, len(h.Ops)), Crashes: h.Crashes}
	copy(lin.Ops, h.Ops)
	for i := range lin.Ops {
		if lin.Ops[i].Cons.Kind == level.CrossClientMonotonic {
			lin.Ops[i].Cons = level.ConsLinearizable
			ccm++
		}
	}
	v := check.Linearizable(lin, check.LinOptions{Timeout: 60 * time.Second, Strict: true})
	if !v.OK {
		// The key's whole history is the counter-example: name it, not
		// its thousands of ops (porcupine's visualization has them).
		why := "no violation listed"
		if len(v.Violations) > 0 {
			vi := v.Violations[0]
			why = fmt.Sprintf("key %s: %s (%d ops)", vi.Key, vi.Reason, len(vi.Ops))
		}
		t.Fatalf("history of %d ops (%d cross-client-monotonic reads judged as linearizable) is not linearizable: %s; visualization %s", len(h.Ops), ccm, why, v.Visualization)
	}
	if c := check.CrossClientMonotonic(h); !c.OK || c.Checked == 0 {
		t.Fatalf("cross-client monotonic: %+v", c)
	}
	// The moving keys' histories span the move: ops that succeeded at
	// group 1 before it, while it ran (the kill, the held hand-over) and at
	// group 2 after it.
	var before, during, after int
	for _, op := range h.Ops {
		if op.Outcome != check.OK || kv.KeySlot([]byte(op.Key)) > 4095 {
			continue
		}
		switch {
		case op.Return < moveStart:
			before++
		case op.Invoke > moveEnd:
			after++
		default:
			during++
		}
	}
	t.Logf("linearizable: %d ops checked (%d cross-client-monotonic reads) over keys %v; ops on the moving keys before, during, after the move: %d, %d, %d",
		v.Checked, ccm, keys, before, during, after)
	if ccm == 0 || before == 0 || during == 0 || after == 0 {
		t.Fatalf("too little to judge the move: %d cross-client-monotonic reads; %d, %d, %d ops on the moving keys before, during, after it", ccm, before, during, after)
	}
}
