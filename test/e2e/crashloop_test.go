package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Crash loops (issue 25 item 1): one data directory (or group) killed with
// SIGKILL over and over at random moments — while clients write, after lives
// that wrote nothing, while the node is still recovering — sometimes stopped
// gracefully instead. After every restart the node (group) must start and hold
// every write acknowledged as durable. Before the fix a single node's
// directory could not be opened after the second write-less kill in a row.
//
// KEFIR_SOAK=1 runs many more lives (make soak).

func soakRun() bool { return os.Getenv("KEFIR_SOAK") == "1" }

// ackLog is the set of acknowledged writes, each a unique key whose value is
// the key itself.
type ackLog struct {
	mu   sync.Mutex
	keys []string
}

func (a *ackLog) add(k string) {
	a.mu.Lock()
	a.keys = append(a.keys, k)
	a.mu.Unlock()
}

func (a *ackLog) all() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...)
}

// verify reads every acknowledged key through c, in batches.
func (a *ackLog) verify(t *testing.T, c *client.Client, life int, opts ...client.CallOption) {
	t.Helper()
	keys := a.all()
	for lo := 0; lo < len(keys); lo += 500 {
		batch := keys[lo:min(lo+500, len(keys))]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		vals, err := c.MultiGet(ctx, batch, opts...)
		cancel()
		if err != nil {
			t.Fatalf("life %d: read back %d acknowledged writes: %v", life, len(batch), err)
		}
		missing := 0
		for i, k := range batch {
			if string(vals[i]) != k {
				if missing < 5 {
					t.Errorf("life %d: acknowledged %s, read %q", life, k, vals[i])
				}
				missing++
			}
		}
		if missing > 0 {
			t.Fatalf("life %d: %d of %d acknowledged writes lost", life, missing, len(keys))
		}
	}
}

// writeUntil runs writers putting unique sync keys through c until ctx ends,
// recording the acknowledged ones.
func writeUntil(ctx context.Context, c *client.Client, acks *ackLog, life, writers int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("L%d-w%d-%d", life, w, i)
				if err := c.Put(ctx, k, []byte(k), client.WithDurability(client.Sync)); err == nil {
					acks.add(k)
				}
			}
		}()
	}
	return &wg
}

// waitAcked waits (up to 10 s) until acks holds more than before writes, so a
// "kill under writes" life kills a node that has acknowledged writes: a group
// still settling after the last restart must not turn the life into an idle one.
func waitAcked(t *testing.T, acks *ackLog, before int) {
	t.Helper()
	if !testgroup.Until(10*time.Second, 2*time.Millisecond, func() bool { return len(acks.all()) > before }) {
		t.Fatalf("no write acknowledged within 10s (%d before)", before)
	}
}

// lifeKind is how one life of a crash loop goes.
type lifeKind int

const (
	lifeWrites     lifeKind = iota // clients write; SIGKILL at a random moment
	lifeIdle                       // nothing written; SIGKILL after a random pause
	lifeMidRecover                 // SIGKILL a random moment after exec, before or during recovery
	lifeGraceful                   // clients write, then SIGTERM
)

func (k lifeKind) String() string {
	return [...]string{"writes+kill", "idle+kill", "kill-while-starting", "writes+sigterm"}[k]
}

func pickLife(rng *rand.Rand) lifeKind {
	switch r := rng.IntN(16); {
	case r < 7:
		return lifeWrites
	case r < 13:
		return lifeIdle
	case r < 15:
		return lifeMidRecover
	default:
		return lifeGraceful
	}
}

// killWhileStarting starts n and SIGKILLs it a random moment (under 40 ms)
// later: before or during its recovery (lifeMidRecover).
func killWhileStarting(t *testing.T, n *cluster.Node, rng *rand.Rand) {
	t.Helper()
	if err := n.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Duration(rng.IntN(40_000)) * time.Microsecond)
	n.Kill()
}

func TestCrashLoopSingleNode(t *testing.T) {
	lives := 24
	if soakRun() {
		lives = 300
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed) // the kill moments also depend on timing: a seed replays the choices only
	rng := rand.New(rand.NewPCG(seed, 25))
	n := cluster.NewNode(t, "n1")
	acks := &ackLog{}
	counts := map[lifeKind]int{}
	var seq []string
	kills, busy := 0, 0
	// First the sequences the issue reported, then random lives.
	prelude := []lifeKind{lifeIdle, lifeIdle, lifeWrites, lifeIdle, lifeIdle, lifeGraceful, lifeIdle, lifeIdle}
	for life := 0; life < lives; life++ {
		kind := pickLife(rng)
		if life < len(prelude) {
			kind = prelude[life]
		}
		counts[kind]++
		seq = append(seq, kind.String())
		// Half of the lives write index hint files often, so kills also land
		// in a checkpoint and restarts load hints. (Compaction needs sealed
		// segments, which these few MiB never fill: the storage crash seeds
		// cover it.)
		n.Args = nil
		if rng.IntN(2) == 0 {
			n.Args = []string{"--checkpoint-interval", "50ms"}
			busy++
		}
		if kind == lifeMidRecover {
			killWhileStarting(t, n, rng)
			kills++
			continue
		}
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("life %d (after %s): the node did not start: %v\nlives so far: %s\n%s",
				life, strings.Join(seq[max(0, life-4):life], ", "), err, strings.Join(seq, ", "), tail(n.Logs(), 20))
		}
		c := dial(t, n.ClientAddr)
		acks.verify(t, c, life)
		switch kind {
		case lifeIdle:
			time.Sleep(time.Duration(rng.IntN(150_000)) * time.Microsecond)
		case lifeWrites, lifeGraceful:
			ctx, cancel := context.WithCancel(context.Background())
			before := len(acks.all())
			wg := writeUntil(ctx, c, acks, life, 1+rng.IntN(4))
			waitAcked(t, acks, before)
			time.Sleep(time.Duration(rng.IntN(250_000)) * time.Microsecond)
			if kind == lifeGraceful {
				cancel()
				wg.Wait()
				if code := n.Stop(); code != 0 {
					t.Fatalf("life %d: graceful stop exited %d\n%s", life, code, tail(n.Logs(), 20))
				}
				c.Close()
				continue
			}
			n.Kill() // mid-write: the writes in flight are not acknowledged
			cancel()
			wg.Wait()
		}
		n.Kill()
		kills++
		c.Close()
	}
	n.Start()
	acks.verify(t, dial(t, n.ClientAddr), lives)
	holes := strings.Count(n.Logs(), "versions handed out before a crash were not on disk")
	t.Logf("%d lives (%d SIGKILLs, %d with a checkpoint every 50ms): %d with writes, %d idle, %d killed while starting, %d graceful; %d acknowledged writes all present after every restart; %d restarts recorded lost versions",
		lives, kills, busy, counts[lifeWrites], counts[lifeIdle], counts[lifeMidRecover], counts[lifeGraceful], len(acks.all()), holes)
	if counts[lifeIdle] < 2 || len(acks.all()) == 0 {
		t.Fatal("the loop did not exercise write-less lives and acknowledged writes")
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestCrashLoopReplicaGroup is the crash loop on a 3-replica group: each round
// SIGKILLs one random replica or the whole group at a random moment (under
// writes or idle, or while a replica is still starting), restarts it, and
// checks every acknowledged write through the group.
func TestCrashLoopReplicaGroup(t *testing.T) {
	rounds := 6
	if soakRun() {
		rounds = 80
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 26))
	g := startGroup(t)
	g.settledLeader(-1)
	acks := &ackLog{}
	counts := map[lifeKind]int{}
	kills, wholeGroup := 0, 0
	// The first rounds cover every kind (one replica and the whole group under
	// writes, an idle kill, a kill while starting); the rest are random.
	prelude := []lifeKind{lifeWrites, lifeWrites, lifeIdle, lifeMidRecover}
	for round := 0; round < rounds; round++ {
		kind := pickLife(rng)
		if kind == lifeGraceful {
			kind = lifeWrites
		}
		wholeGroupRound := rng.IntN(3) == 0
		if round < len(prelude) {
			kind, wholeGroupRound = prelude[round], round == 1
		}
		counts[kind]++
		var victims []int
		if wholeGroupRound {
			victims = []int{0, 1, 2}
			wholeGroup++
		} else {
			victims = []int{rng.IntN(3)}
		}
		c := dialGroup(t, g.addrs())
		ctx, cancel := context.WithCancel(context.Background())
		var wg *sync.WaitGroup
		if kind == lifeWrites {
			before := len(acks.all())
			wg = writeUntil(ctx, c, acks, round, 1+rng.IntN(3))
			waitAcked(t, acks, before)
		}
		time.Sleep(time.Duration(rng.IntN(300_000)) * time.Microsecond)
		for _, v := range victims {
			g.nodes[v].Kill()
			kills++
		}
		cancel()
		if wg != nil {
			wg.Wait()
		}
		c.Close()
		for _, v := range victims {
			n := g.nodes[v]
			if kind == lifeMidRecover {
				// Killed again while it recovers: the next start must still work.
				killWhileStarting(t, n, rng)
				kills++
			}
			if err := n.StartNoWait(); err != nil {
				t.Fatal(err)
			}
		}
		for _, v := range victims {
			if err := g.nodes[v].WaitReady(20 * time.Second); err != nil {
				t.Fatalf("round %d (%s): %s did not start: %v\n%s", round, kind, g.nodes[v].ID, err, tail(g.nodes[v].Logs(), 20))
			}
		}
		g.settledLeader(-1)
		acks.verify(t, dialGroup(t, g.addrs()), round)
	}
	// Every replica holds every acknowledged write, read from its own state.
	l := g.settledLeader(-1)
	for i, n := range g.nodes {
		g.caughtUp(i, l)
		acks.verify(t, dialGroup(t, []string{n.ClientAddr}), rounds, client.WithConsistency(client.Eventual))
	}
	t.Logf("%d rounds (%d SIGKILLs, %d of the whole group): %d with writes, %d idle, %d killed again while starting; %d acknowledged writes all present after every restart",
		rounds, kills, wholeGroup, counts[lifeWrites], counts[lifeIdle], counts[lifeMidRecover], len(acks.all()))
	if len(acks.all()) == 0 {
		t.Fatal("no write was acknowledged")
	}
}
