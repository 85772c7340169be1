package server

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricValue reads the sample named series (name and labels, as exposed)
// from n's /metrics; 0 if it is absent.
func metricValue(t *testing.T, n *Server, series string) float64 {
	t.Helper()
	r, err := http.Get("http://" + n.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// fsyncCount reads kefir_fsync_duration_seconds_count{log="<log>"} from n's /metrics.
func fsyncCount(t *testing.T, n *Server, log string) int {
	t.Helper()
	return int(metricValue(t, n, `kefir_fsync_duration_seconds_count{log="`+log+`"}`))
}

// The storage gauges report the engine's files and index, not only its log position.
func TestStorageGaugesCountBytesAndKeys(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.expect(`
SET a 1 => OK
SET b 2 => OK
`)
	if got := metricValue(t, s, "kefir_storage_keys"); got < 2 {
		t.Errorf("kefir_storage_keys = %v after two keys were written", got)
	}
	if got := metricValue(t, s, "kefir_storage_disk_bytes"); got <= 0 {
		t.Errorf("kefir_storage_disk_bytes = %v after synced writes", got)
	}
	if got := metricValue(t, s, "kefir_storage_live_bytes"); got <= 0 {
		t.Errorf("kefir_storage_live_bytes = %v after synced writes", got)
	}
}

// The fsync latency histogram times real fsyncs: a single node's sync write
// syncs the engine's log and is counted there.
func TestFsyncDurationIsExportedForTheEnginesLog(t *testing.T) {
	s := startServer(t, nil)
	before := fsyncCount(t, s, "storage")
	c := dial(t, s)
	c.expect(`SET a 1 => OK`) // sync by default: acknowledged after an fsync
	if got := fsyncCount(t, s, "storage"); got <= before {
		t.Fatalf("kefir_fsync_duration_seconds_count{log=storage} = %d after a sync write, was %d", got, before)
	}
}

// In a replica group writes are made durable by the replication log: its
// fsyncs are counted at every replica (a follower syncs what the leader sends).
func TestFsyncDurationIsExportedForTheReplicationLog(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	before := make([]int, len(g.nodes))
	for i, n := range g.nodes {
		before[i] = fsyncCount(t, n, "replication")
	}
	c := dial(t, g.nodes[l])
	c.expect(`SET a 1 => OK`)
	// A sync write is on a majority's disks when acknowledged: the leader and
	// at least one follower have synced since.
	grew := 0
	for i, n := range g.nodes {
		if fsyncCount(t, n, "replication") > before[i] {
			grew++
		}
	}
	if grew < 2 {
		t.Fatalf("replication-log fsyncs grew at %d replicas after a sync write, want a majority (2)", grew)
	}
}

// --fsync-extra-delay emulates a slower disk: a write acknowledged only once
// durable waits for the delay after its fsync, at a single node and in a
// group, while a cad write (acknowledged in a majority's memory) does not.
// The fsync histogram keeps timing the real system call.
func TestFsyncExtraDelayDelaysWhatWaitsForDurability(t *testing.T) {
	const extra = 100 * time.Millisecond
	timed := func(c *client, args ...string) time.Duration {
		t.Helper()
		start := time.Now()
		if got := c.do(args...); got != "OK" {
			t.Fatalf("%v: %q", args, got)
		}
		return time.Since(start)
	}

	s := startServer(t, func(c *Config) { c.FsyncExtraDelay = extra })
	if d := timed(dial(t, s), "SET", "a", "1"); d < extra {
		t.Errorf("single node: a sync write took %v with a %v emulated fsync", d, extra)
	}

	g := startGroupWith(t, func(c *Config) { c.FsyncExtraDelay = extra })
	c := dial(t, g.nodes[g.leader(t)])
	if d := timed(c, "SET", "b", "1"); d < extra {
		t.Errorf("group: a sync write took %v with a %v emulated fsync", d, extra)
	}
	// The fastest of three: a loaded machine may stall one write for other
	// reasons, but a write that waited for the fsync waits every time.
	fastest := time.Hour
	for i := range 3 {
		fastest = min(fastest, timed(c, "KEFIR.CALL", "DURABILITY", "cad", "CMD", "SET", "b", strconv.Itoa(i)))
	}
	if fastest >= extra {
		t.Errorf("group: the fastest of three cad writes took %v, as long as the %v emulated fsync it need not wait for", fastest, extra)
	}
	n := fsyncCount(t, g.nodes[0], "replication")
	sum := metricValue(t, g.nodes[0], `kefir_fsync_duration_seconds_sum{log="replication"}`)
	if n == 0 || sum/float64(n) >= extra.Seconds() {
		t.Errorf("fsync histogram: %d fsyncs, %.3fs in all: it timed the emulated delay, not the system call", n, sum)
	}
}

func TestFsyncExtraDelayIsBounded(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, MaxFsyncExtraDelay + 1} {
		cfg := Config{DataDir: t.TempDir(), FsyncExtraDelay: d}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--fsync-extra-delay") {
			t.Errorf("FsyncExtraDelay %v: %v, want a refusal naming --fsync-extra-delay", d, err)
		}
	}
}
