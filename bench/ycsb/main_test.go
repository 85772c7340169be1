package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/bench/limits"
	"github.com/kefirdb/kefir/bench/ycsb/drivers"
	"github.com/kefirdb/kefir/internal/ycsb"
)

func result(tput, p50 float64) *ycsb.Result {
	return &ycsb.Result{Workload: "a", Clients: 16, Throughput: tput, Mode: "closed",
		PerOp: []ycsb.OpStats{{Op: "READ", Throughput: tput, P50Us: p50}}}
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
	rows := []row{{System: "kefir", Durable: true, Run: 1, Result: &ycsb.Result{Workload: "w", Clients: 1, Mode: "closed",
		PerOp: []ycsb.OpStats{{Op: "UPDATE", P50Us: 620}, {Op: "READ", P50Us: 20}}}}}
	md := markdown("cmd", rows, limits.Result{LoopbackRTTP50us: 10, FsyncP50us: 300})
	// A durable update's floor is a round trip plus an fsync (310 µs); a read's is a round trip.
	if !strings.Contains(md, "| UPDATE | 0 | 620.0 | 2.0× |") || !strings.Contains(md, "| READ | 0 | 20.0 | 2.0× |") {
		t.Fatalf("floor multiples wrong:\n%s", md)
	}
}

func TestPlotsAreWrittenAndEmptyDataIsAnError(t *testing.T) {
	w, _ := ycsb.Standard("a")
	w.RecordCount, w.ValueSize = 1000, 10
	var rows []row
	for _, target := range []float64{0, 2000, 4000} {
		res, err := ycsb.Run(context.Background(), w, drivers.Null{}.NewDB, ycsb.Config{Clients: 2, Target: target, Duration: 100 * time.Millisecond})
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
	if len(files) != 3 || filepath.Base(files[0]) != "throughput-a.png" || filepath.Base(files[1]) != "cdf-a.png" {
		t.Fatalf("wrote %v, want a throughput bar chart, a CDF and a throughput-latency plot", files)
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

func TestThroughputBarsAreTheMedianAndRangeOfRounds(t *testing.T) {
	cell := func(sys string, run, clients int, tput float64, mode string) row {
		return row{System: sys, Run: run, Result: &ycsb.Result{Workload: "a", Clients: clients, Mode: mode, Throughput: tput}}
	}
	rows := []row{
		cell("x", 1, 64, 300, "closed"), cell("y", 1, 64, 10, "closed"),
		cell("x", 2, 64, 100, "closed"), cell("y", 2, 64, 30, "closed"),
		cell("x", 3, 64, 200, "closed"), cell("y", 3, 64, 20, "closed"),
		cell("x", 1, 1, 5000, "closed"), // a smaller client count: not this chart's cell
		cell("x", 1, 64, 9000, "open"),  // an open-loop target: its throughput is the target
	}
	got := throughputBars(rows)
	want := []throughputBar{{System: "x", Median: 200, Min: 100, Max: 300, Rounds: 3}, {System: "y", Median: 20, Min: 10, Max: 30, Rounds: 3}}
	if !slices.Equal(got, want) {
		t.Fatalf("bars %+v, want %+v", got, want)
	}
}

func TestCDFGroupsHoldAtMostSixLines(t *testing.T) {
	var rows []row
	add := func(sys string) {
		for run := 1; run <= 3; run++ {
			rows = append(rows, row{System: sys, Run: run, Result: &ycsb.Result{Workload: "a", Clients: 64}})
		}
	}
	for _, s := range []string{"respserver(via-kefir-client)", "redis(no-persistence)", "kefir-1-node(sync)", "etcd-3-members"} {
		add(s)
	}
	for i := range 8 { // more replicated rows than one panel holds
		add(fmt.Sprintf("kefir-3-replicas(m%d)", i))
	}
	// A system without the workload (ZooKeeper has no scans) gets no line and no legend entry.
	rows = append(rows, row{System: "zookeeper-3-servers", Run: 1, Unsupported: "scans", Result: &ycsb.Result{Workload: "a"}})
	names, groups := cdfGroups("a", rows)
	wantNames := []string{"cdf-a-ceiling", "cdf-a-single-node", "cdf-a-replicated-1", "cdf-a-replicated-2"}
	if !slices.Equal(names, wantNames) {
		t.Fatalf("files %v, want %v", names, wantNames)
	}
	total := 0
	for i, g := range groups {
		if len(g) > maxLinesPerPanel {
			t.Fatalf("%s has %d lines, want at most %d", names[i], len(g), maxLinesPerPanel)
		}
		for _, r := range g {
			if r.Run != 1 {
				t.Fatalf("%s plots round %d of %s, want only the first", names[i], r.Run, r.System)
			}
		}
		total += len(g)
	}
	if total != 12 {
		t.Fatalf("%d lines in all, want one per system (12)", total)
	}
}

func TestFloorIncludesTheEmulatedDelay(t *testing.T) {
	rows := []row{{System: "x", Delay: 500 * time.Microsecond, Run: 1, Result: &ycsb.Result{Workload: "c", Clients: 1, Mode: "closed",
		PerOp: []ycsb.OpStats{{Op: "READ", P50Us: 2020}}}}}
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
