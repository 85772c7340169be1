package chainmaster

import (
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
)

// TestLearnWithoutCarriesIntoTheWholeChainRestart (review36c): member 2 is
// dead for good and the operator starts the restarted standalone master
// with --learn-without 2. The learning then ends without it — but when it
// ends in a whole-chain restart (a restarted member ahead of the running
// ones, Learner.Ahead; or no member running as a replica at all) the
// restart waited for every configured member (chain.Master's candidates),
// 2 included, and the standalone master has no other way to forgo it (no
// admin port): the chain stayed down for good. The operator's word holds
// for the restart: it goes on from the longest history of the others.
func TestLearnWithoutCarriesIntoTheWholeChainRestart(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond
	run := func(beat func(learning bool) []chain.Msg) []chain.Msg {
		var sent []chain.Msg
		t0 := time.Unix(1_000_000, 0)
		now := t0
		cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: 2 * failAfter,
			LearnWithout: []uint64{2}, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}
		x, err := newMaster(cfg, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		var seq uint64
		for d := time.Duration(0); d <= 8*failAfter; d += hb {
			now = t0.Add(d)
			x.tick(now)
			for _, m := range beat(d <= failAfter) {
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
		return chain.Msg{From: id, Refused: true, LU: lu, LA: lu}
	}
	restartOf := func(sent []chain.Msg) (chain.NodeID, bool) {
		i := slices.IndexFunc(sent, func(a chain.Msg) bool { return a.Type == chain.MsgRestart })
		if i < 0 {
			return 0, false
		}
		return sent[i].To, true
	}
	// 1 running at 4, 3 restarted holding 6 (ahead): every member failed;
	// 1, told it is out, reports as restarted.
	sent := run(func(learning bool) []chain.Msg {
		if learning {
			return []chain.Msg{running(1), restarted(3, 6)}
		}
		return []chain.Msg{restarted(1, 4), restarted(3, 6)}
	})
	if to, ok := restartOf(sent); !ok || to != 3 {
		t.Fatalf("3 ahead, 2 forgone: RESTART sent %v to %d, want one to 3 (the restart must not wait for 2)", ok, to)
	}
	// Nobody running: 1 and 3 restarted, the whole chain's restart.
	sent = run(func(bool) []chain.Msg { return []chain.Msg{restarted(1, 4), restarted(3, 6)} })
	if to, ok := restartOf(sent); !ok || to != 3 {
		t.Fatalf("1 and 3 restarted, 2 forgone: RESTART sent %v to %d, want one to 3 (the restart must not wait for 2)", ok, to)
	}
}

// TestLearnWithoutAMemberOfALearntConfiguration (review36c): the chain is
// [1 2 5] at epoch 3 (5 took 3's place since the master's --members were
// written), 5 is dead for good and 3 restarted, holding no more. The
// restarted master learns [1 2 5] from 1 and 2 and waits for 5
// (Learner.Waiting: a member of a learnt configuration); the operator's
// --learn-without 5 was dropped — Config.LearnWithout forwent only members
// waited for at the start, the configured ones (and the command refused an
// id outside --members) — so the master waited for good. It acts once its
// learning time is up, on [1 2 5]: 1 and 2 leased.
func TestLearnWithoutAMemberOfALearntConfiguration(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond
	var sent []chain.Msg
	t0 := time.Unix(1_000_000, 0)
	now := t0
	cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: 2 * failAfter,
		LearnWithout: []uint64{5}, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}
	x, err := newMaster(cfg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	for d := time.Duration(0); d <= 3*failAfter; d += hb {
		now = t0.Add(d)
		x.tick(now)
		for _, m := range []chain.Msg{
			{From: 1, Epoch: 3, ID: 4, LU: 3<<40 + 2, LA: 9, Members: []chain.NodeID{1, 2, 5}},
			{From: 2, Epoch: 3, ID: 4, LU: 3<<40 + 2, LA: 9, Members: []chain.NodeID{1, 2, 5}},
			{From: 3, Refused: true, LU: 4, LA: 4},
		} {
			seq++
			m.Type, m.To, m.Seq = chain.MsgHeartbeat, 9, seq
			x.step([]chain.Msg{m})
		}
	}
	leased := func(n chain.NodeID) bool {
		return slices.ContainsFunc(sent, func(a chain.Msg) bool {
			return a.Type == chain.MsgHeartbeat && a.To == n && slices.Contains(a.Members, n)
		})
	}
	if !x.learnUntil.IsZero() || !leased(1) || !leased(2) {
		t.Fatalf("5 forgone: still learning %v (waiting for %v), 1 leased %v, 2 leased %v; want the master acting on [1 2 5], 1 and 2 leased",
			!x.learnUntil.IsZero(), x.learnerWaiting(), leased(1), leased(2))
	}
}

// learnerWaiting is Learner.Waiting while the master learns (nil after).
func (x *Master) learnerWaiting() []chain.NodeID {
	if x.learner == nil {
		return nil
	}
	return x.learner.Waiting()
}

// TestAheadMemberIsACandidateOfTheRestart (review36c): Learner.Ahead weighs
// every member of every configuration learnt, but the whole-chain restart
// it calls waited only for the configured members and the learnt chain's
// (restartNodes): member 4, of the configuration [1 2 3 4] at 2 that 1
// still reports and not of the chain [2 3] at 4 the others report,
// restarted holding updates past theirs — the master restarted the whole
// chain for it, and then restarted it from 1's shorter history, leaving
// 4's out (it is joined, and loses them). It is a candidate: the chain
// restarts from the longest history, 4's.
func TestAheadMemberIsACandidateOfTheRestart(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond
	const e1 = 1 << 40
	var sent []chain.Msg
	t0 := time.Unix(1_000_000, 0)
	now := t0
	cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: 2 * failAfter,
		Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}
	x, err := newMaster(cfg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	restarted := func(id chain.NodeID, n uint64) chain.Msg {
		return chain.Msg{From: id, Refused: true, LU: e1 + n, LA: n}
	}
	var seq uint64
	for d := time.Duration(0); d <= 6*failAfter; d += hb {
		now = t0.Add(d)
		x.tick(now)
		beats := []chain.Msg{restarted(1, 5), restarted(2, 5), restarted(3, 5), restarted(4, 9)}
		if d <= failAfter {
			beats = []chain.Msg{
				{From: 1, Epoch: 2, ID: 3, LU: e1 + 5, LA: 5, Members: []chain.NodeID{1, 2, 3, 4}},
				{From: 2, Epoch: 4, ID: 5, LU: e1 + 5, LA: 5, Members: []chain.NodeID{2, 3}},
				{From: 3, Epoch: 4, ID: 5, LU: e1 + 5, LA: 5, Members: []chain.NodeID{2, 3}},
				restarted(4, 9),
			}
		}
		for _, m := range beats {
			seq++
			m.Type, m.To, m.Seq = chain.MsgHeartbeat, 9, seq
			x.step([]chain.Msg{m})
		}
	}
	i := slices.IndexFunc(sent, func(a chain.Msg) bool { return a.Type == chain.MsgRestart })
	if i < 0 {
		t.Fatal("4 ahead: the chain never restarted")
	}
	if sent[i].To != 4 {
		t.Fatalf("4 ahead: the chain restarted from %d (%v), want from 4, the longest history", sent[i].To, sent[i])
	}
}
