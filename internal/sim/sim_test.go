package sim_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/sim"
	"github.com/kefirdb/kefir/internal/sim/simtoy"
	"github.com/kefirdb/kefir/internal/vfs"
)

// probe is a replica that does only what a test tells it: it sends the
// messages and persists the records queued in its outbox on its next event,
// and remembers what it received and recovered.
type probe struct {
	id        sim.Addr
	recovered [][]byte
	got       []any
	gotAt     []int64 // local clock at delivery
	ticks     []int64 // local clock at each tick
	persisted int
	fs        vfs.FS
	out       sim.Ready
}

type probes struct{ byID map[sim.Addr]*probe }

func (p *probes) factory(id sim.Addr, b sim.Boot) sim.Node {
	n := &probe{id: id, recovered: b.Recovered, fs: b.FS}
	p.byID[id] = n
	return n
}

func (n *probe) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Message:
		n.got = append(n.got, ev.Msg)
		n.gotAt = append(n.gotAt, ev.Now)
	case sim.Tick:
		n.ticks = append(n.ticks, ev.Now)
	case sim.Persisted:
		n.persisted = ev.Persisted
	}
}

func (n *probe) Ready() sim.Ready {
	rd := n.out
	n.out = sim.Ready{}
	return rd
}

func newProbes(t *testing.T, o sim.Options) (*sim.Sim, *probes) {
	t.Helper()
	p := &probes{byID: map[sim.Addr]*probe{}}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	o.NewReplicaBoot = p.factory
	return sim.New(o), p
}

// send makes replica from send msgs to `to` at its next event (a tick).
func (p *probes) send(from, to sim.Addr, msgs ...any) {
	for _, m := range msgs {
		p.byID[from].out.Messages = append(p.byID[from].out.Messages, sim.Envelope{To: to, Msg: m})
	}
}

func TestLinkDropAllDeliversNothing(t *testing.T) {
	s, p := newProbes(t, sim.Options{Net: sim.Link{Drop: 1}})
	p.send(0, 1, "a", "b", "c")
	s.RunFor(100 * time.Millisecond)
	if len(p.byID[1].got) != 0 || s.Stats().Dropped != 3 {
		t.Fatalf("got %v, stats %+v", p.byID[1].got, s.Stats())
	}
}

func TestLinkDuplicates(t *testing.T) {
	s, p := newProbes(t, sim.Options{Net: sim.Link{Dup: 1, Delay: sim.Dist{Base: time.Millisecond}}})
	p.send(0, 1, "a")
	s.RunFor(100 * time.Millisecond)
	if !reflect.DeepEqual(p.byID[1].got, []any{"a", "a"}) || s.Stats().Duplicated != 1 {
		t.Fatalf("got %v, stats %+v", p.byID[1].got, s.Stats())
	}
}

func TestJitterReorders(t *testing.T) {
	s, p := newProbes(t, sim.Options{Seed: 1, Net: sim.Link{Delay: sim.Dist{Base: time.Millisecond, Jitter: 5 * time.Millisecond}}})
	var want []any
	for i := 0; i < 50; i++ {
		want = append(want, i)
	}
	p.send(0, 1, want...)
	s.RunFor(100 * time.Millisecond)
	got := p.byID[1].got
	if len(got) != 50 || reflect.DeepEqual(got, want) {
		t.Fatalf("50 messages with 5ms jitter should all arrive, out of order; got %v", got)
	}
}

func TestPartitionOneWayAndHeal(t *testing.T) {
	s, p := newProbes(t, sim.Options{Net: sim.Link{Delay: sim.Dist{Base: time.Millisecond}}})
	s.Block(0, 1) // 0 cannot reach 1; 1 still reaches 0
	p.send(0, 1, "lost")
	p.send(1, 0, "arrives")
	s.RunFor(50 * time.Millisecond)
	if len(p.byID[1].got) != 0 || len(p.byID[0].got) != 1 {
		t.Fatalf("one-way block: 1 got %v, 0 got %v", p.byID[1].got, p.byID[0].got)
	}
	s.Partition([]sim.Addr{0}, []sim.Addr{1, 2})
	p.send(2, 0, "lost")
	p.send(1, 2, "same side")
	s.RunFor(50 * time.Millisecond)
	if len(p.byID[0].got) != 1 || len(p.byID[2].got) != 1 {
		t.Fatalf("partition: 0 got %v, 2 got %v", p.byID[0].got, p.byID[2].got)
	}
	s.Heal()
	p.send(0, 1, "healed")
	s.RunFor(50 * time.Millisecond)
	if !reflect.DeepEqual(p.byID[1].got, []any{"healed"}) {
		t.Fatalf("after heal 1 got %v", p.byID[1].got)
	}
}

func TestPartitionDropsMessagesInFlight(t *testing.T) {
	s, p := newProbes(t, sim.Options{Net: sim.Link{Delay: sim.Dist{Base: 10 * time.Millisecond}}})
	p.send(0, 1, "in flight")
	s.RunFor(3 * time.Millisecond) // sent at the first tick (<1ms), arrives at ~11ms
	s.Partition([]sim.Addr{0}, []sim.Addr{1})
	s.RunFor(30 * time.Millisecond)
	if len(p.byID[1].got) != 0 {
		t.Fatalf("message crossed a partition: %v", p.byID[1].got)
	}
}

func TestHoldReleasesInOrder(t *testing.T) {
	s, p := newProbes(t, sim.Options{Net: sim.Link{Delay: sim.Dist{Base: time.Millisecond}}})
	s.Hold(0, 1)
	p.send(0, 1, "x", "y")
	p.send(2, 1, "z")
	s.RunFor(50 * time.Millisecond)
	if !reflect.DeepEqual(p.byID[1].got, []any{"z"}) {
		t.Fatalf("while held, 1 got %v", p.byID[1].got)
	}
	s.Release(0, 1)
	s.RunFor(50 * time.Millisecond)
	if !reflect.DeepEqual(p.byID[1].got, []any{"z", "x", "y"}) {
		t.Fatalf("after release, 1 got %v", p.byID[1].got)
	}
}

func TestClockDriftWithinBound(t *testing.T) {
	const drift = 0.01 // 1%, exaggerated so it is measurable in ticks
	s, p := newProbes(t, sim.Options{Seed: 3, Replicas: 5, MaxDrift: drift, Tick: time.Millisecond})
	s.RunFor(10 * time.Second)
	var minRate, maxRate = 2.0, 0.0
	for id, n := range p.byID {
		ticks := n.ticks
		elapsedLocal := float64(ticks[len(ticks)-1] - ticks[0])
		// Ticks come every Tick of local time...
		perTick := elapsedLocal / float64(len(ticks)-1)
		if perTick < 0.999e6 || perTick > 1.001e6 {
			t.Fatalf("node %d: %.0fns of local time per tick, want 1ms", id, perTick)
		}
		// ...so the tick count over 10s of real time shows the clock rate.
		rate := float64(len(ticks)) / 10000
		if rate < 1-drift-0.001 || rate > 1+drift+0.001 {
			t.Fatalf("node %d: clock rate %.4f outside 1±%g", id, rate, drift)
		}
		minRate, maxRate = min(minRate, rate), max(maxRate, rate)
	}
	if maxRate-minRate < drift/10 {
		t.Fatalf("clocks should differ: rates in [%.4f, %.4f]", minRate, maxRate)
	}
}

func TestCrashLosesUnsyncedKeepsSynced(t *testing.T) {
	s, p := newProbes(t, sim.Options{Sync: sim.Dist{Base: 5 * time.Millisecond}})
	n := p.byID[0]
	n.out.Persist = [][]byte{[]byte("r1"), []byte("r2")}
	n.out.Sync = true
	s.RunFor(20 * time.Millisecond)
	if n.persisted != 2 {
		t.Fatalf("persisted = %d, want 2", n.persisted)
	}
	n.out.Persist = [][]byte{[]byte("r3")}
	n.out.Sync = true // requested, but the crash comes first
	s.RunFor(2 * time.Millisecond)
	s.Crash(0)
	if s.Replica(0) != nil || s.Up(0) {
		t.Fatal("crashed replica still up")
	}
	s.RunFor(10 * time.Millisecond)
	if n.persisted != 2 {
		t.Fatalf("a crashed node got a Persisted event: %d", n.persisted)
	}
	s.Restart(0)
	got := p.byID[0].recovered
	if len(got) != 2 || string(got[0]) != "r1" || string(got[1]) != "r2" {
		t.Fatalf("recovered %q, want [r1 r2]", got)
	}
}

func TestTornCrashRecoversAPrefix(t *testing.T) {
	torn := 0
	for seed := uint64(0); seed < 200; seed++ {
		s, p := newProbes(t, sim.Options{Seed: seed, Torn: true})
		n := p.byID[0]
		n.out.Persist = [][]byte{[]byte("synced")}
		n.out.Sync = true
		s.RunFor(5 * time.Millisecond)
		n.out.Persist = [][]byte{bytes.Repeat([]byte("a"), 40), bytes.Repeat([]byte("b"), 40)}
		s.RunFor(2 * time.Millisecond)
		s.Crash(0)
		s.Restart(0)
		got := p.byID[0].recovered
		if len(got) == 0 || string(got[0]) != "synced" {
			t.Fatalf("seed %d: synced record lost: %q", seed, got)
		}
		for i, r := range got[1:] {
			c := []byte("ab")[i]
			if !bytes.Equal(r, bytes.Repeat([]byte{c}, 40)) {
				t.Fatalf("seed %d: recovered a corrupt record %q", seed, r)
			}
		}
		if len(got) < 3 {
			torn++
		}
		// The torn tail is gone for good: a second crash recovers the same.
		s.Crash(0)
		s.Restart(0)
		if again := p.byID[0].recovered; len(again) != len(got) {
			t.Fatalf("seed %d: second recovery found %d records, first %d", seed, len(again), len(got))
		}
	}
	if torn == 0 || torn == 200 {
		t.Fatalf("%d of 200 crashes lost unsynced records; want some but not all", torn)
	}
}

func toyRun(seed uint64, trace io.Writer) (check.History, sim.Stats) {
	s := sim.New(sim.Options{
		Seed: seed, Replicas: 3, Clients: 3,
		NewReplica: simtoy.NewReplica(simtoy.Safe), NewClient: simtoy.NewClient(simtoy.Safe, 50),
		Net:      sim.Link{Delay: sim.Dist{Base: 100 * time.Microsecond, Jitter: time.Millisecond, Exp: true}, Drop: 0.05, Dup: 0.05},
		MaxDrift: 1e-4, Torn: true,
		Workload: sim.KV{Keys: 3}, OpsPerClient: 50,
		Faults:   &sim.Faults{Every: sim.Dist{Base: 10 * time.Millisecond, Jitter: 20 * time.Millisecond}},
		Duration: time.Second, Trace: trace,
	})
	h := s.Run()
	return h, s.Stats()
}

func TestSameSeedReplaysExactly(t *testing.T) {
	var t1, t2, t3 bytes.Buffer
	h1, st1 := toyRun(42, &t1)
	h2, st2 := toyRun(42, &t2)
	if !bytes.Equal(t1.Bytes(), t2.Bytes()) || !reflect.DeepEqual(h1, h2) || st1 != st2 {
		t.Fatal("same seed, different runs")
	}
	if st1.Crashes == 0 || st1.Dropped == 0 || st1.Duplicated == 0 {
		t.Fatalf("run injected too few faults to prove much: %+v", st1)
	}
	// Tracing must not perturb the run.
	h3, _ := toyRun(42, nil)
	if !reflect.DeepEqual(h1, h3) {
		t.Fatal("tracing changed the run")
	}
	toyRun(43, &t3)
	if bytes.Equal(t1.Bytes(), t3.Bytes()) {
		t.Fatal("different seeds, same run")
	}
	if !strings.HasPrefix(t1.String(), fmt.Sprintf("%12.6fms sim: seed=42 ", 0.0)) {
		t.Fatalf("trace should open with the seed and options: %.120s", t1.String())
	}
}

// fakeTB captures Explore's failure instead of failing this test.
type fakeTB struct {
	testing.TB
	msg string
}

func (f *fakeTB) Helper()      {}
func (f *fakeTB) Name() string { return "TestFake" }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func TestExploreReportsSeedAndTrace(t *testing.T) {
	t.Setenv(sim.SeedEnv, "")
	f := &fakeTB{}
	func() {
		defer func() {
			if r := recover(); r != nil && r != f {
				panic(r)
			}
		}()
		sim.Explore(f, 1, 10, func(seed uint64, trace io.Writer) error {
			h, _ := toyRun(seed, trace)
			if seed == 4 {
				return fmt.Errorf("pretend violation after %d ops", len(h.Ops))
			}
			return nil
		})
	}()
	if !strings.Contains(f.msg, "seed=4 failed") || !strings.Contains(f.msg, "KEFIR_SIM_SEED=4") ||
		!strings.Contains(f.msg, "replay reproduced the failure") {
		t.Fatalf("failure message: %s", f.msg)
	}
	i := strings.Index(f.msg, "trace: ")
	path := strings.Fields(f.msg[i+len("trace: "):])[0]
	defer os.Remove(path)
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("trace file %s: %v", path, err)
	}
}

// BenchmarkSimulatedMessages measures simulated messages delivered per second
// of real time: the toy register on 5 replicas with 10 clients, lossy jittery
// network, no crashes (the simulator's own cost plus a cheap core).
//
//	go test -run '^$' -bench SimulatedMessages -benchmem ./internal/sim/
func BenchmarkSimulatedMessages(b *testing.B) {
	var delivered int64
	b.ReportAllocs()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		s := sim.New(sim.Options{
			Seed: uint64(i), Replicas: 5, Clients: 10,
			NewReplica: simtoy.NewReplica(simtoy.Safe), NewClient: simtoy.NewClient(simtoy.Safe, 50),
			Net:      sim.Link{Delay: sim.Dist{Base: 100 * time.Microsecond, Jitter: 500 * time.Microsecond}, Drop: 0.01, Dup: 0.01},
			Workload: sim.KV{Keys: 10}, OpsPerClient: 200,
			Duration: 10 * time.Second,
		})
		s.Run()
		delivered += s.Stats().Delivered
	}
	b.ReportMetric(float64(delivered)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(delivered)/float64(b.N), "msgs/run")
}

func TestFailedFsyncCrashesTheReplica(t *testing.T) {
	s, p := newProbes(t, sim.Options{SyncFail: 1})
	n := p.byID[1]
	n.out.Persist = [][]byte{[]byte("r1")}
	n.out.Sync = true
	s.RunFor(10 * time.Millisecond)
	if s.Up(1) || s.Stats().Crashes != 1 || n.persisted != 0 {
		t.Fatalf("up=%t stats=%+v persisted=%d", s.Up(1), s.Stats(), n.persisted)
	}
	s.Restart(1)
	if got := p.byID[1].recovered; len(got) > 1 {
		t.Fatalf("recovered %q", got)
	}
}

func TestInvariantStopsTheRun(t *testing.T) {
	calls := 0
	s, _ := newProbes(t, sim.Options{Seed: 9, InvariantEvery: 10 * time.Millisecond, Invariant: func(s *sim.Sim) error {
		calls++
		if s.Now() > 50*time.Millisecond {
			return fmt.Errorf("replica 2 disagrees")
		}
		return nil
	}})
	s.RunFor(time.Second)
	if s.Err() == nil || !strings.Contains(s.Err().Error(), "seed=9") || !strings.Contains(s.Err().Error(), "replica 2 disagrees") {
		t.Fatalf("Err() = %v", s.Err())
	}
	if s.Now() > 70*time.Millisecond || calls < 5 || calls > 8 {
		t.Fatalf("run went on to %v after %d checks", s.Now(), calls)
	}
}

func TestSwarmVariesOptionsDeterministically(t *testing.T) {
	a, b := sim.Swarm(1, sim.Options{}), sim.Swarm(1, sim.Options{})
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different swarm options")
	}
	distinct := map[string]bool{}
	for seed := uint64(0); seed < 20; seed++ {
		o := sim.Swarm(seed, sim.Options{})
		distinct[fmt.Sprintf("%+v %v %v", o.Net, o.MaxDrift, *o.Faults)] = true
	}
	if len(distinct) < 15 {
		t.Fatalf("only %d distinct swarm settings in 20 seeds", len(distinct))
	}
	kept := sim.Swarm(3, sim.Options{Net: sim.Link{Drop: 0.5}})
	if kept.Net.Drop != 0.5 {
		t.Fatal("Swarm overrode an explicit option")
	}
}

// A replica's own files on Boot.FS follow the same crash rules as the log.
func TestBootFSLosesUnsyncedFiles(t *testing.T) {
	s, p := newProbes(t, sim.Options{})
	fs := p.byID[0].fs
	f, err := fs.Create("/state")
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("durable"))
	f.Sync()
	fs.SyncDir("/")
	f.Write([]byte(" volatile"))
	s.Crash(0)
	s.Restart(0)
	fs = p.byID[0].fs
	g, err := fs.Open("/state")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := g.ReadAt(buf, 0)
	if string(buf[:n]) != "durable" {
		t.Fatalf("after crash /state = %q", buf[:n])
	}
}

func TestWipeGivesAnEmptyDisk(t *testing.T) {
	s, p := newProbes(t, sim.Options{})
	n := p.byID[2]
	n.out.Persist = [][]byte{[]byte("r1")}
	n.out.Sync = true
	s.RunFor(10 * time.Millisecond)
	s.Crash(2)
	s.Wipe(2)
	s.Restart(2)
	if got := p.byID[2].recovered; len(got) != 0 {
		t.Fatalf("wiped replica recovered %q", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("wiping a running replica must panic")
		}
	}()
	s.Wipe(2)
}
