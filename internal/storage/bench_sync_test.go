package storage

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkPutSyncLatency: one writer doing Append then Sync, one record at a time (a
// `sync` SET without pipelining), on the real file system. It reports the p50 and p99
// of the whole write (Append + Sync) and of the Sync alone (write(2) or pwrite(2) of the
// record plus fdatasync). Zero-filled segments (docs/design/zero-filled-logs.md) are
// what it compares: the engine opens outside the timer, so a new engine's first segment
// is zero-filled before it starts.
//
//	go test -run '^$' -bench PutSyncLatency -benchtime 3000x ./internal/storage
//
// (value=2800/seg=8MiB wants -benchtime 10000x or more to roll.)
func BenchmarkPutSyncLatency(b *testing.B) {
	for _, c := range []struct {
		vsize int
		seg   int64 // segment size (0: the default, 64 MiB)
	}{{100, 0}, {2800, 0}, {2800, 8 << 20}} {
		name := fmt.Sprintf("value=%d", c.vsize)
		if c.seg > 0 {
			// Small segments: a long run rolls, and the filler zero-fills the next
			// segment while the writer syncs.
			name += fmt.Sprintf("/seg=%dMiB", c.seg>>20)
		}
		vsize := c.vsize
		b.Run(name, func(b *testing.B) {
			db := benchOpen(b, Options{SegmentSize: c.seg})
			defer db.Close()
			val := make([]byte, vsize)
			key := make([]byte, 0, 16)
			ops := make([]time.Duration, 0, b.N)
			syncs := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key = benchKey(key, uint64(i))
				t0 := time.Now()
				p, err := db.Append(Record{Key: key, Value: val, Version: uint64(i + 1)})
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := db.Sync(p); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				ops = append(ops, t2.Sub(t0))
				syncs = append(syncs, t2.Sub(t1))
			}
			b.StopTimer()
			q := func(d []time.Duration, f float64) float64 {
				slices.Sort(d)
				return float64(d[int(f*float64(len(d)-1))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(q(ops, 0.5), "op-p50-us")
			b.ReportMetric(q(ops, 0.99), "op-p99-us")
			b.ReportMetric(q(syncs, 0.5), "sync-p50-us")
			b.ReportMetric(q(syncs, 0.99), "sync-p99-us")
			b.ReportMetric(float64(db.Stats().Segments), "segments")
		})
	}
}
