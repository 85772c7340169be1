package vrshard

import (
	"context"
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// ChainMeta is r — a replica of the metadata group — as a hosted chain
// master's metadata group (chainmaster.Config.Meta).
func (r *Replica) ChainMeta() chainmaster.Meta { return chainMeta{r} }

type chainMeta struct{ r *Replica }

// leaseProbe is the key the leadership read reads: any key would do (it is
// absent); a linearizable read succeeds only at the leader under its lease.
var leaseProbe = []byte("kefir-chain-master-lease")

// Read is a linearizable read (leader, lease, and everything committed
// before it applied), then the record from the engine, which has applied at
// least as much: reserved records are not readable by ops.
func (m chainMeta) Read(ctx context.Context, group uint64) (*kv.ChainConfig, error) {
	if _, err := m.r.Read(ctx, kv.Op{Kind: kv.KindGet, Key: leaseProbe}, level.ConsLinearizable, shard.Session{}); err != nil {
		return nil, err
	}
	v, err := m.r.Engine().Get(kv.ChainConfigKey(group))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("chain %d's configuration: %w", group, err)
	}
	c, err := kv.DecodeChainConfig(v.Data)
	if err != nil {
		return nil, fmt.Errorf("chain %d's configuration at version %d: %w", group, v.Version, err)
	}
	return c, nil
}

// Commit writes op (sync: on a majority's disks) at r, which must lead.
func (m chainMeta) Commit(ctx context.Context, op kv.Op) (kv.Result, error) {
	if op.Kind != kv.KindMapChainInit && op.Kind != kv.KindMapChainSet {
		return kv.Result{}, fmt.Errorf("chain master: %s is not a chain configuration op", op.Kind)
	}
	return m.r.Write(ctx, op, level.Sync, shard.ReqID{})
}
