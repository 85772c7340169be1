package server

import (
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// runRegisterWorkload drives concurrent clients over RESP against s (each on its
// own connection) on a few hot keys, named prefix+"r0".."r2", and records what
// they observe. If stale is set, GETs are not sent: they are answered "not
// found" by the test itself, which is what a node serving an old snapshot
// would do.
//
// The checker's register model starts every key absent, so the keys must be
// absent when the run starts: two runs against one store need different
// prefixes (the client seeds are fixed, so a second run on the same keys
// writes the same values, and a read of the first run's leftover value looks
// like a read from the future). This is checked, not assumed.
func runRegisterWorkload(t *testing.T, s *Server, prefix string, clients, opsPerClient int, stale bool) check.History {
	t.Helper()
	pre := dial(t, s)
	for k := range 3 {
		key := prefix + "r" + strconv.Itoa(k)
		pre.send("EXISTS", key)
		if got := pre.reply(); got != "(integer) 0" {
			t.Fatalf("register workload: key %q exists before the run (EXISTS => %s); the model starts it absent, use a fresh prefix", key, got)
		}
	}
	rec := check.NewRecorder(nil)
	var wg sync.WaitGroup
	for cl := range clients {
		c := dial(t, s)
		rng := rand.New(rand.NewSource(int64(cl)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range opsPerClient {
				key := prefix + "r" + strconv.Itoa(rng.Intn(3))
				op := check.Op{Client: cl, Key: key, Cons: level.ConsLinearizable, Dur: level.Sync}
				var args []string
				switch p := rng.Intn(10); {
				case p < 4:
					op.Kind = check.Get
					args = []string{"GET", key}
				case p < 7:
					op.Kind, op.Value = check.Put, fmt.Sprintf("c%d-%d", cl, i)
					args = []string{"SET", key, op.Value}
				case p < 9:
					op.Kind, op.Value = check.CAS, fmt.Sprintf("c%d-%d", cl, i)
					op.Expect = fmt.Sprintf("c%d-%d", rng.Intn(clients), rng.Intn(max(i, 1)))
					args = []string{"KEFIR.CAS", key, op.Expect, op.Value}
				default:
					op.Kind = check.Delete
					args = []string{"DEL", key}
				}
				id := rec.Invoke(op)
				if stale && op.Kind == check.Get {
					rec.Complete(id, check.Result{Found: false, Node: -1})
					continue
				}
				var bs [][]byte
				for _, a := range args {
					bs = append(bs, []byte(a))
				}
				if _, err := c.nc.Write(resp.AppendCommand(nil, bs...)); err != nil {
					rec.Unknown(id)
					return
				}
				v, err := c.rd.ReadValue()
				if err != nil || v.Kind == resp.Error {
					rec.Unknown(id)
					return
				}
				res := check.Result{Node: -1}
				switch op.Kind {
				case check.Get:
					res.Found = v.Kind == resp.Bulk
					res.Value = string(v.Str)
				case check.CAS:
					res.Found = v.Int == 1
				}
				rec.Complete(id, res)
			}
		}()
	}
	wg.Wait()
	return rec.History()
}

// Concurrent SET, GET, KEFIR.CAS and DEL over RESP form a linearizable history.
func TestRESPHistoryIsLinearizable(t *testing.T) {
	s := startServer(t, nil)
	h := runRegisterWorkload(t, s, "", 6, 150, false)
	if v := check.Linearizable(h, check.LinOptions{NoVisualization: true, Strict: true}); !v.OK {
		t.Fatalf("not linearizable:\n%s", v)
	}
}

// The check above can fail: reads that ignore completed writes are caught.
func TestStaleReadsAreNotLinearizable(t *testing.T) {
	s := startServer(t, nil)
	h := runRegisterWorkload(t, s, "", 3, 60, true)
	if v := check.Linearizable(h, check.LinOptions{NoVisualization: true}); v.OK {
		t.Fatal("a history of reads that never see completed writes passed the linearizability check")
	}
}
