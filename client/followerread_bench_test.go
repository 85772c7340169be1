package client

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkFollowerReads measures cross-client-monotonic reads from many
// goroutines (and, as the baseline of issue 7, linearizable reads) against an in-process 3-replica group with --follower-reads,
// spread over the replicas (the default) and sent the leader's way only
// (WithReplicaReads(false)); pool is WithPoolSize, per address when spread.
// All three replicas share this machine's CPUs,
// so the figure shows the client's overhead and how the load spreads, not
// the scaling three machines would give.
//
// Run: go test -run '^$' -bench FollowerReads -benchmem ./client/
func BenchmarkFollowerReads(b *testing.B) {
	nodes := startFollowerReadGroup(b)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.ClientAddr().String())
	}
	ctx := context.Background()
	seed, err := Dial(ctx, addrs, WithRetryUnavailable(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer seed.Close()
	for i := range 100 {
		if err := seed.Put(ctx, fmt.Sprint("key:", i), []byte("value-0123456789abcdef")); err != nil {
			b.Fatal(err)
		}
	}
	waitFollowerReads(b, ctx, seed, nodes)
	for _, tc := range []struct {
		spread bool
		pool   int
		cons   Consistency
	}{
		{true, 2, CrossClientMonotonic}, {false, 2, CrossClientMonotonic}, {false, 2, Linearizable},
		{true, 1, CrossClientMonotonic}, {false, 1, CrossClientMonotonic}, {false, 1, Linearizable},
	} {
		name := "leader"
		if tc.spread {
			name = "spread"
		}
		b.Run(fmt.Sprintf("%s/%s/pool=%d", name, tc.cons, tc.pool), func(b *testing.B) {
			// The leader first: the pool's connections go to it (there is
			// no write here to redirect them), so "leader" reads are leader
			// reads, unless the group changes views during the run.
			var ordered []string
			for _, n := range nodes {
				if n.Status().Role == "leader" {
					ordered = append([]string{n.ClientAddr().String()}, ordered...)
				} else {
					ordered = append(ordered, n.ClientAddr().String())
				}
			}
			c, err := Dial(ctx, ordered, WithReplicaReads(tc.spread), WithPoolSize(tc.pool), WithRetryUnavailable(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			before := sum(followerServed(nodes))
			b.SetParallelism(16)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					if _, err := c.Get(ctx, fmt.Sprint("key:", i%100), WithConsistency(tc.cons)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(sum(followerServed(nodes))-before)/float64(b.N), "follower-served/op")
		})
	}
}
