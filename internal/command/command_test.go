package command

import (
	"strings"
	"testing"
)

func argv(s string) [][]byte {
	var out [][]byte
	for _, f := range strings.Fields(s) {
		out = append(out, []byte(f))
	}
	return out
}

func TestClassesFollowArchitecture(t *testing.T) {
	cases := []struct {
		cmd  string
		want Class
	}{
		{"SET k v", NilextUpdate},
		{"set k v", NilextUpdate},
		{"SET k v NX", NonNilextUpdate},
		{"SET k v xx", NonNilextUpdate},
		{"SET k v GET", NonNilextUpdate},
		{"SET k v EX 10", NilextUpdate},
		// Key expiry (docs/design/expiry.md): an expiry option does not make
		// SET's reply depend on state, KEEPTTL neither (the fast path still
		// keeps KEEPTTL off: vrshard.NilextEligible); everything that answers
		// what it found is non-nilext; the TTL family reads.
		{"SET k v PX 10", NilextUpdate},
		{"SET k v EXAT 10", NilextUpdate},
		{"SET k v PXAT 10", NilextUpdate},
		{"SET k v KEEPTTL", NilextUpdate},
		{"SET k v EX 10 NX", NonNilextUpdate},
		{"SET k v EX 10 GET", NonNilextUpdate},
		{"SETEX k 10 v", NilextUpdate},
		{"PSETEX k 10 v", NilextUpdate},
		{"GETEX k", NonNilextUpdate},
		{"GETEX k EX 10", NonNilextUpdate},
		{"EXPIRE k 10", NonNilextUpdate},
		{"PEXPIRE k 10 NX", NonNilextUpdate},
		{"EXPIREAT k 10", NonNilextUpdate},
		{"PEXPIREAT k 10", NonNilextUpdate},
		{"PERSIST k", NonNilextUpdate},
		{"TTL k", Read},
		{"PTTL k", Read},
		{"EXPIRETIME k", Read},
		{"PEXPIRETIME k", Read},
		{"KEFIR.CALL DURABILITY sync CMD SETEX k 1 v", NilextUpdate},
		{"KEFIR.CALL CMD EXPIRE k 1", NonNilextUpdate},
		// A value that happens to spell an option is not an option.
		{"SET k NX", NilextUpdate},
		{"MSET a 1 b 2", NilextUpdate},
		{"DEL a", NonNilextUpdate},
		{"INCR a", NonNilextUpdate},
		{"GETSET a b", NonNilextUpdate},
		{"APPEND a b", NonNilextUpdate},
		{"KEFIR.CAS a b c", NonNilextUpdate},
		{"GET a", Read},
		{"MGET a b", Read},
		{"KEFIR.SCAN a b", Read},
		{"PING", Admin},
		{"KEFIR.CALL DURABILITY sync CMD SET k v", NilextUpdate},
		{"KEFIR.CALL SESSION CMD CMD SET k v NX", NonNilextUpdate},
		{"KEFIR.CALL REQID 1 2 CMD GET k", Read},
		{"KEFIR.CALL CMD KEFIR.CALL CMD GET k", Admin},
	}
	for _, c := range cases {
		a := argv(c.cmd)
		s, ok := Lookup(a[0])
		if !ok {
			t.Fatalf("%q: not found", c.cmd)
		}
		if got := Classify(s, a); got != c.want {
			t.Errorf("Classify(%q) = %v, want %v", c.cmd, got, c.want)
		}
	}
}

func TestLookupIsCaseInsensitiveAndRejectsUnknown(t *testing.T) {
	for _, n := range []string{"get", "GeT", "kefir.scan"} {
		if _, ok := Lookup([]byte(n)); !ok {
			t.Errorf("Lookup(%q) failed", n)
		}
	}
	for _, n := range []string{"", "GETX", strings.Repeat("A", 100), "G\x00T"} {
		if _, ok := Lookup([]byte(n)); ok {
			t.Errorf("Lookup(%q) succeeded", n)
		}
	}
}

func TestArity(t *testing.T) {
	get := MustLookup("GET")
	if !get.ArityOK(2) || get.ArityOK(1) || get.ArityOK(3) {
		t.Error("GET arity is exactly 2")
	}
	mget := MustLookup("MGET")
	if mget.ArityOK(1) || !mget.ArityOK(2) || !mget.ArityOK(50) {
		t.Error("MGET arity is at least 2")
	}
}

func TestIDsAreDense(t *testing.T) {
	for i, s := range All() {
		if s.ID != i {
			t.Fatalf("%s has ID %d at %d", s.Name, s.ID, i)
		}
	}
	if len(Names()) != Count() {
		t.Fatal("Names and Count disagree")
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	name := []byte("get")
	if n := testing.AllocsPerRun(100, func() { Lookup(name) }); n != 0 {
		t.Fatalf("Lookup allocates %v times", n)
	}
}

// Lookup's hash table must answer exactly as the table does: every spec by
// its name in any case, and nothing for a name that is none (each name with a
// byte changed or cut short probes the slots its neighbours fill).
func TestLookupFindsEverySpecByItsName(t *testing.T) {
	for _, s := range All() {
		for _, n := range []string{s.Name, strings.ToLower(s.Name)} {
			if got, ok := Lookup([]byte(n)); !ok || got != s {
				t.Errorf("Lookup(%q) = %v, %v; want %s", n, got, ok, s.Name)
			}
		}
		for i := range len(s.Name) {
			for _, n := range []string{s.Name[:i], s.Name[:i] + "\x01" + s.Name[i+1:], s.Name + "X"} {
				if got, ok := Lookup([]byte(n)); ok && got.Name != n {
					t.Errorf("Lookup(%q) = %s", n, got.Name)
				}
			}
		}
	}
}

// Every command's class, spelled out: the nilext fast path acknowledges a
// NilextUpdate before it is ordered, so a command whose reply depends on
// state must never be one, and a read must never be an update. A command
// added to the table without a line here fails, so its class is decided, not
// defaulted.
func TestEveryCommandIsClassified(t *testing.T) {
	want := map[string]Class{
		"GET": Read, "MGET": Read, "EXISTS": Read, "STRLEN": Read, "KEFIR.SCAN": Read,
		"SCAN": Read, "KEYS": Read, "RANDOMKEY": Read, "TYPE": Read, "TOUCH": Read, "OBJECT": Read,
		"GETRANGE": Read, "SUBSTR": Read, "GETBIT": Read, "BITCOUNT": Read, "BITPOS": Read, "LCS": Read,
		"SET": NilextUpdate, "MSET": NilextUpdate,
		"DEL": NonNilextUpdate, "UNLINK": NonNilextUpdate, "INCR": NonNilextUpdate, "DECR": NonNilextUpdate,
		"INCRBY": NonNilextUpdate, "DECRBY": NonNilextUpdate, "GETSET": NonNilextUpdate, "APPEND": NonNilextUpdate,
		"SETNX": NonNilextUpdate, "KEFIR.CAS": NonNilextUpdate,
		// Replies that depend on the state found: non-nilext.
		"RENAME": NonNilextUpdate, "RENAMENX": NonNilextUpdate, "COPY": NonNilextUpdate, "GETDEL": NonNilextUpdate,
		"SETRANGE": NonNilextUpdate, "INCRBYFLOAT": NonNilextUpdate, "MSETNX": NonNilextUpdate, "SETBIT": NonNilextUpdate, "BITFIELD": NonNilextUpdate, "BITFIELD_RO": Read,
		// OK whatever it found, but it names no key a read could find
		// pending in a d-log: ordered before it replies.
		"FLUSHDB": NonNilextUpdate, "FLUSHALL": NonNilextUpdate,
		// Hashes: every write answers what it found (HSET's count of new
		// fields, HDEL's count, HINCRBY's value) or, HMSET, writes a record
		// that depends on it (the field count): ordered. Reads are reads.
		"HSET": NonNilextUpdate, "HMSET": NonNilextUpdate, "HSETNX": NonNilextUpdate, "HDEL": NonNilextUpdate,
		"HINCRBY": NonNilextUpdate, "HINCRBYFLOAT": NonNilextUpdate,
		"HGET": Read, "HMGET": Read, "HEXISTS": Read, "HSTRLEN": Read, "HLEN": Read, "HGETALL": Read,
		"HKEYS": Read, "HVALS": Read, "HSCAN": Read, "HRANDFIELD": Read,
		// Key expiry: SETEX and PSETEX answer OK whatever the state (as SET EX);
		// the others answer what they found.
		"SETEX": NilextUpdate, "PSETEX": NilextUpdate, "GETEX": NonNilextUpdate, "PERSIST": NonNilextUpdate,
		"EXPIRE": NonNilextUpdate, "PEXPIRE": NonNilextUpdate, "EXPIREAT": NonNilextUpdate, "PEXPIREAT": NonNilextUpdate,
		"TTL": Read, "PTTL": Read, "EXPIRETIME": Read, "PEXPIRETIME": Read,
		// Scripts: the reply is what the script returns from the state it
		// ran against: ordered, never nilext. A read-only script is a read.
		"EVAL": NonNilextUpdate, "EVALSHA": NonNilextUpdate, "EVAL_RO": Read, "EVALSHA_RO": Read,
		"SCRIPT": Admin, "KEFIR.TX": Admin, "KEFIR.TXAPPLY": NonNilextUpdate,
		"KEFIR.CALL": Admin, "PING": Admin, "ECHO": Admin, "HELLO": Admin, "AUTH": Admin, "SELECT": Admin,
		"QUIT": Admin, "INFO": Admin, "CLIENT": Admin, "COMMAND": Admin, "CONFIG": Admin, "DBSIZE": Admin,
		"KEFIR.CONSISTENCY": Admin, "KEFIR.DURABILITY": Admin, "KEFIR.SESSION": Admin, "KEFIR.TOPOLOGY": Admin,
		// Redis Cluster's surface: node commands (docs/cluster.md).
		"CLUSTER": Admin, "ASKING": Admin, "READONLY": Admin, "READWRITE": Admin, "KEFIR.SLOTS": Admin, "KEFIR.GROUP": Admin,
		"KEFIR.NILEXT": Admin, "KEFIR.CHAINVERSION": Admin, "MULTI": Admin, "EXEC": NonNilextUpdate, "DISCARD": Admin, "WATCH": Read, "UNWATCH": Admin,
		"KEFIR.EXEC": NonNilextUpdate, "KEFIR.EXECRO": Read, "KEFIR.WATCH": Read, "KEFIR.GROUPSCAN": Read,
	}
	for _, s := range All() {
		if s.Has(Unsupported) && want[s.Name] == 0 {
			continue // never runs: answers UnsupportedError
		}
		w, ok := want[s.Name]
		if !ok {
			t.Errorf("%s: no class decided in this test", s.Name)
			continue
		}
		if s.Class != w {
			t.Errorf("%s: class %v, want %v", s.Name, s.Class, w)
		}
	}
	// The arguments decide for SET only.
	for _, c := range []struct {
		cmd  string
		want Class
	}{{"RENAME a b", NonNilextUpdate}, {"FLUSHDB ASYNC", NonNilextUpdate}, {"SCAN 0 MATCH *", Read}, {"MSETNX a 1", NonNilextUpdate},
		{"HSET h f v", NonNilextUpdate}, {"HMSET h f v", NonNilextUpdate}, {"HGETALL h", Read}} {
		a := argv(c.cmd)
		s, _ := Lookup(a[0])
		if got := Classify(s, a); got != c.want {
			t.Errorf("Classify(%q) = %v, want %v", c.cmd, got, c.want)
		}
	}
}

// Known Redis commands Kefir lacks are in the table, flagged, with the one
// error text; a name already implemented is not shadowed by the list.
func TestUnsupportedCommandsAreKnown(t *testing.T) {
	for _, n := range []string{"LPUSH", "SADD", "ZADD", "LPOP", "BITOP"} {
		s, ok := Lookup([]byte(n))
		if !ok || !s.Has(Unsupported) {
			t.Errorf("%s: known %v, unsupported %v", n, ok, ok && s.Has(Unsupported))
		}
	}
	for _, n := range []string{"SCAN", "KEYS", "FLUSHDB", "GET", "PTTL", "EXPIRE", "HSET", "HGETALL", "HRANDFIELD"} {
		if s, _ := Lookup([]byte(n)); s == nil || s.Has(Unsupported) {
			t.Errorf("%s is flagged unsupported", n)
		}
	}
	if got := UnsupportedError("LPUSH"); !strings.HasPrefix(got, "ERR unsupported command 'lpush'") {
		t.Errorf("UnsupportedError = %q", got)
	}
}
