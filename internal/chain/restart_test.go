package chain

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
)

// TestRestartResumesPrecopy: a log member crashes, the chain repairs
// around it and takes more updates; the member restarts from the committed
// prefix of its durable history (Config.Log: what its host recorded as
// acknowledged) and rejoins as a joiner whose pre-copy asks only for what
// follows that prefix. Once it is a replica again every member holds the
// same history and the invariants hold throughout (collect checks them).
func TestRestartResumesPrecopy(t *testing.T) {
	ids := []NodeID{1, 2, 3}
	h := newHarness(ids, 3, 2, 0)
	h.setup(SU, func(NodeID) Store { return Log })
	put := putter(h)
	put(6)
	old := h.members[2]
	st := old.Status()
	var committed []Entry
	for _, e := range old.History() {
		if e.Seq <= st.LA {
			committed = append(committed, e)
		}
	}
	if len(committed) != 6 {
		t.Fatalf("member 2 holds %d committed entries after 6 updates, want 6 (%+v)", len(committed), st)
	}
	h.crash(2, true)
	h.stabilize()
	put(5)
	if h.err != nil {
		t.Fatal(h.err)
	}

	// Restart: a joiner holding the committed prefix.
	c := h.config(2)
	c.Log = committed
	m := NewMember(c, newKV())
	if s := m.Status(); s.State != Inactive || s.Log != 6 || s.LU != committed[5].Seq || s.Persisted != s.LU {
		t.Fatalf("restarted member: %+v, want an inactive joiner holding (and having persisted) 6 entries", s)
	}
	if out := m.Ready(); len(out) != 0 {
		t.Fatalf("a restart sends %v, want nothing until the master orders a join", out)
	}
	if err := h.master.Join(2, 1); err != nil {
		t.Fatal(err)
	}
	h.members[2], h.all[2] = m, m
	h.collect()
	h.deliver(link{masterID, 2}) // PRECOPY: the joiner asks the tail
	if q := h.queues[link{2, 3}]; len(q) != 1 || q[0].Type != MsgPrecopyReq || q[0].Seq != committed[5].Seq {
		t.Fatalf("the restarted joiner sent %v to the tail, want one precopy-req after %s (what it holds)", q, FormatSeq(committed[5].Seq))
	}
	h.stabilize()
	put(3)
	if h.err != nil {
		t.Fatal(h.err)
	}
	if got := h.master.Members(); len(got) != 3 || got[1] != 2 {
		t.Fatalf("chain %v after the rejoin at position 1, want 2 in the middle", got)
	}
	want := h.members[1].History()
	for _, n := range h.master.Members() {
		got := h.members[n].History()
		if len(got) != len(want) || got[len(got)-1].sum != want[len(want)-1].sum {
			t.Fatalf("member %d holds %d entries, the head %d (or a different history)", n, len(got), len(want))
		}
	}
	if s := m.Status(); s.State != Active || s.LA != s.LU {
		t.Fatalf("rejoined member: %+v, want active with everything acknowledged", s)
	}
}

// TestRestartFromSnapshot: a member restarts from its host's checkpoint
// with no log after it, so it knows how many entries its history holds but
// not the sequence number of the last (Config.BaseN without BaseSeq); the
// tail meanwhile compacted its history. The joiner asks for a snapshot, the
// tail sends its state machine in the first pre-copy chunk (its
// Snapshotter), and after the join every member holds the same history,
// compacted prefixes included.
func TestRestartFromSnapshot(t *testing.T) {
	ids := []NodeID{1, 2, 3}
	h := newHarness(ids, 3, 2, 0)
	put := putter(h)
	put(6)
	h.crash(2, true)
	h.stabilize()
	put(5)
	for _, n := range h.ids() {
		h.members[n].Compact(^uint64(0))
	}
	if s := h.members[3].Status(); s.Base != 11 || s.Log != 0 {
		t.Fatalf("the tail after compaction: %+v, want 11 entries compacted, none left", s)
	}
	c := h.config(2)
	c.BaseN = 6
	m := NewMember(c, newKV())
	if err := h.master.Join(2, 1); err != nil {
		t.Fatal(err)
	}
	h.members[2], h.all[2] = m, m
	h.collect()
	h.deliver(link{masterID, 2})
	if q := h.queues[link{2, 3}]; len(q) != 1 || q[0].Type != MsgPrecopyReq || !q[0].Any {
		t.Fatalf("the joiner sent %v to the tail, want a precopy-req asking for a snapshot", q)
	}
	h.stabilize()
	if h.snaps != 1 {
		t.Fatalf("%d snapshots sent, want 1", h.snaps)
	}
	put(3)
	if h.err != nil {
		t.Fatal(h.err)
	}
	head := h.members[1]
	for _, n := range h.master.Members() {
		x := h.members[n]
		if x.total() != head.total() || x.lastSum() != head.lastSum() {
			t.Fatalf("member %d holds %d entries, the head %d (or a different history)", n, x.total(), head.total())
		}
	}
	if got := string(m.sm.Read([]byte("k1"))); got != "1:v11" {
		t.Fatalf("the joiner's state after the snapshot: k1 = %q, want 1:v11", got)
	}
}

// putter returns a function that puts n updates "k<id%5>=v<id>" through
// the master, ids counting from 1, and lets the chain settle.
func putter(h *harness) func(n int) {
	id := uint64(0)
	return func(n int) {
		for range n {
			id++
			h.master.Put(id, fmt.Appendf(nil, "k%d=v%d", id%5, id))
			h.collect()
		}
		h.stabilize()
	}
}

// TestPinTimeout: a tail keeps its log after a pre-copying joiner's
// position (its pin) until the pin times out on the tail's clock; then it
// compacts past it, and the joiner's next request gets a snapshot. The join
// (before the tail, which is then truncated) completes and every member
// holds the same history.
func TestPinTimeout(t *testing.T) {
	h := newHarness([]NodeID{1, 2}, 2, 2, 0)
	put := putter(h)
	put(5)
	tail := h.members[2]
	tail.cfg.PinTimeout = 10
	if err := h.addJoiner(3, 1); err != nil {
		t.Fatal(err)
	}
	h.deliver(link{masterID, 3}) // PRECOPY
	h.deliver(link{3, 2})        // the first request: after 0
	if tail.Compact(^uint64(0)); tail.base.n != 0 {
		t.Fatalf("the tail compacted %d entries past a live joiner's pin", tail.base.n)
	}
	h.tick(11)
	if tail.Compact(^uint64(0)); tail.base.n != 5 {
		t.Fatalf("the tail compacted %d entries after the pin timed out, want 5", tail.base.n)
	}
	h.stabilize()
	if h.snaps != 1 {
		t.Fatalf("%d snapshots sent, want 1 (the joiner's next request is below the compacted prefix)", h.snaps)
	}
	put(2)
	if h.err != nil {
		t.Fatal(h.err)
	}
	// A join before the tail truncates the old tail: [1 3].
	if got := h.master.Members(); len(got) != 2 || got[1] != 3 {
		t.Fatalf("chain %v, want [1 3]", got)
	}
	for _, n := range h.master.Members() {
		if x := h.members[n]; x.total() != 7 || x.lastSum() != h.members[1].lastSum() {
			t.Fatalf("member %d holds %d entries (want 7) or another history", n, x.total())
		}
	}
}

// TestRestartWithoutAMember: every member of a chain of three crashes; the
// master, down, waits for all three to report (Restarted). Node 3 — the
// last tail, the only one whose durable prefix holds all 6 acknowledged
// updates (the others' commit points lag at 4) — never comes back, so the
// operator restarts without it (Forgo): the chain restarts from 1 (4
// entries, the lowest id of the longest) and loses updates 5 and 6, as
// Forgo warns. When 3 comes back holding its 6 entries it is not joined —
// they hold updates the chain no longer has (ForgoneError) — until it
// restarts holding nothing; then it joins and every member holds the
// chain's one history. With the mutation joinForgone (Join takes it as any
// restarted member) the joiner's pre-copy asks after entries the chain
// never had; before review35d it resumed after them, and the members'
// histories differed.
func TestRestartWithoutAMember(t *testing.T) {
	run := func(t *testing.T, joinForgone bool) error {
		ids := []NodeID{1, 2, 3}
		h := newHarness(ids, 3, 2, 0)
		h.setup(SU, func(NodeID) Store { return Log })
		h.master.mut.joinForgone = joinForgone
		put := putter(h)
		put(6)
		prefix := map[NodeID][]Entry{}
		for _, id := range ids {
			hist := h.members[id].History()
			prefix[id] = hist[:min(len(hist), 4)]
		}
		prefix[3] = h.members[3].History()
		if len(prefix[3]) != 6 {
			t.Fatalf("the tail holds %d entries after 6 updates", len(prefix[3]))
		}
		for _, id := range ids {
			h.crash(id, true)
		}
		if !h.master.Down() {
			t.Fatal("the master is not down with every member crashed")
		}
		if _, err := h.master.Forgo(3); err != nil {
			t.Fatal(err) // nobody reported yet: it waits for 1 and 2
		}
		restart := func(id NodeID, log []Entry) (*Member, bool) {
			c := h.config(id)
			c.Log = log
			m := NewMember(c, newKV())
			h.members[id], h.all[id] = m, m
			s := m.Status()
			return m, h.master.Restarted(id, s.LU, s.Base+s.Log, false)
		}
		if _, ok := restart(1, prefix[1]); ok {
			t.Fatal("the chain restarted before 2 reported")
		}
		if got := h.master.Awaited(); len(got) != 1 || got[0] != 2 {
			t.Fatalf("awaited %v, want [2]", got)
		}
		if _, ok := restart(2, prefix[2]); !ok {
			t.Fatal("the chain did not restart once every remaining candidate reported")
		}
		if _, err := h.master.Forgo(2); err == nil {
			t.Fatal("Forgo on a running chain succeeded")
		}
		h.collect()
		h.stabilize()
		if got := h.master.Members(); len(got) != 1 || got[0] != 1 {
			t.Fatalf("restarted chain %v, want [1]", got)
		}
		if err := h.master.Join(2, 1); err != nil {
			t.Fatal(err)
		}
		h.collect()
		h.stabilize()
		put(2)

		// 3 comes back holding its 6 entries: refused, until it holds none.
		if _, ok := restart(3, prefix[3]); ok {
			t.Fatal("a forgone node's report restarted a running chain")
		}
		err := h.master.Join(3, 2)
		var fe *ForgoneError
		if !joinForgone {
			if !errors.As(err, &fe) || fe.Node != 3 || fe.Length != 4 {
				t.Fatalf("join of the forgone node holding 6 entries: %v, want a ForgoneError at 4", err)
			}
			restart(3, nil)
			err = h.master.Join(3, 2)
		}
		if err != nil {
			t.Fatalf("join of node 3: %v", err)
		}
		h.collect()
		h.stabilize()
		put(2)
		if h.err != nil {
			return h.err
		}
		want := h.members[1].History()
		for _, n := range h.master.Members() {
			got, s := h.members[n].History(), h.members[n].Status()
			if s.Base+s.Log != len(want) || got[len(got)-1].sum != want[len(want)-1].sum {
				return fmt.Errorf("member %d holds %d entries, the head %d (or a different history)", n, s.Base+s.Log, len(want))
			}
		}
		if got := h.master.Members(); len(got) != 3 {
			return fmt.Errorf("chain %v at the end, want three members", got)
		}
		if len(want) != 8 {
			t.Fatalf("the chain holds %d entries, want 8 (4 kept, 4 after the restart)", len(want))
		}
		return nil
	}
	if err := run(t, false); err != nil {
		t.Fatal(err)
	}
	if !mutation.On {
		return
	}
	// Since review35d the pre-copy does not resume after entries its
	// source does not hold: the source sends a snapshot that replaces them
	// (TestPrecopyReplacesADivergedHistory). The refusal stays (the
	// operator hears that the node held more than the chain), but a join
	// without it no longer diverges.
	if err := run(t, true); err != nil {
		t.Fatalf("joinForgone: %v; want the forgone node's history replaced by its pre-copy", err)
	}
}

// TestForgoRefuses: Forgo only while the chain is down, for a candidate,
// and never the last one.
func TestForgoRefuses(t *testing.T) {
	h := newHarness([]NodeID{1, 2}, 2, 2, 0)
	if _, err := h.master.Forgo(2); err == nil {
		t.Fatal("Forgo on a running chain succeeded")
	}
	h.crash(1, true)
	h.crash(2, true)
	if _, err := h.master.Forgo(7); err == nil {
		t.Fatal("Forgo of a node that was never a member succeeded")
	}
	if _, err := h.master.Forgo(2); err != nil {
		t.Fatal(err)
	}
	if _, err := h.master.Forgo(1); err == nil {
		t.Fatal("Forgo of the last candidate succeeded")
	}
}

// TestRestartedMemberIgnoresRepairOrders (found by e2e
// TestChainRestartsWithoutAMember): a member restarts — an inactive joiner
// holding its durable prefix — before the master notices, and the master,
// repairing the chain around another member that restarted first, sends
// the old incarnation's CR_MID to the new one. A joiner is not linked into
// the chain: it must not take the order. It did, and stayed "repairing"
// (waiting for a REPAIR_INFO from a successor that never answered: on the
// host it was down too; here its CR_MID_REPAIR is lost), so when it was
// later joined as the head it never passed an update on: the chain took
// writes and answered none. With the mutation inactiveRepairs (the code
// before) the writes after the join are not answered.
func TestRestartedMemberIgnoresRepairOrders(t *testing.T) {
	run := func(inactiveRepairs bool) (answered int) {
		ids := []NodeID{1, 2, 3, 4}
		h := newHarness(ids, 4, 2, 0)
		h.setup(SU, func(NodeID) Store { return Log })
		put := putter(h)
		put(4)
		prefix := h.members[1].History()
		h.crash(1, false) // restarted before the master hears of it
		c := h.config(1)
		c.Log = prefix
		m := NewMember(c, newKV())
		m.mut.inactiveRepairs = inactiveRepairs
		h.members[1], h.all[1] = m, m
		h.crash(2, true) // the master repairs [1 3 4]: CR_MID to 1, towards 3
		h.collect()
		h.deliver(link{masterID, 1})
		if q := h.queues[link{1, 3}]; len(q) > 0 {
			h.drop(link{1, 3}) // its CR_MID_REPAIR: no answer comes
		}
		h.master.Fail(1) // its heartbeat says it is not a replica
		h.collect()
		h.stabilize()
		if err := h.master.Join(1, 0); err != nil {
			t.Fatal(err)
		}
		h.collect()
		h.stabilize()
		before := len(h.replies)
		put(3)
		if h.err != nil {
			t.Fatal(h.err)
		}
		return len(h.replies) - before
	}
	if n := run(false); n != 3 {
		t.Fatalf("%d of 3 writes answered after the restarted member joined as the head", n)
	}
	if !mutation.On {
		return
	}
	if n := run(true); n == 3 {
		t.Fatal("inactiveRepairs not caught: every write answered")
	}
}

// TestRestartPrefersTheNewerEpoch: the histories a restart compares may run
// past the members' commit points (a host reports its durable log whole:
// vrshard's chainCore.tentative), and two such logs may disagree after
// their common prefix — an old head's updates that never reached its
// successor, numbered in its epoch, and the new head's at the same
// positions, in a newer one, which the tail may have committed and served.
// The restart takes the log whose last update is of the newest numbering
// epoch, the longest among those (Master.upToDate), not the longest: with
// the mutation restartLongestLog the old head's longer log wins. A history
// of a checkpoint alone whose last number its host does not know (lu 0: a
// checkpoint written before hosts kept the number) is a committed prefix,
// compared by length.
func TestRestartPrefersTheNewerEpoch(t *testing.T) {
	run := func(t *testing.T, longest bool, reports map[NodeID]restartReport) NodeID {
		ids := []NodeID{1, 2, 3}
		h := newHarness(ids, 3, 2, 0)
		h.setup(SU, func(NodeID) Store { return Log })
		h.master.mut.restartLongestLog = longest
		putter(h)(2)
		for _, id := range ids {
			h.crash(id, true)
		}
		restarted := reportRestarts(t, h, ids, reports)
		if ms := h.master.Members(); !restarted || len(ms) != 1 {
			t.Fatalf("restarted %v, members %v: want a chain of one", restarted, ms)
		}
		return h.master.Members()[0]
	}
	bits := newHarness([]NodeID{1, 2, 3}, 3, 2, 0).master.seqBits
	seq := func(epoch uint64, n uint64) uint64 { return epoch<<bits | n }
	split := map[NodeID]restartReport{1: {lu: seq(1, 6), length: 6}, 2: {lu: seq(2, 1), length: 5}, 3: {}}
	if got := run(t, false, split); got != 2 {
		t.Fatalf("restarted from %d, want 2 (the newer epoch's log, though shorter)", got)
	}
	if mutation.On {
		if got := run(t, true, split); got != 1 {
			t.Fatalf("restartLongestLog: restarted from %d, want 1 (the mutation does not bite)", got)
		}
	}
	// A checkpoint alone whose number is unknown (lu 0: a host's
	// directory from before the number) is compared by length: over a
	// shorter log, not over a longer one, whose epoch cannot be compared
	// with the checkpoint's (TestRestartCheckpointOfTheNewerEpoch: with
	// the number it can).
	snap := map[NodeID]restartReport{1: {lu: 0, length: 10}, 2: {lu: seq(1, 9), length: 9}, 3: {}}
	if got := run(t, false, snap); got != 1 {
		t.Fatalf("restarted from %d, want 1 (a checkpoint's committed prefix over a shorter log)", got)
	}
}

// TestRestartCheckpointAloneBehind: a member whose host holds a checkpoint
// with no entry after it (its last number unknown: lu 0) — the host
// checkpointed in a quiet moment, then the member failed — while the chain
// went on without it and acknowledged more updates, which the other members
// hold. A whole-chain restart must not take the checkpoint over their
// longer logs: it would drop acknowledged writes (review33d: counted as
// the newest epoch, it did). The host keeps the checkpoint's last number
// with it, so the report carries its epoch, older than the others' logs
// here; without it (lu 0: a directory of a build before the number) it is
// compared by length. Either way the 20 acknowledged updates survive. The
// opposite case: TestRestartCheckpointOfTheNewerEpoch.
func TestRestartCheckpointAloneBehind(t *testing.T) {
	for _, number := range []bool{true, false} {
		ids := []NodeID{1, 2, 3}
		h := newHarness(ids, 3, 2, 0)
		h.setup(SU, func(NodeID) Store { return Log })
		put := putter(h)
		put(10)
		checkpoint := restartReport{length: 10}
		if number {
			checkpoint.lu = h.members[1].Status().LU
		}
		h.crash(1, true)
		h.collect()
		h.stabilize()
		put(10)
		if n := len(h.members[3].History()); n != 20 {
			t.Fatalf("the tail holds %d entries after 20 updates", n)
		}
		reports := map[NodeID]restartReport{1: checkpoint}
		for _, id := range []NodeID{2, 3} {
			s := h.members[id].Status()
			reports[id] = restartReport{lu: s.LU, length: s.Base + s.Log}
			h.crash(id, true)
		}
		restarted := reportRestarts(t, h, ids, reports)
		if ms := h.master.Members(); !restarted || len(ms) != 1 || ms[0] == 1 {
			t.Fatalf("number %v: restarted %v, members %v: want a chain of 2 or 3 (holding the 20 acknowledged updates), not 1's checkpoint of 10", number, restarted, ms)
		}
	}
}

// reportRestarts tells h's master, down with every member crashed, that
// each of ids restarted holding reports[id], and whether the chain
// restarted at the last report.
func reportRestarts(t *testing.T, h *harness, ids []NodeID, reports map[NodeID]restartReport) bool {
	t.Helper()
	if !h.master.Down() {
		t.Fatal("the master is not down with every member crashed")
	}
	restarted := false
	for _, id := range ids {
		r := reports[id]
		restarted = h.master.Restarted(id, r.lu, r.length, r.paged)
	}
	return restarted
}

// TestRestartCheckpointOfTheNewerEpoch: the case a checkpoint's unknown
// number left open (review33d's other half). An old head logs updates and
// fails before passing any on: its log runs past the chain's in the old
// numbering epoch. The repaired chain (a newer epoch) acknowledges more
// updates, fewer than the old head's unpassed suffix, and every member
// left checkpoints them with no entry after (a quiet moment); then they
// fail too. Each restarts from what its host keeps: the old head its
// whole log (past its commit point: the host's tentative suffix), the
// others their checkpoint — with its last update's number, which the host
// now keeps on disk beside it (vrshard: the snapshot record's number), or
// without it, as the host before did (lu 0: compared by length). With the
// number the restart takes the newer epoch's checkpoint and the
// acknowledged updates survive; without it the old head's longer log wins
// and the update acknowledged last is gone.
func TestRestartCheckpointOfTheNewerEpoch(t *testing.T) {
	run := func(t *testing.T, number bool) (NodeID, string) {
		ids := []NodeID{1, 2, 3}
		h := newHarness(ids, 3, 2, 0)
		h.setup(SU, func(NodeID) Store { return Log })
		put := putter(h)
		put(4)
		// Three updates the head logs and never passes on (its client
		// gives up: the master does not route them again).
		for id := uint64(101); id <= 103; id++ {
			h.master.Put(id, fmt.Appendf(nil, "k%d=old%d", id%5, id))
			h.master.Forget(id)
		}
		h.collect()
		for _, l := range []link{{masterID, 1}, {1, 1}} {
			for len(h.queues[l]) > 0 {
				h.deliver(l) // the updates reach the head, then its disk
			}
		}
		oldHead := slices.Clone(h.members[1].History())
		if len(oldHead) != 7 {
			t.Fatalf("the old head holds %d entries, want 7", len(oldHead))
		}
		h.crash(1, true)
		h.stabilize()
		put(2) // k0=v5, k1=v6: acknowledged by the repaired chain
		if h.err != nil {
			t.Fatal(h.err)
		}
		if n := len(h.replies); n != 6 {
			t.Fatalf("%d updates answered, want 6", n)
		}
		reports := map[NodeID]restartReport{}
		restarted := map[NodeID]*Member{}
		c := h.config(1)
		c.Log = oldHead
		restarted[1] = NewMember(c, newKV())
		for _, id := range []NodeID{2, 3} {
			m := h.members[id]
			if e, old := m.Status().LU>>h.master.seqBits, oldHead[6].Seq>>h.master.seqBits; e <= old {
				t.Fatalf("member %d's last update of epoch %d, the old head's of %d: want a newer one", id, e, old)
			}
			m.Compact(^uint64(0)) // a checkpoint with nothing after it
			s := m.Status()
			if s.Base != 6 || s.Log != 0 {
				t.Fatalf("member %d after its checkpoint: %+v, want 6 entries compacted, none after", id, s)
			}
			c := h.config(id)
			c.BaseN = s.Base
			if number {
				_, c.BaseSeq = m.Base()
			}
			sm := newKV()
			sm.Restore(m.sm.(*kvSM).Snapshot())
			restarted[id] = NewMember(c, sm)
			h.crash(id, true)
		}
		for id, m := range restarted {
			s := m.Status()
			reports[id] = restartReport{lu: s.LU, length: s.Base + s.Log}
			h.members[id], h.all[id] = m, m
		}
		if !reportRestarts(t, h, ids, reports) {
			t.Fatalf("the chain did not restart on the reports %+v", reports)
		}
		from := h.master.Members()[0]
		for _, id := range ids {
			if id != from {
				delete(h.members, id) // they join later: not needed here
			}
		}
		h.collect()
		h.stabilize()
		if s := restarted[from].Status(); s.State != Active {
			t.Fatalf("member %d ordered to restart the chain: %+v", from, s)
		}
		return from, string(restarted[from].sm.Read([]byte("k1")))
	}
	if from, v := run(t, true); from == 1 || v != "1:v6" {
		t.Fatalf("restarted from %d, k1 = %q: want a member of the newer epoch, holding the acknowledged k1=v6", from, v)
	}
	// The host before (no number with the checkpoint): the old head's
	// longer log wins and the acknowledged k1=v6 is lost.
	if from, v := run(t, false); from != 1 || v == "1:v6" {
		t.Fatalf("without the number: restarted from %d, k1 = %q: want the old head (1) and k1=v6 lost (the test shows nothing)", from, v)
	}
}

// TestRestartSetsTheDurablePoint: the member a whole-chain restart carries
// on from holds its history on its disk, and no acknowledgement will come
// to move its durable point (DA) over it: RESTART sets DA to it. Under
// AUSI the host serves strong reads only at DA (vrshard's chainCore.Ready),
// so without it every key of the history would wait for the next write.
func TestRestartSetsTheDurablePoint(t *testing.T) {
	ids := []NodeID{1, 2, 3}
	h := newHarness(ids, 3, 2, 0)
	h.setup(AUSI, func(NodeID) Store { return Log })
	putter(h)(6)
	hist := map[NodeID][]Entry{}
	for _, id := range ids {
		hist[id] = h.members[id].History()
		h.crash(id, true)
	}
	for _, id := range ids {
		c := h.config(id)
		c.Log = hist[id]
		m := NewMember(c, newKV())
		h.members[id], h.all[id] = m, m
		s := m.Status()
		h.master.Restarted(id, s.LU, s.Base+s.Log, false)
	}
	h.collect()
	h.stabilize()
	got := h.master.Members()
	if len(got) != 1 {
		t.Fatalf("restarted chain %v, want one member", got)
	}
	if s := h.members[got[0]].Status(); s.State != Active || s.LU == 0 || s.DA != s.LU {
		t.Fatalf("the restarted member %d: state %v, LU %d, DA %d; want DA at LU", got[0], s.State, s.LU, s.DA)
	}
}

// TestRestartNeverFromAPagedMember: a candidate whose host holds pages of a
// snapshot it had not finished taking (a joiner crashed mid-pages over a
// checkpoint: its state is a prefix of the pages over the checkpoint, no
// history's) reports the newest number and the longest history; the chain
// restarts from a whole candidate all the same (review34a). With every
// candidate paged it stays down until one reports whole (here: restarted
// on an emptied disk). The mutation restartPaged, the rule before, restarts
// from the paged one.
func TestRestartNeverFromAPagedMember(t *testing.T) {
	run := func(t *testing.T, mutated bool, reports map[NodeID]restartReport) (*harness, bool) {
		t.Helper()
		ids := []NodeID{1, 2, 3}
		h := newHarness(ids, 3, 2, 0)
		h.master.mut.restartPaged = mutated
		h.setup(SU, func(NodeID) Store { return Log })
		for _, id := range ids {
			h.crash(id, true)
		}
		return h, reportRestarts(t, h, ids, reports)
	}
	seq := func(e, i uint64) uint64 { return e<<defaultSeqBits | i }
	reports := map[NodeID]restartReport{
		1: {lu: seq(5, 40), length: 40, paged: true},
		2: {lu: seq(3, 20), length: 20},
		3: {lu: seq(3, 22), length: 22},
	}
	for _, mutated := range []bool{false, mutation.On} {
		h, restarted := run(t, mutated, reports)
		ms := h.master.Members()
		want := NodeID(3)
		if mutated {
			want = 1
		}
		if !restarted || len(ms) != 1 || ms[0] != want {
			t.Fatalf("mutated %v: restarted %v, members %v: want the chain restarted from %d", mutated, restarted, ms, want)
		}
	}
	all := map[NodeID]restartReport{1: reports[1], 2: {lu: seq(3, 20), length: 20, paged: true}, 3: {length: 30, paged: true}}
	h, restarted := run(t, false, all)
	if restarted || !h.master.Down() || !h.master.Paged() || len(h.master.Awaited()) != 0 {
		t.Fatalf("every candidate paged: restarted %v, members %v, paged %v, awaited %v: want the chain down, waiting on paged members only",
			restarted, h.master.Members(), h.master.Paged(), h.master.Awaited())
	}
	if !h.master.Restarted(2, 0, 0, false) || h.master.Members()[0] != 2 {
		t.Fatalf("2 back whole (empty): members %v, want the chain restarted from 2", h.master.Members())
	}
}

// TestRestartRefusedByANewProcess: the member a whole-chain restart chose
// crashed after it reported and came back empty (a memory member, review35d's
// SU D-M-D seed 479) before the RESTART reached it. The order carries what
// it reported; the new process holds another history and refuses, and the
// master, down again, restarts from the longest history left once the
// refuser reports what it holds now. Taking the order (restartUnchecked,
// the code before) the empty process carries the chain on from nothing:
// the 6 acknowledged updates are gone.
func TestRestartRefusedByANewProcess(t *testing.T) {
	run := func(unchecked bool) (*harness, NodeID) {
		ids := []NodeID{1, 2, 3}
		h := newHarness(ids, 3, 2, 0)
		h.setup(SU, func(NodeID) Store { return Log })
		putter(h)(6)
		hist := map[NodeID][]Entry{}
		for _, id := range ids {
			hist[id] = h.members[id].History()
			h.crash(id, true)
		}
		restart := func(id NodeID, log []Entry) bool {
			c := h.config(id)
			c.Log = log
			m := NewMember(c, newKV())
			m.mut.restartUnchecked = unchecked
			h.members[id], h.all[id] = m, m
			s := m.Status()
			return h.master.Restarted(id, s.LU, s.Base+s.Log, false)
		}
		restart(1, hist[1][:4])
		restart(2, hist[2][:5])
		if !restart(3, hist[3]) || h.master.Members()[0] != 3 {
			t.Fatalf("members %v: want the chain restarted from 3, the longest", h.master.Members())
		}
		// 3 crashes before the RESTART reaches it and comes back empty.
		h.crash(3, false)
		restart(3, nil)
		h.collect()
		h.stabilize()
		if h.master.Down() {
			// Refused: 3 reports what it holds now, and the chain restarts
			// from 2's 5 entries.
			if !restart(3, nil) {
				t.Fatal("the chain did not restart again once the refuser reported")
			}
			h.collect()
			h.stabilize()
		}
		ms := h.master.Members()
		if len(ms) != 1 {
			t.Fatalf("members %v: want a chain of one", ms)
		}
		return h, ms[0]
	}
	h, got := run(false)
	if s := h.members[got].Status(); got != 2 || s.State != Active || s.Base+s.Log != 5 {
		t.Fatalf("restarted from %d (%v, %d entries): want 2, active with its 5 entries", got, s.State, s.Base+s.Log)
	}
	if !mutation.On {
		return
	}
	h, got = run(true)
	if s := h.members[got].Status(); got != 3 || s.State != Active || s.Base+s.Log != 0 {
		t.Fatalf("restartUnchecked: restarted from %d (%v, %d entries): want the empty 3 (the bug)", got, s.State, s.Base+s.Log)
	}
}

// TestPrecopyReplacesADivergedHistory: a joiner whose history holds updates
// the chain never committed — an old head's, logged and never passed on,
// taken as its committed prefix (the host simulation's AUSI D-D-M seed 548:
// a member alone acknowledged updates a restarted master never learnt of) —
// asks its source for the updates after its last, which the source does
// not hold. Continuing after it, or "done" with nothing more, would join it
// with a history that is not the chain's; the source answers with a
// snapshot, which replaces the joiner's history.
func TestPrecopyReplacesADivergedHistory(t *testing.T) {
	ids := []NodeID{1, 2, 3}
	h := newHarness(ids, 3, 2, 0)
	h.setup(SU, func(NodeID) Store { return Log })
	put := putter(h)
	put(4)
	for id := uint64(101); id <= 103; id++ {
		h.master.Put(id, fmt.Appendf(nil, "k%d=old%d", id%5, id))
		h.master.Forget(id)
	}
	h.collect()
	for _, l := range []link{{masterID, 1}, {1, 1}} {
		for len(h.queues[l]) > 0 {
			h.deliver(l)
		}
	}
	oldHead := slices.Clone(h.members[1].History())
	if len(oldHead) != 7 {
		t.Fatalf("the old head holds %d entries, want 7", len(oldHead))
	}
	h.crash(1, true)
	h.stabilize()
	put(1) // the repaired chain's, numbered in a newer epoch
	c := h.config(1)
	c.Log = oldHead
	m := NewMember(c, newKV())
	h.members[1], h.all[1] = m, m
	if err := h.master.Join(1, 2); err != nil {
		t.Fatal(err)
	}
	h.collect()
	h.stabilize()
	put(2)
	if h.err != nil {
		t.Fatal(h.err)
	}
	if ms := h.master.Members(); len(ms) != 3 {
		t.Fatalf("members %v: want the old head joined", ms)
	}
	want := h.members[2].History()
	got := m.History()
	if s := m.Status(); s.Base+s.Log != len(want) || got[len(got)-1].Seq != want[len(want)-1].Seq || string(m.sm.Read([]byte("k1"))) != string(h.members[2].sm.Read([]byte("k1"))) {
		t.Fatalf("the joiner holds %d entries ending %s, k1 = %q; the chain %d ending %s, k1 = %q",
			s.Base+s.Log, FormatSeq(got[len(got)-1].Seq), m.sm.Read([]byte("k1")),
			len(want), FormatSeq(want[len(want)-1].Seq), h.members[2].sm.Read([]byte("k1")))
	}
}

// TestRestartStaleRefusal: the member a whole-chain restart chose (3, 6
// entries) crashed after it reported and came back with 5; the RESTART went
// twice (a re-send) and was refused twice. The first refusal puts the chain
// down, 3 reports its 5 — still the longest — and is chosen again, at a
// newer epoch; the second refusal, of the first order, arrives before the
// new order is taken. It must not refuse the new one: before review36a the
// master went down again while 3 took the new order and became the chain,
// and waited for a report of 3's that never came (an active member sends
// none).
func TestRestartStaleRefusal(t *testing.T) {
	ids := []NodeID{1, 2, 3}
	h := newHarness(ids, 3, 2, 0)
	h.master.SetResend(2)
	h.setup(SU, func(NodeID) Store { return Log })
	putter(h)(6)
	hist := map[NodeID][]Entry{}
	for _, id := range ids {
		hist[id] = h.members[id].History()
		h.crash(id, true)
	}
	restart := func(id NodeID, log []Entry) bool {
		c := h.config(id)
		c.Log = log
		m := NewMember(c, newKV())
		h.members[id], h.all[id] = m, m
		s := m.Status()
		return h.master.Restarted(id, s.LU, s.Base+s.Log, false)
	}
	restart(1, hist[1][:4])
	restart(2, hist[2][:4])
	if !restart(3, hist[3]) || h.master.Members()[0] != 3 {
		t.Fatalf("members %v: want the chain restarted from 3", h.master.Members())
	}
	h.crash(3, false)
	restart(3, hist[3][:5])
	h.collect()
	h.mtick(3) // the RESTART again
	to3, from3 := link{masterID, 3}, link{3, masterID}
	for len(h.queues[to3]) > 0 {
		h.deliver(to3)
	}
	if n := len(h.queues[from3]); n != 2 {
		t.Fatalf("%d answers from 3, want its 2 refusals: %v", n, h.queues[from3])
	}
	h.deliver(from3)
	if !h.master.Down() {
		t.Fatal("the chain is not down after the refusal")
	}
	if !restart(3, hist[3][:5]) {
		t.Fatal("the chain did not restart again once 3 reported")
	}
	h.collect()
	h.stabilize() // the stale refusal first, then the new order
	if s := h.members[3].Status(); h.master.Down() || s.State != Active || !slices.Equal(h.master.Members(), []NodeID{3}) {
		t.Fatalf("master down %v, members %v; 3 %v at epoch %d: want the chain of 3, up", h.master.Down(), h.master.Members(), s.State, s.Epoch)
	}
	if h.err != nil {
		t.Fatal(h.err)
	}
}

// divergedOldHead builds TestPrecopyReplacesADivergedHistory's chain on h:
// 4 committed updates, 3 more its head 1 logged and never passed on; 1
// crashes, and the repaired chain of 2 and 3 takes `after` updates,
// numbered in a newer epoch. It returns the old head's history, which a
// new member 1 restarts holding.
func divergedOldHead(t *testing.T, h *harness, after int) []Entry {
	t.Helper()
	put := putter(h)
	put(4)
	for id := uint64(101); id <= 103; id++ {
		h.master.Put(id, fmt.Appendf(nil, "k%d=old%d", id%5, id))
		h.master.Forget(id)
	}
	h.collect()
	for _, l := range []link{{masterID, 1}, {1, 1}} {
		for len(h.queues[l]) > 0 {
			h.deliver(l)
		}
	}
	oldHead := slices.Clone(h.members[1].History())
	if len(oldHead) != 7 {
		t.Fatalf("the old head holds %d entries, want 7", len(oldHead))
	}
	h.crash(1, true)
	h.stabilize()
	put(after)
	return oldHead
}

// joinDiverged joins m (1, restarted holding a diverged history) at
// position 2, lets the join and two more updates run (with ticks: a paged
// pre-copy's requests are paced), and checks that m ends up holding the
// chain's history and state.
func joinDiverged(t *testing.T, h *harness, m *Member) {
	t.Helper()
	h.members[1], h.all[1] = m, m
	if err := h.master.Join(1, 2); err != nil {
		t.Fatal(err)
	}
	h.collect()
	for range 20 {
		h.stabilize()
		h.tick(1)
	}
	putter(h)(2)
	if h.err != nil {
		t.Fatal(h.err)
	}
	if ms := h.master.Members(); len(ms) != 3 {
		t.Fatalf("members %v: want the old head joined", ms)
	}
	want := h.members[2].History()
	s := m.Status()
	if s.Base+s.Log != len(want) || m.lastSeq() != want[len(want)-1].Seq || s.Paged ||
		string(m.sm.Read([]byte("k1"))) != string(h.members[2].sm.Read([]byte("k1"))) {
		t.Fatalf("the joiner (%v, paged %v) holds %d entries ending %s, k1 = %q; the chain %d ending %s, k1 = %q",
			s.State, s.Paged, s.Base+s.Log, FormatSeq(m.lastSeq()), m.sm.Read([]byte("k1")),
			len(want), FormatSeq(want[len(want)-1].Seq), h.members[2].sm.Read([]byte("k1")))
	}
}

// TestPrecopyReplacesADivergedCompactedHistory: the diverged joiner's host
// compacted its whole history (a checkpoint at its end, no entry after it),
// and the chain holds as many entries as it does, ending in another
// update. install compared a log entry at the snapshot's length, which a
// history compacted to its end does not have: the joiner kept its history
// and joined with it — the invariant check: its history is not a prefix of
// its predecessor's (review36a).
func TestPrecopyReplacesADivergedCompactedHistory(t *testing.T) {
	h := newHarness([]NodeID{1, 2, 3}, 3, 2, 0)
	h.setup(SU, func(NodeID) Store { return Log })
	oldHead := divergedOldHead(t, h, 3) // 4 + 3: as long as the old head's
	c := h.config(1)
	c.BaseN, c.BaseSeq = len(oldHead), oldHead[len(oldHead)-1].Seq
	sm := newKV()
	for _, e := range oldHead {
		sm.Apply(e.Seq, e.Op)
	}
	joinDiverged(t, h, NewMember(c, sm))
}

// TestPrecopyReplacesADivergedHistoryInPages: as
// TestPrecopyReplacesADivergedHistory, the source's host sending its
// snapshot in pages (a replica host's state machine, no Snapshotter). The
// pages are the joiner's host's state from the first one on; the last
// page's LU is the number the source pinned for the snapshot, not the
// joiner's request, so the joiner did not count the answer as current and
// kept its longer history over the pages' state (review36a): its host never
// restored them, the flush was refused, and every join after ended the
// same way. The whole snapshot from the host (pageLines 0) was replaced
// already.
func TestPrecopyReplacesADivergedHistoryInPages(t *testing.T) {
	for _, lines := range []int{0, 1} {
		t.Run(fmt.Sprintf("pageLines=%d", lines), func(t *testing.T) {
			h := newHarness([]NodeID{1, 2, 3}, 3, 2, 0)
			h.hostSnaps, h.pageLines = true, lines
			h.setup(SU, func(NodeID) Store { return Log })
			oldHead := divergedOldHead(t, h, 1)
			c := h.config(1)
			c.Log = oldHead
			sm := h.newSM()
			for _, e := range oldHead {
				sm.Apply(e.Seq, e.Op) // its host's state, restarted
			}
			joinDiverged(t, h, NewMember(c, sm))
		})
	}
}
