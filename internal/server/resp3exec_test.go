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

// TestExecResp3PipelinedMatchesRedis: TestExecResp3MatchesRedis's
// comparison for one pipeline: EXECs of writes with and without a
// respelled element, plain writes after them in the same batch, a
// read-only EXEC (answered as a read, flushing the batch before it), an
// EXEC aborted by its watch, and HELLO switching the protocol between
// EXECs of one pipeline (it flushes the batch first, so each EXEC is
// answered in the protocol it was queued in). A batch holds at most one
// EXEC — MULTI and every command queued after it flush the batch — so
// conn.exec3 never holds more than one EXEC's shapes; review36a found no
// desync, and this keeps the pipelined paths compared. The leader and the
// follower are of two groups, so that each sees only its own connection's
// writes.
func TestExecResp3PipelinedMatchesRedis(t *testing.T) {
	rc := startRedis(t)
	g := startGroup(t)
	g2 := startGroup(t)
	follower := (g2.leader(t) + 1) % len(g2.nodes)
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[g.leader(t)])},
		{"group follower", dial(t, g2.nodes[follower])}}
	pipe := []string{
		"HELLO 3", "HMSET h a 1 b 2", "HMSET one f v",
		"MULTI", "HGETALL h", "SET a 1", "EXEC",
		"SET b 2",
		"MULTI", "INCR c", "EXEC",
		"MULTI", "HRANDFIELD one 2 WITHVALUES", "INCR c", "EXEC",
		"MULTI", "HGETALL h", "EXEC",
		"MULTI", "HGETALL h", "HSET h z 9", "EXEC",
		"WATCH h", "HSET h zz 8", "MULTI", "HGETALL h", "SET a 2", "EXEC",
		"MULTI", "HGETALL h", "SET q 1", "EXEC", "HELLO 2",
		"MULTI", "HGETALL h", "SET q 2", "EXEC", "HELLO 3",
		"MULTI", "HGETALL none", "SET q 3", "EXEC", "GET q",
	}
	var buf []byte
	for _, cmd := range pipe {
		buf = appendCmd(buf, strings.Fields(cmd)...)
	}
	for _, c := range []*client{rc, targets[0].c, targets[1].c, targets[2].c} {
		if _, err := c.nc.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range pipe {
		rv, err := rc.rd.ReadValue()
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			v, err := tg.c.rd.ReadValue()
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(cmd, "HELLO") {
				continue
			}
			if got, want := v.String(), rv.String(); got != want {
				t.Errorf("%s: %s:\n  redis: %s\n  kefir: %s", tg.name, cmd, want, got)
			}
		}
	}
}
