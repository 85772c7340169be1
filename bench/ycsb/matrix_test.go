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
	rows, failures, err := runMatrix(context.Background(), path, 2, 20*time.Millisecond, 1, io.Discard)
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
