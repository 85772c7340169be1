package cluster

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
)

// FLUSHALL and FLUSHDB at a node of several groups (docs/cluster.md,
// "What works across groups"). One flush op is atomic and durable within
// its group (kv.KindFlush, one entry of the group's log); across groups the
// node that takes the command sends one to every group that owns slots,
// each routed like a keyed write by a key of one of the group's slots (the
// op's Key: kv.Op.RoutingKeys; applyFlush ignores it and empties the whole
// engine). Redis Cluster's FLUSHALL empties one master and a cluster client
// sends it to every master; a node here empties the whole keyspace, so a
// plain client's reset works, and a cluster client's one per master does
// the same work again, harmlessly. Not atomic across groups: a reader may
// see one group emptied and another not yet.

// FlushTarget is one group's part of a flush across groups.
type FlushTarget struct {
	Group GroupID
	Key   []byte // a key of a slot the group owns: the op's route
}

// FlushTargets returns, for every group of the map that owns a slot by
// this node's knowledge (not in flight), a key to route its flush by.
func (m *Multi) FlushTargets() ([]FlushTarget, error) {
	var out []FlushTarget
	for _, g := range m.smap().Groups {
		if len(g.Slots) == 0 {
			continue
		}
		k := KeyWhere("kefir-flush-", func(s uint16) bool {
			id, inFlight := m.owner(s)
			return id == g.ID && !inFlight
		})
		if k == nil {
			return nil, &ReplyError{fmt.Sprintf("TRYAGAIN group %d's slots are in flight (a move's hand-over): no route for its flush", g.ID)}
		}
		out = append(out, FlushTarget{Group: g.ID, Key: k})
	}
	return out, nil
}

// flushCheck refuses a flush at group g while a slot of its table is
// migrating or importing: a move copies keys by version (docs/design/
// cluster.md §2), and a flush at its destination would delete keys the
// final copy does not send again. Checked where the flush is proposed;
// a move's first step ordered just after it in the log is not caught
// (the flush then empties what it was asked to, with the move's copy).
//
// A flush that names its group (Delta, FlushTargets' group: the group its
// route key was chosen for) is refused at any other: the key's slot moved
// since, or the sender's map was stale, and the group meant would be left
// unflushed while the reply said OK.
func flushCheck(g *localGroup, op *kv.Op) error {
	if op.Delta != 0 && GroupID(op.Delta) != g.spec.ID {
		return &ReplyError{fmt.Sprintf("TRYAGAIN group %d's flush was routed to group %d (slot %d moved, or the sender's map is stale)", op.Delta, g.spec.ID, Slot(op.Key))}
	}
	t := g.table()
	if t == nil {
		return nil
	}
	for _, r := range t.Runs() {
		if r.State == kv.SlotMigrating || r.State == kv.SlotImporting {
			return &ReplyError{fmt.Sprintf("TRYAGAIN group %d is moving slots %d-%d (%s): FLUSHALL waits for the move to end", g.spec.ID, r.Start, r.End, r.State)}
		}
	}
	return nil
}
