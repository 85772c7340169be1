package kv

import (
	"strings"
	"testing"
)

// REVIEW (finding 5): a key that expires between a transaction's start and
// its commit passes validation (its record, and so its version, did not
// change), but the commit's writes are evaluated at the commit's clock,
// where the key is absent. The transaction read k=5 and its INCRBY answered
// 6; the commit lands k=1 and answers success: the committed write is not
// the one the transaction computed (under SERIALIZABLE too), and the value
// it read was not the value at the commit.
func TestReviewTxCommitOverAKeyThatExpiredInTheWindow(t *testing.T) {
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
