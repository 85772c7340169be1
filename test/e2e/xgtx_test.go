package e2e

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Cross-group transactions (docs/design/transactions.md, "Cross-group
// transactions") with real processes: two groups over three nodes, the Go
// client's c.Txn moving money between accounts of the two groups from
// several goroutines while group 2's leader and then group 1's (the
// coordinator of every transfer: each begins with an account of group 1)
// are killed with SIGKILL and restarted. The total never changes, read by a
// cross-group read-only transaction during the run and by plain reads after
// it, and no lock is left once the pushes have run.
func TestTxCrossGroupBankLeaderKill(t *testing.T) {
	layout := kcluster.EvenGroups(2, []uint64{1, 2, 3}, 3)
	g := cluster.StartGroups(t, 3, kcluster.FormatGroups(layout), "--cross-group-tx", "true")
	g.WaitLeaders(20 * time.Second)
	inGroup := func(k string) int {
		s := kcluster.Slot([]byte(k))
		for i, gs := range layout {
			if s >= gs.Slots[0].Start && s <= gs.Slots[0].End {
				return i
			}
		}
		return -1
	}
	var accts [2][]string
	for i := 0; len(accts[0]) < 3 || len(accts[1]) < 3; i++ {
		k := "acct" + strconv.Itoa(i)
		if gi := inGroup(k); len(accts[gi]) < 3 {
			accts[gi] = append(accts[gi], k)
		}
	}
	const initial, n = 100, 6
	for _, ks := range accts {
		for _, k := range ks {
			if v, err := cluster.Command(g.Nodes[0].ClientAddr, "SET", k, strconv.Itoa(initial)); err != nil || string(v.Str) != "OK" {
				t.Fatalf("SET %s: %v %v", k, v, err)
			}
		}
	}
	leader := func(gi int) int { return g.SlotLeader(int(kcluster.Slot([]byte(accts[gi][0])))) }
	l1 := leader(0)
	addrs := []string{g.Nodes[l1].ClientAddr}
	for i, nd := range g.Nodes {
		if i != l1 {
			addrs = append(addrs, nd.ClientAddr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, addrs, client.WithRetryUnavailable(15*time.Second), client.WithMaxRetries(5))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func(ctx context.Context, tx *client.Tx, k string) (int64, error) {
		b, err := tx.Get(ctx, k)
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(string(b), 10, 64)
	}
	sum := func() (int64, error) {
		var total int64
		err := c.Txn(ctx, func(tx *client.Tx) error {
			total = 0
			for _, ks := range accts {
				for _, k := range ks {
					v, err := get(ctx, tx, k)
					if err != nil {
						return err
					}
					total += v
				}
			}
			return nil
		}, &client.TxOptions{MaxAttempts: 50})
		return total, err
	}
	var commits, unknown, aborted, sums, sumFails atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				a, b := accts[0][r.IntN(3)], accts[1][r.IntN(3)]
				amt := int64(r.IntN(21) - 10)
				tctx, tcancel := context.WithTimeout(ctx, 20*time.Second)
				err := c.Txn(tctx, func(tx *client.Tx) error {
					va, err := get(tctx, tx, a)
					if err != nil {
						return err
					}
					vb, err := get(tctx, tx, b)
					if err != nil {
						return err
					}
					if err := tx.Set(tctx, a, []byte(strconv.FormatInt(va-amt, 10))); err != nil {
						return err
					}
					return tx.Set(tctx, b, []byte(strconv.FormatInt(vb+amt, 10)))
				}, &client.TxOptions{MaxAttempts: 20})
				tcancel()
				switch {
				case err == nil:
					commits.Add(1)
				case errors.Is(err, client.ErrUnknownOutcome):
					unknown.Add(1)
				case errors.Is(err, client.ErrTxAborted):
					aborted.Add(1)
				default:
					// A kill's transient errors (a connection refused while
					// the client finds the new leader): outcome unknown too.
					unknown.Add(1)
					t.Logf("transfer: %v", err)
				}
			}
		}()
	}
	// A reader checks the total with cross-group read-only transactions.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if s, err := sum(); err == nil {
				sums.Add(1)
				if s != initial*n {
					t.Errorf("a read-only transaction saw a total of %d, want %d", s, initial*n)
				}
			} else {
				sumFails.Add(1)
			}
		}
	}()
	pause := func(d time.Duration) { time.Sleep(d) }
	pause(2 * time.Second)
	for _, gi := range []int{1, 0} {
		l := leader(gi)
		if l < 0 {
			t.Fatalf("group %d has no leader", gi+1)
		}
		t.Logf("killing n%d, group %d's leader (commits so far %d)", l+1, gi+1, commits.Load())
		g.Nodes[l].Kill()
		pause(2 * time.Second)
		g.Nodes[l].Start()
		pause(2 * time.Second)
	}
	close(stop)
	wg.Wait()
	t.Logf("transfers: %d committed, %d aborted after their retries, %d unknown; %d totals read (%d reads gave up)", commits.Load(), aborted.Load(), unknown.Load(), sums.Load(), sumFails.Load())
	if sums.Load() == 0 {
		t.Error("no read-only transaction read the total")
	}
	if commits.Load() < 20 {
		t.Errorf("only %d transfers committed", commits.Load())
	}
	// Every lock resolved (pushed if its coordinator died), then the
	// total, by plain reads at every node.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var total int64
		ok := true
		for _, ks := range accts {
			for _, k := range ks {
				v, err := cluster.Command(g.Nodes[0].ClientAddr, "GET", k)
				x, perr := strconv.ParseInt(string(v.Str), 10, 64)
				if err != nil || perr != nil {
					ok = false
					break
				}
				total += x
			}
		}
		if ok {
			if total != initial*n {
				t.Fatalf("the total after the run is %d, want %d", total, initial*n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the accounts could not be read after the run")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s, err := sum(); err != nil || s != initial*n {
		t.Fatalf("a read-only transaction after the run: %d, %v", s, err)
	}
}
