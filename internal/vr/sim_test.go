package vr

import (
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/sim"
)

// soak reports whether KEFIR_SOAK=1 asks for the long runs.
func soak() bool { return os.Getenv("KEFIR_SOAK") == "1" }

func simRun(seed uint64, o simOptions, trace io.Writer, tweak func(*sim.Options)) (*sim.Sim, check.History) {
	so := sim.Options{
		Seed:       seed,
		Replicas:   3,
		Clients:    4,
		NewReplica: newSimReplica(o),
		NewClient:  newSimClient(30, 12),
		Net: sim.Link{
			Delay: sim.Dist{Base: 200 * time.Microsecond, Jitter: 600 * time.Microsecond, Exp: true},
			Drop:  0.02,
			Dup:   0.02,
		},
		MaxDrift:     o.drift,
		Torn:         true,
		Workload:     sim.KV{Keys: 3, Get: 4, Put: 4, CAS: 1, Incr: 1, Dur: level.Sync},
		OpsPerClient: 40,
		Think:        sim.Dist{Jitter: 3 * time.Millisecond},
		Faults: &sim.Faults{
			Every: sim.Dist{Base: 30 * time.Millisecond, Jitter: 60 * time.Millisecond},
			Until: 600 * time.Millisecond,
		},
		Duration: 3 * time.Second,
		Trace:    trace,
	}
	if tweak != nil {
		tweak(&so)
	}
	s := sim.New(so)
	return s, s.Run()
}

func defaultSimOptions() simOptions {
	return simOptions{lease: 30 * time.Millisecond, drift: 1e-3, checkpoint: 24, keep: 6}
}

// judge runs the checkers the VR core promises through this driver.
func judge(s *sim.Sim, h check.History) error {
	var errs []error
	if v := check.Linearizable(h, check.LinOptions{Timeout: 5 * time.Second}); !v.OK {
		errs = append(errs, v.Err())
	}
	if v := check.Durability(h); !v.OK {
		errs = append(errs, v.Err())
	}
	if err := checkAgreement(s, s.Config().Replicas); err != nil {
		errs = append(errs, err)
	}
	for i := 0; i < s.Config().Replicas; i++ {
		if n := s.Replica(i); n != nil {
			if e := n.(*simReplica).errs; len(e) > 0 {
				errs = append(errs, fmt.Errorf("replica %d reported: %v", i, e[0]))
			}
		}
	}
	return errors.Join(errs...)
}

type runStats struct {
	seeds, ops, ok, unknown, crashes, views int
}

func (st *runStats) add(s *sim.Sim, h check.History) {
	st.seeds++
	st.ops += len(h.Ops)
	for _, op := range h.Ops {
		if op.Outcome == check.OK {
			st.ok++
		} else {
			st.unknown++
		}
	}
	st.crashes += s.Stats().Crashes
	for i := 0; i < s.Config().Replicas; i++ {
		if n := s.Replica(i); n != nil {
			st.views = max(st.views, int(n.(*simReplica).core.view))
		}
	}
}

func explore(t *testing.T, seeds int, o simOptions, tweak func(*sim.Options)) runStats {
	var st runStats
	sim.Explore(t, 1, seeds, func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h := simRun(seed, o, trace, tweak)
		if trace == nil {
			st.add(s, h)
		}
		return judge(s, h)
	})
	t.Logf("%d seeds: %d ops, %d ok, %d unknown; %d crashes; highest view %d", st.seeds, st.ops, st.ok, st.unknown, st.crashes, st.views)
	if st.ok < st.ops/3 {
		t.Errorf("only %d of %d operations completed: the group is not making progress", st.ok, st.ops)
	}
	return st
}

func seedCount(def, soakN int) int {
	if soak() {
		return soakN
	}
	if testing.Short() {
		return def / 5
	}
	return def
}

// TestSimLinearizable: under drops, duplicates, reordering, partitions, clock
// drift and crashes that lose unsynced data, every history is linearizable,
// no acknowledged sync write is lost, and committed logs agree. Reads use the
// leader lease when held and read-index otherwise.
func TestSimLinearizable(t *testing.T) {
	explore(t, seedCount(150, 3000), defaultSimOptions(), nil)
}

// TestSimReadIndexOnly: the same, with leases off, so every linearizable read
// goes through read-index.
func TestSimReadIndexOnly(t *testing.T) {
	o := defaultSimOptions()
	o.lease = 0
	explore(t, seedCount(60, 1000), o, nil)
}

// TestSimFiveReplicas: f = 2, up to two replicas down at once.
func TestSimFiveReplicas(t *testing.T) {
	explore(t, seedCount(40, 800), defaultSimOptions(), func(o *sim.Options) { o.Replicas = 5 })
}

// mutationCaught runs the simulation with a deliberate bug until a checker
// fails, and fails the test if none does within budget seeds: proof that the
// suite above can see that class of bug.
func mutationCaught(t *testing.T, budget int, o simOptions, tweak func(*sim.Options)) {
	t.Helper()
	for seed := uint64(1); seed <= uint64(budget); seed++ {
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			s, h := simRun(seed, o, nil, tweak)
			err = judge(s, h)
		}()
		if err != nil {
			msg := err.Error()
			if len(msg) > 600 {
				msg = msg[:600] + "..."
			}
			t.Logf("caught at seed %d of %d: %s", seed, budget, msg)
			return
		}
	}
	t.Fatalf("mutation survived %d seeds: the simulator and checkers cannot see this bug", budget)
}

// TestMutationCommitWithoutQuorum: a leader that commits (and answers) as
// soon as it has written an entry loses acknowledged writes when it fails.
func TestMutationCommitWithoutQuorum(t *testing.T) {
	o := defaultSimOptions()
	o.mut.commitWithoutQuorum = true
	mutationCaught(t, 100, o, nil)
}

// TestMutationNoLeaseCheck: a deposed leader that serves reads without a
// lease returns stale values.
func TestMutationNoLeaseCheck(t *testing.T) {
	o := defaultSimOptions()
	o.mut.noLeaseCheck = true
	mutationCaught(t, 100, o, nil)
}

// TestMutationSkipClientTable: without the client table, a retried
// increment executes twice.
func TestMutationSkipClientTable(t *testing.T) {
	o := defaultSimOptions()
	o.mut.skipClientTable = true
	mutationCaught(t, 100, o, nil)
}

// TestMutationAckBeforePersist: followers that acknowledge prepares before
// the fsync lose acknowledged writes when a majority crashes.
func TestMutationAckBeforePersist(t *testing.T) {
	o := defaultSimOptions()
	o.mut.ackBeforePersist = true
	mutationCaught(t, 100, o, nil)
}
