package kv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func oneBit(off uint64) []TxRange { return []TxRange{{off, off + 1}} }

// commitRanged commits x as the front door does when it kept ranges:
// ranges[k] (nil: the whole key) for every checked key.
func (x *txn) commitRanged(t testing.TB, ranges map[string][]TxRange) string {
	t.Helper()
	written := map[string]bool{}
	var checks []TxCheck
	for _, w := range x.writes {
		k := string(w.RoutingKey())
		if written[k] {
			continue
		}
		written[k] = true
		if _, ok := x.seen[k]; !ok {
			_, _, _, _, _ = x.snap()(w.RoutingKey())
		}
		checks = append(checks, TxCheck{Key: []byte(k), Version: x.seen[k], Ranges: ranges[k]})
	}
	if x.iso == TxSerializable {
		for k, v := range x.seen {
			if !written[k] {
				checks = append(checks, TxCheck{Key: []byte(k), Version: v, Ranges: ranges[k]})
			}
		}
	}
	op, err := NewTxCommit(x.start, x.iso, TxOrigin{}, checks, x.writes)
	if err != nil {
		t.Fatal(err)
	}
	op, err = DecodeOp(AppendOp(nil, &op))
	if err != nil {
		t.Fatal(err)
	}
	v := x.s.last + 1
	res, err := Apply(x.s.at(x.s.last), v, &op, 0, func(key, value, meta []byte, tomb bool) {
		x.s.vers[string(key)] = append(x.s.vers[string(key)], mvRec{v, append([]byte(nil), value...), tomb, bytes.Clone(meta)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Kind != ResReply {
		t.Fatalf("commit result kind %v", res.Kind)
	}
	x.s.last = v
	return strings.TrimSpace(string(res.Bulk))
}

func (x *txn) writeTB(t testing.TB, op Op) {
	if _, err := x.ov.Apply(x.snap(), x.start+1, &op, 0); err != nil {
		t.Fatal(err)
	}
	x.writes = append(x.writes, op)
}

func setBit(k string, off int64, bit byte) Op {
	return Op{Kind: KindSetBit, Key: []byte(k), Delta: off, Value: []byte{bit}}
}

// Digest 001 IA-0 (2): two transactions that flip different bits of one key
// concurrently both commit and the value holds both bits; the same bit → the
// second aborts. Under SI and SERIALIZABLE (whose GETBIT reads are ranged
// too), for a key that exists and one that the two create.
func TestTxDifferentBitsBothCommit(t *testing.T) {
	for _, iso := range []Cond{TxSI, TxSerializable} {
		for _, exists := range []bool{true, false} {
			for _, same := range []bool{false, true} {
				name := fmt.Sprintf("iso=%d exists=%v same=%v", iso, exists, same)
				s := newMV()
				if exists {
					s.set(t, "k", "\x00\x00")
				}
				t1, t2 := s.begin(iso), s.begin(iso)
				b1, b2 := uint64(3), uint64(12)
				if same {
					b2 = b1
				}
				for _, c := range []struct {
					x *txn
					b uint64
				}{{t1, b1}, {t2, b2}} {
					// A read of the bit first (GETBIT: the snapshot, ranged).
					if _, _, _, _, err := c.x.snap()([]byte("k")); err != nil {
						t.Fatal(err)
					}
					c.x.write(t, setBit("k", int64(c.b), '1'))
				}
				r1 := t1.commitRanged(t, map[string][]TxRange{"k": oneBit(b1)})
				r2 := t2.commitRanged(t, map[string][]TxRange{"k": oneBit(b2)})
				if !committed(r1) {
					t.Fatalf("%s: first %q", name, r1)
				}
				if committed(r2) == same {
					t.Fatalf("%s: second %q", name, r2)
				}
				v := []byte(s.get("k"))
				if GetBit(v, int64(b1)) != 1 || (!same && GetBit(v, int64(b2)) != 1) {
					t.Fatalf("%s: value %x lacks a bit", name, v)
				}
			}
		}
	}
}

// A whole-key write in the window (a SET outside any transaction, which
// writes no access entry) conflicts with every range.
func TestTxWholeKeyWriteConflictsWithRanges(t *testing.T) {
	for _, iso := range []Cond{TxSI, TxSerializable} {
		s := newMV()
		s.set(t, "k", "\x00\x00")
		t1 := s.begin(iso)
		t1.write(t, setBit("k", 3, '1'))
		s.set(t, "k", "\xff\x00")
		if r := t1.commitRanged(t, map[string][]TxRange{"k": oneBit(3)}); committed(r) {
			t.Fatalf("iso %d: committed over a whole-key write: %s", iso, r)
		}
		// And a transaction's whole-key SET (no entry either).
		t2, t3 := s.begin(iso), s.begin(iso)
		t2.write(t, set("k", "x"))
		t3.write(t, setBit("k", 9, '1'))
		if r := t2.commitRanged(t, nil); !committed(r) {
			t.Fatal(r)
		}
		if r := t3.commitRanged(t, map[string][]TxRange{"k": oneBit(9)}); committed(r) {
			t.Fatalf("iso %d: committed over a transaction's SET: %s", iso, r)
		}
	}
}

// A SERIALIZABLE GETRANGE past the value's end reads its length there: a
// SETRANGE elsewhere that grows the value into the read range conflicts.
func TestTxGrowingWriteConflictsWithReadPastEnd(t *testing.T) {
	s := newMV()
	s.set(t, "k", "abcde")
	t1, t2 := s.begin(TxSerializable), s.begin(TxSerializable)
	_, _, _, _, _ = t1.snap()([]byte("k"))
	t1.write(t, set("other", "1"))
	t2.write(t, Op{Kind: KindSetRange, Key: []byte("k"), Delta: 20, Value: []byte("z")})
	if r := t2.commitRanged(t, map[string][]TxRange{"k": {{160, 168}}}); !committed(r) {
		t.Fatal(r)
	}
	// t1 read bytes 0..9 (GETRANGE k 0 9): bytes 5..9 were padded by t2.
	if r := t1.commitRanged(t, map[string][]TxRange{"k": {{0, 80}}}); committed(r) {
		t.Fatalf("read past the end not invalidated: %s", r)
	}
}

// The window's ranges are kept for txAccessKeep commits: a transaction
// further back falls back to the key-grain decision (abort), identically.
func TestTxAccessRecordRetention(t *testing.T) {
	s := newMV()
	s.set(t, "k", string(make([]byte, 64)))
	old := s.begin(TxSI)
	old.write(t, setBit("k", 500, '1'))
	recent := (*txn)(nil)
	for i := 0; i <= txAccessKeep; i++ {
		if i == 1 {
			recent = s.begin(TxSI)
			recent.write(t, setBit("k", 501, '1'))
		}
		x := s.begin(TxSI)
		x.write(t, setBit("k", int64(i), '1'))
		if r := x.commitRanged(t, map[string][]TxRange{"k": oneBit(uint64(i))}); !committed(r) {
			t.Fatalf("flip %d: %s", i, r)
		}
	}
	if r := recent.commitRanged(t, map[string][]TxRange{"k": oneBit(501)}); !committed(r) {
		t.Fatalf("a start within the record aborted: %s", r)
	}
	if r := old.commitRanged(t, map[string][]TxRange{"k": oneBit(500)}); !strings.HasPrefix(r, "-TXABORT") {
		t.Fatalf("a start older than the record committed: %s", r)
	}
	row, _, _, _, _ := s.at(s.last)(accessRowKey([]byte("k")))
	if n := len(decodeAccess(row)); n != txAccessKeep {
		t.Fatalf("record of %d entries", n)
	}
}

// A crash replay of a ranged commit whose row and key record survived
// rewrites the row as it was and decides the same.
func TestTxRangedReplay(t *testing.T) {
	s := newMV()
	s.set(t, "k", "\x00\x00")
	t1, t2 := s.begin(TxSI), s.begin(TxSI)
	t1.write(t, setBit("k", 1, '1'))
	t2.write(t, setBit("k", 9, '1'))
	if r := t1.commitRanged(t, map[string][]TxRange{"k": oneBit(1)}); !committed(r) {
		t.Fatal(r)
	}
	op, err := NewTxCommit(t2.start, TxSI, TxOrigin{}, []TxCheck{{Key: []byte("k"), Version: 1, Ranges: oneBit(9)}}, t2.writes)
	if err != nil {
		t.Fatal(err)
	}
	run := func(get Getter) (string, map[string][]byte) {
		recs := map[string][]byte{}
		res, err := Apply(get, 3, &op, 0, func(key, value, meta []byte, tomb bool) { recs[string(key)] = append([]byte(nil), value...) })
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Bulk), recs
	}
	r1, recs := run(s.at(2))
	// The crash kept both records: the applier reports them at version 3.
	after := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if v, ok := recs[string(key)]; ok {
			return v, nil, 3, true, nil
		}
		return s.at(2)(key)
	}
	r2, recs2 := run(after)
	if r1 != ":3\r\n" || r2 != r1 || len(recs2) != 2 {
		t.Fatalf("first %q, replay %q (%d records)", r1, r2, len(recs2))
	}
	for k, v := range recs {
		if !bytes.Equal(recs2[k], v) {
			t.Fatalf("replay wrote %q=%x, first run %x", k, recs2[k], v)
		}
	}
	// The crash kept the row only: the key is checked as the first time.
	rowOnly := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if IsAccessRow(key) {
			return recs[string(key)], nil, 3, true, nil
		}
		return s.at(2)(key)
	}
	if r3, recs3 := run(rowOnly); r3 != r1 || !bytes.Equal(recs3[string(accessRowKey([]byte("k")))], recs[string(accessRowKey([]byte("k")))]) {
		t.Fatalf("row-only replay: %q", r3)
	}
}

func TestTxRangedCodec(t *testing.T) {
	checks := []TxCheck{{Key: []byte("a"), Version: 4, Ranges: []TxRange{{1, 2}, {80, 160}}}, {Key: []byte("b"), Version: 0}}
	writes := []Op{{Kind: KindSetRange, Key: []byte("a"), Delta: 10, Value: []byte("xyz")}, setBit("a", 7, '0'), set("b", "v")}
	op, err := NewTxCommit(3, TxSerializable, TxOrigin{}, checks, writes)
	if err != nil {
		t.Fatal(err)
	}
	op, err = DecodeOp(AppendOp(nil, &op))
	if err != nil {
		t.Fatal(err)
	}
	gc, gw, err := DecodeTxCommit(&op)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(gc) != fmt.Sprint(checks) || len(gw) != 3 || gw[0].Kind != KindSetRange || gw[0].Delta != 10 ||
		string(gw[0].Value) != "xyz" || gw[1].Kind != KindSetBit || gw[1].Delta != 7 || string(gw[1].Value) != "0" {
		t.Fatalf("round trip: %v %+v", gc, gw)
	}
	for i := range op.Value {
		if i == 1 {
			continue // [0]: the format without ranges, of no checks
		}
		bad := op
		bad.Value = op.Value[:i]
		if _, _, err := DecodeTxCommit(&bad); err == nil {
			t.Fatalf("truncation at %d accepted", i)
		}
	}
}

// BenchmarkTxBitFlipContention: rounds of n concurrent transactions (one
// snapshot) each flipping one random bit of one of 4 hot 64-byte keys,
// committed in turn, with ranged checks (fine) and whole-key ones (key).
// Reports the share that commits and the commit ops applied per second.
//
//	go test -run '^$' -bench TxBitFlipContention -benchtime 2000x ./internal/kv/
func BenchmarkTxBitFlipContention(b *testing.B) {
	for _, n := range []int{2, 8, 32} {
		for _, fine := range []bool{true, false} {
			b.Run(fmt.Sprintf("concurrent=%d/%s", n, map[bool]string{true: "fine", false: "key"}[fine]), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, uint64(n)))
				s := newMV()
				for k := 0; k < 4; k++ {
					x := &txn{s: s, start: s.last, iso: TxSI, seen: map[string]uint64{}}
					x.writeTB(b, set(fmt.Sprint("hot", k), string(make([]byte, 64))))
					x.commitRanged(b, nil)
				}
				commits, total := 0, 0
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					xs := make([]*txn, n)
					bits := make([]uint64, n)
					for j := range xs {
						xs[j] = &txn{s: s, start: s.last, iso: TxSI, seen: map[string]uint64{}}
						bits[j] = uint64(rng.IntN(512))
						xs[j].writeTB(b, setBit(fmt.Sprint("hot", rng.IntN(4)), int64(bits[j]), byte('0'+rng.IntN(2))))
					}
					for j, x := range xs {
						var rs map[string][]TxRange
						if fine {
							rs = map[string][]TxRange{string(x.writes[0].Key): oneBit(bits[j])}
						}
						if committed(x.commitRanged(b, rs)) {
							commits++
						}
						total++
					}
				}
				b.ReportMetric(100*float64(commits)/float64(total), "%commit")
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "commitops/s")
				b.ReportMetric(float64(commits)/b.Elapsed().Seconds(), "commits/s")
			})
		}
	}
}

// BenchmarkTxCommitApply is the state machine's cost of one commit of a
// SETBIT to a 64-byte key whose access record is full (txAccessKeep
// entries): ranged, validated through the record four writes back, and
// key-grain (whole), validated by its version. Reports the bytes each
// commit writes.
//
//	go test -run '^$' -bench TxCommitApply ./internal/kv/
func BenchmarkTxCommitApply(b *testing.B) {
	for _, ranged := range []bool{true, false} {
		b.Run(map[bool]string{true: "ranged", false: "whole"}[ranged], func(b *testing.B) {
			type rec struct {
				data []byte
				v    uint64
			}
			st := map[string]rec{"k": {make([]byte, 64), 1}}
			get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
				r, ok := st[string(key)]
				return r.data, nil, r.v, ok, nil
			}
			var hist []uint64
			written := 0
			v := uint64(1)
			commit := func(i int, count bool) {
				ver := st["k"].v
				var rs []TxRange
				if ranged {
					rs = oneBit(uint64(i % 512))
					if len(hist) >= 4 {
						ver = hist[len(hist)-4]
					}
				}
				op, err := NewTxCommit(ver, TxSI, TxOrigin{}, []TxCheck{{Key: []byte("k"), Version: ver, Ranges: rs}}, []Op{setBit("k", int64(i%512), '1')})
				if err != nil {
					b.Fatal(err)
				}
				v++
				res, err := Apply(get, v, &op, 0, func(key, value, meta []byte, tomb bool) {
					st[string(key)] = rec{append([]byte(nil), value...), v}
					if count {
						written += len(key) + len(value)
					}
				})
				if err != nil || !bytes.HasPrefix(res.Bulk, []byte(":")) {
					b.Fatalf("%q %v", res.Bulk, err)
				}
				hist = append(hist, v)
			}
			for i := 0; i < 2*txAccessKeep; i++ {
				commit(i, false)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				commit(i, true)
			}
			b.ReportMetric(float64(written)/float64(b.N), "B-written/op")
		})
	}
}
