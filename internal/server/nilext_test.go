package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
)

// startNilextGroup starts a --nilext group whose followers wait 1 s (not
// 300 ms) without heartbeats before starting a view change: these tests are
// about the fast path, which needs all three replicas in one view, and on a
// loaded 2-core box a 300 ms scheduling stall mid-test is common enough to
// turn an assertion about which path a write took into a test of elections.
func startNilextGroup(t testing.TB) *group {
	return startGroupWith(t, func(c *Config) { c.Nilext, c.ViewChangeTimeout = true, time.Second })
}

// nilextBackoff is vrshard's default NilextBackoff: after a fast write
// misses its window the coordinator sends every write down the ordered path
// for this long.
const nilextBackoff = time.Second

// fastWrites sends script (nilext writes only) through c until every write
// in it completes on s's fast path; it returns an error if a write ever takes
// neither path, or if the fast path still misses after 8 tries. A fast write
// must gather acks from every replica of a 3-node group within NilextTimeout
// (100 ms); on a loaded 2-core box a write can miss that window (the first
// one from a node also dials its peer connections) and correctly fall back
// to the ordered path, which the client cannot tell apart. So a miss is
// retried after the coordinator's rest: a fast path that never completes
// still fails.
func fastWrites(t *testing.T, s *Server, c *client, script string, n uint64) error {
	t.Helper()
	for attempt := 1; ; attempt++ {
		before := vrOf(s).Stats()
		c.expect(script)
		after := vrOf(s).Stats()
		fast, fb := after.NilextFast-before.NilextFast, after.NilextFallbacks-before.NilextFallbacks
		switch {
		case fast == n:
			return nil
		case fast+fb != n:
			return fmt.Errorf("%d fast + %d fallback writes for %q, want %d nilext writes: some took neither path", fast, fb, script, n)
		case attempt == 8:
			return fmt.Errorf("%q: %d of %d writes on the fast path after %d attempts", script, fast, n, attempt)
		}
		t.Logf("attempt %d: %d of %d writes fell back (missed the fast path's window); retrying after the coordinator's rest", attempt, fb, n)
		time.Sleep(nilextBackoff + 100*time.Millisecond)
	}
}

// fastWrites fails when writes keep the ordered path (here: a group without
// --nilext, where a plain SET is never coordinated on the fast path).
func TestFastWritesCanFail(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	err := fastWrites(t, g.nodes[l], dial(t, g.nodes[l]), `SET k v => OK`, 1)
	if err == nil {
		t.Fatal("ordered-path writes passed as fast-path writes")
	}
	t.Logf("caught: %v", err)
}

// With --nilext a plain SET at any node completes on the fast path (that
// node coordinates it; counted in its stats), a linearizable GET anywhere
// sees it, and non-nilext commands keep the ordered path and see it too.
func TestNilextSetThroughEveryNode(t *testing.T) {
	g := startNilextGroup(t)
	l := g.leader(t)
	for i, s := range g.nodes {
		c := dial(t, s)
		a := "a" + string(rune('0'+i))
		if err := fastWrites(t, s, c, `
SET `+a+` v => OK
MSET m1 x m2 y => OK`, 2); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		c.expect(`
GET ` + a + ` => "v"
GET m2 => "y"
INCR n => (integer) ` + string(rune('1'+i)))
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
	st := fetchStatus(t, g.nodes[l])
	if st.Replication == nil || st.Replication.Nilext == nil || st.Replication.Nilext.Fast == 0 {
		t.Fatalf("leader /status has no nilext figures: %+v", st.Replication)
	}
	if nx := st.Replication.Nilext; nx.DLogStale || nx.DLogCycles != 0 || nx.DLogStaleWaits != 0 {
		t.Fatalf("a group that never crashed reports stale d-logs or cycles: %+v", nx)
	}
	// The d-log view-change counters an operator watches (docs/operations.md).
	r, err := http.Get("http://" + g.nodes[l].HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, name := range []string{"kefir_nilext_dlog_cycles_total 0", "kefir_nilext_dlog_stale_waits_total 0"} {
		if !strings.Contains(string(body), "\n"+name+"\n") {
			t.Errorf("/metrics lacks %q", name)
		}
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
		fast += vrOf(s).Stats().NilextFast
	}
	if fast == 0 {
		t.Fatal("no write took the fast path: the history checked nothing new")
	}
}
