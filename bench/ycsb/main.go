// Command ycsb runs YCSB core workloads (A–F, W) against Kefir, Redis, or a trivial
// in-process RESP server (the harness's own ceiling), closed- or open-loop, and prints
// per-operation throughput and latency percentiles as a Markdown table, Go-benchmark
// lines (for benchstat) and optionally JSON.
//
// Run from bench/:
//
//	go run ./ycsb -db respserver -workloads a,c -clients 1,16,64       # harness ceiling
//	go run ./ycsb -db redis -addr 127.0.0.1:6379 -workloads a -target 0,20000
//	go run ./ycsb -db kefir -addr 127.0.0.1:6380 -consistency linearizable -durability sync
//
// It must not be imported; the library is internal/ycsb (workloads, runner, histograms),
// the generators internal/ycsb/gen, Kefir's driver internal/ycsb/kefirdb (all in the main module,
// shared with `kefir bench`).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/bench/limits"
	"github.com/kefirdb/kefir/bench/ycsb/drivers"
	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/faultproxy"
	"github.com/kefirdb/kefir/internal/ycsb"
	"github.com/kefirdb/kefir/internal/ycsb/kefirdb"
)

type flags struct {
	db, addr, password string
	workloads          []string
	records            uint64
	valueSize          int
	distribution       string
	clients            []int
	targets            []float64
	warmup, dur        time.Duration
	load               bool
	loadClients        int
	consistency        string
	durability         string
	runs               int
	jsonPath, mdPath   string
	plotDir            string
	plotFrom           []string
	seed               uint64
	waitReplicas       int
	respVia            string
	etcdSerializable   bool
	label              string
	cpuProfile         string
	delay              time.Duration
	pool               int
	redisPool          int
	zkSessions         int
	zkSyncReads        bool
	loadOnly           bool
	linkDelay          time.Duration
	durable            string
	summarizeTo        string
	agreeFiles         string
	ratios             string
	spliceInto         string
	section            string
	note               string
	limitSamples       int
	compactPath        string
	matrixPath         string
	rounds             int
	prewarm            time.Duration
	watchPids          string
	disturbed          float64
	remeasure          int
	remeasureBudget    int
	quiesce            time.Duration
	failuresPath       string
	serveAddr          string
	serverPids         string
	metrics            string
}

func parse(args []string) (*flags, error) {
	fs := flag.NewFlagSet("ycsb", flag.ContinueOnError)
	f := &flags{}
	var workloads, clients, targets string
	fs.StringVar(&f.db, "db", "respserver", "system under test: kefir, redis, etcd, zookeeper, respserver (trivial in-process RESP server: harness + client library ceiling) or null (no I/O: the harness alone)")
	fs.StringVar(&f.addr, "addr", "", "server address(es), comma-separated (defaults: kefir 127.0.0.1:6380, redis 127.0.0.1:6379, etcd the three members of peers/etcd.sh)")
	fs.StringVar(&f.password, "password", os.Getenv("KEFIR_PASSWORD"), "server password")
	fs.StringVar(&workloads, "workloads", "a", "comma-separated core workloads: a b c d e f w")
	fs.Uint64Var(&f.records, "records", 100_000, "recordcount")
	fs.IntVar(&f.valueSize, "valuesize", 1000, "record size in bytes (fieldcount × fieldlength)")
	fs.StringVar(&f.distribution, "distribution", "", "override requestdistribution: uniform, zipfian or latest")
	fs.StringVar(&clients, "clients", "16", "comma-separated client counts")
	fs.StringVar(&targets, "target", "0", "comma-separated total target rates in ops/s; 0 = closed loop")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "warm-up before measuring (not recorded)")
	fs.DurationVar(&f.dur, "d", 10*time.Second, "measured duration of each run")
	fs.BoolVar(&f.load, "load", true, "run the load phase before each workload")
	fs.IntVar(&f.loadClients, "load-clients", 16, "clients in the load phase")
	fs.StringVar(&f.consistency, "consistency", "", "kefir: read consistency level (linearizable, cross-client-monotonic, session, bounded(N), bounded(T), eventual); empty = server default")
	fs.StringVar(&f.durability, "durability", "", "kefir: write durability level (sync, cad, async); empty = server default")
	fs.IntVar(&f.waitReplicas, "redis-wait", 0, "redis: follow each write with WAIT n (primary with replicas)")
	fs.BoolVar(&f.etcdSerializable, "etcd-serializable", false, "etcd: serializable (local, possibly stale) reads instead of linearizable")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole invocation here (harness, drivers and any in-process server)")
	fs.DurationVar(&f.delay, "delay", 0, "emulated network distance: a delay proxy in front of every server address adds this much in each direction (client links only)")
	fs.IntVar(&f.pool, "pool", 0, "kefir (and respserver -via kefir): connections of Kefir's client, which pipelines concurrent calls on each; 0 = 4")
	fs.IntVar(&f.redisPool, "redis-pool", 0, "redis (and respserver -via redis): go-redis pool size; 0 = one connection per client (the largest of -clients and -load-clients), as a go-redis user sizes it: go-redis does not pipeline concurrent calls, so a client without a connection waits for one")
	fs.IntVar(&f.zkSessions, "zk-sessions", 1, "zookeeper: sessions the clients share (go-zookeeper pipelines concurrent calls on each; one session per process is ZooKeeper's usual model)")
	fs.BoolVar(&f.zkSyncReads, "zk-sync-reads", false, "zookeeper: sync before every read (reads see every write committed before they started) instead of local reads")
	fs.BoolVar(&f.loadOnly, "load-only", false, "run the load phase of the first workload and exit (later invocations then use -load=false: every workload shares the key space)")
	fs.DurationVar(&f.linkDelay, "link-delay", 0, "one-way delay already emulated outside this process on every client and peer link (bench/delaymesh, started by the peers scripts): only recorded in the reports")
	fs.StringVar(&f.durable, "durable", "", "yes: the system fsyncs before acknowledging a write (sets the latency floor); no: it does not; empty: the driver's guess (kefir from -durability, etcd yes, zookeeper yes, redis no)")
	fs.StringVar(&f.summarizeTo, "summarize", "", "reduce the -json files given as arguments (rounds of the same cells) to medians; write the summary JSON here and its table to -md")
	fs.StringVar(&f.agreeFiles, "agree", "", "A.json,B.json: compare two -summarize outputs row by row (issue 8: within 15% on medians); table to -md and stdout; exit 3 if any row disagrees")
	fs.StringVar(&f.ratios, "ratios", "", "\"ROW/PEER;ROW/PEER\": with -summarize outputs as arguments (one per matrix), write the table of each ROW's median total throughput ÷ its PEER's per cell to -md and stdout")
	fs.StringVar(&f.spliceInto, "splice", "", "replace the text between <!-- BEGIN SECTION --> and <!-- END SECTION --> in this file with standard input")
	fs.StringVar(&f.section, "section", "ycsb-compare", "marker name for -splice")
	fs.StringVar(&f.note, "note", "", "free text recorded in -summarize output (compare.sh records the load averages)")
	fs.IntVar(&f.limitSamples, "limits-samples", 300, "round trips and fsyncs sampled for the physical floors (0 = skip: compare.sh measures them once per matrix)")
	fs.StringVar(&f.compactPath, "md-compact", "", "-summarize, -agree: also write the compact table (one line per system, one column per workload and client count) here")
	fs.StringVar(&f.matrixPath, "matrix", "", "drive every system listed in this file (one line of ycsb flags per system, each with -label) from this process, cells interleaved across systems, -rounds times; rows and failures go to -json")
	fs.DurationVar(&f.prewarm, "prewarm", 0, "-matrix: before round 1, run every workload on every system for this long at the largest client count, unmeasured (JIT, caches, heaps: so the first round is not the only cold one)")
	fs.StringVar(&f.watchPids, "watch-pids", "", "-matrix: file listing the systems' server pids; each cell then records the CPU used by every other process outside this one (the CPU watch)")
	fs.Float64Var(&f.disturbed, "disturbed", 0.25, "-matrix with -watch-pids: a cell during which other processes used more than this many cores is measured again (see -remeasure)")
	fs.IntVar(&f.remeasure, "remeasure", 2, "-matrix: extra measurements at most of one disturbed cell (the least disturbed is kept)")
	fs.IntVar(&f.remeasureBudget, "remeasure-budget", 30, "-matrix: extra measurements at most over the whole matrix (bounds its length on a busy machine)")
	fs.DurationVar(&f.quiesce, "quiesce", 0, "-matrix: pause before each cell, so the previous cell's system settles (its last writes, fsyncs and collections) before the next one is measured")
	fs.IntVar(&f.rounds, "rounds", 3, "-matrix: rounds (each cell of each system measured once per round)")
	fs.StringVar(&f.failuresPath, "failures", "", "-matrix: also list failed connections, loads and cells here, one per line (empty file: none)")
	fs.StringVar(&f.serveAddr, "serve", "", "run only the trivial RESP server (the -db respserver one) on this address until interrupted: the harness ceiling with the server in its own process, as every real system is")
	fs.StringVar(&f.serverPids, "server-pids", "", "file listing the system's server pids (a plain run, or a -matrix line); each measured cell then records its server CPU µs per op and write_bytes per write (/proc; bench/README.md, \"Cost per operation\")")
	fs.StringVar(&f.metrics, "metrics", "", "kefir (a plain run, or a -matrix line): the nodes' Prometheus endpoints (http://HOST:PORT/metrics, comma-separated); each measured cell then records fsyncs per write")
	fs.StringVar(&f.label, "label", "", "name of the system in reports (default: derived from -db and its options)")
	fs.StringVar(&f.respVia, "via", "redis", "respserver: which client library drives it (redis or kefir)")
	fs.IntVar(&f.runs, "runs", 1, "repetitions of each cell (to report run-to-run spread)")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed")
	fs.StringVar(&f.jsonPath, "json", "", "write results as JSON here")
	fs.StringVar(&f.mdPath, "md", "", "write the Markdown table here too")
	fs.StringVar(&f.plotDir, "plot", "", "write PNG plots (latency CDFs, throughput vs latency) here; with JSON files as arguments, plot those instead of running")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	f.plotFrom = fs.Args()
	if len(f.plotFrom) > 0 && f.plotDir == "" && f.summarizeTo == "" && f.ratios == "" {
		return nil, fmt.Errorf("unexpected arguments %v (JSON files need -plot DIR, -summarize FILE or -ratios PAIRS)", f.plotFrom)
	}
	for _, w := range strings.Split(workloads, ",") {
		if w = strings.TrimSpace(w); w != "" {
			f.workloads = append(f.workloads, w)
		}
	}
	for _, s := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-clients: bad count %q", s)
		}
		f.clients = append(f.clients, n)
	}
	for _, s := range strings.Split(targets, ",") {
		t, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || t < 0 {
			return nil, fmt.Errorf("-target: bad rate %q", s)
		}
		f.targets = append(f.targets, t)
	}
	if f.addr == "" {
		f.addr = map[string]string{"kefir": "127.0.0.1:6380", "redis": "127.0.0.1:6379",
			"etcd":      "127.0.0.1:2479,127.0.0.1:2481,127.0.0.1:2483",
			"zookeeper": "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"}[f.db]
	}
	return f, nil
}

// system is a connected driver.
type system struct {
	name string
	// durable: a write is acknowledged only after an fsync, so its latency floor is a
	// round trip plus an fsync (otherwise a round trip).
	durable bool
	newDB   ycsb.NewDB
	flush   func(context.Context) error // empties the store before a load; nil if it cannot
	// noScans: the system has no range read, so workloads with scans are skipped
	// (and reported as unsupported) rather than emulated.
	noScans bool
	close   func() error
}

// delayer puts a delay proxy (internal/faultproxy) in front of each server address, so
// every system compared sees the same emulated network distance on its client links.
type delayer struct {
	oneWay  time.Duration
	proxies []*faultproxy.Proxy
}

// wrap returns the address clients should use for upstream: upstream itself when no
// delay is asked for, else a new proxy delaying each direction by oneWay.
func (d *delayer) wrap(upstream string) string {
	if d.oneWay <= 0 {
		return upstream
	}
	p, err := faultproxy.New(upstream, uint64(len(d.proxies))+1)
	if err != nil {
		// Listening on loopback failing is not something a benchmark can work around.
		panic(fmt.Sprintf("delay proxy for %s: %v", upstream, err))
	}
	p.Delay(faultproxy.Up, d.oneWay, 0)
	p.Delay(faultproxy.Down, d.oneWay, 0)
	d.proxies = append(d.proxies, p)
	return p.Addr()
}

func (d *delayer) wrapAll(addrs []string) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = d.wrap(a)
	}
	return out
}

func (d *delayer) close() error {
	var err error
	for _, p := range d.proxies {
		err = errors.Join(err, p.Close())
	}
	return err
}

// connect opens the system under test, behind delay proxies if -delay is set.
func connect(ctx context.Context, f *flags, index bool, pool int) (*system, error) {
	dl := &delayer{oneWay: f.delay}
	sys, err := connectVia(ctx, f, index, pool, dl)
	if err != nil {
		dl.close()
		return nil, err
	}
	if f.delay > 0 {
		sys.name += fmt.Sprintf(" +%v each way", f.delay)
		inner := sys.close
		sys.close = func() error { return errors.Join(inner(), dl.close()) }
	}
	return sys, nil
}

func connectVia(ctx context.Context, f *flags, index bool, pool int, dl *delayer) (*system, error) {
	switch f.db {
	case "redis", "respserver":
		addr, name := f.addr, "redis"
		var srv *drivers.RESPServer
		if f.db == "respserver" {
			var err error
			if srv, err = drivers.StartRESPServer("127.0.0.1:0"); err != nil {
				return nil, err
			}
			addr, name = srv.Addr(), "respserver(via "+f.respVia+")"
			addr = dl.wrap(addr)
			if f.respVia == "kefir" {
				k, err := kefirdb.New(ctx, kefirdb.Config{Addrs: []string{addr}, PoolSize: kefirPool(f)})
				if err != nil {
					srv.Close()
					return nil, err
				}
				return &system{name: name, newDB: k.NewDB, close: func() error { return errors.Join(k.Close(), srv.Close()) }}, nil
			}
		}
		if srv == nil {
			addr = dl.wrap(addr)
		}
		r, err := drivers.NewRedis(ctx, drivers.RedisConfig{Addr: addr, Password: f.password, PoolSize: pool, Index: index,
			WaitReplicas: f.waitReplicas, WaitTimeout: time.Second})
		if err != nil {
			if srv != nil {
				srv.Close()
			}
			return nil, err
		}
		if f.waitReplicas > 0 {
			name += fmt.Sprintf("+WAIT %d", f.waitReplicas)
		}
		return &system{name: name, newDB: r.NewDB, flush: r.FlushAll, close: func() error {
			err := r.Close()
			if srv != nil {
				err = errors.Join(err, srv.Close())
			}
			return err
		}}, nil
	case "etcd":
		e, err := drivers.NewEtcd(ctx, drivers.EtcdConfig{Endpoints: dl.wrapAll(strings.Split(f.addr, ",")), Serializable: f.etcdSerializable})
		if err != nil {
			return nil, err
		}
		name := "etcd"
		if f.etcdSerializable {
			name += "(serializable reads)"
		}
		return &system{name: name, durable: true, newDB: e.NewDB, flush: e.DeleteAll, close: e.Close}, nil
	case "zookeeper":
		z, err := drivers.NewZooKeeper(ctx, drivers.ZooKeeperConfig{Servers: dl.wrapAll(strings.Split(f.addr, ",")),
			Sessions: max(f.zkSessions, 1), SyncReads: f.zkSyncReads})
		if err != nil {
			return nil, err
		}
		name := "zookeeper"
		if f.zkSyncReads {
			name += "(sync+read)"
		}
		// Whether writes are fsynced before the ack is the ensemble's forceSync
		// (peers/zookeeper.sh), which the label states; durable assumes the default, yes.
		return &system{name: name, durable: true, newDB: z.NewDB, flush: z.DeleteAll, close: z.Close, noScans: true}, nil
	case "null":
		return &system{name: "null (harness only)", newDB: drivers.Null{}.NewDB, close: func() error { return nil }}, nil
	case "kefir":
		cfg := kefirdb.Config{Addrs: dl.wrapAll(strings.Split(f.addr, ",")), Password: f.password, PoolSize: kefirPool(f),
			RetryUnavailable: 5 * time.Second}
		name := "kefir"
		if f.consistency != "" {
			c, err := client.ParseConsistency(f.consistency)
			if err != nil {
				return nil, err
			}
			cfg.Consistency = c
		}
		if f.durability != "" {
			d, err := client.ParseDurability(f.durability)
			if err != nil {
				return nil, err
			}
			cfg.Durability = d
		}
		name += fmt.Sprintf("(%s/%s)", cfg.Consistency, cfg.Durability)
		k, err := kefirdb.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		// The server's default durability is sync unless it was started otherwise.
		durable := cfg.Durability == client.Sync || cfg.Durability.IsZero()
		return &system{name: name, durable: durable, newDB: k.NewDB, close: k.Close}, nil
	}
	return nil, fmt.Errorf("unknown -db %q (want kefir, redis, etcd, zookeeper, respserver or null)", f.db)
}

// kefirPool is the Kefir client's connection count: its calls pipeline, so a few
// connections carry any number of clients, and each write/read syscall carries many
// requests — one connection per client would cost four syscalls per operation.
func kefirPool(f *flags) int {
	if f.pool > 0 {
		return f.pool
	}
	return 4
}

// row is one measured cell for the reports.
type row struct {
	System  string `json:"system"`
	Durable bool   `json:"durable_writes"`
	// Delay is the emulated one-way delay added on client links (each direction).
	Delay time.Duration `json:"delay_one_way_ns,omitempty"`
	// LinkDelay is the one-way delay emulated outside this process on every client and
	// peer link (bench/delaymesh), as declared with -link-delay.
	LinkDelay time.Duration `json:"link_delay_one_way_ns,omitempty"`
	// Unsupported names what the system lacks when the workload was not run ("scans").
	Unsupported string       `json:"unsupported,omitempty"`
	Run         int          `json:"run"`
	Result      *ycsb.Result `json:"result"`
	// Cost is what the cell cost the system per operation (cost.go); nil outside -matrix.
	Cost *Cost `json:"cost,omitempty"`
	// OtherCPUCores is the CPU (in cores) that processes outside the matrix — not this
	// one, not the systems' servers — used while the cell ran (-matrix with
	// -watch-pids; the CPU watch, cpuwatch.go). Attempts counts the cell's measurements
	// when it was measured again for being disturbed (the least disturbed is kept).
	OtherCPUCores float64 `json:"other_cpu_cores,omitempty"`
	Attempts      int     `json:"attempts,omitempty"`
}

func main() {
	f, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ycsb:", err)
		os.Exit(2)
	}
	if f.serveAddr != "" {
		srv, err := drivers.StartRESPServer(f.serveAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ycsb:", err)
			os.Exit(1)
		}
		fmt.Println("serving RESP on", srv.Addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
		if err := srv.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "ycsb:", err)
			os.Exit(1)
		}
		return
	}
	if f.summarizeTo != "" || f.agreeFiles != "" || f.ratios != "" || f.spliceInto != "" {
		if err := report(f, os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "ycsb:", err)
			if errors.Is(err, errDisagree) {
				os.Exit(3)
			}
			os.Exit(1)
		}
		return
	}
	if len(f.plotFrom) > 0 {
		rows, err := readRows(f.plotFrom)
		if err == nil {
			var files []string
			files, err = plotAll(f.plotDir, rows)
			for _, p := range files {
				fmt.Println(p)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ycsb:", err)
			os.Exit(1)
		}
		return
	}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(pf)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ycsb:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var lim limits.Result
	if f.limitSamples > 0 {
		var lerr error
		if lim, lerr = limits.Measure(os.TempDir(), f.limitSamples); lerr != nil {
			fmt.Fprintln(os.Stderr, "ycsb: measuring limits:", lerr)
		}
	}
	var rows []row
	var failures []string
	if f.matrixPath != "" {
		var pids []int
		if pids, err = readWatchPids(f.watchPids); err == nil && f.watchPids != "" && pids == nil {
			pids = []int{} // watch with no server of its own (every system in process)
		}
		if err == nil {
			rows, failures, err = runMatrix(ctx, f.matrixPath, matrixOpts{rounds: f.rounds, prewarm: f.prewarm, seed: f.seed,
				watchPids: pids, disturbed: f.disturbed, remeasure: f.remeasure, remeasureBudget: f.remeasureBudget, quiesce: f.quiesce}, os.Stderr)
		}
		if f.failuresPath != "" {
			var b strings.Builder
			for _, m := range failures {
				b.WriteString("- " + m + "\n")
			}
			err = errors.Join(err, os.WriteFile(f.failuresPath, []byte(b.String()), 0o644))
		}
	} else {
		rows, err = run(ctx, f, os.Stderr)
	}
	if len(rows) > 0 {
		cmd := "go run ./ycsb " + strings.Join(os.Args[1:], " ")
		md := markdown(cmd, rows, lim)
		if f.matrixPath == "" { // a matrix's costs are in its summary (-summarize)
			if c := costMarkdown(summary{Rows: summarize(rows), CPUs: runtime.NumCPU()}); c != "" {
				md += "\n" + c
			}
		}
		fmt.Print(md)
		if f.mdPath != "" {
			if werr := os.WriteFile(f.mdPath, []byte(md), 0o644); werr != nil {
				err = errors.Join(err, werr)
			}
		}
		if f.jsonPath != "" {
			doc := map[string]any{"command": cmd, "limits": lim, "rows": rows}
			if f.matrixPath != "" {
				doc["failures"] = failures
				if b, rerr := os.ReadFile(f.matrixPath); rerr == nil {
					doc["matrix"] = strings.Split(strings.TrimSpace(string(b)), "\n")
				}
			}
			b, _ := json.MarshalIndent(doc, "", "  ")
			if werr := os.WriteFile(f.jsonPath, append(b, '\n'), 0o644); werr != nil {
				err = errors.Join(err, werr)
			}
		}
		if f.plotDir != "" {
			files, perr := plotAll(f.plotDir, rows)
			for _, p := range files {
				fmt.Fprintln(os.Stderr, "plot:", p)
			}
			err = errors.Join(err, perr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ycsb:", err)
		os.Exit(1)
	}
}

// errDisagree is -agree's verdict when some row differs by more than agreeLimit.
var errDisagree = errors.New("the two runs disagree by more than 15% on some rows")

// report runs the offline modes: -summarize, -agree, -ratios, -splice.
func report(f *flags, args []string) error {
	switch {
	case f.summarizeTo != "":
		rows, err := readRows(f.plotFrom)
		if err != nil {
			return err
		}
		// The floors come from the first file that measured them (compare.sh has its
		// ceiling invocations measure them, the others skip it).
		var lim limits.Result
		for _, path := range f.plotFrom {
			var doc struct {
				Limits limits.Result `json:"limits"`
			}
			if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &doc) == nil && doc.Limits.LoopbackRTTP50us > 0 {
				lim = doc.Limits
				break
			}
		}
		s := summary{Command: "go run ./ycsb " + strings.Join(args, " "), LoadAvg: f.note, Limits: lim, Rows: summarize(rows), CPUs: runtime.NumCPU()}
		b, _ := json.MarshalIndent(s, "", "  ")
		if err := os.WriteFile(f.summarizeTo, append(b, '\n'), 0o644); err != nil {
			return err
		}
		md := summaryMarkdown(s)
		if w := watchMarkdown(s.Rows); w != "" {
			md += "\n" + w
		}
		if c := costMarkdown(s); c != "" {
			md += "\n" + c
		}
		if c := ceilingMarkdown(s.Rows); c != "" {
			md += "\nHarness ceiling (issue 8: the harness against a trivial in-process RESP server must reach ≥ 3× the best system in the same cell):\n\n" + c
		}
		fmt.Print(md)
		if f.mdPath != "" {
			if err := os.WriteFile(f.mdPath, []byte(md), 0o644); err != nil {
				return err
			}
		}
		if f.compactPath != "" {
			c := totalsMarkdown(s.Rows)
			if w := watchMarkdown(s.Rows); w != "" {
				c += "\n" + w
			}
			if t := costMarkdown(s); t != "" {
				c += "\n" + t
			}
			if t := ceilingMarkdown(s.Rows); t != "" {
				c += "\nHarness ceiling (in-process trivial RESP server, same cell; issue 8 wants ≥ 3× the best system):\n\n" + t
			}
			if err := os.WriteFile(f.compactPath, []byte(c), 0o644); err != nil {
				return err
			}
		}
		if f.plotDir != "" {
			files, err := plotAll(f.plotDir, rows)
			for _, p := range files {
				fmt.Fprintln(os.Stderr, "plot:", p)
			}
			return err
		}
		return nil
	case f.ratios != "":
		pairs, err := parsePairs(f.ratios)
		if err != nil {
			return err
		}
		var runs [][]summaryRow
		for _, path := range f.plotFrom {
			s, err := readSummary(path)
			if err != nil {
				return err
			}
			runs = append(runs, s.Rows)
		}
		if len(runs) == 0 {
			return errors.New("-ratios wants the -summarize outputs as arguments")
		}
		md := ratiosMarkdown(pairs, runs)
		if md != "" {
			md += costRatiosMarkdown(pairs, runs)
		}
		fmt.Print(md)
		if f.mdPath != "" {
			return os.WriteFile(f.mdPath, []byte(md), 0o644)
		}
		return nil
	case f.agreeFiles != "":
		names := strings.Split(f.agreeFiles, ",")
		if len(names) != 2 {
			return fmt.Errorf("-agree wants two summary files, got %q", f.agreeFiles)
		}
		a, err := readSummary(names[0])
		if err != nil {
			return err
		}
		b, err := readSummary(names[1])
		if err != nil {
			return err
		}
		md := agreeMarkdown([2]string{names[0], names[1]}, a, b)
		fmt.Print(md)
		if f.mdPath != "" {
			if err := os.WriteFile(f.mdPath, []byte(md), 0o644); err != nil {
				return err
			}
		}
		rows, missing := agree(a.Rows, b.Rows)
		if f.compactPath != "" {
			c := agreeVerdict(rows) + " Every row is in the full table. Below: the difference of the two runs' median total throughput " +
				"per cell (bold: beyond 15%):\n\n"
			c += agreeTotalsMarkdown(a.Rows, b.Rows)
			if err := os.WriteFile(f.compactPath, []byte(c), 0o644); err != nil {
				return err
			}
		}
		for _, r := range rows {
			if !r.Within {
				return errDisagree
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d cells measured in only one run", len(missing))
		}
		return nil
	default:
		body, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		doc, err := os.ReadFile(f.spliceInto)
		if err != nil {
			return err
		}
		out, err := splice(doc, f.section, body)
		if err != nil {
			return fmt.Errorf("%s: %w", f.spliceInto, err)
		}
		return os.WriteFile(f.spliceInto, out, 0o644)
	}
}

// workloadsOf builds the workloads f asks for, and whether any of them scans.
func workloadsOf(f *flags) ([]ycsb.Workload, bool, error) {
	var ws []ycsb.Workload
	index := false
	for _, name := range f.workloads {
		w, err := ycsb.Standard(name)
		if err != nil {
			return nil, false, err
		}
		w.RecordCount, w.ValueSize = f.records, f.valueSize
		if f.distribution != "" {
			w.RequestDistribution = f.distribution
		}
		if err := w.Validate(); err != nil {
			return nil, false, err
		}
		index = index || w.HasScans()
		ws = append(ws, w)
	}
	return ws, index, nil
}

// redisPool is go-redis's pool size: -redis-pool, or by default one connection per
// client of the largest phase, since go-redis sends one call at a time per connection.
func redisPool(f *flags) int {
	if f.redisPool > 0 {
		return f.redisPool
	}
	pool := f.loadClients
	for _, c := range f.clients {
		pool = max(pool, c)
	}
	return pool
}

// open connects f's system with its label and durability override applied.
func open(ctx context.Context, f *flags, index bool) (*system, error) {
	sys, err := connect(ctx, f, index, redisPool(f))
	if err != nil {
		return nil, err
	}
	if f.label != "" {
		sys.name = f.label
	}
	if f.durable != "" {
		sys.durable = f.durable == "yes"
	}
	return sys, nil
}

// load empties sys (if it can) and runs w's load phase.
func load(ctx context.Context, f *flags, sys *system, w ycsb.Workload, logw io.Writer) error {
	if sys.flush != nil {
		if err := sys.flush(ctx); err != nil {
			return fmt.Errorf("flush before loading %s: %w", w.Name, err)
		}
	}
	res, err := ycsb.Load(ctx, w, sys.newDB, f.loadClients)
	if err != nil {
		return fmt.Errorf("load %s: %w", w.Name, err)
	}
	fmt.Fprintf(logw, "%s load %s: %d records in %.1fs (%.0f/s), %d errors, %d inserts retried\n", sys.name, w.Name, res.Ops, res.Seconds, res.Throughput, res.Errors, res.Retries)
	if res.Errors > 0 {
		return fmt.Errorf("load %s: %d inserts failed, first: %v", w.Name, res.Errors, res.FirstErrors)
	}
	return nil
}

func run(ctx context.Context, f *flags, logw io.Writer) ([]row, error) {
	ws, index, err := workloadsOf(f)
	if err != nil {
		return nil, err
	}
	sys, err := open(ctx, f, index)
	if err != nil {
		return nil, err
	}
	defer sys.close()
	meter, err := costMeterOf(f)
	if err != nil {
		return nil, err
	}
	var rows []row
	for i, w := range ws {
		if w.HasScans() && sys.noScans {
			fmt.Fprintf(logw, "%s: workload %s skipped: the system has no range read (scans unsupported)\n", sys.name, w.Name)
			rows = append(rows, row{System: sys.name, Durable: sys.durable, Delay: f.delay, LinkDelay: f.linkDelay,
				Unsupported: "scans", Result: &ycsb.Result{Workload: w.Name, Phase: "run", Mode: "closed"}})
			continue
		}
		if f.loadOnly && i > 0 {
			break
		}
		if f.load || f.loadOnly {
			if err := load(ctx, f, sys, w, logw); err != nil {
				return rows, err
			}
		}
		if f.loadOnly {
			continue
		}
		for run := range f.runs {
			for _, c := range f.clients {
				for _, t := range f.targets {
					cfg := ycsb.Config{Clients: c, Target: t, Warmup: f.warmup, Duration: f.dur, Seed: f.seed + uint64(run)}
					if meter != nil {
						cfg.Window = meter.window
					}
					res, err := ycsb.Run(ctx, w, sys.newDB, cfg)
					if err != nil {
						return rows, fmt.Errorf("run %s clients=%d target=%v: %w", w.Name, c, t, err)
					}
					rw := row{System: sys.name, Durable: sys.durable, Delay: f.delay, LinkDelay: f.linkDelay, Run: run + 1, Result: res}
					if meter != nil {
						rw.Cost = meter.cost(res)
					}
					rows = append(rows, rw)
					fmt.Fprintln(logw, benchLine(sys.name, res))
				}
			}
		}
	}
	return rows, nil
}

// benchLine formats a result as a Go benchmark line, so benchstat can compare runs.
func benchLine(sys string, r *ycsb.Result) string {
	mode := "closed"
	if r.Mode == "open" {
		mode = fmt.Sprintf("target=%.0f", r.Target)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "BenchmarkYCSB/%s/%s/clients=%d/%s 1 %.0f ops/sec", strings.NewReplacer(" ", "", "/", ":").Replace(sys), r.Workload, r.Clients, mode, r.Throughput)
	for _, op := range r.PerOp {
		name := strings.ToLower(strings.ReplaceAll(op.Op, "-", ""))
		fmt.Fprintf(&sb, " %.1f %s-p50-us %.1f %s-p99-us", op.P50Us, name, op.P99Us, name)
	}
	fmt.Fprintf(&sb, " %.2f process-cpu-us/op %d errors", r.ProcessCPUUsPerOp, r.Errors)
	return sb.String()
}

func markdown(cmd string, rows []row, lim limits.Result) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Command (from `bench/`): `%s`\n\n", cmd)
	fmt.Fprintf(&sb, "Physical floors on this machine: %s. The \"× floor\" column is p50 ÷ the floor of that operation: "+
		"a round trip (plus twice any emulated one-way delay), plus a write+fsync for writes of systems that fsync before acknowledging "+
		"(replicated systems' peer round trip is not counted in the floor). %s\n\n", lim, networkNote(rows))
	sb.WriteString("| system | workload | clients | load | run | op | ops/s | p50 µs | × floor | p95 µs | p99 µs | p99.9 µs | errors | not found |\n")
	sb.WriteString("|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r.Unsupported != "" {
			fmt.Fprintf(&sb, "| %s | %s | | | | not supported: no %s | | | | | | | | |\n", r.System, strings.ToUpper(r.Result.Workload), r.Unsupported)
			continue
		}
		mode := "closed"
		if r.Result.Mode == "open" {
			mode = fmt.Sprintf("open %.0f/s", r.Result.Target)
			if r.Result.Backlog > 0 {
				mode += fmt.Sprintf(" (**%d never sent**)", r.Result.Backlog)
			}
		}
		for _, op := range r.Result.PerOp {
			rtt := lim.LoopbackRTTP50us + 2*float64(r.Delay+r.LinkDelay)/1e3
			floor := rtt
			if r.Durable && (op.Op == "UPDATE" || op.Op == "INSERT" || op.Op == "READ-MODIFY-WRITE") {
				floor += lim.FsyncP50us
			}
			if op.Op == "READ-MODIFY-WRITE" {
				floor += rtt
			}
			times := "–"
			if floor > 0 {
				times = fmt.Sprintf("%.1f×", op.P50Us/floor)
			}
			fmt.Fprintf(&sb, "| %s | %s | %d | %s | %d | %s | %.0f | %.1f | %s | %.1f | %.1f | %.1f | %d | %d |\n",
				r.System, strings.ToUpper(r.Result.Workload), r.Result.Clients, mode, r.Run, op.Op, op.Throughput,
				op.P50Us, times, op.P95Us, op.P99Us, op.P999Us, op.Errors, op.NotFound)
		}
		fmt.Fprintf(&sb, "| %s | %s | %d | %s | %d | **total** | **%.0f** | | | | | | %d | |\n",
			r.System, strings.ToUpper(r.Result.Workload), r.Result.Clients, mode, r.Run, r.Result.Throughput, r.Result.Errors)
	}
	sb.WriteString(agreement(rows))
	return sb.String()
}

// networkNote states the emulated network distance of the rows, as every table must.
func networkNote(rows []row) string {
	seen := map[[2]time.Duration]bool{}
	var parts []string
	for _, r := range rows {
		k := [2]time.Duration{r.Delay, r.LinkDelay}
		if seen[k] {
			continue
		}
		seen[k] = true
		switch {
		case r.Delay == 0 && r.LinkDelay == 0:
			parts = append(parts, "none (loopback, no delay proxy)")
		case r.LinkDelay > 0:
			parts = append(parts, fmt.Sprintf("%v one way on every client and peer link (delay proxies, bench/delaymesh)", r.LinkDelay+r.Delay))
		default:
			parts = append(parts, fmt.Sprintf("%v one way on client links only (delay proxies in the harness; peer links undelayed)", r.Delay))
		}
	}
	return "Network distance: " + strings.Join(parts, "; ") + "."
}

// agreement reports, for cells measured more than once (-runs > 1), how far apart the
// runs are: issue 8 asks that back-to-back runs agree within 15% on medians.
func agreement(rows []row) string {
	type cellKey struct {
		sys, w  string
		clients int
		target  float64
	}
	type spread struct{ tput, p50 []float64 }
	cells := map[cellKey]*spread{}
	var order []cellKey
	for _, r := range rows {
		if r.Unsupported != "" {
			continue
		}
		k := cellKey{r.System, r.Result.Workload, r.Result.Clients, r.Result.Target}
		if cells[k] == nil {
			cells[k] = &spread{}
			order = append(order, k)
		}
		cells[k].tput = append(cells[k].tput, r.Result.Throughput)
		if len(r.Result.PerOp) > 0 {
			cells[k].p50 = append(cells[k].p50, r.Result.PerOp[0].P50Us)
		}
	}
	var sb strings.Builder
	for _, k := range order {
		s := cells[k]
		if len(s.tput) < 2 {
			continue
		}
		if sb.Len() == 0 {
			sb.WriteString("\nRun-to-run agreement (max ÷ min − 1 over runs; issue 8 wants ≤ 15%):\n\n| system | workload | clients | target | throughput | first op's p50 | within 15% |\n|---|---|---:|---:|---:|---:|---|\n")
		}
		dt, dp := relSpread(s.tput), relSpread(s.p50)
		ok := "yes"
		if dt > 0.15 || dp > 0.15 {
			ok = "**no**"
		}
		fmt.Fprintf(&sb, "| %s | %s | %d | %.0f | %.0f%% | %.0f%% | %s |\n", k.sys, strings.ToUpper(k.w), k.clients, k.target, 100*dt, 100*dp, ok)
	}
	return sb.String()
}

func relSpread(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	if lo <= 0 {
		return 0
	}
	return hi/lo - 1
}
