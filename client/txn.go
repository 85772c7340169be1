package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Interactive transactions (KEFIR.TX; docs/design/transactions.md,
// "Interactive transactions").
//
// A transaction's commands go to one connection (KEFIR.TX handles belong to
// the connection that began them), one of a few transaction connections that
// concurrent transactions share, as the pool's connections are shared by
// concurrent calls (txConns): their commands travel together in the writes
// and replies of the connection. BEGIN, the snapshot reads and the buffered
// writes go there. Its commit is a write like any other: KEFIR.TX PREPARE answers the
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
	// ReadOnly begins the transaction READONLY: its writes (Set, Del, Incr,
	// SetRange, SetBit) return ErrTxReadOnly without reaching the server,
	// and its reads never wait for a commit in flight. On a node of one
	// replica group it never waits and never aborts (its reads are of one
	// snapshot, and it ends without a commit) but at the lifetime and
	// retention limits and a rare race: a key first read by a later call
	// whose version at the start was dropped before the start was pinned; on a node of several groups a
	// read of a key a prepared cross-group transaction writes waits for it,
	// and some reads may still abort: one across groups is validated at its
	// end (docs/design/transactions.md, "Read-only transactions"). Against a
	// server whose KEFIR.TX FEATURES does not name READONLY it begins as any
	// transaction (its first read may wait); its writes are still refused.
	ReadOnly bool
}

// ErrTxReadOnly: a write in a transaction begun with TxOptions.ReadOnly.
// Txn returns it as fn returns it; it is not retried.
var ErrTxReadOnly = errors.New("kefir: write in a read-only transaction (TxOptions.ReadOnly)")

// ErrTxAborted: the transaction aborted (a conflict with a transaction that
// committed after its start, or its snapshot grew too old). Txn retries it;
// it returns it once MaxAttempts are spent.
var ErrTxAborted = errors.New("kefir: transaction aborted")

// Tx is an open transaction, valid inside the function given to Txn.
//
// BEGIN is sent with the transaction's first command, in one write, so a
// transaction pays no round trip for BEGIN; where the server takes KEFIR.TX's
// chained form (probeTx), it is not even a command of its own: the first
// command is KEFIR.TX BEGIN <level> THEN <command>, naming the handle the
// client chose (the connection's next, conn.txNext; handles only grow).
// Against an older server BEGIN is a command before the first: the handle
// it will answer is known (a connection's handles count up from 1 in the
// order its BEGINs arrive, which is the order the client queues them: the
// handle is taken when BEGIN is queued).
//
// Set is buffered in the client as well: its reply (OK, or an error) says
// nothing the caller needs, so it is not waited for. It is sent with the
// transaction's next awaited command — Get, MGet, Del, Incr, or the commit's
// PREPARE — in the same write, and its reply is read and checked then. A
// read, three Sets and the commit thus cost three round trips (BEGIN+read;
// the Sets+PREPARE; the commit), as WATCH/MULTI/EXEC does. The price: a
// Set's error (say, a full write set) is not returned by Set but by the next
// awaited call, or by Txn at the commit; either way the transaction aborts
// (nothing it wrote lands), every later call of the transaction returns that
// error, and Txn returns it as is (retried only if it wraps ErrTxAborted).
//
// A transaction that wrote nothing ends with an ABORT the client does not
// wait for, sent with the connection's next write (or within 2 ms) — with
// the chained form, inside the connection's next command (foldAborts): a
// read-only transaction of n Gets takes n round trips and, on a server with
// the chained form, n commands, as n Gets do. On a
// node of one replica group that holds for keys of several slots too; on a
// node of several groups such a transaction spans groups and its commit
// (PREPARE) validates its reads.
type Tx struct {
	c *Client
	// cn is the connection the transaction runs on, taken from txs at its
	// first command (acquire): nil before.
	cn    *conn
	txs   *txConns
	moved *txMoved
	level string
	// readOnly: begun with TxOptions.ReadOnly (BEGIN … READONLY where the
	// server takes it, conn.txReadOnly).
	readOnly bool
	h        string // this transaction's handle (its BEGIN's answer), once BEGIN is queued
	begun    bool
	wrote    bool
	// slot is the hash slot of the first key the transaction named (-1:
	// none yet); slots that it named another. On a node of several groups
	// (crossSlots) that makes a transaction across slots, which the server
	// commits in two phases (and validates even if it only read), so it is
	// committed even without writes.
	slot  int
	slots bool
	// pending are buffered writes not yet sent: they go in front of the next
	// awaited command, and their replies are checked with its.
	pending []*request
	// failed is a buffered write's error (or BEGIN's): the transaction is
	// dead, every later call returns it, and Txn returns it without a commit.
	failed error
	// reqs is call's list of the requests of one write, kept across calls.
	reqs []*request
}

// Txn runs fn in a transaction and commits it, retrying the whole of fn on
// an abort (bounded by MaxAttempts, with backoff). fn's reads see the state
// at the transaction's start and its own writes; its writes are buffered
// until the commit. fn must not keep tx, and should have no effects besides
// tx's: it may run several times. An error fn returns aborts the
// transaction and is returned as is (unless it wraps ErrTxAborted: then fn
// is retried). A panic in fn ends the transaction and goes on up. A commit
// whose outcome is unknown returns ErrUnknownOutcome.
//
// A transaction's failure (its own error reply, fn's error, fn's panic)
// does not disturb the transactions sharing its connection: only a reply
// left unread (a context that ended while a call waited) or a connection
// whose handle count went off (a refused BEGIN with BEGINs queued after it)
// closes the connection, and aborts those.
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
	var moved txMoved // a -MOVED of an attempt's first key, for the next
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
		err := c.txnOnce(ctx, fn, o.Isolation, o.ReadOnly, &moved)
		if err == nil || !errors.Is(err, ErrTxAborted) {
			return err
		}
		last = err
	}
	return fmt.Errorf("%w (after %d attempts)", last, o.MaxAttempts)
}

// txMoved is where a -MOVED sent an attempt whose first key was of slot
// (addr empty: nowhere): in a cluster the next attempt whose first key is
// of that slot begins at addr, as a keyed call follows its -MOVED, while
// the slot map, asked for anew, catches up.
type txMoved struct {
	slot int
	addr string
}

// txnOnce runs one attempt: an error wrapping ErrTxAborted may be retried.
// The attempt takes its connection at its first command (Tx.acquire), when
// its first key, which says where it must begin in a cluster, is known.
func (c *Client) txnOnce(ctx context.Context, fn func(tx *Tx) error, iso Isolation, readOnly bool, moved *txMoved) error {
	tx := &Tx{c: c, level: "SERIALIZABLE", readOnly: readOnly, slot: -1, moved: moved}
	if iso == SnapshotIsolation {
		tx.level = "SI"
	}
	// A panic in fn ends the transaction (and its share of cn, which
	// other transactions may be using) before it goes on up: the stream
	// is in step (fn panicked between calls), so cn stays open. Not a
	// recover: the panic keeps its stack.
	returned := false
	defer func() {
		if !returned {
			tx.end()
		}
	}()
	err := fn(tx)
	returned = true
	if err == nil {
		// A buffered write failed and fn did not return its error: the
		// transaction aborts all the same.
		err = tx.failed
	}
	switch {
	case !tx.begun && (err != nil || !tx.wrote):
		// Nothing was sent (fn named no key, or only buffered writes), or
		// BEGIN failed: there is no handle to end.
		tx.end()
		return err
	case err != nil:
		tx.end()
		return err
	case !tx.wrote && !tx.crossSlots():
		// Read-only: its reads were of one committed state, at least as
		// new as its start; there is nothing to validate or order. (Across
		// slots its reads are of several groups' states, validated by the
		// commit.)
		tx.end()
		return nil
	}
	// PREPARE carries the buffered writes (and BEGIN, if nothing was sent
	// yet) in one write; a failed write fails it, and nothing is applied.
	pr, null, err := tx.call(ctx, replyBulk, "PREPARE")
	if err != nil && tx.crossSlots() && !errors.Is(err, errNotSent) && !isTxAbortReply(err) &&
		(errors.Is(err, errConnLost) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		// Across slots PREPARE is the commit itself (the server runs its
		// two phases): a connection lost after it was sent leaves the
		// outcome unknown, not an abort to retry — retried, a transfer
		// that had committed ran twice (the e2e bank test's checker
		// reported the lost update).
		tx.end()
		return fmt.Errorf("%w: the connection was lost during a cross-group commit: %v", ErrUnknownOutcome, err)
	}
	if err != nil {
		// An error reply leaves cn in step, and other transactions may be
		// using it: it is not closed (only a reply left unread closes it,
		// in call). A buffered write's error leaves the handle open, a
		// -TXABORT from PREPARE ended it: ABORT ends it either way (an
		// ended handle answers "no such transaction", which is dropped).
		tx.end()
		return err
	}
	op := append([]byte(nil), pr.val...)
	putRequest(pr)
	tx.txs.put(tx.cn) // the handle is gone
	if null {
		return nil
	}
	r := newCall(replyInt, true, nil, nil)
	r.cmd = append(r.cmd, arg{s: "KEFIR.TXAPPLY"}, arg{b: op})
	// In a cluster the commit goes to the leader of the transaction's
	// group, as a write of its first key would (before, through the pool of
	// the addresses given to Dial, whose node forwarded it to another
	// group's leader).
	r.slot = tx.slot + 1
	if _, err := c.integer(ctx, r); err != nil {
		// Only -TXABORT says it did not commit: a lost connection here is
		// an unknown outcome (ErrUnknownOutcome, from the write path), never
		// an abort to retry.
		var se *Error
		if errors.As(err, &se) && se.Prefix == "TXABORT" {
			return fmt.Errorf("%w: %s", ErrTxAborted, se.Msg)
		}
		return err
	}
	return nil
}

// isTxAbortReply reports whether err is the server's -TXABORT.
func isTxAbortReply(err error) bool {
	var se *Error
	return errors.As(err, &se) && se.Prefix == "TXABORT"
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

// pipeline sends reqs on cn in one write and waits for every reply. If ctx
// ends first, the connection is closed (a reply may still come, and no
// later command may read it as its own; the other transactions on it abort).
// queued, if set, runs under cn.mu before reqs are encoded and queued: where
// a BEGIN takes its handle.
func pipeline(ctx context.Context, cn *conn, queued func(), reqs ...*request) error {
	cn.mu.Lock()
	if cn.broken != nil {
		err := cn.broken
		cn.mu.Unlock()
		return fmt.Errorf("%w: %w", errNotSent, err)
	}
	if queued != nil {
		queued()
	}
	if cn.txThen && len(reqs) > 0 {
		foldAborts(cn, reqs[0])
	}
	for _, r := range reqs {
		r.encode(0, 0)
		r.state = stateQueued
		cn.queue = append(cn.queue, r)
	}
	cn.mu.Unlock()
	select {
	case cn.wake <- struct{}{}:
	default: // the writer is already due to run
	}
	for i, r := range reqs {
		select {
		case <-r.done:
		case <-ctx.Done():
			cn.close() // completes every request still queued or in flight
			for _, q := range reqs[i:] {
				<-q.done
			}
			return ctxError(ctx.Err(), false)
		}
	}
	return nil
}

// foldAborts moves the ABORTs queued on cn and not yet sent (Tx.end's
// riders) into r, the next KEFIR.TX command queued, as KEFIR.TX ABORT
// h… THEN <r's command>: the server ends them first, in one command with
// r's (docs/commands.md). r is queued where they would have been sent, in
// the connection's next write: every command queued after a rider folds it,
// so no BEGIN is ever queued between a rider and the command that carries
// it, and the server's count of open transactions at a BEGIN is what it was.
// cn.mu is held; cn.txThen (the server takes the form).
func foldAborts(cn *conn, r *request) {
	if cn.riders == 0 {
		return
	}
	var local [8]arg
	hs := local[:0]
	keep := cn.queue[:0]
	for _, q := range cn.queue {
		if q.detached && q.state == stateQueued && len(q.cmd) >= 3 && q.cmd[1].s == "ABORT" {
			hs = append(hs, q.cmd[2:]...)
			cn.riders--
			putRequest(q)
			continue
		}
		keep = append(keep, q)
	}
	clear(cn.queue[len(keep):])
	cn.queue = keep
	if len(hs) == 0 {
		return
	}
	// In place: a pooled request's words keep their capacity.
	r.cmd = slices.Insert(r.cmd, 1, arg{s: "ABORT"})
	r.cmd = slices.Insert(r.cmd, 2, hs...)
	r.cmd = slices.Insert(r.cmd, 2+len(hs), arg{s: "THEN"})
}

// request builds KEFIR.TX <sub> <handle> args....
func (t *Tx) request(kind replyKind, sub string, args ...any) *request {
	r := newCall(kind, false, nil, nil)
	r.allowRedirect = false
	r.cmd = append(r.cmd, arg{s: "KEFIR.TX"}, arg{s: sub}, arg{s: t.h})
	for i, a := range args {
		if k, ok := a.(string); ok && (i == 0 || sub == "MGET" || sub == "EXISTS" || sub == "DEL") {
			t.noteSlot(k)
		}
		switch v := a.(type) {
		case string:
			r.cmd = append(r.cmd, arg{s: v})
		case []byte:
			r.cmd = append(r.cmd, arg{b: nonNil(v)})
		}
	}
	return r
}

// beginWords appends BEGIN's words after KEFIR.TX to w: BEGIN, the
// isolation level, and READONLY for a TxOptions.ReadOnly transaction where
// the connection's server takes it (probeTx).
func (t *Tx) beginWords(w []arg) []arg {
	w = append(w, arg{s: "BEGIN"}, arg{s: t.level})
	if t.readOnly && t.cn.txReadOnly {
		w = append(w, arg{s: "READONLY"})
	}
	return w
}

// noteSlot notes that the transaction named key. Keys of several slots
// make a transaction across groups only on a node of several groups; on a
// node of one (txOneGroup) they are one snapshot's, and a read-only
// transaction of them ends without a PREPARE: it was sent, and waited for,
// before, a round trip more than the same reads (almost every read-only
// transaction of 4 random keys names several slots).
func (t *Tx) noteSlot(key string) {
	s := int(keySlot(key))
	if t.slot < 0 {
		t.slot = s
	} else if s != t.slot {
		t.slots = true
	}
}

// crossSlots reports whether the transaction is one across slots that the
// server commits in two phases: keys of several slots, on a node of several
// groups (known once it has a connection).
func (t *Tx) crossSlots() bool {
	return t.slots && t.cn != nil && !t.cn.txOneGroup
}

// acquire takes the transaction's connection, at its first command. In a
// cluster it is one of the transaction connections of the node that leads
// the first key's group by the slot map (or that the last attempt's -MOVED
// named), so the transaction begins where its start must be taken and its
// commands are not forwarded; a node that cannot be reached sends this
// attempt through the addresses given to Dial, as a keyed call's does, and
// asks for a new map. Otherwise (one group, or no key yet) the client's own
// pool's, which follows the group's leader.
func (t *Tx) acquire(ctx context.Context) error {
	c := t.c
	p := &c.pool
	if c.rt != nil && t.slot >= 0 {
		if t.moved.addr != "" && t.moved.slot == t.slot {
			p = c.rt.node(t.moved.addr)
		} else {
			p = c.rt.route(t.slot)
		}
	}
	cn, err := p.txs.get(ctx, p)
	if err != nil && p != &c.pool && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrClosed) && ctx.Err() == nil {
		c.rt.refreshSoon("")
		t.moved.addr = ""
		p = &c.pool
		cn, err = p.txs.get(ctx, p)
	}
	if err != nil {
		return err
	}
	t.cn, t.txs = cn, &p.txs
	return nil
}

// call sends KEFIR.TX <sub> <handle> args... — after BEGIN, if the
// transaction has not begun, and the buffered writes, in the same write —
// and returns the request for the caller to read and then putRequest. A
// buffered write's error fails the call (and the transaction: t.failed).
func (t *Tx) call(ctx context.Context, kind replyKind, sub string, args ...any) (*request, bool, error) {
	if t.failed != nil {
		return nil, false, t.failed
	}
	firstKey := t.slot < 0 // on a node of several groups the first key takes the start
	if t.cn == nil {
		if len(args) > 0 {
			if k, ok := args[0].(string); ok {
				t.noteSlot(k) // where the transaction begins (request notes it again: no change)
			}
		}
		if err := t.acquire(ctx); err != nil {
			if len(t.pending) > 0 {
				t.failed = err
			}
			return nil, false, err
		}
	}
	reqs := t.reqs[:0] // kept across calls: no slice made per call
	var begin *request
	fold := !t.begun && t.cn.txThen // BEGIN travels in reqs[0] (KEFIR.TX BEGIN … THEN)
	if !t.begun && !fold {
		begin = newCall(replyInt, false, nil, nil)
		begin.allowRedirect = false
		var w [4]arg
		begin.cmd = append(append(begin.cmd, arg{s: "KEFIR.TX"}), t.beginWords(w[:0])...)
		reqs = append(reqs, begin)
	}
	writes := t.pending
	t.pending = nil
	reqs = append(reqs, writes...)
	r := t.request(kind, sub, args...)
	reqs = append(reqs, r)
	t.reqs = reqs
	var queued func()
	if fold {
		// The transaction takes the connection's next handle, named by
		// its commands; its first carries the BEGIN. Handles are the
		// client's here and only grow (the server refuses one used
		// before), so a refused BEGIN leaves no count to put right.
		queued = func() {
			t.cn.txNext++
			t.h = strconv.FormatUint(t.cn.txNext, 10)
			for _, q := range reqs {
				q.cmd[2] = arg{s: t.h}
			}
			var w [4]arg
			reqs[0].cmd = slices.Insert(reqs[0].cmd, 1, append(t.beginWords(w[:0]), arg{s: "THEN"})...)
		}
	} else if begin != nil {
		// The handle BEGIN will answer: the connection's next, taken in
		// the order BEGINs are queued (the order the server sees them),
		// and named by the commands queued with it.
		queued = func() {
			t.cn.txNext++
			t.h = strconv.FormatUint(t.cn.txNext, 10)
			for _, q := range reqs[1:] {
				q.cmd[2] = arg{s: t.h}
			}
		}
	}
	if err := pipeline(ctx, t.cn, queued, reqs...); err != nil {
		if t.c.rt != nil && errors.Is(err, errNotSent) {
			t.c.rt.refreshSoon("") // its node may be gone: a new map may route elsewhere
		}
		err = txError(err)
		if len(writes) > 0 {
			t.failed = err // the writes' fate is unknown
		}
		return nil, false, err
	}
	if fold {
		// Begun, or refused (then the handle names no transaction): an
		// ABORT of it is right either way.
		t.begun = true
		if len(writes) > 0 && writes[0].err != nil {
			// The BEGIN travelled with the first buffered write: a refusal
			// (-MOVED at a follower) is retried where it says.
			err := writes[0].err
			putAll(writes)
			putRequest(r)
			t.failed = t.beginFailed(err)
			return nil, false, t.failed
		}
	}
	if begin != nil {
		err, n := begin.err, begin.n
		putRequest(begin)
		if err != nil {
			putAll(writes) // they named a handle that does not exist
			putRequest(r)
			// A refused BEGIN took no handle. If no BEGIN was queued
			// after it, the connection's count is taken back and the
			// connection stays in step (others' transactions may be
			// open on it). Otherwise those BEGINs counted on its handle:
			// their handles are off (they abort at their answer's check
			// below), and the connection is closed.
			cn := t.cn
			cn.mu.Lock()
			last := strconv.FormatUint(cn.txNext, 10) == t.h
			if last {
				cn.txNext--
			}
			cn.mu.Unlock()
			if !last {
				cn.close()
			}
			t.failed = t.beginFailed(err)
			return nil, false, t.failed
		}
		t.begun = true
		if strconv.FormatInt(n, 10) != t.h {
			// Not the handle the command named: the connection's count is
			// not what the client thought, and its state is unknown.
			putAll(writes)
			putRequest(r)
			t.cn.close()
			t.failed = fmt.Errorf("%w: BEGIN answered handle %d, not %s", ErrTxAborted, n, t.h)
			return nil, false, t.failed
		}
	}
	for _, w := range writes {
		if w.err != nil && t.failed == nil {
			// The buffered write's own reply: the caller learns which.
			t.failed = fmt.Errorf("kefir: transaction's buffered %s %s: %w", w.cmd[1].s, w.cmd[3].s, txError(w.err))
		}
	}
	putAll(writes)
	if t.failed != nil {
		putRequest(r)
		return nil, false, t.failed
	}
	if r.err != nil {
		err := r.err
		putRequest(r)
		var se *Error
		if (fold || firstKey && t.slot >= 0) && errors.As(err, &se) && (se.Prefix == "MOVED" || se.Prefix == "UNAVAILABLE") {
			// In a cluster of several groups a transaction's first key
			// takes its start at its group's leader: elsewhere it is
			// redirected, and the transaction is retried there, as a
			// BEGIN refused by a follower is (fold: this was one).
			if fold {
				t.failed = t.beginFailed(err)
				return nil, false, t.failed
			}
			return nil, false, t.beginFailed(err)
		}

		return nil, false, txError(err)
	}
	return r, r.null, nil
}

func putAll(reqs []*request) {
	for _, r := range reqs {
		putRequest(r)
	}
}

// drop forgets the buffered writes not yet sent.
func (t *Tx) drop() {
	putAll(t.pending)
	t.pending = nil
}

// beginFailed maps a failed BEGIN: at a follower (-MOVED) the client learns
// the leader, and the transaction is retried there, as after -UNAVAILABLE or
// a lost connection (ErrTxAborted: it never began).
func (t *Tx) beginFailed(err error) error {
	var se *Error
	rt := t.c.rt
	switch {
	case errors.As(err, &se) && se.Prefix == "MOVED":
		addr := lastWord(se.Msg)
		if rt != nil && t.slot >= 0 {
			// The next attempt begins there, the map catches up: the
			// client's own pool, which unkeyed calls use, stays where it is
			// (moved, it sent every transaction connection from one group's
			// leader to another's whenever transactions of two groups took
			// turns).
			*t.moved = txMoved{slot: t.slot, addr: addr}
			rt.refreshSoon(addr)
		} else {
			t.c.leader.Store(&addr)
		}
		return fmt.Errorf("%w: began at a follower: %w", ErrTxAborted, err)
	case errors.As(err, &se) && se.Prefix == "UNAVAILABLE":
		if rt != nil && t.slot >= 0 {
			t.moved.addr = ""
			rt.refreshSoon("")
		} else {
			t.c.leader.Store(nil)
		}
		return fmt.Errorf("%w: %w", ErrTxAborted, err)
	}
	return txError(err)
}

func lastWord(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ' ' {
			return s[i+1:]
		}
	}
	return s
}

// end ends the transaction's handle and its use of the connection: ABORT
// is queued, and the connection freed at once, without waiting for the
// reply, which is read in its turn (replies come in order) and dropped.
// It is not sent in a write of its own: it rides in the connection's next
// write — another transaction's command, or this client's next BEGIN —
// or, if none comes within riderDelay, a timer sends it (conn.sendDetached),
// so the server unpins the snapshot a few milliseconds late at most and
// a read-only transaction costs the syscalls of its reads alone. Buffered writes not yet sent are
// dropped: the server never sees them. Not waiting means neither an error
// reply (the server already ended the handle: "no such transaction" after a
// -TXABORT) nor a context that ended can close the connection, which other
// transactions share: a connection is closed only when its replies may be
// out of step with its requests. Any later BEGIN on the connection is
// queued behind this ABORT, so the server has ended the handle before it
// counts that BEGIN against its open transactions.
func (t *Tx) end() {
	t.drop()
	cn := t.cn
	if cn == nil {
		return // it never took a connection
	}
	defer t.txs.put(cn)
	if !t.begun {
		return // no handle to end: BEGIN was never sent, or it failed (and closed cn)
	}
	if cn.txThen && cn.addAbort(t.h) {
		return
	}
	r := newCall(replyStatus, false, nil, nil)
	r.allowRedirect = false
	r.cmd = append(r.cmd, arg{s: "KEFIR.TX"}, arg{s: "ABORT"}, arg{s: t.h})
	cn.sendDetached(r)
}

// addAbort adds handle h to an ABORT queued on cn and not yet sent, if
// there is one (KEFIR.TX ABORT takes several handles where the server takes
// the chained form): transactions that end before the connection's next
// write cost one command between them, not one each.
func (c *conn) addAbort(h string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.queue) - 1; i >= 0; i-- {
		q := c.queue[i]
		if q.detached && q.state == stateQueued && len(q.cmd) >= 3 && q.cmd[1].s == "ABORT" {
			q.cmd = append(q.cmd, arg{s: h})
			q.encode(0, 0)
			return true
		}
	}
	return false
}

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

// Set buffers a write of key. It does not wait for the server: the write
// is sent with the transaction's next awaited call (or the commit), which
// returns its error, if any (see Tx). Set returns only the error of an
// earlier failed call of the transaction. value is copied.
func (t *Tx) Set(_ context.Context, key string, value []byte) error {
	if t.failed != nil {
		return t.failed
	}
	if t.readOnly {
		return ErrTxReadOnly
	}
	t.wrote = true
	t.pending = append(t.pending, t.request(replyStatus, "SET", key, append([]byte{}, value...)))
	return nil
}

// Del buffers a deletion of key and reports whether it existed (in the
// transaction's view): it waits for its reply (sending the buffered Sets
// with it).
func (t *Tx) Del(ctx context.Context, key string) (bool, error) {
	if t.readOnly {
		return false, ErrTxReadOnly
	}
	t.wrote = true
	r, _, err := t.call(ctx, replyInt, "DEL", key)
	if err != nil {
		return false, err
	}
	n := r.n
	putRequest(r)
	return n > 0, nil
}

// Incr buffers INCRBY key delta and returns the value in the transaction's
// view (the committed value, if it commits): it waits for its reply
// (sending the buffered Sets with it).
func (t *Tx) Incr(ctx context.Context, key string, delta int64) (int64, error) {
	if t.readOnly {
		return 0, ErrTxReadOnly
	}
	t.wrote = true
	r, _, err := t.call(ctx, replyInt, "INCRBY", key, strconv.FormatInt(delta, 10))
	if err != nil {
		return 0, err
	}
	n := r.n
	putRequest(r)
	return n, nil
}

// txConns are the connections transactions run on, dialed to the leader as
// the client knows it and shared: a connection carries up to txPerConn open
// transactions at once, so that concurrent transactions' commands and
// replies share its writes and reads, as concurrent calls share the pool's
// connections. With a connection of its own per transaction, every command
// was a write and a read of its own on both sides: from 16 goroutines on a
// group's leader, a read-only Txn of 4 Gets cost 3–5× the CPU of 4 Gets
// (docs/design/transactions.md, "Benchmarks: against etcd and Redis").
type txConns struct {
	mu     sync.Mutex
	conns  []*conn
	closed bool
	// dialing is closed when the dial in progress ends (nil: none): one
	// dial at a time (get).
	dialing chan struct{}
}

// txPerConn bounds a connection's open transactions: below the server's 16
// per connection (a BEGIN past it is refused), and a BEGIN handed to a
// server worker holds up the commands queued behind it on its connection.
const txPerConn = 8

// The pool keeps as many transaction connections as the client's pool
// size (WithPoolSize, default 2); more are dialed while every kept one is
// full, one at a time (a transaction that finds them full while another
// dials waits for that connection), and closed when their transactions
// end. Fewer connections, more transactions' commands in each write.

func (p *txConns) get(ctx context.Context, pl *pool) (*conn, error) {
	c := pl.c
	for {
		hint := pl.leader.Load() // nil for ever in a node's pool (route.go)
		p.mu.Lock()
		var best *conn
		bestOpen, bestRiders := 0, false
		keep := p.conns[:0]
		for _, cn := range p.conns {
			cn.mu.Lock()
			broken, open, riders := cn.broken != nil, cn.txOpen, cn.riders > 0
			cn.mu.Unlock()
			if broken || (hint != nil && cn.addr != *hint) {
				if open == 0 || broken {
					cn.close()
					continue
				}
			} else if open < txPerConn && (best == nil || (riders && !bestRiders) || (riders == bestRiders && open < bestOpen)) {
				// A connection with an ABORT waiting to ride in its next
				// write (Tx.end) first: this transaction's BEGIN carries it.
				best, bestOpen, bestRiders = cn, open, riders
			}
			keep = append(keep, cn)
		}
		clear(p.conns[len(keep):])
		p.conns = keep
		if best != nil {
			best.mu.Lock()
			best.txOpen++
			best.mu.Unlock()
			p.mu.Unlock()
			return best, nil
		}
		if p.dialing != nil {
			// Another transaction is dialing: wait for its connection,
			// which has room for this one too. Dialing at once, 16
			// transactions that began together kept 16 connections of
			// one transaction each, whose every command was then a write
			// and a read of its own on both sides (1.6x the server CPU of
			// 8 sharing each; docs/design/transactions.md, "Go client").
			wait := p.dialing
			p.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctxError(ctx.Err(), false)
			}
		}
		closed := p.closed
		if closed || c.closed.Load() {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		done := make(chan struct{})
		p.dialing = done
		p.mu.Unlock()
		cn, err := p.dial(ctx, pl, hint)
		p.mu.Lock()
		p.dialing = nil
		close(done)
		if err == nil {
			cn.txOpen = 1
			if !p.closed && len(p.conns) < c.opts.poolSize {
				p.conns = append(p.conns, cn)
			}
		}
		p.mu.Unlock()
		return cn, err
	}
}

// dial dials a transaction connection to the leader as the pool knows it
// (hint), or else to any of the pool's addresses (a node's pool: its node).
func (p *txConns) dial(ctx context.Context, pl *pool, hint *string) (*conn, error) {
	c := pl.c
	addrs := pl.addrs
	if hint != nil {
		addrs = append([]string{*hint}, addrs...)
	}
	var errs []error
	for _, a := range addrs {
		cn, err := c.dial(ctx, a)
		if err == nil {
			cn.txOneGroup, cn.txThen, cn.txReadOnly = probeTx(ctx, cn)
			return cn, nil
		}
		if errors.Is(err, ErrAuth) {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
}

// probeTx asks cn's node, in one round trip, what its transactions need:
// oneGroup, whether it serves one replica group (INFO cluster says
// cluster_enabled:0, which a node keeps for its life): there a
// transaction's keys of several slots are still of one group, read from
// one snapshot, and a read-only one needs no PREPARE to validate them
// (Tx.noteSlot); and then, whether it takes KEFIR.TX's chained form
// (KEFIR.TX FEATURES names THEN; an older server answers an error): then
// BEGIN travels inside the transaction's first command and an ABORT inside
// the connection's next, each a command fewer on the server (foldAborts,
// Tx.call); and whether it takes BEGIN … READONLY (KEFIR.TX FEATURES names
// READONLY; else a read-only transaction begins as any, and the client
// refuses its writes itself). Asked once per transaction connection; false for what the node
// does not say.
func probeTx(ctx context.Context, cn *conn) (oneGroup, then, readOnly bool) {
	info := newCall(replyBulk, false, nil, nil)
	info.allowRedirect = false
	info.cmd = append(info.cmd, arg{s: "INFO"}, arg{s: "cluster"})
	feat := newCall(replyList, false, nil, nil)
	feat.allowRedirect = false
	feat.cmd = append(feat.cmd, arg{s: "KEFIR.TX"}, arg{s: "FEATURES"})
	if err := pipeline(ctx, cn, nil, info, feat); err != nil {
		return false, false, false // cn is closed or broken: its requests are not returned
	}
	if info.err == nil {
		enabled, known := clusterEnabledIn(info.val)
		oneGroup = known && !enabled
	}
	then = feat.err == nil && slices.ContainsFunc(feat.list, func(w []byte) bool { return string(w) == "THEN" })
	readOnly = feat.err == nil && slices.ContainsFunc(feat.list, func(w []byte) bool { return string(w) == "READONLY" })
	putRequest(info)
	putRequest(feat)
	return oneGroup, then, readOnly
}

// put ends a transaction's use of cn: a connection the pool does not keep
// is closed with its last transaction.
func (p *txConns) put(cn *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cn.mu.Lock()
	cn.txOpen--
	open := cn.txOpen
	cn.mu.Unlock()
	if open == 0 && (p.closed || !slices.Contains(p.conns, cn)) {
		cn.close()
	}
}

func (p *txConns) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, cn := range p.conns {
		cn.close()
	}
	p.conns = nil
}

// SetRange buffers SETRANGE key offset value and returns the value's length
// in the transaction's view. The transaction's write of key is the bytes
// [offset, offset+len(value)) only: a concurrent transaction that wrote
// other bytes of key does not conflict with it (docs/design/transactions.md,
// "Fine-grained conflicts").
func (t *Tx) SetRange(ctx context.Context, key string, offset int64, value []byte) (int64, error) {
	if t.readOnly {
		return 0, ErrTxReadOnly
	}
	t.wrote = true
	r, _, err := t.call(ctx, replyInt, "SETRANGE", key, strconv.FormatInt(offset, 10), value)
	if err != nil {
		return 0, err
	}
	n := r.n
	putRequest(r)
	return n, nil
}

// GetRange reads bytes start..end (inclusive; negative from the end, as
// GETRANGE) of key at the snapshot. With start and end not negative the
// transaction's read of key is those bytes only (SERIALIZABLE validates
// just them); a negative index reads the length, so the whole key.
func (t *Tx) GetRange(ctx context.Context, key string, start, end int64) ([]byte, error) {
	r, _, err := t.call(ctx, replyBulk, "GETRANGE", key, strconv.FormatInt(start, 10), strconv.FormatInt(end, 10))
	if err != nil {
		return nil, err
	}
	val := r.val
	putRequest(r)
	return val, nil
}

// SetBit buffers SETBIT key offset bit and returns the bit's previous value
// in the transaction's view. The write of key is that one bit.
func (t *Tx) SetBit(ctx context.Context, key string, offset int64, bit int) (int, error) {
	if bit != 0 && bit != 1 {
		return 0, fmt.Errorf("kefir: SetBit of %d: a bit is 0 or 1", bit)
	}
	if t.readOnly {
		return 0, ErrTxReadOnly
	}
	t.wrote = true
	r, _, err := t.call(ctx, replyInt, "SETBIT", key, strconv.FormatInt(offset, 10), strconv.Itoa(bit))
	if err != nil {
		return 0, err
	}
	n := r.n
	putRequest(r)
	return int(n), nil
}

// GetBit reads bit offset of key at the snapshot; the read is that bit.
func (t *Tx) GetBit(ctx context.Context, key string, offset int64) (int, error) {
	r, _, err := t.call(ctx, replyInt, "GETBIT", key, strconv.FormatInt(offset, 10))
	if err != nil {
		return 0, err
	}
	n := r.n
	putRequest(r)
	return int(n), nil
}

// Access declares that the transaction uses only bytes start..end
// (inclusive) of key (Isotope's mark_accessed): its whole reads of key (Get,
// MGet) then count as reads of the declared ranges. Whole writes (Set, Del,
// Incr) stay whole: they replace every byte.
func (t *Tx) Access(ctx context.Context, key string, start, end int64) error {
	r, _, err := t.call(ctx, replyStatus, "ACCESS", key, strconv.FormatInt(start, 10), strconv.FormatInt(end, 10))
	if err != nil {
		return err
	}
	putRequest(r)
	return nil
}
