package vrshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
)

// soloCore is a second protocol core for the host: one replica that is its
// own group. An entry commits once its batch is fsynced (Persisted); a
// read is answered in Ready.ReadStates at the commit point. It implements
// only the engine-neutral contract (core.Core), so the host drives it with
// noExt, noHints and its Info for what VR's adapter adds: no leases, no
// sync hints, no nilext. It shows that a core plugs into the host through the contract
// alone (docs/design/one-house.md, "The core contract").
type soloCore struct {
	self     uint64
	first    uint64         // the first op in log (the snapshot op + 1)
	log      []core.Entry   // entries first, first+1, ...
	batches  [][2]uint64    // {PersistSeq, last op} written and not yet durable
	seq      uint64         // the last PersistSeq issued
	commit   uint64         // durable, hence committed (a group of one)
	handed   uint64         // the last op handed out in Committed
	hs       core.HardState // the hard state last written
	lastHand []core.Committed
	clients  map[uint64]core.ClientRecord
	reads    []uint64 // Read ctxs waiting for the next Ready
	out      core.Ready[peerMsg]
}

var _ hostCore = (*soloCore)(nil)

// openSolo starts a soloCore from what the host's disk holds: the snapshot
// point (everything up to it is applied), the entries after it (all
// written, so all durable on the only member: all committed) and the hard
// state.
func openSolo(cfg group, st core.Boot) (hostCore, error) {
	if len(cfg.Members) != 1 || cfg.Members[0] != cfg.Self {
		return nil, fmt.Errorf("solo core: one member, itself, not %v", cfg.Members)
	}
	if st.LostState {
		return nil, errors.New("solo core: no group to recover from")
	}
	c := &soloCore{self: cfg.Self, first: 1, clients: map[uint64]core.ClientRecord{}, hs: st.HardState}
	if s := st.Snapshot; s != nil {
		c.first, c.handed = s.Op+1, s.Op
		for _, rec := range s.Clients {
			c.clients[rec.Client] = rec
		}
	}
	c.log = append(c.log, st.Entries...)
	c.commit = c.lastOp()
	if c.hs.View == 0 {
		c.hs = core.HardState{View: 1, LastNormalView: 1}
	}
	return c, nil
}

func (c *soloCore) lastOp() uint64 { return c.first - 1 + uint64(len(c.log)) }

func (c *soloCore) entry(op uint64) core.Entry { return c.log[op-c.first] }

func (c *soloCore) Step(int64, peerMsg) {}
func (c *soloCore) Heard(int64, uint64) {}
func (c *soloCore) Tick(int64)          {}
func (c *soloCore) Read(_ int64, req core.ReadRequest) error {
	if req.Kind != core.ReadLinearizable {
		return fmt.Errorf("solo core: no %v reads", req.Kind)
	}
	c.reads = append(c.reads, req.Ctx)
	return nil
}

func (c *soloCore) Propose(_ int64, req core.Request, ack core.AckPoint) error {
	if ack != core.AckApplied {
		return fmt.Errorf("solo core: no early acknowledgement (%v)", ack)
	}
	if req.Client != 0 {
		rec, ok := c.clients[req.Client]
		switch {
		case ok && req.ReqNum < rec.ReqNum:
			return core.ErrStaleRequest
		case ok && req.ReqNum == rec.ReqNum:
			c.out.Replies = append(c.out.Replies, core.Reply{Client: rec.Client, ReqNum: rec.ReqNum, Op: rec.Op, Result: rec.Result})
			return nil
		}
		for i := range c.log[c.handed+1-c.first:] {
			if e := &c.log[int(c.handed+1-c.first)+i]; e.Client == req.Client && e.ReqNum == req.ReqNum {
				return nil // in flight: its reply comes at apply
			}
		}
	}
	e := core.Entry{View: c.hs.View, Op: c.lastOp() + 1, Request: req}
	c.log = append(c.log, e)
	c.out.Entries = append(c.out.Entries, e)
	return nil
}

func (c *soloCore) Persisted(seq uint64) {
	for len(c.batches) > 0 && c.batches[0][0] <= seq {
		c.commit = max(c.commit, c.batches[0][1])
		c.batches = c.batches[1:]
	}
}

func (c *soloCore) Ready() core.Ready[peerMsg] {
	if len(c.lastHand) > 0 {
		panic("solo core: Ready before Advance")
	}
	if len(c.out.Entries) > 0 {
		hs := c.hs
		hs.Commit = c.commit
		c.out.HardState, c.hs = &hs, hs
		c.seq++
		c.out.PersistSeq = c.seq
		c.batches = append(c.batches, [2]uint64{c.seq, c.lastOp()})
	}
	for op := c.handed + 1; op <= c.commit; op++ {
		e := c.entry(op)
		cm := core.Committed{Entry: e}
		if e.Client != 0 {
			if rec, ok := c.clients[e.Client]; ok && rec.ReqNum >= e.ReqNum {
				cm.Duplicate = true
			} else {
				c.clients[e.Client] = core.ClientRecord{Client: e.Client, ReqNum: e.ReqNum, Op: op}
			}
		}
		c.out.Committed = append(c.out.Committed, cm)
	}
	c.handed = c.commit
	c.lastHand = c.out.Committed
	for _, ctx := range c.reads {
		c.out.ReadStates = append(c.out.ReadStates, core.ReadState{Ctx: ctx, Index: c.commit})
	}
	c.reads = nil
	// Nothing is acknowledged before commit: R is the commit point.
	c.out.Readable = c.commit
	rd := c.out
	c.out = core.Ready[peerMsg]{}
	return rd
}

func (c *soloCore) Advance(results [][]byte) {
	for i, cm := range c.lastHand {
		if cm.Client == 0 {
			continue
		}
		rec := c.clients[cm.Client]
		if !cm.Duplicate {
			rec.Result = results[i]
			c.clients[cm.Client] = rec
		}
		if rec.ReqNum == cm.ReqNum {
			c.out.Replies = append(c.out.Replies, core.Reply{Client: cm.Client, ReqNum: cm.ReqNum, Op: cm.Op, Result: rec.Result})
		}
	}
	c.lastHand = nil
}

func (c *soloCore) Info() core.Info {
	return core.Info{Self: c.self, Status: core.Normal, View: c.hs.View, Leader: c.self, IsLeader: true,
		FirstOp: c.first, LastOp: c.lastOp(), Commit: c.commit}
}

func (c *soloCore) ClientTable() []core.ClientRecord {
	out := make([]core.ClientRecord, 0, len(c.clients))
	for _, rec := range c.clients {
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b core.ClientRecord) int { return int(a.Client) - int(b.Client) })
	return out
}

func (c *soloCore) ClientTableMinOp() (op uint64, ok bool) {
	for _, rec := range c.clients {
		if !ok || rec.Op < op {
			op, ok = rec.Op, true
		}
	}
	return op, ok
}

func (c *soloCore) CompactPoint(op, keep uint64, _ int) uint64 {
	if op <= keep || op-keep < c.first {
		return 0
	}
	return op - keep
}

func (c *soloCore) Compact(op uint64) error {
	if op < c.first || op > c.handed {
		return fmt.Errorf("solo core: compact to %d outside [%d, %d]", op, c.first, c.handed)
	}
	c.log = slices.Clone(c.log[op+1-c.first:])
	c.first = op + 1
	return nil
}

func (c *soloCore) SendSnapshot(to uint64, _ core.Snapshot) error {
	return fmt.Errorf("solo core: no peer %d", to)
}

// noNetwork is the network of a group of one: nothing is ever sent.
type noNetwork struct{}

func (noNetwork) Send(to uint64, _ frame.Payload) error      { return fmt.Errorf("no peer %d", to) }
func (noNetwork) SendLarge(to uint64, _ frame.Payload) error { return fmt.Errorf("no peer %d", to) }

// TestASecondCorePlugsIntoTheHost drives the host (log, fsyncs, apply to the
// real kv state machine and engine, read waiters, checkpoints and log
// compaction, restart) with soloCore through the contract: writes commit
// and their results come back, a retry is answered from the core's client
// table, linearizable reads go out as read requests and come back in
// Ready.ReadStates, and a restart replays the log after the checkpoint.
func TestASecondCorePlugsIntoTheHost(t *testing.T) {
	dir := t.TempDir()
	var boot core.Boot // what the core was last opened with
	open := func(bootstrap bool) *Replica {
		t.Helper()
		r, err := Open(Options{
			Dir: dir, Bootstrap: bootstrap, Network: noNetwork{}, Logger: testLogger(t),
			VR:            vr.Config{Cluster: 7, Epoch: 1, Members: []uint64{1}, Self: 1},
			CheckpointOps: 4, KeepTail: 2,
			newCore: func(cfg group, st core.Boot) (hostCore, error) {
				boot = st
				return openSolo(cfg, st)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.core.(*soloCore); !ok {
			t.Fatalf("the host runs %T, not the solo core", r.core)
		}
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func(r *Replica, k string) string {
		t.Helper()
		res, err := r.Read(ctx, get(k), level.ConsLinearizable, shard.Session{})
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		return string(res.Bulk)
	}

	r := open(true)
	const n = 10
	for i := range n {
		id := shard.ReqID{Client: 5, Seq: uint64(i + 1)}
		if _, err := r.Write(ctx, set(fmt.Sprint("k", i), fmt.Sprint("v", i)), level.Sync, id); err != nil {
			t.Fatalf("SET k%d: %v", i, err)
		}
	}
	res, err := r.Write(ctx, kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 41}, level.Sync, shard.ReqID{Client: 6, Seq: 1})
	if err != nil || res.Int != 41 {
		t.Fatalf("INCR n by 41: %v, %v", res, err)
	}
	// A retry of an executed request: the core's client table answers it
	// with the first execution's result, and nothing runs twice.
	res, err = r.Write(ctx, kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 41}, level.Sync, shard.ReqID{Client: 6, Seq: 1})
	if err != nil || res.Int != 41 {
		t.Fatalf("retried INCR: %v, %v (want the first result, 41)", res, err)
	}
	for i := range n {
		if got, want := read(r, fmt.Sprint("k", i)), fmt.Sprint("v", i); got != want {
			t.Fatalf("GET k%d = %q, want %q", i, got, want)
		}
	}
	if got := read(r, "n"); got != "41" {
		t.Fatalf("GET n = %q after a retried INCR, want 41", got)
	}
	st := r.Stats()
	if st.IndexReads < n+1 || st.LeaseReads != 0 {
		t.Fatalf("reads: %d by a read request, %d by lease; want every one by a read request", st.IndexReads, st.LeaseReads)
	}
	// A checkpoint's engine fsync runs off the driver: wait for one to
	// finish (and the core's log to be compacted after it, which a restart
	// shows below).
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return r.Stats().Checkpoints != 0 }) {
		t.Fatalf("no checkpoint after %d ops with CheckpointOps 4", n+1)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart: the core starts from the checkpoint's snapshot point and the
	// log after it; the host replays what the engine lacks.
	r = open(false)
	defer r.Close()
	if boot.Snapshot == nil || boot.Snapshot.Op == 0 || len(boot.Entries) > 0 && boot.Entries[0].Op != boot.Snapshot.Op+1 {
		t.Fatalf("restarted from snapshot %+v and %d entries: want a checkpoint's snapshot point and the log after it", boot.Snapshot, len(boot.Entries))
	}
	for i := range n {
		if got, want := read(r, fmt.Sprint("k", i)), fmt.Sprint("v", i); got != want {
			t.Fatalf("after restart, GET k%d = %q, want %q", i, got, want)
		}
	}
	res, err = r.Write(ctx, kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 1}, level.Sync, shard.ReqID{Client: 6, Seq: 2})
	if err != nil || res.Int != 42 {
		t.Fatalf("INCR n after restart: %v, %v (want 42)", res, err)
	}
}
