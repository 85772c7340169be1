package vrshard

import (
	"context"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vr"
)

// Transactions held behind a commit in flight (docs/design/transactions.md,
// "Held behind a commit in flight"). Under contention most aborts are of a
// loser whose commit reaches the leader while the winner's is in flight —
// proposed, not yet applied — so the early check (txdoom.go), which reads
// only the applied, committed state, cannot decide it: the loser is
// proposed, replicated and fsynced on every replica, and aborts at apply.
// The leader knows which keys the transactions it proposed write, so a
// transaction that checks (watches, or validates) such a key is held — not
// proposed — until those commits finish (failed, or applied and readable:
// deferTx), then decided
// as any other at newBatch: answered early if the state now dooms it (the
// winner wrote the key), proposed otherwise (the winner aborted, or wrote
// other bits of it). Nothing is decided from the in-flight commit itself:
// the decision is TxDoomed's, on committed state, so no transaction that
// validation would commit is aborted, and none it would abort commits. The
// loser learns when the winner is applied — no later than it would have
// through the log, where it is ordered behind the winner — and costs no log
// entry, no replication and no fsync. A held transaction waits at most
// txHoldMax; a view change fails the commits it waits for (failAll), which
// releases it.
//
// Only EXECs and KEFIR.TX commits are tracked: they are the writes that
// transactions contend with under optimistic concurrency, and a plain
// write's path pays nothing. A plain write in flight to a checked key is
// not waited for (the transaction is proposed and validated at apply, as
// before). The stepped host (the simulator) holds as a process does, but
// polls instead of waiting (SteppedWrite.Done), on the simulated clock.

// txWriters maps each key written by an unfinished EXEC or transaction
// commit this replica proposed to the latest such proposal's txDone
// (prepareProposal). An entry whose proposal finished is stale: dropped
// when found, or by a sweep.
type txWriters struct {
	mu    sync.Mutex
	last  map[string]chan struct{}
	swept int // entries left by the last sweep
}

// txWriterSlack is how far the map may grow past twice what the last sweep
// left before it is swept again: a sweep's cost is amortized over the
// entries added since.
const txWriterSlack = 256

// add records that the proposal whose txDone is done writes keys.
func (w *txWriters) add(keys [][]byte, done chan struct{}) {
	if len(keys) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[string]chan struct{}{}
	}
	for _, k := range keys {
		w.last[string(k)] = done
	}
	if len(w.last) > 2*w.swept+txWriterSlack {
		for k, d := range w.last {
			if closed(d) {
				delete(w.last, k)
			}
		}
		w.swept = len(w.last)
	}
}

// unfinished returns the txDone of the unfinished proposals that write any
// of keys.
func (w *txWriters) unfinished(keys [][]byte) []chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []chan struct{}
	for _, k := range keys {
		d := w.last[string(k)]
		switch {
		case d == nil:
		case closed(d):
			delete(w.last, string(k))
		default:
			out = append(out, d)
		}
	}
	return out
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// txHoldMax bounds a hold: a commit in flight longer than this (a stalled
// follower, slow disks) is not waited for; the held transaction is then
// proposed and decided at apply, as before holds. A variable for tests.
var txHoldMax = 50 * time.Millisecond

// txBehind returns the txDone of the unfinished EXECs and transaction
// commits this replica proposed that write a key op (an EXEC or a
// transaction commit) checks: newBatch holds op until they finish. Each is
// proposed, so it finishes without waiting for any hold.
func (r *Replica) txBehind(op *kv.Op) []chan struct{} {
	return r.txw.unfinished(kv.TxCheckedKeys(op))
}

// txHoldable reports whether a write of reqs may be held: only in a
// batch Apply answers when every write is finished — one with a write
// acknowledged or ordered before it is applied has a driver-only count of
// its unordered writes (markOrdered) that a held write, finished off the
// driver, would race with, and its early replies would wait for the hold.
func (r *Replica) txHoldable(reqs []shard.WriteReq) bool {
	if mutation.On && r.mut.noTxHold {
		return false
	}
	for i := range reqs {
		q := &reqs[i]
		early := r.answerableEarly(&q.Op)
		ack := r.ackPointFor(q, early)
		if ack != vr.AckApplied || r.ordersEarly(q, ack, early) {
			return false
		}
	}
	return true
}

// proposeHeld decides the writes newBatch held (bw.held: a transaction
// behind commits in flight and the writes after it in the batch, which
// keep their order): it waits until the commits in flight that write a key
// a held transaction checks finish (at most txHoldMax from now), then
// decideHeld answers or proposes them. It runs in Apply, after the batch's
// other writes were handed to the driver. (The stepped host polls the same
// condition instead of waiting: SteppedWrite.Done.)
func (r *Replica) proposeHeld(ctx context.Context, bw *batchWait) error {
	held, from := bw.held, bw.heldFrom
	r.st.txHolds.Add(1)
	timer := time.NewTimer(txHoldMax)
	defer timer.Stop()
	expired := false
	for k := 0; k < len(held) && !expired; k++ {
		if !kv.TxValidated(held[k].Op.Kind) {
			continue
		}
		for _, d := range r.txBehind(&held[k].Op) {
			select {
			case <-d:
				continue
			case <-timer.C:
				expired = true
			case <-ctx.Done():
				r.dropHeld(bw, from, len(held), ctx.Err())
				return ctx.Err()
			case <-r.done:
				r.dropHeld(bw, from, len(held), r.closedErr())
				return r.closedErr()
			}
			break
		}
	}
	pp := r.decideHeld(bw)
	if len(pp) == 0 {
		return nil
	}
	select {
	case r.propc <- pp:
		return nil
	case <-ctx.Done():
		unsent(pp)
		return ctx.Err()
	case <-r.done:
		unsent(pp)
		return r.closedErr()
	}
}

// heldReleased reports whether every commit in flight that a transaction
// held in bw checks has finished (proposeHeld's wait is over).
func (r *Replica) heldReleased(bw *batchWait) bool {
	for k := range bw.held {
		if kv.TxValidated(bw.held[k].Op.Kind) && len(r.txBehind(&bw.held[k].Op)) > 0 {
			return false
		}
	}
	return true
}

// decideHeld ends bw's hold: in order, it answers each held transaction the
// early check now dooms and makes proposals of the rest, which it returns
// for the driver.
func (r *Replica) decideHeld(bw *batchWait) []*proposal {
	held, from := bw.held, bw.heldFrom
	bw.held = nil
	ts := r.clock.Now().UnixNano()
	var pp []*proposal
	for k := range held {
		q, p := &held[k], &bw.ps[from+k]
		if kv.TxValidated(q.Op.Kind) {
			if res, ok := r.txDoomed(&q.Op, q.ID); ok {
				r.st.heldAborts.Add(1)
				p.finish(res, nil)
				continue
			}
		}
		r.prepareProposal(q, p, ts)
		pp = append(pp, p)
	}
	return pp
}

// unsent releases whoever waits for the transactions of pp (holds, fresh
// reads): Apply gave up before the driver took them, so they will never
// finish, and a key they write would otherwise look in flight until a later
// commit of it.
func unsent(pp []*proposal) {
	for _, p := range pp {
		p.releaseTx()
	}
}

// dropHeld finishes the held writes bw.ps[from:from+n], not proposed, with
// err.
func (r *Replica) dropHeld(bw *batchWait, from, n int, err error) {
	for i := from; i < from+n; i++ {
		bw.ps[i].finish(kv.Result{}, err)
	}
	bw.held = nil
}

// TxHolds is how many transactions this replica held behind commits in
// flight (proposeHeld), and how many of them it then answered as aborted
// without proposing them.
func (r *Replica) TxHolds() (held, aborted uint64) {
	return r.st.txHolds.Load(), r.st.heldAborts.Load()
}

// TxWriting reports whether an EXEC or transaction commit this replica
// proposed and has not finished writes any of keys: a transaction whose
// first read is of them would read a state that commit is about to replace
// (server txRefresh; TxAwaitWriters waits for it). Cheap, for an event loop.
func (r *Replica) TxWriting(keys [][]byte) bool {
	if mutation.On && r.mut.noFreshReads {
		return false
	}
	return len(r.txw.unfinished(keys)) > 0
}

// TxAwaitWriters waits until every EXEC or transaction commit that writes
// any of keys, proposed by this replica and unfinished at the call, has
// finished (failed, or applied and covered by R: deferTx), or ctx ends (the caller bounds the wait), and
// reports whether there was any. The caller then takes a new start version
// (TxBegin), which follows them.
func (r *Replica) TxAwaitWriters(ctx context.Context, keys [][]byte) (bool, error) {
	if mutation.On && r.mut.noFreshReads {
		return false, nil
	}
	ds := r.txw.unfinished(keys)
	if len(ds) == 0 {
		return false, nil
	}
	for _, d := range ds {
		select {
		case <-d:
		case <-ctx.Done():
			return true, ctx.Err()
		case <-r.done:
			return true, r.closedErr()
		}
	}
	r.st.freshReads.Add(1)
	return true, nil
}

// txApplied is a transaction proposal applied at op whose waiters (holds,
// fresh first reads) are not woken yet: they wake once the readable index R
// covers op (releaseTxApplied), since the early check (TxDoomed) and TxBegin
// read min(R, applied) — woken before, a held transaction would not see the
// commit it waited for and be proposed to abort at apply, and a fresh read's
// new start would miss its winner.
type txApplied struct {
	op   uint64
	done chan struct{}
}

// deferTx (driver) takes p's txDone, if any, for releaseTxApplied: p is
// finished at op by its apply, and R covers op no sooner than this round's
// publish (ready), or later with follower reads.
func (r *Replica) deferTx(p *proposal, op uint64) {
	if p.txDone == nil {
		return
	}
	if mutation.On && r.mut.earlyTxRelease {
		r.closeTx(op, p.txDone)
		p.txDone = nil
		return
	}
	r.txApplied = append(r.txApplied, txApplied{op: op, done: p.txDone})
	p.txDone = nil
}

// releaseTxApplied (driver, after publish) wakes the waiters of the applied
// transactions R now covers.
func (r *Replica) releaseTxApplied() {
	if len(r.txApplied) == 0 {
		return
	}
	R := min(r.readable.Load(), r.applied.Load())
	n := 0
	for _, t := range r.txApplied {
		if t.op <= R {
			r.closeTx(t.op, t.done)
			continue
		}
		r.txApplied[n] = t
		n++
	}
	clear(r.txApplied[n:])
	r.txApplied = r.txApplied[:n]
}

// releaseTxAll (driver) wakes every applied transaction's waiters: this
// replica stopped leading, and R may not move here for a while; what they
// then read is the committed state as far as it is readable, and TxDoomed
// decides nothing from the commit itself.
func (r *Replica) releaseTxAll() {
	for _, t := range r.txApplied {
		r.closeTx(t.op, t.done)
	}
	clear(r.txApplied)
	r.txApplied = r.txApplied[:0]
}

// closeTx wakes the waiters of the transaction applied at op.
func (r *Replica) closeTx(op uint64, done chan struct{}) {
	if h := r.mut.onTxRelease; mutation.On && h != nil {
		h(op)
	}
	close(done)
}
