package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// The matrix mode (-matrix FILE -rounds N) drives every system of the comparison from
// one process, interleaved at the finest grain: for each round, workload and client
// count, every system runs that cell once, back to back (in an order rotated each round),
// before the next cell starts. A system's cell is then measured within seconds of the
// same cell on every other system, so a burst of load from elsewhere on a shared machine
// hits the cell of every system rather than all cells of one; the median over rounds
// (-summarize) then discards the bursts. One process also spares each round the start-up
// of a process, a client library and its connections per system.

// matrixSystem is one line of the matrix file: a connected system and its flags.
type matrixSystem struct {
	f    *flags
	sys  *system
	cost *costMeter
}

// readMatrix parses the matrix file: one system per line, given as the ycsb flags that
// would measure it alone (blank lines and lines starting with # are ignored). Every line
// must ask for the same workloads, client counts, warm-up and duration: those are the
// cells, and a cell means the same thing for every system.
func readMatrix(r io.Reader) ([]*flags, error) {
	var out []*flags
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f, err := parse(strings.Fields(line))
		if err != nil {
			return nil, fmt.Errorf("matrix line %d: %w", n, err)
		}
		if f.label == "" {
			return nil, fmt.Errorf("matrix line %d: every system needs a -label", n)
		}
		if len(out) > 0 {
			a := out[0]
			if !slices.Equal(a.workloads, f.workloads) || !slices.Equal(a.clients, f.clients) || !slices.Equal(a.targets, f.targets) ||
				a.warmup != f.warmup || a.dur != f.dur || a.records != f.records || a.valueSize != f.valueSize {
				return nil, fmt.Errorf("matrix line %d (%s): workloads, clients, targets, records, value size, warm-up and duration must match line 1's", n, f.label)
			}
			for _, o := range out {
				if o.label == f.label {
					return nil, fmt.Errorf("matrix line %d: label %q used twice", n, f.label)
				}
			}
		}
		out = append(out, f)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("matrix file lists no system")
	}
	return out, nil
}

// cellTimeout bounds one system's cell: a system that stops answering costs the matrix
// this much, not the rest of the run.
func cellTimeout(f *flags) time.Duration { return f.warmup + f.dur + 30*time.Second }

// runMatrix connects every system, loads those whose line asks for it (each load fills
// the key space every workload uses), warms every system up for prewarm per workload,
// and measures rounds × workloads × clients × targets, systems interleaved. A system that fails to connect or load is dropped, and a cell that
// fails is left out; both are returned as failures, never hidden.
// matrixOpts are the matrix mode's settings (see the flags of the same names).
type matrixOpts struct {
	rounds          int
	prewarm         time.Duration
	seed            uint64
	watchPids       []int   // the systems' servers, for the CPU watch; nil: no watch
	disturbed       float64 // cores of other CPU above which a cell is measured again
	remeasure       int     // extra measurements of one cell at most
	remeasureBudget int     // extra measurements over the matrix at most
	quiesce         time.Duration
}

func runMatrix(ctx context.Context, path string, o matrixOpts, logw io.Writer) ([]row, []string, error) {
	rounds, prewarm, seed := o.rounds, o.prewarm, o.seed
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	fl, err := readMatrix(fh)
	fh.Close()
	if err != nil {
		return nil, nil, err
	}
	if rounds < 1 {
		return nil, nil, fmt.Errorf("-rounds %d: want at least 1", rounds)
	}
	var failures []string
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		failures = append(failures, msg)
		fmt.Fprintln(logw, "FAILED:", msg)
	}
	var systems []matrixSystem
	defer func() {
		for _, s := range systems {
			s.sys.close()
		}
	}()
	ws, _, err := workloadsOf(fl[0])
	if err != nil {
		return nil, nil, err
	}
	for _, f := range fl {
		fws, index, err := workloadsOf(f)
		if err != nil {
			return nil, failures, err
		}
		sys, err := open(ctx, f, index)
		if err != nil {
			fail("%s: connect: %v", f.label, err)
			continue
		}
		// The in-process server starts empty in every process, so it always loads.
		if f.load || f.db == "respserver" {
			if err := load(ctx, f, sys, fws[0], logw); err != nil {
				fail("%s: %v", f.label, err)
				sys.close()
				continue
			}
		}
		meter, err := costMeterOf(f)
		if err != nil {
			sys.close()
			return nil, failures, fmt.Errorf("%s: %w", f.label, err)
		}
		systems = append(systems, matrixSystem{f: f, sys: sys, cost: meter})
	}
	if len(systems) == 0 {
		return nil, failures, errors.New("no system could be connected and loaded")
	}
	var rows []row
	f0 := fl[0]
	watch := &cpuWatch{pids: o.watchPids}
	cells := &cellMeasurer{o: o, watch: watch, budget: o.remeasureBudget, cellTimeout: cellTimeout(f0), logw: logw}
	// A fixed warm-up pass before round 1: every system runs every workload once at the
	// largest client count, unmeasured. Without it the first round (and so the first of
	// two back-to-back matrices) pays what only a cold system pays — a JVM's JIT
	// (ZooKeeper), first-touch page faults and cache fills, Go heaps growing to their
	// steady size — and differs from the second for that reason alone.
	if prewarm > 0 {
		fmt.Fprintf(logw, "prewarm: %v per system and workload: %s\n", prewarm, loadAverage())
		for _, w := range ws {
			for _, s := range systems {
				if w.HasScans() && s.sys.noScans {
					continue
				}
				cfg := ycsb.Config{Clients: slices.Max(f0.clients), Duration: prewarm, Seed: seed}
				cctx, cancel := context.WithTimeout(ctx, prewarm+30*time.Second)
				_, err := ycsb.Run(cctx, w, s.sys.newDB, cfg)
				cancel()
				if ctx.Err() != nil {
					return nil, failures, ctx.Err()
				}
				if err != nil {
					// Not a failure of the matrix: the measured rounds will say.
					fmt.Fprintf(logw, "prewarm %s workload %s: %v\n", s.sys.name, w.Name, err)
				}
			}
		}
	}
	for r := 1; r <= rounds; r++ {
		fmt.Fprintf(logw, "round %d of %d: %s\n", r, rounds, loadAverage())
		for _, w := range ws {
			for _, c := range f0.clients {
				for _, t := range f0.targets {
					for i := range systems {
						// Rotate who goes first, so no system always runs right after
						// the same neighbour (or first, on a cold cache).
						s := systems[(i+r-1)%len(systems)]
						if w.HasScans() && s.sys.noScans {
							continue
						}
						cfg := ycsb.Config{Clients: c, Target: t, Warmup: f0.warmup, Duration: f0.dur, Seed: seed + uint64(r)}
						res, cost, other, attempts, err := cells.measure(ctx, w, s, cfg, r)
						if ctx.Err() != nil {
							return rows, failures, ctx.Err()
						}
						if err != nil {
							fail("%s: round %d workload %s clients %d: %v", s.sys.name, r, w.Name, c, err)
						}
						if res == nil {
							continue
						}
						rw := row{System: s.sys.name, Durable: s.sys.durable, Delay: s.f.delay, LinkDelay: s.f.linkDelay, Run: r, Result: res, Cost: cost}
						if watch.pids != nil {
							rw.OtherCPUCores, rw.Attempts = other, attempts
						}
						rows = append(rows, rw)
						fmt.Fprintln(logw, benchLine(s.sys.name, res))
					}
				}
			}
		}
	}
	// Workloads a system cannot run are reported, after the measured rows.
	for _, w := range ws {
		for _, s := range systems {
			if w.HasScans() && s.sys.noScans {
				fmt.Fprintf(logw, "%s: workload %s not run: the system has no range read\n", s.sys.name, w.Name)
				rows = append(rows, row{System: s.sys.name, Durable: s.sys.durable, Delay: s.f.delay, LinkDelay: s.f.linkDelay,
					Unsupported: "scans", Run: 1, Result: &ycsb.Result{Workload: w.Name, Phase: "run", Mode: "closed"}})
			}
		}
	}
	return rows, failures, nil
}

// loadAverage is /proc/loadavg's first three fields, for the log (the machine is shared).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	return "load average " + strings.Join(strings.Fields(string(b))[:3], " ")
}

// cellMeasurer runs the matrix's cells: before each measurement it waits quiesce, and
// while the CPU watch finds a measurement disturbed (other processes used more than
// disturbed cores) it measures the cell again, at most remeasure times per cell and
// budget times per matrix, keeping the least disturbed measurement.
type cellMeasurer struct {
	o           matrixOpts
	watch       *cpuWatch
	budget      int // extra measurements left in this matrix
	cellTimeout time.Duration
	logw        io.Writer
}

// measure returns the kept result (nil if no attempt succeeded) and its cost per
// operation, the other processes' CPU while it ran, how many attempts the cell took, and
// the error of the attempt that failed, if one did (after which the cell is not measured
// again). It returns early when ctx ends; the caller checks ctx.
func (m *cellMeasurer) measure(ctx context.Context, w ycsb.Workload, s matrixSystem, cfg ycsb.Config, round int) (res *ycsb.Result, cost *Cost, other float64, attempts int, err error) {
	if s.cost != nil {
		cfg.Window = s.cost.window
	}
	for {
		if m.o.quiesce > 0 {
			time.Sleep(m.o.quiesce)
		}
		before := m.watch.sample()
		cctx, cancel := context.WithTimeout(ctx, m.cellTimeout)
		got, runErr := ycsb.Run(cctx, w, s.sys.newDB, cfg)
		cancel()
		after := m.watch.sample()
		if ctx.Err() != nil {
			return res, cost, other, attempts, ctx.Err()
		}
		attempts++
		if runErr != nil {
			return res, cost, other, attempts, runErr
		}
		cores, ok := otherCores(before, after)
		if res == nil || cores < other {
			res, other = got, cores
			if s.cost != nil {
				cost = s.cost.cost(got)
			}
		}
		if !ok || m.watch.pids == nil || cores <= m.o.disturbed {
			return res, cost, other, attempts, nil
		}
		if attempts > m.o.remeasure || m.budget <= 0 {
			fmt.Fprintf(m.logw, "%s: round %d workload %s: other processes used %.2f cores; not measured again (%d attempts, budget %d left)\n",
				s.sys.name, round, w.Name, cores, attempts, m.budget)
			return res, cost, other, attempts, nil
		}
		m.budget--
		fmt.Fprintf(m.logw, "%s: round %d workload %s: other processes used %.2f cores (> %.2f): measuring again\n",
			s.sys.name, round, w.Name, cores, m.o.disturbed)
	}
}
