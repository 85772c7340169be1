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
