package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// startGroup runs a 3-replica group in-process and returns its nodes.
func startGroup(t *testing.T) []*server.Server {
	t.Helper()
	return startGroupWith(t, false)
}

// startGroupWith runs a 3-replica group in-process, with --follower-reads on
// every member if followerReads, and returns its nodes.
func startGroupWith(t testing.TB, followerReads bool) []*server.Server {
	t.Helper()
	return startNodes(t, func(c *server.Config) { c.FollowerReads = followerReads })
}

// startNodes runs three in-process nodes, each a replica of a 3-replica
// group (or, with mod setting Groups, of every group), mod changing their
// configuration, and returns them started.
func startNodes(t testing.TB, mod func(*server.Config)) []*server.Server {
	t.Helper()
	addrs := testgroup.LoopbackAddrs(t, 6)
	var ms []server.Member
	for i := range 3 {
		ms = append(ms, server.Member{ID: uint64(i + 1), PeerAddr: addrs[2*i], ClientAddr: addrs[2*i+1]})
	}
	var nodes []*server.Server
	for _, m := range ms {
		cfg := server.Config{
			NodeID: fmt.Sprint("n", m.ID), ClientAddr: m.ClientAddr, PeerAddr: m.PeerAddr,
			DataDir: t.TempDir(), ClusterSecret: "s", Members: ms, OpenReplica: vrshard.OpenHosted, ReplicaID: m.ID, ClusterID: 7,
			Bootstrap: true, Logger: slog.New(slog.DiscardHandler),
		}
		if mod != nil {
			mod(&cfg)
		}
		s, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		nodes = append(nodes, s)
	}
	return nodes
}

// clientAddrs is the client address of each node, in order.
func clientAddrs(nodes []*server.Server) []string {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.ClientAddr().String())
	}
	return addrs
}

// dialGroup dials addrs as the group tests do: one connection per address,
// -UNAVAILABLE retried for up to 10s, up to 5 retries after a dead connection; if wire is not
// nil it logs every connection's requests.
func dialGroup(t *testing.T, ctx context.Context, addrs []string, wire *wireLog) *Client {
	t.Helper()
	opts := []Option{WithPoolSize(1), WithRetryUnavailable(10 * time.Second), WithMaxRetries(5)}
	if wire != nil {
		opts = append(opts, func(o *options) { o.wrapConn = wire.wrap })
	}
	c, err := Dial(ctx, addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// leaderOf waits until a running node reports itself leader and returns
// its index.
func leaderOf(t testing.TB, nodes []*server.Server) int {
	t.Helper()
	l, ok := testgroup.Leader(len(nodes), 10*time.Second, 10*time.Millisecond, func(i int) (bool, uint64) {
		return nodes[i] != nil && nodes[i].Status().Role == "leader", 0
	})
	if !ok {
		t.Fatal("no leader")
	}
	return l
}

// The client, pointed at a follower, is redirected to the leader and keeps
// writing exactly once across a leader change.
func TestClientFollowsTheLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group")
	}
	nodes := startGroup(t)
	l := leaderOf(t, nodes)
	f := (l + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var all []string
	for _, i := range []int{f, l, 3 - f - l} {
		all = append(all, nodes[i].ClientAddr().String())
	}
	c := dialGroup(t, ctx, all, nil)
	defer c.Close()
	for i := range 10 {
		if _, err := c.Incr(ctx, "n", 1); err != nil {
			t.Fatalf("incr %d: %v", i, err)
		}
	}
	// The writes went to the leader directly after the first MOVED: the
	// follower forwarded none of them.
	if fw := nodes[f].Status().Replication.Forwarded; fw != 0 {
		t.Fatalf("follower forwarded %d calls; the client should have moved to the leader", fw)
	}
	if leaderAddr := *c.leader.Load(); leaderAddr != nodes[l].ClientAddr().String() {
		t.Fatalf("client's leader %s, want %s", leaderAddr, nodes[l].ClientAddr())
	}

	// Stop the leader: the client finds the new one and carries on.
	nodes[l].Close()
	nodes[l] = nil
	for i := range 10 {
		if _, err := c.Incr(ctx, "n", 1); err != nil && !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("incr %d after the leader stopped: %v", i, err)
		}
	}
	n, err := c.Incr(ctx, "n", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Every incr above either succeeded or was unknown; none ran twice.
	if n < 19 || n > 20 {
		t.Fatalf("counter = %d after 20 increments (at most one of them with an unknown outcome)", n)
	}
}
