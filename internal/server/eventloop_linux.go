//go:build linux

package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// The epoll event loop for plain-TCP client connections (see IOModel).
//
// Ownership is the whole concurrency story: at any moment a connection belongs
// either to its loop or to one worker the loop handed it to ("away"), and only
// its owner touches it. A loop hands a connection off to one of its long-lived
// workers over a channel (workers_linux.go; no goroutine per command) and gets it
// back through its inbox (a mutex), so every transfer is a happens-before edge.
// Away connections stay registered with epoll; if their socket becomes readable
// meanwhile, the loop stops listening to it until they return (level-triggered
// epoll would otherwise report it on every wait).
//
// Per readiness a connection gets one read(2) (the reader's budget), runs every
// complete command, and answers with one write(2). A batch with writes that must be
// durable before the reply is parked; at the end of the loop iteration all parked
// connections of a server are handed to one worker, the loop's syncer, that
// waits once for the highest position among them (one group-commit fsync for every
// client of the iteration, as Redis's appendfsync always does; with no fsync in
// flight the syncer runs it itself) and then writes each reply itself: the
// connections are away, so they are its to write to. It gives them back to the
// loop without waking it unless the loop has something to do for them (see
// syncDone); the loop takes them back when it next wakes, at the latest when their
// client's next request arrives. So a durable write costs one hand-off (loop to
// syncer) and no wake-up back, and reads on other connections do not wait for an
// fsync: the loop keeps serving, and batches parked meanwhile form the next group.
//
// Except under a write-only load. Serving on while an fsync runs means waking once
// per arriving request (with 50 clients sending one sync SET each, about one
// wake-up and context switch per request), where Redis's loop, blocked in its
// fsync, collects all of them in one epoll_wait. So once a loop has run nothing
// but durable writes for coalesceAfter iterations in a row, it waits for its
// groups' fsyncs itself, as Redis does with appendfsync always: arrivals pile up
// in the sockets and the next iteration takes a whole fsync's worth at once. The
// first command it could have answered without an fsync (a read, a PING, an
// async write) switches it back; that one command waits for at most the fsync in
// progress.

const epollSupported = true

// coalesceAfter is how many iterations in a row a loop must have run only
// durable writes before it waits for their fsyncs itself. Long enough that a
// mixed load (a read every few iterations) never coalesces; short enough that a
// write-only load does within a few fsyncs. Measured on 2 cores
// (docs/benchmarks.md, issue 3): sync SET -c 50 -P 1 40–45k req/s coalescing
// against 33–41k serving on.
const coalesceAfter = 16

// parkedBehindFsync counts durable batches parked while the loop's syncer was
// still busy with an earlier group: the loop served on during an fsync. Tests
// read it to see whether a loop coalesces.
var parkedBehindFsync atomic.Uint64

// loopSweepEvery is the longest a loop sleeps between sweeps for timeouts (a
// variable so a test can make a missed wake-up stand out). Atomic: the loops
// are per process and outlive the test that started them, so a test that
// changes it does so while other tests' loops read it.
var loopSweepEvery atomic.Int64

func init() { loopSweepEvery.Store(int64(250 * time.Millisecond)) }

var errWouldBlock = errors.New("server: socket has no more input now")

// evConn is a connection's event-loop state.
type evConn struct {
	l    *loop
	fd   int
	in   fdReader
	nc   *loopNetConn
	done chan struct{} // closed when the loop has closed the connection

	// Owned by the loop; by the away goroutine while away is set.
	away   bool
	events uint32      // epoll events currently registered
	wbuf   []byte      // replies the socket has not taken yet
	woff   int         // wbuf[woff:] is still to be written
	wdead  int64       // monoNow time: a client not reading by then is cut
	idleAt int64       // monoNow time: closed as idle if no command by then; 0: never
	broken bool        // a panic left the connection in an unknown state: close at once
	inLoop bool        // registered in the loop's table
	killed atomic.Bool // Shutdown's deadline passed: close as soon as owned
	// muted is set by the loop before it stops watching an away connection's
	// socket (it became readable while away): whoever gives the connection back
	// must then wake the loop, which re-arms it. See handle and syncDone.
	muted atomic.Bool
}

// fdReader is the resp.Reader's source on a loop connection. It does at most
// budget read system calls (the loop grants one per readiness) and reports
// errWouldBlock instead of waiting, so that parsing stops at the end of what
// arrived.
type fdReader struct {
	fd     int
	budget int
}

func (r *fdReader) Read(p []byte) (int, error) {
	if r.budget <= 0 || len(p) == 0 {
		return 0, errWouldBlock
	}
	r.budget--
	for {
		n, err := sockRead(r.fd, p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return 0, errWouldBlock
		case err != nil:
			return 0, fmt.Errorf("read: %w", os.NewSyscallError("read", err))
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// send writes b without blocking; the rest is queued for the loop, which writes it
// when the socket is writable and reads nothing more from this client meanwhile.
func (e *evConn) send(b []byte) error {
	if e.woff < len(e.wbuf) { // keep order behind what is already queued
		e.wbuf = append(e.wbuf, b...)
		return nil
	}
	n, err := writeFD(e.fd, b)
	if err != nil {
		return err
	}
	if n < len(b) {
		e.wbuf = append(e.wbuf[:0], b[n:]...)
		e.woff = 0
		e.wdead = monoNow() + int64(writeTimeout)
	}
	return nil
}

// pendingOut reports whether replies wait for the socket.
func (e *evConn) pendingOut() bool { return e.woff < len(e.wbuf) }

// writeFD writes b until done or the socket is full. It and fdReader go through
// sockRead and sockWrite (sockio_linux.go).
func writeFD(fd int, b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, err := sockWrite(fd, b[done:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return done, nil
		case err != nil:
			return done, fmt.Errorf("write: %w", os.NewSyscallError("write", err))
		}
		done += n
	}
	return done, nil
}

// loopNetConn stands in for the net.Conn of a loop connection: server.go's
// Shutdown sets an immediate read deadline to make connections drain, and closes
// them when its own deadline passes; both become requests to the loop. Before the
// loop adopts the socket (serveLoop), they act on the original connection.
type loopNetConn struct {
	mu      sync.Mutex
	tc      *net.TCPConn // until adopted
	c       *conn
	adopted bool
	closed  bool
	local   net.Addr
	remote  net.Addr
}

var errLoopConn = errors.New("server: a loop connection is read and written by its event loop")

func (w *loopNetConn) Read([]byte) (int, error)  { return 0, errLoopConn }
func (w *loopNetConn) Write([]byte) (int, error) { return 0, errLoopConn }
func (w *loopNetConn) LocalAddr() net.Addr       { return w.local }
func (w *loopNetConn) RemoteAddr() net.Addr      { return w.remote }

func (w *loopNetConn) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if !w.adopted {
		return w.tc.Close()
	}
	w.c.ev.killed.Store(true)
	w.c.ev.l.poke()
	return nil
}

func (w *loopNetConn) SetDeadline(t time.Time) error { return w.SetReadDeadline(t) }

// SetReadDeadline is how Shutdown wakes connections so they see it draining; a
// loop re-checks its connections.
func (w *loopNetConn) SetReadDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.adopted {
		if w.closed {
			return net.ErrClosed
		}
		return w.tc.SetReadDeadline(t)
	}
	w.c.ev.l.poke()
	return nil
}

func (w *loopNetConn) SetWriteDeadline(time.Time) error { return nil }

// loopConn returns the loop state for nc if an event loop should serve it.
func (s *Server) loopConn(nc net.Conn) *evConn {
	tc, ok := nc.(*net.TCPConn)
	if ioModel.Load() != IOEpoll || !ok {
		return nil
	}
	l, err := pickLoop()
	if err != nil {
		s.log.Warn("event loop unavailable; serving the connection with a goroutine", "err", err)
		return nil
	}
	e := &evConn{l: l, done: make(chan struct{})}
	e.nc = &loopNetConn{tc: tc, local: tc.LocalAddr(), remote: tc.RemoteAddr()}
	return e
}

// serveLoop moves the socket into the loop and waits until the loop has closed it.
// The connection's goroutine stays parked here so that server.go's accounting
// (connection count, WaitGroup) holds exactly as for a goroutine connection.
func (c *conn) serveLoop() {
	e, w := c.ev, c.ev.nc
	w.mu.Lock()
	w.c = c
	if w.closed {
		w.mu.Unlock()
		return
	}
	fd, err := adopt(w.tc)
	if err != nil {
		w.mu.Unlock()
		c.log.Warn("cannot move connection to the event loop; closing it", "err", err)
		w.tc.Close()
		return
	}
	e.fd, e.in.fd = fd, fd
	w.adopted, w.tc = true, nil
	w.mu.Unlock()
	e.l.giveBack(c, true)
	<-e.done
}

// adopt takes the socket out of Go's netpoller: a duplicate descriptor (sharing
// the socket and its non-blocking mode) survives closing the original, which
// deregisters it from the runtime's epoll.
func adopt(tc *net.TCPConn) (int, error) {
	raw, err := tc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("dup socket: %w", derr)
	}
	if err := tc.Close(); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("close original socket: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("non-blocking socket: %w", err)
	}
	return fd, nil
}

var (
	loopsOnce sync.Once
	loops     []*loop
	loopsErr  error
	loopNext  atomic.Uint32
)

// pickLoop returns a loop for a new connection, starting the process's loops on
// first use. Loops live as long as the process, like the runtime's netpoller; an
// idle loop sleeps in epoll_wait with no timeout.
func pickLoop() (*loop, error) {
	loopsOnce.Do(func() {
		n := loopCount()
		addLoopProcs(n)
		for range n {
			l, err := newLoop()
			if err != nil {
				loopsErr = err
				return
			}
			loops = append(loops, l)
			go l.run()
		}
	})
	if loopsErr != nil {
		return nil, loopsErr
	}
	return loops[int(loopNext.Add(1))%len(loops)], nil
}

// addLoopProcs gives the Go scheduler two more processors (Ps) per loop, unless
// GOMAXPROCS is set explicitly. A loop blocks in epoll_wait, and its syncer in
// fdatasync, through plain system calls that keep their P (the runtime's own
// netpoller parks without one); while both of a 2-core machine's Ps sit in them, a
// goroutine they make runnable, such as the next group's syncer, waits until
// sysmon retakes a P, 20 µs to 10 ms later. Measured on 2 cores, sync SET -c 50
// (docs/benchmarks.md): 34–38k req/s with GOMAXPROCS=2, 42–46k with 3 or 4. The
// extra Ps are not extra CPU use: they only run goroutines while the others are
// blocked in those system calls.
func addLoopProcs(n int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 2*n)
}

// loop is one event loop.
type loop struct {
	epfd, evfd int
	// gapAvg: moving average of how long wait waited for events (ns; wait).
	gapAvg int64

	mu      sync.Mutex
	inbox   []inboxItem // connections arriving or coming back from a goroutine
	inboxN  atomic.Int32
	woken   atomic.Bool // an eventfd write is pending
	sweepRq atomic.Bool // Shutdown or a hard close asked for a sweep

	// pool runs what must wait off the loop (workers_linux.go).
	pool *workers

	// The syncer: batches queued for a durability wait, and whether a worker
	// is waiting for some already.
	syncMu   sync.Mutex
	syncQ    []*conn
	syncBusy bool

	// Owned by the loop goroutine.
	byFD      []*conn
	n         int
	events    []unix.EpollEvent
	parked    []*conn // this iteration's batches waiting for durability
	fast      bool    // this iteration answered a command without an fsync
	writeOnly int     // iterations in a row that parked batches and were not fast
	minIdle   time.Duration
	nextSweep int64
	drained   []inboxItem
	// now (monoNow) is read once per iteration, right after epoll_wait
	// returns: the start of every batch the iteration runs (its commands were
	// all waiting by then), the base of idle deadlines and of the next wait's
	// timeout. Clock reads per request were 1.4 % of an unpipelined GET's
	// server CPU (docs/benchmarks.md, issue 3).
	now int64
}

type inboxItem struct {
	c   *conn
	new bool
}

func newLoop() (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	return &loop{epfd: epfd, evfd: evfd, events: make([]unix.EpollEvent, 256), pool: newWorkers()}, nil
}

// poke makes the loop sweep its connections soon (draining, hard closes).
func (l *loop) poke() {
	l.sweepRq.Store(true)
	l.wake()
}

func (l *loop) wake() {
	if l.woken.CompareAndSwap(false, true) {
		var one = [8]byte{1}
		_, _ = unix.Write(l.evfd, one[:])
	}
}

// giveBack hands c to the loop: a new connection, or one a goroutine is done with.
// The caller must not touch c afterwards.
func (l *loop) giveBack(c *conn, isNew bool) {
	l.mu.Lock()
	l.inbox = append(l.inbox, inboxItem{c: c, new: isNew})
	l.mu.Unlock()
	l.inboxN.Add(1)
	l.wake()
}

// giveBackQuiet is giveBack without the wake-up: the caller wakes the loop if it
// must act at once (syncDone).
func (l *loop) giveBackQuiet(c *conn) {
	l.mu.Lock()
	l.inbox = append(l.inbox, inboxItem{c: c})
	l.mu.Unlock()
	l.inboxN.Add(1)
}

func (l *loop) run() {
	for {
		n, err := l.wait()
		l.now = monoNow()
		if err != nil && err != unix.EINTR {
			panic(fmt.Sprintf("server: epoll_wait: %v", err)) // EBADF/EINVAL: a bug
		}
		l.drainInbox()
		for i := 0; i < n; i++ {
			ev := &l.events[i]
			fd := int(ev.Fd)
			if fd == l.evfd {
				var b [8]byte
				_, _ = unix.Read(l.evfd, b[:])
				l.woken.Store(false)
				l.drainInbox() // after clearing woken: nothing queued is missed
				continue
			}
			if fd < len(l.byFD) && l.byFD[fd] != nil {
				l.handle(l.byFD[fd], ev.Events)
			}
		}
		switch {
		case l.fast:
			l.writeOnly, l.fast = 0, false
		case len(l.parked) > 0:
			l.writeOnly++
		}
		l.releaseParked()
		if l.sweepRq.Swap(false) || l.now >= l.nextSweep {
			l.sweep(l.now)
		}
	}
}

// loopSpin bounds how long a loop polls without blocking before it sleeps in
// epoll_wait (Config.LoopSpin; 0 disables). A client that waits for each reply
// (redis-benchmark, a closed-loop caller) sends its next command a few
// microseconds after it got the last reply; a loop asleep by then must be
// woken, and the wake-up (and the context switch) is charged to the sender.
// Measured (docs/benchmarks.md, sessions 8 and 9): redis-benchmark GET -c 50
// -P 16 spends 0.79–0.85 µs of its own CPU per request against a loop that
// sleeps, 0.66–0.68 with 50 µs of polling, 0.69–0.72 against Redis. The loop
// polls only while it is hot: when the gaps it waited before its last events
// were short (gapAvg < loopSpin/2), so a lightly loaded node does not burn CPU
// polling. Process-wide, like the loops: the last server created sets it.
var loopSpin atomic.Int64

func setLoopSpin(d time.Duration) { loopSpin.Store(int64(max(d, 0))) }

// wait is epoll_wait: while the loop is hot it first polls for up to loopSpin
// before it blocks; it keeps gapAvg, a moving average of how long it waited
// for events.
func (l *loop) wait() (int, error) {
	start := monoNow()
	if spin := loopSpin.Load(); spin > 0 && l.n > 0 && l.gapAvg < spin/2 {
		end := start + spin
		for {
			n, err := unix.EpollWait(l.epfd, l.events, 0)
			if n != 0 || (err != nil && err != unix.EINTR) {
				l.noteGap(monoNow() - start)
				return n, err
			}
			if monoNow() >= end {
				break
			}
		}
	}
	n, err := unix.EpollWait(l.epfd, l.events, l.waitMillis())
	if n > 0 {
		l.noteGap(monoNow() - start)
	}
	return n, err
}

// noteGap folds one wait into gapAvg (1/8 weight), capped so that one long idle
// period is forgotten after a few quick waits.
func (l *loop) noteGap(d int64) {
	d = min(d, 8*loopSpin.Load())
	l.gapAvg += (d - l.gapAvg) / 8
}

// waitMillis is epoll_wait's timeout: until the next sweep for timeouts, or no
// timeout at all when the loop has no connections.
func (l *loop) waitMillis() int {
	if l.n == 0 {
		return -1
	}
	d := (l.nextSweep - l.now) / int64(time.Millisecond)
	return int(max(d, 0)) + 1
}

// sweepEvery is how often a loop checks idle and write timeouts: a fraction of
// the shortest idle timeout, so that idle connections close within 1/8 past it.
func (l *loop) sweepEvery() time.Duration {
	d := time.Duration(loopSweepEvery.Load())
	if l.minIdle > 0 {
		d = min(d, max(l.minIdle/8, 5*time.Millisecond))
	}
	return d
}

func (l *loop) drainInbox() {
	if l.inboxN.Load() == 0 {
		return
	}
	l.mu.Lock()
	l.drained, l.inbox = l.inbox, l.drained[:0]
	l.inboxN.Store(0)
	l.mu.Unlock()
	for _, it := range l.drained {
		if it.new {
			l.add(it.c)
		} else {
			l.returned(it.c)
		}
	}
	clear(l.drained)
}

func (l *loop) add(c *conn) {
	e := c.ev
	for e.fd >= len(l.byFD) {
		l.byFD = append(l.byFD, make([]*conn, len(l.byFD)+64)...)
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, e.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(e.fd)}); err != nil {
		c.log.Warn("epoll_ctl add failed; closing connection", "err", err)
		unix.Close(e.fd)
		close(e.done)
		return
	}
	l.byFD[e.fd] = c
	l.n++
	e.inLoop, e.events = true, unix.EPOLLIN
	if idle := c.srv.cfg.IdleTimeout; idle > 0 {
		if l.minIdle == 0 || idle < l.minIdle {
			l.minIdle = idle
			l.nextSweep = 0
		}
		e.idleAt = l.now + int64(idle)
	}
	if c.srv.draining() {
		l.close(c)
	}
}

// setEvents registers the events c waits for, if they changed; false if the
// socket cannot be watched any more (the caller closes it). Only the loop calls
// it, and events is the loop's own field even while c is away.
func (l *loop) setEvents(c *conn, ev uint32) bool {
	e := c.ev
	if e.events == ev {
		return true
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, e.fd, &unix.EpollEvent{Events: ev, Fd: int32(e.fd)}); err != nil {
		c.log.Debug("epoll_ctl mod failed; closing connection", "err", err)
		return false
	}
	e.events = ev
	return true
}

// handle serves one readiness report for a connection.
func (l *loop) handle(c *conn, ev uint32) {
	e := c.ev
	if e.away {
		// Its goroutine may have finished after this wait's drain. muted is
		// set before the drain: a syncer that gives c back after the drain
		// sees it and wakes the loop (the inbox mutex orders the two).
		e.muted.Store(true)
		l.drainInbox()
		if !e.inLoop {
			// The drain took c back and closed it (killed, broken, closing
			// or draining): its reader and descriptor are released.
			return
		}
		if e.away {
			// A failure here resurfaces when it returns and is re-armed.
			_ = l.setEvents(c, 0)
			return
		}
	}
	defer l.recoverPanic(c)
	if e.pendingOut() {
		if !l.flushOut(c) {
			return
		}
		if !e.inLoop || e.away {
			return
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR|unix.EPOLLRDHUP) != 0 {
		e.in.budget = 1
	}
	l.process(c)
}

// recoverPanic closes a connection whose command panicked (a bug) and keeps the
// loop, and every other connection on it, running.
func (l *loop) recoverPanic(c *conn) {
	if r := recover(); r != nil {
		c.log.Error("panic serving connection (bug)", "panic", r, "stack", string(debug.Stack()))
		c.srv.panics.Add(1)
		if c.ev.inLoop && !c.ev.away {
			l.close(c)
		}
	}
}

// process runs the complete commands c has buffered (after at most the one read
// its budget allows) and ends the batch.
func (l *loop) process(c *conn) {
	e := c.ev
	for !c.closing {
		args, ok, err := c.nextCommand()
		if err != nil {
			l.readFailed(c, err)
			return
		}
		if !ok {
			break
		}
		// Looked up once for readMayWait, readInline and dispatchSpec: a
		// lookup is ~90 instructions, a tenth of a pipelined GET's own.
		spec, known := command.Lookup(args[0])
		if c.srv.grp != nil || c.readMayWait(spec, known, args) {
			// A replica's reads and writes wait for the VR driver or a forward
			// to the leader, and a read may wait for an fsync: the rest of the
			// pipeline runs on a worker — unless the command is a read a
			// leader can serve without waiting (readInline).
			if c.srv.grp == nil || !c.readInline(spec, known, args) {
				l.handOff(c, args)
				return
			}
		} else {
			c.dispatchSpec(spec, known, args)
		}
		c.batched++
		if c.batchFull() {
			c.flushWrites()
			if !c.pending.IsZero() {
				l.handOff(c, nil)
				return
			}
			if !l.sendBatch(c) {
				return
			}
			if e.pendingOut() {
				// The client must read before more of its commands run.
				if !l.setEvents(c, unix.EPOLLOUT) {
					l.close(c)
				}
				return
			}
		}
	}
	c.flushWrites()
	if !c.pending.IsZero() && !(mutation.On && mut.loopWaitsInline.Load()) {
		e.away = true
		l.parked = append(l.parked, c)
		return
	}
	if !c.pending.IsZero() {
		if err := c.release(); err != nil { // the mutation: the loop waits
			l.close(c)
			return
		}
		l.afterBatch(c)
		return
	}
	if l.sendBatch(c) {
		l.afterBatch(c)
	}
}

// nextCommand reads c's next complete command for the loop or its away
// goroutine: ok is false, with no error, when there is none for now (nothing
// buffered and no read budget left, or the read would block).
func (c *conn) nextCommand() (args [][]byte, ok bool, err error) {
	if c.rd.Buffered() == 0 && c.ev.in.budget == 0 {
		return nil, false, nil
	}
	args, err = c.rd.ReadCommand(c.args[:0])
	c.args = args
	for resp.IsTooLarge(err) {
		// Answered in its place; the next command may be buffered already.
		c.refuseTooLarge(err)
		args, err = c.rd.ReadCommand(c.args[:0])
		c.args = args
	}
	if err != nil {
		if errors.Is(err, errWouldBlock) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return args, true, nil
}

// batchFull reports whether c's batch has run enough commands, or buffered
// enough replies, that it must end before the next command.
func (c *conn) batchFull() bool {
	return c.batched >= maxBatch || len(c.out.b)+c.w.Buffered() > 1<<20
}

// readMayWait reports whether args is a read that may wait for an fsync: the
// shard makes what a read reports durable first, which takes an fsync only while
// some sync or cad write is not durable yet. The connection's own queued writes
// are applied first (as the read would), so that they count.
func (c *conn) readMayWait(spec *command.Spec, ok bool, args [][]byte) bool {
	if len(c.writes) == 0 && c.front.Load() <= uint64(c.srv.db.DurablePos()) {
		return false
	}
	if ok && spec.Has(command.Wrapper) {
		spec, ok = wrappedSpec(args)
	}
	if !ok || spec.Class != command.Read || mutation.On && mut.loopReadsInline.Load() {
		return false
	}
	c.flushWrites()
	return c.front.Load() > uint64(c.srv.db.DurablePos())
}

// readInline runs args on the loop if it is a read the replica serves
// without waiting (shard.Replica.TryRead; a replica group's leader under a running lease,
// nothing it returns waiting to become durable), or a KEFIR.TX command that
// never waits (txInline: a snapshot read, ABORT, PREPARE, a read-only COMMIT). False, with nothing done,
// if the command must run on a goroutine. Measured on 3 replicas
// (docs/benchmarks.md, session 11): a leader's read otherwise costs a
// goroutine, a round trip to the VR driver and two wake-ups.
func (c *conn) readInline(spec *command.Spec, ok bool, args [][]byte) bool {
	if len(c.writes) > 0 || len(c.syncKeys) > 0 || !c.pending.IsZero() {
		return false
	}
	if c.txInline(args) { // a transaction's snapshot read: no lease needed (itx.go)
		c.srv.inlineReads.Add(1)
		return true
	}
	if !c.srv.reads.Inline {
		return false
	}
	if ok && spec.Has(command.Wrapper) {
		spec, ok = wrappedSpec(args)
	}
	if !ok || spec.Class != command.Read {
		return false
	}
	if !c.dispatchInline(args) {
		return false
	}
	c.srv.inlineReads.Add(1)
	return true
}

// wrappedSpec is the command KEFIR.CALL args carries, found by skipping its
// options as call does (REQID takes two values, REDIRECT none, the others one). A
// wrapper that fails to parse counts as a read, so it leaves the loop: only
// precision is lost, never the loop's promptness.
func wrappedSpec(args [][]byte) (*command.Spec, bool) {
	for i := 1; i < len(args); {
		opt := args[i]
		switch {
		case bytes.EqualFold(opt, []byte("CMD")):
			if i+1 < len(args) {
				if spec, ok := command.Lookup(args[i+1]); ok && !spec.Has(command.Wrapper) {
					return spec, true
				}
			}
			return readSpec, true
		case bytes.EqualFold(opt, []byte("REQID")):
			i += 3
		case bytes.EqualFold(opt, []byte("REDIRECT")):
			i++
		default:
			i += 2
		}
	}
	return readSpec, true
}

// readSpec stands for a command that may be a read.
var readSpec = &command.Spec{Name: "KEFIR.CALL", Class: command.Read}

// sendBatch releases the batch's replies; false if that closed the connection.
func (l *loop) sendBatch(c *conn) bool {
	if c.batched > 0 {
		l.fast = true
	}
	if err := c.send(); err != nil {
		c.log.Debug("write failed", "err", err)
		l.close(c)
		return false
	}
	if c.ev.broken {
		l.close(c)
		return false
	}
	return true
}

// afterBatch decides what c waits for once its batch's replies are out (or
// queued): the client's next commands, the socket draining, or its end.
func (l *loop) afterBatch(c *conn) {
	e := c.ev
	switch {
	case e.broken || e.killed.Load():
		l.close(c)
	case e.pendingOut():
		if !l.setEvents(c, unix.EPOLLOUT) {
			l.close(c)
		}
	case c.closing:
		l.close(c)
	case c.srv.draining() && c.rd.Buffered() == 0:
		// Like the goroutine path, a draining connection stops between
		// commands; one half-received is cut by the sweep.
		c.log.Debug("closing connection: shutting down")
		l.close(c)
	default:
		if c.rd.Buffered() == 0 {
			if idle := c.srv.cfg.IdleTimeout; idle > 0 {
				e.idleAt = l.now + int64(idle)
			}
		}
		if !l.setEvents(c, unix.EPOLLIN) {
			l.close(c)
		}
	}
}

// flushOut writes queued replies; true if none are left and c is still open.
func (l *loop) flushOut(c *conn) bool {
	e := c.ev
	n, err := writeFD(e.fd, e.wbuf[e.woff:])
	if err != nil {
		c.log.Debug("write failed", "err", err)
		l.close(c)
		return false
	}
	e.woff += n
	if e.pendingOut() {
		if !l.setEvents(c, unix.EPOLLOUT) {
			l.close(c)
		}
		return false
	}
	if cap(e.wbuf) > 256<<10 {
		e.wbuf = nil
	} else {
		e.wbuf = e.wbuf[:0]
	}
	e.woff = 0
	// Commands that waited behind the replies run now (with no new read: their
	// bytes are already buffered), then c listens for input again.
	l.afterBatch(c)
	return e.inLoop && !c.closing
}

// readFailed ends a connection whose input ended or broke, like the goroutine
// path: the batch so far is released, a protocol error is answered.
func (l *loop) readFailed(c *conn, err error) {
	c.flushWrites()
	if !c.pending.IsZero() {
		// Releasing waits for durability: finish on a goroutine.
		c.ev.away = true
		l.pool.submit(job{kind: jobReadFailed, l: l, c: c, err: err})
		return
	}
	c.readFailed(err)
	c.closing = true
	l.afterBatch(c)
}

// finishReadFailed is readFailed's end on a worker: it waits for the batch's
// durability, answers, and gives c back to be closed.
func (l *loop) finishReadFailed(c *conn, err error) {
	defer l.recoverAway(c)
	c.readFailed(err)
	c.closing = true
	l.giveBack(c, false)
}

// handOff gives c to one of the loop's workers, which runs the rest of its
// pipeline (first, then what is buffered), waiting where it must, and gives it
// back.
func (l *loop) handOff(c *conn, first [][]byte) {
	if first != nil {
		l.fast = true // a read that may wait, or a replica's command
	}
	c.ev.away = true
	l.pool.submit(job{kind: jobPipeline, l: l, c: c, first: first})
}

// mayBlock reports whether c's command may wait (a held map poll): on its own
// goroutine or a worker's, never on its event loop's, which serves others.
func (c *conn) mayBlock() bool { return c.ev == nil || c.ev.away }

func (l *loop) runAway(c *conn, first [][]byte) {
	defer l.recoverAway(c)
	e := c.ev
	if first != nil {
		c.dispatch(first)
		c.batched++
	} else {
		// Handed off mid-pipeline because the batch so far waits for an fsync.
		if err := c.release(); err != nil {
			c.closing = true
		}
		if c.closing || e.pendingOut() {
			l.giveBack(c, false)
			return
		}
	}
	for !c.closing {
		args, ok, err := c.nextCommand()
		if err != nil {
			c.readFailed(err)
			c.closing = true
			l.giveBack(c, false)
			return
		}
		if !ok {
			break
		}
		c.dispatch(args)
		c.batched++
		if c.batchFull() {
			if err := c.release(); err != nil {
				c.closing = true
				break
			}
			if e.pendingOut() {
				l.giveBack(c, false) // the loop resumes once the client reads
				return
			}
		}
	}
	if err := c.release(); err != nil {
		c.closing = true
	}
	l.giveBack(c, false)
}

// recoverAway handles a panic on an away goroutine: the connection goes back to
// its loop, which closes it.
func (l *loop) recoverAway(c *conn) {
	if r := recover(); r != nil {
		c.log.Error("panic serving connection (bug)", "panic", r, "stack", string(debug.Stack()))
		c.srv.panics.Add(1)
		c.ev.broken = true
		l.giveBack(c, false)
	}
}

// returned takes back a connection a goroutine is done with.
func (l *loop) returned(c *conn) {
	e := c.ev
	if !e.away {
		panic("server: connection returned to its loop while the loop owned it")
	}
	e.away = false
	e.muted.Store(false)
	defer l.recoverPanic(c)
	if e.broken {
		l.close(c)
		return
	}
	if e.pendingOut() {
		if !l.setEvents(c, unix.EPOLLOUT) {
			l.close(c)
		}
		return
	}
	if c.closing {
		l.close(c)
		return
	}
	if c.rd.Buffered() > 0 && c.srv.grp == nil {
		// Stopped mid-pipeline (its replies had to drain): carry on.
		l.process(c)
		return
	}
	l.afterBatch(c)
}

// releaseParked queues this iteration's durable-write batches for the loop's
// syncer, starting it if it is idle. The syncer waits once for everything queued
// (one group commit), writes the replies, and meanwhile the loop keeps serving and
// queueing: batches that arrive during an fsync and the reply writes form the
// next group.
//
// The next group's fsync does not start before this group's replies are written:
// tried (a new syncer started right after the fsync), it made groups smaller and
// sync SET -P 1 slower (37–39k against 45k req/s), because fewer requests had
// arrived by then.
func (l *loop) releaseParked() {
	if len(l.parked) == 0 {
		return
	}
	if l.coalescing() {
		// Wait here, as Redis does: what arrives meanwhile is the next
		// iteration's group, read in one epoll_wait. If an earlier group is
		// still with the syncer, storage orders the two fsyncs.
		l.waitGroup(l.parked, true)
		clear(l.parked)
		l.parked = l.parked[:0]
		l.drainInbox()
		return
	}
	l.syncMu.Lock()
	l.syncQ = append(l.syncQ, l.parked...)
	start := !l.syncBusy
	l.syncBusy = true
	l.syncMu.Unlock()
	clear(l.parked)
	l.parked = l.parked[:0]
	if start {
		l.pool.submit(job{kind: jobSync, l: l})
	} else {
		parkedBehindFsync.Add(1)
	}
}

// coalescing reports whether the loop waits for this iteration's group itself:
// it has run only durable writes for coalesceAfter iterations.
func (l *loop) coalescing() bool {
	if mutation.On && mut.loopCoalescesAlways.Load() {
		return true
	}
	return l.writeOnly >= coalesceAfter && !(mutation.On && mut.loopNeverCoalesces.Load())
}

func (l *loop) syncer() {
	var group []*conn
	for {
		l.syncMu.Lock()
		group, l.syncQ = l.syncQ, group[:0]
		if len(group) == 0 {
			l.syncBusy = false
			l.syncMu.Unlock()
			return
		}
		l.syncMu.Unlock()
		l.waitGroup(group, false)
		clear(group)
	}
}

// waitGroup waits for the durability of group's batches, one wait per server,
// writes their replies and gives the connections back to the loop (syncDone).
// The wait runs the fsync on this goroutine when none is in flight (storage's
// Sync leads it itself), so the cycle from a group's last write to its replies
// has no hand-off between goroutines.
//
// inLoop is true when the loop itself waits (coalescing): it takes the
// connections back right after, so none needs a wake-up.
func (l *loop) waitGroup(group []*conn, inLoop bool) {
	for len(group) > 0 {
		srv := group[0].srv
		var p shard.Pending
		for _, c := range group {
			if c.srv == srv {
				p = p.Merge(c.pending)
			}
		}
		t := time.Now()
		err := srv.shard.Wait(context.Background(), p)
		d := time.Since(t)
		rest := group[:0] // another server in this process (tests)
		for _, c := range group {
			if c.srv != srv {
				rest = append(rest, c)
				continue
			}
			l.syncDone(c, err, d, inLoop)
		}
		clear(group[len(rest):])
		group = rest
	}
}

// syncDone ends the durability wait of c's batch (err after d): it sends the
// replies, or on failure none (waited closes the connection), and gives c back to
// the loop. The loop is woken only if it must act on c now: close it, write what
// the socket did not take, run commands already buffered, or re-arm a socket it
// muted. Otherwise c waits in the inbox, still registered for input, and the loop
// takes it back on its next wake-up, at the latest when c's client sends again.
func (l *loop) syncDone(c *conn, err error, d time.Duration, inLoop bool) {
	e := c.ev
	wake := true
	func() {
		defer func() {
			if r := recover(); r != nil {
				c.log.Error("panic serving connection (bug)", "panic", r, "stack", string(debug.Stack()))
				c.srv.panics.Add(1)
				e.broken = true
			}
		}()
		if c.waited(err, d) != nil {
			return
		}
		if err := c.send(); err != nil {
			c.log.Debug("write failed", "err", err)
			c.closing = true
			return
		}
		wake = e.broken || c.closing || e.pendingOut() || e.killed.Load() ||
			c.srv.draining() || c.rd.Buffered() > 0
	}()
	l.giveBackQuiet(c)
	// After the push: if the loop muted c before draining its inbox, this
	// load sees it (see handle).
	if (wake || e.muted.Load()) && !inLoop && !(mutation.On && mut.syncerSkipsWake.Load()) {
		l.wake()
	}
}

// sweep closes connections past their idle or write timeout, killed ones, and
// idle ones of a draining server.
func (l *loop) sweep(now int64) {
	l.nextSweep = now + int64(l.sweepEvery())
	for _, c := range l.byFD {
		if c == nil || c.ev.away {
			continue
		}
		e := c.ev
		switch {
		case e.killed.Load():
			l.close(c)
		case e.pendingOut():
			if now > e.wdead {
				c.log.Info("closing connection: client does not read its replies", "write_timeout", writeTimeout)
				l.close(c)
			} else if c.srv.draining() && !c.closing {
				c.closing = true // close once the replies are out
			}
		case c.srv.draining():
			c.log.Debug("closing connection: shutting down")
			l.close(c)
		case e.idleAt != 0 && now > e.idleAt:
			c.log.Info("closing idle connection", "idle_timeout", c.srv.cfg.IdleTimeout)
			l.close(c)
		}
	}
}

// close closes the socket and lets the connection's goroutine return.
func (l *loop) close(c *conn) {
	e := c.ev
	if !e.inLoop {
		return
	}
	e.inLoop = false
	l.byFD[e.fd] = nil
	l.n--
	// Closing the only descriptor also removes it from the epoll set.
	unix.Close(e.fd)
	e.nc.mu.Lock()
	e.nc.closed = true
	e.nc.mu.Unlock()
	close(e.done)
}

// clock is the start time of a batch c runs now: the loop iteration's clock when
// the loop runs it, a fresh reading on an away goroutine (which alone owns c
// then, so reading away is safe; the loop's clock is not).
func (c *conn) clock() time.Time {
	if e := c.ev; e != nil && !e.away {
		return loopEpoch.Add(time.Duration(e.l.now))
	}
	return time.Now()
}

// loopEpoch anchors the loops' clock, monoNow.
var loopEpoch = time.Now()

// monoNow is the loops' clock: nanoseconds since loopEpoch on the monotonic
// clock. One vDSO call (time.Now makes two), and deadlines kept in it do not
// move when the wall clock is stepped.
func monoNow() int64 { return int64(time.Since(loopEpoch)) }
