package vrshard

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vr"
)

// One group's slow driver round must not stall another group that shares
// the node's links. Two VR groups on the same three node transports, both
// led from one node; group 2's replica on the third node is down, so group
// 2 commits with its leader and the second node's replica alone. Then one
// round of group 1 at the second node takes 3 s (a test hook standing in
// for the rounds that do take seconds: a snapshot install, a paged
// snapshot's engine sync, a segment roll's fsync on a busy disk). Group 2
// must go on committing: its prepares to the second node cross the same
// link as group 1's, and a link's reader that only queues group 1's batch
// for group 1's driver (as before inline rounds, 6c62c8f: the write takes
// under a millisecond) reads on until group 1's inbox is full (256
// batches: seconds of heartbeats). A reader that runs group 1's round
// itself (inline.go, stepInline) reads nothing meanwhile, so group 2's
// write waits for the held round (main at d0faae1: ~2.9 s).
func TestSlowRoundOfOneGroupDoesNotStallAnotherOnTheLink(t *testing.T) {
	mutation.Require(t)
	const hold = 3 * time.Second
	var victim atomic.Uint64 // group 1's follower whose round is held (0: none yet)
	var from atomic.Uint64   // group 1's leader: the held round steps its message
	var fired atomic.Bool
	var heldAt atomic.Int64
	nt := newNodeTransports(t, 3, testLogger(t))
	g1 := groupWith(t, nt, 1, testLogger(t), func(o *Options) {
		o.mut.afterStep = func(r *Replica, m peerMsg) {
			vm, ok := m.(*vrMsg)
			if !ok || victim.Load() != r.cfg.Self || (*vr.Message)(vm).From != from.Load() {
				return
			}
			if fired.CompareAndSwap(false, true) {
				heldAt.Store(time.Now().UnixNano())
				time.Sleep(hold)
			}
		}
	})
	g2 := groupOn(t, nt, 2, testLogger(t))
	l1, l2 := g1.leader(5*time.Second), g2.leader(5*time.Second)
	if l1 != l2 {
		t.Skipf("the groups' leaders are on nodes %d and %d: the test needs them on one node", l1+1, l2+1)
	}
	f, other := (l1+1)%3, (l1+2)%3
	g2.kill(other)
	id := uint64(0)
	write := func() time.Duration {
		t.Helper()
		id++
		start := time.Now()
		if _, err := g2.write(set(fmt.Sprint("k", id), "v"), shard.ReqID{Client: 9, Seq: id}, 10*time.Second); err != nil {
			t.Fatalf("group 2 write %d: %v", id, err)
		}
		return time.Since(start)
	}
	write() // group 2 commits with two replicas
	from.Store(g1.ids[l1])
	victim.Store(g1.ids[f]) // the leader's next heartbeat or prepare to it
	for !fired.Load() {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	took := write()
	t.Logf("group 2's write %v after group 1's round on node %d was held, took %v", time.Since(time.Unix(0, heldAt.Load()))-took, f+1, took)
	if took > time.Second {
		t.Fatalf("group 2's write took %v: it waited for group 1's held round on node %d", took, f+1)
	}
}
