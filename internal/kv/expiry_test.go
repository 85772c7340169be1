package kv

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// ttlState is a store at now = 1000 ms: "p" plain, "t" expiring at 5000, "x"
// expired at 900 (still stored), "n" a counter expiring at 5000.
func ttlState() mem {
	return mem{
		"p": {val: "plain", ver: 1},
		"t": {val: "ttl", ver: 2, meta: EncodeMeta(TypeString, 5000)},
		"x": {val: "old", ver: 3, meta: EncodeMeta(TypeString, 900)},
		"n": {val: "7", ver: 4, meta: EncodeMeta(TypeString, 5000)},
	}
}

// Every write's effect on expiries, at version 10 and Now 1000: what Redis
// does (SET clears, KEEPTTL/INCR/APPEND keep, EXPIRE's NX|XX|GT|LT, an expiry
// in the past deletes, an expired key is absent to every op).
func TestApplyExpiry(t *testing.T) {
	const now = 1000
	m := func(at int64) string { return fmt.Sprintf("@%d", at) }
	cases := []struct {
		name string
		op   Op
		recs []string // key=value[@expiry] or key=-
		res  Result
	}{
		{"set ex", Op{Kind: KindSet, Key: b("p"), Value: b("v"), ExpireAt: 3000}, []string{"p=v" + m(3000)}, Result{Kind: ResOK, Version: 10}},
		{"set clears ttl", Op{Kind: KindSet, Key: b("t"), Value: b("v")}, []string{"t=v"}, Result{Kind: ResOK, Version: 10}},
		{"set keepttl", Op{Kind: KindSet, Key: b("t"), Value: b("v"), TTL: TTLKeep}, []string{"t=v" + m(5000)}, Result{Kind: ResOK, Version: 10}},
		{"set keepttl of expired", Op{Kind: KindSet, Key: b("x"), Value: b("v"), TTL: TTLKeep}, []string{"x=v"}, Result{Kind: ResOK, Version: 10}},
		{"set nx over expired sets", Op{Kind: KindSet, Key: b("x"), Value: b("v"), Cond: IfAbsent}, []string{"x=v"}, Result{Kind: ResOK, Version: 10}},
		{"set xx over expired fails", Op{Kind: KindSet, Key: b("x"), Value: b("v"), Cond: IfPresent}, nil, Result{Kind: ResNil, Version: 3}},
		{"set get of expired", Op{Kind: KindSet, Key: b("x"), Value: b("v"), ReturnOld: true}, []string{"x=v"}, Result{Kind: ResNil, Version: 10}},
		{"set exat past deletes", Op{Kind: KindSet, Key: b("p"), Value: b("v"), ExpireAt: 1000}, []string{"p=-"}, Result{Kind: ResOK, Version: 10}},
		{"set exat past of absent", Op{Kind: KindSet, Key: b("a"), Value: b("v"), ExpireAt: 10}, nil, Result{Kind: ResOK}},
		{"mset clears", Op{Kind: KindMSet, Keys: keys("t", "1")}, []string{"t=1"}, Result{Kind: ResOK, Version: 10}},
		{"getset clears", Op{Kind: KindGetSet, Key: b("t"), Value: b("v")}, []string{"t=v"}, Result{Kind: ResBulk, Bulk: b("ttl"), Version: 10}},
		{"getset of expired", Op{Kind: KindGetSet, Key: b("x"), Value: b("v")}, []string{"x=v"}, Result{Kind: ResNil, Version: 10}},
		{"incr keeps", Op{Kind: KindIncrBy, Key: b("n"), Delta: 2}, []string{"n=9" + m(5000)}, Result{Kind: ResInt, Int: 9, Version: 10}},
		{"incr of expired starts at 0", Op{Kind: KindIncrBy, Key: b("x"), Delta: 2}, []string{"x=2"}, Result{Kind: ResInt, Int: 2, Version: 10}},
		{"append keeps", Op{Kind: KindAppend, Key: b("t"), Value: b("!")}, []string{"t=ttl!" + m(5000)}, Result{Kind: ResInt, Int: 4, Version: 10}},
		{"append to expired", Op{Kind: KindAppend, Key: b("x"), Value: b("!")}, []string{"x=!"}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"cas on expired fails", Op{Kind: KindCAS, Key: b("x"), Expected: b("old"), Value: b("v")}, nil, Result{Kind: ResInt, Version: 3}},
		{"del counts live only, deletes expired", Op{Kind: KindDel, Keys: keys("p", "x", "a")}, []string{"p=-", "x=-"}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"del of expired only", Op{Kind: KindDel, Keys: keys("x")}, []string{"x=-"}, Result{Kind: ResInt, Int: 0, Version: 10}},

		{"expire", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 2000}, []string{"p=plain" + m(2000)}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire absent", Op{Kind: KindExpire, Key: b("a"), ExpireAt: 2000}, nil, Result{Kind: ResInt}},
		{"expire expired", Op{Kind: KindExpire, Key: b("x"), ExpireAt: 2000}, nil, Result{Kind: ResInt, Version: 3}},
		{"expire past deletes", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 999}, []string{"p=-"}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire nx with ttl", Op{Kind: KindExpire, Key: b("t"), ExpireAt: 2000, TTL: TTLNX}, nil, Result{Kind: ResInt, Version: 2}},
		{"expire nx without", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 2000, TTL: TTLNX}, []string{"p=plain" + m(2000)}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire xx without", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 2000, TTL: TTLXX}, nil, Result{Kind: ResInt, Version: 1}},
		{"expire xx with", Op{Kind: KindExpire, Key: b("t"), ExpireAt: 2000, TTL: TTLXX}, []string{"t=ttl" + m(2000)}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire gt later", Op{Kind: KindExpire, Key: b("t"), ExpireAt: 6000, TTL: TTLGT}, []string{"t=ttl" + m(6000)}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire gt earlier", Op{Kind: KindExpire, Key: b("t"), ExpireAt: 2000, TTL: TTLGT}, nil, Result{Kind: ResInt, Version: 2}},
		{"expire gt no ttl (infinite)", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 6000, TTL: TTLGT}, nil, Result{Kind: ResInt, Version: 1}},
		{"expire lt earlier", Op{Kind: KindExpire, Key: b("t"), ExpireAt: 2000, TTL: TTLLT}, []string{"t=ttl" + m(2000)}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire lt later", Op{Kind: KindExpire, Key: b("t"), ExpireAt: 6000, TTL: TTLLT}, nil, Result{Kind: ResInt, Version: 2}},
		{"expire lt no ttl (infinite)", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 6000, TTL: TTLLT}, []string{"p=plain" + m(6000)}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire xx gt", Op{Kind: KindExpire, Key: b("p"), ExpireAt: 6000, TTL: TTLXX | TTLGT}, nil, Result{Kind: ResInt, Version: 1}},

		{"persist", Op{Kind: KindPersist, Key: b("t")}, []string{"t=ttl"}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"persist without ttl", Op{Kind: KindPersist, Key: b("p")}, nil, Result{Kind: ResInt, Version: 1}},
		{"persist expired", Op{Kind: KindPersist, Key: b("x")}, nil, Result{Kind: ResInt, Version: 3}},

		{"getex ex", Op{Kind: KindGetEx, Key: b("p"), ExpireAt: 2000}, []string{"p=plain" + m(2000)}, Result{Kind: ResBulk, Bulk: b("plain"), Version: 10}},
		{"getex persist", Op{Kind: KindGetEx, Key: b("t"), TTL: TTLPersist}, []string{"t=ttl"}, Result{Kind: ResBulk, Bulk: b("ttl"), Version: 10}},
		{"getex persist without ttl", Op{Kind: KindGetEx, Key: b("p"), TTL: TTLPersist}, nil, Result{Kind: ResBulk, Bulk: b("plain"), Version: 1}},
		{"getex past deletes", Op{Kind: KindGetEx, Key: b("p"), ExpireAt: 5}, []string{"p=-"}, Result{Kind: ResBulk, Bulk: b("plain"), Version: 10}},
		{"getex expired", Op{Kind: KindGetEx, Key: b("x"), ExpireAt: 2000}, nil, Result{Kind: ResNil, Version: 3}},
		{"getex absent", Op{Kind: KindGetEx, Key: b("a"), ExpireAt: 2000}, nil, Result{Kind: ResNil}},

		{"expire if due", Op{Kind: KindExpireIfDue, Keys: keys("x", "t", "p", "a", "x")}, []string{"x=-"}, Result{Kind: ResInt, Int: 1, Version: 10}},
		{"expire if due, none", Op{Kind: KindExpireIfDue, Keys: keys("t")}, nil, Result{Kind: ResInt}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.op.Now = now
			var got []string
			res, err := Apply(ttlState().get, 10, &c.op, 0, func(key, value, meta []byte, tomb bool) {
				switch {
				case tomb:
					got = append(got, string(key)+"=-")
				case ExpireAt(meta) != 0:
					got = append(got, string(key)+"="+string(value)+fmt.Sprintf("@%d", ExpireAt(meta)))
				default:
					if meta != nil {
						t.Errorf("%s: meta % x without expiry: a plain string must have none", key, meta)
					}
					got = append(got, string(key)+"="+string(value))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(res, c.res) {
				t.Errorf("result = %+v, want %+v", res, c.res)
			}
			if !slices.Equal(got, c.recs) {
				t.Errorf("records = %q, want %q", got, c.recs)
			}
		})
	}
}

// Reads at Now 1000 hide expired keys, and TTL answers in each unit with
// Redis's rounding.
func TestReadExpiry(t *testing.T) {
	st := ttlState()
	st["r"] = memVal{val: "r", ver: 5, meta: EncodeMeta(TypeString, 1000)} // expires in this very ms: still there
	read := func(op Op) Result {
		t.Helper()
		op.Now = 1000
		res, err := Read(st.get, st.scan, &op, 100)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := read(Op{Kind: KindGet, Key: b("x")}); r.Kind != ResNil {
		t.Errorf("GET of an expired key: %+v", r)
	}
	if r := read(Op{Kind: KindGet, Key: b("r")}); r.Kind != ResBulk {
		t.Errorf("GET of a key in its expiry ms: %+v", r)
	}
	if r := read(Op{Kind: KindStrlen, Key: b("x")}); r.Int != 0 {
		t.Errorf("STRLEN of an expired key: %+v", r)
	}
	if r := read(Op{Kind: KindMGet, Keys: keys("x", "t")}); r.Array[0] != nil || string(r.Array[1]) != "ttl" {
		t.Errorf("MGET: %q", r.Array)
	}
	if r := read(Op{Kind: KindExists, Keys: keys("x", "t", "p")}); r.Int != 2 {
		t.Errorf("EXISTS: %+v", r)
	}
	var scanned []string
	r := read(Op{Kind: KindScan})
	for i := 0; i < len(r.Array); i += 2 {
		scanned = append(scanned, string(r.Array[i]))
	}
	if !slices.Equal(scanned, []string{"n", "p", "r", "t"}) {
		t.Errorf("scan saw %q, want the live keys", scanned)
	}
	st["t"] = memVal{val: "ttl", ver: 2, meta: EncodeMeta(TypeString, 5499)}
	for _, c := range []struct {
		key  string
		unit int64
		want int64
	}{
		{"t", UnitPTTL, 4499}, {"t", UnitTTL, 4}, {"t", UnitPExpireTime, 5499}, {"t", UnitExpireTime, 5},
		{"p", UnitTTL, -1}, {"p", UnitPExpireTime, -1}, {"x", UnitTTL, -2}, {"a", UnitPTTL, -2}, {"r", UnitPTTL, 0},
		{reserved, UnitTTL, -2},
	} {
		if r := read(Op{Kind: KindTTL, Key: b(c.key), Delta: c.unit}); r.Kind != ResInt || r.Int != c.want {
			t.Errorf("TTL(%q, unit %d) = %+v, want %d", c.key, c.unit, r, c.want)
		}
	}
}

// An op an older build wrote to its log (no expiry trailer) decodes, with Now
// 0; the expiry fields round-trip; kinds print and classify.
func TestOpCodecExpiry(t *testing.T) {
	// AppendOp of SET k v NX at commit ae3fe84, before expiry existed.
	old, _ := hex.DecodeString("060100016b017600" + "00")
	op, err := DecodeOp(old)
	if err != nil || op.Kind != KindSet || op.Cond != IfAbsent || string(op.Key) != "k" || string(op.Value) != "v" || op.Now != 0 || op.ExpireAt != 0 {
		t.Fatalf("old op decoded as %+v, %v", op, err)
	}
	if again := AppendOp(nil, &op); !bytes.Equal(again, old) {
		t.Fatalf("an op without expiry fields re-encodes as % x, want the old % x", again, old)
	}
	for _, op := range []Op{
		{Kind: KindSet, Key: b("k"), Value: b("v"), Now: 1733380000000, ExpireAt: 1733380010000, TTL: TTLKeep},
		{Kind: KindExpire, Key: b("k"), Now: 5, ExpireAt: -1, TTL: TTLGT},
		{Kind: KindGetEx, Key: b("k"), Now: 5, TTL: TTLPersist},
		{Kind: KindExpireIfDue, Keys: keys("a", "b"), Now: 7},
		{Kind: KindPersist, Key: b("k"), Now: 1},
	} {
		got, err := DecodeOp(AppendOp(nil, &op))
		if err != nil || got.Kind != op.Kind || got.Now != op.Now || got.ExpireAt != op.ExpireAt || got.TTL != op.TTL {
			t.Errorf("%+v decoded as %+v, %v", op, got, err)
		}
		if !op.Kind.IsUpdate() {
			t.Errorf("%v is not an update", op.Kind)
		}
	}
	if KindTTL.IsUpdate() || KindTTL.String() != "ttl" || KindExpireIfDue.String() != "expireifdue" {
		t.Errorf("KindTTL: update %v, name %s", KindTTL.IsUpdate(), KindTTL)
	}
	if _, err := DecodeOp(append([]byte{byte(kindExpiryEnd)}, old[1:]...)); err == nil {
		t.Error("a kind past the expiry kinds decoded")
	}
}

func TestMetaEncoding(t *testing.T) {
	if EncodeMeta(TypeString, 0) != nil {
		t.Error("a plain string has meta")
	}
	m := EncodeMeta(TypeString, 1733380000123)
	if len(m) != 9 || ExpireAt(m) != 1733380000123 || MetaType(m) != TypeString {
		t.Errorf("meta % x", m)
	}
	if !Expired(m, 1733380000124) || Expired(m, 1733380000123) || Expired(nil, 1<<62) {
		t.Error("Expired disagrees with Redis's now > expiry")
	}
	if h := EncodeMeta(1, 0); len(h) != 1 || MetaType(h) != 1 || ExpireAt(h) != 0 {
		t.Errorf("typed meta without expiry % x", h)
	}
}
