package server

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// A write group 1 ran (client 901, request 5: an INCR whose reply was
// lost) goes with its slots to group 2 as a request mark; then a move of
// the slots on to group 3 stops after the source's migrating step and is
// rolled back (move-slots --abort). Group 2 owns the slots again and must
// still check their requests against the marks it imported: the retry of
// the INCR, sent to group 2 after the abort, is answered from the mark,
// not run a second time. Before Mover.rollBack kept a peer on the
// source's owned entry (the destination's: the origin is in no table by
// then), the abort left group 2's entry owned with peer 0 — a slot never
// imported, whose requests kv.MovedRequest does not check — and the INCR
// ran twice.
func TestAbortAfterMigratingKeepsCheckingTheMarks(t *testing.T) {
	g := startMoveGroups(t)
	k := keyOfGroup(1, "ctr")
	// Group 1 runs the INCR (its reply, say, lost to the client).
	dial(t, g.nodes[0]).expect(`KEFIR.CALL REQID 901 5 CMD INCR ` + k + ` => (integer) 1`)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rs := []kv.SlotRange{{Start: 0, End: 8191}}
	seeds := []string{g.cfgs[0].ClientAddr, g.cfgs[1].ClientAddr, g.cfgs[2].ClientAddr}
	mv := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Driver: t.Name()}
	if _, err := mv.Move(ctx, 1, 2, rs); err != nil {
		t.Fatalf("move 1 -> 2: %v", err)
	}
	// The move on to group 3 stops right after the source's migrating
	// step, and is rolled back.
	stopped, stop := context.WithCancel(ctx)
	on := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Driver: t.Name() + "-on",
		AfterStep: func(step string) {
			if step == "migrating" {
				stop()
			}
		}}
	if _, err := on.Move(stopped, 2, 3, rs); err == nil {
		t.Fatal("the move 2 -> 3 went on past its migrating step")
	}
	on.Close()
	stop()
	ab := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Driver: t.Name() + "-abort"}
	if err := ab.Abort(ctx, 2, 3, rs); err != nil {
		t.Fatalf("abort: %v", err)
	}
	tab, err := ab.Table(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	ab.Close()
	for _, r := range tab {
		if r.Start == 0 && (r.State != "owned" || r.Peer == 0) {
			t.Errorf("group 2's slots %d-%d after the abort: %s, peer %d; want owned, imported (peer not 0)", r.Start, r.End, r.State, r.Peer)
		}
	}
	// The retry reaches group 2 (its own node: no forwarding, the
	// request's id as sent).
	if got := dial(t, g.nodes[1]).do("KEFIR.CALL", "REQID", "901", "5", "CMD", "INCR", k); got != "(integer) 1" {
		t.Errorf("the INCR retried at group 2 after the abort: %s, want the mark's (integer) 1 (run once)", got)
	}
	if got := dial(t, g.nodes[1]).do("GET", k); got != `"1"` {
		t.Errorf("GET %s: %s, want \"1\"", k, got)
	}
}
