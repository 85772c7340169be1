package check

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
)

func expires(at int64) mod { return func(o *Op) { o.ExpireAt = at } }

// pexpireat records a PEXPIREAT k at; set: it answered 1.
func (b *hist) pexpireat(c int, key string, at int64, set bool, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: Expire, Key: key, ExpireAt: at, Found: set, Invoke: inv, Return: ret}, mods)
}

// persist records a PERSIST k; removed: it answered 1.
func (b *hist) persist(c int, key string, removed bool, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: Persist, Key: key, Found: removed, Invoke: inv, Return: ret}, mods)
}

// ttl records an expiry read that answered at: -2 absent, -1 no expiry,
// else the expiry (recorder ns).
func (b *hist) ttl(c int, key string, at int64, inv, ret int64, mods ...mod) {
	o := Op{Client: c, Kind: TTL, Key: key, Found: at != -2, Invoke: inv, Return: ret}
	if at > 0 {
		o.ExpireAt = at
	}
	b.add(o, mods)
}

// A history that respects expiries passes; each broken one fails with the
// reason, and the bound is honoured both ways.
func TestExpiry(t *testing.T) {
	eventual := cons(level.ConsEventual)
	bound := ms(10)
	cases := []struct {
		name  string
		build func(b *hist)
		fail  string // "" = passes
	}{
		{"present then absent", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.get(1, "k", "a", ms(2), ms(3))
			b.get(1, "k", "a", ms(95), ms(96), eventual)
			b.get(1, "k", "nil", ms(120), ms(121))
			b.get(2, "k", "nil", ms(200), ms(201), eventual)
		}, ""},
		{"value read after its expiry", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.get(1, "k", "a", ms(150), ms(151), eventual)
		}, "after its expiry"},
		{"value read just after expiry, within the bound", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.get(1, "k", "a", ms(105), ms(106))
		}, ""},
		{"absent before expiry", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.get(1, "k", "nil", ms(20), ms(21))
		}, "before the expiry"},
		{"absent just before expiry, within the bound", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.get(1, "k", "nil", ms(88), ms(92))
		}, ""},
		{"a weak read may lag", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.get(1, "k", "nil", ms(20), ms(21), eventual)
		}, ""},
		{"a concurrent delete explains absence", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.del(2, "k", ms(15), ms(25))
			b.get(1, "k", "nil", ms(20), ms(21))
		}, ""},
		{"an overwrite without expiry lives on", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3))
			b.get(1, "k", "b", ms(500), ms(501))
		}, ""},
		{"an overwrite without expiry vanished", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3))
			b.get(1, "k", "nil", ms(500), ms(501))
		}, "before the expiry"},
		{"an expire extends a value's life", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.pexpireat(0, "k", ms(300), true, ms(2), ms(3))
			b.get(1, "k", "a", ms(200), ms(201))
		}, ""},
		{"a persist keeps a value for ever", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.persist(0, "k", true, ms(2), ms(3))
			b.get(1, "k", "a", ms(900), ms(901))
		}, ""},
		{"an expire that set nothing extends nothing", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.pexpireat(0, "k", ms(300), false, ms(2), ms(3))
			b.get(1, "k", "a", ms(200), ms(201))
		}, "after its expiry"},

		// Expiry reads.
		{"expiry reads of the session's writes", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.ttl(0, "k", ms(100), ms(2), ms(3))
			b.pexpireat(0, "k", ms(300), true, ms(4), ms(5))
			b.ttl(0, "k", ms(300), ms(6), ms(7))
			b.persist(0, "k", true, ms(8), ms(9))
			b.ttl(0, "k", -1, ms(10), ms(11))
			b.persist(0, "k", false, ms(12), ms(13))
			b.ttl(0, "k", -1, ms(14), ms(15))
			b.del(0, "k", ms(16), ms(17))
			b.pexpireat(0, "k", ms(400), false, ms(18), ms(19))
			b.ttl(1, "k", -2, ms(20), ms(21))
		}, ""},
		{"expiry read misses the session's own write", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)))
			b.ttl(0, "k", ms(100), ms(4), ms(5))
		}, "its own (read-your-writes)"},
		{"expiry read misses another client's write", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)))
			b.ttl(1, "k", ms(100), ms(4), ms(5))
		}, "another client's"},
		{"expiry read misses an expire", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.pexpireat(0, "k", ms(300), true, ms(2), ms(3))
			b.ttl(0, "k", ms(100), ms(4), ms(5))
		}, "want expiry @300"},
		{"expiry read misses a persist", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.persist(0, "k", true, ms(2), ms(3))
			b.ttl(0, "k", ms(100), ms(4), ms(5))
		}, "want live without expiry"},
		{"expiry read after a persist of nothing finds an expiry", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.persist(0, "k", false, ms(2), ms(3))
			b.ttl(0, "k", ms(100), ms(4), ms(5))
		}, "want absent or no expiry"},
		{"expiry read finds a deleted key", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.del(0, "k", ms(2), ms(3))
			b.ttl(0, "k", ms(100), ms(4), ms(5))
		}, "want absent"},
		{"a concurrent write excuses an older expiry", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)))
			b.put(1, "k", "c", ms(3), ms(10), expires(ms(300)))
			b.ttl(0, "k", ms(100), ms(4), ms(5))
		}, ""},
		{"an expiry near its end excuses absence", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(12)))
			b.ttl(0, "k", -2, ms(4), ms(5))
		}, ""},
		{"a weak expiry read may lag", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)))
			b.ttl(0, "k", ms(100), ms(4), ms(5), eventual)
		}, ""},
		{"a crash may take a cad write back", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)), dur(level.CAD))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)), dur(level.CAD))
			b.crash(1, ms(4))
			b.ttl(0, "k", ms(100), ms(5), ms(6))
		}, ""},
		{"no crash: a cad write stays", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)), dur(level.CAD))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)), dur(level.Async))
			b.crash(1, ms(1))
			b.ttl(0, "k", ms(100), ms(5), ms(6))
		}, "read-your-writes"},
		{"a sync write survives a crash", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(3), expires(ms(200)))
			b.crash(1, ms(4))
			b.ttl(0, "k", ms(100), ms(5), ms(6))
		}, "read-your-writes"},
		{"expiry read finds a key live after its expiry", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.ttl(1, "k", ms(100), ms(150), ms(151), eventual)
		}, "live 50000000 after the expiry it answered"},
		{"expiry read answers an expiry nobody set", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.ttl(1, "k", ms(120), ms(2), ms(3), eventual)
		}, "no write of the key set"},
		{"expiry read goes back in time", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(20), expires(ms(200)))
			b.ttl(1, "k", ms(200), ms(4), ms(5))
			b.ttl(2, "k", ms(100), ms(6), ms(7))
		}, "went back in time"},
		{"expiry read goes back to no expiry", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1))
			b.pexpireat(0, "k", ms(200), true, ms(2), ms(20))
			b.ttl(1, "k", ms(200), ms(4), ms(5))
			b.ttl(2, "k", -1, ms(6), ms(7))
		}, "went back in time"},
		{"expiry reads of concurrent writes may see either order", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(3), expires(ms(100)))
			b.put(1, "k", "b", ms(2), ms(20), expires(ms(200)))
			b.ttl(2, "k", ms(200), ms(4), ms(5))
			b.ttl(3, "k", ms(100), ms(6), ms(7))
		}, ""},
		{"overlapping expiry reads may see either order", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(20), expires(ms(200)))
			b.ttl(1, "k", ms(200), ms(4), ms(7))
			b.ttl(2, "k", ms(100), ms(6), ms(8))
		}, ""},
		{"an async write read may be taken back", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)))
			b.put(0, "k", "b", ms(2), ms(20), expires(ms(200)), dur(level.Async))
			b.ttl(1, "k", ms(200), ms(4), ms(5))
			b.ttl(2, "k", ms(100), ms(6), ms(7))
		}, ""},
		{"expiry reads at millisecond resolution", func(b *hist) {
			b.put(0, "k", "a", ms(0), ms(1), expires(ms(100)+700_000))
			b.ttl(0, "k", ms(100), ms(2), ms(3))
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b hist
			c.build(&b)
			v := Expiry(b.h, bound)
			switch {
			case c.fail == "" && !v.OK:
				t.Fatalf("a good history failed: %s", v)
			case c.fail != "" && v.OK:
				t.Fatalf("a broken history passed (%d checked)", v.Checked)
			case c.fail != "" && !strings.Contains(v.Violations[0].Reason, c.fail):
				t.Fatalf("reason %q, want %q", v.Violations[0].Reason, c.fail)
			}
		})
	}
}

// SplitExpiring sends every op of a key some Put gave an expiry to the
// expiry half, and the rest to the plain half, renumbered.
func TestSplitExpiring(t *testing.T) {
	var b hist
	b.put(0, "t", "a", ms(0), ms(1), expires(ms(100)))
	b.put(0, "p", "a", ms(0), ms(1))
	b.get(1, "t", "nil", ms(200), ms(201))
	b.get(1, "p", "a", ms(200), ms(201))
	b.crash(0, ms(50))
	plain, exp := SplitExpiring(b.h)
	if len(plain.Ops) != 2 || len(exp.Ops) != 2 || plain.Ops[1].ID != 1 || exp.Ops[1].Key != "t" || len(exp.Crashes) != 1 {
		t.Fatalf("plain %v, expiring %v", plain.Ops, exp.Ops)
	}
	if err := Errs(All(plain, Options{})); err != nil {
		t.Fatal(err)
	}
	if v := Expiry(exp, 0); !v.OK {
		t.Fatal(v)
	}
	// The expiry kinds send their key to the expiry half too: only Expiry
	// models them.
	var e hist
	e.put(0, "p", "a", ms(0), ms(1))
	e.pexpireat(0, "p", ms(100), true, ms(2), ms(3))
	e.put(0, "q", "a", ms(0), ms(1))
	e.ttl(0, "q", -1, ms(2), ms(3))
	e.put(0, "r", "a", ms(0), ms(1))
	e.persist(0, "r", false, ms(2), ms(3))
	if plain, exp := SplitExpiring(e.h); len(plain.Ops) != 0 || len(exp.Ops) != 6 {
		t.Fatalf("plain %v, expiring %v", plain.Ops, exp.Ops)
	}
}
