package vr

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkCommitBatch measures the core's own cost of ordering writes: a
// 3-replica group in one goroutine, messages handed over directly, fsyncs
// reported at once. Each iteration is one batch of `batch` client writes from
// proposal to reply (leader and both followers' work included), so ns/op
// divided by the batch size is the CPU the core spends per write.
//
//	go test -run - -bench CommitBatch -benchmem ./internal/vr/
func BenchmarkCommitBatch(b *testing.B) {
	for _, batch := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			benchCommit(b, batch, false)
		})
	}
}

// BenchmarkCommitBatchCAD is BenchmarkCommitBatch with CAD on: follower
// reads (active set, grants, R), writes proposed at AckReplicated (an early
// ack each, besides the reply), and followers sending a prepare-ok on
// receipt, on fsync and on apply. The difference is the core's CPU cost of
// CAD per write.
//
//	go test -run - -bench 'CommitBatch' -benchmem ./internal/vr/
func BenchmarkCommitBatchCAD(b *testing.B) {
	for _, batch := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			benchCommit(b, batch, true)
		})
	}
}

type benchNode struct {
	r   *Replica
	out []Message
	res [][]byte
}

func benchCommit(b *testing.B, batch int, cad bool) {
	ids := memberIDs(3)
	nodes := map[uint64]*benchNode{}
	for _, id := range ids {
		cfg := Config{Cluster: 1, Epoch: 1, Members: ids, Self: id, HeartbeatInterval: time.Second,
			ViewChangeTimeout: 10 * time.Second, MaxBatch: 1024, MaxInflight: 1 << 16}
		if cad {
			cfg.FollowerReads, cfg.LeaseDuration = true, 10*time.Second
		}
		r, err := New(cfg, State{Bootstrap: true, Nonce: id << 40})
		if err != nil {
			b.Fatal(err)
		}
		r.Tick(1)
		nodes[id] = &benchNode{r: r}
	}
	var replies, acks int
	// run performs one node's Ready (fsync reported immediately) and keeps
	// its outgoing messages.
	run := func(n *benchNode) {
		for {
			rd := n.r.Ready()
			if rd.Empty() {
				return
			}
			n.out = append(n.out, rd.Messages...)
			if len(rd.Committed) > 0 {
				n.res = n.res[:0]
				for range rd.Committed {
					n.res = append(n.res, nil)
				}
				n.r.Advance(n.res)
			}
			replies += len(rd.Replies)
			acks += len(rd.Acks)
			if rd.PersistSeq != 0 {
				n.r.Persisted(rd.PersistSeq)
			}
		}
	}
	data := make([]byte, 160)
	leader := nodes[1]
	var req uint64
	ack := AckApplied
	if cad {
		ack = AckReplicated
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := 0; i < batch; i++ {
			req++
			if err := leader.r.ProposeAck(1, Request{Client: 1 + req%64, ReqNum: req, Data: data}, ack); err != nil {
				b.Fatal(err)
			}
		}
		for busy := true; busy; {
			busy = false
			for _, id := range ids {
				n := nodes[id]
				run(n)
				msgs := n.out
				n.out = n.out[:0]
				for _, m := range msgs {
					busy = true
					nodes[m.To].r.Step(1, m)
				}
			}
		}
		if leader.r.applied-leader.r.first > 8192 {
			for _, n := range nodes {
				if err := n.r.Compact(n.r.applied - 1024); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.StopTimer()
	if replies != int(req) || (cad && acks != int(req)) {
		b.Fatalf("%d replies and %d early acks for %d writes", replies, acks, req)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(req), "ns/write")
}
