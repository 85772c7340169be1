// Package chainmaster runs a chain's master (chain.Master) as a role on a
// node: it decides the chain's membership, which the chain never does
// itself (docs/design/chain.md, "On the replica host").
//
// Standalone (Config.Meta nil), the master is one process's role, not
// replicated: a node id outside the chain, on the same peer transport as
// the members (kefir chain-master; kefir server --chain-master). Hosted by
// the metadata group (below) it is replicated. What it does, either way:
//
//   - Failure detection by heartbeats, started by the members: every
//     member's host sends one every heartbeat interval; the master answers
//     a member of the chain with the configuration (head first), which
//     grants the member a lease of Lease from when it *sent* the heartbeat.
//     A member serves reads and takes writes only under its lease, so one
//     that the master gave up on stops by itself once the lease lapses. The
//     master declares a member failed (Master.Fail: CR_HEAD, CR_MID,
//     CR_TAIL) when it has heard nothing from it for FailAfter, which must
//     exceed Lease: by then the member's last lease has lapsed on any clock
//     that runs at about the master's rate. A member of the starting chain
//     that was never heard from is given StartGrace (10 s) instead.
//   - Re-sending: the links may drop a message, so every heartbeat tick
//     the master's core re-sends an order (a repair's, a join's, a
//     truncation's) unanswered for ResendAfter (chain.Master.Tick); the
//     members answer a repeat again without redoing it.
//   - Rejoin: a node outside the chain whose heartbeat says it is not a
//     replica (a restarted member holding its committed prefix, or a new
//     node) is joined just before the tail (Master.Join), one at a time. A
//     member of the chain whose heartbeat says so restarted before the
//     master noticed its silence: it is declared failed first.
//   - Master failure: the members' leases lapse and the chain stops serving
//     until the master is back. The master keeps its configuration in
//     memory only, so a (re)started master first learns: for up to
//     FailAfter it only listens to heartbeats — it answers none, joins
//     nobody, fails nobody — and adopts the newest configuration a member
//     reports (each heartbeat names its configuration's epoch: Learner)
//     at the highest epoch any member reports, if above its own (one
//     above it if no member reported the configuration of that epoch,
//     failing the members below it rather than leasing them:
//     Learner.Unheard); it ends early once every member of the
//     configuration it holds has reported none newer. It does not end, even
//     after FailAfter, while a member of the configured chain or of a
//     learnt configuration is silent (Learner.Waiting): that member may be
//     the only one that knows the newest configuration — a lone member
//     that answered writes at an epoch the others never heard of — and a
//     master acting without it would issue that epoch again (the host
//     simulation's AUSI D-D-M seed 548). The operator can end the wait
//     (Config.LearnWithout, RestartWithout). A restarted member forgot its
//     configuration but reports its history: one holding updates past
//     every running member's (Learner.Ahead) makes the master restart the
//     whole chain from the longest history rather than trust what it
//     learnt. The learning ends after FailAfter too if no member reported
//     as a replica at all: the whole chain's restart, which waits for
//     every member's report itself. Its
//     orders then carry an epoch above every member's it heard. The
//     members refuse a repair order or a heartbeat answer from an epoch
//     below their own, so a master still holding a stale configuration
//     can neither rewire the chain nor grant a lease. (Residual: a
//     configuration only members the operator forgoes, or nodes outside
//     every configuration heard, know is not learnt.) Replicating the
//     master is the metadata group's job: see "Hosted by the metadata
//     group" below.
//
// Hosted by the metadata group (Config.Meta; issue 30, docs/design/chain.md
// "The master"): every node of the metadata group runs a Master; only the
// one at the group's leader acts. The chain's configuration — members,
// epoch, joiner — is metadata-group state (kv.ChainConfig, one reserved
// record per chain), and:
//
//   - Commit before announce: whenever a decision changes the
//     configuration (Fail, Join, a flush, a truncation, an epoch bump) the
//     master commits it to the metadata group (KindMapChainSet,
//     compare-and-set on the epoch it last committed) before it sends any
//     of the decision's messages; if the commit fails it sends nothing and
//     stops acting (the decision is forgotten; a leader reloads the record).
//     Heartbeat answers carry the committed configuration only. So every
//     configuration a member ever hears of is in the record, and the next
//     leader, which starts from the record, decides above every epoch any
//     member holds.
//   - Leadership by lease: every Heartbeat the master reads the record with
//     a linearizable read at its node's replica, which succeeds only at the
//     leader under its leader lease. It grants member leases (answers
//     heartbeats) only within 2×Heartbeat of such a read.
//   - Taking over: a master that starts leading waits Lease + 2×Heartbeat
//     from its first successful read before it grants or fails anything,
//     then starts from the record (Master.NewMasterAt at its epoch; the
//     first chain's KindMapChainInit if there is none). The old leader's
//     last read preceded the new leader's first (VR's leader lease), its
//     last grant came within 2×Heartbeat after it, and a grant lasts Lease
//     from the member's heartbeat, sent before it: every lease an old
//     master granted has lapsed before the new one acts.
package chainmaster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/transport"
)

// Defaults. A member's host uses DefaultHeartbeat and DefaultLease too.
const (
	DefaultHeartbeat = 50 * time.Millisecond
	DefaultLease     = 500 * time.Millisecond
	DefaultFailAfter = time.Second
	// DefaultStartGrace is how long a member of the starting chain is
	// given to be heard from at all (processes starting on a loaded
	// machine), before FailAfter applies.
	DefaultStartGrace = 10 * time.Second
	// DefaultResendAfter is how long an order waits for its answer before
	// the master sends it again (10 heartbeat intervals by default).
	DefaultResendAfter = 500 * time.Millisecond
)

// Config configures a master.
type Config struct {
	// Self is the master's node id (outside the chain).
	Self uint64
	// Members is the chain to start from, head first.
	Members []uint64
	// Group is the chain's group id on the transport.
	Group uint64
	// Transport is the node's peer transport; every member must be a peer.
	Transport *transport.Transport
	// Heartbeat is how often the master checks for failures (default
	// DefaultHeartbeat); FailAfter how long a silent member is given
	// (default DefaultFailAfter; it must exceed the members' lease).
	Heartbeat, FailAfter time.Duration
	// StartGrace is how long a member of the starting chain that has not
	// been heard from yet is given (default DefaultStartGrace).
	StartGrace time.Duration
	// ResendAfter is how long an order (CR_HEAD, CR_MID, CR_TAIL,
	// PRECOPY, FLUSH, TRUNCATE) waits for its answer before the master
	// sends it again, rounded up to whole heartbeat intervals (default
	// DefaultResendAfter): the transport may drop a message, and a lost
	// order or answer would stall the reconfiguration (chain.Master.Tick).
	ResendAfter time.Duration
	Logger      *slog.Logger
	// Meta, if set, is this node's replica of the metadata group: the
	// master acts only while the node leads it, and the chain's
	// configuration lives there (the package comment, "Hosted by the
	// metadata group"). Nil: a standalone, unreplicated master.
	Meta Meta
	// Lease is the members' lease (default DefaultLease): a master taking
	// over the metadata group's leadership waits it out first.
	Lease time.Duration
	// As is the id the master speaks as and is addressed by (default
	// Self): hosted, the id every metadata node's master shares, which
	// the members know as their master (vrshard.ChainOptions.Master). It
	// must be outside the chain; Self then need not be.
	As uint64
	// Send, if set, sends the master's messages (the node's chain member's
	// endpoint, when the node is a member too and so holds the chain's
	// group on the transport); inbound messages then come through Deliver.
	// Nil: the master registers Group on Transport itself.
	Send func(to uint64, m *chain.Msg)
	// Mode is the chain's update mode (chain.Mode; kefir's --chain-mode),
	// the same on every member. A member whose heartbeats say another is
	// refused: it is not counted alive (so it is failed, or never joined)
	// and the answer tells it the chain's mode, which makes it stop
	// (vrshard's chain core). Every answer carries the mode.
	Mode chain.Mode

	// LearnWithout: members a standalone master does not wait for as it
	// learns the chain (Learner.Forgo; kefir chain-master --learn-without):
	// the operator's word that they are dead for good, given before it
	// starts — of the configured chain or of a configuration it will learn
	// — which holds for the whole-chain restart the learning may end in
	// (forgoLearnt). RestartWithout says the same to a master learning
	// already.
	LearnWithout []uint64

	mut mutations // deliberate bugs for tests
}

// mutations are deliberate bugs that tests switch on (internal/mutation).
type mutations struct {
	// learnSameEpoch: a learnt master starts at the highest epoch reported
	// even above the learnt configuration's (Learner.Config, the code
	// before review34c).
	learnSameEpoch bool
	// learnFromConfigured: a hosted master taking over learns from the
	// configured members, not the record (learnOver, the code before).
	learnFromConfigured bool
	// learnTrusts: a master whose learning found a configuration it could
	// not learn leases the members below it as any (Master.below, the
	// code before review34c).
	learnTrusts bool
	// learntFailsLate: a master whose learning found a configuration it
	// could not learn fails the members its learning heard below it only
	// on their next heartbeat, after it may have answered the others with
	// a configuration listing them (learnt, the code before review35a).
	learntFailsLate bool
	// learnEndsAtTimeout: a standalone master's learning ends after
	// FailAfter whoever it heard (the code before chain548): a member
	// silent through it may know a newer configuration, whose epochs the
	// master then issues again.
	learnEndsAtTimeout bool
	// learnIgnoresRestarted: a restarted member's report teaches the
	// learning nothing (Learner.Ahead; the code before chain548): one
	// that acknowledged updates the running members never got is joined
	// to them, and loses them.
	learnIgnoresRestarted bool
	// announceFirst sends a decision's messages before committing it to
	// the metadata group.
	announceFirst bool
	// grantAtOnce acts (grants leases, fails members) as soon as the
	// master leads, without waiting out the old master's leases.
	grantAtOnce bool
	// recordOnly starts a master that takes over from the record alone,
	// even when the members report an older configuration.
	recordOnly bool
	// noStallGrace: a master whose own ticks stalled counts the stall in
	// its members' silence (the code before stallGrace).
	noStallGrace bool
	// joinerFailAfter: a pre-copying joiner is failed after FailAfter of
	// silence, not StartGrace (the code before).
	joinerFailAfter bool
	// joinLeaving: a node the map wants out of the chain (Leaving) is
	// joined again when it asks, as any node that is not a replica.
	joinLeaving bool
	// growOnTop: a node wanted in always lengthens the chain, even one
	// that takes a failed member's place (the code before filled).
	growOnTop bool
	// joinUnmapped: a node that is not a node of the cluster map is
	// joined when it asks, as any node that is not a replica.
	joinUnmapped bool
}

// Meta is the metadata group as a hosted master uses it, at one node.
type Meta interface {
	// Read returns chain group's configuration (nil: none recorded) by a
	// linearizable read at this node's replica: it fails unless the node
	// leads the group under its leader lease.
	Read(ctx context.Context, group uint64) (*kv.ChainConfig, error)
	// Commit proposes op (KindMapChainInit, KindMapChainSet) at this
	// node's replica and returns once it is committed and applied; a
	// refused op is an error.
	Commit(ctx context.Context, op kv.Op) (kv.Result, error)
}

// MetaWants is implemented by a Meta whose metadata group is a cluster's,
// which keeps on each chain group's map entry the change an operator wants
// (kv.MapGroup's Joining and Leaving: KindMapChainWant). The master reads
// it at each leadership read, from the same replica: nodes joining are
// joined as any node that asks (the chain is kept one longer per joiner
// meanwhile, so a join truncates no one); a leaving member is failed once
// every joiner is linked in, after its last lease ran out; and a leaving
// node is never joined again. The map's Dropped gives the chain's length
// to a master that takes over (Want).
type MetaWants interface {
	Wants(group uint64) (Want, error)
}

// Want is a chain group's entry in the cluster map as the master reads it
// (MetaWants): the nodes wanted in (Joining) and out (Leaving), and the
// members failed without a wish whose places the chain keeps (Dropped);
// Nodes are the map's nodes, the only ones the master joins. Mapped: the
// map has the chain (none of it is known otherwise).
type Want struct {
	Joining, Leaving, Dropped, Nodes []uint64
	Mapped                           bool
}

// Master is a running master.
type Master struct {
	cfg Config
	now func() time.Time // the clock (time.Now; a test's own)
	ep  *transport.Endpoint
	// The inbound queue (Deliver): the members' messages in arrival
	// order, queued beats of them heartbeats; wake is signalled when it
	// turns non-empty.
	qmu   sync.Mutex
	queue []chain.Msg
	beats int
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}

	mu    sync.Mutex    // guards m and heard
	m     *chain.Master // nil: hosted and not acting (not the metadata leader, or waiting out the lease)
	heard map[uint64]time.Time
	lost  bool // "the chain is down" was logged
	paged bool // "every member that may hold it is paged" was logged
	// waitLogged: "the learning waits for members" was logged.
	waitLogged bool
	// learntWithout: the members the operator forwent as the master
	// learnt the chain (Learner.Forgo: --learn-without, RestartWithout)
	// and not heard since. The operator's word that they are dead for good
	// holds for the next whole-chain restart too (forgoLearnt): it waits
	// for every configured member otherwise, and a standalone master has
	// no other way to forgo one (no admin port).
	learntWithout map[uint64]bool
	// refused: nodes left out of a whole-chain restart whose join was
	// refused (chain.ForgoneError) and logged.
	refused map[uint64]bool
	// wrongMode: members whose heartbeats named another mode than the
	// chain's, with when that was last logged.
	wrongMode map[uint64]time.Time
	// lastTick is when the master last ticked while acting (stallGrace).
	lastTick time.Time
	// The map's wanted change (MetaWants), as of the last leadership
	// read; wanting: one was under way at the last tick (its end sets
	// the chain's length to what it became); length: the chain's length
	// when nothing is wanted (the configured members', then what the
	// last wanted change left); granted: when each member was last
	// granted a lease; draining: leaving members no longer granted one,
	// since when.
	joining, leaving []uint64
	// mapDropped, mapped: the map's Dropped of the chain and whether the
	// map has the chain, as of the last leadership read (the length at a
	// takeover: countFromMap); mapNodes: the map's nodes then.
	mapDropped, mapNodes []uint64
	mapped               bool
	wanting              bool
	length               int
	granted              map[uint64]time.Time
	draining             map[uint64]time.Time
	// target is the length the wanted changes lead to (countWant): length,
	// one more per node wanted in, one less per node wanted out, counted
	// once each (seenJoin, seenLeave; counted: the first count since this
	// master started acting is done).
	target              int
	seenJoin, seenLeave map[uint64]bool
	counted             bool
	// filled: nodes wanted in that take a failed member's place (the
	// chain was below target without them), which target does not count
	// again.
	filled map[uint64]bool

	// learnUntil: until when the master only learns the chain from the
	// heartbeats (zero once it has), with what it learnt.
	learnUntil time.Time
	learner    *Learner
	dropped    atomic.Uint64 // heartbeats Deliver dropped (maxQueuedBeats queued)
	// progress: what each member of the chain last reported (its epoch and
	// LU), which only grow while it keeps its history.
	progress map[uint64]progress
	// below: learning found a configuration at this epoch that no member
	// reported (Learner.Unheard; 0: none). A member of the chain reporting
	// an epoch below it may be one that configuration cut out, never told:
	// it is failed, not leased (step).
	below uint64

	// committed is the configuration members may hear of: the metadata
	// group's record (hosted), or what the master last announced.
	committed *kv.ChainConfig
	// Hosted: led is when the last leadership read started (zero: not
	// leading); actAt when a master that took over may act (zero: acting,
	// or not leading); reports the members' last heartbeats while it waits.
	led, actAt time.Time
	reports    map[chain.NodeID]chain.Msg
}

type progress struct{ epoch, lu uint64 }

// lostHistory reports whether heartbeat hb shows that its member went back
// from what it reported before (prev): it restarted without its history —
// a wiped disk started as a member of the initial chain (--bootstrap) — and
// holds less than updates it acknowledged. Granting it a lease would let
// it serve reads missing answered writes.
func lostHistory(prev progress, known bool, hb chain.Msg) bool {
	return known && (hb.Epoch < prev.epoch || hb.LU < prev.lu)
}

// Learner is what a (re)started master learns from the members'
// heartbeats before it acts (the package comment, "Master failure"): the
// newest configuration a member reports, and the highest epoch any member
// is at, above which the master's orders must be.
//
// A heartbeat reports the member's epoch (Epoch) and the configuration it
// last heard of (Members) with that configuration's epoch (ID, +1; 0: a
// member of a build before, whose configuration is taken to be at its
// epoch). The two differ: a member moves to a repair's epoch on a message
// from its new predecessor that names no configuration, and one that took
// a repair's order whose master failed before any heartbeat answer
// reports the order's configuration. Taking the members of the highest
// Epoch instead adopted a stale list at a new epoch — members a repair had
// cut out, granted leases again (the host simulation's AUSI D-Mb-D seed
// 299).
type Learner struct {
	members  []chain.NodeID
	cfgEpoch uint64 // the epoch of members
	epoch    uint64 // the highest any member reported
	reported map[chain.NodeID]uint64
	at       map[chain.NodeID]uint64 // each member's own epoch, as reported
	// need: every member of the configuration the learner started from
	// and of every configuration it learnt since — the members it waits
	// for (Waiting) unless forgone (Forgo). lu: the last update each
	// member running as a replica reported; restarted: the history's last
	// (LU) each restarted member reported (a "not a replica" heartbeat),
	// until it reports as a replica again (Ahead).
	need      map[chain.NodeID]bool
	forgone   map[chain.NodeID]bool
	lu        map[chain.NodeID]uint64
	restarted map[chain.NodeID]uint64
	// ignoreRestarted (-tags mutations): a restarted member's report
	// teaches nothing (Ahead is empty: the code before chain548).
	ignoreRestarted bool
	// sameEpoch (-tags mutations): Config's epoch is the highest reported
	// even above the learnt configuration's (the code before review34c).
	sameEpoch bool
}

// NewLearner starts from the configuration the master was given, at epoch 0.
func NewLearner(members []chain.NodeID) *Learner { return NewLearnerAt(members, 0) }

// NewLearnerAt starts from configuration members at epoch (a hosted
// master's record): only a newer one a member reports replaces it.
func NewLearnerAt(members []chain.NodeID, epoch uint64) *Learner {
	l := &Learner{members: slices.Clone(members), cfgEpoch: epoch, epoch: epoch, reported: map[chain.NodeID]uint64{},
		at: map[chain.NodeID]uint64{}, need: map[chain.NodeID]bool{}, forgone: map[chain.NodeID]bool{},
		lu: map[chain.NodeID]uint64{}, restarted: map[chain.NodeID]uint64{}}
	for _, id := range members {
		l.need[id] = true
	}
	return l
}

// Heard takes a member's heartbeat and reports whether what the master
// starts from changed: a newer configuration, or a higher epoch. A
// joiner's heartbeat (Refused) teaches nothing.
func (l *Learner) Heard(hb chain.Msg) bool {
	if hb.Type != chain.MsgHeartbeat {
		return false
	}
	if hb.Refused {
		// A restarted member: it forgot the configuration it was in, but
		// reports the history it holds, which Ahead compares.
		delete(l.lu, hb.From)
		l.restarted[hb.From] = hb.LU
		return false
	}
	delete(l.restarted, hb.From)
	l.lu[hb.From] = hb.LU
	cfgEpoch := hb.Epoch
	if hb.ID > 0 {
		cfgEpoch = hb.ID - 1
	}
	l.reported[hb.From] = cfgEpoch
	l.at[hb.From] = hb.Epoch
	changed := false
	if hb.Epoch > l.epoch {
		l.epoch, changed = hb.Epoch, true
	}
	// At one epoch a master holds two configurations if it truncated the
	// chain then: the old tail leaves at TRUNCATE_ACK, at the TRUNCATE's
	// epoch. The later is the earlier without its last member (no other
	// change leaves the epoch as it is, and a join never puts the joiner
	// last), so a proper prefix at the learnt epoch is the newer — if the
	// member said its configuration's epoch (a build before: guessed).
	truncated := hb.ID > 0 && cfgEpoch == l.cfgEpoch && cfgEpoch > 0 && len(hb.Members) > 0 &&
		len(hb.Members) < len(l.members) && slices.Equal(hb.Members, l.members[:len(hb.Members)])
	if (cfgEpoch > l.cfgEpoch || truncated) && len(hb.Members) > 0 {
		l.members, l.cfgEpoch, changed = slices.Clone(hb.Members), cfgEpoch, true
		for _, id := range hb.Members {
			l.need[id] = true
		}
	}
	return changed
}

// Done reports whether every member of the learnt configuration has
// reported a configuration no newer than it — nobody heard knows a newer
// one — and nobody is waited for (Waiting).
func (l *Learner) Done() bool {
	for _, id := range l.members {
		if e, ok := l.reported[id]; !l.forgone[id] && (!ok || e > l.cfgEpoch) {
			return false
		}
	}
	return len(l.Waiting()) == 0
}

// Waiting lists, in id order, the members the learning has not heard from
// and waits for: of the configuration it started from (the configured
// chain) and of every one it learnt, silent, and not forgone. Any of them
// may be the one member that knows the chain's newest configuration — a
// lone member at an epoch the others never heard of, which answered writes
// there (the host simulation's AUSI D-D-M seed 548): a master that starts
// without it issues that epoch and the ones below it again, and the chain
// takes other updates at the numbers that member acknowledged. A restarted
// member heard is not waited for: it forgot its configuration, but what it
// holds is what Ahead weighs.
func (l *Learner) Waiting() []chain.NodeID {
	var ids []chain.NodeID
	for id := range l.need {
		_, replica := l.reported[id]
		_, restarted := l.restarted[id]
		if !replica && !restarted && !l.forgone[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Ahead lists, in id order, the restarted members (of the configured chain
// or a learnt configuration) whose history ends above the last update of
// every member running as a replica: each may be a member the others were
// cut out of the chain by, which then acknowledged the updates past theirs
// (sequence numbers are history order across epochs: a head numbers above
// every earlier head, chain.Msg). The learnt configuration cannot be
// trusted then — a master acting on it leases the members cut out, and
// the restarted one is joined to them and loses those updates — so the
// master restarts the whole chain instead (Master.learnt): it fails every
// member, which makes the running ones report their histories as
// restarted ones do, and restarts from the longest
// (chain.Master.Restarted). None if no member is running (that is such a
// restart already). A head's updates not passed on yet look the same and
// cost the same restart: taking them as committed is a valid outcome.
func (l *Learner) Ahead() []chain.NodeID {
	if len(l.lu) == 0 || mutation.On && l.ignoreRestarted {
		return nil
	}
	top := slices.Max(slices.Collect(maps.Values(l.lu)))
	var ids []chain.NodeID
	for id, lu := range l.restarted {
		if l.need[id] && lu > top {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Over reports whether a learning whose time (FailAfter) is up may end:
// nobody is waited for (Waiting), or no member at all was heard as a
// replica — every member down or restarted, the whole chain's restart, in
// which the master leases nobody and restarts the chain only once every
// member that may hold its history has reported (chain.Master.Restarted).
// Otherwise it goes on: a member heard is leased on what the learning
// found, which a silent one may know to be stale. That is the price of a
// master that keeps nothing: restarted with a member dead for good, or cut
// off from it, it waits for that member or for the operator (Forgo:
// Config.LearnWithout, Master.RestartWithout).
func (l *Learner) Over() bool {
	return len(l.Waiting()) == 0 || len(l.lu) == 0
}

// forgoBefore is Forgo said before the learning started (Config.LearnWithout):
// n need not be waited for yet — a member of a configuration still to be
// learnt, which the operator knows and the master does not.
func (l *Learner) forgoBefore(n chain.NodeID) { l.forgone[n] = true }

// Forgo stops waiting for member n (the operator's; Master.RestartWithout):
// whatever configuration it alone knew, and the updates it alone
// acknowledged, are given up. It reports whether n was waited for.
func (l *Learner) Forgo(n chain.NodeID) bool {
	if !slices.Contains(l.Waiting(), n) {
		return false
	}
	l.forgone[n] = true
	return true
}

// Config is the learnt configuration (head first) and the epoch the master
// starts at: the highest any member reported (its next order is above it)
// — one above it if a member is at an epoch above the learnt
// configuration's.
//
// Such a member moved to its epoch on a message from a new predecessor: the
// old master made a configuration at that epoch which no member heard
// reports (one that knows it — the predecessor, ordered — stayed silent
// through the learning), and the learnt configuration, older, is not it.
// Answering at that epoch would put a second configuration at it, which a
// member holding the first takes over its own (a heartbeat answer at its
// configuration's epoch or later: vrshard chainCore.heartbeatAnswer) and a
// later master cannot tell from it: a learner takes the first it hears at
// one epoch, or a proper prefix for a truncation's; a hosted master finds a
// member holding the record's epoch with another configuration no
// decision left unannounced, and does not rewire from it (review34c). One
// above, the master's configuration is the only one at its epoch, and a
// member that reports the old master's from below it is rewired as any
// that never heard the record's (Master.lead). A truncation's prefix, at
// the learnt configuration's own epoch, changes nothing here. What stays
// open is the residual of the package comment: a silent member may know a
// configuration above every epoch heard, which this one may then share.
func (l *Learner) Config() ([]chain.NodeID, uint64) {
	e := max(l.epoch, l.cfgEpoch)
	if l.Unheard() > 0 && !(mutation.On && l.sameEpoch) {
		e++
	}
	return slices.Clone(l.members), e
}

// Unheard is the epoch of a configuration the learning found and could not
// learn (0: none): a member is at an epoch above the learnt configuration's
// (Config). The members below it may be ones that configuration cut out:
// the master fails them rather than lease them (Master.below).
func (l *Learner) Unheard() uint64 {
	if l.epoch > l.cfgEpoch {
		return l.epoch
	}
	return 0
}

// Below lists the members of the learnt configuration heard at an epoch
// below Unheard's (none if nothing is unheard), in id order: the master
// fails them as it starts (Master.failBelow).
func (l *Learner) Below() []chain.NodeID {
	u := l.Unheard()
	var ids []chain.NodeID
	for _, id := range l.members {
		if e, ok := l.at[id]; ok && e < u {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Start registers the master on the transport and runs it until Close.
func Start(cfg Config) (*Master, error) {
	x, err := newMaster(cfg, time.Now)
	if err != nil {
		return nil, err
	}
	if x.cfg.Send == nil {
		ep, err := x.cfg.Transport.Register(x.cfg.Group, frame.EngineChain, x.deliver, nil)
		if err != nil {
			return nil, fmt.Errorf("chainmaster: group %d: %w", x.cfg.Group, err)
		}
		x.ep = ep
	}
	go x.run()
	return x, nil
}

// NewStepped is a master that runs no goroutine: its caller hands it the
// members' messages (Step) and its ticks (Tick) on one goroutine, on the
// caller's clock now — the deterministic simulator's (internal/vrshard's
// host simulation runs chains with it) — where Start's goroutine takes them
// from the transport and a ticker on time.Now. It is the same master, every
// decision (when a member is failed, a joiner given up on, an order sent
// again, a restart made) its step and tick: only the driver differs.
// Config.Send carries its messages (Transport is not used).
func NewStepped(cfg Config, now func() time.Time) (*Master, error) {
	if cfg.Send == nil {
		return nil, fmt.Errorf("chainmaster: node %d: a stepped master needs Config.Send", cfg.Self)
	}
	return newMaster(cfg, now)
}

// Step takes members' messages, as the running master takes what Deliver
// queued (a stepped master's; NewStepped).
func (x *Master) Step(msgs []chain.Msg) { x.step(msgs) }

// Tick is the master's tick on its clock, which the running master takes
// every Heartbeat from its ticker (a stepped master's; NewStepped).
func (x *Master) Tick() { x.tick(x.now()) }

// newMaster is a master that is not running yet, on clock now: Start runs
// it; NewStepped's caller, or a test, drives its step and tick itself, on
// a clock of its own.
func newMaster(cfg Config, now func() time.Time) (*Master, error) {
	if cfg.As == 0 {
		cfg.As = cfg.Self
	}
	if (cfg.Transport == nil && cfg.Send == nil) || cfg.Self == 0 || len(cfg.Members) == 0 || slices.Contains(cfg.Members, cfg.As) {
		return nil, fmt.Errorf("chainmaster: node %d mastering chain %v as %d: need a transport and an id outside the chain", cfg.Self, cfg.Members, cfg.As)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.FailAfter <= 0 {
		cfg.FailAfter = DefaultFailAfter
	}
	if cfg.StartGrace < cfg.FailAfter {
		cfg.StartGrace = max(DefaultStartGrace, cfg.FailAfter)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.FailAfter <= cfg.Lease {
		// A member failed before its last lease lapsed could still serve
		// while the chain is repaired around it.
		return nil, fmt.Errorf("chainmaster: node %d: the failure timeout %v must exceed the members' lease %v", cfg.Self, cfg.FailAfter, cfg.Lease)
	}
	ids := nodeIDs(cfg.Members)
	if cfg.ResendAfter <= 0 {
		cfg.ResendAfter = DefaultResendAfter
	}
	x := &Master{cfg: cfg, now: now, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		heard: map[uint64]time.Time{}, refused: map[uint64]bool{}, wrongMode: map[uint64]time.Time{},
		learnUntil: now().Add(cfg.FailAfter), learner: NewLearner(ids),
		progress: map[uint64]progress{}, committed: &kv.ChainConfig{Group: cfg.Group, Members: slices.Clone(cfg.Members)},
		length: len(cfg.Members), granted: map[uint64]time.Time{}, draining: map[uint64]time.Time{},
		seenJoin: map[uint64]bool{}, seenLeave: map[uint64]bool{}, filled: map[uint64]bool{}}
	x.m = x.newCore(ids, 0)
	x.learner.sameEpoch = mutation.On && cfg.mut.learnSameEpoch
	x.learner.ignoreRestarted = mutation.On && cfg.mut.learnIgnoresRestarted
	for _, id := range cfg.LearnWithout {
		// Any id, not only a configured member: one that joined since the
		// operator wrote --members is waited for once a learnt
		// configuration names it (TestLearnWithoutAMemberOfALearntConfiguration).
		x.learner.forgoBefore(chain.NodeID(id))
		cfg.Logger.Warn("chain master: it learns the chain without a member (--learn-without): a configuration only it knew, and writes only it acknowledged, may be lost",
			"node", id, "configured", slices.Contains(cfg.Members, id))
	}
	if cfg.Meta != nil {
		// The record is the configuration: nothing to learn, and nothing
		// to do until this node leads the metadata group.
		x.m, x.learnUntil, x.learner, x.committed = nil, time.Time{}, nil, nil
	}
	// Silence counts from the start plus the grace: a member is failed
	// StartGrace after the start if it never answers.
	grace := now().Add(cfg.StartGrace - cfg.FailAfter)
	for _, id := range cfg.Members {
		x.heard[id] = grace
	}
	return x, nil
}

// Close stops the master.
func (x *Master) Close() {
	select {
	case <-x.stop:
	default:
		close(x.stop)
	}
	<-x.done
	if x.ep != nil {
		x.ep.Close()
	}
}

// Members is the chain as the master last configured it, head first: the
// committed configuration's (nil: hosted and not acting).
func (x *Master) Members() []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.committed == nil {
		return nil
	}
	return slices.Clone(x.committed.Members)
}

// deliver decodes a batch on the transport's reader and queues it.
func (x *Master) deliver(from uint64, in []frame.Message) error {
	msgs, err := chainwire.Decode(from, x.cfg.As, in)
	if err != nil {
		return err
	}
	x.Deliver(msgs)
	return nil
}

// maxQueuedBeats bounds the heartbeats waiting in the master's queue:
// seconds of them from a chain of a few members.
const maxQueuedBeats = 1024

// Deliver queues members' messages to the master (decoded and checked by
// the caller: each From the member that sent it). With Config.Send it is
// how they arrive. It never waits: it runs on a transport reader (the
// connection's, shared by every group on it) or a member's driver, which a
// master busy with a slow leadership read or commit must not stall. When
// maxQueuedBeats heartbeats are queued a heartbeat is dropped — the next
// one comes a heartbeat interval later. Every other message is queued: an
// answer to an order (CR_*_DONE, PRECOPY_DONE, FLUSH_ACK, TRUNCATE_ACK)
// is never sent again, and the master, which does not resend orders,
// would wait for it for ever (Busy: no join, no rejoin). They are as few
// as the orders the master sent. One queue keeps the arrival order: a
// joiner's heartbeats from before it became a replica precede its
// FLUSH_ACK.
func (x *Master) Deliver(msgs []chain.Msg) {
	x.qmu.Lock()
	for i := range msgs {
		if msgs[i].Type == chain.MsgHeartbeat {
			if x.beats >= maxQueuedBeats {
				x.dropped.Add(1)
				continue
			}
			x.beats++
		}
		x.queue = append(x.queue, msgs[i])
	}
	x.qmu.Unlock()
	select {
	case x.wake <- struct{}{}:
	default: // already signalled
	}
}

func (x *Master) run() {
	defer close(x.done)
	t := time.NewTicker(x.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-x.stop:
			return
		case <-x.wake:
			x.qmu.Lock()
			msgs := x.queue
			x.queue, x.beats = nil, 0
			x.qmu.Unlock()
			x.step(msgs)
		case <-t.C:
			// The tick only triggers: its time is when it fired, stale
			// after a stall (lead).
			x.tick(x.now())
		}
	}
}

func (x *Master) step(msgs []chain.Msg) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		// Hosted, not acting: another node's master, or none yet. While it
		// waits to act it notes what configuration each member holds.
		if !x.actAt.IsZero() {
			for _, msg := range msgs {
				if msg.Type == chain.MsgHeartbeat && !msg.Refused && len(msg.Members) > 0 {
					msg.Members = slices.Clone(msg.Members)
					x.reports[msg.From] = msg
				}
			}
		}
		return
	}
	now := x.now()
	for _, msg := range msgs {
		if msg.Type != chain.MsgHeartbeat {
			if msg.Type == chain.MsgFlushAck && msg.Refused && msg.From == x.m.Joiner() {
				// Its "not a replica" heartbeats do not tell (a joiner's
				// never do); the core aborts the join on this answer.
				x.cfg.Logger.Warn("chain master: the joiner restarted during its flush: join aborted, it is joined again", "node", uint64(msg.From))
			}
			x.m.Step(msg)
			continue
		}
		from := uint64(msg.From)
		if x.otherMode(msg, now) {
			continue
		}
		// Heard: not dead for good after all (forgoLearnt). (A forgone
		// member heard while the chain is down is a candidate again in
		// chain.Master.Restarted anyway.)
		delete(x.learntWithout, from)
		if !x.learnUntil.IsZero() {
			x.learn(msg, now)
			continue
		}
		if msg.Refused && x.m.Down() {
			x.restarted(msg, now)
			continue
		}
		if x.m.Down() {
			// A replica still running while the master counts every member
			// failed (it fell silent past FailAfter): it gets no lease —
			// the chain may restart from another member — and hears that it
			// is out, so its /status says so; restarted, it reports.
			x.outside(msg)
			continue
		}
		if msg.Refused && msg.From == x.m.Restarting() {
			// The member ordered to restart the chain, before it took the
			// order: not a new restart.
			x.heard[from] = now
			continue
		}
		members := x.m.Members()
		if slices.Contains(members, msg.From) && msg.Refused && msg.From != x.m.Joiner() {
			// A member that says it is not a replica restarted (faster than
			// FailAfter: kefir up restarts a killed node in half a second)
			// and lost its place: its old incarnation failed. It is joined
			// again on a later heartbeat. (A joiner's heartbeats sent before
			// it became a replica arrive before its flush-ack, on the same
			// link, while it is still the joiner.)
			x.cfg.Logger.Warn("chain master: member restarted", "node", from)
			x.m.Fail(msg.From)
			delete(x.heard, from)
			delete(x.progress, from)
			if x.m.Down() {
				// It was the last: this heartbeat is its report.
				x.restarted(msg, now)
			}
			continue
		}
		if slices.Contains(members, msg.From) {
			if msg.Epoch < x.below && !(mutation.On && x.cfg.mut.learnTrusts) {
				// Perhaps cut out by the configuration at below, which
				// the master never learnt (its old incarnation's, known
				// only to a member silent through the learning): leased
				// by the learnt, older configuration, it would serve
				// reads the chain's writes no longer reach. Failed, it
				// rejoins holding its history (review34c). (One heard
				// below during the learning was failed as it ended.)
				x.failBelow(msg.From, msg.Epoch)
				continue
			}
			if p, ok := x.progress[from]; lostHistory(p, ok, msg) {
				x.cfg.Logger.Error("chain master: member lost its history (a wiped disk restarted as a member?): failed; restart it without --bootstrap to rejoin",
					"node", from, "epoch", msg.Epoch, "lu", chain.FormatSeq(msg.LU), "was epoch", p.epoch, "was lu", chain.FormatSeq(p.lu))
				x.m.Fail(msg.From)
				delete(x.heard, from)
				delete(x.progress, from)
				continue
			}
			x.progress[from] = progress{msg.Epoch, msg.LU}
			x.heard[from] = now
			x.grant(msg, now)
			continue
		}
		if msg.From == x.m.Joiner() {
			x.heard[from] = now
			continue
		}
		if !msg.Refused {
			// A replica the chain no longer includes (failed while it was
			// alive: slow, paused, cut off): the answer names the chain
			// without it, which grants no lease and lets it say on /status
			// that it is out (vrshard's chain core: "removed").
			x.grant(msg, now)
			continue
		}
		if slices.Contains(x.leaving, from) && !(mutation.On && x.cfg.mut.joinLeaving) {
			// The map wants it out (kefir cluster replace-node,
			// remove-node): it was failed on purpose, and its member,
			// told so, asks to join like a restarted one. Never again:
			// its node retires the member once the record leaves it out.
			if !x.refused[from] {
				x.refused[from] = true
				x.cfg.Logger.Info("chain master: join refused: the cluster map removes the node from the chain", "node", from)
			}
			continue
		}
		if x.unmapped(from) && !(mutation.On && x.cfg.mut.joinUnmapped) {
			// Not a node of the cluster map: taken out of it (kefir
			// cluster remove-node) after it left the chain — the map's
			// Leaving, which kept it out, went with it — and back on its
			// old directory, its member never retired. Joined, it would
			// make the chain one longer than its length, so the flush
			// would truncate the live tail, and the map, which names
			// only its nodes, would stop following the chain's record.
			// (A map without a node list, an older build's, knows its
			// nodes by their groups only: no node is refused by it, and
			// no node leaves such a map.)
			if !x.refused[from] {
				x.refused[from] = true
				x.cfg.Logger.Info("chain master: join refused: the node is not a node of the cluster map", "node", from)
			}
			continue
		}
		// What it holds: a node left out of a whole-chain restart
		// (RestartWithout) is joined only if it holds no more than the
		// chain restarted from.
		x.m.Restarted(msg.From, msg.LU, int(msg.LA), msg.Any)
		if !x.m.Busy() {
			// A node outside the chain that is not a replica: a restarted
			// member (or a new node) waiting to be joined.
			if err := x.m.Join(msg.From, len(members)); err != nil {
				var fe *chain.ForgoneError
				if !errors.As(err, &fe) || !x.refused[from] {
					x.cfg.Logger.Warn("chain master: join refused", "node", from, "err", err)
				}
				if fe != nil {
					x.refused[from] = true // said once, not every heartbeat
				}
				continue
			}
			delete(x.refused, from)
			x.heard[from] = now
			x.cfg.Logger.Info("chain master: joining", "node", from, "members", members)
		}
	}
	x.flush()
}

// restarted takes the heartbeat of a restarted member (not a replica) while
// every member of the chain has failed: what it holds (LU, and its
// history's length in LA; Any: its host holds pages of a snapshot it had not
// finished taking, no history's state) is its report to the core, which
// restarts the chain from the longest history once every member that may
// hold it has reported (chain.Master.Restarted). The chain then has one member; the
// others are joined to it as any restarted member.
func (x *Master) restarted(hb chain.Msg, now time.Time) {
	if !x.m.Restarted(hb.From, hb.LU, int(hb.LA), hb.Any) {
		if x.m.Paged() && !x.paged {
			// Nothing else tells the operator why the chain stays down
			// with every member reported (Awaited is empty).
			x.paged = true
			x.cfg.Logger.Error("chain master: every member that may hold the chain's history restarted holding pages of a snapshot it had not finished taking (a crash mid state transfer): "+
				"none holds a consistent state, and the chain stays down; restarting one on an empty directory restarts the chain from nothing (docs/chain.md)",
				"members", x.m.Members())
		}
		return
	}
	x.paged = false
	for _, id := range x.m.Members() {
		x.heard[uint64(id)] = now // it reported just now, or as good as (the last report completed the set)
	}
	x.lost = false
	x.cfg.Logger.Warn("chain master: restarting the chain from the member holding the longest durable history",
		"node", uint64(hb.From), "members", x.m.Members(), "epoch", x.m.Epoch())
}

// ErrNotActing is RestartWithout's answer at a master that does not act:
// hosted and not at the metadata group's leader (or still waiting out the
// old master's leases). (A standalone master still learning the chain
// takes it as the word to stop waiting for the members named: learnWithout.)
var ErrNotActing = errors.New("chainmaster: this master does not act (not the metadata group's leader, or taking over): ask the leader's")

// RestartWithout is the operator's way out of a whole-chain restart that
// waits for members that may never come back (chain.Master.Forgo): the
// chain restarts from the longest history among the other members as soon
// as they have all reported — at once if they have. It returns what
// happened, for the operator: whom the restart still waits for, or whom it
// restarted from, and what may be lost (the updates acknowledged last, if a
// member left out held them). A member left out that comes back holding
// more than the chain restarted from is not joined until it restarts on an
// empty directory (its log says so).
func (x *Master) RestartWithout(ids []uint64) (string, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m != nil && !x.learnUntil.IsZero() {
		return x.learnWithout(ids)
	}
	if x.m == nil {
		return "", ErrNotActing
	}
	if !x.m.Down() {
		return "", fmt.Errorf("chainmaster: the chain %v is not down: nothing to restart", x.m.Members())
	}
	restarted := false
	for _, id := range ids {
		ok, err := x.m.Forgo(chain.NodeID(id))
		if err != nil {
			x.flush()
			return "", err
		}
		x.cfg.Logger.Warn("chain master: the operator restarts the chain without a member: acknowledged writes only it held may be lost", "node", id)
		restarted = restarted || ok
	}
	if !restarted {
		x.flush()
		if x.m.Paged() {
			return fmt.Sprintf("the chain stays down without %v: every other member that may hold its history restarted holding pages of a snapshot it had not finished taking, "+
				"no consistent state; restarting one on an empty directory restarts the chain from nothing", ids), nil
		}
		return fmt.Sprintf("the chain restarts without %v once %v report (they have not restarted yet); "+
			"the writes acknowledged last are lost if only %v held them", ids, x.m.Awaited(), ids), nil
	}
	now := x.now()
	from := x.m.Members()[0]
	x.heard[uint64(from)] = now
	x.lost = false
	x.cfg.Logger.Warn("chain master: restarting the chain without the members the operator named, from the longest durable history of the others",
		"without", ids, "from", uint64(from), "epoch", x.m.Epoch())
	x.flush()
	if x.m == nil {
		return "", errors.New("chainmaster: the restart could not be recorded in the metadata group (this master stopped acting): try again")
	}
	return fmt.Sprintf("the chain restarted from node %d, the longest durable history without %v; "+
		"the writes acknowledged last are lost if only %v held them. Restarted, %v rejoin if they hold nothing more than node %d did; "+
		"otherwise they are refused until restarted on an empty directory", from, ids, ids, ids, from), nil
}

// learnWithout is RestartWithout at a standalone master still learning the
// chain (Learner.Waiting): it stops waiting for ids, and acts once its
// learning time is up and it waits for nobody else. What it may cost is
// RestartWithout's: a configuration only they knew (the master may issue
// its epochs again) and the writes only they acknowledged.
func (x *Master) learnWithout(ids []uint64) (string, error) {
	for _, id := range ids {
		if !slices.Contains(x.learner.Waiting(), chain.NodeID(id)) {
			return "", fmt.Errorf("chainmaster: learning without %d: not among the members the learning waits for (%v)", id, x.learner.Waiting())
		}
	}
	for _, id := range ids {
		x.learner.Forgo(chain.NodeID(id))
		x.cfg.Logger.Warn("chain master: the operator ends the learning without a member: a configuration only it knew, and writes only it acknowledged, may be lost", "node", id)
	}
	if w := x.learner.Waiting(); len(w) > 0 {
		return fmt.Sprintf("the master still waits to hear %v before it acts", w), nil
	}
	if !x.learner.Done() && x.now().Before(x.learnUntil) {
		return fmt.Sprintf("the master acts without %v once its learning time is up; the writes acknowledged by %v alone are lost if they held any", ids, ids), nil
	}
	x.learnt()
	x.flush()
	return fmt.Sprintf("the master acts without %v on the chain %v at epoch %d; the writes acknowledged by %v alone are lost if they held any",
		ids, x.m.Members(), x.m.Epoch(), ids), nil
}

// otherMode refuses heartbeat hb if it names an update mode other than the
// chain's (a member started with another --chain-mode): not heard — a
// member of the chain is failed after FailAfter and repaired around, a
// joiner never joined — and answered with the chain's mode and no
// configuration, which makes the member stop serving and say why. A chain
// whose members disagree on the mode would answer updates under one rule
// and acknowledge them under another (an AU head answers what an SU tail
// has not stored). A heartbeat that names no mode (0) is from a member
// that predates modes: SU, checked by the member against the answer.
func (x *Master) otherMode(hb chain.Msg, now time.Time) bool {
	m, ok := chain.ModeFromWire(hb.Token)
	if !ok || m == x.cfg.Mode {
		return false
	}
	from := uint64(hb.From)
	if now.Sub(x.wrongMode[from]) >= 5*time.Second {
		x.wrongMode[from] = now
		x.cfg.Logger.Error("chain master: member runs another update mode than the chain: refused (restart it with the chain's --chain-mode)",
			"node", from, "member mode", m.String(), "chain mode", x.cfg.Mode.String())
	}
	x.send(chain.Msg{Type: chain.MsgHeartbeat, To: hb.From, Seq: hb.Seq, Epoch: x.committed.Epoch, Refused: true, Token: x.cfg.Mode.Wire()})
	return true
}

// outside answers hb's heartbeat with the configuration without its sender,
// which grants nothing and tells it that it is out of the chain.
func (x *Master) outside(hb chain.Msg) {
	var ms []chain.NodeID
	for _, id := range x.committed.Members {
		if chain.NodeID(id) != hb.From {
			ms = append(ms, chain.NodeID(id))
		}
	}
	x.send(chain.Msg{Type: chain.MsgHeartbeat, To: hb.From, Seq: hb.Seq, Epoch: x.committed.Epoch, Members: ms, Token: x.cfg.Mode.Wire()})
}

// grant answers member hb's heartbeat with the committed configuration,
// which grants it a lease if it is a member there (a member takes a lease
// only from an answer that lists it) — only while this master
// may grant: hosted, within 2×Heartbeat of a leadership read.
func (x *Master) grant(hb chain.Msg, now time.Time) {
	if x.cfg.Meta != nil && now.Sub(x.led) >= 2*x.cfg.Heartbeat {
		return
	}
	if _, ok := x.draining[uint64(hb.From)]; ok {
		// Leaving: no new lease, so the one it holds runs out before it
		// is failed (followWant) — a member failed under a lease would
		// serve reads the chain's writes no longer reach.
		return
	}
	if slices.Contains(x.committed.Members, uint64(hb.From)) {
		x.granted[uint64(hb.From)] = now
	}
	ms := nodeIDs(x.committed.Members)
	x.send(chain.Msg{Type: chain.MsgHeartbeat, To: hb.From,
		Seq: hb.Seq, Epoch: x.committed.Epoch, Members: ms, Token: x.cfg.Mode.Wire()})
}

// config is the master's configuration as the metadata group records it.
func (x *Master) config() *kv.ChainConfig {
	c := &kv.ChainConfig{Group: x.cfg.Group, Epoch: x.m.Epoch(), Joiner: uint64(x.m.Joiner())}
	for _, id := range x.m.Members() {
		c.Members = append(c.Members, uint64(id))
	}
	return c
}

// lead is a hosted master's leadership check, every tick: a linearizable
// read of the record at this node's replica. It reports whether the master
// acts now, taking over (after waiting out the lease) or stopping as the
// read says, and the time the read started, which is the master's "now"
// for the rest of the tick.
//
// The read's start, not the tick's time, dates the leadership: a Go ticker
// hands back when it fired, which after a stall of the master's goroutine
// (a slow read or commit, a loaded machine) is hundreds of milliseconds
// old. Dating led or actAt from it would shorten the takeover wait, which
// must run from no earlier than the first successful read: the old
// leader's last read preceded that one, not the stale tick.
func (x *Master) lead() (bool, time.Time) {
	start := x.now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*x.cfg.Heartbeat)
	cc, err := x.cfg.Meta.Read(ctx, x.cfg.Group)
	cancel()
	now := start
	if err != nil || (cc == nil && x.m != nil) {
		if x.m != nil || !x.actAt.IsZero() {
			x.cfg.Logger.Info("chain master: not the metadata group's leader (any more): passive", "err", err)
		}
		x.passive()
		return false, now
	}
	x.led = now
	x.readWants()
	if x.m != nil {
		if !cc.Equal(x.committed) {
			// Someone else changed the record: this master's state is not
			// the chain's. Start over from the record.
			x.cfg.Logger.Warn("chain master: the record changed under the master: taking over again", "record", cc.Members, "epoch", cc.Epoch)
			x.passive()
		}
		return x.m != nil, now
	}
	if x.actAt.IsZero() {
		x.reports = map[chain.NodeID]chain.Msg{}
		x.actAt = now.Add(x.cfg.Lease + 2*x.cfg.Heartbeat)
		if mutation.On && x.cfg.mut.grantAtOnce {
			x.actAt = now
		}
		x.cfg.Logger.Info("chain master: leading the metadata group: waiting out the old master's leases", "until", x.actAt)
		return false, now
	}
	if now.Before(x.actAt) {
		return false, now
	}
	// The members may be ahead of the record: none recorded (the
	// metadata group's directories wiped, or the chain ran with a
	// standalone master before), or a record older than what a master
	// since announced. A member refuses a heartbeat answer or an order
	// from an epoch below its own, so a master starting from the record
	// would never grant a lease: it records the newest configuration a
	// member reports, at the highest epoch reported, first (a Learner of
	// the reports, in node order).
	hiMembers, hiEpoch, unheard, below := x.learnOver(cc)
	adopted := hiEpoch > 0 && (cc == nil || hiEpoch > cc.Epoch)
	// starting: this master records the chain's first configuration, so
	// its members may be starting too.
	starting := cc == nil && !adopted
	if adopted || cc == nil {
		rec := &kv.ChainConfig{Group: x.cfg.Group, Members: slices.Clone(x.cfg.Members)}
		op := kv.Op{Kind: kv.KindMapChainInit}
		if adopted {
			rec = &kv.ChainConfig{Group: x.cfg.Group, Epoch: hiEpoch}
			for _, id := range hiMembers {
				rec.Members = append(rec.Members, uint64(id))
			}
			x.cfg.Logger.Warn("chain master: the members are ahead of the record: recording the newest configuration a member reports",
				"record", cc, "members", rec.Members, "epoch", rec.Epoch)
			if cc != nil {
				op = kv.Op{Kind: kv.KindMapChainSet, Delta: int64(cc.Epoch), Expected: kv.AppendChainConfig(nil, cc)}
			}
		}
		op.Key = kv.AppendChainConfig(nil, rec)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := x.cfg.Meta.Commit(ctx, op)
		if err == nil {
			cc, err = x.cfg.Meta.Read(ctx, x.cfg.Group)
		}
		cancel()
		if err != nil || cc == nil {
			x.cfg.Logger.Warn("chain master: record the chain", "record", rec.Members, "epoch", rec.Epoch, "err", err)
			return false, now
		}
		// The map followed the record just written (its members, and the
		// places that left: Dropped), which countFromMap counts.
		x.readWants()
	}
	ids := nodeIDs(cc.Members)
	// The record's joiner is not resumed: its pre-copy or flush is the old
	// master's, unknown here. It is outside the chain (or a member that
	// says it is not a replica, failed on its heartbeat) and is joined
	// again when it asks.
	//
	// A member of the record that reports an older epoch and another
	// configuration never heard the record's: the old master committed it
	// and died before announcing it (all of it, or to everyone). The chain
	// is then wired as that member's configuration says, so the master
	// starts from it (the oldest reported) at the record's epoch and fails
	// anew every member the record dropped: the repair's orders, committed
	// at a new epoch, rewire the chain as recorded. An older epoch alone
	// says nothing: a repair orders only the members whose links change,
	// and the others hear the new configuration in heartbeat answers at
	// their own epoch.
	var old *chain.Msg
	for _, id := range cc.Members {
		r, ok := x.reports[chain.NodeID(id)]
		if ok && r.Epoch < cc.Epoch && !slices.Equal(r.Members, ids) && (old == nil || r.Epoch < old.Epoch) {
			old = &r
		}
	}
	if adopted || mutation.On && x.cfg.mut.recordOnly {
		old = nil // adopted: a configuration a member heard, and the newest
	}
	from := ids
	if old != nil {
		from = old.Members
		x.cfg.Logger.Warn("chain master: the record is ahead of the members (decided, never announced): rewiring from a member's configuration",
			"record", cc.Members, "epoch", cc.Epoch, "member", uint64(old.From), "its epoch", old.Epoch)
	}
	if x.mapped {
		x.countFromMap(cc)
	}
	x.m = x.newCore(from, cc.Epoch)
	reports := x.reports
	x.committed, x.actAt, x.reports = cc, time.Time{}, nil
	clear(x.heard)
	clear(x.progress)
	if adopted {
		x.below = unheard // as a standalone master's learning (learnt)
		if !(mutation.On && x.cfg.mut.learntFailsLate) {
			for _, id := range below {
				if slices.Contains(x.m.Members(), id) {
					x.failBelow(id, reports[id].Epoch)
				}
			}
		}
	}
	heard := now // FailAfter from now: they were never answered here
	if starting {
		// A member of the starting chain never heard from is given
		// StartGrace, as by a standalone master (Start): its process may
		// still be starting on a loaded machine, and a member failed
		// while alive is not joined again until it restarts.
		heard = now.Add(x.cfg.StartGrace - x.cfg.FailAfter)
	}
	for _, id := range x.m.Members() {
		x.heard[uint64(id)] = heard
	}
	if old != nil {
		for _, id := range old.Members {
			if !slices.Contains(cc.Members, uint64(id)) {
				x.m.Fail(id)
				delete(x.heard, uint64(id))
			}
		}
	}
	x.cfg.Logger.Info("chain master: acting (metadata leader)", "members", cc.Members, "epoch", cc.Epoch)
	return true, now
}

// failBelow fails member n, heard at epoch, below the configuration the
// master never learnt (x.below): it may be one that configuration cut out
// (step). A member heard so during the learning is failed as the learning
// ends (learnt, lead), before any heartbeat is answered: answered first,
// another member takes the learnt configuration, which lists n, at an epoch
// above the unlearnt one, and reports it — a master crashing before n's
// next heartbeat leaves its successor nothing unheard to learn, and n, in
// that configuration, is leased by it (review35a;
// TestLearntMasterFailsBelowBeforeAnsweringAnyone).
func (x *Master) failBelow(n chain.NodeID, epoch uint64) {
	x.cfg.Logger.Warn("chain master: member below a configuration the master never learnt (a master crash mid-repair): failed; it rejoins",
		"node", uint64(n), "epoch", epoch, "unlearnt epoch", x.below)
	x.m.Fail(n)
	delete(x.heard, uint64(n))
	delete(x.progress, uint64(n))
}

// learnOver is what a hosted master taking over learns from the members'
// reports over record cc (nil: none): the newest configuration and the
// epoch to start at (Learner.Config), with the epoch of a configuration it
// could not learn and the members heard below it (Learner.Unheard, Below:
// failed as the master starts). It starts from the record, not the
// configured members: a member reporting an epoch above the record's with
// an older configuration (the old master's newer one known only to a
// silent member) then leaves the record's members, at an epoch above every
// one reported, rather than put the older list in the record over it
// (review34c; the mutation learnFromConfigured, the code before).
func (x *Master) learnOver(cc *kv.ChainConfig) (members []chain.NodeID, epoch, unheard uint64, below []chain.NodeID) {
	l := NewLearner(nodeIDs(x.cfg.Members))
	if cc != nil && !(mutation.On && x.cfg.mut.learnFromConfigured) {
		l = NewLearnerAt(nodeIDs(cc.Members), cc.Epoch)
	}
	l.sameEpoch = mutation.On && x.cfg.mut.learnSameEpoch
	for _, id := range slices.Sorted(maps.Keys(x.reports)) {
		l.Heard(x.reports[id])
	}
	members, epoch = l.Config()
	return members, epoch, l.Unheard(), l.Below()
}

// readWants reads the cluster map's entry of the chain (MetaWants), if
// the Meta has it: kept as it was when the read fails.
func (x *Master) readWants() {
	w, ok := x.cfg.Meta.(MetaWants)
	if !ok {
		return
	}
	wt, err := w.Wants(x.cfg.Group)
	if err != nil {
		x.cfg.Logger.Warn("chain master: read the cluster map's wanted change of the chain", "err", err)
		return
	}
	x.joining, x.leaving, x.mapDropped, x.mapNodes, x.mapped = wt.Joining, wt.Leaving, wt.Dropped, wt.Nodes, wt.Mapped
}

// newCore is the master's core for the chain members at epoch, keeping it
// at the configured chain's length, which re-sends an unanswered order every
// ResendAfter: Tick runs on the master's tick, every Heartbeat.
func (x *Master) newCore(members []chain.NodeID, epoch uint64) *chain.Master {
	m := chain.NewMasterAt(chain.NodeID(x.cfg.As), members, x.length, epoch)
	m.SetNodes(x.restartNodes(members))
	// Tick re-sends after n whole ticks, at least n intervals: an order
	// made in a tick, before its Tick, waits exactly n.
	m.SetResend(int((x.cfg.ResendAfter + x.cfg.Heartbeat - 1) / x.cfg.Heartbeat))
	return m
}

// passive stops a hosted master: it forgets its state (the record keeps
// what matters) and answers nothing until it takes over again.
func (x *Master) passive() {
	x.m, x.committed, x.led, x.actAt, x.reports = nil, nil, time.Time{}, time.Time{}, nil
	clear(x.heard)
	clear(x.progress)
	clear(x.granted)
	clear(x.draining)
	x.wanting, x.counted, x.below = false, false, 0
}

// commit records the master's configuration, if it changed, in the metadata
// group (hosted; a standalone master just notes it), before any of the
// decision's messages leave. It reports whether they may.
func (x *Master) commit() bool {
	cur := x.config()
	if x.committed != nil && cur.Equal(x.committed) {
		return true
	}
	if x.cfg.Meta == nil {
		x.committed = cur
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := x.cfg.Meta.Commit(ctx, kv.Op{Kind: kv.KindMapChainSet, Key: kv.AppendChainConfig(nil, cur), Delta: int64(x.committed.Epoch),
		Expected: kv.AppendChainConfig(nil, x.committed)})
	cancel()
	if err != nil {
		x.cfg.Logger.Warn("chain master: commit the configuration: nothing announced, passive", "members", cur.Members, "epoch", cur.Epoch, "err", err)
		x.passive()
		return false
	}
	x.committed = cur
	return true
}

// learn takes a heartbeat while the master learns the chain, adopting a
// newer configuration than its own (Learner).
func (x *Master) learn(msg chain.Msg, now time.Time) {
	if x.learner.Heard(msg) {
		members, epoch := x.learner.Config()
		x.cfg.Logger.Warn("chain master: learnt a newer configuration", "from", uint64(msg.From), "epoch", epoch,
			"members", members, "was", x.m.Members(), "was epoch", x.m.Epoch())
		x.m = x.newCore(members, epoch)
		for _, id := range members {
			if _, ok := x.heard[uint64(id)]; !ok {
				// The start's grace, as for the configured members.
				x.heard[uint64(id)] = x.learnUntil.Add(x.cfg.StartGrace - 2*x.cfg.FailAfter)
			}
		}
	}
	if !msg.Refused {
		// (A restarted member, or a joiner, is joined or failed once the
		// master has learnt the chain.)
		x.heard[uint64(msg.From)] = now
	}
	if x.learner.Done() {
		x.learnt()
	}
}

// forgoLearnt leaves the members the operator forwent as the master learnt
// the chain (learntWithout) out of a whole-chain restart, once the chain is
// down: they are candidates (every configured member is, restartNodes),
// and without this the restart waited for them for good — an Ahead member
// or a chain with no replica left ends the learning in such a restart
// (TestLearnWithoutCarriesIntoTheWholeChainRestart). What it costs is
// chain.Master.Forgo's, the cost the operator accepted: a forgone member
// that comes back holding more than the chain restarted from is refused
// until it restarts empty.
func (x *Master) forgoLearnt() {
	if len(x.learntWithout) == 0 || !x.m.Down() {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(x.learntWithout)) {
		delete(x.learntWithout, id)
		if !slices.Contains(x.m.Awaited(), chain.NodeID(id)) {
			continue
		}
		if _, err := x.m.Forgo(chain.NodeID(id)); err != nil {
			x.cfg.Logger.Warn("chain master: the whole chain restarts: it waits for a member forgone by --learn-without", "node", id, "err", err)
			continue
		}
		x.cfg.Logger.Warn("chain master: the whole chain restarts without a member forgone by --learn-without: writes only it acknowledged may be lost", "node", id)
	}
}

// learnt ends the learning: the master acts on its configuration.
func (x *Master) learnt() {
	x.below = x.learner.Unheard()
	if ahead := x.learner.Ahead(); len(ahead) > 0 {
		// The whole chain's restart (Learner.Ahead): every member failed,
		// the running ones told so by their next heartbeat's answer (they
		// rejoin, reporting their histories), and the chain restarts from
		// the longest once every member has reported. The repair orders
		// the failures made go to a chain that is down: dropped.
		x.cfg.Logger.Warn("chain master: a restarted member holds updates past every running member's: the chain's configuration is not known; the whole chain restarts from the longest history",
			"restarted", ahead, "members", x.m.Members())
		// The restart waits for the members ahead too, and weighs their
		// histories: one of an earlier learnt configuration only is no
		// candidate otherwise (restartNodes: the configured members and
		// the learnt chain's), and the chain restarted without the history
		// it restarts for (TestAheadMemberIsACandidateOfTheRestart).
		nodes := x.restartNodes(x.m.Members())
		for _, id := range ahead {
			if !slices.Contains(nodes, id) {
				nodes = append(nodes, id)
			}
		}
		x.m.SetNodes(nodes)
		for _, id := range x.m.Members() {
			x.m.Fail(id)
			delete(x.heard, uint64(id))
			delete(x.progress, uint64(id))
		}
		x.m.Ready()
	} else if !(mutation.On && x.cfg.mut.learntFailsLate) {
		for _, id := range x.learner.Below() {
			x.failBelow(id, x.learner.at[id])
		}
	}
	for id := range x.learner.forgone {
		_, replica := x.learner.reported[id]
		if _, restarted := x.learner.restarted[id]; replica || restarted {
			continue // heard after all: not dead for good
		}
		if x.learntWithout == nil {
			x.learntWithout = map[uint64]bool{}
		}
		x.learntWithout[uint64(id)] = true
	}
	x.learnUntil, x.learner = time.Time{}, nil
	x.committed = x.config() // what heartbeats are answered with from now on
	x.forgoLearnt()
	x.cfg.Logger.Info("chain master: acting", "members", x.m.Members(), "epoch", x.m.Epoch())
}

func (x *Master) tick(now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if d := x.dropped.Swap(0); d > 0 {
		x.cfg.Logger.Warn("chain master: heartbeats dropped (the queue is full of them)", "heartbeats", d)
	}
	if x.cfg.Meta != nil {
		acting, start := x.lead()
		if !acting {
			x.lastTick = time.Time{} // a takeover sets every member's time afresh
			return
		}
		now = start
	}
	x.stallGrace(now)
	if !x.learnUntil.IsZero() {
		if now.Before(x.learnUntil) {
			x.flush()
			return
		}
		if !x.learner.Over() && !(mutation.On && x.cfg.mut.learnEndsAtTimeout) {
			if !x.waitLogged {
				// Said once: the chain serves nothing until it ends.
				x.waitLogged = true
				x.cfg.Logger.Error("chain master: restarted with no record of the chain, it waits to hear every member before it acts: "+
					"a silent one may hold a newer configuration, and writes only it acknowledged (kefir chain-master --learn-without; docs/chain.md)",
					"waiting for", x.learner.Waiting(), "members", x.m.Members(), "epoch", x.m.Epoch())
			}
			x.flush()
			return
		}
		x.learnt()
	}
	for _, id := range x.m.Members() {
		if x.m.Down() {
			break // every member failed already: waiting for them to restart
		}
		if h, ok := x.heard[uint64(id)]; !ok || now.Sub(h) > x.cfg.FailAfter {
			x.cfg.Logger.Warn("chain master: member failed (no heartbeat)", "node", uint64(id), "silent", now.Sub(h))
			x.m.Fail(id)
			delete(x.heard, uint64(id))
			delete(x.progress, uint64(id))
		}
	}
	x.forgoLearnt()
	if j := x.m.Joiner(); j != 0 {
		// A pre-copying joiner is not in the chain yet: nothing waits for
		// it, and restoring a large snapshot holds its driver, hence its
		// heartbeats, for seconds (bench/chain-join.sh: the master failed
		// the joiner of every 200 MB join just before it finished, and the
		// join started over). It gets StartGrace then; FailAfter once it is
		// linked in (FLUSH), when the chain's writes pass through it.
		limit := x.cfg.FailAfter
		if x.m.JoinerPrecopying() && !(mutation.On && x.cfg.mut.joinerFailAfter) {
			limit = max(limit, x.cfg.StartGrace)
		}
		if h, ok := x.heard[uint64(j)]; ok && now.Sub(h) > limit {
			// A joiner that stopped answering: give up on it (it is heard
			// from again, and joined again, if it comes back).
			x.cfg.Logger.Warn("chain master: joiner failed", "node", uint64(j))
			x.m.Fail(j)
			delete(x.heard, uint64(j))
			delete(x.progress, uint64(j))
		}
	}
	x.followWant(now)
	// Re-send what is unanswered: an order waits ResendAfter, and one this
	// tick's decisions (or a takeover's, in lead) made counts its wait from
	// this tick.
	x.m.Tick()
	x.flush()
}

// countFromMap sets the chain's length and target at a takeover from the
// cluster map (its entry as of this leadership read) and the record cc:
// the length is the record's members and the places failures left
// (Dropped), which the map keeps whichever master acted; the target adds
// one per node wanted in that is not a member yet — none fills a place,
// as Dropped no longer lists a place a wish's joiner takes (kv.chainWant)
// — and takes one per member wanted out. Why not the master's own length
// (the members the map named when its process started, or what its own
// last change left): a master started after a failure counted the chain
// one short, and the failed member's restart then truncated the live tail
// after its flush; one started before a growth that another master
// carried out (or that a failure interrupted) counted the growth's joiner
// as filling a failed member's place rather than lengthening the chain.
func (x *Master) countFromMap(cc *kv.ChainConfig) {
	x.length = max(len(cc.Members)+len(x.mapDropped), 1)
	x.counted, x.target = true, x.length
	clear(x.seenJoin)
	clear(x.seenLeave)
	clear(x.filled)
	for _, id := range x.joining {
		// A member that is the record's joiner is counted among the
		// members, and not linked in yet: its flush may abort.
		member := slices.Contains(cc.Members, id)
		x.seenJoin[id] = member && id != cc.Joiner
		if !member {
			x.target++
		}
	}
	for _, id := range x.leaving {
		x.seenLeave[id] = true
		if slices.Contains(cc.Members, id) {
			x.target--
		}
	}
}

// countWant keeps target, the length the wanted changes lead to: a node
// newly wanted in adds one — unless the chain, failures having dropped a
// member, is below target without it: then it takes that member's place
// (filled) — and one whose wish was dropped before it joined takes back
// what it added; a member newly wanted out takes one.
//
// A wanted node is counted once for as long as the map's Joining names it:
// a join whose flush a failure aborted (the joiner fenced, then joined
// again) is the same node wanted in, not another. And the first count, at
// a master that starts acting in the middle of a change, starts from no
// less than the record's members (its joiner aside: counted as wanted):
// another master may have joined a wanted node, which the map's Joining no
// longer names, after this one's length was set.
func (x *Master) countWant(members []uint64) {
	if !x.counted {
		joiner := x.committed.Joiner
		n := len(members)
		if joiner != 0 && slices.Contains(members, joiner) {
			n--
		}
		x.counted, x.target = true, max(x.length, n)
		clear(x.seenJoin)
		clear(x.seenLeave)
		clear(x.filled)
		for _, id := range x.leaving {
			// Out of the chain already: length (the configured members', or
			// what a change left) may or may not count it; not counting it
			// out over-estimates, which truncates no one.
			x.seenLeave[id] = !slices.Contains(members, id)
		}
		for _, id := range x.joining {
			if id != joiner && slices.Contains(members, id) {
				x.seenJoin[id] = true // joined already: one of n
			}
		}
	}
	// A node no longer wanted in (its join withdrawn: the repair of a
	// joiner that died, which places another in the same wish) gives back
	// what it added — before the nodes newly wanted are counted, which
	// would otherwise count it as still on its way: a withdrawn joiner
	// that filled a failed member's place, replaced in one wish, left the
	// chain one longer than wanted (the new node added one on top of the
	// place, and the place was not given back).
	for id, linked := range x.seenJoin {
		member := slices.Contains(members, id)
		linked = linked || member && id != uint64(x.m.Joiner())
		if !slices.Contains(x.joining, id) {
			delete(x.seenJoin, id)
			if !linked && !member && !x.filled[id] {
				x.target-- // no longer wanted, never joined
			}
			delete(x.filled, id)
		}
	}
	for _, id := range x.joining {
		if _, ok := x.seenJoin[id]; !ok {
			// The chain as wanted without it: its members and the nodes
			// wanted in before it that are not linked in yet. Below the
			// target, it takes the place of a member failures dropped
			// (the chain runs at its length, one short: kefir cluster
			// add-members after a failure) rather than lengthen it: the
			// operator asked for the members the map showed and one more.
			have := len(slices.DeleteFunc(slices.Clone(members), func(m uint64) bool { return m == id }))
			for j := range x.seenJoin {
				if !slices.Contains(members, j) {
					have++
				}
			}
			x.seenJoin[id] = false
			if have < x.target && !(mutation.On && x.cfg.mut.growOnTop) {
				x.filled[id] = true
			} else {
				x.target++
			}
		}
	}
	// seenJoin: whether the node was seen linked in (a member, its flush
	// done), which counts it for good.
	for id := range x.seenJoin {
		if slices.Contains(members, id) && id != uint64(x.m.Joiner()) {
			x.seenJoin[id] = true
		}
	}
	for _, id := range x.leaving {
		if !x.seenLeave[id] {
			// Only a member counts out: one its failure dropped before the
			// wish (replace-node of a node the map remembers as Dropped)
			// left a place below the target that the wish's join fills —
			// or, if this master's length never counted it (it started
			// after the failure), none: not counting it over-estimates,
			// which truncates no one (as the first count).
			x.seenLeave[id] = true
			if slices.Contains(members, id) {
				x.target--
			}
		}
	}
}

// chainIDs is ids as uint64s.
// nodeIDs is chainIDs' inverse: the map's and the record's ids as the
// core's.
func nodeIDs(ids []uint64) []chain.NodeID {
	out := make([]chain.NodeID, len(ids))
	for i, id := range ids {
		out[i] = chain.NodeID(id)
	}
	return out
}

func chainIDs(ids []chain.NodeID) []uint64 {
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = uint64(id)
	}
	return out
}

// followWant carries out the cluster map's wanted change of the chain
// (MetaWants), a step per tick, as decisions of this master (each
// committed before it is announced, by the tick's flush):
//
//   - While a wanted node is not a member yet, the chain is kept one longer
//     per such node (chain.Master.SetLength), so that its join — it asks
//     as any node that is not a replica, and is joined before the tail —
//     truncates no one when it flushes.
//   - Once every wanted node is a member and nothing is under way, a
//     leaving member goes, one at a time: first it is granted no more
//     leases; once the last one it was granted has run out (Lease, and a
//     heartbeat of margin, after it was granted) it is failed, which
//     repairs the chain around it at a new epoch, and the chain's length
//     drops by one. Why not at once: a member failed while its lease runs
//     serves linearizable reads from a history the chain's writes no
//     longer reach. Why after the joins: a replace never leaves the chain
//     below its length.
//
// When the change is done the chain's length is what it became, which
// later failures and rejoins keep.
func (x *Master) followWant(now time.Time) {
	if x.m.Down() {
		return
	}
	if j := uint64(x.m.Joiner()); j != 0 && x.m.JoinerPrecopying() && (slices.Contains(x.leaving, j) || x.unmapped(j)) {
		// The map withdrew the join (a repair of a joiner dead for
		// --repair-after, or a wish naming it to leave), or no longer
		// has the node (remove-node of a dropped member that restarted
		// meanwhile: linked in, a chain member the map lacks, which the
		// map would not follow): it is given up now, not after the
		// joiner's silence, and never joined again while the map's
		// Leaving names it or lacks it (step). Only in its pre-copy,
		// out of the chain: once its FLUSH went out it is a member of
		// the committed chain, granted leases, and serves reads under
		// them once the FLUSH came round to it — failed now, it would
		// serve them from a history the chain's writes no longer reach.
		// It is then failed for silence (FailAfter, past its lease) or,
		// its flush done, drained as any leaving member.
		x.cfg.Logger.Warn("chain master: the cluster map gave up the join: joiner failed", "node", j)
		x.m.Fail(chain.NodeID(j))
		delete(x.heard, j)
		delete(x.progress, j)
	}
	members := chainIDs(x.m.Members())
	x.countWant(members)
	var join, leave []uint64
	for _, id := range x.joining {
		if !slices.Contains(members, id) {
			join = append(join, id)
		}
	}
	for _, id := range x.leaving {
		if slices.Contains(members, id) {
			leave = append(leave, id)
		}
	}
	if len(join) == 0 && len(leave) == 0 {
		if x.wanting {
			// Not the members' count: a member down at this moment (to be
			// repaired and joined again) is still one of the chain's.
			x.wanting = false
			x.length = max(x.target, 1)
			x.m.SetLength(x.length)
			clear(x.draining)
			x.cfg.Logger.Info("chain master: the wanted change of the chain is done", "members", members)
		}
		return
	}
	x.wanting = true
	if x.m.Busy() || len(join) > 0 {
		// No member is failed while a join (or a repair) runs, so none
		// drains meanwhile: a drained member would wait without a lease —
		// a leaving head takes no writes — for as long as it runs, or, for
		// a wanted node that never starts, for ever. It drains again after.
		clear(x.draining)
	}
	if x.m.Busy() {
		return // a join (its length was set before it started), a repair, a truncation
	}
	if len(join) > 0 {
		x.m.SetLength(len(members) + len(join))
		return
	}
	if len(members) == 1 {
		return // never the last member (the map refuses such a wish; failures may still leave one)
	}
	l := leave[0]
	if _, ok := x.draining[l]; !ok {
		x.draining[l] = now
		x.cfg.Logger.Info("chain master: the cluster map removes a member: no more leases for it, then it is failed", "node", l, "members", members)
	}
	if g, ok := x.granted[l]; ok && now.Before(g.Add(x.cfg.Lease+x.cfg.Heartbeat)) {
		return
	}
	x.m.SetLength(len(members) - 1)
	x.cfg.Logger.Warn("chain master: member removed as the cluster map wants (failed on purpose)", "node", l)
	x.m.Fail(chain.NodeID(l))
	delete(x.heard, l)
	delete(x.progress, l)
	delete(x.draining, l)
	x.m.SetNodes(x.restartNodes(x.m.Members())) // a whole-chain restart no longer waits for it
}

// restartNodes are the nodes a whole-chain restart waits for
// (chain.Master.SetNodes), for a chain of members: every configured member
// — one that failed before this master took over may hold the last
// acknowledged writes — and every member (a node a wanted change joined is
// one), but no node the map removes: it left a whole chain behind
// (followWant) — nor one the map no longer has, which left a chain (and
// then the map, its Leaving entry with it: kv's removeNode) or was
// dropped by failure and taken out of the cluster. The configured members
// are the map's when this master started, and may name such a node: kept,
// a whole-chain restart waited for a node taken out of the cluster (its
// machine perhaps wiped) for ever, and took a report of its old directory
// as a candidate's.
func (x *Master) restartNodes(members []chain.NodeID) []chain.NodeID {
	var nodes []chain.NodeID
	for _, id := range slices.Concat(x.cfg.Members, chainIDs(members)) {
		if !slices.Contains(nodes, chain.NodeID(id)) && !slices.Contains(x.leaving, id) && !x.unmapped(id) {
			nodes = append(nodes, chain.NodeID(id))
		}
	}
	return nodes
}

// unmapped reports whether node id is not a node of the cluster map, as of
// the last leadership read: never without the map's view of the chain, or
// for a map without a node list (an older build's), which knows its nodes
// by their groups only.
func (x *Master) unmapped(id uint64) bool {
	return x.mapped && len(x.mapNodes) > 0 && !slices.Contains(x.mapNodes, id)
}

// stallGrace keeps a stall of the master's own process out of its members'
// silence: when this tick comes more than two heartbeats after the last one
// (the process, or the box, did not run it), every member's last heartbeat
// is moved on by the stall. Their heartbeats of that time may still be
// queued behind the stall, unread; without this a master waking from a 1.8 s
// stall failed its healthy members at its first tick (bench/chain-join.sh on
// a loaded box: n1's master failed its own member and n2). Failing later is
// safe — a member serves only under a lease the master granted, and the
// lease runs out on the member's clock — and the grace ends: a member still
// silent FailAfter of awake time later is failed.
func (x *Master) stallGrace(now time.Time) {
	last := x.lastTick
	x.lastTick = now
	if last.IsZero() || (mutation.On && x.cfg.mut.noStallGrace) {
		return
	}
	stall := now.Sub(last) - x.cfg.Heartbeat
	if stall <= x.cfg.Heartbeat {
		return
	}
	for id, h := range x.heard {
		x.heard[id] = h.Add(stall)
	}
	x.cfg.Logger.Warn("chain master: its ticks stalled; the stall does not count as the members' silence", "stall", stall)
}

// flush commits the master's configuration (which publishes it: Members)
// and then sends its output.
func (x *Master) flush() {
	rd := x.m.Ready()
	if mutation.On && x.cfg.mut.announceFirst {
		for i := range rd.Msgs {
			x.send(rd.Msgs[i])
		}
		rd.Msgs = nil
	}
	if !x.commit() {
		return
	}
	for i := range rd.Msgs {
		x.send(rd.Msgs[i])
	}
	for _, id := range rd.Fenced {
		x.cfg.Logger.Warn("chain master: fenced (out of the chain; it rejoins as a new joiner)", "node", uint64(id))
	}
	if x.m.Down() && !x.lost {
		x.lost = true
		x.cfg.Logger.Error("chain master: every member failed: the chain is down until they restart (the longest durable history carries it on)",
			"members", x.m.Members())
	}
}

func (x *Master) send(m chain.Msg) {
	m.From = chain.NodeID(x.cfg.As)
	if x.cfg.Send != nil {
		x.cfg.Send(uint64(m.To), &m)
		return
	}
	if err := x.ep.Send(uint64(m.To), chainwire.Payload(&m)); err != nil && !errors.Is(err, transport.ErrClosed) {
		x.cfg.Logger.Warn("chain master: send", "to", uint64(m.To), "type", m.Type.String(), "err", err)
	}
}
