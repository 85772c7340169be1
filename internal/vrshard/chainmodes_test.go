package vrshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// newModeChain is a chain of three log members (D-D-D) on the production
// host whose members and master run mode.
func newModeChain(t *testing.T, mode chain.Mode, tune func(i int, o *Options)) *chainGroup {
	return newChainGroupMode(t, 0, mode, func(i int, o *Options) {
		co := *o.Chain
		co.Mode = mode
		o.Chain = &co
		if tune != nil {
			tune(i, o)
		}
	})
}

// readOnce reads k at node i at level c, once, within a second.
func (g *chainGroup) readOnce(i int, k string, c level.Consistency) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	res, err := g.reps[i].Read(ctx, get(k), c, shard.Session{})
	return string(res.Bulk), err
}

// writeOnce writes op at node i at durability d, once, within timeout.
func (g *chainGroup) writeOnce(i int, op kv.Op, d level.Durability, id shard.ReqID, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := g.reps[i].Write(ctx, op, d, id)
	return err
}

// eventual reads k at node i at the eventual level, retrying while the node
// cannot serve yet (no lease, a repair under way).
func (g *chainGroup) eventual(i int, k string) string {
	g.t.Helper()
	var res kv.Result
	g.retry(i, "eventual read "+k, func(ctx context.Context, r *Replica) (err error) {
		res, err = r.Read(ctx, get(k), level.ConsEventual, shard.Session{})
		return err
	})
	return string(res.Bulk)
}

// TestChainModesOnTheHost: a chain of three log members in each update mode
// serves each level as docs/design/chain.md's table says. SU and AUSI: sync
// writes at the head, linearizable reads served at every member (CRAQ). AU: a linearizable
// read is refused at every member with ErrNotOfferedUnderAU (not redirected:
// no member serves it), eventual reads are served everywhere. An async
// blind write is answered early (before its commit, by the head alone)
// under AU only; under SU and AUSI it is answered at commit, as sync (no
// early acknowledgement) — and, as before the modes, a cad write on a chain
// is answered too (at commit) rather than refused by the core.
func TestChainModesOnTheHost(t *testing.T) {
	for _, mode := range []chain.Mode{chain.SU, chain.AUSI, chain.AU} {
		t.Run(mode.String(), func(t *testing.T) {
			g := newModeChain(t, mode, nil)
			for k := range 10 {
				g.write(0, set(fmt.Sprint("m", k), fmt.Sprint("v", k)), shard.ReqID{Client: 5, Seq: uint64(k + 1)})
			}
			g.caughtUp(1, 0)
			g.caughtUp(2, 0)
			for i := range 3 {
				if mode == chain.AU {
					if got, err := g.readOnce(i, "m3", level.ConsLinearizable); !errors.Is(err, ErrNotOfferedUnderAU) {
						t.Fatalf("AU: linearizable read at node %d = %q, %v; want ErrNotOfferedUnderAU", i+1, got, err)
					}
				} else {
					// At every member (CRAQ: m3 is clean everywhere), once
					// the member is ready (its lease, the chain's
					// configuration: a member just started says "leader
					// unknown" until then).
					var got string
					g.retry(i, "linearizable read of m3", func(ctx context.Context, r *Replica) error {
						res, err := r.Read(ctx, get("m3"), level.ConsLinearizable, shard.Session{})
						got = string(res.Bulk)
						return err
					})
					if got != "v3" {
						t.Fatalf("%v: linearizable read at node %d = %q", mode, i+1, got)
					}
				}
				if got := g.eventual(i, "m3"); got != "v3" {
					t.Fatalf("%v: eventual read at node %d = %q", mode, i+1, got)
				}
			}
			before := g.reps[0].st.earlyAcks.Load()
			for k, d := range []level.Durability{level.Async, level.CAD, level.Async} {
				if err := g.try(0, "write", func(ctx context.Context, r *Replica) error {
					_, err := r.Write(ctx, set(fmt.Sprint("a", k), "x"), d, shard.ReqID{Client: 6, Seq: uint64(k + 1)})
					return err
				}); err != nil {
					t.Fatalf("%v: %v write: %v", mode, d, err)
				}
				key := fmt.Sprint("a", k)
				if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return g.eventual(2, key) == "x" }) {
					t.Fatalf("%v: the %v write never reached the tail", mode, d)
				}
			}
			early := g.reps[0].st.earlyAcks.Load() - before
			if want := map[chain.Mode]uint64{chain.AU: 2}[mode]; early != want {
				t.Fatalf("%v: %d writes answered before their commit, want %d (AU: the two async ones)", mode, early, want)
			}
		})
	}
}

// auWindow is the loss table's AU and AUSI columns on the host: with
// writes answered in sync at a chain of three log members, the middle
// member crashes; before the master's failure timeout (0.7 s) repairs the
// chain, the head is asked for five async writes (200 ms each), then the
// head crashes too. It returns how many of the five were answered, the
// longest time one took, and how many of those answered the survivor (the
// tail, the chain of one the master repairs to) lacks. Every sync write
// is kept in both modes. The crashed members then restart from their disks
// and rejoin: the old head dropped what it had answered but not passed on
// (an uncommitted suffix of its log), so no member holds a write the chain
// does not. Last every member crashes and restarts: every sync write is
// still there.
func auWindow(t *testing.T, mode chain.Mode, atCommit bool) (answered int, slowest time.Duration, lost int) {
	g := newModeChain(t, mode, func(i int, o *Options) {
		if mutation.On && atCommit {
			o.mut.chainAUAtCommit = true
		}
	})
	for k := range 10 {
		g.write(0, set(fmt.Sprint("s", k), fmt.Sprint("v", k)), shard.ReqID{Client: 5, Seq: uint64(k + 1)})
	}
	// A first async write: the head's lease and overlay are warm.
	g.retry(0, "async write", func(ctx context.Context, r *Replica) error {
		_, err := r.Write(ctx, set("warm", "w"), level.Async, shard.ReqID{Client: 6, Seq: 1})
		return err
	})
	g.caughtUp(2, 0)
	g.crash(1)
	crashed := time.Now()
	var acked []string
	for k := range 5 {
		key := fmt.Sprint("w", k)
		start := time.Now()
		if err := g.writeOnce(0, set(key, "x"), level.Async, shard.ReqID{Client: 6, Seq: uint64(k + 2)}, 200*time.Millisecond); err == nil {
			acked = append(acked, key)
			slowest = max(slowest, time.Since(start))
		}
		if mode == chain.AUSI && k == 1 {
			break // none answered: two (0.4 s) will do before the failure timeout
		}
	}
	if ms := g.master.Members(); !slices.Equal(ms, []uint64{1, 2, 3}) || time.Since(crashed) > 650*time.Millisecond {
		t.Logf("the master repaired the chain (%v) %v after the crash, before the head's: the window may be smaller", ms, time.Since(crashed))
	}
	g.crash(0)
	g.waitMembers(3)
	for k := range 10 {
		if got := g.eventual(2, fmt.Sprint("s", k)); got != fmt.Sprint("v", k) {
			t.Fatalf("%v: sync write s%d lost with the head and the middle: %q", mode, k, got)
		}
	}
	for _, k := range acked {
		if g.eventual(2, k) != "x" {
			lost++
		}
	}
	// The old head and the middle rejoin from their disks: the head's
	// answered-but-unforwarded writes were never committed, and go.
	g.restart(0)
	g.restart(1)
	if !testgroup.Until(15*time.Second, 10*time.Millisecond, func() bool { return len(g.master.Members()) == 3 }) {
		t.Fatalf("%v: the crashed members did not rejoin: %v", mode, g.master.Members())
	}
	for i := range 2 {
		g.caughtUp(i, 2)
		for _, k := range acked {
			if got, want := g.eventual(i, k), g.eventual(2, k); got != want {
				t.Fatalf("%v: node %d holds %s = %q after its rejoin, the chain %q", mode, i+1, k, got, want)
			}
		}
	}
	restartWhole(t, g)
	for i := range 3 {
		for k := range 10 {
			if got := g.eventual(i, fmt.Sprint("s", k)); got != fmt.Sprint("v", k) {
				t.Fatalf("%v: sync write s%d at node %d after a crash of every member: %q", mode, k, i+1, got)
			}
		}
	}
	return len(acked), slowest, lost
}

// TestChainModesLoss: the loss table's AUSI and AU columns on the host
// (auWindow). AU: the head answers each async write by itself, at once
// (well under the 200 ms a write is given, while no write can commit), and
// its crash loses every one of them — AU's window. AUSI: none is answered
// while a member is down (the answer waits for the acknowledgement round),
// so the head's crash loses nothing acknowledged.
func TestChainModesLoss(t *testing.T) {
	t.Run("AU", func(t *testing.T) {
		answered, slowest, lost := auWindow(t, chain.AU, false)
		t.Logf("AU: %d async writes answered by the head alone (slowest %v), %d lost with it", answered, slowest, lost)
		if answered != 5 || slowest > 150*time.Millisecond {
			t.Fatalf("AU: %d of 5 async writes answered by the head with its successor down (slowest %v); want all, each at once", answered, slowest)
		}
		if lost != answered {
			t.Fatalf("AU: the head's crash lost %d of the %d writes only it held", lost, answered)
		}
	})
	t.Run("AUSI", func(t *testing.T) {
		answered, _, lost := auWindow(t, chain.AUSI, false)
		if answered != 0 || lost != 0 {
			t.Fatalf("AUSI: %d writes answered with a member down, %d of them lost; want none answered", answered, lost)
		}
	})
}

// TestChainAUModeMutation: the AU head answering async writes only at
// commit (chainAUAtCommit, the mode ignored for the answer) is caught by
// TestChainModesLoss's assertion: with the middle member down, none is
// answered within its 200 ms.
func TestChainAUModeMutation(t *testing.T) {
	mutation.Require(t)
	answered, slowest, _ := auWindow(t, chain.AU, true)
	if answered == 5 && slowest <= 150*time.Millisecond {
		t.Fatalf("chainAUAtCommit: every async write still answered at once (slowest %v): the test would not catch it", slowest)
	}
	t.Logf("chainAUAtCommit: %d of 5 async writes answered with the middle down: caught", answered)
}

// TestChainModeMismatchRefused: a member started with another update mode
// than its chain's (the master's) is refused: the master does not count it
// alive and repairs the chain around it, and the member serves nothing,
// saying why (ModeMismatchError) — it neither answers writes under its own
// rule nor acknowledges under another.
func TestChainModeMismatchRefused(t *testing.T) {
	g := newChainGroupMode(t, 0, chain.SU, nil)
	g.write(0, set("k", "v0"), shard.ReqID{Client: 5, Seq: 1})
	// The tail restarts with another mode (an operator's wrong flag).
	g.crash(2)
	g.tune = func(i int, o *Options) {
		if i == 2 {
			co := *o.Chain
			co.Mode = chain.AU
			o.Chain = &co
		}
	}
	g.restart(2)
	g.waitMembers(1, 2)
	time.Sleep(300 * time.Millisecond) // were it joined, the master would have ordered it by now
	if ms := g.master.Members(); !slices.Equal(ms, []uint64{1, 2}) {
		t.Fatalf("the AU member was joined to the SU chain: %v", ms)
	}
	g.write(0, set("k", "v"), shard.ReqID{Client: 5, Seq: 2})
	if got := g.read(0, "k"); got != "v" {
		t.Fatalf("GET k at the head of the repaired chain = %q", got)
	}
	_, err := g.readOnce(2, "k", level.ConsEventual)
	werr := g.writeOnce(2, set("k", "w"), level.Sync, shard.ReqID{Client: 7, Seq: 1}, time.Second)
	if !testgroup.Until(3*time.Second, 20*time.Millisecond, func() bool {
		_, err = g.readOnce(2, "k", level.ConsEventual)
		return err != nil
	}) || werr == nil {
		t.Fatalf("the AU member served: read %v, write %v", err, werr)
	}
	if st := g.reps[2].Info().Status; st.String() != "removed" {
		t.Fatalf("the refused member's status is %v, want removed", st)
	}
	if e := (&ModeMismatchError{Member: 3, Mode: chain.AU, Chain: chain.SU}).Error(); !strings.Contains(e, "--chain-mode su") {
		t.Fatalf("the refusal does not say what to do: %s", e)
	}
}

// isRedirectTo reports whether err redirects to node id.
func isRedirectTo(err error, id uint64) bool {
	got, _, ok := LeaderOf(err)
	return ok && got == id
}

// modeLatencies runs five writes at each durability of ds at the head of a
// chain of three log members in mode whose every disk takes extra more per
// fsync (vfs.SlowSync), one at a time, and returns each durability's mean
// latency.
func modeLatencies(t *testing.T, mode chain.Mode, extra time.Duration, mut func(o *Options), ds ...level.Durability) map[level.Durability]time.Duration {
	g := newModeChain(t, mode, func(i int, o *Options) {
		o.FS = vfs.SlowSync(vfs.OS{}, extra)
		if mut != nil {
			mut(o)
		}
	})
	g.write(0, set("warm", "w"), shard.ReqID{Client: 5, Seq: 1}) // the lease, the links
	lat := map[level.Durability]time.Duration{}
	seq := uint64(1)
	for _, d := range ds {
		var total time.Duration
		const n = 5
		for k := range n {
			seq++
			start := time.Now()
			if err := g.writeOnce(0, set(fmt.Sprint("d", k), "v"), d, shard.ReqID{Client: 5, Seq: seq}, 2*time.Second); err != nil {
				t.Fatalf("%v: %v write: %v", mode, d, err)
			}
			total += time.Since(start)
		}
		lat[d] = total / n
	}
	for i := range 3 {
		g.crash(i)
	}
	return lat
}

// TestChainAUSIWaitsForNoDisk: every member's disk takes 100 ms more per
// fsync (vfs.SlowSync). Under SU a sync write is answered only after every
// log member fsynced it, one after the other: at least 300 ms. Under AUSI no
// member's answer or acknowledgement waits for a disk (docs/design/chain.md,
// "Update modes on the host"): an async write is answered in well under
// one fsync's time, and so is AU's. A sync write under AUSI and AU is
// answered only once every log member fsynced it, as under SU, but the
// members fsync side by side ("Per-request durability"): at least one
// fsync's time. AUSI's flag ignored (the core left in SU) fails it, and so
// does the sync write answered at commit (chainSyncAtCommit,
// TestChainSyncAtCommitMutation).
func TestChainAUSIWaitsForNoDisk(t *testing.T) {
	const extra = 100 * time.Millisecond
	su := modeLatencies(t, chain.SU, extra, nil, level.Sync)
	ausi := modeLatencies(t, chain.AUSI, extra, nil, level.Async, level.Sync)
	au := modeLatencies(t, chain.AU, extra, nil, level.Async, level.Sync)
	t.Logf("mean write with %v more per fsync: SU sync %v; AUSI async %v, sync %v; AU async %v, sync %v",
		extra, su[level.Sync], ausi[level.Async], ausi[level.Sync], au[level.Async], au[level.Sync])
	if su[level.Sync] < 3*extra {
		t.Fatalf("SU answered a write in %v, under three fsyncs in series (%v): the disk is not slow", su[level.Sync], 3*extra)
	}
	for mode, lat := range map[chain.Mode]map[level.Durability]time.Duration{chain.AUSI: ausi, chain.AU: au} {
		if lat[level.Async] >= extra {
			t.Fatalf("%v answered an async write in %v: it waited for a disk (one fsync is %v more)", mode, lat[level.Async], extra)
		}
		if lat[level.Sync] < extra {
			t.Fatalf("%v answered a sync write in %v, under one fsync (%v): it did not wait for the log members' disks", mode, lat[level.Sync], extra)
		}
	}
}

// TestChainSyncAtCommitMutation: with chainSyncAtCommit (a sync write on an
// AUSI chain answered at commit, the code before session 30) the sync write
// is answered in under one fsync's time: TestChainAUSIWaitsForNoDisk's
// assertion catches it.
func TestChainSyncAtCommitMutation(t *testing.T) {
	mutation.Require(t)
	const extra = 100 * time.Millisecond
	lat := modeLatencies(t, chain.AUSI, extra, func(o *Options) { o.mut.chainSyncAtCommit = true }, level.Sync)
	if lat[level.Sync] >= extra {
		t.Fatalf("chainSyncAtCommit: the sync write still took %v: the test would not catch it", lat[level.Sync])
	}
	t.Logf("chainSyncAtCommit: AUSI sync write in %v, under one fsync: caught", lat[level.Sync])
}

// lateSyncFS is a disk whose every fsync waits d before it reaches the disk
// (vfs.SlowSync waits after): a power cut within d of a write finds it
// unsynced.
type lateSyncFS struct {
	vfs.FS
	d time.Duration
}

func (s lateSyncFS) Create(n string) (vfs.File, error) { return s.wrap(s.FS.Create(n)) }
func (s lateSyncFS) Open(n string) (vfs.File, error)   { return s.wrap(s.FS.Open(n)) }
func (s lateSyncFS) OpenRW(n string) (vfs.File, error) { return s.wrap(s.FS.OpenRW(n)) }

func (s lateSyncFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	lf := &lateFile{File: f, d: s.d}
	if wa, ok := f.(vfs.WriterAt); ok {
		return lateFileW{lf, wa}, nil
	}
	return lf, nil
}

type lateFile struct {
	vfs.File
	d time.Duration
}

func (f *lateFile) Sync() error {
	time.Sleep(f.d)
	return f.File.Sync()
}

type lateFileW struct {
	*lateFile
	vfs.WriterAt
}

// TestChainAUSIPowerCut: the loss table's power-cut column per mode, on
// the host. Every member's disk (vfs.Mem) takes 100 ms to start an fsync.
// Ten writes, a pause in which every fsync completes, five more, and at
// once a power cut of every member (exactly what was fsynced survives),
// then the whole chain restarts from its disks. SU answered each of the
// five only once every log member had fsynced it: all fifteen kept. AUSI
// answered async writes with no disk waited for: the ten are kept, the five
// — the window — are not. AUSI's sync writes are answered as SU's, once
// every log member fsynced them (per-request durability): all kept.
func TestChainAUSIPowerCut(t *testing.T) {
	run := func(t *testing.T, mode chain.Mode, d level.Durability) (firstMissing, lastMissing int) {
		mems := [3]*vfs.Mem{vfs.NewMem(), vfs.NewMem(), vfs.NewMem()}
		g := newModeChain(t, mode, func(i int, o *Options) { o.FS = lateSyncFS{mems[i], 100 * time.Millisecond} })
		storeWritesAt(g, 0, 0, 10, d)
		time.Sleep(500 * time.Millisecond)
		storeWritesAt(g, 0, 10, 5, d)
		for i := range 3 {
			mems[i].CrashAfter(0) // the power goes: every disk operation fails from now on
		}
		for i := range 3 {
			g.reps[i].crash()
			g.reps[i] = nil
			g.nt.trs[i].Close()
			mems[i].Crash(nil) // the reboot: exactly what was fsynced survives
		}
		head := g.restartAll()
		first := storeMissing(g, head, 10)
		all := storeMissing(g, head, 15)
		return first, all - first
	}
	if f, l := run(t, chain.SU, level.Sync); f != 0 || l != 0 {
		t.Fatalf("SU: a power cut of every member lost %d of the first 10 and %d of the last 5 answered writes; want none", f, l)
	}
	if f, l := run(t, chain.AUSI, level.Sync); f != 0 || l != 0 {
		t.Fatalf("AUSI, sync writes: a power cut of every member lost %d of the first 10 and %d of the last 5 answered writes; want none", f, l)
	}
	f, l := run(t, chain.AUSI, level.Async)
	t.Logf("AUSI, async writes: a power cut of every member lost %d of the first 10 and %d of the last 5 answered writes", f, l)
	if f != 0 || l == 0 {
		t.Fatalf("AUSI, async writes: lost %d of the fsynced 10 and %d of the last 5; want none and a window", f, l)
	}
}
