package check

import (
	"strings"
	"testing"
)

func (b *hist) hset(c int, key string, fv []string, added string, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: HSet, Key: key, Fields: fv, Result: added, Invoke: inv, Return: ret}, mods)
}

func (b *hist) hdel(c int, key string, fs []string, removed string, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: HDel, Key: key, Fields: fs, Result: removed, Invoke: inv, Return: ret}, mods)
}

// hget records an HGET that returned val ("nil": no such field).
func (b *hist) hget(c int, key, field, val string, inv, ret int64, mods ...mod) {
	o := Op{Client: c, Kind: HGet, Key: key, Fields: []string{field}, Found: val != "nil", Invoke: inv, Return: ret}
	if o.Found {
		o.Result = val
	}
	b.add(o, mods)
}

// hgetall records an HGETALL that returned pairs "f=v f=v".
func (b *hist) hgetall(c int, key, pairs string, inv, ret int64, mods ...mod) {
	m := map[string]string{}
	for _, p := range strings.Fields(pairs) {
		f, v, _ := strings.Cut(p, "=")
		m[f] = v
	}
	b.add(Op{Client: c, Kind: HGetAll, Key: key, Result: EncodeHash(m), Invoke: inv, Return: ret}, mods)
}

func (b *hist) hlen(c int, key, n string, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: HLen, Key: key, Result: n, Invoke: inv, Return: ret}, mods)
}

func (b *hist) delKey(c int, key string, deleted bool, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: Delete, Key: key, Found: deleted, Invoke: inv, Return: ret}, mods)
}

func (b *hist) expire(c int, key string, existed bool, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: HExpire, Key: key, Found: existed, Invoke: inv, Return: ret}, mods)
}

// The hash checker passes good histories (concurrent writers, an unknown
// HSET that took effect whole or not at all) and fails each broken one: a
// lost field, a field back after DEL of its hash, a torn multi-field HSET,
// wrong counts.
func TestLinearizableHashes(t *testing.T) {
	opts := LinOptions{NoVisualization: true, Strict: true}
	cases := []struct {
		name string
		ok   bool
		mk   func(b *hist)
	}{
		{"sequential", true, func(b *hist) {
			b.hset(0, "h", []string{"a", "1", "b", "2"}, "2", 0, 1)
			b.hset(0, "h", []string{"a", "3"}, "0", 2, 3)
			b.hgetall(1, "h", "a=3 b=2", 4, 5)
			b.hlen(1, "h", "2", 6, 7)
			b.expire(0, "h", true, 8, 9)
			b.hdel(0, "h", []string{"a", "zz"}, "1", 10, 11)
			b.hget(1, "h", "a", "nil", 12, 13)
			b.hget(1, "h", "b", "2", 14, 15)
			b.delKey(0, "h", true, 16, 17)
			b.hgetall(1, "h", "", 18, 19)
			b.expire(1, "h", false, 20, 21)
			b.delKey(0, "h", false, 22, 23)
		}},
		{"concurrent writers", true, func(b *hist) {
			b.hset(0, "h", []string{"a", "x"}, "1", 0, 10)
			b.hset(1, "h", []string{"a", "y"}, "0", 0, 10)
			b.hget(2, "h", "a", "y", 11, 12) // x came first: y answered 0
		}},
		{"unknown HSET applied whole", true, func(b *hist) {
			b.hset(0, "h", []string{"a", "1", "b", "1"}, "", 0, 1, unknown())
			b.hgetall(1, "h", "a=1 b=1", 5, 6)
		}},
		{"unknown HSET not applied", true, func(b *hist) {
			b.hset(0, "h", []string{"a", "1", "b", "1"}, "", 0, 1, unknown())
			b.hgetall(1, "h", "", 5, 6)
		}},
		{"lost field", false, func(b *hist) {
			b.hset(0, "h", []string{"a", "1"}, "1", 0, 1)
			b.hset(0, "h", []string{"b", "2"}, "1", 2, 3)
			b.hgetall(1, "h", "b=2", 4, 5)
		}},
		{"field resurrected after DEL", false, func(b *hist) {
			b.hset(0, "h", []string{"a", "1"}, "1", 0, 1)
			b.delKey(0, "h", true, 2, 3)
			b.hget(1, "h", "a", "1", 4, 5)
		}},
		{"torn multi-field HSET", false, func(b *hist) {
			b.hset(0, "h", []string{"a", "1", "b", "1"}, "", 0, 1, unknown())
			b.hgetall(1, "h", "a=1", 5, 6)
		}},
		{"torn HSET seen by HLEN and HGETALL", false, func(b *hist) {
			b.hset(0, "h", []string{"a", "1", "b", "1"}, "", 0, 1, unknown())
			b.hlen(1, "h", "2", 5, 6)
			b.hgetall(1, "h", "a=1", 7, 8)
		}},
		{"wrong HSET count", false, func(b *hist) {
			b.hset(0, "h", []string{"a", "1"}, "1", 0, 1)
			b.hset(0, "h", []string{"a", "2"}, "1", 2, 3)
		}},
		{"DEL of a missing hash says deleted", false, func(b *hist) {
			b.delKey(0, "h", true, 0, 1)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b hist
			c.mk(&b)
			v := LinearizableHashes(b.h, opts)
			if v.OK != c.ok {
				t.Fatalf("verdict %v, want ok=%v", v, c.ok)
			}
		})
	}
}
