package cluster

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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
	get := db.Lookup
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

// TestTxDecisionsDueSkipsSlotsMovedAway: the sweep's collect is routed by
// a decision's primary key, so it names only decisions whose primary slot
// the group still serves. Before, the batch went by its first (oldest)
// record's primary: once that slot had moved away, every round's collect
// went to the slot's new owner, and the group collected nothing again.
func TestTxDecisionsDueSkipsSlotsMovedAway(t *testing.T) {
	db, apply := txGroupState(t)
	// Two aborts (settled), the older one's primary "a" in a slot moved away.
	old := time.Now().Add(-time.Hour).UnixMilli()
	t1, t2 := kv.NewTxID(old, []byte("12345678")), kv.NewTxID(old+1, []byte("12345678"))
	apply(kv.NewTxDecide(t1, []byte("a"), false))
	apply(kv.NewTxDecide(t2, []byte("b"), false))
	moved := kv.KeySlot([]byte("a"))
	serves := func(s uint16) bool { return s != moved }
	for _, tc := range []struct {
		serves func(uint16) bool
		want   [][]byte
	}{{nil, [][]byte{t1, t2}}, {serves, [][]byte{t2}}} {
		collect, _, err := TxDecisionsDue(db, time.Now(), time.Minute, TxPushAge, tc.serves)
		if err != nil || collect == nil {
			t.Fatalf("due: %v %v", collect, err)
		}
		if !slices.EqualFunc(collect.Keys, tc.want, bytes.Equal) || kv.KeySlot(collect.Expected) == moved && tc.serves != nil {
			t.Fatalf("collect names %x routed by %q, want %x", collect.Keys, collect.Expected, tc.want)
		}
	}
}

// txGroupState is a group's applied state on a real engine, and apply, which
// applies one op to it as the group's applier would (the op's reply
// ignored).
func txGroupState(t *testing.T) (*storage.DB, func(kv.Op)) {
	t.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	version := uint64(0)
	return db, func(op kv.Op) {
		t.Helper()
		version++
		var recs []storage.Record
		if _, err := kv.Apply(db.Lookup, version, &op, 1<<20, func(key, value, meta []byte, tomb bool) {
			recs = append(recs, storage.Record{Key: bytes.Clone(key), Value: bytes.Clone(value), Meta: bytes.Clone(meta), Version: version, Tombstone: tomb})
		}); err != nil {
			t.Fatal(err)
		}
		if len(recs) > 0 {
			if _, err := db.Append(recs...); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A commit whose other participants have not all resolved holds its
// primary slot's hand-over (kv.txPendingSlot), so the sweep settles it once
// it is TxPushAge old — not only when it comes due for collection
// (TxDecisionKeep, a minute), which held a move of that slot for a minute
// after its coordinator died.
func TestTxDecisionsDueSettlesPendingCommitsAfterAge(t *testing.T) {
	db, apply := txGroupState(t)
	now := time.Now()
	commit := func(nonce string, idAge, decidedAge time.Duration) []byte {
		txid := kv.NewTxID(now.Add(-idAge).UnixMilli(), []byte(nonce))
		prep, err := kv.NewTxPrepare(txid, []byte("a"), 0, kv.TxOrigin{}, nil, []kv.Op{{Kind: kv.KindSet, Key: []byte("a"), Value: []byte(nonce)}})
		if err != nil {
			t.Fatal(err)
		}
		apply(prep)
		dec := kv.NewTxDecide(txid, []byte("a"), true, []byte("{b}"+nonce))
		dec.Now = now.Add(-decidedAge).UnixMilli()
		apply(dec)
		return txid
	}
	due := commit("nonce-01", 10*time.Second, 5*time.Second) // decided 5 s ago: due
	commit("nonce-02", 10*time.Second, 0)                    // decided just now: not yet
	if ids, err := kv.TxPendingIDs(db.Lookup); err != nil || len(ids) != 2 {
		t.Fatalf("pending list %x (%v), want the two commits", ids, err)
	}
	collect, unsettled, err := TxDecisionsDue(db, now, time.Minute, TxPushAge, nil)
	if err != nil {
		t.Fatal(err)
	}
	if collect != nil || len(unsettled) != 1 || !bytes.Equal(unsettled[0].TxID, due) {
		t.Fatalf("collect %v, unsettled %+v; want nothing to collect and the commit decided 5 s ago to settle", collect, unsettled)
	}
}
