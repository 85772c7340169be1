package kv

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// A VR group's member addresses in its own replicated state (issue 28,
// membership; docs/design/cluster.md §7, "The node wiring").
//
// A reconfiguration names members by id only (VR's core orders id lists).
// Before the leader asks for one that adds a member, it writes this record
// through the group's log: every member's peer and client address, the new
// ones included. Each replica's host reads it once applied and teaches its
// node's transport (the peer map) and front door (forwarding, redirects,
// CLUSTER replies) the addresses; being a record of the store it is in every
// snapshot, state transfer and crash replay, so a restarted member and a new
// one that pulled the state know them too, whatever their flags said.
//
//	KindGroupAddrs  Key: AppendGroupAddrs of the nodes (ids distinct, not 0).
//	                The record becomes Key. Int: the number of nodes.

// GroupAddrsKey is the reserved record of a group's member addresses.
var GroupAddrsKey = ReservedKey("group-addrs")

// AppendGroupAddrs appends the encoding of ns (KindGroupAddrs's Key, the
// record's value) to b.
func AppendGroupAddrs(b []byte, ns []MapNode) []byte {
	b = binary.AppendUvarint(b, uint64(len(ns)))
	for _, n := range ns {
		b = AppendMapNode(b, n)
	}
	return b
}

// DecodeGroupAddrs decodes AppendGroupAddrs's encoding, all of b.
func DecodeGroupAddrs(b []byte) ([]MapNode, error) {
	d := Decoder{B: b}
	n := d.Uvarint()
	if d.Err != nil || n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: group addresses", ErrCorrupt)
	}
	ns := make([]MapNode, 0, n)
	for range n {
		nd := decodeMapNode(&d)
		if d.Err != nil || nd.ID == 0 || slices.ContainsFunc(ns, func(x MapNode) bool { return x.ID == nd.ID }) {
			return nil, fmt.Errorf("%w: group addresses", ErrCorrupt)
		}
		ns = append(ns, nd)
	}
	if len(d.B) != 0 {
		return nil, fmt.Errorf("%w: group addresses: %d trailing bytes", ErrCorrupt, len(d.B))
	}
	return ns, nil
}

// applyGroupAddrs replaces the record with op's list, checked first: a
// list that does not decode is refused (ErrInvalidOp) and writes nothing.
func applyGroupAddrs(version uint64, op *Op, emit Emit) (Result, error) {
	ns, err := DecodeGroupAddrs(op.Key)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrInvalidOp, err)
	}
	put(emit, GroupAddrsKey, op.Key, nil)
	return Result{Kind: ResInt, Int: int64(len(ns)), Version: version}, nil
}
