package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// startBenchNode runs a real single node (real files, real TCP) in the test process
// and returns its client address.
func startBenchNode(t *testing.T) string {
	t.Helper()
	s, err := server.New(server.Config{DataDir: t.TempDir(), ClientAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.ClientAddr().String()
}

func TestBenchRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "z"}, "--workload"},
		{[]string{"--clients", "0"}, "--clients 0"},
		{[]string{"--duration", "0s"}, "--duration"},
		{[]string{"--duration", "ten"}, "invalid value"},
		{[]string{"--warmup", "-1s"}, "--warmup"},
		{[]string{"--records", "0"}, "--records"},
		{[]string{"--value-size", "0"}, "--value-size"},
		{[]string{"--rate", "-5"}, "--rate"},
		{[]string{"--rate", "NaN"}, "--rate"},
		{[]string{"--addr", "localhost"}, "--addr"},
		{[]string{"--addr", "127.0.0.1:6380,"}, "--addr"},
		{[]string{"--consistency", "strongest"}, "--consistency"},
		{[]string{"--durability", "maybe"}, "--durability"},
		{[]string{"--pool", "0"}, "--pool"},
		{[]string{"--interval", "0s"}, "--interval"},
		{[]string{"--tls-insecure"}, "--tls"},
		{[]string{"--cluster", "maybe"}, "--cluster"},
		{[]string{"a"}, "unexpected argument"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"bench"}, tc.args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("kefir bench %v: exit %d, stderr %q; want exit 2 and a message naming %q", tc.args, code, stderr.String(), tc.want)
		}
		if stdout.Len() > 0 {
			t.Errorf("kefir bench %v printed a result: %q", tc.args, stdout.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bench", "--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "--rate") && !strings.Contains(stderr.String(), "-rate") {
		t.Errorf("kefir bench --help: exit %d, %q", code, stderr.String())
	}
	f, err := parseBenchFlags([]string{"--addr", "h1:1, h2:2", "--workload", "E", "--records", "77", "--value-size", "10",
		"--durability", "cad", "--consistency", "session", "--cluster", "off"}, func(string) string { return "" }, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.addrs) != 2 || f.addrs[1] != "h2:2" || f.workload.Name != "e" || f.workload.RecordCount != 77 || f.workload.ValueSize != 10 || f.workload.ScanProportion != 0.95 || f.cluster != "off" {
		t.Errorf("parsed %+v", f)
	}
}

// progressLine is one of the per-second lines on stderr.
var progressLine = regexp.MustCompile(`(?m)^\s+\d+\.\ds\s+\d+ ops/s\s+p50 [\d.]+ (µs|ms)\s+p99 [\d.]+ (µs|ms)\s+errors 0$`)

// A real run against a real node: the load inserts every record, the run reads them
// all back (no "not found"), progress lines appear while it runs, and the JSON has
// the shape scripts rely on.
func TestBenchRunsAWorkloadAgainstANodeAndPrintsJSON(t *testing.T) {
	addr := startBenchNode(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--addr", addr, "--load", "--records", "500", "--value-size", "100",
		"--workload", "a", "--clients", "4", "--duration", "1500ms", "--json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rep struct {
		Addrs       []string `json:"addrs"`
		Durability  string   `json:"durability"`
		Consistency string   `json:"consistency"`
		Workload    struct {
			Name        string `json:"name"`
			RecordCount int    `json:"recordcount"`
		} `json:"workload"`
		Load *struct {
			Ops    int64 `json:"ops"`
			Errors int64 `json:"errors"`
		} `json:"load"`
		Run struct {
			Mode       string  `json:"mode"`
			Clients    int     `json:"clients"`
			Seconds    float64 `json:"seconds"`
			Ops        int64   `json:"ops"`
			Errors     int64   `json:"errors"`
			Throughput float64 `json:"ops_per_sec"`
			PerOp      []struct {
				Op       string  `json:"op"`
				Count    int64   `json:"count"`
				NotFound int64   `json:"not_found"`
				P50      float64 `json:"p50_us"`
				P99      float64 `json:"p99_us"`
				Max      float64 `json:"max_us"`
			} `json:"per_op"`
		} `json:"run"`
		Timeline []struct {
			End       float64 `json:"end_unix"`
			Seconds   float64 `json:"seconds"`
			Ops       int64   `json:"ops"`
			OpsPerSec float64 `json:"ops_per_sec"`
		} `json:"timeline"`
	}
	ended := float64(time.Now().UnixMicro()) / 1e6
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if rep.Load == nil || rep.Load.Ops != 500 || rep.Load.Errors != 0 {
		t.Errorf("load: %+v, want 500 inserts and no errors", rep.Load)
	}
	r := rep.Run
	if len(rep.Addrs) != 1 || rep.Addrs[0] != addr || rep.Workload.Name != "a" || rep.Workload.RecordCount != 500 || rep.Durability != "server default" {
		t.Errorf("header: %+v", rep)
	}
	if r.Mode != "closed" || r.Clients != 4 || r.Errors != 0 || r.Ops < 100 || r.Seconds < 1.4 || r.Seconds > 3 {
		t.Errorf("run: %+v", r)
	}
	if d := r.Throughput - float64(r.Ops)/r.Seconds; d*d > 1 {
		t.Errorf("throughput %v ≠ %d ops / %v s", r.Throughput, r.Ops, r.Seconds)
	}
	ops := map[string]bool{}
	for _, op := range r.PerOp {
		ops[op.Op] = true
		if op.Count == 0 || op.NotFound != 0 || op.P50 <= 0 || op.P99 < op.P50 || op.Max < op.P99 {
			t.Errorf("%s: %+v", op.Op, op)
		}
	}
	if !ops["READ"] || !ops["UPDATE"] || len(ops) != 2 {
		t.Errorf("operation types %v, want READ and UPDATE", ops)
	}
	if n := len(progressLine.FindAllString(stderr.String(), -1)); n != 1 {
		t.Errorf("%d progress lines in a 1.5 s run, want 1 (one a second):\n%s", n, stderr.String())
	}
	// The timeline is the progress lines' buckets, dated: one second's, closed
	// within the run, its operations a part of the run's.
	if len(rep.Timeline) != 1 {
		t.Errorf("timeline %+v: want one bucket (one a second)", rep.Timeline)
	} else if b := rep.Timeline[0]; b.Seconds < 0.9 || b.Seconds > 1.5 || b.Ops < 1 || b.Ops > r.Ops ||
		b.End > ended || b.End < ended-5 || math.Abs(b.OpsPerSec-float64(b.Ops)/b.Seconds) > 1 {
		t.Errorf("timeline bucket %+v (run %d ops, ended by %.3f)", b, r.Ops, ended)
	}

	// The same without --json: a table with a row per operation type.
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"bench", "--addr", addr, "--records", "500", "--workload", "b", "--clients", "2", "--duration", "300ms"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"workload b: 2 clients", "ops/s", "p50", "p99.9", "READ", "UPDATE"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// --rate makes the run open loop at that total rate: a node that could do thousands
// of reads a second gets the rate asked for, no more.
func TestBenchHonoursTheRate(t *testing.T) {
	addr := startBenchNode(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--addr", addr, "--load", "--records", "200", "--value-size", "100",
		"--workload", "c", "--clients", "2", "--duration", "1s", "--rate", "150", "--json", "--progress=false", "--interval", "250ms"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rep struct {
		Run struct {
			Mode    string  `json:"mode"`
			Target  float64 `json:"target_ops_per_sec"`
			Ops     int64   `json:"ops"`
			Backlog int64   `json:"backlog"`
		} `json:"run"`
		Timeline []struct {
			Ops int64 `json:"ops"`
		} `json:"timeline"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if rep.Run.Mode != "open" || rep.Run.Target != 150 {
		t.Errorf("mode %q target %v, want open at 150", rep.Run.Mode, rep.Run.Target)
	}
	// 150 ops/s for 1 s: 150 operations were due; a client may leave its last one
	// unsent. Never more than due; those due but not sent (a loaded machine's node
	// fell behind) are reported as the backlog, so sent plus backlog is what was due.
	if due := rep.Run.Ops + rep.Run.Backlog; rep.Run.Ops > 151 || due < 145 || due > 151 {
		t.Errorf("%d operations in 1 s at --rate 150 (backlog %d)", rep.Run.Ops, rep.Run.Backlog)
	}
	if progressLine.MatchString(stderr.String()) {
		t.Errorf("--progress=false printed progress: %s", stderr.String())
	}
	// --interval 250ms: the timeline still comes with --json, in quarter
	// seconds (the fourth may fall just after the window closed), each about a
	// quarter of the rate.
	if n := len(rep.Timeline); n < 3 || n > 4 {
		t.Errorf("timeline %+v: want 3–4 buckets of 250 ms", rep.Timeline)
	}
	for _, b := range rep.Timeline {
		if b.Ops < 20 || b.Ops > 60 {
			t.Errorf("timeline %+v: a 250 ms bucket at 150 ops/s should hold about 37", rep.Timeline)
			break
		}
	}
}

// Against a 3-replica group (real replicas in this process, real TCP and files), given
// every member's address, as a user would: cad writes and linearizable reads with no
// errors, and no read finds a record missing.
func TestBenchAgainstAReplicaGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	addrs := testgroup.LoopbackAddrs(t, 6)
	var ms []server.Member
	for i := range 3 {
		ms = append(ms, server.Member{ID: uint64(i + 1), PeerAddr: addrs[2*i], ClientAddr: addrs[2*i+1]})
	}
	var nodes []*server.Server
	for _, m := range ms {
		s, err := server.New(server.Config{NodeID: fmt.Sprint("n", m.ID), ClientAddr: m.ClientAddr, PeerAddr: m.PeerAddr,
			DataDir: t.TempDir(), ClusterSecret: "s", Members: ms, OpenReplica: vrshard.OpenHosted, ReplicaID: m.ID, ClusterID: 7, Bootstrap: true,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		nodes = append(nodes, s)
	}
	if _, ok := testgroup.Leader(3, 10*time.Second, 10*time.Millisecond, func(i int) (bool, uint64) {
		return nodes[i].Status().Role == "leader", 0
	}); !ok {
		t.Fatal("no leader")
	}
	all := ms[0].ClientAddr + "," + ms[1].ClientAddr + "," + ms[2].ClientAddr
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--addr", all, "--load", "--records", "300", "--value-size", "100", "--workload", "a",
		"--clients", "8", "--duration", "1s", "--durability", "cad", "--consistency", "linearizable", "--json", "--progress=false"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rep struct {
		Durability, Consistency string
		Run                     struct {
			Ops, Errors int64
			PerOp       []struct {
				Op       string
				NotFound int64 `json:"not_found"`
			} `json:"per_op"`
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if rep.Durability != "cad" || rep.Consistency != "linearizable" || rep.Run.Ops < 50 || rep.Run.Errors != 0 || len(rep.Run.PerOp) != 2 {
		t.Fatalf("report %+v", rep)
	}
	for _, op := range rep.Run.PerOp {
		if op.NotFound != 0 {
			t.Errorf("%s: %d records not found after the load", op.Op, op.NotFound)
		}
	}
}

// A cluster that cannot be reached is an error of the run (exit 1) that names the
// address, not a bad invocation (exit 2), and prints no result.
func TestBenchReportsAnUnreachableCluster(t *testing.T) {
	addr := testgroup.LoopbackAddrs(t, 1)[0] // free: nothing listens there
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--addr", addr, "--duration", "1s", "--json"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), addr) || stdout.Len() > 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 naming %s", code, stdout.String(), stderr.String(), addr)
	}
}
