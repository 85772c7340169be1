package frontdoor

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// go-redis's expiry API against Kefir (docs/design/expiry.md): Set with a
// TTL (go-redis sends EX for whole seconds, PX otherwise), SetEx, SetNX and
// SetArgs with KEEPTTL and EXAT, Expire* with their conditions, TTL, PTTL,
// ExpireTime, PExpireTime, GetEx, Persist; a key set with a TTL is gone
// after it.
func TestGoRedisExpiry(t *testing.T) {
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: startNode(t), Protocol: proto})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("RESP%d: %v", proto, err)
			}
		}
		start := time.Now()
		must(rdb.Set(ctx, "s", "v", 100*time.Second).Err())
		if d, err := rdb.TTL(ctx, "s").Result(); err != nil || d != 100*time.Second {
			t.Fatalf("TTL s = %v, %v", d, err)
		}
		must(rdb.Set(ctx, "ms", "v", 1500*time.Millisecond).Err())
		if d, err := rdb.PTTL(ctx, "ms").Result(); err != nil || d <= 0 || d > 1500*time.Millisecond {
			t.Fatalf("PTTL ms = %v, %v", d, err)
		}
		//lint:ignore SA1019 SetEx sends SETEX, the command under test (Set with a TTL sends SET EX, tested above)
		must(rdb.SetEx(ctx, "x", "v", time.Minute).Err())
		if ok, err := rdb.SetNX(ctx, "x", "w", time.Minute).Result(); err != nil || ok {
			t.Fatalf("SetNX of a live key = %v, %v", ok, err)
		}
		at := time.Unix(4102444800, 0)
		must(rdb.SetArgs(ctx, "a", "v", redis.SetArgs{ExpireAt: at}).Err())
		must(rdb.SetArgs(ctx, "a", "w", redis.SetArgs{KeepTTL: true}).Err())
		if tm, err := rdb.ExpireTime(ctx, "a").Result(); err != nil || tm != time.Duration(at.Unix())*time.Second {
			t.Fatalf("ExpireTime a = %v, %v", tm, err)
		}
		if tm, err := rdb.PExpireTime(ctx, "a").Result(); err != nil || tm != time.Duration(at.UnixMilli())*time.Millisecond {
			t.Fatalf("PExpireTime a = %v, %v", tm, err)
		}
		must(rdb.Set(ctx, "p", "v", 0).Err())
		if ok, err := rdb.ExpireXX(ctx, "p", time.Minute).Result(); err != nil || ok {
			t.Fatalf("ExpireXX without a TTL = %v, %v", ok, err)
		}
		if ok, err := rdb.ExpireNX(ctx, "p", time.Minute).Result(); err != nil || !ok {
			t.Fatalf("ExpireNX = %v, %v", ok, err)
		}
		if ok, err := rdb.ExpireGT(ctx, "p", 2*time.Minute).Result(); err != nil || !ok {
			t.Fatalf("ExpireGT = %v, %v", ok, err)
		}
		if ok, err := rdb.ExpireLT(ctx, "p", 3*time.Minute).Result(); err != nil || ok {
			t.Fatalf("ExpireLT later = %v, %v", ok, err)
		}
		if ok, err := rdb.Persist(ctx, "p").Result(); err != nil || !ok {
			t.Fatalf("Persist = %v, %v", ok, err)
		}
		if d, err := rdb.TTL(ctx, "p").Result(); err != nil || d != -1 {
			t.Fatalf("TTL after Persist = %v, %v", d, err)
		}
		if v, err := rdb.GetEx(ctx, "p", time.Minute).Result(); err != nil || v != "v" {
			t.Fatalf("GetEx = %q, %v", v, err)
		}
		if d, err := rdb.TTL(ctx, "p").Result(); err != nil || d != time.Minute {
			t.Fatalf("TTL after GetEx = %v, %v", d, err)
		}
		if ok, err := rdb.ExpireAt(ctx, "p", time.Unix(1, 0)).Result(); err != nil || !ok {
			t.Fatalf("ExpireAt in the past = %v, %v", ok, err)
		}
		if n, err := rdb.Exists(ctx, "p").Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS after an expiry in the past = %d, %v", n, err)
		}
		if d, err := rdb.TTL(ctx, "missing").Result(); err != nil || d != -2 {
			t.Fatalf("TTL missing = %v, %v", d, err)
		}
		time.Sleep(time.Until(start.Add(1600 * time.Millisecond)))
		if err := rdb.Get(ctx, "ms").Err(); err != redis.Nil {
			t.Fatalf("GET ms after its TTL: %v, want redis.Nil", err)
		}
	}
}
