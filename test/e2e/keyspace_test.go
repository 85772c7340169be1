package e2e

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// scanKeys is how many keys the SCAN clients iterate: 20k in make test, 1M
// behind KEFIR_SOAK=1 (issue 27's acceptance size).
func scanKeys() int {
	if soakRun() {
		return 1_000_000
	}
	return 20_000
}

// loadKeys writes key:%07d = v for i < n with pipelined MSETs.
func loadKeys(t *testing.T, addr string, n int) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := struct {
		nc net.Conn
		rd *resp.Reader
	}{nc, resp.NewReader(nc, 0)}
	const perMSet, depth = 200, 50
	var buf []byte
	pending := 0
	flush := func() {
		_ = c.nc.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := c.nc.Write(buf); err != nil {
			t.Fatal(err)
		}
		buf = buf[:0]
		for ; pending > 0; pending-- {
			v, err := c.rd.ReadValue()
			if err != nil || v.Kind == resp.Error {
				t.Fatalf("MSET: %v %s", err, v.Str)
			}
		}
	}
	for i := 0; i < n; i += perMSet {
		args := [][]byte{[]byte("MSET")}
		for j := i; j < min(n, i+perMSet); j++ {
			args = append(args, []byte(fmt.Sprintf("key:%07d", j)), []byte("v"))
		}
		buf = resp.AppendCommand(buf, args...)
		if pending++; pending == depth {
			flush()
		}
	}
	flush()
}

// checkAllKeys fails unless got (one key per line, duplicates allowed) holds
// every key:%07d below n and nothing else.
func checkAllKeys(t *testing.T, who string, got []string, n int) {
	t.Helper()
	seen := make(map[string]bool, n)
	for _, k := range got {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if !strings.HasPrefix(k, "key:") {
			t.Fatalf("%s returned %q, which MATCH key:* excludes", who, k)
		}
		seen[k] = true
	}
	for i := range n {
		if k := fmt.Sprintf("key:%07d", i); !seen[k] {
			t.Fatalf("%s missed %s (%d distinct keys of %d)", who, k, len(seen), n)
		}
	}
	if len(seen) != n {
		t.Fatalf("%s returned %d distinct keys, want %d", who, len(seen), n)
	}
}

// pythonWithRedis finds a python3 that has redis-py (Debian's python3-redis
// installs into the system python, which a pyenv shim may hide).
func pythonWithRedis() string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import redis").Run() == nil {
			return p
		}
	}
	return ""
}

// Issue 27's acceptance: redis-cli --scan --pattern, redis-cli --bigkeys and
// redis-py's scan_iter iterate a 3-replica group's keyspace, through the
// leader and through a follower, returning every key.
func TestScanClientsIterateAGroup(t *testing.T) {
	n := scanKeys()
	g := startGroup(t)
	l := g.settledLeader(-1)
	f := (l + 1) % 3
	start := time.Now()
	loadKeys(t, g.nodes[l].ClientAddr, n)
	t.Logf("loaded %d keys in %v", n, time.Since(start))
	// Keys outside the pattern, which MATCH must leave out.
	redisCLI(t, g.nodes[l].ClientAddr, "MSET", "other:1", "x", "zzz", "y")

	for _, i := range []int{l, f} {
		start = time.Now()
		out := redisCLI(t, g.nodes[i].ClientAddr, "--scan", "--pattern", "key:*")
		checkAllKeys(t, "redis-cli --scan at "+g.nodes[i].ID, strings.Split(out, "\n"), n)
		t.Logf("redis-cli --scan at %s: %v", g.nodes[i].ID, time.Since(start))
	}

	start = time.Now()
	out := redisCLI(t, g.nodes[l].ClientAddr, "--bigkeys")
	if want := fmt.Sprintf("Sampled %d keys in the keyspace!", n+2); !strings.Contains(out, want) {
		t.Fatalf("redis-cli --bigkeys does not say %q:\n%s", want, out)
	}

	t.Logf("redis-cli --bigkeys: %v", time.Since(start))
	start = time.Now()
	py := pythonWithRedis()
	if py == "" {
		t.Fatal("no python3 with redis-py: install Debian's python3-redis")
	}
	host, port, _ := net.SplitHostPort(g.nodes[f].ClientAddr)
	script := `import sys, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=30)
for k in r.scan_iter(match="key:*", count=500):
    sys.stdout.write(k.decode() + "\n")
`
	pout, err := exec.Command(py, "-c", script, host, port).Output()
	if err != nil {
		t.Fatalf("redis-py scan_iter: %v", err)
	}
	checkAllKeys(t, "redis-py scan_iter", strings.Split(string(pout), "\n"), n)
	t.Logf("redis-py scan_iter at %s: %v", g.nodes[f].ID, time.Since(start))
}

// A SCAN whose iteration spans the leader's SIGKILL returns every key
// present throughout: the cursor names a key, not a server's state, and the
// new leader, which never issued it, resumes before that key (some keys come
// twice, none is missed). The client scans through a follower, retrying a
// call that fails while the group elects a new leader with the same cursor,
// as a client would; meanwhile another client deletes every seventh key
// through the third node. check.ScanComplete judges the recorded history:
// keys deleted during the iteration may or may not come back, every other
// one must.
func TestScanSpansALeaderKill(t *testing.T) {
	n := scanKeys() / 4
	g := startGroup(t)
	l := g.settledLeader(-1)
	f, d := (l+1)%3, (l+2)%3
	t0 := time.Now()
	rec := check.NewRecorder(func() int64 { return int64(time.Since(t0)) })
	ids := make([]int, n)
	for i := range n {
		ids[i] = rec.Invoke(check.Op{Client: i, Kind: check.Put, Key: fmt.Sprintf("key:%07d", i), Value: "v"})
	}
	loadKeys(t, g.nodes[l].ClientAddr, n)
	for _, id := range ids {
		rec.Complete(id, check.Result{Node: -1})
	}

	// The deleter, on its own connection to the node that is neither the
	// scanner's nor the one killed.
	stop := make(chan struct{})
	deleted := make(chan int)
	go func() {
		dc := &respConn{addr: g.nodes[d].ClientAddr}
		count := 0
		defer func() { deleted <- count }()
		for i := 0; i < n; i += 7 {
			select {
			case <-stop:
				return
			default:
			}
			id := rec.Invoke(check.Op{Client: n, Kind: check.Delete, Key: fmt.Sprintf("key:%07d", i)})
			v, err := dc.do("DEL", fmt.Sprintf("key:%07d", i))
			if err != nil || v.Kind == resp.Error {
				rec.Unknown(id) // it may have been applied before the error
			} else {
				rec.Complete(id, check.Result{Found: v.Int == 1, Node: -1})
			}
			count++
			time.Sleep(time.Millisecond)
		}
	}()

	c := &respConn{addr: g.nodes[f].ClientAddr} // forward_test.go's: redials after an error
	it := check.Iteration{Client: n + 1, Invoke: int64(time.Since(t0)),
		Match: func(k string) bool { return strings.HasPrefix(k, "key:") }}
	cursor, calls, killed := "0", 0, false
	deadline := time.Now().Add(60 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("SCAN did not finish: %d calls, %d keys", calls, len(it.Keys))
		}
		v, err := c.do("SCAN", cursor, "MATCH", "key:*", "COUNT", "100")
		if err != nil || v.Kind == resp.Error {
			time.Sleep(50 * time.Millisecond) // a view change: retry the same cursor
			continue
		}
		calls++
		cursor = string(v.Elems[0].Str)
		if _, err := strconv.ParseUint(cursor, 10, 64); err != nil {
			t.Fatalf("cursor %q", cursor)
		}
		for _, e := range v.Elems[1].Elems {
			if !strings.HasPrefix(string(e.Str), "key:") {
				t.Fatalf("SCAN MATCH key:* returned %q", e.Str)
			}
			it.Keys = append(it.Keys, string(e.Str))
		}
		if !killed && len(it.Keys) >= n/2 {
			g.nodes[l].Kill()
			killed = true
			t.Logf("killed leader %s after %d keys", g.nodes[l].ID, len(it.Keys))
		}
		if cursor == "0" {
			break
		}
	}
	it.Return = int64(time.Since(t0))
	close(stop)
	dels := <-deleted
	if !killed {
		t.Fatal("the iteration ended before the kill")
	}
	v := check.ScanComplete(rec.History(), []check.Iteration{it})
	t.Logf("%d SCAN calls returned %d keys; %d deletes ran meanwhile; the checker demanded %d keys", calls, len(it.Keys), dels, v.Checked)
	if !v.OK {
		t.Fatalf("%s: %+v", v.Checker, v.Violations)
	}
	if v.Checked < n/2 {
		t.Fatalf("the checker demanded only %d of %d keys: the history exercises nothing", v.Checked, n)
	}
}

// redis-benchmark's tests Kefir implements run without errors against a
// node; the rest answer the one "unsupported command" error (issue 27's
// acceptance; docs/commands.md).
func TestRedisBenchmarkAgainstANode(t *testing.T) {
	path, err := exec.LookPath("redis-benchmark")
	if err != nil {
		t.Skip("redis-benchmark not installed")
	}
	node := cluster.NewNode(t, "n1")
	node.Start()
	host, port, _ := net.SplitHostPort(node.ClientAddr)
	out, err := exec.Command(path, "-h", host, "-p", port, "-n", "2000", "-c", "4", "-q", "-t", "set,get,incr,mset,ping,hset").CombinedOutput()
	if err != nil || strings.Contains(string(out), "ERR") {
		t.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	for _, test := range []string{"SET", "GET", "INCR", "MSET (10 keys)", "PING_INLINE", "PING_MBULK", "HSET"} {
		if !strings.Contains(string(out), test+":") {
			t.Errorf("redis-benchmark did not report %s:\n%s", test, out)
		}
	}
	out, _ = exec.Command(path, "-h", host, "-p", port, "-n", "100", "-c", "1", "-q", "-t", "lpush").CombinedOutput()
	if !strings.Contains(string(out), "ERR unsupported command 'lpush'") {
		t.Errorf("redis-benchmark -t lpush:\n%s", out)
	}
}
