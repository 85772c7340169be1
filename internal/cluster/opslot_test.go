package cluster

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// An op routes by the user keys it names, not by everything in Keys: a
// hash op's fields and an EVAL's arguments hash anywhere, and an MSET's
// values are not keys. (Routing by Keys answered CROSSSLOT to an HSET of
// two fields and to redis-py Lock's release script at a node of several
// groups.)
func TestOpSlotRoutesByUserKey(t *testing.T) {
	b := func(ss ...string) [][]byte {
		out := make([][]byte, len(ss))
		for i, s := range ss {
			out[i] = []byte(s)
		}
		return out
	}
	h := Slot([]byte("h"))
	if Slot([]byte("f1")) == h && Slot([]byte("f2")) == h {
		t.Fatal("test keys hash to one slot; pick others")
	}
	for _, tc := range []struct {
		name  string
		op    kv.Op
		slot  uint16
		cross bool
	}{
		{"hset fields", kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: b("f1", "v1", "f2", "v2")}, h, false},
		{"hget fields", kv.Op{Kind: kv.KindHGet, Key: []byte("h"), Keys: b("f1", "f2")}, h, false},
		{"hsweep", kv.Op{Kind: kv.KindHSweep, Key: []byte("h"), Keys: b("f1", "f2")}, h, false},
		{"eval args", kv.Op{Kind: kv.KindEval, Value: []byte("return 1"), Delta: 1, Keys: b("h", "token", "x")}, h, false},
		{"eval two slots", kv.Op{Kind: kv.KindEval, Delta: 2, Keys: b("h", "f1")}, 0, true},
		{"eval no keys", kv.Op{Kind: kv.KindEval, Delta: 0, Keys: b("f1")}, Slot(nil), false},
		{"mset values", kv.Op{Kind: kv.KindMSet, Keys: b("{h}a", "f1", "{h}b", "f2")}, h, false},
		{"mset two slots", kv.Op{Kind: kv.KindMSet, Keys: b("h", "1", "f1", "2")}, 0, true},
		{"mget", kv.Op{Kind: kv.KindMGet, Keys: b("{h}1", "{h}2")}, h, false},
		{"del two slots", kv.Op{Kind: kv.KindDel, Keys: b("h", "f1")}, 0, true},
		{"get", kv.Op{Kind: kv.KindGet, Key: []byte("h")}, h, false},
		{"rename", kv.Op{Kind: kv.KindRename, Keys: b("{h}a", "{h}b")}, h, false},
	} {
		slot, err := opSlot(&tc.op)
		switch {
		case tc.cross && !errors.Is(err, ErrCrossSlot):
			t.Errorf("%s: slot %d, err %v; want CROSSSLOT", tc.name, slot, err)
		case !tc.cross && (err != nil || slot != tc.slot):
			t.Errorf("%s: slot %d, err %v; want slot %d", tc.name, slot, err, tc.slot)
		}
	}
}
