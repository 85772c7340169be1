package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/storage"
)

// The decision sequence of a cross-group transaction's coordinator and of
// its push (docs/design/transactions.md, "Cross-group transactions"): one
// copy, run by the server (server.txCommitCross, server.txPush, with ops
// forwarded over the cluster's connections) and by vrshard's deterministic
// simulation (TestXgSim, with ops as simulated messages and the
// coordinator killed between any two of them). What carries the ops is
// injected (TxOpRunner); nothing here keeps a clock or starts a goroutine.

// TxOpRunner runs two-phase ops (kv.KindTxPrepare, KindTxDecide,
// KindTxResolve), each at the leader of its routing key's group, all at
// once, and answers each one's RESP reply line ("+PREPARED",
// "-TXABORT ...") or the error that left its outcome unknown. The ops are
// idempotent by transaction id, so a runner may send one again.
type TxOpRunner func(ctx context.Context, ops []kv.Op) (replies []string, errs []error)

// TwoPhase commits a cross-group transaction whose parts' prepares are
// prepares (keys[i]: a key of part i's slot, which routes its resolve):
//
//  1. every prepare at once;
//  2. the decision at the primary (primaryKey's slot): commit if every
//     prepare answered +PREPARED, else abort. The first decision recorded
//     there wins (a push may have recorded abort first), so its answer is
//     the outcome; sent up to three times;
//  3. a resolve with that outcome at every other part that prepared, at
//     once; one that fails is left to its group's leader (the push).
//
// It answers committed, or the abort's reason; err if the decision's
// outcome is unknown. forget, if not nil, tells the primary which parts of
// a commit have resolved, so that it may collect its decision
// (kv.KindTxForget): the caller sends it after its reply (run(ctx,
// forget)); lost, the primary's sweep settles the decision (SettleTx).
func TwoPhase(ctx context.Context, run TxOpRunner, txid, primaryKey []byte, keys [][]byte, prepares []kv.Op) (committed bool, abort string, forget []kv.Op, err error) {
	replies, errs := run(ctx, prepares)
	commit := true
	for i := range prepares {
		if mutation.On && MultiMut.DecideEarly.Load() && Slot(keys[i]) != Slot(primaryKey) {
			continue // the bug: decided without this prepare's answer
		}
		switch {
		case errs[i] != nil:
			commit = false
			if abort == "" {
				abort = "TXABORT a participant's prepare failed: " + errs[i].Error()
			}
		case replies[i] != "+PREPARED":
			commit = false
			if abort == "" {
				abort = strings.TrimPrefix(replies[i], "-")
			}
		}
	}
	var decision string
	for attempt := 0; attempt < 3; attempt++ {
		if decision, err = runOne(ctx, run, kv.NewTxDecide(txid, primaryKey, commit, keys...)); err == nil {
			break
		}
	}
	switch {
	case err != nil:
		// The primary may have recorded it or not: the participants'
		// leaders will learn which from it (the push).
		return false, "", nil, fmt.Errorf("cross-group commit: the decision's outcome is unknown: %w", err)
	case decision == "+FORGOTTEN" && commit:
		// Decided before (an attempt whose answer was lost) and collected
		// since: committed, or aborted by a push — no longer known.
		return false, "", nil, fmt.Errorf("cross-group commit: the decision's outcome is unknown: transaction %x is below its primary's low-water mark and its decision was collected", txid)
	case decision != "+COMMITTED" && decision != "+ABORTED" && decision != "+FORGOTTEN":
		return false, "", nil, fmt.Errorf("cross-group commit: the decision's outcome is unknown: the primary answered %q", decision)
	}
	committed = decision == "+COMMITTED"
	var resolves []kv.Op
	for i := range prepares {
		if Slot(keys[i]) == Slot(primaryKey) || errs[i] != nil || replies[i] != "+PREPARED" {
			continue // the primary resolved in its decide; the others hold nothing
		}
		resolves = append(resolves, kv.NewTxResolve(txid, keys[i], committed))
	}
	if len(resolves) > 0 {
		rreplies, rerrs := run(ctx, resolves) // failed: pushed by its leader
		if committed {
			if done := committedParts(resolves, rreplies, rerrs); len(done) > 0 {
				forget = []kv.Op{kv.NewTxForget(txid, primaryKey, done)}
			}
		}
	}
	if committed {
		return true, "", forget, nil
	}
	if abort == "" {
		abort = "TXABORT the transaction was aborted before its commit (a participant's leader pushed it)"
	}
	return false, abort, nil, nil
}

// committedParts returns the routing keys (Expected) of the commit
// resolves that answered +COMMITTED: the parts a forget may name. Only a
// resolve's own answer says its part resolved (an error line forwarded
// from a group is not one).
func committedParts(resolves []kv.Op, replies []string, errs []error) [][]byte {
	var done [][]byte
	for i, e := range errs {
		if e == nil && replies[i] == "+COMMITTED" {
			done = append(done, resolves[i].Expected)
		}
	}
	return done
}

// runOne runs one op.
func runOne(ctx context.Context, run TxOpRunner, op kv.Op) (string, error) {
	replies, errs := run(ctx, []kv.Op{op})
	return replies[0], errs[0]
}

// PushTx decides and resolves prepared part p (key: a key of its slot)
// from outside its coordinator: abort decided at its primary — the first
// decision wins, so a coordinator that got there first is answered — then
// the part resolved with the primary's answer, and a commit's primary told
// (kv.KindTxForget). Forgotten (the transaction is below the primary's
// low-water mark and has no decision there) resolves abort: a part still
// prepared then was prepared after its transaction was decided — aborted,
// or committed with this part's records landed by an earlier prepare's
// resolve, since a commit is collected only once every part resolved.
func PushTx(ctx context.Context, run TxOpRunner, key []byte, p kv.TxPrepared) error {
	if mutation.On && MultiMut.PushDecidesLocally.Load() {
		// The bug: the part aborts on its own, whatever the primary decided.
		_, err := runOne(ctx, run, kv.NewTxResolve(p.TxID, key, false))
		return err
	}
	d, err := runOne(ctx, run, kv.NewTxDecide(p.TxID, p.Primary, false))
	if err != nil {
		return err
	}
	if d != "+COMMITTED" && d != "+ABORTED" && d != "+FORGOTTEN" {
		return fmt.Errorf("push of %x: decide answered %q", p.TxID, d)
	}
	if Slot(key) == Slot(p.Primary) && d != "+FORGOTTEN" {
		return nil // the primary's part resolved with its decision
	}
	commit := d == "+COMMITTED"
	r, err := runOne(ctx, run, kv.NewTxResolve(p.TxID, key, commit))
	if err != nil || !commit {
		return err
	}
	if r != "+COMMITTED" {
		return fmt.Errorf("push of %x: resolve answered %q", p.TxID, r)
	}
	_, err = runOne(ctx, run, kv.NewTxForget(p.TxID, p.Primary, [][]byte{key}))
	return err
}

// TxDecisionKeep is how long a group keeps the decisions it recorded as a
// primary, by the transaction's id (kv.TxIDTime, its coordinator's clock)
// against its leader's: the low-water mark its sweep raises is now minus
// this. A coordinator whose transaction is older than the mark when its
// prepare or decide arrives is refused (abort, or an unknown outcome), so
// it must exceed a commit's duration (the server's bound is 15 s) plus the
// clocks' skew.
var TxDecisionKeep = time.Minute

// txCollectBatch bounds the decisions one sweep collects (kv's bound on a
// collect op); txSettleBatch the commits it settles.
const (
	txCollectBatch = 4096
	txSettleBatch  = 64
)

// TxDecisionsDue lists the decisions in db (a group's applied state, of
// which it is the primary) that its leader's sweep acts on at now, among
// those below the mark now-keep: collect, the op deleting the settled ones
// (and raising the mark; nil if none is due), and unsettled, the commits
// decided longer than age ago that still wait for a participant's resolve
// (SettleTx), read from the group's pending list (kv.TxPendingIDs: every
// commit not settled, whatever its age), not from the scan, which reads
// only the records below the mark. A commit left unsettled holds no lock —
// a participant still prepared is pushed by its own leader, and the
// push's forget settles it — but it holds its primary slot's hand-over
// (kv.txPendingSlot): settled after age rather than when it comes due for
// collection, a coordinator that died after its decision holds a move for
// seconds, not a minute.
//
// serves (nil: every slot) says whether the group still serves a slot: the
// collect is routed by a decision's primary key, so it names only records
// whose primary slot the group serves — one of a slot moved away since
// (settled: a pending commit keeps its slot, kv.txPendingSlot) would send
// the whole batch to the slot's new owner, which holds none of them. Such
// a record is left where it is (a few bytes; see transactions.md).
func TxDecisionsDue(db *storage.DB, now time.Time, keep, age time.Duration, serves func(slot uint16) bool) (collect *kv.Op, unsettled []kv.TxDecision, err error) {
	mark := now.Add(-keep).UnixMilli()
	var ids [][]byte
	var routing []byte
	var derr error
	err = db.Scan(kv.TxDecisionPrefix, kv.PrefixEnd(kv.TxDecisionPrefix), 0, 0, func(key []byte, v storage.Value) bool {
		txid := bytes.Clone(key[len(kv.TxDecisionPrefix):])
		if kv.TxIDTime(txid) >= mark {
			// The records are in txid order, which is time order
			// (kv.NewTxID): the rest are younger.
			return false
		}
		d, err := kv.DecodeTxDecision(txid, bytes.Clone(v.Data))
		if err != nil {
			derr = err
			return false
		}
		if d.Settled() && (serves == nil || serves(kv.KeySlot(d.Primary))) {
			ids = append(ids, txid)
			if routing == nil {
				routing = d.Primary
			}
		}
		return len(ids) < txCollectBatch
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, nil, err
	}
	pending, err := kv.TxPendingIDs(db.Lookup)
	if err != nil {
		return nil, nil, err
	}
	for _, txid := range pending {
		if len(unsettled) == txSettleBatch {
			break
		}
		d, ok, err := kv.TxDecisionOf(db.Lookup, txid)
		if err != nil {
			return nil, nil, err
		}
		if ok && d.Commit && len(d.Pending) > 0 && now.Sub(time.UnixMilli(d.Decided)) >= age {
			unsettled = append(unsettled, d)
		}
	}
	if len(ids) > 0 && routing != nil {
		op := kv.NewTxCollect(routing, mark, ids)
		collect = &op
	}
	return collect, unsettled, err
}

// SettleTx resolves commit d at every participant it still waits for (a
// resolve is idempotent: one that resolved already answers with nothing
// to do) and tells the primary which did: a coordinator that died after
// its decision, or whose forget was lost, leaves its decision unsettled.
func SettleTx(ctx context.Context, run TxOpRunner, d kv.TxDecision) error {
	resolves := make([]kv.Op, len(d.Pending))
	for i, k := range d.Pending {
		resolves[i] = kv.NewTxResolve(d.TxID, k, true)
	}
	replies, errs := run(ctx, resolves)
	for i, e := range errs {
		if e == nil && replies[i] != "+COMMITTED" {
			errs[i] = fmt.Errorf("settle %x: resolve answered %q", d.TxID, replies[i])
		}
	}
	if done := committedParts(resolves, replies, errs); len(done) > 0 {
		if _, err := runOne(ctx, run, kv.NewTxForget(d.TxID, d.Primary, done)); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// TxStale lists the parts prepared in db (a group's applied state) longer
// than age before now (by their prepare op's clock): the ones its leader
// pushes (RunTxPush; the simulation's sweep).
func TxStale(db *storage.DB, now time.Time, age time.Duration) ([]kv.TxPrepared, error) {
	get := db.Lookup
	ids, err := kv.TxPreparedIDs(get)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	var out []kv.TxPrepared
	for _, id := range ids {
		p, ok, err := kv.TxPreparedOf(get, id)
		if err != nil {
			return out, err
		}
		if !ok || len(p.Locks) == 0 || now.Sub(time.UnixMilli(p.Prepared)) < age {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}
