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
		return chain.Msg{Type: chain.MsgHeartbeat, From: from, Epoch: epoch, ID: epoch + 1, Refused: refused, Members: members}
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

// TestLearnerTakesTheConfigurationsOwnEpoch: a member's epoch and the
// configuration it reports are not of one moment. The old master repaired
// [2 1 3] twice (cut 1 out at epoch 7, 3 at 8) and died before answering a
// heartbeat: node 2 took both orders — it is at 8 and knows [2] from them —
// while 1 and 3 are at 6. A member moved by a new predecessor's
// CR_MID_REPAIR (node 3 at 7) reports the configuration of its last answer
// (6). The master learns [2] and starts above 8; from heartbeats of a
// build before (no configuration epoch) it learns as it did.
func TestLearnerTakesTheConfigurationsOwnEpoch(t *testing.T) {
	hb := func(from chain.NodeID, epoch, cfgEpoch uint64, members ...chain.NodeID) chain.Msg {
		return chain.Msg{Type: chain.MsgHeartbeat, From: from, Epoch: epoch, ID: cfgEpoch + 1, Members: members}
	}
	l := NewLearner([]chain.NodeID{1, 2, 3})
	l.Heard(hb(1, 6, 6, 2, 1, 3))
	l.Heard(hb(3, 7, 6, 2, 1, 3))
	l.Heard(hb(2, 8, 8, 2))
	if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{2}) || e != 8 || !l.Done() {
		t.Fatalf("learnt %v at %d (done %v), want [2] at 8", ms, e, l.Done())
	}
	// In another order: the same.
	l = NewLearner([]chain.NodeID{1, 2, 3})
	l.Heard(hb(2, 8, 8, 2))
	l.Heard(hb(3, 9, 6, 2, 1, 3)) // moved past 8 by a message naming no configuration
	if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{2}) || e != 9 {
		t.Fatalf("learnt %v at %d, want [2] at 9", ms, e)
	}
	// A member of a build before: its configuration taken at its epoch.
	old := NewLearner([]chain.NodeID{1, 2, 3})
	old.Heard(chain.Msg{Type: chain.MsgHeartbeat, From: 3, Epoch: 2, Members: []chain.NodeID{1, 3}})
	if ms, e := old.Config(); !slices.Equal(ms, []chain.NodeID{1, 3}) || e != 2 {
		t.Fatalf("from an older member: learnt %v at %d, want [1 3] at 2", ms, e)
	}
}

// TestLearnerTakesTheTruncatedConfiguration: a truncation changes the
// configuration at its own epoch — the master moves to e at TRUNCATE and
// drops the old tail at TRUNCATE_ACK, still at e — so two members may
// report two configurations at e: [1 2 4 3], answered before the ack, and
// [1 2 4], after it. The later is the prefix; whichever the master hears
// first, it learns [1 2 4], not the old tail (Removed: it serves nothing
// and never fails, and a repair towards it never ends).
func TestLearnerTakesTheTruncatedConfiguration(t *testing.T) {
	hb := func(from chain.NodeID, epoch, cfgEpoch uint64, members ...chain.NodeID) chain.Msg {
		return chain.Msg{Type: chain.MsgHeartbeat, From: from, Epoch: epoch, ID: cfgEpoch + 1, Members: members}
	}
	for _, first := range []bool{true, false} {
		l := NewLearner([]chain.NodeID{1, 2, 3})
		before, after := hb(1, 4, 5, 1, 2, 4, 3), hb(2, 4, 5, 1, 2, 4)
		if !first {
			before, after = after, before
		}
		l.Heard(before)
		l.Heard(after)
		l.Heard(hb(4, 5, 4, 1, 2, 4, 3))
		if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{1, 2, 4}) || e != 5 || !l.Done() {
			t.Fatalf("learnt %v at %d (done %v), want [1 2 4] at 5", ms, e, l.Done())
		}
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
