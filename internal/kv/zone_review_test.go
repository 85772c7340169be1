package kv

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// A zone given for a node of the map is one step of the state machine,
// decided by the map and the op alone: the epoch moves once (not at all
// while a move is in flight: only MoveDone raises it), the node list keeps
// its order and addresses, a second ask is a no-op, and a removed node's
// id is refused with a zone as without one.
func TestClusterMapNodeZoneStep(t *testing.T) {
	m := mem{}
	apply := applier(t, m)
	initMap(t, apply)
	add := func(nd MapNode) (Result, error) {
		return apply(&Op{Kind: KindMapAddNode, Key: AppendMapAddNode(nil, nd)})
	}
	before := readMap(t, m)
	n2 := before.Nodes[1]
	n2.Zone = "b"
	if res, err := add(n2); err != nil || res.Int != int64(before.Epoch+1) {
		t.Fatalf("node 2's zone: %+v %v", res, err)
	}
	after := readMap(t, m)
	want := slices.Clone(before.Nodes)
	want[1].Zone = "b"
	if !slices.Equal(after.Nodes, want) || after.Epoch != before.Epoch+1 {
		t.Fatalf("after node 2's zone: nodes %+v epoch %d, want %+v epoch %d", after.Nodes, after.Epoch, want, before.Epoch+1)
	}
	if res, err := add(n2); err != nil || res.Version != 0 || res.Int != int64(after.Epoch) {
		t.Fatalf("node 2's zone again: %+v %v", res, err)
	}
	// With a move in flight: the zone is set, the epoch stays below the
	// move's (MoveDone raises it).
	plan := MapMove{From: 1, To: 2, Slots: []SlotRange{{0, 9}}, Epoch: after.Epoch + 1}
	if _, err := apply(moveOp(KindMapMovePlan, plan)); err != nil {
		t.Fatal(err)
	}
	n2.Zone = "c"
	if res, err := add(n2); err != nil || res.Int != int64(after.Epoch) {
		t.Fatalf("node 2's zone during a move: %+v %v", res, err)
	}
	if cm := readMap(t, m); cm.Epoch != after.Epoch || cm.Nodes[1].Zone != "c" {
		t.Fatalf("during a move: epoch %d zone %q", cm.Epoch, cm.Nodes[1].Zone)
	}
	if res, err := apply(moveOp(KindMapMoveDone, MapMove{Epoch: plan.Epoch})); err != nil || res.Int != int64(plan.Epoch) {
		t.Fatalf("done: %+v %v", res, err)
	}
	// A removed node's id: refused, zone or not.
	nd := MapNode{ID: 9, ClientAddr: "127.0.0.1:9", PeerAddr: "127.0.0.1:19"}
	if _, err := add(nd); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(&Op{Kind: KindMapAddNode, Cond: MapNodeRemove, Key: AppendMapNode(nil, MapNode{ID: 9})}); err != nil {
		t.Fatal(err)
	}
	nd.Zone = "a"
	if _, err := add(nd); !errors.Is(err, ErrSlotTransition) || !strings.Contains(err.Error(), "never used again") {
		t.Fatalf("removed node 9 with a zone: %v", err)
	}
	if slices.Contains(readMap(t, m).NodeIDs(), 9) {
		t.Fatal("removed node 9 came back")
	}
}
