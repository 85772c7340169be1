package core

import (
	"errors"
	"testing"
)

// TestReadyEmptyAndHasWrite: a Ready is empty only when the host has
// nothing to do — its lease alone, which every Ready carries, does not count
// — and HasWrite names exactly the fields that go to the disk.
func TestReadyEmptyAndHasWrite(t *testing.T) {
	type rd = Ready[struct{}]
	if r := (rd{Lease: Lease{Held: true, Until: 5, Index: 3}}); !r.Empty() || r.HasWrite() {
		t.Fatalf("a Ready with only a lease: Empty %v, HasWrite %v; want empty, no write", r.Empty(), r.HasWrite())
	}
	hs := HardState{View: 1}
	for name, r := range map[string]rd{
		"persist seq": {PersistSeq: 1}, "messages": {Messages: []struct{}{{}}},
		"committed": {Committed: []Committed{{}}}, "replies": {Replies: []Reply{{}}},
		"read states": {ReadStates: []ReadState{{}}}, "snapshot needed": {SnapshotNeeded: []uint64{2}},
		"errors": {Errors: []error{errors.New("x")}}, "acks": {Acks: []Reply{{}}},
	} {
		if r.Empty() {
			t.Errorf("a Ready with %s is empty", name)
		}
	}
	for name, r := range map[string]rd{
		"snapshot": {Snapshot: &Snapshot{Op: 1}}, "truncate": {HasTruncate: true},
		"entries": {Entries: []Entry{{Op: 1}}}, "hard state": {HardState: &hs},
	} {
		if !r.HasWrite() {
			t.Errorf("a Ready with %s has no write", name)
		}
	}
}
