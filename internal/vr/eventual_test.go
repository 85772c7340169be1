package vr

import (
	"testing"
	"time"
)

// TestEventualWindow, scripted: with heartbeats flowing every replica may
// serve eventual reads; a follower cut off from the leader stops once the
// window has passed since the last prepare-ok the leader echoed, and so does
// a leader cut off from every follower (a deposed leader, a minority side),
// while the connected majority keeps serving. Before issue 24 every normal
// replica served eventual reads however long it had been cut off.
func TestEventualWindow(t *testing.T) {
	const w = 200 * time.Millisecond
	n := newNetWith(t, 5, func(c *Config) { c.EventualWindow = w; c.ViewChangeTimeout = time.Hour })
	if err := n.propose(1, 7, 1, "x"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		n.tick(10 * time.Millisecond)
		n.deliver(nil)
	}
	for _, id := range n.ids {
		if u := n.rs[id].EventualUntil(); u <= n.now {
			t.Fatalf("replica %d connected but may not serve eventual reads: until %d, now %d (%+v)", id, u, n.now, n.rs[id].Info())
		}
	}
	// Cut the leader (1) and follower 2 off from 3, 4, 5 (a minority: the
	// leader keeps heartbeating 2 but has no lease), for longer than w.
	cut := func(m Message) bool {
		side := func(id uint64) bool { return id <= 2 }
		return side(m.From) == side(m.To)
	}
	for range 30 {
		n.tick(10 * time.Millisecond)
		n.deliver(cut)
	}
	for _, id := range n.ids {
		until := n.rs[id].EventualUntil()
		if id <= 2 && until > n.now {
			t.Errorf("replica %d cut off from the majority for %v still serves eventual reads (until %d, now %d)", id, 300*time.Millisecond, until, n.now)
		}
	}
	// Heal: the leader's lease returns, and with it everyone's proof.
	for range 5 {
		n.tick(10 * time.Millisecond)
		n.deliver(nil)
	}
	for _, id := range n.ids {
		if u := n.rs[id].EventualUntil(); u <= n.now {
			t.Errorf("replica %d healed but still refuses eventual reads", id)
		}
	}
}
