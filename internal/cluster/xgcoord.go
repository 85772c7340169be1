package cluster

import (
	"context"
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
// outcome is unknown.
func TwoPhase(ctx context.Context, run TxOpRunner, txid, primaryKey []byte, keys [][]byte, prepares []kv.Op) (committed bool, abort string, err error) {
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
		if decision, err = runOne(ctx, run, kv.NewTxDecide(txid, primaryKey, commit)); err == nil {
			break
		}
	}
	if err != nil {
		// The primary may have recorded it or not: the participants'
		// leaders will learn which from it (the push).
		return false, "", fmt.Errorf("cross-group commit: the decision's outcome is unknown: %w", err)
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
		_, _ = run(ctx, resolves) // failed: pushed by its leader
	}
	if committed {
		return true, "", nil
	}
	if abort == "" {
		abort = "TXABORT the transaction was aborted before its commit (a participant's leader pushed it)"
	}
	return false, abort, nil
}

// runOne runs one op.
func runOne(ctx context.Context, run TxOpRunner, op kv.Op) (string, error) {
	replies, errs := run(ctx, []kv.Op{op})
	return replies[0], errs[0]
}

// PushTx decides and resolves prepared part p (key: a key of its slot)
// from outside its coordinator: abort decided at its primary — the first
// decision wins, so a coordinator that got there first is answered — then
// the part resolved with the primary's answer.
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
	if d != "+COMMITTED" && d != "+ABORTED" {
		return fmt.Errorf("push of %x: decide answered %q", p.TxID, d)
	}
	if Slot(key) == Slot(p.Primary) {
		return nil // the primary's part resolved with its decision
	}
	_, err = runOne(ctx, run, kv.NewTxResolve(p.TxID, key, d == "+COMMITTED"))
	return err
}

// TxStale lists the parts prepared in db (a group's applied state) longer
// than age before now (by their prepare op's clock): the ones its leader
// pushes (RunTxPush; the simulation's sweep).
func TxStale(db *storage.DB, now time.Time, age time.Duration) ([]kv.TxPrepared, error) {
	get := engineGetter(db)
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
