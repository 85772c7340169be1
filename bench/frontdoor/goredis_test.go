// Package frontdoor checks Kefir's RESP front door with a real third-party
// client library, go-redis, where what matters is how that library reads
// Kefir's replies (the core suite uses redis-cli and its own RESP client).
package frontdoor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
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

// go-redis's TxPipelined (MULTI, the commands, EXEC in one pipeline) runs
// its commands as one op and hands each its reply (a runtime error as that
// command's error, the others applied, as Redis); a transaction with an
// unknown command reports EXECABORT and applies nothing; the pooled
// connection stays in step; a plain pipeline is not a transaction.
func TestGoRedisTxPipelined(t *testing.T) {
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: startNode(t), PoolSize: 1, Protocol: proto})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rdb.Set(ctx, "ctr", 10, 0).Err(); err != nil {
			t.Fatal(err)
		}
		var incr *redis.IntCmd
		var bad *redis.IntCmd
		var get *redis.StringCmd
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			incr = p.Incr(ctx, "ctr")
			p.Set(ctx, "other", "x", 0)
			bad = p.Incr(ctx, "other")
			get = p.Get(ctx, "ctr")
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "not an integer") {
			t.Errorf("RESP%d TxPipelined: err = %v, want the INCR's error", proto, err)
		}
		if incr.Val() != 11 || get.Val() != "11" || bad.Err() == nil {
			t.Fatalf("RESP%d replies: incr %v, get %v, bad %v", proto, incr.Val(), get.Val(), bad.Err())
		}
		_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, "ctr")
			p.Do(ctx, "NOSUCHCOMMAND")
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "EXECABORT") && !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("RESP%d TxPipelined with an unknown command: err = %v, want EXECABORT", proto, err)
		}
		for range 3 { // the one pooled connection answers in step
			if v, err := rdb.Get(ctx, "ctr").Result(); err != nil || v != "11" {
				t.Fatalf("GET ctr = %q, %v; want 11 (nothing of the aborted transaction applied)", v, err)
			}
		}
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, "ctr")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if v, _ := rdb.Get(ctx, "ctr").Result(); v != "12" {
			t.Fatalf("after a plain pipeline ctr = %q, want 12", v)
		}
	}
}

// go-redis's optimistic-locking example (its docs' Watch: GET, then
// TxPipelined SET inside Watch, retried on TxFailedErr) incrementing one
// counter from several goroutines on every replica of a 3-replica group
// (followers forward WATCH and EXEC to the leader): the final value is the
// number of successful increments, and some did conflict.
func TestGoRedisWatchIncrementOnAGroup(t *testing.T) {
	addrs := startGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const workers, each = 6, 15
	var conflicts atomic.Int64
	increment := func(rdb *redis.Client, key string) error {
		txf := func(tx *redis.Tx) error {
			n, err := tx.Get(ctx, key).Int()
			if err != nil && err != redis.Nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, key, n+1, 0)
				return nil
			})
			return err
		}
		for {
			err := rdb.Watch(ctx, txf, key)
			if err != redis.TxFailedErr {
				return err
			}
			conflicts.Add(1)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		rdb := redis.NewClient(&redis.Options{Addr: addrs[i%3], Protocol: 2 + i%2})
		defer rdb.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := increment(rdb, "counter"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer rdb.Close()
	if n, err := rdb.Get(ctx, "counter").Int(); err != nil || n != workers*each {
		t.Fatalf("counter = %d, %v; want %d", n, err, workers*each)
	}
	t.Logf("%d increments, %d conflicts retried", workers*each, conflicts.Load())
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
