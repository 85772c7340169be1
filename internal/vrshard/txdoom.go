package vrshard

import (
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// Early aborts at the leader (docs/design/transactions.md, "Early abort at
// the leader"). An EXEC whose watched key, or a KEFIR.TX commit whose checked
// key, already has a newer record in the committed state the leader has
// applied must fail its validation at apply: every op the leader orders
// follows that state. newBatch answers it at once with the reply apply would
// give (kv.TxDoomed), with no log entry, no replication and no fsync.
//
//   - The state is the engine as of min(readable, applied): applied ops up to
//     the readable index R are in the log of every later leader (cad.md), so
//     the op, ordered here or by a later leader, follows them. Past R an
//     applied op may still be lost with its cad write.
//   - A retried request whose first attempt was applied would see its own
//     writes as the conflict: if the client's row in the engine (read after
//     the read point was taken, so at least as new) holds this request or a
//     later one, the request is proposed as before and the core answers it
//     from its client table. A first attempt ordered but not yet applied
//     follows the read point, so it aborts at apply too: kv.TxDoomed's answer
//     depends on no clock, and the retry carries the same checks.
//   - The slot fence as of the read point must pass (a write of a slot not
//     served here is answered -MOVED at apply, not aborted).

// txDoomed reports whether op (stamped with its clock) must fail validation
// at apply, and the reply apply would give; id is its request id. newBatch
// calls it only for the kinds kv.TxValidated names (kv.TxDoomed answers
// false for any other).
func (r *Replica) txDoomed(op *kv.Op, id shard.ReqID) (kv.Result, bool) {
	if mutation.On && r.mut.noEarlyAbort {
		return kv.Result{}, false
	}
	at := min(r.readable.Load(), r.applied.Load())
	if at == 0 {
		return kv.Result{}, false
	}
	get := shard.TxSnapAt(r.db, at).Get // an error (a version gone): no decision
	enc, _, _, _, err := get(kv.SlotTableKey)
	if err != nil || kv.CheckSlotTable(enc, op) != nil {
		return kv.Result{}, false
	}
	check := op
	if mutation.On && (r.mut.doomKeyGrain || r.mut.doomOnEqual) {
		check = r.doomMutated(op)
	}
	res, doomed, err := kv.TxDoomed(get, at, check)
	if err != nil || !doomed {
		return kv.Result{}, false
	}
	if !id.IsZero() {
		if e, found, err := clientRow(r.db, id.Client); err != nil || found && e.ReqNum >= id.Seq {
			return kv.Result{}, false // applied (or stale): the core answers
		}
	}
	r.st.earlyAborts.Add(1)
	return res, true
}

// EarlyAborts is how many transactions this replica answered as aborted
// without proposing them (txDoomed).
func (r *Replica) EarlyAborts() uint64 { return r.st.earlyAborts.Load() }

// doomMutated is the op the early check sees under the mutations
// doomKeyGrain (a commit's checks without their ranges) and doomOnEqual
// (every check's version one lower: a key still at the version the
// transaction read counts as written after it).
func (r *Replica) doomMutated(op *kv.Op) *kv.Op {
	if op.Kind != kv.KindTxCommit {
		return op
	}
	return recommitted(op, func(checks []kv.TxCheck) []kv.TxCheck {
		for i := range checks {
			if mutation.On && r.mut.doomKeyGrain {
				checks[i].Ranges = nil
			}
			if mutation.On && r.mut.doomOnEqual && checks[i].Version > 1 {
				checks[i].Version--
			}
		}
		return checks
	})
}
