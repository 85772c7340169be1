package chain

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Lost and repeated orders. The host's links may drop a message; the master
// re-sends an unanswered order every resendTicks of its ticks (Master.Tick)
// and members answer a repeat again without redoing it. Each case below
// starts a reconfiguration on the test harness, loses one message of it (or
// delivers one twice), and requires the reconfiguration to finish — after
// re-sends where something was lost — with the chain whole: R members, all
// active, every history the same, the invariants held after every event,
// and a write and a read after it answered.

const resendTicks = 3

type resendCase struct {
	name string
	// start begins the reconfiguration on a chain of 1, 2, 3 (R = 3)
	// holding k0..k2 (head first).
	start func(h *harness)
	// hit picks the message lost (or doubled): the first that matches.
	hit func(m Msg) bool
}

func typ(t MsgType) func(Msg) bool { return func(m Msg) bool { return m.Type == t } }

func typFrom(t MsgType, from NodeID) func(Msg) bool {
	return func(m Msg) bool { return m.Type == t && m.From == from }
}

func joinAt(pos int) func(h *harness) {
	return func(h *harness) {
		if err := h.addJoiner(4, pos); err != nil {
			panic(err)
		}
	}
}

func failOf(id NodeID) func(h *harness) {
	return func(h *harness) { h.crash(id, true); h.collect() }
}

var resendCases = []resendCase{
	// A mid join: 4 before 2, then the extra tail 3 truncated.
	{"precopy", joinAt(1), typ(MsgPrecopy)},
	{"precopy-req", joinAt(1), typ(MsgPrecopyReq)},
	{"precopy-chunk", joinAt(1), typ(MsgPrecopyChunk)},
	{"precopy-done", joinAt(1), typ(MsgPrecopyDone)},
	{"flush", joinAt(1), typFrom(MsgFlush, masterID)},
	{"flush on its way round", joinAt(1), typFrom(MsgFlush, 2)},
	{"flush back at the joiner", joinAt(1), typFrom(MsgFlush, 3)},
	{"flush-ack", joinAt(1), typ(MsgFlushAck)},
	{"truncate", joinAt(1), typ(MsgTruncate)},
	{"truncate on to the old tail", joinAt(1), typFrom(MsgTruncate, 2)},
	{"truncate-done", joinAt(1), typ(MsgTruncateDone)},
	{"truncate-ack", joinAt(1), typ(MsgTruncateAck)},
	// A head join and a tail join (4 before 3, 3 truncated).
	{"head join: flush", joinAt(0), typFrom(MsgFlush, masterID)},
	{"head join: flush-ack", joinAt(0), typ(MsgFlushAck)},
	{"tail join: truncate-ack", joinAt(3), typ(MsgTruncateAck)},
	// Repairs.
	{"cr-head", failOf(1), typ(MsgCRHead)},
	{"cr-head-done", failOf(1), typ(MsgCRHeadDone)},
	{"cr-mid", failOf(2), typ(MsgCRMid)},
	{"cr-mid-repair", failOf(2), typ(MsgCRMidRepair)},
	{"repair-info", failOf(2), typ(MsgRepairInfo)},
	{"cr-mid-done", failOf(2), typ(MsgCRMidDone)},
	{"cr-tail", failOf(3), typ(MsgCRTail)},
	{"cr-tail-done", failOf(3), typ(MsgCRTailDone)},
}

// resendHarness is a chain of 1, 2, 3 with k0..k2 written, the master
// re-sending every resendTicks ticks, and a spare node 5 for a join after a
// repair.
func resendHarness(t *testing.T) *harness { return resendHarnessWith(t, nil) }

// resendHarnessWith is resendHarness with setup run on it before the
// writes (a mode, datastores: harness.setup).
func resendHarnessWith(t *testing.T, setup func(h *harness)) *harness {
	h := newHarness([]NodeID{1, 2, 3}, 3, 2, 0) // chunks of 2: pre-copy takes rounds
	h.master.SetResend(resendTicks)
	if setup != nil {
		setup(h)
	}
	var b strings.Builder
	h.log = func(s string) { b.WriteString(s + "\n") }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("trace:\n%s", b.String())
		}
	})
	for i := range 3 {
		h.master.Put(uint64(i+1), fmt.Appendf(nil, "k%d=v%d", i, i))
		h.collect()
	}
	h.stabilize()
	return h
}

// stabilizeHitting is stabilize where the first message hit matches is
// lost (lose) or delivered twice; it reports whether one matched. A client
// writes whenever an order or its answer is about to be delivered, so that
// updates are in flight at every step of the reconfiguration (a joiner
// merged without the old tail's log flush, say, misses some).
func stabilizeHitting(h *harness, hit func(Msg) bool, lose bool) bool {
	done := false
	for {
		ls := h.links()
		if len(ls) == 0 {
			return done
		}
		for _, l := range ls {
			if len(h.queues[l]) == 0 {
				continue
			}
			if ordersAndAnswers[h.queues[l][0].Type] {
				h.writes++
				id := 1000 + h.writes
				h.master.Put(id, fmt.Appendf(nil, "w%d=%d", id%3, id))
				h.collect()
			}
			switch {
			case !done && hit(h.queues[l][0]) && lose:
				done = true
				h.drop(l)
			case !done && hit(h.queues[l][0]):
				done = true
				h.dup(l)
			default:
				h.deliver(l)
			}
		}
	}
}

// runHitting starts case c on h (a resendHarness) and runs it until
// quiet, losing (lose) or doubling the message c hits.
func runHitting(t *testing.T, h *harness, c resendCase, lose bool) *harness {
	t.Helper()
	c.start(h)
	if !stabilizeHitting(h, c.hit, lose) {
		t.Fatalf("no %s to hit", c.name)
	}
	return h
}

// settle ticks the master and delivers until it is idle, for at most
// rounds re-send intervals; it reports how many intervals it took.
func settle(h *harness, rounds int) int {
	for i := 0; i < rounds; i++ {
		if !h.master.Busy() && len(h.links()) == 0 {
			return i
		}
		h.mtick(resendTicks + 1)
		h.stabilize()
	}
	return rounds
}

// checkWhole requires the chain whole after the reconfiguration: R members,
// active, one history; then a write is answered and a read at the tail
// sees it.
func checkWhole(t *testing.T, h *harness, r int) {
	t.Helper()
	if h.err != nil {
		t.Fatalf("invariant: %v", h.err)
	}
	if h.master.Busy() {
		t.Fatalf("the master is still busy: members %v joiner %d truncating %d", h.master.Members(), h.master.Joiner(), h.master.Truncating())
	}
	ms := h.master.Members()
	if len(ms) != r {
		t.Fatalf("members %v, want %d", ms, r)
	}
	var lu uint64
	for i, id := range ms {
		m := h.members[id]
		if m == nil {
			t.Fatalf("member %d is down", id)
		}
		s := m.Status()
		if i == 0 {
			lu = s.LU
		}
		if s.State != Active || s.LU != lu || s.LA != s.LU {
			t.Fatalf("member %d: %s lu=%s la=%s, head's lu=%s", id, s.State, FormatSeq(s.LU), FormatSeq(s.LA), FormatSeq(lu))
		}
	}
	for id := uint64(1001); id <= 1000+h.writes; id++ {
		if !slices.ContainsFunc(h.replies, func(r Reply) bool { return r.ID == id }) {
			t.Fatalf("write %d during the reconfiguration not answered", id)
		}
	}
	h.writes = 0
	h.replies = nil
	h.master.Put(100, []byte("k0=after"))
	h.collect()
	h.stabilize()
	h.master.Get(101, []byte("k0"))
	h.collect()
	h.stabilize()
	got := map[uint64]string{}
	for _, r := range h.replies {
		got[r.ID] = string(r.Result)
	}
	if got[100] != "OK" || got[101] != "1:after" {
		t.Fatalf("after the reconfiguration: replies %v, want 100 OK and 101 1:after", got)
	}
	if h.err != nil {
		t.Fatalf("invariant: %v", h.err)
	}
}

// TestResendAfterLoss: each message of a join, a truncation and each
// repair lost once. Without the master's re-send the master stays busy for
// ever (checked: the loss mattered); with it the reconfiguration finishes
// within a few re-send intervals, and then a join of a fresh node works too.
func TestResendAfterLoss(t *testing.T) {
	for _, c := range resendCases {
		t.Run(c.name, func(t *testing.T) {
			h := runHitting(t, resendHarness(t), c, true)
			if !h.master.Busy() {
				t.Fatalf("the master is idle after the loss: the case tests nothing")
			}
			if n := settle(h, 4); n == 4 {
				t.Fatalf("not finished after 4 re-send intervals")
			}
			r := 3
			if len(h.master.Members()) < 3 {
				// A repair: R is back with a join.
				r = 2
				checkWhole(t, h, r)
				if err := h.addJoiner(5, 1); err != nil {
					t.Fatal(err)
				}
				h.stabilize()
				r = 3
			}
			checkWhole(t, h, r)
		})
	}
}

// TestRepeatedOrders: each order and each answer delivered twice (the copy
// later on the same link, as after a re-send whose original was not lost
// but slow), and separately every order re-sent before the first copy is
// delivered: the members take the repeat as a no-op and answer it again,
// and the chain ends whole, as without the repeat.
func TestRepeatedOrders(t *testing.T) {
	for _, c := range resendCases {
		t.Run(c.name, func(t *testing.T) {
			h := runHitting(t, resendHarness(t), c, false)
			settle(h, 1) // nothing lost: at most a stray re-send
			r := min(3, len(h.master.Members()))
			checkWhole(t, h, r)
		})
	}
	t.Run("every order re-sent at once", func(t *testing.T) {
		for _, c := range resendCases {
			h := resendHarness(t)
			c.start(h)
			doubled(t, h)
			if len(h.master.Members()) < 3 {
				if err := h.addJoiner(5, 1); err != nil {
					t.Fatal(err)
				}
				doubled(t, h)
			}
			checkWhole(t, h, 3)
		}
	})
}

// doubled runs the reconfiguration under way with every outstanding order
// re-sent before each round of deliveries (one message a link): each order
// arrives twice or more, the copies sent before the first was delivered (a
// slow link, not a lost message).
func doubled(t *testing.T, h *harness) {
	t.Helper()
	for i := 0; h.master.Busy() || len(h.links()) > 0; i++ {
		if i == 500 {
			t.Fatalf("not finished after 500 rounds")
		}
		h.mtick(resendTicks + 1)
		for _, l := range h.links() {
			h.deliver(l)
		}
	}
}

// TestResendMutationCaught: with the re-send switched off (noResend), a
// lost FLUSH, CR_MID or TRUNCATE_ACK leaves the master busy for ever — the
// old behaviour — and TestResendAfterLoss's check says so.
func TestResendMutationCaught(t *testing.T) {
	mutation.Require(t)
	for _, name := range []string{"flush", "cr-mid", "truncate-ack"} {
		t.Run(name, func(t *testing.T) {
			c := resendCases[slices.IndexFunc(resendCases, func(c resendCase) bool { return c.name == name })]
			h := resendHarness(t)
			h.master.mut.noResend = true
			runHitting(t, h, c, true)
			if n := settle(h, 4); n < 4 || !h.master.Busy() {
				t.Fatalf("noResend went unnoticed: the master finished after a lost %s", name)
			}
		})
	}
}

// stabilizeExcept delivers everything but what is queued on the links skip
// names, until nothing else is left.
func stabilizeExcept(h *harness, skip func(link) bool) {
	for {
		moved := false
		for _, l := range h.links() {
			if !skip(l) && len(h.queues[l]) > 0 {
				h.deliver(l)
				moved = true
			}
		}
		if !moved {
			return
		}
	}
}

// deliverOne delivers the first message on the link from → to.
func deliverOne(t *testing.T, h *harness, from, to NodeID, typ MsgType) {
	t.Helper()
	l := link{from, to}
	if q := h.queues[l]; len(q) == 0 || q[0].Type != typ {
		t.Fatalf("want %s first on %d->%d, queued %v", typ, from, to, q)
	}
	h.deliver(l)
}

// TestRepeatedOrderKeepsQueues: a repeated repair order that arrives after
// the answer to its first copy let a join start must not drop the updates
// the joiner relayed, queued at its successor-to-be until FLUSH makes the
// joiner its predecessor. On the old code every CR_HEAD and every
// CR_MID_REPAIR emptied the member's queues, and the relayed update was lost
// at the joiner's successor: the chain ends with the joiner holding an
// update its successor lacks.
func TestRepeatedOrderKeepsQueues(t *testing.T) {
	t.Run("cr-mid-repair", func(t *testing.T) {
		h := resendHarness(t)
		h.crash(2, true) // CR_MID to 1, towards 3
		h.collect()
		deliverOne(t, h, masterID, 1, MsgCRMid)
		h.mtick(resendTicks + 1) // the CR_MID again: 1, still repairing, asks 3 again
		deliverOne(t, h, masterID, 1, MsgCRMid)
		deliverOne(t, h, 1, 3, MsgCRMidRepair)
		deliverOne(t, h, 3, 1, MsgRepairInfo)
		deliverOne(t, h, 1, masterID, MsgCRMidDone)
		if h.master.Busy() {
			t.Fatalf("busy after cr-mid-done")
		}
		// The repeated CR_MID_REPAIR stays on 1 → 3 while 4 joins between 1
		// and 3 and relays a write to 3 on its own link; FLUSH follows the
		// repeat on 1 → 3.
		onHold := func(l link) bool { return l == link{1, 3} }
		if err := h.addJoiner(4, 1); err != nil {
			t.Fatal(err)
		}
		stabilizeExcept(h, onHold)
		h.master.Put(50, []byte("k1=relayed"))
		h.collect()
		stabilizeExcept(h, onHold)
		if s := h.members[3].Status(); s.Pred != 1 {
			t.Fatalf("3's predecessor %d before FLUSH reached it, want 1", s.Pred)
		}
		h.stabilize()
		settle(h, 2)
		checkWhole(t, h, 3)
	})
	t.Run("cr-head", func(t *testing.T) {
		// 2, the head after the repair, logs to disk under SU: it passes an
		// update on only once its host persisted it, and a FLUSH waits
		// behind the updates it holds.
		h := resendHarnessWith(t, func(h *harness) {
			h.setup(SU, func(id NodeID) Store {
				if id == 2 {
					return Log
				}
				return Memory
			})
		})
		h.crash(1, true) // CR_HEAD to 2
		h.collect()
		h.master.Put(49, []byte("k0=held")) // behind the CR_HEAD
		h.collect()
		h.mtick(resendTicks + 1) // the CR_HEAD again, behind both
		deliverOne(t, h, masterID, 2, MsgCRHead)
		deliverOne(t, h, masterID, 2, MsgUpdate)
		deliverOne(t, h, 2, masterID, MsgCRHeadDone)
		if h.master.Busy() {
			t.Fatalf("busy after cr-head-done")
		}
		// 2's disk stalls (2 → 2 is its host's persist) with write 49
		// held, and the repeated CR_HEAD waits on master → 2, while 4 joins
		// as head: 2 defers FLUSH behind the held write, and 4's relayed
		// write waits in 2's queue for it.
		onHold := func(l link) bool {
			return l == link{2, 2} || l == link{masterID, 2} && h.queues[l][0].Type == MsgCRHead
		}
		stabilizeExcept(h, onHold)
		if err := h.addJoiner(4, 0); err != nil {
			t.Fatal(err)
		}
		stabilizeExcept(h, onHold)
		if h.master.Head() != 4 {
			t.Fatalf("the head join has not started: head %d", h.master.Head())
		}
		h.master.Put(50, []byte("k1=relayed"))
		h.collect()
		stabilizeExcept(h, onHold)
		if s := h.members[2].Status(); s.Pred != 0 || s.Epoch != 1 {
			t.Fatalf("2 took FLUSH before the repeated CR_HEAD: %+v", s)
		}
		deliverOne(t, h, masterID, 2, MsgCRHead) // the repeat, at 2's epoch
		h.stabilize()
		settle(h, 2)
		checkWhole(t, h, 3)
	})
}

// TestRestartedJoinerRefusesFlush: the joiner of a mid join (4, between 1
// and 2) crashes during its flush, after 1 relinked to it, with 1's update
// to it in flight, and restarts (same id, an inactive joiner) before the
// master hears of it; writes follow. The new incarnation gets either the old one's FLUSH
// coming back from the old tail, or only the master's repeat of FLUSH (what
// the old tail sent died with the old incarnation). On the old code it took
// either as its first FLUSH and merged without the lost update: its history
// was not a prefix of 1's (history containment broken), and 1, acknowledged
// past it, took it for committed. It must refuse (it never pre-copied):
// the master aborts the join, repairs around it, and joins it afresh.
func TestRestartedJoinerRefusesFlush(t *testing.T) {
	for _, c := range []struct {
		name string
		// hold: where FLUSH waits while 4 crashes and restarts.
		hold link
	}{
		{"flush coming back", link{2, 3}},
		{"master's repeat", link{3, 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := resendHarness(t)
			if err := h.addJoiner(4, 1); err != nil { // 1 4 2 3
				t.Fatal(err)
			}
			stabilizeExcept(h, func(l link) bool {
				return l == c.hold && h.queues[l][0].Type == MsgFlush
			})
			if s := h.members[1].Status(); s.Succ != 4 {
				t.Fatalf("1's successor %d, want 4: FLUSH has not relinked it", s.Succ)
			}
			h.master.Put(60, []byte("k1=lost"))
			h.collect()
			deliverOne(t, h, masterID, 1, MsgUpdate) // 1 sends it on to 4
			h.crash(4, false)                        // with it in flight
			m := NewMember(h.config(4), h.newSM())   // restarted: a joiner
			h.members[4], h.all[4] = m, m
			h.master.Put(61, []byte("k2=after")) // behind the lost one
			h.collect()
			h.stabilize()
			settle(h, 2)
			h.master.Put(62, []byte("k0=later"))
			h.collect()
			h.stabilize()
			if h.err != nil {
				t.Fatalf("invariant: %v", h.err)
			}
			if s := h.members[4].Status(); s.State != Inactive {
				t.Fatalf("the restarted joiner took FLUSH: %+v", s)
			}
			checkWhole(t, h, 3)
			if err := h.master.Join(4, 1); err != nil { // afresh
				t.Fatal(err)
			}
			h.collect()
			h.stabilize()
			settle(h, 2)
			checkWhole(t, h, 3)
		})
	}
}
