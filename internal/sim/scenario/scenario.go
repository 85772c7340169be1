// Package scenario is Kefir's library of fixed, protocol-independent fault
// schedules: the executions the papers and digests single out (digest 004
// §2.4 Figure 6 and §6.1; digest 003 §2.7 Figure 4, §1.2 Figure 1 and §5.4),
// written once as steps on a simulated cluster so every engine (VR, VR with
// the nilext path, CAD, chain) runs the same schedule and is judged by the
// same checkers.
//
// A scenario speaks only of replicas by index, clients, messages on links,
// crashes and client operations. It never names a protocol message, so a step
// that does not apply to an engine (holding a client's copy to a replica the
// engine's client never writes to) is simply a no-op there. By convention
// replica 0 is the initial leader, primary or head; an engine whose initial
// leader is elsewhere maps indexes in its factories.
//
// It imports internal/sim and internal/check only.
package scenario

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/sim"
)

// Engine is what a replication engine supplies to run scenarios.
type Engine struct {
	Name           string
	NewReplica     sim.ReplicaFactory
	NewReplicaBoot sim.BootFactory // instead of NewReplica, for replicas with their own disk
	NewClient      sim.ClientFactory
	// Settle is how long (virtual time) the engine needs to recover from a
	// crash or partition: elect, sync, re-form its active set (default 2s).
	Settle time.Duration
	// Await bounds how long a step waits for one client operation (default 1s).
	// An operation still pending then stays pending (unknown outcome).
	Await time.Duration
	// Sync is the fsync latency (default: the simulator's). A slow disk
	// keeps records written but unsynced long enough for a crash step to
	// catch them (a power cut loses them).
	Sync sim.Dist
}

// Checker judges a history.
type Checker struct {
	Name  string
	Check func(check.History) check.Verdict
}

// The checkers scenarios use.
var (
	Linearizable = Checker{"linearizable", func(h check.History) check.Verdict {
		return check.Linearizable(h, check.LinOptions{})
	}}
	CrossClient = Checker{"cross-client-monotonic", check.CrossClientMonotonic}
	Durability  = Checker{"durability", check.Durability}
	Session     = Checker{"session", func(h check.History) check.Verdict {
		return check.Session(h, check.SessionOptions{})
	}}
)

// Scenario is a fixed schedule and the promises it tests.
type Scenario struct {
	Name     string
	Source   string // where it comes from
	Doc      string // what it does and what a correct engine must show
	Replicas int
	Clients  int
	Steps    []Step
	Checks   []Checker
	// KnownHazard, if set, says the schedule can legitimately break an engine
	// that follows the paper faithfully (digest 004 §6.1). Engines must report
	// their outcome explicitly rather than assume a pass.
	KnownHazard string
}

// Step is one action of a schedule.
type Step struct {
	Doc string
	do  func(r *runner) error
}

func (s Step) String() string { return s.Doc }

type runner struct {
	s   *sim.Sim
	e   Engine
	sc  *Scenario
	cfg sim.Config
}

// Result is a run's outcome.
type Result struct {
	History  check.History
	Verdicts []check.Verdict
	Stats    sim.Stats
}

// Err joins the failing verdicts (nil if all passed).
func (r Result) Err() error {
	var errs []error
	for _, v := range r.Verdicts {
		if err := v.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Run plays the scenario on engine e. Network: fixed 1ms links without loss or
// jitter, so "held" and "released" decide every arrival order; seed only
// drives what the engine's own timing leaves to chance (clock drift, disk
// latency).
func (sc *Scenario) Run(e Engine, seed uint64, trace io.Writer) (Result, error) {
	if e.Settle == 0 {
		e.Settle = 2 * time.Second
	}
	if e.Await == 0 {
		e.Await = time.Second
	}
	s := sim.New(sim.Options{
		Seed: seed, Replicas: sc.Replicas, Clients: sc.Clients,
		NewReplica: e.NewReplica, NewReplicaBoot: e.NewReplicaBoot, NewClient: e.NewClient,
		Net:      sim.Link{Delay: sim.Dist{Base: time.Millisecond}},
		MaxDrift: 50e-6,
		Sync:     e.Sync,
		Duration: time.Hour,
		Trace:    trace,
	})
	r := &runner{s: s, e: e, sc: sc, cfg: s.Config()}
	// Let the engine start up (elect its first leader).
	s.RunFor(e.Settle)
	for i, st := range sc.Steps {
		if trace != nil {
			fmt.Fprintf(trace, "---- step %d: %s\n", i+1, st.Doc)
		}
		if err := st.do(r); err != nil {
			return Result{History: s.History(), Stats: s.Stats()}, fmt.Errorf("scenario %s step %d (%s): %w", sc.Name, i+1, st.Doc, err)
		}
	}
	s.RunFor(e.Settle) // let pending operations finish
	res := Result{History: s.History(), Stats: s.Stats()}
	for _, c := range sc.Checks {
		res.Verdicts = append(res.Verdicts, c.Check(res.History))
	}
	return res, nil
}

// Client returns the address of client i in a cluster of n replicas.
func client(r *runner, i int) sim.Addr { return r.cfg.ClientAddr(i) }

// Invoke starts op on client c without waiting.
func Invoke(c int, op check.Op) Step {
	return Step{fmt.Sprintf("c%d invokes %s", c, describe(op)), func(r *runner) error {
		r.s.Invoke(c, op)
		return nil
	}}
}

// InvokeVia starts op on client c, routed to replica n (a follower read).
func InvokeVia(c, n int, op check.Op) Step {
	return Step{fmt.Sprintf("c%d invokes %s via replica %d", c, describe(op), n), func(r *runner) error {
		r.s.InvokeVia(c, op, n)
		return nil
	}}
}

// Await runs until client c's operation completes or the engine's Await
// bound passes (the operation then stays pending: unknown outcome). It then
// lets 10µs pass, so the next operation strictly follows in real time (the
// checkers treat touching intervals as concurrent).
func Await(c int) Step {
	return Step{fmt.Sprintf("await c%d", c), func(r *runner) error {
		deadline := r.s.Now() + r.e.Await
		for !r.s.Idle(c) && r.s.Now() < deadline {
			r.s.RunFor(100 * time.Microsecond)
		}
		r.s.RunFor(10 * time.Microsecond)
		return nil
	}}
}

// Do is Invoke followed by Await.
func Do(c int, op check.Op) []Step { return []Step{Invoke(c, op), Await(c)} }

// Sleep lets d of virtual time pass.
func Sleep(d time.Duration) Step {
	return Step{fmt.Sprintf("sleep %v", d), func(r *runner) error { r.s.RunFor(d); return nil }}
}

// Settle lets the engine's settle time pass.
func Settle() Step {
	return Step{"settle", func(r *runner) error { r.s.RunFor(r.e.Settle); return nil }}
}

// Crash crashes replica n.
func Crash(n int) Step {
	return Step{fmt.Sprintf("crash replica %d", n), func(r *runner) error { r.s.Crash(n); return nil }}
}

// CrashAll crashes every replica at once (power failure).
func CrashAll() Step {
	return Step{"crash all replicas", func(r *runner) error { r.s.CrashAll(); return nil }}
}

// Restart restarts replica n from its disk.
func Restart(n int) Step {
	return Step{fmt.Sprintf("restart replica %d", n), func(r *runner) error { r.s.Restart(n); return nil }}
}

// RestartAll restarts every crashed replica.
func RestartAll() Step {
	return Step{"restart all replicas", func(r *runner) error {
		for i := 0; i < r.cfg.Replicas; i++ {
			r.s.Restart(i)
		}
		return nil
	}}
}

// HoldClient holds client c's messages to each of replicas: they arrive
// only when released.
func HoldClient(c int, replicas ...int) Step {
	return Step{fmt.Sprintf("hold c%d -> replicas %v", c, replicas), func(r *runner) error {
		for _, n := range replicas {
			r.s.Hold(client(r, c), sim.Addr(n))
		}
		return nil
	}}
}

// ReleaseClient delivers client c's held messages to each replica, one
// replica after the other 100µs apart, in the order given.
func ReleaseClient(c int, replicas ...int) Step {
	return Step{fmt.Sprintf("release c%d -> replicas %v", c, replicas), func(r *runner) error {
		for _, n := range replicas {
			r.s.Release(client(r, c), sim.Addr(n))
			r.s.RunFor(100 * time.Microsecond)
		}
		return nil
	}}
}

// Isolate cuts replica n from the other replicas, both ways; clients still
// reach it.
func Isolate(n int) Step {
	return Step{fmt.Sprintf("isolate replica %d from replicas", n), func(r *runner) error {
		r.s.Isolate(sim.Addr(n), false)
		return nil
	}}
}

// Block cuts the one-way link between replicas from -> to.
func Block(from, to int) Step {
	return Step{fmt.Sprintf("block replica %d -> replica %d", from, to), func(r *runner) error {
		r.s.Block(sim.Addr(from), sim.Addr(to))
		return nil
	}}
}

// Partition splits replicas into groups (clients reach everyone).
func Partition(groups ...[]int) Step {
	return Step{fmt.Sprintf("partition %v", groups), func(r *runner) error {
		var g [][]sim.Addr
		for _, grp := range groups {
			var a []sim.Addr
			for _, n := range grp {
				a = append(a, sim.Addr(n))
			}
			g = append(g, a)
		}
		r.s.Partition(g...)
		return nil
	}}
}

// Heal removes partitions and releases held links.
func Heal() Step {
	return Step{"heal", func(r *runner) error { r.s.Heal(); return nil }}
}

func describe(op check.Op) string {
	var s string
	switch op.Kind {
	case check.Put:
		s = fmt.Sprintf("put(%s,%s)", op.Key, op.Value)
	case check.CAS:
		s = fmt.Sprintf("cas(%s,%s->%s)", op.Key, op.Expect, op.Value)
	case check.Incr:
		s = fmt.Sprintf("incr(%s,%d)", op.Key, op.Delta)
	default:
		s = fmt.Sprintf("%v(%s)", op.Kind, op.Key)
	}
	if !op.Cons.IsZero() {
		s += " " + op.Cons.String()
	}
	if !op.Dur.IsZero() {
		s += " " + op.Dur.String()
	}
	return s
}

// Operation shorthands.

// Put writes key=val (nilext).
func Put(key, val string, d level.Durability) check.Op {
	return check.Op{Kind: check.Put, Key: key, Value: val, Dur: d}
}

// Get reads key at consistency c.
func Get(key string, c level.Consistency) check.Op {
	return check.Op{Kind: check.Get, Key: key, Cons: c}
}
