package vrshard

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/frame"
)

// TestHostedChainHostDecode: on a chain whose master the metadata group
// hosts (masters 1-3), node 2's host takes, on the connection from node
// from, a member's message to itself, the master's from a metadata node,
// and a member's to the master (handed to its own master, when it hosts
// one); anything else is spoofed, and another engine's frame corrupt.
func TestHostedChainHostDecode(t *testing.T) {
	var local []chain.Msg
	h := &chainHost{chainCore: &chainCore{self: 2, master: ChainMasterID}, viaMeta: true,
		local: func(ms []chain.Msg) { local = append(local, ms...) }}
	h.setMasters([]uint64{1, 2, 3})
	frameOf := func(m chain.Msg) frame.Message {
		return frame.Message{Engine: frame.EngineChain, Type: uint8(m.Type), Body: chainwire.AppendBody(nil, &m)}
	}
	hb := func(from, to uint64) chain.Msg {
		return chain.Msg{Type: chain.MsgHeartbeat, From: chain.NodeID(from), To: chain.NodeID(to), Seq: 7}
	}
	for _, c := range []struct {
		name        string
		from        uint64
		m           chain.Msg
		toMember    bool // decoded for the member
		toMaster    bool // handed to the node's master
		err         error
		noLocalHere bool // the node hosts no master
	}{
		{name: "member to member", from: 4, m: hb(4, 2), toMember: true},
		{name: "master from a metadata node", from: 1, m: hb(ChainMasterID, 2), toMember: true},
		{name: "master from another node", from: 4, m: hb(ChainMasterID, 2), err: frame.ErrSpoofed},
		{name: "member to the master", from: 4, m: hb(4, ChainMasterID), toMaster: true},
		{name: "member to the master, none here", from: 4, m: hb(4, ChainMasterID), err: frame.ErrSpoofed, noLocalHere: true},
		{name: "as another member", from: 4, m: hb(5, 2), err: frame.ErrSpoofed},
		{name: "to another node", from: 4, m: hb(4, 3), err: frame.ErrSpoofed},
	} {
		t.Run(c.name, func(t *testing.T) {
			local = nil
			hc := &chainHost{chainCore: h.chainCore, viaMeta: true, local: h.local}
			hc.setMasters(h.mastersNow())
			if c.noLocalHere {
				hc.local = nil
			}
			b, err := hc.Decode(c.from, 2, []frame.Message{frameOf(c.m)})
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := len(b.(*chainBatch).msgs); got != map[bool]int{true: 1}[c.toMember] {
				t.Fatalf("%d messages for the member, want toMember=%t", got, c.toMember)
			}
			if got := len(local); got != map[bool]int{true: 1}[c.toMaster] {
				t.Fatalf("%d messages for the master, want toMaster=%t", got, c.toMaster)
			}
		})
	}
	// A chain group of a cluster: its metadata nodes follow the map. A
	// master's message from a node the member's map does not name yet is
	// dropped (the connection, shared with the node's other groups,
	// stays), and taken once the map names it.
	f := &chainHost{chainCore: h.chainCore, viaMeta: true, followsMap: true, local: h.local}
	f.setMasters([]uint64{1, 2, 3})
	fm := []frame.Message{frameOf(hb(ChainMasterID, 2))}
	if b, err := f.Decode(4, 2, fm); err != nil || len(b.(*chainBatch).msgs) != 0 {
		t.Fatalf("the master's from node 4, not a metadata node on the member's map: err %v, want it dropped", err)
	}
	f.setMasters([]uint64{1, 2, 4})
	if b, err := f.Decode(4, 2, fm); err != nil || len(b.(*chainBatch).msgs) != 1 {
		t.Fatalf("the master's from node 4 once the map names it: err %v, want it taken", err)
	}
	if b, err := f.Decode(3, 2, fm); err != nil || len(b.(*chainBatch).msgs) != 0 {
		t.Fatalf("the master's from node 3, replaced: err %v, want it dropped", err)
	}
	vr := frame.Message{Engine: frame.EngineVR, Type: uint8(chain.MsgHeartbeat), Body: chainwire.AppendBody(nil, &chain.Msg{Type: chain.MsgHeartbeat, From: 4, To: 2})}
	if _, err := h.Decode(4, 2, []frame.Message{vr}); !errors.Is(err, chainwire.ErrCorrupt) {
		t.Fatalf("another engine's frame: %v, want ErrCorrupt", err)
	}
}
