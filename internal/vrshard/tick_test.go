package vrshard

import (
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
)

// TestFollowerTicksOncePerHeartbeat: a normal VR follower's driver ticks at
// FollowerTickInterval (the heartbeat), the leader and every chain member at
// TickInterval (tickFor).
func TestFollowerTicksOncePerHeartbeat(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader(10 * time.Second)
	o := c.reps[l].opts
	if o.FollowerTickInterval != 10*time.Millisecond || o.TickInterval != 10*time.Millisecond/4 {
		t.Fatalf("defaults: tick %v, follower tick %v; want 2.5ms and 10ms", o.TickInterval, o.FollowerTickInterval)
	}
	want := func(i int) time.Duration {
		if i == l {
			return o.TickInterval
		}
		return o.FollowerTickInterval
	}
	var got [3]time.Duration
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ok := true
		for i, r := range c.reps {
			got[i] = time.Duration(r.tickPeriod.Load())
			ok = ok && got[i] == want(i)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tick periods %v (leader %d); want %v for the leader, %v for followers", got, l, o.TickInterval, o.FollowerTickInterval)
		}
	}

	// The ticker runs at the published period: over a window, a follower
	// ticks at most once per FollowerTickInterval (plus the edges).
	var before [3]uint64
	for i, r := range c.reps {
		before[i] = r.ticks.Load()
	}
	start := time.Now()
	time.Sleep(200 * time.Millisecond)
	elapsed := time.Since(start)
	for i, r := range c.reps {
		n := r.ticks.Load() - before[i]
		if i != l && n > uint64(elapsed/o.FollowerTickInterval)+2 {
			t.Errorf("follower %d ticked %d times in %v; want at most one per %v", i, n, elapsed, o.FollowerTickInterval)
		}
		if i == l && n == 0 {
			t.Errorf("leader ticked 0 times in %v", elapsed)
		}
	}

	g := newChainGroup(t)
	time.Sleep(50 * time.Millisecond) // a few rounds
	for i, r := range g.reps {
		if p := time.Duration(r.tickPeriod.Load()); p != r.opts.TickInterval {
			t.Errorf("chain member %d ticks every %v; want %v", i+1, p, r.opts.TickInterval)
		}
	}
}

// TestNewLeaderTicksFastAtOnce: a follower that becomes leader takes the
// leader's tick at once, though the view change that elected it ran in
// inline rounds (peer messages stepped by connection readers), which reset
// no ticker: endInline wakes run. With the follower tick at a second, a new
// leader left on it would send no heartbeat for up to a second.
func TestNewLeaderTicksFastAtOnce(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) { o.FollowerTickInterval = time.Second })
	old := c.leader(10 * time.Second)
	w := &workload{c: c}
	w.partition(old, true)
	defer w.partition(old, false)
	nl := -1
	if !testgroup.Until(15*time.Second, time.Millisecond, func() bool {
		for i, r := range c.reps {
			if i != old && r.isLeader.Load() {
				nl = i
				return true
			}
		}
		return false
	}) {
		t.Fatal("no new leader")
	}
	r := c.reps[nl]
	want := int64(r.opts.TickInterval)
	if !testgroup.Until(300*time.Millisecond, time.Millisecond, func() bool { return r.tickPeriod.Load() == want }) {
		t.Fatalf("new leader %d ticks every %v 300ms after its election; want %v", nl, time.Duration(r.tickPeriod.Load()), r.opts.TickInterval)
	}
}

// TestViewChangeTicksFast: a replica in a view change keeps the fast tick
// (it resends its start-view-change and do-view-change on it), though it is
// no leader: the group's leader restarted alone comes back into a view
// change it cannot finish (tickFor's status check).
func TestViewChangeTicksFast(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader(10 * time.Second)
	for i := range c.reps {
		c.kill(i)
	}
	c.open(l, false, nil)
	r := c.reps[l]
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool {
		return vr.Status(r.status.Load()) == vr.ViewChange && r.tickPeriod.Load() == int64(r.opts.TickInterval)
	}) {
		t.Fatalf("restarted leader alone: status %v, ticks every %v; want a view change at %v",
			vr.Status(r.status.Load()), time.Duration(r.tickPeriod.Load()), r.opts.TickInterval)
	}
	time.Sleep(50 * time.Millisecond) // rounds after it: still fast
	if p := time.Duration(r.tickPeriod.Load()); p != r.opts.TickInterval || r.isLeader.Load() {
		t.Fatalf("restarted leader alone ticks every %v (leader %v); want %v", p, r.isLeader.Load(), r.opts.TickInterval)
	}
}
