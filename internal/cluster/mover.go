package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
)

// Mover moves slot ranges between two groups of a running cluster (kefir
// cluster move-slots; docs/design/cluster.md, "A move"). It is the stand-in
// for the metadata group's move driver: it keeps no state of its own — every
// step is an op in a group's log (KEFIR.SLOTS at the group's leader), and a
// move that stopped anywhere (the mover killed, a leader crashed) resumes
// from the two groups' tables when Move is run again.
//
// The steps, for ranges R from group S to group D at epoch E (one more than
// either table's):
//
//  1. D: R importing from S; S: R migrating to D (S still serves R).
//  2. pre-copy: every key of R at S's leader, as it stands, into D
//     (KEFIR.SLOTS DUMP / LOAD), then in rounds the keys written since the
//     previous round began, until a round brings little; v0 is the engine
//     version at the last round's start.
//  3. hand-over at S: R none, peer D (S's fence refuses R from this op on;
//     requests for R are held: forwarded and retried, until step 5).
//  4. final copy: S's keys of R with a version above v0, S's frozen state,
//     a deletion at D of every key of R that S does not have, S's
//     client rows as of the hand-over (request marks), and S's view
//     history with the copies of other groups' it holds (view copies, an
//     op of their own: viewCopies).
//  5. D: R owned at E. Routing follows the tables (every node hosting D
//     routes R to it); the source's copy is purged (deletions at S).
type Mover struct {
	// Seeds are client addresses of nodes of the cluster; a step goes to
	// the first that answers and follows its -MOVED to the group's leader.
	Seeds    []string
	Password string
	TLS      *tls.Config
	// Page is how many keys one DUMP reads and one LOAD writes (default
	// 1024).
	Page int
	// PagePause is slept after each page of the pre-copy and of the purge
	// (its key listing and its deletions; an abort's too) — a rate limit
	// that leaves the groups' leaders to their clients (0: none). The
	// window's own pages (final copy, deletions, request marks) are never
	// paced: the slots are held meanwhile; nor is the destination's
	// listing just before the hand-over (scan).
	PagePause time.Duration
	// Pacer, if set, gives the pause instead of PagePause, page by page:
	// the adaptive rate limit (pace.go's Prober).
	Pacer interface{ Pause() time.Duration }
	// RetryFor bounds how long one step is retried while no leader answers
	// (default 30 s).
	RetryFor time.Duration
	// Logf, if set, reports each step.
	Logf func(format string, args ...any)
	// AfterStep, if set, is called after each step and each page of the
	// pre-copy ("precopy-page"; tests: a crash there), and once a recorded
	// move's record is written or taken over, before its first step
	// ("planned"; tests: an abort racing the driver then).
	AfterStep func(step string)

	// Transport, if set, carries each command to addr (a seed, or the
	// address a -MOVED named) and returns its reply, in place of the
	// Mover's TCP connections: the deterministic simulation of moves
	// (internal/vrshard, move_sim_test.go) delivers it as a simulated
	// message to a stepped replica. An error is a failed connection
	// (retried as one).
	Transport func(ctx context.Context, addr string, args [][]byte) (resp.Value, error)
	// Clock, if set, is the Mover's time: its retry bound (RetryFor), the
	// pauses between retries and pages, and MoveResult's durations
	// (default: the real clock).
	Clock MoverClock

	// Meta records the move in the metadata group (MovePlanned before the
	// first step, MoveDone after the last) and drives it under a lease
	// there (metamove.go); off, the move is only in the two groups' tables.
	Meta bool
	// Driver names this driver in the metadata group's record; the first
	// record op appends a random token (identify): each driver's own.
	Driver     string
	identified bool
	// Lease is the driver's lease (default DefaultLease).
	Lease time.Duration
	// TakeOver is the beat of a recorded move this driver takes over
	// without watching it first (the metadata leader's resumer watched
	// it); 0: watch the beat for two leases before claiming a move
	// another driver recorded.
	TakeOver uint64
	// Rand, if set, draws the token that makes Driver this driver's own
	// (identify; default: crypto/rand): the move simulation's draws from
	// its seed, so that a run replays exactly.
	Rand func() uint64

	conns map[string]*moverConn
	// noWait is set once a metadata leader answered that it does not hold
	// map polls (MetaMapWait).
	noWait bool
	// rtTimeout bounds one round trip (dial, AUTH, command; 0: 10 s):
	// the latency probe's are short, so that a hung leader cannot hold it.
	rtTimeout time.Duration
	lease     moveLease
	// settling: settle runs Move to finish a move marked for abort past
	// its hand-over (Move then drives it, rather than settling again).
	settling bool
	// answeredBy is the address that answered the last command.
	answeredBy string
}

// MoverClock is a Mover's time (Mover.Clock).
type MoverClock interface {
	Now() time.Time
	// Sleep returns after d, or ctx's error once ctx ends first.
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// clock is mv's Clock (nil mv or Clock: the real clock).
func (mv *Mover) clock() MoverClock {
	if mv != nil && mv.Clock != nil {
		return mv.Clock
	}
	return realClock{}
}

// like is a Mover to seeds with mv's credentials, transport and clock (nil
// mv: the defaults), so that a Mover a step derives (to a group's members,
// to one node) runs where mv does: on a simulation's network and clock
// under it. The one place a derived Mover is built.
func (mv *Mover) like(seeds []string, retryFor time.Duration) *Mover {
	if mv == nil {
		return &Mover{Seeds: seeds, RetryFor: retryFor}
	}
	return &Mover{Seeds: seeds, Password: mv.Password, TLS: mv.TLS, RetryFor: retryFor, Transport: mv.Transport, Clock: mv.Clock}
}

func (mv *Mover) since(t time.Time) time.Duration { return mv.clock().Now().Sub(t) }

type moverConn struct {
	nc net.Conn
	rd *resp.Reader
}

// MoveResult says what a Move did.
type MoveResult struct {
	Epoch           uint64
	Copied, Final   int // entries loaded by the pre-copy (all its rounds), by the final copy
	Rounds          int // the pre-copy's rounds
	Deleted, Purged int // keys deleted at the destination, purged at the source
	Marks           int // request marks (client-table rows) taken to the destination
	ViewCopies      int // view histories taken to the destination (the source's own and the copies it held)
	Resumed         string
	PreCopy, Freeze time.Duration
	Total           time.Duration
}

// Move moves rs from group from to group to, or finishes such a move that
// stopped part way.
func (mv *Mover) Move(ctx context.Context, from, to GroupID, rs []kv.SlotRange) (MoveResult, error) {
	start := mv.clock().Now()
	defer mv.close()
	var out MoveResult
	if from == to || len(rs) == 0 {
		return out, errors.New("move-slots: need two distinct groups and slots")
	}
	g := func(id GroupID) string { return strconv.FormatUint(uint64(id), 10) }
	ranges := FormatSlotRanges(rs)
	in := InRanges(rs)
	// Tables (a group without one gets its first, from the map).
	tabs := map[GroupID][]SlotRunInfo{}
	for _, id := range []GroupID{from, to} {
		t, err := mv.Table(ctx, id)
		if err != nil {
			return out, err
		}
		if len(t) == 0 {
			if _, err := mv.do(ctx, "KEFIR.SLOTS", "INIT", g(id), "1"); err != nil {
				return out, fmt.Errorf("move-slots: init group %d's slot table: %w", id, err)
			}
			if t, err = mv.Table(ctx, id); err != nil {
				return out, err
			}
		}
		tabs[id] = t
	}
	src, err := uniform(tabs[from], in, from)
	if err != nil {
		return out, err
	}
	dst, err := uniform(tabs[to], in, to)
	if err != nil {
		return out, err
	}
	epoch := max(maxEpoch(tabs[from]), maxEpoch(tabs[to])) + 1
	stage := 0 // 0: fresh, 1: copying, 2: handed over, 3: done
	switch {
	case src.State == "owned" && dst.State == "none":
	case src.State == "migrating" && src.Peer == uint64(to) && (dst.State == "importing" || dst.State == "none"):
		stage, epoch, out.Resumed = 1, src.Epoch, "copy"
	case src.State == "owned" && dst.State == "importing" && dst.Peer == uint64(from):
		// Stopped between its first two steps: the destination imports,
		// the source has not started migrating (and serves the slots as
		// ever). The move goes on at the destination's epoch: a fresh one
		// would need the destination back at none first (the simulation
		// of moves found this: internal/vrshard's TestMoveSimResumesAfterEachStep).
		stage, epoch, out.Resumed = 1, dst.Epoch, "copy"
	case src.State == "none" && src.Peer == uint64(to) && dst.State == "importing" && dst.Peer == uint64(from):
		stage, epoch, out.Resumed = 2, src.Epoch, "final copy"
	case src.State == "none" && src.Peer == uint64(to) && dst.State == "owned":
		stage, epoch, out.Resumed = 3, dst.Epoch, "purge"
	default:
		return out, fmt.Errorf("move-slots: slots %s are %s at group %d (peer %d) and %s at group %d (peer %d): not a move from %d to %d this can start or resume",
			ranges, src.State, from, src.Peer, dst.State, to, dst.Peer, from, to)
	}
	// The metadata group's record: planned (or taken over) before any
	// step, under this driver's lease from here on.
	record := func(stage int) error {
		pe, err := mv.plan(ctx, from, to, rs, stage, epoch)
		switch {
		case errors.Is(err, errNoRecord): // done already: the purge is left
		case err != nil:
			return err
		default:
			epoch = pe
		}
		return nil
	}
	planLate := mutation.On && MultiMut.PlanAfterHandOver.Load()
	if mv.Meta && !planLate {
		if err := record(stage); err != nil {
			return out, err
		}
		mv.after("planned")
		if mutation.On && MultiMut.DoneBeforeCopy.Load() && stage == 0 {
			if err := mv.recordEnd(ctx, "DONE"); err != nil {
				return out, err
			}
		}
		if mv.lease.abort {
			// The record is marked for abort (move-slots --abort): never
			// driven forward before its hand-over. The tables read above
			// came before this driver's claim: settle fences the groups
			// and decides on what they hold then.
			if mv.settling {
				if stage < 2 {
					return out, fmt.Errorf("move-slots: the move at epoch %d is marked to be rolled back: not driving it forward before its hand-over", epoch)
				}
			} else {
				res, rolledBack, err := mv.settle(ctx, from, to, rs)
				if err == nil && rolledBack {
					err = fmt.Errorf("%w: the move of %s from group %d to group %d at epoch %d was marked to be rolled back (move-slots --abort) before its hand-over: rolled back (group %d keeps the slots)",
						ErrMoveRolledBack, ranges, from, to, res.Epoch, from)
				}
				return res, err
			}
		}
	}
	out.Epoch = epoch
	e := strconv.FormatUint(epoch, 10)
	var v0 uint64
	if stage == 0 {
		mv.logf("move %s from group %d to group %d at epoch %d", ranges, from, to, epoch)
	} else {
		mv.logf("resume the move of %s from group %d to group %d at epoch %d: %s", ranges, from, to, epoch, out.Resumed)
	}
	if stage <= 1 {
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(to), "importing", g(from), e, ranges); err != nil {
			return out, fmt.Errorf("move-slots: group %d importing: %w", to, err)
		}
		mv.after("importing")
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(from), "migrating", g(to), e, ranges); err != nil {
			return out, fmt.Errorf("move-slots: group %d migrating: %w", from, err)
		}
		mv.after("migrating")
		// The pre-copy in rounds, as a live VM migration: the first copies
		// every key, each next one the keys written since the previous
		// began (their versions are above the engine's last version then),
		// while the source serves the slots; it stops when a round brings
		// little (or no less than the one before), so that the final copy,
		// during which the slots are held, has only the last round's
		// writes to bring.
		t0 := mv.clock().Now()
		prev := -1
		for round := 0; ; round++ {
			n, at, err := mv.copy(ctx, from, to, ranges, v0, false, nil)
			out.Copied += n
			out.Rounds++
			if err != nil {
				return out, fmt.Errorf("move-slots: pre-copy round %d: %w", round+1, err)
			}
			v0 = at
			if n <= mv.page() || (prev >= 0 && 2*n > prev) || round+1 >= maxRounds {
				break
			}
			prev = n
		}
		out.PreCopy = mv.since(t0)
		mv.after("precopy")
	}
	if stage == 2 && mv.lease.epoch != 0 {
		// A driver that took the move over fences the destination
		// before it lists its keys (a no-op step at its beat): a
		// displaced driver's import still in flight cannot land after
		// the listing (kv.SlotFenceKey).
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(to), "importing", g(from), e, ranges); err != nil {
			return out, fmt.Errorf("move-slots: fence group %d: %w", to, err)
		}
	}
	if stage <= 2 {
		// The destination's keys of R, listed before the hand-over (while
		// it imports, only imports change them, and the final copy only
		// adds keys the source has): the ones the source no longer has
		// are deleted after the final copy. Listed here, not in the
		// window, which then holds one listing (the source's) instead of
		// two.
		dstKeys := map[string]bool{}
		if err := mv.scan(ctx, to, ranges, false, func(k []byte) error {
			dstKeys[string(k)] = true
			return nil
		}); err != nil {
			return out, fmt.Errorf("move-slots: list group %d's keys: %w", to, err)
		}
		t0 := mv.clock().Now()
		// A source whose slots hold locks of prepared cross-group
		// transactions refuses it with -TRYAGAIN (kv.ErrTxLocked: locks
		// never move), which doBytes retries until they are resolved.
		hv, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(from), "none", g(to), e, ranges)
		if err != nil {
			return out, fmt.Errorf("move-slots: hand-over at group %d: %w", from, err)
		}
		mv.after("handover")
		if mv.Meta && planLate {
			// Deliberately broken (tests): recorded only now.
			if err := record(2); err != nil {
				return out, err
			}
		}
		srcKeys := map[string]bool{}
		n, _, err := mv.copy(ctx, from, to, ranges, v0, true, srcKeys)
		out.Final = n
		if err != nil {
			return out, fmt.Errorf("move-slots: final copy: %w", err)
		}
		var dels [][]byte
		for k := range dstKeys {
			if !srcKeys[k] {
				dels = kv.AppendSlotImport(dels, []byte(k), nil, nil, nil, true)
			}
		}
		if err := mv.load(ctx, to, dels, false); err != nil {
			return out, fmt.Errorf("move-slots: final deletions: %w", err)
		}
		out.Deleted = len(dels) / 3
		// The source's client table as of the hand-over (a resumed move
		// does not know its version: the rows as they are, which may also
		// mark requests the fence refused after it, so that their retries
		// are refused rather than run: safe, and rare).
		cv, err := mv.do(ctx, "KEFIR.SLOTS", "CLIENTS", g(from), strconv.FormatInt(hv.Int, 10))
		if err != nil {
			return out, fmt.Errorf("move-slots: group %d's client table: %w", from, err)
		}
		var marks [][]byte
		for i := 0; i+1 < len(cv.Elems); i += 2 {
			if id := cv.Elems[i].Str; len(id) == 8 {
				marks = kv.AppendSlotClientMark(marks, binary.BigEndian.Uint64(id), cv.Elems[i+1].Str)
			}
		}
		if err := mv.load(ctx, to, marks, false); err != nil {
			return out, fmt.Errorf("move-slots: request marks: %w", err)
		}
		out.Marks = len(marks) / 3
		if out.ViewCopies, err = mv.viewCopies(ctx, from, to, hv.Int); err != nil {
			return out, err
		}
		mv.after("finalcopy")
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(to), "owned", g(from), e, ranges); err != nil {
			return out, fmt.Errorf("move-slots: group %d takes the slots: %w", to, err)
		}
		out.Freeze = mv.since(t0)
		mv.after("owned")
	}
	// The source's copy: unreachable (its fence), purged so that its key
	// counts and scans are right.
	var purge [][]byte
	if err := mv.scan(ctx, from, ranges, true, func(k []byte) error {
		purge = kv.AppendSlotImport(purge, k, nil, nil, nil, true)
		return nil
	}); err != nil {
		return out, fmt.Errorf("move-slots: list group %d's old keys: %w", from, err)
	}
	if err := mv.load(ctx, from, purge, true); err != nil {
		return out, fmt.Errorf("move-slots: purge group %d: %w", from, err)
	}
	out.Purged = len(purge) / 3
	if mv.Meta {
		if err := mv.recordEnd(ctx, "DONE"); err != nil {
			return out, err
		}
	}
	out.Total = mv.since(start)
	mv.logf("moved %s from group %d to group %d at epoch %d: %d keys pre-copied, %d in the final copy, %d deleted, %d purged; pre-copy %v, hand-over %v",
		ranges, from, to, epoch, out.Copied, out.Final, out.Deleted, out.Purged, out.PreCopy.Round(time.Millisecond), out.Freeze.Round(time.Millisecond))
	return out, nil
}

// viewCopies takes to group to, with the final copy and before the
// take-over, group from's view history as of the hand-over (version at; 0:
// a resumed move, whatever the leader applied, which is past it) and the
// copies of other groups' histories from holds (kv/viewcopy.go): the
// destination's replicas then judge a session's part of from — a cad or
// async write a view change dropped at from before the hand-over — at a
// read of the moved keys, wherever from is hosted, and after from is gone
// (docs/design/cluster.md §8). Every replica of to that serves the slots
// applied the take-over, and so this op first. They go in an op of their
// own: a destination leader of an older build refuses it whole (its key
// check: the copy's key is reserved), and a source of one does not know
// VIEWS; either way the move goes on without the copies, as before.
func (mv *Mover) viewCopies(ctx context.Context, from, to GroupID, at int64) (int, error) {
	g := func(id GroupID) string { return strconv.FormatUint(uint64(id), 10) }
	v, err := mv.do(ctx, "KEFIR.SLOTS", "VIEWS", g(from), strconv.FormatInt(at, 10))
	if err != nil {
		if strings.Contains(err.Error(), "unknown subcommand") {
			mv.logf("group %d's leader keeps no view history for moves (an older build): its sessions' lost writes are judged only where it is read", from)
			return 0, nil
		}
		return 0, fmt.Errorf("move-slots: group %d's view history: %w", from, err)
	}
	var entries [][]byte
	for i := 0; i+2 < len(v.Elems); i += 3 {
		gid := uint64(v.Elems[i].Int)
		if gid == uint64(to) || gid > 1<<32-1 {
			continue // to's own history is longer than any copy of it
		}
		c, err := kv.DecodeViewCopy(v.Elems[i+2].Str)
		if err != nil {
			return 0, fmt.Errorf("move-slots: group %d's copy of group %d's view history: %w", from, gid, err)
		}
		entries = kv.AppendSlotViews(entries, uint32(gid), c)
	}
	if mutation.On && MultiMut.NoViewCopies.Load() {
		entries = nil // Deliberately broken (tests): none taken.
	}
	if len(entries) == 0 {
		return 0, nil
	}
	if err := mv.load(ctx, to, entries, false); err != nil {
		if strings.Contains(err.Error(), "reserved") {
			mv.logf("group %d's leader refused the view copies (an older build): sessions' lost writes at group %d are judged only where it is read", to, from)
			return 0, nil
		}
		return 0, fmt.Errorf("move-slots: view copies to group %d: %w", to, err)
	}
	return len(entries) / 3, nil
}

// ErrMoveRolledBack is Move's error for a recorded move it found marked for
// abort (move-slots --abort) before its hand-over: it rolled it back
// (settle) instead of moving the slots.
var ErrMoveRolledBack = errors.New("move-slots: rolled back")

// maxRounds bounds the pre-copy's rounds.
const maxRounds = 8

// Abort rolls back a move of rs from group from to group to that has not
// reached its hand-over: the source owns the slots again (it never stopped
// serving them), the destination gives up importing them and its copy is
// purged. A move past its hand-over can only be finished: the source may
// not take back slots it handed over.
//
// A move recorded in the metadata group (Meta) is claimed at once, with the
// abort mark (claimAbort: a live driver is displaced, its next renewal
// refused, and no take-over drives the move forward again), then settled
// (settle): both groups fenced, their tables read, and the move rolled back
// before its hand-over — or, past it, finished forward by this driver and
// an error returned saying so.
func (mv *Mover) Abort(ctx context.Context, from, to GroupID, rs []kv.SlotRange) error {
	defer mv.close()
	ranges := FormatSlotRanges(rs)
	if mv.Meta {
		err := mv.claimAbort(ctx, from, to, rs)
		if err == nil {
			res, rolledBack, err := mv.settle(ctx, from, to, rs)
			if err != nil {
				return err
			}
			if !rolledBack {
				return fmt.Errorf("move-slots: abort: the move of %s from group %d to group %d at epoch %d had been handed over, so it cannot be rolled back: it was finished instead (group %d owns the slots)",
					ranges, from, to, res.Epoch, to)
			}
			return nil
		}
		if !errors.Is(err, errNoRecord) {
			return err
		}
		// Not recorded (done, rolled back, or moved without a record):
		// rolled back from the tables, as without a metadata group.
	} else if err := mv.refuseRecorded(ctx, from, to, rs); err != nil {
		return err
	}
	src, dst, err := mv.moveStates(ctx, from, to, rs)
	if err != nil {
		return err
	}
	return mv.rollBack(ctx, from, to, rs, src, dst)
}

// refuseRecorded is an unrecorded abort's (move-slots --abort
// --record=false) check that the metadata group records no move of any of
// rs: such a rollback reads the tables unfenced and claims nothing, so
// under a recorded move's driver — alive, or the metadata leader's resumer
// taking it over — the driver would go on past it: two owners of a slot
// (vrshard TestMoveSimMetaAbortRacesALiveDriver, unrecorded/). A cluster
// without a metadata group has no record to meet; a metadata group that
// does not answer refuses the abort (it cannot be shown safe), saying so.
func (mv *Mover) refuseRecorded(ctx context.Context, from, to GroupID, rs []kv.SlotRange) error {
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		// No metadata group: the node says so, or (a node whose map
		// names no metadata members) that it does not host group
		// MetaGroupID.
		if msg := err.Error(); strings.Contains(msg, errNoMetaGroup) ||
			strings.Contains(msg, fmt.Sprintf("ERR group %d is not hosted by this node", MetaGroupID)) {
			return nil
		}
		return fmt.Errorf("move-slots: abort --record=false of %s from group %d to group %d: the metadata group's map could not be read to check that it records no move of these slots (rolling back under a recorded move's driver would leave a slot with two owners): %w",
			FormatSlotRanges(rs), from, to, err)
	}
	if cm == nil {
		return nil
	}
	for _, rec := range cm.Moves {
		if slotsMeet(rec.Slots, rs) {
			return fmt.Errorf("move-slots: abort --record=false: the move of slots %s from group %d to group %d is recorded in the metadata group (epoch %d, driver %q): abort it without --record=false (--from %d --to %d --slots %s), which claims the record and fences its driver; an unrecorded rollback would leave a slot with two owners",
				FormatSlotRanges(rec.Slots), rec.From, rec.To, rec.Epoch, rec.Driver, rec.From, rec.To, FormatSlotRanges(rec.Slots))
		}
	}
	return nil
}

// errNoMetaGroup is the text of a node's answer to KEFIR.SLOTS META in a
// cluster made before the metadata group (Multi.hosted).
const errNoMetaGroup = "this cluster has no metadata group"

// claimAbort claims the record of the move of rs from group from to group
// to at once, with the abort mark (errNoRecord: none): at the beat the map
// shows, read again if another claim moved it meanwhile.
func (mv *Mover) claimAbort(ctx context.Context, from, to GroupID, rs []kv.SlotRange) error {
	mv.identify()
	deadline := mv.clock().Now().Add(mv.retryFor())
	for {
		cm, err := mv.MetaMap(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(cm.Moves, func(rec kv.MapMove) bool {
			return rec.From == uint64(from) && rec.To == uint64(to) && slices.Equal(rec.Slots, rs)
		})
		if i < 0 {
			// A recorded move of some of these slots under other
			// ranges (a subset, a superset, the same slots spelt in
			// another order) is not rolled back from the tables: that
			// rollback is unfenced and unclaimed, and the move's
			// driver would go on — two owners of a slot (vrshard
			// TestMoveSimMetaAbortRacesALiveDriver, reversed/).
			for _, rec := range cm.Moves {
				if slotsMeet(rec.Slots, rs) {
					return fmt.Errorf("move-slots: abort: the move in flight is of slots %s from group %d to group %d (epoch %d, driver %q): abort it by those (--from %d --to %d --slots %s)",
						FormatSlotRanges(rec.Slots), rec.From, rec.To, rec.Epoch, rec.Driver, rec.From, rec.To, FormatSlotRanges(rec.Slots))
				}
			}
			return errNoRecord
		}
		rec := cm.Moves[i]
		mv.lease = moveLease{epoch: rec.Epoch, beat: rec.Beat, abort: true}
		err = mv.claim(ctx)
		if err == nil {
			mv.logf("took over the move at epoch %d from driver %q at once, marked for abort", rec.Epoch, rec.Driver)
			return nil
		}
		mv.lease = moveLease{}
		if strings.Contains(err.Error(), "wrong number of arguments") {
			return fmt.Errorf("move-slots: abort: the metadata group's leader does not know the abort mark (an older build; every node must run this one): %w", err)
		}
		if mv.clock().Now().After(deadline) {
			return fmt.Errorf("move-slots: abort: claim the move at epoch %d: %w", rec.Epoch, err)
		}
		// The beat moved between the read and the claim (its driver
		// renewed, another taker claimed): read it again.
		if err := mv.clock().Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// slotsMeet reports whether ranges a and b share a slot: two inclusive
// ranges meet when each starts no later than the other ends.
func slotsMeet(a, b []kv.SlotRange) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Start <= y.End && y.Start <= x.End {
				return true
			}
		}
	}
	return false
}

// settle is what a driver holding a record marked for abort does, whoever
// it is (move-slots --abort after its claim; a take-over of a marked record
// through Move, the metadata leader's resumer's and the simulation's): it
// fences both groups at its beat (fence), so that no step of an earlier
// driver lands after it and the tables it then reads are final, and
// decides on them: before the hand-over it rolls the move back and records
// the abort (rolledBack); past it it finishes the move forward (Move) and
// records it done.
func (mv *Mover) settle(ctx context.Context, from, to GroupID, rs []kv.SlotRange) (res MoveResult, rolledBack bool, err error) {
	res.Epoch = mv.lease.epoch
	for _, id := range []GroupID{from, to} {
		if mutation.On && MultiMut.AbortSkipsFence.Load() {
			break // Deliberately broken (tests): the tables read unfenced.
		}
		if err := mv.fence(ctx, id); err != nil {
			return res, false, err
		}
	}
	mv.after("abort-fenced")
	src, dst, err := mv.moveStates(ctx, from, to, rs)
	if err != nil {
		return res, false, err
	}
	handedOver := src.State == "none" && src.Peer == uint64(to) &&
		(dst.State == "owned" || dst.State == "importing" && dst.Peer == uint64(from))
	if !handedOver {
		res.Resumed = "rolled back"
		return res, true, mv.rollBack(ctx, from, to, rs, src, dst)
	}
	mv.logf("the move at epoch %d was handed over before its abort: finishing it", res.Epoch)
	mv.settling = true
	defer func() { mv.settling = false }()
	res, err = mv.Move(ctx, from, to, rs)
	return res, false, err
}

// fence raises group id's driver fence to this driver's lease (an empty
// KEFIR.SLOTS LOADF at the move's epoch and the lease's beat), retried
// while no leader answers: from then on the group refuses every step of a
// driver with a lower beat. Refused (a driver with a higher beat fenced
// the group): this driver was displaced.
func (mv *Mover) fence(ctx context.Context, id GroupID) error {
	l := mv.lease
	if _, err := mv.do(ctx, "KEFIR.SLOTS", "LOADF", strconv.FormatUint(uint64(id), 10), strconv.FormatUint(l.epoch, 10), strconv.FormatUint(l.beat, 10)); err != nil {
		return fmt.Errorf("move-slots: fence group %d at epoch %d, beat %d: %w", id, l.epoch, l.beat, err)
	}
	return nil
}

// moveStates returns the state of rs at group from and at group to (a
// group without a table: no move of it ever started).
func (mv *Mover) moveStates(ctx context.Context, from, to GroupID, rs []kv.SlotRange) (src, dst SlotRunInfo, err error) {
	in := InRanges(rs)
	var st [2]SlotRunInfo
	for i, id := range []GroupID{from, to} {
		t, err := mv.Table(ctx, id)
		if err != nil {
			return src, dst, err
		}
		if len(t) == 0 {
			// No table: no move of this group ever started (a move
			// recorded by a driver that died before its first step).
			st[i].State = [2]string{"owned", "none"}[i]
			continue
		}
		if st[i], err = uniform(t, in, id); err != nil {
			return src, dst, err
		}
	}
	return st[0], st[1], nil
}

// rollBack rolls back the move of rs from group from to group to whose
// tables are src and dst (refused past the hand-over), purges the
// destination's copy and records the abort if this driver holds the
// move's record.
func (mv *Mover) rollBack(ctx context.Context, from, to GroupID, rs []kv.SlotRange, src, dst SlotRunInfo) error {
	g := func(id GroupID) string { return strconv.FormatUint(uint64(id), 10) }
	ranges := FormatSlotRanges(rs)
	// takeEpoch brings the source, which never left owned, to the move's
	// epoch e (migrating, then owned again, keeping the peer it imported
	// the slots from), as a move rolled back after its migrating step
	// leaves it: an owned entry at an older epoch ranks below the
	// destination's none at e, and every keyspace scan would take the
	// source's keys of the slots as behind and find the slots served by
	// no group, for good (slotrank.go;
	// server.TestScanAfterAMoveAbortedBeforeTheSourceMigrated).
	takeEpoch := func(e string) error {
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(from), "migrating", g(to), e, ranges); err != nil {
			return fmt.Errorf("move-slots: abort: group %d takes the move's epoch: %w", from, err)
		}
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(from), "owned", strconv.FormatUint(src.Peer, 10), e, ranges); err != nil {
			return fmt.Errorf("move-slots: abort: group %d takes the slots back: %w", from, err)
		}
		return nil
	}
	switch {
	case src.State == "owned" && dst.State == "none" && dst.Peer == uint64(from) && src.Epoch > 0 && src.Epoch < dst.Epoch:
		// Rolled back between the move's first two steps by an older
		// build (the destination gave up importing, the source kept
		// its older epoch): the source takes the move's epoch now.
		if err := takeEpoch(strconv.FormatUint(dst.Epoch, 10)); err != nil {
			return err
		}
	case src.State == "owned" && dst.State == "none":
		// Nothing to roll back, or rolled back before the purge.
	case src.State == "owned" && dst.State == "importing" && dst.Peer == uint64(from):
		// Stopped between the move's first two steps: the source never
		// left owned; it takes the move's epoch (takeEpoch), then the
		// destination gives up importing.
		e := strconv.FormatUint(dst.Epoch, 10)
		if err := takeEpoch(e); err != nil {
			return err
		}
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(to), "none", g(from), e, ranges); err != nil {
			return fmt.Errorf("move-slots: abort: group %d stops importing: %w", to, err)
		}
	case src.State == "migrating" && src.Peer == uint64(to) && (dst.State == "importing" || dst.State == "none"):
		// The source takes the slots back with a peer not 0, so that
		// kv.MovedRequest goes on checking their requests against the
		// marks it imported with them: with peer 0 a retry of a write
		// the group the slots came from ran before an earlier move
		// would run again here. The peer it imported them from is not
		// in any table once the migrating step landed (the entry names
		// the destination), and a driver that takes over or aborts a
		// move never read the row before it: the entry keeps the
		// migrating one's peer, the destination. If the source never
		// imported the slots, their requests are checked needlessly —
		// safe, as while they migrate (kv.MovedRequest): a write of
		// them pays a mark's lookup until they move again. (Peer 0
		// here: an INCR counted twice, server
		// TestAbortAfterMigratingKeepsCheckingTheMarks, vrshard
		// TestMoveSimAbortOfAnImportedSlotKeepsItsMarks.)
		e := strconv.FormatUint(src.Epoch, 10)
		peer := g(to)
		if mutation.On && MultiMut.AbortDropsImportOrigin.Load() {
			peer = "0" // Deliberately broken (tests): as never imported.
		}
		if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(from), "owned", peer, e, ranges); err != nil {
			return fmt.Errorf("move-slots: abort: group %d takes the slots back: %w", from, err)
		}
		if dst.State == "importing" {
			if _, err := mv.do(ctx, "KEFIR.SLOTS", "SET", g(to), "none", g(from), e, ranges); err != nil {
				return fmt.Errorf("move-slots: abort: group %d stops importing: %w", to, err)
			}
		}
	default:
		return fmt.Errorf("move-slots: abort: slots %s are %s at group %d and %s at group %d: only a move before its hand-over can be rolled back (finish it with move-slots)",
			ranges, src.State, from, dst.State, to)
	}
	var purge [][]byte
	if err := mv.scan(ctx, to, ranges, true, func(k []byte) error {
		purge = kv.AppendSlotImport(purge, k, nil, nil, nil, true)
		return nil
	}); err != nil {
		return fmt.Errorf("move-slots: abort: list group %d's copy: %w", to, err)
	}
	if err := mv.load(ctx, to, purge, true); err != nil {
		return fmt.Errorf("move-slots: abort: purge group %d's copy: %w", to, err)
	}
	if err := mv.recordEnd(ctx, "ABORT"); err != nil {
		return err
	}
	mv.logf("rolled back the move of %s from group %d to group %d: group %d owns them, %d keys of its copy purged at group %d", ranges, from, to, from, len(purge)/3, to)
	return nil
}

// copy loads into to every key of ranges at from whose version is above
// since, page by page; keys, if not nil, gets every key seen. at is the
// source engine's last version when the first page was read: a key
// written after it may have been read before its write.
func (mv *Mover) copy(ctx context.Context, from, to GroupID, ranges string, since uint64, frozen bool, keys map[string]bool) (n int, at uint64, err error) {
	var cursor []byte
	for page := 0; ; page++ {
		v, err := mv.dump(ctx, from, ranges, cursor, since, frozen)
		if err != nil {
			return n, at, err
		}
		if page == 0 {
			at = uint64(v.Elems[3].Int)
		}
		var entries [][]byte
		es := v.Elems[1].Elems
		for i := 0; i+3 < len(es); i += 4 {
			entries = append(entries, es[i].Str, es[i+1].Str, es[i+2].Str)
		}
		if keys != nil {
			for _, k := range v.Elems[2].Elems {
				keys[string(k.Str)] = true
			}
		}
		if err := mv.load(ctx, to, entries, false); err != nil {
			return n, at, err
		}
		n += len(entries) / 3
		if !frozen {
			mv.after("precopy-page")
		}
		if v.Elems[0].Kind != resp.Bulk || len(v.Elems[0].Str) == 0 {
			return n, at, nil
		}
		// No rest after the last page: it would only let more writes
		// pile up for the next round or the final copy.
		if !frozen {
			if err := mv.rest(ctx); err != nil {
				return n, at, err
			}
		}
		cursor = v.Elems[0].Str
	}
}

// scan visits every key of ranges at group id, paced resting (PagePause)
// between pages: no listing runs in the hand-over's window. The
// destination's listing just before the hand-over is not paced: the
// source's writes meanwhile all go to the final copy, inside the window.
func (mv *Mover) scan(ctx context.Context, id GroupID, ranges string, paced bool, visit func(k []byte) error) error {
	var cursor []byte
	for page := 0; ; page++ {
		if page > 0 && paced {
			if err := mv.rest(ctx); err != nil {
				return err
			}
		}
		v, err := mv.dump(ctx, id, ranges, cursor, ^uint64(0)>>1, false)
		if err != nil {
			return err
		}
		for _, k := range v.Elems[2].Elems {
			if err := visit(k.Str); err != nil {
				return err
			}
		}
		if v.Elems[0].Kind != resp.Bulk || len(v.Elems[0].Str) == 0 {
			return nil
		}
		cursor = v.Elems[0].Str
	}
}

func (mv *Mover) dump(ctx context.Context, id GroupID, ranges string, cursor []byte, since uint64, frozen bool) (resp.Value, error) {
	f := "0"
	limit := mv.page()
	if frozen || since > 1<<61 {
		// The final copy and key listings return mostly keys: larger
		// pages, fewer round trips (in the window, for the final copy).
		limit *= 8
	}
	if frozen {
		f = "1"
	}
	v, err := mv.doBytes(ctx, [][]byte{[]byte("KEFIR.SLOTS"), []byte("DUMP"), []byte(strconv.FormatUint(uint64(id), 10)), []byte(ranges),
		cursor, []byte(strconv.Itoa(limit)), []byte(strconv.FormatUint(since, 10)), []byte(f)})
	if err != nil {
		return v, err
	}
	if v.Kind != resp.Array || len(v.Elems) != 4 {
		return v, fmt.Errorf("KEFIR.SLOTS DUMP: unexpected reply %v", v.Kind)
	}
	return v, nil
}

// load writes entries (triples) into group id, a page per LOAD; paced, it
// rests (PagePause) between pages (outside the hand-over's window only).
func (mv *Mover) load(ctx context.Context, id GroupID, entries [][]byte, paced bool) error {
	per := 3 * mv.page()
	for first := true; len(entries) > 0; first = false {
		if paced && !first {
			if err := mv.rest(ctx); err != nil {
				return err
			}
		}
		n := min(per, len(entries))
		args := append([][]byte{[]byte("KEFIR.SLOTS"), []byte("LOAD"), []byte(strconv.FormatUint(uint64(id), 10))}, entries[:n]...)
		if _, err := mv.doBytes(ctx, args); err != nil {
			return err
		}
		entries = entries[n:]
	}
	return nil
}

// SlotRunInfo is one run of a group's table as KEFIR.SLOTS TABLE lists it.
type SlotRunInfo struct {
	Start, End uint16
	State      string
	Peer       uint64
	Epoch      uint64
}

// Table returns group id's slot table as its leader holds it (empty: none).
func (mv *Mover) Table(ctx context.Context, id GroupID) ([]SlotRunInfo, error) {
	v, err := mv.do(ctx, "KEFIR.SLOTS", "TABLE", strconv.FormatUint(uint64(id), 10))
	if err != nil {
		return nil, fmt.Errorf("move-slots: group %d's slot table: %w", id, err)
	}
	var out []SlotRunInfo
	for _, r := range v.Elems {
		if len(r.Elems) != 5 {
			return nil, fmt.Errorf("move-slots: group %d's slot table: unexpected reply", id)
		}
		out = append(out, SlotRunInfo{Start: uint16(r.Elems[0].Int), End: uint16(r.Elems[1].Int), State: string(r.Elems[2].Str),
			Peer: uint64(r.Elems[3].Int), Epoch: uint64(r.Elems[4].Int)})
	}
	return out, nil
}

// uniform returns the one state every slot of in has in t (a move's slots
// are always in one state at a group).
func uniform(t []SlotRunInfo, in func(uint16) bool, id GroupID) (SlotRunInfo, error) {
	var got *SlotRunInfo
	for i := range t {
		r := t[i]
		for s := int(r.Start); s <= int(r.End); s++ {
			if !in(uint16(s)) {
				continue
			}
			if got == nil {
				got = &t[i]
			} else if !got.sameRow(r) {
				return SlotRunInfo{}, fmt.Errorf("move-slots: the slots are in several states at group %d (%s and %s): move them in parts", id, got.State, r.State)
			}
			break
		}
	}
	if got == nil {
		return SlotRunInfo{}, fmt.Errorf("move-slots: group %d lists none of the slots", id)
	}
	return *got, nil
}

// sameRow reports whether a and b are the same row of a slot table (state,
// peer, epoch), whatever their slots: Move takes a range only if it is one
// row at each group, and the rebalance planner cuts its runs where the row
// changes (as KEFIR.SLOTS TABLE lists them: one run per row).
func (a SlotRunInfo) sameRow(b SlotRunInfo) bool {
	return a.State == b.State && a.Peer == b.Peer && a.Epoch == b.Epoch
}

func maxEpoch(t []SlotRunInfo) uint64 {
	var e uint64
	for _, r := range t {
		e = max(e, r.Epoch)
	}
	return e
}

func (mv *Mover) page() int {
	if mv.Page > 0 {
		return mv.Page
	}
	return 1024
}

// rest sleeps PagePause, or the Pacer's pause (the rate limit), or until
// ctx ends.
func (mv *Mover) rest(ctx context.Context) error {
	d := mv.PagePause
	if mv.Pacer != nil {
		d = mv.Pacer.Pause()
	}
	if d <= 0 {
		return nil
	}
	return mv.clock().Sleep(ctx, d)
}

func (mv *Mover) logf(format string, args ...any) {
	if mv.Logf != nil {
		mv.Logf(format, args...)
	}
}

func (mv *Mover) after(step string) {
	if mv.AfterStep != nil {
		mv.AfterStep(step)
	}
}

// Ping reports whether the node at mv's first seed answers PING within
// RetryFor: a node of the map that placement may choose
// (PlanReplacePlaced) is one that is up. The whole call is bounded by
// RetryFor (when set), not only its retries: a node that accepts the
// connection and never answers (a stopped process) would otherwise hold
// it for the round trip's 10 s.
func (mv *Mover) Ping(ctx context.Context) error {
	if mv.RetryFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, mv.RetryFor)
		defer cancel()
	}
	_, err := mv.do(ctx, "PING")
	return err
}

func (mv *Mover) do(ctx context.Context, args ...string) (resp.Value, error) {
	return mv.doBytes(ctx, strArgs(args...))
}

func strArgs(args ...string) [][]byte {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	return bs
}

func (mv *Mover) retryFor() time.Duration {
	if mv.RetryFor == 0 {
		return 30 * time.Second
	}
	return mv.RetryFor
}

// doBytes sends one command to a seed and follows -MOVED to the group's
// leader; a failed connection, -UNAVAILABLE and -TRYAGAIN are retried
// (every step is idempotent) until RetryFor passes.
func (mv *Mover) doBytes(ctx context.Context, args [][]byte) (resp.Value, error) {
	return mv.doFor(ctx, mv.retryFor(), args)
}

// doFor is doBytes retrying for retryFor.
func (mv *Mover) doFor(ctx context.Context, retryFor time.Duration, args [][]byte) (resp.Value, error) {
	deadline := mv.clock().Now().Add(retryFor)
	pause := 20 * time.Millisecond
	var last error
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return resp.Value{}, err
		}
		if err := mv.renew(ctx, args); err != nil {
			return resp.Value{}, err
		}
		args := mv.fenced(args) // metamove.go
		addr := mv.Seeds[attempt%len(mv.Seeds)]
		for hops := 0; hops < 4; hops++ {
			v, err := mv.roundTrip(ctx, addr, args)
			if err != nil {
				last = err
				break
			}
			if v.Kind != resp.Error {
				mv.answeredBy = addr
				return v, nil
			}
			msg := string(v.Str)
			last = errors.New(msg)
			if strings.HasPrefix(msg, "MOVED ") {
				f := strings.Fields(msg)
				addr = f[len(f)-1]
				continue
			}
			if !strings.HasPrefix(msg, "UNAVAILABLE") && !strings.HasPrefix(msg, "TRYAGAIN") {
				return v, last
			}
			break
		}
		if mv.clock().Now().After(deadline) {
			return resp.Value{}, fmt.Errorf("%s: no leader answered within %v: %w", bytes.Join(args[:min(len(args), 2)], []byte(" ")), retryFor, last)
		}
		if err := mv.clock().Sleep(ctx, pause); err != nil {
			return resp.Value{}, err
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

func (mv *Mover) roundTrip(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
	if mv.Transport != nil {
		return mv.Transport(ctx, addr, args)
	}
	if mv.conns == nil {
		mv.conns = map[string]*moverConn{}
	}
	wait := 10 * time.Second
	if mv.rtTimeout > 0 {
		wait = mv.rtTimeout
	}
	c := mv.conns[addr]
	if c == nil {
		nc, err := net.DialTimeout("tcp", addr, min(2*time.Second, wait))
		if err != nil {
			return resp.Value{}, err
		}
		if mv.TLS != nil {
			nc = tls.Client(nc, mv.TLS)
		}
		c = &moverConn{nc: nc, rd: resp.NewReader(nc, 0)}
		if mv.Password != "" {
			_ = nc.SetDeadline(time.Now().Add(min(5*time.Second, wait)))
			if _, err := nc.Write(resp.AppendCommand(nil, []byte("AUTH"), []byte(mv.Password))); err != nil {
				nc.Close()
				return resp.Value{}, err
			}
			if v, err := c.rd.ReadValue(); err != nil || v.Kind == resp.Error {
				nc.Close()
				return resp.Value{}, fmt.Errorf("auth at %s: %s %v", addr, v.Str, err)
			}
		}
		mv.conns[addr] = c
	}
	_ = c.nc.SetDeadline(time.Now().Add(wait))
	// A held answer (a map poll) or a slow peer must not outlive ctx: its
	// end cuts the round trip (the connection is then dropped below).
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		// A cut that started (ctx ended, maybe just as the answer came)
		// could land on the next round trip: the connection goes.
		if !stop() && mv.conns[addr] == c {
			c.nc.Close()
			delete(mv.conns, addr)
		}
	}()
	if _, err := c.nc.Write(resp.AppendCommand(nil, args...)); err != nil {
		c.nc.Close()
		delete(mv.conns, addr)
		return resp.Value{}, err
	}
	v, err := c.rd.ReadValue()
	if err != nil {
		c.nc.Close()
		delete(mv.conns, addr)
		return resp.Value{}, err
	}
	// The next command may go on this connection while v is in use.
	return v.Clone(), nil
}

func (mv *Mover) close() {
	for a, c := range mv.conns {
		c.nc.Close()
		delete(mv.conns, a)
	}
}

// Close closes the Mover's connections (Move, Abort and Status close theirs
// when they return; a caller of other methods closes them here).
func (mv *Mover) Close() { mv.close() }
