package vrshard

import (
	"context"
	"fmt"
	"sync"
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

// heldLoser runs, on a 3-replica group tuned by tune, a loser whose winner
// is in flight — two commits from one start that both check and write k —
// and returns the loser's reply, the leader's proposals (with the winner in
// flight, while the loser waited, after), and its holds.
func heldLoser(t *testing.T, tune func(*Replica)) (reply, want string, proposals [3]uint64, holds, heldAborts uint64) {
	c := orderedCluster(t, nil)
	l := c.leader(5 * time.Second)
	r := c.reps[l]
	if tune != nil {
		tune(r)
	}
	first, err := c.write(set("k", "1"), shard.ReqID{Client: 1, Seq: 1}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.readableAt(l, first.Version)
	check := []kv.TxCheck{{Key: []byte("k"), Version: first.Version}}
	p0 := r.Stats().Proposals
	winner := c.inFlight(l, txCommit(t, first.Version, check, set("k", "2")), "k", shard.ReqID{Client: 2, Seq: 1})
	// In the writers' map before the driver counts it: wait for the count.
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return r.Stats().Proposals > p0 }) {
		t.Fatal("the winner was not proposed")
	}
	proposals[0] = r.Stats().Proposals
	loser := txCommit(t, first.Version, check, set("k", "3"))
	reqs := []shard.WriteReq{{Op: loser, Durability: level.Sync, ID: shard.ReqID{Client: 3, Seq: 1}}}
	done := c.applyAsync(l, reqs)
	heldOrProposed(r, 1)
	time.Sleep(20 * time.Millisecond) // a proposal of the loser would be counted by now
	proposals[1] = r.Stats().Proposals
	c.isolate(l, false)
	w := <-winner
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.Version == 0 {
		t.Fatalf("winner: %q; want a commit", w.Bulk)
	}
	if reqs[0].Err != nil {
		t.Fatalf("loser: %v", reqs[0].Err)
	}
	proposals[2] = r.Stats().Proposals
	holds, heldAborts = r.TxHolds()
	c.expectValue(l, "k", "2")
	want = fmt.Sprintf("-TXABORT conflict on key 'k': written at version %d after the transaction's start version %d\r\n", w.Version, first.Version)
	return string(reqs[0].Result.Bulk), want, proposals, holds, heldAborts
}

// A loser whose winner is in flight is held until the winner is applied and
// then answered -TXABORT without a log entry: no proposal, no fsync. Before
// holds it was proposed (the early check reads only applied state) and
// aborted at apply, through a log entry replicated and fsynced on every
// replica (TestHeldLoserGoesThroughTheLogWithoutHolds).
func TestHeldBehindACommitInFlightNeedsNoLogEntry(t *testing.T) {
	got, want, ps, h, aborted := heldLoser(t, nil)
	t.Logf("proposals: %d with the winner in flight, %d while the loser waited, %d after; holds %d, aborted held %d", ps[0], ps[1], ps[2], h, aborted)
	if got != want {
		t.Fatalf("loser: %q; want %q", got, want)
	}
	if ps[1] != ps[0] || ps[2] != ps[0] || h != 1 || aborted != 1 {
		t.Fatalf("the loser went through the log: proposals %v, holds %d, held aborts %d; want no proposal, one hold answered early", ps, h, aborted)
	}
}

// Without holds (mutation noTxHold, the code before them) the same loser is
// proposed and aborted at apply: the same reply, through a log entry.
func TestHeldLoserGoesThroughTheLogWithoutHolds(t *testing.T) {
	mutation.Require(t)
	got, want, ps, h, _ := heldLoser(t, func(r *Replica) { r.mut.noTxHold = true })
	t.Logf("proposals %v, holds %d", ps, h)
	if got != want {
		t.Fatalf("loser: %q; want %q", got, want)
	}
	if ps[2] != ps[0]+1 || h != 0 {
		t.Fatalf("proposals %v, holds %d; want the loser proposed, no hold", ps, h)
	}
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

// A transaction's first read behind a commit in flight (server txRefresh):
// TxWriting names the key, TxAwaitWriters returns once the commit is
// applied, and a start taken then (TxBegin) reads it. With the mutation
// noFreshReads the key is not reported.
func TestTxAwaitWritersThenBeginReadsTheCommit(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		if !fresh && !mutation.On {
			continue
		}
		c := orderedCluster(t, nil)
		l := c.leader(5 * time.Second)
		r := c.reps[l]
		r.mut.noFreshReads = !fresh
		first, err := c.write(set("k", "1"), shard.ReqID{Client: 1, Seq: 1}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.readableAt(l, first.Version)
		check := []kv.TxCheck{{Key: []byte("k"), Version: first.Version}}
		winner := c.inFlight(l, txCommit(t, first.Version, check, set("k", "2")), "k", shard.ReqID{Client: 2, Seq: 1})
		keys := [][]byte{[]byte("k")}
		if got := r.TxWriting(keys); got != fresh || r.TxWriting([][]byte{[]byte("other")}) {
			t.Fatalf("fresh %v: TxWriting(k) = %v, TxWriting(other) = %v", fresh, got, !got)
		}
		if !fresh {
			c.isolate(l, false)
			<-winner
			continue
		}
		awaited := make(chan error, 1)
		go func() {
			waited, err := r.TxAwaitWriters(context.Background(), keys)
			if err == nil && !waited {
				err = fmt.Errorf("did not wait")
			}
			awaited <- err
		}()
		select {
		case err := <-awaited:
			t.Fatalf("returned with the commit in flight: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		c.isolate(l, false)
		w := <-winner
		if err := <-awaited; err != nil {
			t.Fatal(err)
		}
		snap, err := r.TxBegin(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		d, _, v, _, err := snap.Get([]byte("k"))
		snap.Close()
		if err != nil || string(d) != "2" || v != w.Version {
			t.Fatalf("after the wait, a new start reads k = %q at version %d (%v); want 2 at %d", d, v, err, w.Version)
		}
		if r.TxWriting(keys) {
			t.Fatal("TxWriting still names k after its commit finished")
		}
	}
}

// An applied transaction's waiters wake only once the readable index covers
// it (deferTx, releaseTxApplied), on the driver after the round's publish:
// what they then read (TxDoomed, TxBegin: min(R, applied)) holds the commit.
// The hook checks R and applied at each release; the held loser is then
// answered without a log entry. With the mutation earlyTxRelease (woken in
// the Ready that applies it, the code before the rule without its poll)
// the hook sees R behind the commit. The hook itself is a mutation-build
// seam (called only when mutation.On), so the test needs the tag for both
// runs.
func TestTxWaitersWakeOnceReadable(t *testing.T) {
	mutation.Require(t)
	for _, early := range []bool{false, true} {
		var mu sync.Mutex
		var releases, behind int
		var first string
		got, want, ps, h, aborted := heldLoser(t, func(r *Replica) {
			r.mut.earlyTxRelease = early
			r.mut.onTxRelease = func(op uint64) {
				mu.Lock()
				defer mu.Unlock()
				releases++
				if R, a := r.readable.Load(), r.applied.Load(); R < op || a < op {
					behind++
					if first == "" {
						first = fmt.Sprintf("op %d released at R %d, applied %d", op, R, a)
					}
				}
			}
		})
		mu.Lock()
		t.Logf("early %v: %d releases, %d before R covered them (%s); loser %q, proposals %v, holds %d, held aborts %d", early, releases, behind, first, got, ps, h, aborted)
		if releases == 0 {
			t.Fatalf("early %v: no transaction's waiters were released through the hook", early)
		}
		if !early {
			if behind != 0 {
				t.Fatalf("waiters woken before R covered their transaction: %s", first)
			}
			if got != want || aborted != 1 {
				t.Fatalf("loser %q (held aborts %d); want %q answered early", got, aborted, want)
			}
		} else if behind == 0 {
			t.Fatal("earlyTxRelease not caught: every release saw R cover the transaction")
		}
		mu.Unlock()
	}
}
