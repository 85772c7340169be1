package server

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/vfs"
)

// A pipelined sync write followed by a protocol error, and the fsync fails: the
// +OK staged for the write must never reach the client (found by review).
func TestFailedFsyncThenProtocolErrorSendsNoOK(t *testing.T) {
	fs := vfs.NewMem()
	s := startServer(t, func(c *Config) { c.FS = fs; c.DataDir = "/data" })
	c := dial(t, s)
	c.expect("SET a 1 => OK")
	fs.FailSyncs(1)
	// One TCP write: a valid SET then a malformed multibulk header.
	if _, err := c.nc.Write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n*x\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c.nc)
	if strings.Contains(string(got), "+OK") {
		t.Fatalf("a sync write whose fsync failed was acknowledged: %q", got)
	}
	t.Logf("client saw %q", got)
}
