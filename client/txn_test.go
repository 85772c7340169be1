package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// dialFor dials a client to addr for a test that may run for up to d: the
// returned context ends after d; the client and the context end with the
// test.
func dialFor(t *testing.T, addr string, d time.Duration, opts ...Option) (context.Context, *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	c, err := Dial(ctx, []string{addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return ctx, c
}

// Concurrent read-modify-write transactions on one counter: each one that
// conflicts is retried, and the counter ends with every increment.
func TestTxnRetriesConflicts(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second)
	for _, iso := range []Isolation{Serializable, SnapshotIsolation} {
		key := "ctr" + strconv.Itoa(int(iso))
		var wg sync.WaitGroup
		var runs sync.Map
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 10 {
					err := c.Txn(ctx, func(tx *Tx) error {
						n, _ := runs.LoadOrStore([2]int{w, i}, new(int))
						*n.(*int)++
						v, err := tx.Get(ctx, key)
						if err != nil && !errors.Is(err, ErrNotFound) {
							return err
						}
						x, _ := strconv.Atoi(string(v))
						return tx.Set(ctx, key, []byte(strconv.Itoa(x+1)))
					}, &TxOptions{Isolation: iso, MaxAttempts: 100})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if v, err := c.Get(ctx, key); err != nil || string(v) != "40" {
			t.Fatalf("isolation %d: counter %q, %v; want 40", iso, v, err)
		}
		retried := 0
		runs.Range(func(_, n any) bool {
			retried += *n.(*int) - 1
			return true
		})
		t.Logf("isolation %d: %d retries", iso, retried)
	}
}

// An error fn returns aborts the transaction (nothing lands) and is
// returned as is; a read-only transaction commits without the log; Del
// and Incr answer the transaction's view.
func TestTxnErrorAndReadOnly(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second)
	boom := errors.New("boom")
	err := c.Txn(ctx, func(tx *Tx) error {
		if err := tx.Set(ctx, "a", []byte("1")); err != nil {
			return err
		}
		return boom
	}, nil)
	if err != boom {
		t.Fatalf("Txn = %v, want fn's error", err)
	}
	if _, err := c.Get(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a written by an aborted transaction: %v", err)
	}
	if err := c.Put(ctx, "b", []byte("5")); err != nil {
		t.Fatal(err)
	}
	err = c.Txn(ctx, func(tx *Tx) error {
		vs, err := tx.MGet(ctx, "a", "b")
		if err != nil || vs[0] != nil || string(vs[1]) != "5" {
			t.Errorf("MGet = %q, %v", vs, err)
		}
		if n, err := tx.Incr(ctx, "b", 2); err != nil || n != 7 {
			t.Errorf("Incr = %d, %v", n, err)
		}
		if ok, err := tx.Del(ctx, "b"); err != nil || !ok {
			t.Errorf("Del = %v, %v", ok, err)
		}
		_, err = tx.Get(ctx, "b")
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("Get after Del: %v", err)
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b after the committed Del: %v", err)
	}
	if err := c.Txn(ctx, func(tx *Tx) error { _, err := tx.Get(ctx, "b"); return ignoreNotFound(err) }, nil); err != nil {
		t.Fatal(err)
	}
}

func ignoreNotFound(err error) error {
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// A commit whose connection dies after it was sent, every retry too, has an
// unknown outcome: Txn returns ErrUnknownOutcome and does not run fn again —
// a new attempt would be a new transaction, applied a second time if the
// first committed.
func TestTxnLostCommitIsUnknownNotRetried(t *testing.T) {
	s := newTestServer(t)
	s.setHook(func(h hookInfo) action {
		if h.argv[0] == "KEFIR.TXAPPLY" {
			return actDropAfterApply
		}
		return actReply
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runs := 0
	err = c.Txn(ctx, func(tx *Tx) error {
		runs++
		return tx.Set(ctx, "k", []byte("v"))
	}, nil)
	if !errors.Is(err, ErrUnknownOutcome) || errors.Is(err, ErrTxAborted) || runs != 1 {
		t.Fatalf("Txn = %v after %d runs of fn; want ErrUnknownOutcome after one", err, runs)
	}
}

// Fine-grained conflicts through Tx's bit and range methods: 8 concurrent
// transactions each read and set its own bit of one key (and write its own
// byte after them); none conflicts, so none is retried, and the value holds
// every bit and byte. Access narrows a Get to the declared bytes.
func TestTxnBitFlipsDoNotConflict(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second)
	for _, iso := range []Isolation{Serializable, SnapshotIsolation} {
		key := "bits" + strconv.Itoa(int(iso))
		// Nine bytes already: no write grows the value (a write past the
		// end changes the length, which conflicts with the bytes it adds).
		if err := c.Put(ctx, key, make([]byte, 9)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var attempts sync.Map
		start := make(chan struct{})
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := c.Txn(ctx, func(tx *Tx) error {
					n, _ := attempts.LoadOrStore(w, new(int))
					*n.(*int)++
					if b, err := tx.GetBit(ctx, key, int64(w)); err != nil || b != 0 {
						return errors.Join(err, errors.New("bit already set"))
					}
					if _, err := tx.SetBit(ctx, key, int64(w), 1); err != nil {
						return err
					}
					_, err := tx.SetRange(ctx, key, int64(1+w), []byte{'a' + byte(w)})
					return err
				}, &TxOptions{Isolation: iso, MaxAttempts: 100})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		v, err := c.Get(ctx, key)
		if err != nil || string(v) != "\xffabcdefgh" {
			t.Fatalf("isolation %d: value %q, %v", iso, v, err)
		}
		total := 0
		attempts.Range(func(_, n any) bool { total += *n.(*int); return true })
		if total != 8 {
			t.Fatalf("isolation %d: %d attempts for 8 transactions on different bits: one conflicted", iso, total)
		}
	}
	// Access: a SERIALIZABLE Get of a key whose declared bytes nobody wrote
	// commits though another byte of it changed in its window.
	if err := c.Put(ctx, "doc", []byte("abcd")); err != nil {
		t.Fatal(err)
	}
	first := true
	err := c.Txn(ctx, func(tx *Tx) error {
		if err := tx.Access(ctx, "doc", 0, 0); err != nil {
			return err
		}
		if _, err := tx.Get(ctx, "doc"); err != nil {
			return err
		}
		if first {
			first = false
			if err := c.Txn(ctx, func(o *Tx) error {
				_, err := o.SetRange(ctx, "doc", 3, []byte("D"))
				return err
			}, nil); err != nil {
				return err
			}
		}
		if r, err := tx.GetRange(ctx, "doc", 0, 0); err != nil || string(r) != "a" {
			return errors.Join(err, errors.New("GetRange"))
		}
		return tx.Set(ctx, "out", []byte("1"))
	}, &TxOptions{Isolation: Serializable, MaxAttempts: 1})
	if err != nil {
		t.Fatalf("a declared read conflicted with a write of other bytes: %v", err)
	}
}

// turnProxy forwards TCP connections to a server and counts round trips:
// a turn is a client write that follows a reply (or opens the connection),
// so a pipeline of several commands in one write is one turn however the
// server splits its replies.
type turnProxy struct {
	ln    net.Listener
	turns atomic.Int64
	live  atomic.Int64 // client connections open through the proxy
}

func newTurnProxy(t *testing.T, target string) *turnProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &turnProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			t.Cleanup(func() { cc.Close(); sc.Close() })
			p.live.Add(1)
			var replied atomic.Bool // a reply came since the client last wrote
			replied.Store(true)
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := cc.Read(buf)
					if n > 0 {
						if replied.Swap(false) {
							p.turns.Add(1)
						}
						if _, err := sc.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						p.live.Add(-1)
						sc.Close()
						return
					}
				}
			}()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := sc.Read(buf)
					if n > 0 {
						replied.Store(true)
						if _, err := cc.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						cc.Close()
						return
					}
				}
			}()
		}
	}()
	return p
}

// A transaction of a read, three Sets and the commit costs three round
// trips: BEGIN with the read; the Sets with PREPARE; KEFIR.TXAPPLY. (Each
// Set waited for its reply before: six.)
func TestTxnRoundTrips(t *testing.T) {
	p := newTurnProxy(t, startNode(t, ""))
	ctx, c := dialFor(t, p.ln.Addr().String(), 30*time.Second, WithPoolSize(1))
	txn := func() error {
		return c.Txn(ctx, func(tx *Tx) error {
			vs, err := tx.MGet(ctx, "a", "b")
			if err != nil {
				return err
			}
			n := len(vs[0])
			for _, k := range []string{"a", "b", "c"} {
				if err := tx.Set(ctx, k, []byte(strconv.Itoa(n+1))); err != nil {
					return err
				}
			}
			return nil
		}, nil)
	}
	// The first one dials the transaction's connection and the write
	// path's; the second finds both open.
	if err := txn(); err != nil {
		t.Fatal(err)
	}
	before := p.turns.Load()
	if err := txn(); err != nil {
		t.Fatal(err)
	}
	if got := p.turns.Load() - before; got != 3 {
		t.Fatalf("a transaction of a read, 3 Sets and the commit took %d round trips, want 3", got)
	}
	for _, k := range []string{"a", "b", "c"} {
		if v, err := c.Get(ctx, k); err != nil || string(v) != "2" {
			t.Fatalf("%s = %q, %v after two transactions; want 2", k, v, err)
		}
	}
}

// A buffered Set's error is not Set's: it surfaces at the next awaited call
// (here the commit's PREPARE, or a Get) and aborts the transaction — nothing
// lands, Txn returns it without a retry. The server's write-set bound
// (4,096 writes) makes the 4,097th Set fail.
func TestTxnBufferedWriteErrorAborts(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second)
	const n = 4097
	for _, readAfter := range []bool{false, true} {
		runs := 0
		var getErr, lateSet error
		err := c.Txn(ctx, func(tx *Tx) error {
			runs++
			for i := range n {
				if err := tx.Set(ctx, "k"+strconv.Itoa(i), []byte("v")); err != nil {
					t.Fatalf("Set %d = %v: a buffered Set does not wait for its reply", i, err)
				}
			}
			if readAfter {
				_, getErr = tx.Get(ctx, "k0")
				lateSet = tx.Set(ctx, "late", []byte("v"))
				return nil // fn ignores the errors: Txn still aborts
			}
			return nil
		}, nil)
		var se *Error
		if !errors.As(err, &se) || se.Prefix != "ERR" || errors.Is(err, ErrTxAborted) || runs != 1 {
			t.Fatalf("readAfter %v: Txn = %v after %d runs; want the full write set's ERR, not retried", readAfter, err, runs)
		}
		if readAfter && (getErr == nil || lateSet == nil) {
			t.Fatalf("Get after the failed Set = %v, a later Set = %v; want the Set's error", getErr, lateSet)
		}
		for _, k := range []string{"k0", "k4095", "late"} {
			if _, err := c.Get(ctx, k); !errors.Is(err, ErrNotFound) {
				t.Fatalf("readAfter %v: %s written by an aborted transaction: %v", readAfter, k, err)
			}
		}
	}
	// The transaction connection is still good for the next transaction.
	if err := c.Txn(ctx, func(tx *Tx) error { return tx.Set(ctx, "ok", []byte("1")) }, nil); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "ok"); err != nil || string(v) != "1" {
		t.Fatalf("ok = %q, %v", v, err)
	}
}

// Concurrent transactions share the client's few transaction connections
// (txConns: up to txPerConn open on each, their handles taken in the order
// their BEGINs are queued), as concurrent calls share the pool's: after 16
// goroutines ran 320 transactions — read-modify-writes of one counter, with
// conflicts retried, and read-only ones — the counter is exact, and the
// client keeps as many transaction connections as its pool size, not one per
// concurrent transaction (it kept 16 before: every command of a transaction
// was then a write and a read of its own, 3–5× the CPU of the same plain
// reads from 16 goroutines).
func TestTxnsShareConnections(t *testing.T) {
	p := newTurnProxy(t, startNode(t, ""))
	ctx, c := dialFor(t, p.ln.Addr().String(), 60*time.Second, WithPoolSize(2))
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				err := c.Txn(ctx, func(tx *Tx) error {
					v, err := tx.Get(ctx, "n")
					if err != nil && !errors.Is(err, ErrNotFound) {
						return err
					}
					if (w+i)%2 == 1 {
						return nil // read-only
					}
					x, _ := strconv.Atoi(string(v))
					return tx.Set(ctx, "n", []byte(strconv.Itoa(x+1)))
				}, &TxOptions{MaxAttempts: 1000, Backoff: 100 * time.Microsecond})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if v, err := c.Get(ctx, "n"); err != nil || string(v) != "160" {
		t.Fatalf("counter %q, %v; want 160", v, err)
	}
	// The pool's 2 connections and at most 2 transaction connections stay
	// open; the ones dialed while those were full closed with their last
	// transaction.
	testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { return p.live.Load() <= 4 })
	if n := p.live.Load(); n > 4 {
		t.Fatalf("%d connections open after the transactions, want at most 4 (2 of the pool, 2 for transactions)", n)
	}
}

// A transaction whose commit fails on its own account — here a buffered
// write's error that surfaces at PREPARE — leaves the transaction
// connection it shares with other, unrelated transactions open: an error
// reply leaves the connection's replies in step with its requests. It
// closed it before (a review's finding), and every transaction in flight on
// it aborted with "connection lost" although nothing conflicted; with
// MaxAttempts 1 the bystander's Txn failed.
func TestTxnOwnErrorSparesNeighbours(t *testing.T) {
	ctx, c, spared := withBystander(t)
	// On the same transaction connection (pool size 1): 4,097 buffered Sets,
	// the last refused by the server's write-set bound, fail at PREPARE.
	err := c.Txn(ctx, func(tx *Tx) error {
		for i := range 4097 {
			if err := tx.Set(ctx, "k"+strconv.Itoa(i), []byte("v")); err != nil {
				return err
			}
		}
		return nil
	}, nil)
	if err == nil {
		t.Fatal("the 4,097-write transaction committed")
	}
	spared("another one's commit failed")
}

// withBystander dials a client with one transaction connection (pool size
// 1) to a node of its own and runs on it a bystander: a transaction with
// MaxAttempts 1 that has begun when withBystander returns, and waits, to
// read once more, write and commit when spared is called — which fails the
// test if it aborted, because of what the test did meanwhile (why).
func withBystander(t *testing.T) (ctx context.Context, c *Client, spared func(why string)) {
	t.Helper()
	return withBystanderAt(t, startNode(t, ""))
}

// withBystanderAt is withBystander with the client dialed to addr.
func withBystanderAt(t *testing.T, addr string) (ctx context.Context, c *Client, spared func(why string)) {
	t.Helper()
	ctx, c = dialFor(t, addr, 30*time.Second, WithPoolSize(1))
	began, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		first := true
		done <- c.Txn(ctx, func(tx *Tx) error {
			if _, err := tx.Get(ctx, "x"); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			if first {
				first = false
				close(began)
				<-release
			}
			if _, err := tx.Get(ctx, "y"); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			return tx.Set(ctx, "bystander", []byte("1"))
		}, &TxOptions{MaxAttempts: 1})
	}()
	<-began
	return ctx, c, func(why string) {
		t.Helper()
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("an unrelated transaction on the shared connection aborted because %s: %v", why, err)
		}
	}
}

// A transaction whose handle the server already ended — as it ends one too
// old, answering -TXABORT — gets "no such transaction" for the ABORT that
// ends it on the client's side: a well-formed error reply, which leaves the
// shared transaction connection open. It closed it before (end closed the
// connection when ABORT failed), aborting the bystander with "connection
// lost". The server's end is played here by an ABORT of the handle sent
// from fn.
func TestTxnEndedHandleSparesNeighbours(t *testing.T) {
	ctx, c, spared := withBystander(t)
	own := errors.New("fn's own error")
	err := c.Txn(ctx, func(tx *Tx) error {
		if _, err := tx.Get(ctx, "z"); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		r := tx.request(replyStatus, "ABORT")
		if err := pipeline(ctx, tx.cn, nil, r); err != nil {
			return err
		}
		if err := r.err; err != nil {
			return fmt.Errorf("the test's ABORT: %w", err)
		}
		putRequest(r)
		return own
	}, nil)
	if !errors.Is(err, own) {
		t.Fatalf("Txn = %v, want fn's error", err)
	}
	spared("another one's handle was already ended")
}

// A transaction whose fn returns because its own context ended (between
// calls: no reply is awaited) leaves the shared transaction connection
// open: its ABORT is not waited for, so the ended context has nothing to
// cancel. It closed it before (end waited for the ABORT's reply under the
// ended context, and a wait cut short closes the connection), aborting the
// bystander, whose context is still good.
func TestTxnCancelledContextSparesNeighbours(t *testing.T) {
	ctx, c, spared := withBystander(t)
	cctx, ccancel := context.WithCancel(ctx)
	err := c.Txn(cctx, func(tx *Tx) error {
		if _, err := tx.Get(cctx, "z"); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		ccancel()
		return cctx.Err()
	}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Txn = %v, want context.Canceled", err)
	}
	spared("another one's context ended")
}

// A panic in fn goes on up through Txn, and the transaction's share of its
// connection is released (and its handle ended) on the way: the connection
// stays open with no transaction counted on it. Before, each panic left one
// count behind (txOpen), so a client whose fns panicked 8 times had a
// transaction connection it took for full forever.
func TestTxnPanicReleasesConnection(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second, WithPoolSize(1))
	for i := range 20 {
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v, want fn's panic", p)
				}
			}()
			_ = c.Txn(ctx, func(tx *Tx) error {
				if i%2 == 1 { // begun, or not: both release
					if _, err := tx.Get(ctx, "x"); err != nil && !errors.Is(err, ErrNotFound) {
						return err
					}
				}
				panic("boom")
			}, nil)
		}()
	}
	c.txs.mu.Lock()
	conns := slices.Clone(c.txs.conns)
	c.txs.mu.Unlock()
	if len(conns) != 1 {
		t.Fatalf("%d transaction connections kept, want 1", len(conns))
	}
	cn := conns[0]
	cn.mu.Lock()
	open, broken := cn.txOpen, cn.broken
	cn.mu.Unlock()
	if open != 0 || broken != nil {
		t.Fatalf("after 20 panics in fn: %d transactions counted on the connection (want 0), broken: %v", open, broken)
	}
	if err := c.Txn(ctx, func(tx *Tx) error { return tx.Set(ctx, "after", []byte("1")) }, nil); err != nil {
		t.Fatal(err)
	}
}

// A BEGIN the server refuses (here: its 16 open transactions per
// connection are reached) leaves the shared transaction connection open:
// the refused transaction fails with the server's error, and the bystander
// open on the connection commits. The connection was closed for every
// refused BEGIN before, aborting the bystander. The other 14 transactions
// are opened by hand, counted as Txn counts its BEGINs. With the chained
// form (KEFIR.TX BEGIN … THEN) the refused transaction's handle stays
// used: handles only grow, and the server counts none. Against a server
// without it, a BEGIN refused took no handle; when no BEGIN was queued
// after it, the client takes back the handle it counted (conn.txNext).
func TestTxnRefusedBeginSparesNeighbours(t *testing.T) {
	for _, old := range []bool{false, true} {
		addr := startNode(t, "")
		if old {
			addr = newCmdProxy(t, addr, true).ln.Addr().String()
		}
		ctx, c, spared := withBystanderAt(t, addr)
		c.txs.mu.Lock()
		cn := c.txs.conns[0]
		c.txs.mu.Unlock()
		var begins []*request
		for range 15 {
			r := newCall(replyInt, false, nil, nil)
			r.allowRedirect = false
			r.cmd = append(r.cmd, arg{s: "KEFIR.TX"}, arg{s: "BEGIN"})
			begins = append(begins, r)
		}
		if err := pipeline(ctx, cn, func() { cn.txNext += 15 }, begins...); err != nil {
			t.Fatal(err)
		}
		for i, r := range begins {
			if r.err != nil || r.n != int64(i+2) {
				t.Fatalf("hand-made BEGIN %d: %d, %v", i, r.n, r.err)
			}
			putRequest(r)
		}
		err := c.Txn(ctx, func(tx *Tx) error {
			_, err := tx.Get(ctx, "z")
			return err
		}, &TxOptions{MaxAttempts: 1})
		if err == nil || !strings.Contains(err.Error(), "too many open transactions") {
			t.Fatalf("old server %v: Txn past the server's open transactions = %v, want its refusal", old, err)
		}
		cn.mu.Lock()
		next, broken := cn.txNext, cn.broken
		cn.mu.Unlock()
		want := uint64(17)
		if old {
			want = 16
		}
		if next != want || broken != nil {
			t.Fatalf("old server %v: after the refused BEGIN the connection counts %d handles (want %d), broken: %v", old, next, want, broken)
		}
		spared("another one's BEGIN was refused")
	}
}

// A transaction's ABORT is not a write of its own: it rides in the
// connection's next write (conn.sendDetached) — here the next transaction's
// BEGIN — so a read-only Txn of 4 Gets takes the 4 round trips of its
// reads, as 4 Gets do (their keys are of several slots: on a node of one
// group that needs no PREPARE, which took a fifth round trip before). When
// nothing follows, the ABORT waits, and the timer sends it within
// riderDelay. Twenty transactions, more than the server's 16 open per
// connection, run on one connection: none is refused, since every ABORT
// reaches the server before the next BEGIN.
func TestTxnReadOnlyEndRidesTheNextWrite(t *testing.T) {
	old := riderDelay
	riderDelay = time.Second
	t.Cleanup(func() { riderDelay = old })
	p := newTurnProxy(t, startNode(t, ""))
	ctx, c := dialFor(t, p.ln.Addr().String(), 30*time.Second, WithPoolSize(1))
	ro := func() error {
		return c.Txn(ctx, func(tx *Tx) error {
			for _, k := range []string{"a", "b", "c", "d"} {
				if _, err := tx.Get(ctx, k); err != nil && !errors.Is(err, ErrNotFound) {
					return err
				}
			}
			return nil
		}, &TxOptions{MaxAttempts: 1})
	}
	if err := ro(); err != nil { // dials the transaction connection
		t.Fatal(err)
	}
	const n = 20
	before := p.turns.Load()
	for range n {
		if err := ro(); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.turns.Load() - before; got != 4*n {
		t.Fatalf("%d read-only transactions of 4 Gets took %d round trips, want %d", n, got, 4*n)
	}
	c.txs.mu.Lock()
	cn := c.txs.conns[0]
	c.txs.mu.Unlock()
	answered := func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return len(cn.queue) == 0 && len(cn.inflight) == 0
	}
	time.Sleep(200 * time.Millisecond)
	if answered() {
		t.Fatal("the last transaction's ABORT was sent at once, not left to ride in the next write")
	}
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, answered) {
		t.Fatal("the last transaction's ABORT was not sent (and answered) with nothing to ride in")
	}
	if got := p.turns.Load() - before; got != 4*n+1 {
		t.Fatalf("%d round trips after the last ABORT went, want %d", got, 4*n+1)
	}
}

// Transactions that begin together with no transaction connection open
// wait for one dial at a time and share what it opens (up to txPerConn
// each): 16 open at once keep 2 connections. Each dialed its own before,
// and the client kept 16 (its pool size) of one transaction each, whose
// every command was then a write and a read of its own on both sides.
func TestTxnsBegunTogetherShareDials(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second, WithPoolSize(16))
	var all sync.WaitGroup
	all.Add(16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Txn(ctx, func(tx *Tx) error {
				if _, err := tx.Get(ctx, "k"); err != nil && !errors.Is(err, ErrNotFound) {
					return err
				}
				all.Done()
				all.Wait() // all 16 open at once
				return nil
			}, &TxOptions{MaxAttempts: 1})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	c.txs.mu.Lock()
	n := len(c.txs.conns)
	c.txs.mu.Unlock()
	if n != 16/txPerConn {
		t.Fatalf("16 transactions begun together kept %d transaction connections, want %d", n, 16/txPerConn)
	}
}

// cmdProxy forwards TCP connections to a server command by command and
// records each one (its words); old makes it a server from before KEFIR.TX's
// chained form: KEFIR.TX FEATURES is answered as such a server answers it
// (an error: the real server is sent a subcommand it does not know), and a
// chained command reaching it is an error of the test.
type cmdProxy struct {
	ln  net.Listener
	old bool
	mu  sync.Mutex
	log [][]string
}

func newCmdProxy(t *testing.T, target string, old bool) *cmdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cmdProxy{ln: ln, old: old}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			t.Cleanup(func() { cc.Close(); sc.Close() })
			go func() {
				defer sc.Close()
				rd := resp.NewReader(cc, 0)
				for {
					v, err := rd.ReadValue()
					if err != nil {
						return
					}
					words := make([]string, len(v.Elems))
					for i, e := range v.Elems {
						words[i] = string(e.Str)
					}
					p.mu.Lock()
					p.log = append(p.log, words)
					p.mu.Unlock()
					if p.old && len(words) >= 2 && words[0] == "KEFIR.TX" {
						if words[1] == "FEATURES" {
							words[1] = "NOFEATURES"
						}
						if slices.Contains(words, "THEN") || (words[1] == "ABORT" && len(words) != 3) {
							t.Errorf("a chained KEFIR.TX sent to a server without the form: %q", words)
						}
					}
					bs := make([][]byte, len(words))
					for i, w := range words {
						bs[i] = []byte(w)
					}
					if _, err := sc.Write(resp.AppendCommand(nil, bs...)); err != nil {
						return
					}
				}
			}()
			go func() {
				defer cc.Close()
				_, _ = io.Copy(cc, sc)
			}()
		}
	}()
	return p
}

// commands is how many commands the proxy forwarded since the mark n, and
// of them how many were KEFIR.TX's of each subcommand (a chain by its
// first).
func (p *cmdProxy) commands(n int) (int, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	subs := map[string]int{}
	for _, w := range p.log[n:] {
		if w[0] == "KEFIR.TX" {
			subs[w[1]]++
		}
	}
	return len(p.log) - n, subs
}

func (p *cmdProxy) mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.log)
}

// A read-only Txn of 4 Gets is 4 commands on the server, as 4 Gets are:
// BEGIN travels inside the first read (KEFIR.TX BEGIN … THEN GET) and the
// ABORT inside the next transaction's first (KEFIR.TX ABORT h THEN …).
// They were commands of their own: 6 per transaction. Against a server
// without the chained form (its KEFIR.TX FEATURES an error), the client
// sends BEGIN and ABORT as before, and its transactions read and commit
// the same.
func TestTxnBeginAndEndRideInTheReads(t *testing.T) {
	addr := startNode(t, "")
	for _, old := range []bool{false, true} {
		p := newCmdProxy(t, addr, old)
		ctx, c := dialFor(t, p.ln.Addr().String(), 30*time.Second, WithPoolSize(1))
		if err := c.Put(ctx, "a", []byte("1")); err != nil {
			t.Fatal(err)
		}
		ro := func() error {
			return c.Txn(ctx, func(tx *Tx) error {
				for _, k := range []string{"a", "b", "c", "d"} {
					if _, err := tx.Get(ctx, k); err != nil && !errors.Is(err, ErrNotFound) {
						return err
					}
				}
				return nil
			}, &TxOptions{MaxAttempts: 1})
		}
		if err := ro(); err != nil { // dials the transaction connection
			t.Fatal(err)
		}
		const n = 20
		m := p.mark()
		for range n {
			if err := ro(); err != nil {
				t.Fatal(err)
			}
		}
		got, subs := p.commands(m)
		want := 4 * n
		if old {
			want = 6 * n // BEGIN, 4 GETs, ABORT (the first one's ABORT among them, the last one's not yet)
		}
		if got != want {
			t.Errorf("old server %v: %d read-only transactions of 4 Gets were %d commands (%v), want %d", old, n, got, subs, want)
		}
		// A transaction that writes, after reads; its commit is read back.
		err := c.Txn(ctx, func(tx *Tx) error {
			v, err := tx.Get(ctx, "a")
			if err != nil {
				return err
			}
			return tx.Set(ctx, "a", append(v, '1'))
		}, nil)
		if err != nil {
			t.Fatalf("old server %v: %v", old, err)
		}
		if v, err := c.Get(ctx, "a"); err != nil || string(v) != "11" {
			t.Fatalf("old server %v: a = %q, %v after the transaction", old, v, err)
		}
		c.txs.mu.Lock()
		then := c.txs.conns[0].txThen
		c.txs.mu.Unlock()
		if then == old {
			t.Fatalf("old server %v: the client took the chained form to be %v", old, then)
		}
	}
}

// TxOptions.ReadOnly: the transaction begins READONLY on a server that takes
// it (KEFIR.TX FEATURES), its reads are served, its writes return
// ErrTxReadOnly without reaching the server (nothing lands), and Txn returns
// fn's error as is, without retrying it.
func TestTxnReadOnly(t *testing.T) {
	ctx, c := dialFor(t, startNode(t, ""), 30*time.Second)
	if err := c.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	runs := 0
	err := c.Txn(ctx, func(tx *Tx) error {
		runs++
		if v, err := tx.Get(ctx, "a"); err != nil || string(v) != "1" {
			t.Errorf("Get = %q, %v", v, err)
		}
		if vs, err := tx.MGet(ctx, "a", "b"); err != nil || string(vs[0]) != "1" || vs[1] != nil {
			t.Errorf("MGet = %q, %v", vs, err)
		}
		if err := tx.Set(ctx, "a", []byte("2")); !errors.Is(err, ErrTxReadOnly) {
			t.Errorf("Set = %v, want ErrTxReadOnly", err)
		}
		if _, err := tx.Incr(ctx, "a", 1); !errors.Is(err, ErrTxReadOnly) {
			t.Errorf("Incr = %v, want ErrTxReadOnly", err)
		}
		if _, err := tx.Del(ctx, "a"); !errors.Is(err, ErrTxReadOnly) {
			t.Errorf("Del = %v, want ErrTxReadOnly", err)
		}
		if _, err := tx.SetRange(ctx, "a", 0, []byte("x")); !errors.Is(err, ErrTxReadOnly) {
			t.Errorf("SetRange = %v, want ErrTxReadOnly", err)
		}
		if _, err := tx.SetBit(ctx, "a", 0, 1); !errors.Is(err, ErrTxReadOnly) {
			t.Errorf("SetBit = %v, want ErrTxReadOnly", err)
		}
		return nil
	}, &TxOptions{ReadOnly: true})
	if err != nil || runs != 1 {
		t.Fatalf("read-only Txn = %v after %d runs", err, runs)
	}
	c.txs.mu.Lock()
	ro := c.txs.conns[0].txReadOnly
	c.txs.mu.Unlock()
	if !ro {
		t.Fatal("the client did not learn that the server takes BEGIN … READONLY")
	}
	runs = 0
	err = c.Txn(ctx, func(tx *Tx) error {
		runs++
		return tx.Set(ctx, "a", []byte("2"))
	}, &TxOptions{ReadOnly: true})
	if !errors.Is(err, ErrTxReadOnly) || runs != 1 {
		t.Fatalf("a read-only Txn that writes = %v after %d runs, want ErrTxReadOnly after 1", err, runs)
	}
	if v, err := c.Get(ctx, "a"); err != nil || string(v) != "1" {
		t.Fatalf("a = %q, %v: a refused write landed", v, err)
	}
}

// TxOptions.ReadOnly on the wire: BEGIN carries READONLY where the server
// names it in KEFIR.TX FEATURES — folded into the first read (KEFIR.TX BEGIN
// SERIALIZABLE READONLY THEN GET …) — and a transaction without the option
// never does; against a server whose FEATURES is an error (before the
// chained form and READONLY) the client sends a plain BEGIN, still reads,
// and still refuses the writes itself.
func TestTxnReadOnlyOnTheWire(t *testing.T) {
	addr := startNode(t, "")
	for _, old := range []bool{false, true} {
		p := newCmdProxy(t, addr, old)
		ctx, c := dialFor(t, p.ln.Addr().String(), 30*time.Second, WithPoolSize(1))
		if err := c.Put(ctx, "a", []byte("1")); err != nil {
			t.Fatal(err)
		}
		txn := func(ro bool) {
			t.Helper()
			err := c.Txn(ctx, func(tx *Tx) error {
				if v, err := tx.Get(ctx, "a"); err != nil || string(v) != "1" {
					return fmt.Errorf("Get = %q, %v", v, err)
				}
				if err := tx.Set(ctx, "a", []byte("2")); ro != errors.Is(err, ErrTxReadOnly) {
					return fmt.Errorf("Set = %v (read-only %v)", err, ro)
				}
				if !ro {
					return tx.Set(ctx, "a", []byte("1"))
				}
				return nil
			}, &TxOptions{ReadOnly: ro, MaxAttempts: 1})
			if err != nil {
				t.Fatalf("old server %v, read-only %v: %v", old, ro, err)
			}
		}
		for _, ro := range []bool{true, false, true} {
			m := p.mark()
			txn(ro)
			p.mu.Lock()
			log := slices.Clone(p.log[m:])
			p.mu.Unlock()
			begins, readOnly := 0, 0
			for _, w := range log {
				if len(w) < 2 || w[0] != "KEFIR.TX" {
					continue
				}
				for i, x := range w {
					if x != "BEGIN" {
						continue
					}
					begins++
					// BEGIN's words run to THEN or the command's end.
					for _, y := range w[i+1:] {
						if y == "THEN" {
							break
						}
						if y == "READONLY" {
							readOnly++
						}
					}
				}
			}
			want := 0
			if ro && !old {
				want = 1
			}
			if begins != 1 || readOnly != want {
				t.Errorf("old server %v, read-only %v: %d BEGINs, %d with READONLY, want 1 and %d: %q", old, ro, begins, readOnly, want, log)
			}
		}
		if v, err := c.Get(ctx, "a"); err != nil || string(v) != "1" {
			t.Fatalf("old server %v: a = %q, %v", old, v, err)
		}
	}
}
