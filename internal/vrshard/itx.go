package vrshard

import (
	"context"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// TxBegin serves an interactive transaction's BEGIN (KEFIR.TX;
// docs/design/transactions.md): at the leader, a linearizable read of the
// whole keyspace (a scan of one key: leadership confirmed, the engine applied
// through the commit index, and the latest update of every key readable,
// cadNeed) makes every write acknowledged before the call readable; the start
// version is then the readable index R, capped by what the engine applied.
// Every version up to it is committed and readable, so the snapshot it pins
// here may be read after this replica loses its leadership, and its commit
// validates on whichever leader orders it.
func (r *Replica) TxBegin(ctx context.Context, _ []byte) (*shard.TxSnap, error) {
	if err := r.CheckConsistency(level.ConsLinearizable); err != nil {
		return nil, err
	}
	if _, err := r.leaderRead(ctx, kv.Op{Kind: kv.KindScan, Limit: 1}); err != nil {
		return nil, err
	}
	return shard.NewTxSnap(r.db, min(r.readable.Load(), r.applied.Load())), nil
}

var _ shard.TxSnapshots = (*Replica)(nil)
