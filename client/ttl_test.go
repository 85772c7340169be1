package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// ttlAPI is what Client and Session share of the calls checkTTLAPI uses.
type ttlAPI interface {
	Get(ctx context.Context, key string, opts ...CallOption) ([]byte, error)
	Put(ctx context.Context, key string, value []byte, opts ...CallOption) error
	MultiPut(ctx context.Context, kvs []KV, opts ...CallOption) error
	Expire(ctx context.Context, key string, ttl time.Duration, opts ...CallOption) (bool, error)
	Persist(ctx context.Context, key string, opts ...CallOption) (bool, error)
	TTL(ctx context.Context, key string, opts ...CallOption) (time.Duration, error)
}

// checkTTLAPI runs the TTL calls against c: expiry set by Put(WithTTL) and
// Expire, read back by TTL, removed by Persist and by a plain Put, and a key
// that expires is gone for Get and TTL.
func checkTTLAPI(t *testing.T, ctx context.Context, c ttlAPI, read ...CallOption) {
	t.Helper()
	if err := c.Put(ctx, "t:a", []byte("v"), WithTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d, err := c.TTL(ctx, "t:a", read...); err != nil || d <= 59*time.Minute || d > time.Hour {
		t.Fatalf("TTL after Put(WithTTL(1h)) = %v, %v", d, err)
	}
	if ok, err := c.Persist(ctx, "t:a"); err != nil || !ok {
		t.Fatalf("Persist = %v, %v; want true", ok, err)
	}
	if ok, err := c.Persist(ctx, "t:a"); err != nil || ok {
		t.Fatalf("second Persist = %v, %v; want false (no TTL left)", ok, err)
	}
	if d, err := c.TTL(ctx, "t:a", read...); err != nil || d != NoExpiry {
		t.Fatalf("TTL after Persist = %v, %v; want NoExpiry", d, err)
	}
	if ok, err := c.Expire(ctx, "t:a", 2*time.Hour); err != nil || !ok {
		t.Fatalf("Expire = %v, %v", ok, err)
	}
	if d, err := c.TTL(ctx, "t:a", read...); err != nil || d <= time.Hour {
		t.Fatalf("TTL after Expire(2h) = %v, %v", d, err)
	}
	// A plain Put clears the TTL, as SET does.
	if err := c.Put(ctx, "t:a", []byte("w")); err != nil {
		t.Fatal(err)
	}
	if d, err := c.TTL(ctx, "t:a", read...); err != nil || d != NoExpiry {
		t.Fatalf("TTL after plain Put = %v, %v; want NoExpiry", d, err)
	}
	if ok, err := c.Expire(ctx, "t:missing", time.Hour); err != nil || ok {
		t.Fatalf("Expire(missing) = %v, %v; want false", ok, err)
	}
	if _, err := c.TTL(ctx, "t:missing", read...); !errors.Is(err, ErrNotFound) {
		t.Fatalf("TTL(missing) err = %v, want ErrNotFound", err)
	}
	// Expiry itself: a short TTL, then the key is gone for Get and TTL. A
	// follower hides a key by its clock plus the group's clock-skew bound
	// (docs/consistency.md), so two reads at different replicas may disagree
	// for up to twice that bound around the expiry: wait until both agree.
	if err := c.Put(ctx, "t:short", []byte("v"), WithTTL(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, gerr := c.Get(ctx, "t:short", read...)
		d, terr := c.TTL(ctx, "t:short", read...)
		if errors.Is(gerr, ErrNotFound) && errors.Is(terr, ErrNotFound) {
			break
		}
		if (gerr != nil && !errors.Is(gerr, ErrNotFound)) || (terr != nil && !errors.Is(terr, ErrNotFound)) || time.Now().After(deadline) {
			t.Fatalf("a key 50ms past its TTL: Get err %v, TTL %v err %v (still there after 5s?)", gerr, d, terr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Bad TTLs are refused before anything is sent.
	for _, d := range []time.Duration{0, -time.Second, 1500 * time.Microsecond} {
		if err := c.Put(ctx, "t:bad", []byte("v"), WithTTL(d)); !errors.Is(err, ErrInvalidTTL) {
			t.Fatalf("Put(WithTTL(%v)) err = %v, want ErrInvalidTTL", d, err)
		}
		if _, err := c.Expire(ctx, "t:bad", d); !errors.Is(err, ErrInvalidTTL) {
			t.Fatalf("Expire(%v) err = %v, want ErrInvalidTTL", d, err)
		}
	}
	if err := c.MultiPut(ctx, []KV{{Key: "t:m", Value: []byte("v")}}, WithTTL(time.Second)); !errors.Is(err, ErrInvalidTTL) {
		t.Fatalf("MultiPut(WithTTL) err = %v, want ErrInvalidTTL", err)
	}
	if _, err := c.Get(ctx, "t:bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused Put wrote anyway: Get err = %v", err)
	}
	cl, ok := c.(*Client)
	if !ok {
		return
	}
	// Within a session, the token still advances.
	s := cl.Session()
	if err := s.Put(ctx, "t:s", []byte("v"), WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if d, err := s.TTL(ctx, "t:s"); err != nil || d <= 0 {
		t.Fatalf("Session TTL = %v, %v", d, err)
	}
	if s.Token() == "" {
		t.Fatal("session token did not advance")
	}
}

func TestTTLSingleNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real node")
	}
	ctx := testCtx(t)
	c, err := Dial(ctx, []string{startNode(t, "")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkTTLAPI(t, ctx, c)
}

func TestTTLReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a replica group")
	}
	ctx := testCtx(t)
	c := dialGroup(t, ctx, clientAddrs(startGroupWith(t, true)), nil)
	defer c.Close()
	t.Run("leader", func(t *testing.T) { checkTTLAPI(t, ctx, c) })
	// Session reads may be served by followers once they have caught up
	// with the session's token; each follower judges expiry by its own
	// clock plus the clock-skew bound.
	t.Run("session", func(t *testing.T) { checkTTLAPI(t, ctx, c.Session(), WithConsistency(SessionConsistency)) })
}
