package vr

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/simkv"
)

// This file extends the simulated driver with the read and write rules of
// docs/design/cad.md, in three configurations:
//
//   - cad: blind writes acknowledged at AckReplicated, CAS/INCR at apply;
//     Config.FollowerReads; a follower serves a key iff FollowerRead gives
//     it R and the key's version in its state machine is <= R, else it
//     redirects; the leader serves a key whose update index u <= Readable()
//     under its lease, and otherwise waits with WaitReadable(u).
//   - async: blind writes acknowledged at AckAppended; the leader keeps an
//     overlay of acknowledged, not yet applied blind writes and serves reads
//     of those keys from it; followers serve their applied state.
//   - syncFollower: every write acknowledged at apply (sync), followers
//     serve their applied state (follower reads without the active set).
//
// Reads go to replicas in turn, so followers serve many of them.

type cadMode uint8

const (
	cadModeCAD cadMode = iota
	cadModeAsync
	cadModeSyncFollower
)

func (m cadMode) String() string {
	return [...]string{"cad+active-set", "async+follower-reads", "sync+follower-reads"}[m]
}

func (m cadMode) durability() level.Durability {
	return [...]level.Durability{level.CAD, level.Async, level.Sync}[m]
}

type cadSimOptions struct {
	mode cadMode
	// noRCheck is a driver mutation: a follower holding a lease serves its
	// state machine without comparing the key's version with R.
	noRCheck bool
	// noLeaderRCheck is a driver mutation: the leader serves what it applied
	// once R >= u, without checking the version it serves against R.
	noLeaderRCheck bool
	// leaderReads sends every read to the leader (as a linearizable read).
	leaderReads bool
	// syncWrites: in cad mode, every write is acknowledged at apply (sync)
	// while reads keep cad's rules.
	syncWrites bool
	// cfg adjusts the replicas' configuration (mutation scenarios).
	cfg   func(*Config)
	stats *cadStats
}

// cadStats shows that a run exercised the paths it claims to.
type cadStats struct {
	followerServed, followerRedirected, leaderFast, leaderWaits, leaderRewaits, overlayServed, earlyAcks int
}

func (c *cadStats) String() string {
	return fmt.Sprintf("follower served %d, redirected %d; leader fast %d, durability waits %d (+%d again); overlay %d; early acks %d",
		c.followerServed, c.followerRedirected, c.leaderFast, c.leaderWaits, c.leaderRewaits, c.overlayServed, c.earlyAcks)
}

func cadConfig(c *Config, o *cadSimOptions) {
	if o.mode == cadModeCAD {
		c.FollowerReads = true
		// Short enough for a 3 s simulated run; Removal just above its bound.
		c.MarkOut = 20 * time.Millisecond
		c.Removal = 30 * time.Millisecond
		c.Suspect = 15 * time.Millisecond
	}
	if o.cfg != nil {
		o.cfg(c)
	}
}

func blindWrite(k check.Kind) bool { return k == check.Put || k == check.Delete }

// cadPropose submits a client write at the ack point its mode wants.
func (n *simReplica) cadPropose(from sim.Addr, m clientReq) {
	ack := AckApplied
	if blindWrite(m.Op.Kind) && !n.o.cad.syncWrites {
		switch n.o.cad.mode {
		case cadModeCAD:
			ack = AckReplicated
		case cadModeAsync:
			ack = AckAppended
			if n.asyncOps == nil {
				n.asyncOps = map[[2]uint64]check.Op{}
			}
			n.asyncOps[[2]uint64{uint64(from), m.Seq}] = m.Op
		}
	}
	if err := n.core.ProposeAck(n.now, Request{Client: uint64(from), ReqNum: m.Seq, Data: simkv.AppendOp(nil, m.Op, 0)}, ack); err != nil {
		n.redirect(from, m.Seq)
	}
}

// onAck answers an early acknowledgement; async writes enter the overlay.
func (n *simReplica) onAck(a Reply) {
	if s := n.o.cad.stats; s != nil {
		s.earlyAcks++
	}
	k := [2]uint64{a.Client, a.ReqNum}
	if op, ok := n.asyncOps[k]; ok {
		delete(n.asyncOps, k)
		if n.overlay == nil {
			n.overlay = map[string]simkv.Record{}
		}
		if cur, ok := n.overlay[op.Key]; !ok || cur.Version < a.Op {
			n.overlay[op.Key] = simkv.Record{Exists: op.Kind == check.Put, Data: op.Value, Version: a.Op}
		}
	}
	res := check.Result{Found: true, Version: a.Op, Node: int(n.id)}
	n.out.Messages = append(n.out.Messages, sim.Envelope{To: sim.Addr(a.Client), Msg: clientResp{Seq: a.ReqNum, OK: true, Result: res}})
}

// pruneOverlay drops overlay entries the state machine has caught up with,
// and all of them once this replica no longer leads.
func (n *simReplica) pruneOverlay() {
	if len(n.overlay) == 0 {
		return
	}
	if !n.core.Info().IsLeader {
		clear(n.overlay)
		clear(n.asyncOps)
		return
	}
	for k, v := range n.overlay {
		if v.Version <= n.core.applied {
			delete(n.overlay, k)
		}
	}
}

// updateIndex is u: the highest op in the log (applied or not) that writes
// key, or the version the state machine holds.
func (n *simReplica) updateIndex(key string) uint64 {
	c := n.core
	for op := c.lastOp(); op > c.applied && op >= c.first; op-- {
		e := c.entry(op)
		if len(e.Data) > 0 && writesKey(e.Data, key) {
			return op
		}
	}
	return n.state.Record(key).Version
}

// writesKey reports whether the entry's op (kv's codec) writes key.
func writesKey(data []byte, key string) bool {
	op, err := kv.DecodeOp(data)
	if err != nil {
		panic(fmt.Sprintf("writesKey: %v", err))
	}
	return slices.ContainsFunc(op.WrittenKeys(), func(k []byte) bool { return string(k) == key })
}

func (n *simReplica) serveNow(to sim.Addr, seq uint64, key string, v simkv.Record) {
	res := simkv.ReadKey(v.Getter(), key, 0)
	res.Node = int(n.id)
	n.out.Messages = append(n.out.Messages, sim.Envelope{To: to, Msg: clientResp{Seq: seq, OK: true, Result: res}})
}

// cadRead serves a read by the rules of the run's mode.
func (n *simReplica) cadRead(from sim.Addr, m clientReq) {
	o, st := n.o.cad, n.o.cad.stats
	info := n.core.Info()
	if info.Status != Normal {
		n.redirect(from, m.Seq)
		return
	}
	if !info.IsLeader {
		if o.leaderReads {
			n.redirect(from, m.Seq)
			return
		}
		if o.mode != cadModeCAD {
			// Follower reads without the active set: whatever is applied.
			st.followerServed++
			n.serveNow(from, m.Seq, m.Op.Key, n.state.Record(m.Op.Key))
			return
		}
		r, err := n.core.FollowerRead(n.now)
		v := n.state.Record(m.Op.Key)
		if err != nil || (v.Version > r && !o.noRCheck) {
			st.followerRedirected++
			n.redirect(from, m.Seq)
			return
		}
		st.followerServed++
		n.serveNow(from, m.Seq, m.Op.Key, v)
		return
	}
	if n.nilextRead(from, m) {
		// --nilext too: a key with a pending nilext update takes the slow
		// path (ordered first); serveReads then holds the read to R
		// (cadRewait), as vrshard's leaderRead does.
		return
	}
	idx, err := n.core.LeaseRead(n.now)
	if o.mode == cadModeAsync && err == nil {
		if v, ok := n.overlay[m.Op.Key]; ok {
			st.overlayServed++
			n.serveNow(from, m.Seq, m.Op.Key, v)
			return
		}
	}
	if o.mode != cadModeCAD {
		n.onClientRead(from, m)
		return
	}
	u := n.updateIndex(m.Op.Key)
	if err == nil && u <= n.core.Readable() {
		st.leaderFast++
		n.parked = append(n.parked, parkedRead{client: from, seq: m.Seq, key: m.Op.Key, index: max(idx, u)})
		return
	}
	n.ctx++
	if err := n.core.WaitReadable(n.now, n.ctx, u); err != nil {
		n.redirect(from, m.Seq)
		return
	}
	st.leaderWaits++
	n.byCtx[n.ctx] = parkedRead{client: from, seq: m.Seq, key: m.Op.Key}
}

// cadRewait: at the leader, a cad read serves the state machine's version
// of the key only if it is <= R (applied may have run past R since u was
// taken, with a newer write of the key that other members lack); otherwise
// it waits again, for that version. It reports whether it took the read.
func (n *simReplica) cadRewait(p parkedRead, v simkv.Record) bool {
	o := n.o.cad
	if o == nil || o.mode != cadModeCAD || o.noLeaderRCheck || v.Version <= n.core.Readable() {
		return false
	}
	n.ctx++
	if err := n.core.WaitReadable(n.now, n.ctx, v.Version); err != nil {
		n.redirect(p.client, p.seq)
		return true
	}
	o.stats.leaderRewaits++
	n.byCtx[n.ctx] = parkedRead{client: p.client, seq: p.seq, key: p.key}
	return true
}

// cadClient is simClient with reads sent to replicas in turn (writes go to
// the leader it knows; both follow redirects).
type cadClient struct {
	*simClient
	rr          int
	leaderReads bool
	leader      int
}

func newCADClient(timeout, maxTries int, leaderReads bool) sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		return &cadClient{simClient: &simClient{id: id, n: cfg.Replicas, timeout: timeout, maxTries: maxTries}, leaderReads: leaderReads}
	}
}

func (c *cadClient) Step(ev sim.Event) {
	if ev.Kind == sim.Invoke && !c.leaderReads {
		if ev.Op.Kind == check.Get {
			c.leader = c.simClient.leader
			c.rr++
			c.simClient.leader = (int(c.id) + c.rr) % c.n
		} else {
			c.simClient.leader = c.leader
		}
	}
	c.simClient.Step(ev)
	if m, ok := ev.Msg.(clientResp); ok && ev.Kind == sim.Message && !m.OK && m.Leader >= 0 {
		c.leader = m.Leader
	}
}

// ---- runs ----

func cadSimOptionsFor(mode cadMode) simOptions {
	o := defaultSimOptions()
	o.cad = &cadSimOptions{mode: mode, stats: &cadStats{}}
	return o
}

// cadRun is simRunHook with the CAD client and workload.
func cadRun(seed uint64, o simOptions, trace io.Writer, tweak func(*sim.Options), hook func(*sim.Sim)) (*sim.Sim, check.History) {
	return simRunHook(seed, o, trace, func(so *sim.Options) {
		so.NewClient = newCADClient(30, 12, o.cad.leaderReads)
		cons := level.ConsCrossClient
		if o.cad.leaderReads {
			cons = level.ConsLinearizable
		}
		dur := o.cad.mode.durability()
		if o.cad.syncWrites {
			dur = level.Sync
		}
		so.Workload = sim.KV{Keys: 3, Get: 5, Put: 4, Delete: 1, CAS: 1, Incr: 1, Cons: cons, Dur: dur}
		// Slow fsyncs: many acknowledged writes sit unsynced when crashes hit.
		so.Sync = sim.Dist{Base: 2 * time.Millisecond, Jitter: 4 * time.Millisecond}
		if tweak != nil {
			tweak(so)
		}
	}, hook)
}

// cadJudge runs the checkers CAD promises: cross-client monotonic reads and
// the cad durability rule (a value once read survives crashes), besides the
// replicas' agreement and reported errors. lin adds linearizability (runs
// whose crashes cannot lose acknowledged writes, reads at the leader).
func cadJudge(s *sim.Sim, h check.History, lin bool) error {
	var errs []error
	if v := check.CrossClientMonotonic(h); !v.OK {
		errs = append(errs, v.Err())
	}
	dh := h
	if o := cadOptionsOf(s); o != nil && o.syncWrites && !o.leaderReads {
		dh = syncAsCAD(h) // see TestCADSimSyncWrites
	}
	if v := check.Durability(dh); !v.OK {
		errs = append(errs, v.Err())
	}
	if lin {
		if v := check.Linearizable(h, check.LinOptions{Timeout: 5 * time.Second, Strict: true}); !v.OK {
			errs = append(errs, v.Err())
		}
	}
	if err := checkAgreement(s, s.Config().Replicas); err != nil {
		errs = append(errs, err)
	}
	for i := 0; i < s.Config().Replicas; i++ {
		if n := s.Replica(i); n != nil {
			for _, e := range n.(*simReplica).errs {
				if !leaseRefusal(e) {
					errs = append(errs, fmt.Errorf("replica %d reported: %v", i, e))
					break
				}
			}
		}
	}
	return errors.Join(errs...)
}

func cadOptionsOf(s *sim.Sim) *cadSimOptions {
	for i := 0; i < s.Config().Replicas; i++ {
		if n := s.Replica(i); n != nil {
			return n.(*simReplica).o.cad
		}
	}
	return nil
}

// syncAsCAD returns h with sync writes marked cad, for the durability
// checker: it then holds them to "a value once read is never lost" only.
func syncAsCAD(h check.History) check.History {
	out := check.History{Ops: append([]check.Op(nil), h.Ops...), Crashes: h.Crashes}
	for i := range out.Ops {
		if out.Ops[i].Dur == level.Sync {
			out.Ops[i].Dur = level.CAD
		}
	}
	return out
}

// lagFollower slows the links to and from one follower for a while, twice,
// so it trails the others (and, without the active set, serves old state).
func lagFollower(s *sim.Sim) {
	for _, at := range []time.Duration{60 * time.Millisecond, 300 * time.Millisecond} {
		s.At(at, func() {
			slowOneFollower(s, sim.Link{Delay: sim.Dist{Base: 8 * time.Millisecond, Jitter: 20 * time.Millisecond}}, 120*time.Millisecond)
		})
	}
}

// slowFollower gives one follower links a few milliseconds slower than the
// others' for most of the run: it applies later than the other follower but
// answers well within Suspect, so it stays in the active set.
func slowFollower(s *sim.Sim) {
	s.At(50*time.Millisecond, func() {
		slowOneFollower(s, sim.Link{Delay: sim.Dist{Base: 2 * time.Millisecond, Jitter: 3 * time.Millisecond}}, 1500*time.Millisecond)
	})
}

// slowOneFollower gives the first running replica that does not lead the
// link slow to and from every other replica, healed after d.
func slowOneFollower(s *sim.Sim, slow sim.Link, d time.Duration) {
	for i := 0; i < s.Config().Replicas; i++ {
		if n := s.Replica(i); n != nil && !n.(*simReplica).core.Info().IsLeader {
			for j := 0; j < s.Config().Replicas; j++ {
				if j != i {
					s.SetLink(sim.Addr(i), sim.Addr(j), slow)
					s.SetLink(sim.Addr(j), sim.Addr(i), slow)
				}
			}
			s.After(d, s.Heal)
			return
		}
	}
}

// cadScenarios are the fault schedules every configuration runs: the random
// nemesis (crashes of up to f replicas that keep a torn prefix of unsynced
// bytes, partitions, one-way links), whole-cluster power failures, and a
// lagging follower.
type cadScenario struct {
	name  string
	tweak func(*sim.Options)
	hook  func(*sim.Sim)
	cfg   func(*Config) // nil: cadConfig's
}

var cadScenarios = []cadScenario{
	{"nemesis", nil, nil, nil},
	{"power-failure", func(so *sim.Options) { so.Faults.Crash, so.Faults.Restart = 0, 0 }, powerFailureHook, nil},
	{"lagging-follower", func(so *sim.Options) {
		so.Faults.Crash, so.Faults.Restart, so.Faults.Partition, so.Faults.OneWay = 0, 0, 1, 1
	}, lagFollower, nil},
	{"slow-follower", func(so *sim.Options) { so.Faults = nil }, slowFollower, nil},
	{"five-replicas", func(so *sim.Options) { so.Replicas = 5 }, nil, nil},
	// Leader crashes within a grant, at random times, with and without the
	// next leader cut off first (leaderRestarts), and leases long enough
	// that a grant outlives a view change (issue 24 item 1). The random
	// nemesis is off: its crashes and partitions rarely leave the schedule
	// intact (2000 seeds with it never caught restartedLeaderVotes; without
	// it seed 110 does, TestCADMutationRestartedLeaderVotes).
	{"leader-restarts", noRandomFaults, leaderRestarts, longGrants},
	// The random nemesis with one member started with a shorter lease
	// (issue 24 item 4): the others refuse it (the lease timing is part of
	// the configuration hash), and the rest of the group carries on.
	{"mixed-leases", nil, nil, nil},
}

// cadPerReplica is the per-member configuration of a scenario (nil: all
// alike).
func cadPerReplica(scenario string) func(sim.Addr, *Config) {
	if scenario == "mixed-leases" {
		return shortLease
	}
	return nil
}

// longGrants: grants of up to 80 ms under a 90 ms lease, so a grant sent
// just before a crash outlives the view change that follows.
func longGrants(c *Config) {
	c.ViewChangeTimeout, c.LeaseDuration = 100*time.Millisecond, 90*time.Millisecond
	c.MarkOut, c.Removal = 80*time.Millisecond, 170*time.Millisecond
}

// leaderRestarts crashes whichever replica leads, every 30 to 150 ms until
// 500 ms into the run, and restarts it from its disk 0.5 to 3 ms later:
// within the grants it has just sent, which it must keep although it forgot
// them. Half the time the replica next in line is first cut off from the
// others long enough to time out, and reaches the leader again as the
// leader comes back (defectingLeader with random timings): the one way a new
// view can form with the restarted leader's help while a grant is valid.
func leaderRestarts(s *sim.Sim) {
	var next func()
	next = func() {
		if s.Now() >= 500*time.Millisecond {
			return
		}
		gap := 30*time.Millisecond + time.Duration(s.Rand().IntN(120))*time.Millisecond
		l := leaderOf(s)
		if l < 0 {
			s.After(gap, next)
			return
		}
		crash := func() {
			s.Crash(l)
			s.After(500*time.Microsecond+time.Duration(s.Rand().IntN(2500))*time.Microsecond, func() { s.Restart(l) })
		}
		if s.Rand().IntN(2) == 0 {
			crash()
			s.After(gap, next)
			return
		}
		n := s.Config().Replicas
		f2 := int((s.Replica(l).(*simReplica).core.view + 1) % uint64(n))
		vct := s.Replica(l).(*simReplica).core.cfg.ViewChangeTimeout
		s.Isolate(sim.Addr(f2), false)
		// F2 times out after vct and asks for the view it leads.
		back := vct + time.Duration(s.Rand().IntN(10000))*time.Microsecond
		s.After(back-time.Duration(s.Rand().IntN(6000))*time.Microsecond, crash)
		s.After(back, func() {
			s.Unblock(sim.Addr(f2), sim.Addr(l))
			s.Unblock(sim.Addr(l), sim.Addr(f2))
		})
		s.After(back+3*vct, func() {
			s.Heal()
			s.After(gap, next)
		})
	}
	s.At(50*time.Millisecond, next)
}

func cadExplore(t *testing.T, seeds int, o simOptions, tweak func(*sim.Options), hook func(*sim.Sim), lin bool) runStats {
	t.Helper()
	var st runStats
	sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h := cadRun(seed, o, trace, tweak, hook)
		if trace == nil {
			st.add(s, h)
		}
		return cadJudge(s, h, lin)
	})
	t.Logf("%d seeds: %d ops, %d ok, %d unknown; %d crashes; %s", st.seeds, st.ops, st.ok, st.unknown, st.crashes, o.cad.stats)
	if st.ok < st.ops/3 {
		t.Errorf("only %d of %d operations completed: the group is not making progress", st.ok, st.ops)
	}
	return st
}

// TestCADSim: with the active set, cross-client monotonic reads and the cad
// durability rule hold under every fault schedule, although followers serve
// reads and writes are acknowledged before they are durable.
func TestCADSim(t *testing.T) {
	for _, sc := range cadScenarios {
		t.Run(sc.name, func(t *testing.T) {
			o := cadSimOptionsFor(cadModeCAD)
			o.cad.cfg = sc.cfg
			o.perReplica = cadPerReplica(sc.name)
			cadExplore(t, seedCount(150, 3000), o, sc.tweak, sc.hook, false)
			if st := o.cad.stats; st.followerServed == 0 || st.leaderWaits == 0 || st.earlyAcks == 0 {
				t.Fatalf("the run did not exercise follower reads, durability waits and early acks: %s", st)
			}
		})
	}
}

// TestCADSimLinearizableLeaderReads: cad writes with linearizable reads at
// the leader, under partitions and one-way links (no crash, so no
// acknowledged write may vanish): the history is linearizable — reads wait
// for R >= u, so they see every write acknowledged at AckReplicated.
func TestCADSimLinearizableLeaderReads(t *testing.T) {
	o := cadSimOptionsFor(cadModeCAD)
	o.cad.leaderReads = true
	cadExplore(t, seedCount(150, 3000), o, func(so *sim.Options) {
		so.Faults.Crash, so.Faults.Restart, so.Faults.Partition, so.Faults.OneWay = 0, 0, 1, 1
	}, nil, true)
}

// TestCADSimSyncWrites: sync writes (acknowledged at apply) with cad's read
// rules. With reads at the leader the history is linearizable and no
// acknowledged write is lost, whatever crashes. With reads spread over the
// followers, reads stay cross-client monotonic and no value once read is
// lost; but a lagging member may still serve a version older than a sync
// write acknowledged just before a crash — sync promises that the write is
// durable, not that every member that serves already shows it (that would
// be read-your-writes across clients; the soak found such histories, e.g.
// seed 82 of the power-failure schedule). So that run's sync writes are
// judged as cad writes by the durability checker.
func TestCADSimSyncWrites(t *testing.T) {
	for _, sc := range cadScenarios[:2] {
		t.Run(sc.name+"/leader-reads", func(t *testing.T) {
			o := cadSimOptionsFor(cadModeCAD)
			o.cad.syncWrites, o.cad.leaderReads = true, true
			cadExplore(t, seedCount(40, 1000), o, sc.tweak, sc.hook, true)
		})
		t.Run(sc.name+"/follower-reads", func(t *testing.T) {
			o := cadSimOptionsFor(cadModeCAD)
			o.cad.syncWrites = true
			cadExplore(t, seedCount(40, 1000), o, sc.tweak, sc.hook, false)
		})
	}
}

// cadMutationCaught is mutationCaught for the CAD runs: some seed must fail
// a checker (or an assertion).
func cadMutationCaught(t *testing.T, budget int, o simOptions, tweak func(*sim.Options), hook func(*sim.Sim)) {
	t.Helper()
	caughtWithin(t, budget, "mutation survived %d seeds: the simulator and checkers cannot see this bug", func(seed uint64) error {
		s, h := cadRun(seed, o, nil, tweak, hook)
		return cadJudge(s, h, false)
	})
}

// TestCADSimAsyncFails: async with the leader's overlay (and followers
// serving their applied state) breaks cross-client monotonic reads once
// crashes take acknowledged, read writes away.
func TestCADSimAsyncFails(t *testing.T) {
	cadMutationCaught(t, 50, cadSimOptionsFor(cadModeAsync), cadScenarios[1].tweak, cadScenarios[1].hook)
}

// TestCADSimSyncFollowerReadsFail: sync writes, followers serve their
// applied state without the active set: a lagging follower returns values
// older than ones already read at the leader.
func TestCADSimSyncFollowerReadsFail(t *testing.T) {
	cadMutationCaught(t, 50, cadSimOptionsFor(cadModeSyncFollower), cadScenarios[2].tweak, cadScenarios[2].hook)
}

// TestCADMutationFollowerNoRCheck: a follower that serves its state machine
// without comparing the key's version with R returns values other members
// do not have yet; a later read elsewhere goes back.
func TestCADMutationFollowerNoRCheck(t *testing.T) {
	o := cadSimOptionsFor(cadModeCAD)
	o.cad.noRCheck = true
	// 600 seeds: since the leader sends a new commit point at once while a
	// durability wait needs it (cad.md §13), followers trail R for less time
	// and the first seed that catches this moved from within 80 to 273.
	cadMutationCaught(t, 600, o, cadScenarios[3].tweak, cadScenarios[3].hook)
}

// TestCADMutationLeaderServesPastR: the leader serves whatever it applied
// once R reached the key's update index, although applied may include a
// newer write of the key that R does not cover yet (found by the nemesis
// seeds: the first version of this driver did exactly that).
func TestCADMutationLeaderServesPastR(t *testing.T) {
	o := cadSimOptionsFor(cadModeCAD)
	o.cad.noLeaderRCheck = true
	cadMutationCaught(t, 80, o, nil, nil)
}

// TestCADMutationReadableIgnoresMembers: R advanced to the leader's own
// applied op, past what followers applied.
func TestCADMutationReadableIgnoresMembers(t *testing.T) {
	mutation.Require(t)
	o := cadSimOptionsFor(cadModeCAD)
	o.mut.readableIgnoresMembers = true
	cadMutationCaught(t, 80, o, cadScenarios[2].tweak, cadScenarios[2].hook)
}

// splitmix scrambles x (SplitMix64's finalizer): distinct, well spread
// start nonces for the simulated restarts.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// ---- scenarios aimed at the active set's timing rules ----

// leaderOf returns the index of the replica that leads (-1: none).
func leaderOf(s *sim.Sim) int {
	for i := 0; i < s.Config().Replicas; i++ {
		if n := s.Replica(i); n != nil && n.(*simReplica).core.Info().IsLeader {
			return i
		}
	}
	return -1
}

// atLeader runs fn with the leader's index at each of the given times (a
// time when no replica leads is skipped).
func atLeader(s *sim.Sim, ats []time.Duration, fn func(l int)) {
	for _, at := range ats {
		s.At(at, func() {
			if l := leaderOf(s); l >= 0 {
				fn(l)
			}
		})
	}
}

// randomFollower picks one of the replicas other than l.
func randomFollower(s *sim.Sim, l int) int {
	n := s.Config().Replicas
	return (l + 1 + s.Rand().IntN(n-1)) % n
}

// isolateFollower cuts one follower off from the other replicas (clients
// still reach it) for a while, twice: the leader suspects it and, after
// Removal, drops it from the active set while it still answers clients.
func isolateFollower(s *sim.Sim) {
	atLeader(s, []time.Duration{100 * time.Millisecond, 400 * time.Millisecond}, func(l int) {
		s.Isolate(sim.Addr(randomFollower(s, l)), false)
		s.After(80*time.Millisecond, s.Heal)
	})
}

// defectingLeader: the replica next in line (F2) is cut off from the other
// replicas until it runs a view change for a view it leads; then its link
// with the leader comes back while the third replica (F1, holding a grant)
// still cannot hear F2. The leader, asked to join F2's view, must wait until
// its grant to F1 has run out.
func defectingLeader(s *sim.Sim) {
	atLeader(s, []time.Duration{100 * time.Millisecond, 500 * time.Millisecond}, func(l int) {
		n := s.Config().Replicas
		v := s.Replica(l).(*simReplica).core.view
		f2 := int((v + 1) % uint64(n))
		s.Isolate(sim.Addr(f2), false)
		// F2 times out after ViewChangeTimeout (100 ms in this scenario)
		// and asks for view v+1, which it leads; let it reach the leader
		// then.
		s.After(105*time.Millisecond, func() {
			s.Unblock(sim.Addr(f2), sim.Addr(l))
			s.Unblock(sim.Addr(l), sim.Addr(f2))
		})
		s.After(300*time.Millisecond, s.Heal)
	})
}

// minorityLeader (5 replicas): the leader and one follower are cut off from
// the other three, which form a new view once their lease promises run out.
// The cut-off follower must stop serving by then.
func minorityLeader(s *sim.Sim) {
	atLeader(s, []time.Duration{100 * time.Millisecond, 500 * time.Millisecond}, func(l int) {
		n := s.Config().Replicas
		f1 := (l + 1) % n
		var rest []sim.Addr
		for i := 0; i < n; i++ {
			if i != l && i != f1 {
				rest = append(rest, sim.Addr(i))
			}
		}
		s.Partition([]sim.Addr{sim.Addr(l), sim.Addr(f1)}, rest)
		s.After(200*time.Millisecond, s.Heal)
	})
}

// delayedGrants delays the leader's messages to one follower by 30 ms for
// 8 ms (less than the view-change timeout: the follower stays normal), then
// holds everything newer for a while: the follower gets old grants late and
// none of the newer commits, while the leader has dropped it from the active
// set and moved R past what it applied.
func delayedGrants(s *sim.Sim) {
	atLeader(s, []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 500 * time.Millisecond}, func(l int) {
		from, to := sim.Addr(l), sim.Addr(randomFollower(s, l))
		s.SetLink(from, to, sim.Link{Delay: sim.Dist{Base: 30 * time.Millisecond}})
		s.After(8*time.Millisecond, func() { s.Hold(from, to) })
		s.After(60*time.Millisecond, func() {
			s.SetLink(from, to, defaultLink)
			s.Release(from, to)
		})
	})
}

func noRandomFaults(so *sim.Options) { so.Faults = nil }

// cadTargeted pairs each timing-rule mutation with the scenario aimed at
// it; the correct core must pass the same scenarios.
var cadTargeted = []struct {
	name    string
	mut     func(*mutations)
	cfg     func(*Config)
	tweak   func(*sim.Options)
	hook    func(*sim.Sim)
	plainVR bool // both runs with noPreVote
}{
	{"drop-without-removal", func(m *mutations) { m.dropAtOnce = true },
		func(c *Config) { c.Suspect = 5 * time.Millisecond }, noRandomFaults, isolateFollower, false},
	// Plain VR view changes (noPreVote) in both runs: with pre-votes a leader
	// that holds its lease never hears a binding start-view-change (the f+1
	// replicas that lost it and the f that keep its lease would overlap), so
	// the grant promise is a second line, for peers that run plain VR.
	{"leader-votes-while-granting", func(m *mutations) { m.leaderVotesWhileGranting = true },
		func(c *Config) {
			// Long leases, so the grant outlives the new view's first reads.
			c.ViewChangeTimeout, c.LeaseDuration = 100*time.Millisecond, 90*time.Millisecond
			c.MarkOut, c.Removal = 80*time.Millisecond, 170*time.Millisecond
		}, noRandomFaults, defectingLeader, true},
	{"restarted-leader-votes", func(m *mutations) { m.restartedLeaderVotes = true },
		longGrants, noRandomFaults, restartingDefectingLeader, false},
	{"grant-beyond-leader-lease", func(m *mutations) { m.grantBeyondLease = true },
		nil, func(so *sim.Options) { so.Faults, so.Replicas = nil, 5 }, minorityLeader, false},
	{"grant-timed-from-receipt", func(m *mutations) { m.grantFromReceipt = true },
		func(c *Config) {
			c.MarkOut, c.Removal, c.Suspect = 10*time.Millisecond, 16*time.Millisecond, 5*time.Millisecond
		}, noRandomFaults, delayedGrants, false},
}

// TestCADTimingRules: every timing rule of the active set has a scenario
// that breaks cross-client monotonic reads when the rule is dropped
// (mutation caught), and the correct core passes the same scenario.
func TestCADTimingRules(t *testing.T) {
	mutation.Require(t)
	for _, tc := range cadTargeted {
		t.Run(tc.name, func(t *testing.T) {
			o := cadSimOptionsFor(cadModeCAD)
			o.cad.cfg = tc.cfg
			o.mut.noPreVote = tc.plainVR
			cadExplore(t, seedCount(40, 1000), o, tc.tweak, tc.hook, false)
			o = cadSimOptionsFor(cadModeCAD)
			o.cad.cfg = tc.cfg
			o.mut.noPreVote = tc.plainVR
			tc.mut(&o.mut)
			// 300: with pre-votes restarted-leader-votes is first caught at
			// seed 143 (73 without them).
			cadMutationCaught(t, 300, o, tc.tweak, tc.hook)
		})
	}
}

// ---- the paper's crash experiment (digest 003 E7, §5.4) ----

// crashSequence schedules a random sequence of 3 to 6 faults drawn from
// seed, 20 to 400 ms into the run: crash one replica, crash all of them at
// once (power failure), restart whatever is down, slow one replica's links
// for a while, or heal. Crashes keep a torn prefix of unsynced bytes.
func crashSequence(seed uint64) func(*sim.Sim) {
	x := splitmix(seed ^ 0xe7)
	next := func(n uint64) uint64 {
		x = splitmix(x)
		return x % n
	}
	return func(s *sim.Sim) {
		n := s.Config().Replicas
		k := 3 + int(next(4))
		for i := 0; i < k; i++ {
			at := time.Duration(20+next(380)) * time.Millisecond
			act, who := next(5), int(next(uint64(n)))
			s.At(at, func() {
				switch act {
				case 0:
					s.Crash(who)
					s.After(time.Duration(5+next(40))*time.Millisecond, func() { s.Restart(who) })
				case 1:
					s.CrashAll()
					s.After(time.Duration(5+next(20))*time.Millisecond, func() {
						for j := 0; j < n; j++ {
							s.Restart(j)
						}
					})
				case 2:
					for j := 0; j < n; j++ {
						s.Restart(j)
					}
				case 3:
					slow := sim.Link{Delay: sim.Dist{Base: 2 * time.Millisecond, Jitter: 15 * time.Millisecond}}
					for j := 0; j < n; j++ {
						if j != who {
							s.SetLink(sim.Addr(who), sim.Addr(j), slow)
							s.SetLink(sim.Addr(j), sim.Addr(who), slow)
						}
					}
					s.After(time.Duration(30+next(100))*time.Millisecond, func() {
						for j := 0; j < n; j++ {
							if j != who {
								s.SetLink(sim.Addr(who), sim.Addr(j), defaultLink)
								s.SetLink(sim.Addr(j), sim.Addr(who), defaultLink)
							}
						}
					})
				case 4:
					s.Heal()
				}
			})
		}
		// Everything back up at the end, so the run settles.
		s.At(500*time.Millisecond, func() {
			s.Heal()
			for j := 0; j < n; j++ {
				s.Restart(j)
			}
		})
	}
}

func crashExperimentTweak(so *sim.Options) {
	so.Faults = nil
	so.OpsPerClient = 40
	so.Duration = 1500 * time.Millisecond
}

// crashExperiment runs seeds sequences of configuration o and returns how
// many saw non-monotonic reads (and how many broke any checker at all).
func crashExperiment(t *testing.T, o simOptions, seeds int) (nonMonotonic, failed int) {
	t.Helper()
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		s, h := cadRun(seed, o, nil, crashExperimentTweak, crashSequence(seed))
		if v := check.CrossClientMonotonic(h); !v.OK {
			nonMonotonic++
		}
		if cadJudge(s, h, false) != nil {
			failed++
		}
	}
	return nonMonotonic, failed
}

// TestCADCrashExperiment reproduces paper 003's crash experiment: random
// crash/restart/delay sequences (all-replica crashes included), reads
// spread over every replica, and the fraction of sequences with
// non-monotonic reads per configuration. cad with the active set must show
// none; the weaker configurations must show some (or the experiment could
// not see the anomaly). 50 sequences per configuration by default;
// KEFIR_SOAK=1 runs 500:
//
//	KEFIR_SOAK=1 go test -run TestCADCrashExperiment -v ./internal/vr/
func TestCADCrashExperiment(t *testing.T) {
	seeds := 50
	if soak() {
		seeds = 500
	}
	type row struct {
		mode      cadMode
		bad, fail int
		stats     *cadStats
	}
	var rows []row
	for _, mode := range []cadMode{cadModeAsync, cadModeSyncFollower, cadModeCAD} {
		o := cadSimOptionsFor(mode)
		bad, fail := crashExperiment(t, o, seeds)
		rows = append(rows, row{mode, bad, fail, o.cad.stats})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "crash experiment, %d sequences per configuration (paper: 83-96%% / 37%% / 0%%)\n", seeds)
	fmt.Fprintf(&b, "%-22s %16s %14s  %s\n", "configuration", "non-monotonic", "any checker", "paths")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-22s %4d (%5.1f%%) %5d (%5.1f%%)  %s\n", r.mode, r.bad, 100*float64(r.bad)/float64(seeds),
			r.fail, 100*float64(r.fail)/float64(seeds), r.stats)
	}
	t.Log(b.String())
	for _, r := range rows {
		switch {
		case r.mode == cadModeCAD && r.fail > 0:
			t.Errorf("cad with the active set failed a checker in %d of %d sequences", r.fail, seeds)
		case r.mode != cadModeCAD && r.bad == 0:
			t.Errorf("%s never showed non-monotonic reads: the experiment cannot see the anomaly", r.mode)
		}
	}
}

// restartingDefectingLeader is defectingLeader with the leader crashed just
// after it sent a grant (it heartbeats every 5 ms, each carrying grants)
// and restarted from its intact disk 1 ms later, as F2's link to it comes
// back (issue 24 item 1). The restarted leader forgot the promise its
// grant to F1 made (promiseUntil lives in memory); it must keep it anyway,
// by not helping F2 form view v+1 for a lease period after its restart.
func restartingDefectingLeader(s *sim.Sim) {
	atLeader(s, []time.Duration{100 * time.Millisecond, 500 * time.Millisecond}, func(l int) {
		n := s.Config().Replicas
		v := s.Replica(l).(*simReplica).core.view
		f2 := int((v + 1) % uint64(n))
		s.Isolate(sim.Addr(f2), false)
		crashAt := 100*time.Millisecond + time.Duration(s.Rand().IntN(5000))*time.Microsecond
		s.After(crashAt, func() {
			s.Crash(l)
			s.After(time.Millisecond, func() { s.Restart(l) })
		})
		s.After(105*time.Millisecond, func() {
			s.Unblock(sim.Addr(f2), sim.Addr(l))
			s.Unblock(sim.Addr(l), sim.Addr(f2))
		})
		s.After(300*time.Millisecond, s.Heal)
	})
}

// TestCADSimRestartedLeaderKeepsGrants (issue 24 item 1): the defecting-
// leader schedule with the leader crashed just after a grant and restarted
// 1 ms later. Before the fix the restarted leader helped F2 form view v+1
// at once, while F1 still served view v's state under its grant: about 1.5 %
// of the seeds broke cross-client monotonic reads (seeds 73 and 106 of the
// first 150), so this runs enough seeds to see it.
func TestCADSimRestartedLeaderKeepsGrants(t *testing.T) {
	o := cadSimOptionsFor(cadModeCAD)
	o.cad.cfg = longGrants
	cadExplore(t, seedCount(150, 3000), o, noRandomFaults, restartingDefectingLeader, false)
}

// TestCADMutationRestartedLeaderVotes: the randomized leader-restarts
// schedule sees a restarted leader that helps form a view at once.
func TestCADMutationRestartedLeaderVotes(t *testing.T) {
	mutation.Require(t)
	i := slices.IndexFunc(cadScenarios, func(sc cadScenario) bool { return sc.name == "leader-restarts" })
	sc := cadScenarios[i]
	o := cadSimOptionsFor(cadModeCAD)
	o.cad.cfg = sc.cfg
	o.mut.restartedLeaderVotes = true
	// Seed 110 catches it since pre-votes (seed 51 before: a lone restarted
	// replica no longer drags the group through extra view changes).
	cadMutationCaught(t, 300, o, sc.tweak, sc.hook)
}
