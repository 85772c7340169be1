package testgroup

import (
	"bytes"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// StartRedis starts a redis-server for the test on a port from FreePorts,
// without persistence, with the extra args (e.g. "--maxmemory", "1mb"),
// and returns its address; the test is skipped if redis-server is not
// installed. The server is killed when the test ends; if it exits before
// listening, the test fails with its output.
func StartRedis(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	port := FreePorts(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var out bytes.Buffer
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		nc, err := net.Dial("tcp", addr)
		if err == nil {
			nc.Close()
			return addr
		}
		select {
		case werr := <-exited:
			exited <- werr // for the cleanup's wait
			t.Fatalf("redis-server exited (%v) before listening on %s:\n%s", werr, addr, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s: %v", addr, err)
		}
	}
}
