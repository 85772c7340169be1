package vrshard

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// BenchmarkNilextWrite: one closed-loop writer, 3 replicas in this process
// on loopback, real files. ordered = Write at the leader (prepare round,
// fsync on a majority); nilext = NilextWrite coordinated at a follower (one
// round trip to all three; sync: each fsyncs the d-log entry before its
// ack; cad: acks from memory). Reports p50/p99 latency.
//
//	go test ./internal/vrshard/ -run '^$' -bench NilextWrite -benchtime 1000x
func BenchmarkNilextWrite(b *testing.B) {
	for _, d := range []level.Durability{level.Sync, level.CAD} {
		for _, mode := range []string{"ordered", "nilext"} {
			b.Run(fmt.Sprintf("%v/%s", d, mode), func(b *testing.B) {
				c := newCluster(b, 3, func(o *Options) { o.Nilext = true })
				l := c.leader(10 * time.Second)
				leader, co := c.reps[l], c.reps[(l+1)%3]
				lats := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := range b.N {
					op := set(fmt.Sprint("k", i%1000), "value")
					t0 := time.Now()
					var err error
					if mode == "ordered" {
						_, err = leader.Write(context.Background(), op, d, shard.ReqID{Client: 5, Seq: uint64(i + 1)})
					} else {
						var fb shard.ReqID
						_, fb, err = co.NilextWrite(context.Background(), op, d)
						if !fb.IsZero() {
							b.Fatalf("write %d fell back", i)
						}
					}
					if err != nil {
						b.Fatal(err)
					}
					lats = append(lats, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(lats)
				b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-us")
				b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-us")
			})
		}
	}
}
