package vrshard

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

// The host holds its protocol core as the engine-neutral contract
// (internal/core, hostCore) and VR's core through a thin adapter (vrCore).
// What an engine adds beyond the contract the host reaches through
// neutral hooks (engineExt: VR's nilext coordinator, nilext.go) and two
// optional interfaces (core.SyncHinter, viewStatuser); a core without them
// gets noExt, noHints and its Info (docs/design/one-house.md, "The core
// contract").
//
// Peer messages are the engine's own: the host holds them as peerMsg
// (outbound, and what its core's Step takes) and as peerBatch (inbound,
// decoded and stepped by the engine, peerEngine), and reads none of VR's
// fields. This file is the only one of the host's that names vr.Message.

// hostCore is the core as the host drives it; its peer message type is
// peerMsg (VR's: *vrMsg).
type hostCore = core.Core[peerMsg]

// peerEngine is what an engine brings for its peer messages besides its
// core: the engine its frames name, the codec for inbound frames, and the
// stepping of a decoded batch, during which the engine looks into each
// message for what the host needs to know and tells it (stepHooks). The
// host carries a batch from the transport's reader to its driver without
// reading it. VR's is its adapter (vrCore); a core without one gets
// noPeers.
type peerEngine interface {
	// Engine is the engine id the group registers on the node transport
	// (peer.go).
	Engine() frame.Engine
	// Decode decodes one batch of a group's inbound frames from member
	// from to member to, checking each message's sender and addressee (an
	// error: the stream cannot be trusted, the transport closes the
	// connection). It runs on the transport's reader goroutine (deliver) or
	// the simulator's caller (StepMessages).
	Decode(from, to uint64, in []frame.Message) (peerBatch, error)
	// StepBatch steps b's messages into the core in order, on the driver,
	// calling h around each. b is the engine's again afterwards (it may
	// reuse it).
	StepBatch(now int64, b peerBatch, h stepHooks)
}

// peerBatch is a decoded batch of inbound peer messages (peerEngine.Decode).
type peerBatch interface {
	// Label names the batch's first message's type, for the diagnostic
	// build's inbox-wait samples (cadtrace.go).
	Label() string
}

// stepHooks is what the host does around each inbound message an engine
// steps (StepBatch); *Replica implements it (replica.go).
type stepHooks interface {
	// syncWanted: the message asks this replica to hold no log batch:
	// something at the sender waits for a commit (VR: the leader's prepare
	// or heartbeat hint), or, with asked, a follower's caller waits for an
	// apply and the others should sync too (nilext_gc.go).
	syncWanted(asked bool)
	// stepped runs after the core took a message: the view events
	// (noteView, with the message as cause) and the afterStep test hook.
	stepped(c viewCause, m peerMsg)
	// trace is the diagnostic build's CAD timeline (nil without -tags
	// cadtrace).
	trace() *tracer
}

// engineExt is what the host does for an engine beyond the contract, at
// fixed points of the driver and in the host's own terms (log records,
// entries, reads, rounds), so that the generic paths (handle, step,
// publish, the read waiters) name no type of the engine's. VR's is its
// Skyros nilext coordinator (nilext.go, nilextCoord), which VR's adapter
// owns and steps its nilext messages into; a core without one gets noExt.
type engineExt interface {
	// readyExtra is the last Ready's engine part: pending, it holds records
	// to log or acknowledgements to route (the Ready is not empty); urgent,
	// a record in it is acknowledged once durable (VR: a sync d-log
	// record), so its batch may not be held for a later fsync.
	readyExtra() (pending, urgent bool)
	// logExtra adds the engine's records to the log batch being written:
	// the last Ready's, or with whole every live one (a new segment, which
	// replaces every older one).
	logExtra(w *wal, whole bool)
	// written runs once the last Ready's batch is written to the log (not
	// yet synced): route what the core acknowledged in it.
	written()
	// preAcked: entry (client, req) was acknowledged before it was ordered
	// (VR: it came from the d-log), so no waiter needs its fsync.
	preAcked(client, req uint64) bool
	// readFirst: a linearizable read of op at the leader, registered as
	// ctx, must first wait for updates the engine took and has not ordered
	// (its answer comes in ReadStates); false: read as usual.
	readFirst(now int64, ctx uint64, op *kv.Op) bool
	// tick runs after the core's Tick; round at the end of every driver
	// round, with the core's Info as of it.
	tick()
	round(info core.Info)
	// publish runs after publish's Info: the engine's figures
	// (Replica.Info).
	publish()
}

// noExt is engineExt for a core with nothing beyond the contract.
type noExt struct{}

func (noExt) readyExtra() (bool, bool)             { return false, false }
func (noExt) logExtra(*wal, bool)                  {}
func (noExt) written()                             {}
func (noExt) preAcked(uint64, uint64) bool         { return false }
func (noExt) readFirst(int64, uint64, *kv.Op) bool { return false }
func (noExt) tick()                                {}
func (noExt) round(core.Info)                      {}
func (noExt) publish()                             {}

// viewStatuser is a cheap look at a core's view and status, which the
// host's view events take after every message (noteView). VR's core has
// one; its Info costs more (it counts peers and computes R), and the
// host's Ready-time figures come too late for a view change and back
// within one batch. A core without it is asked its Info (infoView).
type viewStatuser interface {
	ViewStatus() (view uint64, status core.Status)
}

type infoView struct{ c hostCore }

func (v infoView) ViewStatus() (uint64, core.Status) {
	i := v.c.Info()
	return i.View, i.Status
}

// viewStatusOf is the host's viewStatuser for core c.
func viewStatusOf(c hostCore) viewStatuser {
	if v, ok := c.(viewStatuser); ok {
		return v
	}
	return infoView{c}
}

// vrCore adapts *vr.Replica to the contract: Propose takes the ack point,
// Ready splits VR's batch into the neutral one and VR's nilext part (for
// its coordinator, nx), Info keeps VR's full Info (the coordinator
// publishes its nilext figures). Everything else is VR's own method.
type vrCore struct {
	*vr.Replica
	info   vr.Info
	dlog   []vr.NilextRequest
	nxAcks []vr.NilextAck
	// answered are reads Read answered at once (under the lease; a
	// follower's), for the next Ready (its buffer is reused: the host is
	// done with a Ready's slices before its next event).
	answered []core.ReadState
	// msgs is the last Ready's Messages as peerMsgs, pointers into VR's
	// messages (reused like answered).
	msgs []peerMsg
	// id is the group identity the nilext messages carry and are checked
	// against (VR's core stamps and checks its own).
	id vrIdentity
	// nx is the Skyros nilext coordinator (nilext.go), VR's extension of
	// the host: StepBatch steps the nilext messages into it, and the host
	// reaches it as its engineExt. Open sets it (it needs the host).
	nx *nilextCoord
	// member is the last Ready's Membership, until the host takes it
	// (noteMembership).
	member *vr.Membership
}

// vrIdentity is a VR message's configuration identity as this replica
// sends it.
type vrIdentity struct{ cluster, epoch, hash, self uint64 }

var (
	_ hostCore        = (*vrCore)(nil)
	_ viewStatuser    = (*vrCore)(nil)
	_ peerEngine      = (*vrCore)(nil)
	_ core.SyncHinter = (*vrCore)(nil)
)

// Step is the contract's: m is VR's (*vrMsg; the host steps its inbound
// batches through StepBatch, which calls VR's Step directly).
func (c *vrCore) Step(now int64, m peerMsg) { c.Replica.Step(now, vr.Message(*m.(*vrMsg))) }

func (c *vrCore) Propose(now int64, req core.Request, ack core.AckPoint) error {
	return c.Replica.ProposeAck(now, req, ack)
}

// Read maps a read request onto VR's read calls, every answer in
// Ready.ReadStates. A linearizable read is answered as etcd's
// ReadOnlyLeaseBased does: under the leader's lease (vr LeaseRead: the
// commit index, no round trip) in the next Ready, without one by VR's
// read-index round. Durability waits are VR's WaitReadable and
// AwaitReadable (cad.go), which answer in ReadStates already; a
// follower's read (FollowerRead) is answered in the next Ready.
func (c *vrCore) Read(now int64, req core.ReadRequest) error {
	switch req.Kind {
	case core.ReadLinearizable:
		idx, err := c.Replica.LeaseRead(now)
		if errors.Is(err, vr.ErrNoLease) {
			return c.Replica.ReadIndex(now, req.Ctx)
		}
		if err != nil {
			return err
		}
		c.answered = append(c.answered, core.ReadState{Ctx: req.Ctx, Index: idx, Lease: true})
		return nil
	case core.ReadDurable:
		return c.Replica.WaitReadable(now, req.Ctx, req.Need)
	case core.ReadDurableKnown:
		return c.Replica.AwaitReadable(now, req.Ctx, req.Need)
	case core.ReadFollower:
		R, err := c.Replica.FollowerRead(now)
		c.answered = append(c.answered, core.ReadState{Ctx: req.Ctx, Index: R, Err: err})
		return nil
	}
	return fmt.Errorf("vrshard: VR serves no %v read", req.Kind)
}

func (c *vrCore) Ready() core.Ready[peerMsg] {
	// The lease before VR's Ready, as the host published it before it
	// asked for the Ready when it called VR directly.
	ls := c.lease()
	rd := c.Replica.Ready()
	rd.Lease = ls
	// After VR's Ready: R as of everything in it (its Committed reach the
	// commit point R never exceeds).
	rd.Readable, rd.EventualUntil = c.Replica.Readable(), c.Replica.EventualUntil()
	c.dlog, c.nxAcks = rd.DLog, rd.NilextAcks
	if rd.Membership != nil {
		// A new epoch: the nilext messages are stamped and checked with
		// its identity from now on.
		c.member = rd.Membership
		cfg := c.Replica.Config()
		c.id.epoch, c.id.hash = cfg.Epoch, cfg.Hash()
	}
	if len(c.answered) > 0 {
		rd.ReadStates = append(c.answered, rd.ReadStates...)
		c.answered = rd.ReadStates[:0]
	}
	// A pointer in an interface does not allocate: the messages cost one
	// reused slice, not an allocation each.
	c.msgs = c.msgs[:0]
	for i := range rd.Messages {
		c.msgs = append(c.msgs, (*vrMsg)(&rd.Messages[i]))
	}
	return withMessages(&rd.Ready, c.msgs)
}

// withMessages is rd with msgs as its Messages and every other field as it
// is (TestWithMessagesCopiesEveryField fails when core.Ready grows a field
// this does not copy).
func withMessages[M any](rd *core.Ready[M], msgs []peerMsg) core.Ready[peerMsg] {
	return core.Ready[peerMsg]{
		PersistSeq: rd.PersistSeq, Snapshot: rd.Snapshot, HasTruncate: rd.HasTruncate, Truncate: rd.Truncate,
		Entries: rd.Entries, HardState: rd.HardState, Messages: msgs, Committed: rd.Committed,
		Replies: rd.Replies, ReadStates: rd.ReadStates, SnapshotNeeded: rd.SnapshotNeeded, SnapshotPages: rd.SnapshotPages,
		Errors: rd.Errors, Acks: rd.Acks, Lease: rd.Lease, Readable: rd.Readable, EventualUntil: rd.EventualUntil,
		Durable: rd.Durable,
	}
}

// lease is the leader's lease (LeaseUntil), or without one a follower's
// read lease (FollowerLease, which is off unless Config.FollowerReads).
func (c *vrCore) lease() core.Lease {
	if until, idx, ok := c.Replica.LeaseUntil(); ok {
		return core.Lease{Held: true, Until: until, Index: idx}
	}
	if until, idx, ok := c.Replica.FollowerLease(); ok {
		return core.Lease{Held: true, Until: until, Index: idx, Follower: true}
	}
	return core.Lease{}
}

func (c *vrCore) Info() core.Info {
	c.info = c.Replica.Info()
	i := &c.info
	return core.Info{Self: i.Self, Status: i.Status, View: i.View, Leader: i.Leader, IsLeader: i.IsLeader,
		FirstOp: i.FirstOp, LastOp: i.LastOp, Commit: i.Commit}
}

// ---- VR's peer messages (peerEngine) ----

func (*vrCore) Engine() frame.Engine { return frame.EngineVR }

// vrBatch is a decoded batch of VR messages. Batches are reused (vrBatches):
// deliver decodes on the transport's reader goroutine and the driver steps
// the batch later, so a batch cannot live on either's stack, and a new one
// per batch would be an allocation per batch that the host did not have
// before its messages became opaque (wire.Decode allocated the messages
// alone). Reused, the messages' array is not allocated either.
type vrBatch struct{ msgs []vr.Message }

var vrBatches = sync.Pool{New: func() any { return new(vrBatch) }}

func (b *vrBatch) Label() string {
	if len(b.msgs) == 0 {
		return ""
	}
	return b.msgs[0].Type.String()
}

// release returns b for reuse. Nothing keeps a pointer to its messages:
// VR's Step takes a copy, and what the copy's slices point to (entries,
// snapshots, the frames' bodies) is not b's; clearing drops b's
// references to it.
func (b *vrBatch) release() {
	clear(b.msgs)
	b.msgs = b.msgs[:0]
	vrBatches.Put(b)
}

func (*vrCore) Decode(from, to uint64, in []frame.Message) (peerBatch, error) {
	b := vrBatches.Get().(*vrBatch)
	if cap(b.msgs) < len(in) {
		b.msgs = make([]vr.Message, len(in))
	}
	b.msgs = b.msgs[:len(in)]
	if err := wire.DecodeTo(b.msgs, from, to, in); err != nil {
		b.release()
		return nil, err
	}
	return b, nil
}

// StepBatch steps VR's messages: the nilext ones go to the host's
// coordinator (stepNilext), the others to VR's core, with the group-commit
// hints they carry (vr.SyncWanted, vr.SyncAsked) given to the host before
// and the view-event cause after.
func (c *vrCore) StepBatch(now int64, b peerBatch, h stepHooks) {
	vb := b.(*vrBatch)
	for i := range vb.msgs {
		m := &vb.msgs[i]
		if wire.IsNilext(m.Type) {
			c.stepNilext(now, m)
			continue
		}
		if vr.SyncWanted(m) {
			h.syncWanted(false)
		}
		if vr.SyncAsked(m) {
			h.syncWanted(true)
		}
		c.Replica.Step(now, *m)
		if cadtraceOn {
			traceStep(h.trace(), m)
		}
		h.stepped(viewCause{kind: 'm', role: vrRole(m.Type), typ: m.Type.String(), from: m.From}, (*vrMsg)(m))
	}
	vb.release()
}

// traceStep is cadtrace's look at a stepped message: a follower's fsync
// point in a prepare-ok, the ops a prepare brought.
func traceStep(t *tracer, m *vr.Message) {
	switch {
	case m.Type == vr.MsgPrepareOK:
		t.followerPersisted(m.Persisted)
	case m.Type == vr.MsgPrepare && len(m.Entries) > 0:
		t.received(m.Entries[0].Op, m.Entries[len(m.Entries)-1].Op)
	}
}

// vrRole is what a VR message is to the host's view events (viewlog.go).
func vrRole(t vr.MsgType) msgRole {
	switch t {
	case vr.MsgStartViewChange:
		return roleViewChange
	case vr.MsgDoViewChange:
		return roleVote
	case vr.MsgStartView:
		return roleNewView
	case vr.MsgRecoveryResponse:
		return roleRecovered
	case vr.MsgNewState:
		return roleStateTransfer
	}
	return roleOther
}

// stepNilext hands a nilext message to the coordinator (nilext.go) if it
// carries this group's identity and is addressed here: the transport's
// handshake checked the peer, so anything else is stale or misrouted, and
// dropped.
func (c *vrCore) stepNilext(now int64, m *vr.Message) {
	if c.nx == nil || m.Cluster != c.id.cluster || m.Epoch != c.id.epoch || m.ConfigHash != c.id.hash || m.To != c.id.self {
		return
	}
	switch m.Type {
	case wire.MsgNilext:
		c.nx.take(now, m.From, m.DLog)
	case wire.MsgNilextAck:
		for _, a := range wire.NilextAcks(m) {
			c.nx.ack(a)
		}
	}
}

func (c *vrCore) stamp(m *vrMsg, to uint64) {
	m.Cluster, m.Epoch, m.ConfigHash, m.From, m.To = c.id.cluster, c.id.epoch, c.id.hash, c.id.self, to
}

func (c *vrCore) NilextMessage(to uint64, reqs []vr.NilextRequest) frame.Payload {
	m := &vrMsg{Type: wire.MsgNilext, DLog: reqs}
	c.stamp(m, to)
	return m
}

func (c *vrCore) NilextAcksMessage(to uint64, acks []vr.NilextAck) frame.Payload {
	m := vrMsg(wire.NilextAcksMessage(acks))
	c.stamp(&m, to)
	return &m
}

// noPeers is peerEngine for a core without peer messages (a group of one:
// solo_core_test.go): nothing decodes.
type noPeers struct{}

func (noPeers) Engine() frame.Engine { return 0 }
func (noPeers) Decode(from, _ uint64, in []frame.Message) (peerBatch, error) {
	return nil, fmt.Errorf("vrshard: %d peer messages from %d: this core has no peer codec", len(in), from)
}
func (noPeers) StepBatch(int64, peerBatch, stepHooks) {}

// engineOf is the host's peerEngine for core c: the core's own (VR's
// adapter), or noPeers.
func engineOf(c hostCore) peerEngine {
	if e, ok := c.(peerEngine); ok {
		return e
	}
	return noPeers{}
}

// extOf is the host's engineExt for core c: VR's nilext coordinator, or
// noExt.
func extOf(c hostCore) engineExt {
	if v, ok := c.(*vrCore); ok && v.nx != nil {
		return v.nx
	}
	return noExt{}
}

// hintsOf is the host's group-commit hints for core c: the core's own
// (core.SyncHinter), or none.
func hintsOf(c hostCore) core.SyncHinter {
	if h, ok := c.(core.SyncHinter); ok {
		return h
	}
	return noHints{}
}

// noHints is core.SyncHinter for a core without hints: every request it
// takes counts as a new entry, so no waiter asks for a sync it cannot get.
type noHints struct{}

func (noHints) WantSync(bool)              {}
func (noHints) AskSync()                   {}
func (noHints) Queued(uint64, uint64) bool { return true }

// vrStart is what VR's core starts from besides core.Boot: the nonce of
// this start and the nilext d-log the disk kept (vr.State).
type vrStart struct {
	Nonce      uint64
	DLog       []vr.NilextRequest
	DLogIntact bool
	// Membership is the configuration the log recorded last (nil: none;
	// reconfig.go).
	Membership *vr.Membership
}

// openCore starts the protocol core of group g from what the disk holds
// (boot; VR's extras in vx): VR's, or the one Options.newCore opens (a
// test's), which gets the neutral part alone.
func openCore(opts *Options, g group, boot core.Boot, vx vrStart) (hostCore, error) {
	if opts.Chain != nil {
		return openChainHost(opts, boot)
	}
	if opts.newCore != nil {
		return opts.newCore(g, boot)
	}
	rep, err := vr.New(opts.VR, vr.State{HardState: boot.HardState, Snapshot: boot.Snapshot, Entries: boot.Entries,
		LostState: boot.LostState, Bootstrap: boot.Bootstrap, Nonce: vx.Nonce, DLog: vx.DLog, DLogIntact: vx.DLogIntact,
		Membership: vx.Membership})
	if err != nil {
		return nil, err
	}
	cfg := rep.Config() // with the core's defaults filled in
	return &vrCore{Replica: rep, id: vrIdentity{cluster: cfg.Cluster, epoch: cfg.Epoch, hash: cfg.Hash(), self: cfg.Self}}, nil
}

// peerMsg is a peer message of the engine's, the M of the host's core
// (hostCore), as the host sends it (snapshot.go send): the engine's encoding (frame.Payload, which the transport frames)
// and what the host's sending policy needs to know — destination, size,
// whether it carries state that is sent again when lost, the snapshot it
// carries (for the snapshot holds), and a copy that stays valid after the
// Ready is handled (for messages held behind a large one). VR's is vrMsg,
// a pointer into the Ready's messages: an interface holding a pointer does
// not allocate, so sending costs no allocation per message.
type peerMsg interface {
	frame.Payload
	Dest() uint64
	Size() int
	CarriesState() bool
	SnapshotAt() (op uint64, size int, ok bool)
	Own() peerMsg
}

// vrMsg is a VR message as a peerMsg; its encoding is VR's codec
// (internal/wire).
type vrMsg vr.Message

var _ peerMsg = (*vrMsg)(nil)

func (m *vrMsg) Kind() (frame.Engine, uint8) { return wire.Payload((*vr.Message)(m)).Kind() }
func (m *vrMsg) AppendBody(b []byte) []byte {
	return wire.Payload((*vr.Message)(m)).AppendBody(b)
}
func (m *vrMsg) Dest() uint64 { return m.To }

// Size is about how many bytes m's encoding takes beyond its header.
func (m *vrMsg) Size() int {
	n := 0
	if s := m.Snapshot; s != nil {
		n += len(s.Data)
	}
	for i := range m.Entries {
		n += len(m.Entries[i].Data)
	}
	for i := range m.DLog {
		n += len(m.DLog[i].Data)
	}
	return n
}

// CarriesState: the message types that carry a snapshot or a whole log
// and are sent again when lost (new-state, recovery response, view change).
func (m *vrMsg) CarriesState() bool {
	switch m.Type {
	case vr.MsgNewState, vr.MsgRecoveryResponse, vr.MsgStartView, vr.MsgDoViewChange:
		return true
	}
	return false
}

func (m *vrMsg) SnapshotAt() (uint64, int, bool) {
	if s := m.Snapshot; s != nil {
		return s.Op, len(s.Data), true
	}
	return 0, 0, false
}

// Own copies m's slices that the core may reuse once the Ready is handled
// (entries and d-log records; their data bytes are never written again), so
// a held message stays as it was sent.
func (m *vrMsg) Own() peerMsg {
	c := *m
	c.Entries = append([]vr.Entry(nil), m.Entries...)
	c.DLog = append([]vr.NilextRequest(nil), m.DLog...)
	return &c
}

// traceSent is cadtrace's count of the prepare-oks sent (a VR message
// type; only the diagnostic build calls it).
func traceSent(r *Replica, m peerMsg) {
	if v, ok := m.(*vrMsg); ok && v.Type == vr.MsgPrepareOK {
		r.ctr.okSent(v.Persisted)
	}
}
