package vrshard

import (
	"slices"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/mutation"
)

// chainHost is chainCore as the host holds it: the contract over the
// host's peer messages (hostCore), and the chain's peer codec and stepping
// (peerEngine). Its messages are chain.Msg as peerMsg (chainMsg), encoded
// by internal/chainwire.
type chainHost struct {
	*chainCore
	msgs []peerMsg // the last Ready's messages (reused: the host is done with them before the next event)
	// viaMeta: the master is the metadata group's (ChainOptions.Masters
	// set); masters its nodes standing for it, as the member knows them
	// now: set at the open, then replaced whenever the node's map names
	// other metadata members (SetChainMasters), so that replacing a
	// metadata member does not strand the chain. Read by the driver
	// (Ready) and the connections' readers (Decode), written by the node's
	// map follower: an atomic pointer to a list never changed in place.
	viaMeta bool
	masters atomic.Pointer[[]uint64]
	// followsMap: the list follows a cluster's map (ChainOptions.
	// MastersFollowMap: a chain group of a cluster of several groups), so
	// it may lag.
	followsMap bool
	// fan: the copies of the last Ready's messages to the masters.
	fan []masterBound
	// local is this node's own hosted master, if it may be one of masters
	// (ChainOptions.LocalMaster; a chain group of a cluster always has it:
	// any node may become a metadata member).
	local func([]chain.Msg)
}

// masterBound is a message to the master (addressed to the master's id,
// ChainOptions.Master) on its way to one metadata node.
type masterBound struct {
	chainMsg
	node  uint64
	local func([]chain.Msg) // this node's own master (node is this node)
}

func (m *masterBound) Dest() uint64 { return m.node }

func (m *masterBound) Own() peerMsg {
	return &masterBound{chainMsg: *m.chainMsg.Own().(*chainMsg), node: m.node, local: m.local}
}

// sendLocal hands a message for this node's own master to it, where the
// host would send it (after what it waits for), since the transport has no
// link to its own node. It reports whether it did.
func (m *masterBound) sendLocal(self uint64) bool {
	if m.node != self || m.local == nil {
		return false
	}
	m.local([]chain.Msg{chain.Msg(*m.chainMsg.Own().(*chainMsg))})
	return true
}

var (
	_ hostCore   = (*chainHost)(nil)
	_ peerEngine = (*chainHost)(nil)
)

// openChainHost opens the chain core from the host's start state.
func openChainHost(opts *Options, boot core.Boot) (hostCore, error) {
	o := opts.Chain
	hb, lease := o.Heartbeat, o.Lease
	if hb <= 0 {
		hb = chainmaster.DefaultHeartbeat
	}
	if lease <= 0 {
		lease = chainmaster.DefaultLease
	}
	c, err := openChain(chainConfig{Self: opts.VR.Self, Master: o.Master, Members: opts.VR.Members, Mode: o.Mode,
		Heartbeat: int64(hb), Lease: int64(lease), Store: o.Store, HadLog: !o.NoLogMember, PrecopyRate: o.precopyRate(),
		commitIgnoresEngine: mutation.On && opts.mut.chainCommitIgnoresEngine,
		lostStateReplays:    mutation.On && opts.mut.chainLostStateReplays,
		truncateAtBoot:      mutation.On && opts.mut.chainTruncateAtBoot}, boot)
	if err != nil {
		return nil, err
	}
	c.commitLazy = mutation.On && opts.mut.chainCommitLazy
	c.tailCommitLags = mutation.On && opts.mut.chainTailCommitLags
	c.auAtCommit = mutation.On && opts.mut.chainAUAtCommit
	h := &chainHost{chainCore: c, viaMeta: len(o.Masters) > 0, followsMap: o.MastersFollowMap, local: o.LocalMaster}
	h.setMasters(o.Masters)
	return h, nil
}

// setMasters makes ids the metadata nodes the member sends the master's
// messages to and takes the master's from (a no-op for the same list).
func (h *chainHost) setMasters(ids []uint64) {
	if cur := h.masters.Load(); cur != nil && slices.Equal(*cur, ids) {
		return
	}
	ms := slices.Clone(ids)
	h.masters.Store(&ms)
}

// mastersNow is the metadata nodes standing for the master at this moment.
func (h *chainHost) mastersNow() []uint64 {
	if p := h.masters.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *chainHost) Step(now int64, m peerMsg) { h.chainCore.Step(now, chain.Msg(*m.(*chainMsg))) }

func (h *chainHost) Ready() core.Ready[peerMsg] {
	rd := h.chainCore.Ready()
	h.msgs = h.msgs[:0]
	masters := h.mastersNow()
	if h.viaMeta {
		// One copy per metadata node of each message to the master: sized
		// first, since h.msgs points into h.fan.
		n := 0
		for i := range rd.Messages {
			if uint64(rd.Messages[i].To) == h.master {
				n += len(masters)
			}
		}
		h.fan = slices.Grow(h.fan[:0], n)
	}
	for i := range rd.Messages {
		m := &rd.Messages[i]
		if !h.viaMeta || uint64(m.To) != h.master {
			h.msgs = append(h.msgs, (*chainMsg)(m))
			continue
		}
		for _, id := range masters {
			if id == h.self && h.local == nil {
				continue
			}
			h.fan = append(h.fan, masterBound{chainMsg: chainMsg(*m), node: id, local: h.local})
			h.msgs = append(h.msgs, &h.fan[len(h.fan)-1])
		}
	}
	return withMessages(&rd, h.msgs)
}

func (*chainHost) Engine() frame.Engine { return frame.EngineChain }

// chainBatch is a decoded batch of chain messages.
type chainBatch struct{ msgs []chain.Msg }

func (b *chainBatch) Label() string {
	if len(b.msgs) == 0 {
		return ""
	}
	return b.msgs[0].Type.String()
}

func (h *chainHost) Decode(from, to uint64, in []frame.Message) (peerBatch, error) {
	if !h.viaMeta {
		msgs, err := chainwire.Decode(from, to, in)
		if err != nil {
			return nil, err
		}
		return &chainBatch{msgs}, nil
	}
	// The chain's group also carries the master's traffic (masters): a
	// metadata node's master speaks as the master (ChainOptions.Master),
	// and a member's message to the master, when this node hosts one of
	// them, goes to it.
	masters := h.mastersNow()
	msgs := make([]chain.Msg, 0, len(in))
	var toMaster []chain.Msg
	for i := range in {
		var m chain.Msg
		if err := chainwire.DecodeFrame(&in[i], &m); err != nil {
			return nil, err
		}
		switch {
		case uint64(m.From) == from && uint64(m.To) == to:
			msgs = append(msgs, m)
		case uint64(m.From) == h.master && uint64(m.To) == to && slices.Contains(masters, from):
			msgs = append(msgs, m)
		case uint64(m.From) == h.master && uint64(m.To) == to && h.followsMap:
			// The master's, from a node this member does not count among
			// the metadata nodes: its map, where it learns them, may lag
			// a change of the metadata group (the acting master is the
			// metadata leader's, in the group now). Dropped, not refused:
			// a refusal closes the connection, which the node's other
			// groups share, and a lost order is sent again.
		case uint64(m.From) == from && uint64(m.To) == h.master && h.local != nil:
			toMaster = append(toMaster, m)
		default:
			return nil, chainwire.Spoofed(&m, from, to)
		}
	}
	if len(toMaster) > 0 {
		h.local(toMaster)
	}
	return &chainBatch{msgs}, nil
}

// StepBatch steps the chain's messages in order; the host sees each as a
// message of no particular role (the chain's configuration changes come
// out as Info's View and Leader, which the host notes after the step).
func (h *chainHost) StepBatch(now int64, b peerBatch, hk stepHooks) {
	for i := range b.(*chainBatch).msgs {
		m := &b.(*chainBatch).msgs[i]
		h.chainCore.Step(now, *m)
		hk.stepped(viewCause{kind: 'm', role: roleOther, typ: m.Type.String(), from: uint64(m.From)}, (*chainMsg)(m))
	}
}

// chainMsg is a chain message as a peerMsg.
type chainMsg chain.Msg

var _ peerMsg = (*chainMsg)(nil)

func (m *chainMsg) Kind() (frame.Engine, uint8) { return chainwire.Payload((*chain.Msg)(m)).Kind() }
func (m *chainMsg) AppendBody(b []byte) []byte  { return chainwire.AppendBody(b, (*chain.Msg)(m)) }
func (m *chainMsg) Dest() uint64                { return uint64(m.To) }

// Size is about how many bytes m's encoding takes beyond its header.
func (m *chainMsg) Size() int {
	n := len(m.Op) + len(m.Result)
	for i := range m.Entries {
		n += len(m.Entries[i].Op) + len(m.Entries[i].Result)
	}
	if m.Snap != nil {
		n += len(m.Snap.Data)
	}
	return n
}

// CarriesState: no chain message is sent again when lost (the chain
// assumes reliable links; chaincore.go).
func (m *chainMsg) CarriesState() bool { return false }

func (m *chainMsg) SnapshotAt() (uint64, int, bool) { return 0, 0, false }

func (m *chainMsg) Own() peerMsg {
	c := *m
	c.Entries = slices.Clone(m.Entries)
	c.Members, c.Path = slices.Clone(m.Members), slices.Clone(m.Path)
	return &c
}
