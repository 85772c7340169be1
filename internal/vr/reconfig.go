package vr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Reconfiguration (VR Revisited §7; docs/design/cluster.md, "Membership").
//
// The leader orders a reconfiguration entry like any request (Reconfigure):
// once it is in the log the leader accepts no more client ops in the epoch
// (they get a ReconfiguredError), so the entry is the epoch's last op k.
// When a replica hands out op k (Ready), it moves to epoch e+1: the new
// member list, EpochStart k, Previous the old members, view 0 (the leader
// of the new epoch is Members[0]), and it reports the new configuration in
// Ready.Membership for the host to persist with the hard state.
//
//   - An old member that stays is a member of e+1 holding its start state
//     (its log reaches k): it is normal in view 0 at once, leader or
//     follower. It tells the members that left (epoch-started).
//   - An old member that leaves is "leaving" (Info.Leaving): it stops
//     serving, keeps answering state transfer from the new members, and
//     tells each new member of the epoch (start-epoch) until f'+1 of them
//     report that they hold its start state (epoch-started); then
//     Info.Retired says the host may stop it.
//   - A new member (the host starts it with the new configuration and an
//     empty state, Membership.Apply) or any member whose commit point is
//     below k is "joining": it neither votes nor acknowledges, and pulls
//     the committed log (or a snapshot) from the new and the previous
//     members in turn (get-state marked join) until its commit point
//     reaches k; then it takes part as a restarted member would (a member
//     that would lead its view moves to the next one: it may have led it
//     before a crash).
//
// Epochs meet in Step: a message of an older epoch is refused as before
// and answered with a start-epoch; a refusal of ours from an older epoch
// likewise. A replica that gets a start-epoch of a later epoch moves to it
// (joining, or leaving if it is not a member): it never rejoins the old
// group, whose last op it may not know is committed. Joining members of e+1
// vote in nothing, so every view change of e+1 draws f'+1 replicas that
// hold op k: no view of e+1 can start from a log without the epoch's start.

// reconfigClient marks a reconfiguration entry (Request.Client); ReqNum is
// the new epoch and Data the encoded membership. Hosts never see it: the
// entry is handed out as an empty request (Ready), which they skip.
const reconfigClient = math.MaxUint64

// joinMark in a get-state's Nonce marks a joining member's pull: any member
// or previous member answers with its committed entries (onJoinGetState).
const joinMark = 1

// Membership is a group's configuration after a reconfiguration: what the
// host persists (Ready.Membership, written in the same atomic record as the
// hard state that follows it) and passes back on restart (State.Membership).
type Membership struct {
	Epoch    uint64
	Members  []uint64
	Start    uint64 // Config.EpochStart
	Previous []uint64
}

// Apply returns c with m's epoch, members, start and previous members.
func (m Membership) Apply(c Config) Config {
	c.Epoch, c.Members, c.EpochStart, c.Previous = m.Epoch, slices.Clone(m.Members), m.Start, slices.Clone(m.Previous)
	return c
}

// Reconfiguration errors.
var (
	// ErrReconfigured is what errors.Is finds in a ReconfiguredError.
	ErrReconfigured = errors.New("vr: group reconfigured")
	// ErrReconfigUnsupported: the fast paths (nilext, follower reads) keep
	// promises across the epoch's end that reconfiguration does not carry
	// over yet (docs/design/cluster.md, Membership).
	ErrReconfigUnsupported = errors.New("vr: reconfiguration is not supported with the nilext fast path or follower reads")
	// ErrBadMembers: the member list asked for is not a valid new group.
	ErrBadMembers = errors.New("vr: invalid new member list")
	// ErrEpochMoved is what errors.Is finds in an EpochMovedError.
	ErrEpochMoved = errors.New("vr: the group's configuration epoch moved")
)

// AnyEpoch as Reconfigure's expected epoch: the request is not tied to the
// configuration it was planned against (an old caller's KEFIR.GROUP
// RECONFIG without EPOCH).
const AnyEpoch = math.MaxUint64

// EpochMovedError refuses a reconfiguration planned against configuration
// Expected when the group is at Epoch (Members) by the time the leader
// orders it: another change came first, and the request, made from the
// older member list, would undo it. The caller reads the configuration
// again and plans against it.
type EpochMovedError struct {
	Expected, Epoch uint64
	Members         []uint64
	// Pending: the change to Epoch is ordered, not committed yet (it may
	// still be lost in a view change of epoch Expected).
	Pending bool
}

func (e *EpochMovedError) Error() string {
	if e.Pending {
		return fmt.Sprintf("vr: the group is moving to epoch %d (members %v) from epoch %d, which the reconfiguration expected: another change came first", e.Epoch, e.Members, e.Expected)
	}
	return fmt.Sprintf("vr: the group is at epoch %d (members %v), not at epoch %d as the reconfiguration expected: another change came first", e.Epoch, e.Members, e.Expected)
}

// Is makes errors.Is(err, ErrEpochMoved) true.
func (e *EpochMovedError) Is(t error) bool { return t == ErrEpochMoved }

// ReconfiguredError refuses a client op (or read) at a replica whose group
// is moving, or has moved, to configuration Epoch with Members: retry the
// op there (at Members[0], the new epoch's first leader, or wherever the
// new members redirect). Pending says the reconfiguration is not committed
// yet: it may still be lost in a view change of the old epoch, and then the
// old group takes ops again.
type ReconfiguredError struct {
	Epoch   uint64
	Members []uint64
	Pending bool
}

func (e *ReconfiguredError) Error() string {
	if e.Pending {
		return fmt.Sprintf("vr: group is reconfiguring to epoch %d, members %v: retry at the new configuration", e.Epoch, e.Members)
	}
	return fmt.Sprintf("vr: group moved to epoch %d, members %v: retry at the new configuration", e.Epoch, e.Members)
}

// Is makes errors.Is(err, ErrReconfigured) true.
func (e *ReconfiguredError) Is(t error) bool { return t == ErrReconfigured }

// epochState is the replica's reconfiguration state.
type epochState struct {
	// pending: op of a reconfiguration entry for a later epoch in the log,
	// not yet handed out (0: none). queued: one waits in the proposal queue.
	pending uint64
	queued  []uint64
	// joining: a member of this epoch whose commit point has not reached
	// EpochStart. leaving: not a member of this epoch.
	joining, leaving bool
	// started: members that reported holding the epoch's start state
	// (leaving replicas count them; f'+1 of them retire it).
	started map[uint64]bool
	// lastPull / pullNext: a joining replica's pull round and next source;
	// lastPush: a leaving replica's start-epoch round.
	lastPull, lastPush int64
	pullNext           int
	// replyOld: the Ready that moved this replica out of its epoch handed
	// out entries it proposed as leader; Advance still answers their clients.
	replyOld bool
	// hold: the persist batch that writes the new configuration. No message
	// leaves before it is durable (Ready): a replica that told others of the
	// new epoch and then lost the record (a power cut) would restart in the
	// old one, and they, having adopted the new epoch from it, would pull a
	// start state that nobody knows is committed (the power-cut simulation,
	// seed 327).
	hold uint64
}

// isReconfig: the client id and the data's magic both (a client that drew
// the reserved id by chance must not look like one).
func isReconfig(e *Entry) bool {
	return e.Client == reconfigClient && len(e.Data) >= len(membershipMagic) && string(e.Data[:len(membershipMagic)]) == membershipMagic
}

const membershipMagic = "vr-reconfig"

func encodeMembership(members, previous []uint64) []byte {
	b := []byte(membershipMagic)
	b = binary.AppendUvarint(b, uint64(len(members)))
	for _, m := range members {
		b = binary.AppendUvarint(b, m)
	}
	b = binary.AppendUvarint(b, uint64(len(previous)))
	for _, m := range previous {
		b = binary.AppendUvarint(b, m)
	}
	return b
}

func decodeMembership(b []byte) (members, previous []uint64, err error) {
	const magic = membershipMagic
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, nil, fmt.Errorf("vr: not a reconfiguration entry (%d bytes)", len(b))
	}
	d := kv.Decoder{B: b[len(magic):]}
	read := func() []uint64 {
		n := d.Uvarint()
		if n > 1<<16 {
			d.Err = fmt.Errorf("member count %d", n)
			return nil
		}
		out := make([]uint64, 0, n)
		for range n {
			out = append(out, d.Uvarint())
		}
		return out
	}
	members, previous = read(), read()
	if err := d.Err; err != nil {
		return nil, nil, fmt.Errorf("vr: corrupt reconfiguration entry: %w", err)
	}
	return members, previous, nil
}

// checkMembers validates a new member list against the current one.
func (r *Replica) checkMembers(members []uint64) error {
	if len(members) == 0 || len(members)%2 == 0 {
		return fmt.Errorf("%w: need an odd number of members, have %d", ErrBadMembers, len(members))
	}
	seen := map[uint64]bool{}
	for _, m := range members {
		if m == 0 || m == reconfigClient {
			return fmt.Errorf("%w: member id %d is reserved", ErrBadMembers, m)
		}
		if seen[m] {
			return fmt.Errorf("%w: member %d listed twice", ErrBadMembers, m)
		}
		seen[m] = true
	}
	if len(members) == len(r.cfg.Members) {
		same := true
		for _, m := range r.cfg.Members {
			same = same && seen[m]
		}
		if same {
			return fmt.Errorf("%w: %v is the current member set", ErrBadMembers, members)
		}
	}
	return nil
}

// Reconfigure asks the leader to move the group from configuration epoch
// (AnyEpoch: whatever it is) to a new member list (odd, distinct, not the
// current set; the first member leads the new epoch's view 0). The request
// is ordered as the epoch's last op: from now on the leader refuses client
// ops with a ReconfiguredError. The host learns that it committed from
// Ready.Membership; if a view change of the old epoch loses it, the new
// leader takes ops again and the caller asks again.
//
// The epoch check is a compare-and-set, here and nowhere else: the entry
// it admits moves epoch to epoch+1 (its ReqNum) and can commit only in
// epoch (an epoch's entries after its reconfiguration are truncated, and a
// replica of a later epoch refuses the old epoch's messages), and no second
// reconfiguration is ordered while it is pending (canOrder). A leader that
// is behind (the group moved on without it) orders an entry that cannot
// commit. So a request planned against an older configuration never
// undoes a change that came between (EpochMovedError).
func (r *Replica) Reconfigure(now int64, epoch uint64, members []uint64) error {
	r.observe(now)
	if err := r.canOrder(); err != nil {
		// A change planned against this epoch while another one, ordered
		// from it, is under way: the epoch is about to move (or the other
		// change is lost in a view change, and the group stays). Refused
		// as moved, naming the change under way, so the caller plans
		// against the configuration that comes of it (waiting for it)
		// rather than giving up on a refusal it cannot read.
		var re *ReconfiguredError
		if epoch == r.cfg.Epoch && errors.As(err, &re) && re.Pending {
			return &EpochMovedError{Expected: epoch, Epoch: re.Epoch, Members: re.Members, Pending: true}
		}
		return err
	}
	if epoch != AnyEpoch && epoch != r.cfg.Epoch {
		return &EpochMovedError{Expected: epoch, Epoch: r.cfg.Epoch, Members: slices.Clone(r.cfg.Members)}
	}
	if r.cfg.Nilext || r.cfg.FollowerReads {
		return ErrReconfigUnsupported
	}
	if err := r.checkMembers(members); err != nil {
		return err
	}
	if int(r.lastOp()-r.commit)+len(r.queue) >= r.cfg.MaxInflight {
		return ErrBusy
	}
	r.ep.queued = slices.Clone(members)
	r.queue = append(r.queue, Request{Client: reconfigClient, ReqNum: r.cfg.Epoch + 1,
		Data: encodeMembership(members, r.cfg.Members)})
	return nil
}

// canOrder is why this replica cannot order a request now (nil if it can):
// it is leaving or reconfiguring, not normal, or not the leader.
func (r *Replica) canOrder() error {
	if err := r.refuseReconfigured(); err != nil {
		return err
	}
	if r.status != Normal {
		return ErrNotNormal
	}
	if !r.isLeader() {
		return ErrNotLeader
	}
	return nil
}

// refuseReconfigured is the error for a client op at a replica that is
// leaving, or whose leader has ordered a reconfiguration (nil otherwise).
func (r *Replica) refuseReconfigured() error {
	switch {
	case r.ep.leaving:
		return &ReconfiguredError{Epoch: r.cfg.Epoch, Members: slices.Clone(r.cfg.Members)}
	case r.ep.queued != nil:
		return &ReconfiguredError{Epoch: r.cfg.Epoch + 1, Members: slices.Clone(r.ep.queued), Pending: true}
	case r.ep.pending != 0:
		ms, _, _ := decodeMembership(r.entry(r.ep.pending).Data)
		return &ReconfiguredError{Epoch: r.cfg.Epoch + 1, Members: ms, Pending: true}
	}
	return nil
}

// noteAppended tracks reconfiguration entries for a later epoch entering
// the log (appendEntries).
func (r *Replica) noteAppended(es []Entry) {
	for i := range es {
		if isReconfig(&es[i]) && es[i].ReqNum > r.cfg.Epoch {
			r.ep.pending = es[i].Op
			r.ep.queued = nil
		}
	}
}

// enterEpoch moves the replica to the epoch that the reconfiguration entry
// e (just handed out: committed) begins.
func (r *Replica) enterEpoch(e *Entry) {
	members, _, err := decodeMembership(e.Data)
	if err != nil {
		panic(fmt.Sprintf("vr: replica %d: committed op %d: %v", r.cfg.Self, e.Op, err))
	}
	// Nothing follows the reconfiguration in its epoch: the leader took no
	// op after it, and an entry after it in this log was never committed.
	r.truncate(e.Op)
	if r.status == Normal && r.isLeader() {
		// The old members learn the commit point in their epoch and move
		// on their own; told only in the new one, they would refuse it
		// and have to pull (start-epoch, then a join).
		r.heartbeat()
	}
	cfg := r.cfg
	cfg.Epoch, cfg.Members, cfg.EpochStart, cfg.Previous = e.ReqNum, members, e.Op, slices.Clone(r.cfg.Members)
	r.switchConfig(cfg)
}

// switchConfig makes cfg this replica's configuration, in view 0 of its
// epoch, and reports it for the host to persist (Ready.Membership).
func (r *Replica) switchConfig(cfg Config) {
	wasLeader := r.status == Normal && r.isLeader()
	r.stepDown()
	r.defers = nil // promises made in the old epoch (do-view-change, prepare-ok) mean nothing in the new one
	ackSeq := r.cad.ackSeq
	r.cfg, r.hash = cfg, cfg.Hash()
	r.n = len(cfg.Members)
	r.f = (r.n - 1) / 2
	r.self = slices.Index(cfg.Members, cfg.Self)
	r.resize(0)
	r.cad.ackSeq = ackSeq // this life's sequence goes on (never reused)
	r.ep = epochState{replyOld: wasLeader}
	r.view, r.lnv = 0, 0
	r.pendingView, r.vcHeld, r.vcAbandoned = 0, false, 0
	r.lastPreVote = 0
	r.hsDirty = true
	r.viewSeq = r.nextSeq() // the new epoch's view is durable with this batch
	r.ep.hold = r.nextSeq()
	r.out.Membership = &Membership{Epoch: cfg.Epoch, Members: slices.Clone(cfg.Members), Start: cfg.EpochStart,
		Previous: slices.Clone(cfg.Previous)}
	switch {
	case r.self < 0:
		r.ep.leaving = true
		r.ep.started = map[uint64]bool{}
		r.status = Recovering
		r.pushEpoch()
	case r.commit < cfg.EpochStart:
		r.ep.joining = true
		r.status = Recovering
		r.pull()
	default:
		r.startEpoch()
	}
}

// resize makes the per-member arrays fit r.n members (New, and a new
// configuration); nonce seeds the prepare-ok sequence (cadState.init).
func (r *Replica) resize(nonce uint64) {
	r.acked = make([]uint64, r.n)
	r.hbAcked = make([]uint64, r.n)
	r.ackAt = make([]int64, r.n)
	r.snapWanted = make([]bool, r.n)
	r.snapNext = make([]int64, r.n)
	r.svc = make([]bool, r.n)
	r.dvc = make([]*Message, r.n)
	r.recResp = make([]*Message, r.n)
	r.preVoteAt = make([]int64, r.n)
	r.preVoteView = make([]uint64, r.n)
	r.cad.init(r.n, nonce)
}

// startEpoch: an old member that stays, at the reconfiguration's commit,
// is normal in view 0 of the new epoch, as a bootstrapped member is.
func (r *Replica) startEpoch() {
	r.status = Normal
	r.lastContact = r.now
	if r.isLeader() {
		r.viewStartOp = r.lastOp()
		r.lastHB = r.now - int64(r.cfg.HeartbeatInterval)
		r.hbNow = true
	}
	r.tellStarted()
}

// tellStarted sends epoch-started to the previous members that left. Only
// once what it vouches for is durable: a leaving replica retires on f'+1 of
// them, and may be the last that knows the epoch's start op is committed
// (a joining member that had reported from memory and lost its state in a
// power cut left none that did: the simulation, seed 527).
func (r *Replica) tellStarted() {
	for _, id := range r.cfg.Previous {
		if id != r.cfg.Self && !slices.Contains(r.cfg.Members, id) {
			r.sendAfterSync(id, Message{Type: MsgEpochStarted, Op: r.cfg.EpochStart})
		}
	}
}

// join: a joining member's commit point reached the epoch's start. It takes
// part as a member restarted from its disk does (New): a member that may
// have led its view before (a crash after it had joined once) moves on.
func (r *Replica) join() {
	r.ep.joining = false
	r.tellStarted()
	r.lastContact, r.vcStart, r.lastSVC = r.now, r.now, r.now
	switch {
	case r.nonce != 0:
		// It started without its disk: promises it made may be lost, so it
		// recovers (VR §4.3) before it votes or acknowledges.
		r.status = Recovering
		r.recHave = r.commit
		r.sendRecovery()
	case r.view == r.lnv && !r.isLeader():
		r.status = Normal
	default:
		r.status = ViewChange
		if r.isLeader() {
			r.view++
		}
		r.hsDirty = true
		r.svc[r.self] = true
	}
}

// pull asks the next source for the committed log after this joining
// member's commit point.
func (r *Replica) pull() {
	r.ep.lastPull = r.now
	var srcs []uint64
	for _, id := range slices.Concat(r.cfg.Members, r.cfg.Previous) {
		if id != r.cfg.Self && !slices.Contains(srcs, id) {
			srcs = append(srcs, id)
		}
	}
	if len(srcs) == 0 {
		return
	}
	to := srcs[r.ep.pullNext%len(srcs)]
	r.ep.pullNext++
	r.send(to, Message{Type: MsgGetState, View: r.view, Op: r.commit, Nonce: joinMark})
}

// pushEpoch tells the new members that have not reported the epoch started.
func (r *Replica) pushEpoch() {
	r.ep.lastPush = r.now
	for _, id := range r.cfg.Members {
		if id != r.cfg.Self && !r.ep.started[id] {
			r.sendStartEpoch(id)
		}
	}
}

func (r *Replica) sendStartEpoch(to uint64) {
	r.send(to, Message{Type: MsgStartEpoch, Op: r.cfg.EpochStart,
		Entries: []Entry{{Request: Request{Client: reconfigClient, ReqNum: r.cfg.Epoch,
			Data: encodeMembership(r.cfg.Members, r.cfg.Previous)}}}})
}

// epochTick runs the timers of a joining or leaving replica; it reports
// whether the replica is one (and the rest of Tick does not apply).
func (r *Replica) epochTick() bool {
	hb := int64(r.cfg.HeartbeatInterval)
	switch {
	case r.ep.joining:
		if mutation.On && r.mut.joinEarly {
			// The mutation: a new member takes part before the state
			// transfer has brought it the epoch's start.
			r.ep.joining = false
			r.startEpoch()
			return true
		}
		if r.now-r.ep.lastPull >= hb {
			r.pull()
		}
	case r.ep.leaving:
		if r.now-r.ep.lastPush >= hb && !r.retired() {
			r.pushEpoch()
		}
	default:
		return false
	}
	return true
}

// retired: a leaving replica whose new epoch has f'+1 members holding its
// start state; the host may stop it.
func (r *Replica) retired() bool {
	return r.ep.leaving && len(r.ep.started) >= r.f+1
}

// epochStep handles what crosses epochs and what a joining or leaving
// replica takes; it reports whether m was consumed.
func (r *Replica) epochStep(m *Message) bool {
	if m.Cluster != r.cfg.Cluster {
		return false
	}
	switch {
	case m.Epoch > r.cfg.Epoch && m.Type == MsgStartEpoch:
		r.adoptEpoch(m)
		return true
	case m.Epoch < r.cfg.Epoch && m.Type == MsgRefuse && r.cfg.EpochStart > 0:
		// A replica of an older epoch refused one of our messages: tell it.
		r.sendStartEpoch(m.From)
		return true
	case m.Epoch != r.cfg.Epoch || m.ConfigHash != r.hash || m.To != r.cfg.Self:
		return false
	}
	member := slices.Contains(r.cfg.Members, m.From)
	if !member && !slices.Contains(r.cfg.Previous, m.From) {
		return false
	}
	switch m.Type {
	case MsgStartEpoch:
		// A leaving previous member asks whether we hold the start state.
		if !r.ep.joining && !r.ep.leaving && r.self >= 0 {
			r.sendAfterSync(m.From, Message{Type: MsgEpochStarted, Op: r.cfg.EpochStart})
		}
		return true
	case MsgEpochStarted:
		if r.ep.leaving && member {
			r.ep.started[m.From] = true
		}
		return true
	case MsgGetState:
		if m.Nonce == joinMark && member {
			r.onJoinGetState(m)
			return true
		}
	case MsgNewState:
		if r.ep.joining {
			r.onJoinState(m)
			return true
		}
	}
	if r.ep.joining || r.ep.leaving || !member {
		return true // nothing else is for them
	}
	return false
}

// adoptEpoch moves a replica of an older epoch to the later one a
// start-epoch describes: as a joining member, or leaving if not a member.
func (r *Replica) adoptEpoch(m *Message) {
	if len(m.Entries) != 1 || !isReconfig(&m.Entries[0]) || m.Entries[0].ReqNum != m.Epoch {
		return
	}
	if r.commit >= m.Op {
		return // it holds the reconfiguration committed: it moves when it hands it out
	}
	members, prev, err := decodeMembership(m.Entries[0].Data)
	if err != nil {
		r.out.Errors = append(r.out.Errors, &ConfigError{From: m.From, Reason: err.Error()})
		return
	}
	cfg := r.cfg
	cfg.Epoch, cfg.Members, cfg.EpochStart, cfg.Previous = m.Epoch, members, m.Op, prev
	if cfg.Hash() != m.ConfigHash {
		r.out.Errors = append(r.out.Errors, &ConfigError{From: m.From,
			Reason: fmt.Sprintf("epoch %d's configuration (%s) does not match its hash: lease timing differs", m.Epoch, cfg.Identity())})
		return
	}
	// The log stays: entries after the commit point are checked against
	// the committed ones the pull brings (onJoinState), and until then
	// they are one more copy of ops that may be committed.
	r.switchConfig(cfg)
}

// onJoinGetState answers a joining member's pull with committed entries
// only (or a snapshot when the log no longer reaches them). Any member
// that holds the epoch's start, and any previous member, answers.
func (r *Replica) onJoinGetState(m *Message) {
	if r.ep.joining || r.commit <= m.Op {
		return
	}
	j := slices.Index(r.cfg.Members, m.From)
	if m.Op+1 < r.first {
		r.wantSnapshot(j)
		return
	}
	es := r.copyLog(m.Op+1, 4*r.cfg.MaxBatch)
	for len(es) > 0 && es[len(es)-1].Op > r.commit {
		es = es[:len(es)-1]
	}
	r.send(m.From, Message{Type: MsgNewState, View: r.view, Op: r.commit, Commit: r.commit, First: m.Op + 1,
		Entries: es, Nonce: joinMark})
}

// onJoinState takes the committed entries (and snapshot) of a state
// transfer while joining. An entry of ours that differs from a committed
// one was never committed: it and everything after it go.
func (r *Replica) onJoinState(m *Message) {
	if s := m.Snapshot; s != nil && s.Op > r.commit && r.handed == r.applied {
		r.installSnapshot(s)
	}
	if m.First > r.commit+1 {
		return
	}
	top := r.commit
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Op > m.Commit {
			break
		}
		if e.Op <= r.commit {
			continue
		}
		if e.Op <= r.lastOp() && r.entry(e.Op).View != e.View {
			r.truncate(e.Op - 1)
		}
		if e.Op == r.lastOp()+1 {
			r.appendEntries([]Entry{*e})
		} else if e.Op > r.lastOp() {
			break
		}
		top = e.Op
	}
	if top > r.commit {
		r.setCommit(top)
		r.hsDirty = true
	}
	if r.commit >= r.cfg.EpochStart {
		r.join()
	}
}
