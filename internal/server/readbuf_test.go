package server

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// Connections recycle their read buffers (readBufs). A connection that ends
// with half a command in its buffer, or mid-pipeline, must leave nothing the
// next connection could read: every later connection sees only its own bytes.
func TestRecycledReadBuffersCarryNothingOver(t *testing.T) {
	for _, model := range []IOModel{IOEpoll, IOGoroutine} {
		t.Run(string(model), func(t *testing.T) {
			s := startServer(t, func(c *Config) { c.IOModel = model })
			for i := range 40 {
				// A connection that leaves mid-command: a SET whose value
				// never arrives, after a pipeline of complete ones.
				nc, err := net.Dial("tcp", s.ClientAddr().String())
				if err != nil {
					t.Fatal(err)
				}
				_, _ = fmt.Fprintf(nc, "*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n%d\r\n*3\r\n$3\r\nSET\r\n$5\r\nbogus\r\n$100\r\nxx", i%10)
				time.Sleep(time.Millisecond)
				nc.Close()
				c := dial(t, s)
				if got := c.do("SET", "k", fmt.Sprint(i)); got != "OK" {
					t.Fatalf("round %d: SET: %s", i, got)
				}
				if got := c.do("GET", "k"); got != fmt.Sprintf("%q", fmt.Sprint(i)) {
					t.Fatalf("round %d: GET k: %s", i, got)
				}
				if got := c.do("EXISTS", "bogus"); got != "(integer) 0" {
					t.Fatalf("round %d: the half-sent SET of an earlier connection took effect: EXISTS bogus = %s", i, got)
				}
				c.nc.Close()
			}
		})
	}
}
