package e2e

import (
	"bufio"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// cliSession is one redis-cli process (one connection) fed commands one at
// a time: a transaction's commands must share a connection.
type cliSession struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

func startCLI(t *testing.T, addr string) *cliSession {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-cli", "-h", host, "-p", port)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-cli: %v", err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	return &cliSession{t: t, in: in, out: bufio.NewReader(out)}
}

// do sends one command line and reads lines of its reply (redis-cli prints
// an array's elements on lines of their own, an empty line after an error).
func (s *cliSession) do(line string, lines int) string {
	s.t.Helper()
	if _, err := io.WriteString(s.in, line+"\n"); err != nil {
		s.t.Fatal(err)
	}
	var got []string
	for range lines {
		l, err := s.out.ReadString('\n')
		if err != nil {
			s.t.Fatalf("%s: %v", line, err)
		}
		got = append(got, strings.TrimRight(l, "\n"))
	}
	return strings.Join(got, "|")
}

// MULTI/EXEC and WATCH from redis-cli through a follower of a 3-replica
// group (it forwards EXEC, the whole transaction, and WATCH's read to the
// leader), a second connection's write making EXEC answer nil; then
// redis-py's pipeline() (a transaction by default) and its
// transaction(func, *watches) retry helper incrementing one counter from
// threads on the leader and on the follower: the final count is exact.
func TestTransactionsReplicated(t *testing.T) {
	g := startGroup(t)
	l := g.settledLeader(-1)
	f := (l + 1) % 3
	lead, fol := g.nodes[l].ClientAddr, g.nodes[f].ClientAddr

	a := startCLI(t, fol)
	for _, c := range []struct {
		line  string
		lines int
		want  string
	}{
		{"SET w 1", 1, "OK"},
		{"MULTI", 1, "OK"},
		{"INCR w", 1, "QUEUED"},
		{"INCR w", 1, "QUEUED"},
		{"EXEC", 2, "2|3"},
		{"WATCH w", 1, "OK"},
		{"MULTI", 1, "OK"},
		{"SET r lost", 1, "QUEUED"},
	} {
		if got := a.do(c.line, c.lines); got != c.want {
			t.Fatalf("redis-cli %s: %q, want %q", c.line, got, c.want)
		}
	}
	if got := redisCLI(t, lead, "INCR", "w"); got != "4" { // the second connection
		t.Fatalf("INCR w = %q", got)
	}
	if got := a.do("EXEC", 1); got != "" { // redis-cli prints a nil array as an empty line
		t.Fatalf("EXEC after a watched key changed: %q, want nil", got)
	}
	if got := redisCLI(t, lead, "EXISTS", "r"); got != "0" {
		t.Fatalf("the conflicting transaction applied: EXISTS r = %q", got)
	}

	host, lport, _ := net.SplitHostPort(lead)
	_, fport, _ := net.SplitHostPort(fol)
	runRedisPy(t, txPyScript, host, lport, fport)

	// Every replica applied the same transactions.
	for i := range g.nodes {
		if got := redisCLI(t, g.nodes[i].ClientAddr, "KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "GET", "py:ctr"); got != "40" {
			time.Sleep(500 * time.Millisecond) // a follower may lag: once more
			if got = redisCLI(t, g.nodes[i].ClientAddr, "KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "GET", "py:ctr"); got != "40" {
				t.Errorf("node %d: py:ctr = %q, want 40", i, got)
			}
		}
	}
}

const txPyScript = `
import sys, threading, redis
host, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
r = redis.Redis(host=host, port=ports[-1], socket_timeout=10)
p = r.pipeline()  # transaction=True
p.set("py:a", 1).incr("py:a").get("py:a").incr("py:missing")
assert p.execute() == [True, 2, b"2", 1], "pipeline"
p = r.pipeline()
p.set("py:s", "x").incr("py:s").set("py:t", "y")
try:
    p.execute()
    raise SystemExit("a runtime error inside the transaction was not raised")
except redis.ResponseError:
    pass
assert r.get("py:t") == b"y", "the other commands of a transaction with a runtime error apply"
r.set("py:ctr", 0)
conflicts = [0]
lock = threading.Lock()
def incr(pipe):
    v = int(pipe.get("py:ctr"))
    pipe.multi()
    pipe.set("py:ctr", v + 1)
def work(port):
    c = redis.Redis(host=host, port=port, socket_timeout=10)
    for _ in range(10):
        c.transaction(incr, "py:ctr")
threads = [threading.Thread(target=work, args=(ports[i % len(ports)],)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
got = int(r.get("py:ctr"))
assert got == 40, got
print("ok")
`

// At a node of several groups a transaction's keys, watched or written,
// must share a slot (Redis Cluster's rule): EXEC answers CROSSSLOT
// otherwise and applies nothing; with a hash tag it runs in that slot's
// group, from any node.
func TestGroupsTransactions(t *testing.T) {
	g := cluster.StartGroups(t, 3, threeGroups)
	g.WaitLeaders(20 * time.Second)
	for i, n := range g.Nodes {
		s := startCLI(t, n.ClientAddr)
		tag := "{t" + string(rune('a'+i)) + "}"
		for _, c := range []struct {
			line  string
			lines int
			want  string
		}{
			{"MULTI", 1, "OK"},
			{"SET a 1", 1, "QUEUED"},
			{"SET b 2", 1, "QUEUED"},
			{"EXEC", 2, "CROSSSLOT Keys in request don't hash to the same slot|"},
			{"WATCH " + tag + "w", 1, "OK"},
			{"MULTI", 1, "OK"},
			{"SET " + tag + "x 1", 1, "QUEUED"},
			{"INCR " + tag + "n", 1, "QUEUED"},
			{"EXEC", 2, "OK|1"},
			{"WATCH " + tag + "w", 1, "OK"},
			{"MULTI", 1, "OK"},
			{"SET other 1", 1, "QUEUED"},
			{"EXEC", 2, "CROSSSLOT Keys in request don't hash to the same slot|"},
			{"EXISTS a", 1, "0"},
			{"EXISTS b", 1, "0"},
			{"EXISTS other", 1, "0"},
			// A keyspace read would read one group's keys: refused.
			{"MULTI", 1, "OK"},
			{"SET " + tag + "k 1", 1, "QUEUED"},
			{"KEYS *", 1, "QUEUED"},
			{"HGETALL " + tag + "h", 1, "QUEUED"},
			{"EXEC", 4, "OK|ERR a script or transaction at a node of several groups cannot read the keyspace (SCAN, KEYS, DBSIZE, RANDOMKEY): it runs in one group, which holds only some of the keys||"},
			// So would a flush flush one group's keys: refused; a script on
			// the transaction's keys runs.
			{"MULTI", 1, "OK"},
			{"FLUSHDB", 1, "QUEUED"},
			{"EVAL \"return redis.call('get', KEYS[1])\" 1 " + tag + "k", 1, "QUEUED"},
			{"EXEC", 3, "ERR FLUSHDB and FLUSHALL inside a script or transaction at a node of several groups would flush one group's keys: send it on its own||1"},
		} {
			if got := s.do(c.line, c.lines); got != c.want {
				t.Fatalf("node %d: redis-cli %s: %q, want %q", i, c.line, got, c.want)
			}
		}
	}
}
