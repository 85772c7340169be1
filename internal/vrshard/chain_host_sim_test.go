package vrshard

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/sim"
)

// Chains under the host simulation (host_sim_test.go): three chain members
// of the production host, stepped, and their master — chainmaster's Master,
// the one kefir chain-master and the metadata group run, driven by the
// simulator (chainmaster.NewStepped: its messages through the simulated
// network in chainwire's codec, its ticks every heartbeat on its node's
// drifting clock) instead of a goroutine, a transport and a ticker. The
// master is the simulator's fourth node: the nemesis crashes it, cuts it
// off and power-cuts it with the members (a restarted master learns the
// chain from the heartbeats, as in a process). Every membership decision —
// a member failed after FailAfter of silence, the chain repaired around it,
// a restarted member joined again before the tail (pre-copy, flush,
// truncation), an order sent again after ResendAfter, a whole chain
// restarted from its longest durable history after a power cut — is the
// master's production code, under the simulator's crashes (torn disks),
// power cuts, partitions, one-way links, loss, duplication, drift and
// failing fsyncs.

// hostChainMembers is the number of members; the master is the node after
// them (simulator address hostChainMembers, node id hostChainMembers+1).
const hostChainMembers = 3

// The chain's timing in the simulation: the production defaults divided by
// five (heartbeat 50 ms, lease 500 ms, failure after 1 s, re-send after
// 500 ms), so that a run of a few simulated seconds sees many repairs and
// joins. Lease < FailAfter as chainmaster requires.
const (
	hostChainHeartbeat = 10 * time.Millisecond
	hostChainLease     = 100 * time.Millisecond
	hostChainFailAfter = 200 * time.Millisecond
	hostChainResend    = 100 * time.Millisecond
	// hostChainFlush is a buffered or memory member's flush interval.
	hostChainFlush = 20 * time.Millisecond
)

// hostChain configures a run's chain (hostSimOptions.chain).
type hostChain struct {
	mode chain.Mode
	// stores are the members' datastores, by simulator address (the
	// chain starts head first in that order; repairs and joins reorder it).
	stores [hostChainMembers]ChainStore
}

func (c *hostChain) String() string {
	var b strings.Builder
	for i, s := range c.stores {
		if i > 0 {
			b.WriteByte('-')
		}
		b.WriteString(map[ChainStore]string{ChainLog: "D", ChainBuffered: "Mb", ChainMemory: "M"}[s])
	}
	return c.mode.String() + "/" + b.String()
}

// options are member id's chain options.
func (c *hostChain) options(id sim.Addr) *ChainOptions {
	return &ChainOptions{Master: hostChainMembers + 1, Heartbeat: hostChainHeartbeat, Lease: hostChainLease,
		Store: c.stores[id], Flush: hostChainFlush, Mode: c.mode}
}

// hostMaster is the simulator's node that runs the chain's master.
type hostMaster struct {
	c    *hostChain
	x    *chainmaster.Master // nil until the node's first event
	now  int64 // the node's clock at the current event
	next int64 // when the next tick is due (every heartbeat)
	out  sim.Ready
}

// newHostMaster is the master's node at each (re)start: a fresh master,
// which learns the chain from the members' heartbeats as a restarted
// process's does. It starts at the node's first event, which tells its
// clock (a node's clock is set off from the simulator's by up to an hour:
// a master started at zero would count the hour as its members' silence).
func (c *hostChain) newHostMaster() sim.Node { return &hostMaster{c: c} }

func (n *hostMaster) start() {
	c := n.c
	self := uint64(hostChainMembers + 1)
	x, err := chainmaster.NewStepped(chainmaster.Config{
		Self: self, Members: hostMembers(hostChainMembers), Group: 1,
		Heartbeat: hostChainHeartbeat, Lease: hostChainLease, FailAfter: hostChainFailAfter,
		StartGrace: hostChainFailAfter, ResendAfter: hostChainResend, Mode: c.mode,
		Send: func(to uint64, m *chain.Msg) {
			p := chainwire.Payload(m)
			eng, typ := p.Kind()
			n.out.Messages = append(n.out.Messages, sim.Envelope{To: sim.Addr(to - 1),
				Msg: hostMsg{from: self, to: to, fm: frame.Message{Engine: eng, Type: typ, Body: p.AppendBody(nil)}}})
		},
	}, func() time.Time { return time.Unix(0, simEpoch+n.now) })
	if err != nil {
		panic(fmt.Sprintf("chain master: %v", err))
	}
	n.x = x
}

func (n *hostMaster) Step(ev sim.Event) {
	n.now = ev.Now
	if n.x == nil {
		n.start()
	}
	switch ev.Kind {
	case sim.Message:
		m, ok := ev.Msg.(hostMsg)
		if !ok {
			return // a client's request: the master serves none
		}
		msgs, err := chainwire.Decode(m.from, m.to, []frame.Message{m.fm})
		if err != nil {
			panic(fmt.Sprintf("chain master: a message from %d does not decode: %v", m.from, err))
		}
		n.x.Step(msgs)
	case sim.Tick:
		// The production master's ticker fires every heartbeat.
		if n.now >= n.next {
			n.next = n.now + int64(hostChainHeartbeat)
			n.x.Tick()
		}
	}
}

func (n *hostMaster) Ready() sim.Ready {
	rd := n.out
	n.out = sim.Ready{}
	return rd
}

// hostChainSim runs one seed of chain c under hostSim's swarm of faults
// (and power cuts of every node, with powerCuts), four clients writing at
// the level of w and reading linearizably, and returns the checkers'
// verdicts: linearizability per key of what the clients saw, and that the
// running members that applied the same position hold the same state.
func hostChainSim(seed uint64, trace io.Writer, c hostChain, powerCuts bool, mut mutations, w sim.Workload, stats *string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	var s *sim.Sim
	trueNow := func() int64 {
		if s == nil {
			return 0
		}
		return int64(s.Now())
	}
	o := hostSimOptions{chain: &c, mut: mut, slowSync: powerCuts}
	so := sim.Options{
		Replicas: hostChainMembers + 1, Clients: 4, FIFO: true,
		NewReplicaBoot: newHostNode(o, seed, trueNow),
		NewClient: func(sim.Addr, sim.Config) sim.Node {
			return &hostClient{n: hostChainMembers, timeout: hostClientTimeout}
		},
		Workload: w, OpsPerClient: 150, Think: sim.Dist{Base: 2 * time.Millisecond, Jitter: 10 * time.Millisecond},
		Duration: 4 * time.Second, Trace: trace,
	}
	if powerCuts {
		so.Sync = sim.Dist{Base: 2 * time.Millisecond, Jitter: 4 * time.Millisecond}
	}
	so.Invariant, so.InvariantEvery = chainPrefixesAgree, time.Millisecond
	so = sim.Swarm(seed, so)
	// A peer connection loses messages only when it breaks (or a queue
	// overflows): the chain takes a lost update for a broken link and the
	// member rejoins, so the swarm's 5 % of independent losses would keep
	// the chain rejoining for ever. Up to 1 %, and the nemesis's
	// partitions and crashes.
	so.Net.Drop = min(so.Net.Drop, 0.01)
	s = sim.New(so)
	if powerCuts {
		s.PowerCuts(2 * time.Second)
	}
	if trace != nil && os.Getenv("ZZDUMP") != "" {
		var dump func()
		dump = func() {
			for i := range hostChainMembers {
				if hn, ok := s.Replica(i).(*hostNode); ok {
					if ch, ok := hn.r.core.(*chainHost); ok {
						var b strings.Builder
						for _, e := range ch.m.History() {
							fmt.Fprintf(&b, " %s", chain.FormatSeq(e.Seq))
						}
						fmt.Fprintf(trace, "ZZ %v node %d applied=%d st=%+v hist:%s\n", s.Now(), i+1, hn.r.applied.Load(), ch.m.Status(), b.String())
					}
				}
			}
			s.After(20*time.Millisecond, dump)
		}
		s.After(time.Millisecond, dump)
	}
	h := s.Run()
	if s.Err() == nil {
		s.RunFor(max(so.Duration/2-s.Now(), 0) + time.Second)
		if err := hostAgree(s); err != nil {
			return err
		}
	}
	if stats != nil {
		outcomes := map[check.Outcome]int{}
		for _, op := range h.Ops {
			outcomes[op.Outcome]++
		}
		*stats = fmt.Sprintf("%+v at %v, %d ops: %d OK, %d failed, %d unknown", s.Stats(), s.Now(), len(h.Ops),
			outcomes[check.OK], outcomes[check.Failed], outcomes[check.Unknown])
	}
	return errors.Join(s.Err(), hostJudge(h, workloadDur(w), 0))
}

// hostChainSeeds is how many seeds each configuration runs: a few in
// make test's budget (each seed is about a tenth of a second), many more
// with KEFIR_SOAK (or KEFIR_SIM_SEEDS).
func hostChainSeeds() int {
	if os.Getenv("KEFIR_SOAK") != "" {
		return 300
	}
	return 6
}

// TestHostSimChain runs chains of the production host and their master
// under the host simulation, with and without power cuts of every node,
// and holds each configuration to the loss table of docs/design/chain.md
// ("The loss table on the host", and "per mode"): where it loses nothing
// acknowledged, per-key linearizability of everything the clients saw
// (sync writes: CAS and increments included, so a lost update shows). The
// rows whose power-cut column is a window (D-D-M, a memory tail under a
// log head) are held to it without power cuts only; with them the window
// is observed and logged (TestHostSimChainWindow).
func TestHostSimChain(t *testing.T) {
	syncW := sim.KV{Keys: 3, Get: 4, Put: 4, CAS: 1, Incr: 1, Delete: 1, Dur: level.Sync}
	D, M := ChainLog, ChainMemory
	for _, tc := range []struct {
		c         hostChain
		powerCuts bool
	}{
		// A log tail: nothing acknowledged lost, power cuts included.
		{hostChain{mode: chain.SU, stores: [3]ChainStore{D, D, D}}, false},
		{hostChain{mode: chain.SU, stores: [3]ChainStore{D, D, D}}, true},
		{hostChain{mode: chain.SU, stores: [3]ChainStore{M, M, D}}, true},
		// AUSI's sync writes are answered at the durable point: as SU.
		{hostChain{mode: chain.AUSI, stores: [3]ChainStore{D, D, D}}, false},
		{hostChain{mode: chain.AUSI, stores: [3]ChainStore{D, D, D}}, true},
		// A memory tail: nothing lost while one member survives (the
		// nemesis crashes one node at a time).
		{hostChain{mode: chain.SU, stores: [3]ChainStore{D, D, M}}, false},
		{hostChain{mode: chain.SU, stores: [3]ChainStore{M, M, M}}, false},
	} {
		name := strings.ReplaceAll(tc.c.String(), "/", "_")
		if tc.powerCuts {
			name += "_powercuts"
		}
		t.Run(name, func(t *testing.T) {
			sim.Explore(t, 1, hostChainSeeds(), func(seed uint64, trace io.Writer) error {
				return hostChainSim(seed, trace, tc.c, tc.powerCuts, mutations{}, syncW, nil)
			})
		})
	}
}

// chainPrefixesAgree is the run's invariant: the running members' committed
// histories (the entries up to what each applied) agree position by
// position — history containment as the clients cannot see it until a read
// returns what a lost update leaves.
func chainPrefixesAgree(s *sim.Sim) error {
	// Each member's committed entries, by position: its log starts after
	// its compacted prefix (Status().Base).
	type held struct {
		id, base int
		log      []chain.Entry
	}
	var hs []held
	for i := range hostChainMembers {
		hn, ok := s.Replica(i).(*hostNode)
		if !ok || hn.r.failed() != nil {
			continue
		}
		ch, ok := hn.r.core.(*chainHost)
		if !ok {
			continue
		}
		base, log := ch.m.Status().Base, ch.m.History()
		hs = append(hs, held{i + 1, base, log[:max(0, min(len(log), int(hn.r.applied.Load())-base))]})
	}
	for x := range hs {
		for _, b := range hs[x+1:] {
			a := hs[x]
			for pos := max(a.base, b.base) + 1; pos <= min(a.base+len(a.log), b.base+len(b.log)); pos++ {
				if sa, sb := a.log[pos-a.base-1].Seq, b.log[pos-b.base-1].Seq; sa != sb {
					return fmt.Errorf("committed histories differ at position %d: node %d holds %s, node %d %s",
						pos, a.id, chain.FormatSeq(sa), b.id, chain.FormatSeq(sb))
				}
			}
		}
	}
	return nil
}
