package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
)

// keepBuf is the largest buffer kept for reuse once empty. Larger ones (a
// snapshot, a deep backlog) are given back so an idle link does not pin
// them; a streaming link's batches stay well under it.
const keepBuf = 8 << 20

// mark ends one message in an outbound buffer: the message's frame ends at
// byte end and may be written once the transport clock reaches due (0: at
// once). Invariant: within a buffer, marks are in order of end and of due.
type mark struct {
	end int
	due int64
}

// peer is the outbound half of a link, plus the link's counters and fault.
type peer struct {
	t    *Transport
	id   uint64
	addr string
	log  *slog.Logger
	wake chan struct{} // capacity 1: "the queue is not empty"
	// back (capacity 1) says the peer just connected to us: it is up, so
	// the writer's dial backoff, grown while it was down, no longer
	// applies (serveConn; the writer resets it).
	back chan struct{}
	c    counters

	// partitioned mirrors fault.Partition for the inbound reader, which must
	// not take mu per read.
	partitioned atomic.Bool
	// inbound is the peer's current authenticated inbound connection; a new
	// one replaces (closes) it, since the peer keeps only one outbound
	// connection and a second means the first is dead (half-open).
	inMu    sync.Mutex
	inbound net.Conn
	inDone  chan struct{} // closed when inbound's reader has returned

	// queued counts messages accepted by send and not yet written or
	// dropped (in buf or in the writer's delay line).
	queued atomic.Int64
	// lineBytes is how many bytes the writer holds, taken from buf and not
	// yet written (a large snapshot being written, for SendLarge's bound).
	lineBytes atomic.Int64

	mu     sync.Mutex
	closed bool
	buf    []byte // frames waiting for the writer
	marks  []mark // one per frame in buf
	fault  Fault
	// idle: the writer is parked with nothing in hand on a live connection,
	// whose raw socket is raw (nil for TLS), so push may write for it.
	idle bool
	raw  syscall.RawConn
	// midFrame: buf starts in the middle of a frame whose first bytes push
	// wrote on the current connection; on any other connection the rest
	// would corrupt the stream, so the message is dropped instead.
	midFrame bool
	rng      *rand.Rand // fault draws; REQUIRES: mu held
	lastDue  int64      // due of the last delayed message; keeps order under jitter
}

func (p *peer) send(group uint64, m frame.Payload) error {
	p.mu.Lock()
	err := p.enqueueLocked(group, m, nil)
	p.mu.Unlock()
	p.kick()
	return err
}

// sendFrames queues one message already encoded as frames (SendLarge).
func (p *peer) sendFrames(frames []byte) error {
	p.mu.Lock()
	err := p.enqueueLocked(0, nil, frames)
	p.mu.Unlock()
	p.kick()
	return err
}

// kick wakes the writer.
func (p *peer) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// enqueueLocked applies the link's fault and the queue bounds, and appends
// m's frames addressed to group, or frames (one message already encoded)
// when m is nil; an empty queue takes frames without a copy. REQUIRES: p.mu
// held.
func (p *peer) enqueueLocked(group uint64, m frame.Payload, frames []byte) error {
	if p.closed {
		return ErrClosed
	}
	f := &p.fault
	if f.Partition || (f.DropRate > 0 && p.rng.Float64() < f.DropRate) {
		p.c.faultDropped.Add(1)
		return nil
	}
	if p.queued.Load() >= int64(p.t.cfg.QueueLen) || (len(p.buf) >= p.t.cfg.MaxQueueBytes) {
		p.c.dropped.Add(1)
		return nil
	}
	if frames != nil && int64(len(p.buf))+p.lineBytes.Load() >= int64(p.t.cfg.MaxQueueBytes) {
		// A large message while the link still carries a previous one (a
		// snapshot asked for again before the first was written): a second
		// copy of the state would only wait behind the first.
		p.c.dropped.Add(1)
		return nil
	}
	switch {
	case m != nil:
		p.buf = frame.AppendFrames(p.buf, group, m, p.t.cfg.MaxFrame)
	case len(p.buf) == 0:
		p.buf = frames
	default:
		p.buf = append(p.buf, frames...)
	}
	var due int64
	if f.Delay > 0 || f.Jitter > 0 || p.lastDue > 0 {
		due = p.t.now() + int64(f.Delay)
		if f.Jitter > 0 {
			due += p.rng.Int64N(int64(f.Jitter))
		}
		// Order is kept: a message never overtakes the one before it, also
		// when the delay was just lowered or removed.
		due = max(due, p.lastDue)
		p.lastDue = due
		if f.Delay == 0 && f.Jitter == 0 && due <= p.t.now() {
			p.lastDue = 0 // the delayed backlog is due: back to the fast path
		}
	}
	p.marks = append(p.marks, mark{end: len(p.buf), due: due})
	p.queued.Add(1)
	return nil
}

// push writes the queue right here if the writer is parked on a live plain
// TCP connection with nothing in hand: one non-blocking write (it never
// waits for the socket), which saves the hand-off to the writer goroutine on
// the latency path. Whatever it cannot write (socket buffer full, error, a
// delayed message) is left queued and the writer is woken, as after Send.
// REQUIRES: p.mu not held.
func (p *peer) push() {
	p.mu.Lock()
	if !p.idle || p.raw == nil || len(p.marks) == 0 || p.marks[len(p.marks)-1].due > 0 {
		p.mu.Unlock()
		p.kick()
		return
	}
	buf := p.buf
	n, werr := 0, error(nil)
	err := p.raw.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), buf)
			if werr != syscall.EINTR {
				return true // never wait for writability: that is the writer's job
			}
		}
	})
	if err != nil || n < 0 {
		n = 0
	}
	if n > 0 {
		p.c.batches.Add(1)
		p.c.inlineWrites.Add(1)
		p.c.bytesOut.Add(uint64(n))
		// Messages written whole leave the queue; a partly written head
		// stays, and midFrame says the rest of it may only follow on this
		// connection.
		k := 0
		for k < len(p.marks) && p.marks[k].end <= n {
			k++
		}
		prevEnd := 0
		if k > 0 {
			prevEnd = p.marks[k-1].end
		}
		p.midFrame = n > prevEnd
		p.c.sent.Add(uint64(k))
		p.queued.Add(-int64(k))
		p.buf = p.buf[:copy(p.buf, p.buf[n:])]
		p.marks = p.marks[:copy(p.marks, p.marks[k:])]
		for i := range p.marks {
			p.marks[i].end -= n
		}
	}
	left := len(p.buf) > 0
	p.mu.Unlock()
	if left {
		p.kick()
	}
}

// run is the peer's writer goroutine: it owns the outbound connection.
func (p *peer) run() {
	defer p.t.wg.Done()
	var (
		nc        net.Conn
		dead      chan struct{} // closed when nc's watcher sees it end
		line      []byte        // frames taken from the queue, not yet written
		lineMarks []mark
		failures  int // consecutive failed dials
		timer     = time.NewTimer(time.Hour)
	)
	timer.Stop()
	// consume removes the first n messages (ending at byte end) from the
	// line, counting them as sent or dropped.
	consume := func(n, end int, counter *atomic.Uint64) {
		counter.Add(uint64(n))
		p.queued.Add(-int64(n))
		line = line[:copy(line, line[end:])]
		p.lineBytes.Store(int64(len(line)))
		k := copy(lineMarks, lineMarks[n:])
		lineMarks = lineMarks[:k]
		for i := range lineMarks {
			lineMarks[i].end -= end
		}
	}
	midFrame := false // the line's head was partly written on nc (by push)
	closeConn := func() {
		if nc == nil {
			return
		}
		nc.Close()
		nc, dead = nil, nil
		p.c.connected.Store(false)
		p.mu.Lock()
		p.idle, p.raw = false, nil
		if p.midFrame && len(p.marks) > 0 {
			p.midFrame = false
			p.c.midFrameDrops.Add(1)
			p.c.dropped.Add(1)
			p.queued.Add(-1)
			end := p.marks[0].end
			p.buf = p.buf[:copy(p.buf, p.buf[end:])]
			p.marks = p.marks[:copy(p.marks, p.marks[1:])]
			for i := range p.marks {
				p.marks[i].end -= end
			}
		}
		p.mu.Unlock()
		if midFrame && len(lineMarks) > 0 {
			midFrame = false
			p.c.midFrameDrops.Add(1)
			consume(1, lineMarks[0].end, &p.c.dropped)
		}
	}
	defer closeConn()
	for {
		// Take everything queued. With an empty line the buffers swap, so the
		// common case copies nothing.
		p.mu.Lock()
		p.idle = false
		if len(p.buf) > 0 {
			if len(line) == 0 {
				midFrame, p.midFrame = p.midFrame, false
				line, p.buf = p.buf, line[:0]
				lineMarks, p.marks = p.marks, lineMarks[:0]
				if cap(p.buf) > keepBuf {
					p.buf = nil // do not pin a snapshot-sized buffer
				}
			} else {
				off := len(line)
				line = append(line, p.buf...)
				for _, m := range p.marks {
					lineMarks = append(lineMarks, mark{end: m.end + off, due: m.due})
				}
				p.buf, p.marks = p.buf[:0], p.marks[:0]
			}
		}
		p.lineBytes.Store(int64(len(line)))
		p.mu.Unlock()

		if len(line) == 0 {
			if nc != nil {
				p.mu.Lock()
				p.idle = len(p.buf) == 0
				p.mu.Unlock()
			}
			select {
			case <-p.wake:
			case <-dead:
				closeConn()
			case <-p.t.ctx.Done():
				midFrame = false
				p.discard(len(lineMarks))
				return
			}
			continue
		}
		if dead != nil {
			select {
			case <-dead:
				closeConn()
				continue // closeConn may have dropped a partly written head
			default:
			}
		}
		if nc == nil {
			var err error
			nc, dead, err = p.connect(failures)
			if err != nil {
				if p.t.ctx.Err() != nil {
					midFrame = false
					p.discard(len(lineMarks))
					return
				}
				failures++
				p.c.dialFailures.Add(1)
				consume(len(lineMarks), len(line), &p.c.dropped)
				wait := backoff(p.t.cfg.DialBackoff, p.t.cfg.MaxDialBackoff, failures)
				level := slog.LevelDebug
				if failures == 1 {
					level = slog.LevelWarn
				}
				p.log.Log(p.t.ctx, level, "peer unreachable; dropping its queue and backing off", "err", err, "failures", failures, "backoff", wait)
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-p.back:
					// The peer connected to us: it is up again. Redial at
					// once on the next send instead of sleeping out a backoff
					// that grew while it was down (a returning follower would
					// otherwise not hear its leader for up to MaxDialBackoff).
					timer.Stop()
					failures = 0
					p.log.Debug("peer connected to us; dial backoff reset")
				case <-p.t.ctx.Done():
					timer.Stop()
					midFrame = false
					p.discard(0)
					return
				}
				continue
			}
			if p.c.connects.Add(1) > 1 {
				p.c.reconnects.Add(1)
			}
			if failures > 0 || p.c.connects.Load() > 1 {
				p.log.Info("peer connected", "after_failures", failures)
			}
			failures = 0
			select {
			case <-p.back: // stale: we are connected
			default:
			}
			p.c.connected.Store(true)
			var raw syscall.RawConn
			if sc, ok := nc.(syscall.Conn); ok {
				raw, _ = sc.SyscallConn()
			}
			p.mu.Lock()
			p.raw = raw
			p.mu.Unlock()
		}

		// Write the prefix that is due, in one Write.
		n, end := len(lineMarks), len(line)
		if lineMarks[n-1].due > 0 {
			now := p.t.now()
			n = 0
			for n < len(lineMarks) && lineMarks[n].due <= now {
				n++
			}
			end = 0
			if n > 0 {
				end = lineMarks[n-1].end
			}
		}
		if n > 0 {
			if err := writeTimed(nc, line[:end], p.t.cfg.WriteTimeout); err != nil {
				p.log.Warn("peer write failed; dropping the batch and reconnecting", "err", err, "messages", n)
				midFrame = false // dropped with the batch
				closeConn()
				consume(n, end, &p.c.dropped)
				continue
			}
			// A deadline left armed would make push's RawConn.Write fail
			// once it passes.
			_ = nc.SetWriteDeadline(time.Time{})
			p.c.batches.Add(1)
			p.c.bytesOut.Add(uint64(end))
			consume(n, end, &p.c.sent)
			midFrame = false
			if cap(line) > keepBuf && len(line) == 0 {
				line, lineMarks = nil, nil
			}
		}
		if len(lineMarks) == 0 {
			continue
		}
		// The head of the line is held by an injected delay: sleep until it
		// is due, or until something changes.
		timer.Reset(time.Duration(lineMarks[0].due - p.t.now()))
		select {
		case <-timer.C:
		case <-p.wake:
			timer.Stop() // Go ≥ 1.23 timers: no stale tick to drain
		case <-dead:
			timer.Stop()
			closeConn()
		case <-p.t.ctx.Done():
			timer.Stop()
			midFrame = false
			p.discard(len(lineMarks))
			return
		}
	}
}

// discard accounts for messages lost at Close: the line's and the queue's.
func (p *peer) discard(inLine int) {
	p.mu.Lock()
	n := inLine + len(p.marks)
	p.buf, p.marks, p.midFrame = nil, nil, false
	p.mu.Unlock()
	p.c.dropped.Add(uint64(n))
	p.queued.Add(-int64(n))
}

// backoff is the wait after `failures` consecutive failed dials: base·2^(f−1)
// capped at max, then drawn uniformly from [d/2, d].
func backoff(base, max time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// connect dials the peer, runs TLS and the handshake, and starts the
// connection's watcher, which closes dead when the connection ends. The
// acceptor never writes after the handshake, so the watcher reading EOF or
// an error is how a restarted or vanished peer is noticed before the next
// write is lost.
func (p *peer) connect(failures int) (net.Conn, chan struct{}, error) {
	cfg := &p.t.cfg
	ctx, cancel := context.WithTimeout(p.t.ctx, cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", p.addr, err)
	}
	if cfg.TLS != nil {
		tc := tls.Client(nc, cfg.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, nil, fmt.Errorf("tls handshake with %s: %w", p.addr, err)
		}
		nc = tc
	}
	_ = nc.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	stop := context.AfterFunc(p.t.ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	err = dialHandshake(nc, cfg.ClusterSecret, p.t.self, p.id)
	stop()
	if err != nil {
		nc.Close()
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrIdentity) {
			// Misconfiguration, not a network blip: say it loudly each time
			// the backoff lets us try again.
			p.log.Error("peer refused the connection: fix the cluster configuration", "err", err, "failures", failures+1)
		}
		return nil, nil, fmt.Errorf("handshake with %s: %w", p.addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	dead := make(chan struct{})
	p.t.wg.Add(1)
	go func() {
		defer p.t.wg.Done()
		defer close(dead)
		var b [256]byte
		for {
			n, err := nc.Read(b[:])
			if err != nil {
				return
			}
			if n > 0 {
				p.log.Warn("peer wrote on an outbound connection; closing it", "bytes", n)
				nc.Close()
				return
			}
		}
	}()
	return nc, dead, nil
}

// writePiece is the most one Write hands the socket under one deadline.
const writePiece = 8 << 20

// writeTimed writes b with the timeout bounding each piece's progress, not
// the whole: a batch holding a large snapshot takes as long as the link
// needs, while a peer that stops reading is still found out within timeout.
// A batch up to writePiece bytes is one Write, as before.
func writeTimed(nc net.Conn, b []byte, timeout time.Duration) error {
	return writePieces(nc, b, timeout, writePiece)
}

func writePieces(nc net.Conn, b []byte, timeout time.Duration, piece int) error {
	for len(b) > 0 {
		k := min(len(b), piece)
		_ = nc.SetWriteDeadline(time.Now().Add(timeout))
		n, err := nc.Write(b[:k])
		b = b[n:]
		if err != nil {
			return err
		}
	}
	return nil
}
