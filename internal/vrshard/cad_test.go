package vrshard

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// gatedFS wraps a file system so a test can hold every fsync of the
// replication log (files under "/wal") until it opens the gate, or slow each
// one down: a disk that is slow to make things durable, while memory and the
// network are fast — exactly the gap cad exploits.
type gatedFS struct {
	vfs.FS
	mu     sync.Mutex
	closed bool
	open   chan struct{} // closed when the gate opens
	delay  atomic.Int64  // ns added to every log fsync
	held   atomic.Int64  // fsyncs waiting at the gate now
}

func newGatedFS(fs vfs.FS) *gatedFS { return &gatedFS{FS: fs, open: make(chan struct{})} }

func (g *gatedFS) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed, g.open = true, make(chan struct{})
	}
}

func (g *gatedFS) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.open)
	}
}

func (g *gatedFS) wait(name string) {
	if !strings.Contains(name, "/wal") {
		return
	}
	if d := g.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	g.mu.Lock()
	closed, ch := g.closed, g.open
	g.mu.Unlock()
	if closed {
		g.held.Add(1)
		<-ch
		g.held.Add(-1)
	}
}

func (g *gatedFS) Create(name string) (vfs.File, error) {
	f, err := g.FS.Create(name)
	if err != nil {
		return nil, err
	}
	return &gatedFile{File: f, g: g, name: name}, nil
}

func (g *gatedFS) OpenRW(name string) (vfs.File, error) {
	f, err := g.FS.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return &gatedFile{File: f, g: g, name: name}, nil
}

type gatedFile struct {
	vfs.File
	g    *gatedFS
	name string
}

func (f *gatedFile) Sync() error {
	f.g.wait(f.name)
	return f.File.Sync()
}

// WriteAt passes positional writes through (the files are vfs.Mem's), so
// these tests run the replication log on zero-filled segments, as a
// production replica does, not on its append fallback.
func (f *gatedFile) WriteAt(p []byte, off int64) (int, error) {
	return f.File.(vfs.WriterAt).WriteAt(p, off)
}

// gatedCluster is a 3-replica cluster whose replication-log fsyncs the test
// controls (each replica on its own in-memory disk).
// gateSet is every replica's gate: hold and release act on all of them.
type gateSet map[uint64]*gatedFS

func (gs gateSet) hold() {
	for _, g := range gs {
		g.hold()
	}
}

func (gs gateSet) release() {
	for _, g := range gs {
		g.release()
	}
}

func gatedCluster(t *testing.T, tune func(*Options)) (*cluster, gateSet, map[uint64]*vfs.Mem) {
	mems := map[uint64]*vfs.Mem{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
	gates := gateSet{}
	for id, m := range mems {
		gates[id] = newGatedFS(m)
	}
	c := newCluster(t, 3, func(o *Options) {
		o.FS = gates[o.VR.Self]
		if tune != nil {
			tune(o)
		}
	})
	return c, gates, mems
}

// heldLeader is a gated cluster (RequestTimeout 5s, then tune) whose leader
// holds k = v, readable, with every replica's log fsyncs then held (released
// when the test ends): nothing written from now on can commit until the test
// releases the gates.
func heldLeader(t *testing.T, tune func(*Options), k, v string) (*Replica, gateSet, kv.Result) {
	t.Helper()
	c, gates, _ := gatedCluster(t, func(o *Options) {
		o.RequestTimeout = 5 * time.Second
		if tune != nil {
			tune(o)
		}
	})
	leader := c.reps[c.leader(5*time.Second)]
	w0, err := leader.Write(context.Background(), set(k, v), level.Sync, shard.ReqID{})
	if err != nil {
		t.Fatal(err)
	}
	waitReadable(t, leader, w0.Version)
	gates.hold()
	t.Cleanup(gates.release)
	return leader, gates, w0
}

// A cad blind write is acknowledged once a majority holds it in memory: it
// completes while no replica can fsync its log, where a sync write cannot.
// A linearizable read of the key then waits until the write is durable (it
// is counted as a durability wait) and returns it; a read of a key with no
// pending write does not wait.
func TestCADWriteIsAcknowledgedBeforeFsyncAndReadWaitsForDurability(t *testing.T) {
	c, gates, _ := gatedCluster(t, func(o *Options) { o.RequestTimeout = 400 * time.Millisecond })
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	ctx := context.Background()
	if _, err := leader.Write(ctx, set("old", "v0"), level.Sync, shard.ReqID{}); err != nil {
		t.Fatal(err)
	}
	gates.hold()
	defer gates.release()

	res, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{Client: 5, Seq: 1})
	if err != nil || res.Kind != kv.ResOK || res.Version == 0 {
		t.Fatalf("cad SET with every log fsync held: %+v, %v; want OK at once", res, err)
	}
	if got := leader.Stats().EarlyAcks; got != 1 {
		t.Fatalf("early acks = %d, want 1", got)
	}
	if _, err := leader.Write(ctx, set("s", "v1"), level.Sync, shard.ReqID{Client: 6, Seq: 1}); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("sync SET with every log fsync held: %v; want it to time out (ErrOutcomeUnknown)", err)
	}
	// A state-dependent write at cad is acknowledged at apply, like sync.
	if _, err := leader.Write(ctx, kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 1}, level.CAD, shard.ReqID{Client: 7, Seq: 1}); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("cad INCR with every log fsync held: %v; want it to wait for commit (ErrOutcomeUnknown)", err)
	}

	// A key without pending writes is served at once, no wait counted.
	if r, err := leader.Read(ctx, get("old"), level.ConsLinearizable, shard.Session{}); err != nil || string(r.Bulk) != "v0" {
		t.Fatalf("read of a durable key: %+v, %v", r, err)
	}
	if n := leader.Stats().DurabilityWaits; n != 0 {
		t.Fatalf("durability waits = %d after reading a durable key, want 0", n)
	}

	got := heldRead(t, leader, "k", 150*time.Millisecond, "read of a cad key nobody persisted returned before any fsync")
	gates.release()
	o := <-got
	if o.err != nil || string(o.res.Bulk) != "v1" {
		t.Fatalf("read after the fsyncs: %+v, %v; want v1", o.res, o.err)
	}
	if n := leader.Stats().DurabilityWaits; n != 1 {
		t.Fatalf("durability waits = %d, want 1", n)
	}
	if R := leader.Info().Readable; R < res.Version {
		t.Fatalf("readable index %d below the op %d the read returned", R, res.Version)
	}
}

// The mutation that skips the durability check returns the cad write
// before any replica persisted it: the test above can fail.
func TestBrokenDurabilityCheckReadsUnpersistedWrite(t *testing.T) {
	mutation.Require(t)
	c, gates, _ := gatedCluster(t, nil)
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	leader.mut.noDurabilityWait = true
	gates.hold()
	defer gates.release()
	if _, err := leader.Write(context.Background(), set("k", "v1"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	// Uncommitted, the write is not in the engine: the broken read returns
	// the old state (absent) although the write was acknowledged — a stale
	// linearizable read the checker would flag.
	r, err := leader.Read(context.Background(), get("k"), level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != kv.ResNil {
		t.Fatalf("broken read returned %+v; expected the stale absent state", r)
	}
}

// A read released from its durability wait finds the R that released it
// already published, so it waits once: one round with the core, not two
// (docs/design/cad.md §9). The hook holds the driver right after it woke the
// reader, before ready() ends — where R used to be published — so the
// reader always runs in that window; a second round would show in
// DurabilityRounds.
func TestDurabilityWaitIsServedAfterOneRound(t *testing.T) {
	if n := durabilityRounds(t, false); n != 1 {
		t.Fatalf("durability rounds = %d for one waiting read, want 1: the reader saw the old R and waited again", n)
	}
}

// With R published only at the end of ready() (as before), the same read
// needs a second round: the test above can fail.
//
// The reader must reach the window while the driver sleeps in the hook; on
// a loaded machine it may arrive after R was published anyway (1 run in ~50),
// so the mutation gets three tries to show the second round.
func TestLateReadableCostsASecondRound(t *testing.T) {
	var n uint64
	for try := 1; try <= 3; try++ {
		if n = durabilityRounds(t, true); n >= 2 {
			return
		}
		t.Logf("try %d: %d durability round with the late publication", try, n)
	}
	t.Fatalf("durability rounds = %d with the late publication in three tries, want >= 2: the window was not tested", n)
}

// durabilityRounds makes one linearizable read wait for a cad write held
// back from every disk, then lets the fsyncs through, and returns how many
// waits the read registered with the core.
func durabilityRounds(t *testing.T, late bool) uint64 {
	mutation.Require(t) // test hooks too
	var armed atomic.Bool
	c, gates, _ := gatedCluster(t, func(o *Options) {
		o.mut.lateReadable = late
		o.mut.afterReadRelease = func() {
			if armed.Load() {
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	ctx := context.Background()
	gates.hold()
	released := false
	defer func() {
		if !released {
			gates.release()
		}
	}()
	if _, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	got := make(chan error, 1)
	go func() {
		r, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		if err == nil && string(r.Bulk) != "v1" {
			err = fmt.Errorf("read %+v, want v1", r)
		}
		got <- err
	}()
	if !testgroup.Until(5*time.Second, 2*time.Millisecond, func() bool { return leader.Stats().DurabilityRounds != 0 }) {
		t.Fatal("the read never registered a durability wait")
	}
	gates.release()
	released = true
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	st := leader.Stats()
	if st.DurabilityWaits != 1 {
		t.Fatalf("durability waits = %d, want 1", st.DurabilityWaits)
	}
	return st.DurabilityRounds
}

// A cad or async blind write is acknowledged once a majority holds it in
// memory, not at the leader's append (async shares cad's write path:
// ARCHITECTURE §2, docs/design/cad.md §19): a leader cut off from every
// follower answers neither. Once a follower hears it again both complete,
// before any fsync ends (every log fsync stays held).
func TestCadAndAsyncWritesWaitForAMajoritysMemory(t *testing.T) {
	for _, d := range []level.Durability{level.CAD, level.Async} {
		t.Run(d.String(), func(t *testing.T) {
			c, gates, _ := gatedCluster(t, func(o *Options) { o.RequestTimeout = 5 * time.Second })
			l := c.leader(5 * time.Second)
			leader := c.reps[l]
			gates.hold()
			defer gates.release()
			c.isolate(l, true)
			done := make(chan error, 1)
			go func() {
				_, err := leader.Write(context.Background(), set("k", "v"), d, shard.ReqID{Client: 9, Seq: 1})
				done <- err
			}()
			select {
			case err := <-done:
				t.Fatalf("%s SET at a leader cut off from every follower returned (%v); want it to wait for a majority's memory", d, err)
			case <-time.After(200 * time.Millisecond):
			}
			c.isolate(l, false)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("%s SET after the heal: %v", d, err)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("%s SET still waiting 3 s after the heal, with fsyncs held (a majority holds it in memory)", d)
			}
		})
	}
}

// An async blind write is read from the leader's overlay at once, from its
// append on: no durability wait (the documented unsafe baseline), even while
// every log fsync is held.
func TestAsyncWriteIsReadFromTheOverlayWithoutWaiting(t *testing.T) {
	c, gates, _ := gatedCluster(t, nil)
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	gates.hold()
	defer gates.release()
	if _, err := leader.Write(context.Background(), set("a", "x"), level.Async, shard.ReqID{}); err != nil {
		t.Fatal(err)
	}
	r, err := leader.Read(context.Background(), kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("a"), []byte("b")}}, level.ConsLinearizable, shard.Session{})
	if err != nil || len(r.Array) != 2 || string(r.Array[0]) != "x" || r.Array[1] != nil {
		t.Fatalf("MGET a b after async SET a: %+v, %v", r, err)
	}
	st := leader.Stats()
	if st.OverlayReads != 1 || st.DurabilityWaits != 0 {
		t.Fatalf("overlay reads %d, durability waits %d; want 1 and 0", st.OverlayReads, st.DurabilityWaits)
	}
}

// waitReadable waits until replica i knows a readable index of at least op.
// readOut is a read's outcome.
type readOut struct {
	res kv.Result
	err error
}

// heldRead starts a linearizable read of k on r and fails with msg if it
// returns within d; the read's outcome arrives on the channel later.
func heldRead(t *testing.T, r *Replica, k string, d time.Duration, msg string) <-chan readOut {
	t.Helper()
	got := make(chan readOut, 1)
	go func() {
		res, err := r.Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
		got <- readOut{res, err}
	}()
	select {
	case o := <-got:
		t.Fatalf("%s: %+v, %v", msg, o.res, o.err)
	case <-time.After(d):
	}
	return got
}

func waitReadable(t *testing.T, r *Replica, op uint64) {
	t.Helper()
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return r.Info().Readable >= op }) {
		t.Fatalf("replica %d: readable %d never reached %d", r.cfg.Self, r.Info().Readable, op)
	}
}

// waitLease waits until follower r holds an active-set read lease (the
// leader grants one once it has applied R; a fresh group needs a moment).
func waitLease(t *testing.T, r *Replica) {
	t.Helper()
	var err error
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
		rw := &readWaiter{done: make(chan struct{}), kind: rwFollower}
		if serr := r.sendRead(context.Background(), rw); serr != nil {
			t.Fatal(serr)
		}
		<-rw.done
		err = rw.err
		return err == nil
	}) {
		t.Fatalf("replica %d never got a read lease: %v", r.cfg.Self, err)
	}
}

func followerReadOpts(o *Options) {
	o.FollowerReads = true
	o.VR.MarkOut = 150 * time.Millisecond
	o.VR.Removal = 1500 * time.Millisecond
	o.VR.Suspect = 60 * time.Millisecond
}

// With follower reads, a follower holding an active-set lease serves a
// cross-client-monotonic read itself when the key's latest update is
// readable, and redirects to the leader while it is not (here: a third
// replica is cut off, so R stays behind until the leader removes it).
func TestFollowerServesCrossClientMonotonicReadsOnlyWhenReadable(t *testing.T) {
	c := newCluster(t, 3, followerReadOpts)
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	f, cut := c.reps[(l+1)%3], (l+2)%3
	ctx := context.Background()
	if _, err := leader.Write(ctx, set("stable", "s"), level.CAD, shard.ReqID{Client: 5, Seq: 100}); err != nil {
		t.Fatal(err)
	}
	res, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{Client: 5, Seq: 101})
	if err != nil {
		t.Fatal(err)
	}
	waitReadable(t, f, res.Version)
	waitLease(t, f)
	r, err := f.Read(ctx, get("k"), level.ConsCrossClient, shard.Session{})
	if err != nil || string(r.Bulk) != "v1" {
		t.Fatalf("follower read of a readable key: %+v, %v", r, err)
	}
	if st := f.Stats(); st.FollowerReads != 1 {
		t.Fatalf("follower served %d reads, want 1", st.FollowerReads)
	}

	// Cut one follower off: it stays in the active set (REMOVING) for
	// Removal, holding R back, while the other follower applies new writes.
	w := &workload{c: c}
	w.partition(cut, true)
	defer w.partition(cut, false)
	res2, err := leader.Write(ctx, set("k", "v2"), level.Sync, shard.ReqID{Client: 5, Seq: 102})
	if err != nil {
		t.Fatal(err)
	}
	for f.Info().Applied < res2.Version {
		time.Sleep(2 * time.Millisecond)
	}
	if R := f.Info().Readable; R >= res2.Version {
		t.Skipf("R reached %d before the check (the box stalled past Removal)", R)
	}
	_, err = f.Read(ctx, get("k"), level.ConsCrossClient, shard.Session{})
	if id, _, ok := LeaderOf(err); !ok || id != c.ids[l] {
		t.Fatalf("follower read of a key updated after R: %v; want a redirect to the leader %d", err, c.ids[l])
	}
	if st := f.Stats(); st.FollowerRedirects == 0 {
		t.Fatal("redirect not counted")
	}
	// A key not updated since R is still served locally, even now.
	if r, err := f.Read(ctx, get("stable"), level.ConsCrossClient, shard.Session{}); err != nil || string(r.Bulk) != "s" {
		t.Fatalf("follower read of a key untouched since R: %+v, %v", r, err)
	}
	// Once the leader drops the cut replica, R passes the write and the
	// follower serves it (under its read lease, which a stall of the
	// loaded box may have let lapse meanwhile, as at the start).
	waitReadable(t, f, res2.Version)
	waitLease(t, f)
	r, err = f.Read(ctx, get("k"), level.ConsCrossClient, shard.Session{})
	if err != nil || string(r.Bulk) != "v2" {
		t.Fatalf("follower read after R passed the write: %+v, %v", r, err)
	}
	// The cut-off replica has no lease any more: it redirects.
	_, err = c.reps[cut].Read(ctx, get("k"), level.ConsCrossClient, shard.Session{})
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("cut-off replica answered a cross-client-monotonic read: %v", err)
	}
	if _, ok := c.reps[cut].TryRead(get("k"), level.ConsCrossClient); ok {
		t.Fatal("cut-off replica's TryRead answered a cross-client-monotonic read")
	}
}

// A follower's published read lease (localFollowerLease) ends on time: a
// follower cut off from its leader, which (view changes slowed down) stays
// a normal follower of the view, stops serving once its grant runs out,
// though the lease it published is still the last it held. With the
// localLeaseNoClock mutation it serves the value from before a write the
// other follower already served — a read back in time.
func TestFollowerLocalLeaseEndsOnTime(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "lease", true: "localLeaseNoClock"}[broken], func(t *testing.T) {
			c := newCluster(t, 3, func(o *Options) {
				followerReadOpts(o)
				o.VR.ViewChangeTimeout = time.Minute // the cut follower stays normal
			})
			l := c.leader(5 * time.Second)
			leader := c.reps[l]
			f, ci := c.reps[(l+1)%3], (l+2)%3
			cut := c.reps[ci]
			ctx := context.Background()
			res, err := leader.Write(ctx, set("k", "v1"), level.Sync, shard.ReqID{Client: 5, Seq: 1})
			if err != nil {
				t.Fatal(err)
			}
			waitReadable(t, cut, res.Version)
			waitLease(t, cut)
			if r, ok := cut.TryRead(get("k"), level.ConsCrossClient); !ok || string(r.Bulk) != "v1" {
				t.Fatalf("follower under its lease: TryRead = %q, %v; want \"v1\", true", r.Bulk, ok)
			}
			w := &workload{c: c}
			w.partition(ci, true)
			defer w.partition(ci, false)
			res2, err := leader.Write(ctx, set("k", "v2"), level.Sync, shard.ReqID{Client: 5, Seq: 2})
			if err != nil {
				t.Fatal(err)
			}
			waitReadable(t, f, res2.Version) // the leader dropped the cut follower
			// The other follower serves v2 once it holds a lease (on a loaded
			// machine its grant may lapse and come back: retry until it does).
			var r kv.Result
			if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
				r, err = f.Read(ctx, get("k"), level.ConsCrossClient, shard.Session{})
				return err == nil
			}) || string(r.Bulk) != "v2" {
				t.Fatalf("follower read after R passed v2: %+v, %v", r, err)
			}
			cut.mut.localLeaseNoClock = broken
			r, ok := cut.TryRead(get("k"), level.ConsCrossClient)
			if ok != broken {
				t.Fatalf("mutated=%t: cut-off follower's TryRead = %q, %v after another follower served v2", broken, r.Bulk, ok)
			}
			if broken && string(r.Bulk) != "v1" {
				t.Fatalf("mutated: TryRead = %q, want the stale \"v1\"", r.Bulk)
			}
		})
	}
}

// The mutation that skips the R check at followers: a follower serves a
// value beyond R while another active-set member, cut off but still holding
// its lease, serves the older one afterwards — reads go back in time, and
// the cross-client monotonic checker says so. (The correct path redirects
// the first read: TestFollowerServesCrossClientMonotonicReadsOnlyWhenReadable.)
func TestBrokenFollowerRCheckGoesBackInTime(t *testing.T) {
	mutation.Require(t)
	c := newCluster(t, 3, func(o *Options) {
		followerReadOpts(o)
		o.VR.MarkOut = 400 * time.Millisecond // capped by the leader's lease
	})
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	f, cut := c.reps[(l+1)%3], c.reps[(l+2)%3]
	f.mut.followerNoRCheck = true
	ctx := context.Background()
	rec := check.NewRecorder(nil)
	put := func(v string, seq uint64) uint64 {
		h := rec.Invoke(check.Op{Client: 0, Key: "k", Kind: check.Put, Value: v, Dur: level.Sync})
		res, err := leader.Write(ctx, set("k", v), level.Sync, shard.ReqID{Client: 5, Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		rec.Complete(h, check.Result{Version: res.Version, Node: l})
		return res.Version
	}
	read := func(r *Replica, client int) (string, error) {
		h := rec.Invoke(check.Op{Client: client, Key: "k", Kind: check.Get, Cons: level.ConsCrossClient})
		res, err := r.Read(ctx, get("k"), level.ConsCrossClient, shard.Session{})
		if err != nil {
			rec.Fail(h)
			return "", err
		}
		rec.Complete(h, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Version: res.Version})
		return string(res.Bulk), nil
	}
	v1 := put("v1", 1)
	waitReadable(t, f, v1)
	waitReadable(t, cut, v1)
	waitLease(t, f)
	waitLease(t, cut)
	w := &workload{c: c}
	ci := (l + 2) % 3
	w.partition(ci, true)
	defer w.partition(ci, false)
	v2 := put("v2", 2)
	for f.Info().Applied < v2 {
		time.Sleep(time.Millisecond)
	}
	got1, err1 := read(f, 1)
	got2, err2 := read(cut, 2)
	if err1 != nil || err2 != nil || got1 != "v2" || got2 != "v1" {
		t.Skipf("timing: follower read %q (%v), cut-off member read %q (%v); the cut member's lease may have run out first", got1, err1, got2, err2)
	}
	if v := check.CrossClientMonotonic(rec.History()); v.OK {
		t.Fatal("a read of v1 after a read of v2 passed the cross-client monotonic checker")
	}
}

// Histories with cad writes, cross-client-monotonic reads at every replica
// (follower reads) and linearizable reads at the leader, under leader kills
// with power loss (unsynced log bytes lost) and whole-cluster power cuts: no
// read may go back in time (check.CrossClientMonotonic), and no value once
// read may be lost (check.Durability). With async writes the same schedule
// must show the anomaly: proof the checkers and the schedule can see it.
func TestCADHistoryWithPowerCutsIsCrossClientMonotonic(t *testing.T) {
	for seed := uint64(21); seed < 23; seed++ {
		h := cadPowerCutHistory(t, level.CAD, seed)
		if v := check.CrossClientMonotonic(h); !v.OK || v.Checked == 0 {
			t.Fatalf("seed %d: cross-client monotonic (%d reads judged):\n%v", seed, v.Checked, v)
		}
		if v := check.Durability(h); !v.OK {
			t.Fatalf("seed %d: durability:\n%v", seed, v)
		}
	}
}

func TestAsyncHistoryWithPowerCutsGoesBackInTime(t *testing.T) {
	// Several seeds: the anomaly needs a power cut to land after an async
	// write was read and before it was persisted anywhere.
	for seed := uint64(31); seed < 39; seed++ {
		h := cadPowerCutHistory(t, level.Async, seed)
		if v := check.CrossClientMonotonic(h); !v.OK {
			t.Logf("seed %d: the checker caught async losing a value already read, as it must:\n%.700s", seed, v.String())
			return
		}
	}
	t.Fatal("async writes with reads and whole-cluster power cuts passed the cross-client monotonic checker in every seed: the test cannot see the anomaly")
}

// cadPowerCutHistory runs puts at level d (CAS stays sync), cross-client
// monotonic reads at random replicas and linearizable reads at the leader,
// with a slow log fsync (so acknowledged-but-unpersisted writes exist) and,
// in turn, a whole-cluster power cut during a disk stall (no unsynced byte
// survives) and a partitioned follower followed by a leader power cut (a
// random prefix of its unsynced bytes survives).
func cadPowerCutHistory(t *testing.T, d level.Durability, seed uint64) check.History {
	t.Helper()
	h, _ := cadPowerCutRun(t, d, seed, nil, nil)
	return h
}

// cadPowerCutRun is cadPowerCutHistory with the replicas' options and the
// workload tuned (nil: as there), returning the workload too.
func cadPowerCutRun(t *testing.T, d level.Durability, seed uint64, tune func(*Options), wtune func(*workload)) (check.History, *workload) {
	t.Helper()
	c, gates, mems := gatedCluster(t, func(o *Options) {
		if tune != nil {
			tune(o)
		}
		followerReadOpts(o)
		o.CheckpointOps = 300
		o.KeepTail = 20
		o.RequestTimeout = 500 * time.Millisecond
		// Leaders change on every cut: elect the next one quickly.
		o.VR.ViewChangeTimeout, o.VR.LeaseDuration = 300*time.Millisecond, 250*time.Millisecond
	})
	for _, g := range gates {
		g.delay.Store(int64(10 * time.Millisecond))
	}
	c.leader(5 * time.Second)
	crashRng := mrand.New(mrand.NewSource(int64(seed)))
	w := &workload{c: c, rec: check.NewRecorder(nil), clients: 6, keys: workloadKeys("x", "y"), dur: d, ccmReads: true}
	if wtune != nil {
		wtune(w)
	}
	finish := w.start(seed)
	rounds := max(4, int(workloadTime()/time.Second)+1)
	for round := range rounds {
		time.Sleep(500 * time.Millisecond)
		if round%2 == 0 {
			// A whole-cluster power cut while the disks stall: every fsync
			// of the last 150ms is held, then every replica loses all it
			// had not fsynced (the power goes before the fsyncs return).
			gates.hold()
			time.Sleep(150 * time.Millisecond)
			w.mu.Lock()
			for i := range c.reps {
				w.rec.Crash(i)
				mems[c.ids[i]].Crash(nil)
			}
			gates.release()
			for i := range c.reps {
				if c.reps[i] != nil {
					c.reps[i].crash()
					c.reps[i] = nil
				}
			}
			w.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			w.mu.Lock()
			for i := range c.reps {
				c.open(i, false, nil)
			}
			w.mu.Unlock()
			continue
		}
		// A follower cut off for a while: it keeps its lease (and serves)
		// until the lease runs out, while the others move on.
		w.mu.Lock()
		var lead int
		for i, r := range c.reps {
			if r != nil && r.Info().IsLeader {
				lead = i
			}
		}
		w.mu.Unlock()
		cut := (lead + 1 + int(seed+uint64(round))%2) % len(c.reps)
		w.partition(cut, true)
		time.Sleep(300 * time.Millisecond)
		w.partition(cut, false)
		// A power cut of the leader: a random prefix of its unsynced bytes
		// survives, maybe torn.
		w.mu.Lock()
		victims := []int{}
		for i, r := range c.reps {
			if r != nil && r.Info().IsLeader {
				victims = append(victims, i)
			}
		}
		for _, i := range victims {
			w.rec.Crash(i)
			c.reps[i].crash()
			c.reps[i] = nil
			mems[c.ids[i]].Crash(crashRng)
		}
		w.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		w.mu.Lock()
		for _, i := range victims {
			c.open(i, false, nil)
		}
		w.mu.Unlock()
	}
	time.Sleep(600 * time.Millisecond)
	finish()
	h := w.rec.History()
	ok, unknown := summarize(h)
	t.Logf("%s seed %d: %d operations, %d ok, %d unknown, %d crashes", d, seed, len(h.Ops), ok, unknown, len(h.Crashes))
	if ok < 100 {
		t.Fatalf("only %d operations completed: the test tested nothing", ok)
	}
	return h, w
}

// doCCMRead reads at a random replica at cross-client-monotonic level,
// following redirects.
func (w *workload) doCCMRead(h int, sop kv.Op, rng *rand.Rand) {
	target := rng.IntN(len(w.c.reps))
	w.readAt(h, target, sop, level.ConsCrossClient, shard.Session{})
}

// cad and async writes are acknowledged before they commit, so writers can
// outrun the commit point; when the pipeline is full (MaxInflight
// uncommitted ops) later writes wait for room instead of failing.
func TestEarlyAckedWritersWaitForPipelineRoom(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) { o.VR.MaxInflight = 8 })
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				d := level.Async
				if w%2 == 0 {
					d = level.CAD
				}
				if _, err := leader.Write(context.Background(), set(fmt.Sprintf("k%d-%d", w, i), "v"), d, shard.ReqID{}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 640 early-acknowledged writes failed with an 8-op pipeline, first: %v", n, firstErr.Load())
	}
}

// A follower without follower reads never learns an R (the leader sends
// it only to groups that read at followers), and its per-key update index
// used to be pruned by it: it kept every key of every op it applied, for
// as long as it followed (300 writes: 300 entries, never dropped). It now
// forgets what it applied, raising the floor so that, leading later, it
// reads through the engine's versions until its R passes it. Then the
// old leader is stopped, a follower takes over, and the writes read back.
func TestFollowerUpdateIndexStaysBounded(t *testing.T) {
	c := newCluster(t, 3, nil)
	var last uint64
	for i := 0; i < 300; i++ {
		res, err := c.write(set(fmt.Sprintf("k%d", i), "v"), shard.ReqID{Client: 9, Seq: uint64(i + 1)}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		last = res.Version
	}
	c.waitApplied(last, 10*time.Second)
	size := func(r *Replica) (int, int, uint64) {
		r.upd.mu.Lock()
		defer r.upd.mu.Unlock()
		return len(r.upd.queue), len(r.upd.last), r.upd.floor
	}
	leader := -1
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < len(c.reps); i++ {
		r := c.reps[i]
		if r.isLeader.Load() {
			leader = i
			continue
		}
		// The follower's publish after its last apply prunes it.
		for {
			q, l, floor := size(r)
			if q <= 2 && l <= 2 && floor+2 >= last {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("follower %d's update index after %d writes: %d ops, %d keys, floor %d (op %d)", i, 300, q, l, floor, last)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	c.kill(leader)
	nl := c.leader(10 * time.Second)
	for i := 0; i < 300; i += 37 {
		k := fmt.Sprintf("k%d", i)
		var got string
		var err error
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got, err = c.linGet(nl, k); err == nil || time.Now().After(end) {
				break
			}
		}
		if err != nil || got != "v" {
			t.Fatalf("after the failover, %s = %q (%v)", k, got, err)
		}
	}
}
