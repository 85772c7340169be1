package server

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
)

// vrClientKey is the engine key of vrshard's client-table row for id
// (internal/vrshard/statemachine.go, clientKey).
func vrClientKey(id uint64) string {
	return "\xff\xffkefir/vrclient/" + string(binary.BigEndian.AppendUint64(nil, id))
}

// In a replica group the at-most-once client table keeps one engine row per
// client id (docs/design/client-table.md). DBSIZE and INFO keyspace count the
// user's keys only, on the leader, on followers and after a restart, and no
// read shows a row. Writes here come from the leader's own id (a plain SET),
// three REQIDs and a follower's forwarding id: five rows, five user keys.
func TestReplicaGroupKeyCountsExcludeClientRows(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	c := dial(t, g.nodes[l])
	f := (l + 1) % 3
	fc := dial(t, g.nodes[f])
	c.expect(`
SET a 1 => OK
KEFIR.CALL REQID 101 1 CMD SET b 1 => OK
KEFIR.CALL REQID 102 1 CMD SET c 1 => OK
KEFIR.CALL REQID 103 7 CMD INCR d => (integer) 1
KEFIR.CALL REQID 103 8 CMD INCR d => (integer) 2`)
	fc.expect(`SET e 1 => OK`)
	const want = 5
	counts := func(c *client) (string, string) {
		info := c.do("INFO", "keyspace")
		_, after, _ := strings.Cut(info, "db0:")
		keys, _, _ := strings.Cut(after, ",")
		return c.do("DBSIZE"), keys
	}
	for i := range g.nodes {
		c := dial(t, g.nodes[i])
		var db, keys string
		testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool {
			// A follower counts a write once it has applied it.
			db, keys = counts(c)
			// INFO is read before DBSIZE: wait until both count the last write.
			return db == fmt.Sprintf("(integer) %d", want) && keys == fmt.Sprintf("keys=%d", want)
		})
		if db != fmt.Sprintf("(integer) %d", want) || keys != fmt.Sprintf("keys=%d", want) {
			t.Errorf("node %d (leader %d): DBSIZE %s, INFO keyspace %s; want %d user keys", i, l, db, keys, want)
		}
		// No read exposes a row, whichever way it names it.
		row := vrClientKey(101)
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"GET", row}, "(nil)"},
			{[]string{"EXISTS", row, "a"}, "(integer) 1"},
			{[]string{"STRLEN", row}, "(integer) 0"},
			{[]string{"MGET", row, "b"}, `[(nil), "1"]`},
			{[]string{"KEFIR.SCAN", "", ""}, `["a", "1", "b", "1", "c", "1", "d", "2", "e", "1"]`},
			{[]string{"KEFIR.SCAN", "\xff", ""}, `[]`},
			{[]string{"KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "GET", row}, "(nil)"},
		} {
			if got := c.do(tc.args...); got != tc.want {
				t.Errorf("node %d: %q => %s, want %s", i, tc.args, got, tc.want)
			}
		}
	}
	// A write to a row is refused, not applied.
	if got := dial(t, g.nodes[l]).do("SET", vrClientKey(101), "x"); !strings.HasPrefix(got, "ERR") {
		t.Errorf("SET on a client row => %s, want an error", got)
	}
	// A restarted follower reloads its count of rows from the engine.
	g.nodes[f].Close()
	g.nodes[f] = g.start(t, g.cfgs[f])
	rc := dial(t, g.nodes[f])
	if db, keys := counts(rc); db != fmt.Sprintf("(integer) %d", want) || keys != fmt.Sprintf("keys=%d", want) {
		t.Errorf("restarted follower: DBSIZE %s, INFO keyspace %s; want %d", db, keys, want)
	}
}
