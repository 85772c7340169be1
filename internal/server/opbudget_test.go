package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
)

// A transaction's or script's range reads walk at most kv.OpRangeReadKeys
// keys (docs/design/transactions.md, "A budget for range reads"): at the
// budget DBSIZE inside MULTI and a script answers as redis-server 7 does, on
// a single node and a group's leader; one key more and it answers the
// budget's error as its element, the transaction's other commands running
// as before. The front door's DBSIZE (O(1)) is not budgeted.
func TestExecRangeReadBudget(t *testing.T) {
	if raceOn {
		// 300,000 keys loaded and ops walking 100,000 at apply: volume on
		// one goroutine, which the detector slows tenfold (CI's race run
		// timed out loading them) and where it has nothing to find — the
		// budget's arithmetic is the apply path's; kv and script test it
		// under the race run too.
		t.Skip("volume test: skipped under the race detector")
	}
	rc := startRedis(t)
	// An op walking 100,000 keys applies in ~0.1 s of CPU, several times
	// that on a loaded machine, and a replica's apply holds up its VR
	// timers and heartbeats (vr's Ready loop applies before the next
	// Step/Tick): a 3 s view-change timeout keeps the test's answers from
	// meeting a leader change.
	g := startGroupWith(t, func(c *Config) { c.ViewChangeTimeout = 3 * time.Second })
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[g.leader(t)])}}
	// OpRangeReadKeys-1 keys, in MSETs of 1,000 sent as one pipeline. The
	// connections' deadlines (10 s from dial) are moved out: loading
	// 100,000 keys three times and the ops that walk them take longer
	// than that on a loaded machine (CI ran out of it mid-load).
	for _, c := range append([]*client{rc}, targets[0].c, targets[1].c) {
		_ = c.nc.SetDeadline(time.Now().Add(2 * time.Minute))
		var pipe []byte
		n := 0
		for lo := 0; lo < kv.OpRangeReadKeys-1; lo += 1000 {
			args := []string{"MSET"}
			for i := lo; i < min(lo+1000, kv.OpRangeReadKeys-1); i++ {
				args = append(args, fmt.Sprintf("k%06d", i), "v")
			}
			pipe = appendCmd(pipe, args...)
			n++
		}
		if _, err := c.nc.Write(pipe); err != nil {
			t.Fatal(err)
		}
		for range n {
			if got := c.reply(); got != "OK" {
				t.Fatalf("MSET: %s", got)
			}
		}
	}
	matchRedis(t, rc, targets, []string{
		"MULTI", "SET w 1", "DBSIZE", "GET w", "EXEC",
		"EVAL return(redis.call('dbsize')) 0",
		"MULTI", "DBSIZE", "EXEC",
	})
	for _, tg := range targets {
		c := tg.c
		if got := c.do("SET", "w2", "1"); got != "OK" {
			t.Fatal(got)
		}
		want := "[" + kv.ErrOpRangeReads.Error() + `, "1", OK]`
		for _, tx := range [][]string{{"DBSIZE", "GET w", "SET x 1"}, {"KEYS *", "GET w", "SET y 1"}} {
			c.do("MULTI")
			for _, cmd := range tx {
				c.do(strings.Fields(cmd)...)
			}
			if got := c.do("EXEC"); got != want {
				t.Errorf("%s: %v over the budget:\n got %s\nwant %s", tg.name, tx, got, want)
			}
		}
		if got := c.do("EVAL", "return redis.pcall('dbsize')", "0"); got != kv.ErrOpRangeReads.Error() {
			t.Errorf("%s: a script's DBSIZE over the budget: %s", tg.name, got)
		}
		if got := c.do("DBSIZE"); got != fmt.Sprintf("(integer) %d", kv.OpRangeReadKeys+3) {
			t.Errorf("%s: DBSIZE outside: %s", tg.name, got)
		}
	}
}
