package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The CPU watch: how much CPU processes outside the matrix used while a cell ran. The
// matrix's own processes are this one (harness, client libraries, the in-process
// ceiling) and the systems' servers, listed by pid in the -watch-pids file (compare.sh
// writes it after starting them); everything else on the machine — another session's
// build or benchmark, a cron job — is "other". A cell measured while others used more
// than -disturbed cores is measured again (up to -remeasure times, within a budget per
// matrix), and the report shows each cell's other CPU, so a figure taken on a busy
// machine is visible as such. It reads /proc (Linux); elsewhere it reports nothing.

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux ABI Go
// supports (the kernel exports it to user space as a constant).
const clockTicks = 100

// cpuSample is one reading: the machine's busy time, this process's and the watched
// systems', all in clock ticks.
type cpuSample struct {
	at      time.Time
	busy    uint64 // every CPU's user+nice+system+irq+softirq+steal time since boot
	self    uint64
	systems uint64
	ok      bool
}

// cpuWatch reads the samples; pids are the systems' server processes.
type cpuWatch struct {
	pids []int
}

// readWatchPids reads a file of process ids (whitespace- or line-separated; "" = none).
func readWatchPids(path string) ([]int, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-watch-pids: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		p, err := strconv.Atoi(f)
		if err != nil || p <= 0 {
			return nil, fmt.Errorf("-watch-pids %s: bad pid %q", path, f)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

func (w *cpuWatch) sample() cpuSample {
	s := cpuSample{at: time.Now()}
	busy, ok := machineBusy()
	if !ok {
		return s
	}
	self, ok := procTicks("self")
	if !ok {
		return s
	}
	s.busy, s.self, s.ok = busy, self, true
	for _, p := range w.pids {
		t, _ := procTicks(strconv.Itoa(p)) // a server that exited used nothing more
		s.systems += t
	}
	return s
}

// otherCores is the CPU, in cores, that processes other than this one and the
// watched systems used between a and b (clamped at 0: the readings are not atomic).
func otherCores(a, b cpuSample) (float64, bool) {
	if !a.ok || !b.ok || !b.at.After(a.at) {
		return 0, false
	}
	busy := float64(b.busy) - float64(a.busy)
	mine := float64(b.self) - float64(a.self)
	// A watched server that exited between the samples lowers systems: count only growth.
	if b.systems > a.systems {
		mine += float64(b.systems - a.systems)
	}
	other := (busy - mine) / clockTicks / b.at.Sub(a.at).Seconds()
	return max(other, 0), true
}

// machineBusy sums the non-idle times of /proc/stat's "cpu" line.
func machineBusy() (uint64, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, false
	}
	fields := strings.Fields(sc.Text())
	// cpu user nice system idle iowait irq softirq steal guest guest_nice
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, false
	}
	var busy uint64
	for i, fv := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseUint(fv, 10, 64)
		if err != nil {
			return 0, false
		}
		busy += v
	}
	return busy, true
}

// procTicks is utime+stime of /proc/PID/stat (every thread of the process).
func procTicks(pid string) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	// After ')': state(3) ppid(4) ... utime(14) stime(15), so index 11 and 12 here.
	if len(fields) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(fields[11], 10, 64)
	s, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + s, true
}
