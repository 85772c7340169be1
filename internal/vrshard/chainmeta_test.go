package vrshard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// metaChain is a chain of three (nodes 1-3) whose master is hosted by a
// metadata group — a VR group of three on nodes 4-6, each node running a
// hosted master (chainmaster.Config.Meta) of which only the leader's acts.
type metaChain struct {
	*chainGroup
	meta    *cluster
	masters []*chainmaster.Master
}

// chainVirtualMaster is the id the members know the master by: outside the
// chain, on no transport (ChainOptions.Masters).
const chainVirtualMaster = 100

func newMetaChain(t *testing.T) *metaChain {
	log := testLogger(t)
	nt := newNodeTransports(t, 6, log)
	x := &metaChain{meta: &cluster{t: t, peers: nt.peers, ids: []uint64{4, 5, 6}, reps: make([]*Replica, 3), tune: func(o *Options) {
		o.Transport, o.Group, o.Logger = nt.trs[o.VR.Self-1], metaGroupID, log
		o.VR.ViewChangeTimeout, o.VR.LeaseDuration = 500*time.Millisecond, 300*time.Millisecond
	}}}
	for i := range 3 {
		x.meta.dirs = append(x.meta.dirs, t.TempDir())
		x.meta.openOn(i, true)
	}
	for i := range 3 {
		m, err := chainmaster.Start(chainmaster.Config{Self: uint64(4 + i), Members: []uint64{1, 2, 3}, Transport: nt.trs[3+i],
			Heartbeat: 20 * time.Millisecond, FailAfter: 700 * time.Millisecond, Lease: 300 * time.Millisecond, As: chainVirtualMaster,
			Meta: x.meta.reps[i].ChainMeta(), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		x.masters = append(x.masters, m)
	}
	g := &chainGroup{t: t, nt: nt, reps: make([]*Replica, 3), tune: func(_ int, o *Options) {
		o.Chain = &ChainOptions{Master: chainVirtualMaster, Masters: []uint64{4, 5, 6}, Heartbeat: 20 * time.Millisecond, Lease: 300 * time.Millisecond}
	}}
	x.chainGroup = g
	t.Cleanup(func() {
		for _, r := range g.reps {
			if r != nil {
				r.Close()
			}
		}
		for _, m := range x.masters {
			if m != nil {
				m.Close()
			}
		}
		x.meta.closeAll()
	})
	for i := range 3 {
		g.dirs = append(g.dirs, t.TempDir())
		g.open(i, true)
	}
	return x
}

// record is chain 0's configuration as metadata replica i applied it.
func (x *metaChain) record(i int) *kv.ChainConfig {
	x.t.Helper()
	c, err := readChainRecord(x.meta.reps[i].Engine(), 0)
	if err != nil {
		x.t.Fatal(err)
	}
	return c
}

// waitRecord waits until a live metadata replica applied a configuration
// of the chain with these members and no joiner, and returns it.
func (x *metaChain) waitRecord(want ...uint64) *kv.ChainConfig {
	x.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got *kv.ChainConfig
		for i, r := range x.meta.reps {
			if r == nil {
				continue
			}
			if c := x.record(i); c != nil && (got == nil || c.Epoch > got.Epoch) {
				got = c
			}
		}
		if got != nil && slices.Equal(got.Members, want) && got.Joiner == 0 {
			return got
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("chain record %+v, want members %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killMetaLeader stops the metadata group's leader node as a kill would:
// its replica, its master and its transport; it returns the node's index.
func (x *metaChain) killMetaLeader() int {
	x.t.Helper()
	l := x.meta.leader(10 * time.Second)
	x.masters[l].Close()
	x.masters[l] = nil
	x.meta.kill(l)
	x.nt.trs[3+l].Close()
	return l
}

// TestChainMasterOnTheMetadataGroup (issue 30): the chain's master runs at
// the metadata group's leader, its configuration recorded there. The
// metadata leader is killed while a client writes at the head: the next
// leader's master takes over from the record after waiting out the old
// master's leases, and the chain pauses for less than 2 s; a member failure
// after the failover is still repaired (recorded, then announced) and the
// member rejoins; every acknowledged write is there at the end.
func TestChainMasterOnTheMetadataGroup(t *testing.T) {
	x := newMetaChain(t)
	x.write(0, set("k0", "v0"), shard.ReqID{Client: 5, Seq: 1})
	if c := x.waitRecord(1, 2, 3); c.Epoch != 0 {
		t.Fatalf("the first chain recorded at epoch %d", c.Epoch)
	}

	var (
		mu      sync.Mutex
		acked   []string
		maxGap  time.Duration
		stopped = make(chan struct{})
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		last := time.Now()
		for i := 0; ; i++ {
			select {
			case <-stopped:
				return
			default:
			}
			k := fmt.Sprint("w", i)
			if _, err := x.tryWrite(0, set(k, "1"), shard.ReqID{Client: 6, Seq: uint64(i + 1)}); err != nil {
				t.Errorf("the writer stopped: %v", err) // not Fatal: not the test's goroutine
				return
			}
			now := time.Now()
			mu.Lock()
			acked = append(acked, k)
			maxGap = max(maxGap, now.Sub(last))
			mu.Unlock()
			last = now
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	killed := x.killMetaLeader()
	mu.Lock()
	atKill := len(acked)
	mu.Unlock()
	t.Logf("killed metadata node %d", 4+killed)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		// Writes go on after the failover: the next leader's master took
		// over (the members' leases lapsed meanwhile).
		if x.meta.leader(10*time.Second) != killed && n > atKill+1 {
			time.Sleep(2500 * time.Millisecond)
			break
		}
		if time.Now().After(deadline) {
			close(stopped)
			<-done
			t.Fatalf("no writes within 10 s of the kill (%d acknowledged before it)", atKill)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stopped)
	<-done
	mu.Lock()
	gap, n := maxGap, len(acked)
	mu.Unlock()
	t.Logf("%d writes during the metadata failover; longest pause %v", n, gap)
	if gap >= 2*time.Second {
		t.Fatalf("the chain paused %v across the metadata leader's failover, want < 2 s", gap)
	}

	// A member failure after the failover: the new master records the
	// repair and announces it; the member rejoins.
	x.crash(1)
	c := x.waitRecord(1, 3)
	x.write(0, set("after-mid", "1"), shard.ReqID{Client: 5, Seq: 2})
	x.restart(1)
	if c2 := x.waitRecord(1, 2, 3); c2.Epoch <= c.Epoch {
		t.Fatalf("rejoin recorded at epoch %d, not above the repair's %d", c2.Epoch, c.Epoch)
	}
	x.write(0, set("after-rejoin", "1"), shard.ReqID{Client: 5, Seq: 3})
	x.caughtUp(1, 0)
	for _, k := range append(acked, "k0", "after-mid", "after-rejoin") {
		if got := x.read(0, k); got == "" {
			t.Fatalf("GET %s: an acknowledged write is missing", k)
		}
	}
}

// newHostedChainNodes opens three chain nodes that host their master
// (OpenChainNode: each node a chain member, a replica of the metadata group
// on the same transport and a hosted master speaking through the member's
// endpoint). fs, if set, gives node i's chain member its file system.
func newHostedChainNodes(t *testing.T, fs func(i int) vfs.FS) *chainGroup {
	log := testLogger(t)
	g := &chainGroup{t: t, nt: newNodeTransports(t, 3, log), reps: make([]*Replica, 3)}
	metaDirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	g.tune = func(i int, o *Options) {
		o.Chain = &ChainOptions{Heartbeat: 20 * time.Millisecond, Lease: 300 * time.Millisecond}
		if fs != nil {
			o.FS = fs(i)
		}
	}
	g.opener = func(o Options) (*Replica, error) {
		mo := Options{Dir: metaDirs[o.VR.Self-1], Bootstrap: o.Bootstrap, Logger: log,
			VR: vr.Config{ViewChangeTimeout: 500 * time.Millisecond, LeaseDuration: 300 * time.Millisecond}}
		return OpenChainNode(o, ChainNode{Meta: []uint64{1, 2, 3}, MetaOptions: mo,
			Master: chainmaster.Config{Heartbeat: 20 * time.Millisecond, FailAfter: 700 * time.Millisecond, Logger: log}})
	}
	t.Cleanup(func() {
		for _, r := range g.reps {
			if r != nil {
				r.Close()
			}
		}
	})
	for i := range 3 {
		g.dirs = append(g.dirs, t.TempDir())
		g.open(i, true)
	}
	return g
}

// metaLeader is the index of the node whose metadata replica leads (skip:
// a node not to count, -1: none).
func metaLeader(g *chainGroup, skip int) int {
	g.t.Helper()
	l, ok := testgroup.Leader(len(g.reps), 10*time.Second, testgroup.Interval, func(i int) (bool, uint64) {
		if i == skip || g.reps[i] == nil || g.reps[i].hostedMeta == nil {
			return false, 0
		}
		in := g.reps[i].hostedMeta.Info()
		return in.IsLeader, in.View
	})
	if !ok {
		g.t.Fatal("no metadata leader within 10 s")
	}
	return l
}

// chainRecord is the chain's configuration as node i's metadata replica
// applied it (nil: none yet).
func chainRecord(g *chainGroup, i int) *kv.ChainConfig {
	g.t.Helper()
	c, err := readChainRecord(g.reps[i].hostedMeta.Engine(), 0)
	if err != nil {
		g.t.Fatal(err)
	}
	return c
}

// waitChainRecord waits until node i's metadata replica applied a
// configuration with these members and no joiner at epoch from or above.
func waitChainRecord(g *chainGroup, i int, from uint64, want ...uint64) *kv.ChainConfig {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := chainRecord(g, i)
		if c != nil && c.Epoch >= from && slices.Equal(c.Members, want) && c.Joiner == 0 {
			return c
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("node %d's chain record %+v, want members %v at epoch %d or above", i+1, c, want, from)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// without is ids 1-3 without node index i's id.
func without(i int) []uint64 {
	return slices.DeleteFunc([]uint64{1, 2, 3}, func(id uint64) bool { return id == uint64(i+1) })
}

// TestChainNodesHostTheirMaster (issue 30, as kefir up runs it): the three
// chain nodes are the metadata group too. The node that leads the metadata
// group — found, not assumed: a view change at the start may have moved it
// — is killed: another node's master takes over, fails the dead node after
// waiting out the leases and repairs the chain, committing the repair (the
// record's epoch rises while the old leader is down, so another master
// wrote it); writes go on at the new head; the node restarts (its metadata
// replica recovers, its member rejoins) and every acknowledged write is
// there.
func TestChainNodesHostTheirMaster(t *testing.T) {
	g := newHostedChainNodes(t, nil)
	g.write(0, set("k0", "v0"), shard.ReqID{Client: 5, Seq: 1})
	var acked []string
	for i := range 20 {
		k := fmt.Sprint("a", i)
		g.write(0, set(k, "1"), shard.ReqID{Client: 6, Seq: uint64(i + 1)})
		acked = append(acked, k)
	}
	l := metaLeader(g, -1)
	other := (l + 1) % 3
	before := waitChainRecord(g, other, 0, 1, 2, 3)
	start := time.Now()
	g.crash(l)
	live := without(l)
	// Recorded above the first chain's epoch while node l is down:
	// another node's master took over and committed the repair.
	rec := waitChainRecord(g, other, before.Epoch+1, live...)
	head := int(live[0] - 1)
	g.write(head, set("after", "1"), shard.ReqID{Client: 5, Seq: 2})
	t.Logf("metadata leader node %d killed: the chain %v recorded at epoch %d, wrote again at node %d after %v",
		l+1, rec.Members, rec.Epoch, head+1, time.Since(start))
	g.restart(l)
	g.write(head, set("after-rejoin", "1"), shard.ReqID{Client: 5, Seq: 3})
	deadline := time.Now().Add(10 * time.Second)
	for g.reps[l].Info().Applied < g.reps[head].Info().Commit {
		if time.Now().After(deadline) {
			t.Fatal("the restarted node did not rejoin and catch up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, k := range append(acked, "k0", "after", "after-rejoin") {
		if got := g.read(head, k); got == "" {
			t.Fatalf("GET %s: an acknowledged write is missing", k)
		}
	}
}

// TestChainNodeWhoseMemberFailed: the chain member of the node leading the
// metadata group fails (an fsync error stops its driver; the node's process
// goes on). Nothing handed to it may wait for the dead driver: neither the
// master's order to its own member (it holds the master's lock: the master
// would hang, and Close with it) nor the transport's delivery (the
// connection's reader, shared with the metadata group and the members'
// heartbeats to this master). The node's master, which hears the members
// on the transport's reader, fails its silent member like any other and
// repairs the chain; writes go on at the new head; the node closes.
func TestChainNodeWhoseMemberFailed(t *testing.T) {
	mems := []*vfs.Mem{vfs.NewMem(), vfs.NewMem(), vfs.NewMem()}
	g := newHostedChainNodes(t, func(i int) vfs.FS { return mems[i] })
	g.write(0, set("k0", "v0"), shard.ReqID{Client: 5, Seq: 1})
	l := metaLeader(g, -1)
	other := (l + 1) % 3
	before := waitChainRecord(g, other, 0, 1, 2, 3)
	// The failure must hit the log's fsync, not the zero-filler's.
	for !g.reps[l].wal.fill.Idle() {
		time.Sleep(time.Millisecond)
	}
	mems[l].FailSyncs(1)
	for i := 0; g.reps[l].Info().Failed == nil; i++ {
		if i == 500 {
			t.Fatalf("node %d's member kept running after a failed fsync", l+1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		g.reps[0].Write(ctx, set(fmt.Sprint("f", i), "1"), level.Sync, shard.ReqID{})
		cancel()
		time.Sleep(5 * time.Millisecond)
	}
	live := without(l)
	t.Logf("node %d (the metadata leader)'s chain member failed", l+1)
	// Its driver is gone: nothing drains the inbox. Neither the master's
	// hand-over to its own member nor the transport's delivery of the
	// members' messages (which also carries their heartbeats to this
	// node's master, chainHost.Decode) may wait for it.
	r := g.reps[l]
fill:
	for {
		select {
		case r.inbox <- inbound{from: r.cfg.Self}:
		default:
			break fill
		}
	}
	handed := make(chan struct{})
	go func() {
		r.sendFromMaster(r.cfg.Self, &chain.Msg{Type: chain.MsgHeartbeat, From: chain.NodeID(ChainMasterID), To: chain.NodeID(r.cfg.Self)})
		// An answer to no order (epoch 0): the master ignores it.
		ans := chain.Msg{Type: chain.MsgCRMidDone, From: chain.NodeID(live[0]), To: chain.NodeID(ChainMasterID)}
		r.deliver(live[0], []frame.Message{{Engine: frame.EngineChain, Type: uint8(ans.Type), Body: chainwire.AppendBody(nil, &ans)}})
		close(handed)
	}()
	select {
	case <-handed:
	case <-time.After(5 * time.Second):
		t.Fatalf("node %d's failed member blocked a message to it (the master's lock, the transport's reader)", l+1)
	}
	rec := waitChainRecord(g, other, before.Epoch+1, live...)
	head := int(live[0] - 1)
	g.write(head, set("after", "1"), shard.ReqID{Client: 5, Seq: 2})
	t.Logf("the chain %v recorded at epoch %d, wrote at node %d", rec.Members, rec.Epoch, head+1)
	closed := make(chan struct{})
	go func() {
		g.reps[l].Close()
		close(closed)
	}()
	select {
	case <-closed:
		g.reps[l] = nil
	case <-time.After(5 * time.Second):
		t.Fatalf("node %d's Close hung (its master blocked?)", l+1)
	}
	if got := g.read(head, "k0"); got != "v0" {
		t.Fatalf("GET k0 at node %d: %q", head+1, got)
	}
}
