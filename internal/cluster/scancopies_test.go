package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// copyReplica is a group's replica that holds a copy of another group's
// view history (kv/viewcopy.go) and judges a session's part of that group
// by it, as vrshard.Replica.CopiedSessionViews.
type copyReplica struct {
	versionedReplica
	copies map[uint32]kv.ViewCopy
}

func (r *copyReplica) SessionViews(shard.Session) error { return nil }

func (r *copyReplica) CopiedSessionViews(gid uint32, s shard.Session) error {
	c, ok := r.copies[gid]
	if !ok {
		return nil
	}
	if v, ok := c.View(s.LastWrite); ok && s.WriteViewKnown && v != s.WriteView {
		return fmt.Errorf("%w: op %d was ordered in view %d, not %d", shard.ErrSessionLost, s.LastWrite, v, s.WriteView)
	}
	return nil
}

// A keyspace scan judges the session's parts by the view copies moves
// brought, as a keyed read does (otherParts after the read): once group 1
// moved its slots to group 2 and was removed from the map, no node reads
// group 1 for a scan, and only group 2's copy of group 1's view history can
// tell that the session's write there was dropped by a view change. The
// scan fails with the lost session's error naming group 1, at the node
// that hosts group 2 and for group 2's part asked of it by another node
// (GroupScan); with the mutation ScanCopiesUnchecked both serve the page.
func TestScanChecksTheViewCopies(t *testing.T) {
	sm, err := NewSlotMap(3, []GroupSpec{
		{ID: 2, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 16383}}},
		{ID: 3, Members: []uint64{2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec2, _ := sm.Group(2)
	spec3, _ := sm.Group(3)
	st := &stateGroup{st: State{Normal: true, Leader: 1}}
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}}
	rep2 := &copyReplica{
		versionedReplica: versionedReplica{keys: [][]byte{[]byte("a")}, t: kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 16383}}, 2)},
		// Group 1's ops 1-9 were ordered in view 1, 10 on in view 2.
		copies: map[uint32]kv.ViewCopy{1: {Top: 20, Starts: []kv.ViewStart{{Op: 1, View: 1}, {Op: 10, View: 2}}}},
	}
	n1, err := NewMulti(sm, 1, members, []LocalGroup{{Spec: spec2, Hosted: Hosted{Replica: rep2, Group: st}}})
	if err != nil {
		t.Fatal(err)
	}
	n2, err := NewMulti(sm, 2, members, []LocalGroup{{Spec: spec3, Hosted: Hosted{Replica: &versionedReplica{}, Group: st}}})
	if err != nil {
		t.Fatal(err)
	}
	n1.SetGroupScanAsker(wireAsker(n2))
	n2.SetGroupScanAsker(wireAsker(n1))
	// The session wrote op 12 of group 1 in view 1: a view change
	// dropped it (op 12 was ordered in view 2).
	lost := shard.Session{}.AfterWrite(kv.Result{Version: 12, View: 1, ViewKnown: true, Group: 1}.Pos())
	fresh := shard.Session{}.AfterWrite(kv.Result{Version: 12, View: 2, ViewKnown: true, Group: 1}.Pos())
	sess := level.Consistency{Kind: level.Session}
	op := kv.Op{Kind: kv.KindScan, Limit: 10}
	isLost := func(err error) bool {
		return errors.Is(err, shard.ErrSessionLost) && strings.Contains(err.Error(), "group 1")
	}
	scanAt := func(n *Multi, s shard.Session) error {
		_, _, err := n.Scan(context.Background(), op, sess, s)
		return err
	}
	if err := scanAt(n1, lost); !isLost(err) {
		t.Fatalf("a scan at the node of group 2 with a session whose group 1 write was dropped: %v, want the lost session's error naming group 1", err)
	}
	if _, err := n1.GroupScan(context.Background(), 2, op, sess, lost); !isLost(err) {
		t.Fatalf("group 2's part asked of its node by another's scan, the session's group 1 write dropped: %v, want the lost session's error naming group 1", err)
	}
	for _, n := range []*Multi{n1, n2} {
		if err := scanAt(n, fresh); err != nil {
			t.Fatalf("a session whose group 1 write stands: %v", err)
		}
	}
	if mutation.On {
		MultiMut.ScanCopiesUnchecked.Store(true)
		defer MultiMut.ScanCopiesUnchecked.Store(false)
		if err := scanAt(n1, lost); err != nil {
			t.Fatalf("with ScanCopiesUnchecked: %v", err)
		}
		if _, err := n1.GroupScan(context.Background(), 2, op, sess, lost); err != nil {
			t.Fatalf("with ScanCopiesUnchecked, GroupScan: %v", err)
		}
		t.Log("ScanCopiesUnchecked: the lost session's scan is served")
	}
}
