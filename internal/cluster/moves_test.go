package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// tabledReplica is a fakeReplica whose group keeps a slot table.
type tabledReplica struct {
	*fakeReplica
	t *kv.SlotTable
}

func (r *tabledReplica) SlotTable() *kv.SlotTable { return r.t }

// A node routes by its hosted groups' tables, over the static map: through
// a move of one slot from group 1 to group 2 (both hosted here, group 2 led
// by node 2) a request goes to group 1 while it serves the slot, is held
// (a leader-less redirect, which the front door forwards and retries) while
// the slot is in flight, then goes to group 2; the map CLUSTER SLOTS shows
// follows, at the move's epoch. A refusal by the source's fence that this
// node's (lagging) view of the tables did not foresee becomes the redirect
// to the group the refusal names, or a hold while that one imports.
func TestMultiRoutesByTheGroupsTables(t *testing.T) {
	m, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	tab := map[GroupID]*tabledReplica{}
	var locals []LocalGroup
	for _, id := range []GroupID{1, 2} {
		spec, _ := m.Group(id)
		var rs []kv.SlotRange
		for _, r := range spec.Slots {
			rs = append(rs, kv.SlotRange{Start: r.Start, End: r.End})
		}
		tab[id] = &tabledReplica{fakeReplica: &fakeReplica{name: fmt.Sprintf("g%d", id)}, t: kv.NewSlotTable(rs, 1)}
		locals = append(locals, LocalGroup{Spec: spec, Hosted: Hosted{Replica: tab[id], Group: &stateGroup{st: State{Normal: true, Leader: uint64(id)}}}})
	}
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}, {ID: 3, ClientAddr: "n3:3"}}
	mu, err := NewMulti(m, 1, members, locals)
	if err != nil {
		t.Fatal(err)
	}
	k := keyIn(m, 1)
	s := Slot([]byte(k))
	rs := []kv.SlotRange{{Start: s, End: s}}
	set := func(id GroupID, st kv.SlotState, peer uint64) {
		t.Helper()
		n, err := tab[id].t.Set(rs, st, peer, 2)
		if err != nil {
			t.Fatal(err)
		}
		tab[id].t = n
	}
	write := func() error { return writeServed(mu, k) }
	held := func(err error) bool {
		var nl *NotLeaderError
		return errors.As(err, &nl) && nl.Leader == 0 && nl.HasSlot && nl.Slot == s
	}
	set(2, kv.SlotImporting, 1)
	set(1, kv.SlotMigrating, 2)
	if err := write(); err == nil || err.Error() != "g1" {
		t.Fatalf("a write of a migrating slot: %v, want group 1 to serve it", err)
	}
	set(1, kv.SlotNone, 2)
	if err := write(); !held(err) {
		t.Fatalf("a write of a slot in flight: %v, want it held", err)
	}
	if _, err := mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k)}, level.ConsLinearizable, shard.Session{}); !held(err) {
		t.Fatalf("a read of a slot in flight: %v, want it held", err)
	}
	set(2, kv.SlotOwned, 1)
	if err := write(); err == nil || err.Error() != "g2" {
		t.Fatalf("a write after the take-over: %v, want group 2 to serve it", err)
	}
	if sm := mu.Slots(); sm.Owner(s) != 2 || sm.Epoch != 2 || m.Owner(s) != 1 {
		t.Fatalf("the effective map: slot %d in group %d at epoch %d", s, sm.Owner(s), sm.Epoch)
	}

	// A lagging view: this node still sees the slot migrating at group 1
	// and importing at group 2, whose leaders have moved on.
	k2 := ""
	for i := 0; ; i++ {
		if k2 = fmt.Sprintf("x%d", i); m.Owner(Slot([]byte(k2))) == 1 && Slot([]byte(k2)) != s {
			break
		}
	}
	s2 := Slot([]byte(k2))
	rs = []kv.SlotRange{{Start: s2, End: s2}}
	set(2, kv.SlotImporting, 1)
	set(1, kv.SlotMigrating, 2)
	tab[1].refuse = &kv.SlotError{Slot: s2, State: kv.SlotNone, Peer: 2, Epoch: 2}
	_, err = mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k2)}, level.ConsLinearizable, shard.Session{})
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != 0 || nl.Slot != s2 {
		t.Fatalf("a refusal while group 2 imports (here): %v, want it held", err)
	}
	set(2, kv.SlotOwned, 1)
	// Group 2 owns it here now but group 1's view still says migrating:
	// the owner wins at the same epoch.
	if err := writeServed(mu, k2); err == nil || err.Error() != "g2" {
		t.Fatalf("a write when the destination owns and the source's view lags: %v, want group 2", err)
	}
}

// writeServed sets k through mu: the error names the group that served it
// (a fakeReplica's name), or is the refusal.
func writeServed(mu *Multi, k string) error {
	reqs := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("x")}}}
	if _, err := mu.Apply(context.Background(), reqs); err != nil {
		return err
	}
	if reqs[0].Err == nil {
		return errors.New(string(reqs[0].Result.Bulk))
	}
	return reqs[0].Err
}

// A node asked for a group it does not host (a cluster of more nodes than
// a group has replicas) sends the request on to the group's first member,
// which the Mover follows (-MOVED), instead of refusing it: with "ERR group
// 2 is not hosted by this node", which the Mover does not retry, a move
// between groups the seed it tried first does not host failed.
func TestSlotCommandsForAGroupNotHostedHereGoToAMember(t *testing.T) {
	ids := []uint64{1, 2, 3, 4}
	m, err := NewSlotMap(1, EvenGroups(4, ids, 3))
	if err != nil {
		t.Fatal(err)
	}
	var locals []LocalGroup
	for _, g := range m.Groups {
		if slices.Contains(g.Members, 1) {
			locals = append(locals, LocalGroup{Spec: g, Hosted: Hosted{Replica: &fakeReplica{name: fmt.Sprint(g.ID)}, Group: &stateGroup{st: State{Normal: true, Leader: 1}}}})
		}
	}
	var members []Member
	for _, id := range ids {
		members = append(members, Member{ID: id, ClientAddr: fmt.Sprintf("n%d:%d", id, id)})
	}
	mu, err := NewMulti(m, 1, members, locals)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := m.Group(2)
	if slices.Contains(spec.Members, 1) {
		t.Fatalf("group 2 is hosted by node 1: %v", spec.Members)
	}
	_, err = mu.SlotTable(2)
	if got := Redirect(err); got.Error() != "MOVED n2:2" {
		t.Fatalf("KEFIR.SLOTS TABLE 2 at a node without group 2: %v (redirect %v), want -MOVED to its first member, node 2", err, got)
	}
	if _, err := mu.SlotTable(9); err == nil || !strings.Contains(err.Error(), "not hosted") {
		t.Fatalf("a group not in the map: %v", err)
	}
	// A group the map names node 1 first in, which node 1 does not host
	// (its replica lost with its directory, or not opened yet): on to the
	// next member, not back to node 1 itself.
	var g GroupSpec
	for _, x := range m.Groups {
		if x.Members[0] == 1 {
			g = x
			break
		}
	}
	if g.ID == 0 {
		t.Fatalf("no group of %v has node 1 first", m.Groups)
	}
	locals = slices.DeleteFunc(locals, func(l LocalGroup) bool { return l.Spec.ID == g.ID })
	mu, err = NewMulti(m, 1, members, locals)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mu.SlotTable(g.ID)
	if got, want := Redirect(err).Error(), fmt.Sprintf("MOVED n%d:%d", g.Members[1], g.Members[1]); got != want {
		t.Fatalf("KEFIR.SLOTS TABLE %d at node 1, the group's first member in the map, not hosting it: %v, want %s", g.ID, got, want)
	}
	// The leader it names for the group (a key's -MOVED, KEFIR.GROUP's).
	if n, _, ok := mu.Leader(g.ID); !ok || n != g.Members[1] {
		t.Fatalf("Leader(%d) at node 1, the group's first member in the map, not hosting it: %d, %t; want node %d", g.ID, n, ok, g.Members[1])
	}
}
