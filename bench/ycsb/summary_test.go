package main

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/ycsb"
)

func roundRow(sys string, round int, tput, p50 float64) row {
	return row{System: sys, Run: round, Result: &ycsb.Result{Workload: "a", Clients: 16, Throughput: tput,
		PerOp: []ycsb.OpStats{{Op: "READ", Throughput: tput, P50Us: p50, P99Us: 2 * p50}}}}
}

func TestSummarizeTakesTheMedianOfRounds(t *testing.T) {
	rows := []row{roundRow("x", 1, 100, 10), roundRow("x", 2, 1000, 99), roundRow("x", 3, 120, 12)}
	s := summarize(rows)
	if len(s) != 2 || s[0].Op != "READ" || s[1].Op != "total" {
		t.Fatalf("rows %+v, want READ then total", s)
	}
	// One wild round moves neither median.
	if s[0].Throughput != 120 || s[0].P50Us != 12 || s[1].Throughput != 120 || s[0].Rounds != 3 {
		t.Fatalf("medians %+v", s[0])
	}
	if s[1].Spread != 9 {
		t.Fatalf("spread %v, want 1000/100-1 = 9", s[1].Spread)
	}
}

func TestAgreeFailsARowBeyond15Percent(t *testing.T) {
	a := summarize([]row{roundRow("x", 1, 100, 10), roundRow("y", 1, 100, 10)})
	b := summarize([]row{roundRow("x", 1, 114, 11), roundRow("y", 1, 100, 12)})
	rows, missing := agree(a, b)
	if len(missing) != 0 || len(rows) != 4 {
		t.Fatalf("rows %+v missing %v", rows, missing)
	}
	verdict := map[string]bool{}
	for _, r := range rows {
		verdict[r.System+"/"+r.Op] = r.Within
	}
	// x: 14% and 10% apart: agrees. y: same throughput, but p50 20% apart: does not.
	want := map[string]bool{"x/READ": true, "x/total": true, "y/READ": false, "y/total": true}
	for k, v := range want {
		if verdict[k] != v {
			t.Errorf("%s within=%v, want %v", k, verdict[k], v)
		}
	}
	md := agreeMarkdown([2]string{"a", "b"}, summary{Rows: a}, summary{Rows: b})
	// Totals and operation rows are counted apart: both totals agree, one READ row does not.
	if !strings.Contains(md, "Total throughput: 2 of 2 cells agree") || !strings.Contains(md, "(throughput and p50): 1 of 2 rows") {
		t.Fatalf("verdict line missing:\n%s", md)
	}
}

func TestAgreeReportsCellsMissingFromOneRun(t *testing.T) {
	a := summarize([]row{roundRow("x", 1, 100, 10), roundRow("gone", 1, 100, 10)})
	b := summarize([]row{roundRow("x", 1, 100, 10)})
	if _, missing := agree(a, b); len(missing) != 2 {
		t.Fatalf("missing %v, want both of gone's cells", missing)
	}
	if d := relDiff(0, 5); d <= agreeLimit {
		t.Fatalf("a zero against a figure counted as agreeing (%v)", d)
	}
}

func TestSpliceKeepsHandWrittenText(t *testing.T) {
	doc := "# T\nmine\n<!-- BEGIN s -->\nold\n<!-- END s -->\ntheirs\n"
	out, err := splice([]byte(doc), "s", []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "# T\nmine\n<!-- BEGIN s -->\nnew\n<!-- END s -->\ntheirs\n"; string(out) != want {
		t.Fatalf("got %q want %q", out, want)
	}
	if _, err := splice([]byte("no markers"), "s", nil); err == nil {
		t.Fatal("spliced into a file without markers")
	}
	if _, err := splice([]byte("<!-- END s -->\n<!-- BEGIN s -->\n"), "s", nil); err == nil {
		t.Fatal("spliced between reversed markers")
	}
}

func TestCeilingFlagsACellBelowThreeTimesTheBestSystem(t *testing.T) {
	rows := summarize([]row{roundRow("respserver(via kefir)", 1, 300, 1), roundRow("fast", 1, 150, 1), roundRow("kefir-slow", 1, 150, 1), roundRow("slow", 1, 50, 1)})
	md := ceilingMarkdown(rows)
	if !strings.Contains(md, "| A | 16 | 300 (respserver(via kefir)) | fast | 150 | 2.00× | **no** | – | 2.00× (no) |") {
		t.Fatalf("want a failing 2.0× row against the fastest system:\n%s", md)
	}
	rows = summarize([]row{roundRow("respserver(via kefir)", 1, 300, 1), roundRow("slow", 1, 50, 1)})
	if md := ceilingMarkdown(rows); !strings.Contains(md, "6.0× | yes | – | – |") {
		t.Fatalf("want a passing 6.0× row:\n%s", md)
	}
}

func TestTotalsTableHasOneLinePerSystemAndMarksUnsupportedCells(t *testing.T) {
	rows := []row{roundRow("x", 1, 100, 10), {System: "zk", Unsupported: "scans", Result: &ycsb.Result{Workload: "e"}}}
	e := roundRow("x", 1, 50, 20)
	e.Result.Workload = "e"
	md := totalsMarkdown(summarize(append(rows, e)))
	for _, want := range []string{"| system | A c=16 | E c=16 |", "| x | **100** (10 µs) | **50** (20 µs) |", "| zk |  | not supported |"} {
		if !strings.Contains(md, want) {
			t.Errorf("missing %q in\n%s", want, md)
		}
	}
}

func TestRatiosAreRowOverPeerPerMatrix(t *testing.T) {
	total := func(sys, w string, tput float64) summaryRow {
		return summaryRow{cellKey: cellKey{System: sys, Workload: w, Clients: 64, Op: "total"}, Throughput: tput}
	}
	noScans := summaryRow{cellKey: cellKey{System: "zk", Workload: "e", Op: "total"}, Unsupported: "scans"}
	m1 := []summaryRow{total("kefir", "a", 300), total("etcd", "a", 100), total("zk", "a", 150),
		total("kefir", "e", 40), total("etcd", "e", 20), noScans,
		{cellKey: cellKey{System: "kefir", Workload: "a", Clients: 64, Op: "READ"}, Throughput: 1}} // not a total: ignored
	m2 := []summaryRow{total("kefir", "a", 200), total("etcd", "a", 100), total("zk", "a", 100),
		total("kefir", "e", 30), total("etcd", "e", 20), noScans}
	pairs, err := parsePairs("kefir/etcd; kefir/zk;gone/etcd")
	if err != nil {
		t.Fatal(err)
	}
	md := ratiosMarkdown(pairs, [][]summaryRow{m1, m2})
	for _, want := range []string{
		"| row | ÷ peer | A c=64 | E c=64 |",
		"| kefir | etcd | 3.00× / 2.00× | 2.00× / 1.50× |",
		"| kefir | zk | 2.00× / 2.00× | n/s |",
	} {
		if !strings.Contains(md, want) {
			t.Fatalf("no %q in\n%s", want, md)
		}
	}
	if strings.Contains(md, "gone") {
		t.Fatalf("a pair the run did not measure is in the table:\n%s", md)
	}
	if md := ratiosMarkdown([][2]string{{"gone", "etcd"}}, [][]summaryRow{m1}); md != "" {
		t.Fatalf("a table of unmeasured pairs: %q", md)
	}
	if _, err := parsePairs("kefir-etcd"); err == nil {
		t.Fatal("a pair without a slash was accepted")
	}
}

// Cost per operation: medians over rounds per cell, a table saying which rows are
// CPU-bound, and Kefir ÷ peer ratios of the costs next to the throughput ratios.
func TestCostIsSummarizedTabledAndRatioed(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	withCost := func(sys string, round int, tput float64, c *Cost) row {
		r := roundRow(sys, round, tput, 10)
		r.Cost = c
		return r
	}
	rows := []row{
		withCost("kefir", 1, 100, &Cost{ServerCPUUsPerOp: 10, ServerCores: 1.6, FsyncsPerWrite: f(0.1), BytesWrittenPerWrite: f(1100), ClientNetBytesPerOp: f(600)}),
		withCost("kefir", 2, 100, &Cost{ServerCPUUsPerOp: 30, ServerCores: 1.8, FsyncsPerWrite: f(0.3), BytesWrittenPerWrite: f(1300), ClientNetBytesPerOp: f(600)}),
		withCost("kefir", 3, 100, &Cost{ServerCPUUsPerOp: 20, ServerCores: 1.7, FsyncsPerWrite: f(0.2), BytesWrittenPerWrite: f(1200), ClientNetBytesPerOp: f(600)}),
		withCost("redis", 1, 100, &Cost{ServerCPUUsPerOp: 40, ServerCores: 0.5, BytesWrittenPerWrite: f(2400), ClientNetBytesPerOp: f(1200)}),
		roundRow("ceiling", 1, 500, 5), // no cost measured: not in the cost table
		withCost("etcd", 1, 100, &Cost{ServerCPUUsPerOp: 50, ServerCores: 0.6}),
	}
	rows[5].Attempts, rows[5].OtherCPUCores = 1, 1.2 // the CPU watch saw others fill the machine
	for i := range rows {
		rows[i].Result.ProcessCPUUsPerOp = 2 // harness: 2 µs × 100 ops/s
	}
	s := summary{Rows: summarize(rows), CPUs: 2}
	var kefir summaryRow
	for _, r := range s.Rows {
		if r.System == "kefir" && r.Op == "total" {
			kefir = r
		}
	}
	if kefir.ServerCPUUsPerOp == nil || *kefir.ServerCPUUsPerOp != 20 || *kefir.FsyncsPerWrite != 0.2 || *kefir.BytesWrittenPerWrite != 1200 || *kefir.ServerCores != 1.7 {
		t.Fatalf("kefir's medians: %+v", kefir)
	}
	md := costMarkdown(s)
	for _, want := range []string{
		"| kefir | A | 16 | 100 | 20.0 | 1.70 | 0.00 | **yes** (1.70 of 2) | 0.200 | 1200 | 600 |",
		"| redis | A | 16 | 100 | 40.0 | 0.50 | 0.00 | no (0.50 of 2) | — | 2400 | 1200 |",
		"CPU-bound here: kefir A c=16.",
		"| etcd | A | 16 | 100 | 50.0 | 0.60 | 0.00 | starved (0.60 of 2; others 1.20) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	if strings.Contains(md, "| ceiling |") {
		t.Errorf("a row without a cost is in the cost table:\n%s", md)
	}
	pairs, _ := parsePairs("kefir/redis")
	cr := costRatiosMarkdown(pairs, [][]summaryRow{s.Rows})
	for _, want := range []string{"**Server CPU µs per operation, Kefir ÷ the peer**", "| kefir | redis | 0.50× |",
		"**write_bytes per write", "**Client network bytes per operation"} {
		if !strings.Contains(cr, want) {
			t.Errorf("no %q in\n%s", want, cr)
		}
	}
	if cr := costRatiosMarkdown(pairs, [][]summaryRow{summarize(rows[4:])}); cr != "" {
		t.Errorf("cost ratios without costs: %q", cr)
	}
}
