package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
)

// startNode runs a real Kefir node (storage, shard, RESP front door) in-process on
// a loopback port with its data in a temporary directory.
func startNode(t testing.TB, password string) string {
	t.Helper()
	srv, err := server.New(server.Config{
		ClientAddr: "127.0.0.1:0",
		DataDir:    t.TempDir(),
		Password:   password,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return srv.ClientAddr().String()
}

func TestAgainstRealServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real node")
	}
	addr := startNode(t, "pw")
	ctx := testCtx(t)
	if _, err := Dial(ctx, []string{addr}, WithPassword("bad")); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong password: err = %v, want ErrAuth", err)
	}
	c, err := Dial(ctx, []string{addr}, WithPassword("pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if _, err := c.Get(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(missing) err = %v", err)
	}
	for _, d := range []Durability{Sync, CAD, Async, 0} {
		if err := c.Put(ctx, "k", []byte("v-"+d.String()), WithDurability(d)); err != nil {
			t.Fatalf("Put durability %v: %v", d, err)
		}
	}
	if v, err := c.Get(ctx, "k", WithConsistency(Linearizable)); err != nil || string(v) != "v-default" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if ok, err := c.CAS(ctx, "k", []byte("v-default"), []byte("w")); !ok || err != nil {
		t.Fatalf("CAS = %v, %v", ok, err)
	}
	if ok, err := c.CAS(ctx, "k", []byte("v-default"), []byte("x")); ok || err != nil {
		t.Fatalf("stale CAS = %v, %v; want false", ok, err)
	}
	if n, err := c.Incr(ctx, "ctr", 41); n != 41 || err != nil {
		t.Fatalf("Incr = %d, %v", n, err)
	}
	_, err = c.Incr(ctx, "k", 1)
	var notInt *Error
	if !errors.Is(err, ErrNotInteger) || !errors.Is(err, ErrWrongType) || !errors.As(err, &notInt) || notInt.Msg != "ERR value is not an integer or out of range" {
		t.Fatalf("Incr on a string: err = %v, want Redis's reply, matching ErrNotInteger and ErrWrongType", err)
	}
	if err := c.MultiPut(ctx, []KV{{"s:1", []byte("a")}, {"s:2", []byte("b")}, {"s:3", []byte("c")}}); err != nil {
		t.Fatal(err)
	}
	vals, err := c.MultiGet(ctx, []string{"s:1", "nope", "s:3"})
	if err != nil || fmt.Sprintf("%q", vals) != `["a" "" "c"]` || vals[1] != nil {
		t.Fatalf("MultiGet = %q, %v", vals, err)
	}
	kvs, err := c.Scan(ctx, "s:", "s;", 2)
	if err != nil || len(kvs) != 2 || kvs[0].Key != "s:1" || string(kvs[1].Value) != "b" {
		t.Fatalf("Scan = %v, %v", kvs, err)
	}
	if ok, err := c.Delete(ctx, "s:1"); !ok || err != nil {
		t.Fatalf("Delete = %v, %v", ok, err)
	}

	// Sessions: the token advances and the session reads its own writes.
	s := c.Session()
	if err := s.Put(ctx, "sess", []byte("mine"), WithDurability(CAD)); err != nil {
		t.Fatal(err)
	}
	tok := s.Token()
	if tok == "" {
		t.Fatal("session token did not advance after a write")
	}
	if v, err := s.Get(ctx, "sess", WithConsistency(SessionConsistency)); err != nil || string(v) != "mine" {
		t.Fatalf("session Get = %q, %v", v, err)
	}

	// A level the deployment cannot serve is a server error, not a transport one.
	_, err = c.Get(ctx, "k", WithConsistency(BoundedVersions(3)))
	var se *Error
	if err != nil && !errors.As(err, &se) {
		t.Fatalf("unsupported level: err = %v, want nil or *Error", err)
	}

	// Concurrent pipelined increments on a shared pool are all applied, once.
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := c.Incr(ctx, "hits", 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if v, err := c.Get(ctx, "hits"); err != nil || string(v) != "1000" {
		t.Fatalf("hits = %q, %v; want 1000", v, err)
	}
}

// BenchmarkClientRealServer is BenchmarkClientPipelined against a real node
// (durability async for Put, so this measures the front door, not fsync).
//
// Run: go test -run '^$' -bench ClientRealServer -benchmem ./client/
func BenchmarkClientRealServer(b *testing.B) {
	addr := startNode(b, "")
	for _, op := range []string{"get", "put"} {
		b.Run(op+"/pool=2/goroutines=64xGOMAXPROCS", func(b *testing.B) {
			ctx := context.Background()
			c, err := Dial(ctx, []string{addr}, WithPoolSize(2))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			val := []byte("value-0123456789abcdef")
			for i := range 1000 {
				if err := c.Put(ctx, fmt.Sprintf("key:%d", i), val); err != nil {
					b.Fatal(err)
				}
			}
			b.SetParallelism(64)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					key := fmt.Sprintf("key:%d", i%1000)
					i++
					var err error
					if op == "get" {
						_, err = c.Get(ctx, key)
					} else {
						err = c.Put(ctx, key, val, WithDurability(Async))
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
