package kv

import (
	"errors"
	"reflect"
	"testing"
)

// The group-address record: the op writes its list (through the op codec,
// as a replica's log carries it), a list that does not decode is refused and
// writes nothing, and the record reads back as written.
func TestGroupAddrsOp(t *testing.T) {
	m := mem{}
	ns := []MapNode{{ID: 1, ClientAddr: "127.0.0.1:6380", PeerAddr: "127.0.0.1:7380"}, {ID: 4, ClientAddr: "h:1", PeerAddr: "h:2"}}
	op := &Op{Kind: KindGroupAddrs, Key: AppendGroupAddrs(nil, ns)}
	dec, err := DecodeOp(AppendOp(nil, op))
	if err != nil {
		t.Fatalf("op codec: %v", err)
	}
	res, err := applyTo(t, m, 5, &dec)
	if err != nil || res.Int != 2 || res.Version != 5 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	if ks := op.WrittenKeys(); len(ks) != 1 || string(ks[0]) != string(GroupAddrsKey) {
		t.Fatalf("written keys %q", ks)
	}
	v, _, _, ok, err := m.get(GroupAddrsKey)
	if err != nil || !ok {
		t.Fatalf("record: %v %v", ok, err)
	}
	got, err := DecodeGroupAddrs(v)
	if err != nil || !reflect.DeepEqual(got, ns) {
		t.Fatalf("record reads back %+v %v, want %+v", got, err, ns)
	}
	for _, bad := range [][]byte{nil, {5}, AppendGroupAddrs(nil, []MapNode{{ID: 0}}), AppendGroupAddrs(nil, []MapNode{{ID: 2}, {ID: 2}}), append(AppendGroupAddrs(nil, ns), 0)} {
		before := len(m)
		if _, err := applyTo(t, m, 6, &Op{Kind: KindGroupAddrs, Key: bad}); !errors.Is(err, ErrInvalidOp) {
			t.Errorf("list %x: %v, want ErrInvalidOp", bad, err)
		}
		if len(m) != before {
			t.Errorf("list %x wrote a record", bad)
		}
	}
}
