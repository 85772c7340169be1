// Command chainjoin summarises bench/chain-join.sh's runs (A2/A3, issue 30):
// per run, the throughput before, during and after a member's join from
// kefir bench's 1-second timeline, the longest stall an operation saw, and a
// plot of every run's throughput relative to its level before the join.
//
//	go run ./chainjoin -md table.md -plot join.svg run-*.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kefirdb/kefir/bench/stats"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// run is one file chain-join.sh wrote: the events of the join and kefir
// bench's JSON report.
type run struct {
	Round      int     `json:"round"`
	Level      string  `json:"level"`
	Target     float64 `json:"target_rate"`
	Max        float64 `json:"max_rate"`
	Load       string  `json:"load_avg"`
	Killed     float64 `json:"killed_unix"`
	JoinStart  float64 `json:"join_start_unix"`
	JoinEnd    float64 `json:"join_end_unix"`
	MasterJoin string  `json:"master_joining"`
	Snapshot   string  `json:"snapshot_restored"`
	// CPU: [unix time, "1".."3" or "client", CPU ticks so far] samples,
	// every 0.5 s, of each member's process and kefir bench's.
	ClkTck float64              `json:"clk_tck"`
	CPU    [][3]json.RawMessage `json:"cpu"`
	Bench  struct {
		Run struct {
			Ops        int64   `json:"ops"`
			Errors     int64   `json:"errors"`
			Throughput float64 `json:"ops_per_sec"`
			PerOp      []struct {
				Op    string  `json:"op"`
				P999  float64 `json:"p999_us"`
				MaxUs float64 `json:"max_us"`
			} `json:"per_op"`
		} `json:"run"`
		Timeline []bucket `json:"timeline"`
	} `json:"bench"`
	file string
}

type bucket struct {
	End     float64 `json:"end_unix"`
	Seconds float64 `json:"seconds"`
	Ops     int64   `json:"ops"`
	Rate    float64 `json:"ops_per_sec"`
}

// summary is a run's figures.
type summary struct {
	join     float64 // seconds from n2's start to its "normal"
	snapshot float64 // seconds from n2's start to its restored snapshot (0: none logged)
	// The 1-second buckets before the join (the chain of two left by the
	// kill), overlapping it (up to settle after its end), and after that
	// (the chain of three again).
	before, during, after []float64
	medBefore, medAfter   float64
	minDuring             float64
	ratioMin              float64 // minDuring ÷ medBefore
	// ratioAfter: medAfter ÷ what the run should do without a join: the
	// offered rate (open loop), or the chain of three's maximum measured at
	// the start of the round (closed loop).
	ratioAfter float64
	// stallMs: the longest run of the timeline's fine buckets (100 ms) with
	// no operation completed, from the join's start to settle after its end.
	stallMs          float64
	maxLatMs, p999Ms float64
}

// seconds folds the timeline's buckets (chain-join.sh asks for 100 ms) into
// 1-second ones, as many fine buckets each as make a second.
func seconds(tl []bucket) []bucket {
	if len(tl) == 0 {
		return nil
	}
	n := max(1, int(math.Round(1/tl[0].Seconds)))
	var out []bucket
	for i := 0; i+n <= len(tl); i += n {
		b := bucket{End: tl[i+n-1].End}
		for _, f := range tl[i : i+n] {
			b.Seconds += f.Seconds
			b.Ops += f.Ops
		}
		b.Rate = float64(b.Ops) / b.Seconds
		out = append(out, b)
	}
	return out
}

// settle is how long after the joiner reports "normal" the join still counts:
// the FLUSH that ends it makes the head fail its writes in flight and close
// those clients' connections (docs/design/chain.md, "Joins under load"), and
// the clients' reconnections and retries land in the next second or two.
const settle = 2.0

// summarise splits the 1-second timeline: a bucket is "during" if it
// overlaps the join (to settle seconds after its end) at all, so a dip
// anywhere in it counts against it.
func summarise(r *run) summary {
	var s summary
	s.join = r.JoinEnd - r.JoinStart
	if t, err := time.Parse(time.RFC3339Nano, r.Snapshot); err == nil {
		s.snapshot = float64(t.UnixMicro())/1e6 - r.JoinStart
	}
	for _, b := range seconds(r.Bench.Timeline) {
		start := b.End - b.Seconds
		switch {
		case b.End <= r.JoinStart:
			s.before = append(s.before, b.Rate)
		case start >= r.JoinEnd+settle:
			s.after = append(s.after, b.Rate)
		default:
			s.during = append(s.during, b.Rate)
		}
	}
	// No second of a phase: NaN, so its ratio reads NaN, not a 0 or an infinity.
	s.medBefore, s.medAfter = math.NaN(), math.NaN()
	if len(s.before) > 0 {
		s.medBefore = stats.Median(s.before)
	}
	if len(s.after) > 0 {
		s.medAfter = stats.Median(s.after)
	}
	s.minDuring = math.NaN()
	if len(s.during) > 0 {
		s.minDuring = slices.Min(s.during)
	}
	expect := r.Max
	if r.Target > 0 {
		expect = r.Target
	}
	s.ratioMin, s.ratioAfter = s.minDuring/s.medBefore, s.medAfter/expect
	run := 0.0
	for _, b := range r.Bench.Timeline {
		if b.End <= r.JoinStart || b.End-b.Seconds >= r.JoinEnd+settle {
			continue
		}
		if b.Ops == 0 {
			run += b.Seconds
			s.stallMs = math.Max(s.stallMs, run*1e3)
		} else {
			run = 0
		}
	}
	for _, op := range r.Bench.Run.PerOp {
		s.maxLatMs = math.Max(s.maxLatMs, op.MaxUs/1e3)
		s.p999Ms = math.Max(s.p999Ms, op.P999/1e3)
	}
	return s
}

// cpuCores is each process's CPU use, in cores, over [from, to]: the first
// and last samples inside it. A process restarted in the window (the
// joiner) counts from its first sample.
func cpuCores(r *run, from, to float64) map[string]float64 {
	type sample struct{ t, ticks float64 }
	first, last := map[string]sample{}, map[string]sample{}
	for _, c := range r.CPU {
		var t, ticks float64
		var name string
		if json.Unmarshal(c[0], &t) != nil || json.Unmarshal(c[1], &name) != nil || json.Unmarshal(c[2], &ticks) != nil {
			continue
		}
		if t < from || t > to {
			continue
		}
		if f, ok := first[name]; !ok || ticks < f.ticks {
			first[name] = sample{t, ticks} // a restarted process counts from 0 again
		}
		last[name] = sample{t, ticks}
	}
	out := map[string]float64{}
	for name, f := range first {
		l := last[name]
		if l.t > f.t && r.ClkTck > 0 {
			out[name] = (l.ticks - f.ticks) / r.ClkTck / (l.t - f.t)
		}
	}
	return out
}

// cpuCell prints each process's CPU before the join and during it.
func cpuCell(r *run) string {
	if len(r.CPU) == 0 {
		return "not sampled"
	}
	before := cpuCores(r, r.JoinStart-8, r.JoinStart)
	during := cpuCores(r, r.JoinStart, r.JoinEnd+settle)
	var parts []string
	for _, n := range []string{"1", "2", "3", "client"} {
		name := n
		if n != "client" {
			name = "n" + n
		}
		b, d := "–", "–"
		if v, ok := before[n]; ok {
			b = fmt.Sprintf("%.2f", v)
		}
		if v, ok := during[n]; ok {
			d = fmt.Sprintf("%.2f", v)
		}
		parts = append(parts, fmt.Sprintf("%s %s→%s", name, b, d))
	}
	return strings.Join(parts, ", ")
}

func levelName(r *run) string {
	if r.Level == "low" {
		return fmt.Sprintf("%.0f %% (open loop, %.0f ops/s)", 100*r.Target/r.Max, r.Target)
	}
	return "max (closed loop)"
}

func writeTable(w io.Writer, runs []*run) {
	fmt.Fprintln(w, "| Round | Level | Load avg (1/5/15 min) | Join (snapshot restored at) | Before, R=2: median ops/s | During (to 2 s after): min 1-s bucket (buckets) | **min ÷ before** | Longest stall (no op in 100 ms buckets) | After, R=3: median | after ÷ expected (the rate; R=3's max) | Longest op in the run (p99.9) | CPU in cores, before → during the join |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range runs {
		s := summarise(r)
		snap := "none logged"
		if s.snapshot > 0 {
			snap = fmt.Sprintf("%.1f s", s.snapshot)
		}
		stall := "none"
		if s.stallMs > 0 {
			stall = fmt.Sprintf("%.0f ms", s.stallMs)
		}
		fmt.Fprintf(w, "| %d | %s | %s | %.1f s (%s) | %.0f | %.0f (%d) | **%.2f** | %s | %.0f | %.2f | %.0f ms (%.0f ms) | %s |\n",
			r.Round, levelName(r), r.Load, s.join, snap, s.medBefore, s.minDuring, len(s.during), s.ratioMin,
			stall, s.medAfter, s.ratioAfter, s.maxLatMs, s.p999Ms, cpuCell(r))
	}
}

// plotRuns draws two panels, the open-loop level's runs and the maximum's,
// each run's 1-second buckets in ops/s against the time since its member was
// started (the join's start, a black line at 0), a line per round (later
// rounds dashed), a vertical mark in the run's colour where its join ended.
// Absolute ops/s, not a ratio: at the maximum the chain is of two before the
// join and of three after it, so no one baseline fits the whole run.
func plotRuns(out string, runs []*run) error {
	var panels []*plot.Plot
	for _, level := range []string{"low", "max"} {
		p := plot.New()
		p.X.Label.Text = "seconds since the member was started (the join began at 0)"
		p.Y.Label.Text = "ops/s in the second"
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(9)
		top := 0.0
		i := 0
		for _, r := range runs {
			if r.Level != level {
				continue
			}
			s := summarise(r)
			var pts plotter.XYs
			for _, b := range seconds(r.Bench.Timeline) {
				pts = append(pts, plotter.XY{X: b.End - b.Seconds/2 - r.JoinStart, Y: b.Rate})
				top = math.Max(top, b.Rate)
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color = palette[i%len(palette)]
			l.Width = vg.Points(1.5)
			if i > 0 {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(2 + float64(i))}
			}
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("round %d: join %.1f s, min ÷ before %.2f, load %s", r.Round, s.join, s.ratioMin,
				strings.Fields(r.Load)[0]), l)
			end, err := plotter.NewLine(plotter.XYs{{X: s.join, Y: 0}, {X: s.join, Y: top * 1.1}})
			if err != nil {
				return err
			}
			end.Color, end.Dashes, end.Width = l.Color, l.Dashes, vg.Points(0.8)
			p.Add(end)
			if level == "low" {
				p.Title.Text = fmt.Sprintf("open loop at ~%.0f %% of the chain's maximum (rounds: %s)", 100*r.Target/r.Max, rates(runs, level))
			} else {
				p.Title.Text = "closed loop, 32 clients: the maximum (a chain of two before the join, of three after)"
			}
			i++
		}
		start, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 0, Y: top * 1.1}})
		if err != nil {
			return err
		}
		start.Color = color.Black
		p.Add(start)
		p.Y.Min = 0
		panels = append(panels, p)
	}
	const w, h = 10 * vg.Inch, 9 * vg.Inch
	c, err := draw.NewFormattedCanvas(w, h, strings.TrimPrefix(filepath.Ext(out), "."))
	if err != nil {
		return err
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(18), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
	canvases := plot.Align([][]*plot.Plot{{panels[0]}, {panels[1]}}, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 255},
}

// rates lists the open-loop runs' offered rates, for a panel's title.
func rates(runs []*run, level string) string {
	var out []string
	for _, r := range runs {
		if r.Level == level {
			out = append(out, fmt.Sprintf("%.0f", r.Target))
		}
	}
	return strings.Join(out, ", ") + " ops/s"
}

func main() {
	md := flag.String("md", "", "write the table (Markdown) here; default stdout")
	plotOut := flag.String("plot", "", "write the plot here (.svg or .png, by the extension)")
	flag.Parse()
	var runs []*run
	for _, f := range flag.Args() {
		b, err := os.ReadFile(f)
		if err != nil {
			fail(err)
		}
		r := &run{file: f}
		if err := json.Unmarshal(b, r); err != nil {
			fail(fmt.Errorf("%s: %w", f, err))
		}
		if r.JoinEnd <= r.JoinStart || len(r.Bench.Timeline) == 0 {
			fail(fmt.Errorf("%s: no join end or no timeline", f))
		}
		runs = append(runs, r)
	}
	if len(runs) == 0 {
		fail(fmt.Errorf("no run files given"))
	}
	sort.SliceStable(runs, func(i, j int) bool {
		if runs[i].Level != runs[j].Level {
			return runs[i].Level == "low"
		}
		return runs[i].Round < runs[j].Round
	})
	var sb strings.Builder
	writeTable(&sb, runs)
	if *md == "" {
		fmt.Print(sb.String())
	} else if err := os.WriteFile(*md, []byte(sb.String()), 0o644); err != nil {
		fail(err)
	} else {
		fmt.Print(sb.String())
	}
	if *plotOut != "" {
		if err := plotRuns(*plotOut, runs); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "chainjoin:", err)
	os.Exit(1)
}
