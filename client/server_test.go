package client

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kefirdb/kefir/internal/resp"
)

// testServer is a small in-process RESP server built on internal/resp. It speaks
// the commands and KEFIR.CALL extensions the client uses (resp-extensions.md), with
// a single-node client table for REQID, and lets tests intervene per command.
type testServer struct {
	t  *testing.T
	ln net.Listener

	password string

	mu       sync.Mutex
	data     map[string][]byte
	version  uint64
	table    map[uint64]tableEntry // REQID client id → latest seq and its reply
	log      []string              // every command received, space-joined
	reqids   [][2]uint64           // every REQID received, in order
	tokens   []string              // every SESSION token received
	dups     int                   // writes answered from the client table
	conns    []net.Conn
	accepted int
	noLog    bool // benchmarks: don't keep every command
	// maxConns, if set, refuses connections beyond that many open ones the
	// way kefir server does at --max-clients: an error reply, then close.
	maxConns int
	open     int
	// hook, if set, runs before each command (after KEFIR.CALL is unwrapped) and
	// decides what happens to it.
	hook func(h hookInfo) action
	// slots, if set, makes the server a cluster node (INFO cluster says
	// cluster_enabled:1) whose CLUSTER SLOTS is slots and CLUSTER INFO's
	// epoch epoch; redirect, if set, may answer a command (after KEFIR.CALL
	// is unwrapped) with an error reply instead of running it, given
	// whether the connection's previous command was ASKING.
	slots    resp.Value
	epoch    uint64
	redirect func(argv []string, asking bool) (resp.Value, bool)
	asking   map[int]bool // by connection index: its last command was ASKING
}

type tableEntry struct {
	seq   uint64
	reply resp.Value
}

type hookInfo struct {
	argv      []string // the inner command
	id, seq   uint64   // REQID, zero if none
	connIndex int
}

type action int

const (
	actReply           action = iota // execute and reply
	actDropBeforeApply               // close the connection without executing
	actDropAfterApply                // execute, record in the client table, close without replying
	actNoReply                       // execute, record, send nothing (a lost reply)
)

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	return newTestServerOn(t, nil)
}

// newTestServerOn serves TLS when cfg is non-nil.
func newTestServerOn(t *testing.T, cfg *tls.Config) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	s := &testServer{t: t, ln: ln, data: map[string][]byte{}, table: map[uint64]tableEntry{}}
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *testServer) addr() []string { return []string{s.ln.Addr().String()} }

func (s *testServer) close() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

// dropAll closes every server-side connection, as a crashing network would.
func (s *testServer) dropAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

func (s *testServer) setHook(h func(hookInfo) action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = h
}

func (s *testServer) set(k, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data[k] = []byte(v)
}

func (s *testServer) accepts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

func (s *testServer) commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

func (s *testServer) accept() {
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.maxConns > 0 && s.open >= s.maxConns {
			s.mu.Unlock()
			nc.Write([]byte("-ERR max number of clients reached\r\n"))
			nc.Close()
			continue
		}
		s.conns = append(s.conns, nc)
		s.accepted++
		s.open++
		idx := s.accepted
		s.mu.Unlock()
		go func() {
			s.serve(nc, idx)
			s.mu.Lock()
			s.open--
			s.mu.Unlock()
		}()
	}
}

func (s *testServer) serve(nc net.Conn, idx int) {
	defer nc.Close()
	rd := resp.NewReader(nc, 0)
	w := resp.NewWriter(nc, 0)
	s.mu.Lock()
	password := s.password
	s.mu.Unlock()
	authed := password == ""
	var argv [][]byte
	for {
		var err error
		argv, err = rd.ReadCommand(argv)
		if err != nil {
			if resp.IsProtocolError(err) {
				w.WriteError("ERR " + err.Error())
				w.Flush()
			}
			return
		}
		name := strings.ToUpper(string(argv[0]))
		switch {
		case name == "AUTH":
			if string(argv[len(argv)-1]) == password {
				authed = true
				w.WriteSimple("OK")
			} else {
				w.WriteError("WRONGPASS invalid username-password pair or user is disabled.")
			}
		case !authed:
			w.WriteError("NOAUTH Authentication required.")
		default:
			reply, act := s.call(argv, idx)
			switch act {
			case actDropBeforeApply, actDropAfterApply:
				w.Flush()
				return
			case actNoReply:
			default:
				w.WriteValue(reply)
			}
		}
		if rd.Buffered() == 0 {
			if w.Flush() != nil {
				return
			}
		}
	}
}

func simple(s string) resp.Value { return resp.Value{Kind: resp.Simple, Str: []byte(s)} }
func errv(s string) resp.Value   { return resp.Value{Kind: resp.Error, Str: []byte(s)} }
func intv(n int64) resp.Value    { return resp.Value{Kind: resp.Int, Int: n} }
func bulk(b []byte) resp.Value {
	if b == nil {
		return resp.Value{Kind: resp.Null}
	}
	return resp.Value{Kind: resp.Bulk, Str: b}
}

// call unwraps KEFIR.CALL, applies the client table and runs the command.
func (s *testServer) call(argv [][]byte, connIdx int) (resp.Value, action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	words := make([]string, len(argv))
	for i, a := range argv {
		words[i] = string(a)
	}
	if !s.noLog {
		s.log = append(s.log, strings.Join(words, " "))
	}

	inner := words
	var id, seq uint64
	var token string
	session := false
	if strings.EqualFold(words[0], "KEFIR.CALL") {
		i := 1
		for ; i < len(words) && !strings.EqualFold(words[i], "CMD"); i++ {
			switch strings.ToUpper(words[i]) {
			case "CONSISTENCY", "DURABILITY":
				i++
			case "SESSION":
				i++
				session, token = true, words[i]
				s.tokens = append(s.tokens, token)
			case "REQID":
				id, _ = strconv.ParseUint(words[i+1], 10, 64)
				seq, _ = strconv.ParseUint(words[i+2], 10, 64)
				s.reqids = append(s.reqids, [2]uint64{id, seq})
				i += 2
			}
		}
		if i+1 >= len(words) {
			return errv("ERR KEFIR.CALL without CMD"), actReply
		}
		inner = words[i+1:]
	}

	if strings.EqualFold(inner[0], "ASKING") {
		if s.asking == nil {
			s.asking = map[int]bool{}
		}
		s.asking[connIdx] = true
		return simple("OK"), actReply
	}
	asking := s.asking[connIdx]
	delete(s.asking, connIdx)
	if s.redirect != nil {
		if e, ok := s.redirect(inner, asking); ok {
			return e, actReply
		}
	}
	act := actReply
	if s.hook != nil {
		hook := s.hook
		s.mu.Unlock()
		act = hook(hookInfo{argv: inner, id: id, seq: seq, connIndex: connIdx})
		s.mu.Lock()
	}
	if act == actDropBeforeApply {
		return resp.Value{}, act
	}

	var reply resp.Value
	if e, ok := s.table[id]; id != 0 && ok && seq <= e.seq {
		if seq < e.seq {
			reply = errv("ERR stale request")
		} else {
			s.dups++
			reply = e.reply
		}
	} else {
		reply = s.exec(inner)
		if id != 0 {
			s.table[id] = tableEntry{seq: seq, reply: reply.Clone()}
		}
	}
	if session && reply.Kind != resp.Error {
		reply = resp.Value{Kind: resp.Array, Elems: []resp.Value{
			bulk([]byte("v1." + strconv.FormatUint(s.version, 10) + "." + strconv.FormatUint(s.version, 10))), reply}}
	} else if session {
		reply = resp.Value{Kind: resp.Array, Elems: []resp.Value{bulk([]byte(token)), reply}}
	}
	return reply, act
}

// exec runs one plain command. REQUIRES: s.mu held.
func (s *testServer) exec(w []string) resp.Value {
	name := strings.ToUpper(w[0])
	if strings.HasPrefix(name, "REPLY-ERROR:") {
		return errv(strings.TrimPrefix(w[0], "reply-error:"))
	}
	switch name {
	case "PING":
		return simple("PONG")
	case "READWRITE", "READONLY":
		return simple("OK")
	case "INFO":
		if s.slots.Kind == 0 {
			return errv("ERR unknown command 'INFO'")
		}
		return bulk([]byte("# Cluster\r\ncluster_enabled:1\r\n"))
	case "CLUSTER":
		if s.slots.Kind == 0 {
			return errv("ERR unknown command 'CLUSTER'")
		}
		if strings.EqualFold(w[1], "INFO") {
			return bulk([]byte("cluster_state:ok\r\ncluster_current_epoch:" + strconv.FormatUint(s.epoch, 10) + "\r\n"))
		}
		return s.slots
	case "GET":
		if strings.HasPrefix(w[1], "reply-error:") {
			return errv(strings.TrimPrefix(w[1], "reply-error:"))
		}
		return bulk(s.data[w[1]])
	case "SET":
		s.version++
		s.data[w[1]] = []byte(w[2])
		return simple("OK")
	case "DEL":
		_, ok := s.data[w[1]]
		delete(s.data, w[1])
		s.version++
		if ok {
			return intv(1)
		}
		return intv(0)
	case "INCRBY":
		cur := int64(0)
		if v, ok := s.data[w[1]]; ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return errv("ERR value is not an integer or out of range")
			}
			cur = n
		}
		d, _ := strconv.ParseInt(w[2], 10, 64)
		cur += d
		s.version++
		s.data[w[1]] = []byte(strconv.FormatInt(cur, 10))
		return intv(cur)
	case "MGET":
		out := resp.Value{Kind: resp.Array}
		for _, k := range w[1:] {
			out.Elems = append(out.Elems, bulk(s.data[k]))
		}
		return out
	case "MSET":
		for i := 1; i+1 < len(w); i += 2 {
			s.data[w[i]] = []byte(w[i+1])
		}
		s.version++
		return simple("OK")
	case "KEFIR.CAS":
		if cur, ok := s.data[w[1]]; ok && bytes.Equal(cur, []byte(w[2])) {
			s.data[w[1]] = []byte(w[3])
			s.version++
			return intv(1)
		}
		return intv(0)
	case "KEFIR.TX": // enough of it for one transaction per connection (txn_test.go)
		switch strings.ToUpper(w[1]) {
		case "BEGIN":
			return intv(1)
		case "GET":
			return bulk(s.data[w[3]])
		case "PREPARE":
			return bulk([]byte("op"))
		}
		return simple("OK")
	case "KEFIR.TXAPPLY":
		s.version++
		s.data["txapplied"] = append(s.data["txapplied"], 'x')
		return intv(int64(s.version))
	case "KEFIR.SCAN":
		var keys []string
		for k := range s.data {
			if k >= w[1] && (w[2] == "" || k < w[2]) {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		limit := 1000
		if len(w) == 5 {
			limit, _ = strconv.Atoi(w[4])
		}
		out := resp.Value{Kind: resp.Array}
		for i, k := range keys {
			if i == limit {
				break
			}
			out.Elems = append(out.Elems, bulk([]byte(k)), bulk(s.data[k]))
		}
		return out
	}
	return errv(fmt.Sprintf("ERR unknown command '%s'", w[0]))
}

// gatedConn wraps a client socket so a test can hold the client's writer inside
// Write and observe how the next batch is formed.
type gatedConn struct {
	net.Conn
	mu     sync.Mutex
	gate   chan struct{} // if non-nil, the next Write waits for it
	writes []int         // size of every Write
	inGate chan struct{}
}

func (g *gatedConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	gate := g.gate
	g.gate = nil
	g.writes = append(g.writes, len(p))
	g.mu.Unlock()
	if gate != nil {
		close(g.inGate)
		<-gate
	}
	return g.Conn.Write(p)
}

var _ io.Writer = (*gatedConn)(nil)
