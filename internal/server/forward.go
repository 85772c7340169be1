package server

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// Forwarding: a follower that receives a write or a read it cannot serve
// proxies it to the leader's client port as
//
//	KEFIR.CALL REDIRECT [CONSISTENCY l | DURABILITY d] SESSION <token> [REQID c s] CMD <command...>
//
// REDIRECT makes the receiver answer -MOVED instead of forwarding again, so a
// request never loops between nodes that disagree about the leader; the
// forwarder follows a MOVED itself, a few hops at most. The request id travels
// unchanged, so a client's retry (at this node or another) is answered from
// the leader's client table instead of executing twice. SESSION makes the
// leader return the session token advanced by the command, which the
// follower hands back to its client as if it had served the command itself.

const (
	fwdMaxHops     = 3
	fwdDialTimeout = time.Second
	// fwdTimeout bounds one forwarded round trip; the leader gives up on a
	// write it cannot commit after vrshard's RequestTimeout (2 s) already.
	fwdTimeout = 5 * time.Second
	fwdMaxIdle = 16
)

// errNoLeader is the reply when no leader is known (a view change is running).
var errNoLeader = &replyError{"UNAVAILABLE no leader"}

// fwdCall is one command to forward and, once done, its outcome.
type fwdCall struct {
	args [][]byte
	cons level.Consistency // reads
	dur  level.Durability  // writes (zero for reads)
	id   shard.ReqID
	sess shard.Session

	// Outcome: err (a local failure, e.g. the leader's connection broke), or
	// the leader's reply and the advanced session.
	err     error
	reply   resp.Value
	newSess shard.Session
}

type forwarder struct {
	password string
	tls      *tls.Config

	mu   sync.Mutex
	idle map[string][]*fwdConn

	forwarded atomic.Uint64
}

type fwdConn struct {
	nc  net.Conn
	rd  *resp.Reader
	buf []byte
	// reused: taken from the idle pool (the leader may have closed it since).
	reused bool
	// id and seq are the request ids this connection gives forwarded writes
	// that came without one (plain redis-cli writes), so that the
	// forwarder's own retry is answered from the leader's client table
	// instead of executing twice. One id per connection keeps its seqs in
	// wire order, as the client table requires.
	id, seq uint64
}

func newForwarder(cfg Config) *forwarder {
	f := &forwarder{password: cfg.Password, idle: map[string][]*fwdConn{}}
	if cfg.TLSCert != "" {
		// Every member serves the group's certificate; trust exactly it.
		f.tls = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // see verifyGroupCert
		f.tls.VerifyPeerCertificate = verifyGroupCert(cfg.TLSCert, cfg.TLSKey)
	}
	return f
}

func (f *forwarder) get(addr string) (*fwdConn, error) {
	f.mu.Lock()
	if l := f.idle[addr]; len(l) > 0 {
		c := l[len(l)-1]
		f.idle[addr] = l[:len(l)-1]
		f.mu.Unlock()
		c.reused = true
		return c, nil
	}
	f.mu.Unlock()
	nc, err := net.DialTimeout("tcp", addr, fwdDialTimeout)
	if err != nil {
		return nil, fmt.Errorf("forward: dial leader %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if f.tls != nil {
		nc = tls.Client(nc, f.tls)
	}
	c := &fwdConn{nc: nc, rd: resp.NewReader(nc, 0), id: randomID()}
	if f.password != "" {
		_ = nc.SetDeadline(time.Now().Add(fwdTimeout))
		c.buf = resp.AppendCommand(c.buf[:0], []byte("AUTH"), []byte(f.password))
		if _, err := nc.Write(c.buf); err != nil {
			nc.Close()
			return nil, fmt.Errorf("forward: auth at %s: %w", addr, err)
		}
		v, err := c.rd.ReadValue()
		if err != nil || v.Kind == resp.Error {
			nc.Close()
			return nil, fmt.Errorf("forward: auth at %s refused (the group's members must share one password): %s %v", addr, v.Str, err)
		}
	}
	return c, nil
}

func (f *forwarder) put(addr string, c *fwdConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.idle[addr]) >= fwdMaxIdle {
		c.nc.Close()
		return
	}
	f.idle[addr] = append(f.idle[addr], c)
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.idle {
		for _, c := range l {
			c.nc.Close()
		}
	}
	clear(f.idle)
}

// forward sends calls to addr as one pipeline and fills in their outcomes,
// following MOVED replies a few hops. Calls that got no reply (the connection
// broke) carry an UNAVAILABLE error: a write among them may or may not have
// executed, and only a retry with the same request id can tell.
func (f *forwarder) forward(addr string, calls []*fwdCall) {
	for hop := 0; len(calls) > 0; hop++ {
		if hop == fwdMaxHops {
			for _, c := range calls {
				c.err = errNoLeader
			}
			return
		}
		f.roundTrip(addr, calls)
		var again []*fwdCall
		next := ""
		for _, c := range calls {
			if c.err == nil && c.reply.Kind == resp.Error && strings.HasPrefix(string(c.reply.Str), "MOVED ") {
				to := strings.TrimPrefix(string(c.reply.Str), "MOVED ")
				if next == "" || to == next {
					next = to
					again = append(again, c)
					continue
				}
				c.err = errNoLeader // the nodes disagree: let the client retry
			}
		}
		calls, addr = again, next
	}
}

func (f *forwarder) roundTrip(addr string, calls []*fwdCall) {
	for attempt := 0; ; attempt++ {
		conn, err := f.get(addr)
		if err != nil {
			failCalls(calls, err)
			return
		}
		n, err := f.exchange(conn, calls)
		if err == nil {
			f.forwarded.Add(uint64(len(calls)))
			conn.reused = false
			f.put(addr, conn)
			return
		}
		conn.nc.Close()
		// An idle pooled connection the leader closed fails before any reply.
		// Every write carries a request id by now, so one retry on a fresh
		// connection cannot execute anything twice.
		if n == 0 && conn.reused && attempt == 0 {
			continue
		}
		failCalls(calls[n:], fmt.Errorf("forward to leader %s: %w", addr, err))
		return
	}
}

func failCalls(calls []*fwdCall, err error) {
	e := &replyError{"UNAVAILABLE " + err.Error() + " (a forwarded write's outcome is unknown; retry it with the same request id)"}
	for _, c := range calls {
		c.err = e
	}
}

// exchange sends calls on conn and reads their replies; n is how many were
// answered before an error.
func (f *forwarder) exchange(conn *fwdConn, calls []*fwdCall) (n int, err error) {
	b := conn.buf[:0]
	for _, c := range calls {
		if c.dur != 0 && c.id.IsZero() {
			conn.seq++
			c.id = shard.ReqID{Client: conn.id, Seq: conn.seq}
		}
		b = appendFwd(b, c)
	}
	conn.buf = b
	_ = conn.nc.SetDeadline(time.Now().Add(fwdTimeout))
	if _, err := conn.nc.Write(b); err != nil {
		return 0, err
	}
	for i, c := range calls {
		v, err := conn.rd.ReadValue()
		if err != nil {
			return i, err
		}
		c.err, c.reply, c.newSess = nil, resp.Value{}, c.sess
		switch {
		case v.Kind == resp.Array && len(v.Elems) == 2:
			if s, err := shard.ParseSession(string(v.Elems[0].Str)); err == nil {
				c.newSess = s
			}
			c.reply = v.Elems[1].Clone()
		default: // the wrapper itself failed (e.g. NOAUTH): relay as is
			c.reply = v.Clone()
		}
	}
	return len(calls), nil
}

// randomID returns a random non-zero request client id.
func randomID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

func appendFwd(b []byte, c *fwdCall) []byte {
	n := 5 + len(c.args) // KEFIR.CALL REDIRECT SESSION tok ... CMD
	if c.dur != 0 {
		n += 2
	}
	if !c.cons.IsZero() {
		n += 2
	}
	if !c.id.IsZero() {
		n += 3
	}
	b = resp.AppendArrayHeader(b, n)
	b = resp.AppendBulkString(b, "KEFIR.CALL")
	b = resp.AppendBulkString(b, "REDIRECT")
	if c.dur != 0 {
		b = resp.AppendBulkString(b, "DURABILITY")
		b = resp.AppendBulkString(b, c.dur.String())
	}
	if !c.cons.IsZero() {
		b = resp.AppendBulkString(b, "CONSISTENCY")
		b = resp.AppendBulkString(b, c.cons.String())
	}
	b = resp.AppendBulkString(b, "SESSION")
	b = resp.AppendBulkString(b, c.sess.String())
	if !c.id.IsZero() {
		b = resp.AppendBulkString(b, "REQID")
		b = resp.AppendBulkString(b, strconv.FormatUint(c.id.Client, 10))
		b = resp.AppendBulkString(b, strconv.FormatUint(c.id.Seq, 10))
	}
	b = resp.AppendBulkString(b, "CMD")
	for _, a := range c.args {
		b = resp.AppendBulk(b, a)
	}
	return b
}

// notLeaderReply is the reply to a request that asked for redirects (or that
// cannot be forwarded): -MOVED <leader's client address>, or -UNAVAILABLE
// when no leader is known.
func notLeaderReply(err error) error {
	if _, addr, ok := vrshard.LeaderOf(err); ok && addr != "" {
		return &replyError{"MOVED " + addr}
	}
	return errNoLeader
}

// leaderAddr returns where to forward a request that failed with err, or ""
// when err is not a redirect (or no leader is known).
func leaderAddr(err error) (string, bool) {
	if !errors.Is(err, vrshard.ErrNotLeader) {
		return "", false
	}
	_, addr, ok := vrshard.LeaderOf(err)
	return addr, ok && addr != ""
}

// verifyGroupCert accepts exactly the certificate this node serves: the
// members of a group share the client-port certificate, so a follower
// forwarding to its leader trusts that one certificate and nothing else.
func verifyGroupCert(certFile, keyFile string) func([][]byte, [][]*x509.Certificate) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if err != nil {
			return fmt.Errorf("forward: load own certificate: %w", err)
		}
		if len(raw) == 0 || len(cert.Certificate) == 0 || !bytes.Equal(raw[0], cert.Certificate[0]) {
			return errors.New("forward: the leader does not serve this group's certificate")
		}
		return nil
	}
}

// forwardWrites forwards the batch's writes that this node refused as a
// follower, all to the leader in one pipeline, and returns their outcomes by
// batch index (nil when there were none). Writes that asked for redirects get
// -MOVED instead.
func (c *conn) forwardWrites() []*fwdCall {
	if c.srv.vr == nil {
		return nil
	}
	var out []*fwdCall
	var calls []*fwdCall
	addr := ""
	for i := range c.writes {
		r := &c.writes[i]
		if r.Err == nil || !errors.Is(r.Err, vrshard.ErrNotLeader) {
			continue
		}
		q := &c.meta[i]
		a, ok := leaderAddr(r.Err)
		if q.redirect || !ok || (addr != "" && a != addr) {
			r.Err = notLeaderReply(r.Err)
			continue
		}
		addr = a
		if out == nil {
			out = make([]*fwdCall, len(c.writes))
		}
		sess := c.sess
		if q.session {
			sess = q.sess
		}
		fc := &fwdCall{args: q.raw, dur: r.Durability, id: r.ID, sess: sess}
		out[i] = fc
		calls = append(calls, fc)
	}
	if len(calls) > 0 {
		c.srv.fwd.forward(addr, calls)
	}
	return out
}

// writeForwarded relays a forwarded command's outcome as this node's reply.
func (c *conn) writeForwarded(fc *fwdCall, cmd int, session bool, _ replyShape) {
	if fc.err != nil || fc.reply.Kind == resp.Error {
		c.markErr(cmd)
	}
	if session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(fc.newSess.String())
	} else if fc.err == nil {
		c.sess = fc.newSess
	}
	if fc.err != nil {
		c.writeErr(fc.err)
		return
	}
	_ = c.w.WriteValue(fc.reply)
}

// forwardRead serves a read this node cannot prove at level cons by
// forwarding it to the leader (or answering -MOVED / -UNAVAILABLE no leader).
func (c *conn) forwardRead(args [][]byte, cons level.Consistency, sess shard.Session, o callOpts, err error) error {
	addr, ok := leaderAddr(err)
	if o.redirect || !ok {
		return notLeaderReply(err)
	}
	fc := &fwdCall{args: args, cons: cons, sess: sess}
	c.srv.fwd.forward(addr, []*fwdCall{fc})
	if fc.err != nil {
		return fc.err
	}
	if fc.reply.Kind == resp.Error {
		c.timed[len(c.timed)-1].err = true
	}
	if o.session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(fc.newSess.String())
	} else {
		c.sess = fc.newSess
	}
	return c.w.WriteValue(fc.reply)
}
