package cluster

import (
	"strconv"
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
	b.Run("get", func(b *testing.B) {
		for b.Loop() {
			if _, err := db.GetShared([]byte("key5000")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
