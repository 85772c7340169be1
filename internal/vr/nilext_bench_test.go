package vr

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkNilextWrite compares, in the core, a nilext write on the fast path
// with the same write on the ordered path: a 3-replica group in one goroutine,
// messages handed over in rounds (one round = one one-way message delay),
// fsyncs reported at once. Each iteration is `writers` concurrent writes from
// invocation to completion. Reported per write:
//
//   - msgs/write: every message sent (client→replica requests, acks and
//     replies, and the peer messages of ordering, the background ordering of
//     the fast path included, amortized over its batches);
//
//   - RTT/write: message delays until the write completes, divided by two
//     (the client's view of latency in round trips);
//
//   - ns/write: the cores' CPU per write.
//
//     go test -run - -bench NilextWrite -benchmem ./internal/vr/
func BenchmarkNilextWrite(b *testing.B) {
	for _, path := range []string{"fast", "ordered"} {
		for _, writers := range []int{1, 16} {
			b.Run(fmt.Sprintf("path=%s/writers=%d", path, writers), func(b *testing.B) {
				benchNilext(b, path == "fast", writers)
			})
		}
	}
}

func benchNilext(b *testing.B, fast bool, writers int) {
	ids := memberIDs(3)
	rs := map[uint64]*Replica{}
	for _, id := range ids {
		cfg := Config{Cluster: 1, Epoch: 1, Members: ids, Self: id, HeartbeatInterval: time.Hour,
			ViewChangeTimeout: 2 * time.Hour, MaxBatch: 1024, MaxInflight: 1 << 16,
			Nilext: true, NilextBatch: 64, NilextInterval: time.Hour}
		r, err := New(cfg, State{Bootstrap: true})
		if err != nil {
			b.Fatal(err)
		}
		r.Tick(1)
		rs[id] = r
	}
	leader := rs[1]
	var (
		peer    []Message
		acks    []NilextAck
		replies []Reply
		msgs    int
		res     [][]byte
	)
	drain := func(r *Replica) {
		for {
			rd := r.Ready()
			if rd.Empty() {
				return
			}
			peer = append(peer, rd.Messages...)
			acks = append(acks, rd.NilextAcks...)
			replies = append(replies, rd.Replies...)
			msgs += len(rd.Messages) + len(rd.NilextAcks) + len(rd.Replies)
			if len(rd.Committed) > 0 {
				res = res[:0]
				for range rd.Committed {
					res = append(res, nil)
				}
				r.Advance(res)
			}
			if rd.PersistSeq != 0 {
				r.Persisted(rd.PersistSeq)
			}
		}
	}
	data := make([]byte, 160)
	key := [][]byte{[]byte("k")}
	trackers := make([]*NilextTracker, writers)
	for i := range trackers {
		trackers[i] = NewNilextTracker(ids)
	}
	done := make([]bool, writers)
	var req, writes, delays uint64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		base := req
		for w := 0; w < writers; w++ {
			req++
			client := uint64(w + 1)
			q := Request{Client: client, ReqNum: req, Data: data}
			done[w] = false
			if fast {
				trackers[w].Reset()
				for _, id := range ids {
					msgs++
					if err := rs[id].Nilext(1, NilextRequest{Request: q, Keys: key, Sync: true}); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				msgs++
				if err := leader.Propose(1, q); err != nil {
					b.Fatal(err)
				}
			}
		}
		round, left := uint64(1), writers // round 1: the requests travel
		for {
			for _, id := range ids {
				drain(rs[id])
			}
			if len(peer) == 0 && len(acks) == 0 && len(replies) == 0 {
				break
			}
			round++ // what was just sent now arrives
			for _, a := range acks {
				w := int(a.ReqNum - base - 1)
				if !done[w] && trackers[w].Add(a) {
					done[w] = true
					left--
					delays += round
				}
			}
			for _, rp := range replies {
				w := int(rp.ReqNum - base - 1)
				if !done[w] {
					done[w] = true
					left--
					delays += round
				}
			}
			acks, replies = acks[:0], replies[:0]
			batch := peer
			peer = nil
			for _, m := range batch {
				rs[m.To].Step(1, m)
			}
		}
		if left != 0 {
			b.Fatalf("%d of %d writes did not complete", left, writers)
		}
		writes += uint64(writers)
		if leader.applied > leader.first+8192 {
			for _, r := range rs {
				if r.applied < r.first+1024 {
					continue
				}
				if err := r.Compact(r.applied - 1024); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(msgs)/float64(writes), "msgs/write")
	b.ReportMetric(float64(delays)/float64(writes)/2, "RTT/write")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(writes), "ns/write")
}
