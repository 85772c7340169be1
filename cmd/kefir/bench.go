package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/ycsb"
	"github.com/kefirdb/kefir/internal/ycsb/kefirdb"
)

// benchFlags are kefir bench's options, parsed and checked by parseBenchFlags.
type benchFlags struct {
	addrs                   []string
	password                string
	workload                ycsb.Workload
	clients, pool           int
	duration, warmup        time.Duration
	rate                    float64
	load                    bool
	consistency, durability string
	cons                    client.Consistency
	dur                     client.Durability
	json, tls, insecure     bool
	chainReads              bool
	seed                    uint64
	progress                bool
	interval                time.Duration
	cluster                 string
}

const benchUsage = `Usage: kefir bench [options]

Runs a YCSB workload against a running Kefir node or replica group with Kefir's Go
client, prints a progress line every second (ops/s in that second, p50 and p99 of
the run so far) on stderr, then throughput and latency percentiles per operation
type on stdout (HDR-style histograms: every percentile within 0.1 % of the true
latency), or JSON with --json (with the run's timeline: each progress bucket, dated).

Workloads (YCSB's core workloads, zipfian θ = 0.99 unless said):
  a  50% read, 50% update               b  95% read, 5% update
  c  100% read                          d  95% read latest, 5% insert
  e  95% scan (1–100 keys), 5% insert   f  50% read, 50% read-modify-write
  w  100% update
Records are keys "user<hash>" with --value-size byte values; the run phase reads
and updates the records [0, --records), so load them first (--load, once) or
reads count as "not found".

Latency is measured from when each operation was due (open loop, --rate) or sent
(closed loop, each client sends its next operation when the previous one
returns). A rate above ~10k ops/s per client is not paced reliably: raise --clients.

Examples:
  kefir bench --load --workload a --clients 16 --duration 30s
  kefir bench --addr 127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382 --workload w --durability cad
  kefir bench --workload c --consistency session --rate 5000 --json

Options:
`

func parseBenchFlags(args []string, getenv func(string) string, stderr io.Writer) (*benchFlags, error) {
	f := &benchFlags{}
	fs := flag.NewFlagSet("kefir bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := getenv("KEFIR_ADDR")
	if def == "" {
		def = "127.0.0.1:6380"
	}
	addr := fs.String("addr", def, "node client addresses, comma-separated: one node, or every member of a group (env KEFIR_ADDR)")
	fs.StringVar(&f.password, "password", "", "password (env KEFIR_PASSWORD)")
	workload := fs.String("workload", "a", "YCSB workload: a, b, c, d, e, f or w")
	fs.IntVar(&f.clients, "clients", 16, "concurrent clients (each one operation at a time)")
	fs.IntVar(&f.pool, "pool", 4, "client connections the clients share (the Go client pipelines calls over them)")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "measured time")
	fs.DurationVar(&f.warmup, "warmup", 0, "time to run before measuring (not recorded)")
	records := fs.Uint64("records", 100_000, "records the workload reads and updates (and --load inserts)")
	valueSize := fs.Int("value-size", 1000, "bytes per value")
	fs.BoolVar(&f.load, "load", false, "insert the records before the run (YCSB's load phase, at --durability)")
	fs.StringVar(&f.consistency, "consistency", "", "read consistency (linearizable, cross-client-monotonic, session, bounded(N), bounded(DURATION), eventual); empty: the server's default")
	fs.StringVar(&f.durability, "durability", "", "write durability (sync, cad, async); empty: the server's default")
	fs.Float64Var(&f.rate, "rate", 0, "total offered operations per second (open loop); 0: closed loop, as fast as the clients go")
	fs.StringVar(&f.cluster, "cluster", "auto", "route calls by key slot to each group's leader: auto (when the node is of a cluster of several groups), on, off (send them to --addr, whose nodes forward)")
	fs.BoolVar(&f.chainReads, "chain-reads", false, "spread strong reads (linearizable, bounded, the server's default) over every --addr too: a chain group's members, each serving them (CRAQ)")
	fs.BoolVar(&f.json, "json", false, "print the result as JSON on stdout")
	fs.BoolVar(&f.tls, "tls", false, "connect with TLS")
	fs.BoolVar(&f.insecure, "tls-insecure", false, "with --tls, do not verify the server certificate")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the key and operation choices")
	fs.BoolVar(&f.progress, "progress", true, "print a progress line every --interval on stderr")
	fs.DurationVar(&f.interval, "interval", time.Second, "width of a progress line's bucket, and of a --json timeline's")
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (every option is a --flag; see kefir bench --help)", fs.Arg(0))
	}
	if f.password == "" {
		f.password = getenv("KEFIR_PASSWORD")
	}
	for _, a := range strings.Split(*addr, ",") {
		a = strings.TrimSpace(a)
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf("--addr %q: want host:port[,host:port…]", *addr)
		}
		f.addrs = append(f.addrs, a)
	}
	w, err := ycsb.Standard(*workload)
	if err != nil {
		return nil, fmt.Errorf("--workload: %w", err)
	}
	switch {
	case f.clients < 1:
		return nil, fmt.Errorf("--clients %d: want at least 1", f.clients)
	case f.pool < 1:
		return nil, fmt.Errorf("--pool %d: want at least 1", f.pool)
	case f.duration <= 0:
		return nil, fmt.Errorf("--duration %v: want a positive duration", f.duration)
	case f.interval < time.Millisecond:
		return nil, fmt.Errorf("--interval %v: want at least 1ms", f.interval)
	case f.warmup < 0:
		return nil, fmt.Errorf("--warmup %v: want 0 or a positive duration", f.warmup)
	case *records < 1:
		return nil, errors.New("--records 0: want at least 1")
	case *valueSize < 1 || *valueSize > 64<<20:
		return nil, fmt.Errorf("--value-size %d: want 1 byte to 64 MiB", *valueSize)
	case f.rate < 0 || math.IsNaN(f.rate) || math.IsInf(f.rate, 0):
		return nil, fmt.Errorf("--rate %v: want 0 (closed loop) or a positive rate", f.rate)
	case f.rate > 0 && float64(f.clients)/f.rate*1e9 < 1:
		return nil, fmt.Errorf("--rate %v: beyond nanosecond pacing of %d clients", f.rate, f.clients)
	case f.insecure && !f.tls:
		return nil, errors.New("--tls-insecure needs --tls")
	case f.cluster != "auto" && f.cluster != "on" && f.cluster != "off":
		return nil, fmt.Errorf("--cluster %q: want auto, on or off", f.cluster)
	}
	w.RecordCount, w.ValueSize = *records, *valueSize
	f.workload = w
	if f.consistency != "" {
		if f.cons, err = client.ParseConsistency(f.consistency); err != nil {
			return nil, fmt.Errorf("--consistency: %w", err)
		}
	}
	if f.durability != "" {
		if f.dur, err = client.ParseDurability(f.durability); err != nil {
			return nil, fmt.Errorf("--durability: %w", err)
		}
	}
	return f, nil
}

// benchReport is kefir bench's JSON output.
type benchReport struct {
	Addrs       []string      `json:"addrs"`
	Workload    ycsb.Workload `json:"workload"`
	Clients     int           `json:"clients"`
	Rate        float64       `json:"rate_ops_per_sec"`
	Consistency string        `json:"consistency"`
	Durability  string        `json:"durability"`
	Interrupted bool          `json:"interrupted,omitempty"`
	Load        *ycsb.Result  `json:"load,omitempty"`
	Run         *ycsb.Result  `json:"run"`
	// Timeline is the run's throughput bucket by bucket (--interval each),
	// the progress lines' figures, dated by the wall clock so that a script
	// can line them up with events outside the run (a member killed, a join
	// logged).
	Timeline []benchBucket `json:"timeline,omitempty"`
}

// benchBucket is one --interval of the run.
type benchBucket struct {
	// End is when the bucket closed, Unix time in seconds; Seconds its width.
	End     float64 `json:"end_unix"`
	Seconds float64 `json:"seconds"`
	Ops     int64   `json:"ops"`
	// Errors is the run's errors so far, as the progress line's.
	Errors    int64   `json:"errors_so_far"`
	OpsPerSec float64 `json:"ops_per_sec"`
}

func runBench(args []string, stdout, stderr io.Writer) error {
	f, err := parseBenchFlags(args, os.Getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	// Ctrl-C ends the run early; what was measured until then is still printed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return bench(ctx, f, stdout, stderr)
}

// levelName is what the report says for a level left to the server.
func levelName(set bool, s fmt.Stringer) string {
	if !set {
		return "server default"
	}
	return s.String()
}

func bench(ctx context.Context, f *benchFlags, stdout, stderr io.Writer) error {
	cfg := kefirdb.Config{Addrs: f.addrs, Password: f.password, PoolSize: f.pool,
		Consistency: f.cons, Durability: f.dur,
		// Through a leader change calls retry, as an application's would; the stall
		// shows as latency rather than as errors.
		RetryUnavailable: 5 * time.Second, Cluster: f.cluster, ChainReads: f.chainReads}
	if f.tls {
		cfg.TLS = &tls.Config{InsecureSkipVerify: f.insecure}
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	drv, err := kefirdb.New(dialCtx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer drv.Close()
	rep := benchReport{Addrs: f.addrs, Workload: f.workload, Clients: f.clients, Rate: f.rate,
		Consistency: levelName(f.consistency != "", f.cons), Durability: levelName(f.durability != "", f.dur)}
	mode := "closed loop"
	if f.rate > 0 {
		mode = fmt.Sprintf("open loop at %g ops/s", f.rate)
		if per := f.rate / float64(f.clients); per > 10_000 {
			// One client paces its operations with timers, which oversleep by tens of µs.
			fmt.Fprintf(stderr, "note: %.0f ops/s per client is beyond reliable pacing (~10k): the pacing itself will show as latency; raise --clients\n", per)
		}
	}
	fmt.Fprintf(stderr, "kefir bench: workload %s, %d records of %d B, %d clients, %s, %v at %s (consistency %s, durability %s)\n",
		f.workload.Name, f.workload.RecordCount, f.workload.ValueSize, f.clients, mode, f.duration,
		strings.Join(f.addrs, ","), rep.Consistency, rep.Durability)
	if f.load {
		fmt.Fprintf(stderr, "loading %d records...\n", f.workload.RecordCount)
		res, err := ycsb.Load(ctx, f.workload, drv.NewDB, f.clients)
		if err != nil {
			return fmt.Errorf("load: %w", err)
		}
		if res.Errors > 0 {
			return fmt.Errorf("load: %d of %d inserts failed (first: %s)", res.Errors, f.workload.RecordCount, strings.Join(res.FirstErrors, "; "))
		}
		rep.Load = res
		fmt.Fprintf(stderr, "loaded %d records in %.1f s (%.0f inserts/s)\n", res.Ops, res.Seconds, res.Throughput)
	}
	rc := ycsb.Config{Clients: f.clients, Target: f.rate, Warmup: f.warmup, Duration: f.duration, Seed: f.seed,
		ProgressEvery: f.interval}
	// One mechanism for both: the runner's progress calls are the lines on
	// stderr and, with --json, the timeline (Run returns after the last call).
	var timeline []benchBucket
	if f.progress || f.json {
		rc.Progress = func(p ycsb.Progress) {
			rate := float64(p.IntervalOps) / p.Interval.Seconds()
			if f.json {
				timeline = append(timeline, benchBucket{End: float64(p.At.UnixMicro()) / 1e6,
					Seconds: p.Interval.Seconds(), Ops: p.IntervalOps, Errors: p.Errors, OpsPerSec: rate})
			}
			if f.progress {
				fmt.Fprintf(stderr, "%6.1fs  %9.0f ops/s  p50 %s  p99 %s  errors %d\n", p.Elapsed.Seconds(),
					rate, fmtUs(p.P50Us), fmtUs(p.P99Us), p.Errors)
			}
		}
	}
	res, runErr := ycsb.Run(ctx, f.workload, drv.NewDB, rc)
	rep.Timeline = timeline
	if res == nil {
		return runErr
	}
	rep.Run = res
	if runErr != nil && errors.Is(runErr, context.Canceled) && ctx.Err() != nil {
		if res.Seconds <= 0 {
			return errors.New("interrupted before the measured window began (during --warmup): nothing to report")
		}
		rep.Interrupted, runErr = true, nil
		fmt.Fprintln(stderr, "interrupted: the figures are of the run until then")
	}
	if runErr != nil {
		return runErr
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printBench(stdout, &rep)
	}
	var notFound int64
	for _, op := range res.PerOp {
		notFound += op.NotFound
	}
	if notFound > 0 && rep.Load == nil {
		fmt.Fprintf(stderr, "note: %d reads found no record: load the records first (--load, with the same --records)\n", notFound)
	}
	// Each client may leave one operation due right at the end unsent: only more than
	// that means the cluster did not keep up.
	if res.Backlog > int64(f.clients) {
		fmt.Fprintf(stderr, "note: the cluster fell behind --rate %g: %d operations due in the run were never sent\n", f.rate, res.Backlog)
	}
	if res.Errors > 0 {
		return fmt.Errorf("%d operations failed (first: %s)", res.Errors, strings.Join(res.FirstErrors, "; "))
	}
	return nil
}

// fmtUs prints a latency in µs or ms, whichever reads better.
func fmtUs(us float64) string {
	if us >= 10_000 {
		return fmt.Sprintf("%.1f ms", us/1e3)
	}
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1e3)
	}
	return fmt.Sprintf("%.0f µs", us)
}

func printBench(w io.Writer, rep *benchReport) {
	res := rep.Run
	fmt.Fprintf(w, "workload %s: %d clients, %.1f s: %.0f ops/s (%d ops, %d errors)\n",
		res.Workload, res.Clients, res.Seconds, res.Throughput, res.Ops, res.Errors)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tcount\tops/s\tmean\tp50\tp95\tp99\tp99.9\tmax\t")
	for _, op := range res.PerOp {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", op.Op, op.Count, op.Throughput,
			fmtUs(op.MeanUs), fmtUs(op.P50Us), fmtUs(op.P95Us), fmtUs(op.P99Us), fmtUs(op.P999Us), fmtUs(op.MaxUs))
	}
	tw.Flush()
}
