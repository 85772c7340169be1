package vrshard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A live move of slots from group 1 to group 2 (two VR groups on the same
// three node transports), its steps driven as cluster.Mover drives them,
// under clients that write and read the moving keys throughout: every key's
// history, which spans both groups, is linearizable (internal/check), and
// every acknowledged write is readable at group 2 after the move. One client
// routes on a stale map (always group 1 first) and relies on the source's
// fence to send it on.
func TestSlotMoveUnderConcurrentClientsIsLinearizable(t *testing.T) {
	v := runSlotMove(t, false)
	if !v.OK {
		t.Fatalf("a move under concurrent clients is not linearizable:\n%s", v)
	}
}

// The mutation "hand-over without fencing the source": group 1 keeps
// applying writes and serving reads of the slots it handed over. The stale
// client's writes then land at group 1 after the hand-over, acknowledged and
// never seen at group 2: the linearizability check catches it.
func TestSlotMoveWithoutFencingTheSourceIsCaught(t *testing.T) {
	mutation.Require(t)
	for try := range 3 {
		v := runSlotMove(t, true)
		if !v.OK {
			t.Logf("caught (try %d): %s", try, v.Violations[0].Reason)
			return
		}
	}
	t.Fatal("a source that serves slots it handed over was not caught in 3 runs")
}

// groupWith is groupOn with the replicas' options tuned by tune (nil: none).
func groupWith(t testing.TB, nt *nodeTransports, group uint64, log *slog.Logger, tune func(*Options)) *cluster {
	c := &cluster{t: t, peers: nt.peers, tune: func(o *Options) {
		o.Transport, o.Group = nt.trs[o.VR.Self-1], group
		o.VR.Cluster = 100 + group
		o.Logger = log
		if tune != nil {
			tune(o)
		}
	}}
	for i := range nt.trs {
		c.ids = append(c.ids, uint64(i+1))
		c.dirs = append(c.dirs, t.TempDir())
	}
	c.reps = make([]*Replica, len(nt.trs))
	for i := range c.reps {
		c.openOn(i, true)
	}
	t.Cleanup(c.closeAll)
	return c
}

func slotOp(kind kv.Kind, rs []kv.SlotRange, st kv.SlotState, peer, epoch uint64) kv.Op {
	return kv.Op{Kind: kind, Key: kv.EncodeSlotRanges(rs), Cond: kv.Cond(st), Value: []byte(strconv.FormatUint(peer, 10)), Delta: int64(epoch)}
}

func runSlotMove(t *testing.T, unfenced bool) check.Verdict {
	g1, g2 := twoGroups(t, func(o *Options) { o.mut.slotsUnfenced = unfenced }, nil)
	groups := []*cluster{g1, g2}
	const timeout = 10 * time.Second
	must := func(g *cluster, op kv.Op) kv.Result { t.Helper(); return mustWrite(t, g, op) }
	all := []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}
	must(g1, slotOp(kv.KindSlotInit, all, 0, 0, 1))
	must(g2, slotOp(kv.KindSlotInit, nil, 0, 0, 1))

	// The moving keys (and their slots), a hash among them.
	var keys []string
	var rs []kv.SlotRange
	for i := range 4 {
		k := "mk" + strconv.Itoa(i)
		keys = append(keys, k)
		s := kv.KeySlot([]byte(k))
		rs = append(rs, kv.SlotRange{Start: s, End: s})
	}
	hashKey := keys[0] // its hash "{mk0}h" shares mk0's slot
	// The keys' first values are in the history too: a client's read that
	// returns one before any client's write of the key was applied (a
	// loaded box delays a client's first write by milliseconds) is then
	// explained, where a history without them starts every key absent and
	// calls such a read a violation (the flake the session-30 review
	// traced: "c3 get(mk0) -> \"init\"", before the move began).
	rec := check.NewRecorder(nil)
	for i, k := range keys {
		id := rec.Invoke(check.Op{Client: 200 + i, Kind: check.Put, Key: k, Value: "init"})
		must(g1, set(k, "init"))
		rec.Complete(id, check.Result{Found: true, Value: "init", Node: -1})
	}
	must(g1, kv.Op{Kind: kv.KindHSet, Key: []byte("{" + hashKey + "}h"), Keys: [][]byte{[]byte("f"), []byte("v")}})
	must(g1, kv.Op{Kind: kv.KindSet, Key: []byte("{" + keys[1] + "}ttl"), Value: []byte("t"), ExpireAt: time.Now().Add(time.Hour).UnixMilli()})

	leaderOf := func(g *cluster) *Replica { return leaderOf(g, timeout) }
	// route: the group whose leader's table serves the slot (none: in
	// flight, wait).
	route := func(k string) *cluster {
		s := kv.KeySlot([]byte(k))
		var owner *cluster
		if testgroup.Until(timeout, time.Millisecond, func() bool {
			for _, g := range groups {
				if r := leaderOf(g); r != nil && r.SlotTable().Entry(s).State.Serves() {
					owner = g
					return true
				}
			}
			return false
		}) {
			return owner
		}
		t.Errorf("no group serves slot %d", s)
		return g1
	}
	// Every key read once before the clients start, as a client's read
	// that overtakes the first write of the key does: "init", which the
	// history must explain.
	for i, k := range keys {
		id := rec.Invoke(check.Op{Client: 300 + i, Kind: check.Get, Key: k})
		res, err := leaderOf(g1).Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
		if err != nil {
			t.Fatalf("read %s at group 1 before the move: %v", k, err)
		}
		rec.Complete(id, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Node: -1})
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var refused atomic.Int64
	client := func(c int, stale bool) {
		defer wg.Done()
		seq := uint64(0)
		for n := 0; !stop.Load(); n++ {
			k := keys[(c+n)%len(keys)]
			write := n%2 == 0
			op := check.Op{Client: c, Kind: check.Get, Key: k}
			if write {
				op.Kind, op.Value = check.Put, fmt.Sprintf("c%d-%d", c, n)
			}
			id := rec.Invoke(op)
			g := g1
			if !stale {
				g = route(k)
			}
			for attempt := 0; ; attempt++ {
				r := leaderOf(g)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				var res kv.Result
				var err error
				if write {
					seq++
					res, err = r.Write(ctx, set(k, op.Value), level.Sync, shard.ReqID{Client: uint64(1000 + c), Seq: seq})
				} else {
					res, err = r.Read(ctx, get(k), level.ConsLinearizable, shard.Session{})
				}
				cancel()
				if errors.Is(err, kv.ErrSlotMoved) && attempt < 100 {
					// Refused by the fence: not applied; go where the slot is now.
					refused.Add(1)
					g = route(k)
					continue
				}
				switch {
				case err == nil && write:
					rec.Complete(id, check.Result{Found: true, Value: op.Value, Node: -1})
				case err == nil:
					rec.Complete(id, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Node: -1})
				case write:
					rec.Unknown(id)
				default:
					rec.Fail(id)
				}
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	for c := range 4 {
		wg.Add(1)
		go client(c, c == 0)
	}
	pause := func() { time.Sleep(60 * time.Millisecond) }
	pause()
	moveSlots(t, g1, g2, rs, pause)
	pause()
	pause()
	stop.Store(true)
	wg.Wait()
	// Every key read once more, at its new owner.
	for i, k := range keys {
		id := rec.Invoke(check.Op{Client: 100 + i, Kind: check.Get, Key: k})
		res, err := leaderOf(g2).Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
		if err != nil {
			t.Fatalf("read %s at group 2 after the move: %v", k, err)
		}
		rec.Complete(id, check.Result{Found: res.Kind == kv.ResBulk, Value: string(res.Bulk), Node: -1})
	}
	// The hash and the key with a TTL moved too; group 1 serves none of it.
	r2 := leaderOf(g2)
	if res, err := r2.Read(context.Background(), kv.Op{Kind: kv.KindHGet, Key: []byte("{" + hashKey + "}h"), Keys: [][]byte{[]byte("f")}}, level.ConsLinearizable, shard.Session{}); err != nil || len(res.Array) != 1 || string(res.Array[0]) != "v" {
		t.Fatalf("the hash at group 2: %+v %v", res, err)
	}
	if res, err := r2.Read(context.Background(), kv.Op{Kind: kv.KindTTL, Key: []byte("{" + keys[1] + "}ttl"), Now: time.Now().UnixMilli()}, level.ConsLinearizable, shard.Session{}); err != nil || res.Int <= 0 {
		t.Fatalf("the key with a TTL at group 2: %+v %v", res, err)
	}
	if !unfenced {
		if _, err := leaderOf(g1).Read(context.Background(), get(keys[0]), level.ConsLinearizable, shard.Session{}); !errors.Is(err, kv.ErrSlotMoved) {
			t.Fatalf("group 1 still serves a slot it handed over: %v", err)
		}
		if refused.Load() == 0 {
			t.Fatalf("no request was refused by the source's fence: the stale client never met the hand-over")
		}
	}
	h := rec.History()
	t.Logf("%d ops, %d refused by the fence and sent on", len(h.Ops), refused.Load())
	return check.Linearizable(h, check.LinOptions{NoVisualization: true})
}

func leaderOf(g *cluster, timeout time.Duration) *Replica { return g.reps[g.leader(timeout)] }

// twoGroups starts two VR groups (ids 1 and 2) on three shared node
// transports, tune1 and tune2 tuning each group's replicas.
func twoGroups(t *testing.T, tune1, tune2 func(*Options)) (g1, g2 *cluster) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(&logBuffer{}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nt := newNodeTransports(t, 3, log)
	return groupWith(t, nt, 1, log, tune1), groupWith(t, nt, 2, log, tune2)
}

// mustWrite is a write at g's leader that must succeed.
func mustWrite(t *testing.T, g *cluster, op kv.Op) kv.Result {
	t.Helper()
	res, err := g.write(op, shard.ReqID{}, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", op.Kind, err)
	}
	return res
}

// moveSlots moves rs from group src (peer id 1) to group dst (2) as
// cluster.Mover does, each step a write at the group's leader, pause
// called between the steps.
func moveSlots(t *testing.T, src, dst *cluster, rs []kv.SlotRange, pause func()) {
	t.Helper()
	const timeout = 10 * time.Second
	in := kcluster.InRanges(rs)
	must := func(g *cluster, op kv.Op) kv.Result { t.Helper(); return mustWrite(t, g, op) }
	load := func(g *cluster, entries [][]byte) {
		for len(entries) > 0 {
			n := min(len(entries), 3*64)
			must(g, kv.Op{Kind: kv.KindSlotImport, Keys: entries[:n]})
			entries = entries[n:]
		}
	}
	dump := func(g *cluster, since uint64) kcluster.Dump {
		d, err := kcluster.DumpSlots(leaderOf(g, timeout).db, in, nil, 1<<20, since)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	must(dst, slotOp(kv.KindSlotSet, rs, kv.SlotImporting, 1, 2))
	v0 := must(src, slotOp(kv.KindSlotSet, rs, kv.SlotMigrating, 2, 2)).Version
	pause()
	load(dst, dump(src, 0).Entries)
	pause()
	vLeave := must(src, slotOp(kv.KindSlotSet, rs, kv.SlotNone, 2, 2)).Version
	final := dump(src, v0)
	load(dst, final.Entries)
	have := map[string]bool{}
	for _, k := range final.Keys {
		have[string(k)] = true
	}
	var dels [][]byte
	for _, k := range dump(dst, 1<<62).Keys {
		if !have[string(k)] {
			dels = kv.AppendSlotImport(dels, k, nil, nil, nil, true)
		}
	}
	load(dst, dels)
	// The request marks: the source's client rows as of the hand-over.
	var marks [][]byte
	if err := leaderOf(src, timeout).db.Scan(kv.ClientRowPrefix, kv.ClientRowEnd, vLeave, 0, func(k []byte, v storage.Value) bool {
		id, _ := kv.ClientRowID(kv.ClientRowPrefix, k)
		marks = kv.AppendSlotClientMark(marks, id, slices.Clone(v.Data))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	load(dst, marks)
	must(dst, slotOp(kv.KindSlotSet, rs, kv.SlotOwned, 1, 2))
}

// Request ids survive a move: a retry (same client id and request number)
// of a write the source ran before the hand-over, arriving at the
// destination after it (its reply was lost), is answered with the source's
// outcome and not run again; a retry of an older request is refused
// (kv.ErrSlotStaleRequest); the client's next request runs. With the
// mutation slotsMovedTwice (the destination ignores the marks) the retried
// INCRBY runs twice.
func TestSlotMoveRetryOfAWriteTheSourceRanIsNotRunTwice(t *testing.T) {
	for _, broken := range []bool{false, true} {
		if broken && !mutation.On {
			continue
		}
		t.Run(map[bool]string{false: "marks", true: "slotsMovedTwice"}[broken], func(t *testing.T) {
			g1, g2 := twoGroups(t, nil, func(o *Options) { o.mut.slotsMovedTwice = broken })
			const timeout = 10 * time.Second
			all := []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}
			for _, c := range []struct {
				g  *cluster
				rs []kv.SlotRange
			}{{g1, all}, {g2, nil}} {
				if _, err := c.g.write(slotOp(kv.KindSlotInit, c.rs, 0, 0, 1), shard.ReqID{}, timeout); err != nil {
					t.Fatal(err)
				}
			}
			k := "counter"
			s := kv.KeySlot([]byte(k))
			rs := []kv.SlotRange{{Start: s, End: s}}
			incr := kv.Op{Kind: kv.KindIncrBy, Key: []byte(k), Delta: 1}
			const client = 4242
			if res, err := g1.write(incr, shard.ReqID{Client: client, Seq: 1}, timeout); err != nil || res.Int != 1 {
				t.Fatalf("INCRBY at the source: %+v %v", res, err)
			}
			// The client's second request, to another key at the source:
			// its latest there.
			other := set("elsewhere", "x")
			if kv.KeySlot(other.Key) == s {
				t.Fatal("pick another key")
			}
			if _, err := g1.write(other, shard.ReqID{Client: client, Seq: 2}, timeout); err != nil {
				t.Fatal(err)
			}
			if _, err := g1.write(incr, shard.ReqID{Client: client, Seq: 3}, timeout); err != nil {
				t.Fatal(err)
			}
			moveSlots(t, g1, g2, rs, func() {})
			if !broken {
				// An older request of the client, retried at the
				// destination: refused by the mark, not run.
				if _, err := g2.write(incr, shard.ReqID{Client: client, Seq: 1}, timeout); !errors.Is(err, kv.ErrSlotStaleRequest) {
					t.Fatalf("a retry of an older request at the destination: %v, want kv.ErrSlotStaleRequest", err)
				}
			}
			// Seq 3 retried at the destination (its reply was lost).
			res, err := g2.write(incr, shard.ReqID{Client: client, Seq: 3}, timeout)
			val := func() string {
				r, err := leaderOf(g2, timeout).Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
				if err != nil {
					t.Fatal(err)
				}
				return string(r.Bulk)
			}
			if broken {
				if val() != "3" {
					t.Fatalf("with slotsMovedTwice the retried INCRBY ran %s, want it run twice (3)", val())
				}
				return
			}
			if err != nil || res.Int != 2 || val() != "2" {
				t.Fatalf("retried INCRBY at the destination: %+v %v, value %s; want the source's outcome 2, run once", res, err, val())
			}
			if _, err := g2.write(incr, shard.ReqID{Client: client, Seq: 4}, timeout); err != nil || val() != "3" {
				t.Fatalf("the client's next request: %v, value %s", err, val())
			}
		})
	}
}

// A group's slot table is state like any key: a replica that restarts
// (crash) reloads it, one that lost its disk gets it from the group, and
// both fence the handed-over slot from the first read.
func TestSlotTableSurvivesRestartAndLostDisk(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) { o.CheckpointOps = 16 })
	const timeout = 10 * time.Second
	k := "fenced"
	s := kv.KeySlot([]byte(k))
	rs := []kv.SlotRange{{Start: s, End: s}}
	for _, op := range []kv.Op{
		slotOp(kv.KindSlotInit, []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}, 0, 0, 1),
		set(k, "v"),
		slotOp(kv.KindSlotSet, rs, kv.SlotMigrating, 2, 3),
		slotOp(kv.KindSlotSet, rs, kv.SlotNone, 2, 3),
	} {
		if _, err := c.write(op, shard.ReqID{}, timeout); err != nil {
			t.Fatalf("%s: %v", op.Kind, err)
		}
	}
	// Enough writes for checkpoints and a snapshot to carry the table.
	var last kv.Result
	for i := range 64 {
		var err error
		if last, err = c.write(set("other"+strconv.Itoa(i), "x"), shard.ReqID{}, timeout); err != nil {
			t.Fatal(err)
		}
	}
	c.waitApplied(last.Version, timeout)
	l := c.leader(timeout)
	crashed, wiped := (l+1)%3, (l+2)%3
	c.kill(crashed)
	c.open(crashed, false, nil)
	c.wipe(wiped)
	c.open(wiped, false, nil)
	c.waitRecovered(wiped, timeout)
	c.waitApplied(last.Version, timeout)
	for _, i := range []int{crashed, wiped} {
		e := c.reps[i].SlotTable().Entry(s)
		if e.State != kv.SlotNone || e.Peer != 2 || e.Epoch != 3 {
			t.Fatalf("replica %d's table after restart: %+v", c.ids[i], e)
		}
		if _, err := c.reps[i].Read(context.Background(), get(k), level.ConsEventual, shard.Session{}); !errors.Is(err, kv.ErrSlotMoved) {
			t.Fatalf("replica %d serves the handed-over slot after restart: %v", c.ids[i], err)
		}
	}
	// The fence at apply, too: a write of the slot is refused, not applied.
	if _, err := c.write(set(k, "w"), shard.ReqID{Client: 7, Seq: 1}, timeout); !errors.Is(err, kv.ErrSlotMoved) {
		t.Fatalf("a write of the handed-over slot: %v", err)
	}
}
