package kv

import (
	"errors"
	"strings"
	"testing"
)

// expiringK reads a store of one string key, k=5 at version 1, that expires
// at t=1000 ms.
func expiringK(key []byte) ([]byte, []byte, uint64, bool, error) {
	if string(key) == "k" {
		return []byte("5"), EncodeMeta(TypeString, 1000), 1, true, nil
	}
	return nil, nil, 0, false, nil
}

// commitAt2000 applies a commit at t=2000 ms (after expiringK's k expired)
// over get, at version 2, and returns what it answered and the value it
// landed for k ("" if none).
func commitAt2000(get Getter, op *Op) (res Result, landed string, err error) {
	op.Now = 2000
	res, err = Apply(get, 2, op, 0, func(key, value, _ []byte, tomb bool) {
		if string(key) == "k" && !tomb {
			landed = string(value)
		}
	})
	return res, landed, err
}

// ownedK reads a store whose slot table has every slot owned at epoch 3 and
// k=v at version 2.
func ownedK() Getter {
	table := AppendSlotTable(nil, NewSlotTable([]SlotRange{{Start: 0, End: NumSlots - 1}}, 3))
	return func(key []byte) ([]byte, []byte, uint64, bool, error) {
		switch string(key) {
		case string(SlotTableKey):
			return table, nil, 1, true, nil
		case "k":
			return []byte("v"), nil, 2, true, nil
		}
		return nil, nil, 0, false, nil
	}
}

// A key that expires between a transaction's read and its commit kept its
// record, and so its version, but the commit's writes are evaluated at the
// commit's clock, where the key is absent: the transaction read k=5 and its
// INCRBY answered 6, and without the liveness check the commit landed k=1
// and answered success. TxValidate counts a key not live at op.Now as
// version 0: a conflict with the version the transaction saw.
func TestTxCommitOverAKeyThatExpiredInTheWindowAborts(t *testing.T) {
	k := []byte("k")
	get := expiringK
	// In the transaction (t=500): INCRBY k 1 answers 6 over its snapshot.
	var ov TxOverlay
	incr := Op{Kind: KindIncrBy, Key: k, Delta: 1, Now: 500}
	r, err := ov.Apply(get, 2, &incr, 0)
	if err != nil || r.Int != 6 {
		t.Fatalf("INCRBY in the transaction: %+v %v", r, err)
	}
	// COMMIT, applied at t=2000: k expired in the window.
	op, err := NewTxCommit(1, TxSerializable, TxOrigin{}, []TxCheck{{Key: k, Version: 1}}, []Op{{Kind: KindIncrBy, Key: k, Delta: 1}})
	if err != nil {
		t.Fatal(err)
	}
	res, landed, err := commitAt2000(get, &op)
	if err != nil {
		t.Fatal(err)
	}
	if reply := string(res.Bulk); !strings.HasPrefix(reply, "-TXABORT") && landed != "6" {
		t.Fatalf("commit answered %q and landed k=%q; the transaction read k=5 and computed 6 (want -TXABORT, or 6)", strings.TrimSpace(reply), landed)
	}
}

// A key that had already expired when the transaction read it (noted as
// version 0, absent) and is still expired at the commit is no conflict: the
// transaction computed from absent, and the commit evaluates at absent.
func TestTxCommitOverAKeyExpiredBeforeItsReadCommits(t *testing.T) {
	get := expiringK
	for _, iso := range []Cond{TxSI, TxSerializable} {
		op, err := NewTxCommit(1, iso, TxOrigin{}, []TxCheck{{Key: []byte("k"), Version: 0}}, []Op{{Kind: KindIncrBy, Key: []byte("k"), Delta: 1}})
		if err != nil {
			t.Fatal(err)
		}
		res, landed, err := commitAt2000(get, &op)
		if err != nil || string(res.Bulk) != ":2\r\n" || landed != "1" {
			t.Fatalf("isolation %d: commit answered %q (%v), landed k=%q; want :2 and k=1", iso, res.Bulk, err, landed)
		}
	}
}

// A commit carries the origin of its versions (TxOrigin): a commit without
// the section or with a malformed one is a decoder error, and a key whose slot has
// another origin at the commit is a conflict that says so.
func TestTxCommitOrigin(t *testing.T) {
	get := ownedK()
	checks := []TxCheck{{Key: []byte("k"), Version: 2}}
	writes := []Op{{Kind: KindSet, Key: []byte("k"), Value: []byte("w")}}
	for _, c := range []struct {
		origin TxOrigin
		reply  string
	}{
		{TxOrigin{Epoch: 3, State: SlotOwned}, ":5\r\n"},
		{TxOrigin{Epoch: 2, State: SlotOwned}, "-TXABORT conflict on key 'k': its slot moved (epoch 2 owned at the start, epoch 3 owned here)"},
		{TxOrigin{}, "-TXABORT conflict on key 'k': its slot moved (epoch 0"},
	} {
		op, err := NewTxCommit(1, TxSI, c.origin, checks, writes)
		if err != nil {
			t.Fatal(err)
		}
		_, _, o, err := decodeTxCommit(&op)
		if err != nil || o == nil || *o != c.origin {
			t.Fatalf("origin %+v decoded as %+v %v", c.origin, o, err)
		}
		res, err := Apply(get, 5, &op, 0, func(_, _, _ []byte, _ bool) {})
		if err != nil || !strings.HasPrefix(string(res.Bulk), c.reply) {
			t.Errorf("origin %+v: reply %q %v, want %q", c.origin, res.Bulk, err, c.reply)
		}
	}
	// A commit without its origin section (cut short after its checks) is
	// corrupt: every commit carries one.
	op, _ := NewTxCommit(1, TxSI, TxOrigin{}, checks, writes)
	old := op
	old.Value = op.Value[:len(op.Value)-3]
	if _, _, _, err := decodeTxCommit(&old); err == nil {
		t.Fatal("a commit without its origin decoded")
	}
	for _, tail := range [][]byte{{9, 3, 0}, {txOriginTag, 3}, {txOriginTag, 3, 0, 0}, {txOriginTag, 3, 200}} {
		bad := old
		bad.Value = append(append([]byte(nil), old.Value...), tail...)
		if _, _, err := DecodeTxCommit(&bad); err == nil {
			t.Errorf("origin section %v decoded", tail)
		}
	}
}

// A WATCH observation ends with its origin, which checkObservation requires
// (no release logged an EXEC without it).
func TestWatchObservationOrigin(t *testing.T) {
	get := ownedK()
	seen, err := Observe(get, nil, []byte("k"), 0)
	if err != nil || string(seen) != "\x03\x02\x03\x01" || observedVersion(seen) != 2 {
		t.Fatalf("observation %q %v", seen, err)
	}
	if seen, _ := Observe(get, nil, []byte("absent"), 0); string(seen) != "\x02\x03\x01" || observedVersion(seen) != 0 {
		t.Fatalf("observation of an absent key %q", seen)
	}
	for _, ok := range []string{"\x03\x02\x03\x01", "\x02\x03\x01"} {
		if err := checkObservation([]byte(ok)); err != nil {
			t.Fatalf("%q refused: %v", ok, err)
		}
	}
	if err := checkObservation([]byte("\x01\x02")); !errors.Is(err, ErrTxWatchFormat) {
		t.Fatalf("an observation without its origin: %v", err)
	}
	// The layout's test (observedOrigin): an origin cut short, or bytes after it.
	for _, bad := range []string{"\x03\x02\x03", "\x03\x02\x03\x01\x00", "\x02"} {
		if err := checkObservation([]byte(bad)); !errors.Is(err, ErrTxWatchFormat) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if o, ok := observedOrigin([]byte("\x03\x02\x03\x01")); !ok || o != (TxOrigin{Epoch: 3, State: 1}) {
		t.Fatalf("origin %+v %v", o, ok)
	}
}
