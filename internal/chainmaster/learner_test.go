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
