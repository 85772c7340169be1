package vr

import (
	"fmt"
	"testing"
	"time"
)

// A view change that carries a large log must finish even when shipping and
// processing that log takes longer than the view-change timeout (a loaded
// box: 2 cores, load 20–40). This harness models CPU cost: every replica is
// one CPU that handles its inbox in arrival order, each message costing time
// proportional to its entries (decode, compare, write), and sending costs
// the sender the same (encode). A busy replica does not tick: its timers
// fire late, as under a stall. The network itself is fast (1 ms).

type slowMsg struct {
	at int64
	m  Message
}

type slowNet struct {
	now      int64
	perEntry int64 // CPU cost of one entry in a message (send and receive)
	ids      []uint64
	rs       map[uint64]*Replica
	inbox    map[uint64][]slowMsg
	busy     map[uint64]int64 // the replica's CPU is taken until then
	lastTick map[uint64]int64
	sentDVC  int
	sentSV   int
}

func msgCost(m *Message, perEntry int64) int64 {
	return 200*int64(time.Microsecond) + perEntry*int64(len(m.Entries))
}

// newSlowNet restarts n replicas from disks that all hold the same log of
// logLen entries written in view 4, committed up to commit, in the middle
// of the view change to view 5: every replica starts in view-change status,
// as the saved data directory's nodes did.
func newSlowNet(t *testing.T, n, logLen int, commit uint64, perEntry time.Duration, adjust func(*Config)) *slowNet {
	t.Helper()
	sn := &slowNet{now: 1000 * ms, perEntry: int64(perEntry), rs: map[uint64]*Replica{},
		inbox: map[uint64][]slowMsg{}, busy: map[uint64]int64{}, lastTick: map[uint64]int64{}}
	log := make([]Entry, logLen)
	for i := range log {
		log[i] = Entry{View: 4, Op: uint64(i + 1), Request: Request{Client: 7, ReqNum: uint64(i + 1), Data: []byte("x")}}
	}
	for _, id := range memberIDs(n) {
		cfg := testConfig(id, n)
		cfg.ViewChangeTimeout = 300 * time.Millisecond
		cfg.LeaseDuration = 200 * time.Millisecond
		cfg.MaxBatch, cfg.MaxInflight = 256, 4096
		if adjust != nil {
			adjust(&cfg)
		}
		st := State{HardState: HardState{View: 5, LastNormalView: 4, Commit: commit}, Entries: log, Nonce: id<<40 | 1}
		r, err := New(cfg, st)
		if err != nil {
			t.Fatal(err)
		}
		sn.rs[id] = r
		sn.ids = append(sn.ids, id)
	}
	return sn
}

// drain performs a replica's actions (fsync at once) and queues its messages,
// charging the replica for encoding them and for the entries it writes.
func (sn *slowNet) drain(id uint64) {
	r := sn.rs[id]
	for range 100 {
		rd := r.Ready()
		if rd.Empty() {
			return
		}
		cost := sn.perEntry * int64(len(rd.Entries)) / 4
		for _, m := range rd.Messages {
			c := msgCost(&m, sn.perEntry)
			cost += c
			switch m.Type {
			case MsgDoViewChange:
				sn.sentDVC++
			case MsgStartView:
				sn.sentSV++
			}
			sn.inbox[m.To] = append(sn.inbox[m.To], slowMsg{at: sn.now + cost + ms, m: m})
		}
		sn.busy[id] = max(sn.busy[id], sn.now) + cost
		if len(rd.Committed) > 0 {
			r.Advance(make([][]byte, len(rd.Committed)))
		}
		if rd.PersistSeq != 0 {
			r.Persisted(rd.PersistSeq)
		}
	}
	panic(fmt.Sprintf("replica %d: Ready never empties", id))
}

// run advances virtual time in 1 ms steps for d and reports the first time
// a majority was normal in one view (0: never).
func (sn *slowNet) run(d time.Duration) (settled int64) {
	end := sn.now + int64(d)
	for ; sn.now < end; sn.now += ms {
		for _, id := range sn.ids {
			if sn.busy[id] > sn.now {
				continue
			}
			r := sn.rs[id]
			if q := sn.inbox[id]; len(q) > 0 && q[0].at <= sn.now {
				sn.inbox[id] = q[1:]
				r.Step(sn.now, q[0].m)
				sn.busy[id] = sn.now + msgCost(&q[0].m, sn.perEntry)
				sn.drain(id)
				continue
			}
			if sn.now-sn.lastTick[id] >= 5*ms {
				sn.lastTick[id] = sn.now
				r.Tick(sn.now)
				sn.drain(id)
			}
		}
		views := map[uint64]int{}
		for _, id := range sn.ids {
			if in := sn.rs[id].Info(); in.Status == Normal {
				views[in.View]++
				if views[in.View] > len(sn.ids)/2 {
					return sn.now
				}
			}
		}
	}
	return 0
}

func (sn *slowNet) views() string {
	s := ""
	for _, id := range sn.ids {
		in := sn.rs[id].Info()
		s += fmt.Sprintf(" %d:v%d/%s", id, in.View, in.Status)
	}
	return s
}

// TestViewChangeWithSlowLargeLogConverges: three replicas restart on an
// 11,000-entry log where one entry costs 40 µs of CPU per hop, so a
// do-view-change or start-view takes ~440 ms to encode and as long to
// handle — more than the 300 ms view-change timeout. The group must still
// elect a leader. Before the fix every replica abandoned each view change
// at 300 ms and the group cycled through views for ever (the run below
// stayed without a normal majority for 60 s of virtual time).
func TestViewChangeWithSlowLargeLogConverges(t *testing.T) {
	sn := newSlowNet(t, 3, 11000, 10000, 40*time.Microsecond, nil)
	start := sn.now
	at := sn.run(60 * time.Second)
	if at == 0 {
		t.Fatalf("no majority normal after 60 s of virtual time (livelock):%s; %d do-view-changes, %d start-views sent",
			sn.views(), sn.sentDVC, sn.sentSV)
	}
	t.Logf("a majority was normal after %v:%s; %d do-view-changes, %d start-views sent",
		time.Duration(at-start), sn.views(), sn.sentDVC, sn.sentSV)
}

// TestViewChangeFastPathUnchanged: with cheap messages the first view change
// finishes within about one timeout, as before the backoff.
func TestViewChangeFastPathUnchanged(t *testing.T) {
	sn := newSlowNet(t, 3, 100, 90, time.Microsecond, nil)
	start := sn.now
	at := sn.run(10 * time.Second)
	if at == 0 {
		t.Fatalf("no majority normal after 10 s:%s", sn.views())
	}
	if d := time.Duration(at - start); d > 700*time.Millisecond {
		t.Fatalf("view change took %v with cheap messages; want about one 300 ms timeout (plus the lease wait)", d)
	}
}

// TestViewChangeTimeoutBacksOff: a replica left alone in a view change
// moves on after the view-change timeout, then after twice, four times ...
// that (capped at 16 times), each stretched by its member stagger; a
// start-view (a normal view) resets it to one timeout.
func TestViewChangeTimeoutBacksOff(t *testing.T) {
	const self = 2 // member index 1 of 3: stagger = timeout·1/6
	cfg := testConfig(self, 3)
	r, err := New(cfg, State{HardState: HardState{View: 5, LastNormalView: 4}, Nonce: 3})
	if err != nil {
		t.Fatal(err)
	}
	base := int64(cfg.ViewChangeTimeout)
	now := 1000 * ms
	r.Tick(now)
	r.Ready()
	// moves steps the clock in 1 ms ticks until the view changes and
	// reports how long that took. Member 3 has lost the leader too and
	// pre-votes every tick: alone, a replica never moves (preVote).
	moves := func() int64 {
		v, start := r.Info().View, now
		for r.Info().View == v {
			now += ms
			r.Step(now, Message{Type: MsgStartViewChange, Op: preVoteMark, Cluster: cfg.Cluster, Epoch: cfg.Epoch,
				ConfigHash: cfg.Hash(), From: 3, To: self, View: r.Info().View + 1})
			r.Tick(now)
			r.Ready()
			if now-start > 100*base {
				t.Fatalf("stuck in view %d", v)
			}
		}
		return now - start
	}
	for k, mult := range []int64{1, 2, 4, 8, 16, 16} {
		timeout := base * mult
		want := timeout + timeout/6
		if got := moves(); got < want || got > want+ms {
			t.Fatalf("view change %d abandoned after %v, want %v", k, time.Duration(got), time.Duration(want))
		}
	}
	// The leader of the current view starts it: normal, backoff forgotten.
	v := r.Info().View
	leader := cfg.LeaderOf(v)
	if leader == self {
		t.Fatalf("test assumes member %d does not lead view %d", self, v)
	}
	r.Step(now, Message{Type: MsgStartView, Cluster: cfg.Cluster, Epoch: cfg.Epoch, ConfigHash: cfg.Hash(),
		From: leader, To: self, View: v, First: 1})
	r.Ready()
	if in := r.Info(); in.Status != Normal || in.View != v {
		t.Fatalf("after start-view: %s in view %d, want normal in %d", in.Status, in.View, v)
	}
	if got := moves(); got < base || got > base+ms { // the leader falls silent
		t.Fatalf("normal follower started a view change after %v, want %v", time.Duration(got), time.Duration(base))
	}
	if got, want := moves(), base+base/6; got < want || got > want+ms {
		t.Fatalf("first view change after a normal view abandoned after %v, want %v (backoff not reset)", time.Duration(got), time.Duration(want))
	}
}

// TestDoViewChangeResentSparingly: a do-view-change carries the whole log;
// while the view change lasts it is resent about every quarter of the
// view-change timeout, not with every heartbeat's start-view-change.
func TestDoViewChangeResentSparingly(t *testing.T) {
	const self, other = 2, 1 // view 5 is led by member 3
	cfg := testConfig(self, 3)
	cfg.ViewChangeTimeout = time.Second
	r, err := New(cfg, State{HardState: HardState{View: 5, LastNormalView: 4}, Nonce: 3})
	if err != nil {
		t.Fatal(err)
	}
	now := 1000 * ms
	dvcs, svcs := 0, 0
	var ready func()
	ready = func() {
		rd := r.Ready()
		for _, m := range rd.Messages {
			switch m.Type {
			case MsgDoViewChange:
				dvcs++
			case MsgStartViewChange:
				svcs++
			}
		}
		if rd.PersistSeq != 0 {
			r.Persisted(rd.PersistSeq)
			ready()
		}
	}
	r.Tick(now)
	ready()
	r.Step(now, Message{Type: MsgStartViewChange, Cluster: cfg.Cluster, Epoch: cfg.Epoch, ConfigHash: cfg.Hash(),
		From: other, To: self, View: 5})
	ready()
	if dvcs != 1 {
		t.Fatalf("%d do-view-changes after f+1 start-view-changes, want 1", dvcs)
	}
	for end := now + 900*ms; now < end; {
		now += ms
		r.Tick(now)
		ready()
	}
	if in := r.Info(); in.View != 5 {
		t.Fatalf("left view 5 (now %d) within the 1 s timeout", in.View)
	}
	// 900 ms: start-view-changes to both peers every 10 ms heartbeat, the do-view-change
	// every max(heartbeat, (1 s + stagger)/4) ≈ 292 ms.
	if svcs < 80 || dvcs > 4 {
		t.Fatalf("in 900 ms: %d start-view-change and %d do-view-change messages, want >= 80 and <= 4", svcs, dvcs)
	}
}
