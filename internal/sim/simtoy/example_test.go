package simtoy_test

import (
	"fmt"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/sim/simtoy"
)

// Running a replication core in the simulator: give factories for replicas
// and clients, a network, faults and a workload; run; judge the history.
// Replace simtoy's factories with your engine's.
func Example() {
	s := sim.New(sim.Options{
		Seed:         7,
		Replicas:     3,
		Clients:      2,
		NewReplica:   simtoy.NewReplica(simtoy.Safe),
		NewClient:    simtoy.NewClient(simtoy.Safe, 50),
		Net:          sim.Link{Delay: sim.Dist{Base: 200 * time.Microsecond, Jitter: time.Millisecond}, Drop: 0.01},
		Workload:     sim.KV{Keys: 2},
		OpsPerClient: 20,
		Duration:     time.Second,
	})
	h := s.Run()
	for _, v := range check.All(h, check.Options{}) {
		fmt.Println(v.Checker, v.OK)
	}
	// Output:
	// linearizable true
	// session true
	// cross-client-monotonic true
	// monotonic-state true
	// bounded-staleness true
	// durability true
}
