package server

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// BenchmarkScanReply measures encoding one scan's reply (50 keys and 1 KB values,
// YCSB-E's average range) into a connection's output, as conn.writeResult does, in
// pipelined batches of four handed over (release) together; per reply.
func BenchmarkScanReply(b *testing.B) {
	arr := make([][]byte, 0, 100)
	for i := 0; i < 50; i++ {
		arr = append(arr, []byte(fmt.Sprintf("user%019d", i)), bytes.Repeat([]byte{'v'}, 1000))
	}
	res := kv.Result{Kind: kv.ResArray, Array: arr}
	c := &conn{}
	c.w = resp.NewWriter(&c.out, connWriterSize)
	b.SetBytes(int64(50 * (23 + 1000)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		c.writeResult(res)
		if i%4 == 3 { // a pipelined batch of four
			_ = c.w.Flush()
			c.out.release()
		}
	}
}
