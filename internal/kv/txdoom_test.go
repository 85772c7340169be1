package kv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// doomFn is a leader's early check (TxDoomed, or a broken one).
type doomFn func(get Getter, applied uint64, op *Op) (Result, bool, error)

// doomHistory is a random history of writes of three keys, one op per
// version, op v at clock v*1000 ms: SETs (some with an expiry a few ops
// later), DELs, SETRANGEs outside a transaction, and ranged commits of one
// bit from a start up to three ops back (some abort), which leave the access
// records ranged checks walk.
func doomHistory(t *testing.T, rng *rand.Rand, n int) *mvStore {
	s := newMV()
	keys := []string{"a", "b", "c"}
	for s.last < uint64(n) {
		k := keys[rng.IntN(len(keys))]
		now := int64(s.last+1) * 1000
		var op Op
		switch r := rng.IntN(100); {
		case r < 25:
			op = set(k, fmt.Sprint(rng.IntN(100)))
		case r < 35:
			op = set(k, "e")
			op.ExpireAt = now + int64(1+rng.IntN(4))*1000
		case r < 45:
			op = Op{Kind: KindDel, Keys: [][]byte{[]byte(k)}}
		case r < 55:
			op = Op{Kind: KindSetRange, Key: []byte(k), Delta: int64(rng.IntN(2)), Value: []byte{byte(rng.IntN(256))}}
		default:
			start := s.last - min(s.last, uint64(rng.IntN(4)))
			off := int64(rng.IntN(16))
			c := TxCheck{Key: []byte(k), Version: seenAt(s, start, k), Ranges: oneBit(uint64(off))}
			if rng.IntN(5) == 0 {
				c.Ranges = nil
			}
			var err error
			op, err = NewTxCommit(start, TxSI, TxOrigin{}, []TxCheck{c}, []Op{setBit(k, off, byte('0'+rng.IntN(2)))})
			if err != nil {
				t.Fatal(err)
			}
		}
		op.Now = now
		s.apply(t, op)
	}
	return s
}

// seenAt is the version a transaction that started at start notes for k: 0
// if k is not live at the start's clock (server's itxn.get).
func seenAt(s *mvStore, start uint64, k string) uint64 {
	_, meta, v, ok, _ := s.at(start)([]byte(k))
	if !ok || Expired(meta, int64(start)*1000) {
		return 0
	}
	return v
}

// doomProperty runs random transactions against random histories and
// returns the first time doom said a transaction must abort and validation
// at apply — against any later state, at any clock — committed it; and how
// many it doomed. With the same state and clock, and the same key named, the
// two replies must be the same bytes.
func doomProperty(t *testing.T, doom doomFn, histories, trials int) (violation string, doomed int) {
	noRows := func(start, end []byte) (uint64, error) { return 0, fmt.Errorf("no hashes here") }
	keys := []string{"a", "b", "c"}
	for h := 0; h < histories; h++ {
		rng := rand.New(rand.NewPCG(uint64(h), 29))
		const n = 40
		s := doomHistory(t, rng, n)
		for i := 0; i < trials; i++ {
			start := uint64(rng.IntN(n + 1))
			applied := uint64(rng.IntN(n + 1))
			at := applied + uint64(rng.IntN(n+1-int(applied)))
			now1 := int64(rng.IntN((n + 6) * 1000))
			now2 := now1
			if rng.IntN(2) == 0 {
				now2 = int64(rng.IntN((n + 6) * 1000)) // a retry's clock
			}
			var checks []TxCheck
			var writes []Op
			for _, k := range keys {
				if rng.IntN(2) == 0 {
					continue
				}
				c := TxCheck{Key: []byte(k), Version: seenAt(s, start, k)}
				switch rng.IntN(3) {
				case 0:
					c.Ranges = oneBit(uint64(rng.IntN(16)))
				case 1:
					c.Ranges = []TxRange{{uint64(rng.IntN(8)), uint64(8 + rng.IntN(8))}, TxLength}
				}
				checks = append(checks, c)
				if rng.IntN(2) == 0 {
					writes = append(writes, setBit(k, int64(rng.IntN(16)), '1'))
				} else {
					writes = append(writes, set(k, "w"))
				}
			}
			op, err := NewTxCommit(start, TxSerializable, TxOrigin{}, checks, writes)
			if err != nil {
				t.Fatal(err)
			}
			// EXEC's watches: the same keys, as WATCH saw them at the start.
			for _, c := range checks {
				seen, err := Observe(s.at(start), noRows, c.Key, int64(start)*1000)
				if err != nil {
					t.Fatal(err)
				}
				w := Watch{Key: c.Key, Seen: seen}
				sure, err := watchChanged(s.at(applied), nil, applied, now1, w, true)
				if err != nil {
					t.Fatal(err)
				}
				changed, err := watchChanged(s.at(at), noRows, at+1, now2, w, false)
				if err != nil {
					t.Fatal(err)
				}
				if sure {
					doomed++
				}
				if sure && !changed {
					return fmt.Sprintf("watch of %s seen %x at %d: sure it changed at %d, unchanged at %d", c.Key, seen, start, applied, at+1), doomed
				}
			}
			early := op
			early.Now = now1
			res, sure, err := doom(s.at(applied), applied, &early)
			if err != nil {
				t.Fatal(err)
			}
			if !sure {
				continue
			}
			doomed++
			late := op
			late.Now = now2
			got, err := Apply(s.at(at), at+1, &late, 0, func(_, _, _ []byte, _ bool) {})
			if err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("history %d, start %d, checks %v, doomed at %d (clock %d): %q; apply at %d (clock %d): %q",
				h, start, checks, applied, now1, res.Bulk, at+1, now2, got.Bulk)
			if !bytes.HasPrefix(got.Bulk, []byte("-TXABORT")) {
				return what, doomed
			}
			if at == applied && now1 == now2 && conflictKey(got.Bulk) == conflictKey(res.Bulk) && !bytes.Equal(got.Bulk, res.Bulk) {
				return "different replies: " + what, doomed
			}
		}
	}
	return "", doomed
}

func conflictKey(reply []byte) string {
	s, _, _ := strings.Cut(string(reply), ":")
	return s
}

// TestTxDoomedImpliesAbortAtApply: whenever the leader's early check
// answers an abort, validation at apply aborts too, against any state at or
// after the leader's and at any clock (a retry's), for whole and ranged
// checks, keys that expire, are deleted and recreated; and EXEC's watches
// alike.
func TestTxDoomedImpliesAbortAtApply(t *testing.T) {
	v, doomed := doomProperty(t, TxDoomed, 150, 300)
	if v != "" {
		t.Fatal(v)
	}
	if doomed < 1000 {
		t.Fatalf("only %d transactions doomed: the test is too weak", doomed)
	}
	t.Logf("%d transactions doomed, every one aborted at apply", doomed)
}

// TestTxDoomedPropertyCatchesBrokenChecks shows the property catches early
// checks that abort what validation would commit: one that ignores ranges,
// one that counts a key still at the version the transaction saw as
// written after it, and the naive one — the validator itself run on the
// leader's state, which aborts a key absent at the start that was created
// (and is deleted again before apply), or one expired at the leader's clock
// but not at a retry's.
func TestTxDoomedPropertyCatchesBrokenChecks(t *testing.T) {
	rewrite := func(f func(c *TxCheck)) doomFn {
		return func(get Getter, applied uint64, op *Op) (Result, bool, error) {
			checks, writes, err := DecodeTxCommit(op)
			if err != nil {
				return Result{}, false, err
			}
			for i := range checks {
				f(&checks[i])
			}
			o, err := NewTxCommit(uint64(op.Delta), op.Cond, TxOrigin{}, checks, writes)
			o.Now = op.Now
			if err != nil {
				return Result{}, false, err
			}
			return TxDoomed(get, applied, &o)
		}
	}
	for name, doom := range map[string]doomFn{
		"key grain": rewrite(func(c *TxCheck) { c.Ranges = nil }),
		"equal version": rewrite(func(c *TxCheck) {
			if c.Version > 1 {
				c.Version--
			}
		}),
		"naive": func(get Getter, applied uint64, op *Op) (Result, bool, error) {
			checks, _, origin, err := txCommitParts(op)
			if err != nil {
				return Result{}, false, err
			}
			if err := TxValidate(get, applied+1, op, origin, checks); err != nil {
				return Result{Kind: ResReply, Bulk: respError(err.Error())}, true, nil
			}
			return Result{}, false, nil
		},
	} {
		v, _ := doomProperty(t, doom, 150, 300)
		if v == "" {
			t.Errorf("%s: the property missed it", name)
			continue
		}
		t.Logf("%s: caught: %s", name, v)
	}
}

// TxCheckedKeys names what apply validates: an EXEC's watched keys (not the
// keys its commands write), a commit's checked keys (not its blind writes).
func TestTxCheckedKeys(t *testing.T) {
	cmds := [][][]byte{{[]byte("SET"), []byte("w"), []byte("1")}}
	absent := func(key []byte) ([]byte, []byte, uint64, bool, error) { return nil, nil, 0, false, nil }
	noRows := func(start, end []byte) (uint64, error) { return 0, fmt.Errorf("no hashes here") }
	var watches []Watch
	for _, k := range []string{"a", "b"} {
		seen, err := Observe(absent, noRows, []byte(k), 0)
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, Watch{Key: []byte(k), Seen: seen})
	}
	exec := Op{Kind: KindExec, Value: EncodeTx(nil, cmds, watches), Keys: [][]byte{[]byte("w"), []byte("a"), []byte("b")}, Delta: 3}
	commit, err := NewTxCommit(5, TxSerializable, TxOrigin{}, []TxCheck{{Key: []byte("r"), Version: 3}, {Key: []byte("x"), Version: 4}},
		[]Op{{Kind: KindSet, Key: []byte("x"), Value: []byte("1")}, {Kind: KindSet, Key: []byte("blind"), Value: []byte("2")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op   Op
		want string
	}{
		{exec, "[a b]"},
		{commit, "[r x]"},
		{Op{Kind: KindSet, Key: []byte("k")}, "[]"},
		{Op{Kind: KindTxCommit, Value: []byte("junk")}, "[]"},
	} {
		var got []string
		for _, k := range TxCheckedKeys(&tc.op) {
			got = append(got, string(k))
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("%v: checked keys %v, want %s", tc.op.Kind, got, tc.want)
		}
	}
}
