package client

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/kefirdb/kefir/internal/resp"
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

// fixedResponder answers every command with the same reply, allocating nothing,
// so a benchmark against it measures the client (plus loopback) alone.
func fixedResponder(b *testing.B, reply string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			b.Cleanup(func() { nc.Close() })
			go func() {
				rd := resp.NewReader(nc, 0)
				w := resp.NewWriter(nc, 64<<10)
				var args [][]byte
				for {
					var err error
					if args, err = rd.ReadCommand(args); err != nil {
						return
					}
					w.WriteBulkString(reply)
					if rd.Buffered() == 0 && w.Flush() != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// BenchmarkClientOverhead: Get against a responder that allocates nothing, so
// B/op and allocs/op are the client's own.
//
// Run: go test -run '^$' -bench ClientOverhead -benchmem ./client/
func BenchmarkClientOverhead(b *testing.B) {
	addr := fixedResponder(b, "value-0123456789abcdef")
	for _, procs := range []int{1, 32} {
		b.Run(fmt.Sprintf("get/pool=1/goroutines=%dxGOMAXPROCS", procs), func(b *testing.B) {
			ctx := context.Background()
			c, err := Dial(ctx, []string{addr}, WithPoolSize(1))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetParallelism(procs)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Get(ctx, "key:0000000001"); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
