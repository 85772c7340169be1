package server

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// prefetchPipeline is a random pipeline of runs of KEFIR.SCANs (plain, and in
// KEFIR.CALL at linearizable and eventual, with REDIRECT), some refused
// (LIMIT 0, an option given twice, a bad level, a wrong arity), between writes
// to keys inside the scanned ranges and reads of them.
func prefetchPipeline(rng *rand.Rand, n int) []byte {
	var buf []byte
	for k := 0; k < n; k++ {
		start, limit := rng.IntN(scanKeys), 1+rng.IntN(100)
		from, lim := fmt.Sprintf("s%04d", start), strconv.Itoa(limit)
		switch r := rng.IntN(20); {
		case r < 8:
			buf = appendCmd(buf, "KEFIR.SCAN", from, "", "LIMIT", lim)
		case r < 11:
			buf = appendCmd(buf, "KEFIR.CALL", "REDIRECT", "CONSISTENCY", "linearizable", "CMD", "KEFIR.SCAN", from, fmt.Sprintf("s%04d", start+limit/2))
		case r < 13:
			buf = appendCmd(buf, "KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "KEFIR.SCAN", from, "", "LIMIT", lim)
		case r == 13:
			buf = appendCmd(buf, "KEFIR.SCAN", from, "", "LIMIT", "0")
		case r == 14:
			buf = appendCmd(buf, "KEFIR.CALL", "REDIRECT", "REDIRECT", "CMD", "KEFIR.SCAN", from, "", "LIMIT", lim)
		case r == 15:
			buf = appendCmd(buf, "KEFIR.CALL", "CONSISTENCY", "nonsense", "CMD", "KEFIR.SCAN", from, "")
		case r == 16:
			buf = appendCmd(buf, "KEFIR.SCAN", from)
		case r == 17:
			buf = appendCmd(buf, "SET", fmt.Sprintf("s%04d", start), fmt.Sprintf("new-%d", k))
		case r == 18:
			buf = appendCmd(buf, "DEL", fmt.Sprintf("s%04d", start))
		default:
			buf = appendCmd(buf, "GET", fmt.Sprintf("s%04d", start))
		}
	}
	return buf
}

// TestPipelinedScansReadAheadAnswerInOrder: the KEFIR.SCANs pipelined behind
// a running one are read ahead (prefetch.go), and a connection's replies are
// byte for byte those of the same pipeline run with the read-ahead off —
// writes between scans seen by the scans after them, refused scans refused
// in their place — on one node and at the leader of a 3-replica group, where
// only linearizable scans are read ahead. A look-ahead that reads the scans
// behind a write or a GET too (and numbers them right) fails it: a scan then
// misses the write before it.
func TestPipelinedScansReadAheadAnswerInOrder(t *testing.T) {
	run := func(t *testing.T, addr string, pipe []byte, n int) []string {
		c := dialAddr(t, addr)
		if _, err := c.nc.Write(pipe); err != nil {
			t.Fatal(err)
		}
		out := make([]string, n)
		for i := range out {
			out[i] = c.reply()
		}
		return out
	}
	check := func(t *testing.T, on, off string) {
		rng := rand.New(rand.NewPCG(31, 22))
		for round := range 4 {
			const n = 400
			pipe := prefetchPipeline(rng, n)
			before := prefetchedScans.Load()
			got := run(t, on, pipe, n)
			used := prefetchedScans.Load() - before
			prefetchOn = false
			want := run(t, off, pipe, n)
			prefetchOn = true
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("round %d, reply %d: read ahead %.200s\nin turn %.200s", round, i, got[i], want[i])
				}
			}
			if used == 0 {
				t.Fatalf("round %d: no scan was answered from a read-ahead", round)
			}
			t.Logf("round %d: %d scans answered from a read-ahead", round, used)
		}
	}
	t.Run("node", func(t *testing.T) {
		a, b := startServer(t, nil), startServer(t, nil)
		scanBufFixture(t, a.ClientAddr().String())
		scanBufFixture(t, b.ClientAddr().String())
		check(t, a.ClientAddr().String(), b.ClientAddr().String())
	})
	t.Run("group", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts two 3-replica groups")
		}
		ga, gb := startGroup(t), startGroup(t)
		a, b := ga.nodes[ga.leader(t)].ClientAddr().String(), gb.nodes[gb.leader(t)].ClientAddr().String()
		scanBufFixture(t, a)
		scanBufFixture(t, b)
		check(t, a, b)
	})
}
