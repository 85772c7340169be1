package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// A node counts the reads it served per slot (SlotReads): each served read
// once, at its key's slot; a read its replica refused is not counted, nor
// a write.
func TestMultiCountsServedReadsPerSlot(t *testing.T) {
	mu, m, reps := newTestMulti(t, 1, 2)
	k1, k2 := keyIn(m, 1), keyIn(m, 2)
	read := func(k string) error {
		_, err := mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k)}, level.ConsLinearizable, shard.Session{})
		return err
	}
	for range 3 {
		if err := read(k1); err != nil {
			t.Fatal(err)
		}
	}
	if err := read(k2); err != nil {
		t.Fatal(err)
	}
	reps[2].refuse = errors.New("not now")
	if err := read(k2); err == nil {
		t.Fatal("the refusal did not reach the caller")
	}
	if _, err := mu.Apply(context.Background(), []shard.WriteReq{{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k1), Value: []byte("v")}}}); err != nil {
		t.Fatal(err)
	}
	slots, counts := mu.SlotReads()
	s1, s2 := Slot([]byte(k1)), Slot([]byte(k2))
	want := map[uint16]uint64{s1: 3, s2: 1}
	if len(slots) != 2 || !slices.IsSorted(slots) {
		t.Fatalf("SlotReads: slots %v counts %v, want %v", slots, counts, want)
	}
	for i, s := range slots {
		if counts[i] != want[s] {
			t.Fatalf("slot %d: %d reads counted, want %d", s, counts[i], want[s])
		}
	}
}

// BenchmarkReadLoadAdd: what counting a read costs, one slot hot on every
// core (the worst case: the counter's line moves between cores) and spread
// over slots.
func BenchmarkReadLoadAdd(b *testing.B) {
	var l readLoad
	b.Run("one-hot-slot", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.add(7)
			}
		})
	})
	b.Run("spread", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			s := uint16(0)
			for pb.Next() {
				s += 613
				l.add(s)
			}
		})
	})
}
