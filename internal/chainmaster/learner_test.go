package chainmaster

import (
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/chain"
)

// TestLearnerAdoptsTheNewestConfiguration: a restarted master given
// [1 2 3] learns [1 3 2] from a member at a higher epoch, ignores an older
// member's report and a joiner's, and is done only once every member of the
// learnt configuration has reported an epoch no higher; a fresh chain (all
// at epoch 0) is learnt at once.
func TestLearnerAdoptsTheNewestConfiguration(t *testing.T) {
	hb := func(from chain.NodeID, epoch uint64, refused bool, members ...chain.NodeID) chain.Msg {
		return chain.Msg{Type: chain.MsgHeartbeat, From: from, Epoch: epoch, Refused: refused, Members: members}
	}
	l := NewLearner([]chain.NodeID{1, 2, 3})
	if l.Heard(hb(4, 9, true, 4)) {
		t.Fatal("a joiner's report adopted")
	}
	if !l.Heard(hb(3, 2, false, 1, 3, 2)) {
		t.Fatal("a newer configuration not adopted")
	}
	if l.Heard(hb(2, 1, false, 1, 2)) {
		t.Fatal("an older configuration adopted")
	}
	if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{1, 3, 2}) || e != 2 {
		t.Fatalf("learnt %v at %d, want [1 3 2] at 2", ms, e)
	}
	if l.Done() {
		t.Fatal("done without a report from 1")
	}
	l.Heard(hb(1, 2, false, 1, 3, 2))
	if !l.Done() {
		t.Fatal("not done once every member reported")
	}

	f := NewLearner([]chain.NodeID{1, 2})
	f.Heard(hb(1, 0, false, 1, 2))
	f.Heard(hb(2, 0, false, 1, 2))
	if ms, e := f.Config(); !f.Done() || !slices.Equal(ms, []chain.NodeID{1, 2}) || e != 0 {
		t.Fatalf("fresh chain: learnt %v at %d (done %v)", ms, e, f.Done())
	}
}

// TestLostHistoryDetectsAWipedMember (a review finding): a member of the
// chain restarted on a wiped disk as a member of the initial chain
// (--bootstrap) comes back active with an empty log, its last update 0;
// the master must not hand it a lease. Its heartbeat reports less than it
// did before (LU or epoch), which lostHistory catches; growth or the same
// report is not a loss, nor is a first report.
func TestLostHistoryDetectsAWipedMember(t *testing.T) {
	prev := progress{epoch: 2, lu: 2<<40 | 7}
	hb := func(epoch, lu uint64) chain.Msg { return chain.Msg{Type: chain.MsgHeartbeat, Epoch: epoch, LU: lu} }
	for _, c := range []struct {
		name  string
		known bool
		hb    chain.Msg
		lost  bool
	}{
		{"wiped: epoch 0, LU 0", true, hb(0, 0), true},
		{"LU went back", true, hb(2, 2<<40|3), true},
		{"epoch went back", true, hb(1, 2<<40|7), true},
		{"same", true, hb(2, 2<<40|7), false},
		{"grew", true, hb(3, 3<<40|1), false},
		{"first report", false, hb(0, 0), false},
	} {
		if got := lostHistory(prev, c.known, c.hb); got != c.lost {
			t.Errorf("%s: lostHistory %v, want %v", c.name, got, c.lost)
		}
	}
}
