package drivers

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startEtcd runs a single-member etcd on free loopback ports for the duration of the
// test. etcd-server is a dependency of the bench module's tests (Debian package
// etcd-server; bench/peers/etcd.sh installs it), so its absence fails the test.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("etcd not found: install the Debian package etcd-server (bench/peers/etcd.sh does)")
	}
	cp, pp := freePort(t), freePort(t)
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", cp), fmt.Sprintf("http://127.0.0.1:%d", pp)
	cmd := exec.Command(bin, "--name", "t", "--data-dir", t.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", cp)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not listen on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestEtcdDriverAgainstRealEtcdIncludingScans(t *testing.T) {
	addr := startEtcd(t)
	ctx := context.Background()
	e, err := NewEtcd(ctx, EtcdConfig{Endpoints: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w := workload(t, "e")
	w.RecordCount = 200
	loadAndRun(t, w, e.NewDB)
	db, _ := e.NewDB(0)
	if n, err := db.Scan(ctx, "", 10); err != nil || n != 10 {
		t.Fatalf("scan of 10 from the start: %d keys, %v", n, err)
	}
	if err := e.DeleteAll(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := db.Scan(ctx, "", 10); err != nil || n != 0 {
		t.Fatalf("scan after DeleteAll: %d keys, %v", n, err)
	}
}
