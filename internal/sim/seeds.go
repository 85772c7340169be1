package sim

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// SeedEnv names the environment variable that pins Explore to one seed:
// KEFIR_SIM_SEED=1234 go test -run TestX ./internal/...
const SeedEnv = "KEFIR_SIM_SEED"

// SeedsEnv names the environment variable that overrides how many seeds
// Explore runs, for soaks: KEFIR_SIM_SEEDS=5000 go test -run TestX ...
const SeedsEnv = "KEFIR_SIM_SEEDS"

// Explore runs run for seeds first..first+n-1 (n overridden by SeedsEnv), or
// only the seed in SeedEnv.
// run builds and runs a simulation with the given trace writer (nil when not
// tracing) and returns an error describing any violation. On the first
// failure Explore replays that seed with tracing on, writes the trace next to
// the test's temporary files (kept under os.TempDir), and fails the test with
// the seed and the command that replays it.
func Explore(t testing.TB, first uint64, n int, run func(seed uint64, trace io.Writer) error) {
	t.Helper()
	seeds := make([]uint64, 0, n)
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
		seeds = append(seeds, v)
	} else {
		if s := os.Getenv(SeedsEnv); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v <= 0 {
				t.Fatalf("%s=%q: want a positive count", SeedsEnv, s)
			}
			n = v
		}
		for i := 0; i < n; i++ {
			seeds = append(seeds, first+uint64(i))
		}
	}
	for _, seed := range seeds {
		err := run(seed, nil)
		if err == nil {
			continue
		}
		path := filepath.Join(os.TempDir(), fmt.Sprintf("kefir-sim-%s-seed%d.trace", sanitizeName(t.Name()), seed))
		f, ferr := os.Create(path)
		if ferr != nil {
			t.Fatalf("sim: seed=%d failed: %v\n(trace not written: %v)\nreplay: %s=%d go test -run '^%s$'", seed, err, ferr, SeedEnv, seed, t.Name())
		}
		rerr := run(seed, f)
		f.Close()
		same := "replay reproduced the failure"
		if rerr == nil || rerr.Error() != err.Error() {
			same = fmt.Sprintf("REPLAY DIVERGED (nondeterminism!): %v", rerr)
		}
		t.Fatalf("sim: seed=%d failed: %v\n%s; trace: %s\nreplay: %s=%d go test -run '^%s$'", seed, err, same, path, SeedEnv, seed, t.Name())
	}
}

func sanitizeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}
