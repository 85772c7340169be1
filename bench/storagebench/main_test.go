package main

import (
	"strings"
	"testing"
)

// tinyOptions is a run small enough for the default test suite: it exercises every phase
// but measures nothing worth reporting.
func tinyOptions(t *testing.T, engines ...string) *options {
	t.Helper()
	o, err := parseFlags([]string{"-runs", "1", "-d", "100ms", "-warmup", "10ms", "-n", "3000",
		"-writers", "1,4", "-values", "100", "-phases", "put,get,scan,reopen", "-dir", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	o.engines = engines
	return o
}

func availableEngines() []string {
	var out []string
	for _, e := range engineOrder {
		if openers[e] != nil {
			out = append(out, e)
		}
	}
	return out
}

func TestEveryEngineRunsEveryPhaseAndProducesAFigure(t *testing.T) {
	engines := availableEngines()
	rep, err := run(tinyOptions(t, engines...), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cells {
		for _, e := range engines {
			if len(c.Samples[e]) != 1 || c.Samples[e][0] <= 0 {
				t.Errorf("%s/%s: samples %v, want one positive figure", c.Name, e, c.Samples[e])
			}
		}
	}
	md := rep.Markdown()
	for _, want := range []string{"| put 100B w=4 | puts/s |", "| get zipfian |", "| scan 100 keys |", "| reopen 3k keys |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// faulty wraps an engine and breaks one promise, to show the benchmark refuses to
// report a figure for an engine that loses or corrupts data.
type faulty struct {
	Engine
	dropPuts, corruptGets, shortScans bool
}

func (f *faulty) Put(k, v []byte) error {
	if f.dropPuts {
		return nil // acknowledged, never written
	}
	return f.Engine.Put(k, v)
}

func (f *faulty) Get(k, dst []byte) ([]byte, error) {
	v, err := f.Engine.Get(k, dst)
	if f.corruptGets && err == nil && len(v) > 0 {
		v[len(v)/2] ^= 1
	}
	return v, err
}

func (f *faulty) Scan(start []byte, n int) (int, error) {
	got, err := f.Engine.Scan(start, n)
	if f.shortScans && got > 1 {
		got--
	}
	return got, err
}

func TestRunFailsOnAnEngineThatLosesOrCorruptsData(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      faulty
		phases string
		want   string
	}{
		{"dropped puts", faulty{dropPuts: true}, "put", "read back"},
		{"corrupt gets", faulty{corruptGets: true}, "get", "wrong value"},
		{"short scans", faulty{shortScans: true}, "scan", "got"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			openers["faulty"] = func(dir string, cfg Config) (Engine, error) {
				e, err := openPebble(dir, cfg)
				if err != nil {
					return nil, err
				}
				f := tc.f
				f.Engine = e
				return &f, nil
			}
			defer delete(openers, "faulty")
			o := tinyOptions(t, "faulty")
			o.phases = map[string]bool{tc.phases: true}
			_, err := run(o, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run over a faulty engine: err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestTargetsAreJudgedOnMedians(t *testing.T) {
	rep := &Report{Engines: []string{"kefir", "pebble"}, Config: map[string]any{}, Machine: map[string]any{}}
	rep.Cells = []*Cell{
		{Name: "put a", Unit: "puts/s", Higher: true, Target: &Target{RatioVsPebble: 1.5, Text: "≥ 1.5× pebble"},
			Samples: map[string][]float64{"kefir": {150, 1000, 140}, "pebble": {100, 100, 100}}},
		{Name: "put b", Unit: "puts/s", Higher: true, Target: &Target{RatioVsPebble: 1.5, Text: "≥ 1.5× pebble"},
			Samples: map[string][]float64{"kefir": {150, 160, 155}, "pebble": {100, 90, 110}}},
		{Name: "reopen", Unit: "s", Target: &Target{Max: 1, Text: "≤ 1 s"},
			Samples: map[string][]float64{"kefir": {1.2, 0.9, 1.1}, "pebble": {0.1, 0.1, 0.1}}},
	}
	md := rep.Markdown()
	for _, want := range []string{
		"| put a | puts/s | 150 | 100 | 1.50× (1.40–10.00) | ≥ 1.5× pebble | yes |",
		"| put b | puts/s | 155 | 100 | 1.50× (1.41–1.78) | ≥ 1.5× pebble | yes |",
		"| reopen | s | 1.1 | 0.100 | 11.00× (9.00–12.00) | ≤ 1 s | **no** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	rep.Cells[0].Samples["kefir"] = []float64{149, 149, 1000}
	if !strings.Contains(rep.Markdown(), "| put a | puts/s | 149 | 100 | 1.49× (1.49–10.00) | ≥ 1.5× pebble | **no** |") {
		t.Errorf("a median just under the target must be a miss:\n%s", rep.Markdown())
	}
	// Paired ratios, not a ratio of medians: Kefir is 2× Pebble in two runs of three
	// (the machine's speed drifting between runs); the medians alone (200 vs 200) say 1×.
	rep.Cells[0].Samples = map[string][]float64{"kefir": {100, 400, 200}, "pebble": {50, 200, 300}}
	if !strings.Contains(rep.Markdown(), "| put a | puts/s | 200 | 200 | 2.00× (0.67–2.00) | ≥ 1.5× pebble | yes |") {
		t.Errorf("paired ratios:\n%s", rep.Markdown())
	}
}

func TestRefusesTmpfs(t *testing.T) {
	if !isTmpfs("/dev/shm") {
		t.Skip("/dev/shm is not tmpfs here")
	}
	o := tinyOptions(t, "pebble")
	o.dir = "/dev/shm/kefir-storagebench-test"
	_, err := run(o, nil)
	if err == nil || !strings.Contains(err.Error(), "tmpfs") {
		t.Fatalf("run on tmpfs: err = %v, want a tmpfs refusal", err)
	}
}

func TestMemoryPerKeyMeasuresWhatTheEngineHolds(t *testing.T) {
	// An "engine" that keeps 100 heap bytes per key must measure ≈ 100 − 16 = 84 B/key;
	// one that keeps nothing must measure ≈ −16 (the key bytes are subtracted).
	for _, tc := range []struct {
		perKey   int
		lo, high float64
	}{{100, 80, 130}, {0, -20, 0}} {
		openers["heapy"] = func(dir string, cfg Config) (Engine, error) { return &heapy{perKey: tc.perKey}, nil }
		o := tinyOptions(t)
		o.memChild, o.n = "heapy", 50000
		m, err := measureMem(o)
		delete(openers, "heapy")
		if err != nil {
			t.Fatal(err)
		}
		if m.HeapPerKey < tc.lo || m.HeapPerKey > tc.high {
			t.Errorf("engine holding %d B/key: measured %.1f B/key beyond the key, want in [%v, %v]", tc.perKey, m.HeapPerKey, tc.lo, tc.high)
		}
	}
}

type heapy struct {
	Engine
	perKey int
	held   [][]byte
}

func (h *heapy) Load(keys, _ [][]byte) error {
	if h.perKey == 0 {
		return nil
	}
	h.held = make([][]byte, 0, len(keys))
	buf := make([]byte, h.perKey*len(keys)-24*len(keys)) // the slice headers count too
	for i := range keys {
		h.held = append(h.held, buf[i*(h.perKey-24):(i+1)*(h.perKey-24)])
	}
	return nil
}

func (h *heapy) Close() error { return nil }
