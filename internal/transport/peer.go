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

// link is one authenticated connection with the peer, dialed by either node.
// It carries the pair's traffic both ways: the peer's writer goroutine writes
// to it, and its reader (runLink) reads the peer's frames from it.
type link struct {
	nc     net.Conn
	raw    syscall.RawConn // nil for TLS (push then leaves the writing to the writer)
	dialer uint64          // the node that dialed it
	inc    uint64          // the peer's incarnation, from the handshake
	at     time.Time       // when it became the pair's link
	done   chan struct{}   // closed when its reader has returned
	// ready is closed once the handshake's last line is written: an
	// accepted link becomes the pair's link just before its READY goes out
	// (peer.accept), and no frame may precede that line.
	ready chan struct{}
}

// peer is this node's side of the link to one peer node: the outbound queue
// and its writer, the current connection, the link's counters and fault.
type peer struct {
	t    *Transport
	id   uint64
	addr string
	log  *slog.Logger
	wake chan struct{} // capacity 1: "the queue is not empty"
	// back (capacity 1) says a connection from the peer became the link: it
	// is up, so the writer's dial backoff, grown while it was down, no longer
	// applies, and a writer waiting for the link after a refused duplicate
	// dial has it (serveConn; the writer takes it).
	back chan struct{}
	// redial (capacity 1) asks the writer to replace the current link with a
	// fresh dial: the peer dialed us while we hold a link with it that beats
	// its dial, old enough not to be a dial race, so the peer has most likely
	// lost that link (a half-open connection, admit).
	redial chan struct{}
	c      counters

	// partitioned mirrors fault.Partition for the reader, which must not take
	// mu per read.
	partitioned atomic.Bool
	// cur is the pair's one connection (nil: none). A new one replaces it if
	// it beats it (beats); the replaced one is closed, and the new one's
	// reader delivers only after the old one's has returned.
	// Readers load it without the lock (the writer checks it per batch);
	// linkMu orders the decisions that replace it.
	linkMu sync.Mutex
	cur    atomic.Pointer[link]
	// lastDone is the done channel of the link adopted last, whether or not
	// it is still the pair's link: a link whose writer gave up on it
	// (unlink) may still be delivering what it read, and the next link
	// must not deliver before it has finished. REQUIRES: linkMu.
	lastDone chan struct{}

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

// run is the peer's writer goroutine: it writes the queue to the pair's
// link, dialing one when there is none.
func (p *peer) run() {
	defer p.t.wg.Done()
	var (
		l         *link         // the link the writer writes to
		dead      chan struct{} // l.done: closed when l's reader has returned
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
	midFrame := false // the line's head was partly written on l (by push)
	use := func(nl *link) {
		select {
		case <-nl.ready:
		case <-nl.done:
		}
		l, dead = nl, nl.done
		p.c.connected.Store(true)
		p.mu.Lock()
		p.raw = nl.raw
		p.mu.Unlock()
	}
	// closeConn lets go of l: it is closed (its reader then returns) and no
	// longer the pair's link. A message partly written on it is dropped.
	closeConn := func() {
		if l == nil {
			return
		}
		p.unlink(l)
		l, dead = nil, nil
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
	// switchTo moves the writer to the pair's current link if it is not the
	// one the writer holds (a link the peer dialed replaced ours, or ours
	// was replaced by a fresh dial): what was partly written on the old one
	// is dropped with it.
	switchTo := func() {
		if c := p.current(); c != l {
			closeConn()
			if c != nil {
				use(c)
			}
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
			if l != nil {
				p.mu.Lock()
				p.idle = len(p.buf) == 0
				p.mu.Unlock()
			}
			select {
			case <-p.wake:
			case <-dead:
				closeConn()
			case <-p.redial:
				p.refresh(failures)
				switchTo()
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
		if l == nil {
			nl, err := p.obtain(failures)
			if errors.Is(err, errDuplicate) {
				// A dial race the peer's link won: it is reaching us as an
				// inbound connection (or just did). Wait for it; only if it
				// does not come is this a failed dial.
				p.c.duplicates.Add(1)
				timer.Reset(p.t.cfg.HandshakeTimeout)
				select {
				case <-p.back:
					timer.Stop()
				case <-timer.C:
				case <-p.t.ctx.Done():
					timer.Stop()
				}
				if nl = p.current(); nl != nil {
					err = nil
				}
			}
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
					// The peer connected to us: it is up again, and its
					// connection is our link now. Write at once instead of
					// sleeping out a backoff that grew while it was down (a
					// returning follower would otherwise not hear its leader
					// for up to MaxDialBackoff).
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
			if failures > 0 {
				p.log.Info("peer connected", "after_failures", failures)
			}
			failures = 0
			select {
			case <-p.back: // stale: we are connected
			default:
			}
			use(nl)
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
		if n > 0 && p.current() != l {
			// The link was replaced (the peer's connection or a fresh dial
			// beat it): write on the new one rather than into a closed one.
			switchTo()
			if l == nil {
				continue
			}
		}
		if n > 0 {
			if err := writeTimed(l.nc, line[:end], p.t.cfg.WriteTimeout); err != nil {
				if p.current() != l {
					p.log.Debug("peer link replaced during a write; dropping the batch", "err", err, "messages", n)
				} else {
					p.log.Warn("peer write failed; dropping the batch and reconnecting", "err", err, "messages", n)
				}
				midFrame = false // dropped with the batch
				closeConn()
				consume(n, end, &p.c.dropped)
				continue
			}
			// A deadline left armed would make push's RawConn.Write fail
			// once it passes.
			_ = l.nc.SetWriteDeadline(time.Time{})
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
		case <-p.redial:
			timer.Stop()
			p.refresh(failures)
			switchTo()
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

// connect dials the peer and runs TLS and the handshake. It returns the
// connection, the peer's incarnation and the frame bytes that came with
// READY; errDuplicate if the peer keeps the link it holds with us.
func (p *peer) connect(failures int) (net.Conn, uint64, []byte, error) {
	cfg := &p.t.cfg
	ctx, cancel := context.WithTimeout(p.t.ctx, cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("dial %s: %w", p.addr, err)
	}
	if cfg.TLS != nil {
		tc := tls.Client(nc, cfg.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, 0, nil, fmt.Errorf("tls handshake with %s: %w", p.addr, err)
		}
		nc = tc
	}
	_ = nc.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	stop := context.AfterFunc(p.t.ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	inc, rest, err := dialHandshakeCfg(nc, cfg.ClusterSecret, p.t.self, p.t.inc, p.id, p.t.configOK())
	stop()
	if err != nil {
		nc.Close()
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrIdentity) {
			// Misconfiguration, not a network blip: say it loudly each time
			// the backoff lets us try again.
			p.log.Error("peer refused the connection: fix the cluster configuration", "err", err, "failures", failures+1)
		}
		return nil, 0, nil, fmt.Errorf("handshake with %s: %w", p.addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	if p.c.connects.Add(1) > 1 {
		p.c.reconnects.Add(1)
	}
	return nc, inc, rest, nil
}

// obtain returns the pair's link, dialing one if there is none.
func (p *peer) obtain(failures int) (*link, error) {
	if c := p.current(); c != nil {
		return c, nil
	}
	nc, inc, rest, err := p.connect(failures)
	if err != nil {
		return nil, err
	}
	if l := p.t.startLink(p, nc, p.t.cfg.Self, inc, rest); l != nil {
		return l, nil
	}
	// The peer's own dial won while ours was in its handshake.
	if c := p.current(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("%w: and that connection is gone already", errDuplicate)
}

// refresh replaces the pair's link with a fresh dial (redial). A failed
// dial leaves the link as it is: if it is dead, its reader or the next
// write finds out.
func (p *peer) refresh(failures int) {
	nc, inc, rest, err := p.connect(failures)
	if err != nil {
		p.log.Info("redial to replace a link the peer has likely lost failed", "err", err)
		return
	}
	p.log.Info("replaced the link: the peer dialed us while we held one with it")
	p.t.startLink(p, nc, p.t.cfg.Self, inc, rest)
}

// current returns the pair's link (nil: none).
func (p *peer) current() *link { return p.cur.Load() }

// preferred reports whether a connection dialed by node dialer is the one a
// dial race keeps: the lower node id's.
func (p *peer) preferred(dialer uint64) bool { return dialer == min(p.t.cfg.Self, p.id) }

// beatsLocked reports whether a new connection, dialed by dialer with the
// peer at incarnation inc, replaces the current link. It does if there is
// none; if the peer's incarnation changed (it restarted, so the current
// link is dead, whoever dialed it); if it is the preferred direction (a
// reconnect in that direction, or the winner of a dial race); or if the
// current link is not of the preferred direction either (a reconnect: the
// newer one wins, the older is half-open). It does not only when the
// current link is of the preferred direction and the new one is not: the
// loser of a dial race. Both nodes apply the same rule, so they keep the
// same connection. REQUIRES: linkMu held.
func (p *peer) beatsLocked(dialer, inc uint64) bool {
	c := p.cur.Load()
	return c == nil || c.inc != inc || p.preferred(dialer) || !p.preferred(c.dialer)
}

// accept is the acceptor's decision before READY on nc, a connection the
// peer dialed (its incarnation inc): it adopts nc as the pair's link (as
// adopt) unless the current link beats it. It adopts before READY is sent,
// so the dialer, which adopts when READY arrives and dials again only after
// that, can never have its later dial adopted here before this one. If the
// current link beats nc and is old enough not to be in a dial race with it
// (the peer dialed before our dial reached it), the peer has most likely
// lost that link (it sits half-open here), so the writer is asked to
// replace it with a fresh dial, which beats it at both ends.
func (p *peer) accept(nc net.Conn, inc uint64) (l, prev *link, after chan struct{}) {
	p.linkMu.Lock()
	if !p.beatsLocked(p.id, inc) {
		stale := time.Since(p.cur.Load().at) > p.t.cfg.DialTimeout+p.t.cfg.HandshakeTimeout
		p.linkMu.Unlock()
		p.c.duplicates.Add(1)
		if stale {
			select {
			case p.redial <- struct{}{}:
			default:
			}
		}
		return nil, nil, nil
	}
	l, prev, after = p.adoptLocked(nc, p.id, inc)
	p.linkMu.Unlock()
	return l, prev, after
}

// adopt makes nc (dialed by dialer, the peer at incarnation inc) the pair's
// link if it beats the current one, and returns it, the link it replaces
// (nil if none) and the done channel of the link adopted before it (nil if
// none), whose reader must return before this one delivers. l is nil if nc
// lost: the caller closes it.
func (p *peer) adopt(nc net.Conn, dialer, inc uint64) (l, prev *link, after chan struct{}) {
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if !p.beatsLocked(dialer, inc) {
		return nil, nil, nil
	}
	return p.adoptLocked(nc, dialer, inc)
}

// adoptLocked makes nc the pair's link. REQUIRES: linkMu held.
func (p *peer) adoptLocked(nc net.Conn, dialer, inc uint64) (l, prev *link, after chan struct{}) {
	l = &link{nc: nc, dialer: dialer, inc: inc, at: time.Now(), done: make(chan struct{}), ready: make(chan struct{})}
	if sc, ok := nc.(syscall.Conn); ok {
		l.raw, _ = sc.SyscallConn()
	}
	prev = p.cur.Swap(l)
	after, p.lastDone = p.lastDone, l.done
	return l, prev, after
}

// unlink closes l and, if it is still the pair's link, leaves the pair
// without one.
func (p *peer) unlink(l *link) {
	p.linkMu.Lock()
	p.cur.CompareAndSwap(l, nil)
	p.linkMu.Unlock()
	l.nc.Close()
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
