package kv

import (
	"strings"
	"testing"
)

// A key that expires between a transaction's read and its commit kept its
// record, and so its version, but the commit's writes are evaluated at the
// commit's clock, where the key is absent: the transaction read k=5 and its
// INCRBY answered 6, and without the liveness check the commit landed k=1
// and answered success. TxValidate counts a key not live at op.Now as
// version 0: a conflict with the version the transaction saw.
func TestTxCommitOverAKeyThatExpiredInTheWindowAborts(t *testing.T) {
	k := []byte("k")
	meta := EncodeMeta(TypeString, 1000) // expires at t=1000 ms
	get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if string(key) == "k" {
			return []byte("5"), meta, 1, true, nil
		}
		return nil, nil, 0, false, nil
	}
	// In the transaction (t=500): INCRBY k 1 answers 6 over its snapshot.
	var ov TxOverlay
	incr := Op{Kind: KindIncrBy, Key: k, Delta: 1, Now: 500}
	r, err := ov.Apply(get, 2, &incr, 0)
	if err != nil || r.Int != 6 {
		t.Fatalf("INCRBY in the transaction: %+v %v", r, err)
	}
	// COMMIT, applied at t=2000: k expired in the window.
	op, err := NewTxCommit(1, TxSerializable, []TxCheck{{Key: k, Version: 1}}, []Op{{Kind: KindIncrBy, Key: k, Delta: 1}})
	if err != nil {
		t.Fatal(err)
	}
	op.Now = 2000
	var landed string
	res, err := Apply(get, 2, &op, 0, func(key, value, _ []byte, tomb bool) {
		if string(key) == "k" && !tomb {
			landed = string(value)
		}
	})
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
	meta := EncodeMeta(TypeString, 1000)
	get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if string(key) == "k" {
			return []byte("5"), meta, 1, true, nil
		}
		return nil, nil, 0, false, nil
	}
	for _, iso := range []Cond{TxSI, TxSerializable} {
		op, err := NewTxCommit(1, iso, []TxCheck{{Key: []byte("k"), Version: 0}}, []Op{{Kind: KindIncrBy, Key: []byte("k"), Delta: 1}})
		if err != nil {
			t.Fatal(err)
		}
		op.Now = 2000
		var landed string
		res, err := Apply(get, 2, &op, 0, func(key, value, _ []byte, tomb bool) {
			if string(key) == "k" && !tomb {
				landed = string(value)
			}
		})
		if err != nil || string(res.Bulk) != ":2\r\n" || landed != "1" {
			t.Fatalf("isolation %d: commit answered %q (%v), landed k=%q; want :2 and k=1", iso, res.Bulk, err, landed)
		}
	}
}
