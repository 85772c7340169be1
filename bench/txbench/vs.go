package main

// `txbench vs`: the read-modify-write transaction side by side on Kefir,
// etcd and Redis (issue 29, "Performance"; docs/design/transactions.md,
// "Benchmarks"). Each transaction draws 2 distinct keys from a hot set of H
// keys, reads both and writes both (each value plus one); N clients run it in
// closed loops for a fixed duration, retrying an aborted attempt after a
// jittered backoff (1 ms, doubling to 100 ms: the Go client's own schedule,
// used for every system). Systems alternate cell by cell within a round, and
// each cell's figures are the median over the rounds.
//
//   kefir-txn    KEFIR.TX through the Go client's c.Txn, SERIALIZABLE: BEGIN+MGET,
//                SET+SET+PREPARE (one write each), KEFIR.TXAPPLY — three round trips
//                (the server's default durability)
//   kefir-watch  go-redis WATCH k1 k2; MGET; MULTI SET SET EXEC, at the leader
//   etcd         a read Txn of two Gets, then Txn(If mod_revision(k1)=r1 &&
//                mod_revision(k2)=r2, Then Put k1, Put k2)
//   redis        the kefir-watch loop against one redis-server
//
// The read-only row: a c.Txn of 4 Gets against 4 c.Gets on the Kefir group.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/bench/stats"
	"github.com/kefirdb/kefir/client"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// system is one column of the comparison.
type system struct {
	name    string
	pids    string   // comma-separated: every process of the system
	metrics []string // /metrics URLs whose fsync counter is summed
	fsyncs  string   // the counter's name
	// txn runs one attempt over keys k1, k2: committed reports whether it
	// committed (false: a conflict, to be retried).
	txn func(ctx context.Context, w int, k1, k2 string) (committed bool, err error)
	// kefir's c.Txn retries by itself; attempts counts its runs of fn.
	selfRetry bool
	attempts  atomic.Int64
}

type cell struct {
	commits                                       int64 // committed transactions
	rate, abort, p50, p99, cpu, clientCPU, fsyncs float64
}

func vsMain(args []string) {
	fs := flag.NewFlagSet("vs", flag.ExitOnError)
	kefirAddrs := fs.String("kefir", "", "Kefir group's client addresses (comma-separated)")
	kefirPids := fs.String("kefir-pids", "", "Kefir's process ids (comma-separated)")
	kefirMetrics := fs.String("kefir-metrics", "", "Kefir's /metrics URLs (comma-separated)")
	etcdAddrs := fs.String("etcd", "", "etcd client addresses (comma-separated)")
	etcdPids := fs.String("etcd-pids", "", "etcd's process ids")
	redisAddr := fs.String("redis", "", "redis-server address")
	redisPid := fs.String("redis-pid", "", "redis-server's process id")
	hots := fs.String("hot", "2,8,64,1024", "hot set sizes H")
	clients := fs.Int("c", 16, "clients")
	dur := fs.Duration("d", 5*time.Second, "duration of a cell")
	rounds := fs.Int("r", 3, "rounds")
	pool := fs.Int("pool", 0, "the Kefir client's pool size (0: -c): its plain calls' connections, and the transaction connections it keeps")
	only := fs.String("systems", "kefir-txn,kefir-watch,etcd,redis", "systems to run (none: only the read-only row, given -kefir)")
	_ = fs.Parse(args)

	ctx := context.Background()
	var hs []int
	for _, h := range strings.Split(*hots, ",") {
		n, err := strconv.Atoi(h)
		if err != nil || n < 2 {
			fatalf("-hot: %q is not a hot set size of at least 2", h)
		}
		hs = append(hs, n)
	}
	maxH := slices.Max(hs)
	want := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		want[s] = true
	}

	var systems []*system
	var kc *client.Client
	if *kefirAddrs != "" {
		addrs := strings.Split(*kefirAddrs, ",")
		var err error
		ps := *clients
		if *pool > 0 {
			ps = *pool
		}
		kc, err = client.Dial(ctx, addrs, client.WithPoolSize(ps), client.WithRetryUnavailable(10*time.Second))
		if err != nil {
			fatalf("kefir: %v", err)
		}
		defer kc.Close()
		var kv []client.KV
		for i := range maxH {
			kv = append(kv, client.KV{Key: hotKey(i), Value: []byte("0")})
		}
		if err := kc.MultiPut(ctx, kv, client.WithDurability(client.Sync)); err != nil {
			fatalf("kefir: preload: %v", err)
		}
		metrics := splitNonEmpty(*kefirMetrics)
		if want["kefir-txn"] {
			systems = append(systems, kefirTxnSystem(kc, *kefirPids, metrics))
		}
		if want["kefir-watch"] {
			leader := kefirLeader(ctx, addrs)
			s := &system{name: "kefir-watch", pids: *kefirPids, metrics: metrics, fsyncs: "kefir_vr_log_fsyncs_total"}
			s.txn = watchTxn(redis.NewClient(&redis.Options{Addr: leader, PoolSize: *clients}))
			systems = append(systems, s)
		}
	}
	if *etcdAddrs != "" && want["etcd"] {
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*etcdAddrs, ","), DialTimeout: 10 * time.Second})
		if err != nil {
			fatalf("etcd: %v", err)
		}
		defer cli.Close()
		for i := range maxH {
			if _, err := cli.Put(ctx, hotKey(i), "0"); err != nil {
				fatalf("etcd: preload: %v", err)
			}
		}
		var metrics []string
		for _, a := range strings.Split(*etcdAddrs, ",") {
			metrics = append(metrics, "http://"+a+"/metrics")
		}
		s := &system{name: "etcd", pids: *etcdPids, metrics: metrics, fsyncs: "etcd_disk_wal_fsync_duration_seconds_count"}
		s.txn = func(ctx context.Context, _ int, k1, k2 string) (bool, error) {
			rd, err := cli.Txn(ctx).Then(clientv3.OpGet(k1), clientv3.OpGet(k2)).Commit()
			if err != nil {
				return false, err
			}
			var vals [2][]byte
			var revs [2]int64
			for i, r := range rd.Responses {
				if kvs := r.GetResponseRange().Kvs; len(kvs) == 1 {
					vals[i], revs[i] = kvs[0].Value, kvs[0].ModRevision
				}
			}
			wr, err := cli.Txn(ctx).If(
				clientv3.Compare(clientv3.ModRevision(k1), "=", revs[0]),
				clientv3.Compare(clientv3.ModRevision(k2), "=", revs[1]),
			).Then(clientv3.OpPut(k1, string(incr(vals[0]))), clientv3.OpPut(k2, string(incr(vals[1])))).Commit()
			if err != nil {
				return false, err
			}
			return wr.Succeeded, nil
		}
		systems = append(systems, s)
	}
	if *redisAddr != "" && want["redis"] {
		rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: *clients})
		for i := range maxH {
			if err := rdb.Set(ctx, hotKey(i), "0", 0).Err(); err != nil {
				fatalf("redis: preload: %v", err)
			}
		}
		s := &system{name: "redis", pids: *redisPid}
		s.txn = watchTxn(rdb)
		systems = append(systems, s)
	}
	if len(systems) == 0 && kc == nil {
		fatalf("no system to run")
	}

	res := map[string][]cell{} // system/H -> one cell per round
	var ro, plain []float64    // read-only rows: ops/s per round
	var roCPU, plainCPU []float64
	for r := 1; r <= *rounds; r++ {
		for _, h := range hs {
			for _, s := range systems {
				c := runCell(ctx, s, h, *clients, *dur)
				fmt.Fprintf(os.Stderr, "round %d H=%d %-11s %7.0f commits/s abort %4.1f%% p50 %6.2f ms p99 %7.2f ms cpu %6.0f µs client %5.0f µs fsyncs %.2f\n",
					r, h, s.name, c.rate, 100*c.abort, c.p50, c.p99, c.cpu, c.clientCPU, c.fsyncs)
				res[fmt.Sprintf("%s/%d", s.name, h)] = append(res[fmt.Sprintf("%s/%d", s.name, h)], c)
			}
		}
		if kc != nil {
			a, ac := readOnly(ctx, kc, *kefirPids, maxH, *clients, *dur, true)
			b, bc := readOnly(ctx, kc, *kefirPids, maxH, *clients, *dur, false)
			fmt.Fprintf(os.Stderr, "round %d read-only: txn of 4 Gets %.0f/s (%.0f µs), 4 Gets %.0f/s (%.0f µs)\n", r, a, ac, b, bc)
			ro, roCPU, plain, plainCPU = append(ro, a), append(roCPU, ac), append(plain, b), append(plainCPU, bc)
		}
	}

	// Ratios are medians of the rounds' ratios: a round's cells ran
	// minutes apart at most, so a burst of load on the shared box moves
	// both sides of a round's ratio, and the median of the rounds drops a
	// burst that hit one side.
	fmt.Printf("| H | system | commits/s | abort %% | p50 ms | p99 ms | server CPU µs/commit | client CPU µs/commit | fsyncs/commit | Kefir-txn ÷ |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, h := range hs {
		base, ok := res[fmt.Sprintf("kefir-txn/%d", h)]
		for _, s := range systems {
			cs := res[fmt.Sprintf("%s/%d", s.name, h)]
			m := medianCell(cs)
			ratio := "—"
			if ok && s.name != "kefir-txn" && m.rate > 0 {
				ratio = fmt.Sprintf("%.2f×", stats.Median(roundRatios(base, cs)))
			}
			fs := "—"
			if len(s.metrics) > 0 {
				fs = fmt.Sprintf("%.2f", m.fsyncs)
			}
			fmt.Printf("| %d | %s | %.0f | %.1f | %.2f | %.2f | %.0f | %.0f | %s | %s |\n", h, s.name, m.rate, 100*m.abort, m.p50, m.p99, m.cpu, m.clientCPU, fs, ratio)
		}
	}
	if len(ro) > 0 {
		fmt.Printf("\nread-only, %d clients: c.Txn of 4 Gets %.0f/s (%.0f µs CPU), 4 c.Gets %.0f/s (%.0f µs CPU): ratio %.2f (rounds: %s)\n",
			*clients, stats.Median(ro), stats.Median(roCPU), stats.Median(plain), stats.Median(plainCPU), stats.Median(div(ro, plain)), ratios(ro, plain))
	}
}

// kefirTxnSystem runs the transaction through c.Txn, SERIALIZABLE, which
// retries an abort itself (after its own backoff, the schedule runCell
// uses for the others): its runs of fn are the attempts.
func kefirTxnSystem(kc *client.Client, pids string, metrics []string) *system {
	s := &system{name: "kefir-txn", pids: pids, metrics: metrics, fsyncs: "kefir_vr_log_fsyncs_total", selfRetry: true}
	opts := &client.TxOptions{Isolation: client.Serializable, MaxAttempts: 1 << 20}
	s.txn = func(ctx context.Context, _ int, k1, k2 string) (bool, error) {
		err := kc.Txn(ctx, func(tx *client.Tx) error {
			s.attempts.Add(1)
			vs, err := tx.MGet(ctx, k1, k2)
			if err != nil {
				return err
			}
			if err := tx.Set(ctx, k1, incr(vs[0])); err != nil {
				return err
			}
			return tx.Set(ctx, k2, incr(vs[1]))
		}, opts)
		return err == nil, err
	}
	return s
}

// runCell runs s's transaction from n clients over a hot set of h keys for d.
func runCell(ctx context.Context, s *system, h, n int, d time.Duration) cell {
	var commits, attempts atomic.Int64
	var stop atomic.Bool
	lats := make([][]float64, n)
	var wg sync.WaitGroup
	s.attempts.Store(0)
	self := strconv.Itoa(os.Getpid())
	c0, f0, s0 := cpu(s.pids), scrape(s.metrics, s.fsyncs), cpu(self)
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for !stop.Load() {
				i := rng.IntN(h)
				j := rng.IntN(h - 1)
				if j >= i {
					j++
				}
				k1, k2 := hotKey(i), hotKey(j)
				t0 := time.Now()
				backoff := time.Millisecond
				for !stop.Load() {
					attempts.Add(1)
					ok, err := s.txn(ctx, w, k1, k2)
					if err != nil {
						fatalf("%s: %v", s.name, err)
					}
					if ok {
						commits.Add(1)
						lats[w] = append(lats[w], float64(time.Since(t0).Microseconds())/1000)
						break
					}
					time.Sleep(backoff/2 + time.Duration(rng.Int64N(int64(backoff))))
					backoff = min(2*backoff, 100*time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start).Seconds()
	n64 := float64(commits.Load())
	tries := float64(attempts.Load())
	if s.selfRetry {
		tries = float64(s.attempts.Load())
	}
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	c := cell{commits: commits.Load(), rate: n64 / el}
	if n64 > 0 {
		c.abort = 1 - n64/tries
		c.p50, c.p99 = all[len(all)/2], all[len(all)*99/100]
		c.cpu = (cpu(s.pids) - c0) * 1e6 / n64
		c.clientCPU = (cpu(self) - s0) * 1e6 / n64
		if len(s.metrics) > 0 {
			c.fsyncs = (scrape(s.metrics, s.fsyncs) - f0) / n64
		}
	}
	return c
}

// watchTxn is go-redis's optimistic-lock loop, one attempt: WATCH k1 k2,
// MGET, MULTI SET SET EXEC; a nil EXEC (TxFailedErr) is a conflict.
func watchTxn(rdb *redis.Client) func(context.Context, int, string, string) (bool, error) {
	return func(ctx context.Context, _ int, k1, k2 string) (bool, error) {
		err := rdb.Watch(ctx, func(tx *redis.Tx) error {
			vs, err := tx.MGet(ctx, k1, k2).Result()
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, k1, incr(str(vs[0])), 0)
				p.Set(ctx, k2, incr(str(vs[1])), 0)
				return nil
			})
			return err
		}, k1, k2)
		if errors.Is(err, redis.TxFailedErr) {
			return false, nil
		}
		return err == nil, err
	}
}

// readOnly runs, from n clients for d, a read-only c.Txn of 4 Gets (txn) or 4 c.Gets
// of keys drawn from the h preloaded ones,
// and returns the rate of those units and the server CPU per unit.
func readOnly(ctx context.Context, kc *client.Client, pids string, h, n int, d time.Duration, txn bool) (float64, float64) {
	roOpts := &client.TxOptions{ReadOnly: true} // BEGIN … READONLY: no wait, no abort
	var done atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	c0 := cpu(pids)
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var keys [4]string
			for !stop.Load() {
				for i := range keys {
					keys[i] = hotKey(rng.IntN(h))
				}
				var err error
				if txn {
					err = kc.Txn(ctx, func(tx *client.Tx) error {
						for _, k := range keys {
							if _, err := tx.Get(ctx, k); err != nil {
								return err
							}
						}
						return nil
					}, roOpts)
				} else {
					for _, k := range keys {
						if _, err = kc.Get(ctx, k); err != nil {
							break
						}
					}
				}
				if err != nil {
					fatalf("read-only (txn %v): %v", txn, err)
				}
				done.Add(1)
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	k := float64(done.Load())
	return k / time.Since(start).Seconds(), (cpu(pids) - c0) * 1e6 / k
}

// kefirLeader is the address whose INFO says role:leader (a WATCH/EXEC at
// a follower is forwarded; the benchmark measures the leader's path, as
// c.Txn's).
func kefirLeader(ctx context.Context, addrs []string) string {
	for range 100 {
		for _, a := range addrs {
			rdb := redis.NewClient(&redis.Options{Addr: a})
			info, _ := rdb.Info(ctx, "replication").Result()
			rdb.Close()
			if strings.Contains(info, "role:leader") {
				return a
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	fatalf("kefir: no leader among %v", addrs)
	return ""
}

// scrape sums the counter name over the /metrics urls (0 without any).
func scrape(urls []string, name string) float64 {
	sum := 0.0
	for _, u := range urls {
		resp, err := http.Get(u)
		if err != nil {
			fatalf("metrics %s: %v", u, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
				v, _ := strconv.ParseFloat(f[1], 64)
				sum += v
			}
		}
		resp.Body.Close()
	}
	return sum
}

func hotKey(i int) string { return "tx:hot:" + strconv.Itoa(i) }

func incr(v []byte) []byte {
	n, _ := strconv.Atoi(string(v))
	return strconv.AppendInt(nil, int64(n+1), 10)
}

func str(v any) []byte {
	s, _ := v.(string)
	return []byte(s)
}

func splitNonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// medianCell takes each figure's median over the rounds separately.
func medianCell(cs []cell) cell {
	pick := func(f func(cell) float64) float64 {
		var xs []float64
		for _, c := range cs {
			xs = append(xs, f(c))
		}
		return stats.Median(xs)
	}
	return cell{
		rate:      pick(func(c cell) float64 { return c.rate }),
		abort:     pick(func(c cell) float64 { return c.abort }),
		p50:       pick(func(c cell) float64 { return c.p50 }),
		p99:       pick(func(c cell) float64 { return c.p99 }),
		cpu:       pick(func(c cell) float64 { return c.cpu }),
		clientCPU: pick(func(c cell) float64 { return c.clientCPU }),
		fsyncs:    pick(func(c cell) float64 { return c.fsyncs }),
	}
}

// roundRatios is a's commit rate over b's, round by round.
func roundRatios(a, b []cell) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if b[i].rate > 0 {
			out = append(out, a[i].rate/b[i].rate)
		}
	}
	if len(out) == 0 {
		return []float64{0}
	}
	return out
}

func div(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] / b[i]
	}
	return out
}

func ratios(a, b []float64) string {
	var out []string
	for i := range a {
		out = append(out, fmt.Sprintf("%.2f", a[i]/b[i]))
	}
	return strings.Join(out, " · ")
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "txbench vs: "+format+"\n", args...)
	os.Exit(1)
}
