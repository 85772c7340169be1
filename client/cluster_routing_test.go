package client

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// The tests of this file use only what the client had before it routed by
// slot (Dial, Put, Get and the in-process servers), so that they can be run
// against that client: each fails there (docs/design/cluster.md, "The Go
// client").

// kefirUpLayout is kefir up --groups 3's: group g's members start at node g
// and go round (each node leads one group at first), the slots split as
// redis-cli --cluster create splits them among three masters.
var kefirUpLayout = []kcluster.GroupSpec{
	{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: 0, End: 5460}}},
	{ID: 2, Members: []uint64{2, 3, 1}, Slots: []kcluster.SlotRange{{Start: 5461, End: 10922}}},
	{ID: 3, Members: []uint64{3, 1, 2}, Slots: []kcluster.SlotRange{{Start: 10923, End: 16383}}},
}

// startGroups runs three nodes hosting groups in-process (each node a
// replica of every group) and waits until every node knows a leader of
// every group, the same (usually the group's first member).
func startGroups(t testing.TB, groups []kcluster.GroupSpec) []*server.Server {
	t.Helper()
	nodes := startNodes(t, func(c *server.Config) { c.Groups = groups })
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		for _, s := range nodes {
			st := s.Status().Groups
			if len(st) != len(groups) {
				return false
			}
			for i, g := range st {
				if g.Leader == 0 || g.Leader != nodes[0].Status().Groups[i].Leader {
					return false
				}
			}
		}
		return true
	}) {
		t.Fatal("the groups did not all elect a leader every node knows")
	}
	return nodes
}

// forwardedBy sums the commands the nodes forwarded to a leader (INFO's
// forwarded:, every group's).
func forwardedBy(nodes []*server.Server) (n uint64) {
	for _, s := range nodes {
		if s != nil && s.Status().Replication != nil {
			n += s.Status().Replication.Forwarded
		}
	}
	return n
}

// keysOf returns n keys of each group's slots (by groups' ranges).
func keysOf(groups []kcluster.GroupSpec, n int) [][]string {
	out := make([][]string, len(groups))
	for i := 0; ; i++ {
		k := fmt.Sprint("key:", i)
		s := kcluster.Slot([]byte(k))
		done := true
		for g, spec := range groups {
			for _, r := range spec.Slots {
				if s >= r.Start && s <= r.End && len(out[g]) < n {
					out[g] = append(out[g], k)
				}
			}
			done = done && len(out[g]) == n
		}
		if done {
			return out
		}
	}
}

// Keys of every group go straight to their group's leader: a client dialed
// to node 1 alone writes and reads keys of the three groups (plain calls,
// which a node forwards, and calls with options, which it redirects), and
// no node forwards any of them. Before, the client sent everything to the
// node it found and the nodes forwarded the other groups' calls.
func TestClusterCallsGoToTheirGroupsLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithRetryUnavailable(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := keysOf(kefirUpLayout, 10)
	fwd0 := forwardedBy(nodes)
	// Each kind of call in turn over the groups' keys (a key of group 1,
	// of 2, of 3, of 1...).
	for i := range keys[0] {
		for _, ks := range keys {
			if err := c.Put(ctx, ks[i], []byte("v-"+ks[i])); err != nil {
				t.Fatalf("Put %s: %v", ks[i], err)
			}
		}
	}
	for _, opts := range [][]CallOption{nil, {WithConsistency(Linearizable)}} {
		for i := range keys[0] {
			for _, ks := range keys {
				if v, err := c.Get(ctx, ks[i], opts...); err != nil || string(v) != "v-"+ks[i] {
					t.Fatalf("Get %s (%d options) = %q, %v", ks[i], len(opts), v, err)
				}
			}
		}
	}
	if fwd := forwardedBy(nodes) - fwd0; fwd != 0 {
		t.Fatalf("the nodes forwarded %d of the client's %d calls to keys of three groups, want 0", fwd, 3*len(keys)*len(keys[0]))
	}
}

// The old defect: a write asks for redirects, and a node answers a key of a
// group it does not lead with -MOVED to that group's leader. The client
// took that for the leader of everything and moved its whole pool there,
// so writes alternating between two groups' keys moved it back and forth,
// a new connection each time. Now a redirect moves nothing but its call,
// and the pool of each group's leader stays.
func TestClusterRedirectsDoNotMoveThePool(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var dials atomic.Int64 // connections that carried a write
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithPoolSize(1), WithRetryUnavailable(5*time.Second), func(o *options) {
		o.wrapConn = func(nc net.Conn) net.Conn { return &writeCounter{Conn: nc, n: &dials} }
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := keysOf(kefirUpLayout, 20)
	d0 := dials.Load()
	for i := range keys[0] {
		for g := range keys {
			k := keys[g][i]
			if err := c.Put(ctx, k, []byte("v")); err != nil {
				t.Fatalf("Put %s: %v", k, err)
			}
		}
	}
	// One connection per node at most (WithPoolSize(1)), whatever the
	// number of writes (a view change meanwhile moves a group's calls to
	// another node, which has its connection already).
	if d := dials.Load() - d0; d > 3 {
		t.Fatalf("%d writes alternating over three groups went over %d connections, want at most one per node (3)", 3*len(keys[0]), d)
	}
}

// writeCounter counts, in n, the connections it wraps once one carries a
// write (a request id).
type writeCounter struct {
	net.Conn
	n       *atomic.Int64
	counted bool
}

func (w *writeCounter) Write(b []byte) (int, error) {
	if !w.counted && bytes.Contains(b, []byte("REQID")) {
		w.counted = true
		w.n.Add(1)
	}
	return w.Conn.Write(b)
}
