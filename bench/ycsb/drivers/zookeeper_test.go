package drivers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// zkJar is where Debian's zookeeper package puts the server (bench/peers/zookeeper.sh
// installs it; the bench module is not part of the main CI suite).
const zkJar = "/usr/share/java/zookeeper.jar"

// startZooKeeper runs a standalone ZooKeeper server on a free loopback port for the
// duration of the test, or skips the test if the server is not installed.
func startZooKeeper(t *testing.T) string {
	t.Helper()
	java, err := exec.LookPath("java")
	if _, serr := os.Stat(zkJar); err != nil || serr != nil {
		t.Skipf("ZooKeeper not installed (%s and a JRE; the Debian package zookeeper, which bench/peers/zookeeper.sh installs)", zkJar)
	}
	dir := t.TempDir()
	port := freePort(t)
	cfg := fmt.Sprintf("tickTime=200\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nforceSync=yes\n", dir, port)
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(java, "-Xmx256m", "-cp", zkJar, "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfgPath)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("zookeeper did not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestZooKeeperDriverAgainstRealZooKeeper(t *testing.T) {
	addr := startZooKeeper(t)
	ctx := context.Background()
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("syncReads=%v", sync), func(t *testing.T) {
			z, err := NewZooKeeper(ctx, ZooKeeperConfig{Servers: []string{addr}, Root: "/t", Sessions: 2, SyncReads: sync})
			if err != nil {
				t.Fatal(err)
			}
			defer z.Close()
			if err := z.DeleteAll(ctx); err != nil {
				t.Fatal(err)
			}
			w := workload(t, "a")
			w.RecordCount = 200
			loadAndRun(t, w, z.NewDB)

			db, _ := z.NewDB(0)
			if err := db.Insert(ctx, "k", []byte("v1")); err != nil {
				t.Fatal(err)
			}
			// A second insert of the same key overwrites, as it does in every driver.
			if err := db.Insert(ctx, "k", []byte("v2")); err != nil {
				t.Fatal(err)
			}
			if v, err := db.Read(ctx, "k"); err != nil || string(v) != "v2" {
				t.Fatalf("read back: %q, %v", v, err)
			}
			if _, err := db.Read(ctx, "missing"); !errors.Is(err, ycsb.ErrNotFound) {
				t.Fatalf("missing key: err %v, want ycsb.ErrNotFound", err)
			}
			if err := db.Update(ctx, "missing", []byte("x")); !errors.Is(err, ycsb.ErrNotFound) {
				t.Fatalf("update of a missing key: err %v, want ycsb.ErrNotFound", err)
			}
			if _, err := db.Scan(ctx, "", 10); !errors.Is(err, ErrScanUnsupported) {
				t.Fatalf("scan: err %v, want ErrScanUnsupported", err)
			}
			// DeleteAll empties the root: the loaded records are gone.
			if err := z.DeleteAll(ctx); err != nil {
				t.Fatal(err)
			}
			k := w.KeyName(nil, 0)
			if _, err := db.Read(ctx, string(k)); !errors.Is(err, ycsb.ErrNotFound) {
				t.Fatalf("record 0 after DeleteAll: err %v, want ycsb.ErrNotFound", err)
			}
		})
	}
}

func TestZooKeeperDriverFailsFastWithoutAnEnsemble(t *testing.T) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := NewZooKeeper(ctx, ZooKeeperConfig{Servers: []string{fmt.Sprintf("127.0.0.1:%d", freePort(t))}})
	if err == nil {
		t.Fatal("connected to nothing")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("took %v to give up", time.Since(start))
	}
}
