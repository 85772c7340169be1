package testgroup

import (
	"net"
	"testing"
)

// SilentListener listens on a loopback port, accepts every connection and
// never answers (nor closes it): a hung peer, for tests of timeouts and
// handshakes that must not wait on it. It returns the address; the listener
// and the connections it accepted close when the test ends.
func SilentListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, nc := range held {
				nc.Close()
			}
		}()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return // the listener closed: the test ended
			}
			held = append(held, nc)
		}
	}()
	return ln.Addr().String()
}
