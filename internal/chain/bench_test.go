package chain

import (
	"fmt"
	"testing"
)

// BenchmarkChainUpdate measures the core's own cost of replicating writes:
// a chain of n members and its master in one goroutine, messages handed
// over directly (no invariant check). Each iteration is one batch of `batch`
// client updates from the master's Put to the client's reply, with every
// member's forwarding and the acknowledgements back up included, so ns/op
// divided by the batch size is the CPU the core spends per write.
//
//	go test -run - -bench ChainUpdate -benchmem ./internal/chain/
func BenchmarkChainUpdate(b *testing.B) {
	for _, n := range []int{1, 3} {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("members=%d/batch=%d", n, batch), func(b *testing.B) {
				benchChain(b, n, batch, SU, Memory)
			})
		}
	}
}

// BenchmarkChainModes is BenchmarkChainUpdate's 3-member, 64-update batch
// under each update mode, and under SU with every member a log whose host
// persists at once (the core's cost of the persist/persisted round and of
// holding updates back, not a disk's).
//
//	go test -run - -bench ChainModes -benchmem ./internal/chain/
func BenchmarkChainModes(b *testing.B) {
	for _, c := range []struct {
		mode  Mode
		store Store
	}{{SU, Memory}, {AUSI, Memory}, {AU, Memory}, {SU, Log}} {
		b.Run(fmt.Sprintf("%s/%s", c.mode, c.store), func(b *testing.B) {
			benchChain(b, 3, 64, c.mode, c.store)
		})
	}
}

func benchChain(b *testing.B, n, batch int, mode Mode, store Store) {
	ids := make([]NodeID, n)
	for i := range ids {
		ids[i] = NodeID(i + 1)
	}
	ms := NewMaster(masterID, ids, n)
	ms.SetMode(mode)
	members := map[NodeID]*Member{}
	for _, id := range ids {
		members[id] = NewMember(Config{ID: id, Master: masterID, Members: ids, Mode: mode, Store: store}, newKV())
	}
	op := []byte("key=value-of-some-length")
	var queue []Msg
	var req uint64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < batch; j++ {
			req++
			ms.Put(req, op)
		}
		replies := 0
		queue = append(queue, ms.Ready().Msgs...)
		for len(queue) > 0 {
			msg := queue[0]
			queue = queue[1:]
			if msg.To == masterID {
				ms.Step(msg)
				out := ms.Ready()
				replies += len(out.Replies)
				queue = append(queue, out.Msgs...)
				continue
			}
			m := members[msg.To]
			if msg.Type == MsgPersist {
				msg = Msg{Type: MsgPersisted, From: msg.To, To: msg.To, Seq: msg.Seq}
			}
			m.Step(msg)
			queue = append(queue, m.Ready()...)
		}
		if replies != batch {
			b.Fatalf("%d replies for %d updates", replies, batch)
		}
	}
}
