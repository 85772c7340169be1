package storage

import (
	"fmt"
	"github.com/kefirdb/kefir/internal/vfs"
	"slices"
	"testing"
)

// Keys visits every key of the index in order, deleted ones included, across
// its batches, and stops when told to.
func TestKeysVisitsTheIndexInOrder(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	var want []string
	for i := 0; i < 2*keysBatch+5; i++ {
		k := fmt.Sprintf("k%05d", i)
		want = append(want, k)
		if _, err := db.Append(Record{Key: []byte(k), Value: []byte("v"), Version: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Append(Record{Key: []byte("k00003"), Version: 1 << 20, Tombstone: true}); err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := db.Keys(nil, nil, func(k []byte) bool { got = append(got, string(k)); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("visited %d keys, want %d (first %q)", len(got), len(want), got[:min(3, len(got))])
	}
	got = got[:0]
	_ = db.Keys([]byte("k00010"), []byte("k00013"), func(k []byte) bool { got = append(got, string(k)); return true })
	if !slices.Equal(got, []string{"k00010", "k00011", "k00012"}) {
		t.Fatalf("range visited %q", got)
	}
	n := 0
	_ = db.Keys(nil, nil, func([]byte) bool { n++; return n < 7 })
	if n != 7 {
		t.Fatalf("visited %d after stopping at 7", n)
	}
}
