package vrshard

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
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
	sharedLinkStall(t, func(*Replica, peerMsg) bool { return true }, nil)
}

// The same for a round that steps a large batch (a snapshot, a page of
// one, a log of large values: largeMessage and up), the kind that takes
// long to install: such a batch is never stepped on the reader (deliver),
// so however long its round takes, the link's other groups go on. Here the
// large batch is a prepare of one 300 KiB value.
func TestLargeBatchRoundDoesNotStallAnotherOnTheLink(t *testing.T) {
	big := strings.Repeat("x", 300<<10)
	sharedLinkStall(t, func(_ *Replica, m peerMsg) bool { return m.Size() >= largeMessage }, func(lead *Replica) {
		go func() { // committed by the leader and the other follower
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			lead.Write(ctx, set("big", big), level.Sync, shard.ReqID{Client: 8, Seq: 1})
		}()
	})
}

// sharedLinkStall holds, for 3 s, the first round of group 1 at a follower
// that steps a message from the leader for which match holds (after
// trigger, if given, ran with group 1's leader), and fails if group 2, which shares the link and
// runs on two replicas, takes over a second to commit a write meanwhile.
func sharedLinkStall(t *testing.T, match func(*Replica, peerMsg) bool, trigger func(lead *Replica)) {
	mutation.Require(t)
	const hold = 3 * time.Second
	var victim atomic.Uint64 // group 1's follower whose round is held (0: none yet)
	var from atomic.Uint64   // group 1's leader: the held round steps its message
	var fired atomic.Bool
	nt := newNodeTransports(t, 3, testLogger(t))
	g1 := groupWith(t, nt, 1, testLogger(t), func(o *Options) {
		o.mut.afterStep = func(r *Replica, m peerMsg) {
			vm, ok := m.(*vrMsg)
			if !ok || victim.Load() != r.cfg.Self || (*vr.Message)(vm).From != from.Load() || !match(r, m) {
				return
			}
			if fired.CompareAndSwap(false, true) {
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
	victim.Store(g1.ids[f])
	if trigger != nil {
		trigger(g1.reps[l1])
	}
	for deadline := time.Now().Add(5 * time.Second); !fired.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("group 1's round was never held: the test shows nothing")
		}
	}
	time.Sleep(100 * time.Millisecond)
	took := write()
	t.Logf("group 2's write while group 1's round on node %d was held took %v", f+1, took)
	if took > time.Second {
		t.Fatalf("group 2's write took %v: it waited for group 1's held round on node %d", took, f+1)
	}
	time.Sleep(hold) // let the held round end before the clusters close
}
