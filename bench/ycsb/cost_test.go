package main

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// fp prints an optional figure.
func fp(v *float64) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprint(*v)
}

// sink keeps the CPU burner's loop from being optimised away.
var sink int

// The cost meter against real counters: this test process plays the server (its pid is
// the -server-pids list), burns CPU and writes and fsyncs a file inside the window, and a
// metrics endpoint counts fsyncs; every figure must show what happened in the window.
func TestCostMeterMeasuresTheWindow(t *testing.T) {
	var fsyncs atomic.Int64
	fsyncs.Store(40)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# HELP kefir_fsync_duration_seconds x\n# TYPE kefir_fsync_duration_seconds histogram\n")
		fmt.Fprintf(w, "kefir_fsync_duration_seconds_bucket{log=\"storage\",le=\"+Inf\"} %d\n", fsyncs.Load())
		fmt.Fprintf(w, "kefir_fsync_duration_seconds_count{log=\"storage\"} %d\nkefir_fsync_duration_seconds_count{log=\"replication\"} 7\n", fsyncs.Load())
	}))
	defer srv.Close()
	m := newCostMeter([]int{os.Getpid()}, []string{srv.URL}, false)

	m.window(true)
	// Burn 0.3 s of CPU (not of wall time: the machine may be busy), at most 10 s.
	t0, _ := procTicks("self")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if t, _ := procTicks("self"); t >= t0+30 {
			break
		}
		for i := 0; i < 1_000_000; i++ {
			sink += i
		}
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "w"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fsyncs.Add(500)
	m.window(false)

	res := &ycsb.Result{Ops: 1000, PerOp: []ycsb.OpStats{{Op: "READ", Count: 500}, {Op: "UPDATE", Count: 500}}}
	c := m.cost(res)
	if c == nil {
		t.Fatal("no cost from a complete window")
	}
	// ≥ 0.3 s of CPU over 1000 operations: ≥ 300 µs each.
	if c.ServerCPUUsPerOp < 300 || c.ServerCPUUsPerOp > 5000 || c.ServerCores <= 0 {
		t.Errorf("server CPU %.0f µs/op, %.2f cores; want ≈ 300 µs/op", c.ServerCPUUsPerOp, c.ServerCores)
	}
	if c.FsyncsPerWrite == nil || *c.FsyncsPerWrite != 1 {
		t.Errorf("fsyncs per write %s, want 500 ÷ 500 writes = 1", fp(c.FsyncsPerWrite))
	}
	// 1 MiB written over 500 writes (page cache and fsync: write_bytes counts it).
	if c.BytesWrittenPerWrite == nil || *c.BytesWrittenPerWrite < 2000 {
		t.Errorf("bytes written per write %s, want ≥ 2000 (1 MiB over 500 writes)", fp(c.BytesWrittenPerWrite))
	}
	// The process wrote the file with write(2) and read the metrics over a socket: both in rchar+wchar.
	if c.ClientNetBytesPerOp == nil || *c.ClientNetBytesPerOp < 1000 {
		t.Errorf("client bytes per op %s, want ≥ 1000", fp(c.ClientNetBytesPerOp))
	}

	// An in-process system has no separate client side; a window that never ended has no cost.
	in := newCostMeter(nil, nil, true)
	in.window(true)
	in.window(false)
	if c := in.cost(res); c == nil || c.ClientNetBytesPerOp != nil || c.ServerCPUUsPerOp != 0 || c.FsyncsPerWrite != nil {
		t.Errorf("in-process meter: %+v", c)
	}
	half := newCostMeter([]int{os.Getpid()}, nil, false)
	half.window(true)
	if c := half.cost(res); c != nil {
		t.Errorf("a window that never ended has a cost: %+v", c)
	}
}

func TestSumMetricAddsEverySeriesOfOneMetric(t *testing.T) {
	text := "# HELP kefir_fsync_duration_seconds_count x\nkefir_fsync_duration_seconds_count{log=\"a\"} 3\n" +
		"kefir_fsync_duration_seconds_count{log=\"b\"} 4e+00\nkefir_fsync_duration_seconds_countless 100\nkefir_fsync_duration_seconds_sum 9\n"
	got, err := sumMetric(bufio.NewScanner(strings.NewReader(text)), fsyncMetric)
	if err != nil || got != 7 {
		t.Fatalf("sum %v, %v; want 7", got, err)
	}
	if _, err := sumMetric(bufio.NewScanner(strings.NewReader("other 1\n")), fsyncMetric); err == nil {
		t.Fatal("a missing metric summed to a figure")
	}
}
