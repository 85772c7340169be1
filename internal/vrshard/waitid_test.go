package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// TestSecondWaiterOfARequestIDIsAnswered: a retry that arrives while the
// original is still waiting for its commit waits beside it (waitID holds
// both: the first in its proposal's own one-element array, the second
// appended to a new slice), and the commit answers both with the original's
// outcome. A waitID that kept only one of them would leave the other to
// time out.
func TestSecondWaiterOfARequestIDIsAnswered(t *testing.T) {
	leader, gates, _ := heldLeader(t, nil, "k0", "v0")
	ctx := context.Background()
	id := shard.ReqID{Client: 41, Seq: 1}
	type answer struct {
		version uint64
		err     error
	}
	answers := make(chan answer, 2)
	write := func() {
		res, err := leader.Write(ctx, set("k", "v1"), level.Sync, id)
		answers <- answer{res.Version, err}
	}
	go write()
	time.Sleep(50 * time.Millisecond) // the original waits: no fsync can finish
	go write()
	time.Sleep(50 * time.Millisecond)
	gates.release()
	var got []answer
	for range 2 {
		select {
		case a := <-answers:
			got = append(got, a)
		case <-time.After(3 * time.Second):
			t.Fatalf("a waiter of request %v was not answered (got %v)", id, got)
		}
	}
	for _, a := range got {
		if a.err != nil {
			t.Fatalf("request %v: %v", id, a.err)
		}
	}
	if got[0].version != got[1].version {
		t.Fatalf("request %v answered at versions %d and %d", id, got[0].version, got[1].version)
	}
}
