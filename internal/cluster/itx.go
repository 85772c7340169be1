package cluster

import (
	"context"
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
)

// TxBegin begins an interactive transaction (KEFIR.TX) in the group that
// owns key's slot: versions are a group's op numbers, so a transaction is of
// one group, and of one slot (the front door refuses a second slot with
// -CROSSSLOT, as Redis Cluster does a multi-key command's).
func (m *Multi) TxBegin(ctx context.Context, key []byte) (*shard.TxSnap, error) {
	g, slot, err := m.route(&kv.Op{Kind: kv.KindGet, Key: key})
	if err != nil {
		return nil, err
	}
	ts, ok := g.h.Replica.(shard.TxSnapshots)
	if !ok {
		return nil, fmt.Errorf("%w: group %d's replica serves no transactions", shard.ErrUnavailable, g.spec.ID)
	}
	snap, err := ts.TxBegin(ctx, key)
	return snap, withSlot(err, slot)
}

var _ shard.TxSnapshots = (*Multi)(nil)
