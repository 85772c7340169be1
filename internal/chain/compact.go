package chain

import (
	"bytes"
	"maps"
	"slices"
	"sort"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Compaction bounds a member's history in memory (docs/design/chain.md,
// "Bounded history"). A member drops the prefix of its log that no member
// can still need from it:
//
//   - Up to its LA only. An entry at or below LA was acknowledged by the
//     successor, so it reached the chain's last member, and every replica
//     holds it (history containment). A CR_MID repair re-sends after the
//     new successor's LU, and that successor is upstream of (or is) the
//     last member, so its LU is at least this member's LA: the re-send
//     never reaches below the compaction point.
//   - At the tail (LA = LU there), not past a joiner's pre-copy position
//     (its pin, set by each pre-copy request): the log flush sends the old
//     tail's entries after the joiner's pre-copy end (Config.PinTimeout
//     bounds how long a silent joiner's pin holds). The pins go when the
//     tail does that flush (the master runs one join at a time).
//   - A joiner that asks after a compacted position (its restart's durable
//     prefix is older, or it starts with nothing) gets a snapshot instead:
//     the state machine at a position the tail holds, and the pre-copy goes
//     on after it. An old tail that compacted past the joiner's pre-copy
//     end (it became the tail after the joiner last asked, or a pin timed
//     out) sends a snapshot in the log flush the same way.

// base is the compacted prefix of a member's history.
type base struct {
	n   int    // entries dropped
	seq uint64 // the last one's sequence number (0: none, or unknown)
	sum uint64 // the running digest through it
}

// Snap is a snapshot a tail sends a joiner in its pre-copy: the history's
// first N entries, the last numbered Seq, with digest Sum, as the state
// machine they produce (Data: the state machine's Snapshotter encoding, or
// what the host put there); Versions are the tail's key versions up to Seq
// (CRAQ reads).
type Snap struct {
	N        int
	Seq, Sum uint64
	Data     []byte
	Versions map[string]uint64
	// A host's large state travels as pages (docs/design/chain.md, "Paged
	// snapshots"): each page a precopy-chunk of its own, pulled (and
	// paced) one at a time like log chunks, so no message holds the whole
	// state and the joiner's host applies it a page at a time. From is the
	// host's cursor the page starts after (nil: the first page), Next the
	// one the page ends at (the next page's From), More that pages follow;
	// the core does not read the cursors. Every page of one snapshot has
	// the same N: the source's host reads them all at that one position.
	// Only the last page (More false) is installed as the history's prefix
	// (with Versions, and the entries after it); the pages before it are
	// its host's alone. In a precopy-req, Snap asks for the page of the
	// snapshot at N after Next.
	From, Next []byte
	More       bool
}

// Snapshotter is implemented by a StateMachine that can hand its state to a
// joiner itself. Without it, the member asks its host (MsgSnapshotNeeded)
// and the host answers with SendSnapshot.
type Snapshotter interface {
	Snapshot() []byte
	Restore(data []byte)
}

// total is the history's length, compacted prefix included.
func (m *Member) total() int { return m.base.n + len(m.log) }

// lastSeq is the sequence number of the history's last entry (0: none).
func (m *Member) lastSeq() uint64 {
	if n := len(m.log); n > 0 {
		return m.log[n-1].Seq
	}
	return m.base.seq
}

func (m *Member) lastSum() uint64 {
	if n := len(m.log); n > 0 {
		return m.log[n-1].sum
	}
	return m.base.sum
}

// Base returns how many history entries were compacted away and the last
// one's sequence number: History holds the entries after them.
func (m *Member) Base() (n int, seq uint64) { return m.base.n, m.base.seq }

// CompactBound is the highest sequence number Compact may drop to now.
func (m *Member) CompactBound() uint64 {
	if mutation.On && m.mut.compactPastLA {
		return m.lu
	}
	if m.state != Active {
		return m.base.seq // a joiner's history is not a replica's yet
	}
	to := m.la
	for _, p := range m.pins {
		if t := m.cfg.PinTimeout; t == 0 || m.now-p.at < t {
			to = min(to, p.seq)
		}
	}
	return to
}

// Compact drops the log's entries up to seq, as far as CompactBound
// allows, and returns how many entries the history's compacted prefix then
// holds. The host has the state they produced (a checkpoint).
func (m *Member) Compact(seq uint64) int {
	seq = min(seq, m.CompactBound())
	i := sort.Search(len(m.log), func(i int) bool { return m.log[i].Seq > seq })
	if i == 0 {
		return m.base.n
	}
	last := m.log[i-1]
	m.base = base{n: m.base.n + i, seq: last.Seq, sum: last.sum}
	m.log = append([]Entry(nil), m.log[i:]...) // let the dropped prefix go
	return m.base.n
}

// pin records a joiner's pre-copy position at this tail.
func (m *Member) pin(joiner NodeID, seq uint64) {
	if m.pins == nil {
		m.pins = map[NodeID]pin{}
	}
	m.pins[joiner] = pin{seq: seq, at: m.now}
}

// pin is a joiner's pre-copy position (the seq it last asked after) and
// when it asked, on the member's clock.
type pin struct {
	seq uint64
	at  int64
}

// snapshotFor answers a joiner whose pre-copy position was compacted away:
// with the state machine's own snapshot, or by asking the host for one.
func (m *Member) snapshotFor(joiner NodeID) {
	if s, ok := m.sm.(Snapshotter); ok {
		m.sendSnap(joiner, m.total(), s.Snapshot(), nil)
		return
	}
	m.send(m.cfg.ID, Msg{Type: MsgSnapshotNeeded, Target: joiner})
}

// pageFor answers a joiner's request for the next page of the snapshot at
// p.N: the host reads it (snapshot-needed carrying the cursor) and answers
// with SendSnapshotPage. A position this member can no longer name by
// sequence number (compacted past: the host's capture ended) starts a new
// snapshot; the joiner starts over with its first page.
func (m *Member) pageFor(joiner NodeID, p *Snap) {
	if p.N < m.base.n || p.N > m.total() || p.N == 0 {
		m.pin(joiner, m.base.seq)
		m.snapshotFor(joiner)
		return
	}
	m.pin(joiner, m.snapAt(p.N, nil).Seq)
	m.send(m.cfg.ID, Msg{Type: MsgSnapshotNeeded, Target: joiner, Snap: &Snap{N: p.N, Next: p.Next}})
}

// SendSnapshot sends joiner the snapshot the host captured: data is the
// state machine through the history's first n entries. n must be one the
// member still knows the sequence number of (not below its compacted
// prefix) and not beyond its history; the joiner's pre-copy goes on after
// it. It reports whether it was sent.
func (m *Member) SendSnapshot(joiner NodeID, n int, data []byte) bool {
	return m.SendSnapshotPage(joiner, Snap{N: n, Data: data})
}

// SendSnapshotPage sends joiner one page of the host's snapshot at p.N
// (p.Data, p.From, p.Next, p.More; Snap's paging fields): the last page
// with the entries after the snapshot, as SendSnapshot. A held FLUSH's
// snapshot (the log flush) goes whole: a page with More is refused for it.
func (m *Member) SendSnapshotPage(joiner NodeID, p Snap) bool {
	n := p.N
	if n < m.base.n || n > m.total() || n == 0 || m.state != Active {
		return false
	}
	if f := m.flushWait; f != nil && f.Joiner == joiner {
		if p.More || p.From != nil {
			return false
		}
		// The held FLUSH: the log flush with the snapshot, then FLUSH on.
		m.flushWait = nil
		m.logFlush(*f, m.snapAt(n, p.Data))
		i := slices.Index(f.Path[1:], m.cfg.ID) + 1
		m.send(f.Path[i+1], *f)
		return true
	}
	if m.succ != 0 {
		return false
	}
	if p.More {
		s := m.snapAt(n, p.Data)
		if p.From != nil {
			// The first page carries the key versions, read when the
			// capture began (with a Snapshotter-less state machine that is
			// when its host answers snapshot-needed): a key written since
			// has lost its version at N from lastWrite.
			s.Versions = nil
		}
		s.From, s.Next, s.More = p.From, p.Next, true
		m.pin(joiner, s.Seq)
		m.send(joiner, Msg{Type: MsgPrecopyChunk, Snap: s})
		return true
	}
	m.sendSnap(joiner, n, p.Data, p.From)
	return true
}

func (m *Member) sendSnap(joiner NodeID, n int, data, from []byte) {
	s := m.snapAt(n, data)
	if from != nil {
		s.From, s.Versions = from, nil // the first page carried them
	}
	es, done := m.after(s.Seq, m.cfg.PrecopyChunk)
	asked := m.pins[joiner].seq // LU: the request it answers (install)
	m.pin(joiner, s.Seq)
	m.send(joiner, Msg{Type: MsgPrecopyChunk, Snap: s, Entries: es, Done: done, LA: uint64(m.total()), LU: asked})
}

// snapAt is the snapshot of the history's first n entries (n at least the
// compacted prefix), with the state machine's state data.
func (m *Member) snapAt(n int, data []byte) *Snap {
	s := &Snap{N: n, Seq: m.base.seq, Sum: m.base.sum, Data: data}
	if n > m.base.n {
		e := m.log[n-m.base.n-1]
		s.Seq, s.Sum = e.Seq, e.sum
	}
	if m.keyed != nil {
		s.Versions = map[string]uint64{}
		for k, v := range m.lastWrite {
			if v <= s.Seq {
				s.Versions[k] = v
			}
		}
	}
	return s
}

// install makes a joiner's history the snapshot's (a pre-copy chunk from a
// tail that compacted past what it held, or that does not hold its last
// update). current: the snapshot answers the joiner's request after its LU
// as it is now (the chunk's LU), not an earlier one repeated.
func (m *Member) install(s *Snap, current bool) {
	unknown := m.base.n > 0 && m.base.seq == 0 && len(m.log) == 0
	// A source sends a snapshot for a request after a number it does not
	// hold (MsgPrecopyReq): a joiner whose history is not a prefix of the
	// snapshot's — longer, or another update at its end — went another
	// way, and what it holds is replaced, not continued. Its end is
	// lastSeq, not a log entry: a history compacted to its end (a host's
	// checkpoint with nothing after it) has its last number in its base,
	// and one of the snapshot's length ending in another update joined as
	// it was (review36a).
	diverged := current && !unknown && s.N <= m.total() &&
		(s.N < m.total() || s.Seq != 0 && m.lastSeq() != s.Seq)
	// A joiner whose host took pages of a snapshot (paged) holds their
	// state, not its history's, whatever the last page's N: the history is
	// replaced too. The last page's LU names no request of the joiner's
	// (the source pinned the snapshot's number at the first page), so a
	// diverged joiner answered in pages is not current: before review36a
	// its history stayed, the pages' state was never restored, and every
	// join after ended the same way
	// (TestPrecopyReplacesADivergedHistoryInPages).
	paged := m.paged
	if s.N <= m.total() && !unknown && !diverged && !paged {
		return // nothing new: the chunk's entries follow what it holds
	}
	m.log = nil
	m.base = base{n: s.N, seq: s.Seq, sum: s.Sum}
	// A joining member's LU counts its temporary store too.
	m.lu, m.persistReq, m.persisted, m.unbatched = max(m.lu, s.Seq), max(m.persistReq, s.Seq), max(m.persisted, s.Seq), 0
	if diverged || paged {
		// Its history went another way from the source's (the source did
		// not hold its last update: MsgPrecopyReq), or its state is the
		// pages' (paged): what it held past the snapshot is no one's, and
		// its numbers must not hold LU up.
		m.lu, m.persistReq, m.persisted = s.Seq, s.Seq, s.Seq
		if n := len(m.tmp); n > 0 {
			m.lu = max(m.lu, m.tmp[n-1].Seq)
		}
	}
	if m.keyed != nil {
		m.lastWrite = maps.Clone(s.Versions)
		if m.lastWrite == nil {
			m.lastWrite = map[string]uint64{}
		}
	}
	if r, ok := m.sm.(Snapshotter); ok {
		r.Restore(s.Data)
	}
	m.installed = s
	m.paging, m.paged = nil, false
	// The race (outrun) is measured from here: the gap to the tail's end
	// was another before the snapshot.
	m.race.best, m.race.seen, m.race.stale = 0, false, 0
}

// takePage takes a page of a paged snapshot (Snap.More, or a last page
// that follows others) and reports whether it is the next one: the first
// page of a snapshot (its From nil) starts the paging over unless it
// repeats the snapshot under way; a later page must start where the last
// one taken ended, in the same snapshot. A page its host has not collected
// yet (TakeSnapshot) holds the next back: it is ignored, and asked again.
func (m *Member) takePage(s *Snap) bool {
	if m.installed != nil {
		return false
	}
	if s.From == nil {
		if m.paging != nil && m.paging.N == s.N {
			return false // the answer to a request made twice
		}
	} else if m.paging == nil || m.paging.N != s.N || !bytes.Equal(m.paging.Next, s.From) {
		return false
	}
	if !s.More {
		if s.From != nil {
			s.Versions = m.paging.Versions // the first page's
		}
		return true // the last page: install takes it
	}
	if s.From == nil {
		m.paging = &Snap{N: s.N, Versions: s.Versions}
	}
	m.paging.Next = s.Next
	// The pages are its host's state from now on: a pre-copy from
	// another source must start from a snapshot too (precopyReq).
	m.paged = true
	m.installed = s
	return true
}

// TakeSnapshot returns the snapshot the member installed since the last
// call (nil: none), for its host to store and restore; or a page of a paged
// snapshot (More), which its host applies and installs nothing for.
func (m *Member) TakeSnapshot() *Snap {
	s := m.installed
	m.installed = nil
	return s
}

// precopyReq is a joiner's next pre-copy request: after what it holds, or,
// if its history's end is not known by sequence number (a restart from the
// host's snapshot with no entries after it), a request for a snapshot.
func (m *Member) precopyReq() Msg {
	if p := m.paging; p != nil {
		return Msg{Type: MsgPrecopyReq, Seq: m.lu, Snap: &Snap{N: p.N, Next: p.Next}}
	}
	return Msg{Type: MsgPrecopyReq, Seq: m.lu, Any: m.paged || m.base.n > 0 && m.base.seq == 0 && len(m.log) == 0}
}
