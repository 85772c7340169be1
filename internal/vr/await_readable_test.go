package vr

import (
	"errors"
	"testing"
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
