package cluster

import (
	"context"
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

// reconfigIDs is the members a KEFIR.GROUP RECONFIG GROUP g id... asks for.
func reconfigIDs(args [][]byte) []uint64 {
	var ids []uint64
	for _, a := range args[4:] {
		id, _ := strconv.ParseUint(string(a), 10, 64)
		ids = append(ids, id)
	}
	return ids
}

// A placed replacement (the repairer's, or replace-node --old N without
// --new) that waits for the group's last change to catch up must ask for
// the members the group has when the wait ends, not when it began: an
// operator's replace-node of another member that lands during the wait
// (up to CaughtUpWait) would otherwise be undone — its new node dropped
// before it caught up and the node it replaced, dead, made a member again,
// leaving the group one caught-up member from losing its majority.
func TestPlacedChangeAsksTheGroupAfterTheCatchUpWait(t *testing.T) {
	// The map: group 1 [1 3 5]; node 3 is replaced by node 7 (placed).
	cm := nodeChangeMap()
	var mu sync.Mutex
	// The group: epoch 2 [1 3 5], node 5 added by its last change and
	// still pulling the state. While the change waits for it, an operator
	// replaces node 5 by node 9 (epoch 3), and node 9 catches up.
	epoch, members, previous := int64(2), []uint64{1, 3, 5}, []uint64{1, 3, 6}
	progressed := 0
	var asked []uint64
	tr := func(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
		mu.Lock()
		defer mu.Unlock()
		switch strings.ToUpper(string(args[1])) {
		case "CONFIG":
			return configReply(epoch, members, previous), nil
		case "PROGRESS":
			progressed++
			if progressed == 1 { // 5 behind; then the operator's change lands
				epoch, members, previous = 3, []uint64{1, 3, 9}, []uint64{1, 3, 5}
				return progressReply(2, 100, 180, [3]int64{3, 180, 180}, [3]int64{5, 0, 0}), nil
			}
			return progressReply(epoch, 150, 190, [3]int64{3, 190, 190}, [3]int64{9, 190, 190}), nil
		case "RECONFIG":
			asked = append(asked, reconfigIDs(args)...)
			return resp.Value{Kind: resp.Error, Str: []byte("ERR stop here")}, nil
		}
		t.Fatalf("unexpected command %q", args)
		return resp.Value{}, nil
	}
	mv := &Mover{Seeds: []string{"n1"}, Transport: tr}
	nc := &NodeChange{Cmd: "test", Meta: mv, Old: 3, Replace: true, Leaving: []uint64{3}, CatchUp: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = nc.Run(ctx, cm, []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(asked, []uint64{1, 7, 9}) {
		t.Fatalf("the group was asked to become %v, want [1 7 9] (node 3 replaced by 7, the operator's 5 -> 9 kept)", asked)
	}
}

// replace-node --old 3 --new 7 while the repairer replaced node 5 (dead) by
// node 9: the command's plan, made from the map ([1 3 5] -> [1 7 5]), must
// not undo the repairer's change (5 a member again, 9 dropped): the group's
// own configuration decides, as for a placed replacement.
func TestExplicitReplaceKeepsAConcurrentChange(t *testing.T) {
	cm := nodeChangeMap()
	var asked []uint64
	tr := func(ctx context.Context, addr string, args [][]byte) (resp.Value, error) {
		switch strings.ToUpper(string(args[1])) {
		case "META": // ADDNODE of node 7
			return resp.Value{Kind: resp.Int, Int: 5}, nil
		case "CONFIG": // the repairer's change landed: 5 -> 9, caught up
			return configReply(3, []uint64{1, 3, 9}, []uint64{1, 3, 5}), nil
		case "PROGRESS":
			return progressReply(3, 150, 190, [3]int64{3, 190, 190}, [3]int64{9, 190, 190}), nil
		case "RECONFIG":
			asked = append(asked, reconfigIDs(args)...)
			return resp.Value{Kind: resp.Error, Str: []byte("ERR stop here")}, nil
		}
		t.Fatalf("unexpected command %q", args)
		return resp.Value{}, nil
	}
	mv := &Mover{Seeds: []string{"n1"}, Transport: tr}
	nc := &NodeChange{Cmd: "replace-node", Meta: mv, Old: 3, Replace: true, Leaving: []uint64{3}, CatchUp: 5 * time.Second,
		NewNodes: []Member{{ID: 7, ClientAddr: "n7", PeerAddr: "p"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = nc.Run(ctx, cm, []GroupChange{{Group: 1, Members: []uint64{1, 7, 5}}})
	if !slices.Equal(asked, []uint64{1, 7, 9}) {
		t.Fatalf("the group was asked to become %v, want [1 7 9] (node 3 replaced by 7, the repairer's 5 -> 9 kept)", asked)
	}
}
