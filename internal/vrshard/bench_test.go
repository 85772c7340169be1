package vrshard

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/kv/kvtest"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// Benchmarks: 3 replicas in this process on loopback TCP, real files (fsync)
// in b.TempDir(), closed-loop writers calling the leader's Write (no RESP).
// Keys 16 bytes, values 128 bytes. Reported besides ns/op
// (per write, all writers together):
//
//	writes/s       throughput
//	p50-us, p99-us per-write latency
//	ops/fsync      leader: writes per replication-log fsync (batching)
//	f-ops/fsync    the same at a follower
//
// Run: go test ./internal/vrshard/ -run '^$' -bench Replicated -benchmem -benchtime 3s -cpu 4
//
// -cpu 4 on a two-core box: the three replicas share one Go runtime, and at
// GOMAXPROCS=2 two replicas' fdatasyncs in flight hold both Ps (a goroutine
// in a blocking system call keeps its P until sysmon takes it back), so
// nothing else runs until one ends: a cad write at one writer then measures
// like a sync one (p50 ~530 µs against ~55 µs at -cpu 4; docs/design/cad.md §8).
// Separate processes, one per replica, do not have this problem.
//
// The Sync, CAD and Async variants differ only in the write's durability
// (plain SETs: cad is acknowledged once a majority holds the write in
// memory, async at the leader's append; docs/design/cad.md).
func BenchmarkReplicatedSyncWrite(b *testing.B)  { benchReplicatedWrite(b, level.Sync) }
func BenchmarkReplicatedCADWrite(b *testing.B)   { benchReplicatedWrite(b, level.CAD) }
func BenchmarkReplicatedAsyncWrite(b *testing.B) { benchReplicatedWrite(b, level.Async) }

func benchReplicatedWrite(b *testing.B, d level.Durability) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			c := newCluster(b, 3, nil)
			l := c.leader(10 * time.Second)
			leader := c.reps[l]
			follower := c.reps[(l+1)%3]
			val := make([]byte, 128)
			for i := range val {
				val[i] = 'a' + byte(i%26)
			}
			var failed atomic.Int64
			var lastErr atomic.Value
			write := func(w int, seq uint64) time.Duration {
				key := []byte(fmt.Sprintf("key-%05d-%06d", w, seq%100000))[:16]
				t0 := time.Now()
				_, err := leader.Write(context.Background(), kv.Op{Kind: kv.KindSet, Key: key, Value: val}, d, shard.ReqID{Client: uint64(w + 1), Seq: seq})
				if err != nil {
					// A view change on a loaded machine; counted, judged below.
					failed.Add(1)
					lastErr.Store(err.Error())
				}
				return time.Since(t0)
			}
			for i := range 100 { // warm up connections
				write(0, uint64(i+1))
			}
			ls0, fs0 := leader.Stats(), follower.Stats()
			lt0, ft0 := leader.Transport().Stats().Total, follower.Transport().Stats().Total
			var next atomic.Int64
			lats := make([][]time.Duration, writers)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					seq := uint64(1000)
					for next.Add(1) <= int64(b.N) {
						seq++
						lats[w] = append(lats[w], write(w, seq))
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > int64(b.N)/100 {
				b.Fatalf("%d of %d writes failed, last: %v", n, b.N, lastErr.Load())
			}
			b.ReportMetric(float64(failed.Load()), "failed")
			ls, fs := leader.Stats(), follower.Stats()
			lt, ft := leader.Transport().Stats().Total, follower.Transport().Stats().Total
			all := slices.Concat(lats...)
			slices.Sort(all)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(float64(ls.Applied-ls0.Applied)/float64(max(1, ls.Fsyncs-ls0.Fsyncs)), "ops/fsync")
			b.ReportMetric(float64(fs.Applied-fs0.Applied)/float64(max(1, fs.Fsyncs-fs0.Fsyncs)), "f-ops/fsync")
			// What a write costs each side in peer messages and socket
			// syscalls (docs/design/write-path.md, "Counted per write").
			perW := func(now, then uint64) float64 { return float64(now-then) / float64(b.N) }
			b.ReportMetric(perW(lt.Sent, lt0.Sent), "l-sent/w")
			b.ReportMetric(perW(lt.Batches, lt0.Batches), "l-writes/w")
			b.ReportMetric(perW(lt.Received, lt0.Received), "l-recv/w")
			b.ReportMetric(perW(lt.ReadBatches, lt0.ReadBatches), "l-reads/w")
			b.ReportMetric(perW(ft.Sent, ft0.Sent), "f-sent/w")
			b.ReportMetric(perW(ft.Batches, ft0.Batches), "f-writes/w")
			b.ReportMetric(perW(ft.Received, ft0.Received), "f-recv/w")
			b.ReportMetric(perW(ft.ReadBatches, ft0.ReadBatches), "f-reads/w")
			if tl := traceTimeline(leader, c.reps[(l+1)%3], c.reps[(l+2)%3]); tl != "" {
				// -tags cadtrace and KEFIR_CADTRACE=1: the write path's
				// hand-offs (docs/design/write-path.md).
				b.Logf("timeline of %d writes at %d writers:\n%s", b.N, writers, tl)
			}
		})
	}
}

// Linearizable reads at the leader (lease path), 64 closed-loop readers.
func BenchmarkReplicatedLinearizableRead(b *testing.B) {
	c := newCluster(b, 3, nil)
	l := c.leader(10 * time.Second)
	leader := c.reps[l]
	if _, err := leader.Write(context.Background(), set("0123456789abcdef", "v"), level.Sync, shard.ReqID{}); err != nil {
		b.Fatal(err)
	}
	s0 := leader.Stats()
	op := get("0123456789abcdef")
	b.ResetTimer()
	b.SetParallelism(64 / max(1, testingProcs()))
	// On a loaded shared machine a view change can happen mid-run; failed
	// reads are counted (and reported), not fatal, unless they dominate.
	var failed atomic.Int64
	var lastErr atomic.Value
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := leader.Read(context.Background(), op, level.ConsLinearizable, shard.Session{}); err != nil {
				failed.Add(1)
				lastErr.Store(err.Error())
			}
		}
	})
	b.StopTimer()
	if n := failed.Load(); n > int64(b.N)/100 {
		b.Fatalf("%d of %d reads failed, last: %v", n, b.N, lastErr.Load())
	}
	b.ReportMetric(float64(failed.Load()), "failed")
	s := leader.Stats()
	lease, index := s.LeaseReads-s0.LeaseReads, s.IndexReads-s0.IndexReads
	b.ReportMetric(float64(lease)/float64(max(1, lease+index)), "lease-frac")
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }

// BenchmarkApplierApply is the applier evaluating batches of 16 committed
// writes (SET, INCRBY, GETSET, MSET, DEL over 1000 keys, half with client
// ids) into a real engine: the state machine on the replicated write path.
func BenchmarkApplierApply(b *testing.B) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: b.TempDir()}}})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	a := newApplier(db)
	keys := kvtest.BenchKeys(1000)
	val := make([]byte, 100)
	var v, seq uint64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.begin()
		for j := 0; j < 16; j++ {
			op := kvtest.MixedOp(keys, val, i, j)
			v++
			var client uint64
			if j%2 == 0 {
				seq++
				client = uint64(j + 1)
			}
			if _, opErr, err := a.applyOp(&op, v, 1, client, seq); err != nil || opErr != nil {
				b.Fatal(err, opErr)
			}
		}
		if err := a.flush(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChainSyncWrite: a chain of three members on the production host
// in this process (loopback TCP, real files, the standalone master), three
// log members (DDD) or two over a memory tail (DDM), closed-loop writers at
// the head. Reported besides the
// throughput, summed over the three members per write: fsyncs/op (the
// log's) and log-writes/op (the Readies' log writes, a hard state written
// on its own included) — what a member's eager commit-point save costs
// (chainCore.Ready; docs/design/chain.md, "The loss table on the host").
// KEFIR_BENCH_GAP (a duration) makes each writer pause that long before
// each write: a chain that idles between writes, where a member's commit
// point is written on its own (docs/design/chain.md, "No idle commit-point
// fsync").
//
// Run: go test ./internal/vrshard/ -run '^$' -bench ChainSyncWrite -benchtime 2000x -cpu 4
// (paused: KEFIR_BENCH_GAP=7ms ... -bench 'ChainSyncWrite/.*/writers=1$' -benchtime 300x)
func BenchmarkChainSyncWrite(b *testing.B) {
	var gap time.Duration
	if v := os.Getenv("KEFIR_BENCH_GAP"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			b.Fatalf("KEFIR_BENCH_GAP=%q: want a duration", v)
		}
		gap = d
	}
	for _, bc := range []struct {
		name    string
		stores  [3]ChainStore
		writers int
	}{
		{"DDD", [3]ChainStore{ChainLog, ChainLog, ChainLog}, 1},
		{"DDD", [3]ChainStore{ChainLog, ChainLog, ChainLog}, 16},
		{"DDM", [3]ChainStore{ChainLog, ChainLog, ChainMemory}, 1},
		{"DDM", [3]ChainStore{ChainLog, ChainLog, ChainMemory}, 16},
	} {
		writers := bc.writers
		b.Run(fmt.Sprintf("%s/writers=%d", bc.name, writers), func(b *testing.B) {
			g := newChainGroupTuned(b, 0, func(i int, o *Options) {
				co := *o.Chain
				co.Store = bc.stores[i]
				o.Chain = &co
			})
			val := make([]byte, 128)
			for i := range val {
				val[i] = 'a' + byte(i%26)
			}
			write := func(w int, seq uint64) error {
				key := fmt.Sprintf("key-%05d-%06d", w, seq%100000)
				_, err := g.tryWrite(0, kv.Op{Kind: kv.KindSet, Key: []byte(key), Value: val}, shard.ReqID{Client: uint64(w + 1), Seq: seq})
				return err
			}
			for i := range 100 { // warm up: the lease, the connections
				if err := write(0, uint64(i+1)); err != nil {
					b.Fatal(err)
				}
			}
			counts := func() (fsyncs, writes uint64) {
				for _, r := range g.reps {
					fsyncs += r.st.fsyncs.Load()
					writes += r.st.logWrites.Load()
				}
				return fsyncs, writes
			}
			f0, w0 := counts()
			var next atomic.Int64
			var failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					seq := uint64(1000)
					for next.Add(1) <= int64(b.N) {
						seq++
						time.Sleep(gap)
						if write(w, seq) != nil {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d writes failed", n, b.N)
			}
			f1, w1 := counts()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
			b.ReportMetric(float64(f1-f0)/float64(b.N), "fsyncs/op")
			b.ReportMetric(float64(w1-w0)/float64(b.N), "log-writes/op")
		})
	}
}
