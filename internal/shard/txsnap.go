package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/storage"
)

// Interactive transactions' snapshot reads (KEFIR.TX; docs/design/transactions.md,
// "Interactive transactions"). A transaction reads the engine at its start
// version, which the replica picks as a linearizable read point: at least as
// new as every write acknowledged before BEGIN. The version is pinned in this
// process's engine (storage.DB.Snapshot) until the transaction ends, so
// retention keeps what it reads; a read whose version is gone all the same
// (pinned too late, or read after a restart) fails with ErrTxTooOld.

// TxSnapshots is a Replica that serves interactive transactions.
type TxSnapshots interface {
	// TxBegin returns a pinned snapshot at a start version at least as new
	// as every write acknowledged before the call. key is the transaction's
	// first key: it picks the group on a node of several groups (nil
	// elsewhere). A replica that cannot prove the read point (a follower)
	// answers its not-leader error.
	TxBegin(ctx context.Context, key []byte) (*TxSnap, error)
}

// ErrTxTooOld: a transaction's snapshot no longer has a version it reads.
var ErrTxTooOld = errors.New("TXABORT transaction too old: its snapshot's versions are no longer retained")

// TxEngine is what a TxSnap reads: *storage.DB.
type TxEngine interface {
	Snapshot(at uint64) *storage.Snapshot
	GetAt(key []byte, v uint64) (storage.Value, error)
	GetAtShared(key []byte, v uint64) (storage.Value, error)
}

// TxSnap is a transaction's pinned snapshot.
type TxSnap struct {
	db  TxEngine
	pin *storage.Snapshot
	at  uint64
}

// NewTxSnap pins db at version at (0: the last version).
func NewTxSnap(db TxEngine, at uint64) *TxSnap {
	pin := db.Snapshot(at)
	return &TxSnap{db: db, pin: pin, at: pin.Version()}
}

// TxSnapAt is a view of db at version at without a pin, for a read that
// ends at once (a leader's early abort check, vrshard txdoom.go): a version
// retention dropped reads as ErrTxTooOld, as in a pinned one. Close does
// nothing.
func TxSnapAt(db TxEngine, at uint64) *TxSnap { return &TxSnap{db: db, at: at} }

// Version is the snapshot's start version.
func (s *TxSnap) Version() uint64 { return s.at }

// Get reads key at the snapshot (a kv.Getter): version 0 and exists false
// for a key absent there. It reads with GetAt rather than through the pin,
// which would answer "absent" for a version pruned before the pin was taken
// (storage.Snapshot.Get): that is ErrTxTooOld.
func (s *TxSnap) Get(key []byte) ([]byte, []byte, uint64, bool, error) {
	return s.get(key, false)
}

// GetShared is Get without the copy (storage.DB.GetAtShared): the data and
// meta may be the engine's cached bytes, which the caller must not modify.
// For reads whose results only go to the socket, as a plain GET's do.
func (s *TxSnap) GetShared(key []byte) ([]byte, []byte, uint64, bool, error) {
	return s.get(key, true)
}

func (s *TxSnap) get(key []byte, shared bool) ([]byte, []byte, uint64, bool, error) {
	var v storage.Value
	var err error
	if shared {
		v, err = s.db.GetAtShared(key, s.at)
	} else {
		v, err = s.db.GetAt(key, s.at)
	}
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return nil, nil, 0, false, nil
	case errors.Is(err, storage.ErrVersionGone):
		return nil, nil, 0, false, fmt.Errorf("%w (key %q at version %d)", ErrTxTooOld, key, s.at)
	case err != nil:
		return nil, nil, 0, false, fmt.Errorf("%w: transaction read: %w", ErrUnavailable, err)
	}
	return v.Data, v.Meta, v.Version, true, nil
}

// Close unpins the snapshot.
func (s *TxSnap) Close() {
	if s.pin != nil {
		_ = s.pin.Close()
	}
}

// TxBegin pins the engine's last version: on a single node every
// acknowledged write is applied, and what the transaction may read is made
// durable first (as any read's, readDurable).
func (s *Shard) TxBegin(ctx context.Context, _ []byte) (*TxSnap, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	db, ok := s.db.(TxEngine)
	if !ok {
		return nil, fmt.Errorf("%w: this engine keeps no versions to read", ErrUnavailable)
	}
	snap := NewTxSnap(db, 0)
	if err := s.readDurable(s.db.LastPos()); err != nil {
		snap.Close()
		return nil, err
	}
	return snap, nil
}

var _ TxSnapshots = (*Shard)(nil)
