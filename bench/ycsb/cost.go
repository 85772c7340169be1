package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// Cost per operation (issue 31 item 3): throughput on two shared cores swings with
// whatever else runs; what an operation costs does not. For each measured cell the
// matrix samples, at the start and the end of the measured window (ycsb.Config.Window):
//
//   - server CPU: utime+stime of every process of the system (-server-pids: every
//     replica of a group, every Redis of a primary+replicas set), from /proc/PID/stat;
//   - bytes written: write_bytes of the same processes from /proc/PID/io, which the
//     kernel counts when a page-cache folio goes from clean to dirty, by the folio's
//     size. It is not what reaches the device: on this machine's kernel (6.18, ext4,
//     large folios) a 1 KB write into a large folio that the last fsync cleaned counts
//     the whole folio. Kefir, which overwrites zero-filled segments written in large
//     chunks and fsyncs each group commit, read ≈ 90 KB of write_bytes per 1 KB write
//     while the whole machine's disk (/proc/diskstats) took ≈ 2.6 KB per write in the
//     same seconds (2026-12-05): read the column as page-cache dirtying, not as I/O;
//   - fsyncs: Kefir only, from its /metrics (-metrics, kefir_fsync_duration_seconds_count
//     summed over logs and nodes). /proc has no fsync count, and strace -f on a server
//     would cost more than it measures; other systems' columns say "—";
//   - client network bytes: rchar+wchar of this process from /proc/self/io, which during
//     a cell reads and writes nothing but the system's sockets. Loopback traffic between
//     a group's replicas is not in it (Linux counts network bytes per namespace, which
//     every process of the machine shares, not per process); for the in-process
//     ceiling it counts both ends and is left out.
//
// Each is divided by the window's operations (writes: updates, inserts and
// read-modify-writes).

// Cost is one cell's cost per operation.
type Cost struct {
	ServerCPUUsPerOp float64 `json:"server_cpu_us_per_op"`
	// BytesWrittenPerWrite and FsyncsPerWrite are per write operation; nil without writes
	// (or, for fsyncs, without a metrics endpoint).
	BytesWrittenPerWrite *float64 `json:"bytes_written_per_write,omitempty"`
	FsyncsPerWrite       *float64 `json:"fsyncs_per_write,omitempty"`
	ClientNetBytesPerOp  *float64 `json:"client_net_bytes_per_op,omitempty"`
	// ServerCores is the system's CPU over the window in cores: near the machine's 2,
	// the row is CPU-bound here.
	ServerCores float64 `json:"server_cores"`
}

// costSample is one reading of the counters above.
type costSample struct {
	at         time.Time
	ticks      uint64
	writeBytes uint64
	fsyncs     float64
	fsyncsOK   bool
	net        uint64
	netOK      bool
}

// costMeter samples one system's counters; nil pids means no server processes known.
type costMeter struct {
	pids       []int
	metrics    []string
	inProcess  bool
	httpClient *http.Client

	mu     sync.Mutex
	before costSample
	after  costSample
	ends   int // Window calls seen
}

func newCostMeter(pids []int, metrics []string, inProcess bool) *costMeter {
	return &costMeter{pids: pids, metrics: metrics, inProcess: inProcess, httpClient: &http.Client{Timeout: 2 * time.Second}}
}

// window is the ycsb.Config.Window hook.
func (m *costMeter) window(begin bool) {
	// The harness's own socket bytes are read nearest the window's edges: the /proc
	// reads and the metrics request of the sample are this process's I/O too.
	var s costSample
	if begin {
		m.sampleServers(&s)
		s.net, s.netOK = selfIOBytes()
	} else {
		s.net, s.netOK = selfIOBytes()
		m.sampleServers(&s)
	}
	s.at = time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if begin {
		m.before, m.ends = s, 0
	} else {
		m.after = s
		m.ends++
	}
}

func (m *costMeter) sampleServers(s *costSample) {
	for _, p := range m.pids {
		pid := strconv.Itoa(p)
		t, _ := procTicks(pid)
		s.ticks += t
		w, _ := procWriteBytes(pid)
		s.writeBytes += w
	}
	if len(m.metrics) > 0 {
		s.fsyncsOK = true
		for _, u := range m.metrics {
			n, err := m.scrapeFsyncs(u)
			if err != nil {
				s.fsyncsOK = false
				break
			}
			s.fsyncs += n
		}
	}
}

// cost computes the cell's cost from the last window's samples, or nil if the window
// did not complete.
func (m *costMeter) cost(res *ycsb.Result) *Cost {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, b := m.before, m.after
	if m.ends == 0 || res == nil || res.Ops == 0 || !b.at.After(a.at) {
		return nil
	}
	var writes int64
	for _, op := range res.PerOp {
		switch op.Op {
		case "UPDATE", "INSERT", "READ-MODIFY-WRITE":
			writes += op.Count
		}
	}
	ops := float64(res.Ops)
	c := &Cost{}
	if len(m.pids) > 0 && b.ticks >= a.ticks {
		cpu := float64(b.ticks-a.ticks) / clockTicks
		c.ServerCPUUsPerOp = cpu * 1e6 / ops
		c.ServerCores = cpu / b.at.Sub(a.at).Seconds()
		if writes > 0 && b.writeBytes >= a.writeBytes {
			v := float64(b.writeBytes-a.writeBytes) / float64(writes)
			c.BytesWrittenPerWrite = &v
		}
	}
	if writes > 0 && a.fsyncsOK && b.fsyncsOK && b.fsyncs >= a.fsyncs {
		v := (b.fsyncs - a.fsyncs) / float64(writes)
		c.FsyncsPerWrite = &v
	}
	if !m.inProcess && a.netOK && b.netOK && b.net >= a.net {
		v := float64(b.net-a.net) / ops
		c.ClientNetBytesPerOp = &v
	}
	return c
}

// procWriteBytes is write_bytes of /proc/PID/io.
func procWriteBytes(pid string) (uint64, bool) {
	return procIOField(pid, "write_bytes")
}

// selfIOBytes is this process's rchar+wchar: bytes through read and write system calls
// of every kind (sockets included).
func selfIOBytes() (uint64, bool) {
	r, ok1 := procIOField("self", "rchar")
	w, ok2 := procIOField("self", "wchar")
	return r + w, ok1 && ok2
}

func procIOField(pid, name string) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/io")
	if err != nil {
		return 0, false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && string(k) == name {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// fsyncMetric is the counter of every fsync a Kefir node made (one series per log).
const fsyncMetric = "kefir_fsync_duration_seconds_count"

func (m *costMeter) scrapeFsyncs(url string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := m.httpClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	return sumMetric(bufio.NewScanner(resp.Body), fsyncMetric)
}

// sumMetric sums every series of a metric in Prometheus text format.
func sumMetric(sc *bufio.Scanner, name string) (float64, error) {
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue // another metric whose name starts with this one
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		sum, found = sum+v, true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no %s in the metrics", name)
	}
	return sum, nil
}

// costMeterOf is the meter -server-pids and -metrics ask for: nil if neither is given
// so the run records no cost.
func costMeterOf(f *flags) (*costMeter, error) {
	if f.serverPids == "" && f.metrics == "" {
		return nil, nil
	}
	pids, err := readWatchPids(f.serverPids)
	if err != nil {
		return nil, fmt.Errorf("-server-pids: %w", err)
	}
	var metrics []string
	if f.metrics != "" {
		metrics = strings.Split(f.metrics, ",")
	}
	return newCostMeter(pids, metrics, f.db == "respserver"), nil
}
