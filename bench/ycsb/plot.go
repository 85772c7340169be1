package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/bench/stats"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
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

// plotAll writes, per workload, a bar chart of throughput (one bar per system: the median
// of its rounds, with the lowest and highest round as the error bar), latency CDFs with at
// most maxLinesPerPanel lines per panel (systems a reader compares share a file, one panel
// per operation type, the legend beside the panels), and, where open-loop runs at several
// targets exist, a throughput–latency curve (p99 against achieved throughput).
func plotAll(dir string, rows []row) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	byWorkload := map[string][]row{}
	for _, r := range rows {
		if r.Result == nil {
			continue
		}
		byWorkload[r.Result.Workload] = append(byWorkload[r.Result.Workload], r)
	}
	var written []string
	names := make([]string, 0, len(byWorkload))
	for w := range byWorkload {
		names = append(names, w)
	}
	sort.Strings(names)
	for _, w := range names {
		f, err := plotThroughputBars(dir, w, byWorkload[w])
		if err != nil {
			return written, err
		}
		if f != "" {
			written = append(written, f)
		}
		fs, err := plotCDFs(dir, w, byWorkload[w])
		written = append(written, fs...)
		if err != nil {
			return written, err
		}
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

// percentileTicks labels the tailX axis in percentiles rather than nines.
type percentileTicks struct{}

func (percentileTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, t := range []struct {
		p     float64
		label string
	}{{0, "p0"}, {50, "p50"}, {90, "p90"}, {99, "p99"}, {99.9, "p99.9"}, {99.99, "p99.99"}, {99.999, "p99.999"}} {
		if x := tailX(t.p); x >= lo && x <= hi {
			ticks = append(ticks, plot.Tick{Value: x, Label: t.label})
		}
	}
	return ticks
}

// latencyTicks labels a log latency axis at 1, 2 and 5 per decade: plot.LogTicks labels
// only powers of ten, which leaves a plot spanning 1.5–80 ms with a single number.
type latencyTicks struct{}

func (latencyTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := m * d; v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
			}
		}
	}
	return ticks
}

// throughputBar is one system's throughput in one cell: the median of its rounds and the
// lowest and highest round, which is what the round spread of the tables is made of.
type throughputBar struct {
	System           string
	Median, Min, Max float64
	Rounds           int
}

// throughputBars reduces a workload's closed-loop rows at its largest client count to one
// bar per system, in order of first appearance. Open-loop rows are left out: their
// throughput is the target they were given.
func throughputBars(rows []row) []throughputBar {
	maxClients := 0
	for _, r := range rows {
		if r.Result.Mode != "open" {
			maxClients = max(maxClients, r.Result.Clients)
		}
	}
	var order []string
	tput := map[string][]float64{}
	for _, r := range rows {
		if r.Result.Mode == "open" || r.Result.Clients != maxClients {
			continue
		}
		if _, ok := tput[r.System]; !ok {
			order = append(order, r.System)
		}
		tput[r.System] = append(tput[r.System], r.Result.Throughput)
	}
	bars := make([]throughputBar, 0, len(order))
	for _, sys := range order {
		xs := tput[sys]
		bars = append(bars, throughputBar{System: sys, Median: stats.Median(xs), Min: slices.Min(xs), Max: slices.Max(xs), Rounds: len(xs)})
	}
	return bars
}

// plotThroughputBars draws throughputBars as horizontal bars (the system names are long),
// the first system at the top, each labelled with its median and round spread.
func plotThroughputBars(dir, workload string, rows []row) (string, error) {
	bars := throughputBars(rows)
	if len(bars) == 0 {
		return "", nil
	}
	n := len(bars)
	// Bottom to top, so the first system (the ceiling, in the standard matrix) is on top.
	vals := make(plotter.Values, n)
	xys := make(plotter.XYs, n)
	errs := make(plotter.XErrors, n)
	labels := make([]string, n)
	names := make([]string, n)
	rounds, clients, top := 0, 0, 0.0
	for i, b := range bars {
		y := n - 1 - i
		vals[y] = b.Median
		xys[y] = plotter.XY{X: b.Median, Y: float64(y)}
		errs[y] = struct{ Low, High float64 }{b.Median - b.Min, b.Max - b.Median}
		labels[y] = fmt.Sprintf("%.0f (spread %.0f%%)", b.Median, 100*(b.Max/b.Min-1))
		names[y] = b.System
		rounds = max(rounds, b.Rounds)
		top = max(top, b.Max)
	}
	for _, r := range rows {
		if r.Result.Mode != "open" {
			clients = max(clients, r.Result.Clients)
		}
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("YCSB %s, %d clients: total ops/s, median of %d round(s); error bar: lowest to highest round",
		strings.ToUpper(workload), clients, rounds)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "ops/s"
	p.X.Min, p.X.Max = 0, top*1.3 // room for the labels right of the bars
	bc, err := plotter.NewBarChart(vals, vg.Points(16))
	if err != nil {
		return "", err
	}
	bc.Horizontal = true
	bc.Color = plotutil.Color(0)
	bc.LineStyle.Width = 0
	eb, err := plotter.NewXErrorBars(struct {
		plotter.XYs
		plotter.XErrors
	}{xys, errs})
	if err != nil {
		return "", err
	}
	ends := make(plotter.XYs, n)
	for i := range xys {
		ends[i] = plotter.XY{X: xys[i].X + errs[i].High, Y: xys[i].Y}
	}
	lb, err := plotter.NewLabels(plotter.XYLabels{XYs: ends, Labels: labels})
	if err != nil {
		return "", err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].YAlign = -0.5 // vertically centred on the bar
	}
	lb.Offset = vg.Point{X: vg.Points(6)}
	p.Add(bc, eb, lb, plotter.NewGrid())
	p.NominalY(names...)
	out := filepath.Join(dir, "throughput-"+workload+".png")
	return out, p.Save(11*vg.Inch, vg.Length(1.2+0.38*float64(n))*vg.Inch, out)
}

// maxLinesPerPanel bounds a CDF panel: with more lines than this neither the lines nor the
// legend can be told apart (the standard matrix once drew 26 on one plot).
const maxLinesPerPanel = 6

// plotGroup names the CDF file a system's lines go to, so that systems a reader compares
// with each other share one: a single node against Redis, a replicated group against etcd
// and ZooKeeper, the harness ceilings on their own. The labels are compare.sh's.
func plotGroup(system string) string {
	switch {
	case strings.HasPrefix(system, "respserver"):
		return "ceiling"
	case strings.HasPrefix(system, "kefir-1-node"), strings.HasPrefix(system, "redis("):
		return "single-node"
	case strings.Contains(system, "3-replicas"), strings.HasPrefix(system, "etcd"), strings.HasPrefix(system, "zookeeper"):
		return "replicated"
	}
	return "other"
}

// cdfGroups splits a workload's first-round rows into the files plotCDFs writes: by
// plotGroup, in order of first appearance, and then into chunks of at most
// maxLinesPerPanel rows (each row is one line in each of its operations' panels). A file
// name is "" when one file holds every row.
func cdfGroups(workload string, rows []row) (names []string, groups [][]row) {
	first := map[string]int{} // the lowest round of each system (1 in every compare run)
	for _, r := range rows {
		if f, ok := first[r.System]; !ok || r.Run < f {
			first[r.System] = r.Run
		}
	}
	var order []string
	by := map[string][]row{}
	for _, r := range rows {
		if r.Run != first[r.System] || r.Unsupported != "" {
			continue // not the first round, or a system without the workload: no line, no legend entry
		}
		g := plotGroup(r.System)
		if _, ok := by[g]; !ok {
			order = append(order, g)
		}
		by[g] = append(by[g], r)
	}
	for _, g := range order {
		rs := by[g]
		for i := 0; i < len(rs); i += maxLinesPerPanel {
			name := "cdf-" + workload + "-" + g
			if len(rs) > maxLinesPerPanel {
				name += fmt.Sprintf("-%d", i/maxLinesPerPanel+1)
			}
			names = append(names, name)
			groups = append(groups, rs[i:min(i+maxLinesPerPanel, len(rs))])
		}
	}
	if len(groups) == 1 {
		names[0] = "cdf-" + workload
	}
	return names, groups
}

// plotCDFs writes one PNG per cdfGroups entry: a panel per operation type, one line per
// row, the same colour and dash for a row in every panel, and the legend to the right of
// the panels, off the data.
func plotCDFs(dir, workload string, rows []row) ([]string, error) {
	var written []string
	names, groups := cdfGroups(workload, rows)
	for gi, group := range groups {
		var ops []string // in order of first appearance
		for _, r := range group {
			for _, op := range r.Result.PerOp {
				if !slices.Contains(ops, op.Op) {
					ops = append(ops, op.Op)
				}
			}
		}
		leg := plot.NewLegend()
		leg.Top, leg.Left = true, true
		var panels []*plot.Plot
		for _, opName := range ops {
			p := plot.New()
			p.Title.Text = fmt.Sprintf("YCSB %s %s latency (first round)", strings.ToUpper(workload), opName)
			p.X.Label.Text = "percentile (log scale of 1 − p: the tail gets the width)"
			p.X.Tick.Marker = percentileTicks{}
			p.Y.Label.Text = "latency (µs, log)"
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = latencyTicks{}
			p.Add(plotter.NewGrid())
			lines := 0
			for i, r := range group {
				for _, op := range r.Result.PerOp {
					if op.Op != opName {
						continue
					}
					var pts plotter.XYs
					for _, q := range op.CDF {
						if q.Us > 0 {
							pts = append(pts, plotter.XY{X: tailX(q.Percentile), Y: q.Us})
						}
					}
					if len(pts) == 0 {
						continue
					}
					l, err := plotter.NewLine(pts)
					if err != nil {
						return written, err
					}
					l.Color = plotutil.Color(i)
					l.Dashes = plotutil.Dashes(i)
					l.Width = vg.Points(2)
					p.Add(l)
					lines++
				}
			}
			if lines > 0 {
				panels = append(panels, p)
			}
		}
		if len(panels) == 0 {
			continue
		}
		for i, r := range group {
			label := fmt.Sprintf("%s c=%d", r.System, r.Result.Clients)
			if r.Result.Mode == "open" {
				label += fmt.Sprintf(" @%.0f/s", r.Result.Target)
			}
			l := &plotter.Line{LineStyle: plotter.DefaultLineStyle}
			l.Color, l.Dashes, l.Width = plotutil.Color(i), plotutil.Dashes(i), vg.Points(2)
			leg.Add(label, l)
		}
		out := filepath.Join(dir, names[gi]+".png")
		if err := savePanels(out, panels, leg); err != nil {
			return written, err
		}
		written = append(written, out)
	}
	if len(written) == 0 {
		return nil, fmt.Errorf("workload %s: no latency data (JSON written before CDFs were recorded?)", workload)
	}
	return written, nil
}

// savePanels lays the panels out side by side with the legend in a column of its own on
// the right, and writes the PNG.
func savePanels(out string, panels []*plot.Plot, leg plot.Legend) error {
	const panelW, legendW, h = 6.5, 4.0, 5.0
	w := vg.Length(panelW*float64(len(panels))+legendW) * vg.Inch
	img := vgimg.New(w, h*vg.Inch)
	dc := draw.New(img)
	plotsArea := draw.Crop(dc, 0, -legendW*vg.Inch, 0, 0)
	legendArea := draw.Crop(dc, w-legendW*vg.Inch+vg.Points(12), 0, 0, -vg.Points(30))
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Points(18), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, plotsArea)
	for i, p := range panels {
		p.Draw(canvases[0][i])
	}
	leg.Draw(legendArea)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
