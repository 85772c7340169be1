package kv

// Early aborts (docs/design/transactions.md, "Early abort at the leader").
//
// An EXEC's watches and a KEFIR.TX commit's checks are validated at apply,
// on every replica, against the state as of op−1; a transaction that fails
// there costs a log entry — replicated and fsynced like a commit — to answer
// an abort. Often the leader could have known: a watched or checked key
// already has, in the committed state it has applied, a record newer than
// the one the transaction saw, and every op it orders comes after that
// state. TxDoomed makes that decision with the validators' own per-key
// functions (watchChanged, txCheckKey) in their sure mode, which answers a
// conflict only when apply must find one.

// TxDoomed reports whether op, a KindExec or KindTxCommit about to be
// proposed, must fail its validation at apply, judging by get, a committed
// state as of op number applied that every op still to be ordered follows
// (a leader's read point); and if so the reply its apply would give: EXEC's
// null array, or the commit's -TXABORT conflict (naming the key and version
// this state shows; apply may name a newer version, or another key it checks
// first). False says nothing: apply decides. An op that apply would refuse
// before validating (it does not decode) is never doomed here.
//
// The answer holds for any clock a retry of the same request carries, and
// for a duplicate of it already ordered but not yet applied (it follows this
// state too): only a duplicate already applied — whose own writes this state
// may show as the conflict — must be excluded, by the caller's client table.
func TxDoomed(get Getter, applied uint64, op *Op) (Result, bool, error) {
	switch op.Kind {
	case KindExec:
		_, watches, err := execParts(op)
		if err != nil {
			return Result{}, false, nil
		}
		if changed, err := watchesChanged(get, nil, applied, op.Now, watches, true); err != nil || !changed {
			return Result{}, false, err
		}
		return Result{Kind: ResReply, Bulk: NullArray}, true, nil
	case KindTxCommit:
		checks, _, origin, err := txCommitParts(op)
		if err != nil {
			return Result{}, false, nil
		}
		conflict, err := txConflict(get, applied, op, origin, checks, true)
		if err != nil || conflict == nil {
			return Result{}, false, err
		}
		return Result{Kind: ResReply, Bulk: respError(conflict.Error())}, true, nil
	}
	return Result{}, false, nil
}

// TxValidated reports whether ops of kind k are validated at apply against
// what their transaction saw (TxDoomed may answer them early).
func TxValidated(k Kind) bool { return k == KindExec || k == KindTxCommit }

// TxCheckedKeys returns the keys op, a KindExec or KindTxCommit, is
// validated on at apply: an EXEC's watched keys, a commit's checked ones
// (nil for any other op, or one that does not decode). A leader holds a
// transaction whose checked key a commit in flight writes until that
// commit is applied, then decides it with TxDoomed (vrshard txwait.go).
func TxCheckedKeys(op *Op) [][]byte {
	var keys [][]byte
	switch op.Kind {
	case KindExec:
		_, watches, err := DecodeTx(op.Value) // the watches need no command table
		if err != nil {
			return nil
		}
		for _, w := range watches {
			keys = append(keys, w.Key)
		}
	case KindTxCommit:
		checks, _, _, err := txCommitParts(op)
		if err != nil {
			return nil
		}
		for _, c := range checks {
			keys = append(keys, c.Key)
		}
	}
	return keys
}
