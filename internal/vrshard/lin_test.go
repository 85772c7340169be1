package vrshard

import (
	"context"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vfs"
)

// soak lengthens the fault workloads (default 3s each), e.g.
//
//	go test ./internal/vrshard/ -run 'UnderFaults|PowerLoss' -vrshard.soak 5m
var soak = flag.Duration("vrshard.soak", 0, "run the fault workloads this long instead of 3s")

func workloadTime() time.Duration {
	if *soak > 0 {
		return *soak
	}
	return 3 * time.Second
}

// workloadKeys spreads a soak over more keys: porcupine's search grows with
// the operations per key, and a search that times out decides nothing.
func workloadKeys(base ...string) []string {
	if *soak <= 0 {
		return base
	}
	var ks []string
	for i := range int(soak.Seconds()/3) + 1 {
		for _, k := range base {
			ks = append(ks, fmt.Sprint(k, i))
		}
	}
	return ks
}

func linOptions() check.LinOptions {
	o := check.LinOptions{NoVisualization: true, Strict: true}
	if *soak > 0 {
		o.Timeout = time.Minute
	}
	return o
}

// workload runs concurrent clients against the cluster for d while nemesis
// injects faults, and returns the recorded history.
type workload struct {
	c       *cluster
	rec     *check.Recorder
	clients int
	keys    []string
	// anyReplica sends reads to random replicas instead of the leader.
	anyReplica bool
	// sessionReads makes some reads session reads at random replicas, each
	// client carrying its session token.
	sessionReads bool
	// afterKill, if set, runs after a replica was killed, before it restarts
	// (a power cut of its disk).
	afterKill func(i int)
	// nilext sends puts through the nilext fast path, coordinated by a
	// random replica (nilext_test.go).
	nilext bool
	// dur is the durability of puts (zero: sync); CAS is always sync (its
	// reply reports state, so it is acknowledged at apply whatever the level).
	dur level.Durability
	// ccmReads makes reads cross-client-monotonic at random replicas
	// (follower reads, cad_test.go).
	ccmReads bool
	// sessionOnly makes every read a session read at a random replica; a
	// client whose session is refused (shard.ErrSessionLost) starts a new
	// one, as a real client must (session_view_test.go). lostSessions
	// counts those refusals.
	sessionOnly  bool
	lostSessions atomic.Int64
	// deferredReads serves reads with ReadDeferred and waits for the
	// returned Pending before recording the result, as the RESP front door
	// releases a reply (deferred.go); deferred counts the reads that had
	// something to wait for.
	deferredReads bool
	deferred      atomic.Int64
	// pipelined sends each put as the RESP front door runs a pipeline
	// [put; read] on one connection (sync_pipeline_test.go): Apply, then a
	// deferred read of the same key or another before the put is waited
	// for, then both waits.
	pipelined bool
	pipe      pipeStats
	mu        sync.Mutex // guards c.reps against the nemesis
}

func (w *workload) putDur() level.Durability {
	if w.dur == 0 {
		return level.Sync
	}
	return w.dur
}

func (w *workload) replica(i int) *Replica {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.reps[i]
}

func (w *workload) leaderGuess() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, r := range w.c.reps {
		if r != nil && r.Info().IsLeader {
			return i
		}
	}
	return rand.IntN(len(w.c.reps))
}

// retryable says the operation did not reach a state where it could have
// taken effect on this attempt in a way a retry with the same id would not
// see (redirects, view changes, timeouts: all safe to retry with the same
// request id thanks to the client table).
func retryable(err error) bool {
	return errors.Is(err, shard.ErrUnavailable) || errors.Is(err, shard.ErrClosed) || errors.Is(err, context.DeadlineExceeded)
}

func (w *workload) client(id int, stop <-chan struct{}, rng *rand.Rand) {
	clientID := uint64(1000 + id)
	var seq uint64
	var sess shard.Session
	sessName := "" // the client's own session until one is lost
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		key := w.keys[rng.IntN(len(w.keys))]
		op := check.Op{Client: id, Key: key, Session: sessName}
		var sop kv.Op
		switch p := rng.IntN(10); {
		case (p < 2 && w.sessionReads) || (p < 4 && w.sessionOnly):
			op.Kind, op.Cons = check.Get, level.ConsSession
			sop = get(key)
		case p < 4 && w.ccmReads:
			op.Kind, op.Cons = check.Get, level.ConsCrossClient
			sop = get(key)
		case p < 4:
			op.Kind, op.Cons = check.Get, level.ConsLinearizable
			sop = get(key)
		case p < 8:
			op.Kind, op.Value, op.Dur = check.Put, fmt.Sprintf("c%d-%d", id, n), w.putDur()
			sop = set(key, op.Value)
		default:
			op.Kind, op.Dur = check.CAS, level.Sync
			op.Expect, op.Value = fmt.Sprintf("c%d-%d", rng.IntN(w.clients), rng.IntN(n+1)), fmt.Sprintf("c%d-%d", id, n)
			sop = kv.Op{Kind: kv.KindCAS, Key: []byte(key), Expected: []byte(op.Expect), Value: []byte(op.Value)}
		}
		h := w.rec.Invoke(op)
		switch {
		case op.Kind == check.Get && op.Cons.Kind == level.Session:
			if w.doSessionRead(h, sop, &sess, rng) {
				sess, sessName = shard.Session{}, fmt.Sprintf("client-%d/%d", id, n)
			}
		case op.Kind == check.Get && op.Cons.Kind == level.CrossClientMonotonic:
			w.doCCMRead(h, sop, rng)
		case op.Kind == check.Get:
			w.doRead(h, sop, &sess, rng)
		case op.Kind == check.Put && w.nilext:
			seq++
			w.doNilextWrite(h, sop, rng, shard.ReqID{Client: clientID, Seq: seq}, &sess)
		case op.Kind == check.Put && w.pipelined:
			seq++
			w.doPipelined(h, id, sop, shard.ReqID{Client: clientID, Seq: seq}, rng)
		default:
			seq++
			w.doWrite(h, op.Kind, sop, shard.ReqID{Client: clientID, Seq: seq}, &sess)
		}
	}
}

// redirect picks the replica to try after err: the leader err names, or,
// after a short pause, the current leader guess.
func (w *workload) redirect(err error) int {
	if lid, _, ok := LeaderOf(err); ok {
		return w.c.index(lid)
	}
	time.Sleep(5 * time.Millisecond)
	return w.leaderGuess()
}

// tryReplicas is the workload clients' retry loop: it calls try with the
// replica at target and a 500ms context until try reports done, for up to d.
// A down replica is replaced by the leader guess after a pause; after an
// error try returns, the next target is the one redirect picks. It reports
// false if d ran out first (the operation's outcome is then unknown: the
// caller records it).
func (w *workload) tryReplicas(d time.Duration, target int, try func(ctx context.Context, r *Replica, target int) (done bool, err error)) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		r := w.replica(target)
		if r == nil {
			target = w.leaderGuess()
			time.Sleep(5 * time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		done, err := try(ctx, r, target)
		cancel()
		if done {
			return true
		}
		target = w.redirect(err)
	}
	return false
}

// readAt reads sop at consistency c with session s, starting at replica
// target and following redirects for up to 2s. It records the outcome of
// history op h and reports the result and whether the read completed.
func (w *workload) readAt(h, target int, sop kv.Op, c level.Consistency, s shard.Session) (kv.Result, bool) {
	res, ok, _ := w.readAtLost(h, target, sop, c, s)
	return res, ok
}

// readAtLost is readAt that also reports a session refused as lost
// (shard.ErrSessionLost: recorded as failed, not retried).
func (w *workload) readAtLost(h, target int, sop kv.Op, c level.Consistency, s shard.Session) (kv.Result, bool, bool) {
	var res kv.Result
	lost := false
	done := w.tryReplicas(2*time.Second, target, func(ctx context.Context, r *Replica, target int) (bool, error) {
		var err error
		if w.deferredReads {
			var p shard.Pending
			res, p, err = r.ReadDeferred(ctx, sop, c, s)
			if err == nil && !p.IsZero() {
				w.deferred.Add(1)
				err = r.Wait(ctx, p)
			}
		} else {
			res, err = r.Read(ctx, sop, c, s)
		}
		if err == nil {
			w.rec.Complete(h, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Version: res.Version, Node: target})
			return true, nil
		}
		if errors.Is(err, shard.ErrSessionLost) {
			w.lostSessions.Add(1)
			w.rec.Fail(h)
			lost = true
			return true, nil
		}
		return false, err
	})
	if !done {
		w.rec.Unknown(h)
		return kv.Result{}, false, false
	}
	if lost {
		return kv.Result{}, false, true
	}
	return res, true, false
}

func (w *workload) doRead(h int, sop kv.Op, sess *shard.Session, rng *rand.Rand) {
	target := w.leaderGuess()
	if w.anyReplica {
		target = rng.IntN(len(w.c.reps))
	}
	if res, ok := w.readAt(h, target, sop, level.ConsLinearizable, shard.Session{}); ok {
		// The client's session includes what its strong reads saw.
		*sess = sess.AfterRead(res.Pos())
	}
}

// doSessionRead reads at session level at a random replica and reports
// whether the session was refused as lost.
func (w *workload) doSessionRead(h int, sop kv.Op, sess *shard.Session, rng *rand.Rand) bool {
	target := rng.IntN(len(w.c.reps))
	res, ok, lost := w.readAtLost(h, target, sop, level.ConsSession, *sess)
	if ok {
		*sess = sess.AfterRead(res.Pos())
	}
	return lost
}

func (w *workload) doWrite(h int, kind check.Kind, sop kv.Op, id shard.ReqID, sess *shard.Session) {
	d := level.Sync
	if kind == check.Put {
		d = w.putDur()
	}
	done := w.tryReplicas(3*time.Second, w.leaderGuess(), func(ctx context.Context, r *Replica, target int) (bool, error) {
		res, err := r.Write(ctx, sop, d, id)
		if err == nil {
			*sess = sess.AfterWrite(res.Pos())
			out := check.Result{Version: res.Version, Node: target}
			if kind == check.CAS {
				out.Found = res.Int == 1
			}
			w.rec.Complete(h, out)
			return true, nil
		}
		if !retryable(err) {
			panic(fmt.Sprintf("write %v: unexpected error %v", sop.Kind, err))
		}
		return false, err
	})
	if !done {
		w.rec.Unknown(h)
	}
}

// nemesis alternates link partitions and leader kills (with restart).
func (w *workload) nemesis(stop <-chan struct{}, rng *rand.Rand, kills bool) {
	c := w.c
	for round := 0; ; round++ {
		select {
		case <-stop:
			return
		case <-time.After(300 * time.Millisecond):
		}
		if kills && round%2 == 1 {
			l := w.leaderGuess()
			w.mu.Lock()
			if c.reps[l] != nil {
				w.rec.Crash(l)
				c.reps[l].crash()
				c.reps[l] = nil
			}
			w.mu.Unlock()
			select {
			case <-stop:
			case <-time.After(400 * time.Millisecond):
			}
			w.mu.Lock()
			if w.afterKill != nil {
				w.afterKill(l)
			}
			c.open(l, false, nil)
			w.mu.Unlock()
			continue
		}
		victim := rng.IntN(len(c.reps))
		w.partition(victim, true)
		select {
		case <-stop:
		case <-time.After(400 * time.Millisecond):
		}
		w.partition(victim, false)
	}
}

func (w *workload) partition(victim int, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.c.reps[victim]
	if r == nil {
		return
	}
	for _, id := range w.c.ids {
		if id != w.c.ids[victim] {
			if err := r.Transport().SetLinkFault(id, transport.Fault{Partition: on}); err != nil {
				w.c.t.Fatal(err)
			}
		}
	}
}

func runWorkload(t *testing.T, w *workload, d time.Duration, kills bool, seed uint64) check.History {
	finish := w.start(seed, func(stop <-chan struct{}) { w.nemesis(stop, rand.New(rand.NewPCG(seed, 999)), kills) })
	time.Sleep(d)
	finish()
	return w.rec.History()
}

// start runs the workload's clients, client i on random stream (seed, i),
// and each of also (a nemesis, a fault schedule) in goroutines until finish,
// which stops them all and waits for them.
func (w *workload) start(seed uint64, also ...func(stop <-chan struct{})) (finish func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.client(i, stop, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}
	for _, f := range also {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(stop)
		}()
	}
	return func() {
		close(stop)
		wg.Wait()
	}
}

func summarize(h check.History) (ok, unknown int) { return h.Outcomes() }

func TestConcurrentHistoryUnderFaultsIsLinearizable(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) { o.CheckpointOps = 200; o.KeepTail = 20 })
	c.leader(5 * time.Second)
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 5, keys: workloadKeys("x", "y", "z"), sessionReads: true}
	h := runWorkload(t, w, workloadTime(), true, 1)
	ok, unknown := summarize(h)
	var snaps, ckpts uint64
	for _, r := range c.reps {
		if r != nil {
			snaps += r.Stats().SnapsLoaded
			ckpts += r.Stats().Checkpoints
		}
	}
	t.Logf("%d operations: %d ok, %d unknown, %d crashes; live replicas loaded %d snapshots, took %d checkpoints", len(h.Ops), ok, unknown, len(h.Crashes), snaps, ckpts)
	if ok < 100 {
		t.Fatalf("only %d operations completed: the cluster made no real progress under faults", ok)
	}
	v := check.Linearizable(h, linOptions())
	if !v.OK {
		t.Fatalf("history not linearizable:\n%v", v)
	}
	if v := check.Session(h, check.SessionOptions{}); !v.OK || v.Checked == 0 {
		t.Fatalf("session guarantees (%d reads judged):\n%v", v.Checked, v)
	}
}

// Power cuts: every replica's disk is a vfs.Mem, and a killed leader's disk
// loses what was not fsynced (a random prefix survives, maybe torn) before it
// restarts. Acknowledging anything before its fsync, or trusting the engine
// (never fsynced on the write path) over the log, shows up as a lost or
// doubled write.
func TestPowerLossHistoryIsLinearizable(t *testing.T) {
	mems := map[uint64]*vfs.Mem{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
	c := newCluster(t, 3, func(o *Options) {
		o.FS = mems[o.VR.Self]
		o.CheckpointOps = 300
		o.KeepTail = 20
	})
	c.leader(5 * time.Second)
	crashRng := mrand.New(mrand.NewSource(5))
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 5, keys: workloadKeys("x", "y"), sessionReads: true,
		afterKill: func(i int) { mems[c.ids[i]].Crash(crashRng) }}
	h := runWorkload(t, w, workloadTime(), true, 3)
	ok, unknown := summarize(h)
	t.Logf("%d operations: %d ok, %d unknown, %d power cuts", len(h.Ops), ok, unknown, len(h.Crashes))
	if ok < 100 || len(h.Crashes) == 0 {
		t.Fatalf("%d operations completed, %d power cuts: the test tested nothing", ok, len(h.Crashes))
	}
	if v := check.Linearizable(h, linOptions()); !v.OK {
		t.Fatalf("history not linearizable:\n%v", v)
	}
	if v := check.Session(h, check.SessionOptions{}); !v.OK {
		t.Fatalf("session guarantees:\n%v", v)
	}
}

// The same workload with a deliberately broken read path — linearizable
// reads served from any replica's local state — must fail the checker: proof
// that the test above can see a stale read.
func TestBrokenFollowerReadsFailTheChecker(t *testing.T) {
	mutation.Require(t)
	c := newCluster(t, 3, nil)
	for _, r := range c.reps {
		r.mut.followerLinearizable = true
	}
	l := c.leader(5 * time.Second)
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 4, keys: []string{"x"}, anyReplica: true}
	// Keep one follower partitioned for most of the run: it serves reads
	// from a state that stopped advancing.
	stale := (l + 1) % 3
	w.partition(stale, true)
	finish := w.start(7)
	time.Sleep(1500 * time.Millisecond)
	finish()
	h := w.rec.History()
	v := check.Linearizable(h, check.LinOptions{NoVisualization: true})
	if v.OK {
		ok, unknown := summarize(h)
		t.Fatalf("stale follower reads passed the linearizability checker (%d ops, %d ok, %d unknown): the workload cannot see the bug", len(h.Ops), ok, unknown)
	}
	t.Logf("checker caught the broken read path, as it must:\n%.600s", v.String())
}

// Session reads at a follower that ignores the session token (serves
// whatever it has) must fail the session checker.
func TestBrokenSessionReadsFailTheChecker(t *testing.T) {
	mutation.Require(t)
	c := newCluster(t, 3, nil)
	for _, r := range c.reps {
		r.mut.ignoreSession = true
	}
	l := c.leader(5 * time.Second)
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 3, keys: []string{"x"}, sessionReads: true}
	w.partition((l+1)%3, true)
	finish := w.start(11)
	time.Sleep(time.Second)
	finish()
	if v := check.Session(w.rec.History(), check.SessionOptions{}); v.OK {
		t.Fatalf("session reads ignoring the token passed the session checker (%d judged)", v.Checked)
	}
}

// The sync promise: an acknowledged write survives a power cut of every
// replica at once (only fsynced bytes survive). Writers run during the cut,
// so some batches are always written and not yet fsynced.
func TestAcknowledgedWritesSurviveWholeClusterPowerCut(t *testing.T) {
	for round := range 3 {
		mems := map[uint64]*vfs.Mem{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
		c := newCluster(t, 3, func(o *Options) { o.FS = mems[o.VR.Self]; o.RequestTimeout = 300 * time.Millisecond })
		l := c.leader(5 * time.Second)
		leader := c.reps[l]
		var mu sync.Mutex
		var acked []string
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					k := fmt.Sprintf("k-%d-%d", w, i)
					if _, err := leader.Write(context.Background(), set(k, "v"), level.Sync, shard.ReqID{}); err == nil {
						mu.Lock()
						acked = append(acked, k)
						mu.Unlock()
					} else {
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(150+100*round) * time.Millisecond)
		for i := range c.reps {
			c.kill(i)
		}
		close(stop)
		wg.Wait()
		for _, m := range mems {
			m.Crash(nil)
		}
		mu.Lock()
		keys := append([]string(nil), acked...)
		mu.Unlock()
		if len(keys) == 0 {
			t.Fatal("no write was acknowledged before the cut")
		}
		for i := range c.reps {
			c.open(i, false, nil)
		}
		nl := c.leader(10 * time.Second)
		for _, k := range keys {
			var res kv.Result
			var err error
			for try := 0; try < 100; try++ {
				if res, err = c.reps[nl].Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{}); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
				nl = c.leader(5 * time.Second)
			}
			if err != nil || res.Kind != kv.ResBulk {
				t.Fatalf("round %d: acknowledged write %s lost after the power cut (%d acknowledged): %+v, %v", round, k, len(keys), res, err)
			}
		}
		t.Logf("round %d: %d acknowledged writes survived", round, len(keys))
		c.closeAll()
	}
}
