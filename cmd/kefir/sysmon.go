package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// sysmonAwake is the GODEBUG setting a server runs with: a scheduler trace
// every 2^31−1 ms (~24.8 days), for its side effect. The Go runtime's
// monitor thread (sysmon) sleeps in 20 µs steps while anything runs, and
// deep-sleeps once every processor is idle; the first system call after a
// deep sleep wakes it with its sleep reset to 20 µs. A replica between
// messages is idle, so each prepare, heartbeat or tick restarts those 20 µs
// naps, for as long as the round and its fsync hold a processor: measured
// on a follower under YCSB-E (docs/design/scans.md, "Eighth round"), sysmon
// was a quarter of its CPU samples, ~1,800 nanosleeps a second. With a
// schedtrace period sysmon never deep-sleeps (runtime.sysmon: "should not
// enter deep sleep if schedtrace is enabled"), so its sleep backs off to
// 10 ms and stays there until it retakes a processor from a long system
// call. The trace itself prints a line to stderr only once the machine's
// monotonic clock passes the period (an uptime of ~24.8 days), and again
// each period after.
const sysmonAwake = "schedtrace=2147483647"

// sysmonEnv returns env with sysmonAwake added to GODEBUG, and false if
// GODEBUG sets schedtrace already (the operator's value stands, including
// schedtrace=0 to opt out).
func sysmonEnv(env []string) ([]string, bool) {
	out := make([]string, 0, len(env)+1)
	found := false
	for _, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		for s := range strings.SplitSeq(v, ",") {
			if strings.HasPrefix(s, "schedtrace=") {
				return env, false
			}
		}
		found = true
		if v != "" {
			v += ","
		}
		out = append(out, "GODEBUG="+v+sysmonAwake)
	}
	if !found {
		out = append(out, "GODEBUG="+sysmonAwake)
	}
	return out, true
}

// keepSysmonAwake re-executes the server with sysmonAwake in GODEBUG (the
// runtime reads schedtrace only at start); same process id, arguments and
// environment otherwise. If the exec fails the server runs as it is.
func keepSysmonAwake() {
	env, ok := sysmonEnv(os.Environ())
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err == nil {
		err = syscall.Exec(exe, os.Args, env)
	}
	fmt.Fprintf(os.Stderr, "kefir: running without %s in GODEBUG (re-exec: %v)\n", sysmonAwake, err)
}
