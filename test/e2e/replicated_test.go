package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/faultproxy"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// group is a 3-replica group of real `kefir server` processes.
type group struct {
	t       *testing.T
	nodes   []*cluster.Node
	members string
}

const groupSecret = "e2e-cluster-secret"

func replicaArgs(members string, id int, bootstrap bool) []string {
	return []string{"--members", members, "--replica-id", strconv.Itoa(id), "--cluster-id", "4242",
		"--cluster-secret", groupSecret, "--bootstrap", strconv.FormatBool(bootstrap)}
}

// startGroup starts three replicas, bootstrapping a new group.
func startGroup(t *testing.T) *group {
	t.Helper()
	return startGroupWith(t)
}

// startGroupWith starts three replicas with extra flags on each,
// bootstrapping a new group.
func startGroupWith(t *testing.T, extra ...string) *group {
	t.Helper()
	g := newGroup(t)
	g.start(extra...)
	return g
}

// newGroup describes three nodes and their member list, not started.
func newGroup(t *testing.T) *group {
	t.Helper()
	return newGroupN(t, 3)
}

// newGroupN is newGroup of n nodes (a chain may have any number).
func newGroupN(t *testing.T, n int) *group {
	t.Helper()
	g := &group{t: t}
	var ms []string
	for i := 1; i <= n; i++ {
		n := cluster.NewNode(t, "n"+strconv.Itoa(i))
		g.nodes = append(g.nodes, n)
		ms = append(ms, fmt.Sprintf("%d@%s/%s", i, n.PeerAddr, n.ClientAddr))
	}
	g.members = strings.Join(ms, ",")
	return g
}

// start starts g's nodes with extra flags on each, bootstrapping a new
// group.
func (g *group) start(extra ...string) {
	g.t.Helper()
	for i, n := range g.nodes {
		n.Args = append(replicaArgs(g.members, i+1, true), extra...)
		n.Start()
		// Later starts of the same directory must not bootstrap.
		n.Args = append(replicaArgs(g.members, i+1, false), extra...)
	}
}

type nodeStatus struct {
	Role        string `json:"role"`
	Replication *struct {
		View    uint64 `json:"view"`
		Leader  uint64 `json:"leader"`
		Commit  uint64 `json:"commit_op"`
		Applied uint64 `json:"applied_op"`
	} `json:"replication"`
}

func status(n *cluster.Node) (nodeStatus, error) {
	var st nodeStatus
	hc := http.Client{Timeout: time.Second}
	r, err := hc.Get("http://" + n.HTTPAddr + "/status")
	if err != nil {
		return st, err
	}
	defer r.Body.Close()
	err = json.NewDecoder(r.Body).Decode(&st)
	if err == nil && st.Replication == nil {
		err = errors.New("/status has no replication section")
	}
	return st, err
}

// leader waits until a running node other than skip reports itself leader.
func (g *group) leader(skip int) int {
	g.t.Helper()
	l, ok := testgroup.Leader(len(g.nodes), 20*time.Second, 20*time.Millisecond, func(i int) (bool, uint64) {
		if i == skip || !g.nodes[i].Running() {
			return false, 0
		}
		st, err := status(g.nodes[i])
		return err == nil && st.Role == "leader", 0
	})
	if !ok {
		g.t.Fatal("no leader within 20s")
	}
	return l
}

// settledLeader waits until the group is ready for a workload and returns
// the leader's index: every running node other than skip reports the same
// view and leader, one of them as leader and the rest as followers, and that
// has held for a second. A node that calls itself leader is not enough: a
// fresh group's first leader does so before it has reached its peers, and a
// follower that has not heard it yet (its dials backed off while the peers
// were starting; a loaded box) times out and starts a view change, during
// which writes through it get -UNAVAILABLE no leader by contract. A second
// is over three view-change timeouts (300 ms), so such a follower has
// broken the agreement by then.
func (g *group) settledLeader(skip int) int {
	g.t.Helper()
	l, ok := testgroup.Settled(30*time.Second, time.Second, 20*time.Millisecond, func() (int, bool) {
		l := -1
		var view, leader uint64
		for i, n := range g.nodes {
			if i == skip || !n.Running() {
				continue
			}
			st, err := status(n)
			if err != nil || (st.Role != "leader" && st.Role != "follower") {
				return -1, false
			}
			if leader == 0 {
				view, leader = st.Replication.View, st.Replication.Leader
			} else if st.Replication.View != view || st.Replication.Leader != leader {
				return -1, false
			}
			if st.Role == "leader" {
				l = i
			}
		}
		return l, l >= 0
	})
	if !ok {
		g.t.Fatal("the group did not settle on a leader within 30s")
	}
	return l
}

// caughtUp waits until node i has applied everything the leader committed.
func (g *group) caughtUp(i, leader int) {
	g.t.Helper()
	lst, err := status(g.nodes[leader])
	if err != nil {
		g.t.Fatal(err)
	}
	var st nodeStatus
	if !testgroup.Until(30*time.Second, 20*time.Millisecond, func() bool {
		st, err = status(g.nodes[i])
		return err == nil && st.Replication.Applied >= lst.Replication.Commit
	}) {
		g.t.Fatalf("%s did not catch up to op %d: %+v %v", g.nodes[i].ID, lst.Replication.Commit, st.Replication, err)
	}
}

func (g *group) addrs() []string {
	var out []string
	for _, n := range g.nodes {
		out = append(out, n.ClientAddr)
	}
	return out
}

func dialGroup(t *testing.T, addrs []string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addrs, client.WithRetryUnavailable(15*time.Second), client.WithMaxRetries(5),
		client.WithDialTimeout(time.Second))
	if err != nil {
		t.Fatalf("client.Dial %v: %v", addrs, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// workload runs concurrent clients against a group until stop: durability
// writers putting unique keys with sync through every node in turn, and
// checked clients mixing linearizable reads, puts and CASes on a few keys,
// recorded for the linearizability check.
type workload struct {
	stop     atomic.Bool
	wg       sync.WaitGroup
	ackedMu  sync.Mutex
	acked    map[string]string
	afterCut atomic.Int64 // acknowledged writes after cut was set
	cut      atomic.Bool
	rec      *check.Recorder
}

func startWorkload(t *testing.T, g *group) *workload {
	w := &workload{acked: map[string]string{}, rec: check.NewRecorder(nil)}
	for wi := range 3 {
		c := dialGroup(t, append(g.addrs()[wi:], g.addrs()[:wi]...))
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := 0; !w.stop.Load(); i++ {
				k, v := fmt.Sprintf("w%d-%d", wi, i), fmt.Sprintf("val-%d-%d", wi, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := c.Put(ctx, k, []byte(v), client.WithDurability(client.Sync))
				cancel()
				if err == nil {
					w.ackedMu.Lock()
					w.acked[k] = v
					w.ackedMu.Unlock()
					if w.cut.Load() {
						w.afterCut.Add(1)
					}
				}
			}
		}()
	}
	checkedClients(t, &w.wg, &w.stop, w.rec, g.addrs(), []string{"a", "b", "c"}, 4, nil)
	return w
}

// checkedClients starts n clients (through addrs) that mix reads, puts and
// CASes on keys until stop, recording each op in rec for the checkers: a
// read at level readLevel(rng) (nil: linearizable) that failed has no
// effect, a write that failed may have executed (unknown). Writes are sync.
func checkedClients(t *testing.T, wg *sync.WaitGroup, stop *atomic.Bool, rec *check.Recorder, addrs []string, keys []string, n int, readLevel func(*rand.Rand) level.Consistency) {
	for cid := range n {
		c := dialGroup(t, addrs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cid), 7))
			for i := 0; !stop.Load(); i++ {
				key := keys[rng.IntN(len(keys))]
				op := check.Op{Client: cid, Key: key, Cons: level.ConsLinearizable, Dur: level.Sync}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				switch rng.IntN(4) {
				case 0, 1:
					op.Kind = check.Get
					if readLevel != nil {
						op.Cons = readLevel(rng)
					}
					id := rec.Invoke(op)
					v, err := c.Get(ctx, key, client.WithConsistency(op.Cons))
					switch {
					case err == nil:
						rec.Complete(id, check.Result{Found: true, Value: string(v), Node: -1})
					case errors.Is(err, client.ErrNotFound):
						rec.Complete(id, check.Result{Found: false, Node: -1})
					default:
						rec.Fail(id) // a failed read has no effect
					}
				case 2:
					op.Kind, op.Value = check.Put, fmt.Sprintf("c%d-%d", cid, i)
					id := rec.Invoke(op)
					if err := c.Put(ctx, key, []byte(op.Value), client.WithDurability(client.Sync)); err != nil {
						rec.Unknown(id) // in a replica group any failed write may have executed
					} else {
						rec.Complete(id, check.Result{Node: -1})
					}
				case 3:
					op.Kind, op.Expect, op.Value = check.CAS, fmt.Sprintf("c%d-%d", (cid+1)%n, i-1), fmt.Sprintf("c%d-%d", cid, i)
					id := rec.Invoke(op)
					ok, err := c.CAS(ctx, key, []byte(op.Expect), []byte(op.Value), client.WithDurability(client.Sync))
					if err != nil {
						rec.Unknown(id)
					} else {
						rec.Complete(id, check.Result{Found: ok, Node: -1})
					}
				}
				cancel()
			}
		}()
	}
}

// finish stops the clients and checks: writes were acknowledged after the
// fault, every acknowledged sync write is on every node (eventual reads at
// each node are served from its own state), and the checked history is
// linearizable.
func (w *workload) finish(t *testing.T, g *group) {
	t.Helper()
	w.stop.Store(true)
	w.wg.Wait()
	if w.afterCut.Load() == 0 {
		t.Fatal("no write was acknowledged after the fault")
	}
	w.ackedMu.Lock()
	defer w.ackedMu.Unlock()
	t.Logf("%d sync writes acknowledged (%d after the fault)", len(w.acked), w.afterCut.Load())
	cur := g.leader(-1)
	for i, n := range g.nodes {
		g.caughtUp(i, cur)
		c := dialGroup(t, []string{n.ClientAddr})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		missing := 0
		for k, v := range w.acked {
			got, err := c.Get(ctx, k, client.WithConsistency(client.Eventual))
			if err != nil || string(got) != v {
				if missing < 5 {
					t.Errorf("%s: acknowledged %s=%s, read %q (%v)", n.ID, k, v, got, err)
				}
				missing++
			}
		}
		cancel()
		if missing > 0 {
			t.Fatalf("%s lost %d of %d acknowledged sync writes", n.ID, missing, len(w.acked))
		}
	}
	h := w.rec.History()
	v := check.Linearizable(h, check.LinOptions{Timeout: 30 * time.Second, Strict: true})
	if !v.OK {
		t.Fatalf("history of %d ops is not linearizable: %+v", len(h.Ops), v)
	}
	t.Logf("linearizable: %d ops checked", v.Checked)
}

// A 3-node group under concurrent clients: writes through any node, the
// leader SIGKILLed mid-load, the killed node restarted, a follower SIGSTOPped
// then resumed, then the leader SIGSTOPped past its lease and resumed.
func TestReplicatedGroupUnderKillsAndPauses(t *testing.T) {
	g := startGroup(t)
	l := g.settledLeader(-1)

	// redis-cli works through any node: followers forward to the leader.
	for i, n := range g.nodes {
		if got := redisCLI(t, n.ClientAddr, "SET", "cli"+strconv.Itoa(i), "v"+strconv.Itoa(i)); got != "OK" {
			t.Fatalf("redis-cli SET via %s = %q", n.ID, got)
		}
		if got := redisCLI(t, n.ClientAddr, "GET", "cli0"); got != "v0" {
			t.Fatalf("redis-cli GET via %s = %q", n.ID, got)
		}
	}

	w := startWorkload(t, g)
	time.Sleep(time.Second)
	// SIGKILL the leader mid-load.
	g.nodes[l].Kill()
	w.rec.Crash(l)
	w.cut.Store(true)
	nl := g.leader(l)
	t.Logf("killed leader %s; new leader %s", g.nodes[l].ID, g.nodes[nl].ID)
	time.Sleep(time.Second)

	// Restart the killed node (no bootstrap: it rejoins from its log).
	g.nodes[l].Start()
	time.Sleep(500 * time.Millisecond)

	// SIGSTOP a follower for longer than the view-change timeout, then resume.
	f := 3 - l - nl
	g.nodes[f].Pause()
	time.Sleep(800 * time.Millisecond)
	g.nodes[f].Resume()
	time.Sleep(time.Second)

	// SIGSTOP the leader past its lease and the view-change timeout: the
	// others elect a new leader; when the old one resumes, clients still
	// talking to it must not read stale values (the history check).
	pl := g.leader(-1)
	g.nodes[pl].Pause()
	npl := g.leader(pl)
	time.Sleep(500 * time.Millisecond)
	g.nodes[pl].Resume()
	t.Logf("paused leader %s; %s took over; resumed", g.nodes[pl].ID, g.nodes[npl].ID)
	time.Sleep(time.Second)

	w.finish(t, g)
}

// The leader is cut off from its peers by fault proxies on every peer link
// while clients can still reach it: the others elect a new leader, the
// isolated one must neither acknowledge writes nor serve stale linearizable
// reads, and after the partition heals it rejoins and catches up.
func TestReplicatedGroupLeaderPartition(t *testing.T) {
	g := &group{t: t}
	for i := 1; i <= 3; i++ {
		g.nodes = append(g.nodes, cluster.NewNode(t, "n"+strconv.Itoa(i)))
	}
	var ups []string
	for _, n := range g.nodes {
		ups = append(ups, n.PeerAddr)
	}
	mesh, err := faultproxy.NewMesh(ups, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mesh.Close() })
	// Node i reaches node j through proxy (i, j); the ids (and so the
	// configuration) are the same on every node, only the addresses differ.
	for i, n := range g.nodes {
		var ms []string
		for j, m := range g.nodes {
			peer := m.PeerAddr
			if i != j {
				peer = mesh.Addr(i, j)
			}
			ms = append(ms, fmt.Sprintf("%d@%s/%s", j+1, peer, m.ClientAddr))
		}
		n.Args = replicaArgs(strings.Join(ms, ","), i+1, true)
		n.Start()
		n.Args = replicaArgs(strings.Join(ms, ","), i+1, false)
	}
	l := g.leader(-1)
	w := startWorkload(t, g)
	time.Sleep(time.Second)
	mesh.Isolate(l)
	w.cut.Store(true)
	nl := g.leader(l)
	t.Logf("isolated leader %s; new leader %s", g.nodes[l].ID, g.nodes[nl].ID)
	time.Sleep(1500 * time.Millisecond)
	mesh.Heal()
	time.Sleep(time.Second)
	w.finish(t, g)
}

// The linearizability check above must be able to fail on this kind of
// history: a read that returns a value no write produced.
func TestLinearizabilityCheckCatchesAStaleRead(t *testing.T) {
	rec := check.NewRecorder(nil)
	w := rec.Invoke(check.Op{Client: 0, Kind: check.Put, Key: "a", Value: "1", Cons: level.ConsLinearizable})
	rec.Complete(w, check.Result{Node: -1})
	w = rec.Invoke(check.Op{Client: 0, Kind: check.Put, Key: "a", Value: "2", Cons: level.ConsLinearizable})
	rec.Complete(w, check.Result{Node: -1})
	r := rec.Invoke(check.Op{Client: 1, Kind: check.Get, Key: "a", Cons: level.ConsLinearizable})
	rec.Complete(r, check.Result{Found: true, Value: "1", Node: -1}) // stale: 2 was acknowledged before
	if v := check.Linearizable(rec.History(), check.LinOptions{NoVisualization: true}); v.OK {
		t.Fatal("a stale read passed the linearizability check")
	}
}

// A node given a member list that differs from the group's is refused by its
// peers (and says so in its log); a data directory restarted with another
// cluster id is refused at start.
func TestWrongMemberListIsRefused(t *testing.T) {
	g := startGroup(t)
	g.leader(-1)
	n3 := g.nodes[2]
	n3.Kill()

	// Same data directory, another cluster id: the node refuses to start.
	bad := cluster.NewNode(t, "n3-stale")
	bad.Dir, bad.ClientAddr, bad.PeerAddr, bad.HTTPAddr = n3.Dir, n3.ClientAddr, n3.PeerAddr, n3.HTTPAddr
	bad.Args = append(replicaArgs(g.members, 3, false), "--cluster-id", "999")
	startExpectExit(t, bad)
	if !strings.Contains(bad.Logs(), "configuration does not match the data directory") {
		t.Fatalf("stale config not refused with a clear log line:\n%s", bad.Logs())
	}

	// A fresh directory with the members in another order (another leader
	// order, so another configuration): the group refuses its connections.
	parts := strings.Split(g.members, ",")
	wrong := strings.Join([]string{parts[2], parts[1], parts[0]}, ",")
	imp := cluster.NewNode(t, "n3-wrong")
	imp.ClientAddr, imp.PeerAddr = n3.ClientAddr, n3.PeerAddr
	imp.Args = replicaArgs(wrong, 3, false)
	imp.Start()
	if !testgroup.Until(15*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(imp.Logs(), "fix the cluster configuration") }) {
		t.Fatalf("wrong member list: no refusal logged:\n%s", imp.Logs())
	}
	if st, err := status(imp); err == nil && (st.Role == "leader" || st.Role == "follower") {
		t.Fatalf("node with a wrong member list joined as %s", st.Role)
	}
	found := false
	for _, n := range g.nodes[:2] {
		found = found || strings.Contains(n.Logs(), "belongs to a different cluster or configuration")
	}
	if !found {
		t.Fatal("the group's nodes did not log the refused peer")
	}
}

// startExpectExit runs n expecting it to refuse to start (exit non-zero).
func startExpectExit(t *testing.T, n *cluster.Node) {
	t.Helper()
	if err := n.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if code := n.Wait(20 * time.Second); code == 0 {
		t.Fatalf("%s started (exit code 0), want a refusal", n.ID)
	}
}

// TestRestartedFollowerKeepsTheLeader (issue 25 item 5): a follower killed
// (SIGKILL, or SIGTERM every other time), left down for 1.5 s and
// restarted under a write load
// rejoins the current view as a follower: no view change, and not one write
// fails. Before the fix the group went through 1–3 view changes 1.1–1.3 s
// after the follower came back and writes failed with UNAVAILABLE no leader
// for 0.3–1 s: the follower, not hearing the leader yet, started a view
// change that the leader joined at once. The writers' client does not retry
// UNAVAILABLE, so every such refusal counts. Two restarts here (about 10 s);
// the 20 (about 70 s; make soak covers ./internal/... only):
//
//	KEFIR_SOAK=1 go test -count=1 -run TestRestartedFollowerKeepsTheLeader -v ./test/e2e/
func TestRestartedFollowerKeepsTheLeader(t *testing.T) {
	restarts := 2
	if os.Getenv("KEFIR_SOAK") == "1" {
		restarts = 20
	}
	g := startGroup(t)
	l := g.settledLeader(-1)
	st, err := status(g.nodes[l])
	if err != nil {
		t.Fatal(err)
	}
	view := st.Replication.View
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := client.Dial(ctx, g.addrs(), client.WithDialTimeout(time.Second))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var errMu sync.Mutex
	var errs []string
	for wi := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := c.Put(ctx, fmt.Sprintf("r%d-%d", wi, i), []byte("v"), client.WithDurability(client.Sync))
				cancel()
				if err == nil {
					ok.Add(1)
					continue
				}
				failed.Add(1)
				errMu.Lock()
				if len(errs) < 5 {
					errs = append(errs, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
				}
				errMu.Unlock()
			}
		}()
	}
	for k := range restarts {
		f := (l + 1 + k%2) % 3
		if k%2 == 0 {
			g.nodes[f].Kill()
		} else {
			g.nodes[f].Stop()
		}
		// Down long enough for the leader's redials to back off past the
		// view-change timeout (transport: 50 ms doubling, up to 2 s): the
		// returning follower then hears nothing from the leader for a while.
		time.Sleep(1500 * time.Millisecond)
		g.nodes[f].Start()
		t.Logf("%s restarted (%d of %d) at %s", g.nodes[f].ID, k+1, restarts, time.Now().Format("15:04:05.000"))
		// The disruption came 1.1–1.3 s after the follower was back.
		time.Sleep(1600 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d restarts: %d writes acknowledged, %d failed", restarts, ok.Load(), failed.Load())
	for i, n := range g.nodes {
		st, err := status(n)
		if err != nil {
			t.Fatalf("%s: %v", n.ID, err)
		}
		if st.Replication.View != view {
			t.Errorf("%s is in view %d, the group was in view %d before the restarts", n.ID, st.Replication.View, view)
		}
		if want := map[bool]string{true: "leader", false: "follower"}[i == l]; st.Role != want {
			t.Errorf("%s is %s, want %s", n.ID, st.Role, want)
		}
	}
	if failed.Load() > 0 {
		t.Errorf("%d writes failed while followers restarted, e.g. %v", failed.Load(), errs)
	}
	if ok.Load() == 0 {
		t.Fatal("no write was acknowledged")
	}
}
