package server

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/resp"
)

// helloFields sends HELLO args on c and returns the reply's kind and its
// fields (the values printed by show).
func helloFields(t *testing.T, c *client, args ...string) (resp.Kind, map[string]string) {
	t.Helper()
	c.send(append([]string{"HELLO"}, args...)...)
	v, err := c.rd.ReadValue()
	if err != nil {
		t.Fatalf("HELLO %v: %v", args, err)
	}
	if (v.Kind != resp.Map && v.Kind != resp.Array) || len(v.Elems)%2 != 0 {
		t.Fatalf("HELLO %v = %s, want a map of fields", args, show(v))
	}
	fields := map[string]string{}
	for i := 0; i < len(v.Elems); i += 2 {
		fields[string(v.Elems[i].Str)] = show(v.Elems[i+1])
	}
	return v.Kind, fields
}

// HELLO 2 answers in RESP2, where a map is an array of alternating keys and
// values, and a single node is its own master.
func TestHello2RepliesWithAFlatArray(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	kind, f := helloFields(t, c, "2")
	if kind != resp.Array {
		t.Fatalf("HELLO 2 reply kind %v, want an array", kind)
	}
	for k, want := range map[string]string{"server": `"kefir"`, "proto": "(integer) 2", "role": `"master"`, "mode": `"standalone"`} {
		if f[k] != want {
			t.Errorf("HELLO 2: %s = %s, want %s", k, f[k], want)
		}
	}
	// The connection stays in RESP2: a missing key is the RESP2 null bulk.
	c.send("GET", "missing")
	if v, err := c.rd.ReadValue(); err != nil || v.Kind != resp.Null {
		t.Fatalf("GET missing after HELLO 2 = %v, %v", v, err)
	}
}

func TestClientIDIsDistinctPerConnection(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	ida, idb := a.do("CLIENT", "ID"), b.do("CLIENT", "ID")
	if !strings.HasPrefix(ida, "(integer) ") || !strings.HasPrefix(idb, "(integer) ") {
		t.Fatalf("CLIENT ID = %s and %s, want integers", ida, idb)
	}
	if ida == idb {
		t.Fatalf("two connections share CLIENT ID %s", ida)
	}
	if again := a.do("CLIENT", "ID"); again != ida {
		t.Fatalf("CLIENT ID changed on one connection: %s then %s", ida, again)
	}
}

// redis-cli asks COMMAND DOCS on start (for hints) and client libraries ask
// COMMAND or COMMAND INFO for key positions: each reply must parse and none
// may be an error.
func TestCommandIntrospection(t *testing.T) {
	s := startServer(t, nil)
	for _, proto := range []string{"2", "3"} {
		c := dial(t, s)
		helloFields(t, c, proto)
		read := func(args ...string) resp.Value {
			t.Helper()
			c.send(args...)
			v, err := c.rd.ReadValue()
			if err != nil {
				t.Fatalf("RESP%s %v: %v", proto, args, err)
			}
			if v.Kind == resp.Error {
				t.Fatalf("RESP%s %v = %s", proto, args, v.Str)
			}
			return v
		}
		all := read("COMMAND")
		if all.Kind != resp.Array || len(all.Elems) == 0 {
			t.Fatalf("RESP%s COMMAND = %s, want a non-empty array", proto, show(all))
		}
		found := false
		for _, e := range all.Elems {
			if e.Kind != resp.Array || len(e.Elems) < 6 {
				t.Fatalf("RESP%s COMMAND entry %s, want [name, arity, flags, first, last, step]", proto, show(e))
			}
			found = found || string(e.Elems[0].Str) == "get"
		}
		if !found {
			t.Errorf("RESP%s COMMAND does not list get", proto)
		}
		info := read("COMMAND", "INFO", "GET", "NOSUCH")
		if got := show(info); info.Kind != resp.Array || len(info.Elems) != 2 ||
			!strings.HasPrefix(got, `[["get", (integer) 2, [`) || !strings.HasSuffix(got, `(integer) 1, (integer) 1, (integer) 1], (nil)]`) {
			t.Errorf("RESP%s COMMAND INFO GET NOSUCH = %s", proto, got)
		}
		docs := read("COMMAND", "DOCS")
		if docs.Kind != resp.Map && docs.Kind != resp.Array {
			t.Errorf("RESP%s COMMAND DOCS = %s, want a map (an array in RESP2)", proto, show(docs))
		}
		if docs := read("COMMAND", "DOCS", "GET"); docs.Kind != resp.Map && docs.Kind != resp.Array {
			t.Errorf("RESP%s COMMAND DOCS GET = %s", proto, show(docs))
		}
	}
}
