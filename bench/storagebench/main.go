package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/kefirdb/kefir/bench/limits"
	"github.com/kefirdb/kefir/internal/ycsb/gen"
)

// options are the command's flags.
type options struct {
	dir        string
	engines    []string
	runs       int
	dur        time.Duration
	warm       time.Duration
	writers    []int
	values     []int
	n          int
	getValue   int
	readers    int
	scanLen    int
	cache      int64
	phases     map[string]bool
	mdPath     string
	jsonPath   string
	profileDir string
	memChild   string
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("storagebench", flag.ContinueOnError)
	o := &options{}
	var engines, writers, values, phases string
	fs.StringVar(&o.dir, "dir", "", "scratch directory for the databases (default: a new directory under $TMPDIR; must be a real disk, not tmpfs)")
	fs.StringVar(&engines, "engines", strings.Join(engineOrder, ","), "engines to compare; ratios are against pebble")
	fs.IntVar(&o.runs, "runs", 3, "runs per cell; the report shows medians")
	fs.DurationVar(&o.dur, "d", time.Second, "measured duration of each put/get/scan cell")
	fs.DurationVar(&o.warm, "warmup", 200*time.Millisecond, "unmeasured warm-up before each put/get/scan cell")
	fs.StringVar(&writers, "writers", "1,16,64", "concurrent writer counts for the put cells")
	fs.StringVar(&values, "values", "100,1024", "value sizes in bytes for the put cells")
	fs.IntVar(&o.n, "n", 1_000_000, "keys preloaded for the get, scan, reopen and memory cells")
	fs.IntVar(&o.getValue, "getvalue", 100, "value size of the preloaded keys")
	fs.IntVar(&o.readers, "readers", 4, "concurrent readers in the get and scan cells")
	fs.IntVar(&o.scanLen, "scan", 100, "keys per range scan")
	fs.Int64Var(&o.cache, "cache", 64<<20, "cache bytes for every engine that has one (Kefir value cache, Pebble block cache)")
	fs.StringVar(&phases, "phases", "put,get,scan,reopen,mem", "phases to run")
	fs.StringVar(&o.mdPath, "md", "", "also write the Markdown report to this file")
	fs.StringVar(&o.jsonPath, "json", "", "write the JSON results to this file")
	fs.StringVar(&o.profileDir, "profile-dir", "", "write CPU profiles of Kefir's cells (first run) and a heap profile of its memory cell here")
	fs.StringVar(&o.memChild, "mem-child", "", "internal: measure one engine's memory per key in this process and print JSON")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if o.writers, err = parseInts(writers); err != nil {
		return nil, fmt.Errorf("-writers: %w", err)
	}
	if o.values, err = parseInts(values); err != nil {
		return nil, fmt.Errorf("-values: %w", err)
	}
	for _, e := range strings.Split(engines, ",") {
		if e = strings.TrimSpace(e); e != "" {
			o.engines = append(o.engines, e)
		}
	}
	o.phases = map[string]bool{}
	for _, p := range strings.Split(phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "put", "get", "scan", "reopen", "mem":
			o.phases[p] = true
		case "":
		default:
			return nil, fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	if o.runs < 1 || o.n < 1 || o.readers < 1 || o.scanLen < 1 || o.getValue < 1 {
		return nil, errors.New("-runs, -n, -readers, -scan and -getvalue must be positive")
	}
	return o, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "storagebench:", err)
		os.Exit(2)
	}
	if o.memChild != "" {
		m, err := measureMem(o)
		if err == nil {
			err = json.NewEncoder(os.Stdout).Encode(m)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "storagebench mem-child:", err)
			os.Exit(1)
		}
		return
	}
	rep, err := run(o, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "storagebench:", err)
		os.Exit(1)
	}
	rep.Command = "go run ./storagebench " + strings.Join(os.Args[1:], " ")
	md := rep.Markdown()
	fmt.Print(md)
	if o.mdPath != "" {
		if err := os.WriteFile(o.mdPath, []byte(md), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "storagebench:", err)
			os.Exit(1)
		}
	}
	if o.jsonPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "storagebench:", err)
			os.Exit(1)
		}
	}
}

// ---- keys and values ----

const keySize = 16

// putKey writes key number i: a scrambled 8-byte prefix (so consecutive numbers land all
// over the key order, like hashed user keys) followed by i itself (so keys are unique and
// a reader can tell which value a key must hold).
func putKey(dst []byte, i uint64) []byte {
	dst = binary.BigEndian.AppendUint64(dst[:0], gen.FNV64(i))
	return binary.BigEndian.AppendUint64(dst, i)
}

// keyNum recovers i from putKey(i).
func keyNum(k []byte) uint64 { return binary.BigEndian.Uint64(k[8:]) }

// valuePool is random bytes values are sliced from: random so no engine gains from
// compression, shared so loading N keys does not allocate N values.
type valuePool struct{ buf []byte }

func newValuePool(maxSize int) *valuePool {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20+maxSize)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	return &valuePool{buf: buf}
}

// value returns key i's value of the given size: a deterministic function of i, so a
// reader can verify what it got.
func (p *valuePool) value(i uint64, size int) []byte {
	off := int(gen.FNV64(i^0x9e3779b97f4a7c15) % uint64(len(p.buf)-size))
	return p.buf[off : off+size : off+size]
}

// ---- results ----

// Cell is one measured workload: per engine, one sample per run.
type Cell struct {
	Name    string               `json:"name"`
	Unit    string               `json:"unit"`
	Higher  bool                 `json:"higher_is_better"`
	Samples map[string][]float64 `json:"samples"`
	// P50us and P99us are per-operation latency percentiles (microseconds), per run.
	P50us map[string][]float64 `json:"p50_us,omitempty"`
	P99us map[string][]float64 `json:"p99_us,omitempty"`
	// Extra holds secondary figures (e.g. RSS per key next to heap per key).
	Extra  map[string]map[string][]float64 `json:"extra,omitempty"`
	Target *Target                         `json:"target,omitempty"`
	// Ratios are Kefir's figure over Pebble's, run by run (see pairedRatios).
	Ratios []float64 `json:"kefir_over_pebble_per_run,omitempty"`
}

// Target is issue 2's bar for Kefir in this cell.
type Target struct {
	// RatioVsPebble: Kefir's median must be ≥ this multiple of Pebble's (throughputs).
	RatioVsPebble float64 `json:"ratio_vs_pebble,omitempty"`
	// Max: Kefir's median must be ≤ this (times, bytes).
	Max  float64 `json:"max,omitempty"`
	Text string  `json:"text"`
}

func (c *Cell) add(engine string, v float64) {
	if c.Samples == nil {
		c.Samples = map[string][]float64{}
	}
	c.Samples[engine] = append(c.Samples[engine], v)
}

func (c *Cell) addLatency(engine string, h *hdr.Histogram) {
	if c.P50us == nil {
		c.P50us, c.P99us = map[string][]float64{}, map[string][]float64{}
	}
	c.P50us[engine] = append(c.P50us[engine], float64(h.ValueAtQuantile(50))/1e3)
	c.P99us[engine] = append(c.P99us[engine], float64(h.ValueAtQuantile(99))/1e3)
}

func (c *Cell) addExtra(name, engine string, v float64) {
	if c.Extra == nil {
		c.Extra = map[string]map[string][]float64{}
	}
	if c.Extra[name] == nil {
		c.Extra[name] = map[string][]float64{}
	}
	c.Extra[name][engine] = append(c.Extra[name][engine], v)
}

// Report is the whole result, as written to JSON.
type Report struct {
	Command string         `json:"command"`
	Started time.Time      `json:"started"`
	Elapsed string         `json:"elapsed"`
	Machine map[string]any `json:"machine"`
	Config  map[string]any `json:"config"`
	Engines []string       `json:"engines"`
	Cells   []*Cell        `json:"cells"`
	Notes   []string       `json:"notes"`
	// Limits are this machine's floors, measured at the start in the scratch directory.
	Limits *limits.Result `json:"limits,omitempty"`
}

// ---- the run ----

// bench holds what the phases share.
type bench struct {
	o      *options
	log    *os.File
	pool   *valuePool
	root   string
	loaded map[string]Engine // the preloaded engines, by name
	keys   [][]byte          // the preloaded keys, sorted
}

func run(o *options, logw *os.File) (*Report, error) {
	for _, e := range o.engines {
		if openers[e] == nil {
			return nil, fmt.Errorf("engine %q not available (built with -tags nokefir?)", e)
		}
	}
	root := o.dir
	if root == "" {
		var err error
		if root, err = os.MkdirTemp("", "kefir-storagebench-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(root)
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if isTmpfs(root) {
		return nil, fmt.Errorf("%s is on tmpfs: fsync would cost nothing and the put figures would be meaningless; pass -dir on a real disk", root)
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	maxVal := o.getValue
	for _, v := range o.values {
		maxVal = max(maxVal, v)
	}
	b := &bench{o: o, log: logw, pool: newValuePool(maxVal), root: root, loaded: map[string]Engine{}}
	rep := &Report{
		Started: time.Now().UTC(),
		Engines: o.engines,
		Machine: machineInfo(root),
		Config: map[string]any{
			"runs": o.runs, "duration": o.dur.String(), "warmup": o.warm.String(), "writers": o.writers,
			"put_value_sizes": o.values, "preloaded_keys": o.n, "preloaded_value_size": o.getValue,
			"readers": o.readers, "scan_length": o.scanLen, "cache_bytes": o.cache, "key_size": keySize,
		},
	}
	if lim, err := limits.Measure(root, 300); err == nil {
		rep.Limits = &lim
		b.logf("limits: %s\n", lim)
	} else {
		b.logf("limits: %v\n", err)
	}
	defer func() {
		for _, e := range b.loaded {
			e.Close()
		}
	}()

	var cells []*Cell
	if o.phases["put"] {
		for _, vs := range o.values {
			for _, w := range o.writers {
				cells = append(cells, &Cell{Name: fmt.Sprintf("put %dB w=%d", vs, w), Unit: "puts/s", Higher: true,
					Target: &Target{RatioVsPebble: 1.5, Text: "≥ 1.5× pebble"}})
			}
		}
	}
	needLoad := o.phases["get"] || o.phases["scan"] || o.phases["reopen"]
	if o.phases["get"] {
		cells = append(cells,
			&Cell{Name: "get uniform", Unit: "gets/s", Higher: true, Target: &Target{RatioVsPebble: 2, Text: "≥ 2× pebble"}},
			&Cell{Name: "get zipfian", Unit: "gets/s", Higher: true, Target: &Target{RatioVsPebble: 2, Text: "≥ 2× pebble"}})
	}
	if o.phases["scan"] {
		cells = append(cells, &Cell{Name: fmt.Sprintf("scan %d keys", o.scanLen), Unit: "scans/s", Higher: true})
	}
	if o.phases["reopen"] {
		cells = append(cells, &Cell{Name: fmt.Sprintf("reopen %s keys", human(o.n)), Unit: "s", Target: &Target{Max: 1, Text: "≤ 1 s"}})
	}
	if o.phases["mem"] {
		cells = append(cells, &Cell{Name: "memory per key (heap)", Unit: "B/key", Target: &Target{Max: 64, Text: "≤ 64 B/key"}})
	}
	rep.Cells = cells

	if needLoad {
		if err := b.preload(); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	for r := 0; r < o.runs; r++ {
		// Rotate the engine order each run so no engine always goes first (cold caches,
		// leftover background work of the previous engine).
		order := slices.Clone(o.engines)
		k := r % len(order)
		order = append(order[k:], order[:k]...)
		for _, c := range cells {
			for _, eng := range order {
				b.logf("run %d/%d  %-22s %-7s", r+1, o.runs, c.Name, eng)
				if err := b.measure(c, eng, r); err != nil {
					return nil, fmt.Errorf("run %d, %s, %s: %w", r+1, c.Name, eng, err)
				}
				b.logf("  %.4g %s\n", c.Samples[eng][len(c.Samples[eng])-1], c.Unit)
			}
		}
	}
	rep.Elapsed = time.Since(start).Round(time.Second).String()
	for _, c := range cells {
		c.Ratios = c.pairedRatios()
	}
	rep.Notes = notes(o)
	return rep, nil
}

func (b *bench) logf(format string, args ...any) {
	if b.log != nil {
		fmt.Fprintf(b.log, format, args...)
	}
}

func (b *bench) measure(c *Cell, eng string, run int) error {
	stop := b.profile(eng, run, c.Name)
	defer stop()
	switch {
	case strings.HasPrefix(c.Name, "put "):
		var vs, w int
		if _, err := fmt.Sscanf(c.Name, "put %dB w=%d", &vs, &w); err != nil {
			return err
		}
		return b.putCell(c, eng, vs, w)
	case c.Name == "get uniform":
		return b.getCell(c, eng, gen.Uniform{N: uint64(b.o.n)})
	case c.Name == "get zipfian":
		return b.getCell(c, eng, gen.NewScrambledZipfian(uint64(b.o.n), gen.ZipfianConstant))
	case strings.HasPrefix(c.Name, "scan "):
		return b.scanCell(c, eng)
	case strings.HasPrefix(c.Name, "reopen "):
		return b.reopenCell(c, eng)
	case strings.HasPrefix(c.Name, "memory "):
		return b.memCell(c, eng, run)
	}
	return fmt.Errorf("unknown cell %q", c.Name)
}

// profile starts a CPU profile of Kefir's cells in the first run, if asked.
func (b *bench) profile(eng string, run int, cell string) func() {
	if b.o.profileDir == "" || eng != "kefir" || run != 0 || strings.HasPrefix(cell, "memory") {
		return func() {}
	}
	name := strings.NewReplacer(" ", "-", "=", "", "/", "").Replace(cell)
	f, err := os.Create(filepath.Join(b.o.profileDir, "cpu-kefir-"+name+".pprof"))
	if err != nil {
		b.logf("profile: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.logf("profile: %v\n", err)
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// preload builds the sorted key set and loads it into every engine.
func (b *bench) preload() error {
	n := b.o.n
	b.keys = make([][]byte, n)
	vals := make([][]byte, n)
	kb := make([]byte, n*keySize)
	for i := range n {
		b.keys[i] = putKey(kb[i*keySize:i*keySize:(i+1)*keySize], uint64(i))
		vals[i] = b.pool.value(uint64(i), b.o.getValue)
	}
	sortedPairs(b.keys, vals)
	for _, eng := range b.o.engines {
		t := time.Now()
		b.logf("load %s keys into %s ... ", human(n), eng)
		e, err := openers[eng](filepath.Join(b.root, "loaded-"+eng), Config{CacheBytes: b.o.cache})
		if err != nil {
			return err
		}
		if err := e.Load(b.keys, vals); err != nil {
			e.Close()
			return fmt.Errorf("%s: %w", eng, err)
		}
		if s, ok := e.(interface{ Settle() error }); ok {
			if err := s.Settle(); err != nil {
				e.Close()
				return fmt.Errorf("%s settle: %w", eng, err)
			}
		}
		b.loaded[eng] = e
		b.logf("%.1fs\n", time.Since(t).Seconds())
	}
	return nil
}

func newHist() *hdr.Histogram { return hdr.New(100, int64(30*time.Second), 3) }

// drive runs workers goroutines calling op until the warm-up and then the measured
// duration pass; it returns measured operations per second and the merged latency
// histogram. The first error stops every worker and is returned.
func (b *bench) drive(workers int, op func(w int, r *rand.Rand) error) (float64, *hdr.Histogram, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		total    int64
		merged   = newHist()
	)
	start := time.Now()
	measureFrom := start.Add(b.o.warm)
	end := measureFrom.Add(b.o.dur)
	var failed atomic.Bool
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w)+1, uint64(time.Now().UnixNano())))
			h := newHist()
			var n int64
			for !failed.Load() {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				if err := op(w, r); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					failed.Store(true)
					break
				}
				if t0.After(measureFrom) {
					h.RecordValue(int64(time.Since(t0)))
					n++
				}
			}
			mu.Lock()
			total += n
			merged.Merge(h)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, nil, firstErr
	}
	if total == 0 {
		return 0, nil, fmt.Errorf("no operation completed in the %v measured window (machine overloaded, or -d too short)", b.o.dur)
	}
	// Operations that started before the end count; the measured window is therefore
	// from measureFrom to when the last of them finished.
	window := time.Since(measureFrom)
	return float64(total) / window.Seconds(), merged, nil
}

// putCell measures synced puts of fresh random keys into a new database.
func (b *bench) putCell(c *Cell, eng string, valueSize, writers int) error {
	dir, err := os.MkdirTemp(b.root, "put-"+eng+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := openers[eng](dir, Config{CacheBytes: b.o.cache, Writers: writers})
	if err != nil {
		return err
	}
	defer e.Close()
	last := make([]uint64, writers) // each writer's last acknowledged key, read back below
	bufs := make([][keySize]byte, writers)
	wrote := make([]bool, writers)
	fc, _ := e.(fsyncCounter)
	var syncs0 int64
	if fc != nil {
		syncs0 = fc.fsyncs()
	}
	var puts atomic.Int64
	ops, h, err := b.drive(writers, func(w int, r *rand.Rand) error {
		i := r.Uint64()
		k := putKey(bufs[w][:0], i)
		if err := e.Put(k, b.pool.value(i, valueSize)); err != nil {
			return err
		}
		last[w], wrote[w] = i, true
		puts.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	if fc != nil {
		if n := fc.fsyncs() - syncs0; n > 0 {
			c.addExtra("puts per fsync (group size)", eng, float64(puts.Load())/float64(n))
		}
	}
	var kb [keySize]byte
	var got []byte
	for w := range writers {
		if !wrote[w] {
			return fmt.Errorf("writer %d completed no put", w)
		}
		got, err = e.Get(putKey(kb[:0], last[w]), got)
		if err != nil {
			return fmt.Errorf("read back writer %d's last put: %w", w, err)
		}
		if !bytes.Equal(got, b.pool.value(last[w], valueSize)) {
			return fmt.Errorf("read back writer %d's last put: wrong value", w)
		}
	}
	c.add(eng, ops)
	c.addLatency(eng, h)
	return nil
}

// getCell measures point gets over the preloaded keys, verifying every value.
func (b *bench) getCell(c *Cell, eng string, ch gen.Chooser) error {
	e := b.loaded[eng]
	bufs := make([][]byte, b.o.readers)
	// Draw the key sequence before measuring: a zipfian draw costs a few pow() calls,
	// which would otherwise be a sizeable, engine-independent share of each get and
	// compress the ratios between engines towards 1.
	const seqLen = 1 << 16
	seqs := make([][]uint32, b.o.readers)
	for w := range seqs {
		r := rand.New(rand.NewPCG(uint64(w)+100, uint64(time.Now().UnixNano())))
		seqs[w] = make([]uint32, seqLen)
		for i := range seqs[w] {
			seqs[w][i] = uint32(ch.Next(r))
		}
	}
	next := make([]int, b.o.readers)
	ops, h, err := b.drive(b.o.readers, func(w int, r *rand.Rand) error {
		k := b.keys[seqs[w][next[w]%seqLen]]
		next[w]++
		v, err := e.Get(k, bufs[w])
		if err != nil {
			return fmt.Errorf("get %x: %w", k, err)
		}
		if !bytes.Equal(v, b.pool.value(keyNum(k), b.o.getValue)) {
			return fmt.Errorf("get %x: wrong value", k)
		}
		bufs[w] = v
		return nil
	})
	if err != nil {
		return err
	}
	c.add(eng, ops)
	c.addLatency(eng, h)
	return nil
}

// scanCell measures range scans from uniformly chosen preloaded keys, checking each
// scan returns as many keys as the key order holds from its start.
func (b *bench) scanCell(c *Cell, eng string) error {
	e := b.loaded[eng]
	n := len(b.keys)
	ops, h, err := b.drive(b.o.readers, func(w int, r *rand.Rand) error {
		i := r.IntN(n)
		got, err := e.Scan(b.keys[i], b.o.scanLen)
		if err != nil {
			return err
		}
		if want := min(b.o.scanLen, n-i); got != want {
			return fmt.Errorf("scan from key %d of %d: got %d keys, want %d", i, n, got, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.add(eng, ops)
	c.addLatency(eng, h)
	return nil
}

// reopenCell closes the preloaded engine (after Prepare: Kefir's hint files) and times
// Open plus the first verified Get.
func (b *bench) reopenCell(c *Cell, eng string) error {
	e := b.loaded[eng]
	if err := e.Prepare(); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	if err := e.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	delete(b.loaded, eng)
	t := time.Now()
	e, err := openers[eng](filepath.Join(b.root, "loaded-"+eng), Config{CacheBytes: b.o.cache})
	if err != nil {
		return err
	}
	b.loaded[eng] = e
	k := b.keys[len(b.keys)/2]
	v, err := e.Get(k, nil)
	if err != nil {
		return fmt.Errorf("get after reopen: %w", err)
	}
	if !bytes.Equal(v, b.pool.value(keyNum(k), b.o.getValue)) {
		return errors.New("get after reopen: wrong value")
	}
	c.add(eng, time.Since(t).Seconds())
	return nil
}

// memResult is what a memory child prints.
type memResult struct {
	HeapPerKey    float64 `json:"heap_per_key"`
	RSSAnonPerKey float64 `json:"rss_anon_per_key"`
}

// memCell runs the measurement in a child process, so each engine starts from a clean
// heap and the resident-set figure is not polluted by earlier cells.
func (b *bench) memCell(c *Cell, eng string, run int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(b.root, "mem-"+eng+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	args := []string{"-mem-child", eng, "-dir", dir, "-n", strconv.Itoa(b.o.n),
		"-getvalue", strconv.Itoa(b.o.getValue), "-cache", strconv.FormatInt(b.o.cache, 10)}
	if b.o.profileDir != "" && run == 0 {
		args = append(args, "-profile-dir", b.o.profileDir)
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("memory child: %w", err)
	}
	var m memResult
	if err := json.Unmarshal(out, &m); err != nil {
		return fmt.Errorf("memory child output %q: %w", out, err)
	}
	c.add(eng, m.HeapPerKey)
	c.addExtra("RSS (anon) per key", eng, m.RSSAnonPerKey)
	return nil
}

// memChild loads n keys into a fresh engine and reports (heap after − heap before) / n
// minus the key bytes: the engine's in-memory cost per key beyond the key itself. The
// value cache is off for engines that have one (Kefir), so the figure is the index; the
// keys and values the benchmark itself holds are allocated before the baseline.
func measureMem(o *options) (memResult, error) {
	eng := o.memChild
	open := openers[eng]
	if open == nil {
		return memResult{}, fmt.Errorf("unknown engine %q", eng)
	}
	pool := newValuePool(o.getValue)
	keys := make([][]byte, o.n)
	vals := make([][]byte, o.n)
	kb := make([]byte, o.n*keySize)
	for i := range o.n {
		keys[i] = putKey(kb[i*keySize:i*keySize:(i+1)*keySize], uint64(i))
		vals[i] = pool.value(uint64(i), o.getValue)
	}
	sortedPairs(keys, vals)
	cache := o.cache
	if eng == "kefir" {
		cache = -1
	}
	e, err := open(o.dir, Config{CacheBytes: cache})
	if err != nil {
		return memResult{}, err
	}
	defer e.Close()
	heap0, rss0 := memNow()
	if err := e.Load(keys, vals); err != nil {
		return memResult{}, err
	}
	if s, ok := e.(interface{ Settle() error }); ok {
		if err := s.Settle(); err != nil {
			return memResult{}, err
		}
	}
	heap1, rss1 := memNow()
	if o.profileDir != "" && eng == "kefir" {
		if f, err := os.Create(filepath.Join(o.profileDir, "heap-kefir-loaded.pprof")); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
	runtime.KeepAlive(keys)
	runtime.KeepAlive(vals)
	runtime.KeepAlive(e)
	res := memResult{
		HeapPerKey:    float64(int64(heap1)-int64(heap0))/float64(o.n) - keySize,
		RSSAnonPerKey: float64(rss1-rss0)/float64(o.n) - keySize,
	}
	return res, nil
}

// memNow returns the live heap after a full collection and the anonymous resident set
// (which also counts memory allocated outside the Go heap, e.g. by cgo).
func memNow() (heap uint64, rssAnon int64) {
	runtime.GC()
	debug.FreeOSMemory() // return freed spans, so RSS shows what is live, not what was
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, rssAnonBytes()
}

func rssAnonBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "RssAnon:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func human(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}
