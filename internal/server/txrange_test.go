package server

import (
	"crypto/sha1"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// sortedLeaves is show(v) with every array of bulk strings sorted: KEYS and
// SCAN answer Redis's hash order, Kefir's key order (docs/commands.md).
// Kefir's order is checked by TestExecRangeReadsSeeOwnWrites.
func sortedLeaves(v resp.Value) string {
	switch v.Kind {
	case resp.Array, resp.Map, resp.Set:
		parts := make([]string, len(v.Elems))
		leaves := true
		for i, e := range v.Elems {
			parts[i] = sortedLeaves(e)
			leaves = leaves && e.Kind == resp.Bulk
		}
		if leaves {
			sort.Strings(parts)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return show(v)
}

// Every data command Kefir implements may be held by MULTI, as in Redis:
// range reads (KEYS, SCAN, DBSIZE, HGETALL, HKEYS, HVALS, HSCAN) and the
// long tail (TYPE, RENAME, RENAMENX, COPY, TOUCH, GETRANGE, SETRANGE, SETBIT,
// GETBIT, BITCOUNT, BITPOS, HSTRLEN, HINCRBYFLOAT, MSETNX, GETEX, OBJECT,
// LCS), each reading the
// transaction's own earlier writes. Compared reply by reply with a real
// redis-server on a single node and on a replica group's leader: arrays of
// keys sorted (hash order against key order).
func TestExecRangeReadsMatchRedis(t *testing.T) {
	rc := startRedis(t)
	g := startGroup(t)
	l := g.leader(t)
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[l])}}
	script := []string{
		"SET x0 pre", "SET e gone PX 50", "SLEEP",
		// The example, and more of each.
		"MULTI", "HSET h a 1", "HGETALL h", "DEL x0", "KEYS *", "SET x 1", "SCAN 0 COUNT 1000", "RENAME x y",
		"TYPE y", "TYPE h", "TYPE nokey", "DBSIZE", "EXISTS e", "EXEC",
		"MULTI", "SETRANGE s 2 XY", "GETRANGE s 0 -1", "SUBSTR s 1 2", "SETBIT b 7 1", "GETBIT b 7", "GETBIT b 6",
		"BITCOUNT b", "BITCOUNT b 0 0 BIT", "BITPOS b 1", "BITPOS b 0 0 -1", "STRLEN s", "MSETNX m1 1 m2 2",
		"MSETNX m1 x m3 3", "INCRBYFLOAT f 1.5", "GETEX f EX 100", "TTL f", "GETEX f PERSIST", "TTL f", "GETEX nokey", "GETEX f BADOPT", "HINCRBYFLOAT h a 2.5", "HSET h b 22 c 333", "HSTRLEN h c",
		"HKEYS h", "HVALS h", "HLEN h", "HSCAN h 0", "HSCAN h 0 MATCH [ab] COUNT 1", "TOUCH s b nokey", "COPY s s2", "RENAMENX s2 s", "RENAMENX s2 s3",
		"COPY h h2", "HDEL h2 b", "HGETALL h2", "HGETALL h", "KEYS s*", "KEYS *2", "SCAN 0 MATCH m* COUNT 1000",
		"SCAN 0 TYPE hash COUNT 1000", "DEL h", "TYPE h", "HGETALL h", "KEYS h*", "DBSIZE", "EXEC",
		// Runtime and syntax errors are their command's element.
		"MULTI", "GETRANGE s a b", "RENAME nokey z", "SCAN 0 COUNT 0", "SCAN abc", "SCAN 0 BADOPT 1",
		"BITCOUNT s 0", "BITPOS s 2", "COPY h2 h2", "HGETALL s", "SETBIT s -1 1", "SETRANGE s -1 x",
		"HINCRBYFLOAT h2 a x", "MSETNX a 1 b", "HSCAN h2 abc", "HSCAN h2 0 COUNT 0", "HSCAN s 0", "GET s", "OBJECT ENCODING nokey", "OBJECT FREQ s", "LCS s s3 LEN IDX", "EXEC",
		// OBJECT's subcommand is checked when queued, as Redis's.
		"MULTI", "OBJECT NOPE s", "OBJECT ENCODING", "GET s", "EXEC!",
		// Reads only: a read (KindExecRO), the reader's scanner.
		"MULTI", "KEYS *", "HGETALL h2", "SCAN 0 COUNT 1000", "DBSIZE", "TYPE h2", "GETRANGE s3 0 1", "EXEC",
		"MULTI", "SET i 12345", "OBJECT ENCODING i", "SET i abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz", "OBJECT ENCODING i", "OBJECT ENCODING h2", "OBJECT REFCOUNT h2",
		"SET l1 ohmytext", "SET l2 mynewtext", "LCS l1 l2", "LCS l1 l2 LEN", "LCS l1 l2 IDX MINMATCHLEN 2 WITHMATCHLEN", "LCS h2 l1", "LCS l1 h2 IDX", "EVAL return(redis.pcall('lcs','l1','h2')) 0", "DEL i l1 l2", "EXEC",
		// A watch with range reads.
		"WATCH s3", "MULTI", "KEYS s*", "DEL s3", "KEYS s*", "EXEC", "KEYS *",
		// A transaction that deletes everything it can see.
		"MULTI", "KEYS *", "DEL s s3 b m1 m2 f y h2 e", "KEYS *", "DBSIZE", "SCAN 0", "EXEC", "DBSIZE",
	}
	matchRedis(t, rc, targets, script)
}

type target struct {
	name string
	c    *client
}

// matchRedis sends each command of script to redis-server (rc) and to each
// target and compares the replies (arrays of bulk strings sorted). SLEEP
// sleeps 120 ms; EXEC! is an EXEC that must answer EXECABORT, and every other
// EXEC must not.
func matchRedis(t *testing.T, rc *client, targets []target, script []string) {
	t.Helper()
	for _, cmd := range script {
		if cmd == "SLEEP" {
			time.Sleep(120 * time.Millisecond)
			continue
		}
		// EXEC! is an EXEC that must answer EXECABORT; every other must not.
		abort := cmd == "EXEC!"
		args := strings.Fields(strings.TrimSuffix(cmd, "!"))
		rc.send(args...)
		rv, err := rc.rd.ReadValue()
		if err != nil {
			t.Fatal(err)
		}
		want := rv.Kind.String() + " " + sortedLeaves(rv)
		for _, tg := range targets {
			tg.c.send(args...)
			v, err := tg.c.rd.ReadValue()
			if err != nil {
				t.Fatal(err)
			}
			if args[0] == "EXEC" && strings.Contains(want, "EXECABORT") != abort {
				t.Errorf("%s: %s answered %s", tg.name, cmd, want)
			}
			if got := v.Kind.String() + " " + sortedLeaves(v); got != want {
				t.Errorf("%s: %s:\n  redis: %s\n  kefir: %s", tg.name, cmd, want, got)
			}
		}
	}
}

// RANDOMKEY and HRANDFIELD (every form) inside MULTI, as Redis answers them:
// compared where the answer does not depend on the pick (an empty keyspace,
// one key, a one-field hash, a count above the hash's size, errors), and a
// pick checked to be a live key or field of the transaction's own state
// (TestExecRandomPicksAreLive). Fails where MULTI refuses them.
func TestExecRandomReadsMatchRedis(t *testing.T) {
	rc := startRedis(t)
	g := startGroup(t)
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[g.leader(t)])}}
	matchRedis(t, rc, targets, []string{
		"MULTI", "RANDOMKEY", "HRANDFIELD h", "HRANDFIELD h 3", "HRANDFIELD h -3 WITHVALUES", "EXEC",
		"MULTI", "SET only 1", "RANDOMKEY", "HSET h a 1", "DEL only", "RANDOMKEY", "HRANDFIELD h", "HRANDFIELD h 5",
		"HRANDFIELD h -3", "HRANDFIELD h -2 WITHVALUES", "HRANDFIELD h 5 WITHVALUES", "HRANDFIELD h 0",
		"HRANDFIELD h 0 WITHVALUES", "HSET h b 2 c 3", "HRANDFIELD h 3", "HRANDFIELD h 10 WITHVALUES",
		"HRANDFIELD h x", "HRANDFIELD h 1 BAD", "HRANDFIELD h 1 WITHVALUES BAD", "SET s v", "HRANDFIELD s",
		"HRANDFIELD s 2", "DEL h s", "HRANDFIELD h", "RANDOMKEY", "EXEC",
		// Reads only (KindExecRO) and a script.
		"SET k 1", "MULTI", "RANDOMKEY", "HRANDFIELD k", "EXEC",
		"EVAL return{redis.call('randomkey'),redis.call('hrandfield','nohash',2)} 0",
		"EVAL redis.call('hset','h1','f','v');return(redis.call('hrandfield','h1',-2,'withvalues')) 0",
	})
}

// FLUSHDB and FLUSHALL inside MULTI and scripts, as Redis answers them: the
// commands after the flush see an empty store plus their own writes, the
// writes before it are gone, a watched key the flush deletes is not a
// conflict of the flush's own transaction, FLUSHDB's option checked at EXEC.
// Fails where MULTI refuses a flush.
func TestExecFlushMatchesRedis(t *testing.T) {
	rc := startRedis(t)
	g := startGroup(t)
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[g.leader(t)])}}
	matchRedis(t, rc, targets, []string{
		"SET a 1", "HSET h f v", "SET keep 1",
		"MULTI", "SET b 2", "GET a", "FLUSHDB", "GET a", "GET b", "KEYS *", "DBSIZE", "HGETALL h", "SCAN 0",
		"SET c 3", "RANDOMKEY", "HSET h g w", "HGETALL h", "KEYS *", "EXISTS a b c keep", "EXEC",
		"KEYS *", "DBSIZE", "HGETALL h", "GET a",
		"MULTI", "FLUSHALL ASYNC", "EXEC", "DBSIZE",
		"MULTI", "SET x 1", "FLUSHDB BAD", "GET x", "EXEC", "KEYS *",
		"SET wk 1", "WATCH wk", "MULTI", "FLUSHDB", "SET after 1", "EXEC", "KEYS *",
		"SET z 1", "MULTI", "SET w 1", "FLUSHDB", "SET v 1", "EVAL return(redis.call('keys','*')) 0", "EXEC", "KEYS *",
		"EVAL redis.call('set','y','1');redis.call('flushdb');return(redis.call('dbsize')) 0", "KEYS *",
		"MULTI", "FLUSHDB", "FLUSHALL", "EXEC", "DBSIZE",
	})
}

// EVAL and EVALSHA inside MULTI, as Redis answers them: the script reads the
// transaction's earlier writes and the commands after it read the script's;
// a script that raises keeps the writes it made before (Redis undoes none);
// numkeys is checked at EXEC, EVALSHA's SHA looked up at EXEC (NOSCRIPT as
// the command's element), and an arity error aborts the transaction. Fails
// where MULTI refuses EVAL.
func TestExecEvalMatchesRedis(t *testing.T) {
	rc := startRedis(t)
	g := startGroup(t)
	targets := []target{{"single node", dial(t, startServer(t, nil))}, {"group leader", dial(t, g.nodes[g.leader(t)])}}
	body := "return(redis.call('incrby',KEYS[1],ARGV[1]))"
	sha := fmt.Sprintf("%x", sha1.Sum([]byte(body)))
	matchRedis(t, rc, targets, []string{
		"SET a 0",
		"MULTI", "SET a 1", "EVAL redis.call('set','b',redis.call('get','a'));error('boom') 0", "SET c 3",
		"EVAL return(redis.call('mget','a','b','c')) 0", "EVAL return{KEYS[1],ARGV[1],redis.call('incr',KEYS[1])} 1 a x",
		"EVAL return(1) -1", "EVAL return(1) 2 a", "EVAL return(1) x", "EVALSHA " + sha + " 1 n 5",
		"EVAL redis.call('incr','a');return(redis.call('hset','a','f','1')) 0", "GET a",
		"EVAL redis.call('hset','h','f','v');return(redis.call('hgetall','h')) 0", "HGETALL h", "EXEC",
		"MGET a b c", "HGETALL h",
		"SCRIPT LOAD " + body,
		"MULTI", "EVALSHA " + sha + " 1 n 5", "EVALSHA " + strings.ToUpper(sha) + " 1 n 5", "GET n", "EXEC",
		"WATCH n", "MULTI", "EVAL return(redis.call('get','n')) 0", "EXEC",
		"MULTI", "EVAL_RO return(redis.call('get','a')) 0", "EVAL_RO return(redis.call('set','a','9')) 0",
		"EVALSHA_RO " + sha + " 1 n 5", "GET a", "EXEC",
		"MULTI", "EVAL_RO return(redis.call('get','n')) 0", "EXEC",
		"MULTI", "EVAL return(1)", "GET n", "EXEC!",
	})
}

// RANDOMKEY and HRANDFIELD inside MULTI pick among the transaction's own
// state: live keys and fields only, those it wrote included, those it
// deleted (or that expired) never; and over many picks more than one key.
func TestExecRandomPicksAreLive(t *testing.T) {
	bothModels(t, func(t *testing.T) {
		c := dial(t, startServer(t, nil))
		live := map[string]bool{}
		for i := range 40 {
			k := fmt.Sprintf("k%02d", i)
			c.send("SET", k, "v")
			if _, err := c.rd.ReadValue(); err != nil {
				t.Fatal(err)
			}
			live[k] = i%2 == 0 // the transaction deletes the odd ones
		}
		cmds := [][]string{{"MULTI"}, {"SET", "new", "1"}, {"HSET", "h", "a", "1", "b", "2", "c", "3"}, {"HDEL", "h", "b"}}
		live["new"], live["h"] = true, true
		for i := 1; i < 40; i += 2 {
			cmds = append(cmds, []string{"DEL", fmt.Sprintf("k%02d", i)})
		}
		const picks = 50
		for range picks {
			cmds = append(cmds, []string{"RANDOMKEY"})
		}
		cmds = append(cmds, []string{"HRANDFIELD", "h", "-20", "WITHVALUES"}, []string{"HRANDFIELD", "h", "2"}, []string{"EXEC"})
		var exec resp.Value
		for _, cmd := range cmds {
			c.send(cmd...)
			v, err := c.rd.ReadValue()
			if err != nil {
				t.Fatal(err)
			}
			exec = v
		}
		if len(exec.Elems) != len(cmds)-2 {
			t.Fatalf("EXEC answered %s", show(exec))
		}
		seen := map[string]bool{}
		for _, v := range exec.Elems[len(exec.Elems)-2-picks : len(exec.Elems)-2] {
			if !live[string(v.Str)] {
				t.Errorf("RANDOMKEY answered %s, not a live key", show(v))
			}
			seen[string(v.Str)] = true
		}
		if len(seen) < 5 {
			t.Errorf("%d picks of RANDOMKEY answered only %v", picks, seen)
		}
		fields := map[string]string{"a": "1", "c": "3"}
		withValues := exec.Elems[len(exec.Elems)-2].Elems
		if len(withValues) != 40 {
			t.Fatalf("HRANDFIELD h -20 WITHVALUES answered %d elements", len(withValues))
		}
		seenF := map[string]bool{}
		for i := 0; i < len(withValues); i += 2 {
			f, v := string(withValues[i].Str), string(withValues[i+1].Str)
			if fields[f] != v {
				t.Errorf("HRANDFIELD answered field %q value %q", f, v)
			}
			seenF[f] = true
		}
		if len(seenF) != 2 {
			t.Errorf("20 picks with repeats of 2 fields answered %v", seenF)
		}
		if two := sortedLeaves(exec.Elems[len(exec.Elems)-1]); two != `["a", "c"]` {
			t.Errorf("HRANDFIELD h 2 of a hash of 2 fields answered %s", two)
		}
	})
}

// The range reads of a transaction see its own writes in key order (the
// overlay merged into the store's), deletions hidden.
func TestExecRangeReadsSeeOwnWrites(t *testing.T) {
	bothModels(t, func(t *testing.T) {
		c := dial(t, startServer(t, nil))
		c.expect(`
			MSET b 1 d 1 f 1 => OK
			HSET h b 2 d 4 => (integer) 2
			MULTI => OK
			SET a 1 => QUEUED
			DEL d => QUEUED
			SET e 1 => QUEUED
			KEYS * => QUEUED
			HSET h a 1 c 3 => QUEUED
			HDEL h d => QUEUED
			HGETALL h => QUEUED
			HKEYS h => QUEUED
			SCAN 0 => QUEUED
			DBSIZE => QUEUED
			RENAME a g => QUEUED
			KEYS * => QUEUED
			EXEC => [OK, (integer) 1, OK, ["a", "b", "e", "f", "h"], (integer) 2, (integer) 1, ["a", "1", "b", "2", "c", "3"], ["a", "b", "c"], ["0", ["a", "b", "e", "f", "h"]], (integer) 5, OK, ["b", "e", "f", "g", "h"]]
			KEYS * => ["b", "e", "f", "g", "h"]
			MULTI => OK
			KEFIR.CAS b 1 2 => QUEUED
			KEFIR.CAS b 1 3 => QUEUED
			GET b => QUEUED
			EXEC => [(integer) 1, (integer) 0, "2"]
			KEFIR.CAS b 2 3 => (integer) 1
		`)
	})
}
