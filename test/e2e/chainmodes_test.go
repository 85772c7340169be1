package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// A chain of three `kefir server --engine chain --chain-mode ausi` processes
// under the linearizability workload (sync writers, checked clients reading
// at the linearizable level, putting and CASing): the head — the metadata
// group's leader too — is SIGKILLed, the chain repaired, the head restarted
// from its disk and rejoined. AUSI answers a write once the acknowledgement
// came back to the head (every member holds it, no disk waited for): every
// acknowledged write is on every member at the end and the history is
// linearizable (docs/design/chain.md, "Update modes on the host").
func TestChainAUSIUnderKills(t *testing.T) {
	g := startChain(t, "--chain-mode", "ausi")
	g.settledLeader(-1)
	if got := redisCLI(t, g.nodes[2].ClientAddr, "SET", "k", "v"); got != "OK" {
		t.Fatalf("redis-cli SET via n3 = %q", got)
	}
	if got := redisCLI(t, g.nodes[1].ClientAddr, "GET", "k"); got != "v" {
		t.Fatalf("redis-cli GET via n2 = %q", got)
	}
	w := startWorkload(t, g)
	time.Sleep(time.Second)
	g.nodes[0].Kill()
	w.rec.Crash(0)
	w.cut.Store(true)
	time.Sleep(2500 * time.Millisecond) // the metadata leader's failover, the failure timeout, the repair
	g.nodes[0].Start()
	g.rejoined(0)
	time.Sleep(500 * time.Millisecond)
	w.finish(t, g)
}

// A chain of three `kefir server --engine chain --chain-mode au` processes:
// linearizable reads are refused (redis-cli GET at the default level gets
// the error); async writes are answered by the head alone, sync writes once
// every member holds them. Under writers of both kinds and checked clients
// (async puts, eventual reads at every member), the head is SIGKILLed and
// restarted: every acknowledged sync write is on every member at the end;
// some async writes the head answered may be gone (AU's window, counted);
// and no read ever returned a value no write wrote (AU's promise: stale
// values, never invented ones — check.Eventual with an unbounded window).
func TestChainAUUnderKills(t *testing.T) {
	g := startChain(t, "--chain-mode", "au")
	g.settledLeader(-1)
	if got := redisCLI(t, g.nodes[1].ClientAddr, "SET", "k", "v"); got != "OK" {
		t.Fatalf("redis-cli SET via n2 = %q", got)
	}
	if got := redisCLI(t, g.nodes[0].ClientAddr, "GET", "k"); !strings.Contains(got, "AU mode") {
		t.Fatalf("redis-cli GET (linearizable) on an AU chain = %q, want the refusal", got)
	}

	var (
		stop           atomic.Bool
		wg             sync.WaitGroup
		mu             sync.Mutex
		syncAcked      = map[string]string{}
		asyncAcked     = map[string]string{}
		rec            = check.NewRecorder(nil)
		asyncAfterKill atomic.Int64
		killed         atomic.Bool
	)
	writer := func(wi int, d client.Durability, acked map[string]string) {
		c := dialGroup(t, append(g.addrs()[wi%3:], g.addrs()[:wi%3]...))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k, v := fmt.Sprintf("%v%d-%d", d, wi, i), fmt.Sprintf("val-%d-%d", wi, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := c.Put(ctx, k, []byte(v), client.WithDurability(d))
				cancel()
				if err == nil {
					mu.Lock()
					acked[k] = v
					mu.Unlock()
					if d == client.Async && killed.Load() {
						asyncAfterKill.Add(1)
					}
				}
			}
		}()
	}
	writer(0, client.Sync, syncAcked)
	writer(1, client.Async, asyncAcked)
	writer(2, client.Async, asyncAcked)
	for cid := range 4 {
		c := dialGroup(t, g.addrs())
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cid), 9))
			for i := 0; !stop.Load(); i++ {
				key := []string{"a", "b", "c"}[rng.IntN(3)]
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if rng.IntN(2) == 0 {
					op := check.Op{Client: cid, Key: key, Kind: check.Get, Cons: level.ConsEventual}
					id := rec.Invoke(op)
					v, err := c.Get(ctx, key, client.WithConsistency(client.Eventual))
					switch {
					case err == nil:
						rec.Complete(id, check.Result{Found: true, Value: string(v), Node: -1})
					case errors.Is(err, client.ErrNotFound):
						rec.Complete(id, check.Result{Found: false, Node: -1})
					default:
						rec.Fail(id)
					}
				} else {
					op := check.Op{Client: cid, Key: key, Kind: check.Put, Value: fmt.Sprintf("c%d-%d", cid, i), Dur: level.Async}
					id := rec.Invoke(op)
					if err := c.Put(ctx, key, []byte(op.Value), client.WithDurability(client.Async)); err != nil {
						rec.Unknown(id)
					} else {
						rec.Complete(id, check.Result{Node: -1})
					}
				}
				cancel()
			}
		}()
	}
	time.Sleep(time.Second)
	g.nodes[0].Kill()
	rec.Crash(0)
	killed.Store(true)
	time.Sleep(2500 * time.Millisecond)
	g.nodes[0].Start()
	g.rejoined(0)
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if asyncAfterKill.Load() == 0 {
		t.Fatal("no async write was answered after the head's kill")
	}
	cur := g.leader(-1)
	lostAsync := 0
	for i, n := range g.nodes {
		g.caughtUp(i, cur)
		if i == 0 {
			for k, v := range asyncAcked {
				if presentEventual(t, n.ClientAddr, map[string]string{k: v}) == 0 {
					lostAsync++
				}
			}
		}
		if got := presentEventual(t, n.ClientAddr, syncAcked); got != len(syncAcked) {
			t.Fatalf("%s holds %d of the %d acknowledged sync writes", n.ID, got, len(syncAcked))
		}
	}
	t.Logf("AU: %d sync writes acknowledged, all kept; %d async writes acknowledged (%d after the kill), %d lost with the head",
		len(syncAcked), len(asyncAcked), asyncAfterKill.Load(), lostAsync)
	h := rec.History()
	if v := check.Eventual(h, time.Hour); !v.OK {
		t.Fatalf("an eventual read returned a value no write wrote: %+v", v)
	} else {
		t.Logf("eventual reads: %d checked, no invented value", v.Checked)
	}
}

// presentEventual counts the writes of acked readable through addr at the
// eventual level (an AU chain refuses linearizable reads).
func presentEventual(t *testing.T, addr string, acked map[string]string) int {
	t.Helper()
	c := dial(t, addr)
	n := 0
	for k, v := range acked {
		if got, err := c.Get(context.Background(), k, client.WithConsistency(client.Eventual)); err == nil && string(got) == v {
			n++
		}
	}
	return n
}

// TestChainAUSessionLostOverRESP: a Go client's session over RESP on an AU
// chain of three processes with a standalone master (a hosted one would
// lose its metadata majority with the two members killed here). The
// middle member is SIGKILLed; the session
// writes `async` at once (the head answers it alone: its successor is
// gone) and the head is SIGKILLed before the master repairs the chain, so
// the write dies with it. The survivor, a chain of one, tells the session
// on its next session read and on its next write
// (client.ErrSessionLost), while a fresh session reads and writes as usual
// (docs/design/chain.md, "Sessions on the host").
func TestChainAUSessionLostOverRESP(t *testing.T) {
	g := newGroup(t)
	masterAddr := cluster.FreeAddr(t)
	startChainMaster(t, 9, masterAddr, g.members, "--chain-mode", "au")
	g.start("--engine", "chain", "--chain-master", "9@"+masterAddr, "--chain-mode", "au")
	head := g.settledLeader(-1)
	c := dialGroup(t, g.addrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Put(ctx, "warm", []byte("w")); err != nil {
		t.Fatalf("sync put: %v", err)
	}
	if head != 0 {
		t.Fatalf("the new chain's head is n%d, want n1 (the chain is n1, n2, n3)", head+1)
	}
	const mid = 1
	s := c.Session()
	g.nodes[mid].Kill()
	if err := s.Put(ctx, "a", []byte("A"), client.WithDurability(client.Async)); err != nil {
		t.Fatalf("the session's async put with the middle down: %v", err)
	}
	tok := s.Token()
	g.nodes[head].Kill()
	if !strings.HasPrefix(tok, "v2.") {
		t.Fatalf("the session's token after the head's early answer is %q: no epoch", tok)
	}
	// Until the master repairs the chain (its failure timeout) the
	// survivor redirects to the dead head: the client's error then is not
	// the session's, and the test asks again.
	var err error
	testgroup.Until(20*time.Second, 100*time.Millisecond, func() bool {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		defer rcancel()
		var v []byte
		v, err = s.Get(rctx, "a", client.WithConsistency(client.SessionConsistency))
		if err == nil {
			t.Fatalf("the session read %q after the head died with its write (token %s)", v, tok)
		}
		return errors.Is(err, client.ErrSessionLost)
	})
	if !errors.Is(err, client.ErrSessionLost) {
		t.Fatalf("the session's read after the head died with its write (token %s): %v; want ErrSessionLost", tok, err)
	}
	if err := s.Put(ctx, "b", []byte("B"), client.WithDurability(client.Async)); !errors.Is(err, client.ErrSessionLost) {
		t.Fatalf("the session's write after its loss: %v; want ErrSessionLost", err)
	}
	fresh := c.Session()
	if err := fresh.Put(ctx, "c", []byte("C"), client.WithDurability(client.Async)); err != nil {
		t.Fatalf("a fresh session's write: %v", err)
	}
	if v, err := fresh.Get(ctx, "c", client.WithConsistency(client.SessionConsistency)); err != nil || string(v) != "C" {
		t.Fatalf("a fresh session's read of its write: %q, %v", v, err)
	}
	t.Logf("token %s: read and write refused as lost; a fresh session served", tok)
}
