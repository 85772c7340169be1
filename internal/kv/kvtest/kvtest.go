// Package kvtest holds test helpers for the packages that apply kv ops.
package kvtest

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
)

// BenchKeys returns the benchmarks' n keys, key-000000 on.
func BenchKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%06d", i))
	}
	return keys
}

// MixedOp returns write j (0..15) of batch i of the apply benchmarks' mix:
// SET, INCRBY, GETSET, MSET, DEL and SET NX over keys, values val. The
// engine-level (shard) and replicated (vrshard) benchmarks apply the same
// mix, so their numbers compare.
func MixedOp(keys [][]byte, val []byte, i, j int) kv.Op {
	k := keys[(i*16+j)%len(keys)]
	switch j % 8 {
	case 0, 1, 2:
		return kv.Op{Kind: kv.KindSet, Key: k, Value: val}
	case 3:
		return kv.Op{Kind: kv.KindIncrBy, Key: []byte("ctr"), Delta: 1}
	case 4:
		return kv.Op{Kind: kv.KindGetSet, Key: k, Value: val}
	case 5:
		return kv.Op{Kind: kv.KindMSet, Keys: [][]byte{k, val, keys[(i+j+7)%len(keys)], val}}
	case 6:
		return kv.Op{Kind: kv.KindDel, Keys: [][]byte{keys[(i*16+j+500)%len(keys)]}}
	default:
		return kv.Op{Kind: kv.KindSet, Key: k, Value: val, Cond: kv.IfAbsent}
	}
}
