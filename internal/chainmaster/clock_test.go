package chainmaster

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// leaderMeta is fakeMeta whose node can lose the metadata group's
// leadership: its reads then fail, as a linearizable read off the leader
// does.
type leaderMeta struct {
	*fakeMeta
	deposed bool
}

func (m *leaderMeta) Read(ctx context.Context, group uint64) (*kv.ChainConfig, error) {
	if m.deposed {
		return nil, errors.New("not the leader")
	}
	return m.fakeMeta.Read(ctx, group)
}

// TestHostedMasterLeaseOnAClock drives a hosted master's tick and step on a
// clock of the test's own (no goroutine, no sleeps), so the lease
// arithmetic of "Taking over" and "Leadership by lease" is checked at its
// exact edges: no grant before Lease + 2×Heartbeat from the first
// successful leadership read, a grant right after; none once 2×Heartbeat
// have passed since the last successful read (a stalled master); none from
// a deposed master.
func TestHostedMasterLeaseOnAClock(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &leaderMeta{fakeMeta: &fakeMeta{}}
	var sent []chain.Msg
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) { now = t0.Add(d) }
	seq := uint64(0)
	// beat has every member heartbeat at d and returns the grants (heartbeat
	// answers) the master sent for them.
	beat := func(d time.Duration) int {
		at(d)
		sent = sent[:0]
		for id := chain.NodeID(1); id <= 3; id++ {
			seq++
			x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Members: []chain.NodeID{1, 2, 3}}})
		}
		n := 0
		for _, m := range sent {
			if m.Type == chain.MsgHeartbeat {
				n++
			}
		}
		return n
	}
	tick := func(d time.Duration) { at(d); x.tick(now) }

	tick(0) // the first successful read: takes over, waits until 600 ms
	actAt := lease + 2*hb
	for d := time.Duration(0); d < actAt; d += hb {
		tick(d)
		if n := beat(d + hb/2); n != 0 {
			t.Fatalf("%d grants at %v, before the old master's leases lapsed (%v)", n, d+hb/2, actAt)
		}
	}
	tick(actAt - time.Millisecond)
	if n := beat(actAt - time.Millisecond); n != 0 {
		t.Fatalf("%d grants 1 ms before acting", n)
	}
	tick(actAt)
	if rec, _ := meta.epoch(); rec != 0 || meta.rec == nil {
		t.Fatalf("the master acts without recording the chain (record %v)", meta.rec)
	}
	if n := beat(actAt); n != 3 {
		t.Fatalf("%d grants once acting, want 3", n)
	}
	// No tick (a stalled master): grants until 2×Heartbeat after the last
	// read, none from then.
	if n := beat(actAt + 2*hb - time.Millisecond); n != 3 {
		t.Fatalf("%d grants 1 ms inside the read's 2×Heartbeat, want 3", n)
	}
	if n := beat(actAt + 2*hb); n != 0 {
		t.Fatalf("%d grants 2×Heartbeat after the last leadership read", n)
	}
	tick(actAt + 2*hb)
	if n := beat(actAt + 2*hb); n != 3 {
		t.Fatalf("%d grants after a new read, want 3", n)
	}
	// Deposed: the next read fails and the master grants nothing, at once.
	meta.deposed = true
	tick(actAt + 3*hb)
	if n := beat(actAt + 3*hb); n != 0 {
		t.Fatalf("%d grants from a deposed master", n)
	}
	// Leading again, it waits the whole takeover again.
	meta.deposed = false
	again := actAt + 4*hb
	tick(again)
	tick(again + actAt - time.Millisecond)
	if n := beat(again + actAt - time.Millisecond); n != 0 {
		t.Fatalf("%d grants before a second takeover's wait ended", n)
	}
	tick(again + actAt)
	if n := beat(again + actAt); n != 3 {
		t.Fatalf("%d grants after the second takeover, want 3", n)
	}
}

// TestHostedMasterGivesAStartingChainItsGrace: a hosted master that starts
// the chain (no record: KindMapChainInit) gives a member never heard from
// StartGrace, as a standalone master does — its process may still be
// starting on a loaded machine — not just FailAfter from the takeover. A
// member failed while alive is not joined again until it restarts.
func TestHostedMasterGivesAStartingChainItsGrace(t *testing.T) {
	const hb, lease, failAfter, grace = 50 * time.Millisecond, 500 * time.Millisecond, time.Second, 5 * time.Second
	t0 := time.Unix(1_000_000, 0)
	now := t0
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: grace,
		Meta: &fakeMeta{}, Send: func(uint64, *chain.Msg) {}}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	// run ticks until d, members 1 and 2 heartbeating (3 is silent), and
	// reports whether 3 is still a member.
	run := func(from, to time.Duration) bool {
		for d := from; d <= to; d += hb {
			now = t0.Add(d)
			x.tick(now)
			for id := chain.NodeID(1); id <= 2; id++ {
				seq++
				x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Members: []chain.NodeID{1, 2, 3}}})
			}
		}
		return x.m != nil && slices.Contains(x.m.Members(), 3)
	}
	if !run(0, lease+2*hb+failAfter+hb) {
		t.Fatalf("member 3 failed FailAfter after the takeover, within the start's grace (%v)", grace)
	}
	if run(lease+2*hb+failAfter+2*hb, lease+2*hb+grace+hb) {
		t.Fatalf("member 3, never heard, still in the chain after the start's grace")
	}
}

// clockedMaster is a standalone master of the chain [1 2 3] on a clock of
// the test's own: run ticks it every heartbeat up to a time, with the given
// nodes heartbeating after each tick (node 4 as a node outside the chain,
// waiting to be joined).
type clockedMaster struct {
	x   *Master
	t0  time.Time
	now time.Time
	d   time.Duration // the clock, from t0
	hb  time.Duration
	seq uint64
}

func newClockedMaster(t *testing.T, cfg Config) *clockedMaster {
	t.Helper()
	c := &clockedMaster{t0: time.Unix(1_000_000, 0), hb: cfg.Heartbeat}
	c.now = c.t0
	cfg.Self, cfg.Members, cfg.Send = 9, []uint64{1, 2, 3}, func(uint64, *chain.Msg) {}
	x, err := newMaster(cfg, func() time.Time { return c.now })
	if err != nil {
		t.Fatal(err)
	}
	c.x = x
	return c
}

// beat steps a heartbeat from each of ids.
func (c *clockedMaster) beat(ids ...chain.NodeID) {
	for _, id := range ids {
		c.seq++
		m := chain.Msg{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: c.seq, Members: []chain.NodeID{1, 2, 3}}
		if id == 4 {
			m.Refused, m.Members = true, nil // not a replica: waiting to be joined
		}
		c.x.step([]chain.Msg{m})
	}
}

// tickAt moves the clock to d and ticks.
func (c *clockedMaster) tickAt(d time.Duration) {
	c.d, c.now = d, c.t0.Add(d)
	c.x.tick(c.now)
}

// run ticks every heartbeat from the clock's time until until, ids
// heartbeating after each tick.
func (c *clockedMaster) run(until time.Duration, ids ...chain.NodeID) {
	for d := c.d; d <= until; d += c.hb {
		c.tickAt(d)
		c.beat(ids...)
	}
	c.d += c.hb
}

// TestMasterStallIsNotTheMembersSilence: a master whose own ticks stalled
// (its process, or the box, did not run it for longer than FailAfter) does
// not fail members whose heartbeats it simply did not read meanwhile
// (stallGrace); members that stay silent are failed FailAfter of the
// master's awake time later. With the mutation noStallGrace every member
// is failed at the first tick after the stall, as bench/chain-join.sh saw.
func TestMasterStallIsNotTheMembersSilence(t *testing.T) {
	const hb, lease, failAfter = 50 * time.Millisecond, 500 * time.Millisecond, time.Second
	for _, broken := range []bool{false, true} {
		if broken && !mutation.On {
			continue // the mutation does nothing without -tags mutations
		}
		cfg := Config{Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: failAfter}
		cfg.mut.noStallGrace = broken
		c := newClockedMaster(t, cfg)
		members := func() []chain.NodeID { return c.x.m.Members() }
		c.run(3*failAfter, 1, 2, 3)
		if got := members(); !slices.Equal(got, []chain.NodeID{1, 2, 3}) {
			t.Fatalf("broken %v: members %v before the stall", broken, got)
		}
		// The stall: 1.8 s with no tick and no heartbeat read.
		c.tickAt(c.d + 1800*time.Millisecond)
		got := members()
		if broken {
			if len(got) == 3 {
				t.Fatal("noStallGrace not caught: no member failed at the first tick after the stall")
			}
			continue
		}
		if !slices.Equal(got, []chain.NodeID{1, 2, 3}) {
			t.Fatalf("members %v at the first tick after the master's stall, want all three", got)
		}
		// 1 and 2 answer again; 3 stays silent: failed FailAfter of awake
		// time later, not before.
		c.run(c.d+failAfter+2*hb, 1, 2)
		if got := members(); !slices.Equal(got, []chain.NodeID{1, 2}) {
			t.Fatalf("members %v after FailAfter of silence from 3 following the stall, want [1 2]", got)
		}
	}
}

// TestPrecopyingJoinerGetsStartGrace: a joiner still in its pre-copy is not
// linked into the chain, and restoring a large snapshot holds its driver
// (so its heartbeats) for seconds; the master gives it StartGrace, not
// FailAfter, before giving up on it. With the mutation joinerFailAfter it
// is failed after FailAfter, as bench/chain-join.sh saw at every join.
func TestPrecopyingJoinerGetsStartGrace(t *testing.T) {
	const hb, lease, failAfter, grace = 50 * time.Millisecond, 500 * time.Millisecond, time.Second, 5 * time.Second
	for _, broken := range []bool{false, true} {
		if broken && !mutation.On {
			continue // the mutation does nothing without -tags mutations
		}
		cfg := Config{Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: grace}
		cfg.mut.joinerFailAfter = broken
		c := newClockedMaster(t, cfg)
		x := c.x
		c.run(grace+failAfter, 1, 2, 3) // the chain acts
		c.run(c.d+hb, 1, 2, 3, 4)       // 4 asks to join
		if j := x.m.Joiner(); j != 4 || !x.m.JoinerPrecopying() {
			t.Fatalf("broken %v: joiner %d (pre-copying %v), want 4 pre-copying", broken, j, x.m.JoinerPrecopying())
		}
		c.run(c.d+2*failAfter, 1, 2, 3) // 4 restores a snapshot: silent
		if broken {
			if x.m.Joiner() == 4 {
				t.Fatal("joinerFailAfter not caught: the silent joiner was kept past FailAfter")
			}
			continue
		}
		if x.m.Joiner() != 4 {
			t.Fatalf("the pre-copying joiner was failed after %v of silence, within StartGrace %v", 2*failAfter, grace)
		}
		c.run(c.d+grace, 1, 2, 3) // silent past StartGrace: given up
		if x.m.Joiner() == 4 {
			t.Fatalf("a joiner silent for more than StartGrace (%v) is still joining", grace)
		}
	}
}

// TestHostedMasterRestartsAWholeChain: every member of the recorded chain
// [1 2 3] comes back restarted (its heartbeats say it is not a replica,
// with the length of the durable history it holds). The hosted master
// fails them one by one and, with the last, the chain is down: it never
// records a chain without members (the metadata group refuses one: the
// loop the A8 run saw), and once every member has reported it records the
// member holding the longest history, 3, as the chain at a new epoch,
// orders it to RESTART, and then joins the others to it. A heartbeat of a
// member still running while the chain is down gets no lease; 3's
// heartbeat from before it took the order does not fail it again.
func TestHostedMasterRestartsAWholeChain(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &fakeMeta{rec: &kv.ChainConfig{Group: 0, Members: []uint64{1, 2, 3}, Epoch: 4}}
	var sent []chain.Msg
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	tick := func(d time.Duration) { now = t0.Add(d); x.tick(now) }
	tick(0)
	tick(lease + 2*hb) // acting from the record
	if x.m == nil {
		t.Fatal("the master is not acting")
	}
	length := map[chain.NodeID]uint64{1: 5, 2: 7, 3: 9}
	seq := uint64(0)
	restarted := func(id chain.NodeID) {
		seq++
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Refused: true, LA: length[id], LU: length[id]}})
	}
	// The first round fails them one by one (1 and 2 leave a repaired
	// chain, 3 the last); the chain is down from 3's, which is its report.
	// The next heartbeats of 1 and 2 are theirs.
	for _, id := range []chain.NodeID{1, 2, 3, 1} {
		restarted(id)
		if rec := meta.rec; len(rec.Members) == 0 {
			t.Fatalf("recorded a chain without members after %d's report", id)
		}
		if slices.ContainsFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart }) {
			t.Fatalf("a RESTART before every member reported (%d's report)", id)
		}
	}
	if !x.m.Down() {
		t.Fatal("the master is not down with every member restarted")
	}
	// A member still running while the master counts it failed (it fell
	// silent, then spoke again): no lease, and an answer that leaves it out.
	sent = sent[:0]
	seq++
	x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: 3, To: 9, Seq: seq, Epoch: 6, Members: []chain.NodeID{3}}})
	if len(sent) != 1 || sent[0].Type != chain.MsgHeartbeat || slices.Contains(sent[0].Members, 3) {
		t.Fatalf("a running member's heartbeat while the chain is down: answered %v, want the chain without it", sent)
	}
	restarted(2)
	if x.m.Down() {
		t.Fatal("still down after every member reported")
	}
	if rec := meta.rec; !slices.Equal(rec.Members, []uint64{3}) || rec.Epoch <= 4 {
		t.Fatalf("record %v at epoch %d after the restart, want [3] above epoch 4", rec.Members, rec.Epoch)
	}
	i := slices.IndexFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart })
	if i < 0 || sent[i].To != 3 || sent[i].Epoch != meta.rec.Epoch {
		t.Fatalf("sent %v, want a RESTART to 3 at the recorded epoch %d", sent, meta.rec.Epoch)
	}
	// 3's heartbeat sent before it took the order: not a new restart.
	restarted(3)
	if x.m.Down() || !slices.Equal(meta.rec.Members, []uint64{3}) {
		t.Fatalf("3's heartbeat from before the RESTART: down %v, record %v", x.m.Down(), meta.rec)
	}
	x.step([]chain.Msg{{Type: chain.MsgRestartDone, From: 3, To: 9, Epoch: meta.rec.Epoch}})
	sent = sent[:0]
	restarted(1)
	if !slices.ContainsFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgPrecopy && m.To == 1 && m.Target == 3 }) {
		t.Fatalf("sent %v after 1's next report, want it joined (PRECOPY from 3)", sent)
	}
}

// TestHostedMasterRestartsNeverFromAPagedMember (review34a): as
// TestHostedMasterRestartsAWholeChain, but 3, the longest history, says in
// its heartbeats that its host holds pages of a snapshot it had not
// finished taking (Any: its state is no history's): the chain restarts
// from 2, the longest whole one. Taking Any from the heartbeat is
// chainmaster's part (restarted); the rule is chain.Master.Restarted's.
func TestHostedMasterRestartsNeverFromAPagedMember(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &fakeMeta{rec: &kv.ChainConfig{Group: 0, Members: []uint64{1, 2, 3}, Epoch: 4}}
	var sent []chain.Msg
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	x.tick(now)
	now = t0.Add(lease + 2*hb)
	x.tick(now)
	length := map[chain.NodeID]uint64{1: 5, 2: 7, 3: 9}
	for seq, id := range []chain.NodeID{1, 2, 3, 1, 2} {
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: uint64(seq + 1), Refused: true, LA: length[id], LU: length[id], Any: id == 3}})
	}
	if rec := meta.rec; x.m.Down() || !slices.Equal(rec.Members, []uint64{2}) {
		t.Fatalf("down %v, record %v: want the chain restarted from 2", x.m.Down(), rec)
	}
	if i := slices.IndexFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart }); i < 0 || sent[i].To != 2 {
		t.Fatalf("sent %v, want a RESTART to 2", sent)
	}
}

// TestTakeoverRestartWaitsForEveryConfiguredMember: the old master saw the
// tail 3, then 2 fail and recorded [1] before it went too; every node
// restarts. The master that takes over from the record knows nothing of 2
// and 3 failing, but a whole-chain restart waits for every configured
// member (chain.Master.SetNodes): it restarts the chain from 3, the longest
// history (the last tail's, which holds the last acknowledged writes), not
// from 1, the record's only member.
func TestTakeoverRestartWaitsForEveryConfiguredMember(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &fakeMeta{rec: &kv.ChainConfig{Members: []uint64{1}, Epoch: 6}}
	var sent []chain.Msg
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	tick := func(d time.Duration) { now = t0.Add(d); x.tick(now) }
	tick(0)
	tick(lease + 2*hb)
	length := map[chain.NodeID]uint64{1: 5, 2: 7, 3: 9}
	seq := uint64(0)
	for _, id := range []chain.NodeID{1, 2, 3} {
		seq++
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Refused: true, LA: length[id], LU: length[id]}})
	}
	i := slices.IndexFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart })
	if i < 0 || sent[i].To != 3 || !slices.Equal(meta.rec.Members, []uint64{3}) {
		t.Fatalf("record %v, sent %v: want the chain restarted from 3", meta.rec, sent)
	}
}

// TestHostedMasterRestartsWithoutAMember: every member failed; 1 and 2
// restart, 3 does not. The master waits for 3 (it may hold the last
// acknowledged writes) until the operator restarts without it
// (RestartWithout): then it records and orders the restart from 2, the
// longest of the two. 3, back holding more than 2 did, is refused (no
// PRECOPY, one log line, not one per heartbeat) until it reports an empty
// history; then it is joined. RestartWithout is refused on a chain that is
// not down, and at a master that does not act.
func TestHostedMasterRestartsWithoutAMember(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &fakeMeta{rec: &kv.ChainConfig{Members: []uint64{1, 2, 3}, Epoch: 4}}
	var sent []chain.Msg
	var logs strings.Builder
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) },
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.RestartWithout([]uint64{3}); !errors.Is(err, ErrNotActing) {
		t.Fatalf("RestartWithout at a master not acting: %v, want ErrNotActing", err)
	}
	tick := func(d time.Duration) { now = t0.Add(d); x.tick(now) }
	tick(0)
	tick(lease + 2*hb)
	if _, err := x.RestartWithout([]uint64{3}); err == nil {
		t.Fatal("RestartWithout on a running chain succeeded")
	}
	length := map[chain.NodeID]uint64{1: 5, 2: 7, 3: 9}
	seq := uint64(0)
	report := func(id chain.NodeID) {
		seq++
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Refused: true, LA: length[id], LU: length[id]}})
	}
	// 1 and 2 restart (their first reports fail them; the chain goes down
	// with 3 failed by silence), then report again.
	report(1)
	report(2)
	for d := lease + 3*hb; d <= lease+2*hb+3*lease; d += hb {
		tick(d) // 3 silent past FailAfter
	}
	report(1)
	report(2)
	if !x.m.Down() || slices.ContainsFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart }) {
		t.Fatalf("down %v, sent %v: want the chain down, waiting for 3", x.m.Down(), sent)
	}
	msg, err := x.RestartWithout([]uint64{3})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RestartWithout: %s", msg)
	i := slices.IndexFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart })
	if i < 0 || sent[i].To != 2 || !slices.Equal(meta.rec.Members, []uint64{2}) || sent[i].Epoch != meta.rec.Epoch {
		t.Fatalf("record %v, sent %v: want the chain restarted from 2, recorded first", meta.rec, sent)
	}
	x.step([]chain.Msg{{Type: chain.MsgRestartDone, From: 2, To: 9, Epoch: meta.rec.Epoch}})
	sent = sent[:0]
	report(3)
	report(3)
	if slices.ContainsFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgPrecopy && m.To == 3 }) {
		t.Fatalf("sent %v: 3, holding more than the chain restarted from, was joined", sent)
	}
	if n := strings.Count(logs.String(), "left out of the chain's restart"); n != 1 {
		t.Fatalf("the refusal logged %d times, want once:\n%s", n, logs.String())
	}
	length[3] = 0 // restarted on an empty directory
	report(3)
	if !slices.ContainsFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgPrecopy && m.To == 3 && m.Target == 2 }) {
		t.Fatalf("sent %v after 3 reported an empty history, want it joined (PRECOPY from 2)", sent)
	}
}

// TestHostedMasterRestartRefused (review35d): the RESTART carries what the
// chosen member reported; 3, restarted again since (empty: a memory
// member), refuses it. The master is down again, 3's next heartbeat is its
// new report, and the chain restarts from 2, the longest history left,
// recorded as such.
func TestHostedMasterRestartRefused(t *testing.T) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &fakeMeta{rec: &kv.ChainConfig{Group: 0, Members: []uint64{1, 2, 3}, Epoch: 4}}
	var sent []chain.Msg
	x, err := newMaster(Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	x.tick(now)
	now = t0.Add(lease + 2*hb)
	x.tick(now) // acting from the record
	length := map[chain.NodeID]uint64{1: 5, 2: 7, 3: 9}
	seq := uint64(0)
	restarted := func(id chain.NodeID) {
		seq++
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Refused: true, LA: length[id], LU: length[id]}})
	}
	for _, id := range []chain.NodeID{1, 2, 3, 1, 2} {
		restarted(id)
	}
	restart := func(to chain.NodeID) chain.Msg {
		t.Helper()
		i := slices.IndexFunc(sent, func(m chain.Msg) bool { return m.Type == chain.MsgRestart })
		if i < 0 || sent[i].To != to || sent[i].LA != length[to] || sent[i].LU != length[to] || !slices.Equal(meta.rec.Members, []uint64{uint64(to)}) {
			t.Fatalf("sent %v, record %v: want a RESTART to %d carrying its report (%d), recorded", sent, meta.rec.Members, to, length[to])
		}
		return sent[i]
	}
	r := restart(3)
	sent = sent[:0]
	x.step([]chain.Msg{{Type: chain.MsgRestartDone, From: 3, To: 9, Epoch: r.Epoch, Refused: true}})
	if !x.m.Down() {
		t.Fatal("not down after the chosen member refused the RESTART")
	}
	length[3] = 0
	restarted(3)
	r = restart(2)
	if r.Epoch <= meta.rec.Epoch-1 || meta.rec.Epoch <= 4 {
		t.Fatalf("RESTART to 2 at epoch %d, record at %d", r.Epoch, meta.rec.Epoch)
	}
}
