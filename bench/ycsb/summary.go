package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kefirdb/kefir/bench/limits"
	"github.com/kefirdb/kefir/bench/stats"
)

// The standard matrix (bench/compare.sh) runs every system for several short rounds,
// interleaved, instead of one long run each: on a shared machine a burst of someone
// else's work then lands on one round of every system rather than on all of one
// system's figures. summarize reduces the rounds to medians; agree compares two such
// summaries (two back-to-back matrices) row by row.

// cellKey names one cell of the matrix.
type cellKey struct {
	System   string  `json:"system"`
	Workload string  `json:"workload"`
	Clients  int     `json:"clients"`
	Target   float64 `json:"target_ops_per_sec,omitempty"`
	Op       string  `json:"op"` // an operation type, or "total"
}

// summaryRow is one cell's medians over rounds.
type summaryRow struct {
	cellKey
	Rounds      int           `json:"rounds"`
	Durable     bool          `json:"durable_writes"`
	Delay       time.Duration `json:"delay_one_way_ns,omitempty"`
	LinkDelay   time.Duration `json:"link_delay_one_way_ns,omitempty"`
	Unsupported string        `json:"unsupported,omitempty"`
	Throughput  float64       `json:"median_ops_per_sec"`
	P50Us       float64       `json:"median_p50_us"`
	P99Us       float64       `json:"median_p99_us"`
	// Spread is max ÷ min − 1 of the rounds' throughputs: how noisy the cell was.
	Spread   float64 `json:"round_spread"`
	Errors   int64   `json:"errors"`
	NotFound int64   `json:"not_found"`
	Backlog  int64   `json:"backlog,omitempty"`
	// CPUUsPerOp (total rows) is the median over rounds of the harness process's CPU
	// time per operation (core.Result.ProcessCPUUsPerOp): the client side's cost of
	// an operation, plus the server's for the in-process ceiling.
	CPUUsPerOp float64 `json:"median_process_cpu_us_per_op,omitempty"`
	// The CPU watch (total rows of a -matrix run with -watch-pids): the median and the
	// largest, over the rounds kept, of the CPU other processes used during the cell,
	// and how many extra measurements the cell took because a round was disturbed.
	OtherCPUCores    float64 `json:"median_other_cpu_cores,omitempty"`
	MaxOtherCPUCores float64 `json:"max_other_cpu_cores,omitempty"`
	Remeasured       int     `json:"remeasured,omitempty"`
	Watched          bool    `json:"cpu_watched,omitempty"`
	// Cost per operation (total rows of a -matrix run whose line has -server-pids or
	// -metrics; cost.go): medians over rounds, nil where not measured.
	ServerCPUUsPerOp     *float64 `json:"median_server_cpu_us_per_op,omitempty"`
	ServerCores          *float64 `json:"median_server_cores,omitempty"`
	BytesWrittenPerWrite *float64 `json:"median_bytes_written_per_write,omitempty"`
	FsyncsPerWrite       *float64 `json:"median_fsyncs_per_write,omitempty"`
	ClientNetBytesPerOp  *float64 `json:"median_client_net_bytes_per_op,omitempty"`
}

// summary is what -summarize writes as JSON and -agree reads.
type summary struct {
	Command string        `json:"command"`
	LoadAvg string        `json:"load_average,omitempty"`
	Limits  limits.Result `json:"limits"`
	Rows    []summaryRow  `json:"rows"`
	// CPUs is the machine's CPU count, against which rows are called CPU-bound.
	CPUs     int    `json:"cpus,omitempty"`
	Started  string `json:"started,omitempty"`
	Finished string `json:"finished,omitempty"`
}

// summarize reduces rows measured over rounds (Run = round) to one row per cell and
// operation, with medians over the rounds. Cell order is first appearance.
func summarize(rows []row) []summaryRow {
	type acc struct {
		out                 summaryRow
		tput, p50, p99, cpu []float64
		other               []float64
		// cost per operation, one list per Cost field (costFields' order)
		cost [5][]float64
	}
	cells := map[cellKey]*acc{}
	var order []cellKey
	add := func(k cellKey, r row, tput, p50, p99 float64, errs, nf int64) {
		a := cells[k]
		if a == nil {
			a = &acc{out: summaryRow{cellKey: k, Durable: r.Durable, Delay: r.Delay, LinkDelay: r.LinkDelay, Unsupported: r.Unsupported}}
			cells[k] = a
			order = append(order, k)
		}
		if r.Unsupported != "" {
			return
		}
		a.tput, a.p50, a.p99 = append(a.tput, tput), append(a.p50, p50), append(a.p99, p99)
		a.out.Errors += errs
		a.out.NotFound += nf
		if k.Op == "total" {
			a.out.Backlog += r.Result.Backlog
			if r.Result.ProcessCPUUsPerOp > 0 {
				a.cpu = append(a.cpu, r.Result.ProcessCPUUsPerOp)
			}
			if r.Cost != nil {
				for i, v := range costFields(r.Cost) {
					if v != nil {
						a.cost[i] = append(a.cost[i], *v)
					}
				}
			}
			if r.Attempts > 0 { // watched
				a.out.Watched = true
				a.other = append(a.other, r.OtherCPUCores)
				a.out.Remeasured += r.Attempts - 1
			}
		}
	}
	for _, r := range rows {
		base := cellKey{System: r.System, Workload: r.Result.Workload, Clients: r.Result.Clients, Target: r.Result.Target}
		for _, op := range r.Result.PerOp {
			k := base
			k.Op = op.Op
			add(k, r, op.Throughput, op.P50Us, op.P99Us, op.Errors, op.NotFound)
		}
		k := base
		k.Op = "total"
		add(k, r, r.Result.Throughput, 0, 0, r.Result.Errors, 0)
	}
	out := make([]summaryRow, 0, len(order))
	for _, k := range order {
		a := cells[k]
		a.out.Rounds = len(a.tput)
		a.out.Throughput, a.out.P50Us, a.out.P99Us = stats.Median(a.tput), stats.Median(a.p50), stats.Median(a.p99)
		a.out.CPUUsPerOp = stats.Median(a.cpu)
		if len(a.other) > 0 {
			a.out.OtherCPUCores, a.out.MaxOtherCPUCores = stats.Median(a.other), slices.Max(a.other)
		}
		a.out.Spread = relSpread(a.tput)
		med := func(xs []float64) *float64 {
			if len(xs) == 0 {
				return nil
			}
			m := stats.Median(xs)
			return &m
		}
		a.out.ServerCPUUsPerOp, a.out.ServerCores, a.out.BytesWrittenPerWrite = med(a.cost[0]), med(a.cost[1]), med(a.cost[2])
		a.out.FsyncsPerWrite, a.out.ClientNetBytesPerOp = med(a.cost[3]), med(a.cost[4])
		out = append(out, a.out)
	}
	return out
}

// costFields lists a Cost's figures in the order summarize keeps them (nil: not measured).
func costFields(c *Cost) [5]*float64 {
	var cpu, cores *float64
	if c.ServerCores > 0 || c.ServerCPUUsPerOp > 0 {
		cpu, cores = &c.ServerCPUUsPerOp, &c.ServerCores
	}
	return [5]*float64{cpu, cores, c.BytesWrittenPerWrite, c.FsyncsPerWrite, c.ClientNetBytesPerOp}
}

// cpuBoundShare is the share of the machine's CPUs above which a row counts as
// CPU-bound: the system's servers and the harness driving them together use this much,
// so the cores, not the disk or the protocol, set its throughput here.
const cpuBoundShare = 0.85

// harnessCores is the harness's CPU in cores during a cell (its CPU per op × ops/s).
func harnessCores(r summaryRow) float64 { return r.CPUUsPerOp * r.Throughput / 1e6 }

// cpuBound says whether a row used (nearly) every CPU of the machine, with the figure;
// a row that did not, on a machine that processes outside the matrix (the CPU watch)
// filled up, is "starved": it got what the others left, and its throughput says so.
func cpuBound(r summaryRow, cpus int) (string, bool) {
	if r.ServerCores == nil || cpus <= 0 {
		return "–", false
	}
	used := *r.ServerCores + harnessCores(r)
	limit := cpuBoundShare * float64(cpus)
	switch {
	case used >= limit:
		return fmt.Sprintf("**yes** (%.2f of %d)", used, cpus), true
	case r.Watched && used+r.OtherCPUCores >= limit:
		return fmt.Sprintf("starved (%.2f of %d; others %.2f)", used, cpus, r.OtherCPUCores), false
	}
	return fmt.Sprintf("no (%.2f of %d)", used, cpus), false
}

// costMarkdown is the cost-per-operation table: one line per measured total row
// ("" when no row has a cost).
func costMarkdown(s summary) string {
	var body strings.Builder
	var bound []string
	opt := func(v *float64, format string) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf(format, *v)
	}
	for _, r := range s.Rows {
		if r.Op != "total" || r.Unsupported != "" || (r.ServerCPUUsPerOp == nil && r.ClientNetBytesPerOp == nil && r.FsyncsPerWrite == nil) {
			continue
		}
		cb, isBound := cpuBound(r, s.CPUs)
		if isBound {
			bound = append(bound, fmt.Sprintf("%s %s c=%d", r.System, strings.ToUpper(r.Workload), r.Clients))
		}
		fmt.Fprintf(&body, "| %s | %s | %d | %.0f | %s | %s | %.2f | %s | %s | %s | %s |\n", r.System, strings.ToUpper(r.Workload), r.Clients,
			r.Throughput, opt(r.ServerCPUUsPerOp, "%.1f"), opt(r.ServerCores, "%.2f"), harnessCores(r), cb,
			opt(r.FsyncsPerWrite, "%.3f"), opt(r.BytesWrittenPerWrite, "%.0f"), opt(r.ClientNetBytesPerOp, "%.0f"))
	}
	if body.Len() == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("Cost per operation (medians over rounds; bench/ycsb/cost.go). Server CPU: utime+stime of every process of the system " +
		"(/proc/PID/stat) over the measured window ÷ its operations; server and harness cores: their CPU during the window; " +
		fmt.Sprintf("CPU-bound: the two together used ≥ %.0f %% of the machine's CPUs; starved: they did not, but with the CPU that processes outside the matrix used (the CPU watch's median) the machine was that full. ", 100*cpuBoundShare) +
		"Fsyncs per write: Kefir's kefir_fsync_duration_seconds_count (all logs, all nodes) ÷ writes; /proc has no fsync count, so other systems show —. " +
		"write_bytes per write: write_bytes of the system's processes (/proc/PID/io) ÷ writes; the kernel counts a whole page-cache folio each time a write dirties a clean one, " +
		"so with large folios (this machine's kernel) it measures page-cache dirtying, not bytes reaching the disk, and overstates small fsync'd writes into large folios " +
		"(Kefir's zero-filled segments) many times over (bench/README.md, \"Cost per operation\"). " +
		"Client network bytes per op: the harness's socket reads and writes (rchar+wchar of /proc/self/io) ÷ operations, both directions; " +
		"traffic between a group's replicas is not in it, and in-process rows show —. " +
		"Unlike throughput, CPU per operation barely moves when other work shares the cores.\n\n")
	sb.WriteString("| system | workload | clients | ops/s | server CPU µs/op | server cores | harness cores | CPU-bound | fsyncs/write | write_bytes/write | client net B/op |\n")
	sb.WriteString("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	sb.WriteString(body.String())
	if len(bound) > 0 {
		fmt.Fprintf(&sb, "\nCPU-bound here: %s.\n", strings.Join(bound, "; "))
	} else if s.CPUs > 0 {
		sb.WriteString("\nNo row is CPU-bound here.\n")
	}
	return sb.String()
}

// summaryMarkdown is the matrix's table: one line per cell and operation.
func summaryMarkdown(s summary) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Medians over rounds. Physical floors: %s. \"× floor\" is the median p50 ÷ the floor of that operation "+
		"(a round trip plus twice the emulated one-way delay, plus a write+fsync for writes of systems that fsync before acknowledging).\n\n", s.Limits)
	sb.WriteString("The harness's CPU µs/op (total rows) is the ycsb process's CPU time per operation: the harness and the client library " +
		"(and, for the in-process respserver rows, the trivial server too), never the system under test's.\n\n")
	sb.WriteString("Other CPU (total rows, the CPU watch) is what processes outside the matrix — neither the ycsb process nor any system's servers — " +
		"used while the cell ran, in cores: median and largest over the rounds kept; \"+N\" counts extra measurements of a round that was disturbed " +
		"(the least disturbed is kept).\n\n")
	sb.WriteString("| system | workload | clients | op | rounds | ops/s | p50 µs | × floor | p99 µs | round spread | errors | not found | harness CPU µs/op | other CPU cores |\n")
	sb.WriteString("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Rows {
		if r.Unsupported != "" {
			if r.Op == "total" {
				fmt.Fprintf(&sb, "| %s | %s | | not supported: no %s | | | | | | | | | | |\n", r.System, strings.ToUpper(r.Workload), r.Unsupported)
			}
			continue
		}
		clients := fmt.Sprint(r.Clients)
		if r.Target > 0 {
			clients += fmt.Sprintf(" @%.0f/s", r.Target)
			if r.Backlog > 0 {
				clients += fmt.Sprintf(" (**%d never sent**)", r.Backlog)
			}
		}
		if r.Op == "total" {
			other := ""
			if r.Watched {
				other = fmt.Sprintf("%.2f / %.2f", r.OtherCPUCores, r.MaxOtherCPUCores)
				if r.Remeasured > 0 {
					other += fmt.Sprintf(" (+%d)", r.Remeasured)
				}
			}
			fmt.Fprintf(&sb, "| %s | %s | %s | **total** | %d | **%.0f** | | | | %.0f%% | %d | | %.1f | %s |\n",
				r.System, strings.ToUpper(r.Workload), clients, r.Rounds, r.Throughput, 100*r.Spread, r.Errors, r.CPUUsPerOp, other)
			continue
		}
		rtt := s.Limits.LoopbackRTTP50us + 2*float64(r.Delay+r.LinkDelay)/1e3
		floor := rtt
		if r.Durable && (r.Op == "UPDATE" || r.Op == "INSERT" || r.Op == "READ-MODIFY-WRITE") {
			floor += s.Limits.FsyncP50us
		}
		if r.Op == "READ-MODIFY-WRITE" {
			floor += rtt
		}
		times := "–"
		if floor > 0 {
			times = fmt.Sprintf("%.1f×", r.P50Us/floor)
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %d | %.0f | %.0f | %s | %.0f | %.0f%% | %d | %d | | |\n",
			r.System, strings.ToUpper(r.Workload), clients, r.Op, r.Rounds, r.Throughput, r.P50Us, times, r.P99Us, 100*r.Spread, r.Errors, r.NotFound)
	}
	return sb.String()
}

// watchMarkdown sums up the CPU watch over a matrix's total rows: how disturbed the
// kept measurements were and how many were taken again ("" when nothing was watched).
func watchMarkdown(rows []summaryRow) string {
	var cells, remeasured, over int
	var worst, meds []float64
	for _, r := range rows {
		if r.Op != "total" || !r.Watched {
			continue
		}
		cells++
		remeasured += r.Remeasured
		worst = append(worst, r.MaxOtherCPUCores)
		meds = append(meds, r.OtherCPUCores)
		if r.MaxOtherCPUCores > 0.25 {
			over++
		}
	}
	if cells == 0 {
		return ""
	}
	return fmt.Sprintf("CPU watch: processes outside the matrix used a median of %.2f cores per cell (median over cells of the rounds' median), "+
		"at most %.2f in a kept round; %d of %d cells kept a round above 0.25 cores; %d extra measurements of disturbed rounds.\n",
		stats.Median(meds), slices.Max(worst), over, cells, remeasured)
}

// ceilingMarkdown compares, per workload and client count, the harness's ceiling (the
// rows whose system name starts with "respserver": the trivial in-process server) with
// the highest total throughput any other system reached; issue 8 wants ≥ 3×. It also
// compares each client library's own ceiling with the systems driven through that
// library (respserver via go-redis against the redis rows, via Kefir's client against
// the kefir rows): below 3× there, the client or the harness may be what limits them.
func ceilingMarkdown(rows []summaryRow) string {
	type cell struct {
		w string
		c int
	}
	family := func(sys string) string {
		switch {
		case strings.HasPrefix(sys, "respserver") && strings.Contains(sys, "go-redis"):
			return "redis"
		case strings.HasPrefix(sys, "respserver") && strings.Contains(sys, "kefir"):
			return "kefir"
		case strings.HasPrefix(sys, "redis"):
			return "redis"
		case strings.HasPrefix(sys, "kefir"):
			return "kefir"
		}
		return ""
	}
	type best struct {
		sys  string
		tput float64
	}
	ceil := map[cell]best{}
	top := map[cell]best{}
	famCeil := map[string]map[cell]best{"redis": {}, "kefir": {}}
	famTop := map[string]map[cell]best{"redis": {}, "kefir": {}}
	var order []cell
	seen := map[cell]bool{}
	raise := func(m map[cell]best, k cell, r summaryRow) {
		if r.Throughput > m[k].tput {
			m[k] = best{r.System, r.Throughput}
		}
	}
	for _, r := range rows {
		if r.Op != "total" || r.Unsupported != "" || r.Target > 0 {
			continue
		}
		k := cell{r.Workload, r.Clients}
		if !seen[k] {
			seen[k] = true
			order = append(order, k)
		}
		isCeil := strings.HasPrefix(r.System, "respserver")
		if isCeil {
			raise(ceil, k, r)
		} else {
			raise(top, k, r)
		}
		if f := family(r.System); f != "" {
			if isCeil {
				raise(famCeil[f], k, r)
			} else {
				raise(famTop[f], k, r)
			}
		}
	}
	if len(ceil) == 0 {
		return ""
	}
	ratio := func(c, b float64) (string, string) {
		if c == 0 || b == 0 {
			return "–", "–"
		}
		x := c / b
		if x < 3 {
			return fmt.Sprintf("%.2f×", x), "**no**" // two decimals: 2.97 must not print as 3.0
		}
		return fmt.Sprintf("%.1f×", x), "yes"
	}
	var sb strings.Builder
	sb.WriteString("| workload | clients | harness ceiling ops/s (best ceiling row) | best system | its ops/s | ceiling ÷ best | ≥ 3× | go-redis ceiling ÷ best redis row | Kefir-client ceiling ÷ best kefir row |\n|---|---:|---:|---|---:|---:|---|---|---|\n")
	for _, k := range order {
		c, b := ceil[k], top[k]
		x, ok := ratio(c.tput, b.tput)
		fam := func(f string) string {
			x, ok := ratio(famCeil[f][k].tput, famTop[f][k].tput)
			if x == "–" {
				return "–"
			}
			return fmt.Sprintf("%s (%s)", x, strings.Trim(ok, "*"))
		}
		fmt.Fprintf(&sb, "| %s | %d | %.0f (%s) | %s | %.0f | %s | %s | %s | %s |\n", strings.ToUpper(k.w), k.c, c.tput, c.sys, b.sys, b.tput, x, ok, fam("redis"), fam("kefir"))
	}
	return sb.String()
}

// gridCol is one column of a compact table: a workload at a client count
// (clients -1 marks "this workload is unsupported by the system").
type gridCol struct {
	w string
	c int
}

// grid is a compact table: one line per system, one column per workload and
// client count, in first-seen order.
type grid struct {
	cols    []gridCol
	systems []string
	seenCol map[gridCol]bool
	cell    map[string]map[gridCol]string
}

func newGrid() *grid {
	return &grid{seenCol: map[gridCol]bool{}, cell: map[string]map[gridCol]string{}}
}

// row returns the cells of system sys, adding the line on first sight.
func (g *grid) row(sys string) map[gridCol]string {
	m, ok := g.cell[sys]
	if !ok {
		m = map[gridCol]string{}
		g.cell[sys] = m
		g.systems = append(g.systems, sys)
	}
	return m
}

// col returns the column of a workload and client count, adding it on first sight.
func (g *grid) col(w string, c int) gridCol {
	k := gridCol{w, c}
	if !g.seenCol[k] {
		g.seenCol[k] = true
		g.cols = append(g.cols, k)
	}
	return k
}

// markdown renders the table; value gives the text of one cell.
func (g *grid) markdown(value func(sys string, c gridCol) string) string {
	var sb strings.Builder
	sb.WriteString("| system |")
	for _, c := range g.cols {
		fmt.Fprintf(&sb, " %s c=%d |", strings.ToUpper(c.w), c.c)
	}
	sb.WriteString("\n|---|")
	for range g.cols {
		sb.WriteString("---:|")
	}
	sb.WriteString("\n")
	for _, sys := range g.systems {
		fmt.Fprintf(&sb, "| %s |", sys)
		for _, c := range g.cols {
			fmt.Fprintf(&sb, " %s |", value(sys, c))
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// totalsMarkdown is the compact view of a summary: one line per system, one column per
// workload and client count, each cell the median total throughput (and the median p50
// of the workload's first operation type, µs).
func totalsMarkdown(rows []summaryRow) string {
	g := newGrid()
	for _, r := range rows {
		if r.Target > 0 {
			continue
		}
		cells := g.row(r.System)
		if r.Unsupported != "" {
			for _, c := range g.cols {
				if c.w == r.Workload {
					cells[c] = "n/s"
				}
			}
			cells[gridCol{r.Workload, -1}] = "n/s"
			continue
		}
		k := g.col(r.Workload, r.Clients)
		switch {
		case r.Op == "total":
			cells[k] = fmt.Sprintf("**%.0f**", r.Throughput) + cells[k]
		case cells[k] == "" || !strings.Contains(cells[k], "µs"):
			cells[k] += fmt.Sprintf(" (%.0f µs)", r.P50Us)
		}
	}
	return g.markdown(func(sys string, c gridCol) string {
		v := g.cell[sys][c]
		if v == "" && g.cell[sys][gridCol{c.w, -1}] != "" {
			v = "not supported"
		}
		return v
	})
}

// agreeTotalsMarkdown is the compact view of agree: per system and cell, the difference
// between the two runs' median total throughputs, bold where beyond agreeLimit.
func agreeTotalsMarkdown(a, b []summaryRow) string {
	rows, _ := agree(a, b)
	g := newGrid()
	for _, r := range rows {
		if r.Op != "total" || r.Target > 0 {
			continue
		}
		k := g.col(r.Workload, r.Clients)
		cells := g.row(r.System)
		d := "∞"
		if !math.IsInf(r.DTput, 1) {
			d = fmt.Sprintf("%.0f%%", 100*r.DTput)
		}
		if r.DTput > agreeLimit {
			d = "**" + d + "**"
		}
		cells[k] = d
	}
	return g.markdown(func(sys string, c gridCol) string { return g.cell[sys][c] })
}

// agreeRow is one cell of two matrices side by side.
type agreeRow struct {
	cellKey
	Tput   [2]float64
	P50    [2]float64
	DTput  float64 // |a − b| ÷ min(a, b)
	DP50   float64
	Within bool
}

// agreeLimit is issue 8's bar: two back-to-back runs agree within 15% on medians.
const agreeLimit = 0.15

// agree compares two matrices' summaries cell by cell: each cell's median throughput
// and (for operations) median p50 must differ by at most agreeLimit, relative to the
// smaller. Cells present in only one summary are reported as such, never dropped.
func agree(a, b []summaryRow) (rows []agreeRow, missing []cellKey) {
	bi := map[cellKey]summaryRow{}
	for _, r := range b {
		bi[r.cellKey] = r
	}
	seen := map[cellKey]bool{}
	for _, ra := range a {
		if ra.Unsupported != "" {
			continue
		}
		seen[ra.cellKey] = true
		rb, ok := bi[ra.cellKey]
		if !ok || rb.Unsupported != "" {
			missing = append(missing, ra.cellKey)
			continue
		}
		ar := agreeRow{cellKey: ra.cellKey, Tput: [2]float64{ra.Throughput, rb.Throughput}, P50: [2]float64{ra.P50Us, rb.P50Us}}
		ar.DTput = relDiff(ra.Throughput, rb.Throughput)
		if ra.Op != "total" {
			ar.DP50 = relDiff(ra.P50Us, rb.P50Us)
		}
		ar.Within = ar.DTput <= agreeLimit && ar.DP50 <= agreeLimit
		rows = append(rows, ar)
	}
	for _, rb := range b {
		if rb.Unsupported == "" && !seen[rb.cellKey] {
			missing = append(missing, rb.cellKey)
		}
	}
	return rows, missing
}

// relDiff is |a − b| relative to the smaller of the two; a zero against a non-zero
// is an infinite difference, two zeros none.
func relDiff(a, b float64) float64 {
	lo, hi := min(a, b), max(a, b)
	if hi == 0 {
		return 0
	}
	if lo <= 0 {
		return math.Inf(1)
	}
	return hi/lo - 1
}

// agreeVerdict states how many rows agree, totals and operation rows separately: a
// total row compares one number (the cell's median total throughput), an operation row
// two (that operation's median throughput and median p50), so the second is the harder
// bar, and mixing them would hide which of the two the runs miss.
func agreeVerdict(rows []agreeRow) string {
	var tot, totOK, ops, opsOK int
	for _, r := range rows {
		if r.Op == "total" {
			tot++
			if r.Within {
				totOK++
			}
			continue
		}
		ops++
		if r.Within {
			opsOK++
		}
	}
	return fmt.Sprintf("**Total throughput: %d of %d cells agree within %.0f%%. Per operation (throughput and p50): %d of %d rows.** "+
		"Each figure compared is a median over the cell's rounds in one matrix; difference = larger ÷ smaller − 1.",
		totOK, tot, 100*agreeLimit, opsOK, ops)
}

func agreeMarkdown(names [2]string, sa, sb summary) string {
	rows, missing := agree(sa.Rows, sb.Rows)
	var out strings.Builder
	fmt.Fprintf(&out, "Run 1: `%s`, %s. Run 2: `%s`, %s.\n\n", names[0], sa.LoadAvg, names[1], sb.LoadAvg)
	out.WriteString(agreeVerdict(rows))
	if len(missing) > 0 {
		fmt.Fprintf(&out, " %d cells were measured in only one run (failed or skipped in the other): %v.", len(missing), missing)
	}
	out.WriteString("\n\n| system | workload | clients | op | ops/s run 1 | ops/s run 2 | Δ | p50 µs run 1 | p50 µs run 2 | Δ | within 15% |\n")
	out.WriteString("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n")
	pct := func(x float64) string {
		if math.IsInf(x, 1) {
			return "∞"
		}
		return fmt.Sprintf("%.0f%%", 100*x)
	}
	for _, r := range rows {
		ok := "yes"
		if !r.Within {
			ok = "**no**"
		}
		p50a, p50b, dp := "", "", ""
		if r.Op != "total" {
			p50a, p50b, dp = fmt.Sprintf("%.0f", r.P50[0]), fmt.Sprintf("%.0f", r.P50[1]), pct(r.DP50)
		}
		fmt.Fprintf(&out, "| %s | %s | %d | %s | %.0f | %.0f | %s | %s | %s | %s | %s |\n", r.System, strings.ToUpper(r.Workload), r.Clients, r.Op,
			r.Tput[0], r.Tput[1], pct(r.DTput), p50a, p50b, dp, ok)
	}
	return out.String()
}

func readSummary(path string) (summary, error) {
	var s summary
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// splice replaces the text between the lines "<!-- BEGIN name -->" and
// "<!-- END name -->" in doc with body, keeping everything outside the markers
// (hand-written sections). Both markers must be present exactly once.
func splice(doc []byte, name string, body []byte) ([]byte, error) {
	begin, end := []byte("<!-- BEGIN "+name+" -->\n"), []byte("<!-- END "+name+" -->")
	if bytes.Count(doc, begin) != 1 || bytes.Count(doc, end) != 1 {
		return nil, fmt.Errorf("want exactly one %q line and one %q line", strings.TrimSpace(string(begin)), end)
	}
	i := bytes.Index(doc, begin) + len(begin)
	j := bytes.Index(doc, end)
	if j < i {
		return nil, fmt.Errorf("%q comes before %q", end, strings.TrimSpace(string(begin)))
	}
	out := slices.Clone(doc[:i])
	out = append(out, body...)
	if len(body) > 0 && body[len(body)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, doc[j:]...), nil
}

// parsePairs reads -ratios' "ROW/PEER;ROW/PEER" (system labels hold commas, not slashes
// or semicolons).
func parsePairs(spec string) ([][2]string, error) {
	var pairs [][2]string
	for _, p := range strings.Split(spec, ";") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		num, den, ok := strings.Cut(p, "/")
		if !ok || num == "" || den == "" {
			return nil, fmt.Errorf("-ratios: %q is not ROW/PEER", p)
		}
		pairs = append(pairs, [2]string{num, den})
	}
	if len(pairs) == 0 {
		return nil, fmt.Errorf("-ratios: no pairs in %q", spec)
	}
	return pairs, nil
}

// ratiosMarkdown is the table of claims the results page makes from the matrix: per pair
// and closed-loop cell, the row's median total throughput ÷ its peer's, one figure per
// matrix ("m1 / m2"), "n/s" where either does not support the workload (such a row has
// no client count) and "–" where either is missing. A pair with no figure at all is left
// out, and with none left the table is empty ("").
func ratiosMarkdown(pairs [][2]string, runs [][]summaryRow) string {
	return ratioTable(pairs, runs, func(r summaryRow) (float64, bool) { return r.Throughput, true })
}

// costRatiosMarkdown is ratiosMarkdown for the cost per operation: each row's server CPU
// µs per op, bytes written per write and client network bytes per op ÷ its peer's (below
// 1: Kefir costs less); "" when no pair has them.
func costRatiosMarkdown(pairs [][2]string, runs [][]summaryRow) string {
	var sb strings.Builder
	for _, m := range []struct {
		name string
		v    func(summaryRow) *float64
	}{
		{"Server CPU µs per operation", func(r summaryRow) *float64 { return r.ServerCPUUsPerOp }},
		{"write_bytes per write (page-cache dirtying, not disk bytes: see the cost table)", func(r summaryRow) *float64 { return r.BytesWrittenPerWrite }},
		{"Client network bytes per operation", func(r summaryRow) *float64 { return r.ClientNetBytesPerOp }},
	} {
		t := ratioTable(pairs, runs, func(r summaryRow) (float64, bool) {
			if v := m.v(r); v != nil {
				return *v, true
			}
			return 0, false
		})
		if t != "" {
			fmt.Fprintf(&sb, "\n**%s, Kefir ÷ the peer** (below 1×: Kefir costs less):\n\n%s", m.name, t)
		}
	}
	return sb.String()
}

// ratioTable is the table of value(row) ÷ value(peer) per pair and cell, one figure per
// matrix; value's false means not measured ("–").
func ratioTable(pairs [][2]string, runs [][]summaryRow, value func(summaryRow) (float64, bool)) string {
	type col struct {
		w string
		c int
	}
	var cols []col
	tput := make([]map[cellKey]summaryRow, len(runs))
	unsupported := map[[2]string]bool{} // system, workload: a row without a client count
	for i, rows := range runs {
		tput[i] = map[cellKey]summaryRow{}
		for _, r := range rows {
			if r.Op != "total" || r.Target > 0 {
				continue
			}
			if r.Unsupported != "" {
				unsupported[[2]string{r.System, r.Workload}] = true
				continue
			}
			tput[i][cellKey{System: r.System, Workload: r.Workload, Clients: r.Clients}] = r
			if !slices.Contains(cols, col{r.Workload, r.Clients}) {
				cols = append(cols, col{r.Workload, r.Clients})
			}
		}
	}
	var body strings.Builder
	for _, p := range pairs {
		var line strings.Builder
		measured := false
		fmt.Fprintf(&line, "| %s | %s |", p[0], p[1])
		for _, c := range cols {
			var figs []string
			for i := range runs {
				num, ok1 := tput[i][cellKey{System: p[0], Workload: c.w, Clients: c.c}]
				den, ok2 := tput[i][cellKey{System: p[1], Workload: c.w, Clients: c.c}]
				nv, okn := value(num)
				dv, okd := value(den)
				switch {
				case unsupported[[2]string{p[0], c.w}] || unsupported[[2]string{p[1], c.w}]:
					figs = append(figs, "n/s")
				case !ok1 || !ok2 || !okn || !okd || dv == 0:
					figs = append(figs, "–")
				default:
					figs = append(figs, fmt.Sprintf("%.2f×", nv/dv))
					measured = true
				}
			}
			if slices.Equal(figs, slices.Repeat([]string{"n/s"}, len(figs))) {
				figs = figs[:1]
			}
			fmt.Fprintf(&line, " %s |", strings.Join(figs, " / "))
		}
		if measured { // a pair the run did not measure (a SYSTEMS subset) is left out
			body.WriteString(line.String() + "\n")
		}
	}
	if body.Len() == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("| row | ÷ peer |")
	for _, c := range cols {
		fmt.Fprintf(&sb, " %s c=%d |", strings.ToUpper(c.w), c.c)
	}
	sb.WriteString("\n|---|---|" + strings.Repeat("---:|", len(cols)) + "\n")
	sb.WriteString(body.String())
	return sb.String()
}
