// Package frontdoor checks Kefir's RESP front door with a real third-party
// client library, go-redis, where what matters is how that library reads
// Kefir's replies (the core suite uses redis-cli and its own RESP client).
package frontdoor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vrshard"
	"github.com/redis/go-redis/v9"
)

func startNode(t *testing.T) string {
	t.Helper()
	s, err := server.New(server.Config{ClientAddr: "127.0.0.1:0", DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.ClientAddr().String()
}

// go-redis's TxPipelined (MULTI, the commands, EXEC in one pipeline) reports
// an error and applies nothing: a retry cannot apply the INCR twice (issue 25
// item 8). Before, MULTI answered an error, go-redis stopped reading there
// with the INCR and SET applied, and the connection's later replies were
// out of step. The pooled connection stays usable afterwards.
func TestGoRedisTxPipelinedAppliesNothing(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: startNode(t), PoolSize: 1, Protocol: 2})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Set(ctx, "ctr", 10, 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, "ctr")
		p.Set(ctx, "other", "x", 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Errorf("TxPipelined: err = %v, want EXECABORT", err)
	}
	for range 3 { // the one pooled connection answers in step
		if v, err := rdb.Get(ctx, "ctr").Result(); err != nil || v != "10" {
			t.Fatalf("GET ctr = %q, %v; want 10 (nothing of the transaction applied)", v, err)
		}
		if n, err := rdb.Exists(ctx, "other").Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS other = %d, %v; want 0", n, err)
		}
	}
	// A plain pipeline is not a transaction: it runs.
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, "ctr")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.Get(ctx, "ctr").Result(); v != "11" {
		t.Fatalf("after a plain pipeline ctr = %q, want 11", v)
	}
}

// go-redis's Scan and ScanIterator parse SCAN's cursor as a uint64 and walk a
// keyspace bigger than COUNT to its end with every key (issue 27): the
// cursor Kefir hands out is a decimal uint64, and MATCH filters.
func TestGoRedisScanIteratesEveryKey(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: startNode(t), Protocol: 2})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 5000
	pipe := rdb.Pipeline()
	for i := range n {
		pipe.Set(ctx, fmt.Sprintf("key:%05d", i), "v", 0)
	}
	pipe.Set(ctx, "other", "x", 0)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	iter := rdb.Scan(ctx, 0, "key:*", 100).Iterator()
	for iter.Next(ctx) {
		seen[iter.Val()] = true
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n || seen["other"] {
		t.Fatalf("ScanIterator saw %d keys (other: %v), want %d", len(seen), seen["other"], n)
	}
	keys, cursor, err := rdb.Scan(ctx, 0, "*", 10).Result()
	if err != nil || cursor == 0 || len(keys) != 10 {
		t.Fatalf("Scan: %d keys, cursor %d, %v", len(keys), cursor, err)
	}
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 5001 {
		t.Fatalf("DBSIZE %d %v", n, err)
	}
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after FLUSHDB %d %v", n, err)
	}
}

// startGroup starts a 3-replica group in-process (real TCP between the
// replicas and to the client) and returns the nodes' client addresses.
func startGroup(t *testing.T) []string {
	t.Helper()
	addrs := testgroup.LoopbackAddrs(t, 6)
	var ms []server.Member
	for i := range 3 {
		ms = append(ms, server.Member{ID: uint64(i + 1), PeerAddr: addrs[2*i], ClientAddr: addrs[2*i+1]})
	}
	var out []string
	for i, m := range ms {
		s, err := server.New(server.Config{
			NodeID: fmt.Sprint("n", i+1), ClientAddr: m.ClientAddr, PeerAddr: m.PeerAddr, DataDir: t.TempDir(),
			ClusterSecret: "s3cret", Members: ms, OpenReplica: vrshard.OpenHosted, ReplicaID: m.ID, ClusterID: 42, Bootstrap: true,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, m.ClientAddr)
	}
	return out
}

// go-redis's ScanIterator through every replica of a 3-replica group returns
// every key (followers forward SCAN to the leader at the default,
// linearizable level), and FlushDB through a follower empties the group.
func TestGoRedisScanOnAGroup(t *testing.T) {
	addrs := startGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 3000
	rdb := redis.NewClient(&redis.Options{Addr: addrs[1], Protocol: 2, MaxRetries: 20, MinRetryBackoff: 50 * time.Millisecond})
	defer rdb.Close()
	// The group elects its first leader: retry until a write goes through.
	for {
		if err := rdb.Set(ctx, "probe", "1", 0).Err(); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("no leader: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pipe := rdb.Pipeline()
	for i := range n {
		pipe.Set(ctx, fmt.Sprintf("key:%05d", i), "v", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2})
		seen := map[string]bool{}
		iter := c.Scan(ctx, 0, "key:*", 200).Iterator()
		for iter.Next(ctx) {
			seen[iter.Val()] = true
		}
		if err := iter.Err(); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if len(seen) != n {
			t.Fatalf("%s: ScanIterator saw %d keys, want %d", addr, len(seen), n)
		}
		c.Close()
	}
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("KEYS * after FLUSHDB: %d keys, %v", len(keys), err)
	}
}
