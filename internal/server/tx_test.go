package server

import (
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
)

// MULTI queues, EXEC runs the queue as one op: the replies of its commands,
// runtime and syntax errors as their elements (the others applied, as in
// Redis); an unknown command, a wrong arity or a command a transaction
// cannot hold aborts it at EXEC and nothing of it is applied.
func TestMultiExec(t *testing.T) {
	bothModels(t, func(t *testing.T) {
		s := startServer(t, nil)
		c := dial(t, s)
		c.expect(`
			SET counter 10 => OK
			SET str abc => OK
			EXEC => ERR EXEC without MULTI
			DISCARD => ERR DISCARD without MULTI
			UNWATCH => OK
		`)
		// As redis-py's pipeline() and go-redis's TxPipelined send it: one
		// pipeline, MULTI, the commands, EXEC.
		var buf []byte
		for _, cmd := range [][]string{{"MULTI"}, {"INCR", "counter"}, {"SET", "other", "x"}, {"GET", "counter"},
			{"NOSUCHCOMMAND"}, {"WATCH", "counter"}, {"MULTI"}, {"EXEC"}} {
			buf = appendCmd(buf, cmd...)
		}
		if _, err := c.nc.Write(buf); err != nil {
			t.Fatal(err)
		}
		for i, w := range []string{"OK", "QUEUED", "QUEUED", "QUEUED", "ERR unknown command*",
			"ERR WATCH inside MULTI is not allowed", "ERR MULTI calls can not be nested", "EXECABORT Transaction discarded because of previous errors."} {
			got := c.reply()
			if got != w && !(strings.HasSuffix(w, "*") && strings.HasPrefix(got, strings.TrimSuffix(w, "*"))) {
				t.Errorf("reply %d = %q, want %q", i, got, w)
			}
		}
		c.expect(`
			GET counter => "10"
			EXISTS other => (integer) 0
			MULTI => OK
			INCR counter => QUEUED
			SET counter => ERR wrong number of arguments for 'set' command
			EXEC => EXECABORT*
			MULTI => OK
			SCRIPT LOAD x => ERR command 'script' can not be used inside MULTI*
			EXEC => EXECABORT*
			MULTI => OK
			INCR counter => QUEUED
			DISCARD => OK
			GET counter => "10"
			MULTI => OK
			INCR counter => QUEUED
			INCR str => QUEUED
			SET other y BADOPT => QUEUED
			HSET str f v => QUEUED
			MGET counter other => QUEUED
			SET other z => QUEUED
			EXEC => [(integer) 11, ERR value is not an integer or out of range, ERR syntax error, WRONGTYPE Operation against a key holding the wrong kind of value, ["11", (nil)], OK]
			GET other => "z"
			MULTI => OK
			EXEC => []
			MULTI => OK
			PING => QUEUED
			ECHO hi => QUEUED
			UNWATCH => QUEUED
			GET other => QUEUED
			EXEC => [PONG, "hi", OK, "z"]
		`)
	})
}

// A transaction command refused for its arity inside MULTI (MULTI x, WATCH,
// DISCARD x) marks the transaction as any refused command does, so EXEC
// answers EXECABORT and applies nothing; EXEC with arguments answers
// EXECABORT at once and ends the transaction and the watches, in MULTI or
// not (Redis 7's rejectCommand: flagTransaction, execCommandAbort; checked
// against redis-server 7.0.15).
func TestTxControlArityErrorsAbort(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.expect(`
		SET k 0 => OK
		MULTI => OK
		MULTI x => ERR wrong number of arguments for 'multi' command
		SET k 1 => QUEUED
		EXEC => EXECABORT Transaction discarded because of previous errors.
		MULTI => OK
		WATCH => ERR wrong number of arguments for 'watch' command
		SET k 2 => QUEUED
		EXEC => EXECABORT Transaction discarded because of previous errors.
		MULTI => OK
		SET k 3 => QUEUED
		DISCARD x => ERR wrong number of arguments for 'discard' command
		EXEC => EXECABORT Transaction discarded because of previous errors.
		GET k => "0"
		MULTI => OK
		SET k 4 => QUEUED
		EXEC x => EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command
		GET k => "0"
		EXEC => ERR EXEC without MULTI
		EXEC x => EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command
		WATCH k => OK
		EXEC x => EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command
	`)
	// EXEC x forgot the watch: another client's write no longer aborts.
	c2 := dial(t, s)
	c2.expect(`SET k 5 => OK`)
	c.expect(`
		MULTI => OK
		SET k 6 => QUEUED
		EXEC => [OK]
		GET k => "6"
	`)
}

// A transaction holds at most kv.MaxTxCommands commands (Redis has no such
// bound): the one past it is refused with a clear error and EXEC answers
// EXECABORT, applying nothing.
func TestMultiQueueLimit(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	buf := appendCmd(nil, "MULTI")
	for range kv.MaxTxCommands {
		buf = appendCmd(buf, "INCR", "n")
	}
	buf = appendCmd(buf, "INCR", "n")
	buf = appendCmd(buf, "EXEC")
	go func() { _, _ = c.nc.Write(buf) }()
	if r := c.reply(); r != "OK" {
		t.Fatalf("MULTI: %s", r)
	}
	for i := range kv.MaxTxCommands {
		if r := c.reply(); r != "QUEUED" {
			t.Fatalf("command %d: %s", i, r)
		}
	}
	want := "ERR a transaction holds at most " + strconv.Itoa(kv.MaxTxCommands) + " commands"
	if r := c.reply(); r != want {
		t.Fatalf("the command past the limit: %s, want %s", r, want)
	}
	if r := c.reply(); !strings.HasPrefix(r, "EXECABORT") {
		t.Fatalf("EXEC: %s, want EXECABORT", r)
	}
	c.expect(`EXISTS n => (integer) 0`)
}

// rawReplies reads exactly want's bytes from c's socket (the caller has read
// every earlier reply) and compares them.
func rawReplies(t *testing.T, c *client, want string) {
	t.Helper()
	b := make([]byte, len(want))
	if _, err := io.ReadFull(c.nc, b); err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Fatalf("replies %q, want %q", b, want)
	}
}

// A watched key written by another connection (even with the value it had)
// makes EXEC apply nothing and answer a null array: *-1 in RESP2, _ in RESP3.
// EXEC, DISCARD and UNWATCH forget the watches.
func TestWatchConflictAnswersNullArray(t *testing.T) {
	bothModels(t, watchConflict)
}

func watchConflict(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	b.expect(`SET w 1 => OK`)
	for _, proto := range []string{"2", "3"} {
		c := dial(t, s)
		c.send("HELLO", proto)
		if _, err := c.rd.ReadValue(); err != nil {
			t.Fatal(err)
		}
		null := map[string]string{"2": "*-1\r\n", "3": "_\r\n"}[proto]
		c.nc.Write(appendCmd(appendCmd(nil, "WATCH", "w", "absent"), "GET", "w"))
		rawReplies(t, c, "+OK\r\n$1\r\n1\r\n")
		b.expect(`SET w 1 => OK`)
		c.nc.Write(appendCmd(appendCmd(appendCmd(nil, "MULTI"), "SET", "r", proto), "EXEC"))
		rawReplies(t, c, "+OK\r\n+QUEUED\r\n"+null)
		// The watch is gone with EXEC: the same transaction now applies.
		c.nc.Write(appendCmd(appendCmd(appendCmd(nil, "MULTI"), "SET", "r", proto), "EXEC"))
		rawReplies(t, c, "+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n")
	}
	a.expect(`
		WATCH w => OK
		UNWATCH => OK
	`)
	b.expect(`INCR w => (integer) 2`)
	a.expect(`
		MULTI => OK
		GET w => QUEUED
		EXEC => ["2"]
		WATCH w => OK
		MULTI => OK
		DISCARD => OK
	`)
	b.expect(`INCR w => (integer) 3`)
	a.expect(`
		MULTI => OK
		GET w => QUEUED
		EXEC => ["3"]
		WATCH absent => OK
	`)
	b.expect(`SET absent 1 => OK`) // a key created since WATCH counts as modified
	a.expect(`
		MULTI => OK
		GET w => QUEUED
		EXEC => (nil)
	`)
	// An HSET of an existing field: a single node writes only the field's
	// row (kv.ApplyOptions.SparseHashMeta), not the hash's metadata record,
	// and it is a modification all the same (kv.Observe walks the rows).
	b.expect(`HSET h f 1 g 1 => (integer) 2`)
	a.expect(`WATCH h => OK`)
	b.expect(`HSET h f 2 => (integer) 0`)
	a.expect(`
		MULTI => OK
		HGET h f => QUEUED
		EXEC => (nil)
		WATCH h => OK
		MULTI => OK
		HGET h f => QUEUED
		EXEC => ["2"]
	`)
}

// watchedIncrements runs clients×each WATCH/GET/MULTI/SET/EXEC increments of
// one key concurrently, retrying on a null EXEC, and checks them
// (check.Increments).
// Client i talks to nodes[i%len(nodes)].
func watchedIncrements(t *testing.T, nodes []*Server, clients, each int) check.Verdict {
	s := nodes[0]
	dial(t, s).expect(`SET cnt 0 => OK`)
	var mu sync.Mutex
	var committed []check.Increment
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		c := dial(t, nodes[i%len(nodes)])
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			for done := 0; done < each; {
				c.send("WATCH", "cnt")
				if got := c.reply(); got != "OK" {
					t.Errorf("WATCH: %s", got)
					return
				}
				v, err := strconv.ParseInt(strings.Trim(c.do("GET", "cnt"), `"`), 10, 64)
				if err != nil {
					t.Error(err)
					return
				}
				c.nc.Write(appendCmd(appendCmd(appendCmd(nil, "MULTI"), "SET", "cnt", strconv.FormatInt(v+1, 10)), "EXEC"))
				c.reply()
				c.reply()
				r, err := c.rd.ReadValue()
				if err != nil {
					t.Error(err)
					return
				}
				if r.Kind == resp.Null {
					continue // a conflict: retry
				}
				mu.Lock()
				committed = append(committed, check.Increment{Client: id, Read: v})
				mu.Unlock()
				done++
			}
		}(i)
	}
	wg.Wait()
	final, _ := strconv.ParseInt(strings.Trim(dial(t, s).do("GET", "cnt"), `"`), 10, 64)
	return check.Increments("cnt", 0, committed, final)
}

func TestWatchedIncrementsLoseNothing(t *testing.T) {
	s := startServer(t, nil)
	if v := watchedIncrements(t, []*Server{s}, 4, 40); !v.OK {
		t.Fatal(v.Err())
	}
}

// The same on a 3-replica group, a client on each node: the followers
// forward WATCH (as KEFIR.WATCH, a linearizable read) and EXEC (as
// KEFIR.EXEC, the whole transaction) to the leader.
func TestWatchedIncrementsLoseNothingReplicated(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	nodes := []*Server{g.nodes[l], g.nodes[(l+1)%3], g.nodes[(l+2)%3]}
	if v := watchedIncrements(t, nodes, 3, 20); !v.OK {
		t.Fatal(v.Err())
	}
	// A conflict seen through a follower: the watch is the leader's read,
	// the comparison the state machine's.
	f, o := dial(t, nodes[1]), dial(t, nodes[2])
	f.expect(`
		WATCH cnt => OK
		MULTI => OK
		INCR cnt => QUEUED
	`)
	o.expect(`INCR cnt => (integer) 61`)
	f.expect(`
		EXEC => (nil)
		GET cnt => "61"
		MULTI => OK
		INCR cnt => QUEUED
		EXEC => [(integer) 62]
	`)
	// A transaction of reads is a read (KEFIR.EXECRO, forwarded by the
	// follower at the connection's level): its watch is compared in the
	// leader's snapshot, its null is an array's.
	f.expect(`
		HSET h a 1 => (integer) 1
		WATCH cnt h => OK
		MULTI => OK
		GET cnt => QUEUED
		HGET h a => QUEUED
		EXISTS cnt nope => QUEUED
		EXEC => ["62", "1", (integer) 1]
		WATCH cnt => OK
	`)
	o.expect(`INCR cnt => (integer) 63`)
	f.nc.Write(appendCmd(appendCmd(appendCmd(nil, "MULTI"), "GET", "cnt"), "EXEC"))
	rawReplies(t, f, "+OK\r\n+QUEUED\r\n*-1\r\n")
}

// The checker catches EXEC without its watches (the mutation
// execSkipsWatches): increments are lost, on a single node and on a
// replica group.
func TestWatchedIncrementsCatchSkippedWatches(t *testing.T) {
	mutation.Require(t)
	mut.execSkipsWatches.Store(true)
	defer mut.execSkipsWatches.Store(false)
	g := startGroup(t)
	l := g.leader(t)
	for _, c := range []struct {
		name  string
		nodes []*Server
	}{
		{"single node", []*Server{startServer(t, nil)}},
		{"3 replicas", []*Server{g.nodes[l], g.nodes[(l+1)%3], g.nodes[(l+2)%3]}},
	} {
		caught := false
		for round := 0; round < 5 && !caught; round++ {
			if v := watchedIncrements(t, c.nodes, 4, 30); !v.OK {
				t.Logf("%s: caught: %v", c.name, v.Err())
				caught = true
			}
		}
		if !caught {
			t.Errorf("%s: EXEC skipped its watches and no increment was lost in 5 rounds", c.name)
		}
	}
}

// KEFIR.EXEC (what EXEC proposes) is checked like any write: it must decode
// and name every key its commands and watches touch.
func TestKefirExecIsChecked(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	enc := func(ws []kv.Watch, cmds ...[]string) string {
		var cs [][][]byte
		for _, cmd := range cmds {
			var argv [][]byte
			for _, a := range cmd {
				argv = append(argv, []byte(a))
			}
			cs = append(cs, argv)
		}
		return string(kv.EncodeTx(nil, cs, ws))
	}
	good := enc(nil, []string{"SET", "a", "1"}, []string{"INCR", "b"})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"KEFIR.EXEC", "garbage"}, "ERR KEFIR.EXEC: invalid operation: undecodable transaction"},
		{[]string{"KEFIR.EXEC", good, "a"}, "ERR KEFIR.EXEC: a key of the transaction is not among its keys"},
		{[]string{"KEFIR.EXEC", enc([]kv.Watch{{Key: []byte("w"), Seen: []byte{2, 0, 0}}}), "a"}, "ERR KEFIR.EXEC: a key of the transaction is not among its keys"},
		// A watch without its origin (no release logged one) is refused.
		{[]string{"KEFIR.EXEC", enc([]kv.Watch{{Key: []byte("a"), Seen: []byte{0}}}), "a"}, `ERR KEFIR.EXEC: invalid operation: malformed WATCH observation: no origin (the format of development builds before the origin was added; no release logged it) (watch of key "a")`},
		{[]string{"KEFIR.EXEC", good, "a", "b"}, "[OK, (integer) 1]"},
		{[]string{"KEFIR.EXECRO", enc(nil, []string{"GET", "a"}), "a"}, `["1"]`},
	} {
		if got := c.do(tc.args...); got != tc.want {
			t.Errorf("%q: %s, want %s", tc.args[0], got, tc.want)
		}
	}
}

// BITFIELD and BITFIELD_RO inside MULTI/EXEC answer as in redis-server 7:
// queued (their arguments are checked at EXEC, where a bad one is that
// command's error element and the others apply), each reply an element of
// EXEC's; a transaction of BITFIELD_RO only is a read (KindExecRO). Compared
// with a real redis-server, command by command.
func TestExecBitFieldMatchesRedis(t *testing.T) {
	rc := startRedis(t)
	kc := dial(t, startServer(t, nil))
	for _, cmd := range []string{
		"SET s hello", "HSET h f v",
		"MULTI",
		"BITFIELD k SET u8 0 255 INCRBY u8 0 1 GET u4 0",
		"BITFIELD_RO k GET u8 0",
		"BITFIELD k OVERFLOW FAIL INCRBY u2 0 10 GET u2 0",
		"BITFIELD k BADSUB",
		"BITFIELD k GET i65 0",
		"BITFIELD h GET u8 0",
		"BITFIELD k",
		"BITFIELD_RO k SET u8 0 1",
		"BITFIELD s GET u8 0 SET i8 #1 -1 OVERFLOW SAT INCRBY i8 #1 -200",
		"GET s",
		"EXEC",
		"GET k", "GET s",
		"MULTI", "BITFIELD_RO s GET u8 0 GET i16 8", "BITFIELD_RO nokey GET u8 0", "EXEC",
		"WATCH s", "MULTI", "BITFIELD s INCRBY u8 0 1", "EXEC", "GET s",
	} {
		args := strings.Fields(cmd)
		if want, got := rawReply(t, rc, args), rawReply(t, kc, args); want != got {
			t.Errorf("%s:\n  redis: %s\n  kefir: %s", cmd, want, got)
		}
	}
}
