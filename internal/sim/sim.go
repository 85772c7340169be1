package sim

import (
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Options configures a run. Everything random is drawn from Seed.
type Options struct {
	Seed     uint64
	Replicas int
	Clients  int

	// NewReplica, or NewReplicaBoot when the replica also wants its own
	// disk (Boot.FS), builds replicas; set exactly one.
	NewReplica     ReplicaFactory
	NewReplicaBoot BootFactory
	NewClient      ClientFactory

	// Net is every link's initial behaviour (client links included).
	Net Link
	// FIFO: every link delivers in the order messages were sent on it (a
	// duplicate too, after the original), as a TCP connection does; a
	// message may still be lost (Link.Drop, a partition, a crash). Without
	// it each message has its own delay and links reorder, which VR
	// tolerates; the chain engine assumes FIFO links (docs/design/chain.md,
	// "What the host does not give the chain") and numbers its messages to
	// detect a loss, not a reordering.
	FIFO bool
	// Tick is the nominal tick interval (default 1ms).
	Tick time.Duration
	// MaxDrift bounds each node's clock rate error: a node's clock runs at
	// 1+d, d drawn uniformly in [-MaxDrift, MaxDrift] (e.g. 100e-6 = 100 µs/s).
	MaxDrift float64
	// Sync is the fsync latency distribution (default 100µs + up to 200µs).
	Sync Dist
	// Torn: on a crash each disk keeps a random prefix of its unsynced bytes
	// and may tear the last write (otherwise exactly the synced state survives).
	Torn bool
	// SyncFail is the probability that an fsync fails (EIO). The replica then
	// crashes, as a real process must (after a failed fsync the page cache can
	// no longer be trusted), and restarts from what its disk kept.
	SyncFail float64

	// Workload, if set, drives every client closed-loop: OpsPerClient
	// operations each, Think apart. Scenarios leave it nil and call Invoke.
	Workload     Workload
	OpsPerClient int
	Think        Dist

	// Faults, if set, injects random faults until Faults.Until, then heals the
	// network and restarts crashed replicas.
	Faults *Faults

	// Duration bounds the run in virtual time (default 10s). A run with a
	// workload also stops once every client has finished.
	Duration time.Duration

	// Trace, if set, receives one line per event.
	Trace io.Writer

	// Invariant, if set, is checked after events, at most once per
	// InvariantEvery of virtual time (0: after every event). An error stops
	// the run; Err reports it with the seed and time.
	Invariant      func(*Sim) error
	InvariantEvery time.Duration
}

// Workload generates client operations. Values written should be unique per
// key so the checkers can tell versions apart.
type Workload interface {
	Next(rng *rand.Rand, client, seq int) check.Op
}

// Stats counts what a run did.
type Stats struct {
	Sent, Delivered, Dropped, Duplicated int64
	Steps                                int64 // Node.Step calls
	Crashes, Restarts                    int
	Syncs                                int64
}

type replica struct {
	node     Node
	up       bool
	inc      uint32
	disk     *vfs.Mem
	wal      vfs.File
	logLen   int   // records appended in this incarnation's view of the log
	diskBusy int64 // virtual time the disk finishes its queued fsyncs
	buf      []byte
}

type client struct {
	node    Node
	seq     uint64
	pending int // recorder id of the op in flight, -1 if none
	done    int // ops completed
}

type clock struct {
	rate   float64 // 1 + drift
	offset int64
	tick   int64 // virtual interval between ticks
}

func (c *clock) local(t int64) int64 { return c.offset + int64(float64(t)*c.rate) }

// Sim is one simulated cluster. It is not safe for concurrent use: it is the
// single goroutine that runs every node.
type Sim struct {
	o     Options
	cfg   Config
	total int
	rng   *rand.Rand
	now   int64
	seq   uint64
	q     queue
	links []linkState
	clock []clock

	replicas []*replica
	clients  []*client
	rec      *check.Recorder
	stats    Stats
	stopped  bool
	trace    io.Writer
	err      error
	lastInv  int64
	cuts     []time.Duration // PowerCuts' times
}

const walName = "/wal"

// New builds a cluster and schedules its first ticks and invocations. Nothing
// runs until Run or RunFor.
func New(o Options) *Sim {
	if o.Replicas <= 0 || (o.NewReplica == nil) == (o.NewReplicaBoot == nil) {
		panic("sim: need Replicas > 0 and exactly one of NewReplica, NewReplicaBoot")
	}
	if o.Clients > 0 && o.NewClient == nil {
		panic("sim: clients need NewClient")
	}
	if o.Tick == 0 {
		o.Tick = time.Millisecond
	}
	if o.Sync == (Dist{}) {
		o.Sync = Dist{Base: 100 * time.Microsecond, Jitter: 200 * time.Microsecond}
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	s := &Sim{
		o:     o,
		cfg:   Config{Replicas: o.Replicas, Clients: o.Clients, Tick: o.Tick},
		total: o.Replicas + o.Clients,
		rng:   rand.New(rand.NewPCG(o.Seed, 0x6b65666972)),
		trace: o.Trace,
	}
	s.rec = check.NewRecorder(func() int64 { return s.now })
	s.links = make([]linkState, s.total*s.total)
	for i := range s.links {
		s.links[i].Link = o.Net
	}
	s.clock = make([]clock, s.total)
	for i := range s.clock {
		d := (s.rng.Float64()*2 - 1) * o.MaxDrift
		c := &s.clock[i]
		c.rate = 1 + d
		c.offset = s.rng.Int64N(int64(time.Hour))
		c.tick = int64(float64(o.Tick) / c.rate)
		if c.tick <= 0 {
			c.tick = 1
		}
	}
	s.tracef("sim: seed=%d replicas=%d clients=%d net=%+v drift=%g torn=%t faults=%+v",
		o.Seed, o.Replicas, o.Clients, o.Net, o.MaxDrift, o.Torn, o.Faults)
	for i := 0; i < o.Replicas; i++ {
		r := &replica{disk: vfs.NewMem()}
		s.replicas = append(s.replicas, r)
		s.startReplica(Addr(i), nil)
	}
	for i := 0; i < o.Clients; i++ {
		id := s.cfg.ClientAddr(i)
		c := &client{node: o.NewClient(id, s.cfg), pending: -1}
		s.clients = append(s.clients, c)
		s.schedule(item{at: s.rng.Int64N(int64(o.Tick)), kind: itTick, node: id})
		if o.Workload != nil && o.OpsPerClient > 0 {
			s.schedule(item{at: o.Think.sample(s.rng), kind: itInvoke, node: id})
		}
	}
	if o.Faults != nil {
		s.schedule(item{at: o.Faults.Every.sample(s.rng), kind: itFault})
	}
	return s
}

// Config returns the cluster configuration nodes were given.
func (s *Sim) Config() Config { return s.cfg }

// Now is the virtual time in nanoseconds since the start of the run.
func (s *Sim) Now() time.Duration { return time.Duration(s.now) }

// Seed is the run's seed.
func (s *Sim) Seed() uint64 { return s.o.Seed }

// Rand is the run's PRNG, for test scripts that make random choices (which
// replica to crash next). Drawing from it changes the rest of the run, but
// deterministically, so seeds still replay.
func (s *Sim) Rand() *rand.Rand { return s.rng }

// Stats returns the counters so far.
func (s *Sim) Stats() Stats { return s.stats }

// History returns the clients' history so far (pending operations as unknown).
func (s *Sim) History() check.History { return s.rec.History() }

// Replica returns replica i's current node (nil while crashed), for
// invariant checks.
func (s *Sim) Replica(i int) Node {
	if !s.replicas[i].up {
		return nil
	}
	return s.replicas[i].node
}

// Disk returns replica i's disk.
func (s *Sim) Disk(i int) *vfs.Mem { return s.replicas[i].disk }

// Up reports whether replica i is running.
func (s *Sim) Up(i int) bool { return s.replicas[i].up }

// At runs f at virtual time t (relative to the start of the run).
func (s *Sim) At(t time.Duration, f func()) {
	s.schedule(item{at: int64(t), kind: itCall, fn: f})
}

// After runs f d after now.
func (s *Sim) After(d time.Duration, f func()) {
	s.schedule(item{at: s.now + int64(d), kind: itCall, fn: f})
}

// Err is the invariant violation that stopped the run, if any.
func (s *Sim) Err() error { return s.err }

// Stop ends the run after the current event.
func (s *Sim) Stop() { s.stopped = true }

func (s *Sim) schedule(it item) {
	if it.at < s.now {
		it.at = s.now
	}
	s.seq++
	it.seq = s.seq
	s.q.push(it)
}

// tracef writes a trace line. Callers test s.trace first: building the
// arguments would otherwise allocate on every event of an untraced run.
func (s *Sim) tracef(format string, args ...any) {
	if s.trace == nil {
		return
	}
	fmt.Fprintf(s.trace, "%12.6fms ", float64(s.now)/1e6)
	fmt.Fprintf(s.trace, format, args...)
	s.trace.Write([]byte{'\n'})
}

// Run runs until Duration, until Stop, or until every client finished its
// workload, and returns the history.
func (s *Sim) Run() check.History {
	s.RunFor(time.Duration(int64(s.o.Duration) - s.now))
	return s.History()
}

// RunFor runs for d of virtual time (or until Stop / the workload ends).
func (s *Sim) RunFor(d time.Duration) {
	end := s.now + int64(d)
	s.stopped = false
	for s.q.len() > 0 && !s.stopped {
		if s.q.items[0].at > end {
			break
		}
		it := s.q.pop()
		s.now = it.at
		s.dispatch(&it)
		if s.o.Invariant != nil && (s.o.InvariantEvery == 0 || s.now-s.lastInv >= int64(s.o.InvariantEvery)) {
			s.lastInv = s.now
			if err := s.o.Invariant(s); err != nil {
				s.err = fmt.Errorf("sim: seed=%d at %v: invariant violated: %w", s.o.Seed, time.Duration(s.now), err)
				if s.trace != nil {
					s.tracef("%v", s.err)
				}
				s.stopped = true
			}
		}
	}
	if !s.stopped && s.now < end {
		s.now = end
	}
}

func (s *Sim) dispatch(it *item) {
	switch it.kind {
	case itDeliver:
		if s.link(it.from, it.node).blocked {
			s.stats.Dropped++
			if s.trace != nil {
				s.tracef("drop %d->%d %v (partitioned in flight)", it.from, it.node, it.msg)
			}
			return
		}
		n := s.nodeIfUp(it.node)
		if n == nil {
			s.stats.Dropped++
			if s.trace != nil {
				s.tracef("drop %d->%d %v (down)", it.from, it.node, it.msg)
			}
			return
		}
		s.stats.Delivered++
		if s.trace != nil {
			s.tracef("deliver %d->%d %v", it.from, it.node, it.msg)
		}
		s.step(it.node, n, Event{Kind: Message, From: it.from, Msg: it.msg})
	case itTick:
		if !s.current(it.node, it.inc) {
			return
		}
		n := s.nodeIfUp(it.node)
		s.step(it.node, n, Event{Kind: Tick})
		it2 := *it
		it2.at = s.now + s.clock[it.node].tick
		it2.msg, it2.fn = nil, nil
		s.schedule(it2)
	case itSync:
		if !s.current(it.node, it.inc) {
			return
		}
		r := s.replicas[it.node]
		if s.o.SyncFail > 0 && s.rng.Float64() < s.o.SyncFail {
			r.disk.FailSyncs(1)
		}
		if err := r.wal.Sync(); err != nil {
			if s.trace != nil {
				s.tracef("replica %d fsync failed (%v): crashing it", it.node, err)
			}
			s.Crash(int(it.node))
			return
		}
		s.stats.Syncs++
		if s.trace != nil {
			s.tracef("persisted %d up to %d", it.node, it.n)
		}
		s.step(it.node, r.node, Event{Kind: Persisted, Persisted: it.n})
	case itInvoke:
		s.invokeNext(int(it.node) - s.cfg.Replicas)
	case itCall:
		it.fn()
	case itFault:
		s.fault()
	}
}

// current reports whether a timer item still belongs to the node's incarnation.
func (s *Sim) current(a Addr, inc uint32) bool {
	if s.cfg.IsReplica(a) {
		r := s.replicas[a]
		return r.up && r.inc == inc
	}
	return true
}

func (s *Sim) nodeIfUp(a Addr) Node {
	if s.cfg.IsReplica(a) {
		r := s.replicas[a]
		if !r.up {
			return nil
		}
		return r.node
	}
	return s.clients[int(a)-s.cfg.Replicas].node
}

func (s *Sim) step(a Addr, n Node, ev Event) {
	ev.Now = s.clock[a].local(s.now)
	s.stats.Steps++
	n.Step(ev)
	rd := n.Ready()
	if rd.Empty() {
		return
	}
	if len(rd.Persist) > 0 || rd.Sync {
		if !s.cfg.IsReplica(a) {
			panic("sim: a client asked to persist")
		}
		if !s.persist(a, &rd) {
			return // the write failed and the replica died with its Ready
		}
	}
	for _, m := range rd.Messages {
		s.send(a, m.To, m.Msg)
	}
	if len(rd.Done) > 0 {
		if s.cfg.IsReplica(a) {
			panic("sim: a replica completed a client operation")
		}
		for _, d := range rd.Done {
			s.complete(int(a)-s.cfg.Replicas, d)
		}
	}
}
