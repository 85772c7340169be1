package server

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// expiryScript exercises every expiry command, option, reply and error with
// times that do not depend on the clock (far-future absolute expiries, whole
// seconds read back well within the 500 ms rounding). The replies are
// redis-server 7.0.15's, recorded with KEFIR_REDIS_ADDR=127.0.0.1:<port>
// KEFIR_EXPIRY_PRINT=1 go test -run TestExpiryCommandsAsRedis ./internal/server/;
// with KEFIR_REDIS_ADDR set, the test checks them against that server too.
const expiryScript = `
SET k v EX 0 => ERR invalid expire time in 'set' command
SET k v PX -5 => ERR invalid expire time in 'set' command
SET k v EX soon => ERR value is not an integer or out of range
SET k v EX => ERR syntax error
SET k v EX 10 PX 10 => ERR syntax error
SET k v EX 10 KEEPTTL => ERR syntax error
SET k v KEEPTTL EX 10 => ERR syntax error
SET k v EXAT 9223372036854775807 => ERR invalid expire time in 'set' command
SET k v EX 9223372036854776 => ERR invalid expire time in 'set' command
SET k v EX 9223372036854775 => ERR invalid expire time in 'set' command
SET k v NX XX => ERR syntax error
SET k v GET GET => (nil)
SETEX k 0 v => ERR invalid expire time in 'setex' command
SETEX k -1 v => ERR invalid expire time in 'setex' command
SETEX k x v => ERR value is not an integer or out of range
PSETEX k 0 v => ERR invalid expire time in 'psetex' command
SET k v EXAT 4102444800 => OK
TTL missing => (integer) -2
PTTL missing => (integer) -2
EXPIRETIME missing => (integer) -2
PEXPIRETIME missing => (integer) -2
EXPIRETIME k => (integer) 4102444800
PEXPIRETIME k => (integer) 4102444800000
SET k v KEEPTTL => OK
EXPIRETIME k => (integer) 4102444800
SET k v => OK
EXPIRETIME k => (integer) -1
TTL k => (integer) -1
SET k v PXAT 4102444800123 => OK
PEXPIRETIME k => (integer) 4102444800123
EXPIRETIME k => (integer) 4102444800
SET k v EX 100 => OK
TTL k => (integer) 100
SET k v EXAT 1 => OK
GET k => (nil)
EXISTS k => (integer) 0
SET k v EX 100 GET => (nil)
SET k w EX 100 GET => "v"
SETEX k 100 v => OK
TTL k => (integer) 100
PSETEX k 100000 v => OK
TTL k => (integer) 100
SET k 5 EXAT 4102444800 => OK
INCR k => (integer) 6
EXPIRETIME k => (integer) 4102444800
APPEND k 0 => (integer) 2
EXPIRETIME k => (integer) 4102444800
GETSET k 1 => "60"
EXPIRETIME k => (integer) -1
SET k v EXAT 4102444800 => OK
PERSIST k => (integer) 1
PERSIST k => (integer) 0
PERSIST missing => (integer) 0
TTL k => (integer) -1
EXPIRE k 100 XX => (integer) 0
EXPIRE k 100 GT => (integer) 0
EXPIRE k 100 NX => (integer) 1
EXPIRE k 100 NX => (integer) 0
TTL k => (integer) 100
EXPIRE k 200 LT => (integer) 0
EXPIRE k 50 LT => (integer) 1
TTL k => (integer) 50
EXPIRE k 200 GT => (integer) 1
TTL k => (integer) 200
EXPIRE k 100 XX GT => (integer) 0
EXPIRE k 300 XX GT => (integer) 1
TTL k => (integer) 300
EXPIRE k 100 NX XX => ERR NX and XX, GT or LT options at the same time are not compatible
EXPIRE k 100 GT LT => ERR GT and LT options at the same time are not compatible
EXPIRE k 100 FOO => ERR Unsupported option FOO
EXPIRE k abc => ERR value is not an integer or out of range
EXPIRE k 9223372036854775807 => ERR invalid expire time in 'expire' command
PEXPIRE k 9223372036854775807 => ERR invalid expire time in 'pexpire' command
EXPIREAT k 4102444800 => (integer) 1
EXPIRETIME k => (integer) 4102444800
PEXPIREAT k 4102444800999 => (integer) 1
PEXPIRETIME k => (integer) 4102444800999
EXPIRETIME k => (integer) 4102444801
EXPIRE missing 100 => (integer) 0
EXPIRE k => ERR wrong number of arguments for 'expire' command
EXPIRE k -1 => (integer) 1
EXISTS k => (integer) 0
SET k v => OK
EXPIREAT k 0 => (integer) 1
GET k => (nil)
SET k v => OK
PEXPIRE k 0 => (integer) 1
GET k => (nil)
GETEX missing => (nil)
GETEX missing EX 10 => (nil)
SET k v => OK
GETEX k => "v"
TTL k => (integer) -1
GETEX k EX 100 => "v"
TTL k => (integer) 100
GETEX k PERSIST => "v"
TTL k => (integer) -1
GETEX k EXAT 4102444800 => "v"
EXPIRETIME k => (integer) 4102444800
GETEX k PXAT 4102444800500 => "v"
PEXPIRETIME k => (integer) 4102444800500
GETEX k EX 0 => ERR invalid expire time in 'getex' command
GETEX k EX -1 => ERR invalid expire time in 'getex' command
GETEX k EX x => ERR value is not an integer or out of range
GETEX k EX 10 PX 10 => ERR syntax error
GETEX k EX 10 PERSIST => ERR syntax error
GETEX k PERSIST EX 10 => ERR syntax error
GETEX k FOO => ERR syntax error
GETEX k EX => ERR syntax error
GETEX k EXAT 1 => "v"
GET k => (nil)
TTL => ERR wrong number of arguments for 'ttl' command
PERSIST => ERR wrong number of arguments for 'persist' command
SETEX k 10 => ERR wrong number of arguments for 'setex' command
`

// runExpiryScript runs expiryScript on c; with print set it logs the replies
// in the script's form instead of checking them.
func runExpiryScript(t *testing.T, c *client, print bool) {
	t.Helper()
	if !print {
		c.expect(expiryScript)
		return
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(expiryScript), "\n") {
		cmd, _, _ := strings.Cut(line, "=>")
		out = append(out, strings.TrimSpace(cmd)+" => "+c.do(strings.Fields(cmd)...))
	}
	t.Log("\n" + strings.Join(out, "\n"))
}

// Every expiry command answers as Redis 7 does, on a single node.
func TestExpiryCommandsAsRedis(t *testing.T) {
	print := os.Getenv("KEFIR_EXPIRY_PRINT") != ""
	if addr := os.Getenv("KEFIR_REDIS_ADDR"); addr != "" {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		rc := &client{t: t, nc: nc, rd: resp.NewReader(nc, 0)}
		rc.do("DEL", "k", "missing")
		t.Run("redis", func(t *testing.T) { rc.t = t; runExpiryScript(t, rc, print) })
	}
	s := startServer(t, nil)
	c := dial(t, s)
	t.Run("kefir", func(t *testing.T) { c.t = t; runExpiryScript(t, c, print) })
}

// A key with a TTL is there until its expiry and gone after it, to every
// read command, and PTTL counts down.
func TestExpiryTakesEffect(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.expect(`
SET a 1 PX 600 => OK
SET b 2 => OK
MSET c 3 d 4 => OK
PEXPIRE c 600 => (integer) 1
GET a => "1"
EXISTS a b c => (integer) 3
`)
	if p := c.do("PTTL", "a"); p == "(integer) -1" || p == "(integer) -2" {
		t.Fatalf("PTTL a = %s", p)
	}
	time.Sleep(700 * time.Millisecond)
	c.expect(`
GET a => (nil)
STRLEN a => (integer) 0
MGET a b c => [(nil), "2", (nil)]
EXISTS a b c => (integer) 1
TTL a => (integer) -2
PERSIST c => (integer) 0
INCR a => (integer) 1
TTL a => (integer) -1
SET c x XX => (nil)
SET c x NX => OK
KEFIR.SCAN a z => ["a", "1", "b", "2", "c", "x", "d", "4"]
`)
}

// A 3-replica group answers the expiry commands as Redis does through the
// leader and through a follower (which forwards them), and a key with a TTL
// disappears at every replica and every level once it expires, with no
// replica deleting on its own: the leader's active expiry is what deletes.
func TestExpiryReplicated(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	f := (l + 1) % 3
	lc := dial(t, g.nodes[l])
	t.Run("leader", func(t *testing.T) { lc.t = t; runExpiryScript(t, lc, false) })
	fc := dial(t, g.nodes[f])
	t.Run("follower", func(t *testing.T) { fc.t = t; runExpiryScript(t, fc, false) })

	lc.t, fc.t = t, t
	set := time.Now()
	lc.expect(`
SET e v PX 1000 => OK
SET p v => OK
`)
	// Every replica, at a weak level, sees the key before its expiry...
	var cs []*client
	for i := range g.nodes {
		c := dial(t, g.nodes[i])
		c.expect(`KEFIR.CONSISTENCY eventual => OK`)
		cs = append(cs, c)
	}
	behind := 0 // the first replica not showing e yet
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
		for behind < len(cs) && cs[behind].do("GET", "e") == `"v"` {
			behind++
		}
		return behind == len(cs)
	}) {
		t.Fatalf("replica %d never showed e before its expiry", behind)
	}
	time.Sleep(time.Until(set.Add(1100 * time.Millisecond)))
	// ... and none after it, at any level.
	for i, c := range cs {
		if got := c.do("GET", "e"); got != "(nil)" {
			t.Errorf("replica %d: GET e after its expiry = %s", i, got)
		}
		if got := c.do("EXISTS", "e", "p"); got != "(integer) 1" {
			t.Errorf("replica %d: EXISTS e p = %s", i, got)
		}
	}
	lc.expect(`
GET e => (nil)
TTL e => (integer) -2
`)
}

// storedKeys counts which of keys s's engine still stores (expired or not).
func storedKeys(s *Server, keys []string) int {
	n := 0
	for _, k := range keys {
		if _, err := s.db.Get([]byte(k)); err == nil {
			n++
		}
	}
	return n
}

// The leader's active expiry deletes expired keys from every replica's
// engine, with replicated deletes; without it (ActiveExpiry < 0) expired
// keys stay stored on every replica, hidden from reads: no replica deletes
// on its own.
func TestActiveExpiryReplicated(t *testing.T) {
	for _, active := range []bool{false, true} {
		t.Run(fmt.Sprint("active=", active), func(t *testing.T) {
			g := startGroupWith(t, func(c *Config) {
				c.ActiveExpiry = -1
				if active {
					c.ActiveExpiry = 20 * time.Millisecond
				}
			})
			l := g.leader(t)
			c := dial(t, g.nodes[l])
			var keys []string
			var pipe []byte
			for i := 0; i < 300; i++ {
				k := fmt.Sprintf("x%03d", i)
				keys = append(keys, k)
				pipe = appendCmd(pipe, "SET", k, "v", "PX", "200")
			}
			pipe = appendCmd(pipe, "SET", "keep", "v", "EX", "100")
			if _, err := c.nc.Write(pipe); err != nil {
				t.Fatal(err)
			}
			for range 301 {
				if r := c.reply(); r != "OK" {
					t.Fatalf("SET: %s", r)
				}
			}
			// Every replica applies the SETs. Not "stores every key": on a
			// loaded box a follower may apply them after their 200 ms, and
			// then the leader's deletes too (it failed that way).
			commit := g.nodes[l].grp.State().Commit
			behind := 0 // the first replica that has not applied the SETs yet
			if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool {
				for behind < len(g.nodes) && g.nodes[behind].grp.State().Applied >= commit {
					behind++
				}
				return behind == len(g.nodes)
			}) {
				t.Fatalf("replica %d never applied the keys (op %d)", behind, commit)
			}
			time.Sleep(1200 * time.Millisecond)
			c.expect(`
GET x000 => (nil)
EXISTS x001 x299 keep => (integer) 1
`)
			for i, n := range g.nodes {
				got := storedKeys(n, keys)
				if !active && got != len(keys) {
					t.Errorf("replica %d deleted %d expired keys with active expiry off", i, len(keys)-got)
				}
				if active && got != 0 {
					t.Errorf("replica %d still stores %d of %d expired keys", i, got, len(keys))
				}
				if _, err := n.db.Get([]byte("keep")); err != nil {
					t.Errorf("replica %d: keep: %v", i, err)
				}
			}
			if active && g.nodes[l].expiredKeys() != uint64(len(keys)) {
				t.Errorf("the leader's cycle deleted %d keys, want %d", g.nodes[l].expiredKeys(), len(keys))
			}
		})
	}
}

// On a single node the cycle deletes expired keys too (counted in INFO stats
// expired_keys), and a key written again after it was deleted stays.
func TestActiveExpirySingleNode(t *testing.T) {
	s := startServer(t, func(c *Config) { c.ActiveExpiry = 20 * time.Millisecond })
	c := dial(t, s)
	c.expect(`
SET a 1 PX 100 => OK
SET b 1 PX 100 => OK
SET p 1 => OK
`)
	// A deletion is visible once applied; the cycle counts it once durable.
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool {
		return storedKeys(s, []string{"a", "b"}) == 0 && strings.Contains(c.do("INFO", "stats"), `expired_keys:2\r`)
	}) {
		t.Fatalf("a, b not deleted (%d stored) or not counted: %s", storedKeys(s, []string{"a", "b"}), c.do("INFO", "stats"))
	}
	c.expect(`SET b 2 => OK`)
	time.Sleep(100 * time.Millisecond) // five cycles
	c.expect(`
GET b => "2"
GET p => "1"
`)
	if got := c.do("INFO", "stats"); !strings.Contains(got, `expired_keys:2\r`) {
		t.Fatalf("INFO stats = %s, want expired_keys:2", got)
	}
}

// With --nilext, SET with a future expiry (and SETEX) completes on the fast
// path like a plain SET, carries its expiry to every replica, and is gone
// once it expires; KEEPTTL keeps the ordered path (its meta depends on the
// state) and keeps the expiry.
func TestExpiryOnTheNilextFastPath(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	f := (l + 1) % 3
	c := dial(t, g.nodes[f])
	if err := fastWrites(t, g.nodes[f], c, "SET e v PX 800 => OK\nSETEX s 100 v => OK", 2); err != nil {
		t.Fatal(err)
	}
	before := g.nodes[f].grp.Stats()
	c.expect(`SET e w PX 800 KEEPTTL => ERR syntax error
SET s w KEEPTTL => OK`)
	if after := g.nodes[f].grp.Stats(); after.NilextFast != before.NilextFast {
		t.Errorf("SET KEEPTTL took the fast path")
	}
	lc := dial(t, g.nodes[l])
	lc.expect(`
GET e => "v"
TTL s => (integer) 100
GET s => "w"
`)
	time.Sleep(900 * time.Millisecond)
	lc.expect(`GET e => (nil)`)
	c.expect(`GET e => (nil)`)
}

// INFO keyspace counts the keys with an expiry, hashes only with one.
func TestInfoKeyspaceCountsExpires(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.expect(`
SET a v EX 100 => OK
SET b v => OK
SET c v PX 100000 => OK
PERSIST c => (integer) 1
SETEX d 100 v => OK
HSET h f v => (integer) 1
HSET ht f v => (integer) 1
EXPIRE ht 100 => (integer) 1
`)
	// A hash counts only with a TTL (its metadata's type byte is meta too).
	got := c.do("INFO", "keyspace")
	if !strings.Contains(got, "db0:keys=6,expires=3,") {
		t.Fatalf("INFO keyspace = %q, want keys=6,expires=3", got)
	}
	// avg_ttl: the three keys' 100 s, in milliseconds, less what passed.
	_, avg, ok := strings.Cut(got, "avg_ttl=")
	avg, _, _ = strings.Cut(avg, `\r`) // the reply as quoted
	ms, err := strconv.Atoi(avg)
	if !ok || err != nil || ms > 100000 || ms < 90000 {
		t.Fatalf("INFO keyspace = %q, want avg_ttl near 100000", got)
	}
}

// An expiry read (TTL, PTTL, EXPIRETIME, PEXPIRETIME) shows the write
// answered before it, as GET does: on a VR group's leader after a cad or
// async write (answered before it is applied: the read must wait for it or
// read it from the overlay), and on a --nilext group after a fast-path
// write, through the leader and a follower. The expiry read named no key
// to the engines' read checks (vrshard readKeys, nilextCoord.readKeys), so
// it was served from the engine before the write was applied: every TTL
// here answered the previous write's (or -2), as did a chain member's
// (TestExpiryCommandsChain).
func TestExpiryReadsTheWriteBefore(t *testing.T) {
	check := func(t *testing.T, c *client) {
		t.Helper()
		for i := 1; i <= 50; i++ {
			c.do("SET", "k", "v", "EX", strconv.Itoa(1000+i))
			if got, want := c.do("TTL", "k"), fmt.Sprintf("(integer) %d", 1000+i); got != want {
				t.Fatalf("after SET k v EX %d: TTL k = %s, want %s", 1000+i, got, want)
			}
			c.do("PEXPIREAT", "k", strconv.Itoa(4102444800000+i))
			if got, want := c.do("PEXPIRETIME", "k"), fmt.Sprintf("(integer) %d", 4102444800000+i); got != want {
				t.Fatalf("after PEXPIREAT k %d: PEXPIRETIME k = %s, want %s", 4102444800000+i, got, want)
			}
		}
	}
	t.Run("vr", func(t *testing.T) {
		g := startGroup(t)
		c := dial(t, g.nodes[g.leader(t)])
		c.t = t
		for _, d := range []string{"cad", "async"} {
			c.expect("KEFIR.DURABILITY " + d + " => OK")
			t.Run(d, func(t *testing.T) { c.t = t; check(t, c) })
		}
	})
	t.Run("nilext", func(t *testing.T) {
		g := startNilextGroup(t)
		l := g.leader(t)
		for i, at := range []string{"leader", "follower"} {
			c := dial(t, g.nodes[(l+i)%3])
			t.Run(at, func(t *testing.T) { c.t = t; check(t, c) })
		}
	})
}
