package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
)

// TestChainClientSpreadsStrongReads: a chain of three real processes (SU,
// D-D-D); a writer sets k to 1, 2, 3, … at sync durability, one at a time,
// while four readers of one Go client opened on the three members with
// client.WithChainReads read k linearizably for 3 s. Every member serves
// reads (its clean reads, its reads at the tail's version and its reads
// sent to the tail, from /metrics, each counted only where the read
// came), some of them through the version query (k is nearly always being
// written: dirty upstream of the tail); and no read is stale — each
// returns at least the last value whose write was answered before the
// read began — nor from the future — at most the last value whose write
// had begun by the time the read returned. Without WithChainReads every
// read goes to the address Dial was given first (the head): the reads at
// the other members stay at zero, and the test fails.
func TestChainClientSpreadsStrongReads(t *testing.T) {
	g := startChain(t)
	g.settledLeader(-1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addrs := g.addrs()
	c, err := client.Dial(ctx, addrs, client.WithChainReads(true), client.WithRetryUnavailable(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lin := client.WithConsistency(client.Linearizable)
	if err := c.Put(ctx, "k", []byte("0"), client.WithDurability(client.Sync)); err != nil {
		t.Fatal(err)
	}
	metric := func(i int, name string) float64 { return metricValue(t, g.nodes[i].HTTPAddr, name) }
	// The first three count each read once; the last two are of the
	// version reads (answered from a held update) and the queries sent.
	names := []string{"kefir_chain_reads_clean_total", "kefir_chain_reads_version_total", "kefir_chain_reads_to_tail_total",
		"kefir_chain_reads_held_total", "kefir_chain_version_queries_sent_total"}
	base := make([][]float64, len(g.nodes))
	for i := range g.nodes {
		for _, n := range names {
			base[i] = append(base[i], metric(i, n))
		}
	}
	var acked, begun atomic.Int64 // the writer's last answered value, its latest begun
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := int64(1); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			begun.Store(v)
			if err := c.Put(ctx, "k", []byte(strconv.FormatInt(v, 10)), client.WithDurability(client.Sync)); err != nil {
				writeErr = fmt.Errorf("write %d: %w", v, err)
				return
			}
			acked.Store(v)
		}
	}()
	var mu sync.Mutex
	var bad []string
	var reads atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				low := acked.Load()
				got, err := c.Get(ctx, "k", lin)
				high := begun.Load()
				if err != nil {
					if errors.Is(err, context.Canceled) {
						return
					}
					mu.Lock()
					bad = append(bad, "read: "+err.Error())
					mu.Unlock()
					return
				}
				v, _ := strconv.ParseInt(string(got), 10, 64)
				if v < low || v > high {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("read %d, answered writes up to %d before it began, begun up to %d when it returned", v, low, high))
					mu.Unlock()
				}
				reads.Add(1)
			}
		}()
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if len(bad) > 0 {
		t.Fatalf("%d bad reads of %d, first: %v", len(bad), reads.Load(), bad[:min(len(bad), 5)])
	}
	var version float64
	for i := range g.nodes {
		var d []float64
		sum := 0.0
		for j, n := range names {
			d = append(d, metric(i, n)-base[i][j])
			if j < 3 {
				sum += d[j]
			}
		}
		version += d[1]
		t.Logf("%s: reads clean %.0f, at the tail's version %.0f (from a held update %.0f; %.0f queries sent), sent to the tail %.0f", g.nodes[i].ID, d[0], d[1], d[3], d[4], d[2])
		if sum == 0 {
			t.Errorf("%s served no read: the client did not spread them", g.nodes[i].ID)
		}
	}
	t.Logf("%d reads, %d writes", reads.Load(), acked.Load())
	if version == 0 {
		t.Errorf("no read at the tail's version with a write always in flight")
	}
}
