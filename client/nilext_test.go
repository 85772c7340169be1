package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/faultproxy"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// nxGroup is an in-process --nilext replica group with a fault proxy on
// every link: front[i] in front of node i's client port (what KEFIR.TOPOLOGY
// advertises, so the client's broadcast goes through it) and a mesh on the
// peer links. direct[i] is node i's real client address.
type nxGroup struct {
	nodes  []*server.Server
	front  []*faultproxy.Proxy
	mesh   *faultproxy.Mesh
	direct []string
}

func startNilextGroup(t testing.TB, n int) *nxGroup {
	t.Helper()
	addrs, release := testgroup.HoldLoopbackAddrs(t, 2*n)
	peers, clients := addrs[:n], addrs[n:]
	g := &nxGroup{direct: clients}
	mesh, err := faultproxy.NewMesh(peers, 1)
	if err != nil {
		t.Fatal(err)
	}
	g.mesh = mesh
	t.Cleanup(func() { mesh.Close() })
	for i := range n {
		p, err := faultproxy.New(clients[i], uint64(100+i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		g.front = append(g.front, p)
	}
	release()
	for i := range n {
		var ms []server.Member
		for j := range n {
			peer := peers[j]
			if j != i {
				peer = mesh.Addr(i, j)
			}
			ms = append(ms, server.Member{ID: uint64(j + 1), PeerAddr: peer, ClientAddr: g.front[j].Addr()})
		}
		s, err := server.New(server.Config{
			NodeID: fmt.Sprint("n", i+1), ClientAddr: clients[i], PeerAddr: peers[i],
			DataDir: t.TempDir(), ClusterSecret: "s", Members: ms, OpenReplica: vrshard.OpenHosted, ReplicaID: uint64(i + 1), ClusterID: 9,
			Bootstrap: true, Nilext: true, ViewChangeTimeout: time.Second, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		g.nodes = append(g.nodes, s)
	}
	return g
}

// dialAll returns a client of every node's real address, leader first.
func (g *nxGroup) dial(t testing.TB, opts ...Option) *Client {
	t.Helper()
	l := g.leader(t)
	addrs := []string{g.direct[l]}
	for i, a := range g.direct {
		if i != l && g.nodes[i] != nil {
			addrs = append(addrs, a)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]Option{WithPoolSize(2), WithRetryUnavailable(10 * time.Second), WithMaxRetries(5)}, opts...)
	c, err := Dial(ctx, addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (g *nxGroup) leader(t testing.TB) int {
	t.Helper()
	return leaderOf(t, g.nodes)
}

// runWorkload drives workers closed-loop on keys prefix+"r0".."r2" through
// one shared client: nilext Puts (sync and cad), linearizable Gets, CASes
// and Deletes (ordered). A write with any error is recorded as unknown (it
// may have happened), a read with an error as failed (it had no effect).
// mid, if set, runs once a third of the operations are done.
func runWorkload(t *testing.T, c *Client, prefix string, workers, ops int, mid func()) check.History {
	t.Helper()
	rec := check.NewRecorder(nil)
	var wg sync.WaitGroup
	var done sync.WaitGroup
	done.Add(1)
	var progress sync.Once
	var count int64
	var mu sync.Mutex
	for w := range workers {
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ops {
				mu.Lock()
				count++
				if count == int64(workers*ops/3) {
					progress.Do(done.Done)
				}
				mu.Unlock()
				key := prefix + "r" + strconv.Itoa(rng.IntN(3))
				op := check.Op{Client: w, Key: key, Cons: level.ConsLinearizable, Dur: level.Sync}
				opStart := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				var err error
				var res check.Result
				res.Node = -1
				switch p := rng.IntN(20); {
				case p < 10:
					op.Kind, op.Value = check.Put, fmt.Sprintf("w%d-%d", w, i)
					d := Sync
					if p%2 == 1 {
						d, op.Dur = CAD, level.CAD
					}
					id := rec.Invoke(op)
					err = c.Put(ctx, key, []byte(op.Value), WithDurability(d))
					finishWrite(rec, id, err, res)
				case p < 16:
					op.Kind = check.Get
					id := rec.Invoke(op)
					var v []byte
					v, err = c.Get(ctx, key, WithConsistency(Linearizable))
					if finishRead(rec, id, v, err, res) != nil {
						rec.Fail(id)
					}
				case p < 19:
					op.Kind, op.Value = check.CAS, fmt.Sprintf("w%d-%d", w, i)
					op.Expect = fmt.Sprintf("w%d-%d", rng.IntN(workers), rng.IntN(max(i, 1)))
					id := rec.Invoke(op)
					var ok bool
					ok, err = c.CAS(ctx, key, []byte(op.Expect), []byte(op.Value))
					res.Found = ok
					finishWrite(rec, id, err, res)
				default:
					op.Kind = check.Delete
					id := rec.Invoke(op)
					_, err = c.Delete(ctx, key)
					finishWrite(rec, id, err, res)
				}
				cancel()
				if d := time.Since(opStart); d > 5*time.Second {
					t.Logf("slow op %v (%v): %v", op.Kind, d, err)
				}
			}
		}()
	}
	if mid != nil {
		done.Wait()
		mid()
	}
	wg.Wait()
	return rec.History()
}

var debugErrs = func(error) {}

func finishWrite(rec *check.Recorder, id int, err error, res check.Result) {
	if err != nil {
		debugErrs(err)
		rec.Unknown(id)
		return
	}
	rec.Complete(id, res)
}

// finishRead records a Get's outcome: found, or not found, completes the op
// with res (its Found and Value filled in); any other error is returned and the
// op left to the caller.
func finishRead(rec *check.Recorder, id int, v []byte, err error, res check.Result) error {
	switch {
	case err == nil:
		res.Found, res.Value = true, string(v)
	case errors.Is(err, ErrNotFound):
	default:
		return err
	}
	rec.Complete(id, res)
	return nil
}

func mustLinearizable(t *testing.T, h check.History) {
	t.Helper()
	unknown := 0
	for _, o := range h.Ops {
		if o.Outcome == check.Unknown {
			unknown++
		}
	}
	t.Logf("%d ops, %d with unknown outcome", len(h.Ops), unknown)
	if v := check.Linearizable(h, check.LinOptions{NoVisualization: true, Strict: true}); !v.OK {
		t.Fatalf("not linearizable:\n%s", v)
	}
}

// The Go client's own broadcast: Puts complete on a supermajority (here all
// three replicas, the leader's ack included) in one round trip, and a
// history of concurrent Puts, linearizable Gets, CASes and Deletes is
// linearizable.
func TestNilextBroadcastIsLinearizable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	g := startNilextGroup(t, 3)
	c := g.dial(t, WithNilext(time.Second, 0))
	h := runWorkload(t, c, "a", 4, 80, nil)
	mustLinearizable(t, h)
	st := c.NilextStats()
	if st.Fast == 0 || st.Fallbacks != 0 {
		t.Fatalf("nilext stats %+v: want fast writes and no fallback on a healthy group", st)
	}
	// MultiPut takes the fast path too.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.MultiPut(ctx, []KV{{"m1", []byte("x")}, {"m2", []byte("y")}}); err != nil {
		t.Fatal(err)
	}
	if got := c.NilextStats().Fast; got != st.Fast+1 {
		t.Fatalf("MultiPut: fast writes %d -> %d", st.Fast, got)
	}
	vs, err := c.MultiGet(ctx, []string{"m1", "m2"})
	if err != nil || string(vs[0]) != "x" || string(vs[1]) != "y" {
		t.Fatalf("MultiGet after MultiPut = %q, %v", vs, err)
	}
}

// With several connections per member (WithNilextConns) batches of one
// member go out concurrently; with 5 replicas a write may then overtake the
// same lane's previous one at a member that had not acked it yet. The
// history stays linearizable, the writes take the fast path, and the
// concurrent writers' batches still carry more than one write in all.
func TestNilextSeveralConnsPerMemberIsLinearizable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts replica groups")
	}
	for _, n := range []int{3, 5} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			g := startNilextGroup(t, n)
			c := g.dial(t, WithNilext(time.Second, 0), WithNilextConns(3))
			if c.nx == nil || c.nx.opts.conns != 3 {
				t.Fatalf("WithNilextConns(3) after WithNilext: conns %+v", c.nx)
			}
			h := runWorkload(t, c, "s", 8, 60, nil)
			mustLinearizable(t, h)
			st := c.NilextStats()
			if st.Fast == 0 || st.Fallbacks != 0 {
				t.Fatalf("nilext stats %+v: want fast writes and no fallback on a healthy group", st)
			}
			if st.Batches == 0 || st.Items < st.Fast*uint64(n-1) {
				t.Fatalf("nilext stats %+v: batches do not account for the fast writes' copies", st)
			}
			for _, m := range c.nx.members {
				if len(m.slots) != 3 {
					t.Fatalf("member %d has %d slots, want 3", m.i, len(m.slots))
				}
			}
		})
	}
}

// With one replica unreachable no supermajority exists (3 of 3 needed): a
// write falls back to the ordered path with its id after the timeout, the
// fast path rests, and the history stays linearizable. Once the replica is
// back, writes return to the fast path after the backoff.
func TestNilextFallbackWhileAReplicaIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	g := startNilextGroup(t, 3)
	l := leaderOf(t, g.nodes)
	f := (l + 1) % 3
	c := g.dial(t, WithNilext(30*time.Millisecond, 300*time.Millisecond))
	// Cut the follower off from everyone, the client's broadcast included.
	g.mesh.Isolate(f)
	g.front[f].Blackhole(faultproxy.Up, true)
	g.front[f].Blackhole(faultproxy.Down, true)
	h := runWorkload(t, c, "b", 3, 60, nil)
	mustLinearizable(t, h)
	st := c.NilextStats()
	if st.Fast != 0 || st.Fallbacks == 0 || st.Rested == 0 {
		t.Fatalf("nilext stats %+v with a replica down: want fallbacks and rested writes, no fast write", st)
	}
	// Bytes the partition ate are lost, so its connections are cut too (a
	// real network would have retransmitted them).
	g.mesh.Heal()
	g.mesh.CutAll(f)
	g.front[f].Heal()
	g.front[f].CutAll()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; c.NilextStats().Fast == 0; i++ {
		if ctx.Err() != nil {
			t.Fatalf("no write returned to the fast path after the replica came back: %+v", c.NilextStats())
		}
		if err := c.Put(ctx, "back", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, err := c.Get(ctx, "back"); err != nil || len(v) == 0 {
		t.Fatalf("Get back = %q, %v", v, err)
	}
}

// A leader that stops mid-load: writes in flight fall back (or are unknown),
// the group elects a new leader, the history stays linearizable, and with
// five replicas the four left are a supermajority, so writes take the fast
// path again in the new view.
func TestNilextLeaderChangeMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 5-node group")
	}
	g := startNilextGroup(t, 5)
	l := leaderOf(t, g.nodes)
	c := g.dial(t, WithNilext(50*time.Millisecond, 200*time.Millisecond))
	// The fast path must be in use before the leader stops: on a loaded
	// machine the workload's first writes can all miss the 50 ms window and
	// rest the path until after the stop (CI saw 0 fast writes before it).
	warm, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; c.NilextStats().Fast == 0; i++ {
		if warm.Err() != nil {
			t.Fatalf("no fast write before the leader stopped: %+v", c.NilextStats())
		}
		if err := c.Put(warm, "warm", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	var fastBefore uint64
	h := runWorkload(t, c, "c", 4, 90, func() {
		fastBefore = c.NilextStats().Fast
		t0 := time.Now()
		defer func() { t.Logf("leader stopped in %v", time.Since(t0)) }()
		g.nodes[l].Close()
		g.nodes[l] = nil
		g.front[l].Close() // a dead node's port refuses connections
	})
	t.Logf("workload done")
	mustLinearizable(t, h)
	st := c.NilextStats()
	t.Logf("stats %+v", st)
	if fastBefore == 0 || st.Fast <= fastBefore {
		t.Fatalf("nilext stats %+v (fast %d before the leader stopped): want fast writes before and after the change", st, fastBefore)
	}
}

// The checks above can fail: a client that completes a write on the first
// ack it gets (here a follower's: the leader and the other follower do not
// hear the broadcast) reports a write the leader never orders, and a
// linearizable read at the leader misses it; the history is caught. The
// real rule, in the same setup, falls back and stays linearizable.
func TestNilextFirstAckRuleIsCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	for _, wrong := range []bool{true, false} {
		g := startNilextGroup(t, 3)
		l := leaderOf(t, g.nodes)
		f := (l + 1) % 3
		for i := range g.front {
			if i != f {
				g.front[i].Blackhole(faultproxy.Up, true)
			}
		}
		c := g.dial(t, WithNilext(100*time.Millisecond, 0))
		c.nx.mutFirstAck = wrong
		rec := check.NewRecorder(nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for i := range 3 {
			op := check.Op{Client: 0, Kind: check.Put, Key: "k", Value: strconv.Itoa(i), Cons: level.ConsLinearizable, Dur: level.Sync}
			id := rec.Invoke(op)
			finishWrite(rec, id, c.Put(ctx, "k", []byte(op.Value)), check.Result{Node: -1})
			id = rec.Invoke(check.Op{Client: 0, Kind: check.Get, Key: "k", Cons: level.ConsLinearizable})
			v, err := c.Get(ctx, "k")
			if err := finishRead(rec, id, v, err, check.Result{Node: -1}); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		v := check.Linearizable(rec.History(), check.LinOptions{NoVisualization: true})
		if wrong && v.OK {
			t.Fatal("completing on the first (follower's) ack passed the linearizability check")
		}
		if !wrong && !v.OK {
			t.Fatalf("the supermajority rule with fallback is not linearizable:\n%s", v)
		}
		if st := c.NilextStats(); !wrong && st.Fast != 0 {
			t.Fatalf("nilext stats %+v: no write can complete fast without the leader's ack", st)
		}
	}
}

// The client's completion rule is internal/vr's NilextTracker (the client
// may not import it): random ack sequences give the same verdict, and the
// rule refuses what it must.
func TestNilextAckRuleMatchesTheCore(t *testing.T) {
	for _, n := range []int{3, 5, 7} {
		members := make([]uint64, n)
		for i := range members {
			members[i] = uint64(10 + i)
		}
		topo := &topology{on: true, members: members, need: nilextSupermajority(n)}
		if topo.need != vr.NilextSupermajority(n) {
			t.Fatalf("n=%d: client supermajority %d, core %d", n, topo.need, vr.NilextSupermajority(n))
		}
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		for trial := range 2000 {
			tr := ackTracker{t: topo}
			core := vr.NewNilextTracker(members)
			for range rng.IntN(3 * n) {
				i := rng.IntN(n)
				a := nilextAck{member: i, view: uint64(rng.IntN(3)), from: members[i], leader: rng.IntN(2) == 0}
				got := tr.add(a)
				want := core.Add(vr.NilextAck{From: a.from, View: a.view, Leader: a.leader})
				if got != want {
					t.Fatalf("n=%d trial %d: client says %v, core %v after %+v", n, trial, got, want, a)
				}
				if got {
					break
				}
			}
		}
	}
	topo := &topology{on: true, members: []uint64{1, 2, 3}, need: 3}
	// All three in view 4 (led by members[4%3] = 2), but nobody claims to lead.
	tr := ackTracker{t: topo}
	for i := range 3 {
		if tr.add(nilextAck{member: i, view: 4, from: uint64(i + 1)}) {
			t.Fatal("completed without the leader's ack")
		}
	}
	// A claim to lead by a replica that does not lead that view is ignored.
	tr = ackTracker{t: topo}
	for i := range 3 {
		if tr.add(nilextAck{member: i, view: 4, from: uint64(i + 1), leader: i == 0}) {
			t.Fatal("believed replica 1 leads view 4")
		}
	}
	// Acks split across views do not add up.
	tr = ackTracker{t: topo}
	tr.add(nilextAck{member: 0, view: 3, from: 1, leader: true})
	tr.add(nilextAck{member: 1, view: 3, from: 2})
	if tr.add(nilextAck{member: 2, view: 4, from: 3}) {
		t.Fatal("completed on acks of two views")
	}
	// An ack from a node that is not the member asked does not count.
	tr = ackTracker{t: topo}
	tr.add(nilextAck{member: 0, view: 3, from: 1, leader: true})
	tr.add(nilextAck{member: 1, view: 3, from: 2})
	if tr.add(nilextAck{member: 2, view: 3, from: 2}) {
		t.Fatal("counted member 3's slot answered by replica 2")
	}
}

// BenchmarkNilextPut: Put latency and client allocations, fast path vs the
// ordered path, on an in-process 3-replica group with no delay (so it
// measures CPU and fsyncs, not the round trips the fast path saves; for
// those see bench/nilextbench).
//
// Run: go test -run '^$' -bench NilextPut -benchmem -benchtime 2000x ./client/
func BenchmarkNilextPut(b *testing.B) {
	g := startNilextGroup(b, 3)
	val := []byte("value-0123456789abcdef")
	for _, d := range []Durability{CAD, Sync} {
		for _, fast := range []bool{true, false} {
			name := fmt.Sprintf("%s/ordered", d)
			var opts []Option
			if fast {
				name = fmt.Sprintf("%s/nilext", d)
				opts = append(opts, WithNilext(time.Second, 0))
			}
			b.Run(name, func(b *testing.B) {
				c := g.dial(b, opts...)
				ctx := context.Background()
				if err := c.Put(ctx, "warm", val); err != nil {
					b.Fatal(err)
				}
				before := c.NilextStats()
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if err := c.Put(ctx, "k"+strconv.Itoa(i%1000), val, WithDurability(d)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if fast {
					b.ReportMetric(float64(c.NilextStats().Fast-before.Fast)/float64(b.N), "fast/op")
				}
			})
		}
	}
}
