package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Interactive transactions (KEFIR.TX; docs/design/transactions.md,
// "Interactive transactions").
//
// A transaction runs on a connection of its own (KEFIR.TX handles belong to
// the connection that began them; the pool's connections are shared by
// concurrent calls): BEGIN, the snapshot reads and the buffered writes go
// there. Its commit is a write like any other: KEFIR.TX PREPARE answers the
// commit op, which the client sends as KEFIR.TXAPPLY through its write path,
// with a request id that every retry keeps — so a commit retried across a
// leader change is applied once, and its reply (the committed version or
// -TXABORT) is the first application's.

// Isolation is a transaction's isolation level.
type Isolation int

const (
	// Serializable (the default): a commit aborts if a key the transaction
	// read or wrote changed since its start. With the start taken at a
	// linearizable point, committed transactions are strictly serializable.
	Serializable Isolation = iota
	// SnapshotIsolation: a commit aborts only if a key it wrote changed since
	// its start (first committer wins); write skew is allowed.
	SnapshotIsolation
)

// TxOptions configure Txn. The zero value is Serializable with the defaults.
type TxOptions struct {
	Isolation Isolation
	// MaxAttempts bounds how many times Txn runs fn (default 10).
	MaxAttempts int
	// Backoff is the wait before the second attempt (default 1ms), doubled
	// for each later one up to 100ms, with jitter.
	Backoff time.Duration
}

// ErrTxAborted: the transaction aborted (a conflict with a transaction that
// committed after its start, or its snapshot grew too old). Txn retries it;
// it returns it once MaxAttempts are spent.
var ErrTxAborted = errors.New("kefir: transaction aborted")

// Tx is an open transaction, valid inside the function given to Txn.
type Tx struct {
	c  *Client
	cn *conn
	h  string
}

// Txn runs fn in a transaction and commits it, retrying the whole of fn on
// an abort (bounded by MaxAttempts, with backoff). fn's reads see the state
// at the transaction's start and its own writes; its writes are buffered
// until the commit. fn must not keep tx, and should have no effects besides
// tx's: it may run several times. An error fn returns aborts the
// transaction and is returned as is (unless it wraps ErrTxAborted: then fn
// is retried). A commit whose outcome is unknown returns ErrUnknownOutcome.
func (c *Client) Txn(ctx context.Context, fn func(tx *Tx) error, opts *TxOptions) error {
	var o TxOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 10
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Millisecond
	}
	backoff := o.Backoff
	var last error
	for attempt := 0; attempt < o.MaxAttempts; attempt++ {
		if attempt > 0 {
			// Jittered, so two transactions that conflicted do not meet again.
			d := backoff/2 + time.Duration(uint64(time.Now().UnixNano())%uint64(backoff))
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctxError(ctx.Err(), false)
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		}
		err := c.txnOnce(ctx, fn, o.Isolation)
		if err == nil || !errors.Is(err, ErrTxAborted) {
			return err
		}
		last = err
	}
	return fmt.Errorf("%w (after %d attempts)", last, o.MaxAttempts)
}

// txnOnce runs one attempt: an error wrapping ErrTxAborted may be retried.
func (c *Client) txnOnce(ctx context.Context, fn func(tx *Tx) error, iso Isolation) error {
	cn, h, err := c.txBegin(ctx, iso)
	if err != nil {
		return err
	}
	tx := &Tx{c: c, cn: cn, h: h}
	if err := fn(tx); err != nil {
		tx.end(ctx, "ABORT")
		return err
	}
	pr, null, err := tx.call(ctx, replyBulk, "PREPARE")
	if err != nil {
		tx.drop()
		return err
	}
	op := append([]byte(nil), pr.val...)
	putRequest(pr)
	c.txs.put(cn) // the handle is gone: the connection is free
	if null {
		return nil // it wrote nothing: committed where it read
	}
	r := newCall(replyInt, true, nil, nil)
	r.cmd = append(r.cmd, arg{s: "KEFIR.TXAPPLY"}, arg{b: op})
	if _, err := c.integer(ctx, r); err != nil {
		return txError(err)
	}
	return nil
}

// txBegin opens a transaction on a connection of the pool of transaction
// connections, following -MOVED to the leader (a follower cannot prove the
// read point BEGIN takes).
func (c *Client) txBegin(ctx context.Context, iso Isolation) (*conn, string, error) {
	level := "SERIALIZABLE"
	if iso == SnapshotIsolation {
		level = "SI"
	}
	var last error
	for moves := 0; moves < 2*maxMoves+len(c.addrs); moves++ {
		cn, err := c.txs.get(ctx, c)
		if err != nil {
			return nil, "", err
		}
		tx := &Tx{c: c, cn: cn}
		v, _, err := tx.raw(ctx, replyInt, "KEFIR.TX", "BEGIN", level)
		if err == nil {
			h := strconv.FormatInt(v.n, 10)
			putRequest(v)
			return cn, h, nil
		}
		last = err
		var se *Error
		switch {
		case errors.As(err, &se) && se.Prefix == "MOVED":
			addr := lastWord(se.Msg)
			c.leader.Store(&addr)
			c.txs.put(cn)
		case errors.As(err, &se) && se.Prefix == "UNAVAILABLE", errors.Is(err, errConnLost), errors.Is(err, errNotSent):
			cn.close()
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return nil, "", ctxError(ctx.Err(), false)
			}
		default:
			c.txs.put(cn)
			return nil, "", txError(err)
		}
	}
	return nil, "", fmt.Errorf("%w: no leader to begin a transaction at: %w", ErrUnavailable, last)
}

func lastWord(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ' ' {
			return s[i+1:]
		}
	}
	return s
}

// txError maps a transaction command's error: -TXABORT and a connection
// lost before the commit are aborts (fn may be retried).
func txError(err error) error {
	var se *Error
	switch {
	case errors.As(err, &se) && se.Prefix == "TXABORT":
		return fmt.Errorf("%w: %s", ErrTxAborted, se.Msg)
	case errors.Is(err, errConnLost), errors.Is(err, errNotSent):
		return fmt.Errorf("%w: connection lost: %w", ErrTxAborted, err)
	}
	return err
}

// raw sends one command on the transaction's connection.
func (t *Tx) raw(ctx context.Context, kind replyKind, words ...string) (*request, bool, error) {
	r := newCall(kind, false, nil, nil)
	r.allowRedirect = false
	for _, w := range words {
		r.cmd = append(r.cmd, arg{s: w})
	}
	return t.send(ctx, r)
}

func (t *Tx) send(ctx context.Context, r *request) (*request, bool, error) {
	owned, err := t.cn.do(ctx, r)
	if !owned {
		t.cn.close() // a reply may still come: the connection is not reused
		return nil, false, ctxError(ctx.Err(), false)
	}
	if err != nil {
		putRequest(r)
		return nil, false, err
	}
	return r, r.null, nil
}

// call sends KEFIR.TX <sub> <handle> args... and returns the request (the
// caller reads it, then putRequest).
func (t *Tx) call(ctx context.Context, kind replyKind, sub string, args ...any) (*request, bool, error) {
	r := newCall(kind, false, nil, nil)
	r.allowRedirect = false
	r.cmd = append(r.cmd, arg{s: "KEFIR.TX"}, arg{s: sub}, arg{s: t.h})
	for _, a := range args {
		switch v := a.(type) {
		case string:
			r.cmd = append(r.cmd, arg{s: v})
		case []byte:
			r.cmd = append(r.cmd, arg{b: nonNil(v)})
		}
	}
	req, null, err := t.send(ctx, r)
	if err != nil {
		return nil, false, txError(err)
	}
	return req, null, nil
}

// end sends ABORT and frees the connection.
func (t *Tx) end(ctx context.Context, sub string) {
	if r, _, err := t.call(ctx, replyStatus, sub); err == nil {
		putRequest(r)
		t.c.txs.put(t.cn)
		return
	}
	t.drop()
}

// drop closes the connection (its state is unknown).
func (t *Tx) drop() { t.cn.close() }

// Get reads key at the transaction's snapshot (or its own write):
// ErrNotFound if absent.
func (t *Tx) Get(ctx context.Context, key string) ([]byte, error) {
	r, null, err := t.call(ctx, replyBulk, "GET", key)
	if err != nil {
		return nil, err
	}
	val := r.val
	putRequest(r)
	if null {
		return nil, ErrNotFound
	}
	return val, nil
}

// MGet reads keys at the snapshot: nil for an absent key.
func (t *Tx) MGet(ctx context.Context, keys ...string) ([][]byte, error) {
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	r, _, err := t.call(ctx, replyList, "MGET", args...)
	if err != nil {
		return nil, err
	}
	list := r.list
	putRequest(r)
	return list, nil
}

// Set buffers a write of key.
func (t *Tx) Set(ctx context.Context, key string, value []byte) error {
	r, _, err := t.call(ctx, replyStatus, "SET", key, value)
	if err != nil {
		return err
	}
	putRequest(r)
	return nil
}

// Del buffers a deletion of key and reports whether it existed (in the
// transaction's view).
func (t *Tx) Del(ctx context.Context, key string) (bool, error) {
	r, _, err := t.call(ctx, replyInt, "DEL", key)
	if err != nil {
		return false, err
	}
	n := r.n
	putRequest(r)
	return n > 0, nil
}

// Incr buffers INCRBY key delta and returns the value in the transaction's
// view (the committed value, if it commits).
func (t *Tx) Incr(ctx context.Context, key string, delta int64) (int64, error) {
	r, _, err := t.call(ctx, replyInt, "INCRBY", key, strconv.FormatInt(delta, 10))
	if err != nil {
		return 0, err
	}
	n := r.n
	putRequest(r)
	return n, nil
}

// txConns are the connections transactions run on, dialed to the leader as
// the client knows it, kept for the next transaction when one ends cleanly.
type txConns struct {
	mu     sync.Mutex
	free   []*conn
	closed bool
}

const txConnsKept = 16

func (p *txConns) get(ctx context.Context, c *Client) (*conn, error) {
	hint := c.leader.Load()
	p.mu.Lock()
	for len(p.free) > 0 {
		cn := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		if cn.healthy() && (hint == nil || cn.addr == *hint) {
			p.mu.Unlock()
			return cn, nil
		}
		cn.close()
	}
	closed := p.closed
	p.mu.Unlock()
	if closed || c.closed.Load() {
		return nil, ErrClosed
	}
	addrs := c.addrs
	if hint != nil {
		addrs = append([]string{*hint}, addrs...)
	}
	var errs []error
	for _, a := range addrs {
		cn, err := c.dial(ctx, a)
		if err == nil {
			return cn, nil
		}
		if errors.Is(err, ErrAuth) {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
}

func (p *txConns) put(cn *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.free) >= txConnsKept || !cn.healthy() {
		cn.close()
		return
	}
	p.free = append(p.free, cn)
}

func (p *txConns) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, cn := range p.free {
		cn.close()
	}
	p.free = nil
}
