package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// replyKind says how the reader goroutine decodes a request's reply.
type replyKind uint8

const (
	replyStatus replyKind = iota + 1 // any non-error reply
	replyBulk                        // bulk string or null
	replyInt                         // integer
	replyList                        // array of bulk strings or nulls
	replyPairs                       // array of key, value, key, value… (a scan): request.kvs
	replyRaw                         // any reply, deep-copied into request.raw (nilext.go)
)

// reqState is where a request is; guarded by conn.mu.
type reqState uint8

const (
	stateNew       reqState = iota
	stateQueued             // waiting for the writer goroutine
	stateCancelled          // abandoned before it was sent: the writer skips it
	stateSent               // handed to the socket; its reply is expected in FIFO order
	stateReplied            // popped by the reader goroutine
)

// arg is one command word: a string (names, keys) or bytes (values), so callers'
// strings are encoded without converting them to []byte first.
type arg struct {
	s string
	b []byte
}

// request is one call. It is owned by the calling goroutine except between enqueue
// and the signal on done, when the writer and reader goroutines use it. A request
// whose caller gave up is never returned to the pool, because the reader may still
// complete it.
type request struct {
	// Command: filled by the caller, encoded into buf on the first attempt.
	cmd     []arg
	kind    replyKind
	write   bool
	opts    callOptions
	session *Session
	buf     []byte // encoded bytes, reused as-is on retry (same REQID)
	// allowRedirect asks (via KEFIR.CALL REDIRECT) for -MOVED <leader> instead
	// of forwarding; redirect records that the encoded call carries it.
	allowRedirect bool
	redirect      bool
	sent          bool // some attempt reached the socket
	// fixedID, fixedSeq is the REQID every write carries (a write without
	// one is not sent): its lane's (lanes.go), set by Client.do — or by a
	// nilext write's ordered fallback, which keeps the id its broadcast used
	// (nilext.go) — and kept by all its retries.
	fixedID, fixedSeq uint64
	// slot, if not 0, is the hash slot plus one that a call naming no key
	// is routed by in a cluster (a transaction's commit, KEFIR.TXAPPLY: its
	// transaction's first key's).
	slot int

	state reqState
	done  chan struct{}
	// detached: nobody waits for the reply (a transaction's ABORT,
	// conn.sendDetached); the reader drops it and returns the request to
	// the pool.
	detached bool

	// Result, written by the reader goroutine before it signals done.
	err  error
	null bool
	val  []byte
	n    int64
	list [][]byte
	kvs  []KV
	// into is the caller's buffer a scan's reply is decoded into (Client.ScanInto),
	// nil for fresh arrays. Read by the reader goroutine after it marks the request
	// replied; a caller that gives up first clears it under conn.mu (conn.do), so the
	// reader never writes into memory its caller has taken back.
	into  *ScanBuffer
	token string
	raw   resp.Value
}

var requestPool = sync.Pool{New: func() any {
	return &request{done: make(chan struct{}, 1), cmd: make([]arg, 0, 4)}
}}

func getRequest() *request { return requestPool.Get().(*request) }

func putRequest(r *request) {
	if len(r.done) != 0 {
		panic("client: request returned to the pool with an unread completion")
	}
	clear(r.cmd)
	*r = request{cmd: r.cmd[:0], buf: r.buf[:0], done: r.done}
	requestPool.Put(r)
}

// encode writes the command into r.buf, wrapped in KEFIR.CALL when it carries
// options, a session token or a request id (a write's REQID, clientID and seq).
func (r *request) encode(clientID, seq uint64) {
	o := &r.opts
	var token string
	if r.session != nil {
		token = r.session.Token()
	}
	words := len(r.cmd)
	wrapped := !o.consistency.IsZero() || !o.durability.IsZero() || r.session != nil || r.write
	r.redirect = wrapped && r.allowRedirect
	if wrapped {
		words += 2 // KEFIR.CALL ... CMD
		if !o.consistency.IsZero() {
			words += 2
		}
		if !o.durability.IsZero() {
			words += 2
		}
		if r.session != nil {
			words += 2
		}
		if r.write {
			words += 3
		}
		if r.redirect {
			words++
		}
	}
	b := resp.AppendArrayHeader(r.buf[:0], words)
	if wrapped {
		b = resp.AppendBulkString(b, "KEFIR.CALL")
		if r.redirect {
			b = resp.AppendBulkString(b, "REDIRECT")
		}
		if !o.consistency.IsZero() {
			b = resp.AppendBulkString(b, "CONSISTENCY")
			b = resp.AppendBulkString(b, o.consistency.String())
		}
		if !o.durability.IsZero() {
			b = resp.AppendBulkString(b, "DURABILITY")
			b = resp.AppendBulkString(b, o.durability.String())
		}
		if r.session != nil {
			b = resp.AppendBulkString(b, "SESSION")
			b = resp.AppendBulkString(b, token)
		}
		if r.write {
			var num [20]byte
			b = resp.AppendBulkString(b, "REQID")
			b = resp.AppendBulk(b, strconv.AppendUint(num[:0], clientID, 10))
			b = resp.AppendBulk(b, strconv.AppendUint(num[:0], seq, 10))
		}
		b = resp.AppendBulkString(b, "CMD")
	}
	for _, a := range r.cmd {
		if a.b != nil {
			b = resp.AppendBulk(b, a.b)
		} else {
			b = resp.AppendBulkString(b, a.s)
		}
	}
	r.buf = b
}

// complete decodes the reply into the request's result fields. It runs on the
// reader goroutine while v still aliases the reader's buffer, so it copies.
func (r *request) complete(v resp.Value) {
	if r.session != nil && v.Kind != resp.Error {
		if v.Kind != resp.Array || len(v.Elems) != 2 || (v.Elems[0].Kind != resp.Bulk && v.Elems[0].Kind != resp.Simple) {
			r.err = fmt.Errorf("kefir: session call: want [token, reply], got %s", v.Kind)
			return
		}
		r.token = string(v.Elems[0].Str)
		v = v.Elems[1]
	}
	if v.Kind == resp.Error {
		r.err = serverError(v.Str)
		return
	}
	switch r.kind {
	case replyStatus:
	case replyBulk:
		switch v.Kind {
		case resp.Null:
			r.null = true
		case resp.Bulk, resp.Simple, resp.Verbatim:
			r.val = append(make([]byte, 0, len(v.Str)), v.Str...)
		default:
			r.err = fmt.Errorf("kefir: want a bulk string reply, got %s", v.Kind)
		}
	case replyInt:
		if v.Kind != resp.Int {
			r.err = fmt.Errorf("kefir: want an integer reply, got %s", v.Kind)
			return
		}
		r.n = v.Int
	case replyList:
		if v.Kind == resp.Null {
			return
		}
		if v.Kind != resp.Array {
			r.err = fmt.Errorf("kefir: want an array reply, got %s", v.Kind)
			return
		}
		// One allocation for all values, one for the slice headers.
		for _, e := range v.Elems {
			switch e.Kind {
			case resp.Null, resp.Bulk, resp.Simple:
			default:
				r.err = fmt.Errorf("kefir: want bulk strings in the array reply, got %s", e.Kind)
				return
			}
		}
		slab := concatValues(v.Elems, 0, 1)
		r.list = make([][]byte, len(v.Elems))
		off := 0
		for i, e := range v.Elems {
			if e.Kind != resp.Null {
				r.list[i] = slab[off : off+len(e.Str) : off+len(e.Str)]
				off += len(e.Str)
			}
		}
	case replyPairs:
		r.kvs, r.err = decodePairs(v, r.into)
	case replyRaw:
		r.raw = cloneValue(v)
	default:
		panic("client: request without a reply kind")
	}
}

// decodePairs copies a scan's reply (key, value, key, value…) into KVs. Without a
// buffer it makes three allocations whatever the range's length: the KV slice, one
// string holding every key (each Key a substring of it) and one slab holding every
// value. A string per key and a [][]byte in between were most of a YCSB-E client's
// allocations (a 50-key range: 53 allocations, now 3; docs/design/scans.md). With a
// buffer (ScanBuffer, Client.ScanInto) the pairs and the values go into the buffer's
// arrays, grown only when a reply does not fit, so a steady stream of scans allocates
// just the keys' string: the values' slab (~50 KB per YCSB-E scan) was the client's
// garbage, and collecting it a quarter of its CPU. A null value stays nil, an empty one
// non-nil.
func decodePairs(v resp.Value, into *ScanBuffer) ([]KV, error) {
	if v.Kind == resp.Null {
		return nil, nil
	}
	if v.Kind != resp.Array {
		return nil, fmt.Errorf("kefir: want an array reply, got %s", v.Kind)
	}
	if len(v.Elems)%2 != 0 {
		return nil, fmt.Errorf("kefir: KEFIR.SCAN returned an odd number (%d) of elements", len(v.Elems))
	}
	keyBytes, valBytes := 0, 0
	for i, e := range v.Elems {
		switch e.Kind {
		case resp.Null, resp.Bulk, resp.Simple:
		default:
			return nil, fmt.Errorf("kefir: want bulk strings in the array reply, got %s", e.Kind)
		}
		if i%2 == 0 {
			keyBytes += len(e.Str)
		} else {
			valBytes += len(e.Str)
		}
	}
	var keys strings.Builder
	keys.Grow(keyBytes)
	for i := 0; i < len(v.Elems); i += 2 {
		keys.Write(v.Elems[i].Str)
	}
	all := keys.String()
	n := len(v.Elems) / 2
	var kvs []KV
	var slab []byte
	if into == nil {
		slab = concatValues(v.Elems, 1, 2)
		kvs = make([]KV, n)
	} else {
		// Grown before the copy, so no value's slice is left behind in an old array.
		// Never nil: an empty value must stay distinguishable from a null one.
		slab = slices.Grow(into.vals[:0], max(valBytes, 1))
		for i := 1; i < len(v.Elems); i += 2 {
			slab = append(slab, v.Elems[i].Str...)
		}
		kvs = slices.Grow(into.kvs[:0], n)[:n]
		into.vals, into.kvs = slab, kvs
	}
	k, off := 0, 0
	for i := range kvs {
		key, val := v.Elems[2*i], v.Elems[2*i+1]
		kvs[i].Key = all[k : k+len(key.Str)]
		k += len(key.Str)
		kvs[i].Value = nil
		if val.Kind != resp.Null {
			kvs[i].Value = slab[off : off+len(val.Str) : off+len(val.Str)]
			off += len(val.Str)
		}
	}
	return kvs, nil
}

// concatValues copies the strings of elems[first], elems[first+step]… (nulls skipped)
// back to back into one new slab. It goes through bytes.Join because that is the one
// way the standard library allocates a byte slice without zeroing it first: a
// make([]byte, 0, n) cleared every byte of a scan's ~100 KB before the copy overwrote
// it, 6.5 % of a YCSB-E client's CPU (docs/design/scans.md, "The client's and the
// harness's share"). The list handed to Join stays on the stack up to 128 values (a
// sync.Pool would not: the race detector drops its items at random). The result is
// never nil (an empty reply gives an empty slab), so an empty value stays
// distinguishable from a null one.
func concatValues(elems []resp.Value, first, step int) []byte {
	var local [128][]byte
	parts := local[:0]
	for i := first; i < len(elems); i += step {
		if elems[i].Kind != resp.Null {
			parts = append(parts, elems[i].Str)
		}
	}
	return bytes.Join(parts, nil)
}

// conn is one pipelined connection. Any number of goroutines call do concurrently;
// one writer goroutine sends queued requests in batches (one socket write per batch)
// and one reader goroutine matches replies to sent requests in FIFO order.
type conn struct {
	nc   net.Conn
	rd   *resp.Reader
	addr string // the node it talks to

	mu       sync.Mutex
	queue    []*request // not yet taken by the writer, in enqueue (= seq) order
	inflight []*request // sent, awaiting replies, in wire order
	broken   error      // why the connection is dead; nil while healthy

	wake   chan struct{} // cap 1: the queue is non-empty
	closed chan struct{} // closed when broken is set

	// A transaction connection's (txn.go), under mu: txNext is the last
	// KEFIR.TX handle a queued BEGIN took, txOpen the transactions using it.
	txNext uint64
	txOpen int
	// txOneGroup: the node serves one replica group; txThen: it takes
	// KEFIR.TX's chained form; txReadOnly: BEGIN … READONLY (txn.go,
	// probeTx). Set before the connection carries a transaction.
	txOneGroup, txThen, txReadOnly bool
	// riders counts detached requests queued without waking the writer
	// (sendDetached): they go with the next write, or when flush fires.
	riders int
	flush  *time.Timer
}

func newConn(nc net.Conn, rd *resp.Reader) *conn {
	c := &conn{
		nc:     nc,
		rd:     rd,
		wake:   make(chan struct{}, 1),
		closed: make(chan struct{}),
	}
	go c.writeLoop()
	go c.readLoop()
	return c
}

func (c *conn) healthy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken == nil
}

// do sends req and waits for its reply or ctx. It returns the reply's error,
// errNotSent (never reached the socket: safe to retry anywhere), errConnLost (sent,
// then the connection died) or errAbandoned (ctx ended after the request was
// queued). owned reports whether req is back in the caller's sole hands; when it is
// not, the writer or reader goroutine may still touch it and it must not be reused.
func (c *conn) do(ctx context.Context, req *request) (owned bool, err error) {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return true, fmt.Errorf("%w: %w", errNotSent, c.broken)
	}
	if len(req.buf) == 0 {
		if req.write && req.fixedID == 0 {
			panic("client: a write without a request id")
		}
		req.encode(req.fixedID, req.fixedSeq)
	}
	req.state = stateQueued
	c.queue = append(c.queue, req)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // the writer is already due to run
	}

	select {
	case <-req.done:
		return true, req.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	st := req.state
	if st == stateQueued {
		req.state = stateCancelled
	}
	if st != stateReplied {
		// The reply, if one comes, is decoded into fresh arrays, not into the buffer
		// the caller is about to reuse.
		req.into = nil
	}
	c.mu.Unlock()
	if st == stateReplied {
		// The outcome is already known and being delivered: the reader (or fail) is
		// about to signal done, without blocking. Prefer the answer to a timeout.
		<-req.done
		return true, req.err
	}
	return false, errAbandoned{cause: ctx.Err(), sent: st != stateQueued}
}

// errAbandoned: the caller's context ended while the request was queued (sent is
// false: the writer will skip it) or after it was sent.
type errAbandoned struct {
	cause error
	sent  bool
}

func (e errAbandoned) Error() string {
	return fmt.Sprintf("kefir: request abandoned (sent=%v): %v", e.sent, e.cause)
}
func (e errAbandoned) Unwrap() error { return e.cause }

func (c *conn) writeLoop() {
	var batch []*request
	var wbuf []byte
	for {
		select {
		case <-c.wake:
		case <-c.closed:
			return
		}
		c.mu.Lock()
		if len(c.inflight) > 0 {
			// Replies are outstanding, so callers are active: let the ones that are
			// runnable enqueue too, and send them all in one write.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		if c.broken != nil {
			c.mu.Unlock()
			return
		}
		batch, c.queue = c.queue, batch[:0]
		c.riders = 0 // sent now (sendDetached)
		wbuf = wbuf[:0]
		for _, r := range batch {
			if r.state == stateCancelled {
				continue
			}
			if r.state != stateQueued {
				panic(fmt.Sprintf("client: writer found a request in state %d", r.state))
			}
			r.state = stateSent
			r.sent = true
			c.inflight = append(c.inflight, r)
			wbuf = append(wbuf, r.buf...)
		}
		c.mu.Unlock()
		clear(batch)
		if len(wbuf) > 0 {
			if _, err := c.nc.Write(wbuf); err != nil {
				c.fail(fmt.Errorf("write: %w", err))
				return
			}
		}
		if cap(wbuf) > 1<<20 {
			wbuf = nil // don't pin a buffer grown for one huge batch
		}
	}
}

func (c *conn) readLoop() {
	for {
		v, err := c.rd.ReadValue()
		if err != nil {
			c.fail(fmt.Errorf("read: %w", err))
			return
		}
		if v.Kind == resp.Push {
			continue // out-of-band (RESP3 push); not a reply to any request
		}
		c.mu.Lock()
		if len(c.inflight) == 0 {
			c.mu.Unlock()
			c.fail(errors.New("reply without a request"))
			return
		}
		req := c.inflight[0]
		c.inflight[0] = nil
		c.inflight = c.inflight[1:]
		req.state = stateReplied
		c.mu.Unlock()
		if req.detached {
			putRequest(req) // nobody waits for it (sendDetached)
			continue
		}
		req.complete(v)
		req.done <- struct{}{}
	}
}

// fail marks the connection dead and completes every queued request with
// errNotSent and every sent one with errConnLost.
func (c *conn) fail(cause error) {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return
	}
	c.broken = cause
	if c.flush != nil {
		c.flush.Stop()
	}
	queued, inflight := c.queue, c.inflight
	c.queue, c.inflight = nil, nil
	var wake []*request
	for _, r := range queued {
		if r.state == stateCancelled || r.detached {
			continue // its caller is gone, or there never was one
		}
		r.state = stateReplied
		r.err = fmt.Errorf("%w: %w", errNotSent, cause)
		wake = append(wake, r)
	}
	for _, r := range inflight {
		if r.detached {
			continue
		}
		r.state = stateReplied
		r.err = fmt.Errorf("%w: %w", errConnLost, cause)
		wake = append(wake, r)
	}
	c.mu.Unlock()
	close(c.closed)
	_ = c.nc.Close()
	for _, r := range wake {
		r.done <- struct{}{}
	}
}

func (c *conn) close() { c.fail(net.ErrClosed) }

// riderDelay bounds how long a detached request waits for a write to ride
// in (sendDetached). A variable for tests.
var riderDelay = 2 * time.Millisecond

// sendDetached queues r, a request whose reply nobody waits for (the reader
// drops it), to be sent in the connection's next write instead of a write of
// its own: with whatever any caller queues next, or, if nothing comes, when
// a timer fires riderDelay later. A read-only transaction's ABORT is one
// (Tx.end): on a shared transaction connection the next command of another
// transaction follows within microseconds, and sent on its own the ABORT
// cost a write and a read on each side — a quarter more syscalls per
// transaction than its reads (docs/design/transactions.md, "Go client").
// Requests keep their queue order, so anything queued after r reaches the
// server after it. r is the connection's until its reply is read; if the
// connection is broken, r is dropped (the server ends a closed connection's
// transactions itself).
func (c *conn) sendDetached(r *request) {
	r.encode(0, 0)
	r.detached = true
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		putRequest(r)
		return
	}
	r.state = stateQueued
	c.queue = append(c.queue, r)
	c.riders++
	if c.riders > 1 {
		return // the timer is running for an older rider, still queued
	}
	if c.flush == nil {
		c.flush = time.AfterFunc(riderDelay, c.flushRiders)
	} else {
		c.flush.Reset(riderDelay)
	}
}

// flushRiders wakes the writer for detached requests that found no write to
// ride in (sendDetached).
func (c *conn) flushRiders() {
	c.mu.Lock()
	due := c.riders > 0 && c.broken == nil
	c.mu.Unlock()
	if due {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// closeWhenIdle closes the connection once no request is queued or in flight
// (or after a grace period): the client moved this slot to the leader, and the
// calls still on the old node finish there.
func (c *conn) closeWhenIdle() {
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			c.mu.Lock()
			idle := len(c.queue) == 0 && len(c.inflight) == 0
			c.mu.Unlock()
			if idle {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		c.close()
	}()
}
