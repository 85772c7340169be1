package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	e2ecluster "github.com/kefirdb/kefir/test/e2e/cluster"
)

func TestCRC16IsRedisCRC16(t *testing.T) {
	// The check value of CRC16-CCITT/XMODEM, which Redis's crc16.c documents.
	// 0x31c3 < 16384, so the slot is the checksum itself.
	if got := Slot([]byte("123456789")); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
}

func TestSlotMatchesRedisCluster(t *testing.T) {
	// Slots from Redis's CLUSTER KEYSLOT documentation, and the hash-tag rules.
	for key, want := range map[string]uint16{
		"somekey":       11058,
		"foo{hash_tag}": 2515,
		"hash_tag":      2515,
		"":              0,
	} {
		if got := Slot([]byte(key)); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	for key, tag := range map[string]string{
		"{user1000}.following": "user1000",
		"foo{}{bar}":           "foo{}{bar}", // an empty first tag is no tag: the whole key
		"foo{{bar}}zap":        "{bar",       // from the first '{' to the first '}' after it
		"foo{bar}{zap}":        "bar",        // the first tag only
		"{":                    "{",
		"}{":                   "}{",
	} {
		if got := string(HashTag([]byte(key))); got != tag {
			t.Errorf("HashTag(%q) = %q, want %q", key, got, tag)
		}
	}
}

// TestSlotAgreesWithRedisServer asks a real redis-server in cluster mode for
// CLUSTER KEYSLOT of keys with and without tags (skipped without redis-server).
func TestSlotAgreesWithRedisServer(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	keys := []string{"a", "foo", "{a}b", "x{}y", "{{}}", "{user}:1", "\xc3\xa9", "k\x00z", strings.Repeat("k", 300)}
	for i := range 500 {
		keys = append(keys, "key:"+strconv.Itoa(i*7919), "{t"+strconv.Itoa(i)+"}x")
	}
	dir := t.TempDir()
	addr := e2ecluster.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	// The cluster bus port too: by default it is port+10000, which nothing
	// reserved (a busy one made redis-server exit at once).
	_, busPort, _ := net.SplitHostPort(e2ecluster.FreeAddr(t))
	var out bytes.Buffer
	srv := exec.Command("redis-server", "--port", port, "--cluster-port", busPort, "--bind", "127.0.0.1", "--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--dir", dir, "--save", "", "--appendonly", "no")
	srv.Stdout, srv.Stderr = &out, &out
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	defer func() {
		_ = srv.Process.Kill()
		<-exited
	}()
	var conn net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if conn, err = net.Dial("tcp", addr); err == nil {
			break
		}
		select {
		case werr := <-exited:
			exited <- werr // for the deferred wait
			t.Fatalf("redis-server exited (%v) before listening on %s:\n%s", werr, addr, out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = srv.Process.Kill()
			exited <- <-exited // its output is complete once Wait returned
			t.Fatalf("redis-server did not listen on %s: %v\n%s", addr, err, out.String())
		}
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	for _, k := range keys {
		fmt.Fprintf(conn, "*3\r\n$7\r\nCLUSTER\r\n$7\r\nKEYSLOT\r\n$%d\r\n%s\r\n", len(k), k)
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, ":") {
			t.Fatalf("CLUSTER KEYSLOT %q: %q, %v", k, line, err)
		}
		want, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		if got := Slot([]byte(k)); int(got) != want {
			t.Errorf("Slot(%q) = %d, redis-server says %d", k, got, want)
		}
	}
}
