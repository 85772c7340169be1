//go:build !linux

package server

import (
	"net"
	"time"
)

// Without epoll every connection is served by its own goroutine.

const epollSupported = false

type evConn struct {
	in fdReader
	nc net.Conn
}

type fdReader struct{}

func (*fdReader) Read([]byte) (int, error) { panic("server: no event loop on this system") }

func (*evConn) send([]byte) error { panic("server: no event loop on this system") }

func (*Server) loopConn(net.Conn) *evConn { return nil }

func (*conn) serveLoop() { panic("server: no event loop on this system") }

func (c *conn) clock() time.Time { return time.Now() }

func setLoopSpin(time.Duration) {}

// mayBlock: a connection's own goroutine may wait.
func (*conn) mayBlock() bool { return true }
