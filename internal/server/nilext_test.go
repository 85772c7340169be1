package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/kefirdb/kefir/internal/check"
)

func startNilextGroup(t testing.TB) *group {
	return startGroupWith(t, func(c *Config) { c.Nilext = true })
}

// With --nilext a plain SET at any node completes on the fast path (that
// node coordinates it; counted in its stats), a linearizable GET anywhere
// sees it, and non-nilext commands keep the ordered path and see it too.
func TestNilextSetThroughEveryNode(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	for i, s := range g.nodes {
		before := s.vr.Stats().NilextFast
		c := dial(t, s)
		c.expect(`
SET a` + string(rune('0'+i)) + ` v => OK
MSET m1 x m2 y => OK
GET a` + string(rune('0'+i)) + ` => "v"
GET m2 => "y"
INCR n => (integer) ` + string(rune('1'+i)))
		if got := s.vr.Stats().NilextFast - before; got != 2 {
			t.Fatalf("node %d: %d writes on the fast path, want 2 (SET and MSET)", i, got)
		}
	}
	// SET NX is not nilext: ordered, and it sees the fast write.
	dial(t, g.nodes[(l+1)%3]).expect(`SET a0 other NX => (nil)`)
	// Writes to one key in one pipeline keep the ordered path, in order.
	fc := dial(t, g.nodes[(l+1)%3])
	for _, v := range []string{"1", "2", "3"} {
		fc.send("SET", "p", v)
	}
	for range 3 {
		if got := fc.reply(); got != "OK" {
			t.Fatalf("pipelined SET: %s", got)
		}
	}
	fc.expect(`GET p => "3"`)
	resp, err := http.Get("http://" + g.nodes[l].HTTPAddr().String() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st StatusJSON
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Replication == nil || st.Replication.Nilext == nil || st.Replication.Nilext.Fast == 0 {
		t.Fatalf("leader /status has no nilext figures: %+v", st.Replication)
	}
}

// Concurrent SET (fast path), GET, KEFIR.CAS and DEL (ordered) through a
// follower and through the leader of a --nilext group form a linearizable
// history. (TestStaleReadsAreNotLinearizable shows the checker can fail.)
func TestNilextRESPHistoryIsLinearizable(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	for _, i := range []int{(l + 1) % 3, l} {
		// Each run gets its own keys: the second must not start from the
		// first one's values (the model starts every key absent).
		h := runRegisterWorkload(t, g.nodes[i], fmt.Sprintf("n%d-", i), 4, 60, false)
		if v := check.Linearizable(h, check.LinOptions{NoVisualization: true, Strict: true}); !v.OK {
			t.Fatalf("through node %d: not linearizable:\n%s", i, v)
		}
	}
	var fast uint64
	for _, s := range g.nodes {
		fast += s.vr.Stats().NilextFast
	}
	if fast == 0 {
		t.Fatal("no write took the fast path: the history checked nothing new")
	}
}
