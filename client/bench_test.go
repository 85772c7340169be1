package client

import (
	"context"
	"fmt"
	"strconv"
	"testing"
)

// BenchmarkClientPipelined measures calls from many goroutines sharing a small pool
// against the in-test server (which does a map lookup under a mutex per command, so
// this is mostly client + loopback cost).
//
// Run: go test -run '^$' -bench ClientPipelined -benchmem ./client/
func BenchmarkClientPipelined(b *testing.B) {
	for _, tc := range []struct {
		op          string
		pool, procs int
	}{
		{"get", 1, 1}, {"get", 1, 16}, {"get", 2, 64}, {"put", 2, 64},
	} {
		b.Run(fmt.Sprintf("%s/pool=%d/goroutines=%dxGOMAXPROCS", tc.op, tc.pool, tc.procs), func(b *testing.B) {
			s := newTestServer(&testing.T{})
			s.noLog = true
			defer s.close()
			for i := range 1000 {
				s.set("key:"+strconv.Itoa(i), "value-0123456789abcdef")
			}
			ctx := context.Background()
			c, err := Dial(ctx, s.addr(), WithPoolSize(tc.pool))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			val := []byte("value-0123456789abcdef")
			b.SetParallelism(tc.procs)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					key := "key:" + strconv.Itoa(i%1000)
					i++
					var err error
					if tc.op == "get" {
						_, err = c.Get(ctx, key)
					} else {
						err = c.Put(ctx, key, val)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
