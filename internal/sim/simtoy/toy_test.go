package simtoy

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/sim"
)

func toyOptions(mode Mode, seed uint64, trace io.Writer) sim.Options {
	return sim.Options{
		Seed:       seed,
		Replicas:   3,
		Clients:    3,
		NewReplica: NewReplica(mode),
		NewClient:  NewClient(mode, 50),
		Net: sim.Link{
			Delay: sim.Dist{Base: 200 * time.Microsecond, Jitter: 800 * time.Microsecond, Exp: true},
			Drop:  0.01,
			Dup:   0.01,
		},
		MaxDrift:     100e-6,
		Torn:         true,
		Workload:     sim.KV{Keys: 2, Get: 4, Put: 4, CAS: 1, Incr: 1, Dur: level.Sync},
		OpsPerClient: 60,
		Think:        sim.Dist{Jitter: 2 * time.Millisecond},
		Faults: &sim.Faults{
			Every: sim.Dist{Base: 20 * time.Millisecond, Jitter: 40 * time.Millisecond},
			Until: 400 * time.Millisecond,
			// The toy's primary never fails over: while it is down or cut
			// off, operations time out (unknown outcome). Restarts and heals
			// are weighted up to keep the cluster mostly available.
			Crash: 1, Restart: 3, Partition: 1, OneWay: 1, Heal: 3,
		},
		Duration: 2 * time.Second,
		Trace:    trace,
	}
}

// judge runs every checker: the safe toy is linearizable with sync
// durability, which implies all the weaker promises too.
func judge(h check.History, vizDir string) error {
	return check.Errs(check.All(h, check.Options{Lin: check.LinOptions{VisualizationDir: vizDir}}))
}

// TestSafeToyIsLinearizable: the correct toy passes every checker under drops,
// duplicates, reordering, partitions, crashes with torn writes and clock drift.
func TestSafeToyIsLinearizable(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 20
	}
	var ops, unknown int
	sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) error {
		s := sim.New(toyOptions(Safe, seed, trace))
		h := s.Run()
		ops += len(h.Ops)
		for _, op := range h.Ops {
			if op.Outcome != check.OK {
				unknown++
			}
		}
		if st := s.Stats(); st.Crashes == 0 && st.Dropped == 0 {
			return fmt.Errorf("seed %d injected no faults: %+v", seed, st)
		}
		return judge(h, "")
	})
	t.Logf("%d seeds, %d ops, %d with unknown outcome", seeds, ops, unknown)
}

// TestUnsafeToyIsCaught is the toolkit's self-test: a register that reads from
// any replica, or acknowledges before replicating, or both, must be reported
// non-linearizable within a bounded number of seeds.
func TestUnsafeToyIsCaught(t *testing.T) {
	const budget = 20
	for _, tc := range []struct {
		name string
		mode Mode
	}{{"stale-reads", StaleReads}, {"early-ack", EarlyAck}, {"both", Unsafe}} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= budget; seed++ {
				o := toyOptions(tc.mode, seed, nil)
				// Slow disks and frequent crashes: an early ack only shows
				// when a crash beats the fsync.
				o.Sync = sim.Dist{Base: 2 * time.Millisecond, Jitter: 8 * time.Millisecond}
				o.Faults.Crash, o.Faults.Restart = 3, 3
				h := sim.New(o).Run()
				v := check.Linearizable(h, check.LinOptions{VisualizationDir: t.TempDir()})
				d := check.Durability(h)
				if v.OK && d.OK {
					continue
				}
				if !v.OK && v.Visualization == "" {
					t.Fatalf("seed %d: violation without visualization: %v", seed, v)
				}
				t.Logf("caught at seed %d (of budget %d):\n%v\n%v", seed, budget, v, d)
				return
			}
			t.Fatalf("%s toy passed %d seeds: the checker or the simulator cannot catch it", tc.name, budget)
		})
	}
}

// TestUnsafeToyLosesAcknowledgedWrites: acknowledging before persisting loses
// sync writes when the primary crashes, and the durability checker sees it.
func TestUnsafeToyLosesAcknowledgedWrites(t *testing.T) {
	o := toyOptions(Unsafe, 7, nil)
	o.Faults = nil
	o.Net = sim.Link{Delay: sim.Dist{Base: time.Millisecond}}
	o.Workload = nil
	o.Torn = false
	o.Sync = sim.Dist{Base: 50 * time.Millisecond} // slow disks: the crash beats every fsync
	s := sim.New(o)
	s.At(10*time.Millisecond, func() { s.Invoke(0, check.Op{Kind: check.Put, Key: "x", Value: "a", Dur: level.Sync}) })
	// The put is acknowledged after one round trip (2ms), long before any
	// disk has it. Crash everything, restart, and read at the primary.
	s.At(12*time.Millisecond+100*time.Microsecond, func() { s.CrashAll() })
	s.At(20*time.Millisecond, func() {
		for i := 0; i < 3; i++ {
			s.Restart(i)
		}
	})
	s.At(30*time.Millisecond, func() { s.Invoke(1, check.Op{Kind: check.Get, Key: "x"}) })
	h := s.Run()
	if h.Ops[0].Outcome != check.OK {
		t.Fatalf("put should have been acknowledged: %v", h.Ops[0])
	}
	v := check.Durability(h)
	if v.OK {
		t.Fatalf("durability checker missed a lost acknowledged sync write:\n%v\n%v", h.Ops, v)
	}
	t.Log(v)
}

// TestSafeToySwarm: each seed draws its own fault mix (sim.Swarm), including
// failing fsyncs.
func TestSafeToySwarm(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 20
	}
	sim.Explore(t, 1000, seeds, func(seed uint64, trace io.Writer) error {
		o := toyOptions(Safe, seed, trace)
		o.Net, o.MaxDrift, o.Torn, o.Faults = sim.Link{}, 0, false, nil
		o = sim.Swarm(seed, o)
		o.Faults.Until = 400 * time.Millisecond
		return judge(sim.New(o).Run(), "")
	})
}
