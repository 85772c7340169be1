package check

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
)

func expires(at int64) mod { return func(o *Op) { o.ExpireAt = at } }

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
}
