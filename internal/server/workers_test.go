package server

import (
	"log/slog"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/testgroup"
)

// goroutinesCreated is the process's count of goroutines ever created.
func goroutinesCreated(t *testing.T) uint64 {
	t.Helper()
	s := []rtmetrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 {
		t.Skip("runtime/metrics has no /sched/goroutines-created (Go before 1.26)")
	}
	return s[0].Value.Uint64()
}

// On a replicated node, commands run off the event loop on the loop's
// long-lived workers, and the replication log's fsyncs on the replica's
// syncer: a steady stream of writes and reads creates no goroutine per
// command or per fsync (ARCHITECTURE §1.4). Before, each command batch
// started a goroutine (handOff) and each log fsync another (startSync): this
// test's commands created 1,342 goroutines in the three replicas' process
// (0 now).
func TestReplicatedCommandsCreateNoGoroutinePerCommand(t *testing.T) {
	if CurrentIOModel() != IOEpoll {
		t.Skip("the goroutine I/O model runs a goroutine per connection, not per command")
	}
	g := startGroup(t)
	l := g.leader(t)
	f := (l + 1) % 3
	lc, fc := dial(t, g.nodes[l]), dial(t, g.nodes[f])
	run := func(n int) {
		for i := range n {
			if got := lc.do("SET", "k", "v"); got != "OK" {
				t.Fatalf("SET at the leader => %s", got)
			}
			if got := lc.do("GET", "k"); got != `"v"` {
				t.Fatalf("GET at the leader => %s", got)
			}
			if i%10 == 0 { // forwarded to the leader (a pooled connection)
				if got := fc.do("SET", "f", "v"); got != "OK" {
					t.Fatalf("SET at a follower => %s", got)
				}
			}
		}
	}
	run(50) // warm up: workers, pooled forwarding connections
	const n = 300
	before := goroutinesCreated(t)
	run(n)
	created := goroutinesCreated(t) - before
	t.Logf("%d commands (%d writes) created %d goroutines", 2*n+n/10, n+n/10, created)
	// Slack for what is not per command: a worker started when a burst
	// finds every one busy, heartbeat-driven work, a timer's callback.
	if created > n/10 {
		t.Fatalf("%d writes and %d reads created %d goroutines; want none per command or fsync", n+n/10, n, created)
	}
}

// A node with members and no replication engine wired in refuses to start,
// saying so, instead of serving as a single node: the front door has no
// engine of its own (the binary hands it vrshard.OpenHosted).
func TestReplicatedNodeNeedsAnEngine(t *testing.T) {
	addrs := testgroup.LoopbackAddrs(t, 2)
	_, err := New(Config{
		DataDir: t.TempDir(), ClientAddr: addrs[0], PeerAddr: addrs[1], ClusterSecret: "s",
		Members: []Member{{ID: 1, PeerAddr: addrs[1], ClientAddr: addrs[0]}}, ReplicaID: 1, ClusterID: 1,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "no replication engine") {
		t.Fatalf("New with members and no OpenReplica: %v", err)
	}
}
