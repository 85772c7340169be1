package shard

import (
	"context"
	"testing"
)

type testAck int

func (testAck) Await(context.Context) error { return nil }

// Pendings merge without sharing a backing array: a front door merges a
// connection's Pendings, and an event loop merges several connections'.
func TestPendingMergeKeepsEveryAckAndSharesNoArray(t *testing.T) {
	if !(Pending{}).IsZero() || (Pending{SyncPos: 1}).IsZero() || (Pending{Acks: []Ack{testAck(1)}}).IsZero() {
		t.Fatal("IsZero must hold only for a Pending that waits for nothing")
	}
	base := Pending{Acks: make([]Ack, 1, 8)}
	base.Acks[0] = testAck(1)
	a := base.Merge(Pending{SyncPos: 5, Acks: []Ack{testAck(2)}})
	b := base.Merge(Pending{Acks: []Ack{testAck(3)}})
	if a.SyncPos != 5 || len(a.Acks) != 2 || a.Acks[1] != testAck(2) {
		t.Fatalf("merge a: %+v", a)
	}
	if len(b.Acks) != 2 || b.Acks[1] != testAck(3) || a.Acks[1] != testAck(2) {
		t.Fatalf("merging into the same base overwrote an earlier merge: a %+v, b %+v", a, b)
	}
	if m := (Pending{}).Merge(Pending{}); !m.IsZero() {
		t.Fatalf("empty merge: %+v", m)
	}
}
