package vr

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestReconfigureValidates: the leader refuses a member list that is not
// a valid new group, and followers and the fast paths refuse outright.
func TestReconfigureValidates(t *testing.T) {
	n := newNet(t, 3)
	r := n.rs[1]
	for _, ms := range [][]uint64{nil, {1, 2}, {1, 2, 2}, {3, 2, 1}, {1, 2, 0}} {
		if err := r.Reconfigure(n.now, AnyEpoch, ms); !errors.Is(err, ErrBadMembers) {
			t.Errorf("Reconfigure(%v) = %v, want ErrBadMembers", ms, err)
		}
	}
	if err := n.rs[2].Reconfigure(n.now, AnyEpoch, []uint64{1, 2, 4}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("at a follower: %v, want ErrNotLeader", err)
	}
	nx := newNetWith(t, 3, nilextOn)
	if err := nx.rs[1].Reconfigure(nx.now, AnyEpoch, []uint64{1, 2, 4}); !errors.Is(err, ErrReconfigUnsupported) {
		t.Errorf("with nilext: %v, want ErrReconfigUnsupported", err)
	}
}

// TestReconfigurationRefusesOpsAndRestartsInTheNewEpoch: after the entry
// is ordered the leader refuses ops with a ReconfiguredError naming the new
// members; after it commits, a replica restarted from what its host
// persisted (Ready.Membership, State.Membership) comes back in the new
// epoch, and a removed member refuses with the new configuration.
func TestReconfigurationRefusesOpsAndRestartsInTheNewEpoch(t *testing.T) {
	n := newNet(t, 3)
	var persisted = map[uint64]*Membership{}
	n.onReady = func(id uint64, rd *Ready) {
		if rd.Membership != nil {
			persisted[id] = rd.Membership
		}
	}
	if err := n.rs[1].Reconfigure(n.now, AnyEpoch, []uint64{2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	err := n.propose(1, 7, 1, "x")
	var re *ReconfiguredError
	if !errors.As(err, &re) || !re.Pending || re.Epoch != 2 || !slices.Equal(re.Members, []uint64{2, 3, 4}) || !errors.Is(err, ErrReconfigured) {
		t.Fatalf("propose after Reconfigure: %v", err)
	}
	n.ready(1)
	n.deliver(nil)
	for _, id := range []uint64{1, 2, 3} {
		m := persisted[id]
		if m == nil || m.Epoch != 2 || m.Start != 1 || !slices.Equal(m.Members, []uint64{2, 3, 4}) || !slices.Equal(m.Previous, []uint64{1, 2, 3}) {
			t.Fatalf("replica %d persisted %+v", id, m)
		}
	}
	if err := n.propose(1, 7, 1, "x"); !errors.As(err, &re) || re.Pending || re.Epoch != 2 {
		t.Fatalf("propose at the removed member: %v", err)
	}
	if i := n.rs[2].Info(); !i.IsLeader || i.Epoch != 2 {
		t.Fatalf("replica 2 (first of the new list) should lead epoch 2: %+v", i)
	}
	old := n.rs[3]
	r, err := New(testConfig(3, 3), State{HardState: old.lastHS, Entries: slices.Clone(old.log), Membership: persisted[3]})
	if err != nil {
		t.Fatal(err)
	}
	if i := r.Info(); i.Epoch != 2 || i.Joining || i.Status != Normal || !slices.Equal(r.Config().Members, []uint64{2, 3, 4}) {
		t.Fatalf("restarted replica 3: %+v, members %v", i, r.Config().Members)
	}
	// The removed replica, restarted before the new epoch started (4 has
	// not joined), is still leaving: it may hold the only copy of the
	// start state, and serves it.
	gone := n.rs[1]
	r, err = New(testConfig(1, 3), State{HardState: gone.lastHS, Entries: slices.Clone(gone.log), Membership: persisted[1]})
	if err != nil {
		t.Fatalf("restart of the leaving replica: %v", err)
	}
	if i := r.Info(); !i.Leaving || i.Retired || i.Status != Recovering || i.Epoch != 2 {
		t.Fatalf("restarted leaving replica 1: %+v", i)
	}
}

// TestQueuedReconfigurationGoesWithTheQueue: a view change drops the
// proposal queue, and a reconfiguration still in it with it; a replica that
// leads again later takes ops (before the fix it refused them for ever).
func TestQueuedReconfigurationGoesWithTheQueue(t *testing.T) {
	n := newNet(t, 3)
	r := n.rs[1]
	if err := r.Reconfigure(n.now, AnyEpoch, []uint64{1, 2, 4}); err != nil {
		t.Fatal(err)
	}
	r.stepDown() // what a view change does first
	if err := r.refuseReconfigured(); err != nil {
		t.Fatalf("after the queue was dropped: %v", err)
	}
}

// TestRecoveredMemberJoinsWithoutASecondRecovery: a replica that started
// without its disk and recovered (VR §4.3) is, for the rest of its life, a
// member whose promises are on its disk. When it then joins a later epoch
// (it learned it by start-epoch and pulled its start state: join), it takes
// part at once, as a member restarted from its disk does, instead of
// recovering again: a second recovery needs a normal leader, and a new
// epoch of two such members whose view-0 leader had to join too (it moves
// on to view 1) had none and stood still for good (the move simulation's
// groups of five shrinking to three, vrshard TestMoveSimShrink; fails
// without the fix).
func TestRecoveredMemberJoinsWithoutASecondRecovery(t *testing.T) {
	n := newNet(t, 3)
	n.writes(1, 100, 3, "w", nil)
	r, err := New(testConfig(3, 3), State{LostState: true, Nonce: 77})
	if err != nil {
		t.Fatal(err)
	}
	n.rs[3] = r
	n.tick(10*time.Millisecond, 3)
	n.deliver(nil)
	if i := r.Info(); i.Status != Normal {
		t.Fatalf("replica 3 did not recover: %+v", i)
	}
	// A later epoch's join (what switchConfig's pull ends in).
	r.ep.joining = true
	r.join()
	if i := r.Info(); i.Status == Recovering {
		t.Fatalf("a member that recovered in this life recovers again when it joins a later epoch: %+v", i)
	}
}

// TestReconfigureComparesTheEpoch: a reconfiguration planned against an
// older configuration is refused once another one has moved the group on
// (EpochMovedError naming the current epoch and members), so it cannot
// undo that change; one planned against the current epoch is ordered.
func TestReconfigureComparesTheEpoch(t *testing.T) {
	n := newNet(t, 3)
	e := n.rs[1].Config().Epoch
	if err := n.rs[1].Reconfigure(n.now, e+1, []uint64{1, 2, 4}); !errors.Is(err, ErrEpochMoved) {
		t.Fatalf("expected epoch %d at epoch %d: %v, want ErrEpochMoved", e+1, e, err)
	}
	// Another change comes first: [1 2 3] -> [2 3 4].
	if err := n.rs[1].Reconfigure(n.now, e, []uint64{2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	// While that change is under way, one planned against epoch e is
	// refused as moved, naming the change (the caller waits for it and
	// plans again); an old caller's (no epoch) gets the refusal it knew.
	var pend *EpochMovedError
	if err := n.rs[1].Reconfigure(n.now, e, []uint64{1, 2, 5}); !errors.As(err, &pend) || !pend.Pending || pend.Epoch != e+1 || !slices.Equal(pend.Members, []uint64{2, 3, 4}) {
		t.Fatalf("a request planned against epoch %d while the change to %d is under way: %v, want a pending EpochMovedError", e, e+1, err)
	}
	if err := n.rs[1].Reconfigure(n.now, AnyEpoch, []uint64{1, 2, 5}); !errors.Is(err, ErrReconfigured) {
		t.Fatalf("a request with no epoch while a change is under way: %v, want ErrReconfigured", err)
	}
	n.ready(1)
	n.deliver(nil)
	// The request planned against epoch e ([1 2 3] -> [1 2 5]) would put
	// back node 1, which the change took out.
	err := n.rs[2].Reconfigure(n.now, e, []uint64{1, 2, 5})
	var em *EpochMovedError
	if !errors.As(err, &em) || em.Expected != e || em.Epoch != e+1 || !slices.Equal(em.Members, []uint64{2, 3, 4}) {
		t.Fatalf("a request planned against epoch %d at epoch %d: %v, want EpochMovedError", e, e+1, err)
	}
	if err := n.rs[2].Reconfigure(n.now, e+1, []uint64{2, 3, 5}); err != nil {
		t.Fatalf("a request planned against the current epoch: %v", err)
	}
}
