package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
)

// Issue 24, item 2, with real processes: a follower is SIGKILLed, its
// storage engine directory deleted (its replication log kept), and it is
// restarted. It must not come back as a healthy replica with the state below
// its log's snapshot point missing: it recovers from the group. Then it is
// made the leader (the others' leaders are SIGKILLed and restarted until it
// leads) and every committed key is read through it linearizably. On the old
// code it led with holes and answered nil for the checkpointed keys.
func TestFollowerWithLostEngineLeadsWithEveryCommittedKey(t *testing.T) {
	// Checkpoints every 20 ops: the follower's log no longer holds the ops
	// of most keys, only its (deleted) engine did.
	g := startGroupWith(t, "--replication-checkpoint-ops", "20")
	l := g.settledLeader(-1)
	c := dialGroup(t, g.addrs())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const keys = 100
	for i := range keys {
		if err := c.Put(ctx, fmt.Sprint("k", i), []byte(fmt.Sprint("v", i))); err != nil {
			t.Fatalf("put k%d: %v", i, err)
		}
	}
	f := (l + 1) % 3
	g.caughtUp(f, l)
	// A checkpoint is taken after the apply that crosses 20 ops; give the
	// follower's engine sync a moment to finish and its log segment to roll.
	time.Sleep(500 * time.Millisecond)
	g.nodes[f].Kill()
	engine := filepath.Join(g.nodes[f].Dir, "vr", "engine")
	if _, err := os.Stat(engine); err != nil {
		t.Fatalf("the engine directory is not where the test expects it: %v", err)
	}
	if err := os.RemoveAll(engine); err != nil {
		t.Fatal(err)
	}
	g.nodes[f].Start()
	g.settledLeader(-1) // every node leader or follower again: f recovered
	g.caughtUp(f, g.leader(-1))

	// Make f the leader: leadership goes round-robin by view.
	for try := 0; ; try++ {
		cur := g.settledLeader(-1)
		if cur == f {
			break
		}
		if try == 6 {
			t.Fatalf("%s never became the leader", g.nodes[f].ID)
		}
		g.nodes[cur].Kill()
		g.leader(cur)
		g.nodes[cur].Start()
	}
	t.Logf("%s, which lost its engine, leads", g.nodes[f].ID)

	// Reads through f alone, at the server's default level (linearizable).
	fc := dialGroup(t, []string{g.nodes[f].ClientAddr})
	var wrong []string
	for i := range keys {
		k := fmt.Sprint("k", i)
		v, err := fc.Get(ctx, k)
		if errors.Is(err, client.ErrNotFound) {
			wrong = append(wrong, k+" absent")
			continue
		}
		if err != nil {
			t.Fatalf("get %s at %s: %v", k, g.nodes[f].ID, err)
		}
		if string(v) != fmt.Sprint("v", i) {
			wrong = append(wrong, fmt.Sprintf("%s=%q", k, v))
		}
	}
	if st, err := status(g.nodes[f]); err != nil || st.Role != "leader" {
		t.Fatalf("%s stopped leading during the reads (%+v, %v): the reads did not test it", g.nodes[f].ID, st, err)
	}
	if len(wrong) > 0 {
		t.Fatalf("the leader that lost its engine answered %d of %d committed keys wrong: %v", len(wrong), keys, wrong)
	}
}
