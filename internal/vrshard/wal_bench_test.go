package vrshard

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// BenchmarkWALSync times the replication log alone on the real disk: a batch
// of 20 entries with 128-byte values (~2.9 KB with framing) written, then
// fsynced, in a loop; a checkpoint-like roll every 1,000 batches (~2.9 MB,
// about what 20,000 plain SETs of 16-byte keys and 128-byte values write).
// Sub-benchmarks: "append" (no zero-filled segments: every segment is
// appended to, as the log did before) and "zero-filled" (the filler one
// segment ahead, as replicas run). Reported: sync-p50-us, sync-p99-us (the
// fsync alone), and zero-rolls, the fraction of rolls that found a
// zero-filled file ready.
//
// BENCHDIR picks the directory (default: a temp dir; put it on the disk to
// measure):
//
//	BENCHDIR=/work/... go test ./internal/vrshard/ -run '^$' -bench WALSync -benchtime 3s
func BenchmarkWALSync(b *testing.B) {
	for _, m := range []struct {
		name string
		fill seglog.FillMode
	}{{"append", seglog.FillOff}, {"zero-filled", seglog.FillAsync}} {
		b.Run(m.name, func(b *testing.B) {
			dir := os.Getenv("BENCHDIR")
			if dir == "" {
				dir = b.TempDir()
			}
			dir, err := os.MkdirTemp(dir, "walsync")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			cfg := defaultWALConfig()
			cfg.fill = m.fill
			w, _, err := openWALWith(vfs.Default, dir, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer w.close()
			w.addSnapshot(vr.Snapshot{Op: 0})
			if err := w.roll(); err != nil {
				b.Fatal(err)
			}
			rolls0, zero0 := w.rolls, w.zeroRolls
			val := make([]byte, 128)
			var op uint64
			batch := func() []vr.Entry {
				es := make([]vr.Entry, 20)
				for i := range es {
					op++
					es[i] = vr.Entry{View: 1, Op: op, Request: vr.Request{Client: 1, ReqNum: op, Data: val}}
				}
				return es
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				if i%1000 == 999 {
					w.addSnapshot(vr.Snapshot{Op: op})
					if err := w.roll(); err != nil {
						b.Fatal(err)
					}
				}
				w.addEntries(batch())
				if err := w.write(); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := w.sync(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "sync-p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "sync-p99-us")
			if n := w.rolls - rolls0; n > 0 {
				b.ReportMetric(float64(w.zeroRolls-zero0)/float64(n), "zero-rolls")
			}
		})
	}
}
