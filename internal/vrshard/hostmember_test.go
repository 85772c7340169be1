package vrshard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A new member whose address the replicas learn only after they opened
// (SetAddrs: the node reads it from the group's address record): its
// Options never named it, yet the leader and the member that stays reach
// it after the reconfiguration and it catches up; and a follower's redirect
// names the leader by the client address it was taught. Without the
// SetAddrs call the new member never catches up (verified).
func TestSetAddrsReachesANewMember(t *testing.T) {
	spare, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3, nil)
	l := c.leader(5 * time.Second)
	stay := (l + 1) % 3
	acked := map[string]string{}
	write := func(k, v string) {
		t.Helper()
		if _, err := c.write(set(k, v), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatalf("write %s: %v", k, err)
		}
		acked[k] = v
	}
	for i := range 3 {
		write(fmt.Sprint("before", i), fmt.Sprint(i))
	}
	taught := []kcluster.Member{{ID: 4, PeerAddr: spare.Addr().String(), ClientAddr: "client-4"}, {ID: c.ids[l], ClientAddr: "taught-leader"}}
	for _, r := range c.reps {
		if err := r.SetAddrs(taught); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var nl *NotLeaderError
	if _, err := c.reps[stay].Write(ctx, set("x", "1"), level.Sync, shard.ReqID{}); !errors.As(err, &nl) || nl.Addr != "taught-leader" {
		t.Fatalf("write at a follower: %v, want a redirect to taught-leader", err)
	}
	m, err := c.reps[l].Reconfigure(ctx, 1, []uint64{c.ids[l], c.ids[stay], 4})
	if err != nil {
		t.Fatal(err)
	}
	// Node 4 knows the others from its own Options; theirs never name it.
	peers := maps.Clone(c.peers)
	c.ids, c.dirs = append(c.ids, 4), append(c.dirs, t.TempDir())
	o := c.options(3, false, spare)
	o.Peers = peers
	o.Peers[4] = spare.Addr().String()
	o.VR = m.Apply(o.VR)
	fresh, err := Open(o)
	if err != nil {
		t.Fatalf("open new member 4: %v", err)
	}
	c.reps = append(c.reps, fresh)
	for i := range 3 {
		write(fmt.Sprint("after", i), fmt.Sprint(i))
	}
	nl2 := c.leader(5 * time.Second)
	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool {
		in := fresh.Info()
		return !in.Joining && in.Applied >= c.reps[nl2].Info().Commit
	}) {
		t.Fatalf("new member never caught up: %+v (leader %+v)", fresh.Info(), c.reps[nl2].Info())
	}
	for k, v := range acked {
		c.expectValue(3, k, v)
	}
}
