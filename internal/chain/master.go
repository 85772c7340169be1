package chain

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Reply is a client request's answer from the master.
type Reply struct {
	ID     uint64
	Query  bool
	Result []byte
	// Seq is the update's number, or the version a read returned (the
	// number of the latest update to the key at the member that answered):
	// a session's token is the largest it has seen.
	Seq uint64
	// Lost (a weak read, or an update with a token): the session's token
	// names an update the chain no longer holds; the session must start
	// over (Kefir's ErrSessionLost).
	Lost bool
}

// MasterReady is what the master wants done: messages to send, replies to
// hand to clients, and members to fence (stop for good: a joiner whose join
// was aborted, a tail whose truncation was interrupted). Fencing is the
// host's fail-stop: a fenced member must receive nothing more.
type MasterReady struct {
	Msgs    []Msg
	Replies []Reply
	Fenced  []NodeID
}

type masterMutations struct {
	// truncateEarly: restore R by truncating as soon as FLUSH is issued,
	// before the joiner is a replica.
	truncateEarly bool
	// noResend: Tick re-sends nothing (an order sent once, as before
	// re-sending existed): a lost order or answer stalls the master.
	noResend bool
	// noRepairResend: a repair does not send the earlier repairs'
	// unanswered orders again at its epoch (the code before the rule).
	noRepairResend bool
	// restartShortest: a chain that went down restarts from the member
	// reporting the shortest durable history, not the longest.
	restartShortest bool
	// restartAtOnce: a chain that went down restarts from the first
	// member that reports, without waiting for the others.
	restartAtOnce bool
	// restartLongestLog: a chain that went down restarts from the longest
	// history reported, whatever its updates' epoch (the rule before the
	// members reported their whole durable log: upToDate).
	restartLongestLog bool
	// restartPaged: a paged candidate's report ranks as any other's and may
	// be restarted from (the code before review34a; Restarted).
	restartPaged bool
	// precopyRefusedAtOnce: a pre-copy the tail refused is ordered again
	// at once, from the same tail (the rule before: a refusal loop).
	precopyRefusedAtOnce bool
	// joinForgone: Join takes a node left out of a whole-chain restart
	// (Forgo) as any restarted member, whatever it holds.
	joinForgone bool
}

// down is a chain whose every member failed: the master waits for the
// members that may hold its history to restart and report what they hold
// (Restarted), then restarts the chain from the longest.
type down struct {
	// cands: the members that must report first — every member that
	// failed since the chain was last whole (recent), the last
	// configuration's among them.
	cands   map[NodeID]bool
	reports map[NodeID]restartReport
	// forgone: the forgone nodes whose limit the restart under way set
	// (Master.forgone), back to none if its member refuses it.
	forgone []NodeID
}

// restartReport is what a restarted member holds: the number of its last
// durable, committed update and its history's length in entries; paged:
// its host's state is not that history's (Restarted).
type restartReport struct {
	lu     uint64
	length int
	paged  bool
}

// order names a repair order: its recipient and kind.
type order struct {
	to   NodeID
	kind MsgType
}

// awaited is an unanswered order's epoch and, for CR_MID, its target, and
// when (the master's tick) it was last sent.
type awaited struct {
	epoch  uint64
	target NodeID
	sent   uint64
}

type request struct {
	query bool
	any   bool   // a CRAQ read: any member may answer
	weak  bool   // a weak read: any member holding the token min may answer
	min   uint64 // the session's token (a weak read, an update)
	op    []byte
	to    NodeID // where it was last sent (0: parked)
}

type joinPhase uint8

const (
	phasePrecopy joinPhase = iota + 1
	phaseFlush
)

type joining struct {
	j     NodeID
	pos   int
	phase joinPhase
	src   NodeID
	// precopied: pre-copy is done but a repair is outstanding; FLUSH waits
	// for it (a FLUSH must not overtake a repair's re-sends: those
	// would reach the old tail after FLUSH and miss both the log flush and
	// the joiner).
	precopied bool
	// sent is the tick PRECOPY (pre-copy) or FLUSH (flush) was last sent
	// at; flush is the FLUSH as sent, re-sent as is (Tick).
	sent  uint64
	flush Msg
}

// Master decides a chain's membership and routes client requests: the
// combined manager and front-end of Listing 2 (digest 002 §3.7). The chain
// never decides its own membership; in Kefir the metadata group will play
// this part, and the tests' harness drives it. Like Member it is a pure core:
// it learns of failures from Fail (a perfect failure detector, fail-stop),
// messages from Step, and its output from Ready.
//
// It runs one reconfiguration at a time (a join, a truncation, or a
// repair); a failure during any of them is repaired at once. A failure
// during a flush aborts the join (the joiner is fenced; the harness may
// retry with a fresh node), as the dissertation's "ignore that FLUSH, redo the
// join" (digest §3.4).
type Master struct {
	id      NodeID
	r       int
	mode    Mode
	epoch   uint64
	members []NodeID // the configuration, head first, the joiner included once FLUSH is issued
	dead    map[NodeID]bool
	head    NodeID
	tail    NodeID // whose answers are accepted; 0 while a CR_TAIL is outstanding

	join  *joining
	trunc [2]NodeID // the truncation in progress: the new tail, the old
	// truncSent is the tick TRUNCATE was last sent at.
	truncSent uint64
	// awaiting: the repair orders not yet answered, by member and kind
	// (one member may get CR_HEAD and CR_MID at once), with the epoch of the
	// latest one: an answer to an older order does not count, as FLUSH must
	// not start while a newer repair is still re-sending.
	awaiting map[order]awaited

	reqs   map[uint64]*request
	parked []uint64
	// renumber: the head used up its numbering range; a CR_HEAD at a new
	// epoch renews it as soon as no reconfiguration is under way (a FLUSH
	// in flight would be ignored by members that saw the newer epoch).
	renumber bool

	// early: update answers from a member about to become the tail (the
	// truncation's new tail, or one ordered CR_TAIL) that came before the
	// master made it the tail: its TRUNCATE_ACK or CR_TAIL_DONE, which
	// precedes them on its link, was lost. They count once a re-sent
	// order's answer makes it the tail.
	early map[NodeID][]Msg

	// ticks counts Tick calls; resend is how many ticks an order waits
	// for its answer before Tick sends it again (0: never).
	ticks, resend uint64

	// down: every member failed (nil: the chain runs). recent: the members
	// that failed since the chain was last whole (at r members, nothing
	// under way), the candidates if it goes down. seqBits: the members'
	// Config.SeqBits, to number a restarted chain's epoch above its
	// history's.
	down   *down
	recent map[NodeID]bool
	// restarting: the down state a RESTART under way was chosen from,
	// whose report of the chosen member the order carries; if the member
	// refuses it (it no longer holds what it reported: a new process),
	// the chain goes down again with the other reports (MsgRestartDone).
	restarting *down
	seqBits    uint
	// nodes: every node that may have been a member (SetNodes), whom a
	// whole-chain restart waits for as well.
	nodes []NodeID
	// forgone: the nodes an operator left out of a whole-chain restart
	// (Forgo), with the length of the history the chain restarted from
	// (-1: not restarted yet). One that comes back holding more than that
	// holds updates the chain does not, and is not joined (Join) until it
	// holds no more (an empty disk).
	forgone map[NodeID]int

	out MasterReady
	mut masterMutations
}

// NewMaster returns the master of a chain of the given members (head first)
// at epoch 0, which keeps it at r replicas.
func NewMaster(id NodeID, members []NodeID, r int) *Master {
	return &Master{id: id, r: r, members: append([]NodeID(nil), members...),
		dead: map[NodeID]bool{}, head: members[0], tail: members[len(members)-1],
		awaiting: map[order]awaited{}, reqs: map[uint64]*request{}, recent: map[NodeID]bool{},
		seqBits: defaultSeqBits}
}

// NewMasterAt is NewMaster at a given epoch: a restarted master that
// learnt the chain and its epoch from the members' heartbeats
// (chainmaster), so that its orders carry an epoch above every member's
// (a member refuses a repair order from an epoch below its own).
func NewMasterAt(id NodeID, members []NodeID, r int, epoch uint64) *Master {
	m := NewMaster(id, members, r)
	m.epoch = epoch
	return m
}

// SetMode sets the chain's update mode (before any request; every member
// must be created with the same): under SU the tail answers updates, under
// AUSI and AU the head does.
func (m *Master) SetMode(mode Mode) { m.mode = mode }

// SetSeqBits tells the master the members' Config.SeqBits (default 40), so
// that a chain it restarts numbers above every update it holds.
func (m *Master) SetSeqBits(bits uint) {
	if bits > 0 {
		m.seqBits = bits
	}
}

// SetLength sets how many members the master keeps the chain at (NewMaster's
// r): a join that makes the chain longer truncates its tail once flushed.
// The host changes it when the chain is meant to change length — an
// operator adding a member before removing another (the chain is one longer
// until the leaving member goes), or removing one (one shorter) — and only
// while no join is under way, whose truncation is decided when it flushes.
func (m *Master) SetLength(r int) { m.r = max(r, 1) }

// Length is how many members the master keeps the chain at.
func (m *Master) Length() int { return m.r }

// SetNodes names every node that may ever have been a member of the chain
// (on the host: the group's configured members, which every member ever is
// while new nodes are not joined by an operator). A restart of the whole
// chain waits for each of them too, not only for the members that failed
// since the chain was last whole as this master saw it: a master that took
// over from the record knows none of those it did not see fail.
func (m *Master) SetNodes(ids []NodeID) { m.nodes = slices.Clone(ids) }

// GetWeak routes a weak read to member at (0: the tail): any active member
// that holds the update numbered token (the session's token, 0: none)
// answers from what it has, possibly stale; a member behind the token passes
// it upstream (docs/design/chain.md, "Kefir's levels on a chain").
func (m *Master) GetWeak(id uint64, query []byte, at NodeID, token uint64) {
	m.reqs[id] = &request{query: true, weak: true, min: token, op: query, to: at}
	if at == 0 {
		m.route(id)
		return
	}
	m.send(at, Msg{Type: MsgQuery, ID: id, Op: query, Weak: true, Seq: token})
}

// Members returns the configuration, head first.
func (m *Master) Members() []NodeID { return append([]NodeID(nil), m.members...) }

// Head and Tail are where updates and strong reads go (0: none at present).
func (m *Master) Head() NodeID { return m.head }

// Tail is the member whose answers the master accepts.
func (m *Master) Tail() NodeID { return m.tail }

// Epoch is the current configuration epoch.
func (m *Master) Epoch() uint64 { return m.epoch }

// Busy reports whether a reconfiguration is in progress.
func (m *Master) Busy() bool {
	return m.join != nil || m.trunc[0] != 0 || len(m.awaiting) > 0 || m.down != nil
}

// Joiner is the node joining (0: none).
func (m *Master) Joiner() NodeID {
	if m.join == nil {
		return 0
	}
	return m.join.j
}

// JoinerPrecopying reports whether the join under way is still in its
// pre-copy: the joiner is not linked into the chain yet, so nothing waits
// for it.
func (m *Master) JoinerPrecopying() bool {
	return m.join != nil && m.join.phase == phasePrecopy
}

// Truncating is the tail being truncated (0: none). If the member taking
// over from it fails first, it is fenced too: it may already have freed its
// data.
func (m *Master) Truncating() NodeID { return m.trunc[1] }

// Ready returns and clears the master's output.
func (m *Master) Ready() MasterReady {
	out := m.out
	m.out = MasterReady{}
	return out
}

func (m *Master) send(to NodeID, msg Msg) {
	msg.From, msg.To = m.id, to
	if msg.Epoch == 0 {
		msg.Epoch = m.epoch
	}
	switch msg.Type {
	case MsgCRHead, MsgCRMid, MsgCRTail, MsgRestart, MsgTruncate:
		// A repair's (or a restart's) order names the configuration it
		// makes, at its epoch: the member that takes it knows the chain
		// at that epoch and reports it in its heartbeats, from which a
		// restarted master learns the chain. Without it a member knew the
		// chain only from heartbeat answers, so one repaired to a new epoch
		// whose master failed before answering it reported the new epoch
		// with the old members, and the next master adopted them: members
		// the repair had cut out were granted leases and served reads
		// missing the writes the chain took since (the host simulation's
		// AUSI D-Mb-D seed 299, AUSI D-D-D seed 501). A TRUNCATE names
		// the configuration at its epoch before the old tail goes (the
		// master drops it at TRUNCATE_ACK, at the same epoch): the old
		// tail, once it stopped, reports it without itself (vrshard's
		// chainCore), which a restarted master takes over the longer list
		// at that epoch (chainmaster.Learner).
		if msg.Members == nil {
			msg.Members = slices.Clone(m.members)
		}
	}
	m.out.Msgs = append(m.out.Msgs, msg)
}

// Put routes an update (client request id, unique) to the head.
func (m *Master) Put(id uint64, op []byte) {
	m.reqs[id] = &request{op: op}
	m.route(id)
}

// PutSession routes an update of a session whose token is token: the head
// refuses it as lost if the chain no longer holds the update token names.
func (m *Master) PutSession(id uint64, op []byte, token uint64) {
	m.reqs[id] = &request{op: op, min: token}
	m.route(id)
}

// Get routes a strong read to the tail.
func (m *Master) Get(id uint64, query []byte) {
	m.reqs[id] = &request{query: true, op: query}
	m.route(id)
}

// GetAt routes a version-checked strong read (CRAQ) to member at: it
// answers itself if the key is clean there and otherwise passes the read down
// the chain; the answer may come from any member. If the read cannot be
// served on that path it falls back to the tail.
func (m *Master) GetAt(id uint64, query []byte, at NodeID) {
	m.reqs[id] = &request{query: true, any: true, op: query, to: at}
	if at == 0 {
		m.route(id)
		return
	}
	m.send(at, Msg{Type: MsgQuery, ID: id, Op: query, Any: true})
}

// Forget drops a request the client gave up on; a late answer is ignored.
func (m *Master) Forget(id uint64) { delete(m.reqs, id) }

func (m *Master) route(id uint64) {
	r := m.reqs[id]
	to, t := m.head, MsgUpdate
	if r.query {
		to, t = m.tail, MsgQuery
	}
	r.to = to
	if to == 0 {
		m.parked = append(m.parked, id)
		return
	}
	if r.query {
		m.send(to, Msg{Type: t, ID: id, Op: r.op, Any: r.any, Weak: r.weak, Seq: r.min})
		return
	}
	m.send(to, Msg{Type: t, ID: id, Op: r.op, Token: r.min})
}

// unpark re-routes parked requests after the head or tail changed.
func (m *Master) unpark() {
	p := m.parked
	m.parked = nil
	for _, id := range p {
		if _, ok := m.reqs[id]; ok {
			m.route(id)
		}
	}
}

// Join starts adding j before position pos of the chain (0: as head; at or
// past the tail: just before the tail, never after it). Pre-copy comes first;
// FLUSH follows when j reports it done.
//
// j may be a member that failed and restarted (a new incarnation, perhaps
// holding a durable prefix: Config.Log): once repaired out of the chain it
// joins as any joiner. The host must make sure the old incarnation is gone
// — its process stopped and its links closed — before it asks (fail-stop:
// nothing the old one sent may arrive after this).
func (m *Master) Join(j NodeID, pos int) error {
	if l, ok := m.forgone[j]; ok && !(mutation.On && m.mut.joinForgone) {
		return &ForgoneError{Node: j, Length: l}
	}
	if m.Busy() {
		return fmt.Errorf("chain: join of %d: a reconfiguration is in progress", j)
	}
	if m.tail == 0 || len(m.members) == 0 {
		return fmt.Errorf("chain: join of %d: the chain has no tail to pre-copy from", j)
	}
	if j == 0 || j == m.id || slices.Contains(m.members, j) {
		return fmt.Errorf("chain: join of %d: not a new node (members %v)", j, m.members)
	}
	delete(m.dead, j) // a restarted member: a new incarnation
	m.join = &joining{j: j, pos: pos, phase: phasePrecopy, src: m.tail, sent: m.ticks}
	m.send(j, Msg{Type: MsgPrecopy, Target: m.tail})
	return nil
}

// Step processes a message from a member.
func (m *Master) Step(msg Msg) {
	if m.dead[msg.From] {
		return
	}
	m.step(msg)
	m.maybeRenumber()
	m.settle()
}

// settle forgets the members that failed before the chain was whole again:
// at r members (or more), with a tail and nothing under way, the
// configuration's members hold its history between them and a later
// restart of the whole chain need not wait for the ones gone before.
func (m *Master) settle() {
	if m.down == nil && m.tail != 0 && len(m.members) >= m.r && !m.Busy() && len(m.recent) > 0 {
		clear(m.recent)
	}
}

// maybeRenumber renews the head's numbering range when it asked and nothing
// else is under way.
func (m *Master) maybeRenumber() {
	if m.renumber && !m.Busy() && m.head != 0 {
		m.renumber = false
		m.epoch++
		m.send(m.head, Msg{Type: MsgCRHead})
		m.awaiting[order{m.head, MsgCRHead}] = awaited{epoch: m.epoch, sent: m.ticks}
		m.unpark() // behind the CR_HEAD on the head's link
	}
}

func (m *Master) step(msg Msg) {
	switch msg.Type {
	case MsgUpdateAck, MsgQueryResp:
		r := m.reqs[msg.ID]
		if r == nil || r.query != (msg.Type == MsgQueryResp) {
			return
		}
		answerer := m.tail
		if !r.query && m.mode != SU {
			answerer = m.head // AUSI, AU: the head answers updates
		}
		if msg.From != answerer && !r.any && !r.weak {
			// Lemma 3.17: only the current tail answers (a CRAQ read by
			// whichever member found the key clean, a weak read by any).
			// A read answered by a former tail is asked again; an update
			// waits for the tail's ack — or for its own sender to become
			// the tail, if it is about to (early).
			if r.query && r.to == msg.From {
				m.route(msg.ID)
			}
			if !r.query && m.becomingTail(msg.From) {
				if m.early == nil {
					m.early = map[NodeID][]Msg{}
				}
				m.early[msg.From] = append(m.early[msg.From], msg)
			}
			return
		}
		delete(m.reqs, msg.ID)
		m.out.Replies = append(m.out.Replies, Reply{ID: msg.ID, Query: r.query, Result: msg.Result, Seq: msg.Seq})
	case MsgRedirect:
		r := m.reqs[msg.ID]
		if r == nil || r.to != msg.From && !r.any && !r.weak {
			return
		}
		if msg.Lost {
			delete(m.reqs, msg.ID)
			m.out.Replies = append(m.out.Replies, Reply{ID: msg.ID, Query: r.query, Lost: true})
			return
		}
		to := m.head
		if r.query {
			to = m.tail
		}
		if msg.Exhausted && msg.From == m.head {
			m.renumber = true
		} else if to != 0 && to != msg.From {
			m.route(msg.ID)
			return
		}
		r.to = 0
		m.parked = append(m.parked, msg.ID)
	case MsgPrecopyDone:
		if m.join == nil || msg.From != m.join.j || m.join.phase != phasePrecopy {
			return
		}
		if msg.Refused {
			if m.join.src == m.tail && m.resend > 0 && !(mutation.On && m.mut.precopyRefusedAtOnce) {
				// The tail it names refused (not active yet, or with a
				// successor the master has not heard of): asked again at
				// once, it refuses again at once, and the exchange holds
				// the time still (the host simulation's D-D-M seeds 201 and
				// 228: no failure detector fires to change the tail). The
				// next resend (Tick) asks it again.
				m.join.sent = m.ticks
				return
			}
			m.join.src = 0
			m.reissuePrecopy()
			return
		}
		m.join.precopied = true
		m.maybeFlush()
	case MsgFlushAck:
		if m.join == nil || msg.From != m.join.j || m.join.phase != phaseFlush {
			return
		}
		if msg.Refused {
			// A new incarnation of the joiner (it restarted during the
			// flush): the one that was linked in is gone.
			m.Fail(msg.From)
			return
		}
		m.join = nil
		if len(m.members) > m.r {
			m.truncate()
		}
		m.unpark() // updates a joining head could not take yet
	case MsgTruncateAck:
		if msg.From != m.trunc[0] {
			return
		}
		m.members = m.members[:len(m.members)-1]
		m.tail = msg.From
		m.trunc = [2]NodeID{}
		m.takeEarly(msg.From)
		m.unpark()
	case MsgCRHeadDone, MsgCRMidDone:
		m.answered(msg)
		m.maybeFlush()
	case MsgCRTailDone, MsgRestartDone:
		if msg.Type == MsgRestartDone && msg.Refused {
			m.restartRefused(msg.From, msg.Epoch)
			return
		}
		m.answered(msg)
		if n := len(m.members); n > 0 && m.members[n-1] == msg.From {
			m.tail = msg.From
			m.takeEarly(msg.From)
			m.unpark()
			m.reissuePrecopy()
		}
		m.maybeFlush()
	}
}

// becomingTail reports whether n is about to become the tail: the new tail
// of the truncation under way, or a member ordered CR_TAIL.
func (m *Master) becomingTail(n NodeID) bool {
	if n == m.trunc[0] {
		return true
	}
	_, ok := m.awaiting[order{n, MsgCRTail}]
	_, restart := m.awaiting[order{n, MsgRestart}]
	return (ok || restart) && m.tail == 0
}

// takeEarly takes the answers the new tail n sent before the master knew it
// was the tail (early), now that it does.
func (m *Master) takeEarly(n NodeID) {
	es := m.early[n]
	m.early = nil // anyone else's were a tail-to-be's that no longer is
	for _, e := range es {
		m.step(e)
	}
}

// answered notes a repair order's answer.
func (m *Master) answered(msg Msg) {
	o := order{msg.From, MsgCRHead}
	switch msg.Type {
	case MsgCRMidDone:
		o.kind = MsgCRMid
	case MsgCRTailDone:
		o.kind = MsgCRTail
	case MsgRestartDone:
		o.kind = MsgRestart
	}
	if a, ok := m.awaiting[o]; ok && msg.Epoch >= a.epoch {
		delete(m.awaiting, o)
	}
}

// maybeFlush starts the join's FLUSH once pre-copy is done and no repair is
// outstanding.
func (m *Master) maybeFlush() {
	if j := m.join; j != nil && j.phase == phasePrecopy && j.precopied && len(m.awaiting) == 0 && m.tail != 0 {
		m.startFlush()
	}
}

// reissuePrecopy points a pre-copying joiner at the current tail when its
// source is gone or refused (the joiner resumes after what it holds: its
// prefix of the old tail's history is a prefix of the new tail's).
func (m *Master) reissuePrecopy() {
	if m.join == nil || m.join.phase != phasePrecopy || m.tail == 0 || m.join.src == m.tail {
		return
	}
	m.join.src = m.tail
	m.join.precopied = false
	m.join.sent = m.ticks
	m.send(m.join.j, Msg{Type: MsgPrecopy, Target: m.tail})
}

// startFlush inserts the joiner into the configuration and sends FLUSH
// (digest §3.4 Phase 2).
func (m *Master) startFlush() {
	j := m.join
	m.epoch++
	pos := min(max(j.pos, 0), len(m.members)-1)
	old := m.members
	list := append(append(append([]NodeID(nil), old[:pos]...), j.j), old[pos:]...)
	path := append(append([]NodeID{j.j}, old...), j.j)
	m.members = list
	j.phase = phaseFlush
	j.flush, j.sent = Msg{Type: MsgFlush, Epoch: m.epoch, Members: list, Path: path, Joiner: j.j}, m.ticks
	m.send(j.j, j.flush)
	if pos == 0 {
		// Digest §7.6: updates go to the joiner from now on (it saw FLUSH
		// before them: same link); the old head refuses stragglers.
		m.head = j.j
		m.unpark()
	}
	if mutation.On && m.mut.truncateEarly && len(m.members) > m.r {
		m.truncate()
	}
}

// truncate drops the tail (digest §3.4 Phase 3).
func (m *Master) truncate() {
	m.epoch++
	n := len(m.members)
	m.trunc = [2]NodeID{m.members[n-2], m.members[n-1]}
	m.truncSent = m.ticks
	m.send(m.trunc[0], Msg{Type: MsgTruncate})
}

// Fail tells the master that n failed (fail-stop). It repairs the chain
// around every member that is gone (digest §3.5).
func (m *Master) Fail(n NodeID) {
	if d := m.down; d != nil {
		// Down: a member that reported and failed again holds nothing
		// until it restarts and reports anew.
		delete(d.reports, n)
	}
	if m.dead[n] {
		return
	}
	m.dead[n] = true
	m.recent[n] = true
	delete(m.early, n)
	if j := m.join; j != nil {
		switch {
		case j.phase == phasePrecopy && n == j.j:
			m.join = nil // never linked in: nothing to repair
		case j.phase == phaseFlush && n != j.j:
			m.fence(j.j) // abort the join: relink as before it
			m.join = nil
		case j.phase == phaseFlush:
			m.join = nil
		}
	}
	if m.trunc[0] != 0 {
		if n == m.trunc[0] {
			m.fence(m.trunc[1]) // it may have dropped itself already
		}
		if n == m.trunc[0] || n == m.trunc[1] {
			m.trunc = [2]NodeID{}
		}
	}
	for o, a := range m.awaiting {
		// An order to a dead member, or a CR_MID towards one, is moot:
		// the repair below gives the survivors new orders.
		if m.dead[o.to] || m.dead[a.target] {
			delete(m.awaiting, o)
		}
	}
	for id, r := range m.reqs {
		if r.query && r.to == n {
			r.to = 0
			m.parked = append(m.parked, id)
		}
	}
	slices.Sort(m.parked) // map order must not leak into the output
	m.repair()
	m.maybeRenumber()
}

func (m *Master) fence(n NodeID) {
	if !m.dead[n] {
		m.dead[n] = true
		m.recent[n] = true // it may be the only one holding acknowledged updates (an old tail)
		m.out.Fenced = append(m.out.Fenced, n)
	}
}

// repair relinks the configuration around the dead members: CR_HEAD to a new
// head, CR_TAIL to a new tail, CR_MID to each survivor whose successor
// changed. The survivors keep their relative order.
func (m *Master) repair() {
	var live []NodeID
	for _, id := range m.members {
		if !m.dead[id] {
			live = append(live, id)
		}
	}
	if len(live) == len(m.members) {
		return
	}
	if len(live) == 0 {
		m.goDown()
		return
	}
	m.epoch++
	old := m.members
	m.members = live
	// Orders of an earlier repair still unanswered go again at this epoch,
	// before this repair's: a survivor that takes part in this one (a
	// CR_MID_REPAIR from its new predecessor, a CR_MID) moves to this epoch
	// and then drops the earlier copy as stale, and without re-sends
	// (SetResend 0) the master would wait for its answer for ever (the
	// mode simulation, seed 1828 under AU: a CR_TAIL at epoch 3 to the
	// member a CR_MID_REPAIR had taken to 4). Before this repair's own
	// orders on the same links, which replace an order of the same kind.
	if !(mutation.On && m.mut.noRepairResend) {
		for _, o := range m.sortedOrders() {
			if a := m.awaiting[o]; a.epoch < m.epoch {
				m.resendOrder(o)
			}
		}
	}
	if live[0] != old[0] {
		m.head = live[0]
		m.send(live[0], Msg{Type: MsgCRHead})
		m.awaiting[order{live[0], MsgCRHead}] = awaited{epoch: m.epoch, sent: m.ticks}
	}
	for i := 0; i+1 < len(live); i++ {
		if _, succ := neighbours(old, live[i]); succ != live[i+1] {
			m.send(live[i], Msg{Type: MsgCRMid, Target: live[i+1]})
			m.awaiting[order{live[i], MsgCRMid}] = awaited{epoch: m.epoch, target: live[i+1], sent: m.ticks}
		}
	}
	if last := live[len(live)-1]; last != old[len(old)-1] {
		m.tail = 0
		m.send(last, Msg{Type: MsgCRTail})
		m.awaiting[order{last, MsgCRTail}] = awaited{epoch: m.epoch, sent: m.ticks}
	}
	m.unpark()
}

// SetResend makes Tick re-send an order that has waited n whole ticks for
// its answer (0, the default: never): one sent after the kth Tick goes again
// at the (k+n+1)th. The host ticks the master at a fixed interval
// (chainmaster: every heartbeat), so that is at least n intervals.
func (m *Master) SetResend(n int) { m.resend = uint64(max(n, 0)) }

// Tick is the master's clock, a tick at a time: it re-sends every order
// that has waited SetResend whole ticks for its answer — CR_HEAD, CR_MID and
// CR_TAIL, PRECOPY (until pre-copy is reported done), FLUSH, TRUNCATE — and
// waits as long again. The host's links may drop a message (a full queue, a
// re-dialled connection), and an order or its answer lost would otherwise
// leave the master Busy for ever: no later join, no renumbering. A member
// handles a repeated order idempotently and answers it again
// (docs/design/chain.md, "Lost orders"). An order goes until it is answered
// or superseded: a newer order to the member, the join aborted, the member
// failed — each of which drops or replaces what Tick re-sends.
//
// A FLUSH goes again as it was, at its epoch (nothing raises the epoch
// while it is outstanding but a failure, which aborts the join). Repair
// orders and TRUNCATE go at the current epoch: a later repair may have
// raised it without superseding them, and a member that took part in that
// repair refuses an order from an epoch below its own. A repair order's
// answer then counts only from that epoch on, as for a new order: a FLUSH
// must not start on the answer to the older copy while the newer one may
// still make the member repair again.
func (m *Master) Tick() {
	m.ticks++
	if m.resend == 0 || mutation.On && m.mut.noResend {
		return
	}
	due := func(sent uint64) bool { return m.ticks-sent > m.resend }
	sent := len(m.out.Msgs)
	for _, o := range m.sortedOrders() {
		if due(m.awaiting[o].sent) {
			m.resendOrder(o)
		}
	}
	if j := m.join; j != nil && due(j.sent) {
		switch {
		case j.phase == phaseFlush:
			j.sent = m.ticks
			m.send(j.j, j.flush)
		case !j.precopied && j.src != 0:
			j.sent = m.ticks
			m.send(j.j, Msg{Type: MsgPrecopy, Target: j.src})
		}
	}
	if m.trunc[0] != 0 && due(m.truncSent) {
		m.truncSent = m.ticks
		m.send(m.trunc[0], Msg{Type: MsgTruncate})
	}
	if len(m.out.Msgs) > sent {
		// Requests a member refused for want of the order (an update at
		// a head that never got its CR_HEAD) are parked: they go again
		// behind the re-sent orders, on the same links.
		m.unpark()
	}
}

// sortedOrders lists the unanswered orders in a fixed order (map order
// must not leak into the output).
func (m *Master) sortedOrders() []order {
	orders := make([]order, 0, len(m.awaiting))
	for o := range m.awaiting {
		orders = append(orders, o)
	}
	slices.SortFunc(orders, func(a, b order) int {
		return cmp.Or(cmp.Compare(a.to, b.to), cmp.Compare(a.kind, b.kind))
	})
	return orders
}

// resendOrder sends unanswered order o again at the current epoch; its
// answer counts from that epoch on.
func (m *Master) resendOrder(o order) {
	a := m.awaiting[o]
	a.epoch, a.sent = m.epoch, m.ticks
	m.awaiting[o] = a
	msg := Msg{Type: o.kind, Target: a.target}
	if o.kind == MsgRestart {
		msg = m.restartOrder(o.to)
	}
	m.send(o.to, msg)
}

// Restarting is the member ordered to restart the chain alone whose answer
// has not come (0: none). Until it takes the order its heartbeats still say
// it is not a replica: they are not a new restart.
func (m *Master) Restarting() NodeID {
	for o := range m.awaiting {
		if o.kind == MsgRestart {
			return o.to
		}
	}
	return 0
}

// Down reports whether every member of the chain failed: the master waits
// for them to restart (Restarted). It keeps the last configuration (a
// chain is never recorded without members) and routes nothing.
func (m *Master) Down() bool { return m.down != nil }

// goDown: the last member failed. Nothing is under way any more; the
// members that may hold the chain's history — every one that failed since
// the chain was last whole — must restart and report before one of them
// carries the chain on (Restarted).
func (m *Master) goDown() {
	m.head, m.tail = 0, 0
	m.join, m.trunc, m.early = nil, [2]NodeID{}, nil
	clear(m.awaiting)
	d := &down{cands: map[NodeID]bool{}, reports: map[NodeID]restartReport{}}
	for n := range m.recent {
		d.cands[n] = true
	}
	for _, n := range m.members {
		d.cands[n] = true
	}
	for _, n := range m.nodes {
		d.cands[n] = true
	}
	for n := range m.forgone {
		// Left out of an earlier restart and not back: what it holds is
		// not the chain's history (Forgo).
		delete(d.cands, n)
	}
	m.down = d
}

// Restarted tells the master that n restarted holding a durable history of
// length entries, the last numbered lu (a member's host keeps, across a
// restart, the prefix of its log it knows committed: chain.Config.Log). It
// matters only while the chain is down: once every candidate has reported,
// the one holding the longest history (the lowest id among equals: equal
// lengths are equal histories) is ordered to restart the chain alone
// (RESTART), at an epoch whose numbers lie above every update it holds; the
// others are joined to it as any restarted member. It reports whether the
// chain restarted now.
//
// Why the longest: every member's committed prefix is a prefix of the
// chain's history (nothing the tail acknowledged is ever dropped), so of
// two the shorter is a prefix of the longer; and an update acknowledged to
// a client was persisted by every member before its acknowledgement passed
// it (a log datastore under SU), so the last tail's committed prefix — its
// host saves every entry it persists as committed — holds every one. The
// candidates include every member that failed since the chain was last
// whole, so the last tail is among them even when the failures were
// noticed in another order (the tail's first: the configuration shrank to
// the head before the chain went down), and every node SetNodes named.
// Choosing a shorter history would
// lose acknowledged updates, and a longer one restarted later would then
// hold entries the chain does not (TestSimWholeChainRestart, the mutation
// restartShortest).
//
// A node left out of a restart (Forgo) reports here too when it comes back:
// while the chain is still down it is a candidate again; once the chain
// restarted without it, it may join (Join) only if it holds no more than the
// history the chain restarted from (the shorter of two committed prefixes
// is a prefix of the longer), or nothing.
//
// paged: n's host holds pages of a snapshot it had not finished taking (a
// joiner that crashed mid-pages, or was paging when the chain went down;
// Config.Paged) beside its history: its state is a prefix of the pages over
// a checkpoint, no history's, whatever its history's length or number. It
// is never chosen while a candidate whose state is its history reported
// (upToDate), and the chain stays down rather than restart from it (it
// refuses the RESTART): a candidate that reports again whole (restarted on
// an emptied disk) or the operator's Forgo of the paged ones ends the wait.
// (review34a: before, a paged member whose checkpoint was longer than the
// others' histories, or whose number was the newest, carried the chain on.)
func (m *Master) Restarted(n NodeID, lu uint64, length int, paged bool) bool {
	d := m.down
	if l, ok := m.forgone[n]; ok {
		switch {
		case l < 0 && d != nil:
			delete(m.forgone, n) // back before the restart: a candidate again
			d.cands[n] = true
		case length <= l || length == 0:
			delete(m.forgone, n) // nothing the chain lacks: joined as any
			return false
		default:
			return false
		}
	}
	if d == nil || !d.cands[n] {
		return false
	}
	d.reports[n] = restartReport{lu: lu, length: length, paged: paged}
	return m.maybeRestart()
}

// maybeRestart restarts a chain that is down once every candidate has
// reported (Restarted), from the longest history.
func (m *Master) maybeRestart() bool {
	d := m.down
	if len(d.reports) == 0 || len(d.reports) < len(d.cands) && !(mutation.On && m.mut.restartAtOnce) {
		return false
	}
	ids := make([]NodeID, 0, len(d.reports))
	for id := range d.reports {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	best, epoch := ids[0], m.epoch
	for _, id := range ids {
		r := d.reports[id]
		epoch = max(epoch, r.lu>>m.seqBits)
		longer := m.upToDate(r, d.reports[best])
		if mutation.On && m.mut.restartLongestLog {
			longer = r.length > d.reports[best].length
		}
		if mutation.On && m.mut.restartShortest {
			longer = r.length < d.reports[best].length
		}
		if longer {
			best = id
		}
	}
	if d.reports[best].paged && !(mutation.On && m.mut.restartPaged) {
		return false // every candidate paged: none holds a history's state (Restarted)
	}
	m.down = nil
	for n, l := range m.forgone {
		if l < 0 {
			m.forgone[n] = d.reports[best].length
			d.forgone = append(d.forgone, n)
		}
	}
	m.epoch = epoch + 1
	m.members = []NodeID{best}
	delete(m.dead, best)
	m.head = best // its updates follow the RESTART on its link
	m.restarting = d
	m.send(best, m.restartOrder(best))
	m.awaiting[order{best, MsgRestart}] = awaited{epoch: m.epoch, sent: m.ticks}
	m.unpark()
	return true
}

// restartOrder is the RESTART for n: it carries what n reported
// (Restarted: LU, and the history's length in LA), which n checks against
// what it holds (Member.restart). The report may be an earlier process's:
// a member that crashed after it reported restarts empty (a memory member)
// or shorter, and taking the order it would carry the chain on from that,
// not from the history the master chose it for.
func (m *Master) restartOrder(n NodeID) Msg {
	msg := Msg{Type: MsgRestart}
	if d := m.restarting; d != nil {
		r := d.reports[n]
		msg.LU, msg.LA = r.lu, uint64(r.length)
	}
	return msg
}

// restartRefused: the member ordered to restart the chain does not hold
// what it reported. The chain goes down again, waiting for the same
// candidates, with every report but the refuser's, whose next heartbeat
// reports what it holds now (Restarted); the restart is chosen again.
// epoch is the refused order's: the refusal of an earlier RESTART (one
// sent twice and refused twice, the second answer arriving after the
// restart was chosen again, perhaps from the same member) refuses nothing
// of the order under way. Before review36a it put the chain down again
// while its member took the later order, and the master then waited for a
// report from a member that was active (TestRestartStaleRefusal).
func (m *Master) restartRefused(n NodeID, epoch uint64) {
	d := m.restarting
	if a, ok := m.awaiting[order{n, MsgRestart}]; !ok || epoch < a.epoch || d == nil || len(m.members) != 1 || m.members[0] != n {
		return
	}
	m.restarting = nil
	delete(d.reports, n)
	for _, f := range d.forgone {
		if _, ok := m.forgone[f]; ok {
			m.forgone[f] = -1 // the limit is the history the chain restarts from, not chosen yet
		}
	}
	d.forgone = nil
	m.head, m.tail = 0, 0
	clear(m.awaiting)
	m.down = d
}

// upToDate reports whether history a is more up to date than b: its last
// update of a newer numbering epoch, or of the same one and longer (Raft's
// rule). On committed prefixes this is the longer one (the shorter is a
// prefix of the longer, whose last update cannot be older). It matters once
// a report counts a member's whole durable log, past its commit point (a
// host keeps that suffix until the member joins: vrshard's chain core): two
// such logs may disagree after their common prefix — an old head's updates
// that never reached its successor, and the updates the new head numbered
// in a newer epoch at the same positions — and the newer epoch's log holds
// everything the chain committed, however long the old head's. Every update
// a head numbers in epoch e it numbers after a history holding everything
// committed before (a head is a member of the chain it heads, which holds
// every committed update), and within one epoch the members' logs are
// prefixes of the head's, so the longest holds the others.
//
// A history of a checkpoint with no entry after it knows its last update's
// number from its host, which keeps it with the checkpoint on disk (vrshard:
// the snapshot record's number, chainCore.NumberAt), so it is compared as
// any other. Without it, counted as the newest epoch, the checkpoint of a
// member that failed and was left behind would win over the longer logs of
// the members that went on and acknowledged more
// (TestRestartCheckpointAloneBehind, review33d); counted by length, an old
// head's longer log of an older epoch, its suffix never passed on, would
// win over a checkpoint of the newer epoch's acknowledged updates
// (TestRestartCheckpointOfTheNewerEpoch). A report of lu 0 with entries
// comes only from a checkpoint written by a build before the number (its
// host does not know it: openChain): it is a committed prefix (a host
// checkpoints only committed state), compared by length, the rule before —
// the second case stays open for such a directory until its member logs
// an entry after the checkpoint or checkpoints again.
//
// A paged report (Restarted) is behind every other, whatever it holds.
func (m *Master) upToDate(a, b restartReport) bool {
	if a.paged != b.paged && !(mutation.On && m.mut.restartPaged) {
		return b.paged
	}
	if a.lu == 0 || b.lu == 0 {
		return a.length > b.length
	}
	if ea, eb := a.lu>>m.seqBits, b.lu>>m.seqBits; ea != eb {
		return ea > eb
	}
	return a.length > b.length
}

// Awaited lists the candidates of a chain that is down that have not
// reported yet (Restarted), in id order: whom the restart waits for.
func (m *Master) Awaited() []NodeID {
	if m.down == nil {
		return nil
	}
	var ids []NodeID
	for n := range m.down.cands {
		if _, ok := m.down.reports[n]; !ok {
			ids = append(ids, n)
		}
	}
	slices.Sort(ids)
	return ids
}

// Paged reports whether a chain that is down waits only because every
// candidate reported paged (Restarted): none holds a history's state, and
// the chain stays down until one reports whole — restarted on an emptied
// directory, which carries the chain on with nothing — whatever the
// operator forgoes (Forgo keeps the last candidate).
func (m *Master) Paged() bool {
	d := m.down
	if d == nil || len(d.reports) == 0 || len(d.reports) < len(d.cands) {
		return false
	}
	for _, r := range d.reports {
		if !r.paged {
			return false
		}
	}
	return true
}

// Forgo is an operator's way out of a whole-chain restart that waits for a
// node that may never come back (its disk gone for good): the chain
// restarts without n, from the longest history among the others, as soon
// as every other candidate has reported — at once if they all have. It
// reports whether the chain restarted now.
//
// What it may cost: n may have been the only one holding the last updates
// acknowledged before the chain went down (the last tail, whose durable
// prefix holds every one; the others' commit points lag it): those are
// lost. If n comes back, holding more than the history the chain restarted
// from, it holds exactly such updates, which the chain no longer has: it is
// not joined (Join: ForgoneError) until it restarts holding nothing. One
// holding no more is joined as any restarted member.
//
// Only while the chain is down, for a candidate, and never the last one.
func (m *Master) Forgo(n NodeID) (bool, error) {
	d := m.down
	if d == nil {
		return false, fmt.Errorf("chain: restart without %d: the chain is not down", n)
	}
	if !d.cands[n] {
		return false, fmt.Errorf("chain: restart without %d: not among the members the restart waits for (%v)", n, m.Awaited())
	}
	if len(d.cands) == 1 {
		return false, fmt.Errorf("chain: restart without %d: it is the only member that may hold the chain's history", n)
	}
	delete(d.cands, n)
	delete(d.reports, n)
	if m.forgone == nil {
		m.forgone = map[NodeID]int{}
	}
	m.forgone[n] = -1
	return m.maybeRestart(), nil
}

// ForgoneError is Join's refusal of a node left out of a whole-chain
// restart (Forgo) that came back holding more than the history the chain
// restarted from: the updates beyond it were acknowledged, perhaps, and
// lost with the restart; it must restart holding nothing (an empty disk)
// to join.
type ForgoneError struct {
	Node   NodeID
	Length int // the history the chain restarted from, in entries
}

func (e *ForgoneError) Error() string {
	return fmt.Sprintf("chain: join of %d: it was left out of the chain's restart, which restarted from a history of %d entries, and holds more: "+
		"updates the chain lost with the restart; restart it on an empty disk to join", e.Node, e.Length)
}
