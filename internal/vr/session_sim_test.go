package vr

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
)

// Session reads in the simulator (issue 5, "Tests"). Clients carry a session
// token — the highest version (op number) among their acknowledged writes and
// the highest version they have read — and send session reads to a random
// replica, followers included. A replica serves one from its applied state
// only when that state provably contains the token: applied >= max(last
// write, max read). Versions are op numbers, the same on every replica, and a
// replica applies committed ops only, so any replica that has applied op v
// holds every write up to v: read-my-writes and monotonic reads follow. A
// replica that cannot prove the token redirects to the leader it knows, or,
// when it is the leader (or knows none), waits until it has applied enough;
// it never serves the read from an older state.

// sessionReq is a session read with the client's token.
type sessionReq struct {
	Seq       uint64
	Op        check.Op
	LastWrite uint64 // highest version among the session's acknowledged writes
	MaxRead   uint64 // highest version the session has read
}

func (m sessionReq) String() string {
	return fmt.Sprintf("sreq(seq=%d get %s w=%d r=%d)", m.Seq, m.Op.Key, m.LastWrite, m.MaxRead)
}

// need is the applied op a replica must have reached to serve m.
func (m sessionReq) need() uint64 { return max(m.LastWrite, m.MaxRead) }

// sessionCounters shows that a run exercised the session path.
type sessionCounters struct {
	servedByFollower, servedByLeader, redirected, waited  int
	boundedByFollower, boundedByLeader, boundedRedirected int
	eventualByFollower, eventualByLeader, eventualRefused int
}

// leasedMsg is a leader's prepare or commit stamped with whether the leader
// held its lease when it sent it (session runs only; the core's messages
// carry no such bit). Under the lease no other view can have committed
// anything, so the commit point it carries covers every write acknowledged
// before it was sent.
type leasedMsg struct {
	Message
	Leased bool
}

// outgoing stamps the leader's prepares and commits in session runs.
func (n *simReplica) outgoing(m Message) any {
	if n.o.session == nil || (m.Type != MsgPrepare && m.Type != MsgCommit) {
		return m
	}
	_, err := n.core.LeaseRead(n.now)
	return leasedMsg{Message: m, Leased: err == nil}
}

func (n *simReplica) stepLeased(now int64, m leasedMsg) {
	before := n.core.Info()
	n.core.Step(now, m.Message)
	n.count(before)
	n.heardLeader(now, m.Message, m.Leased)
}

// heardLeader records, on a follower in normal status, a message from its
// leader and the commit point it carried: the base of bounded(t) reads.
//
// Only a leader holding its lease vouches for freshness: a deposed leader
// (cut off from a majority that has formed a new view) may still reach this
// follower, with a commit point that misses the new view's writes. And a
// new leader's commit point lags: it starts its view at the highest commit
// its do-view-changes reported, which can be behind ops already acknowledged
// in an earlier view, and only catches up once it has committed its
// start-view log. Until the leader's commit reaches the op its view started
// with (start-view's Op), its commit point proves nothing either; a follower
// that did not see the start-view of its current view (restarted since)
// never serves bounded reads in that view.
func (n *simReplica) heardLeader(now int64, m Message, leased bool) {
	switch m.Type {
	case MsgPrepare, MsgCommit, MsgStartView:
	default:
		return
	}
	info := n.core.Info()
	if info.Status != Normal || info.IsLeader || m.View != info.View || m.From != info.Leader {
		return
	}
	if m.Type == MsgStartView {
		n.startView, n.startOp = m.View, m.Op
		return
	}
	if !n.o.boundedVrshardRule && (!leased || n.startView != m.View || m.Commit < n.startOp) {
		return
	}
	n.hbAt, n.hbCommit = now, m.Commit
}

// onBounded serves a bounded(t) read the way vrshard does: the leader as a
// linearizable read; a follower when it heard its leader within t (on its
// own clock) and has applied the commit point that message carried, so its
// state was the committed state at that instant; otherwise it redirects.
func (n *simReplica) onBounded(from sim.Addr, m sessionReq) {
	c := n.o.session
	info := n.core.Info()
	if info.IsLeader {
		if c != nil {
			c.boundedByLeader++
		}
		n.onClient(from, clientReq{Seq: m.Seq, Op: m.Op})
		return
	}
	// Elapsed time on this replica's clock, stretched by the drift bound: a
	// slow clock under-measures real time.
	elapsed := float64(n.now-n.hbAt) / (1 - n.o.drift)
	fresh := n.hbAt > 0 && elapsed <= float64(m.Op.Cons.Staleness) && n.core.applied >= n.hbCommit
	if !fresh && !n.o.boundedNoCheck {
		if c != nil {
			c.boundedRedirected++
		}
		n.redirect(from, m.Seq)
		return
	}
	if c != nil {
		c.boundedByFollower++
	}
	n.parked = append(n.parked, parkedRead{client: from, seq: m.Seq, key: m.Op.Key})
	n.serveReads()
}

// onEventual serves an eventual read from the applied state while the core
// says this replica's state is within the eventual window
// (Replica.EventualUntil, as vrshard's CheckConsistency), else redirects.
func (n *simReplica) onEventual(from sim.Addr, m sessionReq) {
	c := n.o.session
	info := n.core.Info()
	if n.now >= n.core.EventualUntil() {
		if c != nil {
			c.eventualRefused++
		}
		n.redirect(from, m.Seq)
		return
	}
	if c != nil {
		if info.IsLeader {
			c.eventualByLeader++
		} else {
			c.eventualByFollower++
		}
	}
	n.parked = append(n.parked, parkedRead{client: from, seq: m.Seq, key: m.Op.Key})
	n.serveReads()
}

// onSession serves, redirects or parks a session read.
func (n *simReplica) onSession(from sim.Addr, m sessionReq) {
	switch m.Op.Cons.Kind {
	case level.BoundedTime:
		n.onBounded(from, m)
		return
	case level.Eventual:
		n.onEventual(from, m)
		return
	}
	need := m.need()
	switch {
	case n.o.sessionNoToken:
		need = 0 // the mutation: serve whatever this replica has applied
	case n.o.sessionNoRead:
		need = m.LastWrite
	}
	c := n.o.session
	if n.core.applied >= need {
		if c != nil {
			if n.core.Info().IsLeader {
				c.servedByLeader++
			} else {
				c.servedByFollower++
			}
		}
		n.parked = append(n.parked, parkedRead{client: from, seq: m.Seq, key: m.Op.Key, index: need})
		n.serveReads()
		return
	}
	info := n.core.Info()
	if info.Status == Normal && !info.IsLeader {
		if c != nil {
			c.redirected++
		}
		n.redirect(from, m.Seq)
		return
	}
	// The leader (or a replica in a view change) waits until it has applied
	// the token; serveReads answers once applied >= index. A snapshot install
	// drops parked reads, and the client's timeout moves it on.
	if c != nil {
		c.waited++
	}
	n.parked = append(n.parked, parkedRead{client: from, seq: m.Seq, key: m.Op.Key, index: need})
}

func newSessionClient(timeout, maxTries int) sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		return &simClient{id: id, n: cfg.Replicas, timeout: timeout, maxTries: maxTries, session: true}
	}
}

// boundedStaleness is the bound of the bounded(t) reads: four heartbeat
// intervals.
const boundedStaleness = 20 * time.Millisecond

// sessionWorkload splits reads evenly between linearizable, session and
// bounded(t) (eventual instead of bounded(t) with eventual set).
type sessionWorkload struct {
	sim.KV
	eventual bool
}

func (w sessionWorkload) Next(rng *rand.Rand, client, seq int) check.Op {
	op := w.KV.Next(rng, client, seq)
	if op.Kind == check.Get {
		switch rng.IntN(3) {
		case 1:
			op.Cons = level.ConsSession
		case 2:
			op.Cons = level.BoundedTimeLevel(boundedStaleness)
			if w.eventual {
				op.Cons = level.ConsEventual
			}
		}
	}
	return op
}

// eventualWindow is the simulated replicas' Config.EventualWindow: five
// heartbeat intervals, so partitions and crashes outlast it often.
const eventualWindow = 25 * time.Millisecond

// eventualTweak is sessionTweak with eventual reads instead of bounded(t).
func eventualTweak(so *sim.Options) {
	sessionTweak(so)
	w := so.Workload.(sessionWorkload)
	w.eventual = true
	so.Workload = w
}

// sessionTweak: the default fault mix, with session clients and more reads.
func sessionTweak(so *sim.Options) {
	kv := so.Workload.(sim.KV)
	kv.Get = 8
	so.Workload = sessionWorkload{KV: kv}
	so.NewClient = newSessionClient(30, 12)
}

// judgeSession is judge plus the session guarantees of session reads and
// the staleness bound of bounded reads.
func judgeSession(s *sim.Sim, h check.History) error {
	return errors.Join(judge(s, h), check.Session(h, check.SessionOptions{}).Err(), check.BoundedStaleness(h).Err())
}

// exploreSession runs seeds with session clients and fails on any checker
// violation; it returns the counters of the runs.
func exploreSession(t *testing.T, seeds int, o simOptions, tweak func(*sim.Options), hook func(*sim.Sim)) (sessionCounters, runStats) {
	var st runStats
	o.counters = &simCounters{}
	o.session = &sessionCounters{}
	sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h := simRunHook(seed, o, trace, func(so *sim.Options) {
			sessionTweak(so)
			if tweak != nil {
				tweak(so)
			}
		}, hook)
		if trace == nil {
			st.add(s, h)
		}
		return judgeSession(s, h)
	})
	t.Logf("%d seeds: %d ops, %d ok, %d unknown; %d crashes; session reads %+v", st.seeds, st.ops, st.ok, st.unknown, st.crashes, *o.session)
	return *o.session, st
}

// TestSimSessionReads: with the default faults (crashes losing unsynced
// data, partitions, drops, duplicates, reordering, clock drift), session
// reads served by any replica that has applied the session's token keep
// read-my-writes, monotonic reads and monotonic writes; the linearizable
// operations stay linearizable and no acknowledged sync write is lost.
func TestSimSessionReads(t *testing.T) {
	c, st := exploreSession(t, seedCount(2000, 20000), defaultSimOptions(), nil, nil)
	if st.ok < st.ops/3 {
		t.Errorf("only %d of %d operations completed: the group is not making progress", st.ok, st.ops)
	}
	// The run must exercise every branch it claims to: followers serving,
	// followers redirecting a token they cannot prove, the leader waiting.
	if c.servedByFollower == 0 || c.redirected == 0 || c.servedByLeader == 0 {
		t.Errorf("session path not exercised: %+v", c)
	}
}

// caughtBy runs seeds with a deliberate bug until verdict fails, and fails
// the test if it never does within budget seeds, or if a checker the bug
// does not concern fails first (the bug must be seen for what it is).
func caughtBy(t *testing.T, budget int, o simOptions, hook func(*sim.Sim), verdict func(check.History) check.Verdict) {
	t.Helper()
	caughtByWith(t, budget, o, sessionTweak, hook, verdict)
}

// caughtByWith is caughtBy with another workload tweak.
func caughtByWith(t *testing.T, budget int, o simOptions, tweak func(*sim.Options), hook func(*sim.Sim), verdict func(check.History) check.Verdict) {
	t.Helper()
	for seed := uint64(1); seed <= uint64(budget); seed++ {
		var err, caught error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			s, h := simRunHook(seed, o, nil, tweak, hook)
			err = judge(s, h)
			caught = verdict(h).Err()
		}()
		if err != nil {
			t.Fatalf("seed %d: the bug broke a check it does not concern: %v", seed, err)
		}
		if caught != nil {
			msg := caught.Error()
			if len(msg) > 600 {
				msg = msg[:600] + "..."
			}
			t.Logf("caught at seed %d of %d: %s", seed, budget, msg)
			return
		}
	}
	t.Fatalf("mutation survived %d seeds: the checker cannot see this bug", budget)
}

func sessionVerdict(h check.History) check.Verdict { return check.Session(h, check.SessionOptions{}) }

// TestMutationSessionNoToken: replicas that serve session reads from their
// applied state without checking the token return reads older than the
// session's own writes (or than what it read before), and check.Session sees it.
func TestMutationSessionNoToken(t *testing.T) {
	o := defaultSimOptions()
	o.sessionNoToken = true
	caughtBy(t, 2000, o, nil, sessionVerdict)
}

// TestMutationSessionNoMaxRead: a token that carries only the last write
// lets a session read from a replica behind one it read before: monotonic
// reads break.
func TestMutationSessionNoMaxRead(t *testing.T) {
	o := defaultSimOptions()
	o.sessionNoRead = true
	caughtBy(t, 2000, o, nil, sessionVerdict)
}

// TestMutationBoundedNoFreshness: followers that serve bounded(t) reads
// without having heard their leader within t serve stale values through a
// partition, and check.BoundedStaleness sees it.
func TestMutationBoundedNoFreshness(t *testing.T) {
	o := defaultSimOptions()
	o.boundedNoCheck = true
	caughtBy(t, 2000, o, nil, check.BoundedStaleness)
}

// crashLeader crashes the leader now and then, so that writes it
// acknowledged may not yet be known committed by the followers that elect
// the next one; it restarts a little later.
func crashLeader(s *sim.Sim) {
	for at := 60 * time.Millisecond; at < 600*time.Millisecond; at += 90 * time.Millisecond {
		s.At(at, func() {
			for i := 0; i < s.Config().Replicas; i++ {
				if n := s.Replica(i); n != nil && n.(*simReplica).core.Info().IsLeader {
					s.Crash(i)
					s.After(60*time.Millisecond, func() { s.Restart(i) })
					return
				}
			}
		})
	}
}

// TestSimSessionLeaderCrashes: the same checks when the leader itself keeps
// crashing, so views change often and new leaders start behind on their
// commit point (the scenario of the mutation below).
func TestSimSessionLeaderCrashes(t *testing.T) {
	c, _ := exploreSession(t, seedCount(300, 5000), defaultSimOptions(), nil, crashLeader)
	if c.boundedByFollower == 0 || c.servedByFollower == 0 {
		t.Errorf("follower reads not exercised: %+v", c)
	}
}

// TestSimSessionFiveReplicas: f = 2. Here a deposed leader cut off from
// the majority that formed the next view can still reach one follower; the
// follower must not take its heartbeats (no lease) as proof of freshness.
func TestSimSessionFiveReplicas(t *testing.T) {
	c, _ := exploreSession(t, seedCount(300, 3000), defaultSimOptions(), func(so *sim.Options) { so.Replicas = 5 }, nil)
	if c.boundedByFollower == 0 || c.servedByFollower == 0 {
		t.Errorf("follower reads not exercised: %+v", c)
	}
}

// TestMutationBoundedVrshardRule: followers that trust any commit point
// their leader sends — vrshard's rule today (internal/vrshard/read.go fresh,
// replica.go step) — serve stale bounded(t) reads right after a view change,
// when the new leader's commit point is still behind ops acknowledged in an
// earlier view.
func TestMutationBoundedVrshardRule(t *testing.T) {
	o := defaultSimOptions()
	o.boundedVrshardRule = true
	caughtBy(t, 2000, o, crashLeader, check.BoundedStaleness)
}

func eventualVerdict(h check.History) check.Verdict { return check.Eventual(h, eventualWindow) }

// TestSimEventualReads: eventual reads go to random replicas, which serve
// them only while Replica.EventualUntil allows (issue 24: a replica cut off
// from a leader that holds its lease for longer than the window stops), and
// check.Eventual holds every history to the window; the rest of the
// workload stays linearizable and session reads keep their guarantees.
func TestSimEventualReads(t *testing.T) {
	var st runStats
	o := defaultSimOptions()
	o.counters = &simCounters{}
	o.session = &sessionCounters{}
	sim.Explore(t, 1, seedCount(150, 5000), func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h := simRun(seed, o, trace, eventualTweak)
		if trace == nil {
			st.add(s, h)
		}
		return errors.Join(judgeSession(s, h), eventualVerdict(h).Err())
	})
	c := *o.session
	t.Logf("%d seeds: %d ops, %d ok, %d unknown; eventual reads: %d by followers, %d by leaders, %d refused",
		st.seeds, st.ops, st.ok, st.unknown, c.eventualByFollower, c.eventualByLeader, c.eventualRefused)
	if c.eventualByFollower == 0 || c.eventualByLeader == 0 || c.eventualRefused == 0 {
		t.Errorf("eventual path not exercised: %+v", c)
	}
}

// TestMutationEventualUnbounded: replicas that serve eventual reads however
// long they have been cut off (the rule before issue 24) return versions
// superseded long before, and check.Eventual sees it.
func TestMutationEventualUnbounded(t *testing.T) {
	mutation.Require(t)
	o := defaultSimOptions()
	o.mut.eventualUnbounded = true
	caughtByWith(t, 500, o, eventualTweak, nil, eventualVerdict)
}
