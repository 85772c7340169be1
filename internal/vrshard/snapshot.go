package vrshard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
)

// Snapshots for lagging peers. A capture scans the whole engine: for a
// large state that takes seconds, and on the driver goroutine it would stop
// heartbeats and replication for that long (a view change at the default
// 300 ms timeout). So the driver pins an engine snapshot at the applied op
// and takes the core's client table (both consistent with that op), and a
// goroutine scans and encodes; the result comes back on snapDone and the
// core sends it to every peer that asked meanwhile. One capture runs at a
// time, and checkpoints do not compact the log past its op while it runs,
// so the core still accepts it when it is ready.
//
// The message still holds the whole state in memory (the transport sends
// it as fragments past its frame limit). A chain joiner's pre-copy pulls
// its snapshot in pages from the pinned engine snapshot instead ("Paged
// snapshots" below); VR's recovery and a chain's log flush still take it
// whole.

type snapResult struct {
	s   vr.Snapshot
	err error
	// page: the result is one page of a paged snapshot (s.Data).
	page *pageRead
}

// wantSnapshot records that peer `to` needs a snapshot and starts a capture
// unless one is running (it will serve `to` as well).
func (r *Replica) wantSnapshot(to uint64) {
	r.snapFor[to] = true
	r.snapWork()
}

// snapWork starts the next capture, or page read, unless one is running:
// one at a time (snapDone holds one result), whole captures first.
func (r *Replica) snapWork() {
	if r.snapRunning {
		return
	}
	if len(r.snapFor) > 0 {
		r.startCapture()
		return
	}
	r.readPage()
}

// startCapture starts a whole capture for the peers in snapFor.
func (r *Replica) startCapture() {
	at := r.applied.Load()
	es := r.db.Snapshot(at)
	clients := r.core.ClientTable()
	r.snapRunning, r.snapAt = true, at
	r.st.snapsCaptured.Add(1)
	var delay time.Duration // a test hook's
	if mutation.On {
		delay = r.mut.captureDelay
	}
	r.exec.goWork(func() {
		defer es.Close()
		r.pause(delay)
		data, err := captureData(es, r.stop)
		r.snapDone <- snapResult{s: vr.Snapshot{Op: at, Clients: clients, Data: data}, err: err}
	})
}

// pause waits d (a test hook's delay) unless the replica stops first.
func (r *Replica) pause(d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-time.After(d):
	case <-r.stop:
	}
}

// errCaptureStopped ends a capture of a replica that is closing (Close and
// crash wait for it: drainSync).
var errCaptureStopped = errors.New("vrshard: snapshot capture stopped: replica closing")

// captured hands a finished capture to the core for every peer waiting for
// it. A failed scan fails the replica, as any engine read error on the
// driver does.
func (r *Replica) captured(res snapResult) error {
	r.snapRunning = false
	defer r.snapWork()
	if res.page != nil {
		return r.pageDone(res)
	}
	if res.err != nil {
		return fmt.Errorf("vrshard: snapshot at %d: %w", res.s.Op, res.err)
	}
	// In member order, not the map's: the messages' order is output (the
	// simulator replays a run only if it is deterministic).
	tos := make([]uint64, 0, len(r.snapFor))
	for to := range r.snapFor {
		tos = append(tos, to)
	}
	slices.Sort(tos)
	for _, to := range tos {
		delete(r.snapFor, to)
		if err := r.core.SendSnapshot(to, res.s); err != nil {
			r.log.Warn("snapshot not sent", "to", to, "err", err)
		}
	}
	// The core's Ready carries the message(s); run's loop handles it next
	// (send counts and logs each snapshot that goes to the transport).
	return nil
}

// captureData encodes every engine key at the snapshot's version (client
// table rows included) with its value, version and timestamp: count
// uvarint, then per key: key, value, version uvarint, ts varint; then, if
// any key has meta (storage.Record.Meta: a TTL), a trailer: count uvarint,
// then per such key: its index uvarint, meta (restore reads it back). The
// trailer comes last so that a snapshot from a build before meta decodes
// unchanged (and one without meta is byte for byte what it was).
func captureData(es *storage.Snapshot, stop <-chan struct{}) ([]byte, error) {
	data, _, _, err := capturePage(es, nil, 0, stop)
	return data, err
}

// capturePage encodes, as captureData does, the keys after the cursor after
// (nil: from the first) until about limit bytes (0: no limit), and returns
// the last key it took (the next page's cursor) and whether keys follow.
func capturePage(es *storage.Snapshot, after []byte, limit int, stop <-chan struct{}) (data, next []byte, more bool, err error) {
	// The count goes in front, once it is known: room is kept for its
	// longest encoding, so the state is not copied a second time.
	body := make([]byte, binary.MaxVarintLen64, 64<<10)
	n := 0
	stopped := false
	var metas []byte // the trailer's entries
	nmeta := 0
	var start []byte
	if after != nil {
		start = append(append(start, after...), 0) // the first key after it
	}
	err = es.Scan(start, nil, 0, func(k []byte, v storage.Value) bool {
		if limit > 0 && n > 0 && len(body)+len(metas) >= limit {
			more = true
			return false
		}
		next = append(next[:0], k...)
		if n%1024 == 0 {
			select {
			case <-stop:
				stopped = true
				return false
			default:
			}
		}
		body = appendBytes(body, k)
		body = appendBytes(body, v.Data)
		body = binary.AppendUvarint(body, v.Version)
		body = binary.AppendVarint(body, v.Timestamp)
		if len(v.Meta) > 0 {
			metas = binary.AppendUvarint(metas, uint64(n))
			metas = appendBytes(metas, v.Meta)
			nmeta++
		}
		n++
		return true
	})
	if nmeta > 0 {
		body = binary.AppendUvarint(body, uint64(nmeta))
		body = append(body, metas...)
	}
	if err == nil && stopped {
		err = errCaptureStopped
	}
	if err != nil {
		return nil, nil, false, err
	}
	var count [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(count[:], uint64(n))
	at := binary.MaxVarintLen64 - k
	copy(body[at:], count[:k])
	if n == 0 {
		next = after
	}
	return body[at:], next, more, nil
}

// Paged snapshots (a chain joiner's pre-copy; docs/design/chain.md, "Paged
// snapshots"). A whole capture holds the state in memory and goes as one
// message, and the joiner restores it in one go on its driver: at 200 MB a
// join took the chain's cores for seconds. A joiner instead pulls its
// snapshot a page at a time, paced by its PrecopyRate: the first request
// pins an engine snapshot at the applied op (pageSrc), with the client
// table of that op, and each request reads the next page of about
// SnapshotPage bytes, in key order after the joiner's cursor, from that
// same engine snapshot — every page at the one version, so the pages are
// together exactly the state at that op, which the log after it continues.
// Reads run off the driver, one at a time (snapRunning, as a capture).
// The last page carries the client table. A source the joiner stops
// pulling goes after pageIdle; a checkpoint keeps the log after its op
// (holdLog), so the core can still name the position.

// pageSrc is a paged snapshot a peer is pulling.
type pageSrc struct {
	es      *storage.Snapshot
	at      uint64
	clients []core.ClientRecord
	want    *core.PageRequest // a request not read yet
	reading bool              // a read of it runs (its es is closed after)
	last    time.Time         // its last request
}

// pageIdle: a paged snapshot nobody asked a page of for this long is
// dropped (its joiner died or went elsewhere); a joiner asks again at once
// after each page, or after its pace's wait.
const pageIdle = 10 * time.Second

// pageRead is a page read off the driver: for peer to, of src, after the
// cursor after; next and more as capturePage's.
type pageRead struct {
	to          uint64
	src         *pageSrc
	after, next []byte
	more        bool
}

// wantPage records a peer's request for a page (core.Ready.SnapshotPages):
// of the snapshot it is pulling, or the first page of a new one.
func (r *Replica) wantPage(req core.PageRequest) {
	src := r.pages[req.To]
	if src == nil || req.Op == 0 || src.at != req.Op {
		r.dropPage(req.To)
		at := r.applied.Load()
		src = &pageSrc{es: r.db.Snapshot(at), at: at, clients: r.core.ClientTable()}
		r.pages[req.To] = src
		req.After = nil
		r.st.snapsCaptured.Add(1)
	}
	src.want, src.last = &req, r.clock.Now()
	r.snapWork()
}

// readPage starts the read of a requested page, if any (in peer order: the
// simulator replays only a deterministic run).
func (r *Replica) readPage() {
	tos := make([]uint64, 0, len(r.pages))
	for to, src := range r.pages {
		if src.want != nil {
			tos = append(tos, to)
		}
	}
	if len(tos) == 0 {
		return
	}
	slices.Sort(tos)
	src := r.pages[tos[0]]
	req := *src.want
	src.want, src.reading = nil, true
	r.snapRunning = true
	limit := r.opts.Chain.snapshotPage()
	moving := mutation.On && r.mut.pageMovingVersion
	r.exec.goWork(func() {
		es := src.es
		if moving {
			// The mutation: each page read at the engine's version of
			// the moment, not the capture's.
			es = r.db.Snapshot(0)
			defer es.Close()
		}
		data, next, more, err := capturePage(es, req.After, limit, r.stop)
		r.snapDone <- snapResult{s: vr.Snapshot{Op: src.at, Data: data}, err: err,
			page: &pageRead{to: req.To, src: src, after: req.After, next: next, more: more}}
	})
}

// pageDone sends a page read to its peer (the last with the client table).
func (r *Replica) pageDone(res snapResult) error {
	p := res.page
	p.src.reading = false
	if r.pages[p.to] != p.src {
		p.src.es.Close() // dropped while it was read
		return nil
	}
	if res.err != nil {
		return fmt.Errorf("vrshard: snapshot page at %d: %w", res.s.Op, res.err)
	}
	s := core.Snapshot{Op: p.src.at, Data: res.s.Data, From: p.after, Next: p.next, More: p.more}
	if !p.more {
		s.Clients = p.src.clients
		r.dropPage(p.to)
	}
	if err := r.core.SendSnapshot(p.to, s); err != nil {
		r.log.Warn("snapshot page not sent", "to", p.to, "err", err)
		r.dropPage(p.to)
	}
	return nil
}

// dropPage forgets the paged snapshot of peer to (its engine snapshot is
// closed now, or by its read when that ends).
func (r *Replica) dropPage(to uint64) {
	src := r.pages[to]
	if src == nil {
		return
	}
	delete(r.pages, to)
	if !src.reading {
		src.es.Close()
	}
}

// largeMessage is the size from which a message is encoded off the driver
// goroutine: encoding copies and checksums it, about a second per GiB once
// it is fragmented (wire's BenchmarkAppendFramesSnapshot: 1.05 GB/s here) —
// a snapshot, or a recovery response or view change carrying a log of large
// values.
const largeMessage = 256 << 10

// hugeMessage: any message from this size on is encoded off the driver
// (prepares are bounded by MaxBatchBytes, so in practice only state).
const hugeMessage = 64 << 20

// maxHeld bounds the messages held for a peer while its large message is
// being queued; beyond it they are dropped, as a full transport queue
// would (VR retransmits).
const maxHeld = 4096

// send hands m to the transport. A large message (largeMessage) is encoded
// and queued by a goroutine (transport.SendLarge), and the messages for the
// same peer after it wait in r.held until it is queued, so the peer still gets
// them in the order the core sent them; a further large one meanwhile is
// dropped, as VR retransmits. The host reads the message only through
// peerMsg (vrcore.go: the engine's encoding and what the holds need).
func (r *Replica) send(m peerMsg) {
	if lm, ok := m.(*masterBound); ok && lm.sendLocal(r.cfg.Self) {
		return // a chain member's message to its own node's master (chainhost.go)
	}
	to := m.Dest()
	size, state := m.Size(), m.CarriesState()
	large := size >= hugeMessage || state && size >= largeMessage
	if h, holding := r.held[to]; holding {
		if large && state {
			// A retransmission (a recovering replica asks every heartbeat)
			// or another copy of the state: it would only follow the first.
			if op, _, ok := m.SnapshotAt(); ok {
				r.log.Debug("snapshot dropped: the previous one for the peer is still being encoded", "to", to, "op", op)
			}
			return
		}
		if len(h) < maxHeld {
			r.held[to] = append(h, m.Own())
		}
		return
	}
	if op, n, ok := m.SnapshotAt(); ok {
		h := snapHold{op: op, size: n}
		if !large {
			h.until = r.clock.Now().Add(holdFor(h.size, r.cfg.ViewChangeTimeout))
		} // else its time starts once it is queued (sentLarge)
		r.snapHolds[to] = h
		r.st.snapsSent.Add(1)
		r.log.Info("sent snapshot", "to", to, "op", op, "bytes", n)
	}
	if large {
		r.held[to] = nil
		r.largeOut++
		big := m.Own()
		var delay time.Duration // a test hook's
		if mutation.On {
			delay = r.mut.encodeDelay
		}
		r.exec.goWork(func() {
			r.pause(delay)
			if err := r.net.SendLarge(to, big); err != nil && !errors.Is(err, transport.ErrClosed) {
				r.log.Warn("send failed", "to", to, "err", err)
			}
			r.largeDone <- to
		})
		return
	}
	var err error
	if r.inlineRound && r.ep != nil {
		// On a reader's or the syncer's goroutine, which parks next
		// (inline.go): write to an idle link here rather than wake its
		// writer. Not on run's: there the writer takes the socket writes
		// off the driver under load (2350e47).
		r.push[0] = transport.Outbound{To: to, Msg: m}
		err = r.ep.SendAll(r.push[:])
		r.push[0] = transport.Outbound{}
	} else {
		err = r.net.Send(to, m)
	}
	if err != nil && !errors.Is(err, transport.ErrClosed) {
		r.log.Warn("send failed", "to", to, "err", err)
	}
	if cadtraceOn {
		traceSent(r, m)
	}
}

// sentLarge: the large message for peer `to` is queued; what waited behind
// it follows.
func (r *Replica) sentLarge(to uint64) {
	r.largeOut--
	if h, ok := r.snapHolds[to]; ok && h.until.IsZero() {
		h.until = r.clock.Now().Add(holdFor(h.size, r.cfg.ViewChangeTimeout))
		r.snapHolds[to] = h
	}
	h := r.held[to]
	delete(r.held, to)
	for _, m := range h {
		r.send(m)
	}
}

// snapHold keeps the log after a sent snapshot's op for the peer receiving
// it: compacted past it before the peer installs it, the snapshot is stale
// on arrival (the peer cannot catch up from the log) and another, as large,
// is needed; under a steady write load that never ends.
//
// Its time runs from when the snapshot is queued on the link, not from when
// the core sent it: a large one is encoded on a goroutine first (send), and
// that takes about a second per GiB, longer on a loaded machine. Counted
// from the core's send, the hold ran out while the snapshot was still being
// encoded, a checkpoint then compacted past its op, and the peer needed a
// second snapshot as large as the first. While it is encoded (until is
// zero), the log is kept: the encoding is bounded, as a running capture is.
type snapHold struct {
	op    uint64
	size  int       // bytes of state, for holdFor
	until time.Time // zero while the snapshot is being encoded
}

// holdFor is how long the log is kept for a snapshot of size bytes: twice
// the time it takes at 32 MiB/s (half the rate the core's resend interval
// assumes), at least two view-change timeouts.
func holdFor(size int, vct time.Duration) time.Duration {
	return max(2*vct, 2*time.Duration(int64(size)/(32<<10))*time.Millisecond)
}

// holdLog lowers a compaction point to keep the log after the op of a
// running capture (or the core would refuse the snapshot once it is ready)
// and after every snapshot still being encoded or that a peer may still be
// receiving, and forgets the holds that ran out.
func (r *Replica) holdLog(to uint64) uint64 {
	if r.snapRunning {
		to = min(to, r.snapAt)
	}
	now := r.clock.Now()
	for id, src := range r.pages {
		if now.Sub(src.last) > pageIdle {
			r.dropPage(id)
			continue
		}
		to = min(to, src.at)
	}
	for id, h := range r.snapHolds {
		if !h.until.IsZero() && now.After(h.until) {
			delete(r.snapHolds, id)
			continue
		}
		to = min(to, h.op)
	}
	return to
}
