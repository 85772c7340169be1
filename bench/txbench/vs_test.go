package main

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/redis/go-redis/v9"
)

// TestRunCellCountsEveryCommitOnce: at H = 2 every transaction increments
// both hot keys, so after a cell each key must equal the commits runCell
// counted — on Kefir through c.Txn and WATCH/EXEC, and on redis-server. A
// driver that counted an aborted attempt as a commit (or a system that lost
// an update) is off; the attempts are at least the commits.
func TestRunCellCountsEveryCommitOnce(t *testing.T) {
	ctx := context.Background()
	addr := testgroup.LoopbackAddrs(t, 1)[0]
	s, err := server.New(server.Config{NodeID: "n1", ClientAddr: addr, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	kc, err := client.Dial(ctx, []string{addr}, client.WithPoolSize(4))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	kr := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
	defer kr.Close()
	rr := redis.NewClient(&redis.Options{Addr: testgroup.StartRedis(t), PoolSize: 4})
	defer rr.Close()

	for _, tc := range []struct {
		s   *system
		rdb *redis.Client // reads the keys back
	}{
		{kefirTxnSystem(kc, "", nil), kr},
		{&system{name: "kefir-watch", txn: watchTxn(kr)}, kr},
		{&system{name: "redis", txn: watchTxn(rr)}, rr},
	} {
		for i := range 2 {
			if err := tc.rdb.Set(ctx, hotKey(i), "0", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		c := runCell(ctx, tc.s, 2, 4, 300*time.Millisecond)
		if c.commits == 0 || c.abort < 0 || c.abort >= 1 {
			t.Errorf("%s: %d commits, abort share %.2f", tc.s.name, c.commits, c.abort)
		}
		for i := range 2 {
			v, err := tc.rdb.Get(ctx, hotKey(i)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if v != strconv.FormatInt(c.commits, 10) {
				t.Errorf("%s: %s = %s after %d counted commits", tc.s.name, hotKey(i), v, c.commits)
			}
		}
	}
}
