package server

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// FuzzConnection feeds arbitrary bytes to a connection of a real node (real
// engine, real files) and checks that the connection ends without a panic and
// that the node still serves others. Run longer with:
//
//	go test ./internal/server -run '^$' -fuzz FuzzConnection -fuzztime 30s
func FuzzConnection(f *testing.F) {
	cmd := func(args ...string) []byte {
		var bs [][]byte
		for _, a := range args {
			bs = append(bs, []byte(a))
		}
		return resp.AppendCommand(nil, bs...)
	}
	seeds := [][]byte{
		cmd("SET", "k", "v"), cmd("GET", "k"), cmd("INCR", "k"), cmd("MSET", "a", "1", "b"),
		cmd("KEFIR.CALL", "SESSION", "v1.1.1", "REQID", "1", "2", "CMD", "SET", "k", "v", "NX", "GET"),
		cmd("KEFIR.CALL", "CMD", "KEFIR.CALL"), cmd("KEFIR.SCAN", "", "", "LIMIT", "3"),
		cmd("HELLO", "3", "AUTH", "default", "x", "SETNAME", "n"), cmd("CLIENT", "SETNAME", "a b"),
		cmd("COMMAND", "INFO", "get", "nope"), cmd("CONFIG", "GET", "*"), cmd("INFO", "all"),
		cmd("SET", "k", "v", "EX", "-1"), cmd("DECRBY", "k", "-9223372036854775808"),
		[]byte("PING\r\nECHO \"a\\x00b\"\r\n"), []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$-1\r\n"),
		[]byte("*1\r\n*1\r\n"), []byte("\x00\xff\r\n"), cmd("KEFIR.SESSION", "v1.18446744073709551615.1"),
		cmd("APPEND", "\xff\xffkefir/client/x", "v"), cmd("QUIT"),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	srv := startServer(f, func(c *Config) { c.MaxBulk = 1 << 16; c.HTTPAddr = "" })
	var id int64
	f.Fuzz(func(t *testing.T, in []byte) {
		cl, sv := net.Pipe()
		id++
		c := srv.newConn(sv, id)
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go func() {
			_ = cl.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, _ = cl.Write(in)
			// Closing ends a command the input left incomplete; the reader below
			// then stops too, and the server's pending writes fail.
			cl.Close()
		}()
		_ = cl.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, cl)
		cl.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("connection did not end")
		}
		if n := srv.panics.Load(); n > 0 {
			t.Fatalf("%d connection(s) panicked", n)
		}
	})
}
