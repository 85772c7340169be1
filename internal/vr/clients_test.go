package vr

import (
	"slices"
	"testing"
	"time"
)

// TestClientTableIsBounded: past its cap the table drops the clients whose
// latest request is oldest, every replica drops the same ones (the table stays
// part of the replicated state), a recent client's retry is still answered from
// the table, and a dropped client's retry executes again — the documented price.
func TestClientTableIsBounded(t *testing.T) {
	const limit = 20
	n := newNet(t, 3)
	for _, id := range n.ids {
		n.rs[id].clients.Cap = limit
	}
	// Followers learn commits in batches of a different size than the leader
	// hands them out: the drops must not depend on batching.
	for c := uint64(1); c <= 50; c++ {
		if err := n.propose(1, c, 1, "w"); err != nil {
			t.Fatal(err)
		}
		n.ready(1)
		if c%7 == 0 {
			n.deliver(nil)
		}
	}
	n.deliver(nil)
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)

	lead := n.rs[1].ClientTable()
	if len(lead) > limit {
		t.Fatalf("table holds %d clients, cap %d", len(lead), limit)
	}
	for _, id := range n.ids[1:] {
		if got := n.rs[id].ClientTable(); !slices.EqualFunc(got, lead, func(a, b ClientRecord) bool {
			return a.Client == b.Client && a.ReqNum == b.ReqNum && a.Op == b.Op
		}) {
			t.Fatalf("replica %d's table differs from the leader's:\n%+v\n%+v", id, got, lead)
		}
	}
	if ev := n.rs[1].clients.Evicted; ev == 0 {
		t.Fatal("nothing was dropped")
	}
	for _, rec := range lead {
		if rec.Client <= 50-uint64(len(lead)) {
			t.Fatalf("client %d kept while newer ones were dropped: %+v", rec.Client, lead)
		}
	}

	last := n.rs[1].Info().LastOp
	n.replies[1] = nil
	if err := n.propose(1, 50, 1, "w"); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	if rs := n.replies[1]; len(rs) != 1 || rs[0].Op != 50 {
		t.Fatalf("a recent client's retry must be answered from the table: %+v", rs)
	}
	if err := n.propose(1, 1, 1, "w"); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	if got := n.rs[1].Info().LastOp; got != last+1 {
		t.Fatalf("a dropped client's retry was not ordered again: last op %d, was %d", got, last)
	}
}
