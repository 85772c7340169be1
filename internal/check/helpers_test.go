package check

import (
	"time"

	"github.com/kefirdb/kefir/internal/level"
)

// hist builds hand-made histories: each helper appends one operation with
// explicit invoke/return times; mods adjust levels, versions and outcomes.
type hist struct{ h History }

type mod func(*Op)

func cons(c level.Consistency) mod { return func(o *Op) { o.Cons = c } }
func dur(d level.Durability) mod   { return func(o *Op) { o.Dur = d } }
func ver(v uint64) mod             { return func(o *Op) { o.Version = v } }
func sess(s string) mod            { return func(o *Op) { o.Session = s } }
func unknown() mod                 { return func(o *Op) { o.Outcome, o.Return = Unknown, Never } }
func ms(n int64) int64             { return n * int64(time.Millisecond) }
func bounded(n uint64) mod         { return cons(level.BoundedVersionsLevel(n)) }
func within(d time.Duration) mod   { return cons(level.BoundedTimeLevel(d)) }
func (b *hist) crash(node int, at int64) {
	b.h.Crashes = append(b.h.Crashes, Crash{Node: node, At: at})
}

func (b *hist) add(o Op, mods []mod) *Op {
	o.ID = len(b.h.Ops)
	o.Outcome = OK
	o.Node = -1
	for _, m := range mods {
		m(&o)
	}
	b.h.Ops = append(b.h.Ops, o)
	return &b.h.Ops[len(b.h.Ops)-1]
}

func (b *hist) put(c int, key, val string, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: Put, Key: key, Value: val, Invoke: inv, Return: ret}, mods)
}

func (b *hist) del(c int, key string, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: Delete, Key: key, Invoke: inv, Return: ret}, mods)
}

// get records a read that returned val; val "nil" means the key was absent.
func (b *hist) get(c int, key, val string, inv, ret int64, mods ...mod) {
	o := Op{Client: c, Kind: Get, Key: key, Invoke: inv, Return: ret, Found: val != "nil"}
	if o.Found {
		o.Result = val
	}
	b.add(o, mods)
}

func (b *hist) cas(c int, key, expect, val string, swapped bool, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: CAS, Key: key, Expect: expect, Value: val, Found: swapped, Invoke: inv, Return: ret}, mods)
}

func (b *hist) incr(c int, key string, delta int64, result string, inv, ret int64, mods ...mod) {
	b.add(Op{Client: c, Kind: Incr, Key: key, Delta: delta, Result: result, Found: true, Invoke: inv, Return: ret}, mods)
}
