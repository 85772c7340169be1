package drivers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
)

// RESPServer is a trivial in-process RESP server: an in-memory map behind the smallest
// command set the drivers use (PING, GET, SET, MGET, DEL, FLUSHALL, ZADD and
// ZRANGE as no-ops, and KEFIR.CALL/KEFIR.SCAN so the Kefir driver can point at it).
// It does no durability and no replication: driven through the Redis or Kefir driver it
// measures the harness's and the client library's own ceiling — issue 8 requires the
// harness to drive at least 3× the best throughput any real system reaches.
type RESPServer struct {
	ln     net.Listener
	shards [64]shard
	seed   maphash.Seed
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

type shard struct {
	mu sync.RWMutex
	m  map[string][]byte
}

// StartRESPServer listens on addr (use "127.0.0.1:0") and serves until Close.
func StartRESPServer(addr string) (*RESPServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &RESPServer{ln: ln, seed: maphash.MakeSeed(), conns: map[net.Conn]struct{}{}}
	for i := range s.shards {
		s.shards[i].m = map[string][]byte{}
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the address the server listens on.
func (s *RESPServer) Addr() string { return s.ln.Addr().String() }

// Close stops the listener and every connection and waits for their goroutines.
func (s *RESPServer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *RESPServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

func (s *RESPServer) shard(key []byte) *shard {
	return &s.shards[maphash.Bytes(s.seed, key)%uint64(len(s.shards))]
}

// serve reads pipelined commands and flushes replies only when no more input is
// buffered, so a pipelined batch costs one read and one write. It is the ceiling's
// server, so it does the least per command it can: the arguments of one command live
// in one buffer reused for the next (only SET copies its value, to keep it), lengths
// are parsed in place, and nothing is allocated per GET.
func (s *RESPServer) serve(c net.Conn) {
	rd := bufio.NewReaderSize(c, 64<<10)
	wr := bufio.NewWriterSize(c, 64<<10)
	var args [][]byte
	var buf []byte
	for {
		var err error
		args, buf, err = readCommand(rd, args[:0], buf[:0])
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				fmt.Fprintf(wr, "-ERR %v\r\n", err)
				wr.Flush()
			}
			return
		}
		s.exec(wr, args)
		if rd.Buffered() == 0 {
			if wr.Flush() != nil {
				return
			}
		}
	}
}

// readCommand parses one RESP array of bulk strings into args, whose slices alias buf
// (grown as needed and returned): they are valid until the next call with the same buf.
func readCommand(rd *bufio.Reader, args [][]byte, buf []byte) ([][]byte, []byte, error) {
	line, err := readLine(rd)
	if err != nil {
		return nil, buf, err
	}
	if len(line) == 0 || line[0] != '*' {
		return nil, buf, fmt.Errorf("protocol: expected array, got %q", line)
	}
	n, ok := parseLen(line[1:])
	if !ok || n < 1 || n > 1<<20 {
		return nil, buf, fmt.Errorf("protocol: bad array length %q", line)
	}
	// Spans first, slices after: buf may move while it grows.
	var spanBuf [8][2]int
	spans := spanBuf[:0]
	for range n {
		line, err := readLine(rd)
		if err != nil {
			return nil, buf, err
		}
		if len(line) == 0 || line[0] != '$' {
			return nil, buf, fmt.Errorf("protocol: expected bulk string, got %q", line)
		}
		l, ok := parseLen(line[1:])
		if !ok || l < 0 || l > 512<<20 {
			return nil, buf, fmt.Errorf("protocol: bad bulk length %q", line)
		}
		start := len(buf)
		buf = slices.Grow(buf, l+2)[:start+l+2]
		if _, err := io.ReadFull(rd, buf[start:]); err != nil {
			return nil, buf, err
		}
		buf = buf[:start+l]
		spans = append(spans, [2]int{start, start + l})
	}
	for _, sp := range spans {
		args = append(args, buf[sp[0]:sp[1]:sp[1]])
	}
	return args, buf, nil
}

// parseLen parses a RESP length (decimal, possibly -1) without allocating.
func parseLen(b []byte) (int, bool) {
	if len(b) == 2 && b[0] == '-' && b[1] == '1' {
		return -1, true
	}
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = 10*n + int(c-'0')
	}
	return n, true
}

func readLine(rd *bufio.Reader) ([]byte, error) {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errors.New("protocol: line not ended by CRLF")
	}
	return line[:len(line)-2], nil
}

func writeBulk(wr *bufio.Writer, v []byte) {
	if v == nil {
		wr.WriteString("$-1\r\n")
		return
	}
	var hdr [24]byte
	h := append(hdr[:0], '$')
	h = strconv.AppendInt(h, int64(len(v)), 10)
	wr.Write(append(h, '\r', '\n'))
	wr.Write(v)
	wr.WriteString("\r\n")
}

func (s *RESPServer) exec(wr *bufio.Writer, args [][]byte) {
	var up [16]byte
	cmd := up[:0]
	if len(args[0]) <= len(up) {
		for _, c := range args[0] {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			cmd = append(cmd, c)
		}
	}
	switch string(cmd) {
	case "KEFIR.CALL":
		// Skip the options up to CMD; levels mean nothing to an in-memory map.
		for i := 1; i < len(args); i++ {
			if bytes.EqualFold(args[i], []byte("CMD")) && i+1 < len(args) {
				s.exec(wr, args[i+1:])
				return
			}
		}
		wr.WriteString("-ERR KEFIR.CALL without CMD\r\n")
	case "PING":
		wr.WriteString("+PONG\r\n")
	case "GET":
		if len(args) != 2 {
			wr.WriteString("-ERR wrong number of arguments for 'get'\r\n")
			return
		}
		sh := s.shard(args[1])
		sh.mu.RLock()
		v := sh.m[string(args[1])]
		sh.mu.RUnlock()
		writeBulk(wr, v)
	case "SET":
		if len(args) < 3 {
			wr.WriteString("-ERR wrong number of arguments for 'set'\r\n")
			return
		}
		v := bytes.Clone(args[2]) // args alias the connection's buffer
		if v == nil {
			v = []byte{} // an empty value is a value, not a missing key
		}
		sh := s.shard(args[1])
		sh.mu.Lock()
		sh.m[string(args[1])] = v
		sh.mu.Unlock()
		wr.WriteString("+OK\r\n")
	case "DEL":
		n := 0
		for _, k := range args[1:] {
			sh := s.shard(k)
			sh.mu.Lock()
			if _, ok := sh.m[string(k)]; ok {
				delete(sh.m, string(k))
				n++
			}
			sh.mu.Unlock()
		}
		fmt.Fprintf(wr, ":%d\r\n", n)
	case "MGET":
		fmt.Fprintf(wr, "*%d\r\n", len(args)-1)
		for _, k := range args[1:] {
			sh := s.shard(k)
			sh.mu.RLock()
			v := sh.m[string(k)]
			sh.mu.RUnlock()
			writeBulk(wr, v)
		}
	case "FLUSHALL":
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			sh.m = map[string][]byte{}
			sh.mu.Unlock()
		}
		wr.WriteString("+OK\r\n")
	case "ZADD":
		wr.WriteString(":1\r\n")
	case "ZRANGE", "ZRANGEBYLEX", "KEFIR.SCAN":
		wr.WriteString("*0\r\n")
	case "SELECT", "CLIENT":
		wr.WriteString("+OK\r\n")
	default:
		fmt.Fprintf(wr, "-ERR unknown command '%s'\r\n", args[0])
	}
}
