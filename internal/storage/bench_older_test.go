package storage

import (
	"runtime"
	"testing"
)

// BenchmarkIndexBytesPerKeyOlder reports what the index costs per key beyond the key
// when every key has one older version (Retention.KeepVersions 2, each of n random keys
// written twice): the price of the older-versions side table (tree.older), which single-
// version keys do not pay (BenchmarkIndexBytesPerKey).
func BenchmarkIndexBytesPerKeyOlder(b *testing.B) {
	const n = 500_000
	for i := 0; i < b.N; i++ {
		db := benchOpen(b, Options{CacheBytes: -1, Retention: Retention{KeepVersions: 2}})
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		val := make([]byte, 100)
		key := make([]byte, 0, 16)
		for round := uint64(0); round < 2; round++ {
			for i := uint64(0); i < n; i++ {
				key = benchKey(key, (i*0x9E3779B97F4A7C15)&(1<<48-1))
				if _, err := db.Append(Record{Key: key, Value: val, Version: round*n + i + 1}); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := db.Sync(db.LastPos()); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n-16, "index-bytes/key")
		runtime.KeepAlive(db)
		db.Close()
	}
}
