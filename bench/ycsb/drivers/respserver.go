package drivers

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"net"
	"strconv"
	"sync"

	"github.com/kefirdb/kefir/internal/resp"
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

// serve runs one connection as an event loop would: every complete command the last
// read brought is parsed in place by the project's RESP reader (the arguments alias its
// buffer: nothing is copied or allocated per command, except the value SET keeps), and
// the batch's replies leave in one write once no command is left buffered. A GET reply
// refers to the stored value instead of copying it (writev): a stored value is never
// modified, a SET replaces it. It is the ceiling's server, so it does the least per
// command it can; what remains per operation is the kernel's work and the map.
func (s *RESPServer) serve(c net.Conn) {
	rd := resp.NewReader(c, 64<<10)
	var out replies
	var args [][]byte
	for {
		var err error
		args, err = rd.ReadCommand(args[:0])
		if err != nil {
			if resp.IsProtocolError(err) {
				out.simple("-ERR " + err.Error() + "\r\n")
			}
			out.flush(c)
			return
		}
		s.exec(&out, args)
		if rd.Buffered() == 0 && out.flush(c) != nil {
			return
		}
	}
}

// replies collects one batch's replies for a single writev: small pieces are appended
// to scratch, and values of at least bigValue bytes are referred to where they are
// stored instead of being copied. segs lists the pieces in order.
type replies struct {
	scratch []byte
	segs    []seg
	bufs    net.Buffers
}

// seg is one piece of the reply stream: scratch[from:to], or val when it is not nil.
type seg struct {
	from, to int
	val      []byte
}

// bigValue is the size from which a value is sent from where it is stored rather than
// copied into the scratch buffer: below it a copy is cheaper than an iovec.
const bigValue = 256

func (r *replies) simple(s string) {
	from := len(r.scratch)
	r.scratch = append(r.scratch, s...)
	r.extend(from)
}

// extend records that scratch[from:] follows the previous piece.
func (r *replies) extend(from int) {
	if n := len(r.segs); n > 0 && r.segs[n-1].val == nil && r.segs[n-1].to == from {
		r.segs[n-1].to = len(r.scratch)
		return
	}
	r.segs = append(r.segs, seg{from: from, to: len(r.scratch)})
}

func (r *replies) integer(n int) { r.prefixed(':', n) }

func (r *replies) arrayHeader(n int) { r.prefixed('*', n) }

// prefixed appends a reply line of one type byte and a decimal number (":n", "*n").
func (r *replies) prefixed(typ byte, n int) {
	from := len(r.scratch)
	r.scratch = append(r.scratch, typ)
	r.scratch = strconv.AppendInt(r.scratch, int64(n), 10)
	r.scratch = append(r.scratch, '\r', '\n')
	r.extend(from)
}

// bulk appends a bulk string reply (v == nil: the null reply).
func (r *replies) bulk(v []byte) {
	if v == nil {
		r.simple("$-1\r\n")
		return
	}
	from := len(r.scratch)
	r.scratch = append(r.scratch, '$')
	r.scratch = strconv.AppendInt(r.scratch, int64(len(v)), 10)
	r.scratch = append(r.scratch, '\r', '\n')
	if len(v) < bigValue {
		r.scratch = append(r.scratch, v...)
		r.scratch = append(r.scratch, '\r', '\n')
		r.extend(from)
		return
	}
	r.extend(from)
	r.segs = append(r.segs, seg{val: v})
	from = len(r.scratch)
	r.scratch = append(r.scratch, '\r', '\n')
	r.extend(from)
}

// flush writes the batch in one writev and resets it.
func (r *replies) flush(c net.Conn) error {
	// scratch is final now (it may have moved while growing), so the slices are taken here.
	bufs := r.bufs[:0]
	for _, sg := range r.segs {
		if sg.val != nil {
			bufs = append(bufs, sg.val)
		} else {
			bufs = append(bufs, r.scratch[sg.from:sg.to])
		}
	}
	r.bufs = bufs
	_, err := bufs.WriteTo(c) // consumes a copy of the slice header, not r.bufs
	clear(r.bufs)             // don't keep stored values alive
	clear(r.segs)
	r.segs, r.scratch = r.segs[:0], r.scratch[:0]
	if cap(r.scratch) > 1<<20 {
		r.scratch = nil // don't pin a buffer grown for one huge batch
	}
	return err
}

func (s *RESPServer) exec(wr *replies, args [][]byte) {
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
		wr.simple("-ERR KEFIR.CALL without CMD\r\n")
	case "PING":
		wr.simple("+PONG\r\n")
	case "GET":
		if len(args) != 2 {
			wr.simple("-ERR wrong number of arguments for 'get'\r\n")
			return
		}
		sh := s.shard(args[1])
		sh.mu.RLock()
		v := sh.m[string(args[1])]
		sh.mu.RUnlock()
		wr.bulk(v)
	case "SET":
		if len(args) < 3 {
			wr.simple("-ERR wrong number of arguments for 'set'\r\n")
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
		wr.simple("+OK\r\n")
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
		wr.integer(n)
	case "MGET":
		wr.arrayHeader(len(args) - 1)
		for _, k := range args[1:] {
			sh := s.shard(k)
			sh.mu.RLock()
			v := sh.m[string(k)]
			sh.mu.RUnlock()
			wr.bulk(v)
		}
	case "FLUSHALL":
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			sh.m = map[string][]byte{}
			sh.mu.Unlock()
		}
		wr.simple("+OK\r\n")
	case "ZADD":
		wr.simple(":1\r\n")
	case "ZRANGE", "ZRANGEBYLEX", "KEFIR.SCAN":
		wr.simple("*0\r\n")
	case "SELECT", "CLIENT":
		wr.simple("+OK\r\n")
	default:
		wr.simple(fmt.Sprintf("-ERR unknown command '%s'\r\n", args[0]))
	}
}
