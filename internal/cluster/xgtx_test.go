package cluster

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// BenchmarkTxLockCheck is what a read or a write at a node of several
// groups pays for cross-group transactions when nothing is locked: the one
// engine lookup of the group's prepared-parts record (txLockOf), against a
// lookup of a stored key (the read itself).
func BenchmarkTxLockCheck(b *testing.B) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: b.TempDir()}}})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	recs := make([]storage.Record, 0, 10000)
	for i := range 10000 {
		recs = append(recs, storage.Record{Key: []byte("key" + strconv.Itoa(i)), Value: make([]byte, 100), Version: uint64(i + 1)})
	}
	if _, err := db.Append(recs...); err != nil {
		b.Fatal(err)
	}
	get := engineGetter(db)
	b.Run("locks", func(b *testing.B) {
		for b.Loop() {
			if n, err := kv.TxLockCount(get); err != nil || n != 0 {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("published", func(b *testing.B) {
		// What txLockOf checks first: the replica's published flag
		// (vrshard.Replica.TxLockFree, an atomic load) through the
		// interface.
		var r any = &stubLockFree{}
		for b.Loop() {
			if lf, ok := r.(txLockFree); !ok || !lf.TxLockFree() {
				b.Fatal("locked")
			}
		}
	})
	b.Run("get", func(b *testing.B) {
		for b.Loop() {
			if _, err := db.GetShared([]byte("key5000")); err != nil {
				b.Fatal(err)
			}
		}
	})
}

type stubLockFree struct{ locked atomic.Bool }

func (s *stubLockFree) TxLockFree() bool { return !s.locked.Load() }

// A source refuses the hand-over while a prepared cross-group transaction
// locks a key of the slots (kv.ErrTxLocked, answered -TRYAGAIN; locks never
// move): the mover sends it again until the locks are resolved, and the
// move completes.
func TestMoverHandOverWaitsForLocks(t *testing.T) {
	f, addr := startFakeSlots(t, 12)
	f.lockedHandOvers = 3
	mv := &Mover{Seeds: []string{addr}, Page: 5}
	if _, err := mv.Move(context.Background(), 1, 2, []kv.SlotRange{{Start: 0, End: 99}}); err != nil {
		t.Fatalf("move with a locked hand-over: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, e := range f.events {
		if e.cmd == "SET 1 none" {
			n++
		}
	}
	if n != 4 || len(f.keys["2"]) != 12 {
		t.Fatalf("%d hand-overs sent (want 4: three refused), destination holds %d keys", n, len(f.keys["2"]))
	}
}
