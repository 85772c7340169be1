package main

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/bench/limits"
	"github.com/kefirdb/kefir/bench/ycsb/core"
)

func result(tput, p50 float64) *core.Result {
	return &core.Result{Workload: "a", Clients: 16, Throughput: tput, Mode: "closed",
		PerOp: []core.OpStats{{Op: "READ", Throughput: tput, P50Us: p50}}}
}

func TestAgreementFlagsRunsMoreThan15PercentApart(t *testing.T) {
	rows := []row{
		{System: "x", Run: 1, Result: result(1000, 100)},
		{System: "x", Run: 2, Result: result(1100, 110)},
	}
	md := markdown("cmd", rows, limits.Result{LoopbackRTTP50us: 10, FsyncP50us: 300})
	if !strings.Contains(md, "| x | A | 16 | 0 | 10% | 10% | yes |") {
		t.Fatalf("runs 10%% apart not reported as agreeing:\n%s", md)
	}
	rows[1].Result = result(1200, 100)
	md = markdown("cmd", rows, limits.Result{})
	if !strings.Contains(md, "| x | A | 16 | 0 | 20% | 0% | **no** |") {
		t.Fatalf("runs 20%% apart not flagged:\n%s", md)
	}
}

func TestRowsShowLatencyAsAMultipleOfTheFloor(t *testing.T) {
	rows := []row{{System: "kefir", Durable: true, Run: 1, Result: &core.Result{Workload: "w", Clients: 1, Mode: "closed",
		PerOp: []core.OpStats{{Op: "UPDATE", P50Us: 620}, {Op: "READ", P50Us: 20}}}}}
	md := markdown("cmd", rows, limits.Result{LoopbackRTTP50us: 10, FsyncP50us: 300})
	// A durable update's floor is a round trip plus an fsync (310 µs); a read's is a round trip.
	if !strings.Contains(md, "| UPDATE | 0 | 620.0 | 2.0× |") || !strings.Contains(md, "| READ | 0 | 20.0 | 2.0× |") {
		t.Fatalf("floor multiples wrong:\n%s", md)
	}
}
