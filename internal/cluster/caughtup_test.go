package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// progressReply is a leader's KEFIR.GROUP PROGRESS answer (server
// writeProgress): [epoch, start, commit, [[follower, persisted, applied]...]],
// its followers being every member of its epoch but itself.
func progressReply(epoch, start, commit int64, followers ...[3]int64) resp.Value {
	rows := make([]resp.Value, len(followers))
	for i, f := range followers {
		rows[i] = resp.Value{Kind: resp.Array, Elems: []resp.Value{{Kind: resp.Int, Int: f[0]}, {Kind: resp.Int, Int: f[1]}, {Kind: resp.Int, Int: f[2]}}}
	}
	return resp.Value{Kind: resp.Array, Elems: []resp.Value{{Kind: resp.Int, Int: epoch}, {Kind: resp.Int, Int: start},
		{Kind: resp.Int, Int: commit}, {Kind: resp.Array, Elems: rows}}}
}

// A member the group's last change added that leads the group now (view
// changes rotate the leader over the members: replace-node puts the new
// node at the old one's index, add-members appends, and view v is led by
// members[v mod n]) is not one of the leader's followers, so PROGRESS has
// no row for it; it has caught up (it leads). WaitCaughtUp must not wait
// for it (review29: it refused every later change of the group unless
// --force, naming the leader as "persisted op 0").
func TestWaitCaughtUpLeaderIsAnAddedMember(t *testing.T) {
	mv := &Mover{Seeds: []string{"n4"}, Transport: func(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
		if !strings.EqualFold(string(args[0]), "KEFIR.GROUP") || !strings.EqualFold(string(args[1]), "PROGRESS") {
			t.Fatalf("unexpected command %q", args)
		}
		// Node 4 replaced node 1 (members [4 2 3], previous [1 2 3]) and
		// leads: its followers are 2 and 3.
		return progressReply(2, 100, 180, [3]int64{2, 180, 180}, [3]int64{3, 180, 180}), nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := mv.WaitCaughtUp(ctx, 1, []uint64{4, 2, 3}, []uint64{1, 2, 3}, []uint64{2}, 300*time.Millisecond, nil); err != nil {
		t.Fatalf("the added member leads the group (caught up), yet: %v", err)
	}

	// A follower the change added that has not pulled the state is still
	// waited for (TestGroupChangeWaitsForNewMembersToCatchUp end to end).
	mv.Transport = func(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
		return progressReply(2, 100, 180, [3]int64{4, 0, 0}, [3]int64{3, 180, 180}), nil
	}
	err := mv.WaitCaughtUp(ctx, 1, []uint64{4, 2, 3}, []uint64{1, 2, 3}, nil, 300*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "node 4 (persisted op 0") {
		t.Fatalf("a new follower at op 0: %v, want a refusal naming node 4", err)
	}
}
