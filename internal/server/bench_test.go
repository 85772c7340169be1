package server

import (
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// benchPipeline sends b.N copies of cmd over one connection in pipelines of
// depth and reads every reply. Allocations are the server's and the test
// client's together; the client side allocates nothing in steady state.
func benchPipeline(b *testing.B, d level.Durability, depth int, setup []string, cmd ...string) {
	s := startServer(b, func(c *Config) { c.Durability = d; c.HTTPAddr = "" })
	c := dial(b, s)
	if setup != nil {
		c.do(setup...)
	}
	var one []byte
	var args [][]byte
	for _, a := range cmd {
		args = append(args, []byte(a))
	}
	one = resp.AppendCommand(one, args...)
	var batch []byte
	for range depth {
		batch = append(batch, one...)
	}
	b.SetBytes(int64(len(one)))
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += depth {
		if _, err := c.nc.Write(batch); err != nil {
			b.Fatal(err)
		}
		for range depth {
			v, err := c.rd.ReadValue()
			if err != nil || v.Kind == resp.Error {
				b.Fatalf("reply %v %v", v, err)
			}
		}
	}
}

func BenchmarkSetAsyncP1(b *testing.B) { benchPipeline(b, level.Async, 1, nil, "SET", "key", "value") }
func BenchmarkSetAsyncP16(b *testing.B) {
	benchPipeline(b, level.Async, 16, nil, "SET", "key", "value")
}
func BenchmarkSetSyncP16(b *testing.B) { benchPipeline(b, level.Sync, 16, nil, "SET", "key", "value") }
func BenchmarkGetP1(b *testing.B) {
	benchPipeline(b, level.Async, 1, []string{"SET", "key", "value"}, "GET", "key")
}
func BenchmarkGetP16(b *testing.B) {
	benchPipeline(b, level.Async, 16, []string{"SET", "key", "value"}, "GET", "key")
}
func BenchmarkIncrSyncP16(b *testing.B) { benchPipeline(b, level.Sync, 16, nil, "INCR", "ctr") }

// benchGroup is benchPipeline against a 3-replica group, through the leader
// or through a follower (which forwards every command to the leader).
func benchGroup(b *testing.B, viaFollower bool, depth int, setup []string, cmd ...string) {
	g := startGroup(b)
	l := g.leader(b)
	s := g.nodes[l]
	if viaFollower {
		s = g.nodes[(l+1)%3]
	}
	c := dial(b, s)
	if setup != nil {
		c.do(setup...)
	}
	var args [][]byte
	for _, a := range cmd {
		args = append(args, []byte(a))
	}
	one := resp.AppendCommand(nil, args...)
	var batch []byte
	for range depth {
		batch = append(batch, one...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += depth {
		if _, err := c.nc.Write(batch); err != nil {
			b.Fatal(err)
		}
		for range depth {
			v, err := c.rd.ReadValue()
			if err != nil || v.Kind == resp.Error {
				b.Fatalf("reply %v %v", v, err)
			}
		}
	}
}

func BenchmarkGroupSetP16Leader(b *testing.B)   { benchGroup(b, false, 16, nil, "SET", "key", "value") }
func BenchmarkGroupSetP16Follower(b *testing.B) { benchGroup(b, true, 16, nil, "SET", "key", "value") }
func BenchmarkGroupGetP1Leader(b *testing.B) {
	benchGroup(b, false, 1, []string{"SET", "key", "value"}, "GET", "key")
}
func BenchmarkGroupGetP1Follower(b *testing.B) {
	benchGroup(b, true, 1, []string{"SET", "key", "value"}, "GET", "key")
}
func BenchmarkGroupSetP1Leader(b *testing.B)   { benchGroup(b, false, 1, nil, "SET", "key", "value") }
func BenchmarkGroupSetP1Follower(b *testing.B) { benchGroup(b, true, 1, nil, "SET", "key", "value") }

// Wrapped writes (what the Go client sends) batch like plain ones.
func BenchmarkCallSetSyncP16(b *testing.B) {
	benchPipeline(b, level.Sync, 16, nil, "KEFIR.CALL", "DURABILITY", "sync", "CMD", "SET", "key", "value")
}
