package kv

import (
	"bytes"
	"testing"
)

// TestTxDoomedLeavesAnExpiredRangedRecordToApply: a ranged check of a record
// with an expiry depends on the clock, and a retry's clock (the early check's)
// is not its first attempt's (apply's). Here the record has expired at the
// retry's clock but not at the first attempt's, where the walk finds no
// overlap and the commit goes through: the early check must not abort it.
// (Found in review: the expiry guard read the meta, which lookup drops once
// the record has expired.)
func TestTxDoomedLeavesAnExpiredRangedRecordToApply(t *testing.T) {
	s := newMV()
	const expiry = 10_000
	set := Op{Kind: KindSet, Key: []byte("k"), Value: []byte{0, 0}, ExpireAt: expiry, Now: 1000}
	s.apply(t, set) // v1, expiring
	// v2: a transaction from start 1 sets bit 15 (the TTL kept).
	c2 := TxCheck{Key: []byte("k"), Version: 1, Ranges: oneBit(15)}
	op2, err := NewTxCommit(1, TxSI, TxOrigin{}, []TxCheck{c2}, []Op{setBit("k", 15, '1')})
	if err != nil {
		t.Fatal(err)
	}
	op2.Now = 2000
	s.apply(t, op2)
	// T: started at 1, sets bit 0.
	c := TxCheck{Key: []byte("k"), Version: 1, Ranges: oneBit(0)}
	op, err := NewTxCommit(1, TxSI, TxOrigin{}, []TxCheck{c}, []Op{setBit("k", 0, '1')})
	if err != nil {
		t.Fatal(err)
	}
	first := op
	first.Now = 5000 // before the expiry
	got, err := Apply(s.at(2), 3, &first, 0, func(_, _, _ []byte, _ bool) {})
	if err != nil || bytes.HasPrefix(got.Bulk, []byte("-TXABORT")) {
		t.Fatalf("the first attempt at apply: %+v, %v; want a commit", got, err)
	}
	retry := op
	retry.Now = expiry + 1000 // the retry's clock, past the expiry
	if res, doomed, err := TxDoomed(s.at(2), 2, &retry); err != nil || doomed {
		t.Fatalf("early check of the retry: doomed %v (%q), %v; want it left to apply", doomed, res.Bulk, err)
	}
}
