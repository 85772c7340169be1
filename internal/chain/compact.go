package chain

import (
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
		m.sendSnap(joiner, m.total(), s.Snapshot())
		return
	}
	m.send(m.cfg.ID, Msg{Type: MsgSnapshotNeeded, Target: joiner})
}

// SendSnapshot sends joiner the snapshot the host captured: data is the
// state machine through the history's first n entries. n must be one the
// member still knows the sequence number of (not below its compacted
// prefix) and not beyond its history; the joiner's pre-copy goes on after
// it. It reports whether it was sent.
func (m *Member) SendSnapshot(joiner NodeID, n int, data []byte) bool {
	if n < m.base.n || n > m.total() || n == 0 || m.state != Active {
		return false
	}
	if f := m.flushWait; f != nil && f.Joiner == joiner {
		// The held FLUSH: the log flush with the snapshot, then FLUSH on.
		m.flushWait = nil
		m.logFlush(*f, m.snapAt(n, data))
		i := slices.Index(f.Path[1:], m.cfg.ID) + 1
		m.send(f.Path[i+1], *f)
		return true
	}
	if m.succ != 0 {
		return false
	}
	m.sendSnap(joiner, n, data)
	return true
}

func (m *Member) sendSnap(joiner NodeID, n int, data []byte) {
	s := m.snapAt(n, data)
	es, done := m.after(s.Seq, m.cfg.PrecopyChunk)
	m.pin(joiner, s.Seq)
	m.send(joiner, Msg{Type: MsgPrecopyChunk, Snap: s, Entries: es, Done: done})
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
// tail that compacted past what it held).
func (m *Member) install(s *Snap) {
	unknown := m.base.n > 0 && m.base.seq == 0 && len(m.log) == 0
	if s.N <= m.total() && !unknown {
		return // nothing new: the chunk's entries follow what it holds
	}
	m.log = nil
	m.base = base{n: s.N, seq: s.Seq, sum: s.Sum}
	// A joining member's LU counts its temporary store too.
	m.lu, m.persistReq, m.persisted, m.unbatched = max(m.lu, s.Seq), max(m.persistReq, s.Seq), max(m.persisted, s.Seq), 0
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
}

// TakeSnapshot returns the snapshot the member installed since the last
// call (nil: none), for its host to store and restore.
func (m *Member) TakeSnapshot() *Snap {
	s := m.installed
	m.installed = nil
	return s
}

// precopyReq is a joiner's next pre-copy request: after what it holds, or,
// if its history's end is not known by sequence number (a restart from the
// host's snapshot with no entries after it), a request for a snapshot.
func (m *Member) precopyReq() Msg {
	return Msg{Type: MsgPrecopyReq, Seq: m.lu, Any: m.base.n > 0 && m.base.seq == 0 && len(m.log) == 0}
}
