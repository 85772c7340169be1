package vrshard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
)

// cluster is n replicas in this process on loopback TCP, each on its own
// directory under t.TempDir().
type cluster struct {
	t     testing.TB
	ids   []uint64
	dirs  []string
	peers map[uint64]string
	reps  []*Replica
	tune  func(*Options)
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("VRSHARD_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newCluster(t testing.TB, n int, tune func(*Options)) *cluster {
	t.Helper()
	c := &cluster{t: t, peers: map[uint64]string{}, tune: tune}
	lns := make([]net.Listener, n)
	for i := range n {
		id := uint64(i + 1)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		c.ids = append(c.ids, id)
		c.dirs = append(c.dirs, t.TempDir())
		c.peers[id] = ln.Addr().String()
	}
	c.reps = make([]*Replica, n)
	for i := range n {
		c.open(i, true, lns[i])
	}
	t.Cleanup(c.closeAll)
	return c
}

func (c *cluster) options(i int, bootstrap bool, ln net.Listener) Options {
	o := Options{
		Dir: c.dirs[i],
		VR: vr.Config{Cluster: 77, Epoch: 1, Members: c.ids, Self: c.ids[i],
			HeartbeatInterval: 10 * time.Millisecond, ViewChangeTimeout: time.Second, // a loaded CI box stalls processes for 100s of ms
			LeaseDuration: 800 * time.Millisecond, MaxDrift: 0.01},
		Bootstrap: bootstrap, Peers: c.peers, ClusterSecret: "test-secret", Listener: ln,
		ClientAddrs: map[uint64]string{},
		Logger:      testLogger(c.t),
	}
	for _, id := range c.ids {
		o.ClientAddrs[id] = "client-" + strconv.FormatUint(id, 10)
	}
	if c.tune != nil {
		c.tune(&o)
	}
	return o
}

func (c *cluster) open(i int, bootstrap bool, ln net.Listener) {
	c.t.Helper()
	if ln == nil {
		var err error
		for try := 0; ; try++ {
			ln, err = net.Listen("tcp", c.peers[c.ids[i]])
			if err == nil {
				break
			}
			if try == 50 {
				c.t.Fatalf("relisten on %s: %v", c.peers[c.ids[i]], err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	r, err := Open(c.options(i, bootstrap, ln))
	if err != nil {
		c.t.Fatalf("open replica %d: %v", c.ids[i], err)
	}
	c.reps[i] = r
}

func (c *cluster) closeAll() {
	for i, r := range c.reps {
		if r != nil {
			r.Close()
			c.reps[i] = nil
		}
	}
}

// kill stops replica i as a process kill would.
func (c *cluster) kill(i int) {
	c.reps[i].crash()
	c.reps[i] = nil
}

// leader waits until one live replica leads and returns its index.
func (c *cluster) leader(timeout time.Duration) int {
	c.t.Helper()
	l, ok := testgroup.Leader(len(c.reps), timeout, testgroup.Interval, func(i int) (bool, uint64) {
		if c.reps[i] == nil {
			return false, 0
		}
		in := c.reps[i].Info()
		return in.IsLeader, in.View
	})
	if !ok {
		c.t.Fatalf("no leader within %v", timeout)
	}
	return l
}

func (c *cluster) index(id uint64) int {
	for i, x := range c.ids {
		if x == id {
			return i
		}
	}
	return -1
}

// write sends a write to the leader, following redirects and retrying with
// the same request id until it succeeds or the timeout passes.
func (c *cluster) write(op kv.Op, id shard.ReqID, timeout time.Duration) (kv.Result, error) {
	deadline := time.Now().Add(timeout)
	target := c.leader(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var res kv.Result
		err := errors.New("replica down")
		if r := c.reps[target]; r != nil {
			res, err = r.Write(ctx, op, level.Sync, id)
		}
		cancel()
		if err == nil || !errors.Is(err, shard.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, shard.ErrClosed) {
			return res, err
		}
		if time.Now().After(deadline) {
			return res, err
		}
		if lid, _, ok := LeaderOf(err); ok && c.reps[c.index(lid)] != nil {
			target = c.index(lid)
		} else {
			time.Sleep(10 * time.Millisecond)
			target = c.leader(time.Until(deadline))
		}
	}
}

func set(k, v string) kv.Op {
	return kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte(v)}
}

func get(k string) kv.Op { return kv.Op{Kind: kv.KindGet, Key: []byte(k)} }

// waitEvery waits until cond holds for every live replica and returns how
// long that took, and whether it happened within timeout.
func (c *cluster) waitEvery(timeout time.Duration, cond func(r *Replica) bool) (time.Duration, bool) {
	start := time.Now()
	ok := testgroup.Until(timeout, time.Millisecond, func() bool {
		for _, r := range c.reps {
			if r != nil && !cond(r) {
				return false
			}
		}
		return true
	})
	return time.Since(start), ok
}

// appliedOp is a waitEvery condition: the replica applied at least op.
func appliedOp(op uint64) func(r *Replica) bool {
	return func(r *Replica) bool { return r.Info().Applied >= op }
}

// waitApplied waits until every live replica applied at least op.
func (c *cluster) waitApplied(op uint64, timeout time.Duration) {
	c.t.Helper()
	if _, ok := c.waitEvery(timeout, appliedOp(op)); !ok {
		for _, r := range c.reps {
			if r != nil {
				c.t.Logf("replica %+v", r.Info())
			}
		}
		c.t.Fatalf("replicas did not apply op %d within %v", op, timeout)
	}
}

func (c *cluster) expectValue(i int, k, want string) {
	c.t.Helper()
	res, err := c.reps[i].Read(context.Background(), get(k), level.ConsEventual, shard.Session{})
	// A replica that just restarted, recovered or changed view serves
	// eventual reads once a leader holding its lease has answered one of
	// its prepare-oks (vr EventualUntil): a heartbeat or two.
	var nl *NotLeaderError
	for deadline := time.Now().Add(5 * time.Second); (errors.As(err, &nl) || errors.Is(err, ErrCannotServe)) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		res, err = c.reps[i].Read(context.Background(), get(k), level.ConsEventual, shard.Session{})
	}
	if err != nil {
		c.t.Fatalf("replica %d: get %s: %v", c.ids[i], k, err)
	}
	if string(res.Bulk) != want {
		c.t.Fatalf("replica %d: get %s = %q (kind %d), want %q", c.ids[i], k, res.Bulk, res.Kind, want)
	}
}

func TestWritesReplicateToEveryReplicaAndSurviveRestart(t *testing.T) {
	c := newCluster(t, 3, nil)
	const n = 100
	var last uint64
	for i := range n {
		res, err := c.write(set(fmt.Sprint("k", i), fmt.Sprint("v", i)), shard.ReqID{Client: 9, Seq: uint64(i + 1)}, 5*time.Second)
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if res.Kind != kv.ResOK || res.Version <= last {
			t.Fatalf("write %d: result %+v after version %d: versions are op numbers and grow", i, res, last)
		}
		last = res.Version
	}
	inc, err := c.write(kv.Op{Kind: kv.KindIncrBy, Key: []byte("ctr"), Delta: 5}, shard.ReqID{}, 5*time.Second)
	if err != nil || inc.Int != 5 {
		t.Fatalf("incr without request id: %+v, %v", inc, err)
	}
	c.waitApplied(inc.Version, 5*time.Second)
	for i := range c.reps {
		c.expectValue(i, "k0", "v0")
		c.expectValue(i, fmt.Sprint("k", n-1), fmt.Sprint("v", n-1))
		c.expectValue(i, "ctr", "5")
	}
	// Every replica persisted the writes: restart all of them at once.
	c.closeAll()
	for i := range c.reps {
		c.open(i, false, nil)
	}
	l := c.leader(10 * time.Second)
	res, err := c.reps[l].Read(context.Background(), get("k42"), level.ConsLinearizable, shard.Session{})
	if err != nil || string(res.Bulk) != "v42" {
		t.Fatalf("after restart: linearizable get k42 = %+v, %v", res, err)
	}
	// A retry of an executed request is answered from the client table, not
	// executed again, even after the restart.
	again, err := c.write(kv.Op{Kind: kv.KindIncrBy, Key: []byte("ctr2"), Delta: 1}, shard.ReqID{Client: 9, Seq: n}, 5*time.Second)
	if err != nil || again.Kind != kv.ResOK || again.Version != last {
		t.Fatalf("retry of request (9,%d) after restart: %+v, %v; want the cached OK at version %d", n, again, err, last)
	}
}

func TestFollowerRedirectsWritesAndStrongReads(t *testing.T) {
	// The follower must apply the leader's write within FollowerWait to serve the
	// session read below; on a loaded CI machine 50 ms is not always enough.
	c := newCluster(t, 3, func(o *Options) { o.FollowerWait = 2 * time.Second })
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	_, err := c.reps[f].Write(context.Background(), set("a", "1"), level.Sync, shard.ReqID{})
	lid, addr, ok := LeaderOf(err)
	if !ok || lid != c.ids[l] || addr != "client-"+strconv.FormatUint(c.ids[l], 10) {
		t.Fatalf("write at follower: err %v; want a NotLeaderError naming node %d", err, c.ids[l])
	}
	if !errors.Is(err, shard.ErrUnavailable) {
		t.Fatalf("NotLeaderError must wrap shard.ErrUnavailable for front doors that do not know it")
	}
	if _, err := c.reps[f].Read(context.Background(), get("a"), level.ConsLinearizable, shard.Session{}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("linearizable read at follower: %v, want ErrNotLeader", err)
	}
	res, err := c.write(set("a", "1"), shard.ReqID{Client: 5, Seq: 1}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A session that saw the write is served by a follower once it applied it.
	sess := shard.Session{}.AfterWrite(res.Pos())
	got, err := c.reps[f].Read(context.Background(), get("a"), level.ConsSession, sess)
	if err != nil || string(got.Bulk) != "1" {
		t.Fatalf("session read at follower: %+v, %v", got, err)
	}
	// A session from the future (ahead of everything) is redirected, not
	// served stale.
	_, err = c.reps[f].Read(context.Background(), get("a"), level.ConsSession, shard.Session{LastWrite: res.Version + 1000})
	if _, _, ok := LeaderOf(err); !ok {
		t.Fatalf("session ahead of follower: %v, want a redirect", err)
	}
	// Bounded staleness by time is served at the leader only: a heartbeat's
	// arrival does not prove freshness (a deposed leader keeps sending them), so
	// a follower redirects rather than risk serving older state than asked.
	_, err = c.reps[f].Read(context.Background(), get("a"), level.BoundedTimeLevel(time.Second), shard.Session{})
	if _, _, ok := LeaderOf(err); !ok {
		t.Fatalf("bounded(1s) read at a follower: %v, want a redirect to the leader", err)
	}
	got, err = c.reps[l].Read(context.Background(), get("a"), level.BoundedTimeLevel(time.Second), shard.Session{})
	if err != nil || string(got.Bulk) != "1" {
		t.Fatalf("bounded(1s) read at the leader: %+v, %v", got, err)
	}
}
