package server

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
)

// A group's directory records the slots it owned at its first start: a
// restart that gives it other slots is refused (the map is static; its keys
// would be in the wrong group), the same slots are accepted, and a
// directory recorded before slots were is accepted as it is.
func TestGroupIdentityRefusesOtherSlots(t *testing.T) {
	dir := t.TempDir()
	id := replicaIdentity{Cluster: 7, Replica: 1, Members: []uint64{1, 2, 3}, Slots: "0-5460"}
	if err := checkIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	if err := checkIdentity(dir, id); err != nil {
		t.Fatalf("same slots refused: %v", err)
	}
	other := id
	other.Slots = "0-5000"
	if err := checkIdentity(dir, other); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("other slots: %v, want ErrStaleConfig", err)
	}
	old := t.TempDir()
	id.Slots = ""
	if err := checkIdentity(old, id); err != nil {
		t.Fatal(err)
	}
	if err := checkIdentity(old, other); err != nil {
		t.Fatalf("a directory recorded without slots: %v", err)
	}
}

// crossSlot finds the keys of a command by the command table and refuses
// keys of several slots with Redis's text; one slot (a hash tag) and
// keyless commands pass.
func TestCrossSlot(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		cross bool
	}{
		{[]string{"MSET", "a", "1", "b", "2"}, true},
		{[]string{"MSET", "{t}a", "1", "{t}b", "2"}, false},
		{[]string{"MSET", "a", "b"}, false}, // the value "b" is not a key
		{[]string{"MGET", "a", "b"}, true},
		{[]string{"DEL", "{x}1", "{x}2", "{x}3"}, false},
		{[]string{"GET", "a"}, false},
		{[]string{"RENAME", "a", "b"}, true},
		{[]string{"PING"}, false},
	} {
		bs := make([][]byte, len(tc.args))
		for i, a := range tc.args {
			bs[i] = []byte(a)
		}
		spec, ok := command.Lookup(bs[0])
		if !ok {
			t.Fatalf("no spec for %s", tc.args[0])
		}
		err := crossSlot(spec, bs)
		if (err != nil) != tc.cross || (err != nil && err != cluster.ErrCrossSlot) {
			t.Errorf("%v: %v, want cross-slot %v", tc.args, err, tc.cross)
		}
		if err != nil && errorText(err) != "CROSSSLOT Keys in request don't hash to the same slot" {
			t.Errorf("%v: reply %q", tc.args, errorText(err))
		}
	}
}
