package vrshard

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

// The host holds its protocol core as the engine-neutral contract
// (internal/core, hostCore) and VR's core through a thin adapter (vrCore).
// What the host still asks of VR outside the contract is vrExt: one list,
// so that moving it behind the adapter or into Ready is visible work
// (docs/design/one-house.md, "The core contract"). A core that is not VR's
// gets noVR, which answers every such call as a core without leases, CAD,
// nilext or sync hints would.

// hostCore is the core as the host drives it. Its peer messages are still
// VR's (the host sends them through VR's codec, internal/wire): a second
// engine with its own messages needs the host to send engine-encoded
// payloads (the doc's "left" list).
type hostCore = core.Core[vr.Message]

// vrExt is what the host asks of the VR core outside the contract.
type vrExt interface {
	// What the host publishes for reads off the driver, asked for rather
	// than taken from Ready: the readable index R (cad.go; handle asks
	// again after Advance, which may move it), eventual reads' horizon.
	// (Reads at the driver are the contract's Read, answered in
	// Ready.ReadStates; the leases come in Ready.Lease.)
	Readable() uint64
	EventualUntil() int64

	// The Skyros nilext fast path (nilext.go): updates in, the d-log, and
	// reads of pending keys.
	Nilext(now int64, req vr.NilextRequest) error
	ReadNilext(now int64, ctx uint64, keys [][]byte) (bool, error)
	DLog() []vr.NilextRequest
	InDLog(client, req uint64) bool
	DLogRecords() []vr.NilextRequest

	// ViewStatus is Info's view and status without the rest (noteView
	// runs after every message).
	ViewStatus() (view uint64, status vr.Status)
	// lastInfo is VR's full Info as of the last Info call (the host
	// publishes the nilext figures from it).
	lastInfo() *vr.Info
	// readyExt is VR's part of the last Ready (vr.Ready's nilext fields):
	// d-log records to write with its batch, acks to route.
	readyExt() ([]vr.NilextRequest, []vr.NilextAck)

	// Decode is the engine's codec for inbound peer frames (VR's:
	// internal/wire), checking each message's sender and addressee: the
	// host hands the transport's frames (deliver) and the simulator's
	// (StepMessages) to it, one decode path for both.
	Decode(from, to uint64, in []frame.Message) ([]vr.Message, error)
}

// vrCore adapts *vr.Replica to the contract: Propose takes the ack point,
// Ready splits VR's batch into the neutral one and VR's nilext part, Info
// keeps VR's full Info for lastInfo. Everything else is VR's own method.
type vrCore struct {
	*vr.Replica
	info   vr.Info
	dlog   []vr.NilextRequest
	nxAcks []vr.NilextAck
	// answered are reads Read answered at once (under the lease; a
	// follower's), for the next Ready (its buffer is reused: the host is
	// done with a Ready's slices before its next event).
	answered []core.ReadState
}

var (
	_ hostCore        = (*vrCore)(nil)
	_ vrExt           = (*vrCore)(nil)
	_ core.SyncHinter = (*vrCore)(nil)
)

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

func (c *vrCore) Ready() core.Ready[vr.Message] {
	// The lease before VR's Ready, as the host published it before it
	// asked for the Ready when it called VR directly.
	ls := c.lease()
	rd := c.Replica.Ready()
	rd.Lease = ls
	c.dlog, c.nxAcks = rd.DLog, rd.NilextAcks
	if len(c.answered) > 0 {
		rd.ReadStates = append(c.answered, rd.ReadStates...)
		c.answered = rd.ReadStates[:0]
	}
	return rd.Ready
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

func (c *vrCore) readyExt() ([]vr.NilextRequest, []vr.NilextAck) { return c.dlog, c.nxAcks }

func (c *vrCore) Info() core.Info {
	c.info = c.Replica.Info()
	i := &c.info
	return core.Info{Self: i.Self, Status: i.Status, View: i.View, Leader: i.Leader, IsLeader: i.IsLeader,
		FirstOp: i.FirstOp, LastOp: i.LastOp, Commit: i.Commit}
}

func (c *vrCore) lastInfo() *vr.Info { return &c.info }

func (*vrCore) Decode(from, to uint64, in []frame.Message) ([]vr.Message, error) {
	return wire.Decode(from, to, in)
}

// noVR is vrExt for a core that is not VR's: no eventual reads, nothing
// early acknowledged (R is the commit point), no nilext.
type noVR struct{ c hostCore }

func (n noVR) Readable() uint64   { return n.c.Info().Commit }
func (noVR) EventualUntil() int64 { return 0 }
func (noVR) Nilext(int64, vr.NilextRequest) error {
	return vr.ErrNilextOff
}
func (noVR) ReadNilext(int64, uint64, [][]byte) (bool, error) { return false, nil }
func (noVR) DLog() []vr.NilextRequest                         { return nil }
func (noVR) InDLog(uint64, uint64) bool                       { return false }
func (noVR) DLogRecords() []vr.NilextRequest                  { return nil }
func (n noVR) ViewStatus() (uint64, vr.Status) {
	i := n.c.Info()
	return i.View, i.Status
}
func (noVR) lastInfo() *vr.Info                             { return &vr.Info{} }
func (noVR) readyExt() ([]vr.NilextRequest, []vr.NilextAck) { return nil, nil }
func (noVR) Decode(from, _ uint64, in []frame.Message) ([]vr.Message, error) {
	return nil, fmt.Errorf("vrshard: %d peer messages from %d: this core has no peer codec", len(in), from)
}

// extOf is the host's vrExt for core c: the adapter itself for VR's, noVR
// for any other.
func extOf(c hostCore) vrExt {
	if x, ok := c.(vrExt); ok {
		return x
	}
	return noVR{c}
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

// openCore starts the protocol core from what the disk holds (st: VR's
// start state, which Open builds): VR's, or the one Options.newCore opens
// (a test's) from the engine-neutral part of st.
func openCore(opts *Options, st vr.State) (hostCore, error) {
	if opts.Chain != nil {
		return nil, errors.New("vrshard: the chain core needs the engine-neutral host messages (not merged yet)")
	}
	if opts.newCore != nil {
		return opts.newCore(opts.VR, core.Boot{HardState: st.HardState, Snapshot: st.Snapshot,
			Entries: st.Entries, LostState: st.LostState, Bootstrap: st.Bootstrap})
	}
	rep, err := vr.New(opts.VR, st)
	if err != nil {
		return nil, err
	}
	return &vrCore{Replica: rep}, nil
}

// peerMsg is an outbound peer message as the host sends it (snapshot.go
// send): the engine's encoding (frame.Payload, which the transport frames)
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
