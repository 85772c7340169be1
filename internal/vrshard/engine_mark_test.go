package vrshard

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vr"
)

// Issue 24, item 2: a follower whose engine directory is deleted while its
// replication log survives must not come back Normal with the checkpointed
// state missing. It recovers from the group (state transfer); then, made
// the leader, it answers every committed key linearizably. On the old code
// it came back Normal at once and, once it led, read the keys below its
// log's snapshot point as absent.
func TestLostEngineRecoversFromTheGroup(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 30 // the followers' logs start well above op 1
		o.KeepTail = 5
	})
	const keys = 100
	var last shard.Result
	for i := range keys {
		var err error
		if last, err = c.write(set(fmt.Sprint("k", i), fmt.Sprint("v", i)), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.waitApplied(last.Version, 5*time.Second)
	f := (c.leader(5*time.Second) + 1) % 3
	// Its log's snapshot point must be above most keys, or the test tests
	// nothing: wait for a checkpoint that covers them.
	for deadline := time.Now().Add(5 * time.Second); c.reps[f].Stats().Checkpoints < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("follower took %d checkpoints", c.reps[f].Stats().Checkpoints)
		}
	}
	c.reps[f].Close()
	c.reps[f] = nil
	if err := os.RemoveAll(filepath.Join(c.dirs[f], "engine")); err != nil {
		t.Fatal(err)
	}
	c.open(f, false, nil)
	c.waitRecovered(f, 15*time.Second)
	c.waitApplied(last.Version, 15*time.Second)

	// Make it the leader: crash whoever leads (and bring it back) until it
	// does. Round-robin leadership gets there within two view changes.
	for try := 0; ; try++ {
		l := c.leader(15 * time.Second)
		if l == f {
			break
		}
		if try == 6 {
			t.Fatalf("replica %d never became the leader", c.ids[f])
		}
		c.kill(l)
		c.leader(15 * time.Second)
		c.open(l, false, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var missing []string
	for i := range keys {
		k := fmt.Sprint("k", i)
		res, err := c.reps[f].Read(ctx, get(k), level.ConsLinearizable, shard.Session{})
		if err != nil {
			t.Fatalf("linearizable get %s at the new leader: %v", k, err)
		}
		if string(res.Bulk) != fmt.Sprint("v", i) {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the replica that lost its engine leads and reads %d of %d committed keys wrong (absent): %v", len(missing), keys, missing)
	}
	if c.reps[f].Stats().SnapsLoaded == 0 {
		t.Fatalf("the replica caught up without a snapshot: the test did not test state transfer")
	}
}

// The applied mark and the view history are engine keys DBSIZE must not
// count (Status.Reserved), and the mark follows the applied op.
func TestEngineMarksAreCountedAsReserved(t *testing.T) {
	c := newCluster(t, 3, nil)
	res, err := c.write(set("a", "1"), shard.ReqID{}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.waitApplied(res.Version, 5*time.Second)
	for _, r := range c.reps {
		n := 0
		if err := r.db.Scan(nil, nil, 0, 0, func(k []byte, v storage.Value) bool {
			if len(k) > len(shard.ReservedPrefix) && string(k[:len(shard.ReservedPrefix)]) == string(shard.ReservedPrefix) {
				n++
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		st := r.Status()
		if st.Clients+st.Reserved != n || st.Reserved < 2 {
			t.Fatalf("replica %d: %d reserved keys in the engine, Status counts %d client rows and %d others", r.cfg.Self, n, st.Clients, st.Reserved)
		}
		v, err := r.db.Get(appliedKey)
		if err != nil || v.Version < res.Version {
			t.Fatalf("replica %d: applied mark %+v (%v), applied %d", r.cfg.Self, v, err, res.Version)
		}
	}
	if got := c.reps[0].Info().Status; got != vr.Normal {
		t.Fatalf("status %v", got)
	}
}
