package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// readRows loads the rows of -json result files (from one or several invocations, e.g.
// the per-system files compare.sh writes), so systems measured separately share a plot.
func readRows(files []string) ([]row, error) {
	var rows []row
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var doc struct {
			Rows []row `json:"rows"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		rows = append(rows, doc.Rows...)
	}
	return rows, nil
}

// plotAll writes, per workload, a latency CDF plot (one line per system, client count
// and operation, first run only) and, where open-loop runs at several targets exist, a
// throughput–latency curve (p99 against achieved throughput).
func plotAll(dir string, rows []row) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	byWorkload := map[string][]row{}
	for _, r := range rows {
		byWorkload[r.Result.Workload] = append(byWorkload[r.Result.Workload], r)
	}
	var written []string
	names := make([]string, 0, len(byWorkload))
	for w := range byWorkload {
		names = append(names, w)
	}
	sort.Strings(names)
	for _, w := range names {
		f, err := plotCDF(dir, w, byWorkload[w])
		if err != nil {
			return written, err
		}
		written = append(written, f)
		f, err = plotThroughputLatency(dir, w, byWorkload[w])
		if err != nil {
			return written, err
		}
		if f != "" {
			written = append(written, f)
		}
	}
	return written, nil
}

// tailX maps a percentile to the "nines" axis: 90 → 1, 99 → 2, 99.9 → 3, so the tail,
// where systems differ, gets most of the width.
func tailX(p float64) float64 {
	if p >= 100 {
		p = 99.9999
	}
	return -math.Log10(1 - p/100)
}

func plotCDF(dir, workload string, rows []row) (string, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("YCSB %s: latency by percentile (first run; closed loop unless noted; with >4 systems, the largest client count)", strings.ToUpper(workload))
	p.X.Label.Text = "percentile (nines: 1 = p90, 2 = p99, 3 = p99.9)"
	p.Y.Label.Text = "latency (µs, log)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	// Many systems: only the largest client count, or the legend outgrows the plot.
	maxClients, systems := 0, map[string]bool{}
	for _, r := range rows {
		maxClients = max(maxClients, r.Result.Clients)
		systems[r.System] = true
	}
	var lines []any
	for _, r := range rows {
		if r.Run != 1 || (len(systems) > 4 && r.Result.Clients != maxClients) {
			continue
		}
		for _, op := range r.Result.PerOp {
			var pts plotter.XYs
			for _, q := range op.CDF {
				if q.Us > 0 {
					pts = append(pts, plotter.XY{X: tailX(q.Percentile), Y: q.Us})
				}
			}
			if len(pts) == 0 {
				continue
			}
			label := fmt.Sprintf("%s %s c=%d", r.System, op.Op, r.Result.Clients)
			if r.Result.Mode == "open" {
				label += fmt.Sprintf(" @%.0f/s", r.Result.Target)
			}
			lines = append(lines, label, pts)
		}
	}
	if len(lines) == 0 {
		return "", fmt.Errorf("workload %s: no latency data (JSON written before CDFs were recorded?)", workload)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "cdf-"+workload+".png")
	return out, p.Save(10*vg.Inch, 7*vg.Inch, out)
}

// plotThroughputLatency plots p99 against achieved throughput: one curve per system
// and client count over open-loop targets, or, without open-loop runs, one curve per
// system over its closed-loop client counts (more clients: more throughput, until the
// system saturates and only latency grows).
func plotThroughputLatency(dir, workload string, rows []row) (string, error) {
	type key struct {
		sys     string
		clients int
	}
	open := false
	for _, r := range rows {
		open = open || r.Result.Mode == "open"
	}
	curves := map[key]plotter.XYs{}
	var order []key
	for _, r := range rows {
		if r.Run != 1 || (r.Result.Mode == "open") != open || len(r.Result.PerOp) == 0 {
			continue
		}
		k := key{r.System, r.Result.Clients}
		if !open {
			k.clients = 0
		}
		if curves[k] == nil {
			order = append(order, k)
		}
		curves[k] = append(curves[k], plotter.XY{X: r.Result.Throughput, Y: r.Result.PerOp[0].P99Us})
	}
	var lines []any
	for _, k := range order {
		if len(curves[k]) < 2 {
			continue
		}
		sort.Slice(curves[k], func(i, j int) bool { return curves[k][i].X < curves[k][j].X })
		label := k.sys
		if open {
			label += fmt.Sprintf(" c=%d", k.clients)
		}
		lines = append(lines, label, curves[k])
	}
	if len(lines) == 0 {
		return "", nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("YCSB %s: p99 of the first operation type vs achieved throughput (%s)", strings.ToUpper(workload),
		map[bool]string{true: "open loop, one point per target rate", false: "closed loop, one point per client count"}[open])
	p.X.Label.Text = "achieved throughput (ops/s)"
	p.Y.Label.Text = "p99 latency (µs, log)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "throughput-latency-"+workload+".png")
	return out, p.Save(10*vg.Inch, 7*vg.Inch, out)
}
