package vr

import (
	"errors"
	"testing"
	"time"
)

// AwaitReadable (vrshard's deferred reads) is released once R covers its
// op, with no heartbeat round: here every heartbeat is dropped, so the
// WaitReadable registered at the same moment — which needs a round sent
// after it — is still waiting when the other is released. Only the leader
// accepts either.
func TestAwaitReadableNeedsNoHeartbeatRound(t *testing.T) {
	n := newNet(t, 3) // no follower reads: R is the commit point
	n.heartbeats(2)
	l := n.rs[1]
	if !l.Info().IsLeader {
		t.Fatalf("setup: replica 1 does not lead: %+v", l.Info())
	}
	if err := n.propose(1, 7, 1, "a"); err != nil {
		t.Fatal(err)
	}
	n.ready(1) // appended, prepares queued (not delivered)
	op := l.lastOp()
	if err := l.AwaitReadable(n.now, 5, op); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitReadable(n.now, 6, op); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	if l.Readable() >= op || len(n.reads[1]) != 0 {
		t.Fatalf("setup: op %d readable (R = %d) or released (%+v) before any prepare-ok", op, l.Readable(), n.reads[1])
	}
	n.deliver(func(m Message) bool { return m.Type != MsgCommit })
	if l.Readable() < op {
		t.Fatalf("setup: R = %d after the prepare-oks, want >= %d", l.Readable(), op)
	}
	if rs := n.reads[1]; len(rs) != 1 || rs[0].Ctx != 5 || rs[0].Err != nil {
		t.Fatalf("read states with every heartbeat dropped: %+v; want only the AwaitReadable one (ctx 5)", rs)
	}
	n.heartbeats(1)
	if rs := n.reads[1]; len(rs) != 2 || rs[1].Ctx != 6 || rs[1].Err != nil {
		t.Fatalf("read states after a heartbeat round: %+v; want ctx 6 released too", rs)
	}
	if err := n.rs[2].AwaitReadable(n.now, 7, op); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a follower's AwaitReadable: %v, want ErrNotLeader", err)
	}
}

// AwaitReadable names an op of the log of the view the driver last saw in a
// Ready: vrshard checks, against that Ready, that it still leads the view
// whose log its deferred read took the op from. But the driver steps several
// messages before its next Ready, so the core may already have left that view
// and started another one it leads — whose log may hold a different entry at
// the op, which R would then cover. Here the leader of view 0 appends an op
// that no follower holds, then steps the start-view-change and
// do-view-change of view 3 (which it leads again) with no Ready in between:
// AwaitReadable must refuse until the driver has seen view 3.
func TestAwaitReadableRefusesAViewTheDriverHasNotSeen(t *testing.T) {
	n := newNet(t, 3)
	n.heartbeats(2)
	l := n.rs[1]
	if !l.Info().IsLeader || l.Info().View != 0 {
		t.Fatalf("setup: replica 1 does not lead view 0: %+v", l.Info())
	}
	if err := n.propose(1, 7, 1, "a"); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	op := l.lastOp()
	n.q = nil // no follower receives it
	// Replicas 2 and 3 move to view 3 (led by 1) once their promises to
	// the old leader have run out; 2's do-view-change goes to 1.
	n.now += int64(time.Second)
	for _, id := range []uint64{2, 3} {
		n.rs[id].observe(n.now)
		n.rs[id].startViewChange(3)
		n.ready(id)
	}
	var toLeader []Message
	for len(n.q) > 0 {
		m := n.q[0]
		n.q = n.q[1:]
		if m.To == 1 {
			if m.From == 2 {
				toLeader = append(toLeader, m)
			}
			continue
		}
		n.rs[m.To].Step(n.now, m)
		n.ready(m.To)
	}
	if len(toLeader) < 2 || toLeader[len(toLeader)-1].Type != MsgDoViewChange {
		t.Fatalf("setup: replica 2 sent replica 1 %+v; want its start-view-change and do-view-change", toLeader)
	}
	for _, m := range toLeader {
		l.Step(n.now, m) // no Ready: the driver still believes it leads view 0
	}
	if in := l.Info(); !in.IsLeader || in.View != 3 {
		t.Fatalf("setup: replica 1 after the view change: %+v; want leader of view 3", in)
	}
	if err := l.AwaitReadable(n.now, 5, op); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("AwaitReadable of view 0's op %d in an undrained view 3: %v, want ErrNotLeader", op, err)
	}
	n.ready(1)
	if err := l.AwaitReadable(n.now, 6, op); err != nil {
		t.Fatalf("AwaitReadable once the driver has seen view 3: %v", err)
	}
}
