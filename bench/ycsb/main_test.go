package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/bench/limits"
	"github.com/kefirdb/kefir/bench/ycsb/core"
	"github.com/kefirdb/kefir/bench/ycsb/drivers"
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

func TestPlotsAreWrittenAndEmptyDataIsAnError(t *testing.T) {
	w, _ := core.Standard("a")
	w.RecordCount, w.ValueSize = 1000, 10
	var rows []row
	for _, target := range []float64{0, 2000, 4000} {
		res, err := core.Run(context.Background(), w, drivers.Null{}.NewDB, core.Config{Clients: 2, Target: target, Duration: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row{System: "null", Run: 1, Result: res})
	}
	dir := t.TempDir()
	files, err := plotAll(dir, rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("wrote %v, want a CDF and a throughput-latency plot", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: not a PNG (%d bytes, %v)", f, len(b), err)
		}
	}
	for i := range rows {
		for j := range rows[i].Result.PerOp {
			rows[i].Result.PerOp[j].CDF = nil
		}
	}
	if _, err := plotAll(t.TempDir(), rows); err == nil {
		t.Fatal("plotting results without latency data succeeded")
	}
}

func TestFloorIncludesTheEmulatedDelay(t *testing.T) {
	rows := []row{{System: "x", Delay: 500 * time.Microsecond, Run: 1, Result: &core.Result{Workload: "c", Clients: 1, Mode: "closed",
		PerOp: []core.OpStats{{Op: "READ", P50Us: 2020}}}}}
	// Floor: 10 µs round trip + 2 × 500 µs = 1010 µs.
	if md := markdown("cmd", rows, limits.Result{LoopbackRTTP50us: 10}); !strings.Contains(md, "| READ | 0 | 2020.0 | 2.0× |") {
		t.Fatalf("floor with delay wrong:\n%s", md)
	}
}

func TestDelayProxyAddsTheDelayToEveryRoundTrip(t *testing.T) {
	srv, err := drivers.StartRESPServer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dl := &delayer{oneWay: 5 * time.Millisecond}
	defer dl.close()
	r, err := drivers.NewRedis(context.Background(), drivers.RedisConfig{Addr: dl.wrap(srv.Addr()), PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	db, _ := r.NewDB(0)
	start := time.Now()
	for range 5 {
		if err := db.Update(context.Background(), "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if per := time.Since(start) / 5; per < 10*time.Millisecond {
		t.Fatalf("a round trip through a 5 ms each-way proxy took %v, want ≥ 10 ms", per)
	}
}
