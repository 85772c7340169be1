package server

import (
	"strings"
	"testing"
)

// On a RESP3 connection EXEC's elements are spelled as their commands'
// replies are in RESP3, as Redis does: HGETALL's a map, HRANDFIELD … WITHVALUES
// an array of [field, value] pairs, LCS … IDX a map — though the state
// machine keeps one RESP2 reply for every connection. Compared with a real
// redis-server 7 by kind at every depth (resp.Value.String), for a
// transaction that writes (logged: answered at the batch's end, or forwarded
// by a follower) and one of reads only (served as a read, or forwarded), on a
// single node, a group's leader and a follower. Fails with the elements
// left as RESP2 spelled them (arrays).
func TestExecResp3MatchesRedis(t *testing.T) {
	rc := startRedis(t)
	g := startGroup(t)
	leader := g.leader(t)
	follower := (leader + 1) % len(g.nodes)
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[leader])},
		{"group follower", dial(t, g.nodes[follower])}}
	script := []string{
		"HELLO 3", "HMSET h a 1 b 2", "HMSET one f v", "SET s1 ohmytext", "SET s2 mynewtext",
		// Reads only.
		"MULTI", "HGETALL h", "HGETALL none", "HRANDFIELD one 1 WITHVALUES", "HRANDFIELD one -2 WITHVALUES",
		"HRANDFIELD one 1", "LCS s1 s2 IDX", "LCS s1 s2 IDX MINMATCHLEN 4 WITHMATCHLEN", "LCS s1 s2", "HKEYS h", "EXEC",
		// A write among them.
		"MULTI", "HMSET h c 3", "HGETALL h", "SET x 1", "GET x", "HRANDFIELD one 3 WITHVALUES", "LCS s1 s2 IDX", "EXEC",
		// An element that fails keeps its error; a script's reply as it is.
		"MULTI", "HGETALL s1", "EVAL return(redis.call('hgetall','one')) 0", "HGETALL one", "EXEC",
		// Back to RESP2: arrays again.
		"HELLO 2", "MULTI", "HGETALL h", "HRANDFIELD one 1 WITHVALUES", "EXEC",
	}
	for _, cmd := range script {
		args := strings.Fields(cmd)
		rc.send(args...)
		rv, err := rc.rd.ReadValue()
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			tg.c.send(args...)
			v, err := tg.c.rd.ReadValue()
			if err != nil {
				t.Fatal(err)
			}
			if args[0] == "HELLO" {
				continue // the servers' fields differ; the protocol is what counts
			}
			if got, want := v.String(), rv.String(); got != want {
				t.Errorf("%s: %s:\n  redis: %s\n  kefir: %s", tg.name, cmd, want, got)
			}
		}
	}
}
