package chain

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
)

// The loss table (digest 002 Table 6.2, §6.3 A10): what a crash loses of
// the acknowledged updates, per chain configuration (the head's and the
// tail's datastore), update mode and crash. docs/design/chain.md has the
// same table and why each cell is what it is.

// lossClass is what a crash can lose of the acknowledged updates.
type lossClass string

const (
	lossNone   lossClass = "none"   // nothing acknowledged, in every run
	lossWindow lossClass = "window" // a recent window, in some runs, never all of it in every run
	lossTotal  lossClass = "total"  // everything acknowledged, in every run
)

// crashKind: powerCut stops every member at once (their memory is gone,
// what their hosts persisted stays); headCrash stops the head alone and the
// chain repairs and carries on.
type crashKind string

const (
	powerCut  crashKind = "power cut"
	headCrash crashKind = "head crash"
)

// lossConfigs are the chains of Table 6.2, head first: M (memory), Mb
// (buffered log: written in batches in the background), D (log, persisted as
// it is logged); and D-Mb, a log head in front of a buffered tail (under SU
// the head's disk is waited for: it passes an update on only once persisted).
var lossConfigs = [][2]Store{{Memory, Memory}, {Memory, Buffered}, {Memory, Log}, {Log, Log}, {Log, Buffered}}

func configName(c [2]Store) string { return c[0].String() + "-" + c[1].String() }

// expectedLoss is the table.
func expectedLoss(c [2]Store, mode Mode, crash crashKind) lossClass {
	if crash == headCrash {
		// The survivors keep their memory. Under SU the tail, under AUSI
		// every member, held an update before it was acknowledged; under AU
		// the head alone did.
		if mode == AU {
			return lossWindow
		}
		return lossNone
	}
	switch {
	case c == [2]Store{Memory, Memory}:
		return lossTotal
	case mode == SU && (c[0] == Log || c[1] == Log):
		// A log member passes an update on, and the tail answers it, only
		// once its host persisted it: every log member's disk has every
		// acknowledged update.
		return lossNone
	}
	return lossWindow
}

// lossRun runs one seed: two clients' worth of updates (up to 4 in flight)
// through a chain of two, a crash at a random moment, and returns how many
// acknowledged updates there were and how many of them the crash lost, or
// the first invariant violation the harness's check found (Check, unless
// noCheck): a run that broke an invariant says nothing about loss, whatever
// it counted.
func lossRun(seed uint64, c [2]Store, mode Mode, crash crashKind, mut mutations, noCheck, durable bool) (acked, lost int, err error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	h := newHarness([]NodeID{1, 2}, 2, 64, 0)
	h.noCheck = noCheck
	h.setup(mode, func(id NodeID) Store { return c[id-1] })
	for _, m := range h.members {
		m.mut = mut
	}
	var next uint64
	inflight := map[uint64]bool{}
	ack := map[uint64]bool{}
	crashAt := 20 + rng.IntN(200)
	for step := 0; step < crashAt; step++ {
		for _, r := range h.replies {
			ack[r.ID] = true
			delete(inflight, r.ID)
		}
		h.replies = h.replies[:0]
		ls := h.links()
		if len(inflight) < 4 && next < 60 && rng.IntN(3) == 0 || len(ls) == 0 {
			next++
			inflight[next] = true
			h.master.Put(next, []byte(fmt.Sprintf("k%d=v%d", next%3, next)))
			h.collect()
			continue
		}
		l := ls[rng.IntN(len(ls))]
		if l.from == l.to && rng.IntN(4) != 0 {
			// A disk write (persist) is slower than a network hop: it
			// completes a quarter of the times it is drawn.
			continue
		}
		h.deliver(l)
	}
	for _, r := range h.replies {
		ack[r.ID] = true
	}
	h.replies = nil
	if durable {
		// What a host answers at the head's durable point (a write asking
		// for durability): the head's updates up to its DA.
		clear(ack)
		hd := h.members[h.master.Head()]
		for _, e := range hd.log {
			if e.Seq <= hd.da {
				ack[e.ID] = true
			}
		}
	}
	var kept []uint64
	switch crash {
	case powerCut:
		// Every member stops; each restarts from what its host persisted.
		// The chain restarts from the longest such history (histories are
		// prefixes of one another).
		for _, id := range h.ids() {
			if d := h.members[id].Durable(); len(d) > len(kept) {
				kept = d
			}
		}
	case headCrash:
		head := h.master.Head()
		h.crash(head, true)
		h.collect()
		h.stabilize()
		for _, r := range h.replies {
			ack[r.ID] = true
		}
		for _, e := range h.members[h.master.Tail()].log {
			kept = append(kept, e.ID)
		}
	}
	if h.err != nil {
		return 0, 0, fmt.Errorf("seed %d: invariant violated: %w", seed, h.err)
	}
	for id := range ack {
		if !slices.Contains(kept, id) {
			lost++
		}
	}
	return len(ack), lost, nil
}

// observedLoss classifies the loss over seeds, or fails with the first
// run's invariant violation.
func observedLoss(c [2]Store, mode Mode, crash crashKind, seeds int, mut mutations, noCheck, durable bool) (lossClass, string, error) {
	var some, total, runs, ackedSum, lostSum int
	for seed := 1; seed <= seeds; seed++ {
		acked, lost, err := lossRun(uint64(seed), c, mode, crash, mut, noCheck, durable)
		if err != nil {
			return "", "", fmt.Errorf("%s, %s, %s: %w", crash, configName(c), mode, err)
		}
		if acked == 0 {
			continue
		}
		runs++
		ackedSum += acked
		lostSum += lost
		if lost > 0 {
			some++
		}
		if lost == acked {
			total++
		}
	}
	detail := fmt.Sprintf("%d runs, %d lost some, %d lost all; %d of %d acknowledged updates lost", runs, some, total, lostSum, ackedSum)
	switch {
	case some == 0:
		return lossNone, detail, nil
	case total == runs:
		return lossTotal, detail, nil
	}
	return lossWindow, detail, nil
}

// TestLossTable asserts the observed loss of every configuration, mode and
// crash against the table.
func TestLossTable(t *testing.T) {
	var table strings.Builder
	for _, crash := range []crashKind{powerCut, headCrash} {
		for _, c := range lossConfigs {
			fmt.Fprintf(&table, "%-10s %-5s", crash, configName(c))
			for _, mode := range []Mode{SU, AUSI, AU} {
				got, detail, err := observedLoss(c, mode, crash, 60, mutations{}, false, false)
				if err != nil {
					t.Fatal(err)
				}
				want := expectedLoss(c, mode, crash)
				fmt.Fprintf(&table, " %s=%-6s", mode, got)
				if got != want {
					t.Errorf("%s, %s, %s: lost %s, the table says %s (%s)", crash, configName(c), mode, got, want, detail)
				}
			}
			table.WriteString("\n")
		}
	}
	t.Logf("observed loss:\n%s", table.String())
}

// TestLossTableMutation: a log member that acknowledges before its host
// persisted the update breaks the tail's invariant (Check: a log tail under
// SU acknowledges only what it persisted), and the loss table fails on it;
// with the invariant check off, D-D under SU loses acknowledged updates on a
// power cut, which the table says it never does.
func TestLossTableMutation(t *testing.T) {
	mutation.Require(t)
	c := [2]Store{Log, Log}
	mut := mutations{ackUnpersisted: true}
	if _, detail, err := observedLoss(c, SU, powerCut, 60, mut, false, false); err == nil || !strings.Contains(err.Error(), "not a valid tail") {
		t.Fatalf("ackUnpersisted: the loss runs found no broken invariant (%v; %s)", err, detail)
	}
	got, detail, err := observedLoss(c, SU, powerCut, 60, mut, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if got == lossNone {
		t.Fatalf("ackUnpersisted not caught: D-D SU lost nothing on a power cut (%s)", detail)
	}
}

// TestDurablePointLosesNothing: the durable point (DA) at the head, where a
// host answers a write that asks for durability under AUSI and AU (Kefir's
// `sync`), covers only updates every log member persisted: a power cut of
// every member loses none of them, in each configuration with a log member
// — SU's row of the loss table, per request. With durableUnpersisted (a log
// member's DA ignores its disk) some are lost.
func TestDurablePointLosesNothing(t *testing.T) {
	var acked int
	for _, c := range [][2]Store{{Memory, Log}, {Log, Log}, {Log, Buffered}, {Log, Memory}} {
		for _, mode := range []Mode{SU, AUSI, AU} {
			got, detail, err := observedLoss(c, mode, powerCut, 60, mutations{}, false, true)
			if err != nil {
				t.Fatal(err)
			}
			if got != lossNone {
				t.Errorf("%s, %s: a power cut lost updates below the head's durable point: %s (%s)", configName(c), mode, got, detail)
			}
			var n int
			fmt.Sscanf(detail[strings.LastIndex(detail, " of ")+4:], "%d", &n)
			acked += n
		}
	}
	if acked == 0 {
		t.Fatal("no update reached the head's durable point: the test checks nothing")
	}
	t.Logf("%d updates below the head's durable point, none lost", acked)
	if !mutation.On {
		return
	}
	got, detail, err := observedLoss([2]Store{Log, Log}, AUSI, powerCut, 60, mutations{durableUnpersisted: true}, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if got == lossNone {
		t.Fatalf("durableUnpersisted not caught: D-D under AUSI lost nothing below the durable point (%s)", detail)
	}
	t.Logf("durableUnpersisted: D-D AUSI lost %s (%s): caught", got, detail)
}

// ParseMode reads the flags' spelling; Wire and ModeFromWire round-trip
// every mode and reject 0 (not said) and values no mode has.
func TestModeNamesAndWire(t *testing.T) {
	for in, want := range map[string]Mode{"su": SU, "": SU, "AUSI": AUSI, " au ": AU} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseMode("sync"); err == nil {
		t.Error("ParseMode(sync): no error")
	}
	for _, m := range []Mode{SU, AUSI, AU} {
		if got, ok := ModeFromWire(m.Wire()); !ok || got != m {
			t.Errorf("ModeFromWire(%v.Wire()) = %v, %v", m, got, ok)
		}
	}
	for _, w := range []uint64{0, uint64(AU) + 2} {
		if _, ok := ModeFromWire(w); ok {
			t.Errorf("ModeFromWire(%d) accepted", w)
		}
	}
}

// TestSyncNeedsALogMember: a chain repaired down to its memory member does
// not move its durable point (DA), though it commits (LA) — a host answers
// a write asking for durability (Kefir's `sync`) at the head's DA, and no
// disk holds these — and a log member that joins moves it again once it
// persisted them. On the code before, DA over no log member moved with LA
// (design/chain.md, "A sync answer needs a disk"; the host simulation's SU
// D-D-M swarm, seeds 48 and 654, lost such answers in a whole-chain restart).
func TestSyncNeedsALogMember(t *testing.T) {
	for _, mode := range []Mode{SU, AUSI, AU} {
		// A chain of memory members by configuration: the user's choice,
		// sync there means every member's store holds it (DA at LA).
		h := newHarness([]NodeID{1, 2}, 2, 64, 0)
		h.setup(mode, func(NodeID) Store { return Memory })
		h.master.Put(1, []byte("k=v"))
		h.collect()
		h.stabilize()
		if s := h.members[1].Status(); s.DA != s.LA || s.LA == 0 {
			t.Fatalf("%s M-M by configuration: head DA %s, LA %s: want DA at LA", mode, FormatSeq(s.DA), FormatSeq(s.LA))
		}
	}
	for _, mode := range []Mode{SU, AUSI, AU} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHarness([]NodeID{1, 2}, 2, 64, 0)
			h.syncPersist = true
			h.setup(mode, func(id NodeID) Store {
				if id == 2 || id == 4 {
					return Memory
				}
				return Log // 1, and 3, which joins last
			})
			id := uint64(0)
			put := func(n int) {
				for range n {
					id++
					h.master.Put(id, []byte(fmt.Sprintf("k%d=v%d", id%3, id)))
					h.collect()
					h.stabilize()
				}
			}
			put(3)
			if s := h.members[1].Status(); s.DA != s.LA || s.LA == 0 {
				t.Fatalf("D-M: head DA %s, LA %s: want DA at LA", FormatSeq(s.DA), FormatSeq(s.LA))
			}
			h.crash(1, true)
			h.collect()
			h.stabilize()
			mem := h.members[2]
			da := mem.Status().DA
			put(3)
			s := mem.Status()
			if h.master.Head() != 2 || len(mem.History()) != 6 || s.LA != mem.History()[5].Seq {
				t.Fatalf("the memory member alone did not commit the writes: head %d, %d entries, LA %s", h.master.Head(), len(mem.History()), FormatSeq(s.LA))
			}
			if s.DA != da || s.DA >= mem.History()[3].Seq {
				t.Fatalf("a chain of its memory member alone moved DA to %s (was %s; LA %s): a sync write would be answered with no disk holding it",
					FormatSeq(s.DA), FormatSeq(da), FormatSeq(s.LA))
			}
			// A memory member joins: it learns that the chain had a log
			// member (the survivor's acknowledgements say so) and moves
			// no DA of its own either.
			join := func(id NodeID) {
				if err := h.addJoiner(id, 0); err != nil {
					t.Fatal(err)
				}
				for range 20 {
					h.stabilize()
					h.mtick(1)
				}
			}
			join(4)
			put(1)
			hd := h.members[h.master.Head()]
			if s = hd.Status(); len(hd.History()) != 7 || s.LA != hd.History()[6].Seq || s.DA >= hd.History()[3].Seq {
				t.Fatalf("M-M after a memory member joined: head %d, %d entries, DA %s, LA %s: want 7 entries, DA below the 4th", hd.cfg.ID, len(hd.History()), FormatSeq(s.DA), FormatSeq(s.LA))
			}
			// A log member joins and pulls the history: DA moves again.
			join(3)
			put(1)
			hd = h.members[h.master.Head()]
			s = hd.Status()
			if s.DA != s.LA || len(hd.History()) != 8 || len(h.members[3].History()) != 8 {
				t.Fatalf("after a log member joined: the head's DA %s, LA %s, the joiner holds %d entries: want DA at LA, 8", FormatSeq(s.DA), FormatSeq(s.LA), len(h.members[3].History()))
			}
		})
	}
}

// TestMemoryHeadNeverHeardALogMember: M-D, a memory head over a log tail
// that fails before its first acknowledgement reaches the head. The head,
// left the chain alone, has heard from no log member — no message said the
// chain had one — but its configuration does (Config.HadLog, the host's
// deployment: kefir server --chain-log-member): it commits the writes (LA)
// and moves no durable point (DA) over them, so its host answers no `sync`
// write that no disk holds. On the code before (hadLog learnt from messages
// only; the mutation hadLogFromTraffic) its DA moved with LA, vacuously
// (design/chain.md, "A sync answer needs a disk").
func TestMemoryHeadNeverHeardALogMember(t *testing.T) {
	for _, mode := range []Mode{SU, AUSI, AU} {
		t.Run(mode.String(), func(t *testing.T) {
			if err := memoryHeadAlone(mode, mutations{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if !mutation.On {
		return // hadLogFromTraffic needs -tags mutations
	}
	for _, mode := range []Mode{SU, AUSI, AU} {
		if err := memoryHeadAlone(mode, mutations{hadLogFromTraffic: true}); err == nil {
			t.Fatalf("%s: hadLogFromTraffic not caught: the memory head alone kept its durable point", mode)
		} else {
			t.Logf("%s: hadLogFromTraffic caught: %v", mode, err)
		}
	}
}

// memoryHeadAlone runs TestMemoryHeadNeverHeardALogMember's M-D chain with
// mut on both members and returns what went wrong.
func memoryHeadAlone(mode Mode, mut mutations) error {
	h := newHarness([]NodeID{1, 2}, 2, 64, 0)
	h.syncPersist = true
	h.setup(mode, func(id NodeID) Store {
		if id == 2 {
			return Log
		}
		return Memory
	})
	for _, m := range h.members {
		m.mut = mut
	}
	id := uint64(0)
	put := func(n int) {
		for range n {
			id++
			h.master.Put(id, []byte(fmt.Sprintf("k%d=v%d", id%3, id)))
			h.collect()
		}
	}
	// The updates reach the tail, which persists them; its
	// acknowledgements never leave it: it fails first.
	put(3)
	for len(h.queues[link{1, 2}])+len(h.queues[link{2, 2}]) > 0 {
		for _, l := range []link{{1, 2}, {2, 2}} {
			if len(h.queues[l]) > 0 {
				h.deliver(l)
			}
		}
	}
	if s := h.members[1].Status(); s.DA != 0 || s.LA != 0 {
		return fmt.Errorf("before the tail's acknowledgements, the head's DA %s, LA %s: want 0", FormatSeq(s.DA), FormatSeq(s.LA))
	}
	h.crash(2, true)
	h.collect()
	h.stabilize()
	put(3)
	h.stabilize()
	for range 5 {
		h.mtick(1)
		h.stabilize()
	}
	hd := h.members[1]
	s := hd.Status()
	if h.master.Head() != 1 || h.master.Tail() != 1 || len(hd.History()) != 6 || s.LA != hd.History()[5].Seq {
		return fmt.Errorf("the memory head alone did not commit the writes: head %d, tail %d, %d entries, LA %s", h.master.Head(), h.master.Tail(), len(hd.History()), FormatSeq(s.LA))
	}
	if s.DA != 0 {
		return fmt.Errorf("the memory head alone, which never heard from a log member, moved DA to %s (LA %s): a sync write would be answered with no disk holding it", FormatSeq(s.DA), FormatSeq(s.LA))
	}
	return nil
}

// TestMemoryJoinerKeepsNoDiskDurablePoint: a memory member that joins a
// chain left with memory members only (D-M, the log head crashed) and then
// becomes the head alone must not hold a durable point (DA) over writes no
// disk ever held: the joiner learns that the chain had a log member however
// it joins — with no write relayed during its join too — and takes no
// vacuous DA meanwhile.
func TestMemoryJoinerKeepsNoDiskDurablePoint(t *testing.T) {
	for _, mode := range []Mode{SU, AUSI, AU} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHarness([]NodeID{1, 2}, 2, 64, 0)
			h.syncPersist = true
			h.setup(mode, func(id NodeID) Store {
				if id == 1 {
					return Log
				}
				return Memory
			})
			id := uint64(0)
			put := func(n int) {
				for range n {
					id++
					h.master.Put(id, []byte(fmt.Sprintf("k%d=v%d", id%3, id)))
					h.collect()
					h.stabilize()
				}
			}
			put(3)
			h.crash(1, true)
			h.collect()
			h.stabilize()
			put(3) // committed by the memory member alone: on no disk
			if err := h.addJoiner(4, 0); err != nil {
				t.Fatal(err)
			}
			for range 20 {
				h.stabilize()
				h.mtick(1)
			}
			j := h.members[4]
			if s := j.Status(); s.State != Active || len(j.History()) != 6 {
				t.Fatalf("the joiner: %+v, %d entries", s, len(j.History()))
			}
			if s := j.Status(); s.DA >= j.History()[3].Seq {
				t.Fatalf("the memory joiner's DA %s covers writes no disk held (4th: %s)", FormatSeq(s.DA), FormatSeq(j.History()[3].Seq))
			}
			h.crash(2, true)
			h.collect()
			h.stabilize()
			for range 10 {
				h.stabilize()
				h.mtick(1)
			}
			if h.master.Head() != 4 {
				t.Fatalf("head %d, want the joiner 4", h.master.Head())
			}
			if s := j.Status(); s.DA >= j.History()[3].Seq {
				t.Fatalf("the memory joiner, head alone, has DA %s over writes no disk held (4th: %s): a sync write would be answered", FormatSeq(s.DA), FormatSeq(j.History()[3].Seq))
			}
		})
	}
}

// TestMemoryTailTakesTheLogMembersDA: a memory tail under a log member (D-M)
// has no disk of its own from it down, so its DA moves only by the notices
// its predecessor passes down (Member.passDown, noticed): once the log
// member persisted the writes, the tail's DA is theirs — what a strong read
// there serves under AUSI (vrshard's Readable) and where DA stands should it
// become head. Without the notices it stays at 0: reads at the tail would
// wait for ever, and a tail made head would refuse sync answers its log
// members' disks hold.
func TestMemoryTailTakesTheLogMembersDA(t *testing.T) {
	for _, mode := range []Mode{SU, AUSI, AU} {
		h := newHarness([]NodeID{1, 2}, 2, 64, 0)
		h.syncPersist = true
		h.setup(mode, func(id NodeID) Store {
			if id == 1 {
				return Log
			}
			return Memory
		})
		for id := uint64(1); id <= 3; id++ {
			h.master.Put(id, []byte(fmt.Sprintf("k=v%d", id)))
			h.collect()
			h.stabilize()
		}
		head, tail := h.members[1].Status(), h.members[2].Status()
		if tail.LA == 0 || tail.DA != tail.LA || head.DA != tail.LA {
			t.Fatalf("%s D-M: the head's DA %s; the memory tail's DA %s, LA %s: want the tail's DA at the head's, at LA",
				mode, FormatSeq(head.DA), FormatSeq(tail.DA), FormatSeq(tail.LA))
		}
	}
}

// TestConfiguredLogMemberDoesNotSpread: M-M-M, a chain of memory members by
// configuration (Config.HadLog false) whose tail was misconfigured (HadLog
// true: kefir server's default --chain-log-member, forgotten on a node added
// by hand). Its configuration is its own: its durable point never moves
// vacuously, but its messages say what it learnt from a log member (its
// store or a message: nothing), so the others, rightly configured, keep
// their vacuous durable point — the head's answers the chain's sync writes
// — while it is there and once it is gone. Were its configuration said
// (knowsLog in the HadLog bit of its acknowledgements), the others would
// keep it for good (hadLog only grows) and pass it to every member that
// joins later: the chain answered no sync write, the misconfigured member
// gone or restarted with the flag right, until a log member joined, though
// none ever ran.
func TestConfiguredLogMemberDoesNotSpread(t *testing.T) {
	for _, mode := range []Mode{SU, AUSI, AU} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHarness([]NodeID{1, 2, 3}, 3, 64, 0)
			h.syncPersist = true
			h.setup(mode, func(NodeID) Store { return Memory })
			c := h.config(3)
			c.Members, c.HadLog = h.master.Members(), true
			h.members[3] = NewMember(c, h.newSM())
			h.all[3] = h.members[3]
			id := uint64(0)
			put := func(n int) {
				for range n {
					id++
					h.master.Put(id, []byte(fmt.Sprintf("k%d=v%d", id%3, id)))
					h.collect()
					h.stabilize()
				}
			}
			// want: every member in ids holds n writes, and its DA is at
			// its LA (vacuous: no log member by configuration).
			check := func(when string, n int, ids ...NodeID) {
				t.Helper()
				for _, id := range ids {
					m := h.members[id]
					if s := m.Status(); len(m.History()) != n || s.LA != m.History()[n-1].Seq || s.DA != s.LA {
						t.Fatalf("%s: member %d: %d entries, LA %s, DA %s; want %d, DA = LA (a chain of memory members by configuration answers sync writes)",
							when, id, len(m.History()), FormatSeq(s.LA), FormatSeq(s.DA), n)
					}
				}
			}
			put(3)
			check("the misconfigured tail in the chain", 3, 1, 2)
			if s := h.members[3].Status(); s.DA != 0 || s.LA == 0 {
				t.Fatalf("the misconfigured tail: LA %s, DA %s; want its own DA at 0", FormatSeq(s.LA), FormatSeq(s.DA))
			}
			h.crash(3, true)
			h.collect()
			h.stabilize()
			put(3)
			for range 5 {
				h.mtick(1)
				h.stabilize()
			}
			if h.master.Tail() != 2 {
				t.Fatalf("tail %d, want 2", h.master.Tail())
			}
			check("the misconfigured tail gone", 6, 1, 2)
		})
	}
}

// TestLogMemberGoneForGood: D-M-M whose log head is removed for good. The
// memory survivors heard from it (hadLog), so they answer no sync write
// over what no disk holds; a memory member that joins then, even one
// configured with no log member (kefir server --chain-log-member=false),
// learns it from them — the flag changed on the members does not make the
// chain answer sync writes again. A log member joining does: once it holds
// the history, the durable point covers every write (docs/chain.md,
// "Datastores": what to do when the log members are gone for good).
func TestLogMemberGoneForGood(t *testing.T) {
	for _, mode := range []Mode{SU, AUSI} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHarness([]NodeID{1, 2, 3}, 3, 64, 0)
			h.syncPersist = true
			h.setup(mode, func(id NodeID) Store {
				if id == 1 || id == 5 {
					return Log
				}
				return Memory
			})
			id := uint64(0)
			put := func(n int) {
				for range n {
					id++
					h.master.Put(id, []byte(fmt.Sprintf("k%d=v%d", id%3, id)))
					h.collect()
					h.stabilize()
				}
			}
			settle := func() {
				for range 20 {
					h.stabilize()
					h.mtick(1)
				}
			}
			put(3)
			h.crash(1, true)
			h.collect()
			settle()
			put(3)
			// Every member started from now on is told the chain has no
			// log member; member 3 is replaced by such a one.
			h.hadLog = false
			h.crash(3, true)
			h.collect()
			settle()
			if err := h.addJoiner(4, 0); err != nil {
				t.Fatal(err)
			}
			settle()
			put(3)
			settle()
			hd := h.members[h.master.Head()]
			if s := hd.Status(); h.master.Head() == 0 || len(h.master.Members()) != 2 || len(hd.History()) != 9 || s.LA != hd.History()[8].Seq || s.DA >= hd.History()[3].Seq {
				t.Fatalf("memory members only, the log head gone for good: chain %v, head's %d entries, LA %s, DA %s; want 9 entries, LA at the 9th, DA below the 4th (written after the log member left)",
					h.master.Members(), len(hd.History()), FormatSeq(s.LA), FormatSeq(s.DA))
			}
			if !h.members[4].hadLog {
				t.Fatal("the joiner configured with no log member did not learn of the log member from the survivors")
			}
			if err := h.addJoiner(5, 0); err != nil {
				t.Fatal(err)
			}
			settle()
			put(1)
			settle()
			hd = h.members[h.master.Head()]
			if s := hd.Status(); len(h.master.Members()) != 3 || s.DA != s.LA || s.LA != hd.History()[9].Seq {
				t.Fatalf("a log member joined: chain %v, head's LA %s, DA %s; want DA = LA at the 10th write", h.master.Members(), FormatSeq(s.LA), FormatSeq(s.DA))
			}
		})
	}
}
