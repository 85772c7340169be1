package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
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
				if r := c.do(args...); r != "(integer) 1000" {
					t.Fatalf("HSET: %s", r)
				}
			}
			c.expect(`
HLEN big => (integer) 10000
DEL big => (integer) 1
`)
			// A new hash at the key while the old rows are swept.
			for i := 0; i < 200; i++ {
				if r := c.do("HSET", "big", fmt.Sprint("f", i), "new"); r != "(integer) 1" {
					t.Fatalf("HSET of the new hash: %s", r)
				}
			}
			deadline := time.Now().Add(8 * time.Second)
			for i, n := range nodes {
				for {
					rows, markers := storedHashRows(t, n)
					if rows == 200 && markers == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("replica %d still stores %d rows and %d markers, want 200 and 1", i, rows, markers)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			c.expect(`
HLEN big => (integer) 200
HGET big f0 => "new"
HGET big f199 => "new"
HGET big f200 => (nil)
`)
		})
	}
}
