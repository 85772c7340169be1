package server

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
)

// A replicated leader answers a sync SET at its ordered point and runs the
// connection's next commands before the SET is applied (docs/design/cad.md
// §12). Nobody sees the SET until it is applied, so a read of its key on the
// same connection must wait for it first; reads of other keys need not.
// Four connections pipeline, each in one write, [SET x; GET y; SET y; GET x;
// MGET x y; EXISTS x; KEFIR.SCAN] on keys of their own, so every reply is
// known exactly.
func TestPipelinedReadsSeeTheConnectionsSyncWrites(t *testing.T) {
	if bad := pipelinedSyncRounds(t, 25); len(bad) > 0 {
		t.Fatalf("replies that missed a sync write pipelined before them: %v", bad)
	}
}

// The mutation: reads run without that wait, and miss the SET before them.
func TestSyncBarrierSkippedMissesPipelinedWrites(t *testing.T) {
	mutation.Require(t)
	mut.syncBarrierSkipped.Store(true)
	defer mut.syncBarrierSkipped.Store(false)
	bad := pipelinedSyncRounds(t, 10)
	if len(bad) == 0 {
		t.Fatal("syncBarrierSkipped: every read still saw the write pipelined before it")
	}
	t.Logf("mutation caught: %s", bad[0])
}

// pipelinedSyncRounds runs rounds pipelines on each of four connections to
// the leader and returns the mismatching replies (at most 5).
func pipelinedSyncRounds(t *testing.T, rounds int) []string {
	g := startGroupWith(t, func(c *Config) { c.Durability = level.Sync })
	l := g.leader(t)
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for cid := range 4 {
		c := dial(t, g.nodes[l])
		wg.Add(1)
		go func() {
			defer wg.Done()
			x, y := fmt.Sprintf("c%d:x", cid), fmt.Sprintf("c%d:y", cid)
			prevY := "(nil)"
			for i := range rounds {
				v := fmt.Sprintf("%q", fmt.Sprintf("v%d", i))
				cmds := [][]string{
					{"SET", x, fmt.Sprintf("v%d", i)},
					{"GET", y},
					{"SET", y, fmt.Sprintf("v%d", i)},
					{"GET", x},
					{"MGET", x, y},
					{"EXISTS", x},
					{"KEFIR.SCAN", fmt.Sprintf("c%d:", cid), fmt.Sprintf("c%d;", cid)},
				}
				want := []string{"OK", prevY, "OK", v, "[" + v + ", " + v + "]", "(integer) 1",
					"[" + fmt.Sprintf("%q", x) + ", " + v + ", " + fmt.Sprintf("%q", y) + ", " + v + "]"}
				var buf []byte
				for _, cmd := range cmds {
					buf = appendCmd(buf, cmd...)
				}
				if _, err := c.nc.Write(buf); err != nil {
					t.Error(err)
					return
				}
				for j := range cmds {
					got := c.reply()
					if got != want[j] {
						mu.Lock()
						if len(bad) < 5 {
							bad = append(bad, fmt.Sprintf("round %d %s: got %s, want %s", i, strings.Join(cmds[j], " "), got, want[j]))
						}
						mu.Unlock()
					}
				}
				prevY = v
			}
		}()
	}
	wg.Wait()
	return bad
}
