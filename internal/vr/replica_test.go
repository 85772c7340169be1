package vr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Scenario tests: each drives a few cores by hand through one protocol step
// and checks the actions they emit. The harness delivers messages only when
// told to, and fsyncs only when told to (or always, with autoSync).

const ms = int64(time.Millisecond)

type tnet struct {
	t        *testing.T
	now      int64
	rs       map[uint64]*Replica
	ids      []uint64
	q        []Message
	autoSync bool
	unsynced map[uint64]uint64 // highest persist seq issued, not yet synced
	applied  map[uint64][]Committed
	replies  map[uint64][]Reply
	reads    map[uint64][]ReadState
	snapReq  map[uint64][]uint64
	errs     map[uint64][]error
	acks     map[uint64][]Reply // early acknowledgements (Ready.Acks)
	sent     []Message          // every message emitted, for assertions
	// nxAcks are the nilext acknowledgements (Ready.NilextAcks) by client,
	// and dlogDisk each replica's d-log records handed to its disk
	// (Ready.DLog): the nilext tests' view of the fast path.
	nxAcks   map[uint64][]NilextAck
	dlogDisk map[uint64][]NilextRequest
	// onReady and onSync, if set, see every Ready ready() performs and every
	// Persisted sync() reports (the datadriven interaction tests print them).
	onReady func(id uint64, rd *Ready)
	onSync  func(id, seq uint64)
}

func testConfig(self uint64, n int) Config {
	return Config{Cluster: 42, Epoch: 1, Members: memberIDs(n), Self: self,
		HeartbeatInterval: 10 * time.Millisecond, ViewChangeTimeout: 100 * time.Millisecond,
		LeaseDuration: 50 * time.Millisecond, MaxDrift: 0.01, MaxBatch: 8, MaxInflight: 64}
}

func newNet(t *testing.T, n int) *tnet {
	t.Helper()
	return newNetWith(t, n, nil)
}

// newNetWith is newNet with adjust applied to every replica's config.
func newNetWith(t *testing.T, n int, adjust func(*Config)) *tnet {
	t.Helper()
	return newNetOf(t, n, adjust, func(id uint64) State { return State{Bootstrap: true, Nonce: id << 40} })
}

// newNetOf starts n replicas, each from testConfig with adjust applied (nil:
// none) and the start state start gives for it.
func newNetOf(t *testing.T, n int, adjust func(*Config), start func(id uint64) State) *tnet {
	t.Helper()
	net := &tnet{t: t, now: 1000 * ms, rs: map[uint64]*Replica{}, autoSync: true, unsynced: map[uint64]uint64{},
		applied: map[uint64][]Committed{}, replies: map[uint64][]Reply{}, reads: map[uint64][]ReadState{},
		snapReq: map[uint64][]uint64{}, errs: map[uint64][]error{}, acks: map[uint64][]Reply{},
		nxAcks: map[uint64][]NilextAck{}, dlogDisk: map[uint64][]NilextRequest{}}
	for _, id := range memberIDs(n) {
		cfg := testConfig(id, n)
		if adjust != nil {
			adjust(&cfg)
		}
		r, err := New(cfg, start(id))
		if err != nil {
			t.Fatal(err)
		}
		net.rs[id] = r
		net.ids = append(net.ids, id)
	}
	for _, id := range net.ids {
		net.rs[id].Tick(net.now)
		net.ready(id)
	}
	return net
}

// ready performs one replica's actions: persist (sync now if autoSync),
// queue messages, apply committed entries (result "r<op>").
func (n *tnet) ready(id uint64) {
	r := n.rs[id]
	for i := 0; i < 50; i++ {
		rd := r.Ready()
		if rd.Empty() {
			return
		}
		if n.onReady != nil {
			n.onReady(id, &rd)
		}
		if rd.PersistSeq != 0 {
			n.unsynced[id] = rd.PersistSeq
		}
		n.dlogDisk[id] = append(n.dlogDisk[id], rd.DLog...)
		n.q = append(n.q, rd.Messages...)
		n.sent = append(n.sent, rd.Messages...)
		if len(rd.Committed) > 0 {
			res := make([][]byte, len(rd.Committed))
			for i, c := range rd.Committed {
				if !c.Duplicate {
					res[i] = []byte(fmt.Sprintf("r%d", c.Op))
				}
			}
			n.applied[id] = append(n.applied[id], rd.Committed...)
			r.Advance(res)
		}
		for _, a := range rd.NilextAcks {
			n.nxAcks[a.Client] = append(n.nxAcks[a.Client], a)
		}
		n.replies[id] = append(n.replies[id], rd.Replies...)
		n.acks[id] = append(n.acks[id], rd.Acks...)
		n.reads[id] = append(n.reads[id], rd.ReadStates...)
		n.snapReq[id] = append(n.snapReq[id], rd.SnapshotNeeded...)
		n.errs[id] = append(n.errs[id], rd.Errors...)
		if n.autoSync && n.unsynced[id] != 0 {
			n.sync(id)
		}
	}
	n.t.Fatalf("replica %d: Ready never empties", id)
}

func (n *tnet) sync(id uint64) {
	if s := n.unsynced[id]; s != 0 {
		delete(n.unsynced, id)
		if n.onSync != nil {
			n.onSync(id, s)
		}
		n.rs[id].Persisted(s)
		n.ready(id)
	}
}

// deliver delivers queued messages (those keep returns true for; others are
// dropped) until the network is quiet.
func (n *tnet) deliver(keep func(Message) bool) {
	for i := 0; len(n.q) > 0; i++ {
		if i > 100000 {
			n.t.Fatal("network never quiets")
		}
		m := n.q[0]
		n.q = n.q[1:]
		if keep != nil && !keep(m) {
			continue
		}
		if r := n.rs[m.To]; r != nil {
			r.Step(n.now, m)
			n.ready(m.To)
		}
	}
}

// deliverOnce delivers the messages queued now that keep accepts, drops the
// other queued ones, and leaves the replies queued.
func (n *tnet) deliverOnce(keep func(Message) bool) {
	q := n.q
	n.q = nil
	for _, m := range q {
		if keep(m) {
			n.rs[m.To].Step(n.now, m)
			n.ready(m.To)
		}
	}
}

func (n *tnet) tick(d time.Duration, ids ...uint64) {
	n.now += int64(d)
	if len(ids) == 0 {
		ids = n.ids
	}
	for _, id := range ids {
		n.rs[id].Tick(n.now)
		n.ready(id)
	}
}

func (n *tnet) propose(id uint64, client, req uint64, data string) error {
	err := n.rs[id].Propose(n.now, Request{Client: client, ReqNum: req, Data: []byte(data)})
	return err
}

// writes has replica id order k writes (clients from+1..from+k, request 1),
// delivering what keep lets through (nil: everything) after each.
func (n *tnet) writes(id, from uint64, k int, data string, keep func(Message) bool) {
	n.t.Helper()
	for i := uint64(1); i <= uint64(k); i++ {
		if err := n.propose(id, from+i, 1, data); err != nil {
			n.t.Fatal(err)
		}
		n.ready(id)
		n.deliver(keep)
	}
}

func (n *tnet) count(typ MsgType) int {
	c := 0
	for _, m := range n.sent {
		if m.Type == typ {
			c++
		}
	}
	return c
}

func only(types ...MsgType) func(Message) bool {
	return func(m Message) bool {
		for _, t := range types {
			if m.Type == t {
				return true
			}
		}
		return false
	}
}

// TestBatchedPipelinedPrepare: proposals between two Readys become one
// batch (one disk write, one prepare per follower); a second batch goes out
// before the first is acknowledged.
func TestBatchedPipelinedPrepare(t *testing.T) {
	n := newNet(t, 3)
	for i := uint64(1); i <= 5; i++ {
		if err := n.propose(1, 100+i, 1, "put"); err != nil {
			t.Fatal(err)
		}
	}
	n.autoSync = false
	rd := n.rs[1].Ready()
	if len(rd.Entries) != 5 || rd.PersistSeq == 0 {
		t.Fatalf("want one write of 5 entries, got %d entries seq %d", len(rd.Entries), rd.PersistSeq)
	}
	prepares := 0
	for _, m := range rd.Messages {
		if m.Type == MsgPrepare {
			prepares++
			if len(m.Entries) != 5 || m.First != 1 || m.Op != 5 {
				t.Fatalf("prepare should carry ops 1..5: %v", m)
			}
		}
	}
	if prepares != 2 {
		t.Fatalf("want one prepare per follower, got %d", prepares)
	}
	if err := n.propose(1, 200, 1, "put"); err != nil {
		t.Fatal(err)
	}
	rd2 := n.rs[1].Ready()
	if len(rd2.Entries) != 1 || rd2.Entries[0].Op != 6 || len(rd2.Messages) != 2 {
		t.Fatalf("second batch must go out while the first is unacknowledged: %+v", rd2)
	}
	if c := n.rs[1].CommitPoint(); c != 0 {
		t.Fatalf("nothing may commit before any fsync or ack, commit=%d", c)
	}
}

// TestPrepareOKOnlyAfterPersist: a follower reports entries it received at
// once (Op, counted only for early acks) but claims nothing persisted until
// its fsync covers the entries; then one prepare-ok covers the whole batch.
func TestPrepareOKOnlyAfterPersist(t *testing.T) {
	n := newNet(t, 3)
	n.autoSync = false
	n.propose(1, 7, 1, "a")
	n.propose(1, 8, 1, "b")
	n.ready(1)
	n.deliver(only(MsgPrepare))
	for _, m := range n.sent {
		if m.Type == MsgPrepareOK && m.Persisted > 0 {
			t.Fatalf("prepare-ok claims persisted before fsync: %v", m)
		}
	}
	n.q = nil
	n.sync(2)
	var oks []Message
	for _, m := range n.q {
		if m.Type == MsgPrepareOK {
			oks = append(oks, m)
		}
	}
	if len(oks) != 1 || oks[0].Persisted != 2 || oks[0].From != 2 {
		t.Fatalf("want one prepare-ok for op 2 from replica 2, got %v", oks)
	}
}

// TestCommitNeedsMajority: the leader's own fsync is not enough; one
// follower's ack (f+1 = 2 of 3) commits, and the leader answers the client.
func TestCommitNeedsMajority(t *testing.T) {
	n := newNet(t, 3)
	n.propose(1, 7, 1, "a")
	n.ready(1)
	// Replica 2 gets the prepare and persists it; replica 3 never does.
	n.deliverOnce(func(m Message) bool { return m.Type == MsgPrepare && m.To == 2 })
	if c := n.rs[1].CommitPoint(); c != 0 || len(n.q) == 0 || n.q[0].Type != MsgPrepareOK {
		t.Fatalf("committed %d with only the leader's copy (queue %v)", c, n.q)
	}
	n.deliver(nil)
	if c := n.rs[1].CommitPoint(); c != 1 {
		t.Fatalf("commit = %d, want 1 after a follower's ack", c)
	}
	if rs := n.replies[1]; len(rs) != 1 || rs[0].Client != 7 || string(rs[0].Result) != "r1" {
		t.Fatalf("want the leader's reply to client 7, got %+v", rs)
	}
}

// TestFollowersLearnCommitFromHeartbeat: followers apply once a heartbeat
// (or the next prepare) carries the commit point.
func TestFollowersLearnCommitFromHeartbeat(t *testing.T) {
	n := newNet(t, 3)
	n.propose(1, 7, 1, "a")
	n.ready(1)
	n.deliver(nil)
	if len(n.applied[2]) != 0 {
		t.Fatal("follower applied before learning the commit point")
	}
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)
	for _, id := range []uint64{2, 3} {
		if got := n.rs[id].Info(); got.Commit != 1 || len(n.applied[id]) != 1 {
			t.Fatalf("replica %d: %+v applied %d", id, got, len(n.applied[id]))
		}
		if len(n.replies[id]) != 0 {
			t.Fatalf("follower %d replied to a client", id)
		}
	}
}

// TestViewChange: when the leader goes silent, followers wait out their
// lease promise and the timeout, run start-view-change / do-view-change /
// start-view, and the new leader keeps the old leader's prepared entries.
func TestViewChange(t *testing.T) {
	n := newNet(t, 3)
	n.propose(1, 7, 1, "a")
	n.ready(1)
	n.deliver(nil) // op 1 prepared everywhere, committed at the leader only
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil) // heartbeat: followers now promise the lease
	delete(n.rs, 1)
	n.ids = []uint64{2, 3}
	n.tick(60 * time.Millisecond)
	if got := n.rs[2].Info().Status; got != Normal {
		t.Fatalf("a follower must not start a view change within its lease promise and timeout: %v", got)
	}
	for i := 0; i < 5; i++ {
		n.tick(25 * time.Millisecond)
		n.deliver(nil)
	}
	i2 := n.rs[2].Info()
	if !i2.IsLeader || i2.View != 1 || i2.LastOp != 1 {
		t.Fatalf("replica 2 should lead view 1 with op 1: %+v", i2)
	}
	if i3 := n.rs[3].Info(); i3.Status != Normal || i3.View != 1 || i3.Leader != 2 {
		t.Fatalf("replica 3 should follow view 1: %+v", i3)
	}
	for _, typ := range []MsgType{MsgStartViewChange, MsgDoViewChange, MsgStartView} {
		if n.count(typ) == 0 {
			t.Fatalf("no %v sent", typ)
		}
	}
	n.propose(2, 8, 1, "b")
	n.ready(2)
	n.deliver(nil)
	if c := n.rs[2].CommitPoint(); c != 2 {
		t.Fatalf("new leader's commit = %d, want 2 (op 1 from the old view, op 2 new)", c)
	}
}

// TestLeaseTiming: the lease needs acknowledgements from f followers,
// starts at the heartbeat's send time and lasts LeaderLease() = L(1-ρ)/(1+ρ).
func TestLeaseTiming(t *testing.T) {
	n := newNet(t, 3)
	if _, err := n.rs[1].LeaseRead(n.now); !errors.Is(err, ErrNoLease) {
		t.Fatalf("lease before any acknowledgement: %v", err)
	}
	n.tick(10*time.Millisecond, 1)
	sent := n.now
	n.now += int64(time.Millisecond)
	n.deliver(nil)
	if _, err := n.rs[1].LeaseRead(n.now); err != nil {
		t.Fatalf("lease after a majority acked: %v", err)
	}
	lease := int64(n.rs[1].Config().LeaderLease())
	if want := int64(50 * time.Millisecond * 99 / 101); lease < want-1 || lease > want {
		t.Fatalf("LeaderLease = %d, want %d", lease, want)
	}
	if _, err := n.rs[1].LeaseRead(sent + lease - 1); err != nil {
		t.Fatalf("lease must hold until send time + %d: %v", lease, err)
	}
	if _, err := n.rs[1].LeaseRead(sent + lease); !errors.Is(err, ErrNoLease) {
		t.Fatalf("lease must end at send time + lease: %v", err)
	}
	if _, err := n.rs[2].LeaseRead(n.now); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a follower has no lease: %v", err)
	}
	// LeaseUntil publishes the same lease for readers outside the driver.
	if until, commit, ok := n.rs[1].LeaseUntil(); !ok || until != sent+lease || commit != n.rs[1].CommitPoint() {
		t.Fatalf("LeaseUntil = %d, %d, %v; want %d, %d, true", until, commit, ok, sent+lease, n.rs[1].CommitPoint())
	}
	if _, _, ok := n.rs[2].LeaseUntil(); ok {
		t.Fatal("a follower publishes a lease")
	}
}

// TestLeaseUntilEndsWithLeadership: once the leader joins a view change
// it publishes no lease, though its followers' promises still run.
func TestLeaseUntilEndsWithLeadership(t *testing.T) {
	n := newNet(t, 3)
	// Past the promise a replica makes at start (observe), so the leader
	// may vote; the followers' acknowledgements are fresh.
	n.tick(60*time.Millisecond, 1)
	n.now += int64(time.Millisecond)
	n.deliver(nil)
	if _, _, ok := n.rs[1].LeaseUntil(); !ok {
		t.Fatal("no lease after a majority acked")
	}
	svc := Message{Type: MsgStartViewChange, View: 1}
	n.rs[3].stamp(&svc, 1)
	n.rs[1].Step(n.now, svc)
	if got := n.rs[1].Info().Status; got != ViewChange {
		t.Fatalf("leader status %v after a start-view-change, want it to join (ViewChange)", got)
	}
	if _, err := n.rs[1].LeaseRead(n.now); err == nil {
		t.Fatal("LeaseRead serves during a view change")
	}
	if _, _, ok := n.rs[1].LeaseUntil(); ok {
		t.Fatal("a leader that joined a view change still publishes its lease")
	}
}

// TestReadIndex: a read-index read is confirmed only by a heartbeat round
// sent after it was registered, acknowledged by f followers.
func TestReadIndex(t *testing.T) {
	n := newNet(t, 3)
	n.propose(1, 7, 1, "a")
	n.ready(1)
	n.deliver(nil)
	if err := n.rs[1].ReadIndex(n.now, 99); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	if len(n.reads[1]) != 0 {
		t.Fatal("read confirmed before any heartbeat acknowledgement")
	}
	n.deliver(func(m Message) bool { return m.To != 1 }) // acks lost
	if len(n.reads[1]) != 0 {
		t.Fatal("read confirmed without acknowledgements")
	}
	if err := n.rs[1].ReadIndex(n.now, 100); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	n.deliver(nil)
	got := n.reads[1]
	if len(got) != 2 || got[0].Index != 1 || got[0].Err != nil {
		t.Fatalf("want both reads confirmed at index 1, got %+v", got)
	}
	if err := n.rs[2].ReadIndex(n.now, 1); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower read index: %v", err)
	}
}

// TestClientTable: a retry of an executed request gets the cached reply; a
// request number below the table's is stale; a retry in flight is not
// ordered twice.
func TestClientTable(t *testing.T) {
	n := newNet(t, 3)
	n.propose(1, 7, 5, "a")
	n.propose(1, 7, 5, "a") // in flight: dropped
	n.ready(1)
	n.deliver(nil)
	if got := n.rs[1].Info().LastOp; got != 1 {
		t.Fatalf("a duplicate in flight was ordered again: last op %d", got)
	}
	n.replies[1] = nil
	if err := n.propose(1, 7, 5, "a"); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	if rs := n.replies[1]; len(rs) != 1 || string(rs[0].Result) != "r1" || rs[0].Op != 1 {
		t.Fatalf("duplicate must be answered from the table: %+v", rs)
	}
	if got := n.rs[1].Info().LastOp; got != 1 {
		t.Fatalf("a duplicate of an executed request was ordered: last op %d", got)
	}
	if err := n.propose(1, 7, 4, "old"); !errors.Is(err, ErrStaleRequest) {
		t.Fatalf("stale request: %v", err)
	}
	// Followers built the same table from the log.
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)
	tab := n.rs[3].ClientTable()
	if len(tab) != 1 || tab[0].Client != 7 || tab[0].ReqNum != 5 || string(tab[0].Result) != "r1" {
		t.Fatalf("follower's client table: %+v", tab)
	}
}

// TestDuplicateEntriesAreNotExecuted: if a retry was ordered twice (across a
// view change), the second copy is marked Duplicate for every replica.
func TestDuplicateEntriesAreNotExecuted(t *testing.T) {
	r, err := New(testConfig(2, 3), State{HardState: HardState{Commit: 2}, Entries: []Entry{
		{View: 0, Op: 1, Request: Request{Client: 7, ReqNum: 1, Data: []byte("incr")}},
		{View: 1, Op: 2, Request: Request{Client: 7, ReqNum: 1, Data: []byte("incr")}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.Tick(0)
	rd := r.Ready()
	if len(rd.Committed) != 2 || rd.Committed[0].Duplicate || !rd.Committed[1].Duplicate {
		t.Fatalf("want op 1 executed and op 2 marked duplicate: %+v", rd.Committed)
	}
	r.Advance([][]byte{[]byte("1"), nil})
}

// TestConfigMismatchRefused: a message from a different cluster, epoch or
// member list changes nothing; the receiver reports a ConfigError and tells
// the sender, which reports a RefusedError.
func TestConfigMismatchRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"cluster", func(c *Config) { c.Cluster = 43 }, "cluster 43"},
		{"epoch", func(c *Config) { c.Epoch = 0 }, "epoch 0"},
		{"peers", func(c *Config) { c.Members = []uint64{1, 2, 4} }, "member list or lease timing differs"},
		// Issue 24 item 4: the lease timing is part of the group's identity.
		{"lease", func(c *Config) { c.LeaseDuration = 20 * time.Millisecond }, "lease 50ms"},
		{"drift", func(c *Config) { c.MaxDrift = 0.05 }, "max drift 0.01"},
		{"mark-out", func(c *Config) { c.MarkOut = 30 * time.Millisecond }, "mark-out 100ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNet(t, 3)
			cfg := testConfig(1, 3)
			tc.mutate(&cfg)
			if tc.name == "peers" {
				cfg.Members = []uint64{1, 2, 4}
			}
			bad, err := New(cfg, State{Bootstrap: true})
			if err != nil {
				t.Fatal(err)
			}
			bad.Tick(n.now)
			bad.Propose(n.now, Request{Client: 1, ReqNum: 1})
			rd := bad.Ready()
			var m Message
			for _, x := range rd.Messages {
				if x.To == 2 {
					m = x
				}
			}
			before := n.rs[2].Info()
			n.rs[2].Step(n.now, m)
			n.ready(2)
			if after := n.rs[2].Info(); after != before {
				t.Fatalf("refused message changed state: %+v -> %+v", before, after)
			}
			errs := n.errs[2]
			var ce *ConfigError
			if len(errs) != 1 || !errors.As(errs[0], &ce) || !strings.Contains(ce.Error(), tc.want) {
				t.Fatalf("want a ConfigError mentioning %q, got %v", tc.want, errs)
			}
			var refuse Message
			for _, x := range n.q {
				if x.Type == MsgRefuse {
					refuse = x
				}
			}
			bad.Step(n.now, refuse)
			var re *RefusedError
			if rd := bad.Ready(); len(rd.Errors) != 1 || !errors.As(rd.Errors[0], &re) || re.By != 2 {
				t.Fatalf("sender must learn it was refused: %+v", rd.Errors)
			}
		})
	}
}

// TestStateTransferNeedsSnapshot: a follower that missed ops the leader has
// compacted away asks for state; the core asks the driver for a snapshot,
// sends it, and the follower installs it and catches up.
func TestStateTransferNeedsSnapshot(t *testing.T) {
	n := laggingThird(t) // the heartbeat showed replica 3 it is behind: get-state
	if c := n.rs[1].CommitPoint(); c != 10 {
		t.Fatalf("commit %d", c)
	}
	snap := Snapshot{Op: 10, Clients: n.rs[1].ClientTable(), Data: []byte("state@10")}
	if err := n.rs[1].SendSnapshot(3, snap); err != nil {
		t.Fatal(err)
	}
	n.ready(1)
	n.deliver(nil)
	i3 := n.rs[3].Info()
	if i3.Applied != 10 || i3.FirstOp != 11 || len(n.rs[3].ClientTable()) != 10 {
		t.Fatalf("replica 3 should have installed the snapshot at 10: %+v, %d clients", i3, len(n.rs[3].ClientTable()))
	}
	n.propose(1, 500, 1, "w")
	n.ready(1)
	n.deliver(nil)
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)
	if i3 := n.rs[3].Info(); i3.Commit != 11 {
		t.Fatalf("replica 3 should follow after the snapshot: %+v", i3)
	}
}

// laggingThird is a 3-replica group whose replica 3 missed ops 1..10 while
// the leader (1) compacted its log to 8: the heartbeat that followed showed
// replica 3 it is behind, and the leader asked its driver for one snapshot.
func laggingThird(t *testing.T) *tnet {
	t.Helper()
	n := newNet(t, 3)
	cut := func(m Message) bool { return m.To != 3 && m.From != 3 }
	n.writes(1, 100, 10, "w", cut)
	if err := n.rs[1].Compact(8); err != nil {
		t.Fatal(err)
	}
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)
	if got := n.snapReq[1]; len(got) != 1 || got[0] != 3 {
		t.Fatalf("leader should ask the driver for one snapshot, for replica 3: %v", got)
	}
	return n
}

// TestSnapshotIsNotRecapturedWhileOneMayBeInFlight: a replica that needs
// state asks again every heartbeat, and a capture scans the whole state, so
// once a snapshot went out the core asks the driver for another only after
// the view-change timeout, or after the time the last one takes at
// snapshotRate if that is longer (here 32 MiB: 500 ms).
func TestSnapshotIsNotRecapturedWhileOneMayBeInFlight(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int
		after time.Duration // no new request before, one soon after
	}{
		{"small", 8, 100 * time.Millisecond},
		{"32 MiB", 32 << 20, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := laggingThird(t)
			sentAt := n.now
			snap := Snapshot{Op: 10, Clients: n.rs[1].ClientTable(), Data: make([]byte, tc.size)}
			if err := n.rs[1].SendSnapshot(3, snap); err != nil {
				t.Fatal(err)
			}
			n.ready(1)
			lost := func(m Message) bool { return m.Snapshot == nil } // the snapshot is lost on the way
			for n.now+int64(10*time.Millisecond) < sentAt+int64(tc.after) {
				n.tick(10 * time.Millisecond)
				n.deliver(lost)
			}
			if got := n.snapReq[1]; len(got) != 1 {
				t.Fatalf("asked for %d snapshots within %v of sending one; want no new one yet", len(got), tc.after)
			}
			for range 3 {
				n.tick(10 * time.Millisecond)
				n.deliver(nil)
			}
			if got := n.snapReq[1]; len(got) != 2 {
				t.Fatalf("asked for %d snapshots after %v; want the lost one asked for again", len(got), tc.after)
			}
		})
	}
}

// TestARefusedSnapshotIsAskedForAgain: a snapshot the core refuses (its op
// is no longer in the log's range, e.g. compacted past while it was being
// captured) leaves the peer's request open, so the driver is asked again on
// the peer's next request instead of never.
func TestARefusedSnapshotIsAskedForAgain(t *testing.T) {
	n := laggingThird(t)
	if err := n.rs[1].SendSnapshot(3, Snapshot{Op: 5, Data: []byte("too old")}); err == nil {
		t.Fatal("a snapshot older than the log's first op must be refused")
	}
	for range 3 {
		n.tick(10 * time.Millisecond)
		n.deliver(nil)
	}
	if got := n.snapReq[1]; len(got) != 2 {
		t.Fatalf("asked for %d snapshots after a refused one; want it asked for again", len(got))
	}
}

// TestPreparesAreBoundedInBytes: a batch of large writes goes out as
// several prepares of at most MaxBatchBytes of request data (one entry alone
// when it is larger), and commits as one would.
func TestPreparesAreBoundedInBytes(t *testing.T) {
	n := newNetWith(t, 3, func(c *Config) { c.MaxBatch, c.MaxBatchBytes = 64, 10_000 })
	n.sent = nil
	sizes := []int{4000, 4000, 4000, 25_000, 100, 100}
	for i, size := range sizes {
		if err := n.propose(1, 100+uint64(i), 1, strings.Repeat("x", size)); err != nil {
			t.Fatal(err)
		}
	}
	n.ready(1)
	var got [][]int
	for _, m := range n.sent {
		if m.Type != MsgPrepare || m.To != 2 {
			continue
		}
		var b []int
		for _, e := range m.Entries {
			b = append(b, len(e.Data))
		}
		got = append(got, b)
	}
	if want := "[[4000 4000] [4000] [25000] [100 100]]"; fmt.Sprint(got) != want {
		t.Fatalf("prepares to replica 2 carry %v, want %s", got, want)
	}
	n.deliver(nil)
	if c := n.rs[1].CommitPoint(); c != uint64(len(sizes)) {
		t.Fatalf("commit %d, want %d", c, len(sizes))
	}
}

// TestASnapshotNoLongerWantedIsRefused: a capture that finishes after a
// view change ended the request is not sent (the driver captures off its
// goroutine, so the result can come late).
func TestASnapshotNoLongerWantedIsRefused(t *testing.T) {
	n := newNet(t, 3)
	if err := n.rs[1].SendSnapshot(3, Snapshot{Op: 0}); err == nil {
		t.Fatal("a snapshot nobody asked for must be refused")
	}
	n = laggingThird(t)
	n.rs[1].stepDown() // as when it joins a newer view
	n.sent = nil
	if err := n.rs[1].SendSnapshot(3, Snapshot{Op: 10, Clients: n.rs[1].ClientTable(), Data: []byte("late")}); err == nil {
		t.Fatal("a snapshot whose request a view change ended must be refused")
	}
	n.ready(1)
	for _, m := range n.sent {
		if m.Snapshot != nil {
			t.Fatalf("a refused snapshot was sent: %v", m)
		}
	}
}

// TestAFollowerHearingASnapshotArriveDoesNotStartAViewChange: while a
// large snapshot streams to a lagging follower, everything the leader sends
// it afterwards (heartbeats included) waits behind it on the same stream. The
// transport's progress (Heard) keeps the follower's view-change timer quiet,
// so the snapshot, which carries the view, is installed when it lands;
// without it the follower starts a view change and the snapshot of the old
// view is ignored.
func TestAFollowerHearingASnapshotArriveDoesNotStartAViewChange(t *testing.T) {
	for _, heard := range []bool{true, false} {
		t.Run(fmt.Sprintf("heard=%v", heard), func(t *testing.T) {
			n := laggingThird(t)
			if err := n.rs[1].SendSnapshot(3, Snapshot{Op: 10, Clients: n.rs[1].ClientTable(), Data: []byte("state@10")}); err != nil {
				t.Fatal(err)
			}
			n.ready(1)
			view := n.rs[3].Info().View
			var held []Message // leader to 3, behind the snapshot
			for range 30 {     // 300 ms: three view-change timeouts
				n.tick(10 * time.Millisecond)
				if heard {
					n.rs[3].Heard(n.now, 1)
					n.ready(3)
				}
				q := n.q
				n.q = nil
				for _, m := range q {
					if m.From == 1 && m.To == 3 {
						held = append(held, m)
						continue
					}
					if r := n.rs[m.To]; r != nil {
						r.Step(n.now, m)
						n.ready(m.To)
					}
				}
			}
			n.q = append(held, n.q...)
			n.deliver(nil)
			i3 := n.rs[3].Info()
			if heard && (i3.View != view || i3.Applied != 10) {
				t.Fatalf("replica 3 should have stayed in view %d and installed the snapshot: %+v", view, i3)
			}
			asked := false
			for _, m := range n.sent {
				asked = asked || (m.From == 3 && m.Type == MsgStartViewChange)
			}
			if !heard && !asked {
				// It only asks (a pre-vote): 1 and 2 still hear each other.
				t.Fatalf("without progress replica 3 should have suspected its leader (the test's control): %+v", i3)
			}
		})
	}
}

// TestCompactPointBoundsTheTailInBytes: the tail kept after a checkpoint
// is at most keepEntries entries and, of those, as many as fit keepBytes (at
// least the last one).
func TestCompactPointBoundsTheTailInBytes(t *testing.T) {
	n := newNet(t, 3)
	for i, size := range []int{10, 10, 10, 10, 500, 500, 10, 10} { // ops 1..8
		n.propose(1, 100+uint64(i), 1, strings.Repeat("x", size))
		n.ready(1)
		n.deliver(nil)
	}
	r := n.rs[1]
	for _, tc := range []struct {
		op, entries uint64
		bytes       int
		want        uint64
	}{
		{8, 1024, 1 << 20, 0}, // everything fits: nothing to drop
		{8, 3, 1 << 20, 5},    // three entries kept: 6, 7, 8
		{8, 1024, 100, 6},     // 7 and 8 (20 bytes) fit; 6 would not
		{8, 1024, 5, 7},       // the last entry is kept whatever its size
		{6, 1024, 600, 5},     // 6 (500 bytes) fits, 5 would not
		{4, 1024, 1 << 20, 0},
	} {
		if got := r.CompactPoint(tc.op, tc.entries, tc.bytes); got != tc.want {
			t.Errorf("CompactPoint(%d, %d, %d) = %d, want %d", tc.op, tc.entries, tc.bytes, got, tc.want)
		}
	}
}

// TestRecoveryProtocol: a replica that lost state neither votes nor
// acknowledges until f+1 replicas, the leader among them, answered its nonce.
func TestRecoveryProtocol(t *testing.T) {
	n := newNet(t, 3)
	n.writes(1, 100, 3, "w", nil)
	r, err := New(testConfig(3, 3), State{LostState: true, Nonce: 77})
	if err != nil {
		t.Fatal(err)
	}
	n.rs[3] = r
	n.sent = nil
	n.tick(time.Millisecond, 3)
	if c := n.count(MsgRecovery); c != 2 {
		t.Fatalf("recovering replica should ask both peers, sent %d: %v", c, n.sent)
	}
	// A prepare reaching it before recovery is not acknowledged.
	n.propose(1, 200, 1, "w")
	n.ready(1)
	n.deliver(func(m Message) bool { return m.Type == MsgPrepare })
	for _, m := range n.sent {
		if m.From == 3 && m.Type == MsgPrepareOK {
			t.Fatalf("recovering replica acknowledged: %v", m)
		}
	}
	if got := r.Info().Status; got != Recovering {
		t.Fatalf("status %v", got)
	}
	n.q = nil
	n.tick(10*time.Millisecond, 3)
	n.deliver(nil)
	if i := r.Info(); i.Status != Normal || i.LastOp != 4 || i.View != 0 {
		t.Fatalf("recovered replica should hold the leader's log: %+v", i)
	}
	// A stale response (another nonce) is ignored.
	r2, _ := New(testConfig(2, 3), State{LostState: true, Nonce: 5})
	r2.Tick(n.now)
	r2.Ready()
	r2.Step(n.now, Message{Type: MsgRecoveryResponse, Cluster: 42, Epoch: 1, ConfigHash: testConfig(1, 3).Hash(), From: 1, To: 2, Nonce: 4})
	r2.Step(n.now, Message{Type: MsgRecoveryResponse, Cluster: 42, Epoch: 1, ConfigHash: testConfig(1, 3).Hash(), From: 3, To: 2, Nonce: 4})
	if r2.Info().Status != Recovering {
		t.Fatal("responses with another nonce completed recovery")
	}
}

// TestInvariantsPanic: breaking an invariant panics with context instead of
// corrupting state.
func TestInvariantsPanic(t *testing.T) {
	n := newNet(t, 3)
	n.propose(1, 7, 1, "a")
	n.ready(1)
	n.deliver(nil)
	r := n.rs[1]
	for name, f := range map[string]func(){
		"truncate committed": func() { r.truncate(0) },
		"view goes back":     func() { r.setView(0); r.view = 5; r.setView(4) },
		"commit beyond log":  func() { r.setCommit(99) },
	} {
		func() {
			defer func() {
				p := recover()
				if p == nil || !strings.Contains(fmt.Sprint(p), "replica 1") {
					t.Errorf("%s: want a panic naming the replica, got %v", name, p)
				}
			}()
			f()
		}()
	}
}

// TestConfigValidate rejects configurations that cannot work.
func TestConfigValidate(t *testing.T) {
	good := testConfig(1, 3)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(*Config){
		"even":       func(c *Config) { c.Members = []uint64{1, 2} },
		"self":       func(c *Config) { c.Self = 9 },
		"duplicate":  func(c *Config) { c.Members = []uint64{1, 1, 2} },
		"lease>vct":  func(c *Config) { c.LeaseDuration = time.Second },
		"drift":      func(c *Config) { c.MaxDrift = 0.5 },
		"timeout<hb": func(c *Config) { c.ViewChangeTimeout = time.Millisecond },
	} {
		c := testConfig(1, 3)
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, c)
		}
	}
}

// TestRestartedLeaderMovesOn: a leader restarting from its disk (not a new
// group) never leads its old view again: it may have lost entries that
// followers hold under op numbers it would hand out anew.
func TestRestartedLeaderMovesOn(t *testing.T) {
	r, err := New(testConfig(1, 3), State{HardState: HardState{View: 3, LastNormalView: 3, Commit: 1},
		Entries: []Entry{{View: 3, Op: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if i := r.Info(); i.View != 4 || i.Status != ViewChange || i.LastNormalView != 3 {
		t.Fatalf("restarted leader of view 3: %+v", i)
	}
	f, err := New(testConfig(2, 3), State{HardState: HardState{View: 3, LastNormalView: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if i := f.Info(); i.View != 3 || i.Status != Normal {
		t.Fatalf("restarted follower should resume its view: %+v", i)
	}
	if _, err := New(testConfig(2, 3), State{Bootstrap: true, Entries: []Entry{{Op: 1}}}); err == nil {
		t.Fatal("bootstrap over existing state accepted")
	}
}

// TestLeasePromiseDefersViewChange: a follower that acknowledged a heartbeat
// does not join another replica's view change until its promise has run
// out, and meanwhile stops extending the leader's lease.
func TestLeasePromiseDefersViewChange(t *testing.T) {
	n := newNet(t, 3)
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil) // 2 and 3 promise until now+50ms
	svc := Message{Type: MsgStartViewChange, View: 1}
	n.rs[3].stamp(&svc, 2)
	n.rs[2].Step(n.now, svc)
	n.ready(2)
	if i := n.rs[2].Info(); i.Status != Normal || i.View != 0 {
		t.Fatalf("follower joined a view change within its promise: %+v", i)
	}
	n.q, n.sent = nil, nil
	n.tick(10*time.Millisecond, 1)
	n.deliver(nil)
	for _, m := range n.sent {
		if m.Type == MsgPrepareOK && m.From == 2 && m.HBSeq != 0 {
			t.Fatalf("follower with a pending view change still renews the lease: %v", m)
		}
	}
	n.tick(45*time.Millisecond, 2)
	if i := n.rs[2].Info(); i.Status != ViewChange || i.View != 1 {
		t.Fatalf("follower should join view 1 once its promise ran out: %+v", i)
	}
}

// TestNewLeaderPullsSnapshot: when the chosen do-view-change log starts after
// everything the new leader can vouch for (the others compacted it), the new
// leader fetches the chosen replica's snapshot before starting the view.
func TestNewLeaderPullsSnapshot(t *testing.T) {
	n := newNet(t, 3)
	cut := func(m Message) bool { return m.To != 2 && m.From != 2 }
	n.writes(1, 100, 10, "w", cut)
	n.tick(10*time.Millisecond, 1)
	n.deliver(cut)
	for _, id := range []uint64{1, 3} {
		if err := n.rs[id].Compact(8); err != nil {
			t.Fatal(err)
		}
	}
	delete(n.rs, 1) // the leader dies; 2 (far behind) leads view 1
	n.ids = []uint64{2, 3}
	for i := 0; i < 8 && len(n.snapReq[3]) == 0; i++ {
		n.tick(30 * time.Millisecond)
		n.deliver(nil)
	}
	if got := n.snapReq[3]; len(got) != 1 || got[0] != 2 {
		t.Fatalf("replica 3 should be asked for a snapshot for the new leader: %v (2: %+v)", got, n.rs[2].Info())
	}
	if err := n.rs[3].SendSnapshot(2, Snapshot{Op: 10, Clients: n.rs[3].ClientTable(), Data: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	n.ready(3)
	n.deliver(nil)
	if i := n.rs[2].Info(); !i.IsLeader || i.View != 1 || i.Commit != 10 || i.FirstOp != 11 {
		t.Fatalf("replica 2 should lead view 1 from the snapshot: %+v", i)
	}
	n.propose(2, 7, 1, "w")
	n.ready(2)
	n.deliver(nil)
	if c := n.rs[2].CommitPoint(); c != 11 {
		t.Fatalf("new view commits after the snapshot: %d", c)
	}
}

// TestReturningFollowerDoesNotDeposeTheLeader (issue 25 item 5): a follower
// restarts and does not hear the leader for three view-change timeouts (its
// links come back slowly); it suspects the leader and asks the others with
// pre-votes, but they still hear the leader and ignore it. No view change
// happens, and once the leader's messages reach it again it is a follower of
// the same view. With plain VR (noPreVote) it starts view 1 on its own and
// the leader joins at once.
func TestReturningFollowerDoesNotDeposeTheLeader(t *testing.T) {
	mutation.Require(t)
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "pre-vote", true: "noPreVote"}[plain], func(t *testing.T) {
			n := newNet(t, 3)
			for _, id := range n.ids {
				n.rs[id].mut.noPreVote = plain
			}
			n.propose(1, 7, 1, "a")
			n.ready(1)
			n.deliver(nil)
			n.tick(10 * time.Millisecond)
			n.deliver(nil)
			old := n.rs[3]
			r, err := New(old.cfg, State{HardState: old.lastHS, Entries: append([]Entry(nil), old.log...), Nonce: 5})
			if err != nil {
				t.Fatal(err)
			}
			r.mut.noPreVote = plain
			n.rs[3] = r
			cut := func(m Message) bool { return !(m.From == 1 && m.To == 3) }
			for range 30 { // 300 ms: three view-change timeouts
				n.tick(10 * time.Millisecond)
				n.deliver(cut)
			}
			for _, id := range n.ids[:2] {
				if i := n.rs[id].Info(); i.View != 0 || i.Status != Normal {
					if plain {
						return // the control: plain VR deposed the leader
					}
					t.Fatalf("replica %d left view 0 for a follower that did not hear the leader: %+v", id, i)
				}
			}
			if plain {
				t.Fatal("plain VR kept the leader: the test cannot see the disruption")
			}
			asked := 0
			for _, m := range n.sent {
				if m.From == 3 && m.Type == MsgStartViewChange && m.Op == preVoteMark {
					asked++
				}
			}
			if asked == 0 {
				t.Fatal("the cut-off follower never suspected its leader (the test's control)")
			}
			n.tick(10 * time.Millisecond)
			n.deliver(nil)
			if i := n.rs[3].Info(); i.View != 0 || i.Status != Normal || i.Commit != 1 {
				t.Fatalf("the returning follower did not rejoin view 0: %+v", i)
			}
			if err := n.propose(1, 7, 2, "b"); err != nil {
				t.Fatal(err)
			}
			n.ready(1)
			n.deliver(nil)
			if c := n.rs[1].CommitPoint(); c != 2 {
				t.Fatalf("leader of view 0 no longer commits: %d", c)
			}
		})
	}
}

// TestPreVotesStillReplaceADeadLeader: when the leader dies, the followers
// suspect it, each asks the other, and they start view 1 together; a
// follower that still hears its leader ignores a pre-vote.
func TestPreVotesStillReplaceADeadLeader(t *testing.T) {
	n := newNet(t, 3)
	n.tick(10 * time.Millisecond)
	n.deliver(nil)
	pv := Message{Type: MsgStartViewChange, View: 1, Op: preVoteMark}
	n.rs[3].stamp(&pv, 2)
	n.rs[2].Step(n.now, pv)
	n.ready(2)
	if i := n.rs[2].Info(); i.View != 0 || i.Status != Normal {
		t.Fatalf("a follower that hears its leader followed a pre-vote: %+v", i)
	}
	delete(n.rs, 1)
	n.ids = []uint64{2, 3}
	for i := 0; i < 20 && !n.rs[2].Info().IsLeader; i++ {
		n.tick(10 * time.Millisecond)
		n.deliver(nil)
	}
	if i := n.rs[2].Info(); !i.IsLeader || i.View != 1 {
		t.Fatalf("replica 2 should lead view 1 after the leader died: %+v (3: %+v)", i, n.rs[3].Info())
	}
}

// TestLateAckKeepsQuorumAck: a follower's acknowledgement of a heartbeat
// whose send time has left the leader's ring (hbRing heartbeats sent since:
// each Ready with a read-index read or a durability wait sends one) tells
// the leader that follower heard a heartbeat at least as late as the one it
// acked before. It must not erase what that earlier one showed: the lease
// would end early, and a leader whose followers all acknowledge it would
// count itself without a quorum and answer a lone peer's pre-vote
// (suspects).
func TestLateAckKeepsQuorumAck(t *testing.T) {
	n := newNet(t, 3)
	for i := 0; i < 12; i++ { // past the view-change timeout since the view began
		n.tick(10*time.Millisecond, 1)
		n.deliver(nil)
	}
	// A heartbeat reaches both followers; their acknowledgements are slow.
	n.tick(10*time.Millisecond, 1)
	n.deliverOnce(func(m Message) bool { return m.To != 1 })
	late := n.q
	n.q = nil
	// The leader sends more than a ring of heartbeats (read-index reads,
	// one a Ready), which never arrive.
	for i := 0; i <= hbRing; i++ {
		if err := n.rs[1].ReadIndex(n.now, uint64(1000+i)); err != nil {
			t.Fatal(err)
		}
		n.ready(1)
		n.q = nil
	}
	n.now += int64(time.Millisecond)
	n.q = late
	n.deliver(func(m Message) bool { return m.To == 1 })
	if _, err := n.rs[1].LeaseRead(n.now); err != nil {
		t.Fatalf("a late acknowledgement ended the lease its followers still back: %v", err)
	}
	if i := n.preVoteTo(3, 1); i.Status != Normal || i.View != 0 {
		t.Fatalf("a leader whose followers acknowledge it answered a lone pre-vote: %+v", i)
	}
}

// preVoteTo steps into replica to a pre-vote from replica from for the view
// after from's, and returns to's Info after it.
func (n *tnet) preVoteTo(from, to uint64) Info {
	pv := Message{Type: MsgStartViewChange, View: n.rs[from].Info().View + 1, Op: preVoteMark}
	n.rs[from].stamp(&pv, to)
	n.rs[to].Step(n.now, pv)
	return n.rs[to].Info()
}

// TestNewLeaderDoesNotSuspectItself: a replica that has just formed its
// view has heard no follower acknowledge it yet, and heard its old leader
// last more than a view-change timeout ago (it suspected it): it must count
// from the view's start (tryStartView), or the first pre-vote for the next
// view it gets — a replica whose view change to this view stalled — would
// move it on at once.
func TestNewLeaderDoesNotSuspectItself(t *testing.T) {
	n := newNet(t, 3)
	n.tick(60 * time.Millisecond) // past the promise each replica makes at start
	n.deliver(nil)
	away := func(m Message) bool { return m.From != 1 && m.To != 1 }
	for i := 0; i < 8 && (n.rs[2].Info().Status != Normal || n.rs[2].Info().View == 0); i++ {
		n.tick(30*time.Millisecond, 2, 3)
		n.deliver(away)
	}
	if i := n.rs[2].Info(); i.Status != Normal || !i.IsLeader || i.View != 1 {
		t.Fatalf("replica 2 should lead view 1: %+v", i)
	}
	if i := n.preVoteTo(3, 2); i.Status != Normal || i.View != 1 {
		t.Fatalf("a leader that has just formed its view answered a pre-vote: %+v", i)
	}
}
