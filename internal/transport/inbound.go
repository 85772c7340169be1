package transport

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
)

const (
	readBufSize = 64 << 10
	// framesPerRead bounds the frames decoded into one Handler call, so a
	// burst of tiny messages does not build one huge batch while the
	// driver waits.
	framesPerRead = 1024
	// progressEvery spaces Config.OnProgress calls of one connection.
	progressEvery = 10 * time.Millisecond
)

// serveConn runs the acceptor side of one inbound connection: the handshake,
// then, if it becomes the pair's link, its reader.
func (t *Transport) serveConn(raw net.Conn) {
	defer t.wg.Done()
	defer t.untrack(raw)
	defer raw.Close()
	remote := raw.RemoteAddr().String()
	nc := raw
	_ = nc.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	if t.cfg.TLS != nil {
		tc := tls.Server(raw, t.cfg.TLS)
		if err := tc.HandshakeContext(t.ctx); err != nil {
			t.protoFailures.Add(1)
			t.log.Warn("peer refused: TLS handshake failed", "remote", remote, "err", err)
			return
		}
		nc = tc
	}
	var (
		ap      *peer
		l, prev *link
		after   chan struct{}
	)
	admit := func(id, inc uint64) bool {
		ap = t.peers()[id]
		l, prev, after = ap.accept(nc, inc)
		return l != nil
	}
	from, _, rest, err := acceptHandshakeCfg(nc, t.cfg.ClusterSecret, t.self, t.inc, func(id uint64) bool { return t.peers()[id] != nil }, admit, t.configOK())
	if l != nil {
		close(l.ready)
	}
	if err != nil && l != nil {
		// Adopted, but READY could not be sent: let the link end the way
		// every link does (its reader fails at once), in its turn.
		nc.Close()
		t.runLink(ap, l, prev, after, nil)
		return
	}
	if err != nil {
		switch {
		case errors.Is(err, errDuplicate):
			t.log.Debug("peer dial refused: we keep the connection we hold with it", "remote", remote, "err", err)
		case errors.Is(err, ErrAuth):
			t.authFailures.Add(1)
			t.log.Warn("peer refused: authentication failed (wrong cluster secret or not a Kefir node)", "remote", remote, "err", err)
		case errors.Is(err, ErrIdentity):
			t.identityFails.Add(1)
			t.log.Error("peer refused: it belongs to a different cluster or configuration", "remote", remote, "err", err)
		default:
			if t.ctx.Err() == nil {
				t.protoFailures.Add(1)
				t.log.Warn("peer handshake failed", "remote", remote, "err", err)
			}
		}
		return
	}
	_ = nc.SetDeadline(time.Time{})
	p := t.peers()[from]
	p.c.inboundConn.Add(1)
	select {
	case p.back <- struct{}{}: // the peer is up, and this is our link to it
	default:
	}
	p.kick() // anything queued goes out on it
	t.runLink(p, l, prev, after, rest)
}

// startLink makes nc, which this node dialed, the pair's link and starts
// its reader; nil if the link the pair holds beats it (nc is closed then).
func (t *Transport) startLink(p *peer, nc net.Conn, dialer, inc uint64, rest []byte) *link {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		nc.Close()
		return nil
	}
	l, prev, after := p.adopt(nc, dialer, inc)
	if l == nil {
		t.mu.Unlock()
		nc.Close()
		p.c.duplicates.Add(1)
		p.log.Debug("our dial lost a dial race; closing it")
		return nil
	}
	close(l.ready)
	t.conns[nc] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		defer t.untrack(nc)
		t.runLink(p, l, prev, after, rest)
	}()
	return l
}

// runLink reads the pair's frames from l until it ends or misbehaves. A link
// it replaced (prev) is closed first, and the reader of the link adopted
// before it (after: prev, or one the writer let go of that may still be
// delivering what it read) must have returned before this one delivers, so a
// peer's messages reach the Handlers in the order it sent them even across a
// change of connection (with a gap for whatever the old one still had in
// flight).
func (t *Transport) runLink(p *peer, l, prev *link, after chan struct{}, rest []byte) {
	defer close(l.done)
	p.c.open.Add(1)
	defer p.c.open.Add(-1)
	log := p.log.With("remote", l.nc.RemoteAddr().String(), "dialer", l.dialer)
	if prev != nil {
		p.c.replaced.Add(1)
		prev.nc.Close()
	}
	if after != nil {
		<-after
	}
	log.Debug("peer link up")
	err := t.readLoop(p, l.nc, rest)
	p.unlink(l)
	switch {
	case errors.Is(err, frame.ErrCorrupt) || errors.Is(err, frame.ErrTooLarge):
		p.c.corrupt.Add(1)
		log.Error("closing peer connection: corrupt frame", "err", err)
	case errors.Is(err, frame.ErrSpoofed):
		p.c.spoofed.Add(1)
		log.Error("closing peer connection: message not from the authenticated peer", "err", err)
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || t.ctx.Err() != nil:
		log.Debug("peer connection closed")
	default:
		log.Info("peer connection failed", "err", err)
	}
}

// readLoop reads frames from p's connection until it ends or misbehaves.
// Every read's complete frames become one Handler call per group (a run of
// consecutive messages of one group each): they are copied into one fresh
// slab (one allocation per batch, not per message) that the messages'
// bodies alias, so the Handlers may keep them.
func (t *Transport) readLoop(p *peer, nc net.Conn, rest []byte) error {
	maxFrame := t.cfg.MaxFrame
	join := frame.Joiner{Max: t.cfg.MaxMessage}
	var msgs []frame.Message // reused: Handlers own the bodies, not the slice
	var progressAt time.Time
	buf := make([]byte, max(readBufSize, len(rest)))
	hi := copy(buf, rest)
	lo := 0
	var sizes []int // frame sizes of the current batch
	for {
		var rerr error
		if len(rest) == 0 || lo == hi {
			var n int
			n, rerr = nc.Read(buf[hi:])
			hi += n
		}
		rest = nil
		for lo < hi {
			// Find the complete frames; CheckFrame verifies their checksums.
			sizes = sizes[:0]
			span := 0
			for len(sizes) < framesPerRead {
				_, n, err := frame.CheckFrame(buf[lo+span:hi], maxFrame)
				if err != nil {
					return fmt.Errorf("frame at stream offset +%d: %w", span, err)
				}
				if n == 0 {
					break
				}
				sizes = append(sizes, n)
				span += n
			}
			if span == 0 {
				break
			}
			slab := make([]byte, span)
			copy(slab, buf[lo:lo+span])
			lo += span
			msgs = msgs[:0]
			off := 0
			for _, n := range sizes {
				// A fragment is copied out of the slab into the joined
				// message; the slab is then garbage once no message aliases it.
				whole, ok, err := join.Add(slab[off+frame.FrameHeader : off+n])
				off += n
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				m, err := frame.Open(whole)
				if err != nil {
					return err
				}
				msgs = append(msgs, m)
			}
			p.c.bytesIn.Add(uint64(span))
			if len(msgs) == 0 {
				continue
			}
			if p.partitioned.Load() {
				p.c.faultDroppedIn.Add(uint64(len(msgs)))
				continue
			}
			if err := t.dispatch(p, msgs); err != nil {
				return err
			}
		}
		// Only a message larger than a read is worth reporting (a partial
		// small frame completes with the next read): keep the clock off the
		// path of ordinary traffic.
		if hi-lo >= readBufSize || join.Pending() > 0 {
			if now := time.Now(); now.Sub(progressAt) >= progressEvery {
				progressAt = now
				t.progress(p, &join, buf[lo+min(frame.FrameHeader, hi-lo):hi])
			}
		}
		if rerr != nil {
			if hi > lo && errors.Is(rerr, io.EOF) {
				// The peer closed (or restarted) mid-write: a cut, not
				// corruption; the frame is lost like any in-flight message.
				return fmt.Errorf("connection closed %d bytes into a frame: %w", hi-lo, io.ErrUnexpectedEOF)
			}
			return rerr
		}
		// Make room: shift the partial frame down, grow for a large frame,
		// and give back a buffer a snapshot grew.
		if lo == hi {
			lo, hi = 0, 0
			if len(buf) > keepBuf {
				buf = make([]byte, readBufSize)
			}
			continue
		}
		if lo > 0 {
			hi = copy(buf, buf[lo:hi])
			lo = 0
		}
		if hi >= frame.FrameHeader {
			need := frame.FrameHeader + int(binary.LittleEndian.Uint32(buf))
			if need > len(buf) {
				// CheckFrame already refused sizes beyond maxFrame.
				nb := make([]byte, max(need, min(2*len(buf), maxFrame+frame.FrameHeader)))
				copy(nb, buf[:hi])
				buf = nb
			}
		}
	}
}

// dispatch hands each run of consecutive messages of one group to that
// group's Handler, so each group sees its messages in the peer's order. A
// group with no endpoint here has its messages dropped and counted: its
// replica is not open yet (or closed), and the engine retransmits.
func (t *Transport) dispatch(p *peer, msgs []frame.Message) error {
	groups := *t.groups.Load()
	for len(msgs) > 0 {
		g := msgs[0].Group
		n := 1
		for n < len(msgs) && msgs[n].Group == g {
			n++
		}
		run := msgs[:n:n]
		msgs = msgs[n:]
		e := groups[g]
		if e == nil || e.closed.Load() {
			p.c.unrouted.Add(uint64(len(run)))
			continue
		}
		for i := range run {
			if run[i].Engine != e.engine {
				return fmt.Errorf("%w: a %v message for group %d, which runs %v here", frame.ErrCorrupt, run[i].Engine, g, e.engine)
			}
		}
		if err := e.handler(p.id, run); err != nil {
			return fmt.Errorf("group %d: %w", g, err)
		}
		p.c.received.Add(uint64(len(run)))
		p.c.readBatches.Add(1)
	}
	return nil
}

// progress tells the group whose message is arriving (the joiner's
// unfinished one, else the partial frame at the head of the read buffer,
// whose payload starts at head) that it is on its way.
func (t *Transport) progress(p *peer, join *frame.Joiner, head []byte) {
	g, ok := join.PendingGroup()
	if !ok && join.Pending() == 0 {
		g, ok = frame.PeekGroup(head)
	}
	if !ok {
		return
	}
	if e := t.endpoint(g); e != nil && e.onProgress != nil && !e.closed.Load() {
		e.onProgress(p.id)
	}
}
