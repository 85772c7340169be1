package vrshard

import (
	"testing"
	"time"
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

	g := newChainGroup(t)
	time.Sleep(50 * time.Millisecond) // a few rounds
	for i, r := range g.reps {
		if p := time.Duration(r.tickPeriod.Load()); p != r.opts.TickInterval {
			t.Errorf("chain member %d ticks every %v; want %v", i+1, p, r.opts.TickInterval)
		}
	}
}
