package ycsb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/ycsb/gen"
)

// Config says how the clients drive the DB.
type Config struct {
	// Clients is the number of concurrent clients, each with its own DB handle.
	Clients int
	// Target is the total offered rate in operations per second. 0 = closed loop: each
	// client issues its next operation when the previous one completes. > 0 = open loop:
	// operations are scheduled at fixed intervals, and latency is measured from the
	// scheduled (intended) start.
	Target float64
	// Warmup runs before measurement starts; its operations are not recorded.
	Warmup time.Duration
	// Duration is the measured time.
	Duration time.Duration
	// Seed makes key and operation choices repeatable (clients derive their own streams).
	Seed uint64
	// Progress, if set, is called every ProgressEvery (default one second) during the
	// measured window with the measurement so far, from a goroutine of Run's; Run does
	// not return before the last call has. It is what `kefir bench` prints while it runs.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// Window, if set, is called when the measured window begins (true) and when it ends
	// (false), from a goroutine of Run's: for samplers of what the window cost outside
	// this process (a server's CPU time, bytes written), which must cover the window
	// the operations were counted in, not the warm-up. When Run returns without error
	// both calls have been made; when ctx ends first, the second may never come.
	Window func(begin bool)

	// serviceTime measures latency from when an operation was actually sent, i.e. with
	// coordinated omission. Only tests set it, to show what the default guards against.
	serviceTime bool
}

// Progress is the measurement so far, for Config.Progress.
type Progress struct {
	// Elapsed is the time since the measured window began; At is when this
	// interval closed, on the wall clock (for lining the intervals up with
	// events outside the run).
	Elapsed time.Duration
	At      time.Time
	// Ops and Errors count operations completed in the window so far.
	Ops, Errors int64
	// IntervalOps is how many of them completed since the previous call, in Interval.
	IntervalOps int64
	Interval    time.Duration
	// P50Us and P99Us are over every operation of the window so far, all types together.
	P50Us, P99Us float64
}

// NewDB opens client number i's handle on the system under test.
type NewDB func(client int) (DB, error)

// OpStats is one operation type's measurement.
type OpStats struct {
	Op         string  `json:"op"`
	Count      int64   `json:"count"`
	Errors     int64   `json:"errors"`
	NotFound   int64   `json:"not_found"`
	Throughput float64 `json:"ops_per_sec"`
	MeanUs     float64 `json:"mean_us"`
	P50Us      float64 `json:"p50_us"`
	P95Us      float64 `json:"p95_us"`
	P99Us      float64 `json:"p99_us"`
	P999Us     float64 `json:"p999_us"`
	MaxUs      float64 `json:"max_us"`
	// CDF is the latency distribution at fixed percentiles, for plots.
	CDF []Quantile `json:"cdf,omitempty"`
	// Histogram is the latency histogram (nanoseconds), for merging runs.
	Histogram *Histogram `json:"-"`
}

// Quantile is one point of a latency distribution.
type Quantile struct {
	Percentile float64 `json:"p"`
	Us         float64 `json:"us"`
}

// cdfPercentiles are where OpStats.CDF samples the distribution: dense in the tail,
// where the systems differ.
var cdfPercentiles = []float64{1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97, 98, 99, 99.5, 99.7, 99.9, 99.95, 99.99, 99.999, 100}

// Result is one phase's measurement.
type Result struct {
	Workload   string    `json:"workload"`
	Phase      string    `json:"phase"` // load or run
	Mode       string    `json:"mode"`  // closed or open
	Clients    int       `json:"clients"`
	Target     float64   `json:"target_ops_per_sec,omitempty"`
	Seconds    float64   `json:"seconds"`
	Ops        int64     `json:"ops"`
	Errors     int64     `json:"errors"`
	Throughput float64   `json:"ops_per_sec"`
	PerOp      []OpStats `json:"per_op"`
	// Backlog counts open-loop operations that were due before the end but never sent
	// because the system fell behind: each of them would have had a latency at least as
	// long as the lag, so a non-zero backlog means the target rate was not sustained.
	Backlog int64 `json:"backlog,omitempty"`
	// Retries counts load-phase inserts that failed and were sent again (see Load).
	Retries int64 `json:"retries,omitempty"`
	// ProcessCPUUsPerOp is the CPU time (user + system) this whole process spent during
	// the measured window, per operation completed in it: the harness, the client
	// library, and an in-process server if there is one (respserver). Against an
	// external server it is what one operation costs the client side; unlike
	// throughput, it barely moves when other processes compete for the cores.
	ProcessCPUUsPerOp float64  `json:"process_cpu_us_per_op,omitempty"`
	FirstErrors       []string `json:"first_errors,omitempty"`
}

// processCPU is the user + system CPU time this process has used so far (0 if the
// system cannot say).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func newHist() *Histogram { return &Histogram{} }

// clientStats is one client's measurement, merged at the end.
type clientStats struct {
	// mu lets the progress reporter read a client's figures while it runs; the client
	// is its only other user, so the lock is uncontended except once per report.
	mu   sync.Mutex
	hist [numOps]*Histogram
	// pending holds latencies not yet in hist: recording them a batch at a time keeps
	// the histogram's counts (up to ≈ 150 KiB each for latencies under 100 ms, one per
	// client and operation type) out of the cache between batches, instead of touching
	// one of them per operation.
	pending   [numOps][]int64
	count     [numOps]int64
	errs      [numOps]int64
	notFound  [numOps]int64
	backlog   int64
	retries   int64
	firstErrs []string
}

func (s *clientStats) record(op Op, lat time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotFound):
		s.notFound[op]++
	case err != nil:
		s.errs[op]++
		if len(s.firstErrs) < 3 {
			s.firstErrs = append(s.firstErrs, fmt.Sprintf("%s: %v", op, err))
		}
		return // a failed operation's latency is not a latency of the system's service
	}
	if s.pending[op] == nil {
		s.pending[op] = make([]int64, 0, pendingBatch)
	}
	s.pending[op] = append(s.pending[op], int64(lat))
	if len(s.pending[op]) == pendingBatch {
		s.flush(op)
	}
	s.count[op]++
}

// pendingBatch is how many latencies a client keeps before recording them.
const pendingBatch = 512

// flush records op's pending latencies into its histogram.
func (s *clientStats) flush(op Op) {
	if len(s.pending[op]) == 0 {
		return
	}
	if s.hist[op] == nil {
		s.hist[op] = newHist()
	}
	for _, v := range s.pending[op] {
		s.hist[op].Record(v)
	}
	s.pending[op] = s.pending[op][:0]
}

// snapshot returns the clients' operations and errors so far and one histogram of
// every latency recorded, all operation types together.
func snapshot(all []*clientStats) (ops, errs int64, h *Histogram) {
	h = newHist()
	for _, c := range all {
		c.mu.Lock()
		for op := range numOps {
			c.flush(op)
			h.Merge(c.hist[op])
			ops += c.count[op]
			errs += c.errs[op]
		}
		c.mu.Unlock()
	}
	return ops, errs, h
}

// reportProgress calls cfg.Progress every cfg.ProgressEvery from measureFrom until end,
// or until stop is closed.
func reportProgress(cfg Config, all []*clientStats, measureFrom, end time.Time, stop <-chan struct{}) {
	every := cfg.ProgressEvery
	if every <= 0 {
		every = time.Second
	}
	select {
	case <-time.After(time.Until(measureFrom)):
	case <-stop:
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var lastOps int64
	last := measureFrom
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			if now.After(end) {
				return
			}
			ops, errs, h := snapshot(all)
			cfg.Progress(Progress{Elapsed: now.Sub(measureFrom), At: now, Ops: ops, Errors: errs,
				IntervalOps: ops - lastOps, Interval: now.Sub(last),
				P50Us: float64(h.ValueAtQuantile(50)) / 1e3, P99Us: float64(h.ValueAtQuantile(99)) / 1e3})
			lastOps, last = ops, now
		}
	}
}

// merge folds client results into one Result over the measured window.
func merge(w Workload, phase string, cfg Config, window time.Duration, all []*clientStats) *Result {
	res := &Result{Workload: w.Name, Phase: phase, Mode: "closed", Clients: cfg.Clients, Seconds: window.Seconds()}
	if cfg.Target > 0 {
		res.Mode, res.Target = "open", cfg.Target
	}
	for op := range numOps {
		h := newHist()
		var st OpStats
		st.Op = op.String()
		for _, c := range all {
			c.flush(op)
			if c.hist[op] != nil {
				h.Merge(c.hist[op])
			}
			st.Count += c.count[op]
			st.Errors += c.errs[op]
			st.NotFound += c.notFound[op]
		}
		if st.Count+st.Errors+st.NotFound == 0 {
			continue
		}
		us := func(v int64) float64 { return float64(v) / 1e3 }
		st.Throughput = float64(st.Count) / window.Seconds()
		st.MeanUs, st.P50Us, st.P95Us = h.Mean()/1e3, us(h.ValueAtQuantile(50)), us(h.ValueAtQuantile(95))
		st.P99Us, st.P999Us, st.MaxUs = us(h.ValueAtQuantile(99)), us(h.ValueAtQuantile(99.9)), us(h.Max())
		st.Histogram = h
		for _, p := range cdfPercentiles {
			st.CDF = append(st.CDF, Quantile{Percentile: p, Us: us(h.ValueAtQuantile(p))})
		}
		res.Ops += st.Count
		res.Errors += st.Errors
		res.PerOp = append(res.PerOp, st)
	}
	for _, c := range all {
		res.Backlog += c.backlog
		res.Retries += c.retries
		if len(res.FirstErrors) < 5 {
			res.FirstErrors = append(res.FirstErrors, c.firstErrs...)
		}
	}
	res.Throughput = float64(res.Ops) / window.Seconds()
	return res
}

// values is one pre-generated random buffer that every write takes its value from: a
// value is a slice of it at a random offset, so values differ from write to write (one
// of valueOffsets) without the harness generating bytes per operation, and no client
// needs a buffer of its own. Nothing writes to the buffer after it is made, so a driver
// that keeps a value (or sends it after the call returned) still sends what was chosen.
type values struct {
	buf  []byte
	size int
}

// valueOffsets is how many distinct values a run writes.
const valueOffsets = 4096

func newValues(size int, seed uint64) values {
	r := rand.New(rand.NewPCG(seed, 0x7a1e))
	b := make([]byte, size+valueOffsets)
	for i := range b {
		b[i] = 'a' + byte(r.Uint32()%26)
	}
	return values{buf: b, size: size}
}

// next returns a value for one write.
func (v values) next(r *rand.Rand) []byte {
	off := r.IntN(valueOffsets)
	return v.buf[off : off+v.size : off+v.size]
}

// keyTable holds the key names of records [0, len), built once per phase, so an
// operation on a loaded record costs the harness an index instead of a hash, a decimal
// formatting and a string allocation. Keys past the table (inserted during the run, or a
// record count over maxKeyTable) are named on the fly.
//
// The names are one string and the offsets into it, not a []string: a table of 100,000
// strings is 100,000 pointers and objects the harness's garbage collector marks in every
// cycle, and a scan-heavy run (YCSB E, whose clients allocate ~100 KB per scan) collects
// ~90 times a second — the table's marking was a cost of every client the harness drives,
// counted in its client CPU per operation (docs/design/scans.md, "The harness's own cost").
type keyTable struct {
	w    Workload
	all  string   // every name, back to back
	ends []uint32 // ends[i]: the end of record i's name in all
}

// maxKeyTable bounds the table (≈ 30 bytes a key: all stays far below ends' 4 GiB).
const maxKeyTable = 1 << 21

// lastKeys is the most recent table: a matrix runs every cell of every system over the
// same records, so it is built once, not once per cell. Tables are never modified.
var lastKeys struct {
	sync.Mutex
	t keyTable
}

func newKeyTable(w Workload) keyTable {
	lastKeys.Lock()
	defer lastKeys.Unlock()
	if t := lastKeys.t; t.ends != nil && t.w.RecordCount == w.RecordCount && t.w.OrderedInserts == w.OrderedInserts {
		return keyTable{w: w, all: t.all, ends: t.ends}
	}
	t := buildKeyTable(w)
	lastKeys.t = t
	return t
}

func buildKeyTable(w Workload) keyTable {
	n := min(w.RecordCount, maxKeyTable)
	t := keyTable{w: w, ends: make([]uint32, n)}
	var all, name []byte
	for i := range n {
		name = w.KeyName(name, i)
		all = append(all, name...)
		t.ends[i] = uint32(len(all))
	}
	t.all = string(all)
	return t
}

// key returns record k's key; scratch is the caller's buffer for keys past the table.
func (t keyTable) key(k uint64, scratch *[]byte) string {
	if k < uint64(len(t.ends)) {
		start := uint32(0)
		if k > 0 {
			start = t.ends[k-1]
		}
		return t.all[start:t.ends[k]]
	}
	*scratch = t.w.KeyName(*scratch, k)
	return string(*scratch)
}

// loadAttempts bounds how often Load sends one record: a replicated system may fail an
// insert across a leader change with an unknown outcome, and an insert is an idempotent
// put, so sending it again is safe; the retries are counted in Result.Retries, and a
// record that fails every attempt is an error that fails the load.
const loadAttempts = 4

// Load inserts records [0, RecordCount) with clients inserting in parallel (client c
// takes every clients-th record), as YCSB's load phase does.
func Load(ctx context.Context, w Workload, newDB NewDB, clients int) (*Result, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	cfg := Config{Clients: clients}
	all := make([]*clientStats, clients)
	var wg sync.WaitGroup
	var openErr error
	var mu sync.Mutex
	vals := newValues(w.ValueSize, 0x5eed)
	start := time.Now()
	for c := range clients {
		all[c] = &clientStats{}
		db, err := newDB(c)
		if err != nil {
			mu.Lock()
			openErr = errors.Join(openErr, fmt.Errorf("client %d: %w", c, err))
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer db.Close()
			st := all[c]
			r := rand.New(rand.NewPCG(uint64(c), 0x5eed))
			var key []byte
			for k := uint64(c); k < w.RecordCount && ctx.Err() == nil; k += uint64(clients) {
				key = w.KeyName(key, k)
				val := vals.next(r)
				t := time.Now()
				err := db.Insert(ctx, string(key), val)
				for a := 1; err != nil && a < loadAttempts && ctx.Err() == nil; a++ {
					st.retries++
					time.Sleep(time.Duration(a) * 50 * time.Millisecond)
					err = db.Insert(ctx, string(key), val)
				}
				st.record(OpInsert, time.Since(t), err)
			}
		}()
	}
	wg.Wait()
	if openErr != nil {
		return nil, openErr
	}
	return merge(w, "load", cfg, time.Since(start), all), ctx.Err()
}

// Run runs the workload's transaction phase over records already loaded.
func Run(ctx context.Context, w Workload, newDB NewDB, cfg Config) (*Result, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clients < 1 || cfg.Duration <= 0 {
		return nil, errors.New("ycsb run: need at least one client and a positive duration")
	}
	counter := gen.NewCounter(w.RecordCount)
	var chooser gen.Chooser
	switch w.RequestDistribution {
	case "uniform":
		chooser = gen.Uniform{N: w.RecordCount}
	case "zipfian":
		chooser = gen.NewScrambledZipfian(w.RecordCount, w.ZipfianTheta)
	case "latest":
		chooser = gen.NewLatest(counter, w.ZipfianTheta)
	}
	cum := w.cumulative()
	keys := newKeyTable(w)
	vals := newValues(w.ValueSize, cfg.Seed)

	dbs := make([]DB, cfg.Clients)
	for c := range dbs {
		db, err := newDB(c)
		if err != nil {
			for _, d := range dbs[:c] {
				d.Close()
			}
			return nil, fmt.Errorf("client %d: %w", c, err)
		}
		dbs[c] = db
	}

	all := make([]*clientStats, cfg.Clients)
	var ackErr atomic.Pointer[error]
	t0 := time.Now()
	measureFrom := t0.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	// Open loop: each client runs at Target/Clients, offset so the clients' schedules
	// interleave evenly instead of firing together.
	var interval time.Duration
	if cfg.Target > 0 {
		interval = time.Duration(float64(time.Second) * float64(cfg.Clients) / cfg.Target)
		if interval <= 0 {
			return nil, fmt.Errorf("ycsb run: target %v ops/s is beyond nanosecond scheduling", cfg.Target)
		}
	}
	// The process's CPU time over the measured window, sampled by a goroutine that
	// sleeps through the warm-up and the window (it costs two getrusage calls).
	cpuWindow := make(chan time.Duration, 1)
	go func() {
		time.Sleep(time.Until(measureFrom))
		if cfg.Window != nil {
			cfg.Window(true)
		}
		before := processCPU()
		time.Sleep(time.Until(end))
		cpu := processCPU() - before
		if cfg.Window != nil {
			cfg.Window(false)
		}
		cpuWindow <- cpu
	}()
	for c := range all {
		all[c] = &clientStats{}
	}
	stopProgress := make(chan struct{})
	var progressDone sync.WaitGroup
	if cfg.Progress != nil {
		progressDone.Add(1)
		go func() {
			defer progressDone.Done()
			reportProgress(cfg, all, measureFrom, end, stopProgress)
		}()
	}
	var wg sync.WaitGroup
	for c := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, st := dbs[c], all[c]
			r := rand.New(rand.NewPCG(cfg.Seed, uint64(c)+1))
			var scratch []byte
			next := t0.Add(interval * time.Duration(c) / time.Duration(cfg.Clients))
			for ctx.Err() == nil {
				now := time.Now()
				intended := now
				if interval > 0 {
					if now.Before(next) {
						time.Sleep(next.Sub(now))
					}
					intended, next = next, next.Add(interval)
					if now = time.Now(); !now.Before(end) {
						// Due before the end but never sent: the system fell behind.
						if intended.Before(end) {
							st.backlog += int64(end.Sub(intended)/interval) + 1
						}
						return
					}
				}
				if !intended.Before(end) {
					return
				}
				if cfg.serviceTime {
					intended = time.Now()
				}
				x := r.Float64()
				op := OpRead
				for x >= cum[op] {
					op++
				}
				var err error
				switch op {
				case OpRead:
					_, err = db.Read(ctx, keys.key(chooser.Next(r), &scratch))
				case OpUpdate:
					err = db.Update(ctx, keys.key(chooser.Next(r), &scratch), vals.next(r))
				case OpInsert:
					k := counter.Next()
					err = db.Insert(ctx, keys.key(k, &scratch), vals.next(r))
					// Acknowledge even a failed insert, as YCSB does, so one failure does
					// not freeze the latest distribution; the failure is counted.
					if aerr := counter.Ack(k); aerr != nil {
						ackErr.CompareAndSwap(nil, &aerr)
					}
				case OpScan:
					_, err = db.Scan(ctx, keys.key(chooser.Next(r), &scratch), 1+r.IntN(w.MaxScanLength))
				case OpRMW:
					key := keys.key(chooser.Next(r), &scratch)
					if _, err = db.Read(ctx, key); err == nil {
						err = db.Update(ctx, key, vals.next(r))
					}
				}
				if err != nil && ctx.Err() != nil {
					// Cut short by the run's own end (Ctrl-C in kefir bench, a cell's
					// deadline in the matrix): the caller's doing, not the system's
					// error, and not a latency of its service either.
					return
				}
				if !intended.Before(measureFrom) {
					st.record(op, time.Since(intended), err)
				}
			}
		}()
	}
	wg.Wait()
	close(stopProgress)
	progressDone.Wait()
	window := time.Since(measureFrom)
	if cfg.Target > 0 {
		window = cfg.Duration
	}
	var closeErr error
	for _, d := range dbs {
		closeErr = errors.Join(closeErr, d.Close())
	}
	res := merge(w, "run", cfg, window, all)
	select {
	case cpu := <-cpuWindow:
		if cpu > 0 && res.Ops > 0 {
			res.ProcessCPUUsPerOp = float64(cpu) / 1e3 / float64(res.Ops)
		}
	case <-ctx.Done(): // cut short: the window never ended
	}
	if p := ackErr.Load(); p != nil {
		return res, *p
	}
	if closeErr != nil {
		return res, fmt.Errorf("closing clients: %w", closeErr)
	}
	return res, ctx.Err()
}
