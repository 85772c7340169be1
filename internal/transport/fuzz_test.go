package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// scriptConn is a net.Conn whose reads come from a script and whose writes
// are recorded: the handshake's untrusted input without a socket.
type scriptConn struct {
	r io.Reader
	w bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return c.w.Write(p) }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzAcceptHandshake feeds arbitrary dialer bytes to the acceptor: it must
// never panic, never admit a dialer (the nonce is fresh, so no input can
// carry a valid MAC), and always answer a bad credential line with ERR.
//
//	go test -run '^$' -fuzz FuzzAcceptHandshake -fuzztime 30s ./internal/transport/
func FuzzAcceptHandshake(f *testing.F) {
	f.Add([]byte("2 abcd 00\nIDENT 1 0000000000000007 0000000000000001\n"))
	f.Add([]byte("2 abcd\n"))
	f.Add([]byte(strings.Repeat("x", 1000)))
	f.Add([]byte("\n\n\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &scriptConn{r: bytes.NewReader(in)}
		self := Identity{Node: 1, Cluster: 7, ConfigHash: 1}
		id, _, rest, err := acceptHandshake(c, "secret", self, 1, func(uint64) bool { return true }, nil)
		if err == nil {
			t.Fatalf("admitted node %d (rest %q) from input %q", id, rest, in)
		}
		out := c.w.String()
		if !strings.HasPrefix(out, greeting+" ") {
			t.Fatalf("no greeting: %q", out)
		}
		if errors.Is(err, ErrAuth) && !strings.HasSuffix(out, "ERR authentication failed\n") {
			t.Fatalf("auth failure not answered with ERR: %q", out)
		}
	})
}

// TestHandshakeOverAPipeAgreesBothWays runs both halves against each other
// and checks the frame bytes that follow the last handshake line reach the
// frame reader (lineReader may read past the line).
func TestHandshakeOverAPipeAgreesBothWays(t *testing.T) {
	a, d := net.Pipe()
	defer a.Close()
	defer d.Close()
	self := Identity{Node: 1, Cluster: 7, ConfigHash: 9}
	type result struct {
		id   uint64
		rest []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		id, _, rest, err := acceptHandshake(a, "secret", self, 1, func(id uint64) bool { return id == 2 }, nil)
		done <- result{id, rest, err}
	}()
	if _, _, err := dialHandshake(d, "secret", Identity{Node: 2, Cluster: 7, ConfigHash: 9}, 2, 1); err != nil {
		t.Fatalf("dialer: %v", err)
	}
	r := <-done
	if r.err != nil || r.id != 2 || len(r.rest) != 0 {
		t.Fatalf("acceptor: id %d rest %q err %v", r.id, r.rest, r.err)
	}

	// Frame bytes in the same read as IDENT come back as rest.
	lr := &lineReader{r: strings.NewReader("IDENT 1 2 3\nFRAMEBYTES")}
	line, err := lr.line()
	if err != nil || line != "IDENT 1 2 3" || string(lr.rest()) != "FRAMEBYTES" {
		t.Fatalf("line %q rest %q err %v", line, lr.rest(), err)
	}
}
