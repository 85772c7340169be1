package storage

import (
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// BenchmarkScanThroughput measures range scans of 1000-byte values in MB/s of keys and
// values returned, YCSB-E's shape (a range of 1..100 keys from a random start, 50 on
// average; here a fixed 50), over a log of scanKeys records (about 64 MB, twice the
// default value cache, so a scan cannot be served from the cache alone). The records
// are inserted in key order ("ordered": a range is adjacent in the log) or in random
// order ("random": every record of a range is somewhere else). "seqread" is the limit
// of the same machine: a plain sequential read of the segment files through a 256 KiB
// buffer, as MB/s of log. cpu-µs/scan is the process's user+system CPU per scan (from
// getrusage), the figure a shared machine distorts least. Every segment, the active
// one too, is read through its mapping: see readBatch, mapActive, and
// docs/design/scans.md for the figures.
//
//	go test -run '^$' -bench ScanThroughput -benchtime 2000x ./internal/storage
//
// Loading the two logs takes minutes on a busy machine; with KEFIR_SCAN_BENCH_DIR set
// they are kept there and reused by later runs (of any binary: an A/B alternates two
// test binaries over the same logs). A kept log is opened, so it must be one an older
// engine can read.
func BenchmarkScanThroughput(b *testing.B) {
	dirs := map[string]string{}
	keep := os.Getenv("KEFIR_SCAN_BENCH_DIR")
	for _, order := range []string{"ordered", "random"} {
		if keep == "" {
			dirs[order] = b.TempDir()
			scanLoad(b, dirs[order], order)
			continue
		}
		dirs[order] = filepath.Join(keep, order)
		if _, err := os.Stat(filepath.Join(dirs[order], "loaded")); err == nil {
			continue
		}
		if err := os.RemoveAll(dirs[order]); err != nil {
			b.Fatal(err)
		}
		if err := os.MkdirAll(dirs[order], 0o755); err != nil {
			b.Fatal(err)
		}
		scanLoad(b, dirs[order], order)
		if err := os.WriteFile(filepath.Join(dirs[order], "loaded"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	// "into" reads the values into one reused buffer (ScanInto), as the server's
	// connections do, so the figure is the engine's work without the values' garbage.
	for _, c := range []struct{ order, mode string }{{"ordered", ""}, {"random", ""}, {"ordered", "into"}, {"random", "into"}} {
		order := c.order
		dir := dirs[order]
		name := "order=" + order
		if c.mode != "" {
			name += "/" + c.mode
		}
		b.Run(name, func(b *testing.B) {
			db, err := Open(Options{Devices: []Device{{Dir: dir}}})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			rng := rand.New(rand.NewSource(1))
			key := make([]byte, 0, 16)
			var buf *[]byte
			if c.mode == "into" {
				buf = new([]byte)
			}
			b.SetBytes(int64(scanLen * (16 + scanValue)))
			b.ReportAllocs()
			cpu0 := cpuMicros()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key = benchKey(key, uint64(rng.Intn(scanKeys-scanLen)))
				n := 0
				if buf != nil {
					*buf = (*buf)[:0]
				}
				err := db.ScanInto(key, nil, 0, scanLen, buf, func(_ []byte, v Value) bool {
					n += len(v.Data)
					return true
				})
				if err != nil || n != scanLen*scanValue {
					b.Fatalf("scan: %d bytes, %v", n, err)
				}
			}
			b.StopTimer()
			b.ReportMetric((cpuMicros()-cpu0)/float64(b.N), "cpu-µs/scan")
		})
	}
	b.Run("seqread", func(b *testing.B) {
		segs, err := filepath.Glob(filepath.Join(dirs["ordered"], "*.log"))
		if err != nil || len(segs) == 0 {
			b.Fatalf("segments: %v %v", segs, err)
		}
		var total int64
		for _, s := range segs {
			fi, err := os.Stat(s)
			if err != nil {
				b.Fatal(err)
			}
			total += fi.Size()
		}
		buf := make([]byte, 256<<10)
		b.SetBytes(total)
		cpu0 := cpuMicros()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for _, s := range segs {
				f, err := os.Open(s)
				if err != nil {
					b.Fatal(err)
				}
				for {
					_, err := f.Read(buf)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				f.Close()
			}
		}
		b.StopTimer()
		// Per scan-equivalent: the CPU to read scanLen records' worth of log.
		perByte := (cpuMicros() - cpu0) / float64(b.N) / float64(total)
		b.ReportMetric(perByte*float64(scanLen*(16+scanValue)), "cpu-µs/scan")
	})
}

const (
	scanKeys  = 64_000
	scanValue = 1000
	scanLen   = 50
)

// scanLoad fills dir with scanKeys records of scanValue bytes, appended in key order or
// in a random order.
func scanLoad(b *testing.B, dir, order string) {
	db, err := Open(Options{Devices: []Device{{Dir: dir}}})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]int, scanKeys)
	for i := range ids {
		ids[i] = i
	}
	if order == "random" {
		rand.New(rand.NewSource(2)).Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	}
	val := make([]byte, scanValue)
	key := make([]byte, 0, 16)
	for n, i := range ids {
		key = benchKey(key, uint64(i))
		if _, err := db.Append(Record{Key: key, Value: val, Version: uint64(n + 1)}); err != nil {
			b.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
}

// cpuMicros is the process's user plus system CPU time so far, in µs.
func cpuMicros() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(fmt.Sprintf("getrusage: %v", err))
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}
