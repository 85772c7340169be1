package vrshard

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/vfs"
)

// txFreeBatches runs, through one applier, a batch that writes a key, then
// prepares a cross-group transaction locking it, then writes it again; and
// a second batch that writes it, aborts the transaction at its primary (this
// group) and writes it once more. It answers what the applier published
// (txLocked) at open and after each batch, and the errors of the three
// writes of the key after the prepare.
func txFreeBatches(t *testing.T, stale bool) (published [3]bool, afterPrepare, nextBatch, afterAbort error) {
	t.Helper()
	db := openMemEngine(t, vfs.NewMem())
	a := newApplier(db)
	a.txFreeStale = stale
	if err := a.loadRows(); err != nil { // as at open
		t.Fatal(err)
	}
	published[0] = a.txLocked.Load()
	v := db.LastVersion()
	apply := func(op kv.Op) error {
		t.Helper()
		v++
		_, opErr, err := a.applyOp(&op, v, 1, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return opErr
	}
	set := kv.Op{Kind: kv.KindSet, Key: []byte("{a}x"), Value: []byte("1")}
	prep, err := kv.NewTxPrepare([]byte("t1"), []byte("{a}x"), 0, kv.TxOrigin{}, []kv.TxCheck{{Key: []byte("{a}x"), Version: 0}}, []kv.Op{{Kind: kv.KindSet, Key: []byte("{a}x"), Value: []byte("tx")}})
	if err != nil {
		t.Fatal(err)
	}
	a.begin()
	if err := apply(kv.Op{Kind: kv.KindSet, Key: []byte("{a}other"), Value: []byte("1")}); err != nil {
		t.Fatal(err) // nothing locked: found by one lookup, kept for the batch
	}
	if err := apply(prep); err != nil {
		t.Fatal(err)
	}
	afterPrepare = apply(set)
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	published[1] = a.txLocked.Load()
	a.begin()
	nextBatch = apply(set)
	if err := apply(kv.NewTxDecide([]byte("t1"), []byte("{a}x"), false)); err != nil {
		t.Fatal(err)
	}
	afterAbort = apply(set)
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	published[2] = a.txLocked.Load()
	return published, afterPrepare, nextBatch, afterAbort
}

// TestApplierTxFreeKeptInTheBatch: the applier's in-memory "nothing is
// locked" (applier.txFree, which spares every write the count record's
// lookup) never lets a write of a locked key through — in the batch of the
// prepare and in the next — and is found again once the lock is gone; what
// it publishes for the leader's reads and writes (txLocked,
// Replica.TxLockFree) is false at open, true after the prepare's batch,
// false after the abort's.
func TestApplierTxFreeKeptInTheBatch(t *testing.T) {
	published, afterPrepare, nextBatch, afterAbort := txFreeBatches(t, false)
	if published != [3]bool{false, true, false} {
		t.Errorf("published locked: %v at open, after the prepare, after the abort; want false true false", published)
	}
	if !errors.Is(afterPrepare, kv.ErrTxLocked) || !errors.Is(nextBatch, kv.ErrTxLocked) {
		t.Fatalf("writes of a locked key: %v (the prepare's batch), %v (the next); want ErrTxLocked", afterPrepare, nextBatch)
	}
	if afterAbort != nil {
		t.Fatalf("write after the abort: %v", afterAbort)
	}
}

// TestApplierTxFreeStaleCaught: with the mutation (a two-phase op leaves
// the cache set) the write in the prepare's batch applies.
func TestApplierTxFreeStaleCaught(t *testing.T) {
	mutation.Require(t)
	_, afterPrepare, nextBatch, _ := txFreeBatches(t, true)
	if afterPrepare != nil {
		t.Fatalf("txFreeStale not caught: %v", afterPrepare)
	}
	t.Logf("txFreeStale caught: the write after the prepare in its batch applied (the next batch's answered %v)", nextBatch)
}
