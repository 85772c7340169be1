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

// txFresher is a group's replica whose leader knows which keys the EXECs
// and transaction commits it has in flight write (vrshard txwait.go).
type txFresher interface {
	TxWriting(keys [][]byte) bool
	TxAwaitWriters(ctx context.Context, keys [][]byte) (bool, error)
}

// fresherOf returns the hosted replica that serves key's slot if it tracks
// the commits in flight, else nil (the key is another node's group's, or the
// engine does not: nothing to wait for here).
func (m *Multi) fresherOf(key []byte) txFresher {
	g, err := m.routeSlot(Slot(key))
	if err != nil {
		return nil
	}
	f, _ := g.h.Replica.(txFresher)
	return f
}

// TxWriting reports whether an EXEC or transaction commit in flight at a
// hosted group's leader writes any of keys (each asked of its own slot's
// group): a transaction's first read or a WATCH of them waits for it
// (server txRefresh, awaitTxWriters). A lookup, for an event loop.
func (m *Multi) TxWriting(keys [][]byte) bool {
	for _, k := range keys {
		if f := m.fresherOf(k); f != nil && f.TxWriting([][]byte{k}) {
			return true
		}
	}
	return false
}

// TxAwaitWriters waits until the EXECs and transaction commits in flight
// at the hosted groups' leaders that write any of keys have finished, or ctx
// ends, and reports whether there was any (vrshard's, per key's group).
func (m *Multi) TxAwaitWriters(ctx context.Context, keys [][]byte) (bool, error) {
	waited := false
	for _, k := range keys {
		f := m.fresherOf(k)
		if f == nil {
			continue
		}
		w, err := f.TxAwaitWriters(ctx, [][]byte{k})
		waited = waited || w
		if err != nil {
			return waited, err
		}
	}
	return waited, nil
}
