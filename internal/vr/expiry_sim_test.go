package vr

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/simkv"
)

// Key expiry in the simulator (docs/design/expiry.md). Every replica has a
// wall clock: the simulation's virtual time plus a fixed offset drawn per
// replica within ±skew (the sim's own node clocks, whose offsets are
// arbitrary, serve leases; wall clocks serve expiry). Clients write values
// with absolute expiries on the recorder's clock (PXAT); the leader stamps
// its wall clock into each op it proposes (kv.Op.Now), every replica
// applies with that, and a replica serving a read decides expiry at its
// own wall clock, plus skew unless it leads (vrshard's readNow). The rest
// of the workload (session, eventual and linearizable reads of keys
// without expiry, crashes, partitions) runs as in the session runs, and
// check.Expiry judges the keys with expiries with bound 2·skew + 2 ms (a
// follower ahead by skew hides keys early by twice it; ms rounding).

// ttlSim configures a run with expiries; its mutations are the bugs the
// run must catch.
type ttlSim struct {
	skew int64        // ns: bound on every wall clock's offset from true time
	now  func() int64 // the simulation's virtual time (set by the hook)
	seed uint64

	followerIgnoresTTL bool // a follower serves reads without deciding expiry
	replicaClock       bool // the state machine decides expiry with the replica's own clock
	replicaDeletes     bool // a follower deletes keys it finds expired on its own
	// active: the leader runs active expiry (kv.KindExpireIfDue of the keys
	// its state has expired, every few ms); activeDel is its mutation, a
	// plain DEL that does not recheck at apply.
	active, activeDel bool
	proposed          *int               // active expiry deletes proposed (counted across runs)
	last              map[sim.Addr]int64 // when each replica's active expiry last ran (wall ns)
}

// activeEvery is the simulated leader's active expiry tick.
const activeEvery = 5 * time.Millisecond

const ttlSkew = 2 * time.Millisecond

// wall is replica id's wall clock in ns.
func (t *ttlSim) wall(id sim.Addr) int64 {
	off := int64(splitmix(t.seed*1000003+uint64(id)) % uint64(2*t.skew+1))
	return t.now() + off - t.skew
}

func toMs(ns int64) int64 { return ns / int64(time.Millisecond) }

// proposeNow is the Now a leader stamps into the ops it proposes.
func (n *simReplica) proposeNow() int64 {
	if n.o.ttl == nil {
		return 0
	}
	return toMs(n.o.ttl.wall(n.id))
}

// readNow is the time a read this replica serves decides expiry at.
func (n *simReplica) readNow() int64 {
	t := n.o.ttl
	if t == nil {
		return 0
	}
	if n.core.Info().IsLeader {
		return toMs(t.wall(n.id))
	}
	if t.followerIgnoresTTL {
		return 0 // no expiry at all
	}
	return toMs(t.wall(n.id) + t.skew)
}

// applyClock is the clock that overrides the ops' Now (0: none, correct).
func (n *simReplica) applyClock() int64 {
	if t := n.o.ttl; t != nil && t.replicaClock {
		return toMs(n.now) // the replica's own (sim) clock, not the op's
	}
	return 0
}

// expiryClientBase marks the client ids a leader's active expiry proposes
// with (one per replica; its request numbers are its local clock, which
// only grows): no reply goes to them.
const expiryClientBase = 1 << 40

func isExpiryClient(c uint64) bool { return c >= expiryClientBase }

// expiryTick runs the leader's active expiry (or, the replicaDeletes
// mutation, a follower that drops the keys it finds expired, without the
// log).
func (n *simReplica) expiryTick() {
	t := n.o.ttl
	if t == nil {
		return
	}
	if t.active && n.core.Info().IsLeader {
		n.activeExpiry()
		return
	}
	if !t.replicaDeletes || n.core.Info().IsLeader {
		return
	}
	now := toMs(t.wall(n.id))
	for _, k := range n.state.Keys() {
		if v := n.state.Record(k); v.Exists && kv.Expired([]byte(v.Meta), now) {
			n.state.Put(k, simkv.Record{Version: v.Version})
		}
	}
}

// activeExpiry proposes the deletion of the keys this leader's applied
// state has expired by its wall clock, as internal/server's cycle does: a
// kv.KindExpireIfDue stamped with the leader's clock, which every replica
// applies with that Now, rechecking each key (a write ordered in between
// wins). The keys go in sorted order: a map's order is random and the run
// must replay from its seed.
func (n *simReplica) activeExpiry() {
	t := n.o.ttl
	wall := t.wall(n.id)
	if wall-t.last[n.id] < int64(activeEvery) {
		return
	}
	t.last[n.id] = wall
	now := toMs(wall)
	var keys []string
	for _, k := range n.state.Keys() { // in order: the run must replay from its seed
		if v := n.state.Record(k); v.Exists && kv.Expired([]byte(v.Meta), now) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return
	}
	op := kv.Op{Kind: kv.KindExpireIfDue, Now: now}
	if t.activeDel {
		op.Kind = kv.KindDel
	}
	for _, k := range keys {
		op.Keys = append(op.Keys, []byte(k))
	}
	req := Request{Client: expiryClientBase + uint64(n.id), ReqNum: uint64(n.now), Data: kv.AppendOp(nil, &op)}
	if err := n.core.Propose(n.now, req); err == nil && t.proposed != nil {
		*t.proposed += len(keys)
	}
}

// ttlWorkload sends half the operations (incr's excepted) to keys "t…",
// whose puts expire 2 to 40 ms after they are invoked.
type ttlWorkload struct {
	sessionWorkload
	t *ttlSim
}

func (w ttlWorkload) Next(rng *rand.Rand, client, seq int) check.Op {
	op := w.sessionWorkload.Next(rng, client, seq)
	if op.Kind == check.Incr || rng.IntN(2) == 0 {
		return op
	}
	op.Key = "t" + op.Key
	if op.Kind == check.Put {
		op.ExpireAt = w.t.now() + int64(2*time.Millisecond) + rng.Int64N(int64(38*time.Millisecond))
	}
	return op
}

// ttlRun runs one seed with expiries (and the mutations t carries).
func ttlRun(seed uint64, o simOptions, t ttlSim, trace io.Writer) (*sim.Sim, check.History) {
	t.seed, t.skew, t.last = seed, int64(ttlSkew), map[sim.Addr]int64{}
	o.ttl = &t
	return simRunHook(seed, o, trace, func(so *sim.Options) {
		eventualTweak(so)
		so.Workload = ttlWorkload{so.Workload.(sessionWorkload), o.ttl}
	}, func(s *sim.Sim) { o.ttl.now = func() int64 { return int64(s.Now()) } })
}

// ttlBound is check.Expiry's bound for these runs.
const ttlBound = 2*int64(ttlSkew) + 2*int64(time.Millisecond)

// judgeTTL: the keys without expiry are held to everything the session
// runs promise; those with expiries to check.Expiry; replicas agree.
func judgeTTL(s *sim.Sim, h check.History) (general, expiry error) {
	plain, exp := check.SplitExpiring(h)
	return errors.Join(judgeSession(s, plain), eventualVerdict(plain).Err()), check.Expiry(exp, ttlBound).Err()
}

// TestSimExpiry: under the session runs' faults, with wall clocks apart by
// up to ttlSkew, no read at any level returns a value after its expiry (within
// the bound), linearizable reads see a value until it expires, and replicas
// that applied the same ops hold the same state (expiry decided by op.Now).
func TestSimExpiry(t *testing.T) {
	o := defaultSimOptions()
	o.counters = &simCounters{}
	o.session = &sessionCounters{}
	var expiring, expiredReads, liveReads, proposed int
	sim.Explore(t, 1, seedCount(60, 3000), func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h := ttlRun(seed, o, ttlSim{active: true, proposed: &proposed}, trace)
		_, exp := check.SplitExpiring(h)
		for _, op := range exp.Ops {
			switch {
			case op.Kind == check.Put && op.ExpireAt != 0:
				expiring++
			case op.Kind == check.Get && op.Outcome == check.OK && op.Found:
				liveReads++
			case op.Kind == check.Get && op.Outcome == check.OK:
				expiredReads++
			}
		}
		g, e := judgeTTL(s, h)
		return errors.Join(g, e)
	})
	t.Logf("puts with expiry %d; reads of keys with expiries: %d found, %d absent; eventual reads %d by followers; active expiry proposed %d deletes",
		expiring, liveReads, expiredReads, o.session.eventualByFollower, proposed)
	if expiring == 0 || liveReads == 0 || expiredReads == 0 || o.session.eventualByFollower == 0 || proposed == 0 {
		t.Error("the runs did not exercise expiry")
	}
}

// Which checks must catch a mutation.
const (
	byGeneral = 1 << iota // the session runs' checks and replica agreement
	byExpiry              // check.Expiry
)

// ttlCaught runs seeds until the mutation m breaks one of the checks by
// names and fails the test if none does.
func ttlCaught(t *testing.T, budget int, m ttlSim, by int) {
	t.Helper()
	o := defaultSimOptions()
	o.session = &sessionCounters{}
	caughtWithin(t, budget, "mutation survived %d seeds", func(seed uint64) error {
		s, h := ttlRun(seed, o, m, nil)
		g, e := judgeTTL(s, h)
		var errs []error
		if by&byGeneral != 0 {
			errs = append(errs, g)
		}
		if by&byExpiry != 0 {
			errs = append(errs, e)
		}
		return errors.Join(errs...)
	})
}

// TestMutationFollowerIgnoresTTL: a follower that serves weak reads without
// deciding expiry returns expired values, and check.Expiry sees it.
func TestMutationFollowerIgnoresTTL(t *testing.T) {
	ttlCaught(t, 100, ttlSim{followerIgnoresTTL: true}, byExpiry)
}

// TestMutationStateMachineReadsClock: a state machine that decides expiry
// with its replica's clock instead of the op's Now: replicas disagree, or
// (clocks all far off, as the sim's node clocks are) values vanish as they
// are written and a linearizable read misses one.
func TestMutationStateMachineReadsClock(t *testing.T) {
	ttlCaught(t, 100, ttlSim{replicaClock: true}, byGeneral|byExpiry)
}

// TestMutationReplicaDeletesOnItsOwn: a follower that deletes expired keys
// itself, outside the log, ends with a state its peers do not have.
func TestMutationReplicaDeletesOnItsOwn(t *testing.T) {
	ttlCaught(t, 100, ttlSim{replicaDeletes: true}, byGeneral)
}

// TestMutationActiveExpiryWithoutRecheck: a leader whose active expiry
// deletes what it found expired with a plain DEL, without rechecking at
// apply, deletes a value written between its scan and the delete, and a
// linearizable read misses a value before its expiry.
func TestMutationActiveExpiryWithoutRecheck(t *testing.T) {
	ttlCaught(t, 400, ttlSim{active: true, activeDel: true}, byExpiry)
}
