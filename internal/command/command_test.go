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

// Lookup's shortcut for the hottest names must answer exactly as the table does.
func TestLookupFindsEverySpecByItsName(t *testing.T) {
	for _, s := range All() {
		for _, n := range []string{s.Name, strings.ToLower(s.Name)} {
			if got, ok := Lookup([]byte(n)); !ok || got != s {
				t.Errorf("Lookup(%q) = %v, %v; want %s", n, got, ok, s.Name)
			}
		}
	}
}
