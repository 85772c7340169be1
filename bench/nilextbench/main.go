// Command nilextbench measures the nilext fast path (issue 6, "Performance")
// against the ordered VR path, side by side on one group, with the Go
// client: closed-loop clients, a delay proxy (internal/faultproxy) on every
// client and peer port holding each direction for the same one-way delay,
// so every link — client to replica, replica to replica — costs the same.
//
// Three experiments, each in interleaved rounds (nilext, ordered, ordered,
// nilext, ...) so that load from other processes hits both alike; tables
// report the median over rounds:
//
//   - low: write latency at 1..4 clients, nilext vs ordered (target: ≤ 0.6×);
//   - peak: throughput and latency as clients grow; the ordered path's peak
//     throughput, and the latency at which nilext delivers it (target ≤ 0.5×);
//   - ycsb: YCSB-A (50% reads) and -B (95%), zipfian keys, linearizable reads,
//     fast path on vs off, with the share of reads that took the slow path
//     (the leader's kefir_nilext_slow_reads counter).
//
// Run from the bench module:
//
//	cd bench && go run ./nilextbench -replicas 3,5 -delays 250us,1ms -durability sync,cad
//
// It builds ../cmd/kefir unless -bin names a binary, starts the replicas as
// processes on 127.0.0.1 (ports from -port), and stops them at the end. It
// must not import anything but the Go client, the fault proxy and the YCSB
// generators.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/faultproxy"
	"github.com/kefirdb/kefir/internal/ycsb/gen"
)

type config struct {
	bin         string
	replicas    []int
	delays      []time.Duration
	durs        []client.Durability
	clients     []int
	peakClients []int
	ycsbClients int
	records     int
	valueSize   int
	round       time.Duration
	warmup      time.Duration
	rounds      int
	experiments map[string]bool
	workloads   []string
	port        int
	dir         string
	nxTimeout   time.Duration
	extraFlags  []string
	// shared: all closed-loop workers of a run share one client.Client
	// (as one Go process would), with pool connections; else each worker
	// has its own client with one connection (as separate processes).
	shared bool
	pool   int
	// nxConns: the nilext client's connections per replica
	// (client.WithNilextConns).
	nxConns int
	// cpuProfile: write a CPU profile of this process (the clients and the
	// delay proxies) during each measured nilext run to cpuProfile-<dur>-<k>.
	cpuProfile string
}

// clientModel says in the tables which client model the rows use.
func (c config) clientModel() string {
	if c.shared {
		return fmt.Sprintf("one shared `client.Client` for all workers of a run (pool size %d, concurrent calls pipelined; nilext writes group-committed per replica as `KEFIR.NILEXT BATCH` over %d connection(s) per replica, one batch in flight on each), same options for ordered and nilext", c.pool, c.nxConns)
	}
	return fmt.Sprintf("one `client.Client` per worker (pool size 1: one connection each, as separate client processes; nilext: %d connection(s) per replica, batches hold one write)", c.nxConns)
}

func main() {
	var (
		c                                           config
		replicas, delays, durs, clients, peak, exps string
		workloads, extra                            string
	)
	flag.StringVar(&c.bin, "bin", "", "kefir binary (default: build ../cmd/kefir)")
	flag.StringVar(&replicas, "replicas", "3,5", "group sizes")
	flag.StringVar(&delays, "delays", "250us,1ms", "one-way delay on every link")
	flag.StringVar(&durs, "durability", "sync,cad", "write durability levels")
	flag.StringVar(&clients, "clients", "1,2,4", "low-load client counts")
	flag.StringVar(&peak, "peak-clients", "4,8,16,32,64", "client counts for the peak experiment")
	flag.IntVar(&c.ycsbClients, "ycsb-clients", 16, "clients for YCSB")
	flag.IntVar(&c.records, "records", 10000, "keys (low/peak: uniform; YCSB: preloaded, zipfian)")
	flag.IntVar(&c.valueSize, "value-size", 100, "value bytes")
	flag.DurationVar(&c.round, "round", 3*time.Second, "measured time per run")
	flag.DurationVar(&c.warmup, "warmup", 500*time.Millisecond, "unmeasured time before each run")
	flag.IntVar(&c.rounds, "rounds", 3, "interleaved rounds per point")
	flag.StringVar(&exps, "experiments", "low,peak,ycsb", "which experiments")
	flag.StringVar(&workloads, "ycsb", "A,B", "YCSB workloads")
	flag.IntVar(&c.port, "port", 17100, "first port (uses port..port+499)")
	flag.StringVar(&c.dir, "dir", "", "data directory (default: a temporary one, removed at exit)")
	flag.DurationVar(&c.nxTimeout, "nilext-timeout", 100*time.Millisecond, "client nilext timeout before the ordered fallback (the client default is 50ms; a loaded shared box has fsync tails past that)")
	flag.StringVar(&extra, "server-flags", "", "extra kefir server flags, space-separated")
	flag.BoolVar(&c.shared, "shared", false, "all workers of a run share one client (default: one client per worker)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "profile this process during each measured nilext run into FILE-<durability>-<clients>")
	flag.IntVar(&c.nxConns, "nx-conns", 1, "nilext client connections per replica (client.WithNilextConns; each has one KEFIR.NILEXT BATCH in flight)")
	flag.IntVar(&c.pool, "pool", 2, "pool size of the shared client (-shared; the client's default is 2)")
	flag.Parse()
	var err error
	must := func(e error) {
		if e != nil && err == nil {
			err = e
		}
	}
	c.replicas, err = parseList(replicas, strconv.Atoi)
	var e error
	c.delays, e = parseList(delays, time.ParseDuration)
	must(e)
	c.durs, e = parseList(durs, client.ParseDurability)
	must(e)
	c.clients, e = parseList(clients, strconv.Atoi)
	must(e)
	c.peakClients, e = parseList(peak, strconv.Atoi)
	must(e)
	if err != nil {
		log.Fatal(err)
	}
	c.experiments = map[string]bool{}
	for _, x := range strings.Split(exps, ",") {
		c.experiments[strings.TrimSpace(x)] = true
	}
	for _, w := range strings.Split(workloads, ",") {
		if w = strings.ToUpper(strings.TrimSpace(w)); w != "" {
			c.workloads = append(c.workloads, w)
		}
	}
	if extra != "" {
		c.extraFlags = strings.Fields(extra)
	}
	if err := run(c); err != nil {
		log.Fatal(err)
	}
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := parse(f)
		if err != nil {
			return nil, fmt.Errorf("parse %q: %w", f, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func run(c config) error {
	if c.dir == "" {
		d, err := os.MkdirTemp("", "nilextbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		c.dir = d
	}
	if c.bin == "" {
		c.bin = filepath.Join(c.dir, "kefir")
		cmd := exec.Command("go", "build", "-o", c.bin, "./cmd/kefir")
		cmd.Dir = ".."
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build kefir (run from bench/): %w", err)
		}
	}
	fmt.Printf("# nilextbench %s\n\ncommand: `%s`\n\n", time.Now().UTC().Format(time.RFC3339), strings.Join(os.Args, " "))
	for _, n := range c.replicas {
		for _, d := range c.delays {
			if err := runGroup(c, n, d); err != nil {
				return fmt.Errorf("%d replicas, delay %v: %w", n, d, err)
			}
		}
	}
	return nil
}

// ---- the group ----

type group struct {
	n       int
	procs   []*exec.Cmd
	proxies []*faultproxy.Proxy
	clients []string // what clients dial: the client ports' proxies
	https   []string
}

func startGroup(c config, n int, delay time.Duration, dir string) (*group, error) {
	g := &group{n: n}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cport := func(i int) int { return c.port + i }
	pport := func(i int) int { return c.port + 100 + i }
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	var members []string
	for i := 1; i <= n; i++ {
		// One proxy per port, both directions delayed: each message crosses
		// exactly one of them, so every link has the same one-way delay.
		for _, port := range []int{cport(i), pport(i)} {
			p, err := faultproxy.Listen(addr(port+200), addr(port), uint64(port))
			if err != nil {
				g.stop()
				return nil, err
			}
			p.Delay(faultproxy.Up, delay, 0)
			p.Delay(faultproxy.Down, delay, 0)
			g.proxies = append(g.proxies, p)
		}
		members = append(members, fmt.Sprintf("%d@%s/%s", i, addr(pport(i)+200), addr(cport(i)+200)))
		g.clients = append(g.clients, addr(cport(i)+200))
		g.https = append(g.https, addr(c.port+400+i))
	}
	cluster := strconv.Itoa(int(rand.Uint32N(1_000_000)) + 1)
	for i := 1; i <= n; i++ {
		args := []string{"server", "--node-id", "n" + strconv.Itoa(i), "--dir", filepath.Join(dir, "n"+strconv.Itoa(i)),
			"--client-addr", addr(cport(i)), "--peer-addr", addr(pport(i)), "--http-addr", g.https[i-1],
			"--log-level", "warn", "--members", strings.Join(members, ","), "--replica-id", strconv.Itoa(i),
			"--cluster-id", cluster, "--bootstrap=true", "--nilext=true"}
		args = append(args, c.extraFlags...)
		cmd := exec.Command(c.bin, args...)
		cmd.Env = append(os.Environ(), "KEFIR_CLUSTER_SECRET=nilextbench-secret")
		lf, err := os.Create(filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
		if err != nil {
			g.stop()
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			g.stop()
			return nil, err
		}
		g.procs = append(g.procs, cmd)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := g.leader(); ok {
			return g, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.stop()
	return nil, errors.New("no leader within 20s (see the node logs)")
}

func (g *group) stop() {
	for _, p := range g.procs {
		if p.Process != nil {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range g.procs {
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	for _, p := range g.proxies {
		_ = p.Close()
	}
}

type status struct {
	Role        string `json:"role"`
	Replication *struct {
		Fsyncs uint64 `json:"log_fsyncs"`
		Nilext *struct {
			SlowReads uint64 `json:"slow_reads"`
		} `json:"nilext"`
	} `json:"replication"`
}

func (g *group) status(i int) (status, error) {
	var st status
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + g.https[i] + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func (g *group) leader() (int, bool) {
	for i := range g.n {
		if st, err := g.status(i); err == nil && st.Role == "leader" {
			return i, true
		}
	}
	return -1, false
}

// slowReads sums the slow-path read counters (only a leader counts them).
func (g *group) slowReads() uint64 {
	var n uint64
	for i := range g.n {
		if st, err := g.status(i); err == nil && st.Replication != nil && st.Replication.Nilext != nil {
			n += st.Replication.Nilext.SlowReads
		}
	}
	return n
}

// fsyncs sums the replicas' log fsyncs.
func (g *group) fsyncs() uint64 {
	var n uint64
	for i := range g.n {
		if st, err := g.status(i); err == nil && st.Replication != nil {
			n += st.Replication.Fsyncs
		}
	}
	return n
}

// serverTimes is, per replica, the summed time its RESP commands took
// (kefir_command_duration_seconds: from the arrival of a command's batch to
// the release of its replies, fsync waits included) and the summed duration
// and count of its replication-log fsync system calls
// (kefir_fsync_duration_seconds{log="replication"}), in seconds. A group's
// writes wait for replication-log fsyncs, so the single-node batch wait
// (kefir_fsync_wait_seconds) is always zero here.
type serverTimes struct{ cmd, fsyncSum, fsyncCount []float64 }

func (g *group) serverTimes() serverTimes {
	t := serverTimes{cmd: make([]float64, g.n), fsyncSum: make([]float64, g.n), fsyncCount: make([]float64, g.n)}
	hc := http.Client{Timeout: 2 * time.Second}
	for i := range g.n {
		resp, err := hc.Get("http://" + g.https[i] + "/metrics")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, val, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				continue
			}
			switch {
			case strings.HasPrefix(name, "kefir_command_duration_seconds_sum{"):
				t.cmd[i] += v
			case name == `kefir_fsync_duration_seconds_sum{log="replication"}`:
				t.fsyncSum[i] += v
			case name == `kefir_fsync_duration_seconds_count{log="replication"}`:
				t.fsyncCount[i] += v
			}
		}
	}
	return t
}

// cpuTimes is the CPU time (user + system) so far of the replica processes
// together and of this process (the clients and every delay proxy).
type cpuTimes struct{ replicas, bench time.Duration }

func (g *group) cpuTimes() cpuTimes {
	var t cpuTimes
	for _, p := range g.procs {
		if p.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
		if err != nil {
			continue
		}
		// Fields after the ")" closing the command name: state is field 3,
		// utime and stime are fields 14 and 15, in clock ticks (USER_HZ, 100).
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		t.replicas += time.Duration(ut+st) * 10 * time.Millisecond
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		t.bench = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return t
}

// ---- closed-loop runs ----

type mode int

const (
	ordered mode = iota
	nilext
)

func (m mode) String() string { return [...]string{"ordered", "nilext"}[m] }

type result struct {
	ops         int
	secs        float64
	w50, w99    time.Duration // write latency
	wmean       time.Duration
	r50, r99    time.Duration // read latency (YCSB)
	fast, falls uint64
	batches     uint64 // KEFIR.NILEXT BATCH commands sent (all members)
	items       uint64 // writes they carried
	reads       int
	slowReads   uint64
	errors      int
	fsyncs      uint64      // log fsyncs on all replicas during the run
	server      serverTimes // per replica: command and fsync-wait seconds during the run
	cpu         cpuTimes    // CPU used during the run
}

// cpuPerOp is the CPU (µs) per completed operation of the replicas together
// and of the bench process (clients and delay proxies).
func (r result) cpuPerOp() (replicas, bench float64) {
	n := float64(max(r.ops, 1))
	return float64(r.cpu.replicas) / 1e3 / n, float64(r.cpu.bench) / 1e3 / n
}

// serverMs is, per replica, the command time per completed write and the
// mean duration of one replication-log fsync (ms).
func (r result) serverMs() (cmd, fsync []float64) {
	w := float64(max(r.ops-r.reads, 1))
	for i := range r.server.cmd {
		cmd = append(cmd, 1e3*r.server.cmd[i]/w)
		fsync = append(fsync, 1e3*r.server.fsyncSum[i]/max(r.server.fsyncCount[i], 1))
	}
	return cmd, fsync
}

// fsyncsPerWrite: log fsyncs (all replicas) per completed write.
func (r result) fsyncsPerWrite() float64 {
	return float64(r.fsyncs) / float64(max(r.ops-r.reads, 1))
}

func (r result) tput() float64 { return float64(r.ops) / r.secs }

// batchSize is the writes per KEFIR.NILEXT BATCH the client sent (nilext).
func (r result) batchSize() float64 { return float64(r.items) / float64(max(r.batches, 1)) }

type workload struct {
	readFrac float64
	keys     func(*rand.Rand) uint64
	dur      client.Durability
}

func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[min(len(xs)-1, int(p*float64(len(xs))))]
}

func mean(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range xs {
		s += x
	}
	return s / time.Duration(len(xs))
}

// dialClients dials the clients of a run in mode m: k of them, one per
// closed-loop worker with one connection each, or with c.shared one client
// for all k workers. Both modes get the same options but WithNilext.
func (g *group) dialClients(c config, m mode, k int) ([]*client.Client, error) {
	var out []*client.Client
	n, pool := k, 1
	if c.shared {
		n, pool = 1, c.pool
	}
	for range n {
		opts := []client.Option{client.WithPoolSize(pool), client.WithRetryUnavailable(5 * time.Second)}
		if m == nilext {
			opts = append(opts, client.WithNilext(c.nxTimeout, 0), client.WithNilextConns(c.nxConns))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cl, err := client.Dial(ctx, g.clients, opts...)
		cancel()
		if err != nil {
			for _, x := range out {
				x.Close()
			}
			return nil, err
		}
		out = append(out, cl)
	}
	return out, nil
}

// measure runs k closed-loop workers in mode m: a warm-up, then c.round
// measured.
func (g *group) measure(c config, m mode, k int, w workload) (result, error) {
	cls, err := g.dialClients(c, m, k)
	if err != nil {
		return result{}, err
	}
	defer func() {
		for _, cl := range cls {
			cl.Close()
		}
	}()
	value := make([]byte, c.valueSize)
	for i := range value {
		value[i] = 'a' + byte(i%26)
	}
	var (
		mu             sync.Mutex
		wlat, rlat     []time.Duration
		ops, reads, ne int
		measuring      = make(chan struct{})
		stop           = make(chan struct{})
		wg             sync.WaitGroup
	)
	var slowBefore uint64
	for i := range k {
		cl := cls[i%len(cls)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			var myW, myR []time.Duration
			myOps, myReads, myErr := 0, 0, 0
			on := false
			for {
				select {
				case <-stop:
					mu.Lock()
					wlat, rlat = append(wlat, myW...), append(rlat, myR...)
					ops, reads, ne = ops+myOps, reads+myReads, ne+myErr
					mu.Unlock()
					return
				case <-measuring:
					on = true
				default:
				}
				key := fmt.Sprintf("user%012d", w.keys(rng))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				var err error
				read := rng.Float64() < w.readFrac
				if read {
					_, err = cl.Get(ctx, key, client.WithConsistency(client.Linearizable))
					if errors.Is(err, client.ErrNotFound) {
						err = nil
					}
				} else {
					err = cl.Put(ctx, key, value, client.WithDurability(w.dur))
				}
				d := time.Since(t0)
				cancel()
				if !on {
					continue
				}
				switch {
				case err != nil:
					myErr++
				case read:
					myR = append(myR, d)
					myReads++
					myOps++
				default:
					myW = append(myW, d)
					myOps++
				}
			}
		}()
	}
	time.Sleep(c.warmup)
	var before client.NilextStats
	for _, cl := range cls {
		s := cl.NilextStats()
		before.Fast += s.Fast
		before.Fallbacks += s.Fallbacks + s.Rested
		before.Batches += s.Batches
		before.Items += s.Items
	}
	if w.readFrac > 0 {
		slowBefore = g.slowReads()
	}
	fsBefore := g.fsyncs()
	stBefore := g.serverTimes()
	cpuBefore := g.cpuTimes()
	var prof *os.File
	if c.cpuProfile != "" && m == nilext {
		if prof, err = os.Create(fmt.Sprintf("%s-%s-%d", c.cpuProfile, w.dur, k)); err != nil {
			return result{}, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(prof); err != nil {
			prof.Close()
			return result{}, fmt.Errorf("cpu profile: %w", err)
		}
	}
	start := time.Now()
	close(measuring)
	time.Sleep(c.round)
	close(stop)
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	secs := time.Since(start).Seconds()
	cpuAfter := g.cpuTimes()
	fsAfter := g.fsyncs()
	stAfter := g.serverTimes()
	wg.Wait()
	r := result{ops: ops, secs: secs, reads: reads, errors: ne, fsyncs: fsAfter - fsBefore, server: stAfter,
		cpu: cpuTimes{cpuAfter.replicas - cpuBefore.replicas, cpuAfter.bench - cpuBefore.bench}}
	for i := range r.server.cmd {
		r.server.cmd[i] -= stBefore.cmd[i]
		r.server.fsyncSum[i] -= stBefore.fsyncSum[i]
		r.server.fsyncCount[i] -= stBefore.fsyncCount[i]
	}
	r.w50, r.w99, r.wmean = pct(wlat, 0.5), pct(wlat, 0.99), mean(wlat)
	r.r50, r.r99 = pct(rlat, 0.5), pct(rlat, 0.99)
	for _, cl := range cls {
		s := cl.NilextStats()
		r.fast += s.Fast
		r.falls += s.Fallbacks + s.Rested
		r.batches += s.Batches
		r.items += s.Items
	}
	r.fast -= before.Fast
	r.falls -= before.Fallbacks
	r.batches -= before.Batches
	r.items -= before.Items
	if w.readFrac > 0 {
		r.slowReads = g.slowReads() - slowBefore
	}
	return r, nil
}

// interleave runs both modes for rounds rounds, alternating which goes
// first, and returns each mode's runs.
func (g *group) interleave(c config, k int, w workload) (map[mode][]result, error) {
	out := map[mode][]result{}
	for r := range c.rounds {
		order := []mode{nilext, ordered}
		if r%2 == 1 {
			order = []mode{ordered, nilext}
		}
		for _, m := range order {
			res, err := g.measure(c, m, k, w)
			if err != nil {
				return nil, err
			}
			out[m] = append(out[m], res)
			fmt.Fprintf(os.Stderr, "  %s k=%d %s: %.0f ops/s w50=%v w99=%v r50=%v fast=%d fallback=%d slowreads=%d/%d errs=%d fsyncs/write=%.2f\n",
				w.dur, k, m, res.tput(), res.w50, res.w99, res.r50, res.fast, res.falls, res.slowReads, res.reads, res.errors, res.fsyncsPerWrite())
		}
	}
	return out, nil
}

// med returns the median over runs of f.
func med(rs []result, f func(result) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	slices.Sort(xs)
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)/2]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// breakdownRow is one row of the low-load "where the time goes" table.
func breakdownRow(d client.Durability, k int, m mode, rs []result, delay time.Duration) string {
	if len(rs) == 0 {
		return ""
	}
	n := len(rs[0].server.cmd)
	cmd, fsync := make([]string, n), make([]string, n)
	largest := 0.0
	for i := range n {
		c := med(rs, func(r result) float64 { v, _ := r.serverMs(); return v[i] })
		f := med(rs, func(r result) float64 { _, v := r.serverMs(); return v[i] })
		cmd[i], fsync[i] = fmt.Sprintf("%.3f", c), fmt.Sprintf("%.3f", f)
		largest = max(largest, c)
	}
	mean := med(rs, func(r result) float64 { return ms(r.wmean) })
	return fmt.Sprintf("| %s | %d | %s | %.3f | %s | %s | %.3f | %.3f |", d, k, m, mean, strings.Join(cmd, " / "),
		strings.Join(fsync, " / "), mean-largest, ms(2*delay))
}

func runGroup(c config, n int, delay time.Duration) error {
	dir := filepath.Join(c.dir, fmt.Sprintf("g%d-%v", n, delay))
	g, err := startGroup(c, n, delay, dir)
	if err != nil {
		return err
	}
	defer g.stop()
	fmt.Fprintf(os.Stderr, "group of %d, one-way delay %v: up\n", n, delay)
	fmt.Printf("## %d replicas, one-way delay %v on every link\n\n", n, delay)
	fmt.Printf("Client model (every table below; \"clients\" = closed-loop workers): %s.\n\n", c.clientModel())
	uniform := func(r *rand.Rand) uint64 { return r.Uint64N(uint64(c.records)) }
	if c.experiments["ping"] || c.experiments["low"] {
		// Calibration: one client-to-replica round trip through the proxies
		// (PING: no replication, no disk). A nilext write costs one such round
		// trip plus the replica's work; an ordered one two.
		p50, p99, err := g.pingLatency()
		if err != nil {
			return err
		}
		fmt.Printf("Calibration: PING round trip through the delay proxies p50 %.3f ms, p99 %.3f ms (ideal %.3f ms).\n\n", ms(p50), ms(p99), ms(2*delay))
	}
	if c.experiments["low"] {
		fmt.Printf("### Low load: write latency (ms, median of %d interleaved rounds of %v)\n\n", c.rounds, c.round)
		fmt.Println("| durability | clients | nilext p50 | ordered p50 | ratio p50 | nilext mean | ordered mean | ratio mean | nilext p99 | ordered p99 | fast / fallback writes | fsyncs per write nilext / ordered |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
		var breakdown []string
		for _, d := range c.durs {
			for _, k := range c.clients {
				rs, err := g.interleave(c, k, workload{keys: uniform, dur: d})
				if err != nil {
					return err
				}
				nx, od := rs[nilext], rs[ordered]
				n50, o50 := med(nx, func(r result) float64 { return ms(r.w50) }), med(od, func(r result) float64 { return ms(r.w50) })
				nm, om := med(nx, func(r result) float64 { return ms(r.wmean) }), med(od, func(r result) float64 { return ms(r.wmean) })
				var fast, falls uint64
				for _, r := range nx {
					fast, falls = fast+r.fast, falls+r.falls
				}
				fmt.Printf("| %s | %d | %.3f | %.3f | **%.2f** | %.3f | %.3f | %.2f | %.3f | %.3f | %d / %d | %.2f / %.2f |\n", d, k, n50, o50, n50/o50, nm, om, nm/om,
					med(nx, func(r result) float64 { return ms(r.w99) }), med(od, func(r result) float64 { return ms(r.w99) }), fast, falls,
					med(nx, result.fsyncsPerWrite), med(od, result.fsyncsPerWrite))
				for _, m := range []mode{nilext, ordered} {
					breakdown = append(breakdown, breakdownRow(d, k, m, rs[m], delay))
				}
			}
		}
		fmt.Println()
		fmt.Println("Where a write's time goes (ms per write, medians over rounds). *Replica command time*: each replica's")
		fmt.Println("`kefir_command_duration_seconds` per write, arrival of the command's batch to its reply (a nilext replica: d-log")
		fmt.Println("append, and its fsync at `sync`; the ordered leader: prepare, follower round trip, fsync). *Log fsync*: the mean")
		fmt.Println("duration of one replication-log fsync system call at each replica. *Outside the replicas*: client mean minus the largest replica")
		fmt.Println("command time — the client, the proxies and the wire; its ideal is the link delay it covers (2 one-way delays).")
		fmt.Println()
		fmt.Println("| durability | clients | path | client mean | replica command time (r1 / r2 / ...) | log fsync (r1 / r2 / ...) | outside the replicas | ideal outside |")
		fmt.Println("|---|---|---|---|---|---|---|---|")
		for _, row := range breakdown {
			fmt.Println(row)
		}
		fmt.Println()
	}
	if c.experiments["peak"] {
		for _, d := range c.durs {
			fmt.Printf("### Throughput vs latency, %s writes (median of %d rounds of %v)\n\n", d, c.rounds, c.round)
			fmt.Println("CPU µs per write: the replica processes together / this process (clients and delay proxies); the box has 2 cores.")
			fmt.Println()
			fmt.Println("| clients | nilext ops/s | nilext p50 ms | nilext mean ms | nilext CPU µs/write | nilext writes per BATCH | nilext fallbacks (all rounds) | ordered ops/s | ordered p50 ms | ordered mean ms | ordered CPU µs/write |")
			fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
			type pt struct{ tput, p50, mean, cpuR, cpuB, batch float64 }
			var nxs, ods []pt
			for _, k := range c.peakClients {
				rs, err := g.interleave(c, k, workload{keys: uniform, dur: d})
				if err != nil {
					return err
				}
				f := func(rs []result) pt {
					return pt{med(rs, result.tput), med(rs, func(r result) float64 { return ms(r.w50) }), med(rs, func(r result) float64 { return ms(r.wmean) }),
						med(rs, func(r result) float64 { v, _ := r.cpuPerOp(); return v }), med(rs, func(r result) float64 { _, v := r.cpuPerOp(); return v }),
						med(rs, result.batchSize)}
				}
				a, b := f(rs[nilext]), f(rs[ordered])
				// Fallbacks took the ordered path: a round with many is not
				// fast-path throughput.
				var fast, falls uint64
				for _, r := range rs[nilext] {
					fast, falls = fast+r.fast, falls+r.falls
				}
				nxs, ods = append(nxs, a), append(ods, b)
				fmt.Printf("| %d | %.0f | %.3f | %.3f | %.0f / %.0f | %.1f | %.1f%% (%d of %d) | %.0f | %.3f | %.3f | %.0f / %.0f |\n", k, a.tput, a.p50, a.mean, a.cpuR, a.cpuB, a.batch,
					100*float64(falls)/float64(max(fast+falls, 1)), falls, fast+falls, b.tput, b.p50, b.mean, b.cpuR, b.cpuB)
			}
			best := 0
			for i := range ods {
				if ods[i].tput > ods[best].tput {
					best = i
				}
			}
			at := -1
			for i := range nxs {
				if nxs[i].tput >= ods[best].tput {
					at = i
					break
				}
			}
			fmt.Printf("\nOrdered peak: %.0f ops/s at %d clients, mean %.3f ms. ", ods[best].tput, c.peakClients[best], ods[best].mean)
			if at < 0 {
				fmt.Printf("Nilext never reached it (best %.0f ops/s).\n\n", slices.MaxFunc(nxs, func(a, b pt) int { return int(a.tput - b.tput) }).tput)
			} else {
				fmt.Printf("Nilext delivers it at %d clients with mean %.3f ms: **%.2f×** the ordered latency.\n\n", c.peakClients[at], nxs[at].mean, nxs[at].mean/ods[best].mean)
			}
		}
	}
	if c.experiments["ycsb"] && len(c.workloads) > 0 {
		if err := preload(g, c); err != nil {
			return err
		}
		z := gen.NewScrambledZipfian(uint64(c.records), 0.99)
		keys := func(r *rand.Rand) uint64 { return z.Next(r) }
		for _, d := range c.durs {
			fmt.Printf("### YCSB, zipfian over %d keys, %d clients, %s updates, linearizable reads (median of %d rounds of %v)\n\n", c.records, c.ycsbClients, d, c.rounds, c.round)
			fmt.Println("| workload | fast path | ops/s | read p50 ms | read p99 ms | update p50 ms | update p99 ms | slow-path reads |")
			fmt.Println("|---|---|---|---|---|---|---|---|")
			for _, wl := range c.workloads {
				frac := map[string]float64{"A": 0.5, "B": 0.95, "C": 1}[wl]
				rs, err := g.interleave(c, c.ycsbClients, workload{readFrac: frac, keys: keys, dur: d})
				if err != nil {
					return err
				}
				for _, m := range []mode{nilext, ordered} {
					var slow uint64
					reads := 0
					for _, r := range rs[m] {
						slow, reads = slow+r.slowReads, reads+r.reads
					}
					on := map[mode]string{nilext: "on", ordered: "off"}[m]
					fmt.Printf("| %s | %s | %.0f | %.3f | %.3f | %.3f | %.3f | %.2f%% (%d of %d) |\n", wl, on, med(rs[m], result.tput),
						med(rs[m], func(r result) float64 { return ms(r.r50) }), med(rs[m], func(r result) float64 { return ms(r.r99) }),
						med(rs[m], func(r result) float64 { return ms(r.w50) }), med(rs[m], func(r result) float64 { return ms(r.w99) }),
						100*float64(slow)/float64(max(reads, 1)), slow, reads)
				}
			}
			fmt.Println()
		}
	}
	return nil
}

// pingLatency measures PING round trips from one client for a second.
func (g *group) pingLatency() (p50, p99 time.Duration, err error) {
	cl, err := client.Dial(context.Background(), g.clients[:1], client.WithPoolSize(1))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	var lat []time.Duration
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		t0 := time.Now()
		if err := cl.Ping(context.Background()); err != nil {
			return 0, 0, err
		}
		lat = append(lat, time.Since(t0))
	}
	return pct(lat, 0.5), pct(lat, 0.99), nil
}

// preload writes every YCSB key once, on the ordered path, in batches.
func preload(g *group, c config) error {
	cl, err := client.Dial(context.Background(), g.clients, client.WithPoolSize(4), client.WithRetryUnavailable(20*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	value := make([]byte, c.valueSize)
	const batch = 100
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	sem := make(chan struct{}, 8)
	for lo := 0; lo < c.records; lo += batch {
		kvs := make([]client.KV, 0, batch)
		for i := lo; i < min(lo+batch, c.records); i++ {
			kvs = append(kvs, client.KV{Key: fmt.Sprintf("user%012d", i), Value: value})
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := cl.MultiPut(ctx, kvs, client.WithDurability(client.CAD)); err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return fmt.Errorf("preload: %w", err)
	default:
		return nil
	}
}
