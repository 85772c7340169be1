package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMatrixFileMustDescribeTheSameCellsForEverySystem(t *testing.T) {
	common := " -workloads a -clients 2 -records 100 -warmup 10ms -d 50ms"
	for name, text := range map[string]string{
		"no label":        "-db null" + common,
		"duplicate label": "-db null -label x" + common + "\n-db null -label x" + common,
		"other clients":   "-db null -label x" + common + "\n-db null -label y" + common + " -clients 3",
		"other duration":  "-db null -label x" + common + "\n-db null -label y" + common + " -d 1s",
		"empty":           "# nothing\n\n",
	} {
		if _, err := readMatrix(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	fl, err := readMatrix(strings.NewReader("# two systems\n-db null -label x" + common + "\n\n-db respserver -label y" + common + "\n"))
	if err != nil || len(fl) != 2 || fl[1].label != "y" {
		t.Fatalf("valid file: %v, %d systems", err, len(fl))
	}
}

func TestMatrixMeasuresEveryRoundOfEveryCellAndReportsWhatFailed(t *testing.T) {
	common := " -workloads a,e -clients 2 -records 200 -warmup 10ms -d 60ms -limits-samples 0"
	path := filepath.Join(t.TempDir(), "m.txt")
	text := "-db null -label harness" + common + "\n" +
		"-db respserver -via kefir -pool 1 -label ceiling" + common + "\n" +
		"-db kefir -addr 127.0.0.1:1 -label unreachable" + common + "\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// A prewarm pass runs every cell once more, unmeasured: it must add no rows.
	rows, failures, err := runMatrix(context.Background(), path, matrixOpts{rounds: 2, prewarm: 20 * time.Millisecond, seed: 1}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(failures) != 1 || !strings.Contains(failures[0], "unreachable") {
		t.Fatalf("failures %q, want the unreachable system's", failures)
	}
	got := map[string]int{}
	for _, r := range rows {
		got[r.System+"/"+r.Result.Workload]++
		if r.Result.Errors != 0 {
			t.Errorf("%s %s: %d errors %v", r.System, r.Result.Workload, r.Result.Errors, r.Result.FirstErrors)
		}
	}
	// 2 systems × 2 workloads × 1 client count × 2 rounds.
	for _, k := range []string{"harness/a", "harness/e", "ceiling/a", "ceiling/e"} {
		if got[k] != 2 {
			t.Errorf("%s measured %d times, want 2 (one per round); all: %v", k, got[k], got)
		}
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8", len(rows))
	}
}

// The CPU watch re-measures a disturbed cell at most -remeasure times per cell and
// -remeasure-budget times per matrix, and records each kept cell's other CPU and attempts.
// A negative threshold makes every cell "disturbed", so the caps are what stops it.
func TestMatrixRemeasuresDisturbedCellsWithinTheCaps(t *testing.T) {
	if _, ok := machineBusy(); !ok {
		t.Skip("no /proc/stat")
	}
	common := " -workloads a -clients 2 -records 100 -warmup 5ms -d 30ms -limits-samples 0"
	path := filepath.Join(t.TempDir(), "m.txt")
	if err := os.WriteFile(path, []byte("-db null -label x"+common+"\n-db null -label y"+common+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rows, _, err := runMatrix(context.Background(), path, matrixOpts{rounds: 2, seed: 1, watchPids: []int{os.Getpid()},
		disturbed: -1, remeasure: 2, remeasureBudget: 5}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	extra := 0
	for _, r := range rows {
		if r.Attempts < 1 || r.Attempts > 3 {
			t.Errorf("%s round %d: %d attempts, want 1..3 (remeasure 2)", r.System, r.Run, r.Attempts)
		}
		if r.OtherCPUCores < 0 {
			t.Errorf("%s: other CPU %v", r.System, r.OtherCPUCores)
		}
		extra += r.Attempts - 1
	}
	if extra != 5 {
		t.Errorf("%d extra measurements, want the budget of 5 (2+2+1+0)", extra)
	}
}

func TestOtherCoresSubtractsThisProcessAndTheSystems(t *testing.T) {
	t0 := time.Now()
	a := cpuSample{at: t0, busy: 1000, self: 100, systems: 200, ok: true}
	b := cpuSample{at: t0.Add(2 * time.Second), busy: 1000 + 300, self: 100 + 150, systems: 200 + 100, ok: true}
	// 300 ticks busy in 2 s, 250 of them the matrix's: 50 ticks = 0.5 s = 0.25 cores.
	if got, ok := otherCores(a, b); !ok || got < 0.2499 || got > 0.2501 {
		t.Fatalf("other = %v (%v), want 0.25", got, ok)
	}
	if _, ok := procTicks("self"); !ok {
		t.Skip("no /proc")
	}
	if _, ok := otherCores(a, cpuSample{}); ok {
		t.Fatal("a failed sample gave a figure")
	}
}
