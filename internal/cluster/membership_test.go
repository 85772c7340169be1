package cluster

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/resp"
)

func testConfig() GroupConfig {
	return GroupConfig{Cluster: 7, Membership: Membership{Epoch: 2, Members: []uint64{1, 2, 3}, Start: 40, Previous: []uint64{1, 2, 5}},
		Addrs: []Member{{1, "p1:1", "c1:1"}, {2, "p2:1", "c2:1"}, {3, "p3:1", "c3:1"}, {5, "p5:1", "c5:1"}}, Leader: 1}
}

// KEFIR.GROUP's reply decodes to what the node wrote (the server writes
// it field by field; this is the reply's shape, built by hand).
func TestDecodeGroupConfig(t *testing.T) {
	c := testConfig()
	ints := func(ids []uint64) resp.Value {
		v := resp.Value{Kind: resp.Array}
		for _, id := range ids {
			v.Elems = append(v.Elems, resp.Value{Kind: resp.Int, Int: int64(id)})
		}
		return v
	}
	addrs := resp.Value{Kind: resp.Array}
	for _, m := range c.Addrs {
		addrs.Elems = append(addrs.Elems, resp.Value{Kind: resp.Bulk, Str: []byte(FormatMember(m))})
	}
	v := resp.Value{Kind: resp.Array, Elems: []resp.Value{{Kind: resp.Int, Int: 7}, {Kind: resp.Int, Int: 2}, {Kind: resp.Int, Int: 40},
		ints(c.Members), ints(c.Previous), {Kind: resp.Int, Int: 1}, addrs}}
	got, err := DecodeGroupConfig(v)
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, c)
	}
	if s := got.String(); s != "epoch 2, members 1@p1:1/c1:1,2@p2:1/c2:1,3@p3:1/c3:1" {
		t.Fatalf("String() = %q", s)
	}
	v.Elems[3] = ints(nil)
	if _, err := DecodeGroupConfig(v); err == nil {
		t.Fatal("a configuration without members decoded")
	}
	if _, err := DecodeGroupConfig(resp.Value{Kind: resp.Error, Str: []byte("ERR x")}); err == nil {
		t.Fatal("an error reply decoded")
	}
}

func TestParseMember(t *testing.T) {
	for in, want := range map[string]Member{"4": {ID: 4}, " 4@h:1/h:2 ": {4, "h:1", "h:2"}} {
		if got, err := ParseMember(in); err != nil || got != want {
			t.Errorf("ParseMember(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "x", "4@h:1", "4@/h:2", "4@h:1/"} {
		if _, err := ParseMember(in); err == nil {
			t.Errorf("ParseMember(%q) accepted", in)
		}
	}
}

// The operator's changes are checked before anything is sent: a member to
// replace that is not one, a new node that already is one or has no
// addresses, removals that leave an even or empty group.
func TestMemberChanges(t *testing.T) {
	c := testConfig()
	got, err := ReplaceMembers(c, 2, Member{4, "p4:1", "c4:1"})
	if err != nil || !reflect.DeepEqual(got, []Member{{ID: 1}, {4, "p4:1", "c4:1"}, {ID: 3}}) {
		t.Fatalf("replace 2 by 4: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		old  uint64
		nw   Member
		want string
	}{
		{9, Member{4, "p", "c"}, "node 9 is not a member"},
		{2, Member{3, "p", "c"}, "node 3 is already a member"},
		{2, Member{ID: 4}, "needs its addresses"},
	} {
		if _, err := ReplaceMembers(c, tc.old, tc.nw); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("replace %d by %+v: %v, want %q", tc.old, tc.nw, err, tc.want)
		}
	}
	got, err = RemoveMembers(c, []uint64{1, 3})
	if err != nil || !reflect.DeepEqual(got, []Member{{ID: 2}}) {
		t.Fatalf("remove 1,3: %+v, %v", got, err)
	}
	for _, ids := range [][]uint64{{1}, {1, 2, 3}, {4}} {
		if _, err := RemoveMembers(c, ids); err == nil {
			t.Errorf("remove %v accepted", ids)
		}
	}
}
