package simtoy

import (
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/sim"
)

// BenchmarkCheckers measures all checkers on a simulated history of the safe
// toy: 10 clients x 500 operations over 10 keys, with faults.
//
//	go test -run '^$' -bench Checkers -benchmem ./internal/sim/simtoy/
func BenchmarkCheckers(b *testing.B) {
	o := toyOptions(Safe, 1, nil)
	o.Clients, o.OpsPerClient = 10, 500
	o.Workload = sim.KV{Keys: 10, Get: 4, Put: 4, CAS: 1, Dur: level.Sync}
	o.Duration = 30 * time.Second
	h := sim.New(o).Run()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := check.Errs(check.All(h, check.Options{})); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(h.Ops))*float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
