package e2e

import (
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Key expiry on a real 3-replica group (docs/design/expiry.md): redis-cli
// through a follower (which forwards) and the leader, a key that expires and
// is gone at every replica, an expiry that survives a restart of the whole
// group, and redis-py's set(ex=) and Lock when python3-redis is installed.
func TestExpiryReplicated(t *testing.T) {
	g := startGroup(t)
	l := g.settledLeader(-1)
	f := (l + 1) % 3
	lead, fol := g.nodes[l].ClientAddr, g.nodes[f].ClientAddr

	for _, c := range []struct{ addr, cmd, want string }{
		{fol, "SET a v EX 100", "OK"},
		{fol, "TTL a", "100"},
		{lead, "EXPIRETIME a", "*"},
		{fol, "SET far v EXAT 4102444800", "OK"},
		{lead, "EXPIRETIME far", "4102444800"},
		{fol, "EXPIREAT far 4102444799 GT", "0"},
		{fol, "PEXPIREAT far 4102444800500 GT", "1"},
		{lead, "PEXPIRETIME far", "4102444800500"},
		{fol, "SET p v", "OK"},
		{fol, "PERSIST p", "0"},
		{fol, "SETEX s 100 v", "OK"},
		{fol, "GETEX s PERSIST", "v"},
		{lead, "TTL s", "-1"},
		{fol, "SET short v PX 1500", "OK"},
		{lead, "GET short", "v"},
		{fol, "SET k v EX 0", "ERR invalid expire time in 'set' command"},
	} {
		got := redisCLI(t, c.addr, strings.Fields(c.cmd)...)
		if c.want != "*" && got != c.want {
			t.Errorf("%s via %s: %q, want %q", c.cmd, c.addr, got, c.want)
		}
	}
	time.Sleep(1600 * time.Millisecond)
	// Gone at every replica, at a weak level too (served locally).
	for i, n := range g.nodes {
		if got := redisCLI(t, n.ClientAddr, "GET", "short"); got != "" {
			t.Errorf("replica %d: GET short after its expiry = %q", i, got)
		}
		if got := redisCLI(t, n.ClientAddr, "KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "EXISTS", "short", "p"); got != "1" {
			t.Errorf("replica %d: eventual EXISTS short p = %q, want 1", i, got)
		}
	}

	t.Run("redis-py", func(t *testing.T) { redisPy(t, fol) })

	// The expiry survives a restart of every replica.
	for _, n := range g.nodes {
		n.Stop()
	}
	for _, n := range g.nodes {
		n.Start()
	}
	l = g.settledLeader(-1)
	if got := redisCLI(t, g.nodes[l].ClientAddr, "PEXPIRETIME", "far"); got != "4102444800500" {
		t.Errorf("PEXPIRETIME far after a restart = %q", got)
	}
	ttl, err := strconv.Atoi(redisCLI(t, g.nodes[l].ClientAddr, "TTL", "a"))
	if err != nil || ttl <= 0 || ttl > 100 {
		t.Errorf("TTL a after a restart = %d, %v", ttl, err)
	}
	if got := redisCLI(t, g.nodes[l].ClientAddr, "GET", "short"); got != "" {
		t.Errorf("GET short after a restart = %q", got)
	}
}

// redisPyScript runs against host:port (argv): set(ex=), set(px=) that
// expires, and Lock: acquired once, refused while held, free again once its
// timeout passed (release, extend and reacquire: script_test.go).
const redisPyScript = `
import sys, time, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=10)
assert r.set("py:ex", "v", ex=100) is True
assert 99 <= r.ttl("py:ex") <= 100, r.ttl("py:ex")
assert r.set("py:px", "v", px=1000) is True
assert r.get("py:px") == b"v"
time.sleep(1.2)
assert r.get("py:px") is None
assert r.ttl("py:px") == -2
a = r.lock("py:lock", timeout=1.5)
assert a.acquire(blocking=False)
b = r.lock("py:lock", timeout=1.5)
assert not b.acquire(blocking=False)
assert 0 < r.pttl("py:lock") <= 1500
time.sleep(1.7)
assert b.acquire(blocking=False)
print("ok")
`

func redisPy(t *testing.T, addr string) {
	host, port, _ := net.SplitHostPort(addr)
	runRedisPy(t, redisPyScript, host, port)
}

// runRedisPy runs a python script with redis-py (argv: args), which must
// print "ok"; skipped if no python3 has redis-py.
func runRedisPy(t *testing.T, script string, args ...string) {
	t.Helper()
	// The system python (Debian's python3-redis) may not be the first python3.
	py := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import redis").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with redis-py (Debian: python3-redis)")
	}
	out, err := exec.Command(py, append([]string{"-c", script}, args...)...).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("redis-py: %v\n%s", err, out)
	}
}
