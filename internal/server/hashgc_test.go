package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// storedHashRows counts the hash field rows and generation markers s's
// engine stores (reachable or not).
func storedHashRows(t *testing.T, s *Server) (rows, markers int) {
	t.Helper()
	p := kv.ReservedKey("h/")
	if err := s.db.Scan(p, kv.PrefixEnd(p), 0, 0, func([]byte, storage.Value) bool { rows++; return true }); err != nil {
		t.Fatal(err)
	}
	ms, me := kv.HashMarkers()
	if err := s.db.Scan(ms, me, 0, 0, func([]byte, storage.Value) bool { markers++; return true }); err != nil {
		t.Fatal(err)
	}
	return rows, markers
}

// The sweeper reclaims the rows of a deleted 10k-field hash from every
// replica's engine (single node: its own), while a new hash at the same key,
// written during the sweep, keeps every field.
func TestHashSweeperReclaimsRows(t *testing.T) {
	for _, replicated := range []bool{false, true} {
		t.Run(fmt.Sprint("replicated=", replicated), func(t *testing.T) {
			mod := func(c *Config) { c.ActiveExpiry = 20 * time.Millisecond }
			var nodes []*Server
			var c *client
			if replicated {
				g := startGroupWith(t, mod)
				nodes = g.nodes
				c = dial(t, g.nodes[g.leader(t)])
			} else {
				s := startServer(t, mod)
				nodes = []*Server{s}
				c = dial(t, s)
			}
			const fields = 10000
			for i := 0; i < fields; i += 1000 {
				args := []string{"HSET", "big"}
				for j := i; j < i+1000; j++ {
					args = append(args, fmt.Sprint("f", j), "v")
				}
				if r, retried := doRetrying(c, args...); r != "(integer) 1000" && !(retried && strings.HasPrefix(r, "(integer) ")) {
					t.Fatalf("HSET: %s", r)
				}
			}
			c.expect(`
HLEN big => (integer) 10000
`)
			if r, retried := doRetrying(c, "DEL", "big"); r != "(integer) 1" && !(retried && r == "(integer) 0") {
				t.Fatalf("DEL: %s", r)
			}
			deleted := time.Now()
			// A new hash at the key while the old rows are swept.
			for i := 0; i < 200; i++ {
				if r, retried := doRetrying(c, "HSET", "big", fmt.Sprint("f", i), "new"); r != "(integer) 1" && !(retried && r == "(integer) 0") {
					t.Fatalf("HSET of the new hash: %s", r)
				}
			}
			behind, rows, markers := 0, 0, 0 // the first replica not swept yet, and what it stores
			if !testgroup.Until(8*time.Second, 20*time.Millisecond, func() bool {
				for ; behind < len(nodes); behind++ {
					if rows, markers = storedHashRows(t, nodes[behind]); rows != 200 || markers != 1 {
						return false
					}
				}
				return true
			}) {
				t.Fatalf("replica %d still stores %d rows and %d markers, want 200 and 1", behind, rows, markers)
			}
			t.Logf("every engine reclaimed the 10,000 rows %v after the DEL", time.Since(deleted).Round(time.Millisecond))
			c.expect(`
HLEN big => (integer) 200
HGET big f0 => "new"
HGET big f199 => "new"
HGET big f200 => (nil)
`)
		})
	}
}

// hscanAll iterates HSCAN key from cursor 0 with COUNT count through c,
// forgetting every cursor the nodes issued after each call when forget is
// set (as a new leader that never issued them would), and returns how many
// times each field came back and how many calls it took.
func hscanAll(t *testing.T, c *client, key string, count int, forget bool) (map[string]int, int) {
	t.Helper()
	seen := map[string]int{}
	cursor := "0"
	calls := 0
	for {
		calls++
		r := c.doRaw("HSCAN", key, cursor, "COUNT", fmt.Sprint(count), "NOVALUES")
		cursor = r.cursor
		for _, f := range r.items {
			seen[f]++
		}
		if forget {
			hscanCursors.mu.Lock()
			clear(hscanCursors.cur)
			clear(hscanCursors.old)
			hscanCursors.mu.Unlock()
		}
		if cursor == "0" || calls > 10000 {
			return seen, calls
		}
	}
}

// HSCAN's cursor resumes after the last field returned: a big hash comes
// back in pages, every field present for the whole iteration at least once
// (exactly once when nothing changes and the cursors are known), also when
// the node resuming a cursor never issued it (a leader change), and with
// fields written and deleted during the iteration.
func TestHScanCursor(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	const n = 1000
	for i := 0; i < n; i += 100 {
		args := []string{"HSET", "h"}
		for j := i; j < i+100; j++ {
			args = append(args, fmt.Sprintf("f%04d", j), "v")
		}
		c.do(args...)
	}
	seen, calls := hscanAll(t, c, "h", 200, false)
	if len(seen) != n || calls < n/200 {
		t.Fatalf("HSCAN returned %d of %d fields in %d calls", len(seen), n, calls)
	}
	for f, k := range seen {
		if k != 1 {
			t.Fatalf("field %s returned %d times", f, k)
		}
	}
	// Cursors the resuming node never issued: no field missed.
	seen, _ = hscanAll(t, c, "h", 150, true)
	if len(seen) != n {
		t.Fatalf("HSCAN with forgotten cursors returned %d of %d fields", len(seen), n)
	}
	// Writes during the iteration: the fields present throughout come back.
	seen = map[string]int{}
	cursor := "0"
	for i := 0; ; i++ {
		r := c.doRaw("HSCAN", "h", cursor, "COUNT", "200")
		for j := 0; j < len(r.items); j += 2 {
			seen[r.items[j]]++
		}
		c.do("HDEL", "h", fmt.Sprintf("f%04d", 999-i)) // from the end
		c.do("HSET", "h", fmt.Sprintf("new%d", i), "v")
		if cursor = r.cursor; cursor == "0" {
			break
		}
	}
	for j := 0; j < n-10; j++ {
		if seen[fmt.Sprintf("f%04d", j)] == 0 {
			t.Fatalf("field f%04d, present throughout, was not returned", j)
		}
	}
	// A small hash comes back whole, cursor 0 (as Redis's listpack).
	c.expect(`
HSET small a 1 b 2 => (integer) 2
HSCAN small 0 COUNT 1 => ["0", ["a", "1", "b", "2"]]
HSCAN small 0 MATCH b => ["0", ["b", "2"]]
`)
}

// scanReply is a SCAN-shaped reply: a cursor and items.
type scanReply struct {
	cursor string
	items  []string
}

func (c *client) doRaw(args ...string) scanReply {
	c.t.Helper()
	c.send(args...)
	v, err := c.rd.ReadValue()
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	if len(v.Elems) != 2 {
		c.t.Fatalf("%v: not a scan reply: %s", args, show(v))
	}
	r := scanReply{cursor: string(v.Elems[0].Str)}
	for _, e := range v.Elems[1].Elems {
		r.items = append(r.items, string(e.Str))
	}
	return r
}

// doRetrying runs a command that may meet a view change of a loaded group
// (-UNAVAILABLE: its outcome unknown) again until it is answered otherwise,
// and reports whether it retried: the commands here are idempotent in
// effect, but a retry may answer as if the first attempt had applied.
func doRetrying(c *client, args ...string) (reply string, retried bool) {
	for try := 0; ; try++ {
		reply = c.do(args...)
		if !strings.Contains(reply, "UNAVAILABLE") || try == 20 {
			return reply, try > 0
		}
		time.Sleep(50 * time.Millisecond)
	}
}
