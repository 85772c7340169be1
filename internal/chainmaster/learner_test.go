package chainmaster

import (
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
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
	// (A configuration at 9 no member reported: the master starts above it,
	// TestLearnerStartsAboveAConfigurationNoMemberReported.)
	if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{2}) || e != 10 || l.Unheard() != 9 {
		t.Fatalf("learnt %v at %d (unheard %d), want [2] at 10 (unheard 9)", ms, e, l.Unheard())
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
		if l.Done() {
			t.Fatal("done with 3, a configured member, never heard")
		}
		// The old tail, truncated out, reports the configuration before.
		l.Heard(hb(3, 5, 5, 1, 2, 4, 3))
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

// TestLearnerStartsAboveAConfigurationNoMemberReported (review34c): the old
// master cut 1 out of [2 1 3] at epoch 8 — ordered 2 (its configuration
// [2 3] at 8) and died; 3 moved to 8 on 2's first message, which names no
// configuration, and reports [2 1 3] of epoch 7; 1, cut out and never
// told, reports [2 1 3] at 7; 2 stays silent through the learning. The
// learner cannot know [2 3]: it learns [2 1 3], and starts one above 8 —
// at 8 it would put a second configuration at the epoch of [2 3] — with 8
// as the epoch of a configuration it could not learn (Unheard), below which
// the master fails a member rather than lease it
// (TestLearntMasterFailsAMemberBelowAnUnlearntConfiguration). The mutation
// learnSameEpoch starts at 8. With every configuration heard (2 too) there
// is nothing unheard.
func TestLearnerStartsAboveAConfigurationNoMemberReported(t *testing.T) {
	hb := func(from chain.NodeID, epoch, cfgEpoch uint64, members ...chain.NodeID) chain.Msg {
		return chain.Msg{Type: chain.MsgHeartbeat, From: from, Epoch: epoch, ID: cfgEpoch + 1, Members: members}
	}
	for _, same := range []bool{false, mutation.On} {
		l := NewLearner([]chain.NodeID{2, 1, 3})
		l.sameEpoch = same
		l.Heard(hb(1, 7, 7, 2, 1, 3))
		l.Heard(hb(3, 8, 7, 2, 1, 3))
		want := uint64(9)
		if same {
			want = 8
		}
		if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{2, 1, 3}) || e != want || l.Unheard() != 8 {
			t.Fatalf("learnSameEpoch %v: learnt %v at %d (unheard %d), want [2 1 3] at %d (unheard 8)", same, ms, e, l.Unheard(), want)
		}
		l.Heard(hb(2, 8, 8, 2, 3))
		if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{2, 3}) || e != 8 || l.Unheard() != 0 {
			t.Fatalf("with 2 heard: learnt %v at %d (unheard %d), want [2 3] at 8 (none)", ms, e, l.Unheard())
		}
	}
}

// TestLearntMasterFailsAMemberBelowAnUnlearntConfiguration (review34c): the
// case of TestLearnerStartsAboveAConfigurationNoMemberReported on a
// standalone master, 2 silent and forgone by the operator (RestartWithout:
// the master waits for it otherwise). Once the learning ends the master
// acts on [2 1 3] — but 1, below the epoch of the configuration it could
// not learn, may be (here is) the member that configuration cut out: its
// heartbeats are not answered with a lease; it is failed and rejoins. 3,
// at that epoch, is in it and leased. With the mutation learnTrusts (the
// code before) 1 is leased on [2 1 3] and serves reads 2's writes, passed
// to 3 alone, never reach.
func TestLearntMasterFailsAMemberBelowAnUnlearntConfiguration(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond
	for _, trusts := range []bool{false, mutation.On} {
		var answers []chain.Msg
		now := time.Unix(1_000_000, 0)
		cfg := Config{Self: 9, Members: []uint64{2, 1, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: 10 * failAfter,
			Send: func(_ uint64, m *chain.Msg) {
				if m.Type == chain.MsgHeartbeat {
					answers = append(answers, *m)
				}
			}}
		// (learntFailsLate too: heard below during the learning, 1 is
		// failed as it ends, before the check on its heartbeat.)
		cfg.mut.learnTrusts, cfg.mut.learntFailsLate = trusts, trusts
		x, err := newMaster(cfg, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.RestartWithout([]uint64{2}); err != nil { // 2 silent: the operator forgoes it
			t.Fatal(err)
		}
		var seq uint64
		beat := func(from chain.NodeID, epoch, cfgEpoch uint64) {
			seq++
			x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: from, To: 9, Seq: seq, Epoch: epoch, ID: cfgEpoch + 1, Members: []chain.NodeID{2, 1, 3}}})
		}
		for d := time.Duration(0); d <= 2*failAfter; d += hb {
			now = time.Unix(1_000_000, 0).Add(d)
			x.tick(now)
			beat(1, 7, 7)
			beat(3, 8, 7)
		}
		leased1, leased3 := false, false
		for _, a := range answers {
			in := slices.Contains(a.Members, a.To)
			leased1 = leased1 || a.To == 1 && in
			leased3 = leased3 || a.To == 3 && in
		}
		if trusts {
			if !leased1 {
				t.Fatal("learnTrusts: 1 was not leased (the mutation does not bite)")
			}
			continue
		}
		if leased1 || !leased3 || slices.Contains(x.m.Members(), 1) || x.m.Epoch() <= 8 {
			t.Fatalf("1 leased %v, 3 leased %v, members %v at %d: want 1 failed unleased, 3 leased, above epoch 8", leased1, leased3, x.m.Members(), x.m.Epoch())
		}
	}
}

// TestHostedTakeoverLearnsOverTheRecord (review34c): a hosted master taking
// over with the record [1 2 4] at epoch 5, and member 1 reporting epoch 6
// with [1 2 3] of epoch 4 (moved to 6 by a message naming no configuration:
// a configuration at 6 the record does not have). Learnt over the
// configured members [1 2 3] the takeover would record [1 2 3], older than
// the record, at 6; over the record it keeps [1 2 4], one above 6, with 6
// the epoch below which it fails members (the mutation learnFromConfigured,
// the code before, records [1 2 3]).
func TestHostedTakeoverLearnsOverTheRecord(t *testing.T) {
	for _, configured := range []bool{false, mutation.On} {
		cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Send: func(uint64, *chain.Msg) {}}
		cfg.mut.learnFromConfigured = configured
		x, err := newMaster(cfg, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		x.reports = map[chain.NodeID]chain.Msg{1: {Type: chain.MsgHeartbeat, From: 1, Epoch: 6, ID: 5, Members: []chain.NodeID{1, 2, 3}},
			4: {Type: chain.MsgHeartbeat, From: 4, Epoch: 5, ID: 5, Members: []chain.NodeID{1, 2, 3}}}
		ms, e, unheard, below := x.learnOver(&kv.ChainConfig{Epoch: 5, Members: []uint64{1, 2, 4}})
		if configured {
			if !slices.Equal(ms, []chain.NodeID{1, 2, 3}) {
				t.Fatalf("learnFromConfigured: learnt %v at %d (the mutation does not bite)", ms, e)
			}
			continue
		}
		// 4, at 5, below the unlearnt 6: failed as the master starts
		// (TestLearntMasterFailsBelowBeforeAnsweringAnyone).
		if !slices.Equal(ms, []chain.NodeID{1, 2, 4}) || e != 7 || unheard != 6 || !slices.Equal(below, []chain.NodeID{4}) {
			t.Fatalf("learnt %v at %d (unheard %d, below %v), want the record's [1 2 4] at 7 (unheard 6, below [4])", ms, e, unheard, below)
		}
	}
}

// TestLearntMasterFailsBelowBeforeAnsweringAnyone (review35a): the case of
// TestLearntMasterFailsAMemberBelowAnUnlearntConfiguration (2 forgone by
// the operator in both masters' learning), but after the
// learning 3's heartbeat comes before 1's. Answered first, 3 took the
// learnt [2 1 3] at 9 — above the unlearnt [2 3] at 8 — and reports it; a
// master crashing before 1's heartbeat failed it (a standalone master keeps
// nothing) left the next one nothing to see: 3 at 8 with a configuration
// at 9 is no unlearnt configuration, and 1 at 7, in it, was leased on
// [2 1 3] — the stale reads review34c closed. So the master fails the
// members its learning heard below the unlearnt epoch as it ends, before
// it answers anyone: no answer lists 1, and a next master learns the
// repair (the mutation learntFailsLate, the code before, leases 1 there).
func TestLearntMasterFailsBelowBeforeAnsweringAnyone(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond
	// run runs a standalone master through its learning and a heartbeat
	// round after it: 3's report first, then 1's (2 silent). It returns
	// the heartbeat answers it sent.
	run := func(late bool, report3 chain.Msg) []chain.Msg {
		var answers []chain.Msg
		t0 := time.Unix(1_000_000, 0)
		now := t0
		cfg := Config{Self: 9, Members: []uint64{2, 1, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: 10 * failAfter,
			Send: func(_ uint64, m *chain.Msg) {
				if m.Type == chain.MsgHeartbeat {
					answers = append(answers, *m)
				}
			}}
		cfg.mut.learntFailsLate = late
		x, err := newMaster(cfg, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.RestartWithout([]uint64{2}); err != nil { // 2 silent: the operator forgoes it
			t.Fatal(err)
		}
		var seq uint64
		for d := time.Duration(0); d <= 2*failAfter; d += hb {
			now = t0.Add(d)
			x.tick(now)
			for _, m := range []chain.Msg{report3, {From: 1, Epoch: 7, ID: 8, Members: []chain.NodeID{2, 1, 3}}} {
				seq++
				m.Type, m.To, m.Seq = chain.MsgHeartbeat, 9, seq
				x.step([]chain.Msg{m})
			}
		}
		return answers
	}
	leased := func(answers []chain.Msg, n chain.NodeID) bool {
		return slices.ContainsFunc(answers, func(a chain.Msg) bool { return a.To == n && slices.Contains(a.Members, n) })
	}
	for _, late := range []bool{false, mutation.On} {
		answers := run(late, chain.Msg{From: 3, Epoch: 8, ID: 8, Members: []chain.NodeID{2, 1, 3}})
		if leased(answers, 1) {
			t.Fatalf("late %v: the first master leased 1", late)
		}
		i := slices.IndexFunc(answers, func(a chain.Msg) bool { return a.To == 3 })
		if i < 0 {
			t.Fatalf("late %v: 3 was never answered", late)
		}
		// The first master crashes; 3 took its first answer and reports it.
		a := answers[i]
		next := run(false, chain.Msg{From: 3, Epoch: 8, ID: a.Epoch + 1, Members: a.Members})
		if leased(next, 1) != late {
			t.Fatalf("late %v: 3 first answered with %v at %d; the next master leased 1 (at epoch 7): %v", late, a.Members, a.Epoch, leased(next, 1))
		}
	}
}

// TestHostedTakeoverFailsBelowAtOnce (review35a): the case of
// TestLearntMasterFailsBelowBeforeAnsweringAnyone at a hosted master taking
// over from the record [2 1 3] at 7 while 3 is at 8 (2 silent): it records
// the learnt list one above 8 and fails 1, heard at 7 while it waited out
// the old master's leases, at once — the record leaves 1 out before any
// heartbeat is answered, which a later takeover reads (the learnt list at
// 9 would be no unlearnt configuration to it). With learntFailsLate 1 stays
// in the record until its next heartbeat.
func TestHostedTakeoverFailsBelowAtOnce(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	for _, late := range []bool{false, mutation.On} {
		t0 := time.Unix(1_000_000, 0)
		now := t0
		meta := &fakeMeta{rec: &kv.ChainConfig{Group: 0, Members: []uint64{2, 1, 3}, Epoch: 7}}
		cfg := Config{Self: 9, Members: []uint64{2, 1, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
			Meta: meta, Send: func(uint64, *chain.Msg) {}}
		cfg.mut.learntFailsLate = late
		x, err := newMaster(cfg, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		x.tick(now) // leads: waits out the old master's leases
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: 1, To: 9, Seq: 1, Epoch: 7, ID: 8, Members: []chain.NodeID{2, 1, 3}}})
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: 3, To: 9, Seq: 2, Epoch: 8, ID: 8, Members: []chain.NodeID{2, 1, 3}}})
		now = t0.Add(lease + 2*hb)
		x.tick(now)
		in := slices.Contains(meta.rec.Members, 1)
		if in != late || meta.rec.Epoch <= 8 {
			t.Fatalf("late %v: record %v: want 1 in it %v, above epoch 8", late, meta.rec, late)
		}
	}
}

// TestRestartedMasterWaitsForALoneMember (the host simulation's AUSI D-D-M
// seed 548): the old master repaired the chain down to member 2 alone, at
// epoch 2, and 2 answered writes there (numbered from 2.1 on); 1 and 3, cut
// out, never heard of it and report [1 2 3] at epoch 0, at update 4. The
// master restarts with no record and hears 1 and 3.
//
//   - 2 silent (crashed, or cut off from the master): the learning does not
//     end, whatever the time (Learner.Waiting): nothing is sent. With
//     learnEndsAtTimeout (the code before) it ends after FailAfter on
//     [1 2 3] at 0, leases 1 and 3, and repairs around 2 at epochs 1 and 2
//     again — the numbers 2 used for the writes it acknowledged.
//   - 2 restarted, holding 2.3 (above 1's and 3's last): the learnt
//     configuration is not trusted (Learner.Ahead): every member is failed,
//     nobody leased, and once 1 and 3 report their histories as restarted
//     members (told they are out, they rejoin) the chain restarts from 2's,
//     above its numbers. With learnIgnoresRestarted (the code before) 1 and
//     3 are leased and 2 repaired around at epoch 1.
//   - 2 restarted holding no more than 1 and 3: nothing to lose; 1 and 3
//     are leased, 2 is joined again later.
//   - 2 reporting as a replica, alone at 2: the master learns [2] at 2 and
//     leases 2 alone.
//   - 2 silent and forgone by the operator (RestartWithout): 1 and 3 are
//     leased — what only 2 held is given up.
func TestRestartedMasterWaitsForALoneMember(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond
	const e2 = 2 << 40 // the first number of a head that took over at epoch 2
	type beats func(learning bool, seq uint64) []chain.Msg
	// run runs a standalone master for 4×FailAfter on beats' heartbeats
	// (learning: within the first FailAfter), after do. It returns what it
	// sent.
	run := func(mut mutations, beat beats, do func(x *Master)) []chain.Msg {
		var sent []chain.Msg
		t0 := time.Unix(1_000_000, 0)
		now := t0
		cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: 2 * failAfter,
			Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}
		cfg.mut = mut
		x, err := newMaster(cfg, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		if do != nil {
			do(x)
		}
		var seq uint64
		for d := time.Duration(0); d <= 4*failAfter; d += hb {
			now = t0.Add(d)
			x.tick(now)
			for _, m := range beat(d <= failAfter, seq) {
				seq++
				m.Type, m.To, m.Seq = chain.MsgHeartbeat, 9, seq
				x.step([]chain.Msg{m})
			}
		}
		return sent
	}
	running := func(id chain.NodeID) chain.Msg {
		return chain.Msg{From: id, Epoch: 0, ID: 1, LU: 4, LA: 4, Members: []chain.NodeID{1, 2, 3}}
	}
	restarted := func(id chain.NodeID, lu uint64) chain.Msg {
		return chain.Msg{From: id, Refused: true, LU: lu, LA: 7}
	}
	leased := func(sent []chain.Msg, n chain.NodeID) bool {
		return slices.ContainsFunc(sent, func(a chain.Msg) bool {
			return a.Type == chain.MsgHeartbeat && a.To == n && slices.Contains(a.Members, n)
		})
	}
	// reissued is an order at an epoch 2 may have used.
	reissued := func(sent []chain.Msg) bool {
		return slices.ContainsFunc(sent, func(a chain.Msg) bool { return a.Type != chain.MsgHeartbeat && a.Epoch <= 2 })
	}
	silent := func(bool, uint64) []chain.Msg { return []chain.Msg{running(1), running(3)} }
	for _, mut := range []bool{false, mutation.On} {
		sent := run(mutations{learnEndsAtTimeout: mut}, silent, nil)
		if mut {
			if !leased(sent, 1) || !leased(sent, 3) || !reissued(sent) {
				t.Fatalf("learnEndsAtTimeout, 2 silent: 1 leased %v, 3 leased %v, an epoch reissued %v (the mutation does not bite)",
					leased(sent, 1), leased(sent, 3), reissued(sent))
			}
			continue
		}
		if len(sent) > 0 {
			t.Fatalf("2 silent: the master sent %v, want nothing while it waits for 2", sent)
		}
	}
	// 2 restarted, ahead; 1 and 3, once out of the chain (the learning
	// over), rejoin and report as restarted members.
	ahead := func(learning bool, _ uint64) []chain.Msg {
		if learning {
			return []chain.Msg{running(1), running(3), restarted(2, e2+3)}
		}
		return []chain.Msg{restarted(1, 4), restarted(3, 4), restarted(2, e2+3)}
	}
	for _, mut := range []bool{false, mutation.On} {
		sent := run(mutations{learnIgnoresRestarted: mut}, ahead, nil)
		if mut {
			if !leased(sent, 1) || !leased(sent, 3) || !reissued(sent) {
				t.Fatalf("learnIgnoresRestarted: 1 leased %v, 3 leased %v, an epoch reissued %v (the mutation does not bite)",
					leased(sent, 1), leased(sent, 3), reissued(sent))
			}
			continue
		}
		i := slices.IndexFunc(sent, func(a chain.Msg) bool { return a.Type == chain.MsgRestart })
		if leased(sent, 1) || leased(sent, 3) || reissued(sent) || i < 0 || sent[i].To != 2 || sent[i].Epoch <= 2 {
			t.Fatalf("2 restarted holding 2.3: 1 leased %v, 3 leased %v, an epoch reissued %v; want neither leased, nothing at or below 2, "+
				"and the chain restarted from 2 above its numbers: %v", leased(sent, 1), leased(sent, 3), reissued(sent), sent)
		}
	}
	// 2 restarted, holding no more than 1 and 3.
	sent := run(mutations{}, func(bool, uint64) []chain.Msg { return []chain.Msg{running(1), running(3), restarted(2, 4)} }, nil)
	if !leased(sent, 1) || !leased(sent, 3) {
		t.Fatalf("2 restarted holding no more: 1 leased %v, 3 leased %v, want both", leased(sent, 1), leased(sent, 3))
	}
	// 2 reports as a replica, alone at 2: learnt, and 1 and 3 are not leased.
	sent = run(mutations{}, func(bool, uint64) []chain.Msg {
		return []chain.Msg{running(1), running(3), {From: 2, Epoch: 2, ID: 3, LU: e2 + 3, LA: 7, Members: []chain.NodeID{2}}}
	}, nil)
	if leased(sent, 1) || leased(sent, 3) || !leased(sent, 2) || reissued(sent) {
		t.Fatalf("2 heard alone at 2: 1 leased %v, 3 leased %v, 2 leased %v, an epoch reissued %v: want 2 alone leased, nothing at or below 2",
			leased(sent, 1), leased(sent, 3), leased(sent, 2), reissued(sent))
	}
	// The operator forgoes 2, silent: the master acts without it.
	sent = run(mutations{}, silent, func(x *Master) {
		if _, err := x.RestartWithout([]uint64{7}); err == nil {
			t.Fatal("RestartWithout 7, no member: accepted")
		}
		if _, err := x.RestartWithout([]uint64{2}); err != nil {
			t.Fatal(err)
		}
	})
	if !leased(sent, 1) || !leased(sent, 3) {
		t.Fatalf("2 forgone: 1 leased %v, 3 leased %v, want both", leased(sent, 1), leased(sent, 3))
	}
}

// TestLearnWithoutBeforeTheStart: Config.LearnWithout (kefir chain-master
// --learn-without) is the operator's word before the master starts: the
// learning never waits for those members; the others it still waits for.
func TestLearnWithoutBeforeTheStart(t *testing.T) {
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, LearnWithout: []uint64{2}, Send: func(uint64, *chain.Msg) {}},
		func() time.Time { return time.Unix(1_000_000, 0) })
	if err != nil {
		t.Fatal(err)
	}
	if w := x.learner.Waiting(); !slices.Equal(w, []chain.NodeID{1, 3}) {
		t.Fatalf("waiting for %v, want [1 3]", w)
	}
	x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: 1, To: 9, Seq: 1, ID: 1, Members: []chain.NodeID{1, 2, 3}}})
	x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: 3, To: 9, Seq: 2, ID: 1, Members: []chain.NodeID{1, 2, 3}}})
	if !x.learnUntil.IsZero() {
		t.Fatalf("still learning with 1 and 3 heard, 2 forgone (waiting for %v)", x.learner.Waiting())
	}
}
