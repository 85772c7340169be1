package server

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/transport"
)

// BenchmarkNilextSet compares SET latency through a follower (the
// coordinator) of a 3-replica group with the nilext fast path off (the
// follower forwards to the leader, which runs a prepare round) and on (the
// follower sends the write to every replica and answers on the
// supermajority's acks), side by side in one run, with `clients` closed-loop
// connections each writing its own keys (P1), and an emulated one-way delay
// on every peer link (the forwarding hop itself is not delayed, which
// flatters the ordered path).
//
// Reported: ns/op is per write across all clients (latency ≈ ns/op ×
// clients); fast/op is the fraction that completed on the fast path;
// fwd/op the fraction forwarded to the leader; peer-msgs/op the peer
// messages all nodes sent per write (heartbeats included). Peer round trips
// on a write's critical path: fast path 1 (coordinator → all → coordinator);
// ordered 1 (leader's prepare → prepare-ok) after the forward hop.
//
//	go test ./internal/server/ -run '^$' -bench NilextSet -benchtime 1000x
//
// Durability: sync (the d-log entry is fsynced on every acking replica
// before its ack; for n = 3 the supermajority is all three) and cad (acked
// from memory, persisted in the background; the ordered path serves cad as
// sync, so its figures are the same).
func BenchmarkNilextSet(b *testing.B) {
	for _, delay := range []time.Duration{0, 250 * time.Microsecond} {
		for _, clients := range []int{1, 4} {
			for _, d := range []level.Durability{level.Sync, level.CAD} {
				for _, nilext := range []bool{false, true} {
					mode := "ordered"
					if nilext {
						mode = "nilext"
					}
					b.Run(fmt.Sprintf("delay=%v/clients=%d/%v/%s", delay, clients, d, mode), func(b *testing.B) {
						benchNilextSet(b, nilext, d, delay, clients)
					})
				}
			}
		}
	}
}

func benchNilextSet(b *testing.B, nilext bool, d level.Durability, delay time.Duration, clients int) {
	g := startGroupWith(b, func(c *Config) { c.Nilext, c.Durability = nilext, d })
	l := g.leader(b)
	f := (l + 1) % 3
	for _, s := range g.nodes {
		for _, m := range g.cfgs[0].Members {
			if delay > 0 && m.ID != s.cfg.ReplicaID {
				if err := vrOf(s).Transport().SetLinkFault(m.ID, transport.Fault{Delay: delay}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	conns := make([]*client, clients)
	for i := range conns {
		conns[i] = dial(b, g.nodes[f])
	}
	sent := func() (msgs, fast uint64) {
		for _, s := range g.nodes {
			msgs += vrOf(s).Transport().Stats().Total.Sent
			fast += vrOf(s).Stats().NilextFast
		}
		return
	}
	msgs0, fast0 := sent()
	fwd0 := g.nodes[f].router.Forwarded()
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := (b.N + clients - 1) / clients
	for ci, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				k := "k" + strconv.Itoa(ci) + "-" + strconv.Itoa(i%1000)
				if _, err := c.nc.Write(resp.AppendCommand(nil, []byte("SET"), []byte(k), []byte("value"))); err != nil {
					b.Error(err)
					return
				}
				if v, err := c.rd.ReadValue(); err != nil || v.Kind == resp.Error {
					b.Errorf("reply %v %v", v, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	n := float64(per * clients)
	msgs1, fast1 := sent()
	b.ReportMetric(float64(fast1-fast0)/n, "fast/op")
	b.ReportMetric(float64(g.nodes[f].router.Forwarded()-fwd0)/n, "fwd/op")
	b.ReportMetric(float64(msgs1-msgs0)/n, "peer-msgs/op")
}
