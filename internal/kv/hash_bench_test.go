package kv

import (
	"fmt"
	"testing"
)

// BenchmarkApplyHSetOneField is the single node's commonest hash write, an
// HSET of one field that exists (ApplyHash with SparseHashMeta: its row
// alone), over an in-memory state; for instruction counts of the hash logic
// alone (valgrind --tool=cachegrind of the test binary at two -test.benchtime
// counts, the difference per op: docs/design/hashes.md, "Pipelined,
// session 25").
func BenchmarkApplyHSetOneField(b *testing.B) {
	m := mem{}
	const fields = 1000
	all := make([][]byte, 0, 2*fields)
	for i := 0; i < fields; i++ {
		all = append(all, []byte(fmt.Sprintf("element:%012d", i)), []byte("xxx"))
	}
	create := Op{Kind: KindHSet, Key: []byte("myhash"), Keys: all}
	if _, err := ApplyHash(m.get, m.has, 2, &create, func(key, value, meta []byte, tomb bool) {
		m[string(key)] = memVal{val: string(value), ver: 2, meta: meta}
	}, ApplyOptions{}); err != nil {
		b.Fatal(err)
	}
	var buf []byte
	o := ApplyOptions{SparseHashMeta: true, Scratch: &buf}
	emitted := 0
	emit := func(key, value, meta []byte, tomb bool) { emitted++ }
	ops := make([]Op, fields)
	for i := range ops {
		ops[i] = Op{Kind: KindHSet, Key: []byte("myhash"), Keys: [][]byte{all[2*i], []byte("yyy")}}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(buf) > 1<<15 {
			buf = buf[:0] // the records are dropped: the arena may be reused
		}
		res, err := ApplyHash(m.get, m.has, uint64(3+i), &ops[i%fields], emit, o)
		if err != nil || res.Int != 0 {
			b.Fatal(res, err)
		}
	}
	if emitted != b.N {
		b.Fatalf("%d records for %d HSETs of existing fields, want one each", emitted, b.N)
	}
}
