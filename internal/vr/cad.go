package vr

import (
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Consistency-aware durability and cross-client monotonic reads
// (docs/design/cad.md; paper 003, digest §2).
//
// Three indexes sit around the commit point C (persisted on a majority, the
// only thing ever applied):
//
//   - acked: the highest op held in memory by a majority. A write proposed
//     with AckReplicated is acknowledged (Ready.Acks) once acked covers it;
//     one proposed with AckAppended at once.
//   - R, the readable index: everything <= R is durable and applied on the
//     leader and on every member of the active set, so any of them may serve
//     it and no later read, anywhere, can return something older. Without
//     Config.FollowerReads, R = C.
//
// The active set (FollowerReads only): the leader tracks each follower as
// OUT → JOINING → IN → REMOVING → OUT. JOINING, IN and REMOVING members hold
// R back (R <= their applied op); only IN members get read leases (grants);
// a suspected member is moved to REMOVING, stops getting grants, and is only
// dropped once Removal has passed since the last grant *sent* to it, by which
// time any grant it holds has run out whatever the network did. R advances
// only while the leader and its IN members are a majority, so whatever was
// read is applied and persisted on a majority.
//
// Grant timing (a deliberate change from cad.md's "measured from receipt",
// see the note added there): a follower numbers its prepare-oks (AckSeq) and
// remembers when it produced each; the leader echoes the latest one it has
// with a grant g, and the follower's lease ends g·(1−ρ)/(1+ρ) after it *sent*
// that prepare-ok, on its own clock. The prepare-ok was sent before the
// leader decided, so however long the grant then sits in a queue, the lease
// ends (in real time) at most g/(1+ρ) after the leader granted it: within
// the leader's own lease (g <= its remaining lease) and within MarkOut of
// the grant on the leader's clock (so Removal's bound holds). Timing from
// receipt would let a delayed grant outlive both (the bounded(t) lesson,
// commit f2c5a71).

type earlyAck struct {
	op, client, req uint64
}

type ackSent struct {
	seq uint64
	at  int64
}

type cadState struct {
	// Leader, per member index (this view).
	recv      []uint64      // last op held in memory
	peerApp   []uint64      // applied op last reported
	member    []MemberState // active-set state
	lastReply []int64       // local time of the latest prepare-ok (0: none this view)
	lastGrant []int64       // local time of the latest grant sent
	lagSince  []int64       // since when the member trails a pending durability wait
	ackSeqIn  []uint64      // latest AckSeq received, echoed with grants
	acked     uint64
	readable  uint64
	want      map[dkey]AckPoint // early acks requested, not yet ordered
	early     []earlyAck        // ordered AckReplicated writes waiting for acked
	scratch   []uint64          // for the majority sort (hot path: no allocation)
	scratchT  []int64

	// Follower.
	ackSeq     uint64
	ackRing    [hbRing]ackSent
	leaseUntil int64
	leaseView  uint64
	learnedR   uint64
	sent       [4]uint64 // view, received, persisted, applied of the last prepare-ok
	hinted     [2]uint64 // view, last op received in a prepare that asked for a sync (SyncWanted)
	due        bool      // a heartbeat asks for a prepare-ok
	dueHB      uint64
}

func (c *cadState) init(n int, nonce uint64) {
	c.recv = make([]uint64, n)
	c.peerApp = make([]uint64, n)
	c.member = make([]MemberState, n)
	c.lastReply = make([]int64, n)
	c.lastGrant = make([]int64, n)
	c.lagSince = make([]int64, n)
	c.ackSeqIn = make([]uint64, n)
	c.scratch = make([]uint64, n)
	c.scratchT = make([]int64, 0, n)
	c.want = map[dkey]AckPoint{}
	// Sequence numbers must not repeat across restarts, or a grant echoing
	// an earlier life's prepare-ok could be anchored at a later send time.
	// The driver's start nonce (random) gives each life its own range.
	c.ackSeq = nonce >> 1
}

// cadReset forgets the active set, R and the early acks: on view change.
func (r *Replica) cadReset() {
	c := &r.cad
	for i := range c.recv {
		c.recv[i], c.peerApp[i], c.lastReply[i], c.lastGrant[i], c.lagSince[i], c.ackSeqIn[i] = 0, 0, 0, 0, 0, 0
		c.member[i] = MemberOut
	}
	c.acked, c.readable = 0, 0
	clear(c.want)
	c.early = nil
	c.leaseUntil, c.leaseView, c.learnedR = 0, 0, 0
	c.due, c.dueHB = false, 0
}

// ProposeAck is Propose with an acknowledgement point. With AckReplicated
// or AckAppended, Ready.Acks carries a Reply without Result once the write
// is held in memory by a majority (resp. appended at the leader); the
// normal Reply still comes when it is applied. Only requests with a client
// identity (Client != 0) can be acknowledged early; the caller must use
// AckApplied for anything whose reply depends on state.
func (r *Replica) ProposeAck(now int64, req Request, ack AckPoint) error {
	if ack > AckAppended {
		return fmt.Errorf("vr: unknown ack point %d", ack)
	}
	if err := r.Propose(now, req); err != nil {
		return err
	}
	if ack != AckApplied && req.Client != 0 {
		k := dkey{req.Client, req.ReqNum}
		if r.inflightQueued(k) {
			r.cad.want[k] = ack
		}
	}
	return nil
}

// inflightQueued reports whether the request still waits in the proposal
// queue (Propose took it; an executed duplicate or an in-flight retry was
// answered or dropped instead). The scan runs backwards: a request Propose
// has just queued is the last one, found at once; only a retry of a request
// still queued, or a duplicate Propose did not queue, walks the queue.
func (r *Replica) inflightQueued(k dkey) bool {
	for i := len(r.queue) - 1; i >= 0; i-- {
		if q := r.queue[i]; q.Client == k.client && q.ReqNum == k.req {
			return true
		}
	}
	return false
}

// Queued reports whether request (client, req) waits in the proposal queue,
// i.e. whether the Propose that just took it will append it as a new entry:
// false for a retry of a request in flight (dropped: its reply comes when the
// entry already in the log is applied) or of an executed one (answered from
// the client table).
func (r *Replica) Queued(client, req uint64) bool {
	return r.inflightQueued(dkey{client, req})
}

// cadOrdered is called for each batch of entries the leader appends.
func (r *Replica) cadOrdered(es []Entry) {
	c := &r.cad
	if len(c.want) == 0 {
		return
	}
	for i := range es {
		e := &es[i]
		if e.Client == 0 {
			continue
		}
		k := dkey{e.Client, e.ReqNum}
		a, ok := c.want[k]
		if !ok {
			continue
		}
		delete(c.want, k)
		switch a {
		case AckAppended:
			r.out.Acks = append(r.out.Acks, Reply{Client: e.Client, ReqNum: e.ReqNum, Op: e.Op})
		case AckReplicated:
			c.early = append(c.early, earlyAck{op: e.Op, client: e.Client, req: e.ReqNum})
		}
	}
	r.advanceAcked()
}

// advanceAcked moves acked to the highest op a majority holds in memory and
// releases the early acks it covers.
func (r *Replica) advanceAcked() {
	c := &r.cad
	if r.status != Normal || !r.isLeader() {
		return
	}
	vals := c.scratch
	copy(vals, c.recv)
	vals[r.self] = r.lastOp()
	slices.Sort(vals)
	if a := vals[r.n-1-r.f]; a > c.acked {
		c.acked = a
	}
	c.acked = max(c.acked, r.commit) // committed implies held by a majority
	n := 0
	for _, e := range c.early {
		if e.op <= c.acked {
			r.out.Acks = append(r.out.Acks, Reply{Client: e.client, ReqNum: e.req, Op: e.op})
		} else {
			c.early[n] = e
			n++
		}
	}
	c.early = c.early[:n]
}

// ---- follower side ----

// ackDue asks for a prepare-ok in the next Ready (answering heartbeat hb if
// heartbeat); progress of the log, the fsync or the applied op also
// produces one. One prepare-ok per Ready: a burst coalesces.
func (r *Replica) maybeAck(hb uint64, heartbeat bool) {
	if heartbeat {
		r.cad.due = true
		r.cad.dueHB = max(r.cad.dueHB, hb)
	}
}

// flushAck builds this Ready's prepare-ok, if any.
func (r *Replica) flushAck() {
	c := &r.cad
	hbDue, hb := c.due, c.dueHB
	c.due, c.dueHB = false, 0
	ask := r.askSync
	r.askSync = false
	if r.status != Normal || r.isLeader() {
		return
	}
	recv, pers, app := r.lastOp(), r.durable, r.applied
	if mutation.On && r.mut.ackBeforePersist {
		pers = r.lastOp()
	} else if r.synced < r.viewSeq {
		pers = 0 // the view itself is not durable yet: promise nothing
	}
	progress := c.sent[0] != r.view || recv > c.sent[1] || pers > c.sent[2] ||
		(r.cfg.FollowerReads && app > c.sent[3])
	if !hbDue && !progress {
		return
	}
	if !hbDue && !ask && r.receiptOnly(recv, pers) {
		return
	}
	c.sent = [4]uint64{r.view, recv, pers, app}
	c.ackSeq++
	c.ackRing[c.ackSeq%hbRing] = ackSent{seq: c.ackSeq, at: r.now}
	m := Message{Type: MsgPrepareOK, View: r.view, Op: recv, Persisted: pers,
		Applied: app, HBSeq: hb, AckSeq: c.ackSeq}
	if ask {
		m.Readable = max(recv, 1) // AskSync: non-zero
	}
	r.send(r.cfg.LeaderOf(r.view), m)
}

// receiptOnly reports whether the prepare-ok due now would only tell the
// leader that entries arrived which its prepares asked this replica to sync
// at once (SyncWanted: a write at the leader waits for their commit): the
// host then starts their fsync without holding them, and the prepare-ok
// that reports them persisted follows, so this one is skipped — one message
// (a socket write here, a read and a step at the leader) fewer per such
// write (docs/design/write-path.md, "Counted per write"). Safe: a prepare-ok
// only ever tells the leader more; what a receipt ack is for is CAD's
// majority-in-memory acknowledgement (acked, from recv), which the later
// ack also carries, so a cad write that shares such a prepare with a waited
// one is acknowledged an fsync later, never wrongly. Not with follower
// reads, whose active set watches every reply (updateMembers), and never
// when anything but receipt progressed (view, persisted, applied) or a
// heartbeat or AskSync wants an answer (flushAck).
func (r *Replica) receiptOnly(recv, pers uint64) bool {
	c := &r.cad
	return !r.cfg.FollowerReads && c.sent[0] == r.view && pers <= c.sent[2] &&
		c.hinted[0] == r.view && recv <= c.hinted[1]
}

// learn takes R and the grant from a leader message of the current view.
func (r *Replica) learn(m *Message) {
	r.evLearn(m)
	c := &r.cad
	if !r.cfg.FollowerReads || r.status != Normal || m.View != r.view {
		return
	}
	if c.leaseView != r.view {
		c.leaseView, c.leaseUntil, c.learnedR = r.view, 0, 0
	}
	c.learnedR = max(c.learnedR, m.Readable)
	if m.Grant <= 0 {
		// Marked out (or the leader lost its lease): stop at once; the
		// leader still counts us in R until Removal, so this is only early.
		c.leaseUntil = 0
		return
	}
	s := c.ackRing[m.AckSeq%hbRing]
	if m.AckSeq == 0 || s.seq != m.AckSeq {
		return // not ours (an earlier life's) or too old to remember
	}
	d := int64(float64(m.Grant) * (1 - r.cfg.MaxDrift) / (1 + r.cfg.MaxDrift))
	if mutation.On && r.mut.grantFromReceipt {
		s.at = r.now
	}
	c.leaseUntil = max(c.leaseUntil, s.at+d)
}

// FollowerRead says whether this follower may serve a cross-client-monotonic
// read at local time now, and up to which op: it may serve a key from its
// state machine if the key's latest version there (tombstones included) is
// <= readable; otherwise the read goes to the leader. It fails with
// ErrNoReadLease unless follower reads are on, this replica is a normal
// follower holding a read lease of the current view, and its state machine
// has applied everything up to the readable index it learned.
func (r *Replica) FollowerRead(now int64) (readable uint64, err error) {
	r.observe(now)
	c := &r.cad
	switch {
	case !r.cfg.FollowerReads:
		return 0, fmt.Errorf("%w: follower reads are off", ErrNoReadLease)
	case r.status != Normal:
		return 0, fmt.Errorf("%w: %s", ErrNoReadLease, r.status)
	case r.isLeader():
		return 0, fmt.Errorf("%w: this replica leads view %d (use WaitReadable)", ErrNoReadLease, r.view)
	case c.leaseView != r.view || r.now >= c.leaseUntil:
		return 0, fmt.Errorf("%w: no grant in view %d", ErrNoReadLease, r.view)
	case r.applied < c.learnedR && !(mutation.On && r.mut.followerNoAppliedCheck):
		// The leader counted an applied op of ours that we no longer have
		// (a report from before a restart, reordered): serving could miss
		// a version <= R that someone already read.
		return 0, fmt.Errorf("%w: applied %d below readable %d", ErrNoReadLease, r.applied, c.learnedR)
	}
	return c.learnedR, nil
}

// FollowerLease is FollowerRead for readers outside the driver: the local
// time until which this follower's read lease lasts and the readable index
// it serves up to; ok is false when FollowerRead would fail now for any
// reason but time. Published as vr.LeaseUntil is (before anything a step
// produced is sent), a reader that loaded it before the driver saw a view
// change serves as a follower cut off from that change would: within its
// grant, during which no other view can form (a grant ends within the
// leader's lease, and the leader joins no view while a grant it sent may be
// valid: grantFor).
func (r *Replica) FollowerLease() (until int64, readable uint64, ok bool) {
	c := &r.cad
	if !r.cfg.FollowerReads || r.status != Normal || r.isLeader() || c.leaseView != r.view ||
		(r.applied < c.learnedR && !(mutation.On && r.mut.followerNoAppliedCheck)) {
		return 0, 0, false
	}
	return c.leaseUntil, c.learnedR, true
}

// ---- leader side: active set and R ----

// leaseEnd is the local time the leader's lease runs out (0: no lease).
func (r *Replica) leaseEnd() int64 {
	if r.cfg.LeaseDuration == 0 || r.commit < r.viewStartOp {
		return 0
	}
	start := r.quorumAckAt()
	if start == 0 {
		return 0
	}
	return start + int64(r.cfg.LeaderLease())
}

// quorumAckAt is the local time this leader sent the latest heartbeat that
// f followers have acknowledged in its view (0: fewer than f have
// acknowledged one; now in a group of one): where its lease starts, and
// the last time it knew a quorum was with it (suspects).
func (r *Replica) quorumAckAt() int64 {
	if r.f == 0 {
		return r.now
	}
	at := r.cad.scratchT[:0]
	for i, a := range r.ackAt {
		if i != r.self {
			at = append(at, a)
		}
	}
	return nthLargest(at, r.f)
}

// grantFor returns the grant for follower j in a message sent now, with the
// leader's lease ending at end.
func (r *Replica) grantFor(j int, end int64) int64 {
	c := &r.cad
	if !r.cfg.FollowerReads || c.member[j] != MemberIn || c.ackSeqIn[j] == 0 {
		return 0
	}
	g := int64(r.cfg.MarkOut)
	if !(mutation.On && r.mut.grantBeyondLease) {
		rem := end - r.now
		if rem <= 0 {
			return 0
		}
		g = min(g, rem)
	}
	c.lastGrant[j] = r.now
	if !(mutation.On && r.mut.leaderVotesWhileGranting) {
		// The leader's lease keeps every other replica that backs it out
		// of a new view, but not the leader itself: it could join one at
		// once (and the grantee, cut off, keep serving). So the leader, too,
		// joins no other view while a grant it sent may be valid: the
		// grantee's lease ends, in real time, within g/(1+ρ) of now, which
		// g of the leader's clock covers.
		r.promiseUntil = max(r.promiseUntil, r.now+g)
	}
	return g
}

// sendLeader sends a prepare or heartbeat to every follower with its R,
// grant and echoed prepare-ok number.
func (r *Replica) sendLeader(m Message) {
	m.Readable = r.Readable()
	r.syncHint(&m)
	r.evVouch(&m)
	var end int64
	if r.cfg.FollowerReads {
		end = r.leaseEnd()
	}
	for j, id := range r.cfg.Members {
		if j == r.self {
			continue
		}
		mm := m
		mm.Grant = r.grantFor(j, end)
		mm.AckSeq = r.cad.ackSeqIn[j]
		r.send(id, mm)
	}
}

// onPeerAck records a prepare-ok's CAD fields.
func (r *Replica) onPeerAck(j int, m *Message) {
	c := &r.cad
	if m.Op > c.recv[j] {
		c.recv[j] = min(m.Op, r.lastOp())
	}
	// Latest, not highest: a restarted follower reports a lower applied op
	// and a new sequence range.
	c.peerApp[j] = m.Applied
	c.ackSeqIn[j] = m.AckSeq
	c.lastReply[j] = r.now
	r.advanceAcked()
	r.updateMembers()
}

// updateMembers runs the active-set state machine and advances R.
func (r *Replica) updateMembers() {
	c := &r.cad
	if r.status != Normal || !r.isLeader() {
		return
	}
	if r.cfg.FollowerReads {
		susp := int64(r.cfg.Suspect)
		target := r.waitTarget()
		for j := range c.member {
			if j == r.self {
				continue
			}
			alive := c.lastReply[j] != 0 && r.now-c.lastReply[j] < susp
			lag := target > c.readable && c.peerApp[j] < target
			if !lag {
				c.lagSince[j] = 0
			} else if c.lagSince[j] == 0 {
				c.lagSince[j] = r.now
			}
			lagging := lag && r.now-c.lagSince[j] >= susp
			// A follower joins once it has caught up with R (and with what a
			// pending durability wait needs), so a far-behind or stuck one
			// does not hold R back while it catches up; it is counted in R
			// (JOINING) before it is granted (IN), so R cannot pass it in
			// between (digest §2.15.2).
			if c.member[j] == MemberOut && alive && c.peerApp[j] >= c.readable && !lag {
				c.member[j] = MemberJoining
			}
			switch c.member[j] {
			case MemberJoining:
				// Never granted in this state: it can leave at once.
				if !alive || lagging {
					c.member[j] = MemberOut
				} else if c.peerApp[j] >= c.readable && c.peerApp[j] >= r.viewStartOp {
					c.member[j] = MemberIn
				}
			case MemberIn:
				if !alive || lagging {
					c.member[j] = MemberRemoving
				}
			case MemberRemoving:
				if (mutation.On && r.mut.dropAtOnce) || r.now-c.lastGrant[j] >= int64(r.cfg.Removal) {
					c.member[j] = MemberOut
					c.lagSince[j] = 0
				}
			}
		}
	}
	r.advanceReadable()
}

// waitTarget is the lowest op a pending durability wait needs R to reach
// (0: none).
func (r *Replica) waitTarget() uint64 {
	var t uint64
	for _, rd := range r.reads {
		if w := max(rd.readable, r.viewStartOp); rd.durWait && (t == 0 || w < t) {
			t = w
		}
	}
	return min(t, r.commit)
}

func (r *Replica) advanceReadable() {
	c := &r.cad
	if r.status != Normal || !r.isLeader() {
		return
	}
	if !r.cfg.FollowerReads {
		c.readable = max(c.readable, r.commit)
	} else {
		in := 1
		v := min(r.commit, r.applied)
		for j, s := range c.member {
			if j == r.self {
				continue
			}
			switch s {
			case MemberIn:
				in++
				fallthrough
			case MemberJoining, MemberRemoving:
				if !(mutation.On && r.mut.readableIgnoresMembers) {
					v = min(v, c.peerApp[j])
				}
			}
		}
		if in >= r.f+1 && v > c.readable {
			c.readable = v
		}
	}
	r.checkReads()
}

// Readable returns the readable index R: at the leader, 0 until R covers
// the ops the view started with (a new leader serves nothing before); at a
// follower, the R it last learned in the current view.
func (r *Replica) Readable() uint64 {
	if r.status != Normal {
		return 0
	}
	if !r.isLeader() {
		if r.cad.leaseView != r.view {
			return 0
		}
		return r.cad.learnedR
	}
	if r.cad.readable < r.viewStartOp {
		return 0
	}
	return r.cad.readable
}

// WaitReadable registers a durability wait at the leader: Ready.ReadStates
// will carry ctx once R >= index and a heartbeat round sent after this call
// confirmed this replica still leads (Index is then the op the state machine
// must have applied before serving, >= index), or ErrNotLeader if it lost
// leadership meanwhile. The leader sends its heartbeat (and with it the
// commit point and grants) at once rather than at the next tick.
func (r *Replica) WaitReadable(now int64, ctx, index uint64) error {
	r.observe(now)
	if r.status != Normal || !r.isLeader() {
		return ErrNotLeader
	}
	if index > r.lastOp() {
		return fmt.Errorf("vr: durability wait for op %d beyond the log's last op %d", index, r.lastOp())
	}
	r.reads = append(r.reads, readReq{ctx: ctx, durWait: true, readable: index})
	r.hbNow = true
	return nil
}

// AwaitReadable registers a durability wait that needs no leadership round:
// Ready.ReadStates will carry ctx once R >= index in this view, or
// ErrNotLeader if this replica steps down first. It is for a read whose
// result was fixed while this replica's leadership was already confirmed
// (lease or read-index) and that returns an entry of this view's log at
// index (vrshard's deferred reads, docs/design/cad.md §11): once R covers
// index in this view the entry is durable, and the view's leader was the
// leader when the result was fixed, so no later confirmation adds anything.
// Without follower reads R is the commit point, which the followers'
// persisted reports move; with them R needs the members' applied reports,
// so the leader heartbeats at once as WaitReadable does.
//
// index names an entry of the log of the view the caller last saw in a
// Ready (the caller checks that it led that view). If the view changed since
// — the driver steps several messages between Readies, and this replica may
// already lead a later view whose adopted log holds another entry at index
// — the wait is refused: R in the new view says nothing about the entry the
// caller read.
func (r *Replica) AwaitReadable(now int64, ctx, index uint64) error {
	r.observe(now)
	if r.status != Normal || !r.isLeader() || r.view != r.lastHS.View {
		return ErrNotLeader
	}
	if index > r.lastOp() {
		return fmt.Errorf("vr: durability wait for op %d beyond the log's last op %d", index, r.lastOp())
	}
	r.reads = append(r.reads, readReq{ctx: ctx, durWait: true, readable: index, noConfirm: true})
	if r.cfg.FollowerReads {
		r.hbNow = true
	}
	r.checkReads()
	return nil
}

// PeerInfo is the leader's view of one follower (for /status).
type PeerInfo struct {
	ID        uint64
	State     MemberState
	Received  uint64
	Persisted uint64
	Applied   uint64
	// LastReply and LastGrant are local times (0: none in this view).
	LastReply int64
	LastGrant int64
}

// Peers reports the leader's view of each follower (nil on a follower).
func (r *Replica) Peers() []PeerInfo {
	if r.status != Normal || !r.isLeader() || r.n == 1 {
		return nil
	}
	c := &r.cad
	out := make([]PeerInfo, 0, r.n-1)
	for j, id := range r.cfg.Members {
		if j == r.self {
			continue
		}
		out = append(out, PeerInfo{ID: id, State: c.member[j], Received: c.recv[j], Persisted: r.acked[j],
			Applied: c.peerApp[j], LastReply: c.lastReply[j], LastGrant: c.lastGrant[j]})
	}
	return out
}

func (r *Replica) checkCADInvariants() {
	c := &r.cad
	if r.status != Normal || !r.isLeader() {
		return
	}
	if c.readable > r.commit {
		panic(fmt.Sprintf("vr: replica %d: readable %d beyond commit %d", r.cfg.Self, c.readable, r.commit))
	}
	if c.acked > r.lastOp() {
		panic(fmt.Sprintf("vr: replica %d: acked %d beyond last op %d", r.cfg.Self, c.acked, r.lastOp()))
	}
	if r.cfg.FollowerReads && !(mutation.On && r.mut.readableIgnoresMembers) && c.readable > r.applied {
		panic(fmt.Sprintf("vr: replica %d: readable %d beyond its applied %d", r.cfg.Self, c.readable, r.applied))
	}
}
