package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// syncWriters puts unique keys with sync durability through c from four
// goroutines until stop, recording what was acknowledged; a write that
// fails (the chain died under it) ends its writer: its outcome is unknown.
// The keys are unique across writer sets too (writerSets), so a test that
// kills a chain several times checks each round's writes, not the same keys
// rewritten with the same values.
type syncWriters struct {
	stop  atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	acked map[string]string
}

func startSyncWriters(c *client.Client) *syncWriters {
	w := &syncWriters{acked: map[string]string{}}
	set := writerSets.Add(1)
	for wi := range 4 {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := 0; !w.stop.Load(); i++ {
				k, v := fmt.Sprintf("s%d-w%d-k%d", set, wi, i), fmt.Sprintf("v%d-%d-%d", set, wi, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := c.Put(ctx, k, []byte(v), client.WithDurability(client.Sync))
				cancel()
				if err != nil {
					return
				}
				w.mu.Lock()
				w.acked[k] = v
				w.mu.Unlock()
			}
		}()
	}
	return w
}

var writerSets atomic.Int64

// until waits for n acknowledged writes (or 20 s).
func (w *syncWriters) until(n int) {
	testgroup.Until(20*time.Second, 10*time.Millisecond, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.acked) >= n
	})
}

// halt stops the writers and returns what was acknowledged.
func (w *syncWriters) halt() map[string]string {
	w.stop.Store(true)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked
}

// killWhole runs sync writers through every node of g until n writes are
// acknowledged, SIGKILLs every node at once, restarts them all and waits
// until a write through the first succeeds: what was acknowledged before
// the kill, and how long after the restart the chain took a write.
func killWhole(t *testing.T, g *group, n int) (acked map[string]string, writableAfter time.Duration) {
	t.Helper()
	w := startSyncWriters(dialGroup(t, g.addrs()))
	w.until(n)
	for _, nd := range g.nodes {
		nd.Kill()
	}
	acked = w.halt()
	for _, nd := range g.nodes {
		nd.Start()
	}
	return acked, writable(t, g.nodes[0].ClientAddr, 20*time.Second)
}

// checkAcked reads every acknowledged write back through addr.
func checkAcked(t *testing.T, addr string, acked map[string]string) {
	t.Helper()
	c := dial(t, addr)
	missing := 0
	for k, v := range acked {
		got, err := c.Get(context.Background(), k)
		if err != nil || string(got) != v {
			missing++
			if missing <= 10 {
				t.Errorf("acknowledged write %s=%s: got %q, %v", k, v, got, err)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged sync writes lost", missing, len(acked))
	}
}

// writable waits until a SET through addr succeeds and reports how long it
// took.
func writable(t *testing.T, addr string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c := dial(t, addr)
	if !testgroup.Until(within, 50*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Put(ctx, "probe", []byte("x")) == nil
	}) {
		t.Fatalf("no write through %s within %v of the restart", addr, within)
	}
	return time.Since(start)
}

// replicationStatus is /status's replication.status ("normal", "removed",
// "recovering", ...).
func replicationStatus(n *cluster.Node) string {
	var st struct {
		Replication *struct {
			Status string `json:"status"`
		} `json:"replication"`
	}
	hc := http.Client{Timeout: time.Second}
	r, err := hc.Get("http://" + n.HTTPAddr + "/status")
	if err != nil {
		return ""
	}
	defer r.Body.Close()
	if json.NewDecoder(r.Body).Decode(&st) != nil || st.Replication == nil {
		return ""
	}
	return st.Replication.Status
}

// A chain of one (`kefir server --engine chain`, one member, its master
// hosted by its own metadata replica) killed with SIGKILL under sync writes
// and restarted comes back writable with every acknowledged write. Before
// the whole-chain restart it never did: the member came back as a joiner
// with no tail to copy from and the master looped committing an empty
// chain (docs/design/chain.md, A8).
func TestChainOfOneRestarts(t *testing.T) {
	g := newGroupN(t, 1)
	g.start("--engine", "chain")
	n := g.nodes[0]
	writable(t, n.ClientAddr, 15*time.Second)
	w := startSyncWriters(dial(t, n.ClientAddr))
	w.until(300)
	n.Kill()
	acked := w.halt()
	if len(acked) < 50 {
		t.Fatalf("only %d writes acknowledged before the kill", len(acked))
	}
	n.Start()
	d := writable(t, n.ClientAddr, 15*time.Second)
	t.Logf("%d sync writes acknowledged before SIGKILL; writable %v after the restart", len(acked), d)
	checkAcked(t, n.ClientAddr, acked)
	if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool { return replicationStatus(n) == "normal" }) {
		t.Fatalf("/status after the restart: %q, want normal", replicationStatus(n))
	}
}

// A chain of three killed whole — every member SIGKILLed at once while
// clients write at sync durability through every member — and restarted:
// the master (hosted by the metadata group on the same nodes, restarted
// too) restarts the chain from the member holding the longest durable
// history and joins the others to it; every acknowledged write is readable
// through every member.
func TestChainRestartsWhole(t *testing.T) {
	g := startChain(t)
	g.settledLeader(-1)
	writable(t, g.nodes[0].ClientAddr, 15*time.Second)
	acked, d := killWhole(t, g, 500)
	if len(acked) < 50 {
		t.Fatalf("only %d writes acknowledged before the kill", len(acked))
	}
	t.Logf("%d sync writes acknowledged before the whole chain's SIGKILL; writable %v after the restart", len(acked), d)
	for i := range g.nodes {
		if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { return replicationStatus(g.nodes[i]) == "normal" }) {
			t.Fatalf("%s not a replica again 20 s after the restart: %q", g.nodes[i].ID, replicationStatus(g.nodes[i]))
		}
	}
	for _, n := range g.nodes {
		checkAcked(t, n.ClientAddr, acked)
	}
	restarted := 0
	for _, n := range g.nodes {
		restarted += strings.Count(n.Logs(), "restarting the chain from the member holding the longest durable history")
	}
	if restarted == 0 {
		t.Fatal("no master logged a whole-chain restart")
	}
}

// A chain of two runs (`kefir server --engine chain` with two members; VR's
// odd-count rule is VR's): it takes writes, its tail is SIGKILLed and the
// head goes on alone (the master, hosted by n1's metadata replica, repairs
// the chain), n2 restarts and rejoins with every write (before the tail:
// the chain is then n2-n1). Then n2, paused past the master's failure
// timeout, is repaired out of the chain while alive: resumed, it hears that
// it is out (the master's answer names the chain without it) and rejoins by
// itself as a new member, with no restart, holding every write. Before, it
// said "removed" on /status until its process was restarted.
func TestChainOfTwo(t *testing.T) {
	g := newGroupN(t, 2)
	g.start("--engine", "chain")
	g.settledLeader(-1)
	writable(t, g.nodes[0].ClientAddr, 15*time.Second)
	w := startSyncWriters(dialGroup(t, g.addrs()[:1]))
	w.until(200)
	n2 := g.nodes[1]
	n2.Kill()
	d := writable(t, g.nodes[0].ClientAddr, 10*time.Second)
	t.Logf("a write through the head %v after the tail's kill", d)
	acked := w.halt()
	n2.Start()
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { return replicationStatus(n2) == "normal" }) {
		t.Fatalf("/status of the restarted tail: %q, want normal (joined again)", replicationStatus(n2))
	}
	checkAcked(t, n2.ClientAddr, acked)

	n2.Pause()
	time.Sleep(1500 * time.Millisecond) // past the master's 1 s failure timeout: repaired out
	n2.Resume()
	if !testgroup.Until(5*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(n2.Logs(), "leaves it out") }) {
		t.Fatalf("the member repaired out of the chain did not hear it (status %q)", replicationStatus(n2))
	}
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { return replicationStatus(n2) == "normal" }) {
		t.Fatalf("/status of the member repaired out of the chain: %q, want normal (rejoined by itself)", replicationStatus(n2))
	}
	checkAcked(t, n2.ClientAddr, acked)
}

// `kefir up --engine chain --nodes 2` starts a chain of two: a write through
// either node is read back through the other.
func TestUpChainOfTwo(t *testing.T) {
	base := freeBase(t, 2)
	u := startUp(t, "--engine", "chain", "--nodes", "2", "--dir", t.TempDir(), "--base-port", fmt.Sprint(base))
	if !strings.Contains(u.banner, "a chain of 2 nodes") || !strings.Contains(u.banner, "metadata group on n1)") {
		t.Fatalf("banner does not announce a chain of two:\n%s", u.banner)
	}
	a1, a2 := fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)
	if got := redisCLI(t, a2, "SET", "k", "v"); got != "OK" {
		t.Fatalf("SET via n2 = %q\n%s", got, u.Logs())
	}
	if got := redisCLI(t, a1, "GET", "k"); got != "v" {
		t.Fatalf("GET via n1 = %q", got)
	}
	u.stop(t)
}

// A chain of three (every member a log) killed whole under sync writes; n1
// and n2 restart, n3 does not (its disk gone for good, say): the master
// waits for it — it may hold the last acknowledged writes — and the chain
// stays down. `kefir chain restart --without 3` restarts it from the longest
// history of the two: every acknowledged write is there (each member writes
// its commit point before it acknowledges, and the head before it answers,
// so under kill -9 the head's durable history holds every answered write).
// n3 then comes back: joined if it holds no more than the chain restarted
// from; refused (its history may hold writes the chain lost) until it
// restarts on an empty directory otherwise — either way it ends a replica
// with every acknowledged write. Before, nothing let the chain restart
// without n3.
func TestChainRestartsWithoutAMember(t *testing.T) {
	g := newGroupN(t, 3)
	g.start("--engine", "chain")
	writable(t, g.nodes[0].ClientAddr, 15*time.Second)
	w := startSyncWriters(dialGroup(t, g.addrs()))
	w.until(300)
	for _, nd := range g.nodes {
		nd.Kill()
	}
	acked := w.halt()
	n1, n2, n3 := g.nodes[0], g.nodes[1], g.nodes[2]
	n1.Start()
	n2.Start()
	c := dial(t, n1.ClientAddr)
	if testgroup.Until(3*time.Second, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return c.Put(ctx, "probe", []byte("x")) == nil
	}) {
		t.Fatal("the chain took a write while a member that may hold the last acknowledged writes had not restarted")
	}
	out, err := exec.Command(cluster.Binary(t), "chain", "restart", "--without", "3", "--http", n1.HTTPAddr+","+n2.HTTPAddr).CombinedOutput()
	if err != nil {
		t.Fatalf("kefir chain restart --without 3: %v\n%s", err, out)
	}
	t.Logf("kefir chain restart --without 3: %s", strings.TrimSpace(string(out)))
	d := writable(t, n1.ClientAddr, 15*time.Second)
	checkAcked(t, n1.ClientAddr, acked)
	t.Logf("restarted without n3: writable %v after the command, every one of %d acknowledged writes kept", d, len(acked))

	n3.Start()
	refused := func() bool {
		return strings.Contains(n1.Logs()+n2.Logs(), "left out of the chain's restart")
	}
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { return replicationStatus(n3) == "normal" || refused() }) {
		t.Fatalf("n3 neither joined nor was refused: %q", replicationStatus(n3))
	}
	if replicationStatus(n3) != "normal" {
		t.Log("n3 holds more than the chain restarted from: refused; restarted on an empty chain directory")
		n3.Kill()
		if err := os.RemoveAll(filepath.Join(n3.Dir, "vr")); err != nil {
			t.Fatal(err)
		}
		n3.Start()
	} else {
		t.Log("n3 holds no more than the chain restarted from: joined as it was")
	}
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { return replicationStatus(n3) == "normal" }) {
		t.Fatalf("n3 did not join the restarted chain: %q", replicationStatus(n3))
	}
	checkAcked(t, n3.ClientAddr, acked)
}
