package drivers

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"
)

// startRedisServer runs a real redis-server on a free loopback port, without
// persistence, for the duration of the test. redis-server is a CI dependency (Debian
// package redis-server), so its absence fails the test rather than skipping it.
func startRedisServer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: install the Debian package redis-server (CI does)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--protected-mode", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRedisDriverAgainstRealRedisIncludingScans(t *testing.T) {
	addr := startRedisServer(t)
	w := workload(t, "e")
	r, err := NewRedis(context.Background(), RedisConfig{Addr: addr, PoolSize: 4, Index: w.HasScans()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.FlushAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	loadAndRun(t, w, r.NewDB)
	db, _ := r.NewDB(0)
	// The index orders keys bytewise: a scan from the smallest key sees count keys.
	n, err := db.Scan(context.Background(), "", 10)
	if err != nil || n != 10 {
		t.Fatalf("scan of 10 from the start: %d keys, %v", n, err)
	}
}
