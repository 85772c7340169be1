package transport

import (
	"testing"
	"time"
)

// TestAPeerThatConnectsResetsTheDialBackoffToIt (issue 26 item 4, found in
// issue 25): while a peer is down our dials to it fail and the backoff
// between them grows (up to MaxDialBackoff, 2 s by default). When the peer
// comes back it connects to us; from then on our messages must reach it at
// once, not after the rest of a backoff that grew while it was away (a
// returning follower stayed deaf to its leader for up to 2 s).
func TestAPeerThatConnectsResetsTheDialBackoffToIt(t *testing.T) {
	lns, _ := listeners(t, 2)
	lnA, lnB := lns[0], lns[1]
	addrB := lnB.Addr().String()
	lnB.Close() // B is down: dials to it are refused at once
	peers := map[uint64]string{1: lnA.Addr().String(), 2: addrB}
	// One failed dial backs off for [1 s, 2 s], as after a few at the
	// default settings.
	const backoff = 2 * time.Second
	a, err := newVR(vrConfig{Config: Config{Self: 1, Peers: peers, ClusterSecret: testSecret, Cluster: 7,
		DialBackoff: backoff, MaxDialBackoff: backoff}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	go a.Serve(lnA)
	mustSend(t, a, 2, msg(1, 2, 1))
	eventually(t, 5*time.Second, func() bool { return a.Stats().Link(2).DialFailures > 0 }, "a failed dial to B")

	// B comes back and talks to A first (a restarted follower answering, or
	// asking for state): A sees B connect.
	lnB = relisten(t, addrB)
	in := newInbox()
	b, err := newVR(vrConfig{Config: Config{Self: 2, Peers: peers, ClusterSecret: testSecret, Cluster: 7}, Handler: in.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	go b.Serve(lnB)
	mustSend(t, b, 1, msg(2, 1, 1))
	eventually(t, 5*time.Second, func() bool { return a.Stats().Link(2).InboundConns > 0 }, "B connected to A")

	start := time.Now()
	for op := uint64(2); in.count() == 0 && time.Since(start) < 5*time.Second; op++ {
		mustSend(t, a, 2, msg(1, 2, op))
		time.Sleep(5 * time.Millisecond)
	}
	// Without the reset A sleeps out at least backoff/2 (1 s) less the few
	// milliseconds B took to come up.
	if took := time.Since(start); in.count() == 0 || took > backoff/4 {
		t.Fatalf("A's messages reached the returned peer after %v (%d delivered); want within %v: the dial backoff was not reset when B connected",
			took, in.count(), backoff/4)
	}
}
