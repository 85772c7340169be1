package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/kefirdb/kefir/internal/keyslot"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/client"
)

// `txbench xgroup -kefir a,b,c` measures cross-group transactions
// (docs/design/transactions.md, "Cross-group transactions") on a cluster
// of two groups (kefir up --groups 2 --cross-group-tx): -c goroutines run
// the Go client's c.Txn transfers (read two accounts, write both) for -d,
// alternately between two accounts of one slot of group 1 (one hash tag:
// the one-op commit) and between an account of group 1 and one of group 2
// (the two-phase commit), -r rounds each, over -accts accounts a side.
// Slots 0-8191 are group 1's and 8192-16383 group 2's (kefir up's even
// split of two groups). -rows picks rows; the row "any group" is transfers
// between two accounts of one hash tag whose slots fall anywhere (on a
// cluster of several groups, single-group transactions spread over every
// group: what the client's routing of transactions changes), and -pid
// adds the servers' CPU per commit.
func xgroupMain(args []string) {
	fs := flag.NewFlagSet("xgroup", flag.ExitOnError)
	addrs := fs.String("kefir", "127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382", "the cluster's client addresses, group 1's leader first")
	clients := fs.Int("c", 16, "goroutines")
	dur := fs.Duration("d", 5*time.Second, "duration of a round")
	rounds := fs.Int("r", 3, "rounds of each row, alternated")
	accts := fs.Int("accts", 64, "accounts a side (transfers pick two at random)")
	rows := fs.String("rows", "one group,two groups", "rows to run, comma-separated: one group, two groups, any group")
	pids := fs.String("pid", "", "server process ids (comma-separated) whose CPU time per commit is shown")
	_ = fs.Parse(args)
	ctx := context.Background()
	kc, err := client.Dial(ctx, strings.Split(*addrs, ","), client.WithPoolSize(*clients), client.WithRetryUnavailable(10*time.Second))
	if err != nil {
		fatalf("kefir: %v", err)
	}
	defer kc.Close()
	// one: pairs in one slot of group 1; cross: a key of group 1, a key of
	// group 2, in distinct slots.
	var one, anyg [][2]string
	var g1, g2 []string
	for i := range *accts {
		tag := "q" + strconv.Itoa(i)
		anyg = append(anyg, [2]string{"{" + tag + "}x", "{" + tag + "}y"})
	}
	for i := 0; len(one) < *accts; i++ {
		tag := "p" + strconv.Itoa(i)
		if keyslot.Of(tag) < 8192 {
			one = append(one, [2]string{"{" + tag + "}x", "{" + tag + "}y"})
		}
	}
	for i := 0; len(g1) < *accts || len(g2) < *accts; i++ {
		k := "acct" + strconv.Itoa(i)
		if keyslot.Of(k) < 8192 {
			if len(g1) < *accts {
				g1 = append(g1, k)
			}
		} else if len(g2) < *accts {
			g2 = append(g2, k)
		}
	}
	var kv []client.KV
	for _, p := range append(append([][2]string(nil), one...), anyg...) {
		kv = append(kv, client.KV{Key: p[0], Value: []byte("100")}, client.KV{Key: p[1], Value: []byte("100")})
	}
	for _, k := range append(append([]string(nil), g1...), g2...) {
		kv = append(kv, client.KV{Key: k, Value: []byte("100")})
	}
	for _, x := range kv {
		if err := kc.Put(ctx, x.Key, x.Value, client.WithDurability(client.Sync)); err != nil {
			fatalf("kefir: preload %s: %v", x.Key, err)
		}
	}
	pick := map[string]func(r *rand.Rand) (string, string){
		"one group": func(r *rand.Rand) (string, string) {
			p := one[r.IntN(len(one))]
			return p[0], p[1]
		},
		"two groups": func(r *rand.Rand) (string, string) { return g1[r.IntN(len(g1))], g2[r.IntN(len(g2))] },
		"any group": func(r *rand.Rand) (string, string) {
			p := anyg[r.IntN(len(anyg))]
			return p[0], p[1]
		},
	}
	runRows := strings.Split(*rows, ",")
	for _, row := range runRows {
		if pick[row] == nil {
			fatalf("unknown row %q", row)
		}
	}
	fmt.Printf("txbench xgroup: %d goroutines, %d accounts a side, %v a round\n", *clients, *accts, *dur)
	fmt.Printf("%-11s %6s %10s %9s %9s %9s %14s\n", "row", "round", "commits/s", "attempts", "p50 ms", "p99 ms", "srv CPU µs/tx")
	for round := 1; round <= *rounds; round++ {
		for _, row := range runRows {
			c0 := cpu(*pids)
			commits, attempts, lat := xgRun(ctx, kc, *clients, *dur, pick[row])
			perTx := (cpu(*pids) - c0) * 1e6 / float64(max(commits, 1))
			fmt.Printf("%-11s %6d %10.0f %9.2f %9.2f %9.2f %14.0f\n", row, round, float64(commits)/dur.Seconds(),
				float64(attempts)/float64(max(commits, 1)), pct(lat, 0.5), pct(lat, 0.99), perTx)
		}
	}
}

// xgRun runs transfers for d: the commits, the attempts (fn's runs), the
// latencies of the committed ones (ms).
func xgRun(ctx context.Context, kc *client.Client, n int, d time.Duration, pick func(*rand.Rand) (string, string)) (int64, int64, []float64) {
	var commits, attempts atomic.Int64
	var mu sync.Mutex
	var lat []float64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var mine []float64
			for time.Now().Before(stop) {
				a, b := pick(r)
				t0 := time.Now()
				err := kc.Txn(ctx, func(tx *client.Tx) error {
					attempts.Add(1)
					va, err := tx.Get(ctx, a)
					if err != nil {
						return err
					}
					vb, err := tx.Get(ctx, b)
					if err != nil {
						return err
					}
					x, _ := strconv.ParseInt(string(va), 10, 64)
					y, _ := strconv.ParseInt(string(vb), 10, 64)
					if err := tx.Set(ctx, a, []byte(strconv.FormatInt(x-1, 10))); err != nil {
						return err
					}
					return tx.Set(ctx, b, []byte(strconv.FormatInt(y+1, 10)))
				}, &client.TxOptions{MaxAttempts: 50})
				if err != nil {
					fmt.Fprintln(os.Stderr, "txbench xgroup:", err)
					continue
				}
				commits.Add(1)
				mine = append(mine, float64(time.Since(t0).Microseconds())/1000)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return commits.Load(), attempts.Load(), lat
}

// pct is the q-quantile of xs (sorted here).
func pct(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[int(q*float64(len(s)-1))]
}
