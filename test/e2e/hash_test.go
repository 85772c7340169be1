package e2e

import (
	"net"
	"os/exec"
	"strings"
	"testing"
)

// Issue 27's acceptance for hashes: redis-py's hset/hgetall (and the rest of
// its hash API) work against a 3-replica group, writing through a follower
// (which forwards) and reading back through the leader and the follower;
// the hash survives a SIGKILL and restart of the whole group.
func TestRedisPyHashesOnAGroup(t *testing.T) {
	py := pythonWithRedis()
	if py == "" {
		t.Fatal("no python3 with redis-py: install Debian's python3-redis")
	}
	g := startGroup(t)
	l := g.settledLeader(-1)
	f := (l + 1) % 3
	run := func(addr, script string) string {
		t.Helper()
		host, port, _ := net.SplitHostPort(addr)
		out, err := exec.Command(py, "-c", `import sys, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=30, decode_responses=True)
`+script, host, port).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-py: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	got := run(g.nodes[f].ClientAddr, `
assert r.hset("user:1", mapping={"name": "ada", "lang": "en", "visits": "1"}) == 3
assert r.hset("user:1", "lang", "fr") == 0
assert r.hincrby("user:1", "visits", 41) == 42
assert r.hincrbyfloat("user:1", "score", 0.5) == 0.5
assert r.hsetnx("user:1", "name", "bob") == 0
assert r.hdel("user:1", "score", "nope") == 1
assert r.hexists("user:1", "name") and not r.hexists("user:1", "score")
assert r.hlen("user:1") == 3
assert r.hmget("user:1", ["name", "x"]) == ["ada", None]
assert r.type("user:1") == "hash"
assert r.expire("user:1", 1000) and 0 < r.ttl("user:1") <= 1000
try:
    r.get("user:1")
    raise SystemExit("GET of a hash did not fail")
except redis.exceptions.ResponseError as e:
    assert str(e).startswith("WRONGTYPE"), e
print(sorted(r.hgetall("user:1").items()))
`)
	want := "[('lang', 'fr'), ('name', 'ada'), ('visits', '42')]"
	if got != want {
		t.Fatalf("HGETALL through the follower: %s, want %s", got, want)
	}
	read := `print(sorted(r.hgetall("user:1").items()), sorted(r.hkeys("user:1")), r.hget("user:1", "visits"), r.hstrlen("user:1", "name"))`
	want = "[('lang', 'fr'), ('name', 'ada'), ('visits', '42')] ['lang', 'name', 'visits'] 42 3"
	if got := run(g.nodes[l].ClientAddr, read); got != want {
		t.Fatalf("read back at the leader: %s, want %s", got, want)
	}
	// SIGKILL every replica, then start them again: the hash is recovered
	// from the replicas' logs and engines.
	for _, n := range g.nodes {
		n.Kill()
	}
	for _, n := range g.nodes {
		n.Start()
	}
	l = g.settledLeader(-1)
	if got := run(g.nodes[l].ClientAddr, read); got != want {
		t.Fatalf("read back after a restart of the group: %s, want %s", got, want)
	}
	// RENAME carries the fields; DEL drops them all.
	if got := run(g.nodes[l].ClientAddr, `
r.rename("user:1", "user:2")
print(r.hgetall("user:1"), r.hget("user:2", "name"), r.delete("user:2"), r.hgetall("user:2"), r.exists("user:2"))`); got != "{} ada 1 {} 0" {
		t.Fatalf("RENAME and DEL of a hash: %s", got)
	}
}
