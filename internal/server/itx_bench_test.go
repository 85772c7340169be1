package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	kefir "github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// Interactive transactions' costs (docs/design/transactions.md, "Figures").
//
// A read-only transaction of 4 GETs against 4 plain GETs, each as one
// pipeline (one round trip): BEGIN, 4 KEFIR.TX GET, COMMIT against 4 GET.
// Handles are numbered per connection from 1, so the pipeline names the
// next one.
func benchTxReads(b *testing.B, tx bool) {
	s := startServer(b, func(c *Config) { c.Durability = level.Async; c.HTTPAddr = "" })
	c := dial(b, s)
	for i := range 4 {
		c.do("SET", fmt.Sprint("k", i), "value")
	}
	b.ReportAllocs()
	b.ResetTimer()
	var buf []byte
	for i := 0; i < b.N; i++ {
		buf = buf[:0]
		n := 4
		if tx {
			h := strconv.Itoa(i + 1)
			buf = appendCmd(buf, "KEFIR.TX", "BEGIN")
			for k := range 4 {
				buf = appendCmd(buf, "KEFIR.TX", "GET", h, fmt.Sprint("k", k))
			}
			buf = appendCmd(buf, "KEFIR.TX", "COMMIT", h)
			n = 6
		} else {
			for k := range 4 {
				buf = appendCmd(buf, "GET", fmt.Sprint("k", k))
			}
		}
		if _, err := c.nc.Write(buf); err != nil {
			b.Fatal(err)
		}
		for range n {
			if v, err := c.rd.ReadValue(); err != nil || v.Kind == resp.Error {
				b.Fatalf("reply %v %v", v, err)
			}
		}
	}
}

func BenchmarkTxReadOnly4Pipelined(b *testing.B) { benchTxReads(b, true) }
func BenchmarkGet4Pipelined(b *testing.B)        { benchTxReads(b, false) }

// The same through the Go client, call by call: a read-only Txn of 4 Gets
// (BEGIN, 4 GETs, PREPARE: 6 round trips) against 4 Gets.
func benchTxReadsClient(b *testing.B, tx bool) {
	s := startServer(b, func(c *Config) { c.Durability = level.Async; c.HTTPAddr = "" })
	benchTxReadsVia(b, s, tx)
}

func BenchmarkTxReadOnly4Client(b *testing.B) { benchTxReadsClient(b, true) }
func BenchmarkGet4Client(b *testing.B)        { benchTxReadsClient(b, false) }

// The same against a replica group's leader, where a command that is not
// served on the event loop (readInline, txInline) costs a hand-off to a
// worker goroutine (on Linux, where the event loop is the default I/O
// model); on a single node every command above runs on the loop.
func benchTxReadsGroup(b *testing.B, tx bool) {
	g := startGroup(b)
	benchTxReadsVia(b, g.nodes[g.leader(b)], tx)
}

func BenchmarkTxReadOnly4Group(b *testing.B) { benchTxReadsGroup(b, true) }
func BenchmarkGet4Group(b *testing.B)        { benchTxReadsGroup(b, false) }

// The group pair from 16 goroutines sharing one client, as txbench vs's
// read-only row runs it (docs/design/transactions.md): CPU-bound on a small
// machine, where the commands' server-side cost shows.
func benchTxReadsGroup16(b *testing.B, tx bool) {
	g := startGroup(b)
	benchTxReadsVia(b, g.nodes[g.leader(b)], tx, 16)
}

func BenchmarkTxReadOnly4Group16(b *testing.B) { benchTxReadsGroup16(b, true) }
func BenchmarkGet4Group16(b *testing.B)        { benchTxReadsGroup16(b, false) }

// The same with the client txbench vs uses (WithPoolSize(16), one
// connection per goroutine for the plain Gets), whose transactions then
// spread over up to 16 transaction connections too.
func benchTxReadsGroup16Pool16(b *testing.B, tx bool) {
	g := startGroup(b)
	benchTxReadsVia(b, g.nodes[g.leader(b)], tx, 16, 16)
}

func BenchmarkTxReadOnly4Group16Pool16(b *testing.B) { benchTxReadsGroup16Pool16(b, true) }
func BenchmarkGet4Group16Pool16(b *testing.B)        { benchTxReadsGroup16Pool16(b, false) }

// benchTxReadsVia runs b.N read-only transactions of 4 Gets (tx) or 4 Gets
// from `clients` goroutines (none: one, the calling one) sharing one client,
// whose pool size is clients[1] (if given).
func benchTxReadsVia(b *testing.B, s *Server, tx bool, clients ...int) {
	ctx := context.Background()
	var opts []kefir.Option
	if len(clients) > 1 {
		opts = append(opts, kefir.WithPoolSize(clients[1]))
	}
	c, err := kefir.Dial(ctx, []string{s.ClientAddr().String()}, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		if err := c.Put(ctx, keys[i], []byte("value")); err != nil {
			b.Fatal(err)
		}
	}
	one := func() error {
		if tx {
			return c.Txn(ctx, func(tx *kefir.Tx) error {
				for _, k := range keys {
					if _, err := tx.Get(ctx, k); err != nil {
						return err
					}
				}
				return nil
			}, nil)
		}
		for _, k := range keys {
			if _, err := c.Get(ctx, k); err != nil {
				return err
			}
		}
		return nil
	}
	// The process's CPU (client and servers alike) per unit: on a shared
	// box the rate moves with others' load, the CPU a unit costs less.
	cpu0 := processCPU(b)
	defer func() {
		if b.N > 0 && !b.Failed() {
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		}
	}()
	b.ResetTimer()
	if len(clients) == 0 {
		for i := 0; i < b.N; i++ {
			if err := one(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errs := make(chan error, clients[0])
	for range clients[0] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := one(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// processCPU is the user and system CPU time this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTxContention sweeps the hot set: 8 clients each run
// read-modify-write transactions of 2 keys drawn from hot keys (one
// attempt each: an abort is not retried), SERIALIZABLE and SI. It reports
// committed transactions per second and the share that aborted.
func BenchmarkTxContention(b *testing.B) {
	for _, iso := range []kefir.Isolation{kefir.Serializable, kefir.SnapshotIsolation} {
		for _, hot := range []int{2, 4, 16, 64, 1024} {
			name := map[kefir.Isolation]string{kefir.Serializable: "ser", kefir.SnapshotIsolation: "si"}[iso]
			b.Run(fmt.Sprintf("%s/hot=%d", name, hot), func(b *testing.B) { benchContention(b, iso, hot) })
		}
	}
}

func benchContention(b *testing.B, iso kefir.Isolation, hot int) {
	s := startServer(b, func(c *Config) { c.HTTPAddr = "" })
	ctx := context.Background()
	c, err := kefir.Dial(ctx, []string{s.ClientAddr().String()}, kefir.WithPoolSize(4))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const clients = 8
	var committed, aborted atomic.Int64
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for next.Add(1) <= int64(b.N) {
				k1, k2 := fmt.Sprint("h", rng.IntN(hot)), fmt.Sprint("h", rng.IntN(hot))
				err := c.Txn(ctx, func(tx *kefir.Tx) error {
					for _, k := range []string{k1, k2} {
						v, err := tx.Get(ctx, k)
						if err != nil && !errors.Is(err, kefir.ErrNotFound) {
							return err
						}
						n, _ := strconv.Atoi(string(v))
						if err := tx.Set(ctx, k, []byte(strconv.Itoa(n+1))); err != nil {
							return err
						}
					}
					return nil
				}, &kefir.TxOptions{Isolation: iso, MaxAttempts: 1})
				switch {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, kefir.ErrTxAborted):
					aborted.Add(1)
				default:
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(committed.Load())/el, "commits/s")
	b.ReportMetric(100*float64(aborted.Load())/float64(max(1, committed.Load()+aborted.Load())), "abort%")
}

// BenchmarkTxBitContention is Isotope's Fig. 4.5/4.6 through the front
// door: 8 clients each flip one random bit of one of hot 64-byte keys in a
// SERIALIZABLE c.Txn (one attempt: an abort is not retried), fine-grained
// (GETBIT and SETBIT: the transaction's access is that bit) against key
// grain (GET the value, SET it with the bit flipped: the same change as a
// whole read and write). Both grains of each hot-set size run side by side
// in one run; it reports committed transactions per second (the goodput:
// every commit is one useful flip), attempts per second and the share that
// committed.
//
//	go test -run '^$' -bench TxBitContention -benchtime 2000x ./internal/server/
func BenchmarkTxBitContention(b *testing.B) {
	for _, hot := range []int{1, 4, 16, 64} {
		for _, fine := range []bool{true, false} {
			b.Run(fmt.Sprintf("hot=%d/%s", hot, map[bool]string{true: "fine", false: "key"}[fine]), func(b *testing.B) {
				benchBitContention(b, hot, fine)
			})
		}
	}
}

func benchBitContention(b *testing.B, hot int, fine bool) {
	s := startServer(b, func(c *Config) { c.HTTPAddr = "" })
	ctx := context.Background()
	c, err := kefir.Dial(ctx, []string{s.ClientAddr().String()}, kefir.WithPoolSize(4))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for k := range hot {
		if err := c.Put(ctx, fmt.Sprint("b", k), make([]byte, 64)); err != nil {
			b.Fatal(err)
		}
	}
	const clients = 8
	var committed, aborted atomic.Int64
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for next.Add(1) <= int64(b.N) {
				key, bit := fmt.Sprint("b", rng.IntN(hot)), int64(rng.IntN(512))
				err := c.Txn(ctx, func(tx *kefir.Tx) error {
					if fine {
						v, err := tx.GetBit(ctx, key, bit)
						if err != nil {
							return err
						}
						_, err = tx.SetBit(ctx, key, bit, 1-v)
						return err
					}
					v, err := tx.Get(ctx, key)
					if err != nil {
						return err
					}
					v = bytes.Clone(v)
					v[bit/8] ^= 0x80 >> (bit % 8)
					return tx.Set(ctx, key, v)
				}, &kefir.TxOptions{Isolation: kefir.Serializable, MaxAttempts: 1})
				switch {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, kefir.ErrTxAborted):
					aborted.Add(1)
				default:
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	all := committed.Load() + aborted.Load()
	b.ReportMetric(float64(committed.Load())/el, "commits/s")
	b.ReportMetric(float64(all)/el, "attempts/s")
	b.ReportMetric(100*float64(committed.Load())/float64(max(1, all)), "commit%")
}
