package vrshard

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// chainBed drives chain cores and their master through the core contract
// as a host does, with the host's parts reduced to what the contract
// needs: a log per member (Entries, Truncate, HardState; fsynced at once,
// Persisted after the batch), an apply that returns the operation as its
// result, and FIFO links. It checks the adapter's half of the contract —
// what is persisted, committed, answered — not the host's (the host test
// does that over real transports).
type chainBed struct {
	t      *testing.T
	master *chain.Master
	cores  map[uint64]*chainCore
	disk   map[uint64][]core.Entry
	// hs is each member's hard state as last written (what a kill -9
	// leaves: the OS has it), synced as of its last fsync (what a power
	// cut leaves: the bed fsyncs every batch at once, and with it every
	// hard state written before; a Ready with only a hard state starts no
	// fsync, as on the host).
	hs, synced map[uint64]core.HardState
	applied    map[uint64][]core.Committed
	replies    map[uint64][]core.Reply
	reads      map[uint64][]core.ReadState
	errs       map[uint64][]error
	queue      []chain.Msg
	// drop, if set, loses the messages it returns true for (a link that
	// is not reliable).
	drop func(chain.Msg) bool
}

const bedMaster = 9

func newChainBed(t *testing.T, ids ...uint64) *chainBed {
	b := &chainBed{t: t, cores: map[uint64]*chainCore{}, disk: map[uint64][]core.Entry{},
		hs: map[uint64]core.HardState{}, synced: map[uint64]core.HardState{}, applied: map[uint64][]core.Committed{},
		replies: map[uint64][]core.Reply{}, reads: map[uint64][]core.ReadState{}, errs: map[uint64][]error{}}
	var nodes []chain.NodeID
	for _, id := range ids {
		nodes = append(nodes, chain.NodeID(id))
		c, err := openChain(chainConfig{Self: id, Master: bedMaster, Members: ids}, core.Boot{Bootstrap: true})
		if err != nil {
			t.Fatal(err)
		}
		b.cores[id] = c
	}
	b.master = chain.NewMaster(bedMaster, nodes, len(ids))
	return b
}

// pump runs every core's and the master's output until nothing moves.
func (b *chainBed) pump() {
	b.t.Helper()
	for range 10000 {
		moved := false
		for _, id := range slices.Sorted(maps.Keys(b.cores)) {
			c := b.cores[id]
			rd := c.Ready()
			if rd.HasTruncate {
				d := b.disk[id]
				for len(d) > 0 && d[len(d)-1].Op > rd.Truncate {
					d = d[:len(d)-1]
				}
				b.disk[id] = d
			}
			for _, e := range rd.Entries {
				if d := b.disk[id]; len(d) > 0 && e.Op != d[len(d)-1].Op+1 || len(d) == 0 && e.Op != 1 {
					b.t.Fatalf("member %d: entry %d appended after %d entries", id, e.Op, len(d))
				}
				b.disk[id] = append(b.disk[id], e)
			}
			if rd.HardState != nil {
				b.hs[id] = *rd.HardState
			}
			b.errs[id] = append(b.errs[id], rd.Errors...)
			b.queue = append(b.queue, rd.Messages...)
			results := make([][]byte, len(rd.Committed))
			for i, cm := range rd.Committed {
				if !cm.Duplicate {
					results[i] = append([]byte("r:"), cm.Data...)
				}
			}
			b.applied[id] = append(b.applied[id], rd.Committed...)
			c.Advance(results)
			b.replies[id] = append(b.replies[id], rd.Replies...)
			b.reads[id] = append(b.reads[id], rd.ReadStates...)
			if rd.PersistSeq != 0 {
				b.synced[id] = b.hs[id]
				c.Persisted(rd.PersistSeq)
			}
			moved = moved || !rd.Empty()
		}
		mr := b.master.Ready()
		b.queue = append(b.queue, mr.Msgs...)
		for _, id := range mr.Fenced {
			delete(b.cores, uint64(id))
		}
		if len(b.queue) > 0 {
			m := b.queue[0]
			b.queue = b.queue[1:]
			if b.drop != nil && b.drop(m) {
				continue
			}
			if m.To == bedMaster {
				b.master.Step(m)
			} else if c := b.cores[uint64(m.To)]; c != nil {
				c.Step(0, m)
			}
			moved = true
		}
		if !moved {
			return
		}
	}
	b.t.Fatal("the chain never settled")
}

// captureBeats makes the bed keep the members' heartbeats to the master in
// *beats instead of delivering them (tests answer them by hand).
func (b *chainBed) captureBeats(beats *[]chain.Msg) {
	b.drop = func(m chain.Msg) bool {
		if m.Type == chain.MsgHeartbeat && m.To == bedMaster {
			*beats = append(*beats, m)
			return true
		}
		return false
	}
}

func (b *chainBed) propose(at, client, req uint64, data string) error {
	return b.cores[at].Propose(0, core.Request{Client: client, ReqNum: req, Data: []byte(data)}, core.AckApplied)
}

// crash stops a member: its queued messages are dropped; the master hears.
func (b *chainBed) crash(id uint64) {
	delete(b.cores, id)
	b.queue = slices.DeleteFunc(b.queue, func(m chain.Msg) bool { return uint64(m.From) == id || uint64(m.To) == id })
	b.master.Fail(chain.NodeID(id))
}

// TestChainCoreContract: three chain members behind the core contract.
// Writes enter at the head only, are persisted on every member, committed
// (applied) everywhere once acknowledged, and answered by the head with the
// state machine's result; a retry is answered from the client table; a
// read waits for the member's LU at the time of the read. Then the middle
// member crashes (the master repairs the chain), writes go on, and the
// member restarts from its disk: it truncates what it had not seen
// committed, rejoins as a joiner and ends with the same log as the others.
func TestChainCoreContract(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	if err := b.propose(2, 7, 1, "x"); !errors.Is(err, core.ErrNotLeader) {
		t.Fatalf("a proposal at the middle: %v, want ErrNotLeader", err)
	}
	if i := b.cores[2].Info(); i.Leader != 1 || i.IsLeader {
		t.Fatalf("middle's Info: %+v, want leader 1", i)
	}
	for i := uint64(1); i <= 3; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	// A read at the head before anything is acknowledged waits for all
	// three writes.
	if err := b.cores[1].Read(0, core.ReadRequest{Ctx: 1, Kind: core.ReadLinearizable}); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if rs := b.reads[1]; len(rs) != 1 || rs[0].Index != 3 || rs[0].Err != nil {
		t.Fatalf("read states %+v, want one at index 3", rs)
	}
	if got := b.replies[1]; len(got) != 3 || string(got[2].Result) != "r:w3" || got[2].Op != 3 {
		t.Fatalf("head replies %+v, want three, the last op 3 with r:w3", got)
	}
	for _, id := range []uint64{2, 3} {
		if len(b.replies[id]) != 0 {
			t.Fatalf("member %d replied %+v: only the head answers", id, b.replies[id])
		}
	}
	for _, id := range []uint64{1, 2, 3} {
		if len(b.disk[id]) != 3 || len(b.applied[id]) != 3 || b.hs[id].Commit > 3 {
			t.Fatalf("member %d: %d on disk, %d applied, hard state %+v", id, len(b.disk[id]), len(b.applied[id]), b.hs[id])
		}
	}
	// A retry of an executed request: the client table's answer, no entry.
	if err := b.propose(1, 7, 3, "w3"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if got := b.replies[1]; len(got) != 4 || string(got[3].Result) != "r:w3" || len(b.disk[1]) != 3 {
		t.Fatalf("retry: replies %+v, %d entries; want r:w3 again and no new entry", got, len(b.disk[1]))
	}
	if err := b.propose(1, 7, 2, "w2"); !errors.Is(err, core.ErrStaleRequest) {
		t.Fatalf("a request older than the client's last: %v, want ErrStaleRequest", err)
	}

	// One more write: the hard state records commit 4 once its
	// acknowledgement came back (chainCore.Ready: at once, with no batch).
	if err := b.propose(1, 7, 4, "w4"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if hs := b.hs[2]; hs.Commit != 4 || len(b.disk[2]) != 4 {
		t.Fatalf("member 2: hard state %+v, %d entries; want commit 4 recorded, 4 entries", hs, len(b.disk[2]))
	}
	b.crash(2)
	b.pump()
	for i := uint64(5); i <= 7; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	if n := len(b.replies[1]); n != 8 {
		t.Fatalf("%d replies after the repair, want 8", n)
	}

	// Restart 2 from its disk, with an uncommitted suffix on it (a batch
	// written after its hard state's commit point).
	disk := append(slices.Clone(b.disk[2]), core.Entry{Op: 5, Request: core.Request{Data: []byte{0x05, 0, 0, 'z'}}})
	hs := b.hs[2]
	c, err := openChain(chainConfig{Self: 2, Master: bedMaster, Members: []uint64{1, 2, 3}}, core.Boot{HardState: hs, Entries: disk})
	if err != nil {
		t.Fatal(err)
	}
	if s := c.status(); s.State != chain.Inactive || s.Log != 4 {
		t.Fatalf("restarted: %+v, want a joiner holding the %d committed entries", s, hs.Commit)
	}
	b.cores[2], b.disk[2], b.applied[2] = c, disk, nil
	if err := b.master.Join(2, 1); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if err := b.propose(1, 7, 8, "w8"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if got := b.master.Members(); !slices.Equal(got, []chain.NodeID{1, 2, 3}) {
		t.Fatalf("chain %v after the rejoin, want [1 2 3]", got)
	}
	for _, id := range []uint64{1, 2, 3} {
		d := b.disk[id]
		if len(d) != 8 {
			t.Fatalf("member %d holds %d entries, want 8", id, len(d))
		}
		for i, e := range d {
			if w := b.disk[1][i]; string(e.Data) != string(w.Data) || e.View != w.View {
				t.Fatalf("member %d entry %d = %+v, the head's %+v", id, i+1, e, w)
			}
		}
	}
	// The restarted member re-applied its committed prefix, then the rest.
	if n := len(b.applied[2]); n != 8 {
		t.Fatalf("the restarted member applied %d entries, want 8", n)
	}
	if i := b.cores[2].Info(); i.Status != core.Normal || i.Commit != 8 {
		t.Fatalf("rejoined member: %+v", i)
	}
}

// TestChainCoreLease: a member serves (reads, and writes at the head) only
// under the master's lease, which runs from when the heartbeat the master
// answered was sent; the answer's configuration names the head.
func TestChainCoreLease(t *testing.T) {
	const ms = int64(1e6)
	c, err := openChain(chainConfig{Self: 3, Master: bedMaster, Members: []uint64{2, 3},
		Heartbeat: 10 * ms, Lease: 100 * ms}, core.Boot{Bootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	read := func(now int64) error { return c.Read(now, core.ReadRequest{Ctx: 1, Kind: core.ReadLinearizable}) }
	if err := read(0); !errors.Is(err, core.ErrNotNormal) {
		t.Fatalf("a read before any lease: %v, want ErrNotNormal", err)
	}
	c.Tick(50 * ms)
	rd := c.Ready()
	if len(rd.Messages) != 1 || rd.Messages[0].Type != chain.MsgHeartbeat || rd.Messages[0].To != bedMaster {
		t.Fatalf("tick sent %v, want a heartbeat to the master", rd.Messages)
	}
	beat := rd.Messages[0]
	c.Tick(55 * ms) // not due yet
	if rd := c.Ready(); len(rd.Messages) != 0 {
		t.Fatalf("a second heartbeat 5 ms later: %v", rd.Messages)
	}
	if i := c.Info(); i.Leader != 2 {
		t.Fatalf("Info.Leader %d, want 2 (the initial chain's head)", i.Leader)
	}
	c.Step(70*ms, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: 3, Seq: beat.Seq, Members: []chain.NodeID{7, 3}})
	if err := read(120 * ms); err != nil {
		t.Fatalf("a read under the lease: %v", err)
	}
	if i := c.Info(); i.Leader != 7 {
		t.Fatalf("Info.Leader %d, want 7 (the master's configuration)", i.Leader)
	}
	if err := read(150 * ms); !errors.Is(err, core.ErrNotNormal) {
		t.Fatalf("a read 100 ms after the answered heartbeat was sent: %v, want ErrNotNormal", err)
	}
}

// TestChainCoreLostUpdate: the node transport may drop a message (a full
// queue, a re-dialled connection) where the chain assumes a reliable link.
// A member that receives its predecessor's next update with a gap before it
// (the head numbers one after another within an epoch) does not take it: it
// becomes a joiner holding its committed history, truncates the rest and
// says so; once the master repaired around it and joined it again, every
// write is answered and every member holds the same log.
func TestChainCoreLostUpdate(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	if err := b.propose(1, 7, 1, "w1"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	b.dropFirstUpdate(1, 2)
	for i := uint64(2); i <= 3; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	if c := b.cores[2]; c.rejoins != 1 || c.status().State != chain.Inactive || len(b.errs[2]) != 1 {
		t.Fatalf("member 2 after a lost update: %d rejoins, %+v, errors %v; want a joiner that said why", c.rejoins, c.status(), b.errs[2])
	}
	if d := b.disk[2]; len(d) != 1 {
		t.Fatalf("member 2 keeps %d entries, want its committed one", len(d))
	}
	// What chainmaster does on the joiner's heartbeat: fail, then join.
	b.master.Fail(2)
	b.pump()
	if err := b.master.Join(2, 2); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if err := b.propose(1, 7, 4, "w4"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if got := b.replies[1]; len(got) != 4 {
		t.Fatalf("head replies %+v, want all four writes answered", got)
	}
	for _, id := range []uint64{1, 2, 3} {
		if d := b.disk[id]; len(d) != 4 || string(d[1].Data) != string(b.disk[1][1].Data) {
			t.Fatalf("member %d holds %d entries, want the head's 4", id, len(d))
		}
	}
	for _, id := range []uint64{1, 3} {
		if len(b.errs[id]) != 0 {
			t.Fatalf("member %d: %v", id, b.errs[id])
		}
	}
}

// TestChainAnswersEveryCommittedWriteOfAClient (a review finding): a
// client's requests are numbered one after another (shard.ReqID: one random client id per client, Seq up
// with each write) and a client with concurrent writes has several in
// flight. When two of one client's writes commit in one Ready (here: the
// tail's acknowledgement of the first is lost, and the second's, which is
// cumulative, commits both), Advance must answer both, not only the one the
// client table's record now names: the host finishes waiters from the
// Replies alone, so an unanswered write's caller times out and its retry
// is refused as stale. VR's Advance answers every committed entry
// (internal/vr/ready.go); so does the chain's.
func TestChainAnswersEveryCommittedWriteOfAClient(t *testing.T) {
	b := newChainBed(t, 1, 2)
	dropped := false
	b.drop = func(m chain.Msg) bool {
		if !dropped && m.Type == chain.MsgAck && m.To == 1 {
			dropped = true
			return true
		}
		return false
	}
	for i := uint64(1); i <= 2; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	if len(b.applied[1]) != 2 || !dropped {
		t.Fatalf("head applied %d entries (ack dropped: %v), want 2", len(b.applied[1]), dropped)
	}
	var got []uint64
	for _, r := range b.replies[1] {
		got = append(got, r.ReqNum)
	}
	if !slices.Contains(got, 1) || !slices.Contains(got, 2) {
		t.Fatalf("head answered requests %v of client 7, want 1 and 2 (both committed and applied)", got)
	}
}

// TestChainRestartedMasterLearnsTheChain (a review finding): a master
// restarted from its --members after a repair and a rejoin (the chain is
// [1 3 2], the master believes [1 2 3]) must not repair the wrong chain
// when the head fails. Unfenced, it made 2 — really the tail — the head,
// whose writes commit at once (it has no successor), while 3, still in the
// stale master's chain and so under its lease, served linearizable reads
// from the history 1 gave it, missing a write answered before the read.
// The members refuse the stale master's repair orders and heartbeat
// answers (their epoch is below the members'); a master that learnt the
// chain from the members' heartbeats (chainmaster.Learner) repairs the
// real one, and every read then sees the answered write.
func TestChainRestartedMasterLearnsTheChain(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	if err := b.propose(1, 7, 1, "w1"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	// The tail 3 fails and comes back from its disk; the master joins it
	// before the tail (chainmaster: Join at len(members)): the chain is
	// [1 3 2].
	b.crash(3)
	b.pump()
	c, err := openChain(chainConfig{Self: 3, Master: bedMaster, Members: []uint64{1, 2, 3}}, core.Boot{HardState: b.hs[3], Entries: b.disk[3]})
	if err != nil {
		t.Fatal(err)
	}
	b.cores[3], b.applied[3] = c, nil
	if err := b.master.Join(3, 2); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if got := b.master.Members(); !slices.Equal(got, []chain.NodeID{1, 3, 2}) {
		t.Fatalf("chain %v after the rejoin, want [1 3 2]", got)
	}
	epoch := b.master.Epoch()

	// The master restarts from its command line, and the head fails
	// before it learnt anything: its repair (at an epoch below the
	// members') is refused — no member becomes the head.
	stale := chain.NewMaster(bedMaster, []chain.NodeID{1, 2, 3}, 3)
	b.master = stale
	b.crash(1)
	b.pump()
	for id, c := range b.cores {
		if c.isHead() {
			t.Fatalf("member %d obeyed the stale master's repair (epoch %d; the chain's is %d): it is the head", id, stale.Epoch(), epoch)
		}
	}
	// Its heartbeat answers grant no lease either.
	const lease = int64(time.Second)
	var beats []chain.Msg
	b.captureBeats(&beats)
	for _, id := range []uint64{2, 3} {
		c := b.cores[id]
		c.beat, c.lease = 1, lease
		c.Tick(10)
	}
	b.pump()
	if len(beats) != 2 {
		t.Fatalf("%d heartbeats from members 2 and 3, want 2", len(beats))
	}
	for _, hb := range beats {
		b.cores[uint64(hb.From)].Step(0, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: hb.From, Seq: hb.Seq,
			Epoch: stale.Epoch(), Members: stale.Members()})
		if c := b.cores[uint64(hb.From)]; c.leased(11) {
			t.Fatalf("member %d took a lease from the stale master's answer (epoch %d; its own %d)", hb.From, stale.Epoch(), c.status().Epoch)
		}
	}

	// The master learns the chain from the same heartbeats, then repairs.
	l := chainmaster.NewLearner([]chain.NodeID{1, 2, 3})
	for _, hb := range beats {
		l.Heard(hb)
	}
	members, learnt := l.Config()
	if !slices.Equal(members, []chain.NodeID{1, 3, 2}) || learnt < epoch {
		t.Fatalf("learnt chain %v at epoch %d, want [1 3 2] at %d or later", members, learnt, epoch)
	}
	if l.Done() {
		t.Fatal("learning done without a report from member 1")
	}
	b.master = chain.NewMasterAt(bedMaster, members, 3, learnt)
	b.master.Fail(1)
	b.pump()
	if !b.cores[3].isHead() {
		t.Fatalf("member 3 is not the head after the learnt master's repair: 2 %+v, 3 %+v", b.cores[2].status(), b.cores[3].status())
	}
	// The learnt master's answers grant the leases.
	beats = nil
	for _, id := range []uint64{2, 3} {
		b.cores[id].Tick(20)
	}
	b.pump()
	for _, hb := range beats {
		b.cores[uint64(hb.From)].Step(0, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: hb.From, Seq: hb.Seq,
			Epoch: b.master.Epoch(), Members: b.master.Members()})
		if c := b.cores[uint64(hb.From)]; !c.leased(21) {
			t.Fatalf("member %d took no lease from the learnt master's answer (epoch %d; its own %d)", hb.From, b.master.Epoch(), c.status().Epoch)
		}
	}
	if err := b.propose(3, 8, 1, "w2"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if len(b.replies[3]) == 0 {
		t.Fatal("the write at the new head 3 was not answered")
	}
	// A linearizable read, after w2 was answered, at each member.
	for _, id := range []uint64{2, 3} {
		c := b.cores[id]
		b.reads[id] = nil
		if err := c.Read(0, core.ReadRequest{Ctx: 1, Kind: core.ReadLinearizable}); err != nil {
			t.Fatalf("member %d: read: %v (%+v, lease until %d)", id, err, c.status(), c.leaseUntil)
		}
		b.pump()
		rs := b.reads[id]
		if len(rs) != 1 {
			t.Fatalf("member %d: %d read states", id, len(rs))
		}
		// What the member serves at the read's index: the applied
		// entries up to it.
		var seen []string
		for _, cm := range b.applied[id] {
			if cm.Op <= rs[0].Index {
				seen = append(seen, string(cm.Data))
			}
		}
		if !slices.Contains(seen, "w2") {
			t.Fatalf("member %d serves a linearizable read at index %d with %v: the answered write w2 is missing", id, rs[0].Index, seen)
		}
	}
}

// TestChainRestartedMasterLearnsATruncation: a join past the chain's
// length truncates the old tail (TRUNCATE at a new epoch; the master drops
// it from its configuration at TRUNCATE_ACK, at the same epoch). A master
// that restarts before answering any heartbeat since must learn the chain
// without the old tail: Removed, it serves nothing and never fails, so a
// master that counted it a member (its tail) would repair towards it —
// which it never answers — once the real tail failed. The TRUNCATE names
// its configuration (chain.Master.send); the old tail reports it without
// itself, at its epoch (chainCore.truncated), which the learner takes over
// the longer list at that epoch, heard first or not (chainmaster.Learner).
func TestChainRestartedMasterLearnsATruncation(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	if err := b.propose(1, 7, 1, "w1"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	b.joinNew(t, 4, []uint64{1, 2, 3}, 2, false)
	if got := b.master.Members(); !slices.Equal(got, []chain.NodeID{1, 2, 4}) {
		t.Fatalf("chain %v after the join and the truncation, want [1 2 4]", got)
	}
	if st := b.cores[3].status().State; st != chain.Removed {
		t.Fatalf("the old tail 3 is %v, want removed", st)
	}
	// The master's answer to the old tail's last heartbeat before the
	// TRUNCATE_ACK, at the truncation's epoch, with the old tail in it,
	// arrives after the TRUNCATE (it came the other way round).
	b.cores[3].Step(0, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: 3, Epoch: b.master.Epoch(), Members: []chain.NodeID{1, 2, 4, 3}})
	var beats []chain.Msg
	b.captureBeats(&beats)
	for _, id := range []uint64{1, 2, 3, 4} {
		b.cores[id].beat = 1
		b.cores[id].Tick(10)
	}
	b.pump()
	for _, order := range [][]int{{0, 1, 2, 3}, {2, 3, 0, 1}, {3, 0, 1, 2}} {
		l := chainmaster.NewLearner([]chain.NodeID{1, 2, 3})
		for _, i := range order {
			l.Heard(beats[i])
		}
		if ms, e := l.Config(); !slices.Equal(ms, []chain.NodeID{1, 2, 4}) || e != b.master.Epoch() || !l.Done() {
			t.Fatalf("heartbeats %v in order %v: learnt %v at %d (done %v), want [1 2 4] at %d", beats, order, ms, e, l.Done(), b.master.Epoch())
		}
	}
}

// TestChainWipedMemberRejoinsAsAJoiner (a review finding): a member whose
// disk lost its state (the host's LostState: a wiped directory) used to be
// refused at start ("wipe the member…", which gave the same error). It
// starts as a joiner holding nothing — never Active on its own — and the
// master's join copies the whole history to it.
func TestChainWipedMemberRejoinsAsAJoiner(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	for i := uint64(1); i <= 3; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	b.crash(2)
	b.pump()
	// The wiped member's disk: perhaps a leftover log, no commit point.
	c, err := openChain(chainConfig{Self: 2, Master: bedMaster, Members: []uint64{1, 2, 3}},
		core.Boot{LostState: true, Entries: b.disk[2]})
	if err != nil {
		t.Fatalf("a wiped member cannot start: %v", err)
	}
	if s := c.status(); s.State != chain.Inactive || len(c.m.History()) != 0 {
		t.Fatalf("wiped member starts %v holding %d entries, want a joiner holding none", s.State, len(c.m.History()))
	}
	if err := c.Read(0, core.ReadRequest{Ctx: 1, Kind: core.ReadLinearizable}); err == nil {
		t.Fatal("a wiped member serves a read before it rejoined")
	}
	b.cores[2], b.applied[2] = c, nil
	if err := b.master.Join(2, 2); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if s := c.status(); s.State != chain.Active {
		t.Fatalf("wiped member is %v after its join, want active", s.State)
	}
	if got := len(b.applied[2]); got != 3 {
		t.Fatalf("wiped member applied %d entries after its join, want the chain's 3", got)
	}
	if d := b.disk[2]; len(d) != 3 || string(d[2].Data) != string(b.disk[1][2].Data) {
		t.Fatalf("wiped member's log holds %d entries, want the head's 3", len(d))
	}
}

// TestChainWipedBootstrappedMemberDoesNotServe (a review finding): a
// member's disk is wiped and it is started again as a member of the
// initial chain (--bootstrap) before the master noticed it was gone: it
// is active with an empty history, and the next update from its
// predecessor (not the chain's first) shows the gap. It must rejoin as a
// joiner, not serve reads from nothing (its LU of 0 used to hide the gap).
func TestChainWipedBootstrappedMemberDoesNotServe(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	for i := uint64(1); i <= 3; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	c, err := openChain(chainConfig{Self: 3, Master: bedMaster, Members: []uint64{1, 2, 3}}, core.Boot{Bootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	b.cores[3], b.applied[3], b.disk[3] = c, nil, nil
	if err := b.propose(1, 7, 4, "w4"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if s := c.status(); s.State == chain.Active || c.rejoins != 1 {
		t.Fatalf("wiped member is %v (rejoins %d) after an update past its empty history, want a joiner", s.State, c.rejoins)
	}
	if err := c.Read(0, core.ReadRequest{Ctx: 1, Kind: core.ReadLinearizable}); err == nil {
		t.Fatal("the wiped member serves a read")
	}
}

// storeBed is a bed of three members with the given stores (tune adjusts
// each core) whose head answered three writes, w1 to w3.
func storeBed(t *testing.T, stores [3]ChainStore, tune func(*chainCore)) *chainBed {
	t.Helper()
	b := newChainBed(t, 1, 2, 3)
	for i, st := range stores {
		id := uint64(i + 1)
		c, err := openChain(chainConfig{Self: id, Master: bedMaster, Members: []uint64{1, 2, 3}, Store: st}, core.Boot{Bootstrap: true})
		if err != nil {
			t.Fatal(err)
		}
		tune(c)
		b.cores[id] = c
	}
	for i := uint64(1); i <= 3; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
		b.pump()
	}
	if n := len(b.replies[1]); n != 3 {
		t.Fatalf("%d writes answered, want 3", n)
	}
	return b
}

// TestChainSavesItsCommitPointAtOnce: every member writes an advanced
// commit point with the Ready that advances it — before the replies it
// releases — whatever its store, so after a kill -9 of every member the
// head's durable prefix holds every write it answered: the only record of
// them when the tail keeps none (a memory tail: D-M, D-D-M, Mb-Mb-M). A log
// member once saved it lazily (with its next batch, or after 100 ms idle:
// its commit point was 2 of 3 here, and D-D-M lost the last writes answered
// before a kill -9 of every member, e2e TestChainStoresLogHeadKilledWhole);
// with the mutation commitLazy (the save rides on batches only) the head
// restarts without the last write.
func TestChainSavesItsCommitPointAtOnce(t *testing.T) {
	run := func(t *testing.T, stores [3]ChainStore, lazy bool) (kept int) {
		b := storeBed(t, stores, func(c *chainCore) { c.commitLazy = lazy })
		if !lazy {
			for _, id := range []uint64{1, 2} {
				if got := b.hs[id].Commit; got != 3 {
					t.Fatalf("%v member %d saved commit point %d with no idle tick, want 3 (every answered write)", stores[id-1], id, got)
				}
			}
		}
		c, err := openChain(chainConfig{Self: 1, Master: bedMaster, Members: []uint64{1, 2, 3}, Store: stores[0]},
			core.Boot{HardState: b.hs[1], Entries: b.disk[1]})
		if err != nil {
			t.Fatal(err)
		}
		return len(c.m.History())
	}
	for _, stores := range [][3]ChainStore{{ChainLog, ChainLog, ChainLog}, {ChainLog, ChainLog, ChainMemory}, {ChainBuffered, ChainBuffered, ChainMemory}} {
		t.Run(fmt.Sprint(stores), func(t *testing.T) {
			if n := run(t, stores, false); n != 3 {
				t.Fatalf("the restarted head keeps %d entries, want all 3", n)
			}
			if !mutation.On {
				return
			}
			if n := run(t, stores, true); n >= 3 {
				t.Fatal("commitLazy not caught: the restarted head keeps every answered write")
			}
		})
	}
}

// TestChainHeartbeatReportsTheOrdersConfiguration: a repair order moves a
// member to its epoch, and its heartbeats report that epoch with the
// configuration — what a restarted master learns the chain from. With no
// heartbeat answer since (lost, or the master gone), the configuration must
// come from the order itself: the host simulation's AUSI D-D-D seed 501
// (KEFIR_SIM_SEEDS=800), where member 1, made the tail alone by a CR_TAIL,
// reported "[1 3] at epoch 2" and a restarted master put the member cut off
// since epoch 1 back in the chain. Here the tail (3) fails, the master
// sends CR_TAIL to 2, and 2's and the head's next heartbeats are taken by
// the bed. With the mutation orderConfigOff (the code before) member 2
// reports [1 2 3] at the new epoch.
func TestChainHeartbeatReportsTheOrdersConfiguration(t *testing.T) {
	run := func(off bool) chain.Msg {
		b := newChainBed(t, 1, 2, 3)
		for _, c := range b.cores {
			c.orderConfigOff = off
		}
		var beats []chain.Msg
		b.captureBeats(&beats)
		b.crash(3)
		b.pump()
		c := b.cores[2]
		if s := c.status(); s.Succ != 0 || s.Epoch != b.master.Epoch() {
			t.Fatalf("member 2 after the tail's failure: %+v, want the tail at epoch %d", s, b.master.Epoch())
		}
		c.beat = 1
		c.Tick(10)
		b.pump()
		if len(beats) != 1 {
			t.Fatalf("%d heartbeats, want 1", len(beats))
		}
		return beats[0]
	}
	hb := run(false)
	if want := []chain.NodeID{1, 2}; hb.Epoch != 1 || !slices.Equal(hb.Members, want) {
		t.Fatalf("member 2 reports %v at epoch %d, want %v at 1", hb.Members, hb.Epoch, want)
	}
	if !mutation.On {
		return
	}
	if hb := run(true); slices.Equal(hb.Members, []chain.NodeID{1, 2}) {
		t.Fatalf("orderConfigOff not caught: member 2 reports %v at epoch %d", hb.Members, hb.Epoch)
	} else {
		t.Logf("orderConfigOff: member 2 reports %v at epoch %d", hb.Members, hb.Epoch)
	}
}

// TestChainRejoinForgetsUnansweredHeartbeats (a review finding): a member
// that rejoins after a lost update stops serving; an answer to a heartbeat
// it sent before must not restore its lease (nor its eventual reads).
func TestChainRejoinForgetsUnansweredHeartbeats(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	var beats []chain.Msg
	b.captureBeats(&beats)
	c := b.cores[3]
	c.beat, c.lease = 1, int64(time.Second)
	c.Tick(10)
	b.pump()
	if len(beats) != 1 {
		t.Fatalf("%d heartbeats, want 1", len(beats))
	}
	c.rejoin("a test's lost update")
	c.Step(0, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: 3, Seq: beats[0].Seq,
		Epoch: b.master.Epoch(), Members: b.master.Members()})
	if c.leased(11) || c.EventualUntil() > 0 {
		t.Fatalf("a rejoining member's lease was restored by an old heartbeat's answer (until %d)", c.EventualUntil())
	}
}

// Losses lostUpdate cannot see (it compares numbers within one head's
// numbering epoch), found by the link numbering (chainCore.linkGap):
//   - "head change": the head crashes, its successor becomes the head at a
//     new epoch, and its first update of that epoch to the tail is lost;
//   - "log flush": a node joins at the tail, and one of the old tail's
//     log-flush entries (MsgFlushedUpdate) to it is lost.
//
// The member that missed a message rejoins (the master repairs around it
// and joins it again) and the chain ends whole: every write answered,
// every member holding the head's log. With the mutation linkGapOff (the
// code before the numbering) the first leaves the tail without an entry
// the head answered as committed, and the second a joiner merged with a gap.
func TestChainLinkNumberingFindsLostMessages(t *testing.T) {
	type run struct {
		errs    []error
		rejoins int
		logs    map[uint64][]string
		replies int
	}
	headChange := func(t *testing.T, off bool) run {
		b := headChangedBed(t, off)
		if !b.cores[2].isHead() {
			t.Fatalf("member 2 did not become the head: %+v", b.cores[2].status())
		}
		b.dropFirstUpdate(2, 3)
		for i := uint64(2); i <= 3; i++ {
			if err := b.propose(2, 7, i, fmt.Sprint("w", i)); err != nil {
				t.Fatal(err)
			}
		}
		b.pump()
		r := run{errs: b.errs[3], rejoins: b.cores[3].rejoins}
		if r.rejoins > 0 {
			// What chainmaster does on the joiner's heartbeat.
			b.failAndJoin(t, 3, 1)
		}
		h := headOf(t, b)
		if err := b.propose(h, 7, 4, "w4"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		r.replies = len(b.replies[2]) + len(b.replies[3])
		r.logs = map[uint64][]string{2: logOf(t, b, 2), 3: logOf(t, b, 3)}
		return r
	}
	logFlush := func(t *testing.T, off bool) run {
		b := newChainBed(t, 1, 2)
		for _, c := range b.cores {
			c.linkGapOff, c.epochGapOff, c.posGapOff = off, off, off
		}
		for i := uint64(1); i <= 3; i++ {
			if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
				t.Fatal(err)
			}
		}
		b.pump()
		j := b.addJoiner(t, 3, []uint64{1, 2})
		j.linkGapOff, j.epochGapOff, j.posGapOff = off, off, off
		if err := b.master.Join(3, 2); err != nil {
			t.Fatal(err)
		}
		// Writes after the pre-copy and before FLUSH reaches the old
		// tail go to the joiner as log-flush entries; one is lost.
		dropped := false
		b.drop = func(m chain.Msg) bool {
			if m.Type == chain.MsgPrecopyDone && m.To == bedMaster {
				for i := uint64(4); i <= 6; i++ {
					if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if !dropped && m.Type == chain.MsgFlushedUpdate && m.To == 3 {
				dropped = true
				return true
			}
			return false
		}
		b.pump()
		r := run{errs: b.errs[3], rejoins: b.cores[3].rejoins}
		b.drop = nil
		if r.rejoins > 0 {
			// What chainmaster does on the joiner's heartbeat (it says it
			// is not joining): the join is aborted, then started afresh.
			b.failAndJoin(t, 3, 2)
		}
		if !dropped {
			t.Fatal("no log-flush entry went to the joiner: the scenario did not happen")
		}
		if err := b.propose(headOf(t, b), 7, 7, "w7"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		r.replies = len(b.replies[1]) + len(b.replies[3])
		r.logs = map[uint64][]string{1: logOf(t, b, 1), 3: logOf(t, b, 3)}
		return r
	}
	// flushAfterLoss: a head change, then the new head's first update is
	// lost on its way to its successor (3), then a node (4) joins between
	// them. The FLUSH is the next message on the link 2→3; the joiner takes
	// 3's log (which lacks w2) and then the head's next update, the second
	// of its numbering epoch, on a link it never heard from before.
	flushAfterLoss := func(t *testing.T, off bool) run {
		b := headChangedBed(t, off)
		dropped := b.dropFirstUpdate(2, 3)
		if err := b.propose(2, 7, 2, "w2"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		b.drop = nil
		if !*dropped {
			t.Fatal("no update went from 2 to 3: the scenario did not happen")
		}
		b.joinNew(t, 4, []uint64{2, 3}, 3, off)
		r := run{errs: b.errs[3], rejoins: b.cores[3].rejoins}
		if r.rejoins > 0 {
			// What chainmaster does on the member's heartbeat (not a
			// replica): failed, the chain repaired, joined again.
			b.failAndJoin(t, 3, 3)
		}
		if err := b.propose(headOf(t, b), 7, 3, "w3"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		r.replies = len(b.replies[2]) + len(b.replies[3])
		// The chain's members (the joiner's join was aborted by 3's
		// failure, with the fix; it joins again when it asks).
		r.logs = map[uint64][]string{}
		for _, id := range b.master.Members() {
			r.logs[uint64(id)] = logOf(t, b, uint64(id))
		}
		return r
	}
	// joinerFirstLost: a head change, a node (4) joins between the new
	// head and its successor, and the head's first update — the first of
	// its numbering epoch, and the first message the joiner ever hears
	// from it — is lost on the way to the joiner: the link numbering takes
	// the next one as its baseline.
	joinerFirstLost := func(t *testing.T, off bool) run {
		b := headChangedBed(t, off)
		b.joinNew(t, 4, []uint64{2, 3}, 3, off)
		if ms := b.master.Members(); !slices.Equal(ms, []chain.NodeID{2, 4, 3}) {
			t.Fatalf("chain %v after the join, want [2 4 3]", ms)
		}
		dropped := b.dropFirstUpdate(2, 4)
		for i := uint64(2); i <= 3; i++ {
			if err := b.propose(2, 7, i, fmt.Sprint("w", i)); err != nil {
				t.Fatal(err)
			}
		}
		b.pump()
		b.drop = nil
		if !*dropped {
			t.Fatal("no update went from 2 to 4: the scenario did not happen")
		}
		r := run{errs: b.errs[4], rejoins: b.cores[4].rejoins}
		if r.rejoins > 0 {
			b.failAndJoin(t, 4, 3)
		}
		if err := b.propose(headOf(t, b), 7, 4, "w4"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		r.replies = len(b.replies[2])
		r.logs = map[uint64][]string{}
		for _, id := range b.master.Members() {
			r.logs[uint64(id)] = logOf(t, b, uint64(id))
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		run     func(*testing.T, bool) run
		head    uint64
		replies int
	}{{"head change", headChange, 2, 3}, {"log flush", logFlush, 1, 7}, {"flush after a lost update", flushAfterLoss, 2, 2},
		{"joiner's first update lost", joinerFirstLost, 2, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run(t, false)
			t.Logf("errors %v, rejoins %d, logs %v, %d replies", r.errs, r.rejoins, r.logs, r.replies)
			if r.rejoins != 1 || len(r.errs) != 1 || !strings.Contains(r.errs[0].Error(), "was lost") {
				t.Fatalf("the member that missed a message: %d rejoins, errors %v; want one rejoin that says why", r.rejoins, r.errs)
			}
			for id, l := range r.logs {
				if !slices.Equal(l, r.logs[tc.head]) {
					t.Fatalf("member %d holds %v, member %d %v", id, l, tc.head, r.logs[tc.head])
				}
			}
			if r.replies < tc.replies {
				t.Fatalf("%d writes answered, want %d", r.replies, tc.replies)
			}
			if !mutation.On {
				return
			}
			m := tc.run(t, true)
			t.Logf("linkGapOff: errors %v, rejoins %d, logs %v", m.errs, m.rejoins, m.logs)
			same := true
			for _, l := range m.logs {
				same = same && slices.Equal(l, m.logs[tc.head])
			}
			if m.rejoins != 0 || same {
				t.Fatalf("linkGapOff not caught: rejoins %d, logs %v", m.rejoins, m.logs)
			}
		})
	}
}

// TestChainUpdatePositionFindsLostFirstMessages: the host simulation's
// seeds 491 and 634 (KEFIR_SIM_SEEDS=800, SU D-D-D and D-D-M, AUSI D-D-D).
// The head (1) takes four writes; every one is lost between the middle (2)
// and the tail (3) — the first messages the link 2→3 ever carried, so the
// link numbering takes the next as its baseline — and the head crashes.
// The middle, head now, numbers its first write 1.1, the first of its
// numbering epoch, which is what an active tail holding nothing may take
// next by the numbers alone (lostUpdate). The update's position (5, in
// the sender's history; chain.Msg.Pos) says four came before it: the tail
// rejoins and copies them. With the mutation posGapOff (the code before)
// the tail holds [w5] at position 1 while the head commits [w1 … w5] on
// its acknowledgement.
func TestChainUpdatePositionFindsLostFirstMessages(t *testing.T) {
	run := func(t *testing.T, off bool) (rejoins int, errs []error, logs map[uint64][]string, replies int) {
		b := newChainBed(t, 1, 2, 3)
		for _, c := range b.cores {
			c.posGapOff = off
		}
		b.drop = func(m chain.Msg) bool { return m.Type == chain.MsgUpdate && m.From == 2 && m.To == 3 }
		for i := uint64(1); i <= 4; i++ {
			if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
				t.Fatal(err)
			}
		}
		b.pump()
		b.drop = nil
		if got := logOf(t, b, 3); len(got) != 0 || len(logOf(t, b, 2)) != 4 {
			t.Fatalf("the tail holds %v, the middle %v: the scenario did not happen", got, logOf(t, b, 2))
		}
		b.crash(1)
		b.pump()
		if err := b.propose(2, 8, 1, "w5"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		rejoins, errs = b.cores[3].rejoins, b.errs[3]
		if rejoins > 0 {
			// What chainmaster does on its heartbeat: failed, then joined
			// again (before the tail: the chain's head).
			b.failAndJoin(t, 3, 2)
		}
		if err := b.propose(headOf(t, b), 8, 2, "w6"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		return rejoins, errs, map[uint64][]string{2: logOf(t, b, 2), 3: logOf(t, b, 3)}, len(b.replies[2]) + len(b.replies[3])
	}
	rejoins, errs, logs, replies := run(t, false)
	t.Logf("errors %v, rejoins %d, logs %v, %d replies", errs, rejoins, logs, replies)
	if rejoins != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "was lost") {
		t.Fatalf("the tail: %d rejoins, errors %v; want one rejoin that says why", rejoins, errs)
	}
	if want := []string{"w1", "w2", "w3", "w4", "w5", "w6"}; !slices.Equal(logs[2], want) || !slices.Equal(logs[3], want) {
		t.Fatalf("the head holds %v, the tail %v; want both %v", logs[2], logs[3], want)
	}
	if replies < 2 {
		t.Fatalf("%d of the writes after the crash answered, want 2", replies)
	}
	if !mutation.On {
		return
	}
	rejoins, _, logs, _ = run(t, true)
	t.Logf("posGapOff: rejoins %d, logs %v", rejoins, logs)
	if rejoins != 0 || slices.Equal(logs[2], logs[3]) {
		t.Fatalf("posGapOff not caught: rejoins %d, logs %v", rejoins, logs)
	}
}

// TestChainUpdatePositionCountsTheCompactedPrefix: an update's position
// (chain.Msg.Pos) and the receiver's check of it (lostUpdate) count the
// compacted prefix, on both sides. Every member compacts its history after
// three writes (a checkpoint), then two more flow down the chain: none is
// taken for a gap. Counting only the entries held (the compacted prefix
// forgotten at the receiver or at the sender) makes every member after the
// head rejoin at the first update after a checkpoint, for as long as the
// chain runs — which no simulation verdict catches (histories agree, the
// writes stall), so this test holds it.
func TestChainUpdatePositionCountsTheCompactedPrefix(t *testing.T) {
	b := newChainBed(t, 1, 2, 3)
	for i := uint64(1); i <= 3; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	for _, id := range []uint64{1, 2, 3} {
		if err := b.cores[id].Compact(3); err != nil {
			t.Fatal(err)
		}
		if got := b.cores[id].base(); got != 3 {
			t.Fatalf("member %d compacted to %d, want 3: the scenario did not happen", id, got)
		}
	}
	for i := uint64(4); i <= 5; i++ {
		if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
	}
	b.pump()
	for _, id := range []uint64{2, 3} {
		if c := b.cores[id]; c.rejoins != 0 || len(b.errs[id]) != 0 {
			t.Fatalf("member %d: %d rejoins, errors %v; want none", id, c.rejoins, b.errs[id])
		}
		if got := b.cores[id].total(); got != 5 {
			t.Fatalf("member %d holds %d positions, want 5", id, got)
		}
	}
	if got := len(b.replies[1]); got != 5 {
		t.Fatalf("%d writes answered, want 5", got)
	}
}

// headChangedBed is a bed of three members, gap detection off with off,
// whose head (1) answered w1 and crashed: member 2 heads the chain [2 3].
func headChangedBed(t *testing.T, off bool) *chainBed {
	t.Helper()
	b := newChainBed(t, 1, 2, 3)
	for _, c := range b.cores {
		c.linkGapOff, c.epochGapOff, c.posGapOff = off, off, off
	}
	if err := b.propose(1, 7, 1, "w1"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	b.crash(1)
	b.pump()
	return b
}

// joinNew opens member id holding nothing (of a chain of members), gap
// detection off with off, and has the master join it keeping length.
func (b *chainBed) joinNew(t *testing.T, id uint64, members []uint64, length int, off bool) {
	t.Helper()
	j := b.addJoiner(t, id, members)
	j.linkGapOff, j.epochGapOff, j.posGapOff = off, off, off
	if err := b.master.Join(chain.NodeID(id), length); err != nil {
		t.Fatal(err)
	}
	b.pump()
}

// addJoiner opens member id of the bed holding nothing, knowing the chain
// of members: a node the master may join.
func (b *chainBed) addJoiner(t *testing.T, id uint64, members []uint64) *chainCore {
	t.Helper()
	j, err := openChain(chainConfig{Self: id, Master: bedMaster, Members: members}, core.Boot{LostState: true})
	if err != nil {
		t.Fatal(err)
	}
	b.cores[id] = j
	return j
}

// failAndJoin is what chainmaster does on the heartbeat of a member that
// rejoined (it says it is not a replica): it fails it, the chain is
// repaired around it, and joins it again keeping length.
func (b *chainBed) failAndJoin(t *testing.T, id chain.NodeID, length int) {
	t.Helper()
	b.master.Fail(id)
	b.pump()
	if err := b.master.Join(id, length); err != nil {
		t.Fatal(err)
	}
	b.pump()
}

// dropFirstUpdate loses the next update from member from to member to
// (and only it); the flag says whether one went.
func (b *chainBed) dropFirstUpdate(from, to chain.NodeID) *bool {
	dropped := new(bool)
	b.drop = func(m chain.Msg) bool {
		if !*dropped && m.Type == chain.MsgUpdate && m.From == from && m.To == to {
			*dropped = true
			return true
		}
		return false
	}
	return dropped
}

// logOf is the data of the writes member id's disk holds, in order.
func logOf(t *testing.T, b *chainBed, id uint64) []string {
	t.Helper()
	var out []string
	for _, e := range b.disk[id] {
		ce, err := fromLogEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		req, err := decodeChainOp(ce.Op)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(req.Data))
	}
	return out
}

// headOf is the bed's head.
func headOf(t *testing.T, b *chainBed) uint64 {
	t.Helper()
	for _, id := range slices.Sorted(maps.Keys(b.cores)) {
		if b.cores[id].isHead() {
			return id
		}
	}
	t.Fatal("no head")
	return 0
}

// TestChainRestartsWhole: a chain of three takes writes, every member
// loses power at once, and each restarts from what its disk holds: the
// entries and the hard state as of its last fsync — the head's and the
// middle's commit points, written on their own after the last
// acknowledgements, are not among it (a Ready with only a hard state starts
// no fsync). The master restarts the chain from the longest durable history
// (chain.Master.Restarted, from what each reports: its LU and length) and
// joins the others: every answered write is on every member, and the
// chain takes writes again. Two rules each keep the last: the tail's host
// records everything it writes as committed, fsynced with the write (its
// acknowledgement follows), and every member reports, and a restart takes,
// its durable log past its commit point (chainCore.tentative). With both
// off — the mutations tailCommitLags (the tail saves its commit point as
// the others do, in a later Ready) and truncateAtBoot — the restarted chain
// holds fewer entries than were answered.
func TestChainRestartsWhole(t *testing.T) {
	run := func(t *testing.T, lag bool) (answered, kept int) {
		ids := []uint64{1, 2, 3}
		b := newChainBed(t, ids...)
		for _, c := range b.cores {
			c.tailCommitLags = lag
		}
		for i := uint64(1); i <= 3; i++ {
			if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
				t.Fatal(err)
			}
			b.pump()
		}
		answered = len(b.replies[1])
		if !lag && b.synced[3].Commit != 3 {
			t.Fatalf("the tail synced commit point %d after writing 3 entries, want 3", b.synced[3].Commit)
		}
		if b.synced[1].Commit >= 3 {
			t.Fatalf("the head synced commit point %d: the power cut takes nothing, the test shows nothing", b.synced[1].Commit)
		}
		for _, id := range ids {
			b.crash(id)
		}
		if !b.master.Down() {
			t.Fatal("the master is not down with every member crashed")
		}
		for _, id := range ids {
			c, err := openChain(chainConfig{Self: id, Master: bedMaster, Members: ids, truncateAtBoot: lag}, core.Boot{HardState: b.synced[id], Entries: b.disk[id]})
			if err != nil {
				t.Fatal(err)
			}
			b.cores[id], b.applied[id], b.replies[id] = c, nil, nil
			lu, n := c.restartReport()
			b.master.Restarted(chain.NodeID(id), lu, n, c.status().Paged)
		}
		b.pump()
		ms := b.master.Members()
		if len(ms) != 1 || b.master.Tail() != ms[0] {
			t.Fatalf("after the restart: chain %v, tail %d, want one member as the tail", ms, b.master.Tail())
		}
		for _, id := range ids {
			if chain.NodeID(id) != ms[0] {
				if err := b.master.Join(chain.NodeID(id), 1); err != nil {
					t.Fatal(err)
				}
				b.pump()
			}
		}
		head := headOf(t, b)
		if err := b.propose(head, 7, 4, "w4"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		if !slices.ContainsFunc(b.replies[head], func(r core.Reply) bool { return r.ReqNum == 4 && r.Err == nil }) {
			t.Fatalf("the restarted chain's head did not answer the write after the restart: %+v", b.replies[head])
		}
		kept = len(b.disk[head]) - 1
		for _, id := range ids {
			if len(b.disk[id]) != kept+1 {
				t.Fatalf("member %d holds %d entries, the head %d", id, len(b.disk[id]), kept+1)
			}
		}
		return answered, kept
	}
	answered, kept := run(t, false)
	if answered != 3 || kept != 3 {
		t.Fatalf("%d writes answered, %d kept across the whole chain's restart", answered, kept)
	}
	if !mutation.On {
		return
	}
	answered, kept = run(t, true)
	t.Logf("tailCommitLags and truncateAtBoot: %d writes answered, %d kept", answered, kept)
	if kept >= answered {
		t.Fatal("tailCommitLags and truncateAtBoot not caught: the restarted chain kept every answered write")
	}
}

// TestChainMemberOutsideTheChainRejoins: a member the master repaired out
// of the chain while it was alive hears so in the answer to its heartbeat
// (the configuration without it): it takes no lease from that answer and
// rejoins as a new member — a joiner holding its committed history, whose
// heartbeats say it is not a replica, so the master joins it again — with
// no restart of its process. With the mutation outsideStays (the code
// before) it stays active, reporting itself removed, until an answer lists
// it again or its process restarts.
func TestChainMemberOutsideTheChainRejoins(t *testing.T) {
	run := func(t *testing.T, stays bool) *chainCore {
		b := newChainBed(t, 1, 2, 3)
		c := b.cores[3]
		c.lease, c.outsideStays = int64(time.Second), stays
		answer := func(seq uint64, members ...chain.NodeID) {
			c.beats = append(c.beats, [2]int64{int64(seq), 0})
			c.Step(0, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: 3, Seq: seq, Members: members})
		}
		answer(1, 1, 2, 3)
		if st := c.Info().Status; st != core.Normal || !c.leased(0) {
			t.Fatalf("a member of the chain: status %v, leased %v; want normal, leased", st, c.leased(0))
		}
		c.leaseUntil = 0
		answer(2, 1, 2)
		if c.leased(0) {
			t.Fatal("a member the configuration left out holds a lease")
		}
		return c
	}
	c := run(t, false)
	if st := c.Info().Status; st != core.Recovering || c.status().State != chain.Inactive || c.rejoins != 1 {
		t.Fatalf("a member the configuration left out: status %v, state %v, rejoins %d; want recovering, a joiner, 1", st, c.status().State, c.rejoins)
	}
	var beats []chain.Msg
	c.beat = 1
	c.Tick(10)
	for _, m := range c.Ready().Messages {
		if m.Type == chain.MsgHeartbeat {
			beats = append(beats, m)
		}
	}
	if len(beats) != 1 || !beats[0].Refused {
		t.Fatalf("heartbeats after the rejoin %+v, want one saying it is not a replica", beats)
	}
	if !mutation.On {
		return
	}
	c = run(t, true)
	if st := c.Info().Status; st != core.Removed || c.rejoins != 0 {
		t.Fatalf("outsideStays: status %v, rejoins %d; want removed, none", st, c.rejoins)
	}
}

// TestChainCoreReadLease: the head publishes a read lease (Ready.Lease) for
// the host to serve linearizable reads off its driver — the head, active,
// under the master's lease, until that lease ends, once its whole history is
// applied — and no other member does, nor the head before the master
// answered. (A head the master repaired around keeps its own wiring; the
// lease's end is what stops it.) With the mutation
// readLeaseForever (the read lease outlives the master's) it fails.
func TestChainCoreReadLease(t *testing.T) {
	const ms = int64(1e6)
	// leaseOf runs the head until the master answered its first heartbeat
	// (sent at 50 ms, a lease of 100 ms) and returns its read lease then.
	leaseOf := func(t *testing.T, self uint64, forever bool) (core.Lease, *chainCore) {
		c, err := openChain(chainConfig{Self: self, Master: bedMaster, Members: []uint64{2, 3},
			Heartbeat: 10 * ms, Lease: 100 * ms}, core.Boot{Bootstrap: true})
		if err != nil {
			t.Fatal(err)
		}
		c.readLeaseForever = forever
		if l := c.Ready().Lease; l.Held {
			t.Fatalf("a lease before the master answered: %+v", l)
		}
		c.Tick(50 * ms)
		rd := c.Ready()
		if len(rd.Messages) != 1 || rd.Messages[0].Type != chain.MsgHeartbeat {
			t.Fatalf("tick sent %v, want a heartbeat", rd.Messages)
		}
		c.Step(70*ms, chain.Msg{Type: chain.MsgHeartbeat, From: bedMaster, To: chain.NodeID(self), Seq: rd.Messages[0].Seq, Members: []chain.NodeID{2, 3}})
		return c.Ready().Lease, c
	}
	l, c := leaseOf(t, 2, false)
	if !l.Held || l.Follower || l.Until != 150*ms || l.Index != uint64(c.total()) {
		t.Fatalf("the head's lease after the answer to the heartbeat sent at 50 ms: %+v, want held until 150 ms at index %d", l, c.total())
	}
	// Every active member holds one (CRAQ reads at any member, chainRead).
	if l, c := leaseOf(t, 3, false); !l.Held || l.Until != 150*ms || l.Index != uint64(c.total()) {
		t.Fatalf("the tail's lease after the answer to the heartbeat sent at 50 ms: %+v, want held until 150 ms", l)
	}
	if !mutation.On {
		return
	}
	if l, _ := leaseOf(t, 2, true); l.Until == 150*ms {
		t.Fatal("readLeaseForever not caught")
	} else {
		t.Logf("readLeaseForever: the lease runs until %d, past the master's (150 ms): caught", l.Until)
	}
}

// TestChainJoinerMergesNoHole: a node (4) joins a chain of three before its
// tail; its new predecessor (2) sends it its first two updates while the
// FLUSH is still on its way round, and the first is lost. The joiner has
// never heard from 2 (its pre-copy came from the tail), so the link
// numbering takes the second as its baseline, and a joiner is not checked
// by lostUpdate: without mergeGap it merged w3 over the hole and, once the
// master repaired around the old tail (which rejoined on the relayed w3),
// was the tail of a chain whose head answered w2 — a write the tail never
// held. With it the joiner rejoins at the merge, and the chain ends with
// every member holding the head's log.
func TestChainJoinerMergesNoHole(t *testing.T) {
	run := func(off bool) (logs map[uint64][]string, rejoins int) {
		b := newChainBed(t, 1, 2, 3)
		if err := b.propose(1, 7, 1, "w1"); err != nil {
			t.Fatal(err)
		}
		b.pump()
		b.addJoiner(t, 4, []uint64{1, 2, 3}).mergeGapOff = off
		proposed, dropped := false, false
		var held *chain.Msg
		b.drop = func(m chain.Msg) bool {
			switch {
			case !proposed && m.Type == chain.MsgFlush && m.From == 1 && m.To == 2:
				proposed = true
				for i := uint64(2); i <= 3; i++ {
					if err := b.propose(1, 7, i, fmt.Sprint("w", i)); err != nil {
						t.Fatal(err)
					}
				}
			case held == nil && m.Type == chain.MsgFlush && m.From == 3 && m.To == 4:
				held = &m // a slow link 3→4: the FLUSH comes round after 2's updates
				return true
			case !dropped && m.Type == chain.MsgUpdate && m.From == 2 && m.To == 4:
				dropped = true
				return true
			case held != nil && m.Type == chain.MsgUpdate && m.From == 2 && m.To == 4:
				b.queue = append(b.queue, *held)
			}
			return false
		}
		if err := b.master.Join(4, 3); err != nil {
			t.Fatal(err)
		}
		b.pump()
		b.drop = nil
		if !proposed || !dropped || held == nil {
			t.Fatalf("the scenario did not happen: proposed %v, dropped %v, FLUSH held %v", proposed, dropped, held != nil)
		}
		rejoins = b.cores[4].rejoins
		// What chainmaster does on the heartbeats of the members that
		// rejoined (not replicas): fail them, the chain repaired around.
		for _, id := range []uint64{3, 4} {
			if c := b.cores[id]; c != nil && c.status().State != chain.Active {
				b.master.Fail(chain.NodeID(id))
				b.pump()
			}
		}
		logs = map[uint64][]string{}
		for _, id := range b.master.Members() {
			logs[uint64(id)] = logOf(t, b, uint64(id))
		}
		if len(b.replies[1]) != 3 {
			t.Fatalf("%d writes answered, want 3", len(b.replies[1]))
		}
		return logs, rejoins
	}
	logs, rejoins := run(false)
	t.Logf("chain %v, joiner rejoins %d", logs, rejoins)
	if rejoins != 1 {
		t.Fatalf("the joiner rejoined %d times, want once (at the merge)", rejoins)
	}
	for id, l := range logs {
		if !slices.Equal(l, []string{"w1", "w2", "w3"}) {
			t.Fatalf("member %d holds %v after the head answered w1 w2 w3", id, l)
		}
	}
	if !mutation.On {
		return
	}
	logs, _ = run(true)
	t.Logf("mergeGapOff: chain %v", logs)
	if slices.Equal(logs[4], []string{"w1", "w2", "w3"}) {
		t.Fatalf("mergeGapOff not caught: the joiner holds %v", logs[4])
	}
}

// bedWithWrites is a chain bed of ids after n writes at its head, each
// pumped to its end.
func bedWithWrites(t *testing.T, ids []uint64, n uint64) *chainBed {
	b := newChainBed(t, ids...)
	for i := uint64(1); i <= n; i++ {
		if err := b.propose(ids[0], 7, i, fmt.Sprint("w", i)); err != nil {
			t.Fatal(err)
		}
		b.pump()
	}
	return b
}

// TestChainPageDropsTentative: a member restarted with a log past its
// commit point keeps that suffix (chainCore.tentative) and counts it in
// its restart report, until its pre-copy begins. A pre-copy by snapshot
// pages begins with a page written into the engine and no log write: from
// then on the member's state is part of a snapshot, and the suffix is no
// longer a history it may restart the chain from (chain.Member.restart
// refuses a paged member; chainCore.adopt would build a new member that
// knows nothing of the pages). Without the page clearing it, the report
// still counts the suffix.
func TestChainPageDropsTentative(t *testing.T) {
	ids := []uint64{1, 2, 3}
	b := bedWithWrites(t, ids, 3)
	if b.synced[1].Commit >= 3 || len(b.disk[1]) != 3 {
		t.Fatalf("the head synced commit point %d, logged %d: want a log past the commit point", b.synced[1].Commit, len(b.disk[1]))
	}
	c, err := openChain(chainConfig{Self: 1, Master: bedMaster, Members: ids}, core.Boot{HardState: b.synced[1], Entries: b.disk[1]})
	if err != nil {
		t.Fatal(err)
	}
	if _, n := c.restartReport(); n != 3 {
		t.Fatalf("restart report counts %d entries, want 3 (the suffix past the commit point)", n)
	}
	c.installed(&chain.Snap{N: 10, Data: kv.AppendClientEntries(nil, nil), More: true})
	if _, n := c.restartReport(); n != int(b.synced[1].Commit) {
		t.Fatalf("after a snapshot page the restart report counts %d entries, want %d (the committed prefix)", n, b.synced[1].Commit)
	}
}

// TestChainRejoinKeepsOnlyPersisted: a log member told it is out keeps as
// tentative only the part of its log past its commit point that its host
// persisted: an update it took but never handed to its host is on no disk,
// and a restart from its report would take it as durable history (adopt
// counts the whole history as written). Without the filter the report
// counts the unwritten update.
func TestChainRejoinKeepsOnlyPersisted(t *testing.T) {
	ids := []uint64{1, 2, 3}
	b := bedWithWrites(t, ids, 3)
	if err := b.propose(1, 7, 4, "w4"); err != nil {
		t.Fatal(err)
	}
	c := b.cores[1]
	if n := len(c.m.History()); n != 4 {
		t.Fatalf("the head holds %d entries after a 4th update, want 4", n)
	}
	c.rejoin("test")
	if _, n := c.restartReport(); n != 3 {
		t.Fatalf("after its rejoin the head's restart report counts %d entries, want 3 (its 4th is on no disk)", n)
	}
}
