package cluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// configReply is a KEFIR.GROUP CONFIG answer (server writeConfig):
// [cluster, epoch, start, members, previous, leader, addresses].
func configReply(epoch int64, members, previous []uint64) resp.Value {
	ids := func(xs []uint64) resp.Value {
		v := resp.Value{Kind: resp.Array}
		for _, x := range xs {
			v.Elems = append(v.Elems, resp.Value{Kind: resp.Int, Int: int64(x)})
		}
		return v
	}
	return resp.Value{Kind: resp.Array, Elems: []resp.Value{{Kind: resp.Int, Int: 1}, {Kind: resp.Int, Int: epoch}, {Kind: resp.Int, Int: 100},
		ids(members), ids(previous), {Kind: resp.Int, Int: int64(members[0])}, {Kind: resp.Array}}}
}

// nodeChangeMap is the map of the NodeChange tests: group 1 [1 3 5] on
// nodes 1-9 (client address "nID").
func nodeChangeMap() *kv.ClusterMap {
	cm := &kv.ClusterMap{Epoch: 4, Groups: []kv.MapGroup{{ID: 1, Members: []uint64{1, 3, 5}}}}
	for id := uint64(1); id <= 9; id++ {
		cm.Nodes = append(cm.Nodes, kv.MapNode{ID: id, ClientAddr: "n" + strconv.FormatUint(id, 10), PeerAddr: "p"})
	}
	return cm
}

// fakeGroup is a VR group's leader as the NodeChange tests see it
// through a Mover's transport: its configuration (CONFIG), a PROGRESS hook,
// and RECONFIG answered as the server does — refused with -EPOCHMOVED when
// planned against another epoch (the core's compare-and-set), else the
// group moves to the next epoch. The map's side (KEFIR.SLOTS META) answers
// an epoch.
type fakeGroup struct {
	t                 *testing.T
	mu                sync.Mutex
	epoch             int64
	members, previous []uint64
	// progress answers PROGRESS (n: its call number, from 1); nil: every
	// member caught up.
	progress func(g *fakeGroup, n int) resp.Value
	// onConfig runs before CONFIG answers (n: its call number, from 1).
	onConfig func(g *fakeGroup, n int)
	// lagging: a member (by client address) that answers CONFIG with an
	// older configuration than the leader's (a follower that has not
	// learned of the last change: partitioned, or slow).
	lagging map[string]resp.Value
	calls   map[string]int
	// pending: a change another party ordered from the current epoch and
	// the group has not committed yet (its leader refuses a request
	// planned against the current epoch, naming the next one: the VR
	// core's EpochMovedError.Pending); nil: none.
	pending []uint64
	// asked: every RECONFIG's expected epoch and members; done: the
	// accepted ones' members.
	asked []string
	done  [][]uint64
}

func (g *fakeGroup) transport(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.calls == nil {
		g.calls = map[string]int{}
	}
	sub := strings.ToUpper(string(args[1]))
	g.calls[sub]++
	switch sub {
	case "META": // ADDNODE, SETMEMBERS: the map's epoch
		return resp.Value{Kind: resp.Int, Int: 5}, nil
	case "CONFIG":
		if g.onConfig != nil {
			g.onConfig(g, g.calls[sub])
		}
		if v, ok := g.lagging[addr]; ok {
			return v, nil
		}
		return configReply(g.epoch, g.members, g.previous), nil
	case "PROGRESS":
		if g.progress != nil {
			return g.progress(g, g.calls[sub]), nil
		}
		var rows [][3]int64
		for _, id := range g.members[1:] {
			rows = append(rows, [3]int64{int64(id), 1000, 1000})
		}
		return progressReply(g.epoch, 100, 1000, rows...), nil
	case "RECONFIG":
		// KEFIR.GROUP RECONFIG GROUP g [EPOCH e] id... (no EPOCH, or
		// AnyEpoch: not checked, as the server)
		e, rest := int64(-1), args[4:]
		if strings.EqualFold(string(rest[0]), "EPOCH") {
			if x, err := strconv.ParseUint(string(rest[1]), 10, 64); err == nil && x != AnyEpoch {
				e = int64(x)
			}
			rest = rest[2:]
		}
		var ids []uint64
		for _, a := range rest {
			id, _ := strconv.ParseUint(string(a), 10, 64)
			ids = append(ids, id)
		}
		g.asked = append(g.asked, fmt.Sprintf("%d:%v", e, ids))
		if e >= 0 && e == g.epoch && g.pending != nil {
			moved := &EpochMovedError{Group: 1, Expected: uint64(e), Epoch: uint64(g.epoch) + 1, Members: g.pending, Pending: true}
			return resp.Value{Kind: resp.Error, Str: []byte(moved.Error())}, nil
		}
		if e >= 0 && e != g.epoch {
			moved := &EpochMovedError{Group: 1, Expected: uint64(e), Epoch: uint64(g.epoch), Members: g.members}
			return resp.Value{Kind: resp.Error, Str: []byte(moved.Error())}, nil
		}
		g.epoch, g.members, g.previous = g.epoch+1, ids, g.members
		g.done = append(g.done, ids)
		return configReply(g.epoch, g.members, g.previous), nil
	}
	g.t.Fatalf("unexpected command %q", args)
	return resp.Value{}, nil
}

// run runs nc (on g's transport) over plan, planned against map cm.
func (g *fakeGroup) run(nc *NodeChange, cm *kv.ClusterMap, plan []GroupChange) error {
	nc.Meta = &Mover{Seeds: []string{"n1"}, Transport: g.transport}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return nc.Run(ctx, cm, plan)
}

// A placed replacement (the repairer's, or replace-node --old N without
// --new) that waits for the group's last change to catch up must ask for
// the members the group has when the wait ends, not when it began: an
// operator's replace-node of another member that lands during the wait
// (up to CaughtUpWait) would otherwise be undone — its new node dropped
// before it caught up and the node it replaced, dead, made a member again,
// leaving the group one caught-up member from losing its majority. The
// request made from the configuration read before the wait is refused
// (-EPOCHMOVED), and the step is planned again.
func TestPlacedChangeAsksTheGroupAfterTheCatchUpWait(t *testing.T) {
	// The map: group 1 [1 3 5]; node 3 is replaced by node 7 (placed).
	// The group: epoch 2 [1 3 5], node 5 added by its last change and
	// still pulling the state. While the change waits for it, an operator
	// replaces node 5 by node 9 (epoch 3), and node 9 catches up.
	g := &fakeGroup{t: t, epoch: 2, members: []uint64{1, 3, 5}, previous: []uint64{1, 3, 6}}
	g.progress = func(g *fakeGroup, n int) resp.Value {
		if n == 1 { // 5 behind; then the operator's change lands
			g.epoch, g.members, g.previous = 3, []uint64{1, 3, 9}, []uint64{1, 3, 5}
			return progressReply(2, 100, 180, [3]int64{3, 180, 180}, [3]int64{5, 0, 0})
		}
		return progressReply(g.epoch, 150, 190, [3]int64{3, 190, 190}, [3]int64{9, 190, 190})
	}
	nc := &NodeChange{Cmd: "test", Leaving: []uint64{3}, CatchUp: 5 * time.Second}
	if err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}}); err != nil {
		t.Fatal(err)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 7, 9}) {
		t.Fatalf("the group became %v (asked %v), want [1 7 9] (node 3 replaced by 7, the operator's 5 -> 9 kept)", g.done, g.asked)
	}
}

// replace-node --old 3 --new 7 while the repairer replaced node 5 (dead) by
// node 9: the command's plan, made from the map ([1 3 5] -> [1 7 5]), must
// not undo the repairer's change (5 a member again, 9 dropped): the group's
// own configuration decides, as for a placed replacement.
func TestExplicitReplaceKeepsAConcurrentChange(t *testing.T) {
	// The repairer's change landed: 5 -> 9, caught up.
	g := &fakeGroup{t: t, epoch: 3, members: []uint64{1, 3, 9}, previous: []uint64{1, 3, 5}}
	nc := &NodeChange{Cmd: "replace-node", Leaving: []uint64{3}, CatchUp: 5 * time.Second,
		NewNodes: []Member{{ID: 7, ClientAddr: "n7", PeerAddr: "p"}}}
	if err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}}); err != nil {
		t.Fatal(err)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 7, 9}) {
		t.Fatalf("the group became %v, want [1 7 9] (node 3 replaced by 7, the repairer's 5 -> 9 kept)", g.done)
	}
}

// The first member asked for the group's configuration lags (node 1 has
// not learned of the repairer's 5 -> 9, epoch 3): the request planned
// against its epoch 2 is refused, and the step must not read that member's
// configuration again and again until it gives up ("keeps changing": the
// group is not changing; a rerun would fail alike while node 1 lags) — it
// asks another member, one at least at the epoch the leader named.
func TestNodeChangeReadsPastALaggingMember(t *testing.T) {
	g := &fakeGroup{t: t, epoch: 3, members: []uint64{1, 3, 9}, previous: []uint64{1, 3, 5},
		lagging: map[string]resp.Value{"n1": configReply(2, []uint64{1, 3, 5}, []uint64{1, 3, 6})}}
	nc := &NodeChange{Cmd: "test", Leaving: []uint64{3}, CatchUp: 5 * time.Second}
	if err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}}); err != nil {
		t.Fatalf("Run: %v (asked %v)", err, g.asked)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 7, 9}) {
		t.Fatalf("the group became %v (asked %v), want [1 7 9] (node 3 replaced by 7, the repairer's 5 -> 9 kept)", g.done, g.asked)
	}
}

// The request reaches the leader while another change, ordered from the
// same epoch, is not committed yet (the repairer's 5 -> 9): the leader
// names the epoch it is moving to, which no member has until the change
// commits. The step must wait for it and plan against it — not read the
// old epoch again at once, be refused again and give up ("keeps changing")
// within the change's commit round trip, as it did when the reconfiguring
// leader's refusal was a generic error.
func TestNodeChangeWaitsForAPendingChange(t *testing.T) {
	g := &fakeGroup{t: t, epoch: 2, members: []uint64{1, 3, 5}, previous: []uint64{1, 3, 6}, pending: []uint64{1, 3, 9}}
	reads := 0
	g.onConfig = func(g *fakeGroup, n int) {
		if g.pending == nil || len(g.asked) == 0 {
			return
		}
		// The pending change commits at the tenth read after the refusal
		// (reading each of the three members at each of the step's
		// attempts, at once, is six).
		if reads++; reads == 10 {
			g.epoch, g.members, g.previous, g.pending = g.epoch+1, g.pending, g.members, nil
		}
	}
	nc := &NodeChange{Cmd: "test", Leaving: []uint64{3}, CatchUp: 5 * time.Second}
	if err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}}); err != nil {
		t.Fatalf("Run: %v (asked %v)", err, g.asked)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 7, 9}) {
		t.Fatalf("the group became %v (asked %v), want [1 7 9] (node 3 replaced by 7, the pending 5 -> 9 kept)", g.done, g.asked)
	}
}

// The pending change the leader named is lost in a view change: the
// group stays at its epoch. The step waits for the named epoch only
// configWait, then plans against the group as it is, and its request goes
// through.
func TestNodeChangeGoesOnWhenThePendingChangeIsLost(t *testing.T) {
	g := &fakeGroup{t: t, epoch: 2, members: []uint64{1, 3, 5}, previous: []uint64{1, 3, 6}, pending: []uint64{1, 3, 9}}
	g.onConfig = func(g *fakeGroup, n int) {
		if len(g.asked) > 0 {
			g.pending = nil // lost: no member ever has epoch 3 from it
		}
	}
	nc := &NodeChange{Cmd: "test", Leaving: []uint64{3}, CatchUp: 5 * time.Second}
	if err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}}); err != nil {
		t.Fatalf("Run: %v (asked %v)", err, g.asked)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 7, 5}) {
		t.Fatalf("the group became %v (asked %v), want [1 7 5]", g.done, g.asked)
	}
}

// add-members --replicas 5 while another run of it grew the group to five
// on other nodes (its placement saw other loads): the step asks for
// nothing (before: both runs' nodes, seven members).
func TestNodeChangeGrowthDoesNotOvershoot(t *testing.T) {
	g := &fakeGroup{t: t, epoch: 3, members: []uint64{1, 3, 5, 2, 4}, previous: []uint64{1, 3, 5}}
	nc := &NodeChange{Cmd: "add-members", CatchUp: 5 * time.Second}
	if err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 3, 5, 7, 9}, Size: 5}}); err != nil {
		t.Fatalf("Run: %v (asked %v)", err, g.asked)
	}
	if len(g.done) != 0 || len(g.members) != 5 {
		t.Fatalf("the group became %v (asked %v), want [1 3 5 2 4] unchanged", g.members, g.asked)
	}
}

// A group that changes again during every catch-up wait: the step plans
// against it again each time and, after reconfigAttempts, stops with "keeps
// changing" for a rerun — it never asks for a change from a configuration
// older than the group's (before the fix, the third change's wait ended in
// a request planned against the configuration read before it).
func TestNodeChangeStopsWhenTheGroupKeepsChanging(t *testing.T) {
	g := &fakeGroup{t: t, epoch: 2, members: []uint64{1, 3, 5}, previous: []uint64{1, 3, 6}}
	// Each wait: the operator replaces the newest member again (5 -> 11,
	// 11 -> 12, ...), the new one caught up.
	next := uint64(10)
	g.progress = func(g *fakeGroup, n int) resp.Value {
		next++
		last := g.members[2]
		g.epoch, g.members, g.previous = g.epoch+1, []uint64{1, 3, next}, g.members
		return progressReply(g.epoch, 150, 190, [3]int64{3, 190, 190}, [3]int64{int64(last), 190, 190}, [3]int64{int64(next), 190, 190})
	}
	nc := &NodeChange{Cmd: "test", Leaving: []uint64{3}, CatchUp: 5 * time.Second}
	err := g.run(nc, nodeChangeMap(), []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}})
	if err == nil || !strings.Contains(err.Error(), "keeps changing") || !strings.Contains(err.Error(), "rerun") {
		t.Fatalf("Run: %v, want \"keeps changing ... rerun\" (asked %v, done %v)", err, g.asked, g.done)
	}
	if len(g.done) != 0 {
		t.Fatalf("the group was changed to %v from a stale configuration (asked %v)", g.done, g.asked)
	}
}

// remove-node and add-members plan from the map, but a group's own
// configuration decides what it is asked for: a replacement the repairer
// made meanwhile (3 -> 6) is kept, not undone (before the fix the group
// was asked for the map's members, bringing back dead node 3).
func TestRemoveAndAddKeepAConcurrentChange(t *testing.T) {
	cm := nodeChangeMap()
	cm.Groups[0].Members = []uint64{1, 3, 5, 7, 9}
	g := &fakeGroup{t: t, epoch: 4, members: []uint64{1, 6, 5, 7, 9}, previous: []uint64{1, 3, 5, 7, 9}}
	rm := &NodeChange{Cmd: "remove-node", Leaving: []uint64{7, 9}, CatchUp: 5 * time.Second}
	if err := g.run(rm, cm, []GroupChange{{Group: 1, Members: []uint64{1, 3, 5}}}); err != nil {
		t.Fatal(err)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 6, 5}) {
		t.Fatalf("remove-node 7,9: the group became %v, want [1 6 5] (the repairer's 3 -> 6 kept)", g.done)
	}
	cm.Groups[0].Members = []uint64{1, 3, 5}
	g = &fakeGroup{t: t, epoch: 4, members: []uint64{1, 6, 5}, previous: []uint64{1, 3, 5}}
	add := &NodeChange{Cmd: "add-members", CatchUp: 5 * time.Second}
	if err := g.run(add, cm, []GroupChange{{Group: 1, Members: []uint64{1, 3, 5, 7, 9}}}); err != nil {
		t.Fatal(err)
	}
	if len(g.done) != 1 || !slices.Equal(g.done[0], []uint64{1, 6, 5, 7, 9}) {
		t.Fatalf("add-members 7,9: the group became %v, want [1 6 5 7 9] (the repairer's 3 -> 6 kept)", g.done)
	}
}
