package frontdoor

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/test/e2e/cluster"
	"github.com/redis/go-redis/v9"
)

// threeGroups is kefir up --groups 3's layout.
var threeGroups = kcluster.FormatGroups(kcluster.EvenGroups(3, []uint64{1, 2, 3}, 3))

// go-redis's ClusterClient, unmodified, against three real nodes hosting
// three groups (issue 28, first part; docs/cluster.md): it reads CLUSTER
// SLOTS, sends each key to its group's leader, runs MSET/MGET of keys that
// share a hash tag, is refused a cross-slot MGET with CROSSSLOT, and keeps
// working — every read the last value written — while the leader of one
// group is killed and restarted under it (the nodes redirect every client,
// --cluster-redirects, so it follows -MOVED to the new leader).
func TestGoRedisClusterClientLeaderKill(t *testing.T) {
	g := cluster.StartGroups(t, 3, threeGroups, "--cluster-redirects", "true")
	g.WaitLeaders(20 * time.Second)
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: g.Addrs(), Protocol: proto, MaxRedirects: 16})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for i := range 30 {
			k := fmt.Sprintf("k%d", i)
			if err := rdb.Set(ctx, k, i, 0).Err(); err != nil {
				t.Fatalf("RESP%d SET %s: %v", proto, k, err)
			}
			if v, err := rdb.Get(ctx, k).Int(); err != nil || v != i {
				t.Fatalf("RESP%d GET %s = %d, %v", proto, k, v, err)
			}
		}
		if err := rdb.MSet(ctx, "{u}a", "1", "{u}b", "2").Err(); err != nil {
			t.Fatalf("RESP%d MSET with a hash tag: %v", proto, err)
		}
		if vs, err := rdb.MGet(ctx, "{u}a", "{u}b").Result(); err != nil || fmt.Sprint(vs) != "[1 2]" {
			t.Fatalf("RESP%d MGET with a hash tag = %v, %v", proto, vs, err)
		}
		if err := rdb.MGet(ctx, "a", "b").Err(); err == nil || err.Error() != "CROSSSLOT Keys in request don't hash to the same slot" {
			t.Fatalf("RESP%d MGET across slots: %v", proto, err)
		}
		cancel()
		rdb.Close()
	}

	// ReadOnly: go-redis sends READONLY to the replicas CLUSTER SLOTS
	// lists and reads there: the connection's reads are eventual, which a
	// follower serves (a value may show late, never one never written).
	ro := redis.NewClusterClient(&redis.ClusterOptions{Addrs: g.Addrs(), ReadOnly: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	for i := range 30 {
		k := fmt.Sprintf("k%d", i)
		for {
			v, err := ro.Get(ctx, k).Int()
			if err == nil && v == i {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("ReadOnly GET %s = %d, %v", k, v, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cancel()
	ro.Close()

	// A workload of SET and GET over every group while the leader of
	// {t1}'s group is killed and restarted.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: g.Addrs(), MaxRedirects: 16})
	defer rdb.Close()
	var ops, retried atomic.Int64
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			k := fmt.Sprintf("{t%d}k", i%12)
			var err error
			deadline := time.Now().Add(20 * time.Second)
			for {
				if err = rdb.Set(ctx, k, i, 0).Err(); err == nil {
					var v int
					if v, err = rdb.Get(ctx, k).Int(); err == nil && v != i {
						done <- fmt.Errorf("GET %s = %d after SET %d", k, v, i)
						return
					}
				}
				if err == nil || time.Now().After(deadline) {
					break
				}
				retried.Add(1) // a dead node's connection refused: retry
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				done <- fmt.Errorf("op %d on %s: %w", i, k, err)
				return
			}
			ops.Add(1)
		}
	}()
	time.Sleep(time.Second)
	victim := g.SlotLeader(int(kcluster.Slot([]byte("t1"))))
	if victim < 0 {
		t.Fatal("no leader known for {t1}'s slot")
	}
	g.Nodes[victim].Kill()
	time.Sleep(2 * time.Second)
	g.Nodes[victim].Start()
	time.Sleep(2 * time.Second)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("go-redis ClusterClient: %d SET+GET pairs, %d retried after errors; killed and restarted %s, the leader of {t1}'s group", ops.Load(), retried.Load(), g.Nodes[victim].ID)
}
