package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// Cross-group transactions at a node of several groups (docs/design/
// transactions.md, "Cross-group transactions"; kv/xgtx.go has the ops and
// the lock rule at apply). What a node does for them besides the
// coordinator (server, xgtx.go):
//
//   - a read of a key that a prepared transaction writes waits, at the
//     group's leader, until the transaction is resolved (AwaitTxLocks):
//     otherwise a reader could see the transaction's write at one group (its
//     primary resolved it) and the state before it at another;
//   - a write of a locked key (read or written by a prepared transaction)
//     waits the same way before it is proposed, so that the lock rule at
//     apply (kv.ErrTxLocked) refuses only one that raced with a prepare;
//   - a wait that lasts pushes the transaction (TxPusher): its primary is
//     asked to decide abort — the first decision wins, so a coordinator that
//     got there first is answered — and the group resolves with the answer;
//   - the leader of each hosted group pushes every transaction left prepared
//     longer than TxPushAge (RunTxPush): a coordinator that died between
//     prepare and resolve leaves locks that nothing else would drop;
//   - the same sweep collects the decisions the group recorded as a
//     primary: it settles a commit that still waits for a participant's
//     resolve after TxPushAge (SettleTx), and deletes the settled decisions
//     older than TxDecisionKeep, raising the group's low-water mark
//     (kv.KindTxCollect).

// TxPushAge is how long a transaction may stay prepared before a
// participant's leader pushes it (from its prepare op's clock).
var TxPushAge = 2 * time.Second

// TxWaitBeforePush is how long a reader or writer waits for a lock before
// it pushes the transaction holding it (a variable for tests); txWaitMax
// bounds its whole wait.
var (
	TxWaitBeforePush = 200 * time.Millisecond
	txWaitMax        = 5 * time.Second
)

// TxPusher decides and resolves a prepared transaction from outside its
// coordinator: decide abort at its primary (routed by p.Primary), then
// resolve at the participant whose key is key with the primary's answer.
// The front door sets it (it routes ops to any group's leader).
type TxPusher func(ctx context.Context, key []byte, p kv.TxPrepared) error

// SetTxPusher sets the function waits and RunTxPush push with.
func (m *Multi) SetTxPusher(p TxPusher) { m.pusher.Store(&p) }

// SetTxOps sets what RunTxPush's collection of decisions runs its ops with
// (the front door's routing to any group's leader).
func (m *Multi) SetTxOps(run TxOpRunner) { m.txOps.Store(&run) }

// ErrTxLockWait: a read or write waited txWaitMax for a prepared
// transaction's lock and it is still held.
var ErrTxLockWait = &ReplyError{"TRYAGAIN key locked by a prepared cross-group transaction that is not resolved yet"}

// txLockOf returns the prepared transaction locking one of keys in this
// node's replica of its group (as applied here), if any; writes false
// counts write locks only (a read waits for those). One atomic load when
// the group's replica publishes that it holds no lock (txLockFree), else
// one engine lookup when it holds none.
func (m *Multi) txLockOf(keys [][]byte, writes bool) (key []byte, p kv.TxPrepared, locked bool, err error) {
	for _, k := range keys {
		g, err := m.routeSlot(Slot(k))
		if err != nil || g.h.Engine == nil {
			continue // another node's group: it waits there
		}
		if lf, ok := g.h.Replica.(txLockFree); ok && lf.TxLockFree() {
			continue // published by the replica's applier: one load
		}
		get := g.h.Engine.Lookup
		n, err := kv.TxLockCount(get)
		if err != nil || n == 0 {
			if err != nil {
				return nil, kv.TxPrepared{}, false, err
			}
			continue
		}
		txid, mode, ok, err := kv.TxLockOf(get, k)
		if err != nil {
			return nil, kv.TxPrepared{}, false, err
		}
		if !ok || (!writes && mode != kv.TxLockWrite) {
			continue
		}
		p, ok, err := kv.TxPreparedOf(get, kv.TxPartID(txid, k))
		if err != nil || !ok {
			return k, kv.TxPrepared{TxID: txid}, true, err
		}
		return k, p, true, nil
	}
	return nil, kv.TxPrepared{}, false, nil
}

// LeadsKey reports whether this node's replica of key's group leads it
// (false for a group this node does not host).
func (m *Multi) LeadsKey(key []byte) bool {
	g, err := m.routeSlot(Slot(key))
	if err != nil {
		return false
	}
	l, ok := g.h.Replica.(txLeads)
	return ok && l.Leads()
}

// TxLocked reports, without waiting, whether a read (writes false) or a
// write of keys would wait for a prepared transaction here.
func (m *Multi) TxLocked(keys [][]byte, writes bool) bool {
	_, _, locked, err := m.txLockOf(keys, writes)
	return locked || err != nil
}

// AwaitTxLocks waits until no prepared transaction locks any of keys (only
// write locks if writes is false) in this node's replicas of their groups,
// pushing the holder once it waited TxWaitBeforePush; ErrTxLockWait after
// txWaitMax.
func (m *Multi) AwaitTxLocks(ctx context.Context, keys [][]byte, writes bool) error {
	start := time.Now()
	pushed := map[string]bool{}
	pause := 200 * time.Microsecond
	for {
		k, p, locked, err := m.txLockOf(keys, writes)
		if err != nil {
			return fmt.Errorf("%w: lock table: %w", shard.ErrUnavailable, err)
		}
		if !locked {
			return nil
		}
		waited := time.Since(start)
		if waited > txWaitMax {
			return ErrTxLockWait
		}
		if waited > TxWaitBeforePush && !pushed[string(p.TxID)] && len(p.Primary) > 0 {
			pushed[string(p.TxID)] = true
			if push := m.pusher.Load(); push != nil {
				m.txPushes.Add(1)
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				_ = (*push)(pctx, k, p) // failed: waited for, pushed again by the leader's sweep
				cancel()
				continue
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// txLockFree is a hosted replica that publishes whether its engine holds a
// prepared transaction (vrshard.Replica.TxLockFree).
type txLockFree interface{ TxLockFree() bool }

// txLeads is a hosted replica that knows whether it leads its group.
type txLeads interface{ Leads() bool }

// RunTxPush pushes, every period until ctx ends, the transactions that have
// been prepared longer than TxPushAge in every hosted group this node
// leads, and collects the decisions those groups keep as primaries
// (collectDecisions).
func (m *Multi) RunTxPush(ctx context.Context, period time.Duration, now func() time.Time) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.pushOld(ctx, now())
	}
}

// pushOld is one round of RunTxPush.
func (m *Multi) pushOld(ctx context.Context, now time.Time) {
	push := m.pusher.Load()
	if push == nil {
		return
	}
	for _, g := range m.hs().local {
		l, ok := g.h.Replica.(txLeads)
		if !ok || !l.Leads() || g.h.Engine == nil {
			continue
		}
		stale, _ := TxStale(g.h.Engine, now, TxPushAge)
		for _, p := range stale {
			m.txPushes.Add(1)
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = (*push)(pctx, p.Locks[0].Key, p) // failed: the next round tries again
			cancel()
		}
		m.collectDecisions(ctx, g, now)
	}
}

// collectDecisions is one round of the sweep's collection at a group this
// node leads (g): its unsettled commits settled,
// then its settled decisions below the mark deleted. Anything that fails
// is tried again by the next round.
func (m *Multi) collectDecisions(ctx context.Context, g *localGroup, now time.Time) {
	run := m.txOps.Load()
	if run == nil {
		return
	}
	keep := TxDecisionKeep
	if k := m.txKeep.Load(); k > 0 {
		keep = time.Duration(k)
	}
	tab := g.table()
	serves := func(slot uint16) bool { return tab == nil || tab.Entry(slot).State.Serves() }
	collect, unsettled, err := TxDecisionsDue(g.h.Engine, now, keep, TxPushAge, serves)
	if err != nil {
		return
	}
	for _, d := range unsettled {
		m.txSettles.Add(1)
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = SettleTx(sctx, *run, d)
		cancel()
	}
	if collect != nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = runOne(cctx, *run, *collect)
		cancel()
	}
}

// SetTxDecisionKeep sets how long this node's groups keep their decisions
// (TxDecisionKeep when never set).
func (m *Multi) SetTxDecisionKeep(d time.Duration) { m.txKeep.Store(int64(d)) }

// TxDecisionCount is the number of decision records in this node's replicas
// (a test's bound check; a scan of each group's decisions).
func (m *Multi) TxDecisionCount() (int, error) {
	n := 0
	for _, g := range m.hs().local {
		if g.h.Engine == nil {
			continue
		}
		err := g.h.Engine.Scan(kv.TxDecisionPrefix, kv.PrefixEnd(kv.TxDecisionPrefix), 0, 0, func([]byte, storage.Value) bool {
			n++
			return true
		})
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TxSettles counts the commits this node's sweep settled (SettleTx).
func (m *Multi) TxSettles() uint64 { return m.txSettles.Load() }

// TxPushes counts the pushes of prepared transactions this node made: its
// sweep's, as a group's leader, and its waiting reads' and writes'.
func (m *Multi) TxPushes() uint64 { return m.txPushes.Load() }

// txSnapLocal is a hosted replica that pins a snapshot of its own engine
// (vrshard.Replica.TxSnapLocal).
type txSnapLocal interface {
	TxSnapLocal(ctx context.Context, key []byte, after uint64) (*shard.TxSnap, error)
}

// TxSnapLocal pins a snapshot of key's group at this node's replica of it,
// leader or follower (committed state, not a linearizable read point): a
// cross-group transaction's further participants, whose every read its
// prepare validates.
func (m *Multi) TxSnapLocal(ctx context.Context, key []byte, after uint64) (*shard.TxSnap, error) {
	slot := Slot(key)
	g, err := m.routeSlot(slot)
	if err != nil {
		return nil, err
	}
	ts, ok := g.h.Replica.(txSnapLocal)
	if !ok {
		return nil, fmt.Errorf("%w: group %d's replica serves no cross-group transactions", shard.ErrUnavailable, g.spec.ID)
	}
	snap, err := ts.TxSnapLocal(ctx, key, after)
	return snap, withSlot(err, slot)
}

// GroupOf is the group that serves key's slot by this node's account.
func (m *Multi) GroupOf(key []byte) GroupID {
	id, _ := m.owner(Slot(key))
	return id
}

// txReadWait is AwaitTxLocks for a read at g, if this replica leads it
// (a follower's read is refused and forwarded: the leader waits).
func (m *Multi) txReadWait(ctx context.Context, g *localGroup, op *kv.Op) error {
	if mutation.On && MultiMut.ReadsIgnoreTxLocks.Load() {
		return nil
	}
	keys, step := op.RoutingKeys()
	if step != 1 || len(keys) == 0 || !m.TxLocked(keys, false) || m.leads(g) != nil {
		return nil
	}
	return m.AwaitTxLocks(ctx, keys, false)
}

// txWriteWait waits, before a batch is proposed, until no prepared
// transaction locks a key that a write of it writes, nor write-locks a key
// a commit only checks (it would abort at apply; a read lock it shares),
// at the groups this node leads; the lock rule at apply refuses only a
// write that raced with a prepare since. A write whose wait fails gets the
// error (Err) and is not proposed; the batch's other writes go on. Only
// ctx's end fails the batch.
func (m *Multi) txWriteWait(ctx context.Context, reqs []shard.WriteReq) error {
	for i := range reqs {
		op := &reqs[i].Op
		if !op.Kind.IsUpdate() || op.Kind == kv.KindFlush || kv.IsXgtxKind(op.Kind) {
			continue
		}
		keys := op.WrittenKeys()
		var checked [][]byte
		if op.Kind == kv.KindTxCommit {
			all, _ := op.RoutingKeys() // the written keys, then the checked ones
			checked = all[len(keys):]
		}
		if !m.TxLocked(keys, true) && !m.TxLocked(checked, false) {
			continue
		}
		err := m.awaitMine(ctx, keys, true)
		if err == nil {
			err = m.awaitMine(ctx, checked, false)
		}
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			reqs[i].Err = err
		}
	}
	return nil
}

// awaitMine is AwaitTxLocks for those of keys whose groups this node leads.
func (m *Multi) awaitMine(ctx context.Context, keys [][]byte, writes bool) error {
	var mine [][]byte
	for _, k := range keys {
		if g, err := m.routeSlot(Slot(k)); err == nil && m.leads(g) == nil {
			mine = append(mine, k)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	return m.AwaitTxLocks(ctx, mine, writes)
}
