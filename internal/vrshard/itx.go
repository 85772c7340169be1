package vrshard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// TxBegin serves an interactive transaction's BEGIN (KEFIR.TX;
// docs/design/transactions.md): at the leader, a linearizable read of the
// whole keyspace (a scan of one key: leadership confirmed, the engine applied
// through the commit index, and the latest update of every key readable,
// cadNeed) makes every write acknowledged before the call readable; the start
// version is then the readable index R, capped by what the engine applied.
// Every version up to it is committed and readable, so the snapshot it pins
// here may be read after this replica loses its leadership, and its commit
// validates on whichever leader orders it.
//
// key (the transaction's first key, nil on a node of one group) passes the
// slot fence as of the snapshot: a transaction is of one slot
// (cluster.Multi.TxBegin), and a snapshot of a slot this group does not
// serve at that version — handed over (its copy frozen while the new owner
// takes writes) or not yet imported — would let a read-only transaction
// commit, without the log, what it read there. The refusal is the read
// fence's *kv.SlotError (-MOVED).
func (r *Replica) TxBegin(ctx context.Context, key []byte) (*shard.TxSnap, error) {
	if err := r.CheckConsistency(level.ConsLinearizable); err != nil {
		return nil, err
	}
	if r.chainCRAQ() {
		return r.chainTxBegin(ctx, key)
	}
	if _, err := r.leaderRead(ctx, txBeginRead); err != nil {
		return nil, err
	}
	return r.txSnap(key)
}

// chainTxBegin is TxBegin on a chain member (SU, AUSI), at the head as
// before strong reads went to any member: its strong reads would check the
// whole keyspace against the keys with updates in flight (chainread.go) and
// go to the tail whenever there is any, and a transaction commits at the
// head. The head's read lease (or the driver) waits until it applied its
// whole history as of now, which holds every acknowledged write.
func (r *Replica) chainTxBegin(ctx context.Context, key []byte) (*shard.TxSnap, error) {
	if !r.isLeader.Load() {
		return nil, r.notLeader()
	}
	op := txBeginRead
	if err := r.linearizable(ctx, &op); err != nil {
		return nil, err
	}
	if r.chainDurable() {
		// Under AUSI the snapshot is pinned at R, the durable point
		// (txSnap): wait until it covers what was applied, every update
		// answered before the transaction began among it (a cad write is
		// answered at commit, before DA; chainread.go, "Strong reads at
		// the durable point").
		if done, err := r.until(ctx, &r.readable, r.applied.Load(), r.opts.RequestTimeout, nil); err != nil || !done {
			return nil, cmp.Or(err, ErrCannotServe)
		}
	}
	return r.txSnap(key)
}

// txBeginRead is the linearizable read of the whole keyspace that makes a
// transaction's start version at least as new as every acknowledged write
// (TxBegin, TxBeginStepped).
var txBeginRead = kv.Op{Kind: kv.KindScan, Limit: 1}

// txSnap pins the start version after txBeginRead completed: the readable
// index R, capped by what the engine applied; key (nil on a node of one
// group) passes the slot fence as of it (TxBegin).
func (r *Replica) txSnap(key []byte) (*shard.TxSnap, error) {
	return r.txSnapAt(key, min(r.readable.Load(), r.applied.Load()))
}

// txSnapAt is txSnap at version v.
func (r *Replica) txSnapAt(key []byte, v uint64) (*shard.TxSnap, error) {
	snap := shard.NewTxSnap(r.db, v)
	if key != nil && !(mutation.On && r.mut.slotsUnfenced) {
		enc, _, _, _, err := snap.Get(kv.SlotTableKey)
		if err == nil {
			err = kv.CheckSlotTable(enc, &kv.Op{Kind: kv.KindGet, Key: key})
		}
		if errors.Is(err, kv.ErrCorrupt) {
			err = fmt.Errorf("%w: slot table at version %d: %w", shard.ErrUnavailable, snap.Version(), err)
		}
		if err != nil {
			snap.Close()
			return nil, err
		}
	}
	return snap, nil
}

var _ shard.TxSnapshots = (*Replica)(nil)

// TryTxBegin is TxBegin of a transaction on a node of one group (no key)
// if it can be served without waiting: this replica leads under a running
// lease and everything the read point covers is readable (TryRead's
// conditions, the same read point TxBegin confirms by waiting). ok false
// means it could not, with nothing pinned: the caller runs TxBegin. The
// event loops call it so that BEGIN need not leave the loop
// (server.txInline).
//
// It is TryRead of txBeginRead without the engine read: the scan's result
// was dropped, and running it (a pinned engine snapshot, a scanner, a
// result: fourteen allocations) was a tenth of a read-only transaction's
// work on the loop (docs/design/transactions.md, "Benchmarks"). What makes
// the start a linearizable read point is the lease and leaderCheck's check
// that every update acknowledged so far is readable (cadNeed of the whole
// keyspace at most R); its pre-read check guards an engine read racing the
// applier, and there is none here: the snapshot is pinned after the check
// (txSnap, as TxBegin pins it).
func (r *Replica) TryTxBegin() (*shard.TxSnap, bool) {
	if r.chainCRAQ() {
		// At the head, under its lease, whose index is the head's whole
		// history when it was granted (localLease: applied at least that):
		// an update the tail committed — and may have answered a read of —
		// is applied here before the snapshot is pinned, or chainTxBegin
		// waits for it (TestChainTxBeginWhileAnUpdateIsInFlight).
		if r.CheckConsistency(level.ConsLinearizable) != nil || !r.isLeader.Load() || !r.localLease() {
			return nil, false
		}
		if r.chainDurable() && r.readable.Load() < r.applied.Load() {
			return nil, false // AUSI: not all durable yet; chainTxBegin waits for it
		}
		snap, err := r.txSnap(nil)
		return snap, err == nil
	}
	op := txBeginRead
	if r.fenceRead(&op) != nil || !r.leaseServes(level.ConsLinearizable) {
		return nil, false
	}
	R := r.readable.Load()
	if r.cadNeed(&op, R, nil) > R && !(mutation.On && r.mut.noDurabilityWait) {
		return nil, false // an acknowledged update is not readable yet: TxBegin waits for it
	}
	r.st.leaseReads.Add(1)
	r.st.localReads.Add(1)
	snap, err := r.txSnap(nil) // no key: no slot fence, no error
	return snap, err == nil
}

// TxSnapLocal pins a snapshot of this replica's engine, leader or follower,
// at committed state — what it applied, capped by its readable index R at a
// leader (which may apply ops not yet committed) and by the commit number it
// knows at a follower (R is a leader's) — with key passing the slot fence as
// of it. It is no linearizable read point: a cross-group
// transaction's further participants are read from it (server, xgtx), and
// every key it reads there is validated at that group's prepare, which
// aborts if any changed since (docs/design/transactions.md, "Cross-group
// transactions").
//
// after is a version the snapshot must hold (the key's version as its
// group's leader read it, linearizably, after the transaction began): it
// waits, bounded by ctx, until this replica's readable index covers it.
func (r *Replica) TxSnapLocal(ctx context.Context, key []byte, after uint64) (*shard.TxSnap, error) {
	pause := 100 * time.Microsecond
	point := func() uint64 {
		if r.Leads() {
			return min(r.readable.Load(), r.applied.Load())
		}
		return min(r.commit.Load(), r.applied.Load())
	}
	for point() < after {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: replica behind version %d (at %d)", shard.ErrUnavailable, after, point())
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Millisecond)
	}
	return r.txSnapAt(key, point())
}
