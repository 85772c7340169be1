package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/lanes"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
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
//
// A plain RESP client (redis-cli) has no request id, so it cannot retry a
// write whose outcome it was not told. The forwarder therefore gives every
// forwarded write an id — a lane's (internal/lanes: a client id used by one
// write at a time, taken for the write's whole forward) — and, when the leader does not
// answer — its connection breaks, it cannot be dialled, it says MOVED or
// "no leader" or UNAVAILABLE — retries the write itself with that same id,
// to whichever leader this replica knows by then, until it has the leader's
// answer or the retry bound (10 s) has passed. The client table makes the retries
// at-most-once: a write the dead leader had committed is answered from the
// new leader's table, one it had not is executed once. A forwarded request
// that finds no leader known waits for one the same way. Only when the
// retries run out does the client get an error, and it says which of two
// things is true (fwdGiveUp): the write never reached a node that could have
// applied it without that node answering ("not applied": safe to retry), or
// it did ("outcome unknown").
//
// One write per id: a write's retries may reach a leader after later writes
// of the same sender ran there (a pipeline's first write refused while the
// second ran; a write waiting to retry while its connection served the next
// forward), and the client table refuses an id's older request number once
// a newer one executed. While the ids were one per pooled connection, such a
// retry was refused as "stale request: client X request 1, table has 2" — a
// user's error for a write sent once (TestGroupsLiveSlotMove under load).

const (
	fwdMaxHops     = 3
	fwdDialTimeout = time.Second
	// fwdTimeout bounds one forwarded round trip; the leader gives up on a
	// write it cannot commit after vrshard's RequestTimeout (2 s) already.
	fwdTimeout = 5 * time.Second
	fwdMaxIdle = 16
	// fwdRetryForDefault bounds how long a forwarded request is retried (and a
	// request that finds no leader known waits for one): several view
	// changes (300 ms timeout each) and a leader's 2 s commit timeout fit.
	fwdRetryForDefault = 10 * time.Second
	// fwdRetryPause is the first pause between retries; it doubles up to
	// fwdRetryMaxPause.
	fwdRetryPause    = 20 * time.Millisecond
	fwdRetryMaxPause = 300 * time.Millisecond
)

// fwdReadRetryFor bounds the retries of a pipeline of reads only. A read
// has no outcome to make certain (it changed nothing), so it is not worth a
// long stall: a leader change (a view-change timeout, a lease) fits, and a
// follower cut off from a dead leader answers UNAVAILABLE within it, before
// common client read timeouts (go-redis: 3 s) give up on the connection.
var fwdReadRetryFor = 2 * time.Second

// ErrNoLeader is the reply when no leader is known (a view change is running).
var ErrNoLeader = &ReplyError{"UNAVAILABLE no leader"}

// Call is one command to forward and, once done, its outcome.
type Call struct {
	Args [][]byte
	Cons level.Consistency // reads
	Dur  level.Durability  // writes (zero for reads)
	ID   shard.ReqID
	Sess shard.Session

	// Outcome: Err (a local failure, e.g. the leader's connection broke), or
	// the leader's reply and the advanced session.
	Err     error
	Reply   resp.Value
	NewSess shard.Session
	// maybe: the request was sent to a node that may have executed it and
	// no answer came back (the connection broke after the write, or the
	// leader answered UNAVAILABLE): until a reply to a retry says what
	// happened, its outcome is unknown.
	maybe bool
}

type forwarder struct {
	password string
	tls      *tls.Config

	mu   sync.Mutex
	idle map[string][]*fwdConn

	forwarded atomic.Uint64
	// retries counts forwarded requests sent again (kefir_forward_retries_total).
	retries atomic.Uint64
	// stopping reports that the node is shutting down: forward stops
	// retrying (nil: never).
	stopping func() bool
	// retryFor bounds how long a forwarded write is retried
	// (fwdRetryForDefault; tests shorten it).
	retryFor time.Duration
	// lanes give forwarded writes that came without a request id theirs
	// (never closed: a forward after close dials anew).
	lanes lanes.Pool
}

type fwdConn struct {
	nc  net.Conn
	rd  *resp.Reader
	buf []byte
	// reused: taken from the idle pool (the leader may have closed it since).
	reused bool
}

// newForwarder dials leaders with password (AUTH; "" none) and, when
// certFile is set, over TLS trusting exactly the group's certificate.
func newForwarder(password, certFile, keyFile string) *forwarder {
	f := &forwarder{password: password, idle: map[string][]*fwdConn{}, retryFor: fwdRetryForDefault}
	if certFile != "" {
		// Every member serves the group's certificate; trust exactly it.
		f.tls = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // see VerifyGroupCert
		f.tls.VerifyPeerCertificate = VerifyGroupCert(certFile, keyFile)
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
	c := &fwdConn{nc: nc, rd: resp.NewReader(nc, 0)}
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

// forward sends calls to addr (the leader as this replica knows it; "" when
// none is known) as one pipeline and fills in their outcomes, retrying what
// got no answer, with the same request ids, to the leader leader() names,
// until every call has the leader's answer or the retry bound (10 s) has passed (see the
// comment at the top of the file).
func (f *forwarder) forward(addr string, calls []*Call, leader func() (string, bool)) {
	// A write without a request id takes a lane for the whole forward; the
	// lane goes back once the write's outcome is settled: the leader
	// answered, or no node that could run it read it. One whose outcome
	// is unknown may still run somewhere, so its lane is dropped.
	type laned struct {
		c *Call
		l *lanes.Lane
	}
	var taken []laned
	for _, c := range calls {
		if c.Dur != 0 && c.ID.IsZero() {
			l := f.lanes.Get()
			c.ID = shard.ReqID{Client: l.ID, Seq: l.Next()}
			taken = append(taken, laned{c, l})
		}
	}
	defer func() {
		for _, t := range taken {
			if t.c.Err == nil || !t.c.maybe {
				f.lanes.Put(t.l)
			}
		}
	}()
	retryFor := fwdReadRetryFor
	for _, c := range calls {
		if c.Dur != 0 {
			retryFor = f.retryFor
			break
		}
	}
	deadline := time.Now().Add(min(retryFor, f.retryFor))
	pause := fwdRetryPause
	why := errors.New("no leader known")
	sent := false // a first attempt went out: later round trips are retries
	for hops := 0; ; {
		if addr == "" {
			addr, _ = leader()
		}
		if addr != "" {
			if sent {
				// Counted when sent again, not when the retry is decided:
				// a retry the deadline cuts off was never sent.
				f.retries.Add(uint64(len(calls)))
			}
			sent = true
			f.roundTrip(addr, calls)
			var again []*Call
			next := ""
			for _, c := range calls {
				redo, to := c.retryable(f.retryFor)
				if !redo {
					continue
				}
				again = append(again, c)
				switch {
				case c.Err != nil:
					why = c.Err
				case string(c.Reply.Str) == ErrNoLeader.Msg:
					why = errors.New("no leader known")
				default:
					why = errors.New(string(c.Reply.Str))
				}
				if to != "" && next == "" {
					next = to
				}
			}
			if len(again) == 0 {
				return
			}
			calls = again
			if next != "" && next != addr && hops < fwdMaxHops {
				// Follow a MOVED at once: the node that sent it knows a leader.
				addr = next
				hops++
				continue
			}
			addr = ""
		}
		if !time.Now().Add(pause).Before(deadline) || (f.stopping != nil && f.stopping()) {
			break
		}
		time.Sleep(pause)
		pause = min(2*pause, fwdRetryMaxPause)
		hops = 0
	}
	for _, c := range calls {
		c.Err = fwdGiveUp(c, why, f.retryFor)
	}
}

// retryable reports whether c's outcome calls for sending it again, and the
// leader a MOVED reply named. A reply from the leader is the outcome (a
// retried write's is its first execution's, from the client table). What is
// retried: a request that got no reply (the connection failed: it may have
// executed if it was sent), a node's refusal to take it (MOVED, no leader: it
// did not execute there), and a leader's UNAVAILABLE to a write (it may have
// executed).
func (c *Call) retryable(retryFor time.Duration) (bool, string) {
	if c.Err != nil {
		return true, ""
	}
	if c.Reply.Kind != resp.Error {
		return false, ""
	}
	msg := string(c.Reply.Str)
	switch {
	case strings.HasPrefix(msg, "MOVED "):
		// "MOVED <addr>" (KEFIR.CALL REDIRECT) or Redis Cluster's
		// "MOVED <slot> <addr>": the address is the last word.
		f := strings.Fields(msg)
		return true, f[len(f)-1]
	case msg == ErrNoLeader.Msg:
		return true, ""
	case strings.HasPrefix(msg, "UNAVAILABLE ") && c.Dur != 0:
		// A write the leader could not finish (it lost leadership, its
		// commit timed out): it may have executed. A read's UNAVAILABLE
		// (a session token ahead, a failed node) is relayed as it is.
		c.maybe = true
		return true, ""
	case c.maybe && strings.Contains(msg, shard.ErrStaleRequest.Error()):
		// A retry of a write whose client id has a later request in the
		// leader's table (a REQID client that pipelined under one id,
		// against docs/design/resp-extensions.md; the forwarder's own ids
		// have one write each): the answer to this one is gone, and
		// retrying cannot bring it back.
		c.Err = fwdGiveUp(c, errors.New(msg), retryFor)
	}
	return false, ""
}

// fwdGiveUp is the error a forwarded request gets when its retries ran out
// (or cannot help). For a write it says what this node knows: "not applied"
// only when no attempt reached a node that could have executed it without
// that node answering.
func fwdGiveUp(c *Call, why error, retryFor time.Duration) error {
	switch {
	case c.Dur == 0:
		return &ReplyError{"UNAVAILABLE forward: " + why.Error()}
	case c.maybe:
		return &ReplyError{fmt.Sprintf("UNAVAILABLE forward: the write's outcome is unknown: it reached the leader, which did not answer (%v), and retries with its request id for up to %v brought no answer; it may have been applied", why, retryFor)}
	}
	return &ReplyError{fmt.Sprintf("UNAVAILABLE forward: the write was not applied: no leader took it within %v (%v); it is safe to retry", retryFor, why)}
}

func (f *forwarder) roundTrip(addr string, calls []*Call) {
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

// ask sends one command (not wrapped in KEFIR.CALL: an internal request
// between nodes, never forwarded on) to addr and returns its reply, bounded
// by ctx's deadline. An idle pooled connection the peer closed is retried
// once on a fresh one, as roundTrip does; nothing is retried after a reply
// or a timeout (the asker falls back).
func (f *forwarder) ask(ctx context.Context, addr string, args ...[]byte) (resp.Value, error) {
	for attempt := 0; ; attempt++ {
		conn, err := f.get(addr)
		if err != nil {
			return resp.Value{}, err
		}
		b := resp.AppendArrayHeader(conn.buf[:0], len(args))
		for _, a := range args {
			b = resp.AppendBulk(b, a)
		}
		conn.buf = b
		deadline := time.Now().Add(fwdTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		_ = conn.nc.SetDeadline(deadline)
		var v resp.Value
		if _, err = conn.nc.Write(b); err == nil {
			v, err = conn.rd.ReadValue()
		}
		if err == nil {
			v = v.Clone()
			conn.reused = false
			f.put(addr, conn)
			return v, nil
		}
		conn.nc.Close()
		var ne net.Error
		if conn.reused && attempt == 0 && !(errors.As(err, &ne) && ne.Timeout()) {
			continue
		}
		return resp.Value{}, err
	}
}

// failCalls records that calls got no reply, for err. Whether a write among
// them may have executed is in its maybe flag (exchange sets it once the
// request was written).
func failCalls(calls []*Call, err error) {
	for _, c := range calls {
		c.Err = err
	}
}

// exchange sends calls on conn and reads their replies; n is how many were
// answered before an error.
func (f *forwarder) exchange(conn *fwdConn, calls []*Call) (n int, err error) {
	b := conn.buf[:0]
	for _, c := range calls {
		b = appendFwd(b, c)
	}
	conn.buf = b
	_ = conn.nc.SetDeadline(time.Now().Add(fwdTimeout))
	if w, err := conn.nc.Write(b); err != nil {
		if w > 0 {
			mayHaveExecuted(calls)
		}
		return 0, err
	}
	for i, c := range calls {
		v, err := conn.rd.ReadValue()
		if err != nil {
			mayHaveExecuted(calls[i:])
			return i, err
		}
		c.Err, c.Reply, c.NewSess = nil, resp.Value{}, c.Sess
		switch {
		case v.Kind == resp.Array && len(v.Elems) == 2:
			if s, err := shard.ParseSession(string(v.Elems[0].Str)); err == nil {
				c.NewSess = s
			}
			c.Reply = v.Elems[1].Clone()
		default: // the wrapper itself failed (e.g. NOAUTH): relay as is
			c.Reply = v.Clone()
		}
	}
	return len(calls), nil
}

// mayHaveExecuted marks calls that were sent (at least in part) and got no
// reply: the node may execute them, so until a retry's reply tells, their
// outcome is unknown. A later MOVED or "no leader" from another node does not
// change that; only a reply from a leader (the client table's) does.
func mayHaveExecuted(calls []*Call) {
	for _, c := range calls {
		c.maybe = true
	}
}

func appendFwd(b []byte, c *Call) []byte {
	n := 5 + len(c.Args) // KEFIR.CALL REDIRECT SESSION tok ... CMD
	if c.Dur != 0 {
		n += 2
	}
	if !c.Cons.IsZero() {
		n += 2
	}
	if !c.ID.IsZero() {
		n += 3
	}
	b = resp.AppendArrayHeader(b, n)
	b = resp.AppendBulkString(b, "KEFIR.CALL")
	b = resp.AppendBulkString(b, "REDIRECT")
	if c.Dur != 0 {
		b = resp.AppendBulkString(b, "DURABILITY")
		b = resp.AppendBulkString(b, c.Dur.String())
	}
	if !c.Cons.IsZero() {
		b = resp.AppendBulkString(b, "CONSISTENCY")
		b = resp.AppendBulkString(b, c.Cons.String())
	}
	b = resp.AppendBulkString(b, "SESSION")
	b = resp.AppendBulkString(b, c.Sess.String())
	if !c.ID.IsZero() {
		b = resp.AppendBulkString(b, "REQID")
		b = resp.AppendBulkString(b, strconv.FormatUint(c.ID.Client, 10))
		b = resp.AppendBulkString(b, strconv.FormatUint(c.ID.Seq, 10))
	}
	b = resp.AppendBulkString(b, "CMD")
	for _, a := range c.Args {
		b = resp.AppendBulk(b, a)
	}
	return b
}

// VerifyGroupCert accepts exactly the certificate this node serves: the
// members of a group share the client-port certificate, so a follower
// forwarding to its leader trusts that one certificate and nothing else.
func VerifyGroupCert(certFile, keyFile string) func([][]byte, [][]*x509.Certificate) error {
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
