package vr

import "testing"

// A follower answers a prepare that asked for a sync at once (SyncWanted: a
// write at the leader waits for its commit) with one prepare-ok, the one
// that reports it persisted, not a receipt ack first (receiptOnly); an
// unhinted prepare still gets its receipt ack at once, which a cad write's
// early acknowledgement (majority in memory) needs. A cad write sharing a
// hinted prepare is acknowledged with the durable prepare-ok: later, never
// before a majority held it.
func TestHintedPrepareGetsOnlyTheDurablePrepareOK(t *testing.T) {
	n := newNet(t, 3)
	n.autoSync = false
	oks := func(from uint64) (receipt, durable int) {
		for _, m := range n.sent {
			if m.Type == MsgPrepareOK && m.From == from && m.HBSeq == 0 {
				if m.Persisted >= m.Op {
					durable++
				} else {
					receipt++
				}
			}
		}
		return
	}
	// Unhinted (a cad write): received at once, an early ack from it.
	n.sent = nil
	n.proposeAck(7, 1, AckReplicated)
	n.deliverOnce(func(m Message) bool { return m.Type == MsgPrepare && m.To == 2 })
	if r, d := oks(2); r != 1 || d != 0 {
		t.Fatalf("unhinted prepare: %d receipt and %d durable prepare-oks before the fsync, want 1 and 0", r, d)
	}
	n.deliver(only(MsgPrepareOK))
	if len(n.acks[1]) != 1 {
		t.Fatalf("cad write not acknowledged on a majority's memory: %+v", n.acks[1])
	}
	n.sync(1)
	n.sync(2)
	n.sync(3)
	n.deliver(nil)

	// Hinted (the leader waits for its commit): nothing until the fsync,
	// then one prepare-ok that carries receipt and durability.
	n.sent = nil
	n.rs[1].WantSync(false)
	n.proposeAck(8, 1, AckApplied)
	n.deliverOnce(func(m Message) bool { return m.Type == MsgPrepare && m.To == 2 })
	if r, d := oks(2); r != 0 || d != 0 {
		t.Fatalf("hinted prepare: %d receipt and %d durable prepare-oks before the fsync, want none", r, d)
	}
	n.sync(2)
	if r, d := oks(2); r != 0 || d != 1 {
		t.Fatalf("hinted prepare: %d receipt and %d durable prepare-oks after the fsync, want 0 and 1", r, d)
	}
	n.deliver(only(MsgPrepareOK))
	if c, op := n.rs[1].CommitPoint(), n.rs[1].lastOp(); c != op-1 {
		t.Fatalf("commit %d before the leader's or a second follower's fsync (last op %d): one durable copy must not commit", c, op)
	}
	n.sync(1)
	if c, op := n.rs[1].CommitPoint(), n.rs[1].lastOp(); c != op {
		t.Fatalf("commit %d, want %d: the leader's and one follower's copies are durable", c, op)
	}

	// A cad write in a hinted prepare: acknowledged by the durable
	// prepare-oks (here the follower's and the leader's own copy).
	n.sent = nil
	acks := len(n.acks[1])
	n.rs[1].WantSync(false)
	n.proposeAck(9, 1, AckReplicated)
	n.deliverOnce(func(m Message) bool { return m.Type == MsgPrepare && m.To == 2 })
	n.deliver(only(MsgPrepareOK))
	if len(n.acks[1]) != acks {
		t.Fatalf("cad write in a hinted prepare acknowledged before any follower reported it: %+v", n.acks[1][acks:])
	}
	n.sync(2)
	n.deliver(only(MsgPrepareOK))
	if len(n.acks[1]) != acks+1 {
		t.Fatalf("cad write in a hinted prepare not acknowledged once a follower reported it durable: %+v", n.acks[1][acks:])
	}
}
