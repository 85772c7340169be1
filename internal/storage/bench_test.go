package storage

import (
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Benchmarks run on the real file system (b.TempDir) with real fsync.
//
//	go test -run '^$' -bench . -benchmem ./internal/storage
//
// Keys are 16 bytes, values 100 bytes unless the name says otherwise.

func benchKey(dst []byte, i uint64) []byte {
	// "key-" + 12 hex digits, without fmt (the benchmark must not measure Sprintf).
	dst = append(dst[:0], "key-"...)
	const hex = "0123456789abcdef"
	for s := 44; s >= 0; s -= 4 {
		dst = append(dst, hex[(i>>uint(s))&0xf])
	}
	return dst
}

func benchOpen(b *testing.B, o Options) *DB {
	b.Helper()
	if len(o.Devices) == 0 {
		o.Devices = []Device{{Dir: b.TempDir()}}
	}
	db, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	return db
}

// BenchmarkAppendSync: each writer appends one record and waits for it to be durable
// (Append then Sync), as a `sync`-durability SET does. Concurrent writers share fsyncs.
func BenchmarkAppendSync(b *testing.B) {
	for _, vsize := range []int{100, 1024} {
		for _, writers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("value=%d/writers=%d", vsize, writers), func(b *testing.B) {
				db := benchOpen(b, Options{})
				defer db.Close()
				val := make([]byte, vsize)
				var next atomic.Uint64
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.SetBytes(int64(vsize + 16))
				b.ResetTimer()
				for w := 0; w < writers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := make([]byte, 0, 16)
						for {
							i := next.Add(1)
							if i > uint64(b.N) {
								return
							}
							key = benchKey(key, i)
							p, err := db.Append(Record{Key: key, Value: val, Version: i})
							if err != nil {
								b.Error(err)
								return
							}
							if _, err := db.Sync(p); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				st := db.Stats()
				b.ReportMetric(float64(st.Syncs)/float64(b.N), "fsyncs/op")
			})
		}
	}
}

// BenchmarkAppend: the apply loop's path: one goroutine appending, no fsync.
func BenchmarkAppend(b *testing.B) {
	db := benchOpen(b, Options{})
	defer db.Close()
	val := make([]byte, 100)
	key := make([]byte, 0, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key = benchKey(key, uint64(i%100000))
		if _, err := db.Append(Record{Key: key, Value: val, Version: uint64(i + 1)}); err != nil {
			b.Fatal(err)
		}
	}
}

var (
	loadedOnce sync.Once
	loadedDir  string
	loadedN    = 200_000
)

// loaded returns a directory holding loadedN keys (100-byte values), built once.
func loaded(b *testing.B) string {
	loadedOnce.Do(func() {
		dir, err := mkTemp()
		if err != nil {
			b.Fatal(err)
		}
		db, err := Open(Options{Devices: []Device{{Dir: dir}}})
		if err != nil {
			b.Fatal(err)
		}
		val := make([]byte, 100)
		key := make([]byte, 0, 16)
		for i := 0; i < loadedN; i++ {
			key = benchKey(key, uint64(i))
			if _, err := db.Append(Record{Key: key, Value: val, Version: uint64(i + 1)}); err != nil {
				b.Fatal(err)
			}
		}
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		loadedDir = dir
	})
	return loadedDir
}

func BenchmarkGet(b *testing.B) {
	dir := loaded(b)
	// hot-shared is hot through GetShared: the same lookups without the value copy.
	// one-key-shared reads a single key from every goroutine (redis-benchmark's default
	// keyspace): the fixed cost of a get, and any cache line all readers write.
	for _, mode := range []string{"hot", "hot-shared", "one-key-shared", "uniform"} {
		b.Run(mode, func(b *testing.B) {
			db, err := Open(Options{Devices: []Device{{Dir: dir}}})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewSource(time.Now().UnixNano()))
				key := make([]byte, 0, 16)
				for pb.Next() {
					var i int
					if mode == "one-key-shared" {
						i = 7
					} else if mode != "uniform" {
						i = rng.Intn(1000) // a working set that fits the cache
					} else {
						i = rng.Intn(loadedN)
					}
					key = benchKey(key, uint64(i))
					get := db.Get
					if mode == "hot-shared" || mode == "one-key-shared" {
						get = db.GetShared
					}
					if _, err := get(key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func BenchmarkScan100(b *testing.B) {
	dir := loaded(b)
	db, err := Open(Options{Devices: []Device{{Dir: dir}}})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	rng := rand.New(rand.NewSource(1))
	key := make([]byte, 0, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key = benchKey(key, uint64(rng.Intn(loadedN-100)))
		n := 0
		if err := db.Scan(key, nil, 0, 100, func([]byte, Value) bool { n++; return true }); err != nil || n != 100 {
			b.Fatalf("scan: %d keys, %v", n, err)
		}
	}
}

// BenchmarkReopen1M: open an engine holding 1M keys, with and without a hint file.
func BenchmarkReopen1M(b *testing.B) {
	if testing.Short() {
		b.Skip("builds a 1M-key engine")
	}
	dir := b.TempDir()
	const n = 1_000_000
	db, err := Open(Options{Devices: []Device{{Dir: dir}}, CacheBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 100)
	key := make([]byte, 0, 16)
	for i := 0; i < n; i++ {
		key = benchKey(key, uint64(i))
		if _, err := db.Append(Record{Key: key, Value: val, Version: uint64(i + 1)}); err != nil {
			b.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	reopen := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			db, err := Open(Options{Devices: []Device{{Dir: dir}}, CacheBytes: -1})
			if err != nil {
				b.Fatal(err)
			}
			if got := db.Stats().Keys; got != n {
				b.Fatalf("reopened with %d keys", got)
			}
			db.Close()
		}
	}
	b.Run("replay", reopen)
	db, _ = Open(Options{Devices: []Device{{Dir: dir}}, CacheBytes: -1})
	if err := db.Checkpoint(); err != nil {
		b.Fatal(err)
	}
	db.Close()
	b.Run("hint", reopen)
}

// BenchmarkIndexBytesPerKey reports the heap the index costs per key beyond the key
// itself (one version per key), for keys arriving in order and in random order, and
// the log bytes per record; "/ttl" gives every record the 9 bytes of meta a key with
// an expiry carries (kv.EncodeMeta), which the index keeps as a flag bit only.
func BenchmarkIndexBytesPerKey(b *testing.B) {
	const n = 1_000_000
	for _, variant := range []string{"sequential", "random", "sequential/ttl", "random/ttl"} {
		order, ttl := strings.CutSuffix(variant, "/ttl")
		var meta []byte
		if ttl {
			meta = []byte{0, 1, 2, 3, 4, 5, 6, 7, 8}
		}
		b.Run(variant, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				db := benchOpen(b, Options{CacheBytes: -1})
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				val := make([]byte, 100)
				key := make([]byte, 0, 16)
				for i := uint64(0); i < n; i++ {
					k := i
					if order == "random" {
						k = (i * 0x9E3779B97F4A7C15) & (1<<48 - 1) // a bijection on 48 bits
					}
					key = benchKey(key, k)
					if _, err := db.Append(Record{Key: key, Value: val, Meta: meta, Version: i + 1}); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := db.Sync(db.LastPos()); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey := float64(after.HeapAlloc-before.HeapAlloc)/n - 16
				b.ReportMetric(perKey, "index-bytes/key")
				b.ReportMetric(float64(db.LastPos())/n, "log-bytes/key")
				runtime.KeepAlive(db)
				db.Close()
			}
		})
	}
}

func mkTemp() (string, error) { return os.MkdirTemp("", "kefir-storage-bench-") }
