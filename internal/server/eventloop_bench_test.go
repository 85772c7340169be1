package server

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// BenchmarkClients is redis-benchmark's shape in-process: 50 connections, each
// sending pipelines of depth P of one command and reading the replies, under each
// I/O model. ns/op is per command across all clients; the clients share the CPU
// with the server, so compare models with each other, not with Redis.
//
//	go test ./internal/server -run '^$' -bench Clients -benchmem
func BenchmarkClients(b *testing.B) {
	models := []IOModel{IOGoroutine}
	if epollSupported {
		models = append(models, IOEpoll)
	}
	for _, m := range models {
		for _, d := range []level.Durability{level.Async, level.Sync} {
			for _, op := range []string{"SET", "GET"} {
				for _, p := range []int{1, 16} {
					b.Run(fmt.Sprintf("%s/%s/%s/P%d", m, d, op, p), func(b *testing.B) {
						benchClients(b, m, d, op, p, 50)
					})
				}
			}
		}
	}
}

func benchClients(b *testing.B, m IOModel, d level.Durability, op string, depth, clients int) {
	old := ioModel.Load()
	ioModel.Store(m)
	defer ioModel.Store(old)
	s := startServer(b, func(c *Config) { c.Durability = d; c.HTTPAddr = "" })
	var cmds [][]byte
	for i := range clients {
		k := []byte(fmt.Sprintf("key:%06d", i))
		if op == "SET" {
			cmds = append(cmds, resp.AppendCommand(nil, []byte("SET"), k, []byte("xxx")))
		} else {
			cmds = append(cmds, resp.AppendCommand(nil, []byte("GET"), k))
		}
	}
	conns := make([]net.Conn, clients)
	for i := range conns {
		nc, err := net.Dial("tcp", s.ClientAddr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc
		if op == "GET" {
			if _, err := nc.Write(resp.AppendCommand(nil, []byte("SET"), []byte(fmt.Sprintf("key:%06d", i)), []byte("xxx"))); err != nil {
				b.Fatal(err)
			}
			if _, err := resp.NewReader(nc, 0).ReadValue(); err != nil {
				b.Fatal(err)
			}
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, nc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var batch []byte
			for range depth {
				batch = append(batch, cmds[i]...)
			}
			rd := resp.NewReader(bufio.NewReader(nc), 0)
			for left.Add(-int64(depth)) > -int64(depth) {
				if _, err := nc.Write(batch); err != nil {
					b.Error(err)
					return
				}
				for range depth {
					if v, err := rd.ReadValue(); err != nil || v.Kind == resp.Error {
						b.Errorf("reply %v %v", v, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
