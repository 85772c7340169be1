package e2e

import (
	"net"
	"strings"
	"testing"
)

// lockScript exercises redis-py 4.3's Lock, whose release, extend and
// reacquire are Lua scripts (register_script: EVALSHA, then SCRIPT LOAD on
// NOSCRIPT), against each address (argv: host, then ports): acquire (SET NX
// PX), a second client refused and then blocked until the holder releases,
// extend (added and replacing the TTL), reacquire, and a release or extend
// by the wrong token refused with LockNotOwnedError.
const lockScript = `
import sys, threading, time, redis
from redis.exceptions import LockNotOwnedError
host = sys.argv[1]
for port in sys.argv[2:]:
    r = redis.Redis(host=host, port=int(port), socket_timeout=10)
    r2 = redis.Redis(host=host, port=int(port), socket_timeout=10)
    name = "py:lock:" + port
    a = r.lock(name, timeout=5)
    assert a.acquire(blocking=False)
    b = r2.lock(name, timeout=5, thread_local=False)  # acquired in a thread below
    assert not b.acquire(blocking=False)
    assert not b.acquire(blocking_timeout=0.3)
    assert a.extend(10)
    assert 14000 < r.pttl(name) <= 15000, r.pttl(name)
    assert a.extend(3, replace_ttl=True)
    assert 2000 < r.pttl(name) <= 3000, r.pttl(name)
    assert a.reacquire()
    assert 4000 < r.pttl(name) <= 5000, r.pttl(name)
    wrong = r2.lock(name, timeout=5)
    for f in (wrong.release, lambda: wrong.extend(1), wrong.reacquire):
        wrong.local.token = b"not-the-token"  # release clears it
        try:
            f()
            raise SystemExit("an operation with the wrong token succeeded")
        except LockNotOwnedError:
            pass
    assert r.get(name) == a.local.token
    got = []
    t = threading.Thread(target=lambda: got.append(b.acquire(blocking_timeout=5)))
    t.start()
    time.sleep(0.3)
    assert not got, (got, r.get(name), r.pttl(name))
    a.release()
    t.join()
    assert got == [True], got
    assert r.get(name) == b.local.token
    try:
        a.release()
        raise SystemExit("a release of a lock released already succeeded")
    except Exception:
        pass
    b.release()
    assert r.get(name) is None
    with r.lock(name, timeout=5) as c:
        assert r.get(name) == c.local.token
    assert r.get(name) is None
print("ok")
`

// redis-py's Lock on a real 3-replica group, through the leader and
// through a follower (which resolves EVALSHA in its own script cache and
// forwards EVAL with the body to the leader); then read-only scripts.
func TestRedisPyLockReplicated(t *testing.T) {
	g, l, f := redisPyOnLeaderAndFollower(t, lockScript)

	// Read-only scripts are reads: through the follower at the default
	// (linearizable) level they are forwarded, EVALSHA_RO as EVAL_RO with
	// the body the follower's cache holds; at eventual the follower serves
	// them itself.
	lead, fol := g.nodes[l].ClientAddr, g.nodes[f].ClientAddr
	get := "return redis.call('get', KEYS[1])"
	sha := redisCLI(t, fol, "SCRIPT", "LOAD", get)
	for _, c := range []struct {
		addr string
		args []string
		want string
	}{
		{lead, []string{"SET", "ro", "v"}, "OK"},
		{fol, []string{"EVAL_RO", get, "1", "ro"}, "v"},
		{fol, []string{"EVALSHA_RO", sha, "1", "ro"}, "v"},
		{fol, []string{"KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "EVALSHA_RO", sha, "1", "ro"}, "v"},
		{fol, []string{"EVAL_RO", "return redis.call('set', KEYS[1], 'x')", "1", "ro"}, "*Write commands are not allowed from read-only scripts.*"},
		{fol, []string{"EVAL", "return redis.call('incr', KEYS[1])", "1", "n"}, "1"},
		{lead, []string{"EVAL_RO", get, "1", "n"}, "1"},
	} {
		got := redisCLI(t, c.addr, c.args...)
		if c.want[0] == '*' && strings.Contains(got, strings.Trim(c.want, "*")) {
			continue
		}
		if got != c.want {
			t.Errorf("%q via %s: %q, want %q", c.args, c.addr, got, c.want)
		}
	}
	// Every replica applied the scripts alike: the locks are gone at each.
	_, lport, _ := net.SplitHostPort(g.nodes[l].ClientAddr)
	_, fport, _ := net.SplitHostPort(g.nodes[f].ClientAddr)
	for i := range g.nodes {
		for _, p := range []string{lport, fport} {
			if got := redisCLI(t, g.nodes[i].ClientAddr, "KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "EXISTS", "py:lock:"+p); got != "0" {
				t.Errorf("node %d: EXISTS py:lock:%s = %q", i, p, got)
			}
		}
	}
}
