package vr

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
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
	servedByFollower, servedByLeader, redirected, waited int
}

// onSession serves, redirects or parks a session read.
func (n *simReplica) onSession(from sim.Addr, m sessionReq) {
	need := m.need()
	if n.o.sessionNoToken {
		need = 0 // the mutation: serve whatever this replica has applied
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

// sessionClient is simClient plus a session token: writes and linearizable
// reads go to the leader as before; session reads go to a random replica.
type sessionClient struct {
	id       sim.Addr
	n        int
	leader   int // where writes and linearizable reads go
	target   int // where the request in flight went
	seq      uint64
	op       check.Op
	inflight bool
	ticks    int
	tries    int
	out      sim.Ready
	timeout  int
	maxTries int

	lastWrite, maxRead uint64
	rnd                uint64 // xorshift state, seeded from the virtual time of each invocation
}

func newSessionClient(timeout, maxTries int) sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		return &sessionClient{id: id, n: cfg.Replicas, timeout: timeout, maxTries: maxTries}
	}
}

func (c *sessionClient) Ready() sim.Ready {
	rd := c.out
	c.out = sim.Ready{}
	return rd
}

func (c *sessionClient) session() bool {
	return c.op.Kind == check.Get && c.op.Cons.Kind == level.Session
}

// random is deterministic per simulation seed: the invocation times differ
// from seed to seed, the client has no other source.
func (c *sessionClient) random(n int) int {
	c.rnd ^= c.rnd << 13
	c.rnd ^= c.rnd >> 7
	c.rnd ^= c.rnd << 17
	return int(c.rnd % uint64(n))
}

func (c *sessionClient) send() {
	c.tries++
	c.ticks = 0
	var msg any = clientReq{Seq: c.seq, Op: c.op}
	if c.session() {
		msg = sessionReq{Seq: c.seq, Op: c.op, LastWrite: c.lastWrite, MaxRead: c.maxRead}
	}
	c.out.Messages = append(c.out.Messages, sim.Envelope{To: sim.Addr(c.target), Msg: msg})
}

func (c *sessionClient) giveUp() {
	c.inflight = false
	c.out.Done = append(c.out.Done, sim.Completion{Seq: c.seq, Outcome: check.Unknown})
}

// learn advances the token with an acknowledged result. A write's version is
// the op that wrote it (a failed CAS reports the version it found, which is
// what the session then knows to exist).
func (c *sessionClient) learn(res check.Result) {
	if c.op.Kind.IsWrite() {
		c.lastWrite = max(c.lastWrite, res.Version)
	} else {
		c.maxRead = max(c.maxRead, res.Version)
	}
}

func (c *sessionClient) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Invoke:
		c.seq, c.op, c.inflight, c.tries = ev.Seq, ev.Op, true, 0
		c.rnd = uint64(ev.Now)*2654435761 + uint64(c.id)*40503 + c.seq | 1
		c.target = c.leader
		if c.session() {
			c.target = c.random(c.n)
		}
		c.send()
	case sim.Message:
		m, ok := ev.Msg.(clientResp)
		if !ok || !c.inflight || m.Seq != c.seq {
			return
		}
		if m.OK {
			c.inflight = false
			c.learn(m.Result)
			c.out.Done = append(c.out.Done, sim.Completion{Seq: m.Seq, Outcome: check.OK, Result: m.Result})
			return
		}
		if m.Leader >= 0 && m.Leader != c.target {
			c.leader, c.target = m.Leader, m.Leader
			if c.tries >= c.maxTries {
				c.giveUp()
				return
			}
			c.send()
		}
		// Otherwise wait: the timeout moves on to another replica.
	case sim.Tick:
		if !c.inflight {
			return
		}
		c.ticks++
		if c.ticks >= c.timeout {
			if c.tries >= c.maxTries {
				c.giveUp()
				return
			}
			c.target = (c.target + 1) % c.n
			if !c.session() {
				c.leader = c.target
			}
			c.send()
		}
	}
}

// sessionWorkload turns two reads in three into session reads.
type sessionWorkload struct{ sim.KV }

func (w sessionWorkload) Next(rng *rand.Rand, client, seq int) check.Op {
	op := w.KV.Next(rng, client, seq)
	if op.Kind == check.Get && rng.IntN(3) != 0 {
		op.Cons = level.ConsSession
	}
	return op
}

// sessionTweak: the default fault mix, with session clients and more reads.
func sessionTweak(so *sim.Options) {
	kv := so.Workload.(sim.KV)
	kv.Get = 8
	so.Workload = sessionWorkload{kv}
	so.NewClient = newSessionClient(30, 12)
}

// judgeSession is judge plus the session guarantees of session reads.
func judgeSession(s *sim.Sim, h check.History) error {
	err := judge(s, h)
	v := check.Session(h, check.SessionOptions{})
	return errors.Join(err, v.Err())
}

// exploreSession runs seeds with session clients and fails on any checker
// violation; it returns the counters of the runs.
func exploreSession(t *testing.T, seeds int, o simOptions) (sessionCounters, runStats) {
	var st runStats
	o.counters = &simCounters{}
	o.session = &sessionCounters{}
	sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h := simRun(seed, o, trace, sessionTweak)
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
	c, st := exploreSession(t, seedCount(2000, 20000), defaultSimOptions())
	if st.ok < st.ops/3 {
		t.Errorf("only %d of %d operations completed: the group is not making progress", st.ok, st.ops)
	}
	// The run must exercise every branch it claims to: followers serving,
	// followers redirecting a token they cannot prove, the leader waiting.
	if c.servedByFollower == 0 || c.redirected == 0 || c.servedByLeader == 0 {
		t.Errorf("session path not exercised: %+v", c)
	}
}

// TestMutationSessionNoToken: replicas that serve session reads from their
// applied state without checking the token return reads older than the
// session's own writes (or than what it read before), and check.Session sees it.
func TestMutationSessionNoToken(t *testing.T) {
	o := defaultSimOptions()
	o.sessionNoToken = true
	for seed := uint64(1); seed <= 2000; seed++ {
		var err, serr error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			s, h := simRun(seed, o, nil, sessionTweak)
			err = judge(s, h)
			serr = check.Session(h, check.SessionOptions{}).Err()
		}()
		if err != nil {
			t.Fatalf("seed %d: the mutation broke a check it does not touch: %v", seed, err)
		}
		if serr != nil {
			msg := serr.Error()
			if len(msg) > 600 {
				msg = msg[:600] + "..."
			}
			t.Logf("caught by check.Session at seed %d: %s", seed, msg)
			return
		}
	}
	t.Fatal("mutation survived 2000 seeds: the session checker cannot see a replica that ignores the token")
}
