package vrshard

import (
	"context"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// Deferred reads (docs/design/cad.md §11). A linearizable read at the leader
// of a key whose latest update is a cad blind write not yet readable must not
// return before that write is durable (and applied on every active-set
// member): R must cover it. Read waits for that on the reader's goroutine,
// and a front door that runs a connection's commands in order holds every
// later command behind it (§9 item 2). But the write's value is known — it
// is in the leader's log, and in the overlay since it was appended — so
// ReadDeferred answers at once with that value and returns a Pending that
// holds the reply until R covers the write, exactly as a cad write's reply
// is held until it is acknowledged (§10). The connection runs its later
// commands meanwhile; the reply leaves, in order, when its batch's Wait
// returns.
//
// Why the value is right: the read is placed at the moment after its engine
// read when every key it read still has, as its latest indexed update, the
// one whose value it returns (the recheck below; an update indexed before
// the engine read is in the engine, by leaderCheck's argument, or in the
// overlay). The reply waits until R >= that update's op in the view whose
// leader appended it: the wait is registered with the core only while this
// replica leads that view, and the core fails it if it steps down. So the
// value returned is the one a read served after R passed it would return,
// and if the write is lost (a leader change before it is durable) the read
// is never answered: the batch's Wait fails and the front door drops the
// connection, an unknown outcome, as for the batch's writes.

// ReadDeferred is Read for a front door that can hold a reply
// (shard.Replica): see above. Every read it cannot defer is served
// as Read serves it, with an empty Pending.
func (r *Replica) ReadDeferred(ctx context.Context, op kv.Op, c level.Consistency, s shard.Session) (kv.Result, shard.Pending, error) {
	if err := r.fenceRead(&op); err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	if c.IsZero() {
		c = level.ConsLinearizable
	}
	if !r.deferrable(&op, c) {
		res, err := r.Read(ctx, op, c, s)
		return res, shard.Pending{}, err
	}
	if err := ctx.Err(); err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	if err := r.CheckConsistency(c); err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	if err := r.linearizable(ctx, &op); err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	res, ack, err := r.deferredRead(op)
	if err != nil {
		return kv.Result{}, shard.Pending{}, err
	}
	if ack != nil {
		r.stampView(&res)
		return res, shard.Pending{Acks: []shard.Ack{ack}}, nil
	}
	res, err = r.leaderServe(ctx, op)
	r.stampView(&res)
	return res, shard.Pending{}, err
}

// deferrable reports whether a read of op at level c may be deferred:
// this replica leads, the level needs the leader, and op reads keys (the
// stepped entry point, ReadDeferredStepped, asks the same).
func (r *Replica) deferrable(op *kv.Op, c level.Consistency) bool {
	return needsLeader(c) && r.isLeader.Load() && !r.chainReads(c) && !(mutation.On && r.mut.followerLinearizable) && r.readKeysOf(op) != nil &&
		!(mutation.On && r.mut.noDurabilityWait) && !(mutation.On && r.mut.noPreReadCheck)
}

// deferredRead serves op from the engine and the overlay's cad writes if
// that is what makes it wait, returning the reply's wait (nil ack: op is
// not such a read, and leaderServe serves it).
func (r *Replica) deferredRead(op kv.Op) (kv.Result, *readAck, error) {
	keys := r.readKeysOf(&op)
	ov := r.upd.overlayFor(keys, true)
	var to, view uint64
	for _, e := range ov {
		if !e.cad {
			continue
		}
		if to != 0 && e.view != view {
			// Entries of two views (view 0 is a view like any other, so
			// `to`, never 0 for an entry, says whether one was seen): a
			// leader change is under way.
			return kv.Result{}, nil, nil
		}
		to, view = max(to, e.op), e.view
	}
	R0 := r.readable.Load()
	if to <= R0 {
		return kv.Result{}, nil, nil // nothing to defer
	}
	// Every other key read must be readable already, as in leaderCheck.
	if need0 := r.cadNeed(&op, R0, ov); need0 > R0 {
		return kv.Result{}, nil, nil
	}
	// The result must be every key's value at op to. A key read from the
	// engine shows the updates the index knows of, and every unapplied write
	// ordered before to was indexed before to was (indexLate): one on a key
	// read makes the check above fall back, so the read never returns k's
	// cad write with j's value from before an earlier sync write of j.
	if h := r.mut.afterOverlay; mutation.On && h != nil {
		h()
	}
	res, err := r.readWith(op, ov)
	if err != nil {
		return kv.Result{}, nil, err
	}
	if !(mutation.On && r.mut.deferNoRecheck) {
		now := r.upd.overlayFor(keys, true)
		for k, e := range ov {
			if n, ok := now[k]; !ok || n.op != e.op {
				// A later update of k was indexed (or the write became
				// readable and left the overlay): the ordinary path.
				return kv.Result{}, nil, nil
			}
		}
	}
	if R := r.readable.Load(); r.cadNeed(&op, R, ov) > R {
		return kv.Result{}, nil, nil
	}
	r.st.durWaits.Add(1)
	r.st.durDeferred.Add(1)
	return res, &readAck{r: r, need: to, view: view}, nil
}

// readAck holds a deferred read's reply until R covers op need in view view.
type readAck struct {
	r          *Replica
	need, view uint64
}

// Await implements shard.Ack.
func (a *readAck) Await(ctx context.Context) error {
	r := a.r
	if mutation.On && r.mut.deferNoWait {
		return nil
	}
	rw := &readWaiter{done: make(chan struct{}), kind: rwDurable, need: a.need, deferred: true, view: a.view}
	if err := r.sendRead(ctx, rw); err != nil {
		return err
	}
	if err := r.awaitRead(ctx, rw); err != nil {
		return err
	}
	return rw.err
}
