package vrshard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// Holds (txwait.go): a transaction that checks a key a commit in flight at
// the leader writes is held, unproposed, until that commit is applied, then
// decided by the early check on the new state.

// inFlight isolates c's leader l (a write it proposes cannot commit), sends
// w to it from a goroutine, and returns once w is proposed (in the leader's
// in-flight writers); its reply comes on the channel once the caller heals
// the leader. txHoldMax is long enough for the test meanwhile.
func (c *cluster) inFlight(l int, w kv.Op, key string, id shard.ReqID) <-chan kv.Result {
	c.t.Helper()
	old := txHoldMax
	txHoldMax = 10 * time.Second
	c.t.Cleanup(func() { txHoldMax = old })
	c.isolate(l, true)
	out := make(chan kv.Result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := c.reps[l].Write(ctx, w, level.Sync, id)
		if err != nil {
			res = kv.Result{Kind: kv.ResReply, Bulk: []byte(err.Error())}
		}
		out <- res
	}()
	r := c.reps[l]
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return len(r.txw.unfinished([][]byte{[]byte(key)})) > 0 }) {
		c.t.Fatal("the first commit was not proposed")
	}
	return out
}

// applyAsync runs reqs through the leader's Apply from a goroutine.
func (c *cluster) applyAsync(l int, reqs []shard.WriteReq) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.reps[l].Apply(ctx, reqs)
		done <- err
	}()
	return done
}

// heldOrProposed waits until r held a transaction (want holds) or a short
// while passed.
func heldOrProposed(r *Replica, want uint64) {
	testgroup.Until(300*time.Millisecond, time.Millisecond, func() bool { h, _ := r.TxHolds(); return h >= want })
}

// A loser whose winner is in flight — two commits from one start that both
// check and write k — is held until the winner is applied and then answered
// -TXABORT without a log entry: no proposal, no fsync. Before holds it was
// proposed (the early check reads only applied state) and aborted at apply,
// through a log entry replicated and fsynced on every replica.
func TestHeldBehindACommitInFlightNeedsNoLogEntry(t *testing.T) {
	c := orderedCluster(t, nil)
	l := c.leader(5 * time.Second)
	r := c.reps[l]
	first, err := c.write(set("k", "1"), shard.ReqID{Client: 1, Seq: 1}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.readableAt(l, first.Version)
	check := []kv.TxCheck{{Key: []byte("k"), Version: first.Version}}
	winner := c.inFlight(l, txCommit(t, first.Version, check, set("k", "2")), "k", shard.ReqID{Client: 2, Seq: 1})
	proposals := r.Stats().Proposals
	loser := txCommit(t, first.Version, check, set("k", "3"))
	reqs := []shard.WriteReq{{Op: loser, Durability: level.Sync, ID: shard.ReqID{Client: 3, Seq: 1}}}
	done := c.applyAsync(l, reqs)
	heldOrProposed(r, 1)
	time.Sleep(20 * time.Millisecond) // a proposal of the loser would be counted by now
	held := r.Stats().Proposals
	c.isolate(l, false)
	w := <-winner
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.Version == 0 {
		t.Fatalf("winner: %q; want a commit", w.Bulk)
	}
	want := fmt.Sprintf("-TXABORT conflict on key 'k': written at version %d after the transaction's start version %d\r\n", w.Version, first.Version)
	if got := string(reqs[0].Result.Bulk); got != want || reqs[0].Err != nil {
		t.Fatalf("loser: %q, %v; want %q", got, reqs[0].Err, want)
	}
	after := r.Stats().Proposals
	h, aborted := r.TxHolds()
	t.Logf("proposals: %d with the winner in flight, %d while the loser waited, %d after; holds %d, aborted held %d", proposals, held, after, h, aborted)
	if held != proposals || after != proposals || h != 1 || aborted != 1 {
		t.Fatalf("the loser went through the log: proposals %d -> %d -> %d, holds %d, held aborts %d; want no proposal, one hold answered early",
			proposals, held, after, h, aborted)
	}
	c.expectValue(l, "k", "2")
}

// heldInOrder holds a transaction that commits once its winner is applied
// (they set different bits of b, ranged checks, so the winner does not doom
// it) in a batch with an INCRBY of the key the transaction sets after it:
// the INCRBY must apply after the transaction, as the connection sent them.
func heldInOrder(t *testing.T, tune func(*Replica)) error {
	c := orderedCluster(t, nil)
	l := c.leader(5 * time.Second)
	r := c.reps[l]
	if tune != nil {
		tune(r)
	}
	base, err := c.write(set("b", "\x00"), shard.ReqID{}, 5*time.Second)
	if err != nil {
		return err
	}
	c.readableAt(l, base.Version)
	bit := func(off int64, writes ...kv.Op) kv.Op {
		return txCommit(t, base.Version, []kv.TxCheck{{Key: []byte("b"), Version: base.Version, Ranges: []kv.TxRange{{Lo: uint64(off), Hi: uint64(off) + 1}}}},
			append([]kv.Op{{Kind: kv.KindSetBit, Key: []byte("b"), Delta: off, Value: []byte{'1'}}}, writes...)...)
	}
	winner := c.inFlight(l, bit(1), "b", shard.ReqID{Client: 4, Seq: 1})
	reqs := []shard.WriteReq{
		{Op: bit(6, set("c", "5")), Durability: level.Sync, ID: shard.ReqID{Client: 5, Seq: 1}},
		{Op: kv.Op{Kind: kv.KindIncrBy, Key: []byte("c"), Delta: 1}, Durability: level.Sync, ID: shard.ReqID{Client: 6, Seq: 1}},
	}
	done := c.applyAsync(l, reqs)
	heldOrProposed(r, 1)
	c.isolate(l, false)
	<-winner
	if err := <-done; err != nil {
		return err
	}
	if h, _ := r.TxHolds(); h != 1 {
		return fmt.Errorf("%d holds, want 1", h)
	}
	if reqs[0].Err != nil || reqs[0].Result.Version == 0 {
		return fmt.Errorf("held transaction: %q, %v; want a commit", reqs[0].Result.Bulk, reqs[0].Err)
	}
	res, err := r.Read(context.Background(), get("c"), level.ConsLinearizable, shard.Session{})
	if err != nil {
		return err
	}
	if string(res.Bulk) != "6" {
		return fmt.Errorf("c = %q after SET c 5 (held transaction) then INCRBY c 1: the batch ran out of order", res.Bulk)
	}
	return nil
}

// A held transaction keeps its place in its batch: the writes after it are
// held with it and proposed after it.
func TestHeldTransactionKeepsItsBatchOrder(t *testing.T) {
	if err := heldInOrder(t, nil); err != nil {
		t.Fatal(err)
	}
}

// Holding only the transaction — the writes after it proposed at once — is
// caught (mutation holdOutOfOrder).
func TestHeldOutOfOrderCaught(t *testing.T) {
	mutation.Require(t)
	err := heldInOrder(t, func(r *Replica) { r.mut.holdOutOfOrder = true })
	if err == nil {
		t.Fatal("holdOutOfOrder not caught")
	}
	t.Logf("caught: %v", err)
}
