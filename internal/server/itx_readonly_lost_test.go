package server

import (
	"context"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// lostTxEngine is an engine whose key "x" has one version left, at top: the
// older ones were pruned (as retention drops a superseded version no
// snapshot pins at once), so a snapshot below top reads it as gone.
type lostTxEngine struct{ top uint64 }

func (e *lostTxEngine) Snapshot(uint64) *storage.Snapshot { return nil }

func (e *lostTxEngine) GetAt(key []byte, v uint64) (storage.Value, error) {
	if string(key) != "x" {
		return storage.Value{}, storage.ErrNotFound
	}
	if v < e.top {
		return storage.Value{}, storage.ErrVersionGone
	}
	return storage.Value{Data: []byte("2"), Version: e.top}, nil
}

func (e *lostTxEngine) GetAtShared(key []byte, v uint64) (storage.Value, error) {
	return e.GetAt(key, v)
}

// lostTxShard is a replica group's leader whose starts come from
// lostTxEngine, with a commit of the keys in flight if writing; only what
// txRefresh calls is implemented (no TryTxBegin: on an event loop a new
// start must wait for a worker).
type lostTxShard struct {
	shard.Replica
	db            *lostTxEngine
	writing       bool
	begins, waits int
}

func (s *lostTxShard) TxBegin(context.Context, []byte) (*shard.TxSnap, error) {
	s.begins++
	return shard.TxSnapAt(s.db, s.db.top), nil
}

func (s *lostTxShard) TxWriting([][]byte) bool { return s.writing }

func (s *lostTxShard) TxAwaitWriters(context.Context, [][]byte) (bool, error) {
	if !s.writing {
		return false, nil
	}
	s.waits++
	s.writing = false
	return true, nil
}

// A READONLY transaction's first read does not wait for a commit in flight
// — but a snapshot that no longer holds its keys' versions is taken again.
// A leader pins the start at its readable index R, and a write its engine
// applied beyond R before the pin has already dropped the version R reads
// (retention keeps a superseded version only for a snapshot open at the
// time). Read there, the brand-new transaction aborted "transaction too old":
// TestTxReadOnlyNeverAbortsUnderContention failed so about once in ten runs
// (some 1 in 80,000 read-only transactions, by then with no commit in flight
// on the key: the one that dropped the version had finished).
func TestTxReadOnlyFirstReadRetakesASnapshotThatLostItsVersions(t *testing.T) {
	db := &lostTxEngine{top: 10}
	s := &lostTxShard{db: db}
	c := &conn{srv: &Server{shard: s}}
	keys := [][]byte{[]byte("y"), []byte("x")}
	newTx := func(at uint64) *itxn {
		return &itxn{iso: kv.TxSerializable, readOnly: true, slot: -1, keys: map[string]*txKey{}, snap: shard.TxSnapAt(db, at)}
	}
	check := func(what string, tx *itxn, start uint64, waits, begins int) {
		t.Helper()
		if tx.snap.Version() != start || s.waits != waits || s.begins != begins {
			t.Fatalf("%s: start %d after %d waits and %d begins, want %d after %d and %d", what, tx.snap.Version(), s.waits, s.begins, start, waits, begins)
		}
	}
	// The snapshot holds the keys: read there, without a wait, even with a
	// commit of them in flight.
	s.writing = true
	tx := newTx(10)
	if err := c.txRefresh(tx, keys); err != nil {
		t.Fatal(err)
	}
	check("a snapshot that holds its keys", tx, 10, 0, 0)
	// It lost x's version, no commit in flight: a new start, no wait.
	s.writing = false
	tx = newTx(9)
	if err := c.txRefresh(tx, keys); err != nil {
		t.Fatal(err)
	}
	check("a snapshot that lost x's version", tx, 10, 0, 1)
	if res, err := tx.read(kv.Op{Kind: kv.KindGet, Key: []byte("x")}); err != nil || string(res.Bulk) != "2" {
		t.Fatalf("the read after the new start: %q, %v", res.Bulk, err)
	}
	// It lost it, with a commit of x in flight: after the commit.
	s.writing = true
	tx = newTx(9)
	if err := c.txRefresh(tx, keys); err != nil {
		t.Fatal(err)
	}
	check("a snapshot that lost x's version, a commit in flight", tx, 10, 1, 2)
	// On an event loop, with nothing done: a worker runs it again.
	tx = newTx(9)
	c.inline = true
	err := c.txRefresh(tx, keys)
	c.inline = false
	if err != nil || !c.wouldWait {
		t.Fatalf("on the loop: %v, wouldWait %v", err, c.wouldWait)
	}
	c.wouldWait = false
	check("on the loop", tx, 9, 1, 2)
	// After its first read it reads its snapshot, lost or not (one
	// snapshot): the read aborts, as any.
	tx = newTx(9)
	tx.touched = true
	if err := c.txRefresh(tx, keys); err != nil {
		t.Fatal(err)
	}
	check("after a read", tx, 9, 1, 2)
}
