package storage

import (
	"runtime"
	"runtime/metrics"
	"testing"
)

// BenchmarkIndexGC runs full garbage collections with an index of 1M random keys (one
// version each) and reports the collector's CPU per cycle (runtime/metrics, which the
// box's load moves less than the wall time): items hold no pointer (older versions are
// in tree.older), so the collector does not scan the leaves.
func BenchmarkIndexGC(b *testing.B) {
	const n = 1_000_000
	db := benchOpen(b, Options{CacheBytes: -1})
	defer db.Close()
	val := make([]byte, 100)
	key := make([]byte, 0, 16)
	for i := uint64(0); i < n; i++ {
		key = benchKey(key, (i*0x9E3779B97F4A7C15)&(1<<48-1))
		if _, err := db.Append(Record{Key: key, Value: val, Version: i + 1}); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	gcCPU := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(gcCPU)
	before := gcCPU[0].Value.Float64()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.GC()
	}
	b.StopTimer()
	metrics.Read(gcCPU)
	b.ReportMetric((gcCPU[0].Value.Float64()-before)*1e3/float64(b.N), "gc-cpu-ms/op")
	runtime.KeepAlive(db)
}
