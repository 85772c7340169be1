package frontdoor

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Issue 27's acceptance for go-redis on a 3-replica group: Set with a TTL
// (EX and PX), HSet and HGetAll, through each replica (a follower forwards
// the writes and, at the default linearizable level, the reads); a key set
// with a TTL is gone at every replica after it, and a hash's fields go with
// its key's TTL.
func TestGoRedisSetTTLAndHSetOnAGroup(t *testing.T) {
	addrs := startGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cs []*redis.Client
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: 20, MinRetryBackoff: 50 * time.Millisecond})
		defer c.Close()
		cs = append(cs, c)
	}
	// The group elects its first leader: retry until a write goes through.
	for cs[0].Set(ctx, "probe", "1", 0).Err() != nil {
		if ctx.Err() != nil {
			t.Fatal("no leader")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, c := range cs {
		k, short, h := fmt.Sprint("ttl:", i), fmt.Sprint("short:", i), fmt.Sprint("h:", i)
		if err := c.Set(ctx, k, "v", 100*time.Second).Err(); err != nil {
			t.Fatalf("%s: Set with a TTL: %v", addrs[i], err)
		}
		if err := c.Set(ctx, short, "v", 1200*time.Millisecond).Err(); err != nil {
			t.Fatalf("%s: Set with a TTL in ms: %v", addrs[i], err)
		}
		if n, err := c.HSet(ctx, h, "a", "1", "b", "2").Result(); err != nil || n != 2 {
			t.Fatalf("%s: HSet = %d, %v", addrs[i], n, err)
		}
		if n, err := c.HSet(ctx, h, map[string]any{"b": "3", "c": "4"}).Result(); err != nil || n != 1 {
			t.Fatalf("%s: HSet of a map = %d, %v", addrs[i], n, err)
		}
		if err := c.PExpire(ctx, h, 1200*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{"a": "1", "b": "3", "c": "4"}
	for _, c := range cs {
		for i := range cs {
			if d, err := c.TTL(ctx, fmt.Sprint("ttl:", i)).Result(); err != nil || d < 99*time.Second || d > 100*time.Second {
				t.Fatalf("TTL ttl:%d = %v, %v", i, d, err)
			}
			if v, err := c.Get(ctx, fmt.Sprint("short:", i)).Result(); err != nil || v != "v" {
				t.Fatalf("GET short:%d before its expiry = %q, %v", i, v, err)
			}
			if m, err := c.HGetAll(ctx, fmt.Sprint("h:", i)).Result(); err != nil || !maps.Equal(m, want) {
				t.Fatalf("HGetAll h:%d = %v, %v", i, m, err)
			}
		}
	}
	time.Sleep(1500 * time.Millisecond)
	for _, c := range cs {
		for i := range cs {
			if err := c.Get(ctx, fmt.Sprint("short:", i)).Err(); err != redis.Nil {
				t.Fatalf("GET short:%d after its expiry: %v, want nil", i, err)
			}
			if m, err := c.HGetAll(ctx, fmt.Sprint("h:", i)).Result(); err != nil || len(m) != 0 {
				t.Fatalf("HGetAll h:%d after its key's expiry = %v, %v", i, m, err)
			}
			if v, err := c.HGet(ctx, fmt.Sprint("h:", i), "a").Result(); err != redis.Nil {
				t.Fatalf("HGet h:%d a after its key's expiry = %q, %v", i, v, err)
			}
		}
	}
}
