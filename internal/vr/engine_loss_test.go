package vr

import (
	"slices"
	"testing"
	"time"
)

// TestEngineLostReplicaRecoversByStateTransfer (issue 24 item 2, the core's
// side of doc.go's obligation for an engine behind its log): replica 3 is
// restarted as a wiped replica (empty State, LostState) after its peers
// moved to another view, committed more and compacted their logs past
// everything it could offer. It takes no part in the group (no prepare-ok,
// no view-change vote) until the leader's snapshot arrives and the
// recovery protocol completes; it then holds the leader's state, client
// table and commit point, follows new writes, and can lead the next view
// with every committed op.
func TestEngineLostReplicaRecoversByStateTransfer(t *testing.T) {
	n := newNet(t, 3)
	n.writes(1, 100, 10, "w", nil)
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)
	// The leader dies for a while: 2 and 3 move to view 1, 1 comes back as
	// its follower (from its disk, intact).
	old := n.rs[1]
	delete(n.rs, 1)
	n.ids = []uint64{2, 3}
	for i := 0; i < 10 && !n.rs[2].Info().IsLeader; i++ {
		n.tick(25 * time.Millisecond)
		n.deliver(nil)
	}
	if i := n.rs[2].Info(); !i.IsLeader || i.View != 1 || i.Commit != 10 {
		t.Fatalf("replica 2 should lead view 1 at commit 10: %+v", i)
	}
	n.rs[1] = old
	n.ids = []uint64{1, 2, 3}
	n.tick(25 * time.Millisecond)
	n.deliver(nil)
	if i := n.rs[1].Info(); i.Status != Normal || i.View != 1 {
		t.Fatalf("replica 1 should follow view 1: %+v", i)
	}
	// Replica 3 goes down (its engine is lost); 1 and 2 commit ops 11..20
	// without it and compact to 18 (their checkpoints).
	delete(n.rs, 3)
	n.ids = []uint64{1, 2}
	n.writes(2, 200, 10, "x", nil)
	n.tick(10*time.Millisecond, 2)
	n.deliver(nil)
	for _, id := range []uint64{1, 2} {
		if i := n.rs[id].Info(); i.Commit != 20 || i.Applied != 20 {
			t.Fatalf("replica %d should have applied 20: %+v", id, i)
		}
		if err := n.rs[id].Compact(18); err != nil {
			t.Fatal(err)
		}
	}

	// The core cannot see the state machine: started from a log whose
	// snapshot point (10) the engine no longer holds, replica 3 would be a
	// normal follower of view 1 at once, with holes (what doc.go's driver
	// obligation prevents).
	if trusted, err := New(testConfig(3, 3), State{Snapshot: &Snapshot{Op: 10},
		HardState: HardState{View: 1, LastNormalView: 1, Commit: 10}}); err != nil || trusted.Info().Status != Normal {
		t.Fatalf("a replica started from its log should be normal: %v %+v", err, trusted.Info())
	}
	// Replica 3 restarts as a wiped replica: its driver found its engine
	// behind its log's snapshot point and dropped the log.
	r3, err := New(testConfig(3, 3), State{LostState: true, Nonce: 0x3e7})
	if err != nil {
		t.Fatal(err)
	}
	n.rs[3], n.ids = r3, []uint64{1, 2, 3}
	n.applied[3], n.snapReq[2], n.sent = nil, nil, nil
	n.tick(time.Millisecond, 3)
	n.deliver(nil)
	// The leader cannot answer from its log (it starts at 19): it asks its
	// driver for a snapshot, and replica 3 stays out until it comes.
	if got := n.snapReq[2]; len(got) != 1 || got[0] != 3 {
		t.Fatalf("the leader should ask its driver for a snapshot for replica 3: %v", got)
	}
	if i := r3.Info(); i.Status != Recovering || i.Applied != 0 {
		t.Fatalf("replica 3 must not come back before it has the state: %+v", i)
	}
	// Meanwhile it neither acknowledges prepares nor joins a view change,
	// however long it waits for the state.
	n.propose(2, 300, 1, "y")
	n.ready(2)
	n.deliver(nil)
	for i := 0; i < 6; i++ {
		// Replica 3 hears no heartbeat; 1 still does. (Not ticking the
		// leader instead would starve 1 too, and a leader that has heard no
		// quorum for the view-change timeout answers 1's pre-vote: the
		// group would rightly change view; viewchange.go, suspects.)
		n.tick(30 * time.Millisecond)
		n.deliver(func(m Message) bool { return m.To != 3 || m.Type == MsgRecoveryResponse })
	}
	for _, m := range n.sent {
		if m.From == 3 && (m.Type == MsgPrepareOK || m.Type == MsgStartViewChange || m.Type == MsgDoViewChange) {
			t.Fatalf("replica 3 took part before recovering: %v", m)
		}
	}
	if i := r3.Info(); i.Status != Recovering {
		t.Fatalf("replica 3 recovered without the state: %+v", i)
	}
	lead := n.rs[2]
	snap := Snapshot{Op: lead.Info().Applied, Clients: lead.ClientTable(), Data: []byte("state@21")}
	if err := lead.SendSnapshot(3, snap); err != nil {
		t.Fatal(err)
	}
	n.ready(2)
	n.deliver(nil)
	for i := 0; i < 5 && r3.Info().Status == Recovering; i++ {
		n.tick(30 * time.Millisecond)
		n.deliver(nil)
	}
	i3, i2 := r3.Info(), lead.Info()
	if i3.Status != Normal || i3.View != i2.View || i3.Leader != 2 || i3.Commit != i2.Commit || i3.Applied != i2.Applied || i3.FirstOp != snap.Op+1 {
		t.Fatalf("replica 3 should be a follower of view %d at the leader's commit after the snapshot: %+v (leader %+v)", i2.View, i3, i2)
	}
	if len(n.applied[3]) != 0 {
		t.Fatalf("ops the snapshot holds were handed to the state machine again: %v", n.applied[3])
	}
	if a, b := r3.ClientTable(), lead.ClientTable(); len(a) != 21 || !slices.EqualFunc(a, b, func(x, y ClientRecord) bool {
		return x.Client == y.Client && x.ReqNum == y.ReqNum && x.Op == y.Op && string(x.Result) == string(y.Result)
	}) {
		t.Fatalf("client tables differ:\n%v\n%v", a, b)
	}
	// It follows new writes like any follower ...
	n.propose(2, 400, 1, "z")
	n.ready(2)
	n.deliver(nil)
	n.tick(10*time.Millisecond, 2)
	n.deliver(nil)
	if got := n.applied[3]; len(got) != 1 || got[0].Op != 22 || got[0].Client != 400 {
		t.Fatalf("replica 3 should apply op 22 (client 400) after the snapshot: %v", got)
	}
	// ... and leads view 2 (members[2]) with every committed op when the
	// leader dies.
	delete(n.rs, 2)
	n.ids = []uint64{1, 3}
	for i := 0; i < 10 && !r3.Info().IsLeader; i++ {
		n.tick(25 * time.Millisecond)
		n.deliver(nil)
	}
	if i := r3.Info(); !i.IsLeader || i.Commit != 22 {
		t.Fatalf("replica 3 should lead with commit 22: %+v", i)
	}
	n.propose(3, 500, 1, "after")
	n.ready(3)
	n.deliver(nil)
	if c := r3.CommitPoint(); c != 23 {
		t.Fatalf("replica 3 should commit op 23 as leader: %d", c)
	}
}
