package e2e

import (
	"net"
	"strings"
	"testing"
	"time"
)

// redis-py's pipeline(transaction=True) holding the range reads and the
// long tail a test suite sends (hgetall, keys, rename, type, getrange,
// setrange, scan, dbsize...) in one transaction, on a 3-replica group,
// through the leader and through a follower (which forwards the EXEC): each
// reads the transaction's own earlier writes; afterwards every replica holds
// the same keys (each applied the one EXEC op alike).
func TestRedisPyTransactionRangeReads(t *testing.T) {
	g, _, _ := redisPyOnLeaderAndFollower(t, txRangePyScript)
	everyReplicaAnswers(t, g, "rr:f:{0}|rr:h|rr:n|rr:y", "KEYS", "rr:*")
}

// redisPyOnLeaderAndFollower starts a 3-replica group and runs the redis-py
// script with the leader's and a follower's ports; it returns the group, the
// leader's and the follower's index.
func redisPyOnLeaderAndFollower(t *testing.T, script string) (g *group, l, f int) {
	g = startGroup(t)
	l = g.settledLeader(-1)
	f = (l + 1) % 3
	host, lport, _ := net.SplitHostPort(g.nodes[l].ClientAddr)
	_, fport, _ := net.SplitHostPort(g.nodes[f].ClientAddr)
	runRedisPy(t, script, host, lport, fport)
	return g, l, f
}

// everyReplicaAnswers checks that every node of g answers want (lines
// joined by "|") to cmd at level eventual, waiting a little for followers.
func everyReplicaAnswers(t *testing.T, g *group, want string, cmd ...string) {
	for i := range g.nodes {
		got := ""
		for range 10 {
			args := append([]string{"KEFIR.CALL", "CONSISTENCY", "eventual", "CMD"}, cmd...)
			got = strings.ReplaceAll(strings.TrimSpace(redisCLI(t, g.nodes[i].ClientAddr, args...)), "\n", "|")
			if got == want {
				break
			}
			time.Sleep(200 * time.Millisecond) // a follower may lag
		}
		if got != want {
			t.Errorf("node %d: %s = %q, want %q", i, strings.Join(cmd, " "), got, want)
		}
	}
}

const txRangePyScript = `
import sys, redis
host, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
for port in ports:
    r = redis.Redis(host=host, port=port, socket_timeout=10)
    r.delete("rr:old", "rr:x", "rr:y", "rr:h", "rr:n", "rr:f:{0}")
    r.set("rr:old", "o")
    p = r.pipeline(transaction=True)
    p.hset("rr:h", mapping={"a": "1", "b": "2"}).hgetall("rr:h")
    p.delete("rr:old").keys("rr:*")
    p.set("rr:x", "hello").rename("rr:x", "rr:y").type("rr:y").type("rr:h")
    p.setrange("rr:y", 5, " world").getrange("rr:y", 0, 4)
    p.scan(0, match="rr:*", count=1000).hkeys("rr:h").hvals("rr:h").dbsize()
    p.msetnx({"rr:n": "1", "rr:f:{0}": "2"}).exists("rr:x")
    got = p.execute()
    want = [2, {b"a": b"1", b"b": b"2"},
            1, [b"rr:h"],
            True, True, b"string", b"hash",
            11, b"hello",
            (0, [b"rr:h", b"rr:y"]), [b"a", b"b"], [b"1", b"2"], got[13],
            True, 0]
    assert got == want, (port, got)
    assert isinstance(got[13], int) and got[13] >= 2, got[13]
    # A transaction of reads only (served as a read).
    p = r.pipeline(transaction=True)
    p.keys("rr:*").hgetall("rr:h").get("rr:y")
    assert p.execute() == [[b"rr:f:{0}", b"rr:h", b"rr:n", b"rr:y"], {b"a": b"1", b"b": b"2"}, b"hello world"], port
print("ok")
`

// redis-py's transactional pipeline holding scripts and random picks, on a
// 3-replica group through the leader and through a follower: pipeline.eval,
// a registered script (redis-py loads it with SCRIPT LOAD before MULTI and
// sends EVALSHA inside, which the node the client talks to resolves to its
// body), a script that raises after a write (the write stays, as in Redis),
// randomkey and hrandfield picking live keys and fields, flushdb (a test
// fixture's reset); every replica ends with the same values.
func TestRedisPyTransactionScriptsRandomAndFlush(t *testing.T) {
	g, _, _ := redisPyOnLeaderAndFollower(t, txScriptPyScript)
	everyReplicaAnswers(t, g, "22|yes|1", "MGET", "rs:n", "rs:raised", "rs:c")
}

const txScriptPyScript = `
import sys, redis
host, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
for port in ports:
    r = redis.Redis(host=host, port=port, socket_timeout=10)
    # A test fixture's reset: flushdb in a transactional pipeline, then writes
    # that see an empty store.
    p = r.pipeline(transaction=True)
    p.set("rs:gone", "1").flushdb().set("rs:fixture", "1").keys("*").dbsize()
    assert p.execute() == [True, True, True, [b"rs:fixture"], 1], port
    add = r.register_script("return redis.call('incrby', KEYS[1], ARGV[1])")
    p = r.pipeline(transaction=True)
    p.set("rs:n", "1").eval("return redis.call('incrby', KEYS[1], 10) + 1", 1, "rs:n")
    add(keys=["rs:n"], args=[1], client=p)
    p.eval("redis.call('set', 'rs:raised', 'yes'); error('boom')", 0)
    p.hset("rs:h", mapping={"a": "1", "b": "2"}).randomkey().hrandfield("rs:h", -4, withvalues=True)
    p.hrandfield("rs:h", 5).incr("rs:c").eval("return redis.call('get', 'rs:raised')", 0)
    got = p.execute(raise_on_error=False)
    assert got[:3] == [True, 12, 12], (port, got)
    assert isinstance(got[3], redis.ResponseError) and "boom" in str(got[3]), (port, got)
    assert got[4] == 2 and r.exists(got[5]) == 1, (port, got)
    pairs = got[6]
    assert len(pairs) == 8 and all({b"a": b"1", b"b": b"2"}[pairs[i]] == pairs[i+1] for i in range(0, 8, 2)), (port, got)
    assert sorted(got[7]) == [b"a", b"b"] and got[9] == b"yes", (port, got)
    p = r.pipeline(transaction=True)
    p.eval("return redis.call('incrby', KEYS[1], 10)", 1, "rs:n")
    assert p.execute() == [22], port
print("ok")
`
