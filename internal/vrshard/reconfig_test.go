package vrshard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// A membership is written in the hard state's record and in every hard
// state record after it, so it survives later batches and a checkpoint's
// new segment; a log without one reads back none.
func TestWALKeepsMembershipWithHardState(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	w.addEntries(entries(1, 4, 0))
	w.addHardState(vr.HardState{Commit: 2})
	commitBatch(t, w)
	w.close()
	if _, st, err := openWAL(mem, "/wal"); err != nil || st.member != nil {
		t.Fatalf("a log never reconfigured: member %+v, %v", st.member, err)
	}

	w, _, err := openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	m := &vr.Membership{Epoch: 2, Members: []uint64{1, 4, 5}, Start: 4, Previous: []uint64{1, 2, 3}}
	w.member = m
	w.addHardState(vr.HardState{Commit: 4})
	commitBatch(t, w)
	w.addEntries(entries(5, 6, 0))
	w.addHardState(vr.HardState{View: 1, LastNormalView: 1, Commit: 6})
	commitBatch(t, w)
	w.close()
	w, st, err := openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.member, m) || st.hs.Commit != 6 || w.member == nil {
		t.Fatalf("recovered member %+v, hs %+v; want %+v with commit 6", st.member, st.hs, m)
	}
	// A checkpoint rewrites the hard state into a new segment: the
	// membership goes with it.
	w.addSnapshot(vr.Snapshot{Op: 6})
	w.addHardState(st.hs)
	if err := w.roll(); err != nil {
		t.Fatal(err)
	}
	w.close()
	if _, st, err = openWAL(mem, "/wal"); err != nil || !reflect.DeepEqual(st.member, m) {
		t.Fatalf("after a checkpoint: member %+v, %v; want %+v", st.member, err, m)
	}
}

// A group reconfigured from three members to one: Reconfigure returns the
// durable new configuration, the leaving replicas retire, writes go on in
// the new epoch, and a restart of the remaining member comes back in it
// (the membership persisted with the hard state) with every acknowledged
// write. Without the persisted membership (vr.State.Membership not passed)
// the restarted replica opens in epoch 1, moves to epoch 2 again only when
// it hands the reconfiguration out a second time, and that discards the log
// after it: the write acknowledged in epoch 2 is gone (verified: "get b").
func TestReconfiguredReplicaRestartsInItsEpoch(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader(5 * time.Second)
	if _, err := c.write(set("a", "1"), shard.ReqID{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	self := c.ids[l]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := c.reps[l].Reconfigure(ctx, 1, []uint64{self})
	if err != nil {
		t.Fatalf("reconfigure to {%d}: %v", self, err)
	}
	if m.Epoch != 2 || !reflect.DeepEqual(m.Members, []uint64{self}) || m.Start == 0 {
		t.Fatalf("new configuration %+v, want epoch 2, members [%d]", m, self)
	}
	if got, ok := c.reps[l].Membership(); !ok || !reflect.DeepEqual(got, m) {
		t.Fatalf("Membership() = %+v, %v; want %+v", got, ok, m)
	}
	if _, err := c.reps[l].Reconfigure(ctx, 2, []uint64{self}); !errors.Is(err, vr.ErrBadMembers) {
		t.Fatalf("reconfigure to the current set: %v, want vr.ErrBadMembers", err)
	}
	// Planned against epoch 1, which the change above ended: refused,
	// typed, naming where the group is.
	var moved *vr.EpochMovedError
	if _, err := c.reps[l].Reconfigure(ctx, 1, []uint64{self, 7, 8}); !errors.As(err, &moved) || moved.Epoch != 2 || !reflect.DeepEqual(moved.Members, []uint64{self}) {
		t.Fatalf("reconfigure from epoch 1 at epoch 2: %v, want a vr.EpochMovedError", err)
	}
	for i := range c.reps {
		if i == l {
			continue
		}
		if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { return c.reps[i].Info().Retired }) {
			t.Fatalf("replica %d never retired: %+v", c.ids[i], c.reps[i].Info())
		}
	}
	if _, err := c.write(set("b", "2"), shard.ReqID{}, 5*time.Second); err != nil {
		t.Fatalf("write in the new epoch: %v", err)
	}
	c.kill(l)
	c.open(l, false, nil)
	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { in := c.reps[l].Info(); return in.IsLeader && in.Epoch == 2 }) {
		t.Fatalf("restarted replica: %+v; want the leader of epoch 2", c.reps[l].Info())
	}
	c.expectValue(l, "a", "1")
	c.expectValue(l, "b", "2")
}

// A member of a three-replica group is replaced by a fresh one amid writes:
// the leader orders {leader, the other follower, 4}; node 4, a spare the
// transport knows, starts with the reported configuration and an empty disk
// and pulls the epoch's start state across the epoch boundary (its handshake
// runs with the new configuration's hash, the old members' with the old
// one); the replaced member retires. Every acknowledged write reads back at
// the new group's leader and at node 4.
func TestReplaceAMemberWithAFreshOne(t *testing.T) {
	spare, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3, func(o *Options) {
		peers := maps.Clone(o.Peers)
		peers[4] = spare.Addr().String()
		o.Peers = peers
	})
	l := c.leader(5 * time.Second)
	stay, gone := (l+1)%3, (l+2)%3
	var mu sync.Mutex
	acked := map[string]string{}
	write := func(k, v string) {
		if _, err := c.write(set(k, v), shard.ReqID{}, 5*time.Second); err == nil {
			mu.Lock()
			acked[k] = v
			mu.Unlock()
		} else if !errors.Is(err, vr.ErrReconfigured) && !errors.Is(err, shard.ErrUnavailable) {
			t.Errorf("write %s: %v", k, err)
		}
	}
	for i := range 5 {
		write(fmt.Sprint("before", i), fmt.Sprint(i))
	}
	// Writes race the reconfiguration: refused (ReconfiguredError) or
	// acknowledged, never lost.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 5 {
			write(fmt.Sprint("during", i), fmt.Sprint(i))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	members := []uint64{c.ids[l], c.ids[stay], 4}
	m, err := c.reps[l].Reconfigure(ctx, 1, members)
	if err != nil {
		t.Fatalf("reconfigure to %v: %v", members, err)
	}
	wg.Wait()
	if _, err := c.reps[stay].Reconfigure(ctx, vr.AnyEpoch, []uint64{1}); !errors.As(err, new(*NotLeaderError)) {
		t.Fatalf("reconfigure at a follower: %v, want a NotLeaderError", err)
	}

	// Node 4: the reported configuration, an empty disk, no Bootstrap.
	c.ids = append(c.ids, 4)
	c.dirs = append(c.dirs, t.TempDir())
	c.peers[4] = spare.Addr().String()
	o := c.options(3, false, spare)
	o.VR = m.Apply(o.VR)
	fresh, err := Open(o)
	if err != nil {
		t.Fatalf("open new member 4: %v", err)
	}
	c.reps = append(c.reps, fresh)

	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { return c.reps[gone].Info().Retired }) {
		t.Fatalf("replaced member %d never retired: %+v", c.ids[gone], c.reps[gone].Info())
	}
	if _, err := c.reps[gone].Write(ctx, set("late", "x"), level.Sync, shard.ReqID{}); !errors.Is(err, vr.ErrReconfigured) {
		t.Fatalf("write at the retired member: %v, want vr.ErrReconfigured", err)
	}
	c.reps[gone].Close() // the host stops a retired replica
	c.reps[gone] = nil
	for i := range 5 {
		write(fmt.Sprint("after", i), fmt.Sprint(i))
	}
	if len(acked) < 10 {
		t.Fatalf("only %d writes acknowledged: %v", len(acked), acked)
	}
	nl := c.leader(5 * time.Second)
	if in := c.reps[nl].Info(); in.Epoch != 2 {
		t.Fatalf("leader %d in epoch %d, want 2", c.ids[nl], in.Epoch)
	}
	for k, v := range acked {
		res, err := c.reps[nl].Read(ctx, get(k), level.ConsLinearizable, shard.Session{})
		if err != nil || string(res.Bulk) != v {
			t.Fatalf("leader: get %s = %q, %v; want %q", k, res.Bulk, err, v)
		}
	}
	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool {
		in := fresh.Info()
		return !in.Joining && in.Applied >= c.reps[nl].Info().Commit
	}) {
		t.Fatalf("new member never caught up: %+v (leader %+v)", fresh.Info(), c.reps[nl].Info())
	}
	for k, v := range acked {
		c.expectValue(3, k, v)
	}
}
