package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// maxBatch bounds how many pipelined commands a connection executes before it
// releases their replies, so one client cannot hold its replies (and memory)
// indefinitely.
const maxBatch = 1024

// writeTimeout bounds how long a reply write may block on a client that does not
// read.
const writeTimeout = time.Minute

// outBuf collects a batch's replies; the resp.Writer flushes into it, and the
// connection writes it to the socket only once the batch's writes are durable.
type outBuf struct {
	b     []byte
	small []byte  // the connection's own buffer (at most smallOut), while b is a pooled one
	big   *[]byte // bigOuts' box for b while b is a pooled buffer (nil: b is the connection's)
}

func (o *outBuf) Write(p []byte) (int, error) {
	if n := len(o.b) + len(p); n > cap(o.b) && n > smallOut {
		o.grow(n)
	}
	o.b = append(o.b, p...) // below smallOut: grown by append, so a connection of small replies keeps a small buffer
	return len(p), nil
}

// Output past smallOut bytes (a batch holding a scan reply: 50 KB for YCSB-E's ranges
// of 1 KB values) goes to a buffer of at least bigOut bytes from bigOuts, returned there
// once written. Growing a fresh buffer by doubling for every such batch was ~8 % of a
// scan-heavy server's CPU; with the pool taken only past 256 KiB the doubling below it
// (4, 8, … 128 KiB, each a fresh allocation) was still half the bytes the server
// allocated under YCSB-E (docs/design/scans.md). A connection keeps its own buffer of
// at most smallOut bytes between batches (grown by append: one that only ever sends
// small replies keeps a small one, as connections come and go by the thousand), and
// the pool's buffers are reclaimed by the GC when nothing needs them.
const (
	smallOut = 16 << 10
	bigOut   = 256 << 10
)

var bigOuts sync.Pool // of *[]byte, each of capacity >= bigOut

// grow moves o's bytes to a pooled buffer of at least n bytes (one from bigOuts if it
// is large enough, else a new one of at least bigOut). A pooled buffer o outgrows goes
// back to the pool.
func (o *outBuf) grow(n int) {
	bp, _ := bigOuts.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	if cap(*bp) < n {
		*bp = make([]byte, 0, max(n, 2*cap(o.b), bigOut)) // the pool's smaller one is left to the GC
	}
	nb := append((*bp)[:0], o.b...)
	if o.big != nil {
		*o.big = o.b[:0]
		bigOuts.Put(o.big)
	} else {
		o.small = o.b[:0]
	}
	o.b, o.big = nb, bp
}

// release empties o, handing a pooled buffer back to bigOuts: a connection does not
// pin a big buffer after one big reply.
func (o *outBuf) release() {
	if o.big != nil {
		*o.big = o.b[:0]
		bigOuts.Put(o.big)
		o.b, o.small, o.big = o.small, nil, nil
		return
	}
	o.b = o.b[:0]
}

// replyShape says how a queued write's kv.Result is spelled.
type replyShape uint8

const (
	shapeAsIs  replyShape = iota
	shapeSetNX            // SETNX: OK → 1, nil → 0
	// shapeExec3: an EXEC on a RESP3 connection with elements that RESP3
	// spells otherwise (HGETALL's map: conn.exec3, tx.go's resp3Shapes).
	shapeExec3
)

// queued is the bookkeeping of one write waiting in the connection's batch.
type queued struct {
	cmd     int // command ID, for metrics
	shape   replyShape
	session bool          // KEFIR.CALL SESSION: reply [token, reply]
	sess    shard.Session // the per-call session, when session is set
	// Replicated mode only: the command as received (copied into the batch
	// arena), to forward it if this node turns out not to lead, and whether
	// the caller asked for -MOVED instead.
	raw      [][]byte
	redirect bool
}

// conn is one client connection. Its goroutine owns all of it.
type conn struct {
	itx  *itxConn // its interactive transactions (itx.go)
	srv  *Server
	nc   net.Conn
	id   int64
	addr string
	log  *slog.Logger
	name string

	rd  *resp.Reader
	w   *resp.Writer
	out outBuf

	authed bool
	// authFails counts this connection's failed AUTH attempts (checkAuth).
	authFails int
	// multi: the connection sent MULTI and has not yet sent EXEC or DISCARD;
	// every command but txControl's is queued in tx meanwhile (tx.go).
	multi bool
	tx    txState
	// exec3 are the element shapes of the batch's EXECs of shape
	// shapeExec3, in order; execShapes those of the EXEC being answered
	// (nil outside one: every reply as the state machine spelled it).
	exec3      [][]resp3Shape
	execShapes []resp3Shape
	// clusterAware: the connection behaves as a Redis Cluster client's
	// (cluster.go): requests for a slot led elsewhere get -MOVED.
	clusterAware bool
	// callRedirect: the admin command running came in KEFIR.CALL REDIRECT
	// (a forward): it must redirect, not forward again.
	callRedirect bool
	cons         level.Consistency
	dur          level.Durability
	sess         shard.Session

	args [][]byte

	// The batch: writes queued since the last flush, their reply bookkeeping, and
	// what the applied ones still wait for.
	writes  []shard.WriteReq
	meta    []queued
	arena   arena
	pending shard.Pending
	// syncKeys are the keys of this connection's sync writes that a
	// replicated shard answered at their ordered point, not yet applied
	// (docs/design/cad.md §12): nobody sees them until they are, so a later
	// read of one of these keys on this connection (a KEFIR.SCAN whose range
	// covers one, a DBSIZE or INFO keyspace: keyspaceBarrier) waits for the
	// batch's pending writes first (awaitSyncWrites). Cleared whenever they
	// were waited for.
	syncKeys map[string]struct{}
	// inline: an event loop runs this command and it must not wait (a
	// replica's read: readInline); wouldWait: it could not, and did nothing.
	inline, wouldWait bool
	// timing for metrics: command ID and start of each command in the batch.
	timed      []timedCmd
	batchStart time.Time
	batched    int
	closing    bool
	// writeDeadline is the write deadline last set on nc; sendOut renews it only
	// when less than half of writeTimeout is left, not on every batch (resetting a
	// deadline is a runtime timer update under the poller's locks).
	writeDeadline time.Time

	// ev is the connection's state in an epoll event loop (eventloop_linux.go)
	// when one serves it; nil on the goroutine-per-connection path.
	ev *evConn
	// front is the highest engine position any connection of this node is
	// making durable (see syncFrontOf): until it is durable, a read may have to
	// wait for an fsync, so an event loop hands such reads to a goroutine.
	front *atomic.Uint64
}

type timedCmd struct {
	cmd int
	err bool
}

func (s *Server) newConn(nc net.Conn, id int64) *conn {
	c := &conn{
		srv:    s,
		nc:     nc,
		id:     id,
		addr:   nc.RemoteAddr().String(),
		authed: s.cfg.Password == "",
		cons:   s.cfg.Consistency,
		// A node that redirects every client treats each as cluster-aware.
		clusterAware: s.cfg.ClusterRedirects,
		dur:          s.cfg.Durability,
		front:        syncFrontOf(s.db),
	}
	c.log = s.log.With("conn", id, "remote", c.addr)
	var in io.Reader = nc
	if ev := s.loopConn(nc); ev != nil {
		// An event loop will own the socket: nc becomes a handle that forwards
		// Shutdown's deadline and close to the loop, and the reader takes its
		// bytes from the loop's reads.
		c.ev, c.nc, in = ev, ev.nc, &ev.in
	}
	c.rd = resp.NewReaderBuf(in, getReadBuf())
	c.rd.SetMaxBulk(s.cfg.MaxBulk)
	c.rd.SetMaxCommand(s.cfg.MaxRequest)
	// The writer only stages replies for outBuf (an in-memory copy), so a small
	// buffer costs little and keeps idle connections cheap.
	c.w = resp.NewWriter(&c.out, connWriterSize)
	return c
}

const connWriterSize = 4 << 10

// readBufs recycles connections' initial read buffers (resp.DefaultBufferSize
// each). A client that opens connections per job (redis-benchmark opens 50 per
// test) otherwise allocates 16 KB per connection, two thirds of a connection's
// allocations, and on a small heap that runs the collector every few dozen
// connections (docs/benchmarks.md, session 9). A buffer goes back only once
// serve has returned: nothing reads a connection's buffer after that.
var readBufs = sync.Pool{New: func() any { b := make([]byte, resp.DefaultBufferSize); return &b }}

func getReadBuf() []byte { return *readBufs.Get().(*[]byte) }

// releaseBuffers returns c's read buffer for another connection's use; c is
// finished (serve returned) and its reader must not be used again.
func (c *conn) releaseBuffers() {
	c.txCloseAll() // itx.go: unpin its transactions' snapshots
	if b := c.rd.TakeBuffer(); len(b) == resp.DefaultBufferSize {
		readBufs.Put(&b)
	}
}

// serve runs the connection until the client leaves, misbehaves or the server
// shuts down. A panic is a bug; it is logged with its stack and closes only this
// connection.
func (c *conn) serve() {
	if c.ev != nil {
		c.serveLoop() // returns once the event loop has closed the connection
		return
	}
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("panic serving connection (bug)", "panic", r, "stack", string(debug.Stack()))
			c.srv.panics.Add(1)
		}
		c.nc.Close()
	}()
	for !c.closing {
		if c.rd.Buffered() == 0 {
			if err := c.release(); err != nil {
				c.log.Debug("write failed", "err", err)
				return
			}
			if c.srv.draining() {
				return
			}
			if c.srv.cfg.IdleTimeout > 0 {
				_ = c.nc.SetReadDeadline(time.Now().Add(c.srv.cfg.IdleTimeout))
				// Shutdown may have set an immediate deadline between the check
				// above and this one; do not sleep through it.
				if c.srv.draining() {
					return
				}
			}
		}
		args, err := c.rd.ReadCommand(c.args[:0])
		c.args = args
		if resp.IsTooLarge(err) {
			c.refuseTooLarge(err)
			continue
		}
		if err != nil {
			c.readFailed(err)
			return
		}
		c.dispatch(args)
		c.batched++
		if c.batched >= maxBatch || len(c.out.b)+c.w.Buffered() > 1<<20 {
			if err := c.release(); err != nil {
				return
			}
		}
	}
	_ = c.release()
}

// refuseTooLarge answers a command the reader discarded for being over the
// bulk or request limit (resp.TooLargeError), in its place among the
// pipeline's replies; the connection and the commands after it carry on.
func (c *conn) refuseTooLarge(err error) {
	c.flushWrites()
	c.srv.m.tooLarge.Inc()
	c.log.Info("refused a command over the size limit", "err", err)
	_ = c.w.WriteError(err.Error()) // "ERR ...", as resp.TooLargeError spells it
	c.batched++
}

// readFailed answers a protocol error before closing; other errors just close.
func (c *conn) readFailed(err error) {
	switch {
	case resp.IsProtocolError(err):
		c.srv.m.protoErrors.Inc()
		c.log.Info("closing connection on protocol error", "err", err)
		if c.release() != nil && c.closing {
			return // the batch's durability failed: the connection closes with no reply at all
		}
		c.out.b = c.out.b[:0]
		_ = c.w.WriteError("ERR " + err.Error())
		_ = c.release()
	case errors.Is(err, os.ErrDeadlineExceeded) && c.srv.draining():
		c.log.Debug("closing connection: shutting down")
		_ = c.release()
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.log.Info("closing idle connection", "idle_timeout", c.srv.cfg.IdleTimeout)
		_ = c.release()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		_ = c.release()
	default:
		c.log.Debug("read failed", "err", err)
		_ = c.release()
	}
}

// release ends the batch: applies queued writes, waits for their durability with
// one shared fsync (a replica: for the acknowledgement of the writes it ordered,
// shard.Pending.Acks), and writes all replies in one system call. If the wait fails
// the writes' outcome is unknown, so no reply claims anything: the connection
// closes and the client sees an unknown outcome, as it must.
func (c *conn) release() error {
	c.flushWrites()
	if mutation.On && mut.releaseSkipsWait.Load() {
		c.pending = shard.Pending{} // the mutation: replies before their writes are acknowledged
	}
	if !c.pending.IsZero() {
		t := time.Now()
		err := c.srv.shard.Wait(context.Background(), c.pending)
		if err := c.waited(err, time.Since(t)); err != nil {
			return err
		}
	}
	return c.send()
}

// waited records the outcome of the batch's durability wait (err, after d). On
// failure it drops every reply of the batch, including those still staged in the
// RESP writer: none may reach the client, now or on a later flush.
func (c *conn) waited(err error, d time.Duration) error {
	if c.pending.SyncPos != 0 {
		// An fsync wait (kefir_fsync_wait_seconds); a replica's wait for
		// acknowledgements (Pending.Acks) is not one.
		c.srv.m.syncLatency.Observe(d.Seconds())
	}
	c.pending = shard.Pending{}
	clear(c.syncKeys)
	if err == nil {
		return nil
	}
	c.log.Error("durability wait failed; closing connection without replies", "err", err)
	proto := c.w.Protocol()
	c.w.Reset(&c.out)
	c.w.SetProtocol(proto)
	c.out.b = c.out.b[:0]
	c.closing = true
	return err
}

// send ends a batch whose writes are applied and durable: it records the batch's
// metrics and writes its replies.
func (c *conn) send() error {
	if !c.pending.IsZero() {
		panic("server: replies released before their writes are durable")
	}
	if len(c.timed) > 0 {
		lat := time.Since(c.batchStart).Seconds()
		m := c.srv.m
		for _, t := range c.timed {
			m.calls[t.cmd].Inc()
			m.latency[t.cmd].Observe(lat)
			if t.err {
				m.errs[t.cmd].Inc()
			}
		}
		m.commands.Add(uint64(len(c.timed)))
		c.timed = c.timed[:0]
	}
	c.batched = 0
	if err := c.w.Flush(); err != nil {
		return err
	}
	if len(c.out.b) == 0 {
		return nil
	}
	var err error
	if c.ev != nil {
		// The loop's socket never blocks: what it does not take now waits in
		// the connection's output queue, and the loop stops reading from this
		// client until that drains.
		err = c.ev.send(c.out.b)
	} else {
		// A client that stops reading its replies must not hold the goroutine
		// and its buffers forever.
		if now := time.Now(); c.writeDeadline.Sub(now) < writeTimeout/2 {
			c.writeDeadline = now.Add(writeTimeout)
			_ = c.nc.SetWriteDeadline(c.writeDeadline)
		}
		_, err = c.nc.Write(c.out.b)
	}
	c.out.release()
	return err
}

// flushWrites applies the queued writes and writes their replies. Reads and admin
// commands call it first, so replies stay in command order and reads see the
// connection's earlier writes.
func (c *conn) flushWrites() {
	if len(c.writes) == 0 {
		return
	}
	p, err := c.applyBatch()
	if err != nil {
		for i := range c.writes {
			c.writes[i].Err = err
		}
	}
	c.pending = c.pending.Merge(p)
	if len(p.Acks) > 0 {
		c.noteSyncKeys()
	}
	if p.SyncPos != 0 {
		for f := c.front.Load(); f < uint64(p.SyncPos) && !c.front.CompareAndSwap(f, uint64(p.SyncPos)); f = c.front.Load() {
		}
	}
	fwd := c.forwardWrites()
	for i := range c.writes {
		r := &c.writes[i]
		q := &c.meta[i]
		c.execShapes = nil
		if q.shape == shapeExec3 {
			c.execShapes, c.exec3 = c.exec3[0], c.exec3[1:]
		}
		if fwd != nil && fwd[i] != nil {
			c.writeForwarded(fwd[i], q.cmd, q.session, q.shape)
			continue
		}
		if r.Err != nil {
			c.markErr(q.cmd)
			if q.session {
				_ = c.w.WriteArrayHeader(2)
				_ = c.w.WriteBulkString(q.sess.String())
			}
			c.writeErr(r.Err)
			continue
		}
		if q.session {
			_ = c.w.WriteArrayHeader(2)
			_ = c.w.WriteBulkString(q.sess.AfterWrite(r.Result.Pos()).String())
		} else {
			c.sess = c.sess.AfterWrite(r.Result.Pos())
		}
		res := r.Result
		if q.shape == shapeSetNX {
			if res.Kind == kv.ResOK {
				res = kv.Result{Kind: kv.ResInt, Int: 1}
			} else {
				res = kv.Result{Kind: kv.ResInt, Int: 0}
			}
		}
		c.writeResult(res)
	}
	clear(c.writes) // drop references to the batch's keys and values
	c.writes = c.writes[:0]
	c.meta = c.meta[:0]
	c.exec3, c.execShapes = nil, nil
	c.arena.reset()
}

// markErr flags the latest timed entry of cmd as an error.
func (c *conn) markErr(cmd int) {
	for i := len(c.timed) - 1; i >= 0; i-- {
		if c.timed[i].cmd == cmd {
			c.timed[i].err = true
			return
		}
	}
}

func (c *conn) writeResult(r kv.Result) {
	switch r.Kind {
	case kv.ResOK:
		_ = c.w.WriteSimple("OK")
	case kv.ResInt:
		_ = c.w.WriteInt(r.Int)
	case kv.ResBulk:
		_ = c.w.WriteBulk(r.Bulk)
	case kv.ResNil:
		_ = c.w.WriteNull()
	case kv.ResReply:
		c.writeReply(r.Bulk) // a script's (script.go)
	case kv.ResArray:
		_ = c.w.WriteArrayHeader(len(r.Array))
		for _, b := range r.Array {
			if b == nil {
				_ = c.w.WriteNull()
			} else {
				_ = c.w.WriteBulk(b)
			}
		}
	default:
		panic(fmt.Sprintf("server: result kind %d", r.Kind))
	}
}

// writeErr spells err with the prefix its type calls for
// (docs/design/resp-extensions.md).
func (c *conn) writeErr(err error) {
	_ = c.w.WriteError(errorText(err))
}

func errorText(err error) string {
	var re *replyError
	var ce *cluster.ReplyError
	var pe command.ReplyError
	switch {
	case errors.As(err, &re):
		return re.msg
	case errors.As(err, &pe): // the argument parsers shared with scripts
		return string(pe)
	case errors.As(err, &ce):
		return ce.Msg
	case errors.Is(err, cluster.ErrNotLeader):
		return cluster.Redirect(err).Error()
	case errors.Is(err, kv.ErrWrongKind):
		return kv.ErrWrongKind.Error() // its text is Redis's, prefix included
	case errors.Is(err, kv.ErrWrongType):
		// Redis's reply for INCR on a non-integer, which clients match on;
		// -WRONGTYPE is for a key holding another kind of value.
		return errNotInt.msg
	case errors.Is(err, shard.ErrUnavailable), errors.Is(err, shard.ErrClosed), errors.Is(err, shard.ErrSessionAhead):
		return "UNAVAILABLE " + err.Error()
	case errors.Is(err, level.ErrUnknownLevel):
		return "ERR " + err.Error()
	case errors.Is(err, kv.ErrTxLocked):
		// A write that raced with a cross-group transaction's prepare
		// (kv/xgtx.go; the front door waits for locks before proposing):
		// Redis Cluster clients retry TRYAGAIN.
		return "TRYAGAIN " + err.Error()
	}
	return "ERR " + err.Error()
}

// replyError is an error whose RESP text (prefix included) is fixed (the
// router's are cluster.ReplyError).
type replyError struct{ msg string }

func (e *replyError) Error() string { return e.msg }

func errf(format string, args ...any) error {
	return &replyError{msg: fmt.Sprintf(format, args...)}
}

var (
	errSyntax   = &replyError{"ERR syntax error"}
	errNotInt   = &replyError{"ERR value is not an integer or out of range"}
	errNoAuth   = &replyError{"NOAUTH Authentication required."}
	errWrongPwd = &replyError{"WRONGPASS invalid username-password pair or user is disabled."}
)

// dispatch runs one command. Writes are queued (see flushWrites); everything else
// first flushes the queue.
func (c *conn) dispatch(args [][]byte) {
	spec, ok := command.Lookup(args[0])
	c.dispatchSpec(spec, ok, args)
}

// dispatchSpec is dispatch of a command already looked up (spec, ok:
// command.Lookup(args[0])).
func (c *conn) dispatchSpec(spec *command.Spec, ok bool, args [][]byte) {
	if !ok {
		// No command is named POST or HOST:, so only an unknown name can be
		// an HTTP line: a known command pays nothing for the check.
		if crossProtocol(args[0]) {
			c.crossProtocolAttack(args[0])
			return
		}
		c.flushWrites()
		c.tx.dirty = c.multi // Redis: EXEC aborts a transaction that met an unknown command
		c.writeErr(unknownCommand(args))
		return
	}
	if len(c.timed) == 0 {
		// One clock read per batch: every command of a pipeline arrived together,
		// and its reply leaves with the others.
		c.batchStart = c.clock()
	}
	c.timed = append(c.timed, timedCmd{cmd: spec.ID})
	err := c.check(spec, args)
	if err == nil && c.multi && !txControl(spec) {
		if err = c.queueTx(spec, args); err == nil {
			return
		}
	}
	if err != nil {
		if c.multi {
			// Redis: EXEC answers EXECABORT. A refused MULTI, WATCH or
			// DISCARD (its arity) marks it too: only c.check refuses
			// those here (Redis's rejectCommand flags the transaction).
			c.tx.dirty = true
		}
		c.flushWrites()
		c.timed[len(c.timed)-1].err = true
		if spec == execSpec {
			// Redis's execCommandAbort: a refused EXEC ends the transaction
			// and the watches, in MULTI or not, and says why.
			c.resetTx()
			err = errf("EXECABORT Transaction discarded because of: %s", strings.TrimPrefix(err.Error(), "ERR "))
		}
		c.writeErr(err)
		return
	}
	c.run(spec, args, callOpts{})
}

// txControl reports whether spec runs at once inside MULTI rather than being
// queued: the commands that end or shape the transaction, and QUIT (Redis's
// processCommand lets the same ones through).
func txControl(spec *command.Spec) bool {
	switch spec.Name {
	case "MULTI", "EXEC", "DISCARD", "WATCH", "QUIT":
		return true
	}
	return false
}

// crossProtocol reports whether a command's name is the first word of an HTTP
// request line or header that a browser sends to any port it is told to
// (cross-protocol scripting: a web page posting "SET k v" lines to a RESP
// port). Redis's processCommand checks every command for "post" and "host:",
// since an inline HTTP request spells its header lines as commands too.
func crossProtocol(name []byte) bool {
	return eq(name, "POST") || eq(name, "HOST:")
}

// crossProtocolWarned rate-limits crossProtocolAttack's warning (unix seconds of
// the last one): a page can open connections in a loop.
var crossProtocolWarned atomic.Int64

// crossProtocolAttack closes the connection without running anything more of
// what it sent, and logs it at most once a minute.
func (c *conn) crossProtocolAttack(name []byte) {
	c.srv.m.protoErrors.Inc()
	if now, last := time.Now().Unix(), crossProtocolWarned.Load(); now-last >= 60 && crossProtocolWarned.CompareAndSwap(last, now) {
		c.log.Warn("possible security attack: an HTTP request (cross-protocol scripting) was sent to the RESP port; connection closed",
			"command", clip(name))
	}
	c.closing = true
}

// callOpts are KEFIR.CALL's per-call options.
type callOpts struct {
	cons    level.Consistency
	dur     level.Durability
	id      shard.ReqID
	session bool
	sess    shard.Session
	wrapped bool
	// redirect (KEFIR.CALL REDIRECT): answer -MOVED <leader> instead of
	// forwarding to the leader.
	redirect bool
}

// check validates arity, authentication and support before a command runs.
func (c *conn) check(spec *command.Spec, args [][]byte) error {
	if spec.Has(command.Unsupported) {
		// First, like Redis's "unknown command": whatever the arguments,
		// the answer is that the command does not run here.
		return &replyError{command.UnsupportedError(spec.Name)}
	}
	if !spec.ArityOK(len(args)) {
		return errf("ERR wrong number of arguments for '%s' command", strings.ToLower(spec.Name))
	}
	if !c.authed && !spec.Has(command.NoAuth) {
		return errNoAuth
	}
	return nil
}

// run executes a validated command with per-call options o.
func (c *conn) run(spec *command.Spec, args [][]byte, o callOpts) {
	if c.srv.clusterOn {
		if err := crossSlot(spec, args); err != nil {
			c.flushWrites()
			c.timed[len(c.timed)-1].err = true
			c.writeErr(err)
			return
		}
	}
	if spec.IsUpdate() {
		if c.flushesAcross(spec) { // flush.go: one flush per group
			c.flushWrites()
			if err := c.flushAcross(spec, args, o); err != nil {
				c.timed[len(c.timed)-1].err = true
				if o.session {
					_ = c.w.WriteArrayHeader(2)
					_ = c.w.WriteBulkString(o.sess.String())
				}
				c.writeErr(err)
			}
			return
		}
		c.queueWrite(spec, args, o)
		return
	}
	var err error
	switch {
	case spec.Has(command.Wrapper):
		// KEFIR.CALL: a wrapped write joins the batch like a plain one (the
		// Go client wraps every write, and a follower forwards pipelines of
		// them); call flushes before anything else it runs.
		if err = c.call(args); err != nil {
			c.flushWrites()
		}
	case spec.Class == command.Read:
		c.flushWrites()
		if len(c.syncKeys) > 0 && (readsAny(spec, args, c.syncKeys) || c.sessionRead(o)) && !c.awaitSyncWrites() {
			return // the wait failed: the batch gets no replies, the connection closes
		}
		err = c.read(spec, args, o)
	default:
		c.flushWrites()
		if !c.keyspaceBarrier(spec, args) {
			return // the wait failed: the batch gets no replies, the connection closes
		}
		err = c.admin(spec, args)
	}
	if err != nil {
		c.timed[len(c.timed)-1].err = true
		if o.session {
			_ = c.w.WriteArrayHeader(2)
			_ = c.w.WriteBulkString(o.sess.String())
		}
		c.writeErr(err)
	}
}

// writeSession is the session a write carries for its replica to check
// (shard.WriteReq.Session): the call's token (KEFIR.CALL SESSION), or the
// connection's at the session level; zero for a writer that asked for no
// session guarantees, whose write must not fail for them.
func (c *conn) writeSession(o callOpts) shard.Session {
	switch {
	case o.session:
		return o.sess
	case o.cons.Kind == level.Session || o.cons.IsZero() && c.cons.Kind == level.Session:
		return c.sess
	}
	return shard.Session{}
}

// queueWrite parses a write into the batch. Arguments alias the reader's buffer,
// so they are copied into the batch arena.
func (c *conn) queueWrite(spec *command.Spec, args [][]byte, o callOpts) {
	var op kv.Op
	var shape replyShape
	var exec3 []resp3Shape // shapeExec3's
	var err error
	switch {
	case spec != execSpec && spec != kefirExecSpec && spec != txApplySpec && !isScript(spec):
		// The common case, parsed in place: into a zeroed slot of the
		// batch, dropped again if the command is refused.
		n := len(c.writes)
		c.writes = append(c.writes, shard.WriteReq{})
		w := &c.writes[n]
		if shape, err = parseWriteInto(&w.Op, spec, args, &c.arena); err == nil && !o.dur.IsZero() {
			err = c.srv.shard.CheckDurability(o.dur)
		}
		if err != nil {
			c.writes = c.writes[:n]
			c.refuseWrite(err, o)
			return
		}
		w.Durability, w.ID = o.dur, o.id
		if w.Durability.IsZero() {
			w.Durability = c.dur
		}
		w.Session = c.writeSession(o)
		c.noteQueued(spec, args, &w.Op, shape, o)
		return
	case spec == execSpec:
		// EXEC: the transaction becomes the KEFIR.EXEC that carries it
		// (tx.go), parsed, logged and forwarded as one.
		if !c.multi {
			err = errf("ERR EXEC without MULTI")
		} else if !c.tx.writes && !c.tx.dirty {
			// Only reads: served as a read (KEFIR.EXECRO), not logged.
			c.flushWrites()
			c.execShapes = c.resp3Shapes()
			if args, err = c.execArgs(); err == nil {
				args[0] = kefirExecROName
				err = c.read(kefirExecROSpec, args, o)
			}
			c.execShapes = nil
			if err == nil {
				return
			}
		} else {
			if exec3 = c.resp3Shapes(); exec3 != nil {
				shape = shapeExec3
			}
			if args, err = c.execArgs(); err == nil {
				op, err = parseExec(args, &c.arena)
			}
		}
	case spec == kefirExecSpec:
		op, err = parseExec(args, &c.arena)
	case isScript(spec):
		op, err = c.parseScript(spec, args, &c.arena) // script.go
	default:
		op, err = parseTxApply(args, &c.arena) // itx.go: txApplySpec
		if err == nil && kv.IsXgtxKind(op.Kind) && !c.srv.cfg.CrossGroupTx {
			// Without the switch nothing pushes a prepared transaction
			// (xgtx.go): its locks would stay.
			err = errf("ERR KEFIR.TXAPPLY: cross-group transactions are off on this node (--cross-group-tx)")
		}
	}
	if err == nil && !o.dur.IsZero() {
		err = c.srv.shard.CheckDurability(o.dur)
	}
	if err != nil {
		c.refuseWrite(err, o)
		return
	}
	d := o.dur
	if d.IsZero() {
		d = c.dur
	}
	w := shard.WriteReq{Op: op, Durability: d, ID: o.id}
	if spec != txApplySpec {
		// A transaction or a script advances the writer's session as any
		// write does, so it is judged by it too (writeSession); a
		// KEFIR.TXAPPLY is a coordinator's step, not a writer's.
		w.Session = c.writeSession(o)
	}
	c.writes = append(c.writes, w)
	if shape == shapeExec3 {
		c.exec3 = append(c.exec3, exec3)
	}
	c.noteQueued(spec, args, &c.writes[len(c.writes)-1].Op, shape, o)
}

// refuseWrite answers a write refused before it joined the batch, after the
// batch's earlier replies (flushWrites).
func (c *conn) refuseWrite(err error, o callOpts) {
	c.flushWrites()
	c.timed[len(c.timed)-1].err = true
	if o.session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(o.sess.String())
	}
	c.writeErr(err)
}

// noteQueued records how to answer the write just added to the batch (op, its
// slot's Op); a replicated node keeps the command as received for forwarding.
func (c *conn) noteQueued(spec *command.Spec, args [][]byte, op *kv.Op, shape replyShape, o callOpts) {
	q := queued{cmd: spec.ID, shape: shape, session: o.session, sess: o.sess, redirect: o.redirect}
	if c.srv.grp != nil {
		q.raw = make([][]byte, len(args))
		for i, a := range args {
			q.raw[i] = c.arena.copy(a)
		}
		if kv.IsScript(op.Kind) {
			forwardedScript(op, q.raw) // never a SHA the leader may lack
		}
	}
	c.meta = append(c.meta, q)
}

var getSpec, setSpec = command.MustLookup("GET"), command.MustLookup("SET")

// hgetSpec is HGET's. A one-field HGET takes the key-read path as GET does
// where the shard has one (fieldReader: the single node), else read's own
// path (one op, the field's value as its reply), not readMore's closures and
// command switch, which cost a pipelined HGET about a tenth of its CPU
// (docs/design/hashes.md).
var hgetSpec, _ = command.Lookup([]byte("HGET"))

// fieldReader is a shard.Replica with a hot path for a one-field HGET, as
// ReadKey is GET's (shard.Shard.ReadField).
type fieldReader interface {
	ReadField(key, field []byte, c level.Consistency, s shard.Session) (value []byte, version uint64, found bool, err error)
}

// read serves a read command; a nil error means the reply was written.
func (c *conn) read(spec *command.Spec, args [][]byte, o callOpts) error {
	if c.srv.reads.Key && !o.session {
		var (
			v       []byte
			version uint64
			found   bool
			err     error
			hot     = true
		)
		cons := o.cons
		if cons.IsZero() {
			cons = c.cons
		}
		switch {
		case spec == getSpec && len(args) == 2:
			v, version, found, err = c.srv.shard.ReadKey(args[1], cons, c.sess)
		case spec == hgetSpec && len(args) == 3 && c.srv.fields != nil:
			v, version, found, err = c.srv.fields.ReadField(args[1], args[2], cons, c.sess)
		default:
			hot = false
		}
		if hot {
			if err != nil {
				return err
			}
			// AfterRead, not a bare max: a higher version must not keep the
			// view of the lower one (a token set from a replica group's).
			c.sess = c.sess.AfterRead(kv.Result{Version: version}.Pos())
			if found {
				_ = c.w.WriteBulk(v)
			} else {
				_ = c.w.WriteNull()
			}
			return nil
		}
	}
	hget := spec == hgetSpec && len(args) == 3
	if moreReads[spec.ID] && !hget {
		return c.readMore(spec, args, o)
	}
	if spec == watchSpec {
		if c.multi {
			return errf("ERR WATCH inside MULTI is not allowed")
		}
		return c.watch(args, o) // tx.go
	}
	var op kv.Op
	var err error
	if hget {
		op = kv.Op{Kind: kv.KindHGet, Key: args[1], Keys: args[2:]} // as evalHash's
	} else if isScript(spec) { // EVAL_RO, EVALSHA_RO (script.go)
		if c.inline {
			// A script may run for its whole instruction budget: not on
			// an event loop, which serves many connections.
			c.wouldWait = true
			return nil
		}
		op, err = c.parseScript(spec, args, nil)
	} else {
		op, err = parseRead(spec, args)
	}
	if err != nil {
		return err
	}
	if op.Kind == kv.KindScan {
		// The values are read into a lent buffer, taken back once
		// writeResult (below) has encoded them (scanbuf.go).
		op.ScanBuf = lendScanBuf()
		defer returnScanBuf(op.ScanBuf)
	}
	cons := o.cons
	if cons.IsZero() {
		cons = c.cons
	}
	sess := c.sess
	if o.session {
		sess = o.sess
	}
	res, after, p, err := c.readPath(op, cons, sess)
	if errors.Is(err, errWouldWait) {
		c.wouldWait = true
		return nil
	}
	if errors.Is(err, cluster.ErrNotLeader) {
		if kv.IsScript(op.Kind) {
			args = forwardedScriptArgs(&op, args) // never a SHA the leader may lack
		}
		return c.forwardRead(args, cons, sess, o, err)
	}
	if err != nil {
		return err
	}
	c.pending = c.pending.Merge(p)
	if o.session { // sess is o.sess
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(after.String())
	} else { // sess is c.sess
		c.sess = after
	}
	if hget {
		c.writeNullable(res.Array[0])
		return nil
	}
	c.writeResult(res)
	return nil
}

func clip(b []byte) string { return command.Clip(b) }

// unknownCommand is Redis's reply to a name no command has (known but
// unsupported ones answer command.UnsupportedError instead).
func unknownCommand(args [][]byte) error {
	return errf("ERR unknown command '%s', with args beginning with: %s", clip(args[0]), argPreview(args[1:]))
}

// argPreview is Redis's preview of an unknown command's arguments: each
// quoted and followed by a space, until the preview reaches 128 bytes (the
// argument that crosses it cut there). Bytes that would break the reply are
// escaped (clip).
func argPreview(args [][]byte) string {
	var sb strings.Builder
	for _, a := range args {
		if sb.Len() >= 128 {
			break
		}
		s := clip(a)
		if room := 128 - sb.Len(); len(s) > room {
			s = s[:room]
		}
		sb.WriteByte('\'')
		sb.WriteString(s)
		sb.WriteString("' ")
	}
	return sb.String()
}

// arena copies request bytes that must outlive the reader's buffer until the
// batch is applied. The engine copies keys and values into its write buffer and
// index (storage.DB.Append keeps no caller slice) and the shard clones what its
// client table keeps,
// so the arena is reused from batch to batch; a chunk that fills up is replaced,
// never grown in place, so earlier slices of the batch stay valid.
type arena struct {
	buf []byte
	// args backs the argument lists of the batch's ops (Keys: MSET's,
	// DEL's, HSET's...), by the same rules: a list per write was an
	// allocation of every HSET that a SET does not make.
	args [][]byte
}

func (a *arena) reset() {
	if cap(a.buf) > 1<<20 {
		a.buf = nil // one huge batch must not pin its memory
	}
	a.buf = a.buf[:0]
	clear(a.args) // nor keep the large arguments copied outside buf
	if cap(a.args) > 1<<16 {
		a.args = nil
	}
	a.args = a.args[:0]
}

// copyArgs copies each of args into the arena and returns the list, itself
// in the arena.
func (a *arena) copyArgs(args [][]byte) [][]byte {
	n := len(args)
	if cap(a.args)-len(a.args) < n {
		a.args = make([][]byte, 0, max(2*cap(a.args), 256, n))
	}
	start := len(a.args)
	a.args = a.args[:start+n]
	out := a.args[start : start+n : start+n]
	for i, b := range args {
		out[i] = a.copy(b)
	}
	return out
}

// copyKeyArgs is copy of args[0] and copyArgs of args[1:] — a write's key
// and its list (HSET's fields and values, HDEL's fields) — with one check
// of the arena's room for all their bytes: HSET's three copies, each
// checking it, took ~85 instructions more than SET's two
// (docs/design/hashes.md, "Pipelined, session 25").
func (a *arena) copyKeyArgs(args [][]byte) (key []byte, rest [][]byte) {
	if len(args) == 3 {
		if k, f, v := args[0], args[1], args[2]; len(k)+len(f)+len(v) <= 64<<10 {
			return a.copyKeyFieldValue(k, f, v)
		}
	}
	total := 0
	for _, b := range args {
		total += len(b)
	}
	if total > 64<<10 {
		return a.copy(args[0]), a.copyArgs(args[1:]) // large arguments go outside buf
	}
	n := len(args) - 1
	if cap(a.args)-len(a.args) < n {
		a.args = make([][]byte, 0, max(2*cap(a.args), 256, n))
	}
	start := len(a.args)
	a.args = a.args[:start+n]
	rest = a.args[start : start+n : start+n]
	p := len(a.buf)
	if cap(a.buf)-p < total {
		a.buf, p = make([]byte, 0, max(2*cap(a.buf), 4<<10, total)), 0
	}
	buf := a.buf[:p+total]
	a.buf = buf
	e := p + len(args[0])
	key = buf[p:e:e]
	copy(key, args[0])
	for i, b := range args[1:] {
		p, e = e, e+len(b)
		rest[i] = buf[p:e:e]
		copy(rest[i], b)
	}
	return key, rest
}

// copyKeyFieldValue is copyKeyArgs of [k, f, v] of at most 64 KiB in all
// (an HSET of one field, the commonest hash write): the same layout without
// the loops over the list, 167 instructions of a pipelined HSET where
// copyKeyArgs's loops took 218 (docs/design/hashes.md, "Pipelined, session
// 31").
func (a *arena) copyKeyFieldValue(k, f, v []byte) (key []byte, rest [][]byte) {
	if cap(a.args)-len(a.args) < 2 {
		a.args = make([][]byte, 0, max(2*cap(a.args), 256))
	}
	start := len(a.args)
	a.args = a.args[:start+2]
	rest = a.args[start : start+2 : start+2]
	total := len(k) + len(f) + len(v)
	p := len(a.buf)
	if cap(a.buf)-p < total {
		a.buf, p = make([]byte, 0, max(2*cap(a.buf), 4<<10, total)), 0
	}
	a.buf = a.buf[:p+total]
	buf := a.buf[p : p+total : p+total] // the three copies, back to back
	e1 := len(k)
	e2 := e1 + len(f)
	key = buf[:e1:e1]
	copy(key, k)
	fc, vc := buf[e1:e2:e2], buf[e2:]
	copy(fc, f)
	copy(vc, v)
	rest[0], rest[1] = fc, vc
	return key, rest
}

func (a *arena) copy(b []byte) []byte {
	if len(b) > 64<<10 {
		return append([]byte(nil), b...)
	}
	n := len(a.buf)
	if cap(a.buf)-n < len(b) {
		a.buf, n = make([]byte, 0, max(2*cap(a.buf), 4<<10, len(b))), 0
	}
	e := n + len(b)
	a.buf = a.buf[:e]
	copy(a.buf[n:e], b)
	return a.buf[n:e:e]
}

// noteSyncKeys records the keys of the batch's sync writes just applied, which a
// replicated shard may have answered at their ordered point (Pending.Acks).
func (c *conn) noteSyncKeys() {
	for i := range c.writes {
		w := &c.writes[i]
		if w.Err != nil || w.Durability != level.Sync {
			continue
		}
		if c.syncKeys == nil {
			c.syncKeys = make(map[string]struct{})
		}
		for _, k := range w.Op.WrittenKeys() {
			c.syncKeys[string(k)] = struct{}{}
		}
	}
}

// readsAny reports whether read command args may read one of keys, found where
// the command table says its keys are (FirstKey, LastKey, KeyStep); a
// KEFIR.SCAN reads those in its range [start, end) (an empty end: to the
// last key); any other read with no key positions is assumed to.
func readsAny(spec *command.Spec, args [][]byte, keys map[string]struct{}) bool {
	if spec.Name == "KEFIR.SCAN" && len(args) >= 3 {
		start, end := args[1], args[2]
		for k := range keys {
			if k >= string(start) && (len(end) == 0 || k < string(end)) {
				return true
			}
		}
		return false
	}
	if spec.FirstKey <= 0 || spec.KeyStep <= 0 {
		return true
	}
	last := spec.LastKey
	if last < 0 {
		last += len(args)
	}
	for i := spec.FirstKey; i <= last && i < len(args); i += spec.KeyStep {
		if _, ok := keys[string(args[i])]; ok {
			return true
		}
	}
	return false
}

// sessionRead reports whether a read with options o is served at session
// level. Its token carries the versions of the connection's writes answered
// before they were applied — sync writes at their ordered point
// (flushWrites), cad and async writes at their acknowledgement — whatever
// keys it reads. The leader serves it once it has applied them, waiting for
// a version in its log however slow the commit (up to vrshard's
// RequestTimeout; a redirect if it stops leading; "session token is ahead"
// only for a version beyond its log, a write a view change lost). Such a read
// still waits for the connection's sync writes here first (awaitSyncWrites),
// as a read of their keys does: the replica's wait then finds them applied.
func (c *conn) sessionRead(o callOpts) bool {
	cons := o.cons
	if cons.IsZero() {
		cons = c.cons
	}
	return o.session || cons.Kind == level.Session
}

// keyspaceBarrier makes an admin command that reports on the whole keyspace —
// DBSIZE, INFO with its keyspace section — wait for the connection's sync
// writes answered at their ordered point (syncKeys), as a read of their keys
// does: a client that pipelines SET k then DBSIZE counts k, as it did before
// those writes were answered early (docs/design/cad.md §12). Other
// connections' writes are counted once applied, as always (DBSIZE stays an
// approximate, local count). False if the wait failed (the connection closes).
func (c *conn) keyspaceBarrier(spec *command.Spec, args [][]byte) bool {
	if len(c.syncKeys) == 0 || !readsKeyspace(spec, args) {
		return true
	}
	return c.awaitSyncWrites()
}

// readsKeyspace reports whether admin command args reports on the keyspace.
func readsKeyspace(spec *command.Spec, args [][]byte) bool {
	switch spec.Name {
	case "DBSIZE":
		return true
	case "INFO":
		section := ""
		if len(args) > 1 {
			section = strings.ToLower(string(args[1]))
		}
		return infoWants(section, "keyspace")
	}
	return false
}

// awaitSyncWrites waits for the batch's pending writes before a read of a key
// one of its sync writes wrote (syncKeys). Those writes are visible once
// applied, and their replies leave with the batch's anyway; the connection's
// replies stay staged. False if the wait failed (waited closed the connection).
func (c *conn) awaitSyncWrites() bool {
	if mutation.On && mut.syncBarrierSkipped.Load() {
		return true // the mutation
	}
	t := time.Now()
	err := c.srv.shard.Wait(context.Background(), c.pending)
	return c.waited(err, time.Since(t)) == nil
}

// dispatchInline runs args on the event loop if it can finish there without
// waiting (c.inline; a path that would wait sets c.wouldWait and does
// nothing), and reports whether it did; if not, the replies it queued are
// dropped and the caller hands args to a worker, which runs them again.
func (c *conn) dispatchInline(args [][]byte) bool {
	n := len(c.timed)
	c.inline = true
	c.dispatch(args)
	c.inline = false
	if c.wouldWait {
		c.wouldWait = false
		c.timed = c.timed[:n]
		return false
	}
	return true
}
