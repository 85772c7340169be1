package vrshard

import (
	"errors"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/vr"
)

// TestVRAdapterAnswersLeaseReadsInReady: the host asks its core for a
// linearizable read with a read request only (core.Read); VR's adapter
// answers it under the leader lease in the next Ready's ReadStates (Lease
// set, the commit index), and by VR's read-index round once the lease has
// run out (Lease unset); a follower's read request is answered in its next
// Ready too (here: no read lease, follower reads are off). Every Ready
// carries the leader's lease, which the host publishes for reads off its
// driver.
// Three VR cores behind the adapter, driven by hand: every batch durable at
// once, every message delivered unless the followers are cut off.
func TestVRAdapterAnswersLeaseReadsInReady(t *testing.T) {
	ids := []uint64{1, 2, 3}
	cores := map[uint64]*vrCore{}
	for _, id := range ids {
		rep, err := vr.New(vr.Config{Cluster: 1, Epoch: 1, Members: ids, Self: id,
			HeartbeatInterval: 10 * time.Millisecond, ViewChangeTimeout: 100 * time.Millisecond,
			LeaseDuration: 50 * time.Millisecond, MaxDrift: 0.01}, vr.State{Bootstrap: true, Nonce: id})
		if err != nil {
			t.Fatal(err)
		}
		cores[id] = &vrCore{Replica: rep}
	}
	var now int64
	var got, got2 []vr.ReadState // the read states of replicas 1 and 2
	var lease core.Lease         // replica 1's, from its last Ready
	cut := false                 // the followers hear nothing
	// round runs one round of three hosts.
	round := func() {
		for busy := true; busy; {
			busy = false
			for _, id := range ids {
				c := cores[id]
				rd := c.Ready()
				if id == 1 {
					lease = rd.Lease
				}
				if rd.Empty() {
					continue
				}
				busy = true
				switch id {
				case 1:
					got = append(got, rd.ReadStates...)
				case 2:
					got2 = append(got2, rd.ReadStates...)
				}
				if rd.PersistSeq != 0 {
					c.Persisted(rd.PersistSeq)
				}
				if len(rd.Committed) > 0 {
					c.Advance(make([][]byte, len(rd.Committed)))
				}
				for _, m := range rd.Messages {
					if !cut {
						cores[m.To].Step(now, m)
					}
				}
			}
		}
	}
	tick := func() {
		now += int64(time.Millisecond)
		for _, id := range ids {
			cores[id].Tick(now)
		}
		round()
	}
	leader := cores[1] // the leader of view 0
	for range 200 {
		if _, _, ok := leader.LeaseUntil(); ok && leader.Info().IsLeader {
			break
		}
		tick()
	}
	if _, _, ok := leader.LeaseUntil(); !ok {
		t.Fatalf("no lease after 200 ms: %+v", leader.Info())
	}
	if until, idx, _ := leader.LeaseUntil(); !lease.Held || lease.Follower || lease.Until != until || lease.Index != idx {
		t.Fatalf("Ready.Lease %+v, want the leader's lease until %d at commit %d", lease, until, idx)
	}
	if err := leader.Read(now, core.ReadRequest{Ctx: 7}); err != nil {
		t.Fatal(err)
	}
	round()
	if len(got) != 1 || got[0].Ctx != 7 || !got[0].Lease || got[0].Err != nil || got[0].Index != leader.Info().Commit {
		t.Fatalf("a read under the lease: read states %+v, want ctx 7 at commit %d answered by the lease", got, leader.Info().Commit)
	}

	// The followers stop hearing the leader until its lease has run out; a
	// read then takes a read-index round once they hear it again.
	got = nil
	cut = true
	for range 60 {
		tick()
	}
	if until, _, ok := leader.LeaseUntil(); ok && until > now {
		t.Fatalf("the lease outlived 60 ms without followers: until %d, now %d", until, now)
	}
	cut = false
	if err := leader.Read(now, core.ReadRequest{Ctx: 8}); err != nil {
		t.Fatal(err)
	}
	round()
	for i := 0; i < 50 && len(got) == 0; i++ {
		tick()
	}
	if len(got) != 1 || got[0].Ctx != 8 || got[0].Lease || got[0].Err != nil {
		t.Fatalf("a read without the lease: read states %+v, want ctx 8 from a read-index round", got)
	}

	if err := cores[2].Read(now, core.ReadRequest{Ctx: 9, Kind: core.ReadFollower}); err != nil {
		t.Fatal(err)
	}
	round()
	if len(got2) != 1 || got2[0].Ctx != 9 || !errors.Is(got2[0].Err, vr.ErrNoReadLease) {
		t.Fatalf("a follower's read: read states %+v, want ctx 9 refused for want of a read lease", got2)
	}
}
