package vr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/simkv"
)

// The simulator with reconfigurations (reconfig.go): five replica slots,
// a group of three to begin with, and the leader asked at random times to
// move the group to a random new member list (three or five of the slots,
// old members replaced, added back, the leader among the removed), amid
// the usual crashes, partitions, message loss, duplication and reordering.
// The host's part is the simulated driver's: it persists Ready.Membership
// (recMembership) and restarts in the configuration its disk holds; a slot
// that is not a member runs no core (a spare, or a retired member the host
// stopped once Info.Retired); a spare that a committed configuration names
// is started as a new member of it with an empty disk (recReset), as an
// operator starts a replica for a new member.
//
// Judged by: the linearizability and durability checkers over the whole
// history (it spans the epochs); an auditor that no two replicas ever hand
// out different entries at one op number, whatever their epochs; and, once
// the run is quiet, every member of the latest configuration normal in it,
// holding the whole state (equal applied ops and state machines).

const (
	// recMembership: Ready.Membership (epoch, members, start, previous).
	recMembership byte = 70
	// recReset: the host wiped the replica's disk to start it as a new
	// member: everything before is void.
	recReset byte = 71
	// recRetired: the host stopped the replica at Info.Retired; it does
	// not start it again in that configuration.
	recRetired byte = 72
)

func appendMembership(b []byte, m *Membership, hs *HardState) []byte {
	for _, v := range []uint64{hs.View, hs.LastNormalView, hs.Commit} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendUvarint(b, m.Epoch)
	b = binary.AppendUvarint(b, m.Start)
	for _, l := range [][]uint64{m.Members, m.Previous} {
		b = binary.AppendUvarint(b, uint64(len(l)))
		for _, id := range l {
			b = binary.AppendUvarint(b, id)
		}
	}
	return b
}

func readMembership(r *reader) (*Membership, HardState) {
	hs := HardState{View: r.uvarint(), LastNormalView: r.uvarint(), Commit: r.uvarint()}
	m := &Membership{Epoch: r.uvarint(), Start: r.uvarint()}
	for _, l := range []*[]uint64{&m.Members, &m.Previous} {
		k := r.uvarint()
		for range k {
			*l = append(*l, r.uvarint())
		}
	}
	return m, hs
}

// reconfigSim is one run's reconfiguration state, shared by its replicas
// (the simulation is one goroutine).
type reconfigSim struct {
	initial int // members of epoch 1: the first this many slots
	// latest is the newest configuration any replica reported committed:
	// the operator's knowledge, which starts cores for new members.
	latest Membership
	// committed[op] is the first entry handed out at op (the auditor).
	committed map[uint64]auditEntry
	auditErr  error
	asked     int // Reconfigure calls accepted
	epochs    int // configurations reached
	joined    int // spares started as new members
	stopped   int // retired members stopped
	snapshots int // snapshots installed in a reconfigured epoch
	// keepRetired: the host keeps a retired replica open (it takes part
	// again if a later epoch names it) and reopens a retired slot from its
	// kept disk once the latest configuration names it again, as
	// kefir's server does (internal/server/rejoin.go), instead of
	// stopping it and starting a re-added slot from an empty disk.
	keepRetired bool
	readopted   int // retired replicas that became members again
	// plannedFrom[epoch members] is the member list the request that
	// asked for configuration (epoch, members) was planned against (the
	// configuration the reconfigurer read, at a random replica: perhaps
	// one that lags); moved counts the requests the leader refused
	// (ErrEpochMoved); casErr is the first configuration committed from
	// another member list than its request was planned against.
	plannedFrom map[string][]uint64
	moved       int
	casErr      error
	// epochMembers[e] is configuration e's members, once committed.
	epochMembers map[uint64][]uint64
}

func plannedKey(epoch uint64, members []uint64) string { return fmt.Sprint(epoch, members) }

func newReconfigSim(initial int) *reconfigSim {
	return &reconfigSim{initial: initial, latest: Membership{Epoch: 1, Members: memberIDs(initial)},
		committed: map[uint64]auditEntry{}}
}

// runs reports whether slot id runs a core given its disk: a member of the
// configuration there (nil: the first epoch's), or a previous member that
// had not retired when it stopped (it may hold the only copy of the new
// epoch's start state).
func (rc *reconfigSim) runs(id sim.Addr, m *Membership, recs [][]byte) bool {
	if m == nil {
		return slices.Contains(memberIDs(rc.initial), replicaID(id))
	}
	if slices.Contains(m.Members, replicaID(id)) {
		return true
	}
	if rc.keepRetired && rc.latest.Epoch > m.Epoch && slices.Contains(rc.latest.Members, replicaID(id)) {
		return true // named again: reopened from its kept disk
	}
	retired := false
	for _, rec := range recs {
		switch rec[0] {
		case recRetired:
			retired = true
		case recMembership, recReset:
			retired = false
		}
	}
	return slices.Contains(m.Previous, replicaID(id)) && !retired
}

func (rc *reconfigSim) note(m *Membership) {
	if rc == nil {
		return
	}
	// Reconfigure's compare-and-set: a request planned against epoch e
	// commits, if at all, as the move from e's members — never applied to
	// a configuration another change made meanwhile.
	if p, ok := rc.plannedFrom[plannedKey(m.Epoch, m.Members)]; ok && !slices.Equal(p, m.Previous) && rc.casErr == nil {
		rc.casErr = fmt.Errorf("epoch %d %v committed from %v, but its request was planned against %v", m.Epoch, m.Members, m.Previous, p)
	}
	if rc.epochMembers == nil {
		rc.epochMembers = map[uint64][]uint64{1: memberIDs(rc.initial)}
	}
	rc.epochMembers[m.Epoch] = slices.Clone(m.Members)
	if m.Epoch <= rc.latest.Epoch {
		return
	}
	rc.latest = Membership{Epoch: m.Epoch, Members: slices.Clone(m.Members), Start: m.Start, Previous: slices.Clone(m.Previous)}
	rc.epochs++
}

// audit checks that op's entry is the one every other replica handed out.
func (rc *reconfigSim) audit(id sim.Addr, e *Entry) {
	if rc == nil || rc.auditErr != nil {
		return
	}
	got := auditEntry{view: e.View, client: e.Client, req: e.ReqNum}
	if prev, ok := rc.committed[e.Op]; !ok {
		rc.committed[e.Op] = got
	} else if prev != got {
		rc.auditErr = fmt.Errorf("op %d handed out as %+v and, at replica %d, as %+v", e.Op, prev, replicaID(id), got)
	}
}

// auditEntry identifies an entry (a view's leader proposes one entry per op).
type auditEntry struct{ view, client, req uint64 }

// spareStep: a slot without a core starts one when the latest committed
// configuration names it, from an empty disk.
func (n *simReplica) spareStep(ev sim.Event) {
	rc := n.o.reconfig
	if ev.Kind != sim.Tick || rc == nil || !slices.Contains(rc.latest.Members, replicaID(n.id)) {
		return
	}
	n.out.Persist = append(n.out.Persist, []byte{recReset}, appendMembership([]byte{recMembership}, &rc.latest, &HardState{}))
	n.recs += 2
	n.out.Sync = true
	core, err := New(rc.latest.Apply(simConfig(n.id, 0, n.o)), State{Nonce: uint64(ev.Now)<<8 | uint64(n.id)})
	if err != nil {
		panic(err)
	}
	core.mut = n.o.mut
	n.core, n.state, n.ckpt, n.recovering = core, &simkv.Store{}, 0, false
	rc.joined++
	core.Tick(ev.Now)
	n.drain()
}

// maybeStop: the host stops a retired replica.
func (n *simReplica) maybeStop() {
	if n.o.reconfig == nil || n.core == nil || !n.core.Info().Retired {
		return
	}
	if n.o.reconfig.keepRetired {
		if !n.keptRetired {
			n.keptRetired = true
			n.out.Persist = append(n.out.Persist, []byte{recRetired})
			n.recs++
			n.out.Sync = true
			n.o.reconfig.stopped++
		}
		return
	}
	n.out.Persist = append(n.out.Persist, []byte{recRetired})
	n.recs++
	n.out.Sync = true
	n.core = nil
	n.seqAt, n.parked = nil, nil
	clear(n.byCtx)
	n.o.reconfig.stopped++
}

// reconfigurer asks the leader of the latest epoch, every 60–180 ms until
// until, to move to a random member list of 3 or 5 slots.
func reconfigurer(s *sim.Sim, rc *reconfigSim, until time.Duration) {
	var next func()
	next = func() {
		if s.Now() >= until {
			return
		}
		defer s.After(60*time.Millisecond+time.Duration(s.Rand().IntN(120))*time.Millisecond, next)
		slots := s.Config().Replicas
		for i := range slots {
			node := s.Replica(i)
			if node == nil {
				continue
			}
			n := node.(*simReplica)
			if n.core == nil || !n.core.Info().IsLeader {
				continue
			}
			size := 3
			if slots >= 5 && s.Rand().IntN(2) == 0 {
				size = 5
			}
			perm := s.Rand().Perm(slots)
			var ms []uint64
			for _, p := range perm[:size] {
				ms = append(ms, replicaID(sim.Addr(p)))
			}
			// Planned against the configuration of a random replica (the
			// operator's read: it may lag the leader's, or be ahead of a
			// deposed leader's).
			read := n.core.cfg
			if j := s.Replica(s.Rand().IntN(slots)); j != nil && j.(*simReplica).core != nil {
				read = j.(*simReplica).core.cfg
			}
			// A third of them read before the last change (a caller that
			// waited, or read a member that lags more than the sim's).
			if old, ok := rc.epochMembers[read.Epoch-1]; ok && s.Rand().IntN(3) == 0 {
				read.Epoch, read.Members = read.Epoch-1, old
			}
			key := plannedKey(n.core.cfg.Epoch+1, ms)
			switch err := n.core.Reconfigure(n.now, read.Epoch, ms); {
			case err == nil:
				rc.asked++
				if rc.plannedFrom == nil {
					rc.plannedFrom = map[string][]uint64{}
				}
				rc.plannedFrom[key] = slices.Clone(read.Members)
			case errors.Is(err, ErrEpochMoved):
				rc.moved++
			}
			return
		}
	}
	s.At(50*time.Millisecond, next)
}

// judgeReconfig: the history's checkers, the auditor, and the latest
// configuration's members complete and equal at the end. Configuration
// errors are expected (replicas of different epochs meet) and not judged.
func judgeReconfig(s *sim.Sim, h check.History, rc *reconfigSim) error {
	errs := judgeHistory(s, h)
	if rc.auditErr != nil {
		errs = append(errs, rc.auditErr)
	}
	if rc.casErr != nil {
		errs = append(errs, rc.casErr)
	}
	var first *simReplica
	for _, id := range rc.latest.Members {
		node := s.Replica(int(replicaAddr(id)))
		if node == nil || node.(*simReplica).core == nil {
			errs = append(errs, fmt.Errorf("member %d of epoch %d runs no replica at the end", id, rc.latest.Epoch))
			continue
		}
		n := node.(*simReplica)
		if i := n.core.Info(); i.Epoch != rc.latest.Epoch || i.Status != Normal || i.Joining {
			errs = append(errs, fmt.Errorf("member %d at the end: epoch %d (latest %d), %s, joining %t", id, i.Epoch, rc.latest.Epoch, i.Status, i.Joining))
			continue
		}
		if first == nil {
			first = n
		} else if first.core.applied != n.core.applied || !slices.Equal(first.state.Image(), n.state.Image()) {
			errs = append(errs, fmt.Errorf("members %d and %d of epoch %d differ at the end: applied %d and %d", first.core.cfg.Self, id,
				rc.latest.Epoch, first.core.applied, n.core.applied))
		}
	}
	for i := range s.Config().Replicas {
		if node := s.Replica(i); node != nil {
			for _, e := range node.(*simReplica).errs {
				var ce *ConfigError
				var re *RefusedError
				if !errors.As(e, &ce) && !errors.As(e, &re) {
					errs = append(errs, fmt.Errorf("replica %d reported: %v", i+1, e))
					break
				}
			}
		}
	}
	return errors.Join(errs...)
}

func reconfigRun(seed uint64, o simOptions, trace io.Writer) (*sim.Sim, check.History, *reconfigSim) {
	return reconfigRunWith(seed, o, trace, nil, nil)
}

// reconfigRunWith is reconfigRun with tweak applied to the options and
// hook to the simulation as well (power cuts).
func reconfigRunWith(seed uint64, o simOptions, trace io.Writer, tweak func(*sim.Options), hook func(*sim.Sim), rcTweak ...func(*reconfigSim)) (*sim.Sim, check.History, *reconfigSim) {
	rc := newReconfigSim(3)
	for _, f := range rcTweak {
		f(rc)
	}
	o.reconfig = rc
	var s *sim.Sim
	s, h := simRunHook(seed, o, trace, func(so *sim.Options) {
		so.Replicas = 5
		so.Faults.Until = 900 * time.Millisecond
		so.Faults.MaxDown = 1
		so.OpsPerClient = 80
		if tweak != nil {
			tweak(so)
		}
	}, func(sm *sim.Sim) {
		s = sm
		reconfigurer(sm, rc, 800*time.Millisecond)
		if hook != nil {
			hook(sm)
		}
	})
	// The run ends with the workload; the auditor's last check wants the
	// group quiet: the nemesis done (it heals and restarts everything at
	// Until) and the last commit point everywhere.
	// RunFor stops again when the last client finishes, which may come
	// after Run gave up at Duration.
	for end := max(s.Now(), 900*time.Millisecond) + time.Second; s.Now() < end; {
		s.RunFor(end - s.Now())
	}
	return s, h, rc
}

// TestSimReconfiguration: random reconfigurations amid random faults.
func TestSimReconfiguration(t *testing.T) {
	o := defaultSimOptions()
	var asked, moved, epochs, joined, stopped, snaps, ok, ops, crashes int
	sim.Explore(t, 1, seedCount(40, 1000), func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h, rc := reconfigRun(seed, o, trace)
		asked, epochs, joined, stopped, moved = asked+rc.asked, epochs+rc.epochs, joined+rc.joined, stopped+rc.stopped, moved+rc.moved
		ops, crashes, snaps = ops+len(h.Ops), crashes+s.Stats().Crashes, snaps+rc.snapshots
		for _, op := range h.Ops {
			if op.Outcome == check.OK {
				ok++
			}
		}
		return judgeReconfig(s, h, rc)
	})
	t.Logf("reconfigurations asked %d (%d refused: planned against another epoch), epochs reached %d, new members started %d, retired members stopped %d, snapshots installed in later epochs %d; ops %d (%d ok), crashes %d",
		asked, moved, epochs, joined, stopped, snaps, ops, ok, crashes)
	if epochs == 0 || joined == 0 || stopped == 0 || snaps == 0 || moved == 0 {
		t.Fatalf("the runs did not exercise reconfiguration: %d epochs, %d joins, %d stops, %d snapshots, %d stale requests", epochs, joined, stopped, snaps, moved)
	}
}

// TestSimReconfigurationKeepRetired: retired replicas kept open and
// reopened from their kept disks when a later epoch names them again
// (kefir's rejoin: its log may hold ops of a view that was replaced, from
// before it retired).
func TestSimReconfigurationKeepRetired(t *testing.T) {
	o := defaultSimOptions()
	var stopped, back int
	sim.Explore(t, 1, seedCount(40, 1000), func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h, rc := reconfigRunWith(seed, o, trace, nil, nil, func(rc *reconfigSim) { rc.keepRetired = true })
		stopped, back = stopped+rc.stopped, back+rc.readopted
		return judgeReconfig(s, h, rc)
	})
	t.Logf("retired %d, members again %d", stopped, back)
	if stopped == 0 || back == 0 {
		t.Fatalf("the runs did not exercise a retired replica named again: %d retired, %d back", stopped, back)
	}
}

// TestSimReconfigurationKeepRetiredPowerFailure: the same with the power
// cut on every slot at once (a retired replica restarts from its kept disk,
// a torn batch may have lost its newest membership record).
func TestSimReconfigurationKeepRetiredPowerFailure(t *testing.T) {
	o := defaultSimOptions()
	back := 0
	sim.Explore(t, 1, seedCount(30, 600), func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h, rc := reconfigRunWith(seed, o, trace, powerFailures, powerFailureHook, func(rc *reconfigSim) { rc.keepRetired = true })
		back += rc.readopted
		return judgeReconfig(s, h, rc)
	})
	if back == 0 {
		t.Fatal("no retired replica became a member again")
	}
}

// TestSimReconfigurationPowerFailure: the same with slow fsyncs (many
// writes in flight unsynced, torn batches) and the power cut twice on every
// slot at once: each restarts in the configuration its disk kept, a torn
// batch that lost a membership record restarts in the old epoch and is told
// the new one.
func TestSimReconfigurationPowerFailure(t *testing.T) {
	o := defaultSimOptions()
	epochs := 0
	sim.Explore(t, 1, seedCount(30, 600), func(seed uint64, trace io.Writer) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h, rc := reconfigRunWith(seed, o, trace, powerFailures, powerFailureHook)
		epochs += rc.epochs
		return judgeReconfig(s, h, rc)
	})
	if epochs == 0 {
		t.Fatal("no reconfiguration committed")
	}
}

// TestMutationJoinEarly: a new member that takes part before state
// transfer brought it the epoch's start (votes with an empty log) is
// caught.
func TestMutationJoinEarly(t *testing.T) {
	mutation.Require(t)
	o := defaultSimOptions()
	o.mut.joinEarly = true
	caughtWithin(t, 200, "joinEarly survived %d seeds: the simulator and auditor cannot see a member that votes before it holds the epoch's start", func(seed uint64) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		s, h, rc := reconfigRun(seed, o, nil)
		return judgeReconfig(s, h, rc)
	})
}
