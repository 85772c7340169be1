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
				benchChain(b, n, batch)
			})
		}
	}
}

func benchChain(b *testing.B, n, batch int) {
	ids := make([]NodeID, n)
	for i := range ids {
		ids[i] = NodeID(i + 1)
	}
	ms := NewMaster(masterID, ids, n)
	members := map[NodeID]*Member{}
	for _, id := range ids {
		members[id] = NewMember(Config{ID: id, Master: masterID, Members: ids}, newKV())
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
			m.Step(msg)
			queue = append(queue, m.Ready()...)
		}
		if replies != batch {
			b.Fatalf("%d replies for %d updates", replies, batch)
		}
	}
}
