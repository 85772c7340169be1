package vr

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Scenario tests of the nilext fast path, one protocol step each, on cores
// driven by hand: messages are delivered and fsyncs reported only when the
// test says so (or at once with autoSync).

func nxConfig(self uint64, n int) Config {
	c := testConfig(self, n)
	nilextOn(&c)
	return c
}

// nilextOn turns the fast path on as the hand-driven tests run it: orders
// the d-log every 5 ms or 4 entries.
func nilextOn(c *Config) {
	c.Nilext, c.NilextBatch, c.NilextInterval = true, 4, 5*time.Millisecond
}

// newNxNet is a test network (tnet) of n replicas with the nilext fast
// path on (nilextOn), started without a nonce.
func newNxNet(t *testing.T, n int) *tnet {
	t.Helper()
	return newNetOf(t, n, nilextOn, func(uint64) State { return State{Bootstrap: true} })
}

func nxReq(client, req uint64, key string, sync bool) NilextRequest {
	return NilextRequest{Request: Request{Client: client, ReqNum: req, Data: []byte(key + "=" + fmt.Sprint(client, req))},
		Keys: [][]byte{[]byte(key)}, Sync: sync}
}

// send gives a nilext update to the listed replicas (all if none).
func (x *tnet) send(q NilextRequest, to ...uint64) {
	x.t.Helper()
	if len(to) == 0 {
		to = x.ids
	}
	for _, id := range to {
		if err := x.rs[id].Nilext(x.now, q); err != nil {
			x.t.Fatalf("replica %d refused %v: %v", id, q.Request, err)
		}
		x.ready(id)
	}
}

func (x *tnet) complete(client, req uint64) bool {
	tr := NewNilextTracker(x.ids)
	for _, a := range x.nxAcks[client] {
		if a.ReqNum == req && tr.Add(a) {
			return true
		}
	}
	return false
}

func logReqs(r *Replica) []uint64 {
	var out []uint64
	for op := r.first; op <= r.lastOp(); op++ {
		out = append(out, r.entry(op).ReqNum)
	}
	return out
}

// TestNilextSyncAckWaitsForDisk: a sync update is acknowledged only after the
// fsync covering its d-log entry; a cad/async one at once. Either way the
// entry goes to the disk (Ready.DLog).
func TestNilextSyncAckWaitsForDisk(t *testing.T) {
	x := newNxNet(t, 3)
	x.autoSync = false
	x.send(nxReq(10, 1, "k", true), 2)
	if len(x.nxAcks[10]) != 0 {
		t.Fatalf("sync update acknowledged before its fsync: %v", x.nxAcks[10])
	}
	if len(x.dlogDisk[2]) != 1 {
		t.Fatalf("d-log entry not handed to the disk: %v", x.dlogDisk[2])
	}
	x.sync(2)
	if len(x.nxAcks[10]) != 1 || x.nxAcks[10][0].From != 2 || x.nxAcks[10][0].View != 0 || x.nxAcks[10][0].Leader {
		t.Fatalf("want one follower ack in view 0 after the fsync, got %+v", x.nxAcks[10])
	}
	x.send(nxReq(11, 1, "k", false), 1)
	if len(x.nxAcks[11]) != 1 || !x.nxAcks[11][0].Leader {
		t.Fatalf("async update must be acknowledged at once (by the leader): %+v", x.nxAcks[11])
	}
}

// TestNilextTrackerRule: f + ceil(f/2) + 1 acks of one view, the leader's
// among them; fewer, mixed views or no leader do not complete.
func TestNilextTrackerRule(t *testing.T) {
	if got := []int{NilextSupermajority(3), NilextSupermajority(5), NilextSupermajority(7)}; !slices.Equal(got, []int{3, 4, 6}) {
		t.Fatalf("supermajorities %v, want [3 4 6]", got)
	}
	ids := memberIDs(5)
	ack := func(from, view uint64) NilextAck {
		return NilextAck{Client: 9, ReqNum: 1, From: from, View: view, Leader: ids[view%5] == from}
	}
	tr := NewNilextTracker(ids)
	for _, a := range []NilextAck{ack(2, 0), ack(3, 0), ack(4, 0), ack(4, 0)} {
		if tr.Add(a) {
			t.Fatal("completed without the leader's ack")
		}
	}
	if tr.Add(ack(2, 1)) || tr.Add(ack(3, 1)) {
		t.Fatal("acks of another view counted")
	}
	// 5 does not lead view 0: its claim is not believed (its ack counts).
	if tr.Add(NilextAck{Client: 9, ReqNum: 1, From: 5, View: 0, Leader: true}) {
		t.Fatal("a replica that does not lead view 0 completed the update by claiming to")
	}
	if !tr.Add(ack(1, 0)) {
		t.Fatal("four acks of view 0 with the leader's did not complete")
	}
}

// TestNilextRetransmitAndStraggler: a retransmission keeps its first d-log
// position and is acknowledged again; a copy arriving after the update was
// applied is acknowledged from the client table and never re-added.
func TestNilextRetransmitAndStraggler(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "a", true))
	x.send(nxReq(11, 1, "b", true))
	x.send(nxReq(10, 1, "a", true))
	if got := x.rs[2].DLog(); len(got) != 2 || got[0].Client != 10 || got[1].Client != 11 {
		t.Fatalf("d-log after a retransmission: %v", got)
	}
	if n := len(x.nxAcks[10]); n != 6 {
		t.Fatalf("want the retransmission acknowledged again (6 acks), got %d", n)
	}
	x.tick(5 * time.Millisecond) // the finalizer's interval
	x.deliver(nil)
	x.tick(10 * time.Millisecond) // heartbeat carries the commit point to followers
	x.deliver(nil)
	for _, id := range x.ids {
		if in := x.rs[id].Info(); in.DLogLen != 0 || in.Applied != 2 {
			t.Fatalf("replica %d after finalization: %+v", id, in)
		}
	}
	if len(x.replies[1]) != 0 {
		t.Fatalf("background-ordered updates must not produce Replies: %v", x.replies[1])
	}
	before := len(x.nxAcks[10])
	x.send(nxReq(10, 1, "a", true))
	if len(x.nxAcks[10]) != before+3 {
		t.Fatal("straggler copy of an applied update not acknowledged")
	}
	for _, id := range x.ids {
		if x.rs[id].Info().DLogLen != 0 {
			t.Fatalf("replica %d re-added an applied update to its d-log", id)
		}
	}
}

// TestNilextOrphansCollected: a copy that reached one follower only (its
// client moved on) leaves that follower's d-log once a later request of the
// same client is applied, without waiting for a view change.
func TestNilextOrphansCollected(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", true), 3)
	x.send(nxReq(10, 2, "k", true))
	x.tick(5 * time.Millisecond)
	x.deliver(nil)
	x.tick(10 * time.Millisecond)
	x.deliver(nil)
	for _, id := range x.ids {
		if in := x.rs[id].Info(); in.DLogLen != 0 || in.Applied != 1 {
			t.Fatalf("replica %d: %+v (the orphan of request 1 must be gone)", id, in)
		}
	}
}

// TestNilextBackgroundBatch: the leader orders its d-log, in d-log order,
// once NilextBatch entries wait (without waiting for the timer).
func TestNilextBackgroundBatch(t *testing.T) {
	x := newNxNet(t, 3)
	for i := uint64(1); i <= 3; i++ {
		x.send(nxReq(10+i, 1, "k", true))
	}
	x.deliver(nil)
	if got := x.rs[1].Info().LastOp; got != 0 {
		t.Fatalf("3 < batch 4 entries ordered before the interval: last op %d", got)
	}
	x.send(nxReq(20, 1, "k", true))
	x.deliver(nil)
	if got := logReqs(x.rs[1]); len(got) != 4 {
		t.Fatalf("a full batch was not ordered: log %v", got)
	}
	var order []uint64
	for op := uint64(1); op <= 4; op++ {
		order = append(order, x.rs[1].entry(op).Client)
	}
	if !slices.Equal(order, []uint64{11, 12, 13, 20}) {
		t.Fatalf("consensus log order %v is not the leader's d-log order", order)
	}
}

// TestNilextSlowRead: a read of a key with a pending update orders the d-log
// and is released only once it is committed; other keys go the usual way.
func TestNilextSlowRead(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", true))
	l := x.rs[1]
	slow, err := l.ReadNilext(x.now, 77, [][]byte{[]byte("other")})
	if err != nil || slow {
		t.Fatalf("read of a key without pending updates: slow=%t err=%v", slow, err)
	}
	slow, err = l.ReadNilext(x.now, 78, [][]byte{[]byte("k")})
	if err != nil || !slow {
		t.Fatalf("read of a pending key must take the slow path: slow=%t err=%v", slow, err)
	}
	x.ready(1)
	if len(x.reads[1]) != 0 {
		t.Fatal("slow read released before the pending update committed")
	}
	x.deliver(nil)
	if len(x.reads[1]) != 1 || x.reads[1][0].Ctx != 78 || x.reads[1][0].Index < 1 {
		t.Fatalf("slow read not released at the update's op: %+v", x.reads[1])
	}
	if in := l.Info(); in.NilextSlowReads != 1 {
		t.Fatalf("slow reads counted %d, want 1", in.NilextSlowReads)
	}
	if _, err := x.rs[2].ReadNilext(x.now, 1, nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower read: %v", err)
	}
}

// TestNilextProposeOrdersPendingFirst: a non-nilext update goes after every
// pending nilext update.
func TestNilextProposeOrdersPendingFirst(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", true))
	x.send(nxReq(11, 1, "j", true))
	if err := x.rs[1].Propose(x.now, Request{Client: 12, ReqNum: 1, Data: []byte("cas")}); err != nil {
		t.Fatal(err)
	}
	x.ready(1)
	x.deliver(nil)
	var order []uint64
	for op := uint64(1); op <= x.rs[1].lastOp(); op++ {
		order = append(order, x.rs[1].entry(op).Client)
	}
	if !slices.Equal(order, []uint64{10, 11, 12}) {
		t.Fatalf("log order %v, want the pending d-log first", order)
	}
	if len(x.replies[1]) != 1 || x.replies[1][0].Client != 12 {
		t.Fatalf("only the proposed update gets a Reply: %+v", x.replies[1])
	}
}

// TestNilextViewChangeRecoversDLog: the leader dies with completed updates
// only in d-logs; the new leader puts them in its start log (in real-time
// order) and followers drop their d-logs.
func TestNilextViewChangeRecoversDLog(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", true))
	x.send(nxReq(11, 1, "k", true))
	if !x.complete(10, 1) || !x.complete(11, 1) {
		t.Fatal("updates did not complete")
	}
	if x.rs[1].Info().LastOp != 0 {
		t.Fatal("finalizer ran; the scenario needs pending entries")
	}
	delete(x.rs, 1)
	x.ids = []uint64{2, 3}
	for range 10 {
		x.tick(25 * time.Millisecond)
		x.deliver(nil)
	}
	l := x.rs[2]
	if in := l.Info(); !in.IsLeader || in.View != 1 {
		t.Fatalf("replica 2 should lead view 1: %+v", in)
	}
	var got []uint64
	for op := uint64(1); op <= l.lastOp(); op++ {
		got = append(got, l.entry(op).Client)
	}
	if !slices.Equal(got, []uint64{10, 11}) {
		t.Fatalf("new leader's log %v, want the recovered updates 10, 11 in order", got)
	}
	for _, id := range x.ids {
		if in := x.rs[id].Info(); in.DLogLen != 0 || in.Applied != 2 {
			t.Fatalf("replica %d after the view change: %+v", id, in)
		}
	}
}

// TestNilextRestartKeepsDLog: a restarted replica gets its d-log back from
// the disk records, minus what its client table shows executed.
func TestNilextRestartKeepsDLog(t *testing.T) {
	cfg := nxConfig(2, 3)
	st := State{HardState: HardState{View: 0, LastNormalView: 0},
		Snapshot: &Snapshot{Op: 1, Clients: []ClientRecord{{Client: 10, ReqNum: 1, Op: 1}}},
		DLog:     []NilextRequest{nxReq(10, 1, "k", true), nxReq(11, 1, "k", true)}}
	r, err := New(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.DLog(); len(got) != 1 || got[0].Client != 11 || !r.NilextPending([]byte("k")) {
		t.Fatalf("restored d-log %v", got)
	}
}

func nx(c uint64) NilextRequest { return NilextRequest{Request: Request{Client: c, ReqNum: 1}} }

func clients(rs []NilextRequest) []uint64 {
	var out []uint64
	for _, q := range rs {
		out = append(out, q.Client)
	}
	return out
}

// TestRecoverDurabilityLogFigure8: the paper's example (f = 2): a before c
// in >= 2 of 3 logs, a and b unordered; an update in one log only is not
// completed and is dropped.
func TestRecoverDurabilityLogFigure8(t *testing.T) {
	a, b, c, d := nx(1), nx(2), nx(3), nx(4)
	got, err := RecoverDurabilityLog([][]NilextRequest{{a, b, c}, {b, a, c, d}, {a, c}}, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g := clients(got); !slices.Equal(g, []uint64{1, 2, 3}) && !slices.Equal(g, []uint64{2, 1, 3}) {
		t.Fatalf("recovered %v", g)
	}
}

// TestRecoverDurabilityLogCycle: the digest 004 §6.1 logs form the cycle
// x→y→z→x: refused with three logs; with all five (S1 = S5 = [x y z]) the
// threshold rises to 4 and the order is x y z.
func TestRecoverDurabilityLogCycle(t *testing.T) {
	x, y, z := nx(1), nx(2), nx(3)
	three := [][]NilextRequest{{z, x, y}, {x, y, z}, {y, z, x}}
	if _, err := RecoverDurabilityLog(three, 5); !errors.Is(err, ErrDLogCycle) {
		t.Fatalf("cycle not detected: %v", err)
	}
	all := append([][]NilextRequest{{x, y, z}}, append(three, []NilextRequest{x, y, z})...)
	got, err := RecoverDurabilityLog(all, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g := clients(got); !slices.Equal(g, []uint64{1, 2, 3}) {
		t.Fatalf("recovered %v, want x y z", g)
	}
	if _, err := RecoverDurabilityLog(three[:1], 5); err == nil {
		t.Fatal("one log of five accepted: a completed update may be in none of them")
	}
}

// TestRecoverDurabilityLogF1NeverCycles: with f = 1 the edge relation is an
// intersection of two orders; random logs never cycle, and an update in only
// one of the two logs is dropped (a completed one is in all three d-logs).
func TestRecoverDurabilityLogF1NeverCycles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		var logs [][]NilextRequest
		for range 2 {
			var l []NilextRequest
			for _, c := range rng.Perm(6) {
				if rng.IntN(5) > 0 {
					l = append(l, nx(uint64(c+1)))
				}
			}
			logs = append(logs, l)
		}
		got, err := RecoverDurabilityLog(logs, 3)
		if err != nil {
			t.Fatalf("case %d: %v on %v", i, err, logs)
		}
		for _, q := range got {
			if !slices.ContainsFunc(logs[0], func(p NilextRequest) bool { return p.Client == q.Client }) ||
				!slices.ContainsFunc(logs[1], func(p NilextRequest) bool { return p.Client == q.Client }) {
				t.Fatalf("case %d: kept %d, which is not in both logs", i, q.Client)
			}
		}
	}
}

// TestNilextOffByDefault: without Config.Nilext the core refuses nilext
// updates and behaves as before.
func TestNilextOffByDefault(t *testing.T) {
	r, err := New(testConfig(1, 3), State{Bootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Nilext(1, nxReq(1, 1, "k", true)); !errors.Is(err, ErrNilextOff) {
		t.Fatalf("got %v", err)
	}
	if slow, err := r.ReadNilext(1, 1, [][]byte{[]byte("k")}); slow || err != nil {
		t.Fatalf("read with the fast path off: slow=%t err=%v", slow, err)
	}
	bad := nxConfig(1, 3)
	bad.NilextBatch = -1
	if err := bad.Validate(); err == nil {
		t.Fatal("negative nilext batch accepted")
	}
}

// randomExecutions checks the counting argument on random executions:
// nilext updates reach each of n replicas at random times (or never),
// complete when `quorum` replicas including the leader (replica 0) hold them,
// and the leader crashes at a random time. From the d-logs of a random set of
// V >= f+1 survivors, whenever recovery succeeds, every completed update must
// be kept and every update that completed before another was invoked must
// come first. It returns the violations (the first few are logged) and counts
// cycles.
func randomExecutions(t *testing.T, n, quorum, cases int) (violations, recovered, cycles int) {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(quorum)))
	for c := 0; c < cases; c++ {
		ops := 2 + rng.IntN(6)
		inv := make([]float64, ops)
		arr := make([][]float64, ops) // arr[op][replica], -1 never
		done := make([]float64, ops)  // completion time, -1 never
		for o := range ops {
			inv[o] = rng.Float64() * 10
			arr[o] = make([]float64, n)
			var got []float64
			for r := range n {
				arr[o][r] = -1
				if rng.IntN(6) > 0 {
					arr[o][r] = inv[o] + rng.ExpFloat64()*2
					got = append(got, arr[o][r])
				}
			}
			done[o] = -1
			if arr[o][0] >= 0 && len(got) >= quorum {
				slices.Sort(got)
				done[o] = max(got[quorum-1], arr[o][0])
			}
		}
		crash := rng.Float64() * 14
		survivors := rng.Perm(n - 1) // the leader is gone
		v := (n-1)/2 + 1 + rng.IntN(n-1-(n-1)/2)
		var logs [][]NilextRequest
		for _, s := range survivors[:v] {
			r := s + 1
			var idx []int
			for o := range ops {
				if arr[o][r] >= 0 && arr[o][r] < crash {
					idx = append(idx, o)
				}
			}
			slices.SortFunc(idx, func(a, b int) int {
				switch {
				case arr[a][r] < arr[b][r]:
					return -1
				case arr[a][r] > arr[b][r]:
					return 1
				}
				return 0
			})
			var l []NilextRequest
			for _, o := range idx {
				l = append(l, nx(uint64(o+1)))
			}
			logs = append(logs, l)
		}
		got, err := RecoverDurabilityLog(logs, n)
		if errors.Is(err, ErrDLogCycle) {
			cycles++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		recovered++
		pos := map[int]int{}
		for i, q := range got {
			pos[int(q.Client)-1] = i
		}
		for a := range ops {
			if done[a] < 0 || done[a] >= crash {
				continue
			}
			pa, in := pos[a]
			if !in {
				if violations++; violations <= 3 {
					t.Logf("n=%d case %d: completed update %d lost; logs %v", n, c, a+1, logs)
				}
				continue
			}
			for b := range ops {
				if pb, in := pos[b]; in && done[a] < inv[b] && pb < pa {
					if violations++; violations <= 3 {
						t.Logf("n=%d case %d: %d completed before %d was invoked but is ordered after it", n, c, a+1, b+1)
					}
				}
			}
		}
	}
	return violations, recovered, cycles
}

// TestRecoverDurabilityLogRandomExecutions: with the supermajority rule no
// random execution loses a completed update or breaks real-time order, and
// f = 1 never meets a cycle.
func TestRecoverDurabilityLogRandomExecutions(t *testing.T) {
	for _, n := range []int{3, 5, 7} {
		bad, ok, cycles := randomExecutions(t, n, NilextSupermajority(n), 4000)
		t.Logf("n=%d: %d recoveries checked, %d met a cycle", n, ok, cycles)
		if bad > 0 {
			t.Errorf("n=%d: %d violations", n, bad)
		}
		if n == 3 && cycles > 0 {
			t.Errorf("f = 1 met %d cycles", cycles)
		}
	}
}

// TestMutationRandomExecutionsSimpleMajority: the same checks catch the
// simple-majority completion rule (Figure 6's hazard).
func TestMutationRandomExecutionsSimpleMajority(t *testing.T) {
	bad, ok, _ := randomExecutions(t, 5, 3, 4000)
	if bad == 0 {
		t.Fatalf("simple majority survived %d recoveries", ok)
	}
	t.Logf("caught: %d violations in %d recoveries", bad, ok)
}

// BenchmarkRecoverDurabilityLog: a view change's d-log recovery cost with
// 5 logs of m pending updates in slightly different orders.
func BenchmarkRecoverDurabilityLog(b *testing.B) {
	for _, m := range []int{100, 1000} {
		b.Run(fmt.Sprint("m=", m), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			logs := make([][]NilextRequest, 5)
			for i := range logs {
				for o := range m {
					logs[i] = append(logs[i], nx(uint64(o+1)))
				}
				for range m / 10 { // local swaps: concurrent arrivals
					j := rng.IntN(m - 1)
					logs[i][j], logs[i][j+1] = logs[i][j+1], logs[i][j]
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := RecoverDurabilityLog(logs, 5); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestNilextInDLog: a request is in the d-log from its arrival until it is
// applied, at the leader and at followers, and only while normal; a request
// proposed through the ordered path is not.
func TestNilextInDLog(t *testing.T) {
	x := newNxNet(t, 3)
	x.send(nxReq(10, 1, "k", true))
	x.deliver(nil)
	for _, id := range x.ids {
		if !x.rs[id].InDLog(10, 1) {
			t.Fatalf("replica %d: pending request not in its d-log", id)
		}
		if x.rs[id].InDLog(10, 2) || x.rs[id].InDLog(11, 1) {
			t.Fatalf("replica %d: InDLog true for a request it never took", id)
		}
	}
	x.rs[1].nxOrder()
	x.ready(1)
	x.deliver(nil)
	x.tick(10 * time.Millisecond) // the heartbeat carries the commit to the followers
	x.deliver(nil)
	for _, id := range x.ids {
		if x.rs[id].InDLog(10, 1) {
			t.Fatalf("replica %d: applied request still in its d-log (applied %d)", id, x.rs[id].Info().Applied)
		}
	}
	x.send(nxReq(12, 1, "k", true))
	x.deliver(nil)
	x.rs[2].status = ViewChange
	if x.rs[2].InDLog(12, 1) {
		t.Fatal("InDLog true at a replica that is not normal")
	}
}

// TestNilextSyncHint: the leader's prepare and heartbeat ask followers to
// sync (SyncWanted) while a slow-path read waits for their commit, and
// not for background ordering.
func TestNilextSyncHint(t *testing.T) {
	x := newNxNet(t, 3)
	wanted := func() (prepares, wanted int) {
		for i := range x.q {
			if m := &x.q[i]; m.From == 1 && (m.Type == MsgPrepare || m.Type == MsgCommit) {
				if m.Type == MsgPrepare {
					prepares++
				}
				if SyncWanted(m) {
					wanted++
				}
			}
		}
		return prepares, wanted
	}
	x.send(nxReq(10, 1, "k", true))
	x.deliver(nil)
	x.rs[1].nxOrder()
	x.ready(1)
	if p, w := wanted(); p == 0 || w != 0 {
		t.Fatalf("background ordering: %d prepares, %d asking for a sync; want some, none", p, w)
	}
	x.deliver(nil)
	x.send(nxReq(11, 1, "k", true))
	x.deliver(nil)
	if slow, err := x.rs[1].ReadNilext(x.now, 5, [][]byte{[]byte("k")}); err != nil || !slow {
		t.Fatalf("slow read: %v %v", slow, err)
	}
	x.ready(1)
	if p, w := wanted(); p == 0 || w == 0 {
		t.Fatalf("ordering for a slow-path read: %d prepares, %d asking for a sync; want both > 0", p, w)
	}
	x.deliver(nil)
	if len(x.reads[1]) != 1 {
		t.Fatalf("slow read not released: %+v", x.reads[1])
	}
	x.tick(10 * time.Millisecond)
	if _, w := wanted(); w != 0 {
		t.Fatal("heartbeat asks for a sync with no read waiting")
	}
}
