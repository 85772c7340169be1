package vrshard

import (
	"errors"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/vr"
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
	// Group-commit hints (vr synchint.go; nilext_gc.go): a follower asked
	// to sync, a waiter wants the followers to sync, a request already in
	// the log.
	WantSync(beat bool)
	AskSync()
	Queued(client, req uint64) bool

	// Reads answered by synchronous calls rather than Ready.ReadStates:
	// the leader's lease as the host publishes it for reads off the driver
	// (LeaseUntil; a lease read at the driver is a ReadIndex answered in
	// Ready), a follower's read lease (FollowerLease, FollowerRead), the
	// readable index R and durability waits against it (cad.go), eventual
	// reads' horizon.
	LeaseUntil() (until int64, commit uint64, ok bool)
	FollowerLease() (until int64, readable uint64, ok bool)
	FollowerRead(now int64) (readable uint64, err error)
	WaitReadable(now int64, ctx, index uint64) error
	AwaitReadable(now int64, ctx, index uint64) error
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
}

// vrCore adapts *vr.Replica to the contract: Propose takes the ack point,
// Ready splits VR's batch into the neutral one and VR's nilext part, Info
// keeps VR's full Info for lastInfo. Everything else is VR's own method.
type vrCore struct {
	*vr.Replica
	info   vr.Info
	dlog   []vr.NilextRequest
	nxAcks []vr.NilextAck
	// leased are reads ReadIndex answered under the lease, for the next
	// Ready (its buffer is reused: the host is done with a Ready's slices
	// before its next event).
	leased []core.ReadState
}

var (
	_ hostCore = (*vrCore)(nil)
	_ vrExt    = (*vrCore)(nil)
)

func (c *vrCore) Propose(now int64, req core.Request, ack core.AckPoint) error {
	return c.Replica.ProposeAck(now, req, ack)
}

// ReadIndex answers a linearizable read as etcd's ReadOnlyLeaseBased does:
// under the leader's lease (vr LeaseRead: the commit index, no round trip),
// in the next Ready's ReadStates; without one, by VR's read-index round.
func (c *vrCore) ReadIndex(now int64, ctx uint64) error {
	idx, err := c.Replica.LeaseRead(now)
	if errors.Is(err, vr.ErrNoLease) {
		return c.Replica.ReadIndex(now, ctx)
	}
	if err != nil {
		return err
	}
	c.leased = append(c.leased, core.ReadState{Ctx: ctx, Index: idx, Lease: true})
	return nil
}

func (c *vrCore) Ready() core.Ready[vr.Message] {
	rd := c.Replica.Ready()
	c.dlog, c.nxAcks = rd.DLog, rd.NilextAcks
	if len(c.leased) > 0 {
		rd.ReadStates = append(c.leased, rd.ReadStates...)
		c.leased = rd.ReadStates[:0]
	}
	return rd.Ready
}

func (c *vrCore) readyExt() ([]vr.NilextRequest, []vr.NilextAck) { return c.dlog, c.nxAcks }

func (c *vrCore) Info() core.Info {
	c.info = c.Replica.Info()
	i := &c.info
	return core.Info{Self: i.Self, Status: i.Status, View: i.View, Leader: i.Leader, IsLeader: i.IsLeader,
		FirstOp: i.FirstOp, LastOp: i.LastOp, Commit: i.Commit}
}

func (c *vrCore) lastInfo() *vr.Info { return &c.info }

// noVR is vrExt for a core that is not VR's: no sync hints, no leases (a
// linearizable read goes through ReadIndex and comes back in
// Ready.ReadStates), no follower or eventual reads, nothing early
// acknowledged (R is the commit point), no nilext.
type noVR struct{ c hostCore }

func (noVR) WantSync(bool)                        {}
func (noVR) AskSync()                             {}
func (noVR) Queued(uint64, uint64) bool           { return true }
func (noVR) LeaseUntil() (int64, uint64, bool)    { return 0, 0, false }
func (noVR) FollowerLease() (int64, uint64, bool) { return 0, 0, false }
func (noVR) FollowerRead(int64) (uint64, error)   { return 0, vr.ErrNoReadLease }
func (noVR) WaitReadable(int64, uint64, uint64) error {
	return core.ErrNotNormal
}
func (noVR) AwaitReadable(int64, uint64, uint64) error {
	return core.ErrNotNormal
}
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

// extOf is the host's vrExt for core c: the adapter itself for VR's, noVR
// for any other.
func extOf(c hostCore) vrExt {
	if x, ok := c.(vrExt); ok {
		return x
	}
	return noVR{c}
}

// openCore starts the protocol core from what the disk holds: VR's, or the
// one Options.newCore opens (a test's).
func openCore(opts *Options, st vr.State) (hostCore, error) {
	if opts.newCore != nil {
		return opts.newCore(opts.VR, st)
	}
	rep, err := vr.New(opts.VR, st)
	if err != nil {
		return nil, err
	}
	return &vrCore{Replica: rep}, nil
}
