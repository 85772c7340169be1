package vrshard

import (
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// Leads reports whether this replica is the leader of its group now: the one
// replica that runs active expiry (docs/design/expiry.md). Its answer may be
// stale the moment it returns; that is harmless, since a deposed leader's
// proposals are refused and an expiry delete rechecks at apply.
func (r *Replica) Leads() bool { return r.isLeader.Load() }

// TxLockFree reports that this replica's engine, as of its last applied
// batch, holds no prepared cross-group transaction: a read or write here
// need not look for a lock (cluster.Multi's waits). One atomic load
// (applier.txLocked), where the engine's lookup of the count record was
// 57–67 ns.
func (r *Replica) TxLockFree() bool { return !r.app.txLocked.Load() }

// Active expiry in the host (docs/design/expiry.md, "Active expiry"): every
// Options.ActiveExpiry on the replica's clock (r.clock: a process's wall
// clock, the simulator's drifting one), the leader samples its engine for
// keys expired at that clock (shard.ExpiryRound, the one copy of the
// decision) and proposes a replicated delete-if-still-expired
// (kv.KindExpireIfDue) of them, whose apply rechecks each key with the op's
// Now, the leader's clock at proposal. Rounds go on while a sample was more
// than a tenth expired, for at most a quarter of the tick on the same clock
// (the rate limit). The walk reads the engine off the driver (the
// executor: a goroutine in a process, the next tick in stepped mode), one
// round at a time; its result comes back to the driver (expDone), which
// proposes. Followers never delete: what they apply is the leader's
// deletes, and a replica that stops leading drops its cursor.
type expiryCycle struct {
	every   time.Duration // Options.ActiveExpiry (0: off)
	due     time.Time     // the next cycle starts at or after it
	start   time.Time     // when the running cycle started
	walking bool          // a round's walk is off the driver
	cursor  []byte
	// props are the deletes proposed since the last afterEvents, which
	// proposes them; batches are those not yet finished, whose results
	// count into deleted.
	props   []*proposal
	batches []*batchWait
	deleted atomic.Uint64 // keys the cycle deleted (Stats.ExpiredKeys)
}

// activeExpiry is Options.ActiveExpiry for a node's tick d
// (ReplicaSpec.ActiveExpiry: 0 the default, negative off).
func activeExpiry(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return shard.DefaultActiveExpiry
	case d < 0:
		return 0
	}
	return d
}

// expiryFound is a round's walk: the keys expired at its clock, where the
// next round goes on, and whether the cycle goes on.
type expiryFound struct {
	keys [][]byte
	next []byte
	more bool
	err  error
}

// maybeExpire (onTick) starts a cycle when one is due on the replica's
// clock and this replica leads.
func (r *Replica) maybeExpire() {
	e := &r.exp
	e.count()
	if e.every <= 0 || e.walking {
		return
	}
	now := r.clock.Now()
	if now.Before(e.due) {
		return
	}
	e.due = now.Add(e.every)
	if !r.isLeader.Load() {
		e.cursor = nil // a new leader starts its own walk
		return
	}
	e.start = now
	r.expiryRound(now)
}

// expiryRound starts one round's walk off the driver at the clock reading
// now.
func (r *Replica) expiryRound(now time.Time) {
	e := &r.exp
	e.walking = true
	cursor, ms := e.cursor, now.UnixMilli()
	if mutation.On && r.mut.expiryClockAhead {
		ms += 1000 // deliberately broken (tests): see expired
	}
	db := r.db
	r.exec.goWork(func() {
		keys, next, more, err := shard.ExpiryRound(db, cursor, ms)
		r.expDone <- expiryFound{keys: keys, next: next, more: more, err: err}
	})
}

// expired (driver) takes a round's walk: a leader proposes the deletes and,
// while the cycle's budget lasts, starts the next round.
func (r *Replica) expired(f expiryFound) {
	e := &r.exp
	e.walking = false
	if f.err != nil {
		r.log.Warn("active expiry", "err", f.err)
		return
	}
	if !r.isLeader.Load() {
		e.cursor = nil
		return
	}
	e.cursor = f.next
	if len(f.keys) > 0 {
		q := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindExpireIfDue, Keys: f.keys}}}
		if mutation.On && r.mut.expiryClockAhead {
			// Deliberately broken (tests): the delete decided by a clock a
			// second ahead of the leader's.
			q[0].Op.Now = r.clock.Now().UnixMilli() + 1000
		}
		bw, pp, _ := r.newBatch(q)
		bw.deadline = r.clock.Now().Add(r.opts.RequestTimeout)
		e.props = append(e.props, pp...)
		e.batches = append(e.batches, bw)
	}
	if now := r.clock.Now(); f.more && now.Sub(e.start) < e.every/4 {
		r.expiryRound(now)
	}
}

// count adds the keys the finished deletes removed to deleted.
func (e *expiryCycle) count() {
	k := 0
	for _, bw := range e.batches {
		select {
		case <-bw.done:
			if p := &bw.ps[0]; p.err == nil {
				e.deleted.Add(uint64(p.res.Int))
			}
		default:
			e.batches[k] = bw
			k++
		}
	}
	clear(e.batches[k:])
	e.batches = e.batches[:k]
}

// takeProps hands the deletes proposed since the last call to afterEvents.
func (e *expiryCycle) takeProps(props []*proposal) []*proposal {
	if len(e.props) == 0 {
		return props
	}
	props = append(props, e.props...)
	clear(e.props)
	e.props = e.props[:0]
	return props
}
