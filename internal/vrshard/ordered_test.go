package vrshard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/transport"
)

// The ordered point (docs/design/cad.md §10): Apply returns a cad blind
// write once it is in the leader's log, and Wait awaits its
// acknowledgement. These tests cut the leader off from both followers, so
// no acknowledgement can arrive: whatever returns meanwhile was not held by
// the replication round.

// isolate cuts (or heals) every link of replica i.
func (c *cluster) isolate(i int, on bool) {
	c.t.Helper()
	for _, id := range c.ids {
		if id != c.ids[i] {
			if err := c.reps[i].Transport().SetLinkFault(id, transport.Fault{Partition: on}); err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

// orderedCluster is a 3-replica cluster whose leader keeps its lease, and
// whose followers keep their view, for seconds without hearing each other:
// long enough to look at a write that cannot be acknowledged.
func orderedCluster(t *testing.T, tune func(*Options)) *cluster {
	return newCluster(t, 3, func(o *Options) {
		o.VR.ViewChangeTimeout = 4 * time.Second
		o.VR.LeaseDuration = 3 * time.Second
		o.RequestTimeout = 10 * time.Second
		if tune != nil {
			tune(o)
		}
	})
}

// applyOne applies one write and returns its reply and its Pending.
// isolatedLeader writes each key/value pair of kvs at sync to c's leader,
// waits until the last is readable there, then isolates the leader. It
// returns the leader and the op of the first write.
func isolatedLeader(t *testing.T, c *cluster, kvs ...string) (int, *Replica, uint64) {
	t.Helper()
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	var first, last uint64
	for i := 0; i+1 < len(kvs); i += 2 {
		res, err := leader.Write(context.Background(), set(kvs[i], kvs[i+1]), level.Sync, shard.ReqID{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = res.Version
		}
		last = res.Version
	}
	waitReadable(t, leader, last)
	c.isolate(l, true)
	return l, leader, first
}

func applyOne(t *testing.T, r *Replica, op kv.Op, d level.Durability, id shard.ReqID) (shard.WriteReq, shard.Pending) {
	t.Helper()
	reqs := []shard.WriteReq{{Op: op, Durability: d, ID: id}}
	p, err := r.Apply(context.Background(), reqs)
	if err != nil {
		t.Fatalf("apply %v: %v", op.Kind, err)
	}
	return reqs[0], p
}

// acked reports whether p's writes were all acknowledged (or failed)
// already, without waiting.
func acked(p shard.Pending) bool {
	for _, a := range p.Acks {
		select {
		case <-a.(*batchWait).done:
		default:
			return false
		}
	}
	return true
}

// A cad write's Apply returns at its ordered point, with OK at its op and
// its acknowledgement still pending — the replication round can no longer
// hold the commands after it on a connection. A read of another, durable key
// is served meanwhile; a read of the written key (the connection reading its
// own write) neither returns the old value nor the unacknowledged new one
// until the write is durable, then the new one; Wait returns once the write
// is acknowledged. A sync write and a state-dependent cad write still wait
// inside Apply, and the applyWaitsForAck mutation (the behaviour before §10)
// holds a cad write there too: the test can see the difference.
func TestCADApplyReturnsAtItsOrderedPoint(t *testing.T) {
	mutation.Require(t)
	for _, before := range []bool{false, true} {
		name := "ordered"
		if before {
			name = "applyWaitsForAck"
		}
		t.Run(name, func(t *testing.T) {
			c := orderedCluster(t, func(o *Options) { o.mut.applyWaitsForAck = before })
			l, leader, base := isolatedLeader(t, c, "k", "v0", "other", "o")
			ctx := context.Background()
			healed := false
			defer func() {
				if !healed {
					c.isolate(l, false)
				}
			}()

			type applied struct {
				w   shard.WriteReq
				p   shard.Pending
				err error
			}
			got := make(chan applied, 1)
			go func() {
				reqs := []shard.WriteReq{{Op: set("k", "v1"), Durability: level.CAD, ID: shard.ReqID{Client: 5, Seq: 1}}}
				p, err := leader.Apply(ctx, reqs)
				got <- applied{reqs[0], p, err}
			}()
			var a applied
			select {
			case a = <-got:
				if before {
					t.Fatalf("with applyWaitsForAck, Apply of a cad write returned with no follower reachable: %+v", a.w)
				}
			case <-time.After(500 * time.Millisecond):
				if !before {
					t.Fatal("Apply of a cad write is held by its replication round (no follower reachable)")
				}
				c.isolate(l, false)
				healed = true
				a = <-got
				if a.err != nil || a.w.Err != nil || !acked(a.p) {
					t.Fatalf("applyWaitsForAck: %+v, pending %+v; want the acknowledged reply and nothing to wait for", a.w, a.p)
				}
				return
			}
			if a.err != nil || a.w.Err != nil || a.w.Result.Kind != kv.ResOK || a.w.Result.Version <= base {
				t.Fatalf("ordered cad write: %+v; want OK at its op", a.w)
			}
			if len(a.p.Acks) != 1 || acked(a.p) {
				t.Fatalf("ordered cad write: pending %+v acknowledged %v; want one pending acknowledgement", a.p, acked(a.p))
			}
			// The next command on the connection is not held.
			if r, err := leader.Read(ctx, get("other"), level.ConsLinearizable, shard.Session{}); err != nil || string(r.Bulk) != "o" {
				t.Fatalf("read of a durable key behind an unacknowledged cad write: %+v, %v", r, err)
			}
			// Reading its own write: neither v0 (the connection wrote v1)
			// nor v1 before it is durable.
			rd := heldRead(t, leader, "k", 200*time.Millisecond, "read of an ordered, unacknowledged cad write returned before it was durable")
			if acked(a.p) {
				t.Fatal("acknowledged with no follower reachable")
			}
			c.isolate(l, false)
			healed = true
			if err := leader.Wait(ctx, a.p); err != nil {
				t.Fatalf("Wait after the partition healed: %v", err)
			}
			o := <-rd
			if o.err != nil || string(o.res.Bulk) != "v1" || o.res.Version != a.w.Result.Version {
				t.Fatalf("read of its own write: %+v, %v; want v1 at %d", o.res, o.err, a.w.Result.Version)
			}
			if R := leader.Info().Readable; R < a.w.Result.Version {
				t.Fatalf("read returned op %d above R %d", a.w.Result.Version, R)
			}

			// State-dependent writes are still answered inside Apply:
			// nothing is left for Wait.
			for _, w := range []struct {
				op kv.Op
				d  level.Durability
			}{{kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 1}, level.Sync}, {kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 1}, level.CAD}} {
				r, p := applyOne(t, leader, w.op, w.d, shard.ReqID{})
				if r.Err != nil || len(p.Acks) != 0 {
					t.Fatalf("%v at %v: %+v, pending %+v; want it answered inside Apply", w.op.Kind, w.d, r, p)
				}
			}
			// A blind sync write is answered at its ordered point too
			// (§12): OK at its op, Wait awaiting its apply.
			if r, p := applyOne(t, leader, set("s", "1"), level.Sync, shard.ReqID{}); r.Err != nil || r.Result.Kind != kv.ResOK || len(p.Acks) != 1 {
				t.Fatalf("blind sync write: %+v, pending %+v; want OK at its op and one pending wait", r, p)
			} else if err := leader.Wait(ctx, p); err != nil {
				t.Fatalf("Wait for a blind sync write: %v", err)
			}
			// An async blind write shares cad's write path (cad.md §19):
			// OK at its op, Wait awaiting a majority's memory; a read is
			// served its value at once, from the overlay.
			if r, p := applyOne(t, leader, set("a", "1"), level.Async, shard.ReqID{}); r.Err != nil || r.Result.Kind != kv.ResOK || len(p.Acks) != 1 {
				t.Fatalf("async write: %+v, pending %+v; want OK at its op and one pending acknowledgement", r, p)
			} else {
				if got, err := leader.Read(ctx, get("a"), level.ConsLinearizable, shard.Session{}); err != nil || string(got.Bulk) != "1" {
					t.Fatalf("read of an ordered async write: %+v, %v; want its value at once", got, err)
				}
				if err := leader.Wait(ctx, p); err != nil {
					t.Fatalf("Wait for an async write: %v", err)
				}
			}
		})
	}
}

// lostOrderedWrite applies a cad write at a leader cut off from both
// followers, lets them elect a new leader, heals, and returns what Wait
// said about the write and the value the new leader holds for its key.
func lostOrderedWrite(t *testing.T, skip bool) (newValue string, w shard.WriteReq, waitErr error) {
	if skip {
		mutation.Require(t)
	}
	c := newCluster(t, 3, func(o *Options) {
		o.VR.ViewChangeTimeout = 300 * time.Millisecond
		o.VR.LeaseDuration = 250 * time.Millisecond
		o.RequestTimeout = 10 * time.Second
		o.mut.ackWaitSkipped = skip
	})
	l := c.leader(5 * time.Second)
	old := c.reps[l]
	ctx := context.Background()
	if _, err := old.Write(ctx, set("k", "v0"), level.Sync, shard.ReqID{}); err != nil {
		t.Fatal(err)
	}
	c.isolate(l, true)
	w, p := applyOne(t, old, set("k", "lost"), level.CAD, shard.ReqID{Client: 5, Seq: 1})
	if w.Err != nil || len(p.Acks) != 1 {
		t.Fatalf("ordered cad write at an isolated leader: %+v, pending %+v", w, p)
	}
	done := make(chan error, 1)
	go func() { done <- old.Wait(ctx, p) }()
	// The others elect a new leader; the old one hears of it once healed.
	nl := newLeaderBesides(t, c, l)
	if _, err := c.reps[nl].Write(ctx, set("x", "1"), level.Sync, shard.ReqID{}); err != nil {
		t.Fatalf("write at the new leader: %v", err)
	}
	c.isolate(l, false)
	select {
	case waitErr = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait of a write whose leader was deposed never returned")
	}
	r, err := c.reps[nl].Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	return string(r.Bulk), w, waitErr
}

// A leader change between Apply and Wait: the write was ordered at the old
// leader only and is lost; Wait must fail (outcome unknown), so the front
// door drops the batch's replies and no one is told OK.
func TestOrderedWriteLostInALeaderChangeFailsItsWait(t *testing.T) {
	v, w, err := lostOrderedWrite(t, false)
	if v != "v0" {
		t.Fatalf("the new leader holds %q for the key: the write was not lost, the test shows nothing", v)
	}
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Wait of the lost write %+v: %v; want ErrOutcomeUnknown", w, err)
	}
}

// The mutation: Wait that does not wait acknowledges the lost write.
func TestBrokenAckWaitAcknowledgesALostWrite(t *testing.T) {
	v, _, err := lostOrderedWrite(t, true)
	if err != nil || v != "v0" {
		t.Fatalf("with ackWaitSkipped: Wait %v, new leader holds %q; want nil and v0 (a lost write acknowledged)", err, v)
	}
}

// The replica closes between Apply and Wait: Wait fails.
func TestOrderedWriteFailsItsWaitWhenTheReplicaCloses(t *testing.T) {
	c := orderedCluster(t, nil)
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	c.isolate(l, true)
	w, p := applyOne(t, leader, set("k", "v"), level.CAD, shard.ReqID{})
	if w.Err != nil || len(p.Acks) != 1 {
		t.Fatalf("ordered cad write: %+v, pending %+v", w, p)
	}
	leader.Close()
	c.reps[l] = nil
	if err := leader.Wait(context.Background(), p); err == nil {
		t.Fatal("Wait of an unacknowledged write succeeded after its replica closed")
	}
}

// Pendings from several Apply calls (a connection's batch with reads in
// between) merge, and Wait awaits all of them.
func TestWaitAwaitsEveryMergedBatch(t *testing.T) {
	c := orderedCluster(t, nil)
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	c.isolate(l, true)
	var p shard.Pending
	var last uint64
	for i := range 3 {
		w, q := applyOne(t, leader, set("k", string(rune('a'+i))), level.CAD, shard.ReqID{})
		if w.Err != nil || w.Result.Version <= last {
			t.Fatalf("write %d: %+v after op %d", i, w, last)
		}
		last = w.Result.Version
		p = p.Merge(q)
	}
	if len(p.Acks) != 3 || acked(p) {
		t.Fatalf("merged pending %+v (acknowledged %v); want 3 unacknowledged batches", p, acked(p))
	}
	c.isolate(l, false)
	if err := leader.Wait(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if !acked(p) {
		t.Fatal("Wait returned before every merged batch was acknowledged")
	}
}

// The mutation noEarlyIndex (a cad write enters the update index only when
// applied) breaks the argument of TestCADApplyReturnsAtItsOrderedPoint: the
// connection's read right after Apply returned serves the old value.
func TestBrokenEarlyIndexMissesTheConnectionsOwnWrite(t *testing.T) {
	mutation.Require(t)
	c := orderedCluster(t, func(o *Options) { o.mut.noEarlyIndex = true })
	l, leader, _ := isolatedLeader(t, c, "k", "v0")
	ctx := context.Background()
	defer c.isolate(l, false)
	w, p := applyOne(t, leader, set("k", "v1"), level.CAD, shard.ReqID{})
	if w.Err != nil || len(p.Acks) != 1 {
		t.Fatalf("ordered cad write: %+v, pending %+v", w, p)
	}
	r, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
	if err != nil || string(r.Bulk) != "v0" {
		t.Fatalf("with noEarlyIndex: read after the connection's own write: %+v, %v; want the stale v0", r, err)
	}
	t.Logf("mutation caught: the read after the connection's own cad write returned %q", r.Bulk)
}

// A leader read checks its keys' latest updates against R before it reads
// the engine, not only after: here the connection's own cad write is
// ordered (no replica can fsync, so it cannot commit), the read starts, and
// — only with the noPreReadCheck mutation, where the engine is read first —
// the write commits, is applied and becomes readable between the engine
// read and the check after it (the afterLeaderRead hook opens the fsyncs
// and waits for that), so the check finds nothing unreadable and serves the
// value before the write. Without the mutation the read waits for the
// write and returns it. The third case is main before §10 (Apply waited
// for the acknowledgement, the read checked only after the engine read):
// the client was told OK and then read the value before its own write — a
// linearizability bug that predates the ordered point, made more likely by
// it (reads now run right after the write is ordered).
func TestLeaderReadChecksItsKeysBeforeReadingTheEngine(t *testing.T) {
	mutation.Require(t)
	for _, tc := range []struct {
		name         string
		broken, main bool
	}{{"checked", false, false}, {"noPreReadCheck", true, false}, {"noPreReadCheck+applyWaitsForAck", true, true}} {
		broken := tc.broken
		t.Run(tc.name, func(t *testing.T) {
			var (
				armed  atomic.Bool
				target atomic.Uint64
				hooked atomic.Int32
			)
			var gates gateSet
			var c *cluster
			openGates := func() {
				gates.release()
			}
			c, gates, _ = gatedCluster(t, func(o *Options) {
				o.mut.noPreReadCheck = broken
				o.mut.applyWaitsForAck = tc.main
				o.RequestTimeout = 5 * time.Second
				o.mut.afterLeaderRead = func() {
					if !armed.Load() || hooked.Add(1) != 1 {
						return
					}
					openGates()
					for _, r := range c.reps {
						if r != nil && r.Info().IsLeader {
							waitReadable(t, r, target.Load())
						}
					}
				}
			})
			defer openGates()
			l := c.leader(5 * time.Second)
			leader := c.reps[l]
			ctx := context.Background()
			if _, err := leader.Write(ctx, set("k", "v0"), level.Sync, shard.ReqID{}); err != nil {
				t.Fatal(err)
			}
			gates.hold()
			w, p := applyOne(t, leader, set("k", "v1"), level.CAD, shard.ReqID{})
			if w.Err != nil {
				t.Fatal(w.Err)
			}
			target.Store(w.Result.Version)
			armed.Store(true)
			if !broken {
				// The read waits for the write's durability; the hook runs
				// only once it re-reads. Let the fsyncs go meanwhile.
				go func() {
					time.Sleep(100 * time.Millisecond)
					openGates()
				}()
			}
			r, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
			if err != nil {
				t.Fatal(err)
			}
			if err := leader.Wait(ctx, p); err != nil {
				t.Fatal(err)
			}
			if hooked.Load() == 0 {
				t.Fatal("the hook never ran: the window was not tested")
			}
			switch {
			case !broken && string(r.Bulk) != "v1":
				t.Fatalf("read after the connection's own write returned %q, want v1", r.Bulk)
			case broken && string(r.Bulk) != "v0":
				t.Fatalf("with noPreReadCheck the read returned %q; want the stale v0 (the test shows nothing)", r.Bulk)
			case broken:
				t.Logf("mutation caught: the read after the connection's own write returned %q", r.Bulk)
			}
		})
	}
}
