package server

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
)

// hashScript exercises the hash commands; its expectations are Redis
// 7.0.15's answers (TestHashRepliesMatchRedis checks them against a real
// redis-server). Fields are added in order: Redis answers a small hash in
// insertion order, Kefir in field order.
const hashScript = `
HSET h a 1 b 2 => (integer) 2
HSET h b 3 c 4 => (integer) 1
HGET h b => "3"
HGET h zz => (nil)
HGET nokey a => (nil)
HMGET h a zz c => ["1", (nil), "4"]
HMGET nokey a => [(nil)]
HEXISTS h a => (integer) 1
HEXISTS h zz => (integer) 0
HSTRLEN h c => (integer) 1
HSTRLEN h zz => (integer) 0
HLEN h => (integer) 3
HLEN nokey => (integer) 0
HGETALL h => ["a", "1", "b", "3", "c", "4"]
HGETALL nokey => []
HKEYS h => ["a", "b", "c"]
HVALS h => ["1", "3", "4"]
HSETNX h a x => (integer) 0
HSETNX h d 5 => (integer) 1
HMSET h e 6 f 7 => OK
HINCRBY h e 10 => (integer) 16
HINCRBY h g -3 => (integer) -3
HINCRBY h a x => ERR value is not an integer or out of range
HINCRBY h e 9223372036854775807 => ERR increment or decrement would overflow
HINCRBYFLOAT h f 0.5 => "7.5"
HINCRBYFLOAT h f x => ERR value is not a valid float
HINCRBYFLOAT h f inf => ERR value is NaN or Infinity
HINCRBYFLOAT nokey f -Infinity => ERR value is NaN or Infinity
HINCRBYFLOAT h f 1e5000 => ERR value is not a valid float
HINCRBYFLOAT h f 0x1p-1 => "8"
HINCRBYFLOAT h f -0x.8 => "7.5"
HSET h s hello => (integer) 1
HINCRBY h s 1 => ERR hash value is not an integer
HINCRBYFLOAT h s 1 => ERR hash value is not a float
HDEL h a a zz b => (integer) 2
HDEL nokey a => (integer) 0
HLEN h => (integer) 6
HSCAN h 0 => ["0", ["c", "4", "d", "5", "e", "16", "f", "7.5", "g", "-3", "s", "hello"]]
HSCAN h 0 MATCH [cd] => ["0", ["c", "4", "d", "5"]]
HSCAN h 0 COUNT 100 => ["0", ["c", "4", "d", "5", "e", "16", "f", "7.5", "g", "-3", "s", "hello"]]
HSCAN h x => ERR invalid cursor
HSCAN h -0 MATCH [cd] => ["0", ["c", "4", "d", "5"]]
HSCAN h - => ERR invalid cursor
HSET h odd => ERR wrong number of arguments for 'hset' command
HMSET h odd => ERR wrong number of arguments for 'hmset' command
HSET one f v => (integer) 1
HRANDFIELD one => "f"
HRANDFIELD one 5 => ["f"]
HRANDFIELD one -2 => ["f", "f"]
HRANDFIELD one 1 WITHVALUES => ["f", "v"]
HRANDFIELD one 0 => []
HRANDFIELD nokey => (nil)
HRANDFIELD nokey 3 => []
HRANDFIELD one x => ERR value is not an integer or out of range
HRANDFIELD one -9223372036854775808 => ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807
HRANDFIELD nokey -9223372036854775808 WITHVALUES => ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807
HRANDFIELD one -9223372036854775808 FOO => ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807
HRANDFIELD one 9223372036854775807 => ["f"]
HRANDFIELD one 4611686018427387903 WITHVALUES => ["f", "v"]
HRANDFIELD one 4611686018427387904 WITHVALUES => ERR value is out of range
HRANDFIELD one -4611686018427387904 WITHVALUES => ERR value is out of range
TYPE h => hash
SCAN 0 TYPE hash MATCH h => ["0", ["h"]]
SCAN 0 TYPE string MATCH h* => ["0", []]
TYPE nokey => none
OBJECT ENCODING h => "listpack"
OBJECT REFCOUNT h => (integer) 1
HSET bigv f xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx => (integer) 1
OBJECT ENCODING bigv => "hashtable"
DEL bigv => (integer) 1
SET str v => OK
TYPE str => string
GET h => WRONGTYPE Operation against a key holding the wrong kind of value
STRLEN h => WRONGTYPE Operation against a key holding the wrong kind of value
INCR h => WRONGTYPE Operation against a key holding the wrong kind of value
APPEND h x => WRONGTYPE Operation against a key holding the wrong kind of value
GETDEL h => WRONGTYPE Operation against a key holding the wrong kind of value
SET h x GET => WRONGTYPE Operation against a key holding the wrong kind of value
MGET h str => [(nil), "v"]
EXISTS h str => (integer) 2
HSET str f v => WRONGTYPE Operation against a key holding the wrong kind of value
HGET str f => WRONGTYPE Operation against a key holding the wrong kind of value
HGETALL str => WRONGTYPE Operation against a key holding the wrong kind of value
HLEN str => WRONGTYPE Operation against a key holding the wrong kind of value
HDEL str f => WRONGTYPE Operation against a key holding the wrong kind of value
HINCRBY str f 1 => WRONGTYPE Operation against a key holding the wrong kind of value
HINCRBYFLOAT str f 1 => WRONGTYPE Operation against a key holding the wrong kind of value
HINCRBYFLOAT str f x => ERR value is not a valid float
INCRBYFLOAT h 1 => WRONGTYPE Operation against a key holding the wrong kind of value
SET h x NX => (nil)
EXPIRE h 100 => (integer) 1
HSET h t 1 => (integer) 1
TTL h => (integer) 100
PERSIST h => (integer) 1
TTL h => (integer) -1
EXPIRE h 100 => (integer) 1
COPY h hc => (integer) 1
TTL hc => (integer) 100
COPY h hc => (integer) 0
HSET hc c copied => (integer) 0
HGET h c => "4"
HGET hc c => "copied"
HLEN hc => (integer) 7
SET cs plain => OK
COPY h cs REPLACE => (integer) 1
HGET cs c => "4"
COPY cs hc REPLACE => (integer) 1
HGET hc c => "4"
PERSIST h => (integer) 1
RENAME h h2 => OK
HLEN h => (integer) 0
HGET h2 c => "4"
HLEN h2 => (integer) 7
DEL h2 => (integer) 1
HGETALL h2 => []
HSET h2 z 1 => (integer) 1
HGETALL h2 => ["z", "1"]
SET h2 plain => OK
GET h2 => "plain"
DEL h2 => (integer) 1
HSET h2 y 2 => (integer) 1
HGETALL h2 => ["y", "2"]
HDEL h2 y => (integer) 1
EXISTS h2 => (integer) 0
HSET h3 a 1 => (integer) 1
RENAME h3 one => OK
HGETALL one => ["a", "1"]
HSET kt f v => (integer) 1
EXPIRE kt 100 => (integer) 1
SET kt x KEEPTTL => OK
GET kt => "x"
TTL kt => (integer) 100
FLUSHDB => OK
HGETALL one => []
DBSIZE => (integer) 0
`

// The hash script on a single node.
func TestHashCommandsSingleNode(t *testing.T) {
	c := dial(t, startServer(t, nil))
	c.expect(hashScript)
	// NOVALUES is Redis 7.4's (7.0 answers a syntax error).
	c.expect(`
HSET nv a 1 b 2 => (integer) 2
HSCAN nv 0 NOVALUES => ["0", ["a", "b"]]
`)
}

// The hash script on a replicated group, through the leader at every level
// and through a follower (which forwards writes and reads it cannot serve).
func TestHashCommandsReplicated(t *testing.T) { expectOnGroup(t, hashScript) }

// Every reply of hashScript is Redis's, kind and bytes (HRANDFIELD's as a
// set: Redis picks its own order).
func TestHashRepliesMatchRedis(t *testing.T) {
	rc := startRedis(t)
	kc := dial(t, startServer(t, nil))
	rc.do("FLUSHALL")
	for _, line := range strings.Split(strings.TrimSpace(hashScript), "\n") {
		cmd, _, _ := strings.Cut(line, "=>")
		args := strings.Fields(cmd)
		want, got := rawReply(t, rc, args), rawReply(t, kc, args)
		if args[0] == "HRANDFIELD" {
			want, got = sortedArray(want), sortedArray(got)
		}
		if want != got {
			t.Errorf("%s:\n  redis: %s\n  kefir: %s", strings.TrimSpace(cmd), want, got)
		}
	}
}

// A one-field HGET takes conn.read's own paths (hgetSpec), not readMore's:
// the spec the table returns for any spelling is the one they compare
// against, and a single node's server has the key-read path for it
// (fieldReader). hashScript's HGETs check the replies (single node and group).
func TestHGetTakesTheReadPath(t *testing.T) {
	for _, name := range []string{"HGET", "hget", "HGet"} {
		if spec, ok := command.Lookup([]byte(name)); !ok || spec != hgetSpec {
			t.Fatalf("Lookup(%q) = %p, %v; the HGET path compares against %p", name, spec, ok, hgetSpec)
		}
	}
	if s := startServer(t, nil); s.fields == nil {
		t.Fatal("single node: no ReadField path for HGET")
	}
}

// Parsing an HSET (or HDEL, MSET, DEL: arena.copyArgs) allocates nothing
// once the connection's arena is warm, as parsing a SET does not: its
// argument list lives in the arena with its bytes (before, each HSET
// allocated its list).
func TestParsingAWriteOfManyArgumentsDoesNotAllocate(t *testing.T) {
	var a arena
	for _, tc := range []struct {
		cmd  string
		keys int // len(op.Keys)
	}{{"HSET h f v", 2}, {"HSET h f v g w", 4}, {"HDEL h f", 1}, {"MSET k v", 2}, {"DEL k j", 2}, {"SET k v", 0}} {
		var args [][]byte
		for _, s := range strings.Fields(tc.cmd) {
			args = append(args, []byte(s))
		}
		spec, ok := command.Lookup(args[0])
		if !ok {
			t.Fatalf("no spec for %s", tc.cmd)
		}
		parse := func() {
			var op kv.Op
			_, err := parseWriteInto(&op, spec, args, &a)
			if err != nil || len(op.Keys) != tc.keys || tc.keys > 0 && string(op.Keys[tc.keys-1]) != string(args[len(args)-1]) ||
				op.Key != nil && string(op.Key) != string(args[1]) {
				t.Fatalf("%s: %q, %v", tc.cmd, op.Keys, err)
			}
			a.reset()
		}
		parse()
		if n := testing.AllocsPerRun(100, parse); n != 0 {
			t.Errorf("parsing %s allocates %.1f times, want 0", tc.cmd, n)
		}
	}
}

// The arena's copies hold their bytes across its growth, whatever their
// size: one larger than the arena's first buffer, one beyond 64 KiB (copied
// outside it), and many small ones that force it to grow; each is capped at
// its length.
func TestArenaCopiesSurviveGrowth(t *testing.T) {
	var a arena
	want := [][]byte{bytes.Repeat([]byte("a"), 10<<10), bytes.Repeat([]byte("b"), 70<<10)}
	for i := range 3000 {
		want = append(want, []byte(strconv.Itoa(i)))
	}
	got := a.copyArgs(want[:2])
	for _, b := range want[2:] {
		got = append(got, a.copy(b))
	}
	got = append(got, a.copyArgs(want[2:])...)
	want = append(want, want[2:]...)
	if len(got) != len(want) {
		t.Fatalf("%d copies, want %d", len(got), len(want))
	}
	for i, g := range got {
		if len(g) <= 64<<10 && cap(g) != len(g) { // a larger one is an allocation of its own
			t.Fatalf("copy %d: capacity %d past its length %d (an append would overwrite the next)", i, cap(g), len(g))
		}
		if !bytes.Equal(g, want[i]) {
			t.Fatalf("copy %d: %q, want %q", i, g[:min(8, len(g))], want[i][:min(8, len(want[i]))])
		}
	}
}

// copyKeyArgs (HSET's and HDEL's key and list, one check of the arena's
// room) keeps what copy and copyArgs keep: every copy holds its bytes
// across the arena's growth and later copies, capped at its length, the
// list too; random lists, some past 64 KiB in all, interleaved with the
// other two.
func TestArenaCopyKeyArgsSurvivesGrowth(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 1))
	var a arena
	var got, want [][]byte
	for range 2000 {
		args := make([][]byte, 1+rng.IntN(6))
		for i := range args {
			n := rng.IntN(40)
			if rng.IntN(50) == 0 {
				n = rng.IntN(80 << 10)
			}
			args[i] = bytes.Repeat([]byte{byte('a' + rng.IntN(26))}, n)
		}
		switch rng.IntN(3) {
		case 0:
			key, rest := a.copyKeyArgs(args)
			if cap(rest) != len(rest) {
				t.Fatalf("list of %d: capacity %d", len(rest), cap(rest))
			}
			got = append(append(got, key), rest...)
		case 1:
			got = append(got, a.copyArgs(args)...)
		default:
			got = append(got, a.copy(args[0]))
			args = args[:1]
		}
		want = append(want, args...)
	}
	for i, g := range got {
		if len(g) <= 64<<10 && cap(g) != len(g) {
			t.Fatalf("copy %d: capacity %d past its length %d", i, cap(g), len(g))
		}
		if !bytes.Equal(g, want[i]) {
			t.Fatalf("copy %d: %d bytes %q, want %d bytes %q", i, len(g), g[:min(8, len(g))], len(want[i]), want[i][:min(8, len(want[i]))])
		}
	}
}

// copyKeyArgs takes a new chunk, and a new list, when the arena's current
// ones have no room — never the old ones again, which the batch's earlier
// copies still hold — both for an HSET of one field (three arguments:
// copyKeyFieldValue) and of more (its loop). TestArenaCopyKeyArgsSurvivesGrowth's
// random lists reach neither of copyKeyFieldValue's grows (its
// three-argument lists are few and small), so here the arena is filled to
// each point short of its end first, and every copy made before and after
// is checked, byte for byte (each copy's bytes its own).
func TestArenaCopyKeyArgsGrowsWithoutOverwriting(t *testing.T) {
	next := byte(0)
	mk := func(n int) []byte { next++; return bytes.Repeat([]byte{next}, n) }
	for _, n := range []int{3, 5} {
		grewBuf, grewArgs := false, false
		for room := 0; room < 70; room++ {
			var a arena
			var got, want [][]byte
			keep := func(g [][]byte, w ...[]byte) { got, want = append(got, g...), append(want, w...) }
			// room bytes left in the arena's first chunk (4 KiB), room%5
			// slots in its first list (256).
			fill := mk(4<<10 - room)
			keep([][]byte{a.copy(fill)}, fill)
			list := make([][]byte, 256-room%5)
			for i := range list {
				list[i] = []byte{}
			}
			keep(a.copyArgs(list), list...)
			chunk, slots := cap(a.buf), cap(a.args)
			args := make([][]byte, n)
			for i := range args {
				args[i] = mk(10 + i)
			}
			key, rest := a.copyKeyArgs(args)
			if len(rest) != n-1 || cap(rest) != n-1 {
				t.Fatalf("%d arguments, room %d: list of %d, capacity %d, want %d", n, room, len(rest), cap(rest), n-1)
			}
			keep(append([][]byte{key}, rest...), args...)
			grewBuf = grewBuf || cap(a.buf) != chunk
			grewArgs = grewArgs || cap(a.args) != slots
			// Later copies land after these, not over them.
			args2 := [][]byte{mk(5), mk(6), mk(7)}
			key, rest = a.copyKeyArgs(args2)
			keep(append([][]byte{key}, rest...), args2...)
			tail := mk(9)
			keep([][]byte{a.copy(tail)}, tail)
			for i, g := range got {
				if cap(g) != len(g) {
					t.Fatalf("%d arguments, room %d: copy %d: capacity %d past its length %d", n, room, i, cap(g), len(g))
				}
				if !bytes.Equal(g, want[i]) {
					t.Fatalf("%d arguments, room %d: copy %d of %d holds %q, want %q", n, room, i, len(got), g[:min(8, len(g))], want[i][:min(8, len(want[i]))])
				}
			}
		}
		if !grewBuf || !grewArgs {
			t.Fatalf("%d arguments: the copy grew the arena's bytes %v, its list %v: the test no longer reaches a grow", n, grewBuf, grewArgs)
		}
	}
}
