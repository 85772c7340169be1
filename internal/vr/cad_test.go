package vr

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Unit tests of the CAD rules (cad.go, docs/design/cad.md), one rule each,
// on the hand-driven harness of replica_test.go. Replica 1 leads view 0.

func followerReads(c *Config) {
	c.FollowerReads = true
	c.MarkOut = 40 * time.Millisecond
	c.Removal = 60 * time.Millisecond // MinRemoval: 40·1.01/0.99 + 10 = 50.8 ms
	c.Suspect = 25 * time.Millisecond
}

// cadNet is a 3-replica group with follower reads, warmed up: leases held,
// both followers in the active set.
func cadNet(t *testing.T) *tnet {
	t.Helper()
	n := newNetWith(t, 3, followerReads)
	n.heartbeats(3)
	for _, p := range n.rs[1].Peers() {
		if p.State != MemberIn {
			t.Fatalf("after warm-up peer %d is %s, want in (%+v)", p.ID, p.State, n.rs[1].Peers())
		}
	}
	return n
}

// commitOne has the leader (replica 1) order and commit one write (client
// 7, request 1) by delivering everything it sends; the followers learn of
// the commit with the next heartbeat.
func (n *tnet) commitOne() {
	n.t.Helper()
	if err := n.propose(1, 7, 1, "a"); err != nil {
		n.t.Fatal(err)
	}
	n.ready(1)
	n.deliver(nil)
}

// heartbeats runs k heartbeat rounds: 10 ms pass, every message is delivered.
func (n *tnet) heartbeats(k int) {
	for range k {
		n.tick(10 * time.Millisecond)
		n.deliver(nil)
	}
}

func (n *tnet) proposeAck(client, req uint64, ack AckPoint) {
	n.t.Helper()
	if err := n.rs[1].ProposeAck(n.now, Request{Client: client, ReqNum: req, Data: []byte("w")}, ack); err != nil {
		n.t.Fatal(err)
	}
	n.ready(1)
}

func TestConfigRemovalBound(t *testing.T) {
	c := testConfig(1, 3)
	followerReads(&c)
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	c.Removal = c.MinRemoval()
	if err := c.Validate(); err != nil {
		t.Fatalf("Removal = MinRemoval refused: %v", err)
	}
	c.Removal = c.MinRemoval() - 1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "removal") {
		t.Fatalf("Removal below MarkOut·(1+ρ)/(1−ρ)+heartbeat accepted: %v", err)
	}
	c = testConfig(1, 3)
	followerReads(&c)
	c.LeaseDuration = 0
	if err := c.Validate(); err == nil {
		t.Fatal("follower reads without a leader lease accepted")
	}
	c = testConfig(1, 3)
	followerReads(&c)
	if _, err := New(c, State{Bootstrap: true}); err == nil || !strings.Contains(err.Error(), "nonce") {
		t.Fatalf("follower reads started without a nonce: %v", err)
	}
	if _, err := New(c, State{Bootstrap: true, Nonce: 9}); err != nil {
		t.Fatalf("follower reads with a nonce: %v", err)
	}
	d := testConfig(1, 3)
	d.fill()
	if d.MarkOut != DefaultMarkOut || d.Removal != 5*DefaultMarkOut || d.Suspect != DefaultMarkOut {
		t.Fatalf("defaults: mark-out %v removal %v suspect %v", d.MarkOut, d.Removal, d.Suspect)
	}
}

// TestAckReplicated: a cad write is acknowledged once a majority holds it in
// memory — before any fsync — and the commit point does not move for it.
func TestAckReplicated(t *testing.T) {
	n := newNet(t, 3)
	n.autoSync = false
	n.proposeAck(7, 1, AckReplicated)
	if len(n.acks[1]) != 0 {
		t.Fatalf("acknowledged with only the leader's copy: %+v", n.acks[1])
	}
	n.deliverOnce(func(m Message) bool { return m.Type == MsgPrepare && m.To == 2 })
	n.deliver(only(MsgPrepareOK))
	if a := n.acks[1]; len(a) != 1 || a[0].Client != 7 || a[0].ReqNum != 1 || a[0].Op != 1 || a[0].Result != nil {
		t.Fatalf("want one early ack for op 1, got %+v", a)
	}
	if c := n.rs[1].CommitPoint(); c != 0 {
		t.Fatalf("commit %d without any fsync: received entries must not count", c)
	}
	if i := n.rs[1].Info(); i.Acked != 1 || i.Persisted != 0 {
		t.Fatalf("info: acked %d persisted %d", i.Acked, i.Persisted)
	}
	// The normal reply still comes at apply.
	n.sync(1)
	n.sync(2)
	n.deliver(nil)
	if r := n.replies[1]; len(r) != 1 || string(r[0].Result) != "r1" {
		t.Fatalf("want the reply at apply too, got %+v", r)
	}
}

// TestAckAppended: an async write is acknowledged at the leader's append;
// a sync one only by its reply.
func TestAckAppended(t *testing.T) {
	n := newNet(t, 3)
	n.autoSync = false
	n.proposeAck(7, 1, AckAppended)
	n.proposeAck(8, 1, AckApplied)
	if a := n.acks[1]; len(a) != 1 || a[0].Client != 7 || a[0].Op != 1 {
		t.Fatalf("want exactly the async write acked at append, got %+v", a)
	}
	if err := n.rs[1].ProposeAck(n.now, Request{Client: 9, ReqNum: 1}, AckPoint(9)); err == nil {
		t.Fatal("unknown ack point accepted")
	}
}

// TestFollowerReportsReceivedThenPersisted: a follower's prepare-ok says
// what it received at once, and what it persisted once the fsync is done.
func TestFollowerReportsReceivedThenPersisted(t *testing.T) {
	n := newNet(t, 3)
	n.autoSync = false
	n.propose(1, 7, 1, "a")
	n.ready(1)
	n.deliverOnce(func(m Message) bool { return m.Type == MsgPrepare && m.To == 2 })
	var ok []Message
	for _, m := range n.q {
		if m.Type == MsgPrepareOK {
			ok = append(ok, m)
		}
	}
	if len(ok) != 1 || ok[0].Op != 1 || ok[0].Persisted != 0 {
		t.Fatalf("want one prepare-ok op1 p0 before the fsync, got %v", ok)
	}
	n.q = nil
	n.sync(2)
	if len(n.q) != 1 || n.q[0].Persisted != 1 {
		t.Fatalf("want one prepare-ok with persisted 1 after the fsync, got %v", n.q)
	}
}

// TestReadableIsCommitWithoutFollowerReads.
func TestReadableIsCommitWithoutFollowerReads(t *testing.T) {
	n := newNet(t, 3)
	n.commitOne()
	if r, c := n.rs[1].Readable(), n.rs[1].CommitPoint(); r != c || c != 1 {
		t.Fatalf("readable %d, commit %d", r, c)
	}
	if _, err := n.rs[2].FollowerRead(n.now); !errors.Is(err, ErrNoReadLease) {
		t.Fatalf("follower read without follower reads: %v", err)
	}
}

// TestGrantsAndFollowerRead: IN followers get grants on heartbeats, capped
// by MarkOut, and serve up to the R they learned.
func TestGrantsAndFollowerRead(t *testing.T) {
	n := cadNet(t)
	n.commitOne()
	// One heartbeat brings the followers the commit point (they apply and
	// report it, which moves R), the next one brings them R.
	n.heartbeats(2)
	if r := n.rs[1].Readable(); r != 1 {
		t.Fatalf("leader readable %d, want 1", r)
	}
	var grants int
	for _, m := range n.sent {
		if m.From == 1 && m.Grant > 0 {
			grants++
			if m.Grant > int64(40*time.Millisecond) {
				t.Fatalf("grant %v beyond MarkOut", time.Duration(m.Grant))
			}
		}
	}
	if grants == 0 {
		t.Fatal("no grant sent")
	}
	for _, id := range []uint64{2, 3} {
		r, err := n.rs[id].FollowerRead(n.now)
		if err != nil || r != 1 {
			t.Fatalf("follower %d: readable %d, %v", id, r, err)
		}
	}
	if _, err := n.rs[1].FollowerRead(n.now); !errors.Is(err, ErrNoReadLease) {
		t.Fatalf("leader's FollowerRead: %v", err)
	}
	// The lease runs out without new grants.
	until := n.rs[2].Info().ReadLeaseUntil
	if _, err := n.rs[2].FollowerRead(until); !errors.Is(err, ErrNoReadLease) {
		t.Fatalf("follower read at its lease's end: %v", err)
	}
}

// TestGrantCappedByLeaderLease: with followers silent, the leader's lease
// shrinks and so do its grants, down to none.
func TestGrantCappedByLeaderLease(t *testing.T) {
	n := cadNet(t)
	end := n.rs[1].leaseEnd()
	n.q = nil
	n.sent = nil
	n.now = end - int64(5*time.Millisecond)
	n.rs[1].Tick(n.now)
	n.rs[1].hbNow = true
	n.ready(1)
	for _, m := range n.sent {
		if m.Grant > int64(5*time.Millisecond) {
			t.Fatalf("grant %v with 5ms of leader lease left", time.Duration(m.Grant))
		}
	}
	n.sent = nil
	n.now = end
	n.rs[1].hbNow = true
	n.ready(1)
	for _, m := range n.sent {
		if m.Grant != 0 {
			t.Fatalf("grant %v without a leader lease", time.Duration(m.Grant))
		}
	}
}

// TestLeaseAnchoredAtAckSend: a grant that arrives late gives the follower
// a lease counted from when it sent the prepare-ok the leader echoed, not
// from the arrival.
func TestLeaseAnchoredAtAckSend(t *testing.T) {
	n := cadNet(t)
	n.q = nil
	n.tick(10*time.Millisecond, 1)
	var hb Message
	for _, m := range n.q {
		if m.To == 2 && m.Grant > 0 {
			hb = m
		}
	}
	if hb.Grant == 0 {
		t.Fatal("no grant to replica 2")
	}
	sentAt := n.rs[2].cad.ackRing[hb.AckSeq%hbRing]
	if sentAt.seq != hb.AckSeq {
		t.Fatalf("echoed ack %d unknown to the follower", hb.AckSeq)
	}
	n.now += int64(30 * time.Millisecond) // the grant sat in a queue
	n.rs[2].Step(n.now, hb)
	want := sentAt.at + int64(float64(hb.Grant)*(1-0.01)/(1+0.01))
	if got := n.rs[2].Info().ReadLeaseUntil; got > want {
		t.Fatalf("lease until %d, want at most %d (ack sent at %d, received at %d)", got, want, sentAt.at, n.now)
	}
	// An echo of an ack this replica never sent (an earlier life's) gives nothing.
	n2 := cadNet(t)
	hb.AckSeq = 12345
	n2.rs[2].cad.leaseUntil = 0
	n2.rs[2].Step(n2.now, hb)
	if got := n2.rs[2].Info().ReadLeaseUntil; got != 0 {
		t.Fatalf("lease %d from a foreign ack number", got)
	}
}

// TestFollowerReadNeedsAppliedR: a follower that learned an R beyond what
// it applied refuses (it could miss a version <= R that someone read). The
// leader only publishes an R every member reported applied, so this takes a
// report from before a restart, reordered; here the leader's message is
// built by hand.
func TestFollowerReadNeedsAppliedR(t *testing.T) {
	mutation.Require(t)
	n := cadNet(t)
	n.propose(1, 7, 1, "a")
	n.ready(1)
	n.deliver(func(m Message) bool { return m.Type != MsgCommit })
	f := n.rs[2]
	if f.lastOp() != 1 || f.applied != 0 {
		t.Fatalf("setup: follower last op %d applied %d", f.lastOp(), f.applied)
	}
	hb := Message{Type: MsgCommit, View: 0, Op: 1, Commit: 1, Readable: 1, Grant: int64(30 * time.Millisecond),
		AckSeq: f.cad.ackSeq, HBSeq: 1000}
	n.rs[1].stamp(&hb, 2)
	f.Step(n.now, hb) // learns R = 1 and commit 1; applies only at its next Ready
	if _, err := f.FollowerRead(n.now); !errors.Is(err, ErrNoReadLease) {
		t.Fatalf("follower with applied %d < R 1 served: %v", f.applied, err)
	}
	f.mut.followerNoAppliedCheck = true
	if _, err := f.FollowerRead(n.now); err != nil {
		t.Fatalf("the mutation should serve: %v", err)
	}
	f.mut.followerNoAppliedCheck = false
	n.ready(2)
	if r, err := f.FollowerRead(n.now); err != nil || r != 1 {
		t.Fatalf("after applying: %d, %v", r, err)
	}
}

// TestTwoStepRemoval (5 replicas): a follower that stops applying is
// suspected once a durability wait needs it, stops getting grants, still
// holds R back until Removal has passed since the last grant sent, and R
// then advances only while the leader and its IN followers are a majority.
func TestTwoStepRemoval(t *testing.T) {
	n := newNetWith(t, 5, followerReads)
	// Replicas 4 and 5 are down; replica 3 answers but reports nothing applied.
	down := func(m Message) bool { return m.To != 4 && m.To != 5 && m.From != 4 && m.From != 5 }
	deliver := func() {
		for len(n.q) > 0 {
			m := n.q[0]
			n.q = n.q[1:]
			if !down(m) {
				continue
			}
			if m.From == 3 {
				m.Applied = 0
			}
			n.rs[m.To].Step(n.now, m)
			n.ready(m.To)
		}
	}
	for range 3 {
		n.tick(10*time.Millisecond, 1, 2, 3)
		deliver()
	}
	l := n.rs[1]
	state := func(id uint64) MemberState {
		for _, p := range l.Peers() {
			if p.ID == id {
				return p.State
			}
		}
		return MemberOut
	}
	if state(2) != MemberIn || state(3) != MemberIn {
		t.Fatalf("want 2 and 3 in: %+v", l.Peers())
	}
	n.propose(1, 7, 1, "a")
	n.ready(1)
	deliver()
	if l.CommitPoint() != 1 || l.Readable() != 0 {
		t.Fatalf("commit %d readable %d: want 1 and 0 (replica 3 has not applied)", l.CommitPoint(), l.Readable())
	}
	if err := l.WaitReadable(n.now, 99, 1); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	deliver()
	var removingAt int64
	for i := 0; i < 20 && removingAt == 0; i++ {
		n.tick(5*time.Millisecond, 1, 2, 3)
		deliver()
		if state(3) == MemberRemoving {
			removingAt = n.now
		}
	}
	if removingAt == 0 {
		t.Fatalf("lagging member never suspected: %+v", l.Peers())
	}
	var lastGrant int64
	for _, p := range l.Peers() {
		if p.ID == 3 {
			lastGrant = p.LastGrant
		}
	}
	n.sent = nil
	for n.now < lastGrant+int64(60*time.Millisecond)-int64(5*time.Millisecond) {
		n.tick(5*time.Millisecond, 1, 2, 3)
		deliver()
		if state(3) != MemberRemoving {
			t.Fatalf("dropped %v after the last grant, before Removal", time.Duration(n.now-lastGrant))
		}
		if l.Readable() != 0 {
			t.Fatal("R passed a removing member's applied op")
		}
	}
	for _, m := range n.sent {
		if m.To == 3 && m.Grant > 0 {
			t.Fatal("grant sent to a removing member")
		}
	}
	for i := 0; i < 4; i++ {
		n.tick(5*time.Millisecond, 1, 2, 3)
		deliver()
	}
	if state(3) != MemberOut {
		t.Fatalf("not out after Removal: %+v", l.Peers())
	}
	// {leader, 2} is not a majority of 5: R stays put although 3 is out.
	if l.Readable() != 0 || len(n.reads[1]) != 0 {
		t.Fatalf("R advanced to %d with only 2 of 5 in the active set", l.Readable())
	}
	// Replica 4 comes back: three of five, R moves and the wait completes.
	down = func(m Message) bool { return m.To != 5 && m.From != 5 }
	for i := 0; i < 4; i++ {
		n.tick(10*time.Millisecond, 1, 2, 3)
		deliver() // replica 4 hears the leader before its own timer fires
		n.tick(0, 4)
		deliver()
	}
	if l.Readable() != 1 || len(n.reads[1]) != 1 || n.reads[1][0].Ctx != 99 || n.reads[1][0].Err != nil {
		t.Fatalf("readable %d, reads %+v, peers %+v", l.Readable(), n.reads[1], l.Peers())
	}
}

// TestWaitReadableHeartbeatsAtOnce: a durability wait does not wait for the
// heartbeat timer; the read completes once R covers it and the round
// confirmed leadership.
func TestWaitReadableHeartbeatsAtOnce(t *testing.T) {
	n := cadNet(t)
	n.commitOne() // committed at the leader; the followers do not know yet
	if n.rs[1].Readable() != 0 {
		t.Fatal("setup: readable already")
	}
	n.sent = nil
	if err := n.rs[1].WaitReadable(n.now, 5, 1); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	if n.count(MsgCommit) != 2 {
		t.Fatalf("want a heartbeat to each follower at once, sent %v", n.sent)
	}
	n.deliver(nil) // no tick: the wait must not need the timer
	if rs := n.reads[1]; len(rs) != 1 || rs[0].Ctx != 5 || rs[0].Index < 1 || rs[0].Err != nil {
		t.Fatalf("read states %+v", rs)
	}
	if err := n.rs[2].WaitReadable(n.now, 6, 1); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower's WaitReadable: %v", err)
	}
}

// TestViewChangeResetsReadState: a new view starts with every follower out,
// R = 0 (nothing readable before the view's start op), and followers drop
// their leases.
func TestViewChangeResetsReadState(t *testing.T) {
	n := cadNet(t)
	n.commitOne()
	n.heartbeats(1)
	if _, err := n.rs[3].FollowerRead(n.now); err != nil {
		t.Fatal(err)
	}
	// Replica 1 goes silent; 2 and 3 move to view 1 (led by 2) once their
	// promises and the timeout run out.
	for i := 0; i < 30 && n.rs[2].Info().View == 0; i++ {
		n.tick(10*time.Millisecond, 2, 3)
		n.deliver(func(m Message) bool { return m.To != 1 && m.From != 1 })
	}
	for i := 0; i < 5; i++ {
		n.tick(time.Millisecond, 2, 3)
		n.deliver(func(m Message) bool { return m.To != 1 && m.From != 1 })
	}
	l := n.rs[2]
	if !l.Info().IsLeader {
		t.Fatalf("replica 2 did not take over: %+v", l.Info())
	}
	if _, err := n.rs[3].FollowerRead(n.now); !errors.Is(err, ErrNoReadLease) && n.rs[3].Readable() > l.Readable() {
		t.Fatalf("follower kept an old view's R: %d > %d", n.rs[3].Readable(), l.Readable())
	}
	if r := l.Readable(); r != 0 && r < l.viewStartOp {
		t.Fatalf("new leader readable %d below its start op %d", r, l.viewStartOp)
	}
}

// TestLeaderPromisesWhileGranting: a leader that granted g does not join a
// newer view for g after the grant, even when asked; the mutation does.
func TestLeaderPromisesWhileGranting(t *testing.T) {
	mutation.Require(t)
	for _, mutated := range []bool{false, true} {
		n := cadNet(t)
		l := n.rs[1]
		l.mut.leaderVotesWhileGranting = mutated
		n.heartbeats(6) // past the promise every replica makes at start
		n.q = nil
		n.tick(10*time.Millisecond, 1)
		var g int64
		for _, m := range n.q {
			g = max(g, m.Grant)
		}
		if g == 0 {
			t.Fatal("no grant")
		}
		svc := Message{Type: MsgStartViewChange, View: 1}
		n.rs[2].stamp(&svc, 1)
		n.now += g / 2
		l.Step(n.now, svc)
		if joined := l.Info().View == 1; joined != mutated {
			t.Fatalf("mutated=%t: joined view 1 %v after granting %v: %t", mutated, time.Duration(g/2), time.Duration(g), joined)
		}
		n.now += g
		l.Tick(n.now)
		if l.Info().View != 1 {
			t.Fatal("leader never joined the view it was asked to once its grants ran out")
		}
	}
}

// TestCommitGoesOutAtOnceWhileADurabilityWaitNeedsIt: with follower reads R
// needs the followers' applied reports, and a follower applies only what it
// learned is committed. While a durability wait is not covered, the leader
// sends a commit point that advances at once (cad.md §13): here no tick
// happens, and the wait is released; with noCommitForReads the followers
// learn it only from the next heartbeat, so the wait is still pending.
func TestCommitGoesOutAtOnceWhileADurabilityWaitNeedsIt(t *testing.T) {
	mutation.Require(t)
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "atOnce", true: "noCommitForReads"}[off], func(t *testing.T) {
			n := cadNet(t)
			l := n.rs[1]
			l.mut.noCommitForReads = off
			if err := n.propose(1, 7, 1, "a"); err != nil {
				t.Fatal(err)
			}
			n.ready(1)
			op := l.lastOp()
			if err := l.AwaitReadable(n.now, 5, op); err != nil {
				t.Fatal(err)
			}
			n.ready(1)
			n.deliver(nil) // no tick
			if l.commit < op {
				t.Fatalf("setup: op %d not committed (commit %d)", op, l.commit)
			}
			released := len(n.reads[1]) == 1 && n.reads[1][0].Ctx == 5 && n.reads[1][0].Err == nil
			if released == off {
				t.Fatalf("noCommitForReads=%v: R = %d, read states %+v", off, l.Readable(), n.reads[1])
			}
			if off {
				n.heartbeats(1) // the next heartbeat carries the commit point
				if rs := n.reads[1]; len(rs) != 1 || rs[0].Ctx != 5 || rs[0].Err != nil {
					t.Fatalf("after a heartbeat: read states %+v", rs)
				}
			}
		})
	}
}

// TestAskSync: a follower's AskSync makes its next Ready send the leader a
// prepare-ok asking for a sync (SyncAsked), even with nothing new to report,
// once; without it the follower sends nothing, and at the leader it is a no-op.
func TestAskSync(t *testing.T) {
	n := newNet(t, 3)
	n.deliver(nil)
	asked := func(from uint64) (oks, asks int) {
		for _, m := range n.q {
			if m.From == from && m.Type == MsgPrepareOK {
				oks++
				if SyncAsked(&m) {
					asks++
				}
			}
		}
		return oks, asks
	}
	n.ready(2)
	if oks, _ := asked(2); oks != 0 {
		t.Fatalf("an idle follower sent %d prepare-oks", oks)
	}
	n.rs[2].AskSync()
	n.ready(2)
	if oks, asks := asked(2); oks != 1 || asks != 1 {
		t.Fatalf("after AskSync: %d prepare-oks, %d asking for a sync; want 1, 1", oks, asks)
	}
	n.q = nil
	n.ready(2)
	if oks, _ := asked(2); oks != 0 {
		t.Fatalf("AskSync asked again: %d prepare-oks", oks)
	}
	n.rs[1].AskSync() // the leader
	n.ready(1)
	for _, m := range n.q {
		if SyncAsked(&m) {
			t.Fatalf("the leader asked for a sync: %v", m)
		}
	}
	// Ordinary prepare-oks never ask.
	if err := n.rs[1].Propose(n.now, Request{Client: 7, ReqNum: 1, Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	for len(n.q) > 0 {
		m := n.q[0]
		n.q = n.q[1:]
		if SyncAsked(&m) {
			t.Fatalf("an ordinary prepare-ok asks for a sync: %v", m)
		}
		n.rs[m.To].Step(n.now, m)
		n.ready(m.To)
	}
}

// restart replaces replica id by a new core started from what its disk
// holds (its log and last hard state, everything synced): a crash and a
// restart from an intact disk, at n.now.
func (n *tnet) restart(id uint64, nonce uint64) *Replica {
	n.t.Helper()
	old := n.rs[id]
	st := State{HardState: old.lastHS, Entries: append([]Entry(nil), old.log...), Nonce: nonce}
	r, err := New(old.cfg, st)
	if err != nil {
		n.t.Fatal(err)
	}
	r.Tick(n.now)
	n.rs[id] = r
	n.ready(id)
	return r
}

// TestRestartedLeaderKeepsItsGrantPromise (issue 24 item 1): a leader that
// crashes just after sending a read grant and restarts from its intact disk
// does not help form the next view until a lease period after its restart:
// the follower holding the grant may still serve the old view's state. A
// follower that had joined a view change before its crash resumes it at
// once.
func TestRestartedLeaderKeepsItsGrantPromise(t *testing.T) {
	mutation.Require(t)
	for _, mutated := range []bool{false, true} {
		t.Run(map[bool]string{false: "correct", true: "restartedLeaderVotes"}[mutated], func(t *testing.T) {
			n := cadNet(t)
			n.heartbeats(6) // past the promise every replica makes at start
			n.q = nil
			n.tick(10*time.Millisecond, 1)
			granted := false
			for _, m := range n.q {
				granted = granted || (m.To == 3 && m.Grant > 0)
			}
			if !granted {
				t.Fatalf("no grant to replica 3: %v", n.q)
			}
			n.deliver(func(m Message) bool { return m.To == 3 || m.From == 3 }) // 2 is cut off
			if _, err := n.rs[3].FollowerRead(n.now); err != nil {
				t.Fatalf("replica 3 holds no read lease: %v", err)
			}
			n.now += ms
			l := n.restart(1, 77)
			l.mut.restartedLeaderVotes = mutated
			if i := l.Info(); i.View != 1 || i.Status != ViewChange {
				t.Fatalf("restarted leader: %+v", i)
			}
			// Replica 2 (leader of view 1) timed out and asks for view 1.
			n.q, n.sent = nil, nil
			svc := Message{Type: MsgStartViewChange, View: 1}
			n.rs[2].stamp(&svc, 1)
			l.Step(n.now, svc)
			n.ready(1)
			n.tick(10*time.Millisecond, 1)
			helped := 0
			for _, m := range n.sent {
				if m.From == 1 && (m.Type == MsgDoViewChange || m.Type == MsgStartViewChange) {
					helped++
				}
			}
			if (helped > 0) != mutated {
				t.Fatalf("mutated=%t: the restarted leader sent %d start-/do-view-changes within its lease period: %v", mutated, helped, n.sent)
			}
			if mutated {
				return
			}
			// A lease period after the restart it joins: view 1 forms.
			n.tick(time.Duration(l.cfg.LeaseDuration), 1)
			n.deliver(func(m Message) bool { return m.To != 3 && m.From != 3 })
			n.tick(10*time.Millisecond, 1, 2)
			n.deliver(func(m Message) bool { return m.To != 3 && m.From != 3 })
			if i := n.rs[2].Info(); !i.IsLeader || i.View != 1 {
				t.Fatalf("view 1 did not form once the restarted leader's promise ran out: 2 %+v, 1 %+v", i, l.Info())
			}
		})
	}
}

// TestRestartedFollowerFinishesItsViewChange: a follower that had joined a
// view change before it crashed (its hard state's view is past its last
// normal view) made no promise it could still owe: restarted, it takes part
// in that view change at once.
func TestRestartedFollowerFinishesItsViewChange(t *testing.T) {
	n := cadNet(t)
	n.heartbeats(6)
	// 3 joins 2's view change for view 1 (its promise has run out)...
	n.tick(time.Duration(n.rs[3].cfg.LeaseDuration), 3)
	svc := Message{Type: MsgStartViewChange, View: 1}
	n.rs[2].stamp(&svc, 3)
	n.rs[3].Step(n.now, svc)
	n.ready(3)
	if i := n.rs[3].Info(); i.View != 1 || i.Status != ViewChange {
		t.Fatalf("replica 3 did not join view 1: %+v", i)
	}
	// ... and crashes before the view forms; restarted at once.
	n.q, n.sent = nil, nil
	r := n.restart(3, 78)
	r.Step(n.now, svc)
	n.ready(3)
	dvc := 0
	for _, m := range n.sent {
		if m.From == 3 && m.Type == MsgDoViewChange && m.View == 1 {
			dvc++
		}
	}
	if dvc == 0 {
		t.Fatalf("restarted follower did not resume its view change: %+v, sent %v", r.Info(), n.sent)
	}
}
